//! `ledger`: the embedded API. `open` = recover the log, load the newest valid
//! snapshot, replay the tail. `submit` = take the append lock, catch up with every
//! record other processes appended, build and check the transaction against the
//! up-to-date projection, append it if the head is where the check saw it
//! (`append_if_head`), sync, apply, release. So a transaction is always validated
//! against exactly the state it is appended after, across processes. The ledger
//! uses only lock / read-from-sequence / append-if-head / sync, the narrow interface
//! a replicated backend can implement.
//!
//! ```
//! use fencelog::ledger::{Ledger, LedgerOptions, identity};
//! use fencelog::model::{Event, Txn};
//! let dir = tempfile::tempdir().unwrap();
//! let ledger = Ledger::open(dir.path(), LedgerOptions::default()).unwrap();
//! let me = identity::probe(std::process::id(), uuid::Uuid::new_v4()).unwrap();
//! let claim = ledger
//!     .submit(None, |_p, now_ms, writer| Ok(Txn {
//!         request: None, time_ms: now_ms, writer, conditions: vec![],
//!         events: vec![Event::Claim { subject: "home/a".into(), owner: me.clone(),
//!                                     stale_after_ms: 20_000, lock: None, previous: None }],
//!     }))
//!     .unwrap();
//! assert_eq!(claim.seq, Some(1));
//! assert_eq!(ledger.projection().subject("home/a").unwrap().generation, 1);
//! ```

pub mod identity;
pub mod snapshot;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use serde::Serialize;

use crate::format::{ChainLink, GENESIS_LINK, hex};
use crate::model::{
    Checked, Event, Outcome, Projection, REQUESTS_RETAINED, Refusal, RequestTag, Txn, decode_txn, encode_txn,
};
use crate::storage::{self, Log, LogOptions, OpenReport, Tailer, VerifyOnOpen, read_records};

#[derive(Debug, Clone)]
pub struct LedgerOptions {
    pub log: LogOptions,
    /// Write a snapshot after this many records applied since the last one.
    pub snapshot_every_records: u64,
    /// A stale writer's refused attempts on one subject are written at most once per
    /// this window, with a count.
    pub fenced_audit_window_ms: u64,
}

