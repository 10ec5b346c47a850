//! Async callers (the daemon's requests): judged or queued in the open group on
//! the caller's own task, which then waits for its records without holding a
//! thread; when no group is open, made leader on a thread that may block.

use std::ops::ControlFlow;
use std::sync::{Arc, MutexGuard};
use std::time::Instant;

use super::slots::{Signal, Slot};
use super::{Act, Admission, CommitError, Core, GroupCommit, HEAD_MOVED_RETRIES_MAX, LOG_TARGET, Phase, Settled};
use crate::storage::error::Error;

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

/// Why an async caller's lead gave no answer ([`lead_on_blocking_pool`]).
pub enum LeadFailed {
    /// The lead panicked (the engine poisoned itself when it caught it).
    Panicked(Box<dyn std::any::Any + Send>),
    /// The thread to lead on never ran (a runtime shutting down).
    NotRun,
}

/// Where an async caller made leader leads ([`lead_on_blocking_pool`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LeadOn {
    /// The runtime's blocking pool: the caller's worker stays free for the other
    /// tasks (the daemon's requests: with the leader in place, a worker blocked in
    /// `fdatasync` cost 64 clients a fifth of their rate, `docs/BENCHMARKS.md`).
    Pool,
    /// On a worker of a multi-thread runtime, the caller's own thread, the runtime
    /// told that it blocks (`block_in_place`): no hand-off to the pool and back
    /// (raw async appends: one appender 4.9k → 6.6k appends/s). Elsewhere the pool.
    InPlace,
}

/// Lead for an async caller that was made leader ([`AsyncTurn::Lead`],
/// [`AsyncCommit::Lead`]): run `lead` with the engine's owner on a thread that may
/// block ([`LeadOn`]). The request to lead is withdrawn however that ends — also
/// if the thread never runs (a runtime shutting down drops it; with no runtime the
/// spawn panics) — so other async callers never wait for a leader that does not
/// come.
#[cfg_attr(not(feature = "daemon"), allow(unused_variables))] // `on`: no multi-thread runtime without it
pub async fn lead_on_blocking_pool<O, S, R>(
    owner: Arc<O>,
    engine: fn(&O) -> &GroupCommit<S>,
    on: LeadOn,
    lead: impl FnOnce(&O) -> R + Send + 'static,
) -> Result<R, LeadFailed>
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
    #[cfg(feature = "daemon")]
    if on == LeadOn::InPlace
        && tokio::runtime::Handle::try_current()
            .is_ok_and(|h| h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread)
    {
        let owner = pending.0.take().expect("taken once");
        let led =
            tokio::task::block_in_place(|| std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| lead(&owner))));
        return led.map_err(LeadFailed::Panicked);
    }
    let led = tokio::task::spawn_blocking(move || {
        let owner = pending.0.take().expect("taken once");
        lead(&owner)
    })
    .await;
    led.map_err(|e| if e.is_panic() { LeadFailed::Panicked(e.into_panic()) } else { LeadFailed::NotRun })
}

/// Lead for an async caller that was made leader ([`AsyncCommit::Lead`]) on the
/// caller's own thread — a runtime worker, the runtime not told: no hand-off to
/// another thread and back (one client: heartbeat p50 over a raw `fdatasync`
/// 299–323 → 161–204 µs, run medians in `docs/BENCHMARKS.md`). A worker held so
/// holds up the tasks queued behind it, so this is only for a caller that is
/// alone (`AsyncCommit::Lead`'s `alone`, and its owner's own count of callers in
/// flight), and the lead is kept short: it waits for nobody — not for the
/// engine's mutex held long (it tries for `INLINE_CORE_SPIN_US`), another
/// leader's turn or a reader, nor for the exclusive section taken by another
/// process (it gives up after the lock's short spin) — it declines a long
/// catch-up ([`Hooks::inline_catch_up_is_long`]; the file backend reads nothing
/// others appended on it), and it ends its turn after its own group (and the one
/// queued while that was synced). When it declines, the answer is
/// [`CommitError::WouldBlock`] with nothing of the caller's written or answered
/// (and nothing judged, unless an earlier try of the same lead was judged and
/// sent back by another writer's append — judged again then, as any caller's):
/// the caller leads again on a thread that may block ([`lead_on_blocking_pool`]).
/// A blocking commit made inside it (a transaction's build that commits to
/// another engine) is not inline. Panics are caught and given back, as there.
///
/// [`Hooks::inline_catch_up_is_long`]: super::Hooks::inline_catch_up_is_long
///
/// Only on a multi-thread runtime with other workers ([`may_lead_inline`]):
/// elsewhere the caller's thread is the only worker, and everything else would
/// wait.
pub fn lead_inline<R>(lead: impl FnOnce() -> R) -> Result<R, LeadFailed> {
    let _inline = LeadingInline::begin();
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(lead)).map_err(LeadFailed::Panicked)
}

