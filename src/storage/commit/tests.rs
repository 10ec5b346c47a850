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
    /// The exclusive section is taken elsewhere: a leader that gives up
    /// (`give_up`) is withdrawn; one that waits gets it (as if it was let go).
    taken_elsewhere: bool,
    /// What `Hooks::inline_catch_up_is_long` answers.
    long_catch_up: bool,
    catch_ups: AtomicU32,
    /// Run during each append (off the core mutex), with the group's last sequence.
    during_append: Mutex<Option<DuringAppend>>,
}

/// Called during an append with the group's last sequence.
type DuringAppend = Box<dyn FnMut(u64) + Send>;

struct FakeX<'a>(u64, &'a Fake);

impl Exclusive for FakeX<'_> {
    fn append_if_head(&mut self, expect_seq: u64, payloads: Vec<Vec<u8>>) -> Result<AppendOutcome, Error> {
        let first_seq = expect_seq + 1;
        self.0 = expect_seq + payloads.len() as u64;
        if let Some(f) = self.1.during_append.lock().unwrap().as_mut() {
            f(self.0);
        }
        Ok(AppendOutcome::Appended(Appended { first_seq, last_seq: self.0, chain_head: [0; 32] }))
    }
}

impl Hooks<()> for Fake {
    type Error = Error;
    fn exclusive(
        &self,
        give_up: &dyn Fn() -> bool,
        f: &mut dyn FnMut(&mut dyn Exclusive) -> Result<(), Error>,
    ) -> Result<(), Error> {
        if self.taken_elsewhere && give_up() {
            return Err(Error::Withdrawn { waited_ms: 0 });
        }
        self.entered.fetch_add(1, Ordering::SeqCst);
        drop(self.gate.lock().unwrap());
        match &self.fail_with {
            Some(e) => Err(e.clone()),
            None => f(&mut FakeX(0, self)),
        }
    }
    fn inline_catch_up_is_long(&self, _core: &Core<()>, _x: &dyn Exclusive) -> bool {
        self.long_catch_up
    }
    fn catch_up(&self, core: &mut Core<()>, _x: &mut dyn Exclusive) -> Result<(), Error> {
        self.catch_ups.fetch_add(1, Ordering::SeqCst);
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
    Fake {
        entered: AtomicU32::new(0),
        gate: Mutex::new(()),
        fail_with,
        panic_in_catch_up,
        taken_elsewhere: false,
        long_catch_up: false,
        catch_ups: AtomicU32::new(0),
        during_append: Mutex::new(None),
    }
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
    let started = Arc::new(AtomicU32::new(0));
    let waiters: Vec<_> = (0..4)
        .map(|_| {
            let (engine, started) = (Arc::clone(&engine), Arc::clone(&started));
            rt.spawn(async move {
                let mut act = |_: &mut Core<()>| ((), 0u64);
                // Counted in the same poll that goes on to find the engine held.
                started.fetch_add(1, Ordering::SeqCst);
                if let AsyncCommit::<(), Error>::Lead { .. } = engine.commit_async(Admission::Callers, &mut act).await {
                    engine.async_lead_withdrawn();
                }
            })
        })
        .collect();
    let deadline = Instant::now() + Duration::from_secs(5);
    while started.load(Ordering::SeqCst) < 4 {
        assert!(Instant::now() < deadline, "the four callers never ran");
        std::thread::sleep(Duration::from_millis(1));
    }
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

/// Proves: `lead_inline` runs the lead on the caller's own thread — a worker of
/// a multi-thread runtime, the task's own — where `LeadOn::Pool` runs it on
/// another thread, and a panic in it reaches the caller as `Panicked`.
#[test]
fn an_inline_lead_runs_on_the_callers_worker_and_a_pool_lead_does_not() {
    let engine = Arc::new(GroupCommit::new((), 0, limits()));
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(1).build().unwrap();
    let (worker, inline, pool) = rt
        .block_on(rt.spawn(async move {
            let worker = std::thread::current().id();
            let inline = lead_inline(|| std::thread::current().id()).unwrap_or_else(|_| panic!("the lead failed"));
            let pool = lead_on_blocking_pool(engine, |e| e, LeadOn::Pool, |_| std::thread::current().id()).await;
            (worker, inline, pool.unwrap_or_else(|_| panic!("the lead failed")))
        }))
        .unwrap();
    assert_ne!(worker, std::thread::current().id(), "the task ran on a worker, not on the test's thread");
    assert_eq!(inline, worker, "inline: on the task's worker");
    assert_ne!(pool, worker, "pool: on another thread");
    let led = rt.block_on(rt.spawn(async { lead_inline(|| -> u32 { panic!("in the lead") }) })).unwrap();
    assert!(matches!(led, Err(LeadFailed::Panicked(_))));
}

/// Proves: a large group's async waiters woken by a leader on a runtime worker of
/// its own (`lead_inline`, in a task on a one-worker runtime) have `Durable` in
/// their channels before that lead ends — the signal is not left to a task
/// spawned onto the worker the lead holds, which would run only after the lead.
/// (The waiting tasks themselves run when a worker is free: this proves their
/// answers are given, not when they are read.)
#[test]
fn an_inline_leader_wakes_a_large_group_before_its_lead_ends() {
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(1).build().unwrap();
    let heard_in_lead = rt
        .block_on(rt.spawn(async move {
            lead_inline(|| {
                let (woken, mut rxs) = task_waiters(TASK_WAKES_HANDED_OFF_MIN * 2);
                wake(woken);
                rxs.iter_mut().map(|rx| rx.try_recv()).filter(|r| matches!(r, Ok(Signal::Durable(None)))).count()
            })
            .unwrap_or_else(|_| panic!("the lead failed"))
        }))
        .unwrap();
    assert_eq!(heard_in_lead, TASK_WAKES_HANDED_OFF_MIN * 2);
}

/// One record committed as an async caller made leader would: on its own thread
/// (`lead_inline`) or not.
fn lead_one(engine: &GroupCommit<()>, hooks: &Fake, inline: bool) -> Result<Settled<u64>, CommitError<Error>> {
    let lead = || {
        engine.commit_async_lead(hooks, Admission::Callers, |core| {
            let seq = core.queue(b"x".to_vec());
            (seq, seq)
        })
    };
    if inline { lead_inline(lead).unwrap_or_else(|_| panic!("the lead panicked")) } else { lead() }
}

/// Proves: a lead on an async caller's own thread never waits for an exclusive
/// section taken elsewhere, and declines a long catch-up: it answers `WouldBlock`
/// with nothing judged, queued or caught up, the phase free for the next leader,
/// and the decline counted; the same lead on a thread that may block waits for
/// the section, catches up and commits.
#[test]
fn an_inline_lead_declines_a_taken_section_and_a_long_catch_up_with_nothing_judged() {
    for (taken_elsewhere, long_catch_up) in [(true, false), (false, true)] {
        let engine = GroupCommit::new((), 0, limits());
        let hooks = Fake { taken_elsewhere, long_catch_up, ..fake(None, false) };
        let declined = lead_one(&engine, &hooks, true);
        assert!(matches!(declined, Err(CommitError::WouldBlock)), "{declined:?}");
        assert_eq!(hooks.catch_ups.load(Ordering::SeqCst), 0, "nothing caught up");
        {
            let core = engine.lock();
            assert_eq!((core.phase, core.last_seq, core.queued.len()), (Phase::Idle, 0, 0), "nothing judged");
            assert_eq!(core.inline_leads, InlineLeads { led: 0, declined: 1 });
            assert!(core.poisoned().is_none());
        }
        let led = lead_one(&engine, &hooks, false).unwrap();
        assert_eq!(led.answer, 1);
        assert_eq!(engine.lock().durable_seq(), 1);
        assert_eq!(engine.inline_leads(), InlineLeads { led: 0, declined: 1 }, "not an inline lead");
    }
    // Neither: the inline lead leads, and is counted.
    let engine = GroupCommit::new((), 0, limits());
    let hooks = fake(None, false);
    assert_eq!(lead_one(&engine, &hooks, true).unwrap().answer, 1);
    assert_eq!(engine.inline_leads(), InlineLeads { led: 1, declined: 0 });
}

/// Proves: a lead on an async caller's own thread waits for nobody before it
/// leads: with another leader's turn under way (kept inside its exclusive
/// section), and with the engine's mutex held by someone else, it declines at
/// once — `WouldBlock`, nothing judged, each decline counted (the one that
/// could not have the mutex too) —
/// where a lead on a thread that may block waits and then commits.
#[test]
fn an_inline_lead_declines_another_leaders_turn_and_a_held_engine_without_waiting() {
    let engine = GroupCommit::new((), 0, limits());
    let hooks = fake(None, false);
    // The inline lead on a thread of its own; what it answered, unless it waits.
    let inline_answer = |let_go: &mut dyn FnMut()| {
        std::thread::scope(|s| {
            let (tx, rx) = std::sync::mpsc::channel();
            let (engine, hooks) = (&engine, &hooks);
            s.spawn(move || tx.send(lead_one(engine, hooks, true).map(|s| s.answer)).unwrap());
            let answer = rx.recv_timeout(Duration::from_secs(60));
            let_go(); // before asserting: a lead that waits must not hang the test
            answer.expect("the inline lead waited")
        })
    };
    let gate = hooks.gate.lock().unwrap();
    std::thread::scope(|s| {
        let other = s.spawn(|| append(&engine, &hooks).map(|s| s.answer));
        while hooks.entered.load(Ordering::SeqCst) != 1 {
            std::thread::yield_now();
        }
        // The other leader is inside its exclusive section: the phase is taken.
        let mut gate = Some(gate);
        let declined = inline_answer(&mut || drop(gate.take()));
        assert!(matches!(declined, Err(CommitError::WouldBlock)), "{declined:?}");
        assert_eq!(other.join().unwrap().unwrap(), 1);
        assert_eq!(engine.inline_leads(), InlineLeads { led: 0, declined: 1 });
    });
    // The engine's mutex held by another thread for longer than the lead tries.
    let mut held = Some(engine.lock());
    let nothing_judged = held.as_ref().map(|c| (c.last_seq, c.queued.len()));
    let declined = inline_answer(&mut || drop(held.take()));
    assert!(matches!(declined, Err(CommitError::WouldBlock)), "{declined:?}");
    assert_eq!(nothing_judged, Some((1, 0)));
    let core = engine.lock();
    assert_eq!((core.last_seq, core.queued.len()), (1, 0), "nothing judged");
    drop(core);
    assert_eq!(engine.inline_leads(), InlineLeads { led: 0, declined: 2 }, "counted without the mutex");
    assert_eq!(lead_one(&engine, &hooks, false).unwrap().answer, 2, "a lead that may block commits");
    assert_eq!(lead_one(&engine, &hooks, true).unwrap().answer, 3, "alone and free: inline");
    assert_eq!(engine.inline_leads(), InlineLeads { led: 1, declined: 2 });
}

/// Proves: a commit for a blocking caller made inside a lead on an async
/// caller's own thread (a transaction's build that commits to another engine) is
/// not an inline lead: it waits for the section taken elsewhere as any blocking
/// caller would, instead of being withdrawn; and the inline lead around it is
/// still one after it.
#[test]
fn a_blocking_commit_inside_an_inline_lead_is_not_inline() {
    let inner = GroupCommit::new((), 0, limits());
    let inner_hooks = Fake { taken_elsewhere: true, ..fake(None, false) };
    let outer = GroupCommit::new((), 0, limits());
    let outer_hooks = fake(None, false);
    let led = lead_inline(|| {
        let nested = append(&inner, &inner_hooks).map(|s| s.answer);
        assert!(leading_inline(), "the inline lead is still one after the nested commit");
        let own = outer.commit_async_lead(&outer_hooks, Admission::Callers, |core| {
            let seq = core.queue(b"x".to_vec());
            (seq, seq)
        });
        (nested, own.map(|s| s.answer))
    })
    .unwrap_or_else(|_| panic!("the lead panicked"));
    assert!(!leading_inline(), "the flag ends with the lead");
    assert_eq!(led.0.unwrap(), 1, "the nested blocking commit waited for the section and committed");
    assert_eq!(led.1.unwrap(), 1);
    assert_eq!(inner.inline_leads(), InlineLeads { led: 0, declined: 0 });
    assert_eq!(outer.inline_leads(), InlineLeads { led: 1, declined: 0 });
}

/// Proves: a lead on an async caller's own thread ends its turn after its own
/// group and the one queued while that was synced — a caller arriving during
/// that second sync leads a turn of its own — where a lead on another thread
/// takes that caller into a third group of the same turn.
#[test]
fn an_inline_lead_ends_its_turn_after_its_group_and_the_one_queued_meanwhile() {
    for inline in [true, false] {
        let engine = Arc::new(GroupCommit::new((), 0, limits()));
        let others = Arc::new(fake(None, false));
        let hooks = fake(None, false);
        let arrivals = Arc::new(Mutex::new(Vec::new()));
        {
            let (engine, others, arrivals) = (Arc::clone(&engine), Arc::clone(&others), Arc::clone(&arrivals));
            // During the syncs of the first two groups, one more caller arrives.
            *hooks.during_append.lock().unwrap() = Some(Box::new(move |last_seq| {
                if last_seq > 2 {
                    return;
                }
                let (e, o) = (Arc::clone(&engine), Arc::clone(&others));
                arrivals.lock().unwrap().push(std::thread::spawn(move || append(&e, &o).map(|s| s.answer)));
                // It queued into the open group, or waits for the turn to end.
                let deadline = Instant::now() + Duration::from_secs(60);
                loop {
                    let core = engine.lock();
                    if core.queued.len() == 1 || core.arrivals_waiting == 1 {
                        break;
                    }
                    drop(core);
                    assert!(Instant::now() < deadline, "the arrival neither queued nor waited");
                    std::thread::yield_now();
                }
            }));
        }
        assert_eq!(lead_one(&engine, &hooks, inline).unwrap().answer, 1);
        let answers: Vec<u64> = arrivals.lock().unwrap().drain(..).map(|h| h.join().unwrap().unwrap()).collect();
        assert_eq!(answers, [2, 3]);
        assert_eq!(engine.lock().durable_seq(), 3);
        let third_led_its_own_turn = others.entered.load(Ordering::SeqCst) == 1;
        assert_eq!(third_led_its_own_turn, inline, "inline: {inline}");
        assert_eq!(hooks.entered.load(Ordering::SeqCst), 1);
    }
}
