//! Where each waiter is woken: a thread on its own condition variable, an async
//! task on its own channel. The leader wakes exactly the waiters whose records a
//! sync made durable; the core keeps them in sequence order.

use std::sync::{Arc, Condvar, Mutex};

use super::Core;
use crate::format::ChainLink;
use crate::storage::error::Error;

#[derive(Debug, Clone)]
pub(super) enum Signal {
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
pub(super) struct ThreadSlot {
    signal: Mutex<Option<Signal>>,
    cv: Condvar,
}

impl ThreadSlot {
    /// The signal if one was given (the leader's own slot, after its flush).
    pub(super) fn try_take(&self) -> Option<Signal> {
        self.signal.lock().expect("slot").take()
    }

    pub(super) fn take(&self) -> Signal {
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
pub(super) enum Slot {
    Thread(Arc<ThreadSlot>),
    Task(tokio::sync::oneshot::Sender<Signal>),
}

impl Slot {
    pub(super) fn give(self, s: Signal) {
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

/// Async waiters woken by a leader that is not a runtime worker are handed to a
/// worker in one task when there are at least this many: each wake-up from outside
/// the runtime is a push onto its shared queue under a lock (and maybe a worker
/// unparked), so the leader would wake a large group one task at a time before it
/// could start the next group.
pub(super) const TASK_WAKES_HANDED_OFF_MIN: usize = 16;

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
pub(super) fn wake(woken: Vec<(Slot, Signal)>) {
    let (tasks, threads): (Vec<_>, Vec<_>) = woken.into_iter().partition(|(slot, _)| matches!(slot, Slot::Task(_)));
    drop(Wakes(threads));
    let tasks = Wakes(tasks);
    if tasks.0.len() < TASK_WAKES_HANDED_OFF_MIN {
        return;
    }
    // A leader for async callers runs on the runtime's blocking pool (a thread that
    // blocks is never one of its workers), where the runtime is at hand. Elsewhere
    // (a thread of the caller's own, a current-thread runtime) they are woken here
    // — and by a leader on a worker of its own (`LeadOn::Inline`): what it spawned
    // would wait in that worker's own queue until its lead ends.
    if !super::async_path::leading_inline()
        && let Ok(h) = tokio::runtime::Handle::try_current()
        && h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread
    {
        drop(h.spawn(async move { drop(tasks) }));
    }
}

impl<S> Core<S> {
    /// The waiters whose records are now durable (and only them), with their
    /// signal: woken by the caller once it has let go of the core mutex, so that
    /// arrivals queue meanwhile. `links` are the chain links of the records the
    /// last group appended from `first_seq` on.
    pub(super) fn durable_waiters(&mut self, first_seq: u64, links: &[ChainLink]) -> Vec<(Slot, Signal)> {
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
    pub(super) fn wait_for(&mut self, covers: u64, slot: Slot) {
        match self.waiters.back() {
            Some((last, _)) if *last > covers => {
                let at = self.waiters.partition_point(|(seq, _)| *seq <= covers);
                self.waiters.insert(at, (covers, slot));
            }
            _ => self.waiters.push_back((covers, slot)),
        }
    }

    /// Give every waiter the same signal.
    pub(super) fn wake_all(&mut self, signal: Signal) {
        for (_, slot) in std::mem::take(&mut self.waiters) {
            slot.give(signal.clone());
        }
    }
}
