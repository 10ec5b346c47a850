//! Failure injection at every I/O site (the `fail` crate; compiled in for `cargo
//! test` only). Each test proves the outcome of one failure branch: the writer is
//! poisoned (or the operation fails cleanly), nothing acknowledged is lost, the
//! error has a clear code, and reopening recovers. Failpoints are global to a
//! process, so these tests live in their own binary and each holds a
//! `FailScenario` (which serialises them); child processes take theirs from the
//! `FAILPOINTS` environment variable.

mod common;

use std::fs;
use std::process::Command;
use std::sync::Barrier;

use common::{claim, hash_tree, me, records};
use fencelog::ledger::{Ledger, LedgerError, LedgerOptions};
use fencelog::storage::{Log, LogOptions, segment_path, verify_dir};

/// Proves: a write that fails part way (20 bytes of the frame on disk) is cut back
/// at once, under the append lock — `NOT_COMMITTED`, the segment holds exactly what
/// it held before — and the writer is poisoned (every later append fails with
/// WRITER_POISONED) until reopen, which finds nothing to cut.
#[test]
fn a_write_that_fails_part_way_is_cut_back_and_not_committed() {
    let d = tempfile::tempdir().unwrap();
    let _fp = fail::FailScenario::setup();
    let log = Log::open(d.path(), LogOptions::default()).unwrap();
    log.append(b"one").unwrap();
    log.append(b"two").unwrap();
    let written = common::written_bytes(&segment_path(d.path(), 1));
    fail::cfg("segment::write", "return(20)").unwrap();
    let err = log.append(b"three").unwrap_err();
    assert_eq!(err.code(), "NOT_COMMITTED", "{err}");
    assert!(err.to_string().contains("injected write failure"), "{err}");
    let after = std::fs::read(segment_path(d.path(), 1)).unwrap();
    assert_eq!(&after[..], &written[..written.len() - fencelog::format::FRAMES_END_MARK.len()], "cut to the frames");
    for _ in 0..3 {
        let err = log.append(b"later").unwrap_err();
        assert_eq!(err.code(), "WRITER_POISONED", "{err}");
        assert!(err.to_string().contains("injected write failure"));
    }
    assert!(log.close().is_err(), "close reports the poisoning");
    fail::remove("segment::write");
    let log = Log::open(d.path(), LogOptions::default()).unwrap();
    assert!(log.open_report().repairs.is_empty(), "nothing torn was left");
    assert_eq!(log.append(b"three again").unwrap().first_seq, 3);
    log.close().unwrap();
    let recs = records(d.path());
    assert_eq!(recs.iter().map(|r| r.1.as_slice()).collect::<Vec<_>>(), vec![&b"one"[..], b"two", b"three again"]);
}

/// Proves (issue 23, item 5): a failed sync is cut back before anyone else can
/// append — `NOT_COMMITTED`, and another reader of the log, while the poisoned
/// writer is still open, sees none of it (before the fix the record sat in the
/// page cache, where every reader and writer acted on it, while a power cut could
/// still erase it). The writer stays poisoned until reopen, which finds a
/// consistent log.
#[test]
fn a_failed_sync_is_cut_back_before_anyone_can_read_it() {
    let d = tempfile::tempdir().unwrap();
    let _fp = fail::FailScenario::setup();
    let log = Log::open(d.path(), LogOptions::default()).unwrap();
    log.append(b"acknowledged").unwrap();
    fail::cfg("segment::fdatasync", "return").unwrap();
    let err = log.append(b"never committed").unwrap_err();
    assert_eq!(err.code(), "NOT_COMMITTED", "{err}");
    assert_eq!(records(d.path()), vec![(1, b"acknowledged".to_vec())], "nobody else can see the failed group");
    assert_eq!(log.append(b"refused").unwrap_err().code(), "WRITER_POISONED");
    drop(log);
    fail::remove("segment::fdatasync");
    let log = Log::open(d.path(), LogOptions::default()).unwrap();
    assert!(log.open_report().repairs.is_empty());
    assert_eq!(log.append(b"after reopen").unwrap().first_seq, 2);
    log.close().unwrap();
    let recs = records(d.path());
    assert_eq!(recs, vec![(1, b"acknowledged".to_vec()), (2, b"after reopen".to_vec())]);
}

