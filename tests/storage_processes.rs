//! Real child processes: kill -9 while appending, and concurrent appenders.

mod common;

use std::collections::{BTreeMap, HashSet};
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use common::{Rng, records, seed};
use fencelog::storage::{Log, LogOptions, verify_dir};

fn spawn(dir: &Path, tag: &str, count: u64, threads: u64, segment_bytes_max: u64) -> Child {
    Command::new(common::torture_bin())
        .args([dir.to_str().unwrap(), tag, &count.to_string(), &threads.to_string(), &segment_bytes_max.to_string()])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn fencelog-torture")
}

/// Parse the child's `ACK <seq> <payload>` lines; a line cut by the kill is ignored
/// (the child had not finished reporting that append).
fn acks(out: &[u8]) -> Vec<(u64, Vec<u8>)> {
    out.split(|&b| b == b'\n')
        .filter_map(|l| std::str::from_utf8(l).ok())
        .filter_map(|l| l.strip_prefix("ACK "))
        .filter_map(|l| l.split_once(' '))
        .map(|(s, p)| (s.parse().unwrap(), p.as_bytes().to_vec()))
        .collect()
}

/// Proves: after `kill -9` at random moments (60 rounds, several appender threads,
/// small segments so kills also land in rotations), every append the child reported
/// as acknowledged is present at its sequence, intact, and the whole log verifies.
#[test]
fn kill_9_at_random_moments_never_loses_an_acknowledged_append() {
    let seed = seed();
    eprintln!("seed {seed} (FENCELOG_TEST_SEED to replay)");
    let mut rng = Rng(seed);
    let d = tempfile::tempdir().unwrap();
    let mut promised: BTreeMap<u64, Vec<u8>> = BTreeMap::new();
    let mut repairs = 0;
    for round in 0..60 {
        let mut child = spawn(d.path(), &format!("r{round}"), 0, 1 + rng.below(4), 8 * 1024);
        let mut r = BufReader::new(child.stdout.take().unwrap());
        // Round 0 and every odd round are killed only after the child's first
        // acknowledged append (so the log exists, and progress does not depend on
        // how busy the machine is); the even rounds after it are killed at any
        // moment, opening and recovering included.
        let waits_for_first_ack = round == 0 || round % 2 == 1;
        let mut first = Vec::new();
        if waits_for_first_ack {
            r.read_until(b'\n', &mut first).unwrap();
            assert!(first.starts_with(b"ACK "), "round {round}: the child said {:?}", String::from_utf8_lossy(&first));
        }
        let reader = std::thread::spawn(move || {
            let mut buf = first;
            while r.read_until(b'\n', &mut buf).map(|n| n > 0).unwrap_or(false) {}
            buf
        });
        std::thread::sleep(Duration::from_millis(5 + rng.below(60)));
        child.kill().unwrap(); // SIGKILL
        child.wait().unwrap();
        let acked = acks(&reader.join().unwrap());
        if waits_for_first_ack {
            assert!(!acked.is_empty(), "round {round}: its first acknowledged append was read");
        }
        for (seq, payload) in acked {
            assert!(promised.insert(seq, payload).is_none(), "round {round}: sequence {seq} acknowledged twice");
        }
        // Readers first (they never repair), then a writer recovers the tail.
        let summary = verify_dir(d.path(), LogOptions::default().body_max()).unwrap();
        assert!(!summary.has_corruption(), "round {round}: {:?}", summary.problems);
        let log = Log::open(d.path(), LogOptions::default()).unwrap();
        repairs += log.open_report().repairs.len();
        drop(log);
        let on_disk: BTreeMap<u64, Vec<u8>> = records(d.path()).into_iter().collect();
        for (seq, payload) in &promised {
            assert_eq!(on_disk.get(seq), Some(payload), "round {round}: acknowledged sequence {seq} lost or changed");
        }
        let seqs: Vec<u64> = on_disk.keys().copied().collect();
        assert_eq!(seqs, (1..=seqs.len() as u64).collect::<Vec<_>>(), "round {round}: sequences dense");
    }
    assert!(promised.len() >= 31, "every round that waited for an acknowledgement made one: {}", promised.len());
    eprintln!("{} acknowledged appends checked, {repairs} torn tails repaired", promised.len());
}

