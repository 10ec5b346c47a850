//! Rebuilding the state from the log: `replay` adopts the newest snapshot the
//! chain vouches for (or none) and applies every record after it, verified; a
//! ledger's catch-up applies what the backend's reader finds after the
//! projection's last sequence, rebuilding first if the projection may not follow
//! the log.

use std::time::Instant;

use crate::format::{ChainLink, GENESIS_LINK, hex};
use crate::model::{Event, Projection, Txn, decode_txn};
use crate::storage::{self, LogBackend, RecordReader};

use super::{Inner, Ledger, LedgerError, LedgerState, snapshot};

impl Ledger {
    /// Apply every record after the projection's last sequence (after rebuilding
    /// the projection from the log, if it may not follow it).
    pub(super) fn catch_up_with(&self, inner: &mut Inner) -> Result<(), LedgerError> {
        for attempt in 0..2 {
            if inner.stale {
                let r = replay(&*self.backend)?;
                let last = r.projection.last_seq();
                inner.fenced.clear();
                (inner.tailer, inner.projection, inner.chain_head) = (r.tailer, r.projection, r.chain_head);
                (inner.snapshot_seq, inner.since_snapshot) = (r.snapshot_seq, r.applied);
                inner.stale = false;
                inner.caught_up_to(last);
                tracing::info!(last_seq = last, "the ledger's state was rebuilt from the log");
            }
            match Self::catch_up(inner) {
                // Another writer's group this ledger read while it was being synced
                // was cut back (its sync failed): rebuilt from the log, at once.
                Err(LedgerError::Storage(storage::Error::CutUnderReader { .. })) if attempt == 0 => {
                    tracing::warn!("records this ledger read were cut back by their writer; rebuilding");
                    inner.stale = true;
                }
                Err(LedgerError::Storage(e)) if e.is_transient() => {
                    // Read part way, perhaps: rebuilt from the log next time.
                    inner.stale = true;
                    return Err(LedgerError::Storage(e));
                }
                r => return r,
            }
        }
        unreachable!("the second attempt returns")
    }

    /// Apply every record after the projection's last sequence.
    fn catch_up(inner: &mut Inner) -> Result<(), LedgerError> {
        let LedgerState { tailer, projection, chain_head, since_snapshot, .. } = &mut **inner;
        let read_from = tailer.next_seq();
        let applied = apply_tail(tailer.as_mut(), projection, chain_head, since_snapshot);
        let (last, read_to) = (projection.last_seq(), tailer.next_seq());
        if last > inner.last_seq() {
            inner.others_seen = Some(Instant::now());
        }
        if let Err(e) = applied {
            let transient = matches!(&e, LedgerError::Storage(s) if s.is_transient());
            // A sync of what the tailer read failed: it reads nothing more, so
            // the state can follow the log no further (WRITER_POISONED, and a
            // daemon is not ready) — until the log is opened again.
            let unsynced = matches!(&e, LedgerError::Storage(s) if s.is_read_sync_failure());
            if unsynced || (!transient && (last != inner.last_seq() || read_to != read_from)) {
                // Records were applied, or read past, before the failure: the
                // projection no longer follows the log (a later catch-up would not
                // read them again), and every later answer would rest on a
                // half-read tail. Until reopen, none is given.
                inner.poison(format!("catching up failed after record {last}: {e}"));
            }
            return Err(e);
        }
        inner.caught_up_to(last);
        Ok(())
    }

    /// Replay from the newest vouched snapshot, with the other writer's records.
    /// Audit windows counted attempts judged on the discarded state: the retries
    /// count them again, and the first is written again.
    ///
    /// The backend unreachable meanwhile (etcd without a leader, say): nothing is
    /// poisoned — the state is marked stale and rebuilt by the next catch-up,
    /// which every retried judgement makes first (and which fails, transiently,
    /// while the backend stays unreachable).
    pub(super) fn rebuild_from_log(&self, core: &mut Inner) -> Result<(), String> {
        core.fenced.clear();
        core.others_seen = Some(Instant::now());
        let r = match replay(&*self.backend) {
            Ok(r) => r,
            Err(LedgerError::Storage(e)) if e.is_transient() => {
                tracing::warn!(error = %e, "catching up after another writer appended: the log is unreachable; later");
                core.stale = true;
                return Ok(());
            }
            Err(e) => return Err(e.to_string()),
        };
        let last = r.projection.last_seq();
        (core.tailer, core.projection, core.chain_head) = (r.tailer, r.projection, r.chain_head);
        (core.snapshot_seq, core.since_snapshot) = (r.snapshot_seq, r.applied);
        core.caught_up_to(last);
        Ok(())
    }
}

