use super::*;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use super::slots::{Signal, Slot, TASK_WAKES_HANDED_OFF_MIN, wake};
use crate::storage::backend::AppendOutcome;

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
                if let AsyncCommit::<(), Error>::Lead { .. } = engine.commit_async(Admission::Callers, &mut act).await {
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

/// One async judged commit on `engine` that queues one record: what the engine
/// told the caller (`Lead { alone }`, or done).
fn async_turn(rt: &tokio::runtime::Runtime, engine: &GroupCommit<()>) -> Option<bool> {
    rt.block_on(async {
        let mut act = |core: &mut Core<()>| ((), core.queue(vec![7]));
        match engine.commit_async::<(), Error>(Admission::Callers, &mut act).await {
            AsyncCommit::Lead { alone } => Some(alone),
            AsyncCommit::Done(_) => None,
        }
    })
}

/// Proves: an async caller made leader is told it is alone only when the last
/// group carried one record and nobody waits for room — after a crowded group
/// (three records) or with a caller waiting for room it is not, and after it led
/// a group of its own one record alone it is again.
#[test]
fn an_async_leader_is_alone_only_after_a_group_of_one_with_nobody_waiting() {
    let engine = GroupCommit::new((), 0, limits());
    let hooks = fake(None, false);
    let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
    assert_eq!(async_turn(&rt, &engine), Some(true), "before any group");
    engine.async_lead_withdrawn();
    // A thread's three records, led as one group.
    let three = |core: &mut Core<()>| {
        core.queue(vec![1]);
        core.queue(vec![2]);
        ((), core.queue(vec![3]))
    };
    engine.commit(&hooks, Admission::Callers, three).unwrap();
    assert_eq!(engine.lock().last_group_records, 3);
    assert_eq!(async_turn(&rt, &engine), Some(false), "after a group of three");
    engine.async_lead_withdrawn();
    engine.lock().room_waiting += 1;
    engine.lock().last_group_records = 1;
    assert_eq!(async_turn(&rt, &engine), Some(false), "with a caller waiting for room");
    engine.async_lead_withdrawn();
    engine.lock().room_waiting -= 1;
    // Led by the async caller itself: a group of its one record.
    engine.commit_async_lead(&hooks, Admission::Callers, |core: &mut Core<()>| ((), core.queue(vec![9]))).unwrap();
    assert_eq!(engine.lock().last_group_records, 1);
    assert_eq!(engine.lock().durable_seq(), 4);
    assert_eq!(async_turn(&rt, &engine), Some(true), "after a group of one");
    engine.async_lead_withdrawn();
}

/// Proves: `LeadOn::Inline` runs the lead on the caller's own thread (no hand-off),
/// on a current-thread runtime and on a worker of a multi-thread one, and a panic
/// in it reaches the caller as `Panicked`; `LeadOn::Pool` runs it on another
/// thread.
#[test]
fn an_inline_lead_runs_on_the_callers_thread_and_a_pool_lead_does_not() {
    let engine = Arc::new(GroupCommit::new((), 0, limits()));
    let current = tokio::runtime::Builder::new_current_thread().build().unwrap();
    let multi = tokio::runtime::Builder::new_multi_thread().worker_threads(1).build().unwrap();
    for rt in [&current, &multi] {
        for (on, same) in [(LeadOn::Inline, true), (LeadOn::Pool, false)] {
            let e = Arc::clone(&engine);
            let (caller, leader) = rt.block_on(async move {
                let caller = std::thread::current().id();
                let led = lead_on_blocking_pool(e, |e| e, on, |_| std::thread::current().id()).await;
                (caller, led.unwrap_or_else(|_| panic!("the lead failed")))
            });
            assert_eq!(caller == leader, same, "{on:?}");
        }
        let e = Arc::clone(&engine);
        let led = rt.block_on(lead_on_blocking_pool(e, |e| e, LeadOn::Inline, |_| -> u32 { panic!("in the lead") }));
        assert!(matches!(led, Err(LeadFailed::Panicked(_))));
    }
}

/// Proves: a large group's async waiters woken by a leader on a runtime worker of
/// its own (`LeadOn::Inline`) hear `Durable` before that lead ends — not from a
/// task spawned onto the worker the lead holds (on a one-worker runtime it would
/// run only after the lead).
#[test]
fn an_inline_leader_wakes_a_large_group_before_its_lead_ends() {
    let engine = Arc::new(GroupCommit::new((), 0, limits()));
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(1).build().unwrap();
    let heard_in_lead = rt.block_on(async move {
        let led = lead_on_blocking_pool(
            engine,
            |e| e,
            LeadOn::Inline,
            |_| {
                let (woken, mut rxs) = task_waiters(TASK_WAKES_HANDED_OFF_MIN * 2);
                wake(woken);
                rxs.iter_mut().map(|rx| rx.try_recv()).filter(|r| matches!(r, Ok(Signal::Durable(None)))).count()
            },
        );
        led.await.unwrap_or_else(|_| panic!("the lead failed"))
    });
    assert_eq!(heard_in_lead, TASK_WAKES_HANDED_OFF_MIN * 2);
}
