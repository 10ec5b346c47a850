//! The group commit: threads of one process share syncs. This is the ledger's
//! write barrier (as raft-engine's `write_barrier.rs`): who leads, who queues,
//! who waits for what, and who is woken when.
//!
//! **Lock order.** (1) the backend's exclusive section (the cross-process append
//! lock of the file backend) → (2) the ledger's `inner` mutex → (3) a waiter's own
//! slot. A thread holding (2) never waits for (1) (the leader takes (1) before
//! (2)). (2) is never held across a write or sync of the log: the leader lets go
//! of it for each group, so other threads can judge and queue the next one. It is
//! held across *reads* of the log — catching up, and the replay that rebuilds the
//! state after another writer appended first (rare with the file backend) — which
//! is what keeps every judgement on exactly the state it follows.
//!
//! **Wake-ups.** A thread whose answer rests on records not yet durable waits on
//! its own slot; after each sync the leader wakes exactly the waiters whose
//! records that sync made durable (not every thread on every change: a design
//! note measured a third of the throughput for that). The shared condition
//! variable is only for phase changes (arrivals waiting to join or lead a group)
//! and for readers waiting for a view with nothing in flight.

use std::collections::BTreeMap;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};

use super::{Drained, HEAD_MOVED_RETRIES_MAX, Inner, Ledger, LedgerError, replay};
use crate::storage::{self, AppendOutcome, Exclusive};

/// Where the ledger's group commit stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Phase {
    /// No thread of this ledger holds the append lock.
    Idle,
    /// A thread is taking the append lock and catching up; arrivals wait.
    Starting,
    /// The flusher holds the append lock and the projection is caught up: arrivals
    /// check their transactions against it and queue them for its next sync.
    Open,
    /// The flusher has held the append lock for `GROUPS_PER_LOCK_MAX` groups: it
    /// syncs what is queued and releases the lock, so other processes get their
    /// turn; arrivals wait and then compete for the lock anew.
    Closing,
}

/// Commit groups one flusher writes before it lets go of the append lock.
pub const GROUPS_PER_LOCK_MAX: u32 = 8;

/// A waiting thread's own slot: the leader puts one signal in it and wakes that
/// thread alone.
#[derive(Default)]
pub(super) struct Slot {
    signal: Mutex<Option<Signal>>,
    cv: Condvar,
}

#[derive(Debug, Clone)]
enum Signal {
    /// Everything the answer rests on is durable.
    Durable,
    /// Another writer appended first: judge again.
    Retry,
    /// The group failed; the ledger is poisoned.
    Failed(String),
}

impl Slot {
    fn give(&self, s: Signal) {
        *self.signal.lock().expect("slot") = Some(s);
        self.cv.notify_one();
    }

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

/// Who may commit while the ledger drains.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Admission {
    /// Callers' transactions: refused once draining began.
    Callers,
    /// The ledger's own records (checkpoints, coalesced audit counts on close):
    /// admitted while draining, so a drained ledger can still close cleanly.
    Internal,
}

/// Waiters by the last sequence their answer rests on.
pub(super) type Waiters = BTreeMap<u64, Vec<Arc<Slot>>>;

/// Wake the waiters whose records are now durable (and only them).
fn wake_durable(inner: &mut Inner) {
    let later = inner.waiters.split_off(&(inner.durable_seq + 1));
    for slot in std::mem::replace(&mut inner.waiters, later).into_values().flatten() {
        slot.give(Signal::Durable);
    }
}

/// Give every waiter the same signal (another writer appended first, or the
/// ledger is poisoned).
fn wake_all(inner: &mut Inner, signal: Signal) {
    for slot in std::mem::take(&mut inner.waiters).into_values().flatten() {
        slot.give(signal.clone());
    }
}

/// Poison the ledger: the projection may hold transactions the log lacks; every
/// waiter hears it now, every later call until reopen.
fn poison(inner: &mut Inner, cause: String) {
    inner.poisoned.get_or_insert(cause);
    inner.queued.clear();
    let cause = inner.poisoned.clone().expect("just set");
    wake_all(inner, Signal::Failed(cause));
}

