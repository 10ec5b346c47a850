//! Snapshots as the ledger sees them: the projection encoded as a body (storage
//! keeps the bytes, see `storage::snapshots`), and decoded only once the chain has
//! vouched for its digest. The ledger writes one off the append path when enough
//! has been applied since the last (or at once: `Ledger::snapshot_now`), and the
//! checkpoint record that vouches for it goes into the next commit group.

use crate::format::{ChainLink, hex};
use crate::model::{Event, Projection, Txn};
use crate::storage::commit::Admission;

use super::{Inner, Ledger, LedgerError};

pub use crate::storage::snapshots::{SNAPSHOTS_KEPT, SnapshotMeta, digest_of};

/// A snapshot body begins with this tag and the schema of the projection encoded
/// after it. (0xFF begins no bincode varint, so no untagged body — schema 1, what
/// builds before the tag wrote — can look tagged.)
const BODY_TAG: [u8; 7] = [0xFF, b'F', b'L', b'P', b'R', b'O', b'J'];
/// The projection's schema: bumped whenever `Projection` (or a type in it) changes
/// its encoding. A snapshot of another schema is never decoded: it is ignored (a
/// warning; the log is replayed from an older snapshot or from record 1), and
/// `inspect verify` does not compare it.
pub const PROJECTION_SCHEMA: u8 = 3;
/// Bytes of a body that tell its schema.
pub const SCHEMA_PREFIX_BYTES: usize = BODY_TAG.len() + 1;

/// The snapshot body of a projection: the tag, the schema, then bincode
/// (deterministic: every map is a BTreeMap, so one state has one digest whoever
/// writes it).
pub fn body_of(p: &Projection) -> Vec<u8> {
    let mut body = Vec::with_capacity(4096);
    body.extend_from_slice(&BODY_TAG);
    body.push(PROJECTION_SCHEMA);
    bincode::serde::encode_into_std_write(p, &mut body, bincode::config::standard()).expect("projection encodes");
    body
}

/// The schema a body (or its first [`SCHEMA_PREFIX_BYTES`]) was written with.
pub fn schema_of(prefix: &[u8]) -> u8 {
    match prefix.strip_prefix(&BODY_TAG[..]) {
        Some([schema, ..]) => *schema,
        _ => 1,
    }
}

/// The projection in a snapshot body covering `seq`.
pub fn decode(body: &[u8], seq: u64) -> Result<Projection, String> {
    // Claimed lengths are bounded (a corrupt length cannot ask for gigabytes).
    const DECODE_BYTES_MAX: usize = 1 << 30;
    let schema = schema_of(body);
    if schema != PROJECTION_SCHEMA {
        let who = if schema < PROJECTION_SCHEMA { "an earlier" } else { "a later" };
        return Err(format!(
            "a projection of schema {schema}, written by {who} build (this one reads schema {PROJECTION_SCHEMA})"
        ));
    }
    let body = &body[SCHEMA_PREFIX_BYTES..];
    let cfg = bincode::config::standard().with_limit::<DECODE_BYTES_MAX>();
    let (mut p, used): (Projection, usize) = bincode::serde::decode_from_slice(body, cfg).map_err(|e| e.to_string())?;
    if used != body.len() {
        return Err(format!("{} trailing bytes", body.len() - used));
    }
    if p.last_seq() != seq {
        return Err(format!("covers sequence {} but says {seq}", p.last_seq()));
    }
    p.share_request_ids();
    Ok(p)
}

pub fn describe(seq: u64, chain_head: &ChainLink) -> String {
    format!("sequence {seq}, chain head {}", hex(chain_head))
}

/// The most entries the state may hold per record of the tail for a short-lived
/// writer to snapshot it ([`Ledger::snapshot_if_tail_exceeds`]): four. A
/// replayed record (decoded, checked, chained, applied) costs a few times what an
/// entry of a snapshot costs to decode, and a snapshot is written once for every
/// open that then decodes it instead of the tail (measured in docs/BENCHMARKS.md,
/// "The tail a short-lived writer leaves").
pub const STATE_ENTRIES_PER_TAIL_RECORD_MAX: u64 = 4;

impl Ledger {
    /// Start writing a snapshot of the durable state on a thread of its own, if one
    /// is due (`LedgerOptions::snapshot_every_records`, `snapshot_every_bytes`) and
    /// none is in flight.
    pub(super) fn maybe_snapshot(&self, inner: &mut Inner) {
        let super::replay::SinceSnapshot { records, bytes } = inner.since_snapshot;
        let every_records = self.opts.snapshot_every_records.max(inner.projection.entries());
        if records < every_records && bytes < self.opts.snapshot_every_bytes {
            return;
        }
        // Only durable state: another leader may already be writing a group (the
        // projection runs ahead of the log while it does); the next leader to end
        // with nothing in flight takes the snapshot.
        if !inner.is_settled() || inner.poisoned().is_some() {
            return;
        }
        // One snapshot in flight at a time, written off the append path.
        if inner.snapshot_thread.as_ref().is_some_and(|t| !t.is_finished()) {
            return;
        }
        // Not on a runtime worker, where a lone async caller leads on its own
        // thread: cloning the projection could hold the worker for milliseconds.
        // The next async lead goes to the blocking pool and takes it.
        let deferred = crate::storage::commit::leading_inline();
        self.snapshot_wants_pool.store(deferred, std::sync::atomic::Ordering::SeqCst);
        if deferred {
            return;
        }
        if let Some(t) = inner.snapshot_thread.take() {
            let _ = t.join(); // its checkpoint was not queued: that snapshot stays unvouched
        }
        inner.since_snapshot = Default::default();
        let (backend, chain_head, p) = (self.backend.clone(), inner.chain_head, inner.projection.clone());
        let after = self.opts.after_snapshot;
        let spawned = std::thread::Builder::new().name("fencelog-snapshot".into()).spawn(move || {
            let body = body_of(&p);
            let written = backend
                .put_snapshot(p.last_seq(), &chain_head, &body)
                .map_err(|e| tracing::warn!(error = %e, "snapshot not written"))
                .ok();
            // The clone of the projection (its maps' nodes; the entries are shared
            // until the original changes them) and its encoding are freed now: the embedding program may give the pages back
            // (the daemon does: `LedgerOptions::after_snapshot`).
            drop((p, body));
            if let Some(f) = after {
                f();
            }
            written
        });
        match spawned {
            Ok(t) => inner.snapshot_thread = Some(t),
            // No snapshot this time (the next due one is tried again).
            Err(e) => tracing::warn!(error = %e, "snapshot thread not started"),
        }
    }

