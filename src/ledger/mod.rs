//! `ledger`: the embedded API. `open` = recover the log, load the newest valid
//! snapshot, replay the tail. `submit` = under the append lock, catch up with every
//! record other processes appended, build and check the transaction against the
//! up-to-date projection, apply it, append it right after the state it was checked
//! against (`append_if_head`), sync, answer, release. So a transaction is always
//! validated against exactly the state it is appended after, across processes.
//! Threads of one process share syncs (group commit, see [`Ledger::submit`]). The ledger
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
//!     .submit(None, |_p, now_ms, writer| Ok(Txn::new(now_ms, writer, vec![Event::Claim {
//!         subject: "home/a".into(), owner: me.clone(), stale_after_ms: 20_000, lock: None, previous: None,
//!     }])))
//!     .unwrap();
//! assert_eq!(claim.seq, Some(1));
//! assert_eq!(ledger.projection().subject("home/a").unwrap().generation, 1);
//! ```

pub mod identity;
pub mod observer;
pub mod snapshot;

use crate::storage::Exclusive;
use crate::storage::commit::{
    Admission, AsyncCommit, CommitError, Core, GroupCommit, GroupLimits, Hooks, lead_on_blocking_pool,
};
pub use crate::storage::commit::{GROUPS_PER_LOCK_MAX, HEAD_MOVED_RETRIES_MAX};

use std::collections::HashMap;
use std::path::Path;
use std::sync::MutexGuard;
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::format::{ChainLink, GENESIS_LINK, hex};
use crate::model::{
    CallerId, Checked, Event, Outcome, Projection, REQUESTS_RETAINED, Refusal, RefusedContent, RequestTag, Txn,
    decode_txn, encode_txn,
};
use std::sync::Arc;

use crate::storage::{self, FileBackend, LogBackend, LogOptions, OpenReport, RecordReader, VerifyOnOpen};

#[derive(Debug, Clone)]
pub struct LedgerOptions {
    pub log: LogOptions,
    /// Write a snapshot after this many records applied since the last one — or
    /// after as many records as the state has entries (subjects, requests
    /// remembered, processes, leases), if that is more: a snapshot copies the whole
    /// state under the commit lock, so its cost per record stays bounded however
    /// large the state grows, and a replay after it never reads more records than
    /// the snapshot holds entries.
    pub snapshot_every_records: u64,
    /// … or after this many record bytes (payloads) applied since the last one,
    /// whichever comes first.
    pub snapshot_every_bytes: u64,
    /// A stale writer's refused attempts on one subject are written at most once per
    /// this window, with a count.
    pub fenced_audit_window_ms: u64,
    /// This writer's host id, as it records owners, processes and observed
    /// staleness on a log shared by hosts (default: [`identity::host_id`]). An
    /// embedding program may name its host; tests simulate hosts with it.
    pub host: Option<String>,
}

impl Default for LedgerOptions {
    fn default() -> Self {
        LedgerOptions {
            log: LogOptions::default(),
            snapshot_every_records: 10_000,
            snapshot_every_bytes: 64 << 20,
            fenced_audit_window_ms: 1_000,
            host: None,
        }
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
    /// Another writer kept appending first: judged again this many times.
    #[error("another writer appended first {retries} times in a row; the transaction was not appended")]
    HeadMovedTooOften { retries: u32 },
    /// The ledger is draining (a cutover): this transaction was not judged and
    /// will never be appended.
    #[error("the ledger is draining for a cutover: the transaction was not judged and will never be appended")]
    Draining,
    /// A record whose checksum and chain hold but whose payload does not decode:
    /// replay never skips it (the projection would silently diverge).
    #[error(
        "record {seq} does not decode ({detail}); the projection cannot be rebuilt past it. If a newer fencelog \
         wrote it, use that version"
    )]
    UndecodableRecord { seq: u64, detail: String },
    /// A snapshot (written only from durable state) covers records the log no
    /// longer holds: records were cut from the end, or the snapshot is another
    /// log's.
    #[error(
        "the log ends at sequence {log_last_seq} but the snapshot {snapshot} covers sequence {snapshot_seq}: records \
         were cut from the end of the log (if the snapshot belongs to another log, move it away)"
    )]
    LogShorterThanSnapshot { snapshot: String, snapshot_seq: u64, log_last_seq: u64 },
}

