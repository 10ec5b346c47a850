//! The ledger over its backend seam: the same scenarios on the file backend, the
//! in-memory backend and a real 3-member etcd cluster on loopback (the proof that
//! nothing above `storage::LogBackend` relies on files or on a lock held across
//! round trips), and what only an optimistic
//! backend shows: writers that overtake each other (`HeadMoved`) get the answer for
//! the state their transaction actually follows.

mod common;

use std::collections::BTreeSet;
use std::sync::Arc;

use common::{claim, me};
use fencelog::ledger::{Ledger, LedgerError, LedgerOptions};
use fencelog::model::{Event, Projection, Refusal, Txn};
use fencelog::storage::{FileBackend, LogBackend, MemoryBackend};

fn heartbeat(subject: &str) -> impl FnMut(&Projection, u64, uuid::Uuid) -> Result<Txn, Refusal> {
    let subject = subject.to_owned();
    move |p, now_ms, writer| {
        let generation = p.subject(&subject).expect("claimed").generation;
        Ok(Txn::new(now_ms, writer, vec![Event::Heartbeat { subject: subject.clone(), generation }]))
    }
}

/// A backend to run a scenario on, and a way to open it again (a "restart").
struct Fixture {
    _dir: Option<tempfile::TempDir>,
    open: Box<dyn Fn() -> Arc<dyn LogBackend>>,
}

fn file() -> Fixture {
    let d = tempfile::tempdir().unwrap();
    let path = d.path().to_path_buf();
    Fixture {
        _dir: Some(d),
        open: Box::new(move || Arc::new(FileBackend::open(&path, Default::default()).unwrap()) as Arc<dyn LogBackend>),
    }
}

fn memory() -> Fixture {
    let m = MemoryBackend::new();
    Fixture { _dir: None, open: Box::new(move || Arc::new(m.another_writer()) as Arc<dyn LogBackend>) }
}

/// A fresh prefix on the binary's shared 3-member etcd cluster; "restart" opens
/// it again (a new writer identity, a fresh connection).
fn etcd() -> Fixture {
    use fencelog::storage::etcd::{EtcdBackend, EtcdOptions};
    let opts = EtcdOptions::parse(&common::etcd::shared().endpoints, &common::etcd::fresh_prefix("ledger")).unwrap();
    EtcdBackend::init(&opts).unwrap();
    let loc = fencelog::storage::Location::Etcd(opts.clone());
    Fixture {
        _dir: None,
        open: Box::new(move || {
            let log = loc.log_options(Default::default());
            Arc::new(EtcdBackend::open(&opts, &log).unwrap()) as Arc<dyn LogBackend>
        }),
    }
}

fn ledger(f: &Fixture) -> Ledger {
    Ledger::with_backend((f.open)(), LedgerOptions::default()).unwrap()
}

/// 16 threads × 20 transactions through one ledger: dense distinct sequences, and
/// a restart replays to the same projection.
fn threads_commit_dense_sequences_and_replay_agrees(f: Fixture) {
    let l = ledger(&f);
    let owner = me();
    let seqs: Vec<u64> = std::thread::scope(|s| {
        let workers: Vec<_> = (0..16)
            .map(|t| {
                let (l, owner) = (&l, &owner);
                s.spawn(move || {
                    let subject = format!("t{t}");
                    let mut seqs = vec![l.submit(None, claim(&subject, owner)).unwrap().seq.unwrap()];
                    for _ in 1..20 {
                        seqs.push(l.submit(None, heartbeat(&subject)).unwrap().seq.unwrap());
                    }
                    seqs
                })
            })
            .collect();
        workers.into_iter().flat_map(|w| w.join().unwrap()).collect()
    });
    let unique: BTreeSet<u64> = seqs.iter().copied().collect();
    assert_eq!(unique, (1..=320).collect::<BTreeSet<u64>>());
    let live = l.projection();
    drop(l);
    assert_eq!(ledger(&f).projection(), live);
}