/// What the log gives when replayed: the newest snapshot the chain vouches for (if
/// any), then every record after it, verified.
pub(super) struct Replayed {
    pub(super) tailer: Box<dyn RecordReader>,
    pub(super) projection: Projection,
    pub(super) chain_head: ChainLink,
    pub(super) snapshot_seq: Option<u64>,
    pub(super) warnings: Vec<String>,
    /// Records and payload bytes applied after the snapshot.
    pub(super) applied: SinceSnapshot,
    /// Records this replay read and applied.
    pub(super) read: u64,
}

/// Records, and their payload bytes, applied since the last snapshot: what decides
/// when the next one is due (`LedgerOptions::snapshot_every_records`, `…_bytes`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct SinceSnapshot {
    pub(super) records: u64,
    pub(super) bytes: u64,
}

impl SinceSnapshot {
    pub(super) fn count(&mut self, payload_bytes: u64) {
        self.records += 1;
        self.bytes += payload_bytes;
    }
}

/// How young a snapshot no checkpoint vouches for may be and still be taken for
/// one whose writer is appending its checkpoint (a short-lived writer appends it
/// at once; a daemon's background snapshot joins its next commit group): an
/// open ignores it either way, and warns only when it is older.
const SNAPSHOT_IN_FLIGHT_MS: u64 = 60_000;

/// Replay the log in `dir`: try each snapshot (the newest few, newest first); one
/// is adopted only if the log holds its chain head and a checkpoint record with
/// the blake3 of its body — checked by a pass over the tail *before* the snapshot
/// is decoded, so a file no checkpoint vouches for never costs more than a
/// streaming read. A snapshot beyond the end of the log is evidence that records
/// were cut: refused. Otherwise replay from record 1.
pub(super) fn replay(backend: &dyn LogBackend) -> Result<Replayed, LedgerError> {
    let (metas, mut warnings) = backend.newest_snapshots();
    let fresh = |from: u64| Replayed {
        tailer: backend.reader(from),
        projection: Projection::default(),
        chain_head: GENESIS_LINK,
        snapshot_seq: None,
        warnings: vec![],
        applied: SinceSnapshot::default(),
        read: 0,
    };
    for m in metas {
        let mut ignored = |why: String| {
            let w = format!("{}: {why}; snapshot ignored", m.source);
            tracing::warn!("{w}");
            warnings.push(w);
        };
        // One pass over the records from the snapshot's sequence on: is it vouched
        // for, and (kept, up to a bound) the transactions to apply after it.
        let mut tail = vouch_and_collect(backend, &m)?;
        match tail.verdict {
            Vouched::Yes => {}
            Vouched::NoCheckpoint if backend.snapshot_age_ms(&m).is_some_and(|ms| ms < SNAPSHOT_IN_FLIGHT_MS) => {
                // Its writer is most likely appending the checkpoint now: kept in
                // the report, not warned about.
                let w = format!(
                    "{}: no checkpoint record vouches for it yet (stored just now); snapshot ignored",
                    m.source
                );
                tracing::debug!("{w}");
                warnings.push(w);
                continue;
            }
            Vouched::NoCheckpoint | Vouched::DigestDiffers => {
                ignored(format!("no checkpoint record in the log vouches for it (digest {})", hex(&m.digest)));
                continue;
            }
            Vouched::HeadDiffers => {
                ignored(format!("the log does not hold the snapshot's {}", snapshot::describe(m.seq, &m.chain_head)));
                continue;
            }
        }
        let projection = match backend.snapshot_body(&m).and_then(|b| snapshot::decode(&b, m.seq)) {
            Ok(p) => p,
            Err(e) => {
                ignored(e);
                continue;
            }
        };
        let mut r = Replayed {
            tailer: tail.reader,
            projection,
            chain_head: m.chain_head,
            snapshot_seq: Some(m.seq),
            warnings: vec![],
            applied: SinceSnapshot::default(),
            read: 0,
        };
        match tail.records.take() {
            Some(records) => {
                for (seq, txn, link, bytes) in records {
                    r.projection.apply_replayed(seq, &txn);
                    r.chain_head = link;
                    r.applied.count(bytes);
                }
            }
            None => {
                // The tail was too long to keep: read it again, applying.
                r.tailer = backend.reader(m.seq);
                let Replayed { tailer, projection, chain_head, applied, .. } = &mut r;
                apply_tail(tailer.as_mut(), projection, chain_head, applied)?;
            }
        }
        r.warnings = warnings;
        r.read = r.applied.records;
        return Ok(r);
    }
    let mut r = fresh(1);
    let Replayed { tailer, projection, chain_head, applied, .. } = &mut r;
    apply_tail(tailer.as_mut(), projection, chain_head, applied)?;
    r.warnings = warnings;
    r.read = r.applied.records;
    Ok(r)
}

