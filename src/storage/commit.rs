//! The group commit: the one commit engine of fencelog (as raft-engine's
//! `write_barrier.rs`). Threads (and async tasks) of one process that append at
//! once share syncs; this file says who leads, who queues, who waits for what, and
//! who is woken when. Raw appends ([`super::Log::append`]) and the ledger's
//! compare-and-append transactions both commit through it: the ledger judges each
//! transaction against its projection (its state `S`, kept under the same mutex)
//! before it queues the record; a raw append queues its payloads as they are.
//!
//! **Leader and followers.** The first caller to arrive while no group is open
//! leads: it enters the backend's exclusive section (the file backend's
//! cross-process append lock), lets the state catch up with what other processes
//! appended (`Hooks::catch_up`), opens the group, queues its own records and
//! flushes: one append and one sync per group, until nothing is queued. Callers
//! arriving while a group is open queue their records behind the ones being
//! synced (they follow them in the log) and wait.
//!
//! **Lock order.** (1) the backend's exclusive section → (2) the engine's `core`
//! mutex → (3) a waiter's own slot. A thread holding (2) never waits for (1) (the
//! leader takes (1) before (2)). (2) is never held across a write or sync of the
//! log: the leader lets go of it for each group, so other callers can queue the
//! next one. It is held across *reads* of the log — catching up, and the rebuild
//! after another writer appended first (rare with the file backend) — which is
//! what keeps every judgement on exactly the state it follows.
//!
//! **Wake-ups.** A caller whose answer rests on records not yet durable waits on
//! its own slot (a condition variable for a thread, a channel for an async task);
//! after each sync the leader wakes exactly the waiters whose records that sync
//! made durable (not every thread on every change: a design note measured a third
//! of the throughput for that). The shared condition variable (and, for async
//! tasks, a `Notify`) is only for phase changes, for readers waiting for a view
//! with nothing in flight, and for callers waiting for room in a full queue.
//!
//! **Turns between processes.** After `GROUPS_PER_LOCK_MAX` groups a leader lets
//! go of the exclusive section if another writer says it waits
//! (`Exclusive::others_waiting`), so that other processes get their turn; else it
//! keeps it for more, at most `EXTRA_TURNS_MAX` times. A leader whose turn could
//! not start (a lock timeout) shares that answer with the callers that waited for
//! it, instead of each of them waiting out the lock in turn.
//!
//! **Failure.** A group that does not become durable poisons the engine: every
//! waiter hears the cause, every later call too, until the log is reopened.

use std::collections::VecDeque;
use std::ops::{Deref, DerefMut};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use super::backend::{AppendOutcome, Appended, Exclusive};
use super::error::Error;
use super::options::LogOptions;
use crate::format::ChainLink;

/// Commit groups one leader writes before it lets go of the exclusive section.
pub const GROUPS_PER_LOCK_MAX: u32 = 8;

/// Rounds of `GROUPS_PER_LOCK_MAX` groups a leader may add to its turn when no
/// other writer says it waits (writers of earlier builds do not say so). Also
/// bounds how long the leader's own caller waits for its answer: at most
/// `(1 + EXTRA_TURNS_MAX) × GROUPS_PER_LOCK_MAX` groups, after its own is durable.
pub const EXTRA_TURNS_MAX: u32 = 3;

/// Times a caller's records are judged again because another writer appended
/// first, before it hears `HEAD_MOVED`.
pub const HEAD_MOVED_RETRIES_MAX: u32 = 64;

/// Where the group commit stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// No caller holds the exclusive section.
    Idle,
    /// A caller is entering the exclusive section and catching up; arrivals wait.
    Starting,
    /// The leader holds the exclusive section and the state is caught up: arrivals
    /// queue their records for its next sync.
    Open,
    /// The leader's turn is over (`GROUPS_PER_LOCK_MAX` groups while another writer
    /// waits, or its extra turns used up): it syncs what is queued and lets go, so
    /// other processes get their turn; arrivals wait.
    Closing,
}

/// Who may commit while the engine drains.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admission {
    /// Callers' records: refused once draining began.
    Callers,
    /// The owner's own records (a ledger's checkpoints and audit counts on close):
    /// admitted while draining, so a drained log can still close cleanly.
    Internal,
}

/// Why a commit did not give its answer.
#[derive(Debug)]
pub enum CommitError<E> {
    /// Storage failed, or the engine is poisoned.
    Storage(Error),
    /// The owner's catch-up failed (e.g. a record that does not decode).
    Hook(E),
    /// The engine is draining: the records were not queued and never will be.
    Draining,
    /// Another writer appended first this many times in a row.
    HeadMovedTooOften { retries: u32 },
}

/// An answer whose records are durable, with the chain link of the last record it
/// rests on when the backend gave it (`None` when the answer rested only on records
/// already durable).
#[derive(Debug)]
pub struct Settled<T> {
    pub answer: T,
    pub link: Option<ChainLink>,
}

/// What the owner of the engine (the ledger, a raw log) does at its turns.
pub trait Hooks<S> {
    type Error;
    /// Run `f` in the backend's exclusive section (the file backend: holding the
    /// cross-process append lock, after catching up with the files).
    fn exclusive(
        &self,
        give_up: &dyn Fn() -> bool,
        f: &mut dyn FnMut(&mut dyn Exclusive) -> Result<(), Error>,
    ) -> Result<(), Error>;
    /// In the exclusive section, before a group opens: bring the state up to the
    /// log's head (what other processes appended) and say where it is
    /// ([`Core::caught_up_to`]).
    fn catch_up(&self, core: &mut Core<S>, x: &mut dyn Exclusive) -> Result<(), Self::Error>;
    /// Nothing is queued and the leader is about to end the group: queue the
    /// owner's own records if it has any (a checkpoint). Returns whether it did.
    fn before_idle(&self, _core: &mut Core<S>) -> bool {
        false
    }
    /// A group became durable (its first and last sequence, the chain link of its
    /// last record).
    fn on_durable(&self, _core: &mut Core<S>, _group: &Appended) {}
    /// Another writer appended first: rebuild the state from the log's durable
    /// records and say where it is ([`Core::caught_up_to`]), or say why not.
    fn rebuild(&self, core: &mut Core<S>) -> Result<(), String>;
    /// The leader has left the exclusive section (work that must not hold it, such
    /// as starting a snapshot).
    fn after_lead(&self, _core: &mut Core<S>) {}
    /// A group's append failed with a transient error (the backend unreachable:
    /// etcd without a quorum), so its records may or may not have landed. Return
    /// `true` if the owner can put its state right from the log before its next
    /// turn (it rebuilds then): the engine then tells the group's waiters the
    /// error and goes on, unpoisoned. `false` (the default): poisoned, as for any
    /// failed append.
    fn unavailable(&self, _core: &mut Core<S>) -> bool {
        false
    }
}

/// How large a group and the queue may grow.
#[derive(Debug, Clone, Copy)]
pub struct GroupLimits {
    /// Most records and payload bytes in one append and sync.
    pub records_max: usize,
    pub bytes_max: usize,
    /// Most records queued for the next group; arrivals wait for room beyond it.
    pub queued_records_max: usize,
}

impl GroupLimits {
    pub fn of(opts: &LogOptions) -> GroupLimits {
        GroupLimits {
            records_max: opts.batch_records_max,
            bytes_max: opts.batch_bytes_max,
            queued_records_max: opts.queue_depth_max,
        }
    }
}