impl LedgerError {
    pub fn code(&self) -> &'static str {
        match self {
            LedgerError::Refused(r) => r.code(),
            LedgerError::Storage(e) => e.code(),
            LedgerError::SnapshotNotInLog(_) => "SNAPSHOT_NOT_IN_LOG",
            LedgerError::Draining => "DRAINING",
            LedgerError::HeadMovedTooOften { .. } => "HEAD_MOVED",
            LedgerError::UndecodableRecord { .. } | LedgerError::LogShorterThanSnapshot { .. } => "CORRUPTION",
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

/// What `Ledger::drain` found.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Drained {
    /// Every judged transaction is durable (or failed) — else the wait ran out.
    pub settled: bool,
    /// The last durable sequence.
    pub last_seq: u64,
}

/// What became of a request id.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
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

/// The ledger's state, kept under the commit engine's mutex (`Core` derefs to it).
struct LedgerState {
    tailer: Box<dyn RecordReader>,
    projection: Projection,
    head: ChainLink,
    /// Records and payload bytes applied since the last snapshot.
    since_snapshot: (u64, u64),
    /// Coalescing of recorded refusals by (subject, code, operation, caller).
    fenced: HashMap<String, FencedWindow>,
    /// The snapshot being written off the append path; once it is written, its
    /// checkpoint record goes into the next commit group.
    snapshot_thread: Option<std::thread::JoinHandle<Option<snapshot::SnapshotMeta>>>,
    /// Sequence of the last checkpoint record this ledger appended: a snapshot
    /// asked for right after it would differ only by that record, so it is skipped.
    own_checkpoint_seq: u64,
    /// Where this ledger's last snapshot went (for `snapshot_now`'s answer).
    last_snapshot: Option<String>,
    /// The projection may not follow the log: an append's outcome is unknown (the
    /// backend was unreachable), or a catch-up stopped part way for the same
    /// reason. Rebuilt from the log (replay) before it is used again.
    stale: bool,
    /// When this ledger last met another writer's records (a catch-up read them,
    /// or an append found the head moved): an optimistic backend's writer reads
    /// before judging only while others write.
    others_seen: Option<Instant>,
}

/// How long after meeting another writer's records a writer on an optimistic
/// backend still catches up before each turn's judgements.
const OTHERS_RECENT_MS: u64 = 1_000;

/// The engine's state with the ledger's: the projection runs ahead of the
/// engine's durable sequence only while a group is being committed (its last
/// sequence is always the engine's `last_seq`).
type Inner = Core<LedgerState>;

/// Refused attempts of one (subject, code, operation, caller), since the last record of
/// them this writer wrote.
struct FencedWindow {
    /// When this writer last wrote a record of them (0: never).
    last_written_ms: u64,
    /// Attempts not yet written, the first of them at `first_pending_ms`.
    pending: u64,
    first_pending_ms: u64,
    /// The last attempt's details (what the record says).
    subject: String,
    code: &'static str,
    op: String,
    caller: CallerId,
    presented: Option<u64>,
    current: u64,
    retired: Option<u64>,
    /// The content of the first refused data write not yet written.
    content: Option<RefusedContent>,
}

/// What a refusal that is kept as evidence says: subject, presented generation,
/// current generation, cut-off of the presented generation when it was retired.
/// `None` for refusals that are not recorded ([`crate::model::RECORDED_REFUSALS`]).
fn recorded(r: &Refusal, txn: &Txn) -> Option<(String, Option<u64>, u64, Option<u64>)> {
    let (subject, presented, current, retired) = match r {
        Refusal::Fenced { subject, presented, current, retired } => {
            (subject, Some(*presented), *current, retired.as_ref().map(|t| t.cut_off_seq))
        }
        // Only a data write to a released subject: a heartbeat or release after a
        // release is the owner's own late bookkeeping.
        Refusal::NotActive { subject, generation }
            if txn.events.iter().any(|e| matches!(e, Event::Note { subject: s, .. } if s == subject)) =>
        {
            (subject, Some(*generation), *generation, None)
        }
        Refusal::IdentityUncertain { subject, generation, .. } | Refusal::Busy { subject, generation, .. } => {
            (subject, None, *generation, None)
        }
        Refusal::TakeoverRace { subject, expected_generation, current_generation, .. } => {
            (subject, Some(*expected_generation), *current_generation, None)
        }
        Refusal::TakeoverActiveRefused { subject, generation, .. } => (subject, Some(*generation), *generation, None),
        _ => return None,
    };
    // Only the refusal of an event on that subject (a heartbeat, a note, a claim, a
    // takeover): a lease or a spawn on behalf of a fenced owner is the supervisor's
    // and the lease table's business, not kept.
    if !txn.events.iter().any(|e| e.subject() == Some(subject.as_str())) {
        return None;
    }
    debug_assert!(crate::model::RECORDED_REFUSALS.contains(&r.code()));
    Some((subject.clone(), presented, current, retired))
}

/// The refusal for a transaction whose data write (a note) comes under a
/// generation that is not the subject's current one, or whose tenure ended.
fn late_write(p: &Projection, txn: &Txn, outcomes: &[crate::model::Outcome]) -> Option<Refusal> {
    txn.events.iter().zip(outcomes).find_map(|(e, o)| match (e, o) {
        (Event::Note { subject, generation, .. }, crate::model::Outcome::Noted { authoritative: false, .. }) => {
            let current = p.subject(subject).map_or(0, |s| s.generation);
            Some(if *generation == current {
                Refusal::NotActive { subject: subject.clone(), generation: current }
            } else {
                p.fenced(subject, *generation)
            })
        }
        _ => None,
    })
}

pub struct Ledger {
    opts: LedgerOptions,
    backend: Arc<dyn LogBackend>,
    /// Where the log is, when it was opened by location (a runner started for one
    /// of its processes opens the same log).
    location: Option<storage::Location>,
    /// This process, as the caller of what it submits itself.
    me: CallerId,
    /// The one commit engine (`storage::commit`), over the ledger's state.
    group: GroupCommit<LedgerState>,
    report: LedgerOpenReport,
    /// This host, whether the log is shared by hosts, and what this writer has
    /// watched of owners' heartbeats on its own clock.
    observer: Arc<observer::Observer>,
}

/// blake3 of the caller's intent, for request-id idempotency.
pub fn intent_digest<T: Serialize>(intent: &T) -> [u8; 32] {
    let bytes = bincode::serde::encode_to_vec(intent, bincode::config::standard()).expect("intent encodes");
    *blake3::hash(&bytes).as_bytes()
}

impl Ledger {
    pub fn open(dir: impl AsRef<Path>, opts: LedgerOptions) -> Result<Ledger, LedgerError> {
        let dir = dir.as_ref().to_path_buf();
        // Storage recovers the tail and checks the whole history's headers and
        // seals; the replay below verifies every record it reads (from the vouched
        // snapshot's segment, or from record 1), so a full scan at open would only
        // read the log twice.
        let mut log_opts = opts.log.clone();
        log_opts.verify_on_open = VerifyOnOpen::LastSegment;
        let backend = FileBackend::open(&dir, log_opts)?;
        let mut l = Self::with_backend(Arc::new(backend), opts)?;
        l.location = Some(storage::Location::Dir(dir));
        Ok(l)
    }

    /// Open the log at `location`: a directory (as [`Ledger::open`]) or a prefix in
    /// an etcd cluster (whose commit groups are bounded by etcd's request limits).
    pub fn open_at(location: &storage::Location, mut opts: LedgerOptions) -> Result<Ledger, LedgerError> {
        if let Some(dir) = location.dir() {
            return Self::open(dir, opts);
        }
        opts.log = location.log_options(opts.log);
        let backend = location.open(opts.log.clone())?;
        let mut l = Self::with_backend(backend, opts)?;
        l.location = Some(location.clone());
        Ok(l)
    }

    /// Where this ledger's log is, if it was opened by location.
    pub fn location(&self) -> Option<&storage::Location> {
        self.location.as_ref()
    }

    /// The backend this ledger reads and appends through.
    pub fn backend(&self) -> &Arc<dyn LogBackend> {
        &self.backend
    }

    /// Where this ledger judges liveness from (this host; whether the log is
    /// shared by hosts).
    pub fn here(&self) -> &identity::Here {
        self.observer.here()
    }

    /// What this writer has watched of owners' heartbeats, on its own clock.
    pub fn observer(&self) -> &Arc<observer::Observer> {
        &self.observer
    }

