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

mod error;
mod fenced;
pub mod identity;
pub mod observer;
mod replay;
pub mod snapshot;

pub use error::LedgerError;

use crate::storage::Exclusive;
use crate::storage::commit::{
    Admission, AsyncCommit, CommitError, Core, GroupCommit, GroupLimits, Hooks, LeadFailed, LeadOn, lead_inline,
    lead_on_blocking_pool, may_lead_inline,
};
pub use crate::storage::commit::{GROUPS_PER_LOCK_MAX, HEAD_MOVED_RETRIES_MAX};

use std::collections::HashMap;
use std::path::Path;
use std::sync::MutexGuard;
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::format::{ChainLink, hex};
use crate::model::{
    CallerId, Checked, Outcome, Projection, REQUESTS_RETAINED, Refusal, RequestTag, Txn, decode_txn, encode_txn,
};
use std::sync::Arc;

use crate::storage::{self, FileBackend, Head, LogBackend, LogOptions, OpenReport, RecordReader, VerifyOnOpen};

use fenced::{FencedWindow, late_write, recorded};
use replay::replay;

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
    /// Called on the snapshot's thread once a snapshot is written and its copy of
    /// the state freed: the embedding program's allocator policy (the daemon gives
    /// glibc's freed pages back to the system here). Default: nothing.
    pub after_snapshot: Option<fn()>,
}