#[derive(Debug, Clone)]
enum Signal {
    /// Everything the answer rests on is durable (with the chain link of the
    /// record the waiter waited for, when the backend gave it).
    Durable(Option<ChainLink>),
    /// Another writer appended first: judge again.
    Retry,
    /// The group failed; the engine is poisoned. What each waiter hears:
    /// `WRITER_POISONED` with the cause, or `NOT_COMMITTED` when the failed group
    /// was cut back (nothing of it, nor of what was queued after it, is in the log).
    Failed(Error),
}

/// A waiting thread's own condition variable: the leader puts one signal in it and
/// wakes that thread alone.
#[derive(Default)]
struct ThreadSlot {
    signal: Mutex<Option<Signal>>,
    cv: Condvar,
}

impl ThreadSlot {
    /// The signal if one was given (the leader's own slot, after its flush).
    fn try_take(&self) -> Option<Signal> {
        self.signal.lock().expect("slot").take()
    }

    fn take(&self) -> Signal {
        let mut g = self.signal.lock().expect("slot");
        loop {
            if let Some(s) = g.take() {
                return s;
            }
            g = self.cv.wait(g).expect("slot");
        }
    }
}

/// Where one waiter is woken.
enum Slot {
    Thread(Arc<ThreadSlot>),
    Task(tokio::sync::oneshot::Sender<Signal>),
}

impl Slot {
    fn give(self, s: Signal) {
        match self {
            Slot::Thread(t) => {
                *t.signal.lock().expect("slot") = Some(s);
                t.cv.notify_one();
            }
            Slot::Task(tx) => {
                let _ = tx.send(s);
            }
        }
    }
}

/// The engine's state and its owner's (`S`, reached through `Deref`), under one
/// mutex.
pub struct Core<S> {
    state: S,
    phase: Phase,
    /// Records queued for the next group, in sequence order.
    queued: Vec<Vec<u8>>,
    /// The sequence the last queued record will have (the durable one when
    /// nothing is in flight).
    last_seq: u64,
    /// Everything up to this sequence is synced.
    durable_seq: u64,
    /// Bumped when queued records were judged on state another writer overtook:
    /// every waiter of an older epoch judges again.
    epoch: u64,
    head_moved: u64,
    draining: bool,
    /// Readers waiting for a view with nothing in flight; while any wait, arrivals
    /// do not join the open group, so the leader drains and the wait is bounded.
    readers_waiting: usize,
    /// Callers waiting for room in a full queue.
    room_waiting: usize,
    /// Threads waiting for a group to open (a probe for tests: nothing decides on it).
    #[cfg(test)]
    arrivals_waiting: usize,
    /// An async caller found no group open and asked for a leader on a blocking
    /// thread that has not started yet: other async callers wait for it instead of
    /// asking for more (threads may still lead: the phase stays `Idle`).
    async_lead_pending: bool,
    /// The last attempt to lead that could not enter the exclusive section (a lock
    /// timeout, say), and when it gave up: callers that were waiting then get the
    /// same answer instead of each waiting out the lock again.
    lead_failed: Option<(Instant, Error)>,
    poisoned: Option<String>,
    /// Waiters with the last sequence their answer rests on, in that order (it is
    /// the last queued sequence when they register, so nearly always at the back:
    /// no map node and no vector per waiter).
    waiters: VecDeque<(u64, Slot)>,
}

impl<S> Deref for Core<S> {
    type Target = S;
    fn deref(&self) -> &S {
        &self.state
    }
}

impl<S> DerefMut for Core<S> {
    fn deref_mut(&mut self) -> &mut S {
        &mut self.state
    }
}

impl<S> Core<S> {
    /// Everything up to this sequence is durable.
    pub fn durable_seq(&self) -> u64 {
        self.durable_seq
    }

    /// The sequence the last queued record will have.
    pub fn last_seq(&self) -> u64 {
        self.last_seq
    }

    /// Queue a record for the next group; returns the sequence it will have.
    pub fn queue(&mut self, record: Vec<u8>) -> u64 {
        self.queued.push(record);
        self.last_seq += 1;
        self.last_seq
    }

    /// After catching up or rebuilding: the log is durable up to `seq` and nothing
    /// of this engine is in flight.
    pub fn caught_up_to(&mut self, seq: u64) {
        debug_assert!(self.queued.is_empty() && self.last_seq == self.durable_seq, "caught up with records in flight");
        (self.durable_seq, self.last_seq) = (seq, seq);
    }

    /// No group is being committed and nothing is in flight.
    pub fn is_settled(&self) -> bool {
        self.phase == Phase::Idle && self.durable_seq == self.last_seq
    }

    pub fn poisoned(&self) -> Option<&str> {
        self.poisoned.as_deref()
    }

    /// How often another writer appended first.
    pub fn head_moved(&self) -> u64 {
        self.head_moved
    }

    /// The failure of an attempt to lead that gave up after `since`.
    fn lead_failed_since(&self, since: Instant) -> Option<Error> {
        self.lead_failed.as_ref().filter(|(at, _)| *at >= since).map(|(_, e)| e.clone())
    }

    /// An async caller that cannot go on yet: registered for the engine's next
    /// change before the core's mutex is let go (no wake-up is lost), and counted
    /// among those waiting for room when a group is open and no reader holds it
    /// back. Returns whether it was counted (it is counted out by a `RoomWait`).
    fn park_async(&mut self, notified: std::pin::Pin<&mut tokio::sync::futures::Notified<'_>>, blocked: bool) -> bool {
        notified.enable();
        let waits_for_room = self.phase == Phase::Open && !blocked;
        if waits_for_room {
            self.room_waiting += 1;
        }
        waits_for_room
    }

    pub fn poison_check(&self) -> Result<(), Error> {
        match &self.poisoned {
            Some(cause) => Err(Error::Poisoned { cause: cause.clone() }),
            None => Ok(()),
        }
    }

    /// The waiters whose records are now durable (and only them), with their
    /// signal: woken by the caller once it has let go of the core mutex, so that
    /// arrivals queue meanwhile. `links` are the chain links of the records the
    /// last group appended from `first_seq` on.
    fn durable_waiters(&mut self, first_seq: u64, links: &[ChainLink]) -> Vec<(Slot, Signal)> {
        let n = self.waiters.partition_point(|(seq, _)| *seq <= self.durable_seq);
        self.waiters
            .drain(..n)
            .map(|(seq, slot)| {
                let link = seq.checked_sub(first_seq).and_then(|i| links.get(i as usize)).copied();
                (slot, Signal::Durable(link))
            })
            .collect()
    }

    /// Register a waiter for `covers`, keeping the order by sequence.
    fn wait_for(&mut self, covers: u64, slot: Slot) {
        match self.waiters.back() {
            Some((last, _)) if *last > covers => {
                let at = self.waiters.partition_point(|(seq, _)| *seq <= covers);
                self.waiters.insert(at, (covers, slot));
            }
            _ => self.waiters.push_back((covers, slot)),
        }
    }

    /// Give every waiter the same signal.
    fn wake_all(&mut self, signal: Signal) {
        for (_, slot) in std::mem::take(&mut self.waiters) {
            slot.give(signal.clone());
        }
    }