/// The state handed over by the ledger of the process this one was forked from
/// (see [`Ledger::open_handed_over`](super::Ledger::open_handed_over)), with
/// every record after it applied: the record at its last sequence must carry its
/// chain head.
pub(super) fn resume(backend: &dyn LogBackend, h: super::HandedOver) -> Result<Replayed, LedgerError> {
    fail::fail_point!("ledger::resume", |_| Err(LedgerError::SnapshotNotInLog("injected".into())));
    let super::HandedOver { projection, chain_head, snapshot_seq, since_snapshot } = h;
    let mut r = Replayed {
        tailer: backend.reader(projection.last_seq().max(1)),
        projection,
        chain_head,
        snapshot_seq,
        warnings: vec![],
        applied: since_snapshot,
        read: 0,
    };
    let Replayed { tailer, projection, chain_head, applied, .. } = &mut r;
    apply_tail(tailer.as_mut(), projection, chain_head, applied)?;
    r.read = r.applied.records - since_snapshot.records;
    Ok(r)
}

enum Vouched {
    Yes,
    /// No checkpoint record names the snapshot's sequence.
    NoCheckpoint,
    /// Checkpoint records name its sequence, none with its digest: the file is
    /// not the one they vouched for.
    DigestDiffers,
    HeadDiffers,
}

/// Decoded records kept from the tail after a snapshot in the vouching pass, so
/// that boot reads the tail once; beyond this many it is read again instead.
const TAIL_RECORDS_KEPT_MAX: usize = 200_000;

/// A kept record: sequence, transaction, chain link, payload bytes.
type KeptRecord = (u64, Txn, ChainLink, u64);

struct Tail {
    verdict: Vouched,
    /// Positioned after the last record.
    reader: Box<dyn RecordReader>,
    /// The records after the snapshot, unless there were too many to keep.
    records: Option<Vec<KeptRecord>>,
}

/// Does the log vouch for this snapshot? One pass over the records from its
/// sequence on (verified, decoded, not applied): its chain head, a checkpoint with
/// its digest, and the transactions after it. A snapshot beyond the end of the log
/// is refused: records were cut. A record that does not decode is `CORRUPTION`.
fn vouch_and_collect(backend: &dyn LogBackend, m: &snapshot::SnapshotMeta) -> Result<Tail, LedgerError> {
    let mut reader = backend.reader(m.seq);
    let (mut last, mut head_ok, mut found, mut named) = (0, false, false, false);
    let mut records = Some(Vec::new());
    let mut undecodable = None;
    reader.poll(&mut |r| {
        last = r.seq;
        if r.seq == m.seq {
            head_ok = r.link == m.chain_head;
            return;
        }
        if r.seq < m.seq || undecodable.is_some() {
            return;
        }
        match decode_txn(r.payload) {
            Ok(txn) => {
                for e in &txn.events {
                    if let Event::Checkpoint { snapshot_seq, digest } = e
                        && *snapshot_seq == m.seq
                    {
                        named = true;
                        found |= *digest == m.digest;
                    }
                }
                match records.as_mut() {
                    Some(kept) if kept.len() < TAIL_RECORDS_KEPT_MAX => {
                        kept.push((r.seq, txn, r.link, r.payload.len() as u64))
                    }
                    _ => records = None,
                }
            }
            Err(e) => undecodable = Some(LedgerError::UndecodableRecord { seq: r.seq, detail: e.detail }),
        }
    })?;
    if let Some(e) = undecodable {
        return Err(e);
    }
    if last < m.seq {
        return Err(LedgerError::LogShorterThanSnapshot {
            snapshot: m.source.clone(),
            snapshot_seq: m.seq,
            log_last_seq: last,
        });
    }
    let verdict = if !head_ok {
        Vouched::HeadDiffers
    } else if found {
        Vouched::Yes
    } else if named {
        Vouched::DigestDiffers
    } else {
        Vouched::NoCheckpoint
    };
    Ok(Tail { verdict, reader, records })
}