impl Default for LedgerOptions {
    fn default() -> Self {
        LedgerOptions {
            log: LogOptions::default(),
            snapshot_every_records: 10_000,
            snapshot_every_bytes: 64 << 20,
            fenced_audit_window_ms: 1_000,
            host: None,
            after_snapshot: None,
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
    /// The snapshot the state was built from, if any.
    pub snapshot_seq: Option<u64>,
    pub snapshot_warnings: Vec<String>,
    /// Records after that snapshot the state was built from: what an open
    /// replays now (for [`Ledger::open_handed_over`], what its state holds
    /// after the snapshot, though it read only `records_read` of them).
    pub replayed_records: u64,
    /// Records this open read and applied (after the snapshot, or after the
    /// state handed over).
    pub records_read: u64,
    /// The sequence of the state handed over, for [`Ledger::open_handed_over`]:
    /// the records after it are all that open read.
    pub handed_over_at: Option<u64>,
}

/// A ledger's state taken out of it ([`Ledger::hand_over`]) by a process forked
/// from the one that opened it, to open the same log anew without replaying it
/// ([`Ledger::open_handed_over`]).
#[doc(hidden)]
pub struct HandedOver {
    projection: Projection,
    chain_head: ChainLink,
    snapshot_seq: Option<u64>,
    since_snapshot: replay::SinceSnapshot,
}

/// The ledger's state, kept under the commit engine's mutex (`Core` derefs to it).
struct LedgerState {
    tailer: Box<dyn RecordReader>,
    projection: Projection,
    chain_head: ChainLink,
    /// Records and payload bytes applied since the last snapshot.
    since_snapshot: replay::SinceSnapshot,
    /// The newest snapshot this state is known to follow: the one it was
    /// rebuilt from, or the last this ledger wrote and queued the checkpoint of.
    snapshot_seq: Option<u64>,
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
    /// Async callers inside [`submit_as_async`](Self::submit_as_async) now: one
    /// made leader leads on its own thread only when it is the only one.
    async_in_flight: std::sync::atomic::AtomicUsize,
    /// A snapshot fell due at the end of a lead on an async caller's own thread
    /// (a runtime worker, where the projection is not cloned): the next async
    /// lead goes to the blocking pool, and takes it.
    snapshot_wants_pool: std::sync::atomic::AtomicBool,
}

/// Most records other writers may have appended since this ledger's last turn
/// for an async caller's lead on its own thread (`storage::commit::lead_inline`)
/// to catch up on them there; beyond, that lead declines and one on the blocking
/// pool catches up (applying a record takes microseconds: this bounds the worker's
/// turn to about a millisecond more).
const INLINE_CATCH_UP_RECORDS_MAX: u64 = 256;

/// Most of its own records a ledger's tailer may fall behind by, unread, while
/// its turns find the log's last record to be the state's ([`Hooks::catch_up`]).
const TAILER_LAG_RECORDS_MAX: u64 = 256;

/// blake3 of the caller's intent, for request-id idempotency.
pub fn intent_digest<T: Serialize>(intent: &T) -> [u8; 32] {
    let bytes = bincode::serde::encode_to_vec(intent, bincode::config::standard()).expect("intent encodes");
    *blake3::hash(&bytes).as_bytes()
}

impl Ledger {
    pub fn open(dir: impl AsRef<Path>, opts: LedgerOptions) -> Result<Ledger, LedgerError> {
        Self::open_dir(dir.as_ref(), opts, None)
    }

    fn open_dir(dir: &Path, opts: LedgerOptions, from: Option<HandedOver>) -> Result<Ledger, LedgerError> {
        let dir = dir.to_path_buf();
        // Storage recovers the tail and checks the whole history's headers and
        // seals; the replay below verifies every record it reads (from the vouched
        // snapshot's segment, or from record 1), so a full scan at open would only
        // read the log twice.
        let mut log_opts = opts.log.clone();
        log_opts.verify_on_open = VerifyOnOpen::LastSegment;
        let backend = FileBackend::open(&dir, log_opts)?;
        let mut l = Self::with_backend_from(Arc::new(backend), opts, from)?;
        l.location = Some(storage::Location::Dir(dir));
        Ok(l)
    }

    /// Open the log at `location`: a directory (as [`Ledger::open`]) or a prefix in
    /// an etcd cluster (whose commit groups are bounded by etcd's request limits).
    pub fn open_at(location: &storage::Location, opts: LedgerOptions) -> Result<Ledger, LedgerError> {
        Self::open_at_from(location, opts, None)
    }

    /// [`open_at`](Self::open_at) from a state handed over by the ledger of the
    /// process this one was forked from ([`hand_over`](Self::hand_over)), on
    /// the same log: the log is opened anew (its own descriptors, locks and
    /// writer id), the record at the state's last sequence must carry the
    /// state's chain head, and only the records after it are read and applied —
    /// nothing before it is replayed or decoded again. A log whose record there
    /// differs (it is not the log the state was built from) is
    /// `SNAPSHOT_NOT_IN_LOG`, as a snapshot the log does not hold is.
    #[doc(hidden)]
    pub fn open_handed_over(
        location: &storage::Location,
        opts: LedgerOptions,
        from: HandedOver,
    ) -> Result<Ledger, LedgerError> {
        Self::open_at_from(location, opts, Some(from))
    }

    fn open_at_from(
        location: &storage::Location,
        mut opts: LedgerOptions,
        from: Option<HandedOver>,
    ) -> Result<Ledger, LedgerError> {
        if let Some(dir) = location.dir() {
            return Self::open_dir(dir, opts, from);
        }
        opts.log = location.log_options(opts.log);
        let backend = location.open(opts.log.clone())?;
        let mut l = Self::with_backend_from(backend, opts, from)?;
        l.location = Some(location.clone());
        Ok(l)
    }

    /// Take this ledger's state out of it, for a process forked from this one
    /// (with one thread, so that nothing was in flight) that opens the same log
    /// anew with [`open_handed_over`](Self::open_handed_over) rather than
    /// replaying it: nothing is copied. This ledger is then poisoned: it answers
    /// nothing more (`WRITER_POISONED`; open the log again). Never waits.
    /// `None` — the caller replays the log instead — unless the state is exactly
    /// the durable log's: nothing in flight, not poisoned, not waiting to be
    /// rebuilt, and no snapshot of this ledger's written or being written whose
    /// checkpoint it has not appended (the state handed over would not say so).
    #[doc(hidden)]
    pub fn hand_over(&self) -> Option<HandedOver> {
        let mut inner = self.group.lock();
        if !inner.is_settled() || inner.poisoned().is_some() || inner.stale || inner.snapshot_thread.is_some() {
            return None;
        }
        debug_assert_eq!(inner.projection.last_seq(), inner.last_seq());
        let handed = HandedOver {
            projection: std::mem::take(&mut inner.projection),
            chain_head: inner.chain_head,
            snapshot_seq: inner.snapshot_seq,
            since_snapshot: inner.since_snapshot,
        };
        inner.poison("its state was handed over to a process forked from this one; open the log again".into());
        Some(handed)
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
        Self::with_backend_from(backend, opts, None)
    }

    fn with_backend_from(
        backend: Arc<dyn LogBackend>,
        opts: LedgerOptions,
        from: Option<HandedOver>,
    ) -> Result<Ledger, LedgerError> {
        let handed_over_at = from.as_ref().map(|h| h.projection.last_seq());
        let r = match from {
            Some(h) => replay::resume(&*backend, h)?,
            None => replay(&*backend)?,
        };
        let last_seq = r.projection.last_seq();
        let state = LedgerState {
            tailer: r.tailer,
            projection: r.projection,
            chain_head: r.chain_head,
            since_snapshot: r.applied,
            snapshot_seq: r.snapshot_seq,
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
            records_read: r.read,
            handed_over_at,
        };
        // `debug`: the daemon's one boot line (`ready`) says the same at `info`.
        tracing::debug!(
            segments = report.storage.segments,
            last_seq = report.storage.last_seq,
            repairs = report.storage.repairs.len(),
            snapshot_seq = report.snapshot_seq.unwrap_or(0),
            replayed = report.replayed_records,
            read = report.records_read,
            handed_over_at = report.handed_over_at,
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
            async_in_flight: std::sync::atomic::AtomicUsize::new(0),
            snapshot_wants_pool: std::sync::atomic::AtomicBool::new(false),
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
            chain_head: r.chain_head,
            snapshot_seq: r.snapshot_seq,
            snapshot_warnings: r.warnings,
            backend,
        })
    }

    pub fn open_report(&self) -> &LedgerOpenReport {
        &self.report
    }

    pub fn writer_id(&self) -> uuid::Uuid {
        self.backend.writer_id()
    }

    /// What storage did: records appended and syncs made through this ledger's log
    /// (transactions committed together share one sync).
    pub fn commit_stats(&self) -> crate::storage::CommitStats {
        self.backend.commit_stats()
    }

    /// How often another writer appended first and this ledger judged its queued
    /// transactions again.
    pub fn head_moved_count(&self) -> u64 {
        self.group.lock().head_moved()
    }

    /// How often a lone async caller led its commit group on its own thread, and
    /// how often such a lead gave its turn to the blocking pool
    /// ([`submit_as_async`](Self::submit_as_async)).
    pub fn inline_leads(&self) -> storage::commit::InlineLeads {
        self.group.inline_leads()
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
            chain_head: inner.chain_head,
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
        request: Option<RequestTag>,
        build: impl FnMut(&Projection, u64, uuid::Uuid) -> Result<Txn, Refusal>,
    ) -> Result<Committed, LedgerError> {
        self.submit_as(&self.me.clone(), request, build)
    }

    /// [`submit`](Self::submit) on behalf of `caller`: a refusal that is kept as
    /// evidence names it (the CLI's caller, a daemon's client).
    pub fn submit_as(
        &self,
        caller: &CallerId,
        request: Option<RequestTag>,
        mut build: impl FnMut(&Projection, u64, uuid::Uuid) -> Result<Txn, Refusal>,
    ) -> Result<Committed, LedgerError> {
        // `build` may run more than once: again whenever another writer appended
        // first (each run sees the state its transaction would follow).
        self.commit_with(Admission::Callers, |inner| self.check_and_queue(inner, caller, request.clone(), &mut build))
    }

    /// [`submit_as`](Self::submit_as) for an async caller (the daemon): when a
    /// commit group is open, the transaction is built and judged on the caller's
    /// own thread and its answer awaited without holding a thread; when none is,
    /// the caller leads one on the runtime's blocking pool. When it is this
    /// ledger's only async caller, the engine saw no company (`AsyncCommit::Lead`'s
    /// `alone`), an append waits only on local storage
    /// (`LogBackend::append_is_local`: not etcd), no snapshot waits to be taken and
    /// the runtime has other workers (`storage::commit::may_lead_inline`: not a
    /// current-thread or one-worker runtime), it first leads on its own thread
    /// (`storage::commit::lead_inline`): a lone client's request is not handed to
    /// another thread and back. That lead waits for nobody (the engine, another
    /// leader's turn, another process's turn of the append lock) and reads nothing
    /// others appended (on a directory; elsewhere at most
    /// `INLINE_CATCH_UP_RECORDS_MAX` records): it declines instead, with nothing
    /// of the caller's written or answered, and the caller leads on the pool. Same
    /// judgement, same answers. `caller: None` is this ledger's own process (as
    /// `submit`).
    ///
    /// Dropping the future after the transaction was queued does not withdraw it
    /// (see `GroupCommit::commit_async`): run it in a task of its own when every
    /// answer must be heard.
    pub async fn submit_as_async(
        self: &Arc<Self>,
        caller: Option<CallerId>,
        request: Option<RequestTag>,
        mut build: impl FnMut(&Projection, u64, uuid::Uuid) -> Result<Txn, Refusal> + Send + 'static,
    ) -> Result<Committed, LedgerError> {
        use std::sync::atomic::Ordering::SeqCst;
        struct InFlight<'a>(&'a std::sync::atomic::AtomicUsize);
        impl Drop for InFlight<'_> {
            fn drop(&mut self) {
                self.0.fetch_sub(1, SeqCst);
            }
        }
        self.async_in_flight.fetch_add(1, SeqCst);
        let _in_flight = InFlight(&self.async_in_flight);
        let turn = {
            let who = caller.as_ref().unwrap_or(&self.me);
            let mut act = |inner: &mut Inner| self.check_and_queue(inner, who, request.clone(), &mut build);
            self.group.commit_async::<_, LedgerError>(Admission::Callers, &mut act).await
        };
        let settled = match turn {
            AsyncCommit::Done(r) => r,
            AsyncCommit::Lead { alone } => {
                let inline = alone
                    && self.async_in_flight.load(SeqCst) == 1
                    && self.backend.append_is_local()
                    && !self.snapshot_wants_pool.load(SeqCst)
                    && may_lead_inline();
                let led_inline = inline.then(|| {
                    let who = caller.as_ref().unwrap_or(&self.me);
                    lead_inline(|| {
                        self.group.commit_async_lead(&**self, Admission::Callers, |inner| {
                            self.check_and_queue(inner, who, request.clone(), &mut build)
                        })
                    })
                });
                let led = match led_inline {
                    // Declined, nothing judged: lead on the pool.
                    None | Some(Ok(Err(CommitError::WouldBlock))) => {
                        lead_on_blocking_pool(
                            Arc::clone(self),
                            |ledger| &ledger.group,
                            LeadOn::Pool,
                            move |ledger| {
                                let who = caller.unwrap_or_else(|| ledger.me.clone());
                                ledger.group.commit_async_lead(ledger, Admission::Callers, |inner| {
                                    ledger.check_and_queue(inner, &who, request.clone(), &mut build)
                                })
                            },
                        )
                        .await
                    }
                    Some(led) => led,
                };
                match led {
                    Ok(r) => r,
                    // As on the other path (and for a thread): the panic reaches the
                    // caller; the engine poisoned itself when it caught it.
                    Err(LeadFailed::Panicked(p)) => std::panic::resume_unwind(p),
                    Err(LeadFailed::NotRun) => return Err(LedgerError::Storage(storage::Error::Closed)),
                }
            }
        };
        match settled {
            Ok(settled) => settled.answer,
            Err(e) => Err(LedgerError::from_commit(e)),
        }
    }

    /// [`submit`](Self::submit) for the ledger's owner's own last words: admitted
    /// even while draining (a daemon's cutover record and the release of its home).
    pub fn submit_internal(
        &self,
        request: Option<RequestTag>,
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
        request: Option<RequestTag>,
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
            Ok(h) if h.seq == inner.durable_seq() && h.link == inner.chain_head => (answer, covers),
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
        request: Option<RequestTag>,
        build: &mut impl FnMut(&Projection, u64, uuid::Uuid) -> Result<Txn, Refusal>,
    ) -> (Result<Committed, LedgerError>, u64) {
        let now_ms = self.opts.log.now_ms();
        let seen = inner.projection.last_seq();
        let mut txn = match build(&inner.projection, now_ms, self.writer_id()) {
            Ok(t) => t,
            Err(r) => return (Err(LedgerError::Refused(r)), seen),
        };
        txn.request = request;
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
                let covers = inner.projection.last_seq();
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
        let seq = inner.projection.last_seq() + 1;
        let outcomes = match checked {
            Some(outcomes) => inner.projection.apply_checked(seq, txn, outcomes),
            None => inner.projection.apply(seq, txn).map_err(LedgerError::Refused)?,
        };
        inner.since_snapshot.count(record.len() as u64);
        let queued_at = inner.queue(record);
        debug_assert_eq!(queued_at, seq, "the projection and the commit engine agree on the next sequence");
        Ok((seq, outcomes))
    }

    /// "Committed at N" or "never committed": always answerable after the fact. A
    /// lookup under the commit engine's lock (never a copy of the state: a client
    /// reconciling a thousand request ids holds writers up for a thousand
    /// lookups, not a thousand copies); only an id older than the requests the
    /// state remembers is looked for in the log, off the lock.
    pub fn request_status(&self, id: &str) -> Result<RequestStatus, LedgerError> {
        let (found, last_seq, forgotten) = self.refresh_with(|p| {
            let found = p.requests().get(id).map(|e| (e.seq, e.outcomes.clone()));
            (found, p.last_seq(), p.requests().len() >= REQUESTS_RETAINED)
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
    pub fn refresh_with_chain_head<R>(&self, f: impl FnOnce(&Projection, &ChainLink) -> R) -> Result<R, LedgerError> {
        let mut inner = self.settled()?;
        self.catch_up_with(&mut inner)?;
        Ok(f(&inner.projection, &inner.chain_head))
    }

    /// The log's head (its last sequence and that record's chain link), caught up
    /// with other writers (no copy of the state).
    pub fn head(&self) -> Result<Head, LedgerError> {
        self.refresh_with_chain_head(|p, h| Head { seq: p.last_seq(), link: *h })
    }

    /// Clean close: write the counts of coalesced fenced attempts not yet recorded,
    /// then a snapshot. (A crash loses only those counts: the first attempt of each
    /// window is always recorded.)
    pub fn close(self) -> Result<(), LedgerError> {
        self.flush_fenced()?;
        if self.settled()?.projection.last_seq() > 0 {
            self.snapshot_now()?;
        }
        Ok(())
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
            Err(e) => Err(LedgerError::from_commit(e)),
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
        Ok(hex(&self.settled()?.chain_head))
    }
}

/// "Committed at N" or "never committed", from a projection caught up with the log
/// in `dir`. A request id older than the projection retains is looked for in the
/// log itself, which must then be whole: "never committed" from a partial history
/// would make a client run its operation twice.
fn request_status_in(backend: &dyn LogBackend, p: &Projection, id: &str) -> Result<RequestStatus, LedgerError> {
    if let Some(e) = p.requests().get(id) {
        return Ok(RequestStatus::Committed { request: id.into(), seq: e.seq, outcomes: e.outcomes.clone() });
    }
    if p.requests().len() >= REQUESTS_RETAINED
        && let Some(seq) = request_in_log(backend, id)?
    {
        return Ok(RequestStatus::Committed { request: id.into(), seq, outcomes: vec![] });
    }
    Ok(RequestStatus::NeverCommitted { request: id.into(), log_last_seq: p.last_seq() })
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
    pub chain_head: ChainLink,
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
    ///
    /// On a backend that holds the log's tail for the section (a directory's
    /// lock), whose writer has just caught up with every other writer's records:
    /// when the log's last record is the state's (same sequence, same chain link,
    /// so the same history), nothing was appended since, and the tailer reads
    /// nothing — it would read back this ledger's own records only. It falls
    /// behind by those records, so it reads them once
    /// [`TAILER_LAG_RECORDS_MAX`] have gathered (a later catch-up after another
    /// writer's append reads no more than that of its own).
    fn catch_up(&self, core: &mut Inner, x: &mut dyn Exclusive) -> Result<(), LedgerError> {
        let alone = core.others_seen.is_none_or(|t| t.elapsed() >= Duration::from_millis(OTHERS_RECENT_MS));
        if self.backend.optimistic() && !core.stale && alone {
            return Ok(());
        }
        let last = core.projection.last_seq();
        if !core.stale
            && last == core.last_seq()
            && x.head() == Some(Head { seq: last, link: core.chain_head })
            && last < core.tailer.next_seq().saturating_add(TAILER_LAG_RECORDS_MAX)
        {
            return Ok(());
        }
        self.catch_up_with(core)
    }

    /// A lead on an async caller's own thread leaves a rebuild, and a long tail of
    /// other writers' records, to a lead on the blocking pool.
    fn inline_catch_up_is_long(&self, core: &Inner, x: &dyn Exclusive) -> bool {
        core.stale
            || x.last_seq().is_some_and(|last| last.saturating_sub(core.last_seq()) > INLINE_CATCH_UP_RECORDS_MAX)
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
        core.chain_head = group.chain_head;
        // The tailer need not read this writer's own records back.
        core.tailer.skip_own(group.first_seq, group.last_seq, group.chain_head);
    }

    /// Another writer appended first: replay from the newest vouched snapshot
    /// (`Ledger::rebuild_from_log`).
    fn rebuild(&self, core: &mut Inner) -> Result<(), String> {
        self.rebuild_from_log(core)
    }

    /// Off the append lock: a snapshot (the projection cloned) if one is due and
    /// nothing is in flight.
    fn after_lead(&self, core: &mut Inner) {
        self.maybe_snapshot(core);
    }
}