impl Default for LedgerOptions {
    fn default() -> Self {
        LedgerOptions { log: LogOptions::default(), snapshot_every_records: 10_000, fenced_audit_window_ms: 1_000 }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum LedgerError {
    #[error("refused: {0}")]
    Refused(Refusal),
    #[error(transparent)]
    Storage(#[from] storage::Error),
    #[error("the log does not hold the snapshot's {0}")]
    SnapshotNotInLog(String),
}

impl LedgerError {
    pub fn code(&self) -> String {
        match self {
            LedgerError::Refused(r) => r.code(),
            LedgerError::Storage(e) => e.code().into(),
            LedgerError::SnapshotNotInLog(_) => "SNAPSHOT_NOT_IN_LOG".into(),
        }
    }
}

/// What a submitted transaction did.
#[derive(Debug, Clone, Serialize)]
pub struct Committed {
    /// Sequence of the record, or `None` when nothing needed writing.
    pub seq: Option<u64>,
    pub outcomes: Vec<Outcome>,
    /// The request id had already committed this content; this is that result.
    pub deduplicated: bool,
}

/// What became of a request id.
#[derive(Debug, Clone, Serialize)]
#[serde(tag = "status", rename_all = "snake_case")]
pub enum RequestStatus {
    Committed { request: String, seq: u64, outcomes: Vec<Outcome> },
    NeverCommitted { request: String, log_last_seq: u64 },
}

#[derive(Debug, Clone, Serialize)]
pub struct LedgerOpenReport {
    pub storage: OpenReport,
    pub snapshot_seq: Option<u64>,
    pub snapshot_warnings: Vec<String>,
    pub replayed_records: u64,
}

struct Inner {
    tailer: Tailer,
    projection: Projection,
    head: ChainLink,
    since_snapshot: u64,
    /// Coalescing of fenced attempts by subject.
    fenced: HashMap<String, FencedWindow>,
    snapshot_thread: Option<std::thread::JoinHandle<()>>,
}

/// Refused stale writes on one subject, since the last audit record written.
struct FencedWindow {
    last_written_ms: u64,
    /// Attempts not yet written, the first of them at `first_pending_ms`.
    pending: u64,
    first_pending_ms: u64,
    op: String,
    presented: u64,
    current: u64,
}

pub struct Ledger {
    dir: PathBuf,
    opts: LedgerOptions,
    log: Log,
    inner: Mutex<Inner>,
    report: LedgerOpenReport,
}

/// blake3 of the caller's intent, for request-id idempotency.
pub fn intent_digest<T: Serialize>(intent: &T) -> [u8; 32] {
    let bytes = bincode::serde::encode_to_vec(intent, bincode::config::standard()).expect("intent encodes");
    *blake3::hash(&bytes).as_bytes()
}

impl Ledger {
    pub fn open(dir: impl AsRef<Path>, opts: LedgerOptions) -> Result<Ledger, LedgerError> {
        let dir = dir.as_ref().to_path_buf();
        let (snap, mut warnings) =
            if dir.join(storage::SNAPSHOT_DIR).is_dir() { snapshot::load_newest(&dir) } else { (None, vec![]) };
        // Storage recovers the tail; the replay below verifies every record it reads
        // (from the snapshot's segment, or from record 1), so a full scan at open
        // would only read the log twice.
        let mut log_opts = opts.log.clone();
        log_opts.verify_on_open = VerifyOnOpen::LastSegment;
        let log = Log::open(&dir, log_opts)?;
        let body_max = opts.log.body_max();
        let fresh = |from: u64| Inner {
            tailer: Tailer::new(&dir, body_max, from),
            projection: Projection::default(),
            head: GENESIS_LINK,
            since_snapshot: 0,
            fenced: HashMap::new(),
            snapshot_thread: None,
        };
        let mut inner = fresh(1);
        let mut snapshot_seq = None;
        if let Some(s) = snap {
            // Adopt the snapshot only if the log holds its exact chain head.
            let mut candidate = fresh(s.seq);
            candidate.projection = s.projection;
            candidate.head = s.head;
            match Self::catch_up(&mut candidate) {
                Ok(()) => {
                    snapshot_seq = Some(s.seq);
                    inner = candidate;
                }
                Err(e) => {
                    warnings.push(format!("{}: {e}; snapshot ignored, replaying the whole log", s.path.display()))
                }
            }
        }
        if snapshot_seq.is_none() {
            Self::catch_up(&mut inner)?;
        }
        let report = LedgerOpenReport {
            storage: log.open_report().clone(),
            snapshot_seq,
            snapshot_warnings: warnings,
            replayed_records: inner.projection.last_seq - snapshot_seq.unwrap_or(0),
        };
        Ok(Ledger { dir, opts, log, inner: Mutex::new(inner), report })
    }

    /// Apply every record after the projection's last sequence. A snapshot's own
    /// record is re-read to prove the log still holds the snapshot's chain head.
    fn catch_up(inner: &mut Inner) -> Result<(), LedgerError> {
        let Inner { tailer, projection, head, since_snapshot, .. } = inner;
        let expect_head = (projection.last_seq, *head);
        let mut head_checked = projection.last_seq == 0 || tailer.next_seq() > projection.last_seq;
        let mut mismatch = None;
        let applied = tailer.poll(|r| {
            if r.seq <= projection.last_seq {
                if r.seq == expect_head.0 {
                    head_checked = true;
                    if r.link != expect_head.1 {
                        mismatch = Some(r.seq);
                    }
                }
                return;
            }
            match decode_txn(r.payload) {
                Ok(txn) => {
                    let _ = projection.apply(r.seq, &txn);
                }
                Err(e) => {
                    tracing::error!(seq = r.seq, error = %e, "undecodable record skipped");
                    projection.skip_undecodable(r.seq);
                }
            }
            *head = r.link;
        })?;
        if mismatch.is_some() || !head_checked {
            return Err(LedgerError::SnapshotNotInLog(snapshot::describe(expect_head.0, &expect_head.1)));
        }
        *since_snapshot += applied;
        Ok(())
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn open_report(&self) -> &LedgerOpenReport {
        &self.report
    }

    pub fn writer_id(&self) -> uuid::Uuid {
        self.log.writer_id()
    }

    /// A copy of the projection as of the last catch-up.
    pub fn projection(&self) -> Projection {
        self.inner.lock().expect("ledger").projection.clone()
    }

    /// Catch up with other writers, then return the projection.
    pub fn refresh(&self) -> Result<Projection, LedgerError> {
        let mut inner = self.inner.lock().expect("ledger");
        Self::catch_up(&mut inner)?;
        Ok(inner.projection.clone())
    }

    /// Build a transaction against the up-to-date projection (`build(projection,
    /// now_ms, writer)`), check it, append it and sync, all while holding the append
    /// lock, so no other writer can move the state in between. `request` makes it
    /// idempotent: (id, intent digest).
    pub fn submit(
        &self,
        request: Option<(String, [u8; 32])>,
        build: impl FnOnce(&Projection, u64, uuid::Uuid) -> Result<Txn, Refusal>,
    ) -> Result<Committed, LedgerError> {
        let mut guard = self.inner.lock().expect("ledger");
        let inner = &mut *guard;
        self.log.with_lock(|l| {
            Self::catch_up(inner)?;
            let now_ms = self.opts.log.now_ms();
            let mut txn = build(&inner.projection, now_ms, self.writer_id()).map_err(LedgerError::Refused)?;
            txn.request = request.map(|(id, digest)| RequestTag { id, digest });
            let head = inner.projection.last_seq;
            match inner.projection.check(head + 1, &txn) {
                Ok(Checked::Deduplicated(e)) => {
                    return Ok(Committed { seq: Some(e.seq), outcomes: e.outcomes, deduplicated: true });
                }
                Ok(Checked::Valid { outcomes, writes: false }) => {
                    return Ok(Committed { seq: None, outcomes, deduplicated: false });
                }
                Ok(Checked::Valid { .. }) => {}
                Err(r) => {
                    if let Refusal::Fenced { subject, presented, current } = &r
                        && let Some(op) = txn.events.iter().find(|e| e.subject() == Some(subject)).map(Event::kind)
                    {
                        self.audit_fenced(l, inner, subject, op, *presented, *current, now_ms)?;
                    }
                    return Err(LedgerError::Refused(r));
                }
            }
            let a = l.append_if_head(head, vec![encode_txn(&txn)])?;
            let outcomes = inner.projection.apply(a.first_seq, &txn).map_err(LedgerError::Refused)?;
            inner.head = a.chain_head;
            inner.since_snapshot += 1;
            self.maybe_snapshot(inner);
            Ok(Committed { seq: Some(a.first_seq), outcomes, deduplicated: false })
        })?
    }

    /// Keep a compact audit record of a stale writer's refused attempt: at most one
    /// per subject per window from this writer; repeats within the window are counted
    /// and written with the next record (or on `close`).
    #[allow(clippy::too_many_arguments)]
    fn audit_fenced(
        &self,
        l: &mut storage::Locked<'_>,
        inner: &mut Inner,
        subject: &str,
        op: &str,
        presented: u64,
        current: u64,
        now_ms: u64,
    ) -> Result<(), LedgerError> {
        const SUBJECTS_TRACKED_MAX: usize = 10_000;
        if inner.fenced.len() >= SUBJECTS_TRACKED_MAX && !inner.fenced.contains_key(subject) {
            inner.fenced.retain(|_, f| f.pending > 0);
        }
        let w = inner.fenced.entry(subject.to_owned()).or_insert(FencedWindow {
            last_written_ms: 0,
            pending: 0,
            first_pending_ms: now_ms,
            op: String::new(),
            presented,
            current,
        });
        if w.pending == 0 {
            w.first_pending_ms = now_ms;
        }
        w.pending += 1;
        (w.op, w.presented, w.current) = (op.to_owned(), presented, current);
        if w.last_written_ms != 0 && now_ms.saturating_sub(w.last_written_ms) < self.opts.fenced_audit_window_ms {
            return Ok(());
        }
        self.write_fenced(l, inner, subject, now_ms)
    }

    /// Append the `FencedAttempts` record for the attempts pending on `subject`.
    fn write_fenced(
        &self,
        l: &mut storage::Locked<'_>,
        inner: &mut Inner,
        subject: &str,
        now_ms: u64,
    ) -> Result<(), LedgerError> {
        let w = inner.fenced.get_mut(subject).expect("a window exists for a pending subject");
        let event = Event::FencedAttempts {
            subject: subject.to_owned(),
            writer: self.writer_id(),
            op: w.op.clone(),
            presented: w.presented,
            current: w.current,
            count: std::mem::take(&mut w.pending),
            first_ms: w.first_pending_ms,
            last_ms: now_ms,
        };
        w.last_written_ms = now_ms;
        let txn =
            Txn { request: None, time_ms: now_ms, writer: self.writer_id(), conditions: vec![], events: vec![event] };
        let a = l.append_if_head(inner.projection.last_seq, vec![encode_txn(&txn)])?;
        let _ = inner.projection.apply(a.first_seq, &txn);
        inner.head = a.chain_head;
        Ok(())
    }

    /// "Committed at N" or "never committed": always answerable after the fact.
    pub fn request_status(&self, id: &str) -> Result<RequestStatus, LedgerError> {
        let p = self.refresh()?;
        if let Some(e) = p.requests.get(id) {
            return Ok(RequestStatus::Committed { request: id.into(), seq: e.seq, outcomes: e.outcomes.clone() });
        }
        if p.requests.len() >= REQUESTS_RETAINED {
            // The projection forgets old request ids; the log does not.
            let mut found = None;
            read_records(&self.dir, 1, self.opts.log.body_max(), |r| {
                if let Ok(txn) = decode_txn(r.payload)
                    && txn.request.as_ref().is_some_and(|t| t.id == id)
                {
                    found = Some(r.seq);
                    return false;
                }
                true
            })?;
            if let Some(seq) = found {
                return Ok(RequestStatus::Committed { request: id.into(), seq, outcomes: vec![] });
            }
        }
        Ok(RequestStatus::NeverCommitted { request: id.into(), log_last_seq: p.last_seq })
    }

    fn maybe_snapshot(&self, inner: &mut Inner) {
        if inner.since_snapshot < self.opts.snapshot_every_records {
            return;
        }
        // One snapshot in flight at a time, written off the append path.
        if let Some(t) = inner.snapshot_thread.take() {
            let _ = t.join();
        }
        inner.since_snapshot = 0;
        let (dir, head, p) = (self.dir.clone(), inner.head, inner.projection.clone());
        inner.snapshot_thread = Some(std::thread::spawn(move || {
            if let Err(e) = snapshot::write(&dir, p.last_seq, &head, &p) {
                tracing::warn!(error = %e, "snapshot not written");
            }
        }));
    }

    /// Write a snapshot now (also done on `close`).
    pub fn snapshot_now(&self) -> Result<PathBuf, LedgerError> {
        let mut inner = self.inner.lock().expect("ledger");
        if let Some(t) = inner.snapshot_thread.take() {
            let _ = t.join();
        }
        inner.since_snapshot = 0;
        Ok(snapshot::write(&self.dir, inner.projection.last_seq, &inner.head, &inner.projection)?)
    }

    /// Clean close: write the counts of coalesced fenced attempts not yet recorded,
    /// then a snapshot. (A crash loses only those counts: the first attempt of each
    /// window is always recorded.)
    pub fn close(self) -> Result<(), LedgerError> {
        self.flush_fenced()?;
        if self.inner.lock().expect("ledger").projection.last_seq > 0 {
            self.snapshot_now()?;
        }
        Ok(())
    }

    fn flush_fenced(&self) -> Result<(), LedgerError> {
        let mut guard = self.inner.lock().expect("ledger");
        let inner = &mut *guard;
        let pending: Vec<String> = inner.fenced.iter().filter(|(_, f)| f.pending > 0).map(|(s, _)| s.clone()).collect();
        if pending.is_empty() {
            return Ok(());
        }
        self.log.with_lock(|l| -> Result<(), LedgerError> {
            Self::catch_up(inner)?;
            let now_ms = self.opts.log.now_ms();
            pending.iter().try_for_each(|subject| self.write_fenced(l, inner, subject, now_ms))
        })?
    }

    /// The chain head (hex) at the projection's last sequence.
    pub fn chain_head(&self) -> String {
        hex(&self.inner.lock().expect("ledger").head)
    }
}

impl Drop for Ledger {
    /// A snapshot in flight is finished, never abandoned half-written (it is written
    /// to a temp file and renamed, so even a crash leaves no damaged `.snap`).
    fn drop(&mut self) {
        if let Ok(mut inner) = self.inner.lock()
            && let Some(t) = inner.snapshot_thread.take()
        {
            let _ = t.join();
        }
    }
}