/// 12 threads race for one subject, 20 rounds: exactly one winner; every other is
/// refused ALREADY_ACTIVE naming it.
fn racing_claims_have_exactly_one_winner(f: Fixture) {
    let l = ledger(&f);
    for round in 0..20 {
        let subject = format!("race/{round}");
        let results: Vec<_> = std::thread::scope(|s| {
            let hs: Vec<_> = (0..12).map(|_| s.spawn(|| l.submit(None, claim(&subject, &me())))).collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        let winners = results.iter().filter(|r| r.is_ok()).count();
        assert_eq!(winners, 1, "round {round}");
        for r in results.iter().filter_map(|r| r.as_ref().err()) {
            assert!(matches!(r, LedgerError::Refused(Refusal::AlreadyActive { .. })), "{r}");
        }
    }
}

/// One request id from 8 threads commits once; every caller gets that result.
fn one_request_id_commits_once(f: Fixture) {
    let l = ledger(&f);
    let owner = me();
    let results: Vec<_> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..8)
            .map(|_| {
                s.spawn(|| {
                    l.submit(
                        Some(fencelog::model::RequestTag { id: "req-1".into(), digest: [7; 32] }),
                        claim("idem", &owner),
                    )
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap().unwrap()).collect()
    });
    assert!(results.iter().all(|c| c.seq == Some(1)));
    assert_eq!(results.iter().filter(|c| !c.deduplicated).count(), 1);
    assert_eq!(l.projection().last_seq(), 1);
}

/// A snapshot written through the backend is vouched for by its checkpoint and
/// adopted after a restart; the projection equals a full replay's.
fn snapshots_go_through_the_backend(f: Fixture) {
    let l = ledger(&f);
    let owner = me();
    for i in 0..30 {
        l.submit(None, claim(&format!("s/{i}"), &owner)).unwrap();
    }
    l.snapshot_now().unwrap();
    l.submit(None, claim("after", &owner)).unwrap();
    let live = l.projection();
    drop(l);
    let again = ledger(&f);
    let r = again.open_report();
    assert_eq!((r.snapshot_seq, r.replayed_records), (Some(30), 2), "{r:?}");
    assert_eq!(again.projection(), live);
}

macro_rules! on_every_backend {
    ($($scenario:ident),*) => {
        mod file_backend {
            $( #[test] fn $scenario() { super::$scenario(super::file()) } )*
        }
        mod memory_backend {
            $( #[test] fn $scenario() { super::$scenario(super::memory()) } )*
        }
        mod etcd_backend {
            $( #[test] fn $scenario() { super::$scenario(super::etcd()) } )*
        }
    };
}

on_every_backend!(
    threads_commit_dense_sequences_and_replay_agrees,
    racing_claims_have_exactly_one_winner,
    one_request_id_commits_once,
    snapshots_go_through_the_backend,
    a_drained_ledger_closes_and_its_snapshot_is_adopted,
    an_undecodable_record_met_while_catching_up_is_refused_every_time_after,
    a_panic_while_the_ledger_is_held_poisons_it
);

/// Proves: two ledgers (two writers) on one log with no lock between them (in
/// memory, and in etcd: two hosts' writers) — so they overtake each other and see
/// `HeadMoved` — racing to claim the same subjects: exactly one claim of each
/// subject lands; every loser is refused ALREADY_ACTIVE naming the winner, judged on
/// the state its transaction actually follows (the other writer's claim included);
/// both ledgers end at the log's state.
fn writers_that_overtake_each_other_are_judged_again_on_the_state_they_follow(f: Fixture) {
    let a = ledger(&f);
    let b = ledger(&f);
    let owner = me();
    // Race in batches until the two writers have overtaken each other at least
    // once (bounded): the test must exercise the path it is about. The two start
    // each claim together (a barrier): on a loaded machine, threads left alone
    // often run their batches one after the other and never race.
    let (mut next, batch) = (0u64, 40u64);
    let together = std::sync::Barrier::new(2);
    while a.head_moved_count() + b.head_moved_count() == 0 && next < 20_000 {
        let run = |l: &Ledger| -> Vec<Result<u64, String>> {
            (next..next + batch)
                .map(|i| {
                    together.wait();
                    match l.submit(None, claim(&format!("x/{i}"), &owner)) {
                        Ok(c) => Ok(c.seq.unwrap()),
                        Err(LedgerError::Refused(Refusal::AlreadyActive { generation: 1, .. })) => Err("lost".into()),
                        Err(e) => panic!("unexpected {e}"),
                    }
                })
                .collect()
        };
        let outcomes: Vec<Vec<Result<u64, String>>> = std::thread::scope(|s| {
            let ha = s.spawn(|| run(&a));
            let hb = s.spawn(|| run(&b));
            vec![ha.join().unwrap(), hb.join().unwrap()]
        });
        for i in 0..batch as usize {
            let won = outcomes.iter().filter(|o| o[i].is_ok()).count();
            assert_eq!(won, 1, "subject x/{}: {:?} / {:?}", next + i as u64, outcomes[0][i], outcomes[1][i]);
        }
        let seqs: BTreeSet<u64> = outcomes.iter().flatten().filter_map(|r| r.as_ref().ok().copied()).collect();
        assert_eq!(seqs, (next + 1..=next + batch).collect::<BTreeSet<u64>>(), "one record per subject, dense");
        next += batch;
    }
    assert!(a.head_moved_count() + b.head_moved_count() > 0, "the writers never overtook each other");
    let pa = a.refresh().unwrap();
    let pb = b.refresh().unwrap();
    assert_eq!(pa, pb);
    assert_eq!(pa.last_seq(), next);
    let fresh = ledger(&f);
    assert_eq!(fresh.projection(), pa);
}

/// Proves: a writer whose state is behind another writer's records never answers
/// from it. Writer B last looked when A held a subject; A released it and took
/// another (and rotated its fence). B's claim of the first is committed — never
/// refused ALREADY_ACTIVE from what B last saw, a refusal that appends nothing —
/// and B's claim of the second is refused naming A's current tenure — never
/// committed over it. (On an optimistic backend B does not read before judging:
/// a read of the head before an answer that appends nothing, or the append's
/// compare, finds what A wrote.)
fn a_writer_behind_another_never_answers_from_what_it_last_saw(f: Fixture) {
    let owner = me();
    let a = ledger(&f);
    a.submit(None, claim("first", &owner)).unwrap();
    // B reads the log when it opens, then only writes: it has met no other
    // writer's records since.
    let b = ledger(&f);
    b.submit(None, claim("mine", &owner)).unwrap();
    let generation = |l: &Ledger, s: &str| l.refresh().unwrap().subject(s).map(|x| x.generation);
    a.submit(None, |_, t, w| Ok(Txn::new(t, w, vec![Event::Release { subject: "first".into(), generation: 1 }])))
        .unwrap();
    a.submit(None, claim("second", &owner)).unwrap();
    a.submit(None, |_, t, w| Ok(Txn::new(t, w, vec![Event::RotateFence { subject: "second".into(), generation: 1 }])))
        .unwrap();
    let c = b.submit(None, claim("first", &owner)).expect("free since A released it");
    assert!(c.seq.is_some());
    match b.submit(None, claim("second", &owner)) {
        Err(LedgerError::Refused(Refusal::AlreadyActive { generation: 2, .. })) => {}
        other => panic!("judged on what B last saw: {other:?}"),
    }
    assert_eq!(generation(&a, "first"), Some(2));
    assert_eq!(generation(&b, "second"), Some(2));
}

/// Proves: `drain` (the daemon's cutover) refuses new transactions with DRAINING
/// and lets every transaction already judged finish: afterwards each submission of
/// 8 threads (submitting until refused) has a known answer — committed (and its
/// request id is in the log) or DRAINING (and its request id never committed) —
/// and the ledger is settled at the log's last sequence.
#[test]
fn draining_refuses_new_transactions_and_settles_every_judged_one() {
    use std::sync::atomic::{AtomicU64, Ordering};
    for f in [file(), memory(), etcd()] {
        let l = ledger(&f);
        let owner = me();
        let committed_so_far = AtomicU64::new(0);
        let answers: Vec<(String, Result<u64, String>)> = std::thread::scope(|s| {
            let workers: Vec<_> = (0..8)
                .map(|t| {
                    let (l, owner, count) = (&l, &owner, &committed_so_far);
                    s.spawn(move || {
                        let mut out = vec![];
                        for i in 0..5_000 {
                            let id = format!("r-{t}-{i}");
                            let r = l.submit(
                                Some(fencelog::model::RequestTag { id: id.clone(), digest: [t as u8; 32] }),
                                claim(&format!("d/{t}/{i}"), owner),
                            );
                            let refused = r.is_err();
                            count.fetch_add(u64::from(!refused), Ordering::Relaxed);
                            out.push((id, r.map(|c| c.seq.unwrap()).map_err(|e| e.code().to_string())));
                            if refused {
                                break;
                            }
                        }
                        out
                    })
                })
                .collect();
            while committed_so_far.load(Ordering::Relaxed) < 50 {
                std::thread::yield_now();
            }
            let drained = l.drain(5_000).unwrap();
            assert!(drained.settled);
            workers.into_iter().flat_map(|w| w.join().unwrap()).collect()
        });
        let refused = answers.iter().filter(|(_, r)| r.as_ref().is_err_and(|c| c == "DRAINING")).count();
        assert_eq!(refused, 8, "every worker was refused once, mid-way");
        let p = l.projection();
        for (id, r) in &answers {
            match r {
                Ok(seq) => assert_eq!(p.requests().get(id.as_str()).map(|e| e.seq), Some(*seq), "{id}"),
                Err(code) => {
                    assert_eq!(code, "DRAINING");
                    assert!(!p.requests().contains_key(id.as_str()), "{id} was refused yet committed");
                }
            }
        }
        let committed = answers.iter().filter(|(_, r)| r.is_ok()).count() as u64;
        assert_eq!(p.last_seq(), committed, "nothing else was appended");
    }
}

/// Proves (review): background snapshots taken while 32 threads commit in groups
/// are of durable state only: `inspect verify` finds every snapshot equal to a
/// replay of the log up to its sequence, and a reopen finds none the log does not
/// hold. (A race: before the fix it failed 2 runs in 5 here.)
#[test]
fn background_snapshots_under_concurrency_cover_durable_state_only() {
    let d = tempfile::tempdir().unwrap();
    let opts = LedgerOptions { snapshot_every_records: 7, ..LedgerOptions::default() };
    let l = Ledger::open(d.path(), opts.clone()).unwrap();
    let owner = me();
    std::thread::scope(|s| {
        for t in 0..32 {
            let (l, owner) = (&l, &owner);
            s.spawn(move || {
                let subject = format!("snap/{t}");
                l.submit(None, claim(&subject, owner)).unwrap();
                for _ in 0..100 {
                    l.submit(None, heartbeat(&subject)).unwrap();
                }
            });
        }
    });
    drop(l); // not `close`: the newest snapshots on disk are background ones
    let snaps = std::fs::read_dir(d.path().join("snapshots")).unwrap().count();
    assert!(snaps > 0, "snapshots were taken");
    let (summary, code) =
        fencelog::inspect::verify_pinned(&fencelog::inspect::Source::Dir(d.path().to_path_buf()), &[]).unwrap();
    assert_eq!(code, 0, "{:?}", summary.problems);
    let again = Ledger::open(d.path(), opts).unwrap();
    let r = again.open_report();
    assert!(!r.snapshot_warnings.iter().any(|w| w.contains("does not hold")), "{r:?}");
}

/// Proves (review): with several threads on each of two ledgers overtaking each
/// other on one log without a lock (in memory, in etcd) (several groups per leader, `HeadMoved` among them),
/// no transaction is appended twice and no caller is refused by its own claim:
/// every acknowledged claim is in the log exactly once, and the log holds no claim
/// that nobody acknowledged.
fn several_threads_per_writer_overtaking_never_append_twice(f: Fixture) {
    let ledgers: Vec<Ledger> = (0..2).map(|_| ledger(&f)).collect();
    let owner = me();
    let mut acked: Vec<(String, u64)> = vec![];
    // Batches until the writers have overtaken each other (bounded): the test must
    // exercise the path it is about.
    for batch in 0..50 {
        if ledgers.iter().map(Ledger::head_moved_count).sum::<u64>() > 0 {
            break;
        }
        acked.extend(std::thread::scope(|s| {
            let hs: Vec<_> = (0..2)
                .flat_map(|w| (0..6).map(move |t| (w, t)))
                .map(|(w, t)| {
                    let (l, owner) = (&ledgers[w], &owner);
                    s.spawn(move || {
                        let mut acked = vec![];
                        for i in 0..40 {
                            // Half contested across writers, half private to this thread.
                            let subject = if i % 2 == 0 {
                                format!("shared/{batch}/{i}")
                            } else {
                                format!("own/{batch}/{w}/{t}/{i}")
                            };
                            match l.submit(None, claim(&subject, owner)) {
                                Ok(c) => acked.push((subject, c.seq.unwrap())),
                                Err(LedgerError::Refused(Refusal::AlreadyActive { .. })) => {
                                    assert!(subject.starts_with("shared/"), "{subject} refused by its own claim")
                                }
                                Err(e) => panic!("{subject}: {e}"),
                            }
                        }
                        acked
                    })
                })
                .collect();
            hs.into_iter().flat_map(|h| h.join().unwrap()).collect::<Vec<_>>()
        }));
    }
    assert!(ledgers.iter().map(Ledger::head_moved_count).sum::<u64>() > 0, "the writers overtook each other");
    let mut in_log: Vec<(String, u64)> = vec![];
    (f.open)()
        .reader(1)
        .poll(&mut |r| {
            for e in fencelog::model::decode_txn(r.payload).unwrap().events {
                if let Event::Claim { subject, .. } = e {
                    in_log.push((subject, r.seq));
                }
            }
        })
        .unwrap();
    let mut acked_sorted = acked.clone();
    acked_sorted.sort_by_key(|(_, seq)| *seq);
    assert_eq!(in_log, acked_sorted, "exactly the acknowledged claims, once each");
}

/// Proves (review): a drained ledger still closes cleanly — its own records (the
/// closing snapshot's checkpoint) are admitted — and the snapshot is adopted next
/// (on every backend: the snapshot goes through the backend).
fn a_drained_ledger_closes_and_its_snapshot_is_adopted(f: Fixture) {
    let l = ledger(&f);
    l.submit(None, claim("c", &me())).unwrap();
    assert!(l.drain(1_000).unwrap().settled);
    assert!(matches!(l.submit(None, claim("d", &me())), Err(LedgerError::Draining)));
    l.close().unwrap();
    let again = ledger(&f);
    assert_eq!(again.open_report().snapshot_seq, Some(1));
}

/// A backend that forwards to an in-memory log but whose every append finds the
/// head moved (as if another writer always got there first).
struct AlwaysOvertaken(MemoryBackend);

impl LogBackend for AlwaysOvertaken {
    fn head(&self) -> fencelog::storage::Result<fencelog::storage::Head> {
        self.0.head()
    }
    fn reader(&self, from_seq: u64) -> Box<dyn fencelog::storage::RecordReader> {
        self.0.reader(from_seq)
    }
    fn append_if_head(
        &self,
        _expect_seq: u64,
        _payloads: Vec<Vec<u8>>,
    ) -> fencelog::storage::Result<fencelog::storage::AppendOutcome> {
        Ok(fencelog::storage::AppendOutcome::HeadMoved { actual: self.0.head()?.seq })
    }
    fn exclusive(
        &self,
        _give_up: &dyn Fn() -> bool,
        f: &mut dyn FnMut(&mut dyn fencelog::storage::Exclusive) -> fencelog::storage::Result<()>,
    ) -> fencelog::storage::Result<()> {
        struct Plain<'a>(&'a AlwaysOvertaken);
        impl fencelog::storage::Exclusive for Plain<'_> {
            fn append_if_head(
                &mut self,
                e: u64,
                p: Vec<Vec<u8>>,
            ) -> fencelog::storage::Result<fencelog::storage::AppendOutcome> {
                self.0.append_if_head(e, p)
            }
        }
        f(&mut Plain(self))
    }
    fn put_snapshot(
        &self,
        seq: u64,
        head: &fencelog::format::ChainLink,
        body: &[u8],
    ) -> fencelog::storage::Result<fencelog::storage::snapshots::SnapshotMeta> {
        self.0.put_snapshot(seq, head, body)
    }
    fn newest_snapshots(&self) -> (Vec<fencelog::storage::snapshots::SnapshotMeta>, Vec<String>) {
        self.0.newest_snapshots()
    }
    fn snapshot_body(&self, meta: &fencelog::storage::snapshots::SnapshotMeta) -> Result<Vec<u8>, String> {
        self.0.snapshot_body(meta)
    }
    fn writer_id(&self) -> uuid::Uuid {
        self.0.writer_id()
    }
    fn open_report(&self) -> fencelog::storage::OpenReport {
        self.0.open_report()
    }
}

/// Proves: the retries after `HeadMoved` are bounded: a writer that is overtaken
/// every time gets HEAD_MOVED after `HEAD_MOVED_RETRIES_MAX` judgements, with
/// nothing appended, and the ledger is not poisoned by it.
#[test]
fn a_writer_overtaken_every_time_gives_up_after_the_bound_with_head_moved() {
    let l = Ledger::with_backend(Arc::new(AlwaysOvertaken(MemoryBackend::new())), LedgerOptions::default()).unwrap();
    let mut judged = 0u32;
    let owner = me();
    let mut build = claim("never", &owner);
    let err = l
        .submit(None, |p, t, w| {
            judged += 1;
            build(p, t, w)
        })
        .unwrap_err();
    assert_eq!(err.code(), "HEAD_MOVED", "{err}");
    assert_eq!(judged, fencelog::ledger::HEAD_MOVED_RETRIES_MAX);
    assert_eq!(l.head_moved_count(), u64::from(fencelog::ledger::HEAD_MOVED_RETRIES_MAX));
    assert_eq!(l.projection().last_seq(), 0, "nothing appended, the ledger still answers");
}

/// Proves: booting from a snapshot with a tail longer than the ledger keeps in
/// memory while vouching (more than 200,000 records) reads the tail again and
/// reaches the same state as a full replay.
#[test]
fn a_long_tail_after_a_snapshot_is_read_again_and_gives_the_full_replay_state() {
    let d = tempfile::tempdir().unwrap();
    let l = Ledger::open(d.path(), LedgerOptions::default()).unwrap();
    let owner = me();
    l.submit(None, claim("long", &owner)).unwrap();
    l.snapshot_now().unwrap();
    drop(l);
    // 200,001 heartbeats appended as raw records (fast), all valid transactions.
    let log = fencelog::storage::Log::open(d.path(), fencelog::storage::LogOptions::default()).unwrap();
    let beat = fencelog::model::encode_txn(&Txn::new(
        1,
        uuid::Uuid::nil(),
        vec![Event::Heartbeat { subject: "long".into(), generation: 1 }],
    ));
    let mut left = 200_001usize;
    while left > 0 {
        let n = left.min(4096);
        log.append_batch(vec![beat.clone(); n]).unwrap();
        left -= n;
    }
    drop(log);
    let booted = Ledger::open(d.path(), LedgerOptions::default()).unwrap();
    let r = booted.open_report().clone();
    assert_eq!((r.snapshot_seq, r.replayed_records), (Some(1), 200_002), "{r:?}");
    let from_snapshot = booted.projection();
    drop(booted);
    std::fs::remove_dir_all(d.path().join("snapshots")).unwrap();
    std::fs::create_dir(d.path().join("snapshots")).unwrap();
    let full = Ledger::open(d.path(), LedgerOptions::default()).unwrap();
    assert_eq!(full.open_report().snapshot_seq, None);
    assert_eq!(full.projection(), from_snapshot);
}

/// Proves (review): a live ledger that meets a record it cannot decode — appended
/// by another writer after it opened (on every backend: another process on the
/// directory, another host on etcd) — refuses every later answer, rather than
/// answering from a projection that silently lacks that record (the reader has
/// moved past it, so a second catch-up would find "nothing new").
fn an_undecodable_record_met_while_catching_up_is_refused_every_time_after(f: Fixture) {
    let l = ledger(&f);
    l.submit(None, claim("a", &me())).unwrap();
    let other = (f.open)();
    let head = other.head().unwrap().seq;
    let appended = other.append_if_head(head, vec![b"\xff\xff\xff not a transaction".to_vec()]).unwrap();
    assert!(matches!(appended, fencelog::storage::AppendOutcome::Appended(_)), "{appended:?}");
    drop(other);
    let err = l.refresh().expect_err("refused");
    assert_eq!(err.code(), "CORRUPTION", "{err}");
    // Afterwards the ledger is poisoned, and says by what.
    for _ in 0..3 {
        let err = l.refresh().expect_err("refused");
        assert_eq!(err.code(), "WRITER_POISONED", "{err}");
        assert!(err.to_string().contains("record 2 does not decode"), "{err}");
    }
    let err = l.submit(None, claim("b", &me())).expect_err("refused");
    assert_eq!(err.code(), "WRITER_POISONED", "{err}");
}

/// Proves (review): a panic while the ledger's state is held outside a commit
/// group (here: in a `refresh_with` closure) poisons the ledger; later calls hear
/// WRITER_POISONED instead of being judged on state that may be half-changed.
fn a_panic_while_the_ledger_is_held_poisons_it(f: Fixture) {
    let l = ledger(&f);
    l.submit(None, claim("a", &me())).unwrap();
    let panicked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        l.refresh_with(|_| -> () { panic!("a reader's closure panicked") })
    }));
    assert!(panicked.is_err());
    let err = l.submit(None, claim("b", &me())).expect_err("refused");
    assert_eq!(err.code(), "WRITER_POISONED", "{err}");
}

/// The scenarios only a log without a lock between writers shows.
mod optimistic {
    macro_rules! on_memory_and_etcd {
        ($($scenario:ident),*) => {
            mod memory_backend {
                $( #[test] fn $scenario() { super::super::$scenario(super::super::memory()) } )*
            }
            mod etcd_backend {
                $( #[test] fn $scenario() { super::super::$scenario(super::super::etcd()) } )*
            }
        };
    }
    on_memory_and_etcd!(
        writers_that_overtake_each_other_are_judged_again_on_the_state_they_follow,
        a_writer_behind_another_never_answers_from_what_it_last_saw,
        several_threads_per_writer_overtaking_never_append_twice
    );
}
