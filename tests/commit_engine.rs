//! The one commit engine (`storage::commit`) as raw appenders see it: threads and
//! async tasks of one process share syncs, each hears its own sequences and chain
//! link, a full queue makes arrivals wait instead of failing, and (in
//! `failpoints.rs`) a failed sync fails every waiter of its group. The ledger's
//! transactions commit through the same engine (`ledger_group_commit.rs`).

mod common;

use std::collections::BTreeMap;
use std::sync::{Arc, Barrier};

use fencelog::storage::{Appended, Log, LogOptions, read_records};

/// Every record of the log as seq → (payload, chain link), verified.
fn links_and_payloads(dir: &std::path::Path) -> BTreeMap<u64, (Vec<u8>, [u8; 32])> {
    let mut out = BTreeMap::new();
    read_records(dir, 1, LogOptions::default().body_max(), |r| {
        out.insert(r.seq, (r.payload.to_vec(), r.link));
        true
    })
    .unwrap();
    out
}

/// Each acknowledged append names exactly the record(s) it wrote: the payload at
/// its first sequence is the caller's, its chain link is the log's link there, and
/// no two appends were given the same sequence.
fn check_answers(dir: &std::path::Path, answers: &[(Vec<u8>, Appended)]) {
    let log = links_and_payloads(dir);
    assert_eq!(log.len(), answers.len(), "every acknowledged record is in the log, nothing else");
    let mut seen = std::collections::BTreeSet::new();
    for (payload, a) in answers {
        assert_eq!(a.first_seq, a.last_seq);
        assert!(seen.insert(a.first_seq), "sequence {} given twice", a.first_seq);
        let (stored, link) = &log[&a.first_seq];
        assert_eq!(stored, payload, "record {} is not the caller's", a.first_seq);
        assert_eq!(&a.chain_head, link, "the chain link answered for {} is not the log's", a.first_seq);
    }
    assert_eq!(seen.into_iter().collect::<Vec<_>>(), (1..=answers.len() as u64).collect::<Vec<_>>());
}