impl Ledger {
    /// Stop taking transactions (they are refused with `DRAINING`, never judged,
    /// never appended) and wait, at most `wait_ms_max`, until every transaction
    /// already judged is durable or failed: afterwards the answer to each is known.
    /// Returns whether the ledger settled in time, and the last durable sequence.
    pub fn drain(&self, wait_ms_max: u64) -> Result<Drained, LedgerError> {
        let deadline = std::time::Instant::now() + std::time::Duration::from_millis(wait_ms_max);
        let mut inner = self.inner.lock().expect("ledger");
        inner.draining = true;
        self.changed.notify_all();
        loop {
            let settled = inner.phase == Phase::Idle && inner.durable_seq == inner.projection.last_seq;
            if settled || inner.poisoned.is_some() {
                Self::poison_check(&inner)?;
                return Ok(Drained { settled: true, last_seq: inner.durable_seq });
            }
            let now = std::time::Instant::now();
            if now >= deadline {
                return Ok(Drained { settled: false, last_seq: inner.durable_seq });
            }
            inner = self.changed.wait_timeout(inner, deadline - now).expect("ledger").0;
        }
    }

    /// The ledger with no transaction between check and sync: waits while any is in
    /// flight (meanwhile new arrivals do not join the open group, so this is bounded
    /// by the groups already formed).
    pub(super) fn settled(&self) -> Result<MutexGuard<'_, Inner>, LedgerError> {
        let mut inner = self.inner.lock().expect("ledger");
        inner.readers_waiting += 1;
        while inner.durable_seq < inner.projection.last_seq && inner.poisoned.is_none() {
            inner = self.changed.wait(inner).expect("ledger");
        }
        inner.readers_waiting -= 1;
        self.changed.notify_all();
        Self::poison_check(&inner)?;
        Ok(inner)
    }

    pub(super) fn poison_check(inner: &Inner) -> Result<(), LedgerError> {
        match &inner.poisoned {
            Some(cause) => Err(LedgerError::Storage(storage::Error::Poisoned { cause: cause.clone() })),
            None => Ok(()),
        }
    }

    /// Run `act` on a caught-up projection within a commit group; `act` returns its
    /// answer and the last sequence that answer depends on (it is returned once that
    /// sequence is durable). If another writer appended first (`HeadMoved`), the
    /// state `act` was judged on is gone: it runs again on the new state.
    pub(super) fn commit_with<T>(
        &self,
        admission: Admission,
        mut act: impl FnMut(&Self, &mut Inner) -> (Result<T, LedgerError>, u64),
    ) -> Result<T, LedgerError> {
        for _ in 0..HEAD_MOVED_RETRIES_MAX {
            if let Some(answer) = self.attempt(admission, &mut act) {
                return answer;
            }
            tracing::debug!("judging a transaction again: another writer appended first");
        }
        Err(LedgerError::HeadMovedTooOften { retries: HEAD_MOVED_RETRIES_MAX })
    }

    /// One try of `commit_with`: `None` when it must be judged again.
    fn attempt<T>(
        &self,
        admission: Admission,
        act: &mut impl FnMut(&Self, &mut Inner) -> (Result<T, LedgerError>, u64),
    ) -> Option<Result<T, LedgerError>> {
        let mut inner = self.inner.lock().expect("ledger");
        loop {
            if let Err(e) = Self::poison_check(&inner) {
                return Some(Err(e));
            }
            if inner.draining && admission == Admission::Callers {
                return Some(Err(LedgerError::Draining));
            }
            let readers = inner.readers_waiting > 0;
            match inner.phase {
                Phase::Open if !readers => {
                    let epoch = inner.epoch;
                    let (answer, covers) = match self.guarded(&mut inner, act) {
                        Ok(done) => done,
                        Err(panic) => {
                            drop(inner);
                            std::panic::resume_unwind(panic);
                        }
                    };
                    return self.await_durable(inner, covers, epoch, answer);
                }
                Phase::Idle if !readers => {
                    inner.phase = Phase::Starting;
                    drop(inner);
                    return self.lead(act);
                }
                _ => inner = self.changed.wait(inner).expect("ledger"),
            }
        }
    }

    /// Become the flusher: take the append lock, catch up, open the group, run this
    /// thread's own `act`, and flush the groups.
    fn lead<T>(
        &self,
        act: &mut impl FnMut(&Self, &mut Inner) -> (Result<T, LedgerError>, u64),
    ) -> Option<Result<T, LedgerError>> {
        let (mut own, mut panicked, mut opened) = (None, None, false);
        let mut failed: Option<LedgerError> = None;
        let locked = self.backend.exclusive(&mut |x| {
            let mut inner = self.inner.lock().expect("ledger");
            if let Err(e) = Self::catch_up(&mut inner) {
                failed = Some(e);
                return Ok(());
            }
            inner.phase = Phase::Open;
            opened = true;
            self.changed.notify_all();
            match self.guarded(&mut inner, act) {
                Err(panic) => panicked = Some(panic),
                Ok((answer, covers)) => {
                    // Like every other thread's, the leader's answer waits on its own
                    // slot: the group that makes it durable settles it — not a later
                    // group that fails, or that another writer overtakes.
                    let slot = (covers > inner.durable_seq).then(|| {
                        let slot = Arc::new(Slot::default());
                        inner.waiters.entry(covers).or_default().push(slot.clone());
                        slot
                    });
                    own = Some((answer, slot));
                }
            }
            if let Err(e) = self.flush_groups(x, inner) {
                failed = Some(e);
            }
            Ok(())
        });
        let error = match (locked, failed) {
            (Err(e), _) => Some(LedgerError::from(e)),
            (Ok(()), e) => e,
        };
        // Off the append lock: a snapshot (the projection cloned) if one is due and
        // nothing is in flight.
        self.maybe_snapshot(&mut self.inner.lock().expect("ledger"));
        if let Some(panic) = panicked {
            // `flush_groups` found the ledger poisoned and ended the phase; now let
            // the caller's panic go on.
            std::panic::resume_unwind(panic);
        }
        if !opened {
            // The lock was not taken or the catch-up failed: the phase is still this
            // thread's `Starting`. (Once open, `flush_groups` alone ends the phase: by
            // now another thread may have started the next one.)
            let mut inner = self.inner.lock().expect("ledger");
            inner.phase = Phase::Idle;
            self.changed.notify_all();
        }
        match own {
            None => Some(Err(error.unwrap_or(LedgerError::Storage(storage::Error::Closed)))),
            // It rested on durable state only.
            Some((answer, None)) => Some(answer),
            Some((answer, Some(slot))) => match slot.try_take() {
                Some(Signal::Durable) => Some(answer),
                Some(Signal::Retry) => None,
                // The leader hears what failed (an I/O error, say).
                Some(Signal::Failed(cause)) => {
                    Some(Err(error.unwrap_or(LedgerError::Storage(storage::Error::Poisoned { cause }))))
                }
                None => Some(Err(error.unwrap_or(LedgerError::Storage(storage::Error::Poisoned {
                    cause: "the group ended without settling the leader's transaction".into(),
                })))),
            },
        }
    }

    /// Run `act`, catching a panic (from the caller's `build`, or a bug): the ledger
    /// cannot know how far the transaction got, so it is poisoned, and every thread
    /// waiting on this group is woken to an error instead of waiting for ever. The
    /// caller re-raises the panic once it holds no lock.
    fn guarded<T>(
        &self,
        inner: &mut Inner,
        act: &mut impl FnMut(&Self, &mut Inner) -> (Result<T, LedgerError>, u64),
    ) -> Result<(Result<T, LedgerError>, u64), Box<dyn std::any::Any + Send>> {
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| act(self, &mut *inner))).inspect_err(|_| {
            tracing::error!("a transaction panicked while being built or checked; the ledger is poisoned");
            poison(inner, "a transaction panicked while being built or checked".into());
            self.changed.notify_all();
        })
    }

    /// Hand queued records to storage, one sync per group, until none are left. The
    /// caller holds the append lock throughout; the ledger mutex is released during
    /// each write and sync so that other threads can queue the next group.
    fn flush_groups<'a>(&'a self, l: &mut dyn Exclusive, mut inner: MutexGuard<'a, Inner>) -> Result<(), LedgerError> {
        let (records_max, bytes_max) = (self.opts.log.batch_records_max, self.opts.log.batch_bytes_max);
        let mut groups = 0;
        loop {
            // Only the flusher ends its phase (another thread could otherwise start a
            // second flusher while this one still holds the lock).
            debug_assert!(matches!(inner.phase, Phase::Open | Phase::Closing), "flusher in phase {:?}", inner.phase);
            if let Some(cause) = inner.poisoned.clone() {
                // Queued transactions were judged on state that cannot be trusted.
                poison(&mut inner, cause.clone());
                inner.phase = Phase::Idle;
                self.changed.notify_all();
                return Err(LedgerError::Storage(storage::Error::Poisoned { cause }));
            }
            if inner.queued.is_empty() {
                match self.queue_checkpoint(&mut inner) {
                    Ok(true) => continue,
                    Ok(false) => {}
                    Err(e) => tracing::warn!(error = %e, "checkpoint not queued"),
                }
                inner.phase = Phase::Idle;
                self.changed.notify_all();
                return Ok(());
            }
            let (mut n, mut bytes) = (0, 0);
            for r in &inner.queued {
                if n > 0 && (n == records_max || bytes + r.len() > bytes_max) {
                    break;
                }
                (n, bytes) = (n + 1, bytes + r.len());
            }
            let group: Vec<Vec<u8>> = inner.queued.drain(..n).collect();
            let expect = inner.durable_seq;
            drop(inner);
            let appended = l.append_if_head(expect, group);
            inner = self.inner.lock().expect("ledger");
            match appended {
                Ok(AppendOutcome::HeadMoved { actual }) => {
                    // Another writer appended first: everything queued was judged on
                    // state the log does not have. Rebuild the durable state (with
                    // the other writer's records) and send every waiter of this
                    // epoch back to judge its transaction again.
                    tracing::info!(expected = expect, actual, "another writer appended first; judging again");
                    inner.queued.clear();
                    inner.epoch += 1;
                    inner.head_moved += 1;
                    wake_all(&mut inner, Signal::Retry);
                    // Audit windows counted attempts judged on the discarded state:
                    // the retries count them again, and the first is written again.
                    inner.fenced.clear();
                    match replay(&*self.backend) {
                        Ok(r) => {
                            inner.tailer = r.tailer;
                            inner.projection = r.projection;
                            inner.head = r.head;
                            inner.durable_seq = inner.projection.last_seq;
                        }
                        Err(e) => {
                            let cause = format!("catching up after another writer appended: {e}");
                            poison(&mut inner, cause.clone());
                            inner.phase = Phase::Idle;
                            self.changed.notify_all();
                            return Err(LedgerError::Storage(storage::Error::Poisoned { cause }));
                        }
                    }
                    self.changed.notify_all();
                }
                Ok(AppendOutcome::Appended(a)) if a.first_seq == expect + 1 && a.last_seq == expect + n as u64 => {
                    inner.durable_seq = a.last_seq;
                    inner.head = a.chain_head;
                    wake_durable(&mut inner);
                    groups += 1;
                    let closing = groups >= GROUPS_PER_LOCK_MAX && inner.phase == Phase::Open;
                    if closing {
                        inner.phase = Phase::Closing;
                    }
                    // The shared condition variable only for those who need it: a
                    // phase change, or readers waiting for a settled view.
                    if closing || inner.readers_waiting > 0 {
                        self.changed.notify_all();
                    }
                }
                result => {
                    let (cause, error) = match result {
                        Ok(AppendOutcome::Appended(a)) => {
                            let cause =
                                format!("records landed at {}..={}, not after {expect}", a.first_seq, a.last_seq);
                            (cause.clone(), storage::Error::Poisoned { cause })
                        }
                        Ok(AppendOutcome::HeadMoved { .. }) => unreachable!("handled above"),
                        Err(e) => (e.to_string(), e),
                    };
                    tracing::error!(%cause, "a commit group did not become durable; the ledger is poisoned");
                    poison(&mut inner, cause);
                    inner.phase = Phase::Idle;
                    self.changed.notify_all();
                    // The flusher reports what failed (an I/O error, say); the others
                    // waiting on the group, and every later call, hear WRITER_POISONED.
                    return Err(LedgerError::Storage(error));
                }
            }
        }
    }

    /// Wait until everything up to `covers` is durable, then give `answer`; `None`
    /// if the state it was judged on (in `epoch`) was overtaken by another writer.
    fn await_durable<T>(
        &self,
        mut inner: MutexGuard<'_, Inner>,
        covers: u64,
        epoch: u64,
        answer: Result<T, LedgerError>,
    ) -> Option<Result<T, LedgerError>> {
        if inner.epoch != epoch {
            return None;
        }
        if inner.durable_seq >= covers {
            return Some(answer);
        }
        if let Err(e) = Self::poison_check(&inner) {
            return Some(Err(e));
        }
        // Wait on our own slot: the leader wakes us when `covers` is durable.
        let slot = Arc::new(Slot::default());
        inner.waiters.entry(covers).or_default().push(slot.clone());
        drop(inner);
        match slot.take() {
            Signal::Durable => Some(answer),
            Signal::Retry => None,
            Signal::Failed(cause) => Some(Err(LedgerError::Storage(storage::Error::Poisoned { cause }))),
        }
    }
}