    /// A ledger over any backend (the file backend, the in-memory one, later a
    /// replicated one): replay from the newest snapshot the chain vouches for.
    pub fn with_backend(backend: Arc<dyn LogBackend>, opts: LedgerOptions) -> Result<Ledger, LedgerError> {
        let r = replay(&*backend)?;
        let last_seq = r.projection.last_seq;
        let state = LedgerState {
            tailer: r.tailer,
            projection: r.projection,
            head: r.head,
            since_snapshot: r.applied,
            fenced: HashMap::new(),
            snapshot_thread: None,
            own_checkpoint_seq: 0,
            last_snapshot: None,
            stale: false,
            others_seen: None,
        };
        let report = LedgerOpenReport {
            storage: backend.open_report(),
            snapshot_seq: r.snapshot_seq,
            snapshot_warnings: r.warnings,
            replayed_records: last_seq - r.snapshot_seq.unwrap_or(0),
        };
        // `debug`: the daemon's one boot line (`ready`) says the same at `info`.
        tracing::debug!(
            segments = report.storage.segments,
            last_seq = report.storage.last_seq,
            repairs = report.storage.repairs.len(),
            snapshot_seq = report.snapshot_seq.unwrap_or(0),
            replayed = report.replayed_records,
            "ledger opened"
        );
        let group = GroupCommit::new(state, last_seq, GroupLimits::of(&opts.log));
        let mut here = identity::Here::new(backend.shared_by_hosts());
        if let Some(host) = &opts.host {
            here.host = identity::sanitize_host(host);
        }
        let observer = Arc::new(observer::Observer::new(here));
        Ok(Ledger {
            opts,
            backend,
            location: None,
            me: identity::caller_of(std::process::id(), None),
            group,
            report,
            observer,
        })
    }

    /// A read-only view of the log in `dir`: never writes, never takes the append
    /// lock, never creates anything (a missing or non-log directory is `NOT_A_LOG`).
    /// The whole history is checked from genesis; damage anywhere but a torn tail is
    /// `CORRUPTION`; a torn tail is answered from the intact prefix and reported.
    pub fn read_only(dir: impl AsRef<Path>, opts: &LedgerOptions) -> Result<ReadView, LedgerError> {
        Self::read_only_at(&storage::Location::Dir(dir.as_ref().to_path_buf()), opts)
    }

    /// [`read_only`](Self::read_only) of the log at `location`.
    pub fn read_only_at(location: &storage::Location, opts: &LedgerOptions) -> Result<ReadView, LedgerError> {
        let backend = location.open_read_only(&opts.log)?;
        let r = replay(&*backend)?;
        Ok(ReadView {
            here: identity::Here::new(backend.shared_by_hosts()),
            torn_tail: r.tailer.stopped_at_torn_tail(),
            projection: r.projection,
            head: r.head,
            snapshot_seq: r.snapshot_seq,
            snapshot_warnings: r.warnings,
            backend,
        })
    }

