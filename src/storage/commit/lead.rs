//! A thread's commit: judged in the open group, or — when none is open — as the
//! leader, who enters the exclusive section, catches up, opens the group, judges
//! its own records in it and flushes the groups (`flush.rs`).

use std::sync::{Arc, MutexGuard};
use std::time::Instant;

use super::async_path::leading_inline;
use super::slots::{Signal, Slot, ThreadSlot};
use super::{
    Act, Admission, CommitError, Core, GroupCommit, HEAD_MOVED_RETRIES_MAX, Hooks, LOG_TARGET, Phase, Settled,
};
use crate::storage::backend::Exclusive;
use crate::storage::error::Error;

/// What a leader's turn in the exclusive section leaves for its caller's answer
/// ([`GroupCommit::lead_started`]).
struct LeaderTurn<T, E> {
    /// The leader's own answer, with the slot it waits on when it rests on records
    /// not yet durable.
    own: Option<(T, Option<Arc<ThreadSlot>>)>,
    /// A panic in the leader's own `act`, re-raised once the turn is over.
    panicked: Option<Box<dyn std::any::Any + Send>>,
    /// The group opened (the exclusive section entered and the state caught up).
    opened: bool,
    /// Until `flush_groups` ends it, the phase is this leader's.
    phase_ours: bool,
    /// Why the turn gave no answer, when it did not.
    failed: Option<CommitError<E>>,
}