/// `threads` threads (started together) each append `each` records; what each
/// append sent and was answered.
fn append_from_threads(log: &Log, threads: usize, each: usize) -> Vec<(Vec<u8>, Appended)> {
    let start = Barrier::new(threads);
    std::thread::scope(|s| {
        let hs: Vec<_> = (0..threads)
            .map(|t| {
                let start = &start;
                s.spawn(move || {
                    start.wait();
                    (0..each)
                        .map(|i| {
                            let p = format!("thread {t} append {i}").into_bytes();
                            (p.clone(), log.append(&p).unwrap())
                        })
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        hs.into_iter().flat_map(|h| h.join().unwrap()).collect()
    })
}

/// Proves: sixteen threads appending at once share syncs (fewer syncs than
/// records) and each hears its own sequence and chain link.
#[test]
fn concurrent_threads_share_syncs_and_each_hears_its_own_record() {
    let d = tempfile::tempdir().unwrap();
    let log = Log::open(d.path(), LogOptions::default()).unwrap();
    let (threads, each) = (16, 40);
    let answers = append_from_threads(&log, threads, each);
    let fencelog::storage::CommitStats { records: appended, syncs } = log.commit_stats();
    assert_eq!(appended, (threads * each) as u64);
    assert!(syncs < appended, "no group commit: {syncs} syncs for {appended} records");
    log.close().unwrap();
    check_answers(d.path(), &answers);
}

/// Proves: async tasks wait for their sync without a thread each — 256 tasks on a
/// two-worker runtime — and, mixed with threads on the same log, every task and
/// thread hears its own sequence and chain link.
#[test]
fn async_tasks_and_threads_append_through_the_same_groups() {
    let d = tempfile::tempdir().unwrap();
    let log = Arc::new(Log::open(d.path(), LogOptions::default()).unwrap());
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let (tasks, each) = (256, 4);
    let from_threads = std::thread::scope(|s| {
        let threads = s.spawn(|| append_from_threads(&log, 4, 50));
        let from_tasks: Vec<(Vec<u8>, Appended)> = rt.block_on(async {
            let hs: Vec<_> = (0..tasks)
                .map(|t| {
                    let log = log.clone();
                    tokio::spawn(async move {
                        let mut out = vec![];
                        for i in 0..each {
                            let p = format!("task {t} append {i}").into_bytes();
                            out.push((p.clone(), log.append_async(p).await.unwrap()));
                        }
                        out
                    })
                })
                .collect();
            let mut all = vec![];
            for h in hs {
                all.extend(h.await.unwrap());
            }
            all
        });
        let mut all = threads.join().unwrap();
        all.extend(from_tasks);
        all
    });
    assert_eq!(from_threads.len(), 4 * 50 + tasks * each);
    let fencelog::storage::CommitStats { records: appended, syncs } = log.commit_stats();
    assert!(syncs < appended, "no group commit: {syncs} syncs for {appended} records");
    check_answers(d.path(), &from_threads);
}

/// Proves: the queue is bounded and a full queue is back-pressure, not failure —
/// with room for two queued records, eight threads' appends all land, in order,
/// each once.
#[test]
fn a_full_queue_makes_arrivals_wait_and_nothing_is_lost() {
    let d = tempfile::tempdir().unwrap();
    let log = Log::open(d.path(), LogOptions { queue_depth_max: 2, ..LogOptions::default() }).unwrap();
    let answers = append_from_threads(&log, 8, 25);
    log.close().unwrap();
    check_answers(d.path(), &answers);
}

/// Proves: a batch is acknowledged with its own first and last sequence even when
/// the engine splits it over two groups (the group limit is smaller than the
/// batch): every record of every batch is where its answer says.
#[test]
fn batches_split_over_groups_keep_their_sequences() {
    let d = tempfile::tempdir().unwrap();
    let opts = LogOptions { batch_records_max: 8, ..LogOptions::default() };
    let log = Log::open(d.path(), opts).unwrap();
    let batches: Vec<(Vec<Vec<u8>>, Appended)> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..4)
            .map(|t| {
                let log = &log;
                s.spawn(move || {
                    (0..10)
                        .map(|i| {
                            let batch: Vec<Vec<u8>> = (0..5).map(|j| format!("{t}/{i}/{j}").into_bytes()).collect();
                            (batch.clone(), log.append_batch(batch).unwrap())
                        })
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        hs.into_iter().flat_map(|h| h.join().unwrap()).collect()
    });
    let stored = links_and_payloads(d.path());
    assert_eq!(stored.len(), 4 * 10 * 5);
    for (batch, a) in &batches {
        assert_eq!(a.last_seq - a.first_seq + 1, batch.len() as u64);
        for (k, p) in batch.iter().enumerate() {
            assert_eq!(&stored[&(a.first_seq + k as u64)].0, p);
        }
        assert_eq!(a.chain_head, stored[&a.last_seq].1);
    }
}

/// Poll a future to completion on this thread, with no runtime around it.
fn poll_without_runtime<F: std::future::Future>(f: F) -> F::Output {
    let mut f = std::pin::pin!(f);
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    loop {
        if let std::task::Poll::Ready(out) = f.as_mut().poll(&mut cx) {
            return out;
        }
        std::thread::yield_now();
    }
}

/// Proves: an async append that must lead but cannot start its blocking thread
/// (here: no tokio runtime, so the spawn panics) wedges nothing — threads append
/// afterwards, and async appends in a runtime are not left waiting for a leader
/// that never started.
#[test]
fn an_async_lead_that_never_starts_holds_up_no_one() {
    let d = tempfile::tempdir().unwrap();
    let log = Arc::new(Log::open(d.path(), LogOptions::default()).unwrap());
    let outside = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        poll_without_runtime(log.append_async(b"no runtime".to_vec()))
    }));
    assert!(outside.is_err(), "leading needs a runtime's blocking pool");
    assert_eq!(log.append(b"from a thread").unwrap().first_seq, 1);
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let answers = rt.block_on(async {
        let hs: Vec<_> = (0..8)
            .map(|i| {
                let log = log.clone();
                tokio::spawn(async move {
                    let p = format!("task {i}").into_bytes();
                    let a = tokio::time::timeout(std::time::Duration::from_secs(30), log.append_async(p.clone()))
                        .await
                        .expect("an async append waited for a leader that never started")
                        .unwrap();
                    (p, a)
                })
            })
            .collect();
        let mut all = vec![(b"from a thread".to_vec(), Appended { first_seq: 1, last_seq: 1, chain_head: [0; 32] })];
        for h in hs {
            all.push(h.await.unwrap());
        }
        all
    });
    let stored = links_and_payloads(d.path());
    assert_eq!(stored.len(), 9);
    for (p, a) in &answers[1..] {
        assert_eq!(&stored[&a.first_seq].0, p);
    }
}

/// Proves (review): a panic in a `with_lock` closure leaves the log poisoned —
/// later appends hear WRITER_POISONED (the tail may be half-changed), they do not
/// panic — and reopening recovers.
#[test]
fn a_panic_while_the_tail_is_held_poisons_the_log_and_reopen_recovers() {
    let d = tempfile::tempdir().unwrap();
    let log = Log::open(d.path(), LogOptions::default()).unwrap();
    log.append(b"one").unwrap();
    let panicked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        log.with_lock(|_| -> () { panic!("a closure panicked holding the lock") })
    }));
    assert!(panicked.is_err());
    for _ in 0..2 {
        let err = log.append(b"later").unwrap_err();
        assert_eq!(err.code(), "WRITER_POISONED", "{err}");
    }
    drop(log);
    let log = Log::open(d.path(), LogOptions::default()).unwrap();
    assert_eq!(log.append(b"two").unwrap().first_seq, 2);
}