    /// Apply every record after the projection's last sequence (after rebuilding
    /// the projection from the log, if it may not follow it).
    fn catch_up_with(&self, inner: &mut Inner) -> Result<(), LedgerError> {
        for attempt in 0..2 {
            if inner.stale {
                let r = replay(&*self.backend)?;
                let last = r.projection.last_seq;
                inner.fenced.clear();
                (inner.tailer, inner.projection, inner.head) = (r.tailer, r.projection, r.head);
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
        let LedgerState { tailer, projection, head, since_snapshot, .. } = &mut **inner;
        let read_from = tailer.next_seq();
        let applied = apply_tail(tailer.as_mut(), projection, head, since_snapshot);
        let (last, read_to) = (projection.last_seq, tailer.next_seq());
        if last > inner.last_seq() {
            inner.others_seen = Some(Instant::now());
        }
        if let Err(e) = applied {
            let transient = matches!(&e, LedgerError::Storage(s) if s.is_transient());
            if !transient && (last != inner.last_seq() || read_to != read_from) {
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

    pub fn open_report(&self) -> &LedgerOpenReport {
        &self.report
    }

    pub fn writer_id(&self) -> uuid::Uuid {
        self.backend.writer_id()
    }

    /// What storage did: records appended and syncs made through this ledger's log
    /// (transactions committed together share one sync).
    pub fn commit_stats(&self) -> (u64, u64) {
        self.backend.commit_stats()
    }

    /// How often another writer appended first and this ledger judged its queued
    /// transactions again.
    pub fn head_moved_count(&self) -> u64 {
        self.group.lock().head_moved()
    }

    /// A copy of the projection as of the last catch-up (see `refresh`), without
    /// transactions still being synced (it waits for them).
    pub fn projection(&self) -> Projection {
        match self.settled() {
            Ok(inner) => inner.projection.clone(),
            // Poisoned: the projection may hold transactions the log lacks; it is
            // returned as it is, for diagnosis (every mutation now fails).
            Err(_) => self.group.lock().projection.clone(),
        }
    }

    /// Catch up with other writers, then look at the projection through `f`
    /// (no copy: what a poll of one entry should use).
    pub fn refresh_with<R>(&self, f: impl FnOnce(&Projection) -> R) -> Result<R, LedgerError> {
        let mut inner = self.settled()?;
        self.catch_up_with(&mut inner)?;
        Ok(f(&inner.projection))
    }

    /// Catch up with other writers, then a read view of the state (what `state`
    /// and `request show` answer from), as a read-only open would give.
    pub fn view(&self) -> Result<ReadView, LedgerError> {
        let mut inner = self.settled()?;
        self.catch_up_with(&mut inner)?;
        Ok(ReadView {
            here: self.here().clone(),
            projection: inner.projection.clone(),
            head: inner.head,
            torn_tail: false,
            snapshot_seq: None,
            snapshot_warnings: vec![],
            backend: Arc::clone(&self.backend),
        })
    }

    /// Catch up with other writers, then return the projection.
    pub fn refresh(&self) -> Result<Projection, LedgerError> {
        let mut inner = self.settled()?;
        self.catch_up_with(&mut inner)?;
        Ok(inner.projection.clone())
    }

    /// Build a transaction against the up-to-date projection (`build(projection,
    /// now_ms, writer)`), check it, append it and sync; `request` makes it
    /// idempotent: (id, intent digest).
    ///
    /// **Group commit.** Threads of one process submitting at once share syncs. The
    /// first takes the append lock (so no other process can move the state), catches
    /// up, and becomes the *flusher*: it hands queued records to storage, one sync per
    /// group, until none are left (or, after `GROUPS_PER_LOCK_MAX` groups while another
    /// process waits for the lock, until the ones already queued are synced), then
    /// releases the lock (`storage::commit`). Meanwhile arriving threads
    /// build and check their transactions against the projection *including the ones
    /// still being synced* (they will precede them in the log), apply them, queue
    /// their records and wait. Every answer — success, deduplication, refusal — is
    /// returned only once all the state it was judged on is durable; if a sync fails,
    /// the waiting transactions fail too and the ledger is poisoned until reopened.
    pub fn submit(
        &self,
        request: Option<(String, [u8; 32])>,
        build: impl FnMut(&Projection, u64, uuid::Uuid) -> Result<Txn, Refusal>,
    ) -> Result<Committed, LedgerError> {
        self.submit_as(&self.me.clone(), request, build)
    }

    /// [`submit`](Self::submit) on behalf of `caller`: a refusal that is kept as
    /// evidence names it (the CLI's caller, a daemon's client).
    pub fn submit_as(
        &self,
        caller: &CallerId,
        request: Option<(String, [u8; 32])>,
        mut build: impl FnMut(&Projection, u64, uuid::Uuid) -> Result<Txn, Refusal>,
    ) -> Result<Committed, LedgerError> {
        // `build` may run more than once: again whenever another writer appended
        // first (each run sees the state its transaction would follow).
        self.commit_with(Admission::Callers, |inner| self.check_and_queue(inner, caller, request.clone(), &mut build))
    }

    /// [`submit_as`](Self::submit_as) for an async caller (the daemon): when a
    /// commit group is open, the transaction is built and judged on the caller's
    /// own thread and its answer awaited without holding a thread; when none is,
    /// the caller leads one on the runtime's blocking pool. Same judgement, same
    /// answers. `caller: None` is this ledger's own process (as `submit`).
    ///
    /// Dropping the future after the transaction was queued does not withdraw it
    /// (see `GroupCommit::commit_async`): run it in a task of its own when every
    /// answer must be heard.
    pub async fn submit_as_async(
        self: &Arc<Self>,
        caller: Option<CallerId>,
        request: Option<(String, [u8; 32])>,
        mut build: impl FnMut(&Projection, u64, uuid::Uuid) -> Result<Txn, Refusal> + Send + 'static,
    ) -> Result<Committed, LedgerError> {
        let turn = {
            let who = caller.as_ref().unwrap_or(&self.me);
            let mut act = |inner: &mut Inner| self.check_and_queue(inner, who, request.clone(), &mut build);
            self.group.commit_async::<_, LedgerError>(Admission::Callers, &mut act).await
        };
        let settled = match turn {
            AsyncCommit::Done(r) => r,
            AsyncCommit::Lead => {
                let led = lead_on_blocking_pool(
                    Arc::clone(self),
                    |ledger| &ledger.group,
                    move |ledger| {
                        let who = caller.unwrap_or_else(|| ledger.me.clone());
                        ledger.group.commit_async_lead(ledger, Admission::Callers, |inner| {
                            ledger.check_and_queue(inner, &who, request.clone(), &mut build)
                        })
                    },
                )
                .await;
                match led {
                    Ok(r) => r,
                    // As on the other path (and for a thread): the panic reaches the
                    // caller; the engine poisoned itself when it caught it.
                    Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
                    Err(_) => return Err(LedgerError::Storage(storage::Error::Closed)),
                }
            }
        };
        match settled {
            Ok(settled) => settled.answer,
            Err(e) => Err(Self::commit_error(e)),
        }
    }

    /// [`submit`](Self::submit) for the ledger's owner's own last words: admitted
    /// even while draining (a daemon's cutover record and the release of its home).
    pub fn submit_internal(
        &self,
        request: Option<(String, [u8; 32])>,
        mut build: impl FnMut(&Projection, u64, uuid::Uuid) -> Result<Txn, Refusal>,
    ) -> Result<Committed, LedgerError> {
        self.commit_with(Admission::Internal, |inner| {
            self.check_and_queue(inner, &self.me, request.clone(), &mut build)
        })
    }

    /// Build, check and (if it writes) apply and queue one transaction. Returns the
    /// answer and the last sequence it depends on.
    fn check_and_queue(
        &self,
        inner: &mut Inner,
        caller: &CallerId,
        request: Option<(String, [u8; 32])>,
        build: &mut impl FnMut(&Projection, u64, uuid::Uuid) -> Result<Txn, Refusal>,
    ) -> (Result<Committed, LedgerError>, u64) {
        let (answer, covers) = self.check_and_queue_once(inner, caller, request.clone(), build);
        // On an optimistic backend the state may be behind another writer's
        // records (the turn did not read before judging). A write is vouched for
        // by its append's compare, and so is an answer that waits on a group
        // queued before it; an answer that writes nothing and waits on nothing (a
        // refusal, a deduplicated request, a no-op) is given only once the head
        // says nothing came meanwhile — else the state is caught up and it is
        // judged again.
        let writes =
            matches!(&answer, Ok(Committed { seq: Some(s), deduplicated: false, .. }) if *s > inner.durable_seq());
        if !self.backend.optimistic() || writes || inner.last_seq() > inner.durable_seq() {
            return (answer, covers);
        }
        match self.backend.head() {
            Ok(h) if h.seq == inner.durable_seq() && h.link == inner.head => (answer, covers),
            Ok(_) => match self.catch_up_with(inner) {
                Ok(()) => self.check_and_queue_once(inner, caller, request, build),
                Err(e) => (Err(e), covers),
            },
            Err(e) => {
                if e.is_transient() {
                    inner.stale = true;
                }
                (Err(LedgerError::Storage(e)), covers)
            }
        }
    }

    fn check_and_queue_once(
        &self,
        inner: &mut Inner,
        caller: &CallerId,
        request: Option<(String, [u8; 32])>,
        build: &mut impl FnMut(&Projection, u64, uuid::Uuid) -> Result<Txn, Refusal>,
    ) -> (Result<Committed, LedgerError>, u64) {
        let now_ms = self.opts.log.now_ms();
        let seen = inner.projection.last_seq;
        let mut txn = match build(&inner.projection, now_ms, self.writer_id()) {
            Ok(t) => t,
            Err(r) => return (Err(LedgerError::Refused(r)), seen),
        };
        txn.request = request.map(|(id, digest)| RequestTag { id, digest });
        let checked = match inner.projection.check(seen + 1, &txn) {
            // A data write under a generation that is not the subject's current one,
            // or whose tenure ended, is refused (a zombie that checks its exit code
            // must hear "no"). The model still applies such records when it replays
            // a log an earlier build wrote; a new one is never appended.
            Ok(Checked::Valid { outcomes, .. }) if let Some(r) = late_write(&inner.projection, &txn, &outcomes) => {
                Err(r)
            }
            other => other,
        };
        match checked {
            Ok(Checked::Deduplicated(e)) => {
                (Ok(Committed { seq: Some(e.seq), outcomes: e.outcomes, deduplicated: true }), seen)
            }
            Ok(Checked::Valid { outcomes, writes: false }) => {
                (Ok(Committed { seq: None, outcomes, deduplicated: false }), seen)
            }
            Ok(Checked::Valid { outcomes, .. }) => match self.queue(inner, &txn, Some(outcomes)) {
                Ok((seq, outcomes)) => (Ok(Committed { seq: Some(seq), outcomes, deduplicated: false }), seq),
                Err(e) => (Err(e), seen),
            },
            Err(r) => {
                if let Some(what) = recorded(&r, &txn)
                    && let Err(err) = self.audit_refusal(inner, &r, &txn, caller, what, now_ms)
                {
                    return (Err(err), seen);
                }
                let covers = inner.projection.last_seq;
                (Err(LedgerError::Refused(r)), covers)
            }
        }
    }

    /// Apply a transaction to the projection and queue its record; returns its
    /// sequence and outcomes. `checked`: the outcomes `check` just gave it on this
    /// state (then it is not judged again). A record over the limit is refused here,
    /// before anything changes (storage would refuse the whole group).
    fn queue(
        &self,
        inner: &mut Inner,
        txn: &Txn,
        checked: Option<Vec<Outcome>>,
    ) -> Result<(u64, Vec<Outcome>), LedgerError> {
        let record = encode_txn(txn);
        let max = u64::from(self.opts.log.payload_bytes_max);
        if record.len() as u64 > max {
            return Err(LedgerError::Storage(storage::Error::RecordTooLarge { bytes: record.len() as u64, max }));
        }
        let seq = inner.projection.last_seq + 1;
        let outcomes = match checked {
            Some(outcomes) => inner.projection.apply_checked(seq, txn, outcomes),
            None => inner.projection.apply(seq, txn).map_err(LedgerError::Refused)?,
        };
        inner.since_snapshot.0 += 1;
        inner.since_snapshot.1 += record.len() as u64;
        let queued_at = inner.queue(record);
        debug_assert_eq!(queued_at, seq, "the projection and the commit engine agree on the next sequence");
        Ok((seq, outcomes))
    }

    /// Keep a compact record of a refused attempt that is kept as evidence: at
    /// most one per (subject, code, operation, caller) per window — across processes, by the
    /// `Refused` records already in the log. Repeats within the window are counted
    /// and written with the next record, or on `close`, by the writer whose record
    /// opened the window; a writer that finds the window opened by another
    /// process's record counts its repeats but does not write them unless it
    /// outlives the window (the bound on the log wins over an exact count across
    /// short-lived processes: `docs/STATE-MACHINE.md`).
    fn audit_refusal(
        &self,
        inner: &mut Inner,
        refusal: &Refusal,
        txn: &Txn,
        caller: &CallerId,
        (subject, presented, current, retired): (String, Option<u64>, u64, Option<u64>),
        now_ms: u64,
    ) -> Result<(), LedgerError> {
        const WINDOWS_TRACKED_MAX: usize = 10_000;
        let code = refusal.code();
        let attempted = txn.events.iter().find(|e| e.subject() == Some(subject.as_str()));
        let op = attempted.map_or("?", Event::kind);
        let key = crate::model::refusal_window_key(&subject, code, op, caller);
        if inner.fenced.len() >= WINDOWS_TRACKED_MAX && !inner.fenced.contains_key(&key) {
            inner.fenced.retain(|_, f| f.pending > 0);
        }
        let window_ms = self.opts.fenced_audit_window_ms;
        let recorded_ms = inner.projection.refusal_recorded_ms(&key);
        let w = inner.fenced.entry(key.clone()).or_insert_with(|| FencedWindow {
            last_written_ms: 0,
            pending: 0,
            first_pending_ms: now_ms,
            subject: subject.clone(),
            code,
            op: op.to_owned(),
            caller: caller.clone(),
            presented,
            current,
            retired: None,
            content: None,
        });
        if w.pending == 0 {
            w.first_pending_ms = now_ms;
        }
        w.pending += 1;
        (w.presented, w.current, w.retired) = (presented, current, retired);
        // What the first refused data write of the window tried to write.
        if let (Some(Event::Note { text, .. }), None) = (attempted, &w.content) {
            w.content = Some(RefusedContent::of(text));
        }
        // A record stamped ahead of this clock (a clock stepped back, a skewed
        // writer) opens no window here: the bound must not become a blackout.
        let within = |ms: u64| ms != 0 && ms <= now_ms && now_ms - ms < window_ms;
        if within(w.last_written_ms) || recorded_ms.is_some_and(within) {
            return Ok(());
        }
        self.write_refused(inner, &key, now_ms)
    }

    /// Queue the `Refused` record for the attempts pending under `key`.
    fn write_refused(&self, inner: &mut Inner, key: &str, now_ms: u64) -> Result<(), LedgerError> {
        let w = inner.fenced.get_mut(key).expect("a window exists for a pending key");
        let event = Event::Refused {
            subject: w.subject.clone(),
            code: w.code.to_owned(),
            op: w.op.clone(),
            caller: w.caller.clone(),
            writer: self.writer_id(),
            presented: w.presented,
            current: w.current,
            retired_cut_off_seq: w.retired,
            count: std::mem::take(&mut w.pending),
            first_ms: w.first_pending_ms,
            last_ms: now_ms,
            content: w.content.take(),
        };
        w.last_written_ms = now_ms;
        let txn = Txn::new(now_ms, self.writer_id(), vec![event]);
        self.queue(inner, &txn, None).map(|_| ())
    }

    /// "Committed at N" or "never committed": always answerable after the fact. A
    /// lookup under the commit engine's lock (never a copy of the state: a client
    /// reconciling a thousand request ids holds writers up for a thousand
    /// lookups, not a thousand copies); only an id older than the requests the
    /// state remembers is looked for in the log, off the lock.
    pub fn request_status(&self, id: &str) -> Result<RequestStatus, LedgerError> {
        let (found, last_seq, forgotten) = self.refresh_with(|p| {
            let found = p.requests.get(id).map(|e| (e.seq, e.outcomes.clone()));
            (found, p.last_seq, p.requests.len() >= REQUESTS_RETAINED)
        })?;
        if let Some((seq, outcomes)) = found {
            return Ok(RequestStatus::Committed { request: id.into(), seq, outcomes });
        }
        if forgotten && let Some(seq) = request_in_log(&*self.backend, id)? {
            return Ok(RequestStatus::Committed { request: id.into(), seq, outcomes: vec![] });
        }
        Ok(RequestStatus::NeverCommitted { request: id.into(), log_last_seq: last_seq })
    }

    /// Catch up with other writers, then look at the projection and its chain head
    /// through `f` (no copy).
    pub fn refresh_with_head<R>(&self, f: impl FnOnce(&Projection, &ChainLink) -> R) -> Result<R, LedgerError> {
        let mut inner = self.settled()?;
        self.catch_up_with(&mut inner)?;
        Ok(f(&inner.projection, &inner.head))
    }

    /// The last sequence and its chain link, caught up with other writers (no
    /// copy of the state).
    pub fn head(&self) -> Result<(u64, ChainLink), LedgerError> {
        self.refresh_with_head(|p, h| (p.last_seq, *h))
    }

    fn maybe_snapshot(&self, inner: &mut Inner) {
        let (records, bytes) = inner.since_snapshot;
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
        if let Some(t) = inner.snapshot_thread.take() {
            let _ = t.join(); // its checkpoint was not queued: that snapshot stays unvouched
        }
        inner.since_snapshot = (0, 0);
        let (backend, head, p) = (self.backend.clone(), inner.head, inner.projection.clone());
        let spawned = std::thread::Builder::new().name("fencelog-snapshot".into()).spawn(move || {
            let body = snapshot::body_of(&p);
            let written = backend
                .put_snapshot(p.last_seq, &head, &body)
                .map_err(|e| tracing::warn!(error = %e, "snapshot not written"))
                .ok();
            // The copy of the projection and its encoding (together about twice the
            // state) are freed now: give the pages back rather than keep them.
            drop((p, body));
            release_free_memory();
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
    fn queue_checkpoint(&self, inner: &mut Inner) -> Result<bool, LedgerError> {
        if !inner.snapshot_thread.as_ref().is_some_and(|t| t.is_finished()) {
            return Ok(false);
        }
        let written = inner.snapshot_thread.take().and_then(|t| t.join().ok().flatten());
        let Some(w) = written else { return Ok(false) };
        let event = Event::Checkpoint { snapshot_seq: w.seq, digest: w.digest };
        self.queue(inner, &Txn::new(self.opts.log.now_ms(), self.writer_id(), vec![event]), None)?;
        Ok(true)
    }

    /// Write a snapshot now (also done on `close`) and append the checkpoint record
    /// that vouches for it. It covers only durable state. Returns where it is.
    pub fn snapshot_now(&self) -> Result<String, LedgerError> {
        let (last, head, projection) = {
            let mut inner = self.settled()?;
            if let Some(t) = inner.snapshot_thread.take() {
                let _ = t.join();
            }
            inner.since_snapshot = (0, 0);
            let last = inner.projection.last_seq;
            if last > 0 && last == inner.own_checkpoint_seq {
                // Nothing but our own checkpoint since the snapshot it vouches for.
                return Ok(inner.last_snapshot.clone().unwrap_or_default());
            }
            (last, inner.head, inner.projection.clone())
        };
        // Encoded and written without holding the ledger: submitters go on.
        let written = self.backend.put_snapshot(last, &head, &snapshot::body_of(&projection))?;
        self.group.lock().last_snapshot = Some(written.source.clone());
        let event = Event::Checkpoint { snapshot_seq: written.seq, digest: written.digest };
        let c = self.commit_with(Admission::Internal, |inner| {
            let txn = Txn::new(self.opts.log.now_ms(), self.writer_id(), vec![event.clone()]);
            self.check_and_queue(inner, &self.me, None, &mut |_, _, _| Ok(txn.clone()))
        })?;
        self.group.lock().own_checkpoint_seq = c.seq.unwrap_or(0);
        Ok(written.source)
    }

    /// Clean close: write the counts of coalesced fenced attempts not yet recorded,
    /// then a snapshot. (A crash loses only those counts: the first attempt of each
    /// window is always recorded.)
    pub fn close(self) -> Result<(), LedgerError> {
        self.flush_fenced()?;
        if self.settled()?.projection.last_seq > 0 {
            self.snapshot_now()?;
        }
        Ok(())
    }

    /// Write the counts of refusals not yet recorded — those of windows this
    /// writer opened, or that no record covers any more. Repeats inside a window
    /// another process's record opened are not written (see `audit_refusal`).
    fn flush_fenced(&self) -> Result<(), LedgerError> {
        if self.group.lock().fenced.values().all(|f| f.pending == 0) {
            return Ok(());
        }
        self.commit_with(Admission::Internal, |inner| {
            let now_ms = self.opts.log.now_ms();
            let window_ms = self.opts.fenced_audit_window_ms;
            let pending: Vec<String> = inner
                .fenced
                .iter()
                .filter(|(_, f)| f.pending > 0)
                .filter(|(key, f)| {
                    let other = inner.projection.refusal_recorded_ms(key);
                    let opened_by_another =
                        other.is_some_and(|ms| ms != f.last_written_ms && ms <= now_ms && now_ms - ms < window_ms);
                    !opened_by_another
                })
                .map(|(k, _)| k.clone())
                .collect();
            let written = pending.iter().try_for_each(|key| self.write_refused(inner, key, now_ms));
            (written, inner.projection.last_seq)
        })
    }

    /// Run `act` on a caught-up projection within a commit group (the engine
    /// decides who leads and who waits: `storage::commit`); `act` returns its
    /// answer and the last sequence that answer depends on. It may run more than
    /// once: again whenever another writer appended first.
    fn commit_with<T>(
        &self,
        admission: Admission,
        act: impl FnMut(&mut Inner) -> (Result<T, LedgerError>, u64),
    ) -> Result<T, LedgerError> {
        match self.group.commit(self, admission, act) {
            Ok(settled) => settled.answer,
            Err(e) => Err(Self::commit_error(e)),
        }
    }

    fn commit_error(e: CommitError<LedgerError>) -> LedgerError {
        match e {
            CommitError::Storage(e) => LedgerError::Storage(e),
            CommitError::Hook(e) => e,
            CommitError::Draining => LedgerError::Draining,
            CommitError::HeadMovedTooOften { retries } => LedgerError::HeadMovedTooOften { retries },
        }
    }

    /// The ledger with no transaction between check and sync.
    fn settled(&self) -> Result<MutexGuard<'_, Inner>, LedgerError> {
        Ok(self.group.settled()?)
    }

    /// Stop taking transactions (they are refused with `DRAINING`, never judged,
    /// never appended) and wait, at most `wait_ms_max`, until every transaction
    /// already judged is durable or failed: afterwards the answer to each is known.
    /// Returns whether the ledger settled in time, and the last durable sequence.
    pub fn drain(&self, wait_ms_max: u64) -> Result<Drained, LedgerError> {
        let d = self.group.drain(wait_ms_max)?;
        Ok(Drained { settled: d.settled, last_seq: d.last_seq })
    }

    /// The chain head (hex) at the projection's last sequence.
    pub fn chain_head(&self) -> Result<String, LedgerError> {
        Ok(hex(&self.settled()?.head))
    }
}

/// What the log gives when replayed: the newest snapshot the chain vouches for (if
/// any), then every record after it, verified.
struct Replayed {
    tailer: Box<dyn RecordReader>,
    projection: Projection,
    head: ChainLink,
    snapshot_seq: Option<u64>,
    warnings: Vec<String>,
    /// Records and payload bytes applied after the snapshot.
    applied: (u64, u64),
}

/// Return freed heap pages to the system (glibc keeps them otherwise).
fn release_free_memory() {
    crate::sys::memory::release_free_memory();
}

/// Replay the log in `dir`: try each snapshot (the newest few, newest first); one
/// is adopted only if the log holds its chain head and a checkpoint record with
/// the blake3 of its body — checked by a pass over the tail *before* the snapshot
/// is decoded, so a file no checkpoint vouches for never costs more than a
/// streaming read. A snapshot beyond the end of the log is evidence that records
/// were cut: refused. Otherwise replay from record 1.
fn replay(backend: &dyn LogBackend) -> Result<Replayed, LedgerError> {
    let (metas, mut warnings) = backend.newest_snapshots();
    let fresh = |from: u64| Replayed {
        tailer: backend.reader(from),
        projection: Projection::default(),
        head: GENESIS_LINK,
        snapshot_seq: None,
        warnings: vec![],
        applied: (0, 0),
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
            Vouched::NoCheckpoint => {
                ignored(format!("no checkpoint record in the log vouches for it (digest {})", hex(&m.digest)));
                continue;
            }
            Vouched::HeadDiffers => {
                ignored(format!("the log does not hold the snapshot's {}", snapshot::describe(m.seq, &m.head)));
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
            head: m.head,
            snapshot_seq: Some(m.seq),
            warnings: vec![],
            applied: (0, 0),
        };
        match tail.records.take() {
            Some(records) => {
                for (seq, txn, link, bytes) in records {
                    r.projection.apply_replayed(seq, &txn);
                    r.head = link;
                    r.applied.0 += 1;
                    r.applied.1 += bytes;
                }
            }
            None => {
                // The tail was too long to keep: read it again, applying.
                r.tailer = backend.reader(m.seq);
                let Replayed { tailer, projection, head, applied, .. } = &mut r;
                apply_tail(tailer.as_mut(), projection, head, applied)?;
            }
        }
        r.warnings = warnings;
        return Ok(r);
    }
    let mut r = fresh(1);
    let Replayed { tailer, projection, head, applied, .. } = &mut r;
    apply_tail(tailer.as_mut(), projection, head, applied)?;
    r.warnings = warnings;
    Ok(r)
}

enum Vouched {
    Yes,
    NoCheckpoint,
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
    let (mut last, mut head_ok, mut found) = (0, false, false);
    let mut records = Some(Vec::new());
    let mut undecodable = None;
    reader.poll(&mut |r| {
        last = r.seq;
        if r.seq == m.seq {
            head_ok = r.link == m.head;
            return;
        }
        if r.seq < m.seq || undecodable.is_some() {
            return;
        }
        match decode_txn(r.payload) {
            Ok(txn) => {
                found |= txn.events.iter().any(
                    |e| matches!(e, Event::Checkpoint { snapshot_seq, digest } if *snapshot_seq == m.seq && *digest == m.digest),
                );
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
    head: ChainLink,
    applied: (u64, u64),
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
        self.applied.0 += 1;
        self.applied.1 += payload.len() as u64;
        self.head = link;
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
/// record at that sequence (if read again) must carry `head`. A long tail is
/// replayed by two threads: this one reads and verifies (with helpers checking the
/// chain, storage's `LinksAhead`); a second decodes and applies, in order, what the
/// first hands it — the projection is touched by one thread only and in sequence
/// order, so the result is the one thread's result.
fn apply_tail(
    tailer: &mut dyn RecordReader,
    projection: &mut Projection,
    head: &mut ChainLink,
    applied: &mut (u64, u64),
) -> Result<(), LedgerError> {
    let expect_head = (projection.last_seq, *head);
    let mut head_checked = projection.last_seq == 0 || tailer.next_seq() > projection.last_seq;
    let mut mismatch = None;
    let applier = Applier { projection, head: *head, applied: *applied, undecodable: None };
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
                    let (tx, rx) = std::sync::mpsc::sync_channel::<RecordBatch>(REPLAY_BATCHES_QUEUED_MAX);
                    let (spent_tx, spent_rx) = std::sync::mpsc::channel::<RecordBatch>();
                    let applier = std::sync::Arc::new(std::sync::Mutex::new(inline.take()));
                    let handed = std::sync::Arc::clone(&applier);
                    let applying =
                        std::thread::Builder::new().name("fencelog-replay".into()).spawn_scoped(s, move || {
                            let mut a = handed.lock().expect("applier").take().expect("handed over");
                            for b in rx {
                                a.take_batch(&b);
                                let _ = spent_tx.send(b); // its buffers are used again
                            }
                            a
                        });
                    match applying {
                        Ok(applying) => pipe = Some((tx, spent_rx, applying)),
                        // No thread to be had (a pid limit): go on applying here.
                        Err(e) => {
                            tracing::warn!("replay goes on in one thread: {e}");
                            inline = applier.lock().expect("applier").take();
                        }
                    }
                }
                return;
            }
            batch.payloads.extend_from_slice(r.payload);
            batch.records.push((r.seq, r.link, batch.payloads.len()));
            if batch.records.len() == REPLAY_BATCH_RECORDS || batch.payloads.len() >= REPLAY_BATCH_BYTES_MAX {
                let (tx, spent, _) = pipe.as_ref().expect("the applying thread runs");
                // A returned batch is used again unless a large payload grew it.
                let mut next = spent
                    .try_recv()
                    .ok()
                    .filter(|b| b.payloads.capacity() <= 2 * REPLAY_BATCH_BYTES_MAX)
                    .unwrap_or_default();
                next.payloads.clear();
                next.records.clear();
                // It only stops early by panicking, which the join below reports.
                let _ = tx.send(std::mem::replace(&mut batch, next));
            }
        });
        let applier = match (inline, pipe) {
            (Some(a), _) => a,
            (None, Some((tx, _, applying))) => {
                if !batch.records.is_empty() {
                    let _ = tx.send(batch);
                }
                drop(tx);
                applying.join().unwrap_or_else(|p| std::panic::resume_unwind(p))
            }
            (None, None) => unreachable!("the applier is inline or on its thread"),
        };
        (polled, applier)
    });
    polled?;
    *head = applier.head;
    *applied = applier.applied;
    if let Some(e) = applier.undecodable {
        return Err(e);
    }
    if mismatch.is_some() || !head_checked {
        return Err(LedgerError::SnapshotNotInLog(snapshot::describe(expect_head.0, &expect_head.1)));
    }
    Ok(())
}

/// "Committed at N" or "never committed", from a projection caught up with the log
/// in `dir`. A request id older than the projection retains is looked for in the
/// log itself, which must then be whole: "never committed" from a partial history
/// would make a client run its operation twice.
fn request_status_in(backend: &dyn LogBackend, p: &Projection, id: &str) -> Result<RequestStatus, LedgerError> {
    if let Some(e) = p.requests.get(id) {
        return Ok(RequestStatus::Committed { request: id.into(), seq: e.seq, outcomes: e.outcomes.clone() });
    }
    if p.requests.len() >= REQUESTS_RETAINED
        && let Some(seq) = request_in_log(backend, id)?
    {
        return Ok(RequestStatus::Committed { request: id.into(), seq, outcomes: vec![] });
    }
    Ok(RequestStatus::NeverCommitted { request: id.into(), log_last_seq: p.last_seq })
}

/// The sequence of the record carrying request `id`, looked for in the whole log
/// (for ids older than the requests the state remembers). The reader verifies
/// every record and refuses damage (only a torn tail ends it quietly), so "never
/// committed" is never said of a partial log.
fn request_in_log(backend: &dyn LogBackend, id: &str) -> Result<Option<u64>, LedgerError> {
    let mut found = None;
    backend.reader(1).poll(&mut |r| {
        if found.is_none()
            && let Ok(txn) = decode_txn(r.payload)
            && txn.request.as_ref().is_some_and(|t| t.id == id)
        {
            found = Some(r.seq);
        }
    })?;
    Ok(found)
}

/// The log as read-only commands see it (see [`Ledger::read_only`]).
pub struct ReadView {
    pub projection: Projection,
    /// Chain link of the projection's last sequence.
    pub head: ChainLink,
    /// The log ends in a torn write: the answer is from the intact prefix, and the
    /// next writer will cut the tail.
    pub torn_tail: bool,
    pub snapshot_seq: Option<u64>,
    pub snapshot_warnings: Vec<String>,
    /// Where liveness is judged from, for this log.
    pub here: identity::Here,
    backend: Arc<dyn LogBackend>,
}

impl ReadView {
    /// "Committed at N" or "never committed" (see [`Ledger::request_status`]).
    pub fn request_status(&self, id: &str) -> Result<RequestStatus, LedgerError> {
        request_status_in(&*self.backend, &self.projection, id)
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

/// What the ledger does at the commit engine's turns.
impl Hooks<LedgerState> for Ledger {
    type Error = LedgerError;

    fn exclusive(
        &self,
        give_up: &dyn Fn() -> bool,
        f: &mut dyn FnMut(&mut dyn Exclusive) -> Result<(), storage::Error>,
    ) -> Result<(), storage::Error> {
        self.backend.exclusive(give_up, f)
    }

    /// Before a turn's judgements. On an optimistic backend (etcd) the read is
    /// skipped while no other writer has been seen for [`OTHERS_RECENT_MS`]: the
    /// append's compare finds one that came first (`HeadMoved`: rebuilt, judged
    /// again), and a writer alone pays one round trip per group, not two.
    fn catch_up(&self, core: &mut Inner, _x: &mut dyn Exclusive) -> Result<(), LedgerError> {
        let alone = core.others_seen.is_none_or(|t| t.elapsed() >= Duration::from_millis(OTHERS_RECENT_MS));
        if self.backend.optimistic() && !core.stale && alone {
            return Ok(());
        }
        self.catch_up_with(core)
    }

    /// The outcome of a group is unknown (the backend unreachable): the projection
    /// holds its transactions, the log may not; rebuilt from the log next turn.
    fn unavailable(&self, core: &mut Inner) -> bool {
        core.stale = true;
        true
    }

    fn before_idle(&self, core: &mut Inner) -> bool {
        self.queue_checkpoint(core).unwrap_or_else(|e| {
            tracing::warn!(error = %e, "checkpoint not queued");
            false
        })
    }

    fn on_durable(&self, core: &mut Inner, group: &storage::Appended) {
        core.head = group.chain_head;
        // The tailer need not read this writer's own records back.
        core.tailer.skip_own(group.first_seq, group.last_seq, group.chain_head);
    }

    /// Replay from the newest vouched snapshot, with the other writer's records.
    /// Audit windows counted attempts judged on the discarded state: the retries
    /// count them again, and the first is written again.
    ///
    /// The backend unreachable meanwhile (etcd without a leader, say): nothing is
    /// poisoned — the state is marked stale and rebuilt by the next catch-up,
    /// which every retried judgement makes first (and which fails, transiently,
    /// while the backend stays unreachable).
    fn rebuild(&self, core: &mut Inner) -> Result<(), String> {
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
        let last = r.projection.last_seq;
        (core.tailer, core.projection, core.head) = (r.tailer, r.projection, r.head);
        core.caught_up_to(last);
        Ok(())
    }

    /// Off the append lock: a snapshot (the projection cloned) if one is due and
    /// nothing is in flight.
    fn after_lead(&self, core: &mut Inner) {
        self.maybe_snapshot(core);
    }
}
