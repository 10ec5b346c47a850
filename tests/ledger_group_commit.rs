//! The ledger's group commit: threads of one process submitting at once share syncs,
//! are still judged one after another against exactly the state they follow, and
//! never get an answer that rests on state that is not yet durable.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::process::{Child, Command, Stdio};
use std::sync::Barrier;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use common::{Rng, records, seed};
use fencelog::ledger::{Ledger, LedgerError, LedgerOptions, identity};
use fencelog::model::{Event, Identity, Projection, Refusal, Txn, decode_txn};
use fencelog::storage::{LogOptions, verify_dir};

/// A child running `fencelog-torture ledger` (threads sharing one ledger).
fn spawn_ledger(dir: &std::path::Path, tag: &str, threads: u64, ops: u64, subjects: u64) -> Child {
    Command::new(common::torture_bin())
        .args(["ledger", dir.to_str().unwrap(), tag])
        .args([threads, ops, subjects].map(|n| n.to_string()))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn fencelog-torture")
}

/// (sequence, request id)
type Ack = (u64, String);
/// (refusal code, request id)
type Refused = (String, String);

/// The child's complete lines: (`ACK` seq, request id) and (`REFUSED` code, request
/// id). A line cut by a kill is ignored (the child had not reported it).
fn reported(out: &[u8]) -> (Vec<Ack>, Vec<Refused>) {
    let (mut acks, mut refused) = (Vec::new(), Vec::new());
    let complete = &out[..out.iter().rposition(|&b| b == b'\n').map_or(0, |i| i + 1)];
    for line in String::from_utf8_lossy(complete).lines() {
        match line.split(' ').collect::<Vec<_>>()[..] {
            ["ACK", seq, id] => acks.push((seq.parse().unwrap(), id.to_owned())),
            ["REFUSED", code, id] => refused.push((code.to_owned(), id.to_owned())),
            _ => panic!("unexpected line {line:?}"),
        }
    }
    (acks, refused)
}

/// Request id → sequence, for every transaction in the log that carries one.
fn committed_requests(dir: &std::path::Path) -> BTreeMap<String, u64> {
    records(dir).into_iter().filter_map(|(seq, p)| decode_txn(&p).unwrap().request.map(|r| (r.id, seq))).collect()
}

fn me() -> Identity {
    identity::probe(std::process::id(), uuid::Uuid::new_v4()).unwrap()
}

fn claim(subject: &str, owner: &Identity) -> impl Fn(&Projection, u64, uuid::Uuid) -> Result<Txn, Refusal> + use<> {
    let (subject, owner) = (subject.to_owned(), owner.clone());
    move |_p, now_ms, writer| {
        let (subject, owner) = (subject.clone(), owner.clone());
        Ok(Txn::new(
            now_ms,
            writer,
            vec![Event::Claim { subject, owner, stale_after_ms: 60_000, lock: None, previous: None }],
        ))
    }
}

fn heartbeat(subject: &str) -> impl Fn(&Projection, u64, uuid::Uuid) -> Result<Txn, Refusal> + use<> {
    let subject = subject.to_owned();
    move |p, now_ms, writer| {
        let generation = p.subject(&subject).expect("claimed").generation;
        Ok(Txn::new(now_ms, writer, vec![Event::Heartbeat { subject: subject.clone(), generation }]))
    }
}

/// Proves: 32 threads each claiming a subject and heartbeating it 24 times through
/// one ledger all commit, at distinct dense sequences, sharing syncs; a reader
/// calling `projection()` meanwhile never sees a transaction the log does not hold
/// yet; a reopen replays to the same projection.
#[test]
fn threads_of_one_process_share_syncs_and_every_transaction_lands_once() {
    let d = tempfile::tempdir().unwrap();
    let ledger = Ledger::open(d.path(), LedgerOptions::default()).unwrap();
    let (threads, each) = (32u64, 25u64);
    let done = AtomicBool::new(false);
    let owner = me();
    let seqs: Vec<u64> = std::thread::scope(|s| {
        let reader = s.spawn(|| {
            let mut views = 0;
            while !done.load(Ordering::Acquire) {
                let p = ledger.projection();
                let on_disk = records(d.path()).len() as u64;
                assert!(on_disk >= p.last_seq(), "projection at {} but the log holds {on_disk}", p.last_seq());
                views += 1;
            }
            views
        });
        let workers: Vec<_> = (0..threads)
            .map(|t| {
                let (ledger, owner) = (&ledger, &owner);
                s.spawn(move || {
                    let subject = format!("t{t}");
                    let mut seqs = vec![ledger.submit(None, claim(&subject, owner)).unwrap().seq.unwrap()];
                    for _ in 1..each {
                        seqs.push(ledger.submit(None, heartbeat(&subject)).unwrap().seq.unwrap());
                    }
                    seqs
                })
            })
            .collect();
        let seqs = workers.into_iter().flat_map(|w| w.join().unwrap()).collect();
        done.store(true, Ordering::Release);
        assert!(reader.join().unwrap() > 0);
        seqs
    });
    let total = threads * each;
    let unique: BTreeSet<u64> = seqs.iter().copied().collect();
    assert_eq!(unique, (1..=total).collect::<BTreeSet<u64>>(), "distinct, dense sequences");
    let fencelog::storage::CommitStats { records: appended, syncs } = ledger.commit_stats();
    assert_eq!(appended, total);
    assert!(syncs < appended / 2, "transactions must share syncs: {appended} records took {syncs} syncs");
    let live = ledger.projection();
    assert_eq!(live.subjects().len() as u64, threads);
    assert!(live.subjects().values().all(|s| s.generation == 1));
    drop(ledger);
    let replayed = Ledger::open(d.path(), LedgerOptions::default()).unwrap();
    assert_eq!(replayed.projection(), live);
}