impl<S> GroupCommit<S> {
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
        let _blocking = super::async_path::NotInline::begin();
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
            tracing::debug!(target: LOG_TARGET, "judging again: another writer appended first");
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
        // A lead on an async caller's own thread waits for nobody: not for the
        // engine held long (a leader catching up holds it), nor for another
        // leader's phase or a reader. It declines instead, with nothing judged.
        let inline = leading_inline();
        let mut core = if inline {
            match self.lock_briefly() {
                Some(core) => core,
                None => {
                    self.declined_unlocked.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    return Some(Err(CommitError::WouldBlock));
                }
            }
        } else {
            self.lock()
        };
        if async_lead && std::mem::take(&mut core.async_lead_pending) && core.phase != Phase::Idle {
            // A group is open or opening: the async callers waiting for this
            // thread may queue into it themselves. (If idle, this thread takes the
            // phase now, and they are woken when its group opens.)
            self.changed_async.notify_waiters();
        }
        loop {
            if let Some(refused) = core.refusal(admission, arrived) {
                return Some(Err(refused));
            }
            let blocked = core.readers_waiting > 0;
            if inline && (blocked || core.phase != Phase::Idle) {
                if async_lead && core.phase == Phase::Idle {
                    // The async callers that wait for this lead's group wait for
                    // the lead that follows (on the blocking pool) instead.
                    core.async_lead_pending = true;
                }
                core.inline_leads.declined += 1;
                return Some(Err(CommitError::WouldBlock));
            }
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
        let mut ours = LeaderTurn { own: None, panicked: None, opened: false, phase_ours: true, failed: None };
        // A panic anywhere in the leader's turn (a hook, the backend) must not
        // leave the phase taken and the waiters asleep for ever.
        // A drain that begins while this leader waits for the exclusive section
        // (another process's turn of the lock) withdraws it: nothing of its turn
        // has been judged, so nothing is, and the wait ends at once — a cutover's
        // grace bounds every admitted request, not only those already judged.
        // A lead on an async caller's own thread does not wait at all: it gives
        // the turn back (`WouldBlock`), and the caller leads again elsewhere.
        let inline = leading_inline();
        let drained = || admission == Admission::Callers && self.lock().draining;
        let give_up = || inline || drained();
        let turn = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            hooks.exclusive(&give_up, &mut |x| self.lead_in_section(hooks, admission, act, x, &mut ours))
        }));
        let entered = match turn {
            Ok(entered) => entered,
            Err(panic) => self.leader_panicked(ours.phase_ours, panic),
        };
        let entered = match entered {
            Err(Error::Withdrawn { .. }) if inline && !drained() => {
                ours.failed = Some(CommitError::WouldBlock);
                Ok(())
            }
            entered => entered,
        };
        let error = self.turn_error(entered, ours.failed, ours.opened);
        if !ours.opened {
            // The exclusive section was not entered or the catch-up failed: the
            // phase is still this caller's `Starting`. (Once open, `flush_groups`
            // alone ends the phase: by now another caller may have started the next.)
            let mut core = self.lock();
            core.phase = Phase::Idle;
            self.wake_phase();
        }
        // Off the exclusive section.
        let mut core = self.lock();
        if inline {
            let declined = matches!(error, Some(CommitError::WouldBlock));
            core.inline_leads.declined += u64::from(declined);
            core.inline_leads.led += u64::from(ours.opened);
        }
        hooks.after_lead(&mut core);
        drop(core);
        if let Some(panic) = ours.panicked {
            // `flush_groups` found the engine poisoned and ended the phase; now let
            // the caller's panic go on.
            std::panic::resume_unwind(panic);
        }
        leader_answer(ours.own, error)
    }

    /// The leader's turn in the exclusive section: open the group (unless a drain
    /// began meanwhile, or the catch-up fails), judge this caller's own `act` in
    /// it, and flush the groups. What the turn leaves is in `ours`.
    fn lead_in_section<H: Hooks<S>, T>(
        &self,
        hooks: &H,
        admission: Admission,
        act: &mut Act<'_, S, T>,
        x: &mut dyn Exclusive,
        ours: &mut LeaderTurn<T, H::Error>,
    ) -> Result<(), Error> {
        let mut core = self.lock();
        if core.draining && admission == Admission::Callers {
            // Entered after the drain began: judge nothing.
            ours.failed = Some(CommitError::Draining);
            return Ok(());
        }
        if leading_inline() && hooks.inline_catch_up_is_long(&core, &*x) {
            ours.failed = Some(CommitError::WouldBlock);
            return Ok(());
        }
        if let Err(e) = hooks.catch_up(&mut core, x) {
            ours.failed = Some(CommitError::Hook(e));
            return Ok(());
        }
        core.phase = Phase::Open;
        core.lead_failed = None;
        ours.opened = true;
        self.wake_phase();
        match self.guarded(&mut core, act) {
            Err(panic) => ours.panicked = Some(panic),
            Ok((answer, covers)) => {
                // Like every other caller's, the leader's answer waits on its
                // own slot: the group that makes it durable settles it — not
                // a later group that fails, or that another writer overtakes.
                let slot = (covers > core.durable_seq).then(|| {
                    let slot = Arc::new(ThreadSlot::default());
                    core.wait_for(covers, Slot::Thread(slot.clone()));
                    slot
                });
                ours.own = Some((answer, slot));
            }
        }
        ours.phase_ours = false;
        if let Err(e) = self.flush_groups(hooks, x, core) {
            ours.failed = Some(CommitError::Storage(e));
        }
        Ok(())
    }

    /// The leader's turn panicked outside its caller's own judgement (a hook, the
    /// backend): poison the engine, free the phase if it is still this leader's,
    /// and let the panic go on.
    fn leader_panicked(&self, phase_ours: bool, panic: Box<dyn std::any::Any + Send>) -> ! {
        let mut core = self.lock();
        tracing::error!(target: LOG_TARGET, "the leader of a commit group panicked; the log is poisoned");
        core.poison("the leader of a commit group panicked".into());
        if phase_ours {
            core.phase = Phase::Idle;
        }
        self.wake_phase();
        drop(core);
        std::panic::resume_unwind(panic);
    }

    /// Why the leader's turn gave no answer, if it did not: the exclusive section
    /// not entered (`entered`: a drain withdrew it, or the lock could not be had),
    /// or what `failed` within it.
    fn turn_error<E>(
        &self,
        entered: Result<(), Error>,
        failed: Option<CommitError<E>>,
        opened: bool,
    ) -> Option<CommitError<E>> {
        match (entered, failed) {
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
        }
    }

    /// Run `act`, catching a panic (from an owner's judgement, or a bug): the engine
    /// cannot know how far it got, so it is poisoned, and every waiter is woken to
    /// an error instead of waiting for ever. The caller re-raises the panic once it
    /// holds no lock.
    pub(super) fn guarded<T>(
        &self,
        core: &mut Core<S>,
        act: &mut Act<'_, S, T>,
    ) -> Result<(T, u64), Box<dyn std::any::Any + Send>> {
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| act(&mut *core))).inspect_err(|_| {
            tracing::error!(
                target: LOG_TARGET,
                "a commit panicked while its records were built or judged; the log is poisoned"
            );
            core.poison("a commit panicked while its records were built or judged".into());
            self.wake_phase();
        })
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
}

/// The leader's own answer once its turn is over: what its slot heard (the group
/// that made its records durable settles it, as any caller's), or why the turn
/// gave none. `None` when its `act` must be judged again.
fn leader_answer<T, E>(
    own: Option<(T, Option<Arc<ThreadSlot>>)>,
    error: Option<CommitError<E>>,
) -> Option<Result<Settled<T>, CommitError<E>>> {
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
                None => {
                    Some(Err(error
                        .unwrap_or_else(|| poisoned("the group ended without settling the leader's records".into()))))
                }
            }
        }
    }
}
