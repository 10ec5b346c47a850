//! The ledger's group commit: threads of one process submitting at once share syncs,
//! are still judged one after another against exactly the state they follow, and
//! never get an answer that rests on state that is not yet durable.

mod common;

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Barrier};

use common::records;
use fencelog::ledger::{Ledger, LedgerError, LedgerOptions, identity};
use fencelog::model::{Event, Identity, Projection, Refusal, Txn, decode_txn};
use fencelog::storage::{Faults, LogOptions};

fn me() -> Identity {
    identity::probe(std::process::id(), uuid::Uuid::new_v4()).unwrap()
}

fn claim(subject: &str, owner: &Identity) -> impl FnOnce(&Projection, u64, uuid::Uuid) -> Result<Txn, Refusal> {
    let (subject, owner) = (subject.to_owned(), owner.clone());
    move |_p, now_ms, writer| {
        Ok(Txn {
            request: None,
            time_ms: now_ms,
            writer,
            conditions: vec![],
            events: vec![Event::Claim { subject, owner, stale_after_ms: 60_000, lock: None, previous: None }],
        })
    }
}

fn heartbeat(subject: &str) -> impl FnOnce(&Projection, u64, uuid::Uuid) -> Result<Txn, Refusal> {
    let subject = subject.to_owned();
    move |p, now_ms, writer| {
        let generation = p.subject(&subject).expect("claimed").generation;
        Ok(Txn {
            request: None,
            time_ms: now_ms,
            writer,
            conditions: vec![],
            events: vec![Event::Heartbeat { subject, generation }],
        })
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
                assert!(on_disk >= p.last_seq, "projection at {} but the log holds {on_disk}", p.last_seq);
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
    let (appended, syncs) = ledger.commit_stats();
    assert_eq!(appended, total);
    assert!(syncs < appended / 2, "transactions must share syncs: {appended} records took {syncs} syncs");
    let live = ledger.projection();
    assert_eq!(live.subjects.len() as u64, threads);
    assert!(live.subjects.values().all(|s| s.generation == 1));
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
        let winners: Vec<uuid::Uuid> = results.iter().filter(|r| r.1.is_ok()).map(|r| r.0).collect();
        assert_eq!(winners.len(), 1, "round {round}");
        for (_, r) in results.iter().filter(|r| r.1.is_err()) {
            match r {
                Err(LedgerError::Refused(Refusal::AlreadyActive { instance, .. })) => {
                    assert_eq!(*instance, winners[0], "round {round}")
                }
                other => panic!("round {round}: expected ALREADY_ACTIVE, got {other:?}"),
            }
        }
    }
    let claims = records(d.path())
        .iter()
        .filter(|(_, p)| matches!(decode_txn(p).unwrap().events[0], Event::Claim { .. }))
        .count();
    assert_eq!(claims, 50, "one claim record per round");
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
                    ledger.submit(Some(("req-1".into(), [7u8; 32])), claim("dedup/a", owner)).unwrap()
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert!(results.iter().all(|c| c.seq == Some(1)), "{results:?}");
    assert_eq!(results.iter().filter(|c| !c.deduplicated).count(), 1, "{results:?}");
    assert_eq!(records(d.path()).len(), 1);
}

/// Proves: when the sync of a group fails, no transaction of it is acknowledged —
/// neither the claim nor the refusals judged against it — every later call fails
/// with WRITER_POISONED until reopen, and the reopened ledger works and holds every
/// transaction acknowledged before the failure.
#[test]
fn a_failed_sync_fails_every_transaction_judged_on_it_and_poisons_the_ledger() {
    let d = tempfile::tempdir().unwrap();
    let faults = Arc::new(Faults::default());
    let opts = LedgerOptions {
        log: LogOptions { faults: Some(faults.clone()), ..LogOptions::default() },
        ..Default::default()
    };
    let ledger = Ledger::open(d.path(), opts).unwrap();
    let owner = me();
    for i in 0..5 {
        ledger.submit(None, claim(&format!("before/{i}"), &owner)).unwrap();
    }
    faults.fail_sync_after(0);
    let barrier = Barrier::new(8);
    let results: Vec<Result<_, LedgerError>> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..8)
            .map(|_| {
                let (ledger, owner, barrier) = (&ledger, &owner, &barrier);
                s.spawn(move || {
                    barrier.wait();
                    ledger.submit(None, claim("contested", owner))
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for r in &results {
        match r {
            Err(LedgerError::Storage(_)) => {}
            other => panic!("nothing judged on a failed sync may be answered: {other:?}"),
        }
    }
    assert!(results.iter().any(|r| r.as_ref().is_err_and(|e| e.code() == "WRITER_POISONED")));
    let later = ledger.submit(None, claim("after", &owner)).unwrap_err();
    assert_eq!(later.code(), "WRITER_POISONED");
    assert_eq!(ledger.refresh().unwrap_err().code(), "WRITER_POISONED");
    drop(ledger);
    let reopened = Ledger::open(d.path(), LedgerOptions::default()).unwrap();
    let p = reopened.projection();
    for i in 0..5 {
        assert_eq!(p.subject(&format!("before/{i}")).map(|s| s.generation), Some(1));
    }
    let c = reopened.submit(None, claim("after", &owner)).unwrap();
    assert_eq!(c.seq, Some(p.last_seq + 1));
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
