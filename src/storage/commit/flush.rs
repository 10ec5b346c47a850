//! The leader's flush: the queued records go to the backend one group at a time
//! — one append and one sync each — with the core mutex let go during each; what
//! became of a group (durable, overtaken by another writer, failed) settles its
//! waiters.

use std::sync::MutexGuard;

use super::async_path::leading_inline;
use super::slots::{Signal, wake};
use super::{Core, EXTRA_TURNS_MAX, GROUPS_PER_LOCK_MAX, GroupCommit, GroupLimits, Hooks, LOG_TARGET, Phase};
use crate::storage::backend::{AppendOutcome, Appended, Exclusive};
use crate::storage::error::Error;

impl<S> GroupCommit<S> {
    /// Hand queued records to the backend, one append and sync per group, until
    /// none are left. The caller is in the exclusive section throughout; the core
    /// mutex is released during each write and sync so that others can queue the
    /// next group.
    ///
    /// After `GROUPS_PER_LOCK_MAX` groups the leader keeps the section for as many
    /// more only if no other writer says it waits (`Exclusive::others_waiting`), at
    /// most `EXTRA_TURNS_MAX` times; else it syncs what is queued and lets go.
    pub(super) fn flush_groups<'a, H: Hooks<S>>(
        &'a self,
        hooks: &H,
        x: &mut dyn Exclusive,
        mut core: MutexGuard<'a, Core<S>>,
    ) -> Result<(), Error> {
        let mut extra_turns_left = EXTRA_TURNS_MAX;
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
            let group = self.next_group(&mut core);
            let n = group.len();
            core.last_group_records = n;
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
                Ok(AppendOutcome::HeadMoved { actual }) => self.overtaken(hooks, &mut core, expect, actual)?,
                Ok(AppendOutcome::Appended(a)) if a.first_seq == expect + 1 && a.last_seq == expect + n as u64 => {
                    core = self.group_durable(hooks, &*x, core, &a);
                    groups += 1;
                    if leading_inline() && core.phase == Phase::Open {
                        // A lead on an async caller's own thread (a runtime worker)
                        // ends after its group: what was queued meanwhile is synced,
                        // the next arrivals lead their own turn.
                        core.phase = Phase::Closing;
                    }
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
                result => return Err(self.group_failed(hooks, &mut core, expect, result)),
            }
        }
    }

    /// The next group: the queued records from the front, as many as one append
    /// takes (at least one, however large).
    fn next_group(&self, core: &mut Core<S>) -> Vec<Vec<u8>> {
        let GroupLimits { records_max, bytes_max, .. } = self.limits;
        let (mut n, mut bytes) = (0, 0);
        for r in &core.queued {
            if n > 0 && (n == records_max || bytes + r.len() > bytes_max) {
                break;
            }
            (n, bytes) = (n + 1, bytes + r.len());
        }
        core.queued.drain(..n).collect()
    }

    /// Another writer appended first: everything queued was judged on
    /// state the log does not have. Rebuild the durable state (with
    /// the other writer's records) and send every waiter of this
    /// epoch back to judge again.
    fn overtaken<H: Hooks<S>>(&self, hooks: &H, core: &mut Core<S>, expect: u64, actual: u64) -> Result<(), Error> {
        tracing::info!(target: LOG_TARGET, expected = expect, actual, "another writer appended first; judging again");
        core.queued.clear();
        core.last_seq = core.durable_seq;
        core.epoch += 1;
        core.head_moved += 1;
        core.wake_all(Signal::Retry);
        if let Err(why) = hooks.rebuild(core) {
            let cause = format!("catching up after another writer appended: {why}");
            core.poison(cause.clone());
            core.phase = Phase::Idle;
            self.wake_phase();
            return Err(Error::Poisoned { cause });
        }
        self.wake_phase();
        Ok(())
    }

    /// A group is durable: the durable sequence moves on, the owner hears it, and
    /// the waiters whose records it made durable are woken (off the core mutex).
    /// Returns the core mutex, held again.
    fn group_durable<'a, H: Hooks<S>>(
        &'a self,
        hooks: &H,
        x: &dyn Exclusive,
        mut core: MutexGuard<'a, Core<S>>,
        a: &Appended,
    ) -> MutexGuard<'a, Core<S>> {
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
        hooks.on_durable(&mut core, a);
        let woken = core.durable_waiters(a.first_seq, x.links());
        if !woken.is_empty() {
            drop(core);
            wake(woken);
            core = self.lock();
        }
        core
    }

    /// A group did not become durable: its append failed, or its records landed
    /// elsewhere than right after `expect`. Ends the phase, and returns what the
    /// leader reports.
    fn group_failed<H: Hooks<S>>(
        &self,
        hooks: &H,
        core: &mut Core<S>,
        expect: u64,
        result: Result<AppendOutcome, Error>,
    ) -> Error {
        let (cause, error) = match result {
            Ok(AppendOutcome::Appended(a)) => {
                let cause = format!("records landed at {}..={}, not after {expect}", a.first_seq, a.last_seq);
                (cause.clone(), Error::Poisoned { cause })
            }
            // Handled by `flush_groups`, which calls this for the rest.
            Ok(AppendOutcome::HeadMoved { .. }) => unreachable!("handled above"),
            Err(e) => (e.to_string(), e),
        };
        if error.is_transient() && hooks.unavailable(core) {
            // Outcome unknown, state put right from the log before the next
            // turn: every waiter of the group (and what was queued after
            // it) hears the error; nothing is poisoned.
            tracing::warn!(target: LOG_TARGET, %cause, "a commit group's outcome is unknown: the log is unreachable");
            core.fail_all(error.clone());
            core.epoch += 1;
            core.phase = Phase::Idle;
            self.wake_phase();
            return error;
        }
        tracing::error!(target: LOG_TARGET, %cause, "a commit group did not become durable; the log is poisoned");
        core.poison_after(&error);
        core.phase = Phase::Idle;
        self.wake_phase();
        // The leader reports what failed (an I/O error, say); the others
        // waiting on the group, and every later call, hear WRITER_POISONED.
        error
    }
}
