//! The engine's state and its owner's, under the engine's one mutex: where the
//! group commit stands, what is queued and durable, who waits, and poisoning.

use std::collections::VecDeque;
use std::ops::{Deref, DerefMut};
use std::time::Instant;

use super::slots::{Signal, Slot};
use super::{Admission, CommitError, Phase};
use crate::storage::error::Error;

/// Leads on an async caller's own thread ([`lead_inline`](super::lead_inline)).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct InlineLeads {
    /// Turns led there (the group opened).
    pub led: u64,
    /// Turns given back to a lead on the pool: the exclusive section was taken,
    /// the catch-up long, another leader's turn or a reader under way, or the
    /// engine's mutex held past `INLINE_CORE_SPIN_US`.
    pub declined: u64,
}

/// The engine's state and its owner's (`S`, reached through `Deref`), under one
/// mutex.
pub struct Core<S> {
    pub(super) state: S,
    pub(super) phase: Phase,
    /// Records queued for the next group, in sequence order.
    pub(super) queued: Vec<Vec<u8>>,
    /// The sequence the last queued record will have (the durable one when
    /// nothing is in flight).
    pub(super) last_seq: u64,
    /// Everything up to this sequence is synced.
    pub(super) durable_seq: u64,
    /// Bumped when queued records were judged on state another writer overtook:
    /// every waiter of an older epoch judges again.
    pub(super) epoch: u64,
    pub(super) head_moved: u64,
    pub(super) draining: bool,
    /// Readers waiting for a view with nothing in flight; while any wait, arrivals
    /// do not join the open group, so the leader drains and the wait is bounded.
    pub(super) readers_waiting: usize,
    /// Callers waiting for room in a full queue.
    pub(super) room_waiting: usize,
    /// Threads waiting for a group to open (a probe for tests: nothing decides on it).
    #[cfg(test)]
    pub(super) arrivals_waiting: usize,
    /// An async caller found no group open and asked for a leader on a blocking
    /// thread that has not started yet: other async callers wait for it instead of
    /// asking for more (threads may still lead: the phase stays `Idle`).
    pub(super) async_lead_pending: bool,
    /// How many records the last group carried (0 before the first): one when its
    /// writer had the log to itself ([`AsyncCommit::Lead`]'s `alone`).
    pub(super) last_group_records: usize,
    /// Leads on an async caller's own thread: turns led, and turns declined.
    pub(super) inline_leads: InlineLeads,
    /// The last attempt to lead that could not enter the exclusive section (a lock
    /// timeout, say), and when it gave up: callers that were waiting then get the
    /// same answer instead of each waiting out the lock again.
    pub(super) lead_failed: Option<(Instant, Error)>,
    pub(super) poisoned: Option<String>,
    /// Waiters with the last sequence their answer rests on, in that order (it is
    /// the last queued sequence when they register, so nearly always at the back:
    /// no map node and no vector per waiter).
    pub(super) waiters: VecDeque<(u64, Slot)>,
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
    pub(super) fn lead_failed_since(&self, since: Instant) -> Option<Error> {
        self.lead_failed.as_ref().filter(|(at, _)| *at >= since).map(|(_, e)| e.clone())
    }

    /// Why a caller that arrived at `arrived` may not commit now, if it may not:
    /// the engine is poisoned, it drains (and the records are callers'), or the
    /// attempt to lead that the caller waited for could not start.
    pub(super) fn refusal<E>(&self, admission: Admission, arrived: Instant) -> Option<CommitError<E>> {
        if let Err(e) = self.poison_check() {
            return Some(CommitError::Storage(e));
        }
        if self.draining && admission == Admission::Callers {
            return Some(CommitError::Draining);
        }
        self.lead_failed_since(arrived).map(CommitError::Storage)
    }

    pub fn poison_check(&self) -> Result<(), Error> {
        match &self.poisoned {
            Some(cause) => Err(Error::Poisoned { cause: cause.clone() }),
            None => Ok(()),
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
    pub(super) fn poison_after(&mut self, error: &Error) {
        if self.poisoned.is_some() || !matches!(error, Error::NotCommitted { .. }) {
            return self.poison(error.to_string());
        }
        self.poisoned = Some(error.to_string());
        self.fail_all(error.clone());
    }

    pub(super) fn fail_all(&mut self, error: Error) {
        self.queued.clear();
        self.last_seq = self.durable_seq;
        self.wake_all(Signal::Failed(error));
    }
}