/// Proves: raw appenders waiting on a group whose sync fails all hear that their
/// records were not committed — `NOT_COMMITTED` (the group, and what was queued
/// after it, cut back), or `WRITER_POISONED` for one that came after the failure
/// — none is acknowledged, and the log holds exactly what it held before. Eight
/// threads append at once; each write pauses 50 ms (so that followers queue behind
/// the leader's group) and every sync fails.
#[test]
fn a_failed_sync_fails_every_raw_appender_waiting_on_it() {
    let d = tempfile::tempdir().unwrap();
    let _fp = fail::FailScenario::setup();
    let log = Log::open(d.path(), LogOptions::default()).unwrap();
    log.append(b"acknowledged").unwrap();
    fail::cfg("segment::write", "sleep(50)").unwrap();
    fail::cfg("segment::fdatasync", "return").unwrap();
    let start = Barrier::new(8);
    let codes: Vec<&'static str> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..8)
            .map(|t| {
                let (log, start) = (&log, &start);
                s.spawn(move || {
                    start.wait();
                    log.append(format!("thread {t}").as_bytes()).map(|a| a.first_seq).unwrap_err().code()
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert!(codes.contains(&"NOT_COMMITTED"), "the leader's group was cut back: {codes:?}");
    assert!(codes.iter().all(|c| ["NOT_COMMITTED", "WRITER_POISONED"].contains(c)), "{codes:?}");
    assert_eq!(records(d.path()), vec![(1, b"acknowledged".to_vec())], "none of them is in the log");
    assert_eq!(log.append(b"later").unwrap_err().code(), "WRITER_POISONED");
    drop(log);
    fail::remove("segment::write");
    fail::remove("segment::fdatasync");
    let recs = records(d.path());
    assert_eq!(recs, vec![(1, b"acknowledged".to_vec())]);
}

/// Proves: when the sync of a group fails, no transaction of it is acknowledged —
/// neither the claim nor the refusals judged against it: each hears NOT_COMMITTED
/// (or WRITER_POISONED, if it came after the failure) — a read-only view of the
/// log sees none of them, every later call fails with WRITER_POISONED until
/// reopen, and the reopened ledger works and holds every transaction acknowledged
/// before the failure.
#[test]
fn a_failed_sync_fails_every_transaction_judged_on_it_and_poisons_the_ledger() {
    let d = tempfile::tempdir().unwrap();
    let _fp = fail::FailScenario::setup();
    let ledger = Ledger::open(d.path(), LedgerOptions::default()).unwrap();
    let owner = me();
    for i in 0..5 {
        ledger.submit(None, claim(&format!("before/{i}"), &owner)).unwrap();
    }
    fail::cfg("segment::fdatasync", "return").unwrap();
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
            Err(e @ LedgerError::Storage(_)) if ["NOT_COMMITTED", "WRITER_POISONED"].contains(&e.code()) => {}
            other => panic!("nothing judged on a failed sync may be answered: {other:?}"),
        }
    }
    assert!(results.iter().any(|r| r.as_ref().is_err_and(|e| e.code() == "NOT_COMMITTED")));
    let view = Ledger::read_only(d.path(), &LedgerOptions::default()).unwrap();
    assert!(view.projection.subject("contested").is_none(), "the cut-back group is nowhere in the log");
    assert_eq!(view.projection.last_seq(), 5);
    let later = ledger.submit(None, claim("after", &owner)).unwrap_err();
    assert_eq!(later.code(), "WRITER_POISONED");
    assert_eq!(ledger.refresh().unwrap_err().code(), "WRITER_POISONED");
    drop(ledger);
    fail::remove("segment::fdatasync");
    let reopened = Ledger::open(d.path(), LedgerOptions::default()).unwrap();
    let p = reopened.projection();
    for i in 0..5 {
        assert_eq!(p.subject(&format!("before/{i}")).map(|s| s.generation), Some(1));
    }
    let c = reopened.submit(None, claim("after", &owner)).unwrap();
    assert_eq!(c.seq, Some(p.last_seq() + 1));
}

/// Proves: a lone async caller (a daemon request with nobody else in flight),
/// which leads its group on its own runtime worker (`lead_inline`: every one of
/// its leads is counted there), is not acknowledged when that group's sync fails:
/// it hears NOT_COMMITTED, the next async call WRITER_POISONED, a read-only view
/// holds only what was acknowledged before, and the reopened ledger goes on from
/// there. In a task on a two-worker runtime (a lead on a caller's own worker
/// needs another worker beside it).
#[test]
fn a_lone_async_callers_failed_sync_is_not_acknowledged_and_poisons_the_ledger() {
    let d = tempfile::tempdir().unwrap();
    let _fp = fail::FailScenario::setup();
    let ledger = std::sync::Arc::new(Ledger::open(d.path(), LedgerOptions::default()).unwrap());
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let owner = me();
    let (in_task, owner_in_task) = (std::sync::Arc::clone(&ledger), owner.clone());
    let (failed, later) = rt
        .block_on(rt.spawn(async move {
            for i in 0..3 {
                in_task.submit_as_async(None, None, claim(&format!("before/{i}"), &owner_in_task)).await.unwrap();
            }
            fail::cfg("segment::fdatasync", "return").unwrap();
            let failed = in_task.submit_as_async(None, None, claim("lost", &owner_in_task)).await.unwrap_err();
            let later = in_task.submit_as_async(None, None, claim("after", &owner_in_task)).await.unwrap_err();
            (failed, later)
        }))
        .unwrap();
    let inline = ledger.inline_leads();
    // Four led there (the poisoned ledger refuses the fifth before it leads).
    assert_eq!((inline.led, inline.declined), (4, 0), "every lead ran on the task's worker");
    assert_eq!(failed.code(), "NOT_COMMITTED", "{failed}");
    assert_eq!(later.code(), "WRITER_POISONED", "{later}");
    let view = Ledger::read_only(d.path(), &LedgerOptions::default()).unwrap();
    assert!(view.projection.subject("lost").is_none(), "the failed group is nowhere in the log");
    assert_eq!(view.projection.last_seq(), 3);
    drop(ledger);
    fail::remove("segment::fdatasync");
    let reopened = std::sync::Arc::new(Ledger::open(d.path(), LedgerOptions::default()).unwrap());
    assert_eq!(reopened.projection().last_seq(), 3);
    let c = rt.block_on(reopened.submit_as_async(None, None, claim("after", &owner))).unwrap();
    assert_eq!(c.seq, Some(4));
}

/// Proves: a failure creating the next segment (rotation) cuts the group back
/// (`NOT_COMMITTED`) and poisons the writer; a reopen finds every acknowledged
/// record and appending continues. A directory fsync that keeps failing fails the
/// cut back too (it removes the half-made segment): the log is then halted
/// (`SYNC_FAILED`) for every writer until `repair` cuts from the group's first
/// record — after which every acknowledged record is there and appending goes on.
#[test]
fn failed_segment_creation_or_directory_sync_poisons_and_reopen_recovers() {
    for point in ["segment::create", "dir::fsync"] {
        let _fp = fail::FailScenario::setup();
        let d = tempfile::tempdir().unwrap();
        let opts = LogOptions { segment_bytes_max: 400, ..LogOptions::default() };
        let log = Log::open(d.path(), opts.clone()).unwrap();
        let mut acked = vec![];
        fail::cfg(point, "return").unwrap();
        let err = loop {
            match log.append(format!("record {}", acked.len()).as_bytes()) {
                Ok(_) => acked.push(format!("record {}", acked.len()).into_bytes()),
                Err(e) => break e,
            }
            assert!(acked.len() < 100, "{point}: the rotation never failed");
        };
        let want = if point == "segment::create" { "NOT_COMMITTED" } else { "SYNC_FAILED" };
        assert_eq!(err.code(), want, "{point}: {err}");
        assert!(err.to_string().contains("injected"), "{err}");
        assert_eq!(log.append(b"later").unwrap_err().code(), "WRITER_POISONED");
        drop(log);
        fail::remove(point);
        if point == "dir::fsync" {
            assert!(d.path().join(fencelog::storage::SYNC_FAILED_FILE).exists());
            let refused = Log::open(d.path(), opts.clone()).err().expect("halted");
            assert_eq!(refused.code(), "SYNC_FAILED", "{refused}");
            let seq = acked.len() as u64 + 1;
            let r = fencelog::storage::repair(d.path(), seq, &opts).unwrap();
            assert!(r.intact && r.last_seq == acked.len() as u64, "{r:?}");
            assert!(!d.path().join(fencelog::storage::SYNC_FAILED_FILE).exists());
        }
        let log = Log::open(d.path(), opts).unwrap();
        log.append(b"after").unwrap();
        drop(log);
        let got: Vec<Vec<u8>> = records(d.path()).into_iter().map(|(_, p)| p).collect();
        assert_eq!(&got[..acked.len()], &acked[..], "{point}: every acknowledged record");
        assert_eq!(got.len(), acked.len() + 1, "{point}: nothing of the failed group");
        assert_eq!(got.last().unwrap(), b"after");
    }
}

/// Proves: failures while opening (opening or mapping a segment, taking the lock)
/// fail the open with IO_ERROR and change nothing on disk; a failure linking a new
/// log's first segment into place leaves no log and no temp file.
#[test]
fn failures_while_opening_fail_the_open_and_change_nothing() {
    let _fp = fail::FailScenario::setup();
    let fresh = tempfile::tempdir().unwrap();
    fail::cfg("segment::link", "return").unwrap();
    assert_eq!(Log::open(fresh.path(), LogOptions::default()).err().unwrap().code(), "IO_ERROR");
    assert_eq!(fs::read_dir(fresh.path()).unwrap().count(), 0, "no segment, no temp file");
    fail::remove("segment::link");
    drop(_fp);
    let d = tempfile::tempdir().unwrap();
    let log = Log::open(d.path(), LogOptions::default()).unwrap();
    log.append(b"one").unwrap();
    drop(log);
    for point in ["segment::open", "segment::mmap", "lock::acquire"] {
        let _fp = fail::FailScenario::setup();
        let before = hash_tree(d.path());
        fail::cfg(point, "return").unwrap();
        let err = Log::open(d.path(), LogOptions::default()).err().expect("the open fails");
        assert_eq!(err.code(), "IO_ERROR", "{point}: {err}");
        assert_eq!(hash_tree(d.path()), before, "{point}: nothing changed");
    }
    assert_eq!(records(d.path()).len(), 1);
}

/// Proves: recovery that cannot write its evidence (a full disk, part-written) or
/// cannot truncate after it fails with IO_ERROR, leaves no partial evidence and
/// never cuts bytes it has not kept; with the failure gone, recovery completes.
#[test]
fn failures_while_recovering_a_torn_tail_cut_nothing_unkept() {
    let _fp = fail::FailScenario::setup();
    let d = tempfile::tempdir().unwrap();
    let log = Log::open(d.path(), LogOptions::default()).unwrap();
    log.append(b"kept").unwrap();
    drop(log);
    let seg = segment_path(d.path(), 1);
    let mut b = fs::read(&seg).unwrap();
    b.extend_from_slice(&[200, 0, 0, 0, 9, 9, 9]);
    fs::write(&seg, &b).unwrap();
    let evidence = |dir: &std::path::Path| {
        fs::read_dir(dir)
            .unwrap()
            .filter(|e| e.as_ref().unwrap().file_name().to_string_lossy().contains("evidence"))
            .count()
    };
    fail::cfg("evidence::write", "return(3)").unwrap();
    assert_eq!(Log::open(d.path(), LogOptions::default()).err().unwrap().code(), "IO_ERROR");
    assert_eq!((evidence(d.path()), fs::read(&seg).unwrap()), (0, b.clone()), "no partial evidence, nothing cut");
    fail::remove("evidence::write");
    fail::cfg("segment::truncate", "return").unwrap();
    assert_eq!(Log::open(d.path(), LogOptions::default()).err().unwrap().code(), "IO_ERROR");
    assert_eq!(fs::read(&seg).unwrap(), b, "the evidence is kept; the segment is not cut yet");
    fail::remove("segment::truncate");
    let log = Log::open(d.path(), LogOptions::default()).unwrap();
    assert_eq!(log.open_report().repairs.len(), 1);
    drop(log);
    assert_eq!(records(d.path()), vec![(1, b"kept".to_vec())]);
}

/// Proves: a snapshot that cannot be written or renamed costs nothing but the
/// snapshot: `snapshot_now` reports IO_ERROR, no temp file is left, the ledger
/// goes on committing, and a reopen replays the whole log.
#[test]
fn failed_snapshot_writes_cost_only_the_snapshot() {
    for point in ["snapshot::write", "snapshot::fsync", "snapshot::rename", "dir::fsync"] {
        let _fp = fail::FailScenario::setup();
        let d = tempfile::tempdir().unwrap();
        let l = Ledger::open(d.path(), LedgerOptions::default()).unwrap();
        let owner = me();
        l.submit(None, claim("a", &owner)).unwrap();
        fail::cfg(point, "return").unwrap();
        let err = l.snapshot_now().unwrap_err();
        assert_eq!(err.code(), "IO_ERROR", "{point}: {err}");
        l.submit(None, claim("b", &owner)).unwrap();
        fail::remove(point);
        let leftovers: Vec<_> =
            fs::read_dir(d.path().join("snapshots")).unwrap().map(|e| e.unwrap().file_name()).collect();
        if point == "snapshot::rename" {
            assert!(leftovers.is_empty(), "{point}: {leftovers:?}");
        }
        drop(l);
        let again = Ledger::open(d.path(), LedgerOptions::default()).unwrap();
        // A snapshot whose directory fsync failed may exist, but no checkpoint vouches
        // for it: never adopted.
        assert_eq!((again.open_report().snapshot_seq, again.projection().last_seq()), (None, 2), "{point}");
    }
}

/// Proves, through a real child process: a `fencelog` command whose sync fails
/// (FAILPOINTS in its environment) exits 1 with NOT_COMMITTED (`retryable`
/// evidence aside, the message says the group was cut back); `request show`
/// answers "never committed" from the log; and a retry with the same id, without
/// the failure, commits once (not a deduplicated copy of a record the page cache
/// held, as before the fix).
#[test]
fn a_cli_command_whose_sync_fails_is_not_committed_and_a_retry_commits_once() {
    const FENCELOG: &str = env!("CARGO_BIN_EXE_fencelog");
    // Its own reads (`verify_dir`) reach failpoints too: serialised with the others.
    let _fp = fail::FailScenario::setup();
    let d = tempfile::tempdir().unwrap();
    let dir = d.path().to_str().unwrap();
    assert!(Command::new(FENCELOG).args(["init", "--dir", dir]).status().unwrap().success());
    let pid = std::process::id().to_string();
    let claim = ["claim", "--dir", dir, "--subject", "fp/a", "--pid", &pid, "--request-id", "r-1"];
    let out = Command::new(FENCELOG).args(claim).env("FAILPOINTS", "segment::fdatasync=return").output().unwrap();
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!((out.status.code(), v["error"]["code"].as_str()), (Some(1), Some("NOT_COMMITTED")), "{v}");
    let out = Command::new(FENCELOG).args(["request", "show", "--dir", dir, "r-1"]).output().unwrap();
    let shown: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!((out.status.code(), shown["status"].as_str()), (Some(0), Some("never_committed")), "{shown}");
    let out = Command::new(FENCELOG).args(claim).output().unwrap();
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(out.status.code(), Some(0), "{v}");
    assert_eq!((v["seq"].as_u64(), v["deduplicated"].as_bool()), (Some(1), Some(false)), "{v}");
    assert!(verify_dir(d.path(), LogOptions::default().body_max()).unwrap().is_intact());
}

/// Proves: the position index is a hint — a failed write of it never fails an
/// append nor poisons the writer; the records are all there, and the next open
/// (recovery) writes the entries that were lost.
#[test]
fn a_failed_index_write_fails_no_append_and_recovery_writes_it_later() {
    let d = tempfile::tempdir().unwrap();
    let _fp = fail::FailScenario::setup();
    fail::cfg("index::write", "return").unwrap();
    let log = Log::open(d.path(), LogOptions::default()).unwrap();
    let payload = vec![b'x'; 1000];
    for i in 1..=1_000u64 {
        assert_eq!(log.append(&payload).unwrap().first_seq, i, "every append lands");
    }
    log.close().unwrap();
    let index = segment_path(d.path(), 1).with_extension("idx");
    assert!(!index.exists(), "no entry was written");
    fail::remove("index::write");
    let log = Log::open(d.path(), LogOptions::default()).unwrap();
    assert_eq!(log.last_seq(), 1_000);
    log.close().unwrap();
    // 1,000 frames of 1,080 bytes after the 64-byte header: records start in the
    // slots at 256, 512, 768 and 1,024 KiB.
    assert_eq!(fs::read(&index).unwrap().len(), 4 * 52, "recovery wrote the lost entries");
    assert!(verify_dir(d.path(), LogOptions::default().body_max()).unwrap().is_intact());
}

/// Proves: recovery syncs the segment before it writes index entries for what it
/// scanned (a dead writer's frames may never have been synced), and a failure of
/// that sync fails the open — as any failed sync of the log does — with nothing
/// written beside the segment; the next open fills the index.
#[test]
fn a_failed_sync_before_recovery_fills_the_index_fails_the_open() {
    let d = tempfile::tempdir().unwrap();
    let _fp = fail::FailScenario::setup();
    let log = Log::open(d.path(), LogOptions::default()).unwrap();
    let payload = vec![b'y'; 1000];
    for _ in 0..1_000 {
        log.append(&payload).unwrap();
    }
    log.close().unwrap();
    let index = segment_path(d.path(), 1).with_extension("idx");
    fs::remove_file(&index).unwrap();
    fail::cfg("index::fill_sync", "return").unwrap();
    let err = Log::open(d.path(), LogOptions::default()).err().expect("the open fails");
    assert_eq!(err.code(), "IO_ERROR", "{err}");
    assert!(err.to_string().contains("fdatasync"), "{err}");
    assert!(!index.exists(), "no entry written after the failed sync");
    fail::remove("index::fill_sync");
    let log = Log::open(d.path(), LogOptions::default()).unwrap();
    assert_eq!(log.last_seq(), 1_000);
    log.close().unwrap();
    assert_eq!(fs::read(&index).unwrap().len(), 4 * 52);
}

/// Proves: a request to etcd is answered within its bound even when the etcd
/// client's runtime cannot run it (its one thread blocked, here by a failpoint
/// that sleeps in it for longer than the bound): `ETCD_UNAVAILABLE`, saying the
/// runtime did not run the request — never a hang. (Before, the caller waited for
/// the runtime's answer without a deadline of its own.)
#[test]
fn an_etcd_request_is_answered_unavailable_when_the_clients_runtime_is_stalled() {
    use fencelog::storage::LogBackend;
    use fencelog::storage::etcd::{ETCD_ANSWER_GRACE_MS, ETCD_REQUEST_TIMEOUT_MS};
    let _fp = fail::FailScenario::setup();
    let (_, backend) = common::etcd::new_backend(&common::etcd::shared().endpoints, "stall");
    assert_eq!(backend.head().unwrap().seq, 0);
    // Longer than the caller's whole bound: the runtime's answer cannot come first.
    let stall_ms = 2 * (ETCD_REQUEST_TIMEOUT_MS + ETCD_ANSWER_GRACE_MS);
    fail::cfg("etcd::request", &format!("1*sleep({stall_ms})")).unwrap();
    let e = backend.head().unwrap_err();
    fail::remove("etcd::request");
    assert_eq!(e.code(), "ETCD_UNAVAILABLE", "{e}");
    assert!(e.to_string().contains("did not run the request"), "{e}");
}

/// Proves: an append whose `Txn` etcd applied but whose answer was lost (the
/// connection reset under it: a failpoint turns the answer into
/// `ETCD_UNAVAILABLE`) is told from the head and answered as appended, once — not
/// refused, not sent again (the log holds it once, the next append follows it) —
/// and one whose answer was lost before it landed is sent again and lands once.
#[test]
fn an_etcd_append_whose_answer_was_lost_is_told_from_the_head() {
    use fencelog::storage::{AppendOutcome, LogBackend};
    let _fp = fail::FailScenario::setup();
    let (opts, backend) = common::etcd::new_backend(&common::etcd::shared().endpoints, "lost");
    let landed = |r: fencelog::storage::Result<AppendOutcome>| match r {
        Ok(AppendOutcome::Appended(a)) => (a.first_seq, a.last_seq),
        other => panic!("expected appended, got {other:?}"),
    };
    fail::cfg("etcd::txn_answer_lost", "1*return").unwrap();
    assert_eq!(landed(backend.append_if_head(0, vec![b"one".to_vec(), b"two".to_vec()])), (1, 2));
    fail::remove("etcd::txn_answer_lost");
    assert_eq!(landed(backend.append_if_head(2, vec![b"three".to_vec()])), (3, 3));
    fail::cfg("etcd::txn_not_sent", "1*return").unwrap();
    assert_eq!(landed(backend.append_if_head(3, vec![b"four".to_vec()])), (4, 4));
    fail::remove("etcd::txn_not_sent");
    // Another writer of the same log sees each record once, at its sequence.
    let other = common::etcd::open_backend(&opts);
    assert_eq!(other.head().unwrap().seq, 4);
    let mut payloads = vec![];
    other.reader(1).poll(&mut |r| payloads.push(r.payload.to_vec())).unwrap();
    assert_eq!(payloads, [&b"one"[..], b"two", b"three", b"four"]);
    // Another writer appends between the lost answer and the reading of the head:
    // the head is not ours, but our first frame is at its sequence — landed.
    let other = std::sync::Arc::new(other);
    let next = {
        let other = other.clone();
        move |payload: &'static [u8]| {
            let other = other.clone();
            move || {
                let at = other.head().unwrap().seq;
                assert!(matches!(other.append_if_head(at, vec![payload.to_vec()]), Ok(AppendOutcome::Appended(_))));
            }
        }
    };
    fail::cfg_callback("etcd::before_telling", next(b"other on top")).unwrap();
    fail::cfg("etcd::txn_answer_lost", "1*return").unwrap();
    assert_eq!(landed(backend.append_if_head(4, vec![b"five".to_vec()])), (5, 5));
    fail::remove("etcd::txn_answer_lost");
    // The same, but the append was lost before it landed: the other writer's
    // record holds its place, and it never will land — `HeadMoved`.
    fail::cfg_callback("etcd::before_telling", next(b"other instead")).unwrap();
    fail::cfg("etcd::txn_not_sent", "1*return").unwrap();
    assert!(matches!(backend.append_if_head(6, vec![b"never".to_vec()]), Ok(AppendOutcome::HeadMoved { actual: 7 })));
    fail::remove("etcd::txn_not_sent");
    fail::remove("etcd::before_telling");
    assert_eq!(landed(backend.append_if_head(7, vec![b"eight".to_vec()])), (8, 8));
    let mut payloads = vec![];
    other.reader(1).poll(&mut |r| payloads.push(r.payload.to_vec())).unwrap();
    assert_eq!(
        payloads,
        [&b"one"[..], b"two", b"three", b"four", b"five", b"other on top", b"other instead", b"eight"]
    );
}

/// Proves: a reader visits what the append lock's holders say is durable (the
/// durable mark in `LOCK`, written after each of their syncs) without a sync of
/// its own, and a group after it — written by its writer and not yet synced —
/// only once it has synced the segment itself. A failed sync gives no answer from
/// the group, and that reader stays failed — the ledger is poisoned, naming the
/// cause (a sync tried again could pass over pages that never reached the disk);
/// a new reader syncs, and answers.
#[test]
fn a_reader_visits_a_group_in_flight_only_after_its_own_sync() {
    use std::sync::atomic::{AtomicU64, Ordering::SeqCst};
    let d = tempfile::tempdir().unwrap();
    let _fp = fail::FailScenario::setup();
    let opts = LedgerOptions::default;
    let a = Ledger::open(d.path(), opts()).unwrap();
    let b = Ledger::open(d.path(), opts()).unwrap();
    let owner = me();
    b.submit(None, claim("b/1", &owner)).unwrap();
    let syncs = std::sync::Arc::new(AtomicU64::new(0));
    let counted = syncs.clone();
    let count_syncs = move || {
        let counted = counted.clone();
        fail::cfg_callback("reader::fdatasync", move || {
            counted.fetch_add(1, SeqCst);
        })
        .unwrap();
    };
    count_syncs();
    assert!(a.refresh().unwrap().subject("b/1").is_some());
    assert!(Ledger::read_only(d.path(), &opts()).unwrap().projection.subject("b/1").is_some());
    assert_eq!(syncs.load(SeqCst), 0, "b/1 is under the durable mark: no reader synced");
    let seg = segment_path(d.path(), 1);
    let before = fencelog::storage::frames_end(&seg).unwrap();
    fail::cfg("segment::fdatasync", "pause").unwrap();
    std::thread::scope(|s| {
        let writer = s.spawn(|| b.submit(None, claim("b/2", &owner)));
        // Whatever the checks find, the writer is let go (else the scope waits
        // for it for ever).
        let checked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            // b's group is in the file, its sync paused: wait for it there.
            wait_for_group_in_file(&seg, before, || !writer.is_finished());
            fail::cfg("reader::fdatasync", "return").unwrap();
            let err = a.refresh().unwrap_err();
            assert_eq!(err.code(), "IO_ERROR", "{err}");
            assert!(err.to_string().contains("fdatasync what was read"), "{err}");
            let Err(err) = Ledger::read_only(d.path(), &opts()) else { panic!("a read-only view answered") };
            assert_eq!(err.code(), "IO_ERROR", "a read-only view gives no answer either: {err}");
            let err = fencelog::storage::verify_dir(d.path(), LogOptions::default().body_max()).unwrap_err();
            assert_eq!(err.code(), "IO_ERROR", "nor does the inspector's scan: {err}");
            count_syncs();
            let err = a.refresh().unwrap_err();
            assert_eq!(err.code(), "WRITER_POISONED", "the ledger whose reader's sync failed stays failed: {err}");
            assert!(err.to_string().contains("fdatasync what was read"), "it names the cause: {err}");
            assert_eq!(syncs.load(SeqCst), 0, "it did not sync again");
            let view = Ledger::read_only(d.path(), &opts()).unwrap();
            assert!(view.projection.subject("b/2").is_some(), "a new reader answers once it synced");
            assert_eq!(syncs.load(SeqCst), 1, "one sync, of the group in flight");
        }));
        fail::remove("segment::fdatasync");
        let landed = writer.join().unwrap();
        if let Err(p) = checked {
            std::panic::resume_unwind(p);
        }
        assert!(landed.is_ok(), "b's group lands");
    });
    let view = Ledger::read_only(d.path(), &opts()).unwrap();
    assert!(view.projection.subject("b/2").is_some());
    assert_eq!(syncs.load(SeqCst), 1, "b/2 is under the durable mark now: no sync");
}