    /// Poison: the state may hold records the log lacks; every waiter hears it now,
    /// every later call until reopen. (For owners: when their state went ahead of
    /// the log outside a group, e.g. a catch-up that failed half-way.)
    pub fn poison(&mut self, cause: String) {
        self.poisoned.get_or_insert(cause);
        let cause = self.poisoned.clone().expect("just set");
        self.fail_all(Error::Poisoned { cause });
    }

    /// Poison after a group that failed with `error`: when storage cut the group
    /// back (`NOT_COMMITTED`), every waiter hears that — its records, in the group
    /// or queued after it, were never appended and never will be — else it hears
    /// `WRITER_POISONED`, its outcome unknown.
    fn poison_after(&mut self, error: &Error) {
        if self.poisoned.is_some() || !matches!(error, Error::NotCommitted { .. }) {
            return self.poison(error.to_string());
        }
        self.poisoned = Some(error.to_string());
        self.fail_all(error.clone());
    }

    fn fail_all(&mut self, error: Error) {
        self.queued.clear();
        self.last_seq = self.durable_seq;
        self.wake_all(Signal::Failed(error));
    }
}

/// What [`GroupCommit::drain`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DrainOutcome {
    pub settled: bool,
    pub last_seq: u64,
}

/// What an async caller found ([`GroupCommit::queue_async`]).
pub enum AsyncTurn {
    /// Its records were queued into an open group and are settled.
    Done(Result<Settled<(u64, u64)>, Error>),
    /// No group was open: the caller must commit its records on a thread that may
    /// block, with [`GroupCommit::commit_async_lead`] (which leads, or joins a
    /// group opened meanwhile) — or call [`GroupCommit::async_lead_withdrawn`] if
    /// that thread will never run. Until then other async callers wait for it.
    Lead(Vec<Vec<u8>>),
}

/// Lead for an async caller that was made leader ([`AsyncTurn::Lead`],
/// [`AsyncCommit::Lead`]): run `lead` with the engine's owner on the runtime's
/// blocking pool. The request to lead is withdrawn however that ends — also if the
/// thread never runs (a runtime shutting down drops it; with no runtime the spawn
/// panics) — so other async callers never wait for a leader that does not come.
pub async fn lead_on_blocking_pool<O, S, R>(
    owner: Arc<O>,
    engine: fn(&O) -> &GroupCommit<S>,
    lead: impl FnOnce(&O) -> R + Send + 'static,
) -> Result<R, tokio::task::JoinError>
where
    O: Send + Sync + 'static,
    S: 'static,
    R: Send + 'static,
{
    struct Pending<O, S: 'static>(Option<Arc<O>>, fn(&O) -> &GroupCommit<S>);
    impl<O, S> Drop for Pending<O, S> {
        fn drop(&mut self) {
            if let Some(owner) = self.0.take() {
                (self.1)(&owner).async_lead_withdrawn();
            }
        }
    }
    let mut pending = Pending(Some(owner), engine);
    tokio::task::spawn_blocking(move || {
        let owner = pending.0.take().expect("taken once");
        lead(&owner)
    })
    .await
}

/// What an async judged commit found ([`GroupCommit::commit_async`]).
pub enum AsyncCommit<T, E> {
    /// Judged in an open group (or refused before): the answer, settled.
    Done(Result<Settled<T>, CommitError<E>>),
    /// No group was open: the caller must commit on a thread that may block, with
    /// [`GroupCommit::commit_async_lead`] — or call
    /// [`GroupCommit::async_lead_withdrawn`] if that thread will never run.
    Lead,
}

/// An async caller counted among those waiting for room in the queue until it
/// stops waiting — also if its future is dropped.
struct RoomWait<'a, S>(&'a GroupCommit<S>);

impl<S> Drop for RoomWait<'_, S> {
    fn drop(&mut self) {
        self.0.lock().room_waiting -= 1;
    }
}

/// Tries an async caller makes for the engine's mutex, letting the runtime's other
/// tasks run between them, before it waits for it as a blocking section.
const LOCK_TRIES_ASYNC: u32 = 64;

/// Run `f`, which may block, from an async caller: on a worker of a multi-thread
/// runtime the runtime is told (its other tasks move to another thread); anywhere
/// else it simply runs. (The library alone has tokio's single-thread runtime only:
/// there is nothing to tell.)
fn block_in_place<R>(f: impl FnOnce() -> R) -> R {
    #[cfg(feature = "daemon")]
    if tokio::runtime::Handle::try_current()
        .is_ok_and(|h| h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread)
    {
        return tokio::task::block_in_place(f);
    }
    f()
}

/// Async waiters woken by a leader that is not a runtime worker are handed to a
/// worker in one task when there are at least this many: each wake-up from outside
/// the runtime is a push onto its shared queue under a lock (and maybe a worker
/// unparked), so the leader would wake a large group one task at a time before it
/// could start the next group.
const TASK_WAKES_HANDED_OFF_MIN: usize = 16;

/// Signals not yet given are given when this is dropped — however the task that
/// carries it ends, even if it never runs (a runtime shutting down drops it): a
/// waiter whose records are durable must never hear "closed" instead.
struct Wakes(Vec<(Slot, Signal)>);

impl Drop for Wakes {
    fn drop(&mut self) {
        for (slot, signal) in self.0.drain(..) {
            slot.give(signal);
        }
    }
}

/// Give each waiter its signal: threads at once; async tasks from a worker of their
/// runtime when the leader is not one and the group is large (see
/// [`TASK_WAKES_HANDED_OFF_MIN`]), so that waking them overlaps the next group.
fn wake(woken: Vec<(Slot, Signal)>) {
    let (tasks, threads): (Vec<_>, Vec<_>) = woken.into_iter().partition(|(slot, _)| matches!(slot, Slot::Task(_)));
    drop(Wakes(threads));
    let tasks = Wakes(tasks);
    if tasks.0.len() < TASK_WAKES_HANDED_OFF_MIN {
        return;
    }
    // A leader for async callers runs on the runtime's blocking pool (a thread that
    // blocks is never one of its workers), where the runtime is at hand. Elsewhere
    // (a thread of the caller's own, a current-thread runtime) they are woken here.
    if let Ok(h) = tokio::runtime::Handle::try_current()
        && h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread
    {
        drop(h.spawn(async move { drop(tasks) }));
    }
}

/// The engine. `S` is its owner's state, judged and updated under the same mutex.
pub struct GroupCommit<S> {
    core: Mutex<Core<S>>,
    /// Arrivals waiting for a group to open (or to lead one), or for room in the
    /// queue. When a leader ends its phase it wakes *one* of them (to lead), not
    /// every thread: the one that leads wakes them all once the group is open.
    arrivals: Condvar,
    /// Readers waiting for a settled view, a drain: phase ends and poisoning.
    changed: Condvar,
    /// The same, for async tasks.
    changed_async: tokio::sync::Notify,
    limits: GroupLimits,
}

type Act<'a, S, T> = dyn FnMut(&mut Core<S>) -> (T, u64) + 'a;

impl<S> GroupCommit<S> {
    /// An engine whose log is durable up to `durable_seq`.
    pub fn new(state: S, durable_seq: u64, limits: GroupLimits) -> GroupCommit<S> {
        GroupCommit {
            core: Mutex::new(Core {
                state,
                phase: Phase::Idle,
                queued: Vec::new(),
                last_seq: durable_seq,
                durable_seq,
                epoch: 0,
                head_moved: 0,
                draining: false,
                readers_waiting: 0,
                room_waiting: 0,
                #[cfg(test)]
                arrivals_waiting: 0,
                async_lead_pending: false,
                lead_failed: None,
                poisoned: None,
                waiters: VecDeque::new(),
            }),
            arrivals: Condvar::new(),
            changed: Condvar::new(),
            changed_async: tokio::sync::Notify::new(),
            limits,
        }
    }