/// Whether an async caller may lead on its own thread ([`lead_inline`]): only
/// on a worker of a multi-thread runtime with other workers, which take the
/// tasks queued meanwhile. On a current-thread runtime (an embedder's
/// `#[tokio::main(flavor = "current_thread")]`), or a multi-thread one with one
/// worker, its thread is the only one: every other task — timers, connections —
/// would wait for the lead's sync.
pub fn may_lead_inline() -> bool {
    tokio::runtime::Handle::try_current().is_ok_and(|h| {
        h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread && h.metrics().num_workers() > 1
    })
}

thread_local! {
    static LEADING_INLINE: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// This thread leads for an async caller on its own thread ([`lead_inline`])
/// until dropped.
struct LeadingInline(bool);

impl LeadingInline {
    fn begin() -> LeadingInline {
        LeadingInline(LEADING_INLINE.with(|f| f.replace(true)))
    }
}

impl Drop for LeadingInline {
    fn drop(&mut self) {
        LEADING_INLINE.with(|f| f.set(self.0));
    }
}

/// A commit for a caller that blocks (`GroupCommit::commit`) is never an inline
/// lead, even on a thread that leads one (a transaction's `build` that commits to
/// another engine): the flag is lifted until dropped, then put back.
pub(super) struct NotInline(bool);

impl NotInline {
    pub(super) fn begin() -> NotInline {
        NotInline(LEADING_INLINE.with(|f| f.replace(false)))
    }
}

impl Drop for NotInline {
    fn drop(&mut self) {
        LEADING_INLINE.with(|f| f.set(self.0));
    }
}

/// Whether this thread leads for an async caller on its own thread
/// ([`lead_inline`]): it may be a runtime worker, whose own queue holds what it
/// spawns until the lead ends, so nothing long may run on it (an owner defers
/// such work to a lead on another thread).
pub fn leading_inline() -> bool {
    LEADING_INLINE.with(std::cell::Cell::get)
}

/// What an async judged commit found ([`GroupCommit::commit_async`]).
pub enum AsyncCommit<T, E> {
    /// Judged in an open group (or refused before): the answer, settled.
    Done(Result<Settled<T>, CommitError<E>>),
    /// No group was open: the caller must commit on a thread that may block, with
    /// [`GroupCommit::commit_async_lead`] (or try first on its own thread, with
    /// [`lead_inline`]) — or call [`GroupCommit::async_lead_withdrawn`] if that
    /// thread will never run.
    Lead {
        /// Whether the engine saw no company: the last group carried one record
        /// and nobody waits for room. A hint for where to lead ([`lead_inline`]),
        /// never a promise: others may arrive meanwhile (they queue into the group).
        alone: bool,
    },
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

impl<S> Core<S> {
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
}

impl<S> GroupCommit<S> {
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
                if let Some(refused) = core.refusal(admission, arrived) {
                    return AsyncCommit::Done(Err(refused));
                }
                let blocked = core.readers_waiting > 0;
                match core.phase {
                    Phase::Idle if !blocked && !core.async_lead_pending => {
                        core.async_lead_pending = true;
                        let alone = core.last_group_records <= 1 && core.room_waiting == 0;
                        return AsyncCommit::Lead { alone };
                    }
                    Phase::Open if !blocked && core.queued.len() < self.limits.queued_records_max => {
                        match self.judge_async(core, act) {
                            ControlFlow::Break(done) => return done,
                            ControlFlow::Continue(waiting) => Some(waiting),
                        }
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
                    tracing::debug!(target: LOG_TARGET, "judging again: another writer appended first");
                }
                Ok(Signal::Failed(e)) => return failed(e),
                Err(_) => return AsyncCommit::Done(Err(CommitError::Storage(Error::Closed))),
            }
        }
    }

    /// Judge `act` in the open group for an async caller: its answer at once when
    /// that rests on durable records only (or the engine is poisoned), else the
    /// channel on which it hears of the records it rests on, with the answer. A
    /// panic in `act` is re-raised once the core mutex is let go.
    fn judge_async<T, E>(
        &self,
        mut core: MutexGuard<'_, Core<S>>,
        act: &mut Act<'_, S, T>,
    ) -> ControlFlow<AsyncCommit<T, E>, (tokio::sync::oneshot::Receiver<Signal>, T)> {
        let (answer, covers) = match self.guarded(&mut core, act) {
            Ok(done) => done,
            Err(panic) => {
                drop(core);
                std::panic::resume_unwind(panic);
            }
        };
        if core.durable_seq >= covers {
            return ControlFlow::Break(AsyncCommit::Done(Ok(Settled { answer, link: None })));
        }
        if let Err(e) = core.poison_check() {
            return ControlFlow::Break(AsyncCommit::Done(Err(CommitError::Storage(e))));
        }
        let (tx, rx) = tokio::sync::oneshot::channel();
        core.wait_for(covers, Slot::Task(tx));
        ControlFlow::Continue((rx, answer))
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