/// Records a replay applies on the reading thread before it hands applying to a
/// second thread (a short tail is not worth a thread).
const REPLAY_INLINE_RECORDS_MAX: u64 = 4096;
/// Records handed to the applying thread at a time (at most this many, and sent as
/// soon as their payloads reach the byte bound), and how many such batches may
/// wait: a slow apply holds the reader back. In flight at once: the queued
/// batches, the one being applied and the one being filled, each at most
/// `REPLAY_BATCH_BYTES_MAX` plus one payload.
const REPLAY_BATCH_RECORDS: usize = 1024;
const REPLAY_BATCH_BYTES_MAX: usize = 4 << 20;
const REPLAY_BATCHES_QUEUED_MAX: usize = 4;

/// Verified records on their way to the applying thread: their payloads end to end,
/// and for each its sequence, chain link and where its payload ends.
#[derive(Default)]
struct RecordBatch {
    payloads: Vec<u8>,
    records: Vec<(u64, ChainLink, usize)>,
}

/// Decodes and applies records in order; past an undecodable one it applies
/// nothing more. (Decoding here, on the thread that applies, keeps each
/// transaction's allocations on one thread: freed where they were made.)
struct Applier<'a> {
    projection: &'a mut Projection,
    chain_head: ChainLink,
    applied: SinceSnapshot,
    undecodable: Option<LedgerError>,
}

impl Applier<'_> {
    fn take(&mut self, seq: u64, link: ChainLink, payload: &[u8]) {
        if self.undecodable.is_some() {
            return;
        }
        match decode_txn(payload) {
            Ok(txn) => self.projection.apply_replayed(seq, &txn),
            Err(e) => {
                self.undecodable = Some(LedgerError::UndecodableRecord { seq, detail: e.detail });
                return;
            }
        }
        self.applied.count(payload.len() as u64);
        self.chain_head = link;
    }

    fn take_batch(&mut self, b: &RecordBatch) {
        let mut start = 0;
        for &(seq, link, end) in &b.records {
            self.take(seq, link, &b.payloads[start..end]);
            start = end;
        }
    }
}

/// Read, verify and apply every record after the projection's last sequence. The
/// record at that sequence (if read again) must carry `chain_head`. A long tail is
/// replayed by two threads: this one reads and verifies (with helpers checking the
/// chain, storage's `LinksAhead`); a second decodes and applies, in order, what the
/// first hands it — the projection is touched by one thread only and in sequence
/// order, so the result is the one thread's result.
fn apply_tail(
    tailer: &mut dyn RecordReader,
    projection: &mut Projection,
    chain_head: &mut ChainLink,
    applied: &mut SinceSnapshot,
) -> Result<(), LedgerError> {
    let expect_head = (projection.last_seq(), *chain_head);
    let mut head_checked = projection.last_seq() == 0 || tailer.next_seq() > projection.last_seq();
    let mut mismatch = None;
    let applier = Applier { projection, chain_head: *chain_head, applied: *applied, undecodable: None };
    let (polled, applier) = std::thread::scope(|s| {
        let mut inline = Some(applier);
        let mut pipe = None;
        let mut batch = RecordBatch::default();
        let mut inline_records = 0u64;
        let polled = tailer.poll(&mut |r| {
            if r.seq <= expect_head.0 {
                if r.seq == expect_head.0 {
                    head_checked = true;
                    if r.link != expect_head.1 {
                        mismatch = Some(r.seq);
                    }
                }
                return;
            }
            if let Some(a) = inline.as_mut() {
                a.take(r.seq, r.link, r.payload);
                inline_records += 1;
                if inline_records == REPLAY_INLINE_RECORDS_MAX {
                    pipe = hand_over(s, &mut inline);
                }
                return;
            }
            batch.payloads.extend_from_slice(r.payload);
            batch.records.push((r.seq, r.link, batch.payloads.len()));
            if batch.records.len() == REPLAY_BATCH_RECORDS || batch.payloads.len() >= REPLAY_BATCH_BYTES_MAX {
                send_batch(pipe.as_ref().expect("the applying thread runs"), &mut batch);
            }
        });
        (polled, finish(inline, pipe, batch))
    });
    polled?;
    *chain_head = applier.chain_head;
    *applied = applier.applied;
    if let Some(e) = applier.undecodable {
        return Err(e);
    }
    if mismatch.is_some() || !head_checked {
        return Err(LedgerError::SnapshotNotInLog(snapshot::describe(expect_head.0, &expect_head.1)));
    }
    Ok(())
}