/// Proves, across real processes: a group its writer has written and not yet
/// synced (the writer's `fdatasync` paused by a failpoint, the append lock held)
/// is answered from by a reader process only after that reader made it durable:
/// `request show` whose sync fails — a failpoint, and a real EIO from the kernel
/// (a seccomp filter on `fdatasync`) — exits 1 `IO_ERROR` and says nothing about
/// the request; without the failure it answers `committed`. The writer is then
/// killed with SIGKILL before its sync, still marked as the lock's holder: the
/// next writer (a retry of the same request) makes the log durable before it
/// reads under the lock — if that sync fails its turn fails (`IO_ERROR`), it
/// does not answer "deduplicated" from the dead writer's group; so it does when
/// the dead writer left no holder mark (an earlier build), by the durable mark —
/// and then answers it, once.
#[test]
fn a_reader_process_answers_from_an_unsynced_group_only_after_its_own_sync() {
    const FENCELOG: &str = env!("CARGO_BIN_EXE_fencelog");
    // Its own reads (`frames_end`, `verify_dir`) reach failpoints too.
    let _fp = fail::FailScenario::setup();
    let d = tempfile::tempdir().unwrap();
    let dir = d.path().to_str().unwrap();
    assert!(Command::new(FENCELOG).args(["init", "--dir", dir]).status().unwrap().success());
    let seg = segment_path(d.path(), 1);
    let before = fencelog::storage::frames_end(&seg).unwrap();
    let pid = std::process::id().to_string();
    let claim = ["claim", "--dir", dir, "--subject", "fp/held", "--pid", &pid, "--request-id", "r-held"];
    /// The writer, killed however the test ends (it never syncs by itself).
    struct Killed(std::process::Child);
    impl Drop for Killed {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let mut writer = Killed(
        Command::new(FENCELOG)
            .args(claim)
            .env("FAILPOINTS", "segment::fdatasync=pause")
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap(),
    );
    let writer_pid = writer.0.id();
    // The writer's group is in the file (its sync paused): wait for it there.
    wait_for_group_in_file(&seg, before, || writer.0.try_wait().unwrap().is_none());
    let show = ["request", "show", "--dir", dir, "r-held"];
    let json = |out: std::process::Output| -> (Option<i32>, serde_json::Value) {
        (out.status.code(), serde_json::from_slice(&out.stdout).unwrap_or(serde_json::Value::Null))
    };
    let (code, v) =
        json(Command::new(FENCELOG).args(show).env("FAILPOINTS", "reader::fdatasync=return").output().unwrap());
    assert_eq!((code, v["error"]["code"].as_str()), (Some(1), Some("IO_ERROR")), "{v}");
    assert!(v.get("status").is_none(), "no answer about the request: {v}");
    let mut eio = Command::new(common::torture_bin());
    eio.args(["eio", "fdatasync", FENCELOG]).args(show);
    let (code, v) = json(eio.output().unwrap());
    assert_eq!((code, v["error"]["code"].as_str()), (Some(1), Some("IO_ERROR")), "kernel EIO: {v}");
    assert!(v["error"]["message"].as_str().unwrap().contains("Input/output error"), "{v}");
    let (code, v) = json(Command::new(FENCELOG).args(show).output().unwrap());
    assert_eq!((code, v["status"].as_str()), (Some(0), Some("committed")), "{v}");
    assert!(writer.0.try_wait().unwrap().is_none(), "the writer is still before its sync");
    let lock = std::fs::read(d.path().join(fencelog::storage::LOCK_FILE)).unwrap();
    assert_eq!(u64::from_le_bytes(lock[16..24].try_into().unwrap()), 0, "nothing is said durable before its sync");
    drop(writer);
    let lock = std::fs::read(d.path().join(fencelog::storage::LOCK_FILE)).unwrap();
    assert_eq!(
        u64::from_le_bytes(lock[8..16].try_into().unwrap()),
        u64::from(writer_pid),
        "the killed writer is still marked as the lock's holder"
    );
    let (code, v) = json(
        Command::new(FENCELOG)
            .args(claim)
            .env("FAILPOINTS", "lock::sync_after_unclean_holder=return")
            .output()
            .unwrap(),
    );
    assert_eq!((code, v["error"]["code"].as_str()), (Some(1), Some("IO_ERROR")), "{v}");
    assert!(v["error"]["message"].as_str().unwrap().contains("died holding the append lock"), "{v}");
    // A writer that leaves no holder mark (an earlier build's) died the same way:
    // the next one still syncs what it finds past the durable mark before it
    // says so, or answers nothing.
    let mut lock = std::fs::read(d.path().join(fencelog::storage::LOCK_FILE)).unwrap();
    lock[8..16].copy_from_slice(&0u64.to_le_bytes());
    std::fs::write(d.path().join(fencelog::storage::LOCK_FILE), &lock).unwrap();
    let (code, v) =
        json(Command::new(FENCELOG).args(claim).env("FAILPOINTS", "segment::sync_adopted=return").output().unwrap());
    assert_eq!((code, v["error"]["code"].as_str()), (Some(1), Some("IO_ERROR")), "{v}");
    assert!(v["error"]["message"].as_str().unwrap().contains("past the durable mark"), "{v}");
    let (code, v) = json(Command::new(FENCELOG).args(claim).output().unwrap());
    assert_eq!(code, Some(0), "{v}");
    assert_eq!((v["seq"].as_u64(), v["deduplicated"].as_bool()), (Some(1), Some(true)), "{v}");
    let lock = std::fs::read(d.path().join(fencelog::storage::LOCK_FILE)).unwrap();
    assert_eq!(u64::from_le_bytes(lock[8..16].try_into().unwrap()), 0, "the retry let go cleanly");
    assert_eq!(u64::from_le_bytes(lock[16..24].try_into().unwrap()), 1, "record 1 is durable, and said so");
    let (code, v) = json(Command::new(FENCELOG).args(show).output().unwrap());
    assert_eq!((code, v["status"].as_str()), (Some(0), Some("committed")), "{v}");
    assert!(verify_dir(d.path(), LogOptions::default().body_max()).unwrap().is_intact());
}

/// Proves: the inspector's scan gates every segment by the durable mark, not
/// only the last one: records past the mark in a sealed segment (a writer that
/// died before marking them, one of an earlier build) are synced before they
/// are visited, once per segment; a failed sync gives no answer. Records under
/// the mark cost no sync.
#[test]
fn the_inspector_syncs_any_segment_whose_records_are_past_the_durable_mark() {
    use std::sync::atomic::{AtomicU64, Ordering::SeqCst};
    let d = tempfile::tempdir().unwrap();
    let _fp = fail::FailScenario::setup();
    let opts = LogOptions { segment_bytes_max: 400, ..LogOptions::default() };
    let log = Log::open(d.path(), opts.clone()).unwrap();
    for i in 0..12 {
        log.append(format!("record {i}").as_bytes()).unwrap();
    }
    drop(log);
    let segments = common::segment_files(d.path()).len() as u64;
    assert!(segments >= 3, "several segments: {segments}");
    let lock_path = d.path().join(fencelog::storage::LOCK_FILE);
    let syncs = std::sync::Arc::new(AtomicU64::new(0));
    let counted = syncs.clone();
    fail::cfg_callback("reader::fdatasync", move || {
        counted.fetch_add(1, SeqCst);
    })
    .unwrap();
    let body_max = opts.body_max();
    assert_eq!(verify_dir(d.path(), body_max).unwrap().records, 12);
    assert_eq!(syncs.load(SeqCst), 0, "every record is under the mark");
    // As a writer that never marked anything would leave it.
    let mut lock = std::fs::read(&lock_path).unwrap();
    lock[16..24].copy_from_slice(&0u64.to_le_bytes());
    std::fs::write(&lock_path, &lock).unwrap();
    assert_eq!(verify_dir(d.path(), body_max).unwrap().records, 12);
    assert_eq!(syncs.load(SeqCst), segments, "one sync per segment, sealed ones too");
    fail::cfg("reader::fdatasync", "return").unwrap();
    let err = verify_dir(d.path(), body_max).unwrap_err();
    assert_eq!(err.code(), "IO_ERROR", "{err}");
    fail::remove("reader::fdatasync");
    // The next writer syncs what it finds past the mark, and marks it.
    drop(Log::open(d.path(), opts).unwrap());
    let lock = std::fs::read(&lock_path).unwrap();
    assert_eq!(u64::from_le_bytes(lock[16..24].try_into().unwrap()), 12);
}

/// Wait (at most 60 s, looking every 5 ms) until the frames of segment `seg`
/// end past `before`: a paused writer's group has reached the file. `alive`
/// says whether that writer still runs (it must not finish before its sync).
fn wait_for_group_in_file(seg: &std::path::Path, before: u64, mut alive: impl FnMut() -> bool) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while fencelog::storage::frames_end(seg).unwrap() == before {
        assert!(alive(), "the writer finished before its sync");
        assert!(std::time::Instant::now() < deadline, "the writer's group never reached the file");
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
}

/// Proves: a forked runner whose caller's state cannot be resumed on the log
/// (`ledger::resume` fails in the runner) says so in its `runner.log`, replays
/// the log instead, and runs the command to its recorded end.
#[test]
fn a_forked_runner_that_cannot_resume_its_callers_state_replays_the_log() {
    use serde_json::Value;
    const FENCELOG: &str = env!("CARGO_BIN_EXE_fencelog");
    let t = tempfile::tempdir().unwrap();
    let dir = t.path().join("log");
    let fl = |args: &[&str], failpoints: &str| {
        let out = Command::new(FENCELOG)
            .args(args)
            .env("FENCELOG_DIR", &dir)
            .env("RUST_LOG", "fencelog=debug")
            .env("FAILPOINTS", failpoints)
            .output()
            .unwrap();
        (out.status.code().unwrap_or(-1), serde_json::from_slice::<Value>(&out.stdout).unwrap_or(Value::Null))
    };
    assert_eq!(fl(&["init"], "").0, 0);
    let (code, v) = fl(&["run", "--", "/bin/echo", "hi"], "ledger::resume=return");
    assert_eq!((code, v["status"].as_str(), v["stdout_tail"].as_str()), (0, Some("succeeded"), Some("hi\n")), "{v}");
    let log = fs::read_to_string(dir.join("processes").join(v["id"].to_string()).join("runner.log")).unwrap();
    assert!(log.contains("the state handed over cannot be resumed"), "{log}");
    let opened: Vec<&str> = log.lines().filter(|l| l.contains("ledger opened")).collect();
    assert_eq!(opened.len(), 1, "{log}");
    assert!(!opened[0].contains("handed_over_at"), "replayed: {log}");
}