/// Proves: 16 threads of one process racing to claim one free subject, 50 rounds:
/// exactly one wins each round, every other is refused ALREADY_ACTIVE naming the
/// winner — each judged against the state including the claims still being synced.
#[test]
fn threads_racing_for_one_subject_in_one_process_have_exactly_one_winner() {
    let d = tempfile::tempdir().unwrap();
    let ledger = Ledger::open(d.path(), LedgerOptions::default()).unwrap();
    for round in 0..50 {
        let subject = format!("race/{round}");
        let barrier = Barrier::new(16);
        let results: Vec<(uuid::Uuid, Result<_, LedgerError>)> = std::thread::scope(|s| {
            let hs: Vec<_> = (0..16)
                .map(|_| {
                    let (ledger, subject, barrier) = (&ledger, &subject, &barrier);
                    s.spawn(move || {
                        let owner = me();
                        barrier.wait();
                        (owner.instance, ledger.submit(None, claim(subject, &owner)))
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        assert_one_winner(round, &results);
    }
    assert_eq!(claim_records(d.path()), 50, "one claim record per round");
}

/// Exactly one claimant of a round won; every other was refused ALREADY_ACTIVE
/// naming the winner.
fn assert_one_winner(round: usize, results: &[(uuid::Uuid, Result<fencelog::ledger::Committed, LedgerError>)]) {
    let winners: Vec<uuid::Uuid> = results.iter().filter(|r| r.1.is_ok()).map(|r| r.0).collect();
    assert_eq!(winners.len(), 1, "round {round}: {results:?}");
    for (_, r) in results.iter().filter(|r| r.1.is_err()) {
        match r {
            Err(LedgerError::Refused(Refusal::AlreadyActive { instance, .. })) => {
                assert_eq!(*instance, winners[0], "round {round}")
            }
            other => panic!("round {round}: expected ALREADY_ACTIVE, got {other:?}"),
        }
    }
}

fn claim_records(dir: &std::path::Path) -> usize {
    records(dir).iter().filter(|(_, p)| matches!(decode_txn(p).unwrap().events[0], Event::Claim { .. })).count()
}

/// Proves: the same request id submitted by 8 threads at once commits once; every
/// caller gets that one sequence, and all but one are told it was deduplicated.
#[test]
fn one_request_id_submitted_by_several_threads_at_once_commits_once() {
    let d = tempfile::tempdir().unwrap();
    let ledger = Ledger::open(d.path(), LedgerOptions::default()).unwrap();
    let owner = me();
    let barrier = Barrier::new(8);
    let results: Vec<_> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..8)
            .map(|_| {
                let (ledger, owner, barrier) = (&ledger, &owner, &barrier);
                s.spawn(move || {
                    barrier.wait();
                    ledger
                        .submit(
                            Some(fencelog::model::RequestTag { id: "req-1".into(), digest: [7u8; 32] }),
                            claim("dedup/a", owner),
                        )
                        .unwrap()
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert!(results.iter().all(|c| c.seq == Some(1)), "{results:?}");
    assert_eq!(results.iter().filter(|c| !c.deduplicated).count(), 1, "{results:?}");
    assert_eq!(records(d.path()).len(), 1);
}

/// Proves: a process whose threads keep the ledger busy still lets other processes
/// append (its flusher lets go of the append lock every few groups): 5 CLI claims
/// from other processes all commit while 16 threads submit without pause.
#[test]
fn a_busy_process_lets_other_processes_take_their_turn() {
    let d = tempfile::tempdir().unwrap();
    let ledger = Ledger::open(d.path(), LedgerOptions::default()).unwrap();
    let owner = me();
    let stop = AtomicBool::new(false);
    std::thread::scope(|s| {
        for t in 0..16 {
            let (ledger, owner, stop) = (&ledger, &owner, &stop);
            s.spawn(move || {
                let mut i = 0;
                while !stop.load(Ordering::Acquire) {
                    ledger.submit(None, claim(&format!("busy/{t}/{i}"), owner)).unwrap();
                    i += 1;
                }
            });
        }
        for k in 0..5 {
            let out = std::process::Command::new(env!("CARGO_BIN_EXE_fencelog"))
                .args(["claim", "--subject", &format!("other/{k}"), "--pid", &std::process::id().to_string()])
                .env("FENCELOG_DIR", d.path())
                .output()
                .unwrap();
            assert!(out.status.success(), "other process, claim {k}: {}", String::from_utf8_lossy(&out.stdout));
        }
        stop.store(true, Ordering::Release);
    });
    let p = ledger.refresh().unwrap();
    assert!((0..5).all(|k| p.subject(&format!("other/{k}")).is_some()));
}

/// Proves: 3 processes × 4 threads mixing claims (over dead owners too), heartbeats,
/// fence rotations, releases and zombie writes on 12 shared subjects commit exactly
/// what they acknowledge, each at the sequence it was told, refuse only what never
/// reaches the log, and leave a log whose replay validates every record (0 anomalies:
/// each transaction was judged against exactly the state it follows).
#[test]
fn threads_of_several_processes_mixing_operations_commit_exactly_what_they_acknowledge() {
    let d = tempfile::tempdir().unwrap();
    Ledger::open(d.path(), LedgerOptions::default()).unwrap();
    let children: Vec<Child> = (0..3).map(|k| spawn_ledger(d.path(), &format!("p{k}"), 4, 120, 12)).collect();
    let (mut acks, mut refused) = (Vec::new(), Vec::new());
    for c in children {
        let out = c.wait_with_output().unwrap();
        assert!(out.status.success(), "child failed: {}", String::from_utf8_lossy(&out.stderr));
        let (a, r) = reported(&out.stdout);
        acks.extend(a);
        refused.extend(r);
    }
    assert_eq!(acks.len() + refused.len(), 3 * 4 * 120);
    assert!(refused.iter().all(|(code, _)| code == "FENCED"), "only zombie writes are refused");
    assert!(!acks.is_empty() && !refused.is_empty());
    let committed = committed_requests(d.path());
    for (seq, id) in &acks {
        assert_eq!(committed.get(id), Some(seq), "acknowledged {id} at {seq}");
    }
    assert_eq!(committed.len(), acks.len(), "nothing committed that was not acknowledged");
    for (code, id) in &refused {
        assert!(!committed.contains_key(id), "{id} was refused {code} but is in the log");
    }
    let l = Ledger::open(d.path(), LedgerOptions::default()).unwrap();
    let p = l.projection();
    assert_eq!(p.anomalies(), 0, "every record validates on replay");
    assert!(p.subjects().values().map(|s| s.fenced_attempts).sum::<u64>() > 0, "zombie attempts are audited");
    assert!(verify_dir(d.path(), LogOptions::default().body_max()).unwrap().is_intact());
}

/// Proves: `kill -9` of a process whose 8 threads share one ledger, at random moments
/// (15 rounds, each new process claiming over the dead one's subjects with its death
/// evidence): every acknowledged transaction is in the log at its sequence, and the
/// log replays with every record valid.
#[test]
fn kill_9_of_a_process_committing_in_groups_never_loses_an_acknowledged_transaction() {
    let d = tempfile::tempdir().unwrap();
    let s = seed();
    let mut rng = Rng(s);
    let mut acked = 0;
    for round in 0..15 {
        let mut child = spawn_ledger(d.path(), &format!("r{round}"), 8, 0, 4);
        // Killed only once it has opened the log and committed (its first line):
        // on a busy machine a fixed pause could end before the log even exists.
        let mut stdout = std::io::BufReader::new(child.stdout.take().unwrap());
        let mut seen = String::new();
        std::io::BufRead::read_line(&mut stdout, &mut seen).unwrap();
        assert!(seen.ends_with('\n'), "the child said nothing: {seen:?}");
        std::thread::sleep(Duration::from_millis(rng.below(150)));
        child.kill().unwrap();
        let mut rest = Vec::new();
        std::io::Read::read_to_end(&mut stdout, &mut rest).unwrap();
        let out = child.wait_with_output().unwrap();
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(out.status.signal(), Some(9), "killed, not dead before: {}", String::from_utf8_lossy(&out.stderr));
        let mut all = seen.into_bytes();
        all.extend(rest);
        let (acks, _) = reported(&all);
        let committed = committed_requests(d.path());
        for (seq, id) in &acks {
            assert_eq!(committed.get(id), Some(seq), "seed {s} round {round}: acknowledged {id} at {seq}");
        }
        acked += acks.len();
        let l = Ledger::open(d.path(), LedgerOptions::default()).unwrap();
        assert_eq!(l.projection().anomalies(), 0, "seed {s} round {round}");
    }
    assert!(acked > 0, "the children committed something");
    let kinds = records(d.path()).iter().fold(BTreeMap::new(), |mut m, (_, p)| {
        let t = decode_txn(p).unwrap();
        let k = match &t.events[0] {
            Event::Claim { previous: Some(_), .. } => "claim_over_dead",
            e => e.kind(),
        };
        *m.entry(k).or_insert(0) += 1;
        m
    });
    assert!(kinds.get("claim_over_dead").is_some_and(|&n| n > 0), "claims over a killed owner: {kinds:?}");
    assert!(verify_dir(d.path(), LogOptions::default().body_max()).unwrap().is_intact());
}

/// Proves: a `build` that panics while other threads are committing poisons the
/// ledger instead of leaving them waiting: the panic reaches its own caller, every
/// other thread gets WRITER_POISONED (none hangs), and a reopened ledger holds every
/// transaction that was acknowledged.
#[test]
fn a_panicking_build_poisons_the_ledger_and_wakes_every_waiting_thread() {
    let d = tempfile::tempdir().unwrap();
    let ledger = Ledger::open(d.path(), LedgerOptions::default()).unwrap();
    let owner = me();
    let (panicked, acked): (bool, Vec<(String, u64)>) = std::thread::scope(|s| {
        let workers: Vec<_> = (0..8)
            .map(|t| {
                let (ledger, owner) = (&ledger, &owner);
                s.spawn(move || {
                    let mut acked = Vec::new();
                    for i in 0.. {
                        let subject = format!("w{t}/{i}");
                        match ledger.submit(None, claim(&subject, owner)) {
                            Ok(c) => acked.push((subject, c.seq.unwrap())),
                            Err(e) => {
                                assert_eq!(e.code(), "WRITER_POISONED", "{e}");
                                return acked;
                            }
                        }
                    }
                    unreachable!()
                })
            })
            .collect();
        std::thread::sleep(Duration::from_millis(50));
        let bomb =
            s.spawn(|| ledger.submit(None, |_p: &Projection, _now, _w| -> Result<Txn, Refusal> { panic!("boom") }));
        let panicked = bomb.join().is_err();
        (panicked, workers.into_iter().flat_map(|w| w.join().unwrap()).collect())
    });
    assert!(panicked, "the panic reaches the caller whose build panicked");
    assert_eq!(ledger.submit(None, claim("after", &owner)).unwrap_err().code(), "WRITER_POISONED");
    drop(ledger);
    let p = Ledger::open(d.path(), LedgerOptions::default()).unwrap().projection();
    for (subject, seq) in &acked {
        assert_eq!(p.subject(subject).and_then(|s| s.owner.as_ref()).map(|o| o.since_seq), Some(*seq), "{subject}");
    }
}

/// Proves: async submitters (the daemon's requests: 64 tasks on a 2-worker runtime,
/// each claiming its subject and heartbeating it 15 times) and threads submitting
/// at the same time commit through the same groups — every transaction once, at
/// distinct dense sequences, each answer's sequence holding that caller's own
/// transaction and given only once that record is in the log, syncs shared — and a
/// reopen replays to the same projection.
#[test]
fn async_tasks_and_threads_submit_judged_transactions_through_the_same_groups() {
    let d = tempfile::tempdir().unwrap();
    let ledger = std::sync::Arc::new(Ledger::open(d.path(), LedgerOptions::default()).unwrap());
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let (tasks, threads, each) = (64u64, 4u64, 16u64);
    let owner = me();
    let mut answers: Vec<(String, u64)> = std::thread::scope(|s| {
        let from_threads: Vec<_> = (0..threads)
            .map(|t| {
                let (ledger, owner) = (&ledger, &owner);
                s.spawn(move || {
                    let subject = format!("thread/{t}");
                    let mut seqs =
                        vec![(subject.clone(), ledger.submit(None, claim(&subject, owner)).unwrap().seq.unwrap())];
                    for _ in 1..each {
                        seqs.push((subject.clone(), ledger.submit(None, heartbeat(&subject)).unwrap().seq.unwrap()));
                    }
                    seqs
                })
            })
            .collect();
        let from_tasks: Vec<(String, u64)> = rt.block_on(async {
            let hs: Vec<_> = (0..tasks)
                .map(|t| {
                    let (ledger, owner) = (std::sync::Arc::clone(&ledger), owner.clone());
                    let dir = d.path().to_owned();
                    tokio::spawn(async move {
                        let subject = format!("task/{t}");
                        let c = ledger.submit_as_async(None, None, claim(&subject, &owner)).await.unwrap();
                        let mut seqs = vec![(subject.clone(), c.seq.unwrap())];
                        for i in 1..each {
                            let c = ledger.submit_as_async(None, None, heartbeat(&subject)).await.unwrap();
                            seqs.push((subject.clone(), c.seq.unwrap()));
                            // An answer is given only once its record is in the log.
                            if i % 4 == 0 {
                                let on_disk = records(&dir).len() as u64;
                                assert!(on_disk >= c.seq.unwrap(), "answered {:?}, the log holds {on_disk}", c.seq);
                            }
                        }
                        seqs
                    })
                })
                .collect();
            let mut all = vec![];
            for h in hs {
                all.extend(h.await.unwrap());
            }
            all
        });
        let mut all: Vec<(String, u64)> = from_threads.into_iter().flat_map(|h| h.join().unwrap()).collect();
        all.extend(from_tasks);
        all
    });
    let total = (tasks + threads) * each;
    answers.sort_by_key(|a| a.1);
    assert_eq!(answers.iter().map(|a| a.1).collect::<Vec<_>>(), (1..=total).collect::<Vec<_>>(), "dense, distinct");
    let stored = records(d.path());
    assert_eq!(stored.len() as u64, total);
    for ((subject, seq), (stored_seq, payload)) in answers.iter().zip(&stored) {
        assert_eq!(seq, stored_seq);
        let txn = decode_txn(payload).unwrap();
        let on_record = match &txn.events[0] {
            Event::Claim { subject, .. } | Event::Heartbeat { subject, .. } => subject,
            other => panic!("unexpected event {other:?}"),
        };
        assert_eq!(on_record, subject, "the answer at {seq} is another caller's transaction");
    }
    let fencelog::storage::CommitStats { records: appended, syncs } = ledger.commit_stats();
    assert_eq!(appended, total);
    assert!(syncs < appended / 2, "transactions must share syncs: {appended} records took {syncs} syncs");
    let live = ledger.projection();
    assert!(live.subjects().values().all(|s| s.generation == 1 && s.owner.is_some()));
    drop(ledger);
    assert_eq!(Ledger::open(d.path(), LedgerOptions::default()).unwrap().projection(), live);
}

/// Proves: async submitters and threads racing to claim one free subject are judged
/// one after another against the state including the claims still being synced —
/// 30 rounds, 12 tasks and 4 threads each: exactly one winner, every other refused
/// ALREADY_ACTIVE naming it, one claim record per round.
#[test]
fn async_tasks_and_threads_racing_for_one_subject_have_exactly_one_winner() {
    let d = tempfile::tempdir().unwrap();
    let ledger = std::sync::Arc::new(Ledger::open(d.path(), LedgerOptions::default()).unwrap());
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    for round in 0..30 {
        let subject = format!("race/{round}");
        let barrier = std::sync::Arc::new(Barrier::new(16));
        let results: Vec<(uuid::Uuid, Result<_, LedgerError>)> = std::thread::scope(|s| {
            let threads: Vec<_> = (0..4)
                .map(|_| {
                    let (ledger, subject, barrier) = (&ledger, &subject, &barrier);
                    s.spawn(move || {
                        let owner = me();
                        barrier.wait();
                        (owner.instance, ledger.submit(None, claim(subject, &owner)))
                    })
                })
                .collect();
            let tasks: Vec<_> = rt.block_on(async {
                let hs: Vec<_> = (0..12)
                    .map(|_| {
                        let (ledger, subject, barrier) =
                            (std::sync::Arc::clone(&ledger), subject.clone(), std::sync::Arc::clone(&barrier));
                        // The barrier blocks: each task waits on a blocking thread,
                        // then submits from the runtime.
                        tokio::spawn(async move {
                            let owner = me();
                            tokio::task::spawn_blocking(move || barrier.wait()).await.unwrap();
                            (owner.instance, ledger.submit_as_async(None, None, claim(&subject, &owner)).await)
                        })
                    })
                    .collect();
                let mut all = vec![];
                for h in hs {
                    all.push(h.await.unwrap());
                }
                all
            });
            let mut all: Vec<_> = threads.into_iter().map(|h| h.join().unwrap()).collect();
            all.extend(tasks);
            all
        });
        assert_one_winner(round, &results);
    }
    assert_eq!(claim_records(d.path()), 30, "one claim record per round");
}

/// Proves: a ledger whose turns find the log's last record to be its own reads
/// nothing back (its tailer falls behind by its own records, up to a bound), yet
/// judges on the next record another handle appends after any number of such
/// turns — fewer than the bound, at it, and past it — before its own append: a
/// claim of the other handle's subject is refused, naming that owner, at the
/// first judgement (no append found the head moved and judged again). Both
/// handles end with the state and chain head a fresh open replays.
#[test]
fn a_ledger_that_committed_alone_for_many_turns_judges_on_the_next_record_of_another_handle() {
    let d = tempfile::tempdir().unwrap();
    let a = Ledger::open(d.path(), LedgerOptions::default()).unwrap();
    let b = Ledger::open(d.path(), LedgerOptions::default()).unwrap();
    let (ours, theirs) = (me(), me());
    a.submit(None, claim("ours", &ours)).unwrap();
    let moved = a.head_moved_count();
    for alone in [1u64, 2, 255, 256, 257, 600] {
        for _ in 0..alone {
            a.submit(None, heartbeat("ours")).unwrap();
        }
        let subject = format!("theirs/{alone}");
        let landed = b.submit(None, claim(&subject, &theirs)).unwrap().seq.unwrap();
        match a.submit(None, claim(&subject, &ours)) {
            Err(LedgerError::Refused(Refusal::AlreadyActive { instance, .. })) => {
                assert_eq!(instance, theirs.instance, "after {alone} turns alone")
            }
            other => panic!("after {alone} turns alone, the claim at {landed} was not seen: {other:?}"),
        }
        assert_eq!(a.projection().last_seq(), landed, "after {alone} turns alone");
        assert_eq!(a.head_moved_count(), moved, "judged before the other record was read, after {alone} turns alone");
    }
    let replayed = Ledger::open(d.path(), LedgerOptions::default()).unwrap();
    for (name, l) in [("a", &a), ("b", &b)] {
        let now = l.refresh_with(Projection::clone).unwrap();
        assert_eq!(now, replayed.projection(), "{name}");
        assert_eq!(l.chain_head().unwrap(), replayed.chain_head().unwrap(), "{name}");
    }
}

/// Proves: async submitters on one handle while a second handle of the same log
/// (as a second process — the CLI beside a daemon — would) keeps appending: each
/// leader catches up with the other handle's records before it judges, so every
/// answer names that caller's own record, the sequences of both handles together
/// are dense and distinct, and both handles, caught up, hold the state a fresh
/// open replays.
#[test]
fn async_submitters_and_another_handle_appending_to_the_same_log_each_answer_with_their_own_record() {
    let d = tempfile::tempdir().unwrap();
    let a = std::sync::Arc::new(Ledger::open(d.path(), LedgerOptions::default()).unwrap());
    let b = Ledger::open(d.path(), LedgerOptions::default()).unwrap();
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let owner = me();
    let mut answers: Vec<(String, u64)> = vec![];
    let mut burst = 0;
    // Bursts go on (bounded) until the other handle has appended in the midst of
    // one: on a loaded machine it may not get a turn in the first few.
    let interleaved = |answers: &[(String, u64)], n: u64| {
        let seqs_of =
            |prefix: String| answers.iter().filter(|x| x.0.starts_with(&prefix)).map(|x| x.1).collect::<Vec<_>>();
        let (mine, theirs) = (seqs_of(format!("async/{n}/")), seqs_of(format!("other/{n}/")));
        let (first, last) = (mine.iter().min().copied().unwrap_or(0), mine.iter().max().copied().unwrap_or(0));
        theirs.iter().any(|s| (first..last).contains(s))
    };
    let mut seen_interleaved = false;
    while burst < 3 || (!seen_interleaved && burst < 30) {
        let stop = AtomicBool::new(false);
        std::thread::scope(|s| {
            let other: Vec<_> = (0..2)
                .map(|t| {
                    let (b, owner, stop) = (&b, &owner, &stop);
                    s.spawn(move || {
                        let subject = format!("other/{burst}/{t}");
                        let mut seqs =
                            vec![(subject.clone(), b.submit(None, claim(&subject, owner)).unwrap().seq.unwrap())];
                        while !stop.load(Ordering::Relaxed) {
                            seqs.push((subject.clone(), b.submit(None, heartbeat(&subject)).unwrap().seq.unwrap()));
                        }
                        seqs
                    })
                })
                .collect();
            let mine: Vec<(String, u64)> = rt.block_on(async {
                let hs: Vec<_> = (0..32)
                    .map(|t| {
                        let (a, owner) = (std::sync::Arc::clone(&a), owner.clone());
                        tokio::spawn(async move {
                            let subject = format!("async/{burst}/{t}");
                            let c = a.submit_as_async(None, None, claim(&subject, &owner)).await.unwrap();
                            let mut seqs = vec![(subject.clone(), c.seq.unwrap())];
                            for _ in 0..16 {
                                let c = a.submit_as_async(None, None, heartbeat(&subject)).await.unwrap();
                                seqs.push((subject.clone(), c.seq.unwrap()));
                            }
                            seqs
                        })
                    })
                    .collect();
                let mut all = vec![];
                for h in hs {
                    all.extend(h.await.unwrap());
                }
                all
            });
            stop.store(true, Ordering::Relaxed);
            answers.extend(mine);
            for h in other {
                answers.extend(h.join().unwrap());
            }
        });
        seen_interleaved |= interleaved(&answers, burst);
        burst += 1;
    }
    answers.sort_by_key(|x| x.1);
    let stored = records(d.path());
    assert_eq!(answers.iter().map(|x| x.1).collect::<Vec<_>>(), (1..=stored.len() as u64).collect::<Vec<_>>());
    for ((subject, seq), (stored_seq, payload)) in answers.iter().zip(&stored) {
        assert_eq!(seq, stored_seq);
        let on_record = match &decode_txn(payload).unwrap().events[0] {
            Event::Claim { subject, .. } | Event::Heartbeat { subject, .. } => subject.clone(),
            other => panic!("unexpected event {other:?}"),
        };
        assert_eq!(&on_record, subject, "the answer at {seq} is another caller's transaction");
    }
    assert!(seen_interleaved, "in {burst} bursts the other handle never appended between the async records");
    let fresh = Ledger::open(d.path(), LedgerOptions::default()).unwrap().projection();
    assert_eq!(a.refresh().unwrap(), fresh);
    assert_eq!(b.refresh().unwrap(), fresh);
}

/// Proves: once the ledger drains, an async submitter is refused DRAINING before
/// its transaction is judged — nothing is appended — while a thread's and an async
/// submit before the drain both landed.
#[test]
fn an_async_submit_after_the_drain_is_refused_and_never_appended() {
    let d = tempfile::tempdir().unwrap();
    let ledger = std::sync::Arc::new(Ledger::open(d.path(), LedgerOptions::default()).unwrap());
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let owner = me();
    ledger.submit(None, claim("before/thread", &owner)).unwrap();
    let before = rt.block_on(ledger.submit_as_async(None, None, claim("before/task", &owner))).unwrap();
    assert_eq!(before.seq, Some(2));
    assert!(ledger.drain(5_000).unwrap().settled);
    let built = std::sync::Arc::new(AtomicBool::new(false));
    let b = std::sync::Arc::clone(&built);
    let build = claim("after", &owner);
    let after = rt.block_on(ledger.submit_as_async(None, None, move |p: &Projection, now, w| {
        b.store(true, Ordering::SeqCst);
        build(p, now, w)
    }));
    assert!(matches!(after, Err(LedgerError::Draining)), "{after:?}");
    assert!(!built.load(Ordering::SeqCst), "a transaction refused for draining is never judged");
    assert_eq!(records(d.path()).len(), 2);
}

/// Proves: a library transaction conditioned on the log's head (`LogAt`, the
/// compare-and-append of a whole log) is judged the same way when it is committed
/// and when the log is replayed: at the head it lands, and a fresh open applies it
/// (no anomaly, the same state); one sequence behind it is refused
/// CONDITION_FAILED and nothing is appended.
#[test]
fn a_log_at_condition_commits_at_the_head_and_replays_the_same() {
    use fencelog::model::Condition;
    let d = tempfile::tempdir().unwrap();
    let ledger = Ledger::open(d.path(), LedgerOptions::default()).unwrap();
    let owner = me();
    ledger.submit(None, claim("a", &owner)).unwrap();
    let at_head = |behind: u64| {
        let hb = heartbeat("a");
        move |p: &Projection, now_ms: u64, writer: uuid::Uuid| {
            let mut txn = hb(p, now_ms, writer)?;
            txn.conditions.push(Condition::LogAt { seq: p.last_seq() - behind });
            Ok(txn)
        }
    };
    let landed = ledger.submit(None, at_head(0)).unwrap();
    assert_eq!(landed.seq, Some(2));
    match ledger.submit(None, at_head(1)) {
        Err(LedgerError::Refused(r)) => assert_eq!(r.code(), "CONDITION_FAILED", "{r:?}"),
        other => panic!("a stale head must be refused: {other:?}"),
    }
    assert_eq!(records(d.path()).len(), 2, "the refused transaction appended nothing");
    let live = ledger.projection();
    drop(ledger);
    let replayed = Ledger::open(d.path(), LedgerOptions::default()).unwrap().projection();
    assert_eq!(replayed.anomalies(), 0, "the committed record validates on replay");
    assert_eq!(replayed, live);
}

/// Proves: a lone async caller in a task on a multi-thread runtime with two
/// workers leads each of its groups on its own worker
/// (`storage::commit::lead_inline`: every lead counted there) while it is alone,
/// and on a current-thread runtime or a multi-thread one with one worker — whose
/// one thread every other task needs — never does (every lead on the blocking
/// pool, none counted);
/// then, with two threads submitting at the same time, it is answered for every
/// transaction once its record is in the log (in the file: that an answer waits
/// for the sync is `tests/failpoints.rs`'s lone-caller test, whose sync fails), at
/// dense sequences shared with the threads', and a task spawned on that runtime
/// still runs.
#[test]
fn a_lone_async_caller_leads_on_its_own_worker_and_beside_threads_is_answered_once_its_record_is_in_the_log() {
    // A current-thread runtime, a multi-thread one with one worker, with two.
    for workers in [0, 1, 2] {
        let d = tempfile::tempdir().unwrap();
        let ledger = std::sync::Arc::new(Ledger::open(d.path(), LedgerOptions::default()).unwrap());
        let rt = if workers > 0 {
            tokio::runtime::Builder::new_multi_thread().worker_threads(workers).enable_all().build().unwrap()
        } else {
            tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap()
        };
        let owner = me();
        let each = 40u64;
        let lone = |first: u64, n: u64| {
            let (ledger, owner, dir) = (std::sync::Arc::clone(&ledger), owner.clone(), d.path().to_owned());
            async move {
                let mut seqs = vec![];
                for i in first..first + n {
                    let c = if i == 0 {
                        ledger.submit_as_async(None, None, claim("lone", &owner)).await.unwrap()
                    } else {
                        ledger.submit_as_async(None, None, heartbeat("lone")).await.unwrap()
                    };
                    let seq = c.seq.unwrap();
                    let on_disk = records(&dir).len() as u64;
                    assert!(on_disk >= seq, "answered {seq}, the log holds {on_disk}");
                    seqs.push(seq);
                }
                seqs
            }
        };
        let alone = rt.block_on(rt.spawn(lone(0, 5))).unwrap();
        assert_eq!(alone, [1, 2, 3, 4, 5]);
        let inline = ledger.inline_leads();
        let expected = if workers > 1 { (5, 0) } else { (0, 0) };
        assert_eq!((inline.led, inline.declined), expected, "alone, with {workers} workers");
        let mut seqs: Vec<u64> = std::thread::scope(|s| {
            let threads: Vec<_> = (0..2)
                .map(|t| {
                    let (ledger, owner) = (&ledger, &owner);
                    s.spawn(move || {
                        let subject = format!("thread/{t}");
                        let mut seqs = vec![ledger.submit(None, claim(&subject, owner)).unwrap().seq.unwrap()];
                        for _ in 1..each {
                            seqs.push(ledger.submit(None, heartbeat(&subject)).unwrap().seq.unwrap());
                        }
                        seqs
                    })
                })
                .collect();
            let beside = rt.block_on(rt.spawn(lone(5, each - 5))).unwrap();
            assert_eq!(rt.block_on(rt.spawn(async { 42 })).unwrap(), 42);
            let mut all: Vec<u64> = threads.into_iter().flat_map(|h| h.join().unwrap()).collect();
            all.extend(alone.iter().chain(&beside));
            all
        });
        seqs.sort_unstable();
        assert_eq!(seqs, (1..=3 * each).collect::<Vec<_>>(), "dense and distinct ({workers} workers)");
        assert_eq!(records(d.path()).len() as u64, 3 * each);
        let live = ledger.projection();
        drop(ledger);
        assert_eq!(Ledger::open(d.path(), LedgerOptions::default()).unwrap().projection(), live);
    }
}

/// Whether `done` comes to say so (asked until it does, never a fixed wait),
/// within a minute.
fn comes_true(mut done: impl FnMut() -> bool) -> bool {
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while !done() {
        if std::time::Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    true
}

/// A two-worker runtime (an async caller may lead on its own worker only where
/// another worker takes what is queued meanwhile) whose other worker is kept busy
/// by a task that blocks until this is dropped: what the test runs on it runs on
/// one worker, as if it had only that one.
struct OneFreeWorker {
    release: Option<std::sync::mpsc::Sender<()>>,
    rt: tokio::runtime::Runtime,
}

impl OneFreeWorker {
    fn new() -> OneFreeWorker {
        let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
        let (release, held) = std::sync::mpsc::channel::<()>();
        let (started_tx, started) = std::sync::mpsc::channel();
        rt.spawn(async move {
            started_tx.send(()).unwrap();
            let _ = held.recv(); // blocks this worker until released
        });
        started.recv().unwrap();
        OneFreeWorker { release: Some(release), rt }
    }
}

impl Drop for OneFreeWorker {
    fn drop(&mut self) {
        drop(self.release.take()); // the busy worker's task ends: the runtime can shut down
    }
}

/// Proves: a lone async caller whose lead finds the append lock held by another
/// writer (another open of the log, as another process) does not wait for it on
/// its runtime's only free worker (two workers, one kept busy: `OneFreeWorker`):
/// that lead declines (counted), the caller waits on
/// the blocking pool, and meanwhile a task spawned on the runtime runs — while
/// the lock is still held (the other writer's lock wait allowance here is ten
/// minutes: a worker waiting it out would run nothing). Once the lock is let go,
/// the caller is answered at the next sequence.
#[test]
fn a_lone_async_callers_lead_gives_its_worker_back_while_another_writer_holds_the_lock() {
    let d = tempfile::tempdir().unwrap();
    let patient = LedgerOptions {
        log: LogOptions { lock_wait_ms_max: 600_000, ..LogOptions::default() },
        ..LedgerOptions::default()
    };
    let a = std::sync::Arc::new(Ledger::open(d.path(), patient).unwrap());
    let b = Ledger::open(d.path(), LedgerOptions::default()).unwrap();
    let one_free = OneFreeWorker::new();
    let rt = &one_free.rt;
    let owner = me();
    let (held_tx, held_rx) = std::sync::mpsc::channel();
    let (release_tx, release_rx) = std::sync::mpsc::channel::<()>();
    std::thread::scope(|s| {
        let holder = s.spawn(|| {
            let mut other = Some(claim("other", &owner));
            b.submit(None, move |p, now, w| {
                // Judged holding the append lock: hold it until told.
                if let Some(c) = other.take() {
                    held_tx.send(()).unwrap();
                    release_rx.recv().unwrap();
                    return c(p, now, w);
                }
                claim("other", &me())(p, now, w)
            })
        });
        held_rx.recv().unwrap();
        let (a2, owner2) = (std::sync::Arc::clone(&a), owner.clone());
        let mine = rt.spawn(async move { a2.submit_as_async(None, None, claim("mine", &owner2)).await });
        let declined = comes_true(|| a.inline_leads().declined == 1);
        let (ping_tx, ping_rx) = std::sync::mpsc::channel();
        rt.spawn(async move { ping_tx.send(42).unwrap() });
        let ping = ping_rx.recv_timeout(Duration::from_secs(60));
        let still_waiting = !mine.is_finished();
        // Let go before asserting, so that a failure does not hang the holder.
        release_tx.send(()).unwrap();
        assert_eq!(holder.join().unwrap().unwrap().seq, Some(1));
        assert!(declined, "the lead on the worker never declined");
        assert_eq!(ping, Ok(42), "a task spawned while the lock was held did not run");
        assert!(still_waiting, "answered while the other writer held the lock");
        let c = rt.block_on(mine).unwrap().unwrap();
        assert_eq!(c.seq, Some(2));
    });
    let inline = a.inline_leads();
    assert_eq!((inline.led, inline.declined), (0, 1));
    assert_eq!(records(d.path()).len(), 2);
}

/// Proves: a lone async caller whose ledger is behind another writer's records —
/// 300 of them, then a single one — leaves the catch-up to a lead on the blocking
/// pool (the inline lead declines, nothing judged: on a directory the writer
/// reads nothing others appended on a runtime worker, however little), is
/// answered after them, and leads on its own thread again once caught up.
#[test]
fn a_lone_async_callers_lead_leaves_a_long_catch_up_to_the_pool() {
    let d = tempfile::tempdir().unwrap();
    let a = std::sync::Arc::new(Ledger::open(d.path(), LedgerOptions::default()).unwrap());
    let b = Ledger::open(d.path(), LedgerOptions::default()).unwrap();
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let owner = me();
    let submit = |subject: &str| {
        let (a, c) = (std::sync::Arc::clone(&a), claim(subject, &owner));
        rt.block_on(rt.spawn(async move { a.submit_as_async(None, None, c).await })).unwrap().unwrap().seq
    };
    assert_eq!(submit("first"), Some(1));
    let others = 300;
    std::thread::scope(|s| {
        for t in 0..4 {
            let (b, owner) = (&b, &owner);
            s.spawn(move || {
                for i in 0..others / 4 {
                    b.submit(None, claim(&format!("other/{t}/{i}"), owner)).unwrap();
                }
            });
        }
    });
    assert_eq!((a.inline_leads().led, a.inline_leads().declined), (1, 0));
    assert_eq!(submit("after"), Some(others + 2));
    assert_eq!((a.inline_leads().led, a.inline_leads().declined), (1, 1), "the long catch-up went to the pool");
    assert_eq!(submit("again"), Some(others + 3));
    assert_eq!((a.inline_leads().led, a.inline_leads().declined), (2, 1), "caught up: on its own thread again");
    assert!(a.projection().subject("other/3/74").is_some());
    assert_eq!(b.submit(None, claim("other/one", &owner)).unwrap().seq, Some(others + 4));
    assert_eq!(submit("after one"), Some(others + 5));
    assert_eq!((a.inline_leads().led, a.inline_leads().declined), (2, 2), "one record of another's: to the pool");
    assert_eq!(submit("again, caught up"), Some(others + 6));
    assert_eq!((a.inline_leads().led, a.inline_leads().declined), (3, 2));
    assert!(a.projection().subject("other/one").is_some());
}

/// Proves: a lone async caller whose leads run on its own worker still gets its
/// snapshots: one falling due there is taken by the next lead, on the blocking
/// pool (so not every lead is inline), and the log with them verifies intact.
#[test]
fn a_lone_async_callers_snapshots_are_taken_off_its_worker() {
    let d = tempfile::tempdir().unwrap();
    let opts = LedgerOptions { snapshot_every_records: 5, ..LedgerOptions::default() };
    let a = std::sync::Arc::new(Ledger::open(d.path(), opts).unwrap());
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let (a2, owner) = (std::sync::Arc::clone(&a), me());
    let n = 30u64;
    rt.block_on(rt.spawn(async move {
        a2.submit_as_async(None, None, claim("snap", &owner)).await.unwrap();
        for _ in 1..n {
            a2.submit_as_async(None, None, heartbeat("snap")).await.unwrap();
        }
    }))
    .unwrap();
    let inline = a.inline_leads();
    assert!(inline.led > 0 && inline.led < n, "{inline:?}: some leads on the worker, the snapshots' on the pool");
    assert_eq!(inline.declined, 0);
    drop(a);
    let snaps = std::fs::read_dir(d.path().join("snapshots")).unwrap().count();
    assert!(snaps > 0, "snapshots were taken");
    let (summary, code) =
        fencelog::inspect::verify_pinned(&fencelog::inspect::Source::Dir(d.path().to_path_buf()), &[]).unwrap();
    assert_eq!(code, 0, "{:?}", summary.problems);
}