/// Proves: 8 processes appending to one directory at once produce dense sequences,
/// no duplicates, every acknowledged payload at its sequence, and an intact chain.
#[test]
fn eight_processes_appending_concurrently_keep_sequences_dense_and_the_chain_intact() {
    let d = tempfile::tempdir().unwrap();
    Log::open(d.path(), LogOptions::default()).unwrap().close().unwrap();
    let children: Vec<Child> = (0..8).map(|p| spawn(d.path(), &format!("proc{p}"), 150, 2, 16 * 1024)).collect();
    let mut acked = Vec::new();
    for c in children {
        let out = c.wait_with_output().unwrap();
        assert!(out.status.success(), "child failed: {}", String::from_utf8_lossy(&out.stderr));
        acked.extend(acks(&out.stdout));
    }
    assert_eq!(acked.len(), 8 * 2 * 150);
    let on_disk = records(d.path());
    assert_eq!(on_disk.len(), acked.len(), "nothing extra, nothing missing");
    let seqs: Vec<u64> = on_disk.iter().map(|r| r.0).collect();
    assert_eq!(seqs, (1..=acked.len() as u64).collect::<Vec<_>>());
    let unique: HashSet<&Vec<u8>> = on_disk.iter().map(|r| &r.1).collect();
    assert_eq!(unique.len(), on_disk.len(), "no payload written twice");
    let by_seq: BTreeMap<u64, Vec<u8>> = on_disk.into_iter().collect();
    for (seq, payload) in &acked {
        assert_eq!(by_seq.get(seq), Some(payload), "acknowledged sequence {seq}");
    }
    let s = verify_dir(d.path(), LogOptions::default().body_max()).unwrap();
    assert!(s.is_intact() && s.segments > 1, "{s:?}");
}