/// The applying thread of a long replay, with the queue of batches it applies and
/// the one on which it hands applied batches back.
type Pipe<'scope, 'a> = (
    std::sync::mpsc::SyncSender<RecordBatch>,
    std::sync::mpsc::Receiver<RecordBatch>,
    std::thread::ScopedJoinHandle<'scope, Applier<'a>>,
);

/// Hand the applier over to a thread of its own (in `apply_tail`'s scope), which
/// applies the batches sent to it. `None`, the applier back in `inline`, when no
/// thread is to be had.
fn hand_over<'scope, 'a: 'scope>(
    s: &'scope std::thread::Scope<'scope, '_>,
    inline: &mut Option<Applier<'a>>,
) -> Option<Pipe<'scope, 'a>> {
    let (tx, rx) = std::sync::mpsc::sync_channel::<RecordBatch>(REPLAY_BATCHES_QUEUED_MAX);
    let (spent_tx, spent_rx) = std::sync::mpsc::channel::<RecordBatch>();
    let applier = std::sync::Arc::new(std::sync::Mutex::new(inline.take()));
    let handed = std::sync::Arc::clone(&applier);
    let applying = std::thread::Builder::new().name("fencelog-replay".into()).spawn_scoped(s, move || {
        let mut a = handed.lock().expect("applier").take().expect("handed over");
        for b in rx {
            a.take_batch(&b);
            let _ = spent_tx.send(b); // its buffers are used again
        }
        a
    });
    match applying {
        Ok(applying) => Some((tx, spent_rx, applying)),
        // No thread to be had (a pid limit): go on applying here.
        Err(e) => {
            tracing::warn!("replay goes on in one thread: {e}");
            *inline = applier.lock().expect("applier").take();
            None
        }
    }
}

/// Send the filled batch to the applying thread and begin the next one.
fn send_batch(pipe: &Pipe<'_, '_>, batch: &mut RecordBatch) {
    let (tx, spent, _) = pipe;
    // A returned batch is used again unless a large payload grew it.
    let mut next =
        spent.try_recv().ok().filter(|b| b.payloads.capacity() <= 2 * REPLAY_BATCH_BYTES_MAX).unwrap_or_default();
    next.payloads.clear();
    next.records.clear();
    // It only stops early by panicking, which the join in `finish` reports.
    let _ = tx.send(std::mem::replace(batch, next));
}

/// The applier once every record read is applied: the inline one, or the
/// applying thread's after it applied the last, partly filled batch (a panic
/// there goes on here).
fn finish<'a>(inline: Option<Applier<'a>>, pipe: Option<Pipe<'_, 'a>>, batch: RecordBatch) -> Applier<'a> {
    match (inline, pipe) {
        (Some(a), _) => a,
        (None, Some((tx, _, applying))) => {
            if !batch.records.is_empty() {
                let _ = tx.send(batch);
            }
            drop(tx);
            applying.join().unwrap_or_else(|p| std::panic::resume_unwind(p))
        }
        (None, None) => unreachable!("the applier is inline or on its thread"),
    }
}