    /// If a snapshot has been written since the last group, queue the checkpoint
    /// record that lets the chain vouch for it. Returns whether one was queued.
    pub(super) fn queue_checkpoint(&self, inner: &mut Inner) -> Result<bool, LedgerError> {
        if !inner.snapshot_thread.as_ref().is_some_and(|t| t.is_finished()) {
            return Ok(false);
        }
        let written = inner.snapshot_thread.take().and_then(|t| t.join().ok().flatten());
        let Some(w) = written else { return Ok(false) };
        inner.snapshot_seq = Some(w.seq);
        let event = Event::Checkpoint { snapshot_seq: w.seq, digest: w.digest };
        self.queue(inner, &Txn::new(self.opts.log.now_ms(), self.writer_id(), vec![event]), None)?;
        Ok(true)
    }

    /// Write a snapshot now (as [`Ledger::snapshot_now`]) if this ledger's open
    /// replayed at least `min_records` records after the newest snapshot it
    /// started from — and at least a [`STATE_ENTRIES_PER_TAIL_RECORD_MAX`]th of
    /// the state's entries (writing a snapshot costs in proportion to the state:
    /// it must be paid back by the tail each later open no longer replays) — and
    /// no newer snapshot has been written since (by anyone: the log's newest is
    /// still the one it started from, or there is none). The next open then
    /// decodes that snapshot instead of replaying the tail. For a short-lived writer whose
    /// work is done (a runner, its exit on record and its caller told): without
    /// it, a log written only by short-lived processes is snapshotted every
    /// `snapshot_every_records` records, and every open before that replays up to
    /// as many. Returns where the snapshot is, if one was written.
    pub fn snapshot_if_tail_exceeds(&self, min_records: u64) -> Result<Option<String>, LedgerError> {
        let (opened_from, replayed) = (self.report.snapshot_seq, self.report.replayed_records);
        let entries = self.settled()?.projection.entries();
        if replayed < min_records || replayed.saturating_mul(STATE_ENTRIES_PER_TAIL_RECORD_MAX) < entries {
            return Ok(None);
        }
        let (newest, _) = self.backend.newest_snapshots();
        if newest.first().map(|m| m.seq) > opened_from {
            return Ok(None); // another writer has written one since this open
        }
        self.snapshot_now().map(Some)
    }

    /// Write a snapshot now (also done on `close`) and append the checkpoint record
    /// that vouches for it. It covers only durable state. Returns where it is.
    pub fn snapshot_now(&self) -> Result<String, LedgerError> {
        let (last, chain_head, projection) = {
            let mut inner = self.settled()?;
            if let Some(t) = inner.snapshot_thread.take() {
                let _ = t.join();
            }
            inner.since_snapshot = Default::default();
            let last = inner.projection.last_seq();
            if last > 0 && last == inner.own_checkpoint_seq {
                // Nothing but our own checkpoint since the snapshot it vouches for.
                return Ok(inner.last_snapshot.clone().unwrap_or_default());
            }
            (last, inner.chain_head, inner.projection.clone())
        };
        // Encoded and written without holding the ledger: submitters go on.
        let written = self.backend.put_snapshot(last, &chain_head, &body_of(&projection))?;
        {
            let mut inner = self.group.lock();
            inner.last_snapshot = Some(written.source.clone());
            inner.snapshot_seq = Some(written.seq);
        }
        let event = Event::Checkpoint { snapshot_seq: written.seq, digest: written.digest };
        let c = self.commit_with(Admission::Internal, |inner| {
            let txn = Txn::new(self.opts.log.now_ms(), self.writer_id(), vec![event.clone()]);
            self.check_and_queue(inner, &self.me, None, &mut |_, _, _| Ok(txn.clone()))
        })?;
        self.group.lock().own_checkpoint_seq = c.seq.unwrap_or(0);
        Ok(written.source)
    }
}

impl Drop for Ledger {
    /// A snapshot in flight is finished, never abandoned half-written (it is written
    /// to a temp file and renamed, so even a crash leaves no damaged `.snap`).
    fn drop(&mut self) {
        let taken = self.group.lock().snapshot_thread.take();
        if let Some(t) = taken {
            let _ = t.join();
        }
    }
}
