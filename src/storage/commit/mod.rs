//! The group commit: the one commit engine of fencelog (as raft-engine's
//! `write_barrier.rs`). Threads (and async tasks) of one process that append at
//! once share syncs; this module says who leads, who queues, who waits for what, and
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
//!
//! **Files**, by phase: `state.rs` (the state under the engine's mutex, and
//! poisoning), `slots.rs` (where each waiter is woken, and the waiting list),
//! `lead.rs` (a thread's commit, and the leader's turn), `flush.rs` (the leader
//! writes and syncs the groups), `async_path.rs` (async callers), `drain.rs`
//! (readers waiting for a settled view, and the drain).

use std::collections::VecDeque;
use std::sync::{Condvar, Mutex, MutexGuard};

use super::backend::{Appended, Exclusive};
use super::error::Error;
use super::options::LogOptions;
use crate::format::ChainLink;

mod async_path;
mod drain;
mod flush;
mod lead;
mod slots;
mod state;
#[cfg(test)]
mod tests;

pub use async_path::{
    AsyncCommit, AsyncTurn, LeadFailed, LeadOn, lead_inline, lead_on_blocking_pool, leading_inline, may_lead_inline,
};
pub use state::{Core, InlineLeads};

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

/// Longest a lead on an async caller's own thread (`lead_inline`) tries for the
/// engine's mutex before it declines: others hold it for microseconds (a judged
/// transaction, a group's bookkeeping), a leader catching up for longer.
const INLINE_CORE_SPIN_US: u64 = 100;

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
    /// A lead on an async caller's own thread ([`lead_inline`]) would have had
    /// to wait (for the engine, another leader's turn, a reader, the exclusive
    /// section) or to catch up on what others appended: nothing of the caller's
    /// was written or answered; the caller leads again on a thread that may
    /// block. No other lead gives it.
    WouldBlock,
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
    /// In the exclusive section, before `catch_up`, on a lead on an async caller's
    /// own thread ([`lead_inline`]): whether catching up would take long (a
    /// rebuild, or many records another writer appended), in which case that lead
    /// declines ([`CommitError::WouldBlock`]) and one on a thread that may block
    /// catches up instead.
    fn inline_catch_up_is_long(&self, _core: &Core<S>, _x: &dyn Exclusive) -> bool {
        false
    }
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

/// What [`GroupCommit::drain`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DrainOutcome {
    pub settled: bool,
    pub last_seq: u64,
}

/// The target of the engine's log events, in every file of it: this module's
/// path, as when it was one file, so that no log line changes (`target` in JSON
/// logs, `RUST_LOG` directives).
const LOG_TARGET: &str = module_path!();

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
    /// Inline leads declined before they had the mutex (held past
    /// `INLINE_CORE_SPIN_US`): counted outside it, since counting under it
    /// would mean waiting for it.
    declined_unlocked: std::sync::atomic::AtomicU64,
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
                last_group_records: 0,
                inline_leads: InlineLeads::default(),
                lead_failed: None,
                poisoned: None,
                waiters: VecDeque::new(),
            }),
            arrivals: Condvar::new(),
            changed: Condvar::new(),
            changed_async: tokio::sync::Notify::new(),
            declined_unlocked: std::sync::atomic::AtomicU64::new(0),
            limits,
        }
    }

    /// How often an async caller led on its own thread, and how often such a lead
    /// declined ([`lead_inline`]), those declined before they had the mutex
    /// included.
    pub fn inline_leads(&self) -> InlineLeads {
        let counted = self.lock().inline_leads;
        let unlocked = self.declined_unlocked.load(std::sync::atomic::Ordering::Relaxed);
        InlineLeads { declined: counted.declined + unlocked, ..counted }
    }

    /// The state as it is (records may be in flight).
    pub fn lock(&self) -> MutexGuard<'_, Core<S>> {
        self.recover(self.core.lock())
    }

    /// The guard if it can be had within [`INLINE_CORE_SPIN_US`] of trying
    /// (others hold it for microseconds; a leader catching up, for longer).
    fn lock_briefly(&self) -> Option<MutexGuard<'_, Core<S>>> {
        let start = std::time::Instant::now();
        loop {
            match self.core.try_lock() {
                Ok(core) => return Some(core),
                Err(std::sync::TryLockError::Poisoned(p)) => return Some(self.recover(Err(p))),
                Err(std::sync::TryLockError::WouldBlock)
                    if start.elapsed() < std::time::Duration::from_micros(INLINE_CORE_SPIN_US) =>
                {
                    std::hint::spin_loop()
                }
                Err(std::sync::TryLockError::WouldBlock) => return None,
            }
        }
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
}