/// Proves: 64 threads in one process share group commits and every append gets a
/// distinct, dense sequence with its own payload.
#[test]
fn sixty_four_threads_share_group_commits_with_dense_sequences() {
    let d = tempfile::tempdir().unwrap();
    let log = Log::open(d.path(), LogOptions::default()).unwrap();
    let acked: Vec<(u64, Vec<u8>)> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..64)
            .map(|t| {
                let log = &log;
                s.spawn(move || {
                    (0..40)
                        .map(|i| {
                            let p = format!("t{t}-{i}").into_bytes();
                            (log.append(&p).unwrap().first_seq, p)
                        })
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        hs.into_iter().flat_map(|h| h.join().unwrap()).collect()
    });
    let fencelog::storage::CommitStats { records: appended, syncs } = log.commit_stats();
    assert_eq!(appended, 64 * 40);
    assert!(syncs < appended / 2, "appends must share syncs: {appended} appends took {syncs} syncs");
    log.close().unwrap();
    let mut sorted = acked.clone();
    sorted.sort();
    assert_eq!(sorted.iter().map(|a| a.0).collect::<Vec<_>>(), (1..=64 * 40).collect::<Vec<u64>>());
    assert_eq!(records(d.path()), sorted);
}

/// Proves: processes that open one fresh, empty directory at the same moment all
/// succeed (none mistakes the first segment another process is creating for a
/// foreign file), one segment chain results, and every append lands (40 rounds of 8).
#[test]
fn eight_processes_creating_one_fresh_log_at_once_all_succeed() {
    let root = tempfile::tempdir().unwrap();
    for round in 0..40 {
        let dir = root.path().join(format!("fresh-{round}"));
        std::fs::create_dir(&dir).unwrap();
        let children: Vec<Child> = (0..8).map(|p| spawn(&dir, &format!("p{p}"), 1, 1, 1 << 20)).collect();
        let mut acked = 0;
        for c in children {
            let out = c.wait_with_output().unwrap();
            assert!(out.status.success(), "round {round}: {}", String::from_utf8_lossy(&out.stderr));
            acked += acks(&out.stdout).len();
        }
        assert_eq!(acked, 8, "round {round}");
        let seqs: Vec<u64> = records(&dir).iter().map(|r| r.0).collect();
        assert_eq!(seqs, (1..=8).collect::<Vec<_>>(), "round {round}");
        let s = verify_dir(&dir, LogOptions::default().body_max()).unwrap();
        assert!(s.is_intact() && s.segments == 1, "round {round}: {s:?}");
    }
}

/// Proves (review of v2): readers that take no lock never fail, and never miss or
/// repeat a record, while a writer process appends with several threads to small
/// preallocated segments — groups copied over the end mark under the reader, and
/// segments cut to their last record as they are sealed. A long-lived tailer sees
/// every sequence once, in order; fresh tailers and whole scans (what read
/// commands do) succeed every time.
#[test]
fn readers_without_the_lock_never_fail_while_a_writer_seals_and_overwrites() {
    let d = tempfile::tempdir().unwrap();
    Log::open(d.path(), LogOptions::default()).unwrap().close().unwrap();
    let mut child = spawn(d.path(), "live", 0, 4, 4 * 1024);
    let stdout = child.stdout.take().unwrap();
    let drain = std::thread::spawn(move || std::io::copy(&mut BufReader::new(stdout), &mut std::io::sink()));
    let body_max = LogOptions::default().body_max();
    let mut follower = fencelog::storage::Tailer::new(d.path(), body_max, 1);
    let (mut next, mut polls, mut scans) = (1u64, 0u32, 0u32);
    let deadline = std::time::Instant::now() + Duration::from_secs(4);
    while std::time::Instant::now() < deadline {
        follower
            .poll(|r| {
                assert_eq!(r.seq, next, "the follower sees every sequence once, in order");
                next += 1;
            })
            .unwrap_or_else(|e| panic!("follower poll {polls}: {e}"));
        polls += 1;
        std::thread::sleep(Duration::from_micros(200));
        if polls % 8 == 0 {
            let mut fresh = fencelog::storage::Tailer::new(d.path(), body_max, 1);
            fresh.poll(|_| {}).unwrap_or_else(|e| panic!("fresh tailer: {e}"));
            fencelog::storage::read_records(d.path(), 1, body_max, |_| true)
                .unwrap_or_else(|e| panic!("scan {scans}: {e}"));
            scans += 1;
        }
    }
    child.kill().unwrap();
    child.wait().unwrap();
    drain.join().unwrap().unwrap();
    let segments = fencelog::storage::list_segments(d.path()).unwrap().len();
    assert!(
        next > 2_000 && segments > 100,
        "the writer must have appended and sealed: {next} records, {segments} segments"
    );
    eprintln!("{polls} polls, {scans} scans, {} records, {segments} segments", next - 1);
}

/// Poll `cond` every 5 ms for at most 10 s.
fn eventually(mut cond: impl FnMut() -> bool) -> bool {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while std::time::Instant::now() < deadline {
        if cond() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    false
}

/// Proves: the holder of the append lock sees whether another process waits for
/// it (then it lets go after its turn; otherwise it may keep it), and a waiter's
/// word dies with it — `kill -9` of a waiting process never leaves the holder
/// believing someone waits — as does a wait that timed out.
#[test]
fn the_lock_holder_sees_a_waiting_process_and_not_one_that_was_killed_or_gave_up() {
    use fencelog::storage::Exclusive;
    let d = tempfile::tempdir().unwrap();
    let dir = d.path();
    let log = Log::open(dir, LogOptions::default()).unwrap();
    log.append(b"first").unwrap();
    let waiter = |wait_ms: &str| {
        Command::new(common::torture_bin())
            .args(["lock", dir.to_str().unwrap(), wait_ms, "0"])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap()
    };
    log.with_lock(|l| {
        assert!(!l.others_waiting(), "nobody waits yet");
        let mut killed = waiter("60000");
        assert!(
            eventually(|| l.others_waiting()),
            "the waiting process is not seen: {}",
            std::fs::read_to_string("/proc/locks").unwrap_or_default()
        );
        killed.kill().unwrap();
        killed.wait().unwrap();
        assert!(eventually(|| !l.others_waiting()), "a killed waiter is still seen");
        let gave_up = waiter("200").wait_with_output().unwrap();
        assert_eq!(gave_up.status.code(), Some(3), "{}", String::from_utf8_lossy(&gave_up.stdout));
        assert!(!l.others_waiting(), "a waiter that timed out is still seen");
    })
    .unwrap();
    let out = waiter("5000").wait_with_output().unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "HELD", "the lock is free once let go");
}