    /// The state as it is (records may be in flight).
    pub fn lock(&self) -> MutexGuard<'_, Core<S>> {
        self.recover(self.core.lock())
    }

    /// The guard, also after a panic while another thread held the mutex: the
    /// state may then be half-changed, so the engine is poisoned (every waiter and
    /// every later call hears it) and the mutex's own poison cleared.
    fn recover<'a>(&'a self, r: std::sync::LockResult<MutexGuard<'a, Core<S>>>) -> MutexGuard<'a, Core<S>> {
        r.unwrap_or_else(|p| {
            let mut core = p.into_inner();
            self.core.clear_poison();
            if core.poisoned.is_none() {
                tracing::error!("a panic while the commit engine was held; the log is poisoned");
                core.poison("a panic while the commit engine was held".into());
                self.wake_phase();
            }
            core
        })
    }

    /// The guard, for an async caller on a runtime worker. The mutex is mostly
    /// held for microseconds (judging one transaction), but a leader holds it
    /// while it reads the files to catch up, and for a whole replay when another
    /// writer appended first: a worker blocked on it then holds up every other
    /// task of the runtime (health checks, timers, accepting connections). So the
    /// caller retries, letting other tasks run in between, and past
    /// `LOCK_TRIES_ASYNC` tries waits with the runtime told that this worker
    /// blocks (its other tasks move to another thread).
    async fn lock_async(&self) -> MutexGuard<'_, Core<S>> {
        for _ in 0..LOCK_TRIES_ASYNC {
            match self.core.try_lock() {
                Ok(guard) => return guard,
                Err(std::sync::TryLockError::Poisoned(p)) => return self.recover(Err(p)),
                Err(std::sync::TryLockError::WouldBlock) => {}
            }
            tokio::task::yield_now().await;
        }
        block_in_place(|| self.lock())
    }

    /// Everyone who waits for a change: a group opened, room, poisoning.
    fn wake_phase(&self) {
        self.arrivals.notify_all();
        self.changed.notify_all();
        self.changed_async.notify_waiters();
    }

    /// The phase is idle again: one arrival to lead, and the readers.
    fn wake_idle(&self) {
        self.arrivals.notify_one();
        self.changed.notify_all();
        self.changed_async.notify_waiters();
    }

    /// The state with nothing in flight: waits while records are (meanwhile new
    /// arrivals do not join the open group, so this is bounded by the groups
    /// already formed).
    pub fn settled(&self) -> Result<MutexGuard<'_, Core<S>>, Error> {
        let mut core = self.lock();
        core.readers_waiting += 1;
        while core.durable_seq < core.last_seq && core.poisoned.is_none() {
            core = self.recover(self.changed.wait(core));
        }
        core.readers_waiting -= 1;
        self.wake_phase();
        core.poison_check()?;
        Ok(core)
    }

    /// Stop admitting callers' records (they are refused: `Draining`) and wait, at
    /// most `wait_ms_max`, until every record already queued is durable or failed.
    pub fn drain(&self, wait_ms_max: u64) -> Result<DrainOutcome, Error> {
        let deadline = Instant::now() + Duration::from_millis(wait_ms_max);
        let mut core = self.lock();
        core.draining = true;
        self.wake_phase();
        loop {
            if core.is_settled() || core.poisoned.is_some() {
                core.poison_check()?;
                return Ok(DrainOutcome { settled: true, last_seq: core.durable_seq });
            }
            let now = Instant::now();
            if now >= deadline {
                return Ok(DrainOutcome { settled: false, last_seq: core.durable_seq });
            }
            core = match self.changed.wait_timeout(core, deadline - now) {
                Ok((g, _)) => g,
                Err(p) => self.recover(Err(PoisonError::new(p.into_inner().0))),
            };
        }
    }

    /// Run `act` on the caught-up state within a commit group: `act` queues its
    /// records (if any) and returns its answer and the last sequence that answer
    /// rests on; the answer is given once that sequence is durable. If another
    /// writer appended first, the state `act` ran on is gone: it runs again on the
    /// new state.
    pub fn commit<H: Hooks<S>, T>(
        &self,
        hooks: &H,
        admission: Admission,
        act: impl FnMut(&mut Core<S>) -> (T, u64),
    ) -> Result<Settled<T>, CommitError<H::Error>> {
        self.commit_inner(hooks, admission, act, false)
    }

    /// `commit` on the blocking thread an async caller asked for
    /// (`AsyncTurn::Lead`): the request is withdrawn when this caller first holds
    /// the engine — where it takes the phase or joins a group — so that no other
    /// async caller asks for a second thread meanwhile.
    pub fn commit_async_lead<H: Hooks<S>, T>(
        &self,
        hooks: &H,
        admission: Admission,
        act: impl FnMut(&mut Core<S>) -> (T, u64),
    ) -> Result<Settled<T>, CommitError<H::Error>> {
        self.commit_inner(hooks, admission, act, true)
    }

    fn commit_inner<H: Hooks<S>, T>(
        &self,
        hooks: &H,
        admission: Admission,
        mut act: impl FnMut(&mut Core<S>) -> (T, u64),
        mut async_lead: bool,
    ) -> Result<Settled<T>, CommitError<H::Error>> {
        for _ in 0..HEAD_MOVED_RETRIES_MAX {
            if let Some(answer) = self.attempt(hooks, admission, &mut act, std::mem::take(&mut async_lead)) {
                return answer;
            }
            tracing::debug!("judging again: another writer appended first");
        }
        Err(CommitError::HeadMovedTooOften { retries: HEAD_MOVED_RETRIES_MAX })
    }

    /// One try of `commit`: `None` when it must be judged again.
    fn attempt<H: Hooks<S>, T>(
        &self,
        hooks: &H,
        admission: Admission,
        act: &mut Act<'_, S, T>,
        async_lead: bool,
    ) -> Option<Result<Settled<T>, CommitError<H::Error>>> {
        let arrived = Instant::now();
        let mut core = self.lock();
        if async_lead && std::mem::take(&mut core.async_lead_pending) && core.phase != Phase::Idle {
            // A group is open or opening: the async callers waiting for this
            // thread may queue into it themselves. (If idle, this thread takes the
            // phase now, and they are woken when its group opens.)
            self.changed_async.notify_waiters();
        }
        loop {
            if let Err(e) = core.poison_check() {
                return Some(Err(CommitError::Storage(e)));
            }
            if core.draining && admission == Admission::Callers {
                return Some(Err(CommitError::Draining));
            }
            if let Some(e) = core.lead_failed_since(arrived) {
                return Some(Err(CommitError::Storage(e)));
            }
            let blocked = core.readers_waiting > 0;
            match core.phase {
                Phase::Open if !blocked && core.queued.len() < self.limits.queued_records_max => {
                    let epoch = core.epoch;
                    let (answer, covers) = match self.guarded(&mut core, act) {
                        Ok(done) => done,
                        Err(panic) => {
                            drop(core);
                            std::panic::resume_unwind(panic);
                        }
                    };
                    return self.await_durable(core, covers, epoch, answer);
                }
                Phase::Open if !blocked => {
                    core.room_waiting += 1;
                    core = self.recover(self.arrivals.wait(core));
                    core.room_waiting -= 1;
                }
                Phase::Idle if !blocked => {
                    core.phase = Phase::Starting;
                    drop(core);
                    return self.lead_started(hooks, admission, act);
                }
                _ => {
                    #[cfg(test)]
                    {
                        core.arrivals_waiting += 1;
                    }
                    core = self.recover(self.arrivals.wait(core));
                    #[cfg(test)]
                    {
                        core.arrivals_waiting -= 1;
                    }
                }
            }
        }
    }

    /// Lead, the phase having been set to `Starting` by this caller: enter the
    /// exclusive section, catch up, open the group, run this caller's own `act`,
    /// and flush the groups. `None` when `act` must be judged again.
    fn lead_started<H: Hooks<S>, T>(
        &self,
        hooks: &H,
        admission: Admission,
        act: &mut Act<'_, S, T>,
    ) -> Option<Result<Settled<T>, CommitError<H::Error>>> {
        let (mut own, mut panicked, mut opened) = (None, None, false);
        // Until `flush_groups` ends it, the phase is this leader's.
        let mut phase_ours = true;
        let mut failed: Option<CommitError<H::Error>> = None;
        // A panic anywhere in the leader's turn (a hook, the backend) must not
        // leave the phase taken and the waiters asleep for ever.
        // A drain that begins while this leader waits for the exclusive section
        // (another process's turn of the lock) withdraws it: nothing of its turn
        // has been judged, so nothing is, and the wait ends at once — a cutover's
        // grace bounds every admitted request, not only those already judged.
        let drained = || admission == Admission::Callers && self.lock().draining;
        let turn = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            hooks.exclusive(&drained, &mut |x| {
                let mut core = self.lock();
                if core.draining && admission == Admission::Callers {
                    // Entered after the drain began: judge nothing.
                    failed = Some(CommitError::Draining);
                    return Ok(());
                }
                if let Err(e) = hooks.catch_up(&mut core, x) {
                    failed = Some(CommitError::Hook(e));
                    return Ok(());
                }
                core.phase = Phase::Open;
                core.lead_failed = None;
                opened = true;
                self.wake_phase();
                match self.guarded(&mut core, act) {
                    Err(panic) => panicked = Some(panic),
                    Ok((answer, covers)) => {
                        // Like every other caller's, the leader's answer waits on its
                        // own slot: the group that makes it durable settles it — not
                        // a later group that fails, or that another writer overtakes.
                        let slot = (covers > core.durable_seq).then(|| {
                            let slot = Arc::new(ThreadSlot::default());
                            core.wait_for(covers, Slot::Thread(slot.clone()));
                            slot
                        });
                        own = Some((answer, slot));
                    }
                }
                phase_ours = false;
                if let Err(e) = self.flush_groups(hooks, x, core) {
                    failed = Some(CommitError::Storage(e));
                }
                Ok(())
            })
        }));
        let entered = match turn {
            Ok(entered) => entered,
            Err(panic) => {
                let mut core = self.lock();
                tracing::error!("the leader of a commit group panicked; the log is poisoned");
                core.poison("the leader of a commit group panicked".into());
                if phase_ours {
                    core.phase = Phase::Idle;
                }
                self.wake_phase();
                drop(core);
                std::panic::resume_unwind(panic);
            }
        };
        let error = match (entered, failed) {
            // Withdrawn by the drain while it waited: the drain's answer, which
            // those waiting for this turn hear from the drain itself.
            (Err(Error::Withdrawn { .. }), _) => Some(CommitError::Draining),
            (Err(e), _) => {
                if !opened {
                    // Those who waited for this turn hear why it never came.
                    // Shared with every caller that arrived before now (one that
                    // came just now hears it at once, with the leader's wait).
                    self.lock().lead_failed = Some((Instant::now(), e.clone()));
                }
                Some(CommitError::Storage(e))
            }
            (Ok(()), e) => e,
        };
        if !opened {
            // The exclusive section was not entered or the catch-up failed: the
            // phase is still this caller's `Starting`. (Once open, `flush_groups`
            // alone ends the phase: by now another caller may have started the next.)
            let mut core = self.lock();
            core.phase = Phase::Idle;
            self.wake_phase();
        }
        // Off the exclusive section.
        hooks.after_lead(&mut self.lock());
        if let Some(panic) = panicked {
            // `flush_groups` found the engine poisoned and ended the phase; now let
            // the caller's panic go on.
            std::panic::resume_unwind(panic);
        }
        let poisoned = |cause: String| CommitError::Storage(Error::Poisoned { cause });
        match own {
            None => Some(Err(error.unwrap_or(CommitError::Storage(Error::Closed)))),
            // It rested on durable records only.
            Some((answer, None)) => Some(Ok(Settled { answer, link: None })),
            Some((answer, Some(slot))) => {
                match slot.try_take() {
                    Some(Signal::Durable(link)) => Some(Ok(Settled { answer, link })),
                    Some(Signal::Retry) => None,
                    // The leader hears what failed (an I/O error, say).
                    Some(Signal::Failed(e)) => Some(Err(error.unwrap_or(CommitError::Storage(e)))),
                    None => Some(Err(error
                        .unwrap_or_else(|| poisoned("the group ended without settling the leader's records".into())))),
                }
            }
        }
    }

    /// Run `act`, catching a panic (from an owner's judgement, or a bug): the engine
    /// cannot know how far it got, so it is poisoned, and every waiter is woken to
    /// an error instead of waiting for ever. The caller re-raises the panic once it
    /// holds no lock.
    fn guarded<T>(
        &self,
        core: &mut Core<S>,
        act: &mut Act<'_, S, T>,
    ) -> Result<(T, u64), Box<dyn std::any::Any + Send>> {
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| act(&mut *core))).inspect_err(|_| {
            tracing::error!("a commit panicked while its records were built or judged; the log is poisoned");
            core.poison("a commit panicked while its records were built or judged".into());
            self.wake_phase();
        })
    }

    /// Hand queued records to the backend, one append and sync per group, until
    /// none are left. The caller is in the exclusive section throughout; the core
    /// mutex is released during each write and sync so that others can queue the
    /// next group.
    ///
    /// After `GROUPS_PER_LOCK_MAX` groups the leader keeps the section for as many
    /// more only if no other writer says it waits (`Exclusive::others_waiting`), at
    /// most `EXTRA_TURNS_MAX` times; else it syncs what is queued and lets go.
    fn flush_groups<'a, H: Hooks<S>>(
        &'a self,
        hooks: &H,
        x: &mut dyn Exclusive,
        mut core: MutexGuard<'a, Core<S>>,
    ) -> Result<(), Error> {
        let mut extra_turns_left = EXTRA_TURNS_MAX;
        let GroupLimits { records_max, bytes_max, .. } = self.limits;
        let mut groups = 0;
        loop {
            // Only the leader ends its phase (another caller could otherwise start a
            // second leader while this one is still in the exclusive section).
            debug_assert!(matches!(core.phase, Phase::Open | Phase::Closing), "leader in phase {:?}", core.phase);
            if let Some(cause) = core.poisoned.clone() {
                // Queued records were judged on state that cannot be trusted.
                core.poison(cause.clone());
                core.phase = Phase::Idle;
                self.wake_phase();
                return Err(Error::Poisoned { cause });
            }
            if core.queued.is_empty() {
                if hooks.before_idle(&mut core) {
                    continue;
                }
                core.phase = Phase::Idle;
                self.wake_idle();
                return Ok(());
            }
            let (mut n, mut bytes) = (0, 0);
            for r in &core.queued {
                if n > 0 && (n == records_max || bytes + r.len() > bytes_max) {
                    break;
                }
                (n, bytes) = (n + 1, bytes + r.len());
            }
            let group: Vec<Vec<u8>> = core.queued.drain(..n).collect();
            let expect = core.durable_seq;
            if core.room_waiting > 0 {
                self.wake_phase();
            }
            drop(core);
            let appended = x.append_if_head(expect, group);
            // Asked off the core mutex (it is a system call): at the end of a turn,
            // does another writer wait for the section?
            let turn_ends = groups + 1 >= GROUPS_PER_LOCK_MAX;
            let others_wait = turn_ends && extra_turns_left > 0 && x.others_waiting();
            core = self.lock();
            match appended {
                Ok(AppendOutcome::HeadMoved { actual }) => {
                    // Another writer appended first: everything queued was judged on
                    // state the log does not have. Rebuild the durable state (with
                    // the other writer's records) and send every waiter of this
                    // epoch back to judge again.
                    tracing::info!(expected = expect, actual, "another writer appended first; judging again");
                    core.queued.clear();
                    core.last_seq = core.durable_seq;
                    core.epoch += 1;
                    core.head_moved += 1;
                    core.wake_all(Signal::Retry);
                    if let Err(why) = hooks.rebuild(&mut core) {
                        let cause = format!("catching up after another writer appended: {why}");
                        core.poison(cause.clone());
                        core.phase = Phase::Idle;
                        self.wake_phase();
                        return Err(Error::Poisoned { cause });
                    }
                    self.wake_phase();
                }
                Ok(AppendOutcome::Appended(a)) if a.first_seq == expect + 1 && a.last_seq == expect + n as u64 => {
                    // Durable moves forward only, and never past what was judged —
                    // unless the engine was poisoned (a panicking build on another
                    // thread) while this group was being written: `fail_all` then
                    // set the last judged back, and this group's waiters were told
                    // it failed although it is in the log (their request ids say
                    // committed; see the closing notes of this change).
                    assert!(a.last_seq > core.durable_seq, "durable {} -> {}", core.durable_seq, a.last_seq);
                    assert!(
                        a.last_seq <= core.last_seq || core.poisoned.is_some(),
                        "durable {} ahead of the last judged {}",
                        a.last_seq,
                        core.last_seq
                    );
                    core.durable_seq = a.last_seq;
                    hooks.on_durable(&mut core, &a);
                    let woken = core.durable_waiters(a.first_seq, x.links());
                    if !woken.is_empty() {
                        drop(core);
                        wake(woken);
                        core = self.lock();
                    }
                    groups += 1;
                    if groups >= GROUPS_PER_LOCK_MAX && core.phase == Phase::Open {
                        if extra_turns_left > 0 && !others_wait {
                            // Nobody else waits: another turn without letting go.
                            extra_turns_left -= 1;
                            groups = 0;
                        } else {
                            core.phase = Phase::Closing;
                        }
                    }
                    // The shared condition variables only for those who need them:
                    // readers waiting for a settled view (arrivals have nothing to
                    // do until the phase ends).
                    if core.readers_waiting > 0 {
                        self.wake_phase();
                    }
                }
                result => {
                    let (cause, error) = match result {
                        Ok(AppendOutcome::Appended(a)) => {
                            let cause =
                                format!("records landed at {}..={}, not after {expect}", a.first_seq, a.last_seq);
                            (cause.clone(), Error::Poisoned { cause })
                        }
                        Ok(AppendOutcome::HeadMoved { .. }) => unreachable!("handled above"),
                        Err(e) => (e.to_string(), e),
                    };
                    if error.is_transient() && hooks.unavailable(&mut core) {
                        // Outcome unknown, state put right from the log before the next
                        // turn: every waiter of the group (and what was queued after
                        // it) hears the error; nothing is poisoned.
                        tracing::warn!(%cause, "a commit group's outcome is unknown: the log is unreachable");
                        core.fail_all(error.clone());
                        core.epoch += 1;
                        core.phase = Phase::Idle;
                        self.wake_phase();
                        return Err(error);
                    }
                    tracing::error!(%cause, "a commit group did not become durable; the log is poisoned");
                    core.poison_after(&error);
                    core.phase = Phase::Idle;
                    self.wake_phase();
                    // The leader reports what failed (an I/O error, say); the others
                    // waiting on the group, and every later call, hear WRITER_POISONED.
                    return Err(error);
                }
            }
        }
    }

    /// Wait until everything up to `covers` is durable, then give `answer`; `None`
    /// if the state it was judged on (in `epoch`) was overtaken by another writer.
    fn await_durable<T, E>(
        &self,
        mut core: MutexGuard<'_, Core<S>>,
        covers: u64,
        epoch: u64,
        answer: T,
    ) -> Option<Result<Settled<T>, CommitError<E>>> {
        if core.epoch != epoch {
            return None;
        }
        if core.durable_seq >= covers {
            return Some(Ok(Settled { answer, link: None }));
        }
        if let Err(e) = core.poison_check() {
            return Some(Err(CommitError::Storage(e)));
        }
        // Wait on our own slot: the leader wakes us when `covers` is durable.
        let slot = Arc::new(ThreadSlot::default());
        core.wait_for(covers, Slot::Thread(slot.clone()));
        drop(core);
        match slot.take() {
            Signal::Durable(link) => Some(Ok(Settled { answer, link })),
            Signal::Retry => None,
            Signal::Failed(e) => Some(Err(CommitError::Storage(e))),
        }
    }

    /// The blocking thread an async caller asked for (`AsyncTurn::Lead`) will
    /// never run (its task was dropped, or could not be spawned): other async
    /// callers may ask again.
    pub fn async_lead_withdrawn(&self) {
        let mut core = self.lock();
        if std::mem::take(&mut core.async_lead_pending) {
            drop(core);
            self.changed_async.notify_waiters();
        }
    }

    /// [`commit`](Self::commit) for an async caller (the daemon's requests): `act`
    /// is judged under the engine's mutex on the caller's own thread when a group
    /// is open, and the caller waits for its records without holding a thread.
    /// When no group is open it is made leader ([`AsyncCommit::Lead`]): it must
    /// then run the same `act` through [`commit_async_lead`](Self::commit_async_lead)
    /// on a thread that may block (or call
    /// [`async_lead_withdrawn`](Self::async_lead_withdrawn) if that thread will
    /// never run). `act` may run more than once, as with `commit`.
    ///
    /// Dropping this future after `act` queued its records does not withdraw them:
    /// they are committed with their group (the answer is then lost, as for a
    /// client that hung up); a caller that must hear every answer runs it in a task
    /// of its own.
    pub async fn commit_async<T, E>(
        &self,
        admission: Admission,
        act: &mut (dyn FnMut(&mut Core<S>) -> (T, u64) + Send),
    ) -> AsyncCommit<T, E> {
        let arrived = Instant::now();
        let mut retries = 0;
        loop {
            let notified = self.changed_async.notified();
            tokio::pin!(notified);
            let mut waits_for_room = false;
            let judged = {
                let mut core = self.lock_async().await;
                if let Err(e) = core.poison_check() {
                    return AsyncCommit::Done(Err(CommitError::Storage(e)));
                }
                if core.draining && admission == Admission::Callers {
                    return AsyncCommit::Done(Err(CommitError::Draining));
                }
                if let Some(e) = core.lead_failed_since(arrived) {
                    return AsyncCommit::Done(Err(CommitError::Storage(e)));
                }
                let blocked = core.readers_waiting > 0;
                match core.phase {
                    Phase::Idle if !blocked && !core.async_lead_pending => {
                        core.async_lead_pending = true;
                        return AsyncCommit::Lead;
                    }
                    Phase::Open if !blocked && core.queued.len() < self.limits.queued_records_max => {
                        let (answer, covers) = match self.guarded(&mut core, act) {
                            Ok(done) => done,
                            Err(panic) => {
                                drop(core);
                                std::panic::resume_unwind(panic);
                            }
                        };
                        if core.durable_seq >= covers {
                            return AsyncCommit::Done(Ok(Settled { answer, link: None }));
                        }
                        if let Err(e) = core.poison_check() {
                            return AsyncCommit::Done(Err(CommitError::Storage(e)));
                        }
                        let (tx, rx) = tokio::sync::oneshot::channel();
                        core.wait_for(covers, Slot::Task(tx));
                        Some((rx, answer))
                    }
                    _ => {
                        waits_for_room = core.park_async(notified.as_mut(), blocked);
                        None
                    }
                }
            };
            let Some((rx, answer)) = judged else {
                let _room = waits_for_room.then(|| RoomWait(self));
                notified.await;
                continue;
            };
            let failed = |e| AsyncCommit::Done(Err(CommitError::Storage(e)));
            match rx.await {
                Ok(Signal::Durable(link)) => return AsyncCommit::Done(Ok(Settled { answer, link })),
                Ok(Signal::Retry) => {
                    retries += 1;
                    if retries >= HEAD_MOVED_RETRIES_MAX {
                        return AsyncCommit::Done(Err(CommitError::HeadMovedTooOften {
                            retries: HEAD_MOVED_RETRIES_MAX,
                        }));
                    }
                    tracing::debug!("judging again: another writer appended first");
                }
                Ok(Signal::Failed(e)) => return failed(e),
                Err(_) => return AsyncCommit::Done(Err(CommitError::Storage(Error::Closed))),
            }
        }
    }

    /// For async callers with records that need no judging (raw appends): queue
    /// `records` into the open group and wait for them without blocking a thread;
    /// answers their first and last sequence. When no group is open, the caller is
    /// made leader (`AsyncTurn::Lead`): it must lead on a thread that may block.
    pub async fn queue_async(&self, admission: Admission, records: Vec<Vec<u8>>) -> AsyncTurn {
        let mut records = Some(records);
        let arrived = Instant::now();
        loop {
            let notified = self.changed_async.notified();
            tokio::pin!(notified);
            let mut waits_for_room = false;
            let rx = {
                let mut core = self.lock_async().await;
                if let Err(e) = core.poison_check() {
                    return AsyncTurn::Done(Err(e));
                }
                if core.draining && admission == Admission::Callers {
                    return AsyncTurn::Done(Err(Error::Closed));
                }
                if let Some(e) = core.lead_failed_since(arrived) {
                    return AsyncTurn::Done(Err(e));
                }
                let blocked = core.readers_waiting > 0;
                match core.phase {
                    // The phase stays `Idle`: a blocking thread that is slow to start
                    // holds up only async callers (threads may lead meanwhile), and
                    // one that never runs (a runtime shutting down, no runtime)
                    // withdraws the request (`async_lead_withdrawn`).
                    Phase::Idle if !blocked && !core.async_lead_pending => {
                        core.async_lead_pending = true;
                        return AsyncTurn::Lead(records.take().expect("queued once"));
                    }
                    Phase::Open if !blocked && core.queued.len() < self.limits.queued_records_max => {
                        let first = core.last_seq + 1;
                        for r in records.take().expect("queued once") {
                            core.queue(r);
                        }
                        let last = core.last_seq;
                        let (tx, rx) = tokio::sync::oneshot::channel();
                        core.wait_for(last, Slot::Task(tx));
                        Some((rx, first, last))
                    }
                    _ => {
                        waits_for_room = core.park_async(notified.as_mut(), blocked);
                        None
                    }
                }
            };
            let Some((rx, first, last)) = rx else {
                // Counted out again even if this future is dropped while it waits.
                let _room = waits_for_room.then(|| RoomWait(self));
                notified.await;
                continue;
            };
            return AsyncTurn::Done(match rx.await {
                Ok(Signal::Durable(link)) => Ok(Settled { answer: (first, last), link }),
                // Raw records are never judged: a writer that appended first while
                // this one held the lock broke the exclusive section.
                Ok(Signal::Retry) => {
                    Err(Error::Poisoned { cause: "another writer appended inside the exclusive section".into() })
                }
                Ok(Signal::Failed(e)) => Err(e),
                Err(_) => Err(Error::Closed),
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU32, Ordering};

    /// A backend that appends nothing real: it counts, and can be told to fail or
    /// panic when the exclusive section is entered.
    struct Fake {
        entered: AtomicU32,
        /// Held by the test to keep a leader inside `exclusive`.
        gate: Mutex<()>,
        fail_with: Option<Error>,
        panic_in_catch_up: bool,
    }

    struct FakeX(u64);

    impl Exclusive for FakeX {
        fn append_if_head(&mut self, expect_seq: u64, payloads: Vec<Vec<u8>>) -> Result<AppendOutcome, Error> {
            let first_seq = expect_seq + 1;
            self.0 = expect_seq + payloads.len() as u64;
            Ok(AppendOutcome::Appended(Appended { first_seq, last_seq: self.0, chain_head: [0; 32] }))
        }
    }

    impl Hooks<()> for Fake {
        type Error = Error;
        fn exclusive(
            &self,
            _give_up: &dyn Fn() -> bool,
            f: &mut dyn FnMut(&mut dyn Exclusive) -> Result<(), Error>,
        ) -> Result<(), Error> {
            self.entered.fetch_add(1, Ordering::SeqCst);
            drop(self.gate.lock().unwrap());
            match &self.fail_with {
                Some(e) => Err(e.clone()),
                None => f(&mut FakeX(0)),
            }
        }
        fn catch_up(&self, core: &mut Core<()>, _x: &mut dyn Exclusive) -> Result<(), Error> {
            assert!(!self.panic_in_catch_up, "a hook panicked");
            let seq = core.durable_seq();
            core.caught_up_to(seq);
            Ok(())
        }
        fn rebuild(&self, _core: &mut Core<()>) -> Result<(), String> {
            Err("not in this test".into())
        }
    }

    fn fake(fail_with: Option<Error>, panic_in_catch_up: bool) -> Fake {
        Fake { entered: AtomicU32::new(0), gate: Mutex::new(()), fail_with, panic_in_catch_up }
    }

    fn limits() -> GroupLimits {
        GroupLimits { records_max: 64, bytes_max: 1 << 20, queued_records_max: 1024 }
    }

    fn append(engine: &GroupCommit<()>, hooks: &Fake) -> Result<Settled<u64>, CommitError<Error>> {
        engine.commit(hooks, Admission::Callers, |core| {
            let seq = core.queue(b"x".to_vec());
            (seq, seq)
        })
    }

    /// Proves: when the leader cannot enter the exclusive section (a lock
    /// timeout), the callers that waited for its turn hear the same answer at once
    /// — the lock is not waited out again by each of them in turn.
    #[test]
    fn callers_waiting_on_a_leader_that_timed_out_share_its_answer() {
        let timeout = Error::LockTimeout { path: "d".into(), waited_ms: 10, holder_pid: Some(7) };
        let hooks = fake(Some(timeout), false);
        let engine = GroupCommit::new((), 0, limits());
        let gate = hooks.gate.lock().unwrap();
        let codes: Vec<&str> = std::thread::scope(|s| {
            let hs: Vec<_> = (0..8)
                .map(|_| {
                    s.spawn(|| {
                        append(&engine, &hooks).err().map(|e| match e {
                            CommitError::Storage(e) => e.code(),
                            _ => "other",
                        })
                    })
                })
                .collect();
            // Everyone is in: one leader inside `exclusive`, seven waiting for it.
            while !(hooks.entered.load(Ordering::SeqCst) == 1 && engine.lock().arrivals_waiting == 7) {
                std::thread::yield_now();
            }
            drop(gate);
            hs.into_iter().map(|h| h.join().unwrap().unwrap_or("ok")).collect()
        });
        assert_eq!(codes, vec!["LOCK_TIMEOUT"; 8]);
        assert_eq!(hooks.entered.load(Ordering::SeqCst), 1, "the lock was waited out more than once");
        assert!(engine.lock().is_settled(), "the phase is idle again");
    }

    /// Proves: a panic in the leader outside the caller's own judgement (here in
    /// the owner's catch-up hook) poisons the engine and frees the phase: the
    /// panic reaches the leader's caller, later callers hear WRITER_POISONED
    /// instead of waiting for ever.
    #[test]
    fn a_panicking_hook_poisons_the_engine_and_nobody_waits_for_ever() {
        let hooks = fake(None, true);
        let engine = GroupCommit::new((), 0, limits());
        let panicked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| append(&engine, &hooks)));
        assert!(panicked.is_err(), "the panic reaches the leader's caller");
        match append(&engine, &hooks) {
            Err(CommitError::Storage(e)) => assert_eq!(e.code(), "WRITER_POISONED", "{e}"),
            other => panic!("expected WRITER_POISONED, got {:?}", other.map(|s| s.answer)),
        }
    }

    /// Proves: with a working backend, concurrent callers each get their own
    /// sequence, and the engine ends idle with everything durable.
    #[test]
    fn concurrent_callers_get_distinct_sequences() {
        let hooks = fake(None, false);
        let engine = GroupCommit::new((), 0, limits());
        let mut seqs: Vec<u64> = std::thread::scope(|s| {
            let hs: Vec<_> = (0..8)
                .map(|_| s.spawn(|| (0..50).map(|_| append(&engine, &hooks).unwrap().answer).collect::<Vec<_>>()))
                .collect();
            hs.into_iter().flat_map(|h| h.join().unwrap()).collect()
        });
        seqs.sort();
        assert_eq!(seqs, (1..=400).collect::<Vec<_>>());
        assert!(engine.lock().is_settled());
    }

    fn task_waiters(n: usize) -> (Vec<(Slot, Signal)>, Vec<tokio::sync::oneshot::Receiver<Signal>>) {
        (0..n)
            .map(|_| {
                let (tx, rx) = tokio::sync::oneshot::channel();
                ((Slot::Task(tx), Signal::Durable(None)), rx)
            })
            .unzip()
    }

    /// Proves: a large group's async waiters handed to a worker of a live runtime
    /// each hear `Durable`; handed to a runtime already shut down (the task that
    /// carries them is dropped unrun), they still hear `Durable`, never "closed".
    #[test]
    fn handed_off_wakes_are_given_even_if_the_runtime_never_runs_them() {
        let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(1).build().unwrap();
        let (woken, rxs) = task_waiters(TASK_WAKES_HANDED_OFF_MIN * 2);
        rt.block_on(async { tokio::task::spawn_blocking(move || wake(woken)).await.unwrap() });
        for rx in rxs {
            assert!(matches!(rx.blocking_recv(), Ok(Signal::Durable(None))));
        }
        let handle = rt.handle().clone();
        rt.shutdown_background();
        let _inside = handle.enter();
        let (woken, rxs) = task_waiters(TASK_WAKES_HANDED_OFF_MIN * 2);
        wake(woken);
        for rx in rxs {
            assert!(matches!(rx.blocking_recv(), Ok(Signal::Durable(None))), "a durable waiter heard otherwise");
        }
    }

    /// Proves: a waiter registered for an earlier sequence than the last one
    /// registered (an owner's answer resting on less than everything queued) is
    /// still woken exactly when its own sequence is durable — not before, and not
    /// only with the later ones.
    #[test]
    fn waiters_are_woken_by_their_own_sequence_whatever_order_they_came_in() {
        let engine = GroupCommit::new((), 0, limits());
        let mut core = engine.lock();
        let mut rxs = Vec::new();
        for covers in [5u64, 3, 7, 5] {
            let (tx, rx) = tokio::sync::oneshot::channel();
            core.wait_for(covers, Slot::Task(tx));
            rxs.push((covers, rx));
        }
        for durable in [2u64, 3, 4, 5, 7] {
            core.durable_seq = durable;
            let woken = core.durable_waiters(1, &[]);
            let expected = rxs.iter().filter(|(c, _)| *c <= durable).count();
            assert_eq!(woken.len(), expected, "durable up to {durable}");
            woken.into_iter().for_each(|(slot, signal)| slot.give(signal));
            rxs.retain_mut(|(covers, rx)| {
                let got = rx.try_recv();
                assert_eq!(got.is_ok(), *covers <= durable, "waiter for {covers} at durable {durable}");
                got.is_err()
            });
        }
        assert!(rxs.is_empty());
    }

    /// Proves: async callers that find the engine held for long (a leader catching
    /// up, replaying) do not hold up the runtime's other tasks: with one worker and
    /// four callers waiting, a task spawned afterwards still runs while the engine
    /// is held. (With a plain blocking lock it runs only once the engine is let go.)
    #[test]
    fn async_callers_waiting_for_a_long_held_engine_leave_the_runtime_free() {
        let engine = Arc::new(GroupCommit::new((), 0, limits()));
        let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(1).build().unwrap();
        let held = engine.lock();
        let waiters: Vec<_> = (0..4)
            .map(|_| {
                let engine = Arc::clone(&engine);
                rt.spawn(async move {
                    let mut act = |_: &mut Core<()>| ((), 0u64);
                    if let AsyncCommit::<(), Error>::Lead = engine.commit_async(Admission::Callers, &mut act).await {
                        engine.async_lead_withdrawn();
                    }
                })
            })
            .collect();
        std::thread::sleep(Duration::from_millis(50));
        let ran = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let r = Arc::clone(&ran);
        rt.spawn(async move { r.store(true, Ordering::SeqCst) });
        let deadline = Instant::now() + Duration::from_secs(5);
        while !ran.load(Ordering::SeqCst) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(1));
        }
        assert!(ran.load(Ordering::SeqCst), "the runtime's only worker was blocked on the engine");
        drop(held);
        for w in waiters {
            rt.block_on(w).unwrap();
        }
    }
}
