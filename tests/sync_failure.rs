//! A takeover whose durable step fails leaves the old owner in place (issue 23,
//! item 5; the behaviour of seed 003). Under the append lock, before anyone else
//! can append, a failed write or sync cuts its group back and answers
//! `NOT_COMMITTED`; only if that cut fails too is the log refused to every writer
//! (`SYNC_FAILED`) until `repair`. Tested through the real binary, with a
//! failpoint and with a real EIO from the kernel (a seccomp filter on `fdatasync`
//! and `fsync`, set by the `fencelog-torture eio` helper before it execs the
//! binary). Each test opens with what it proves.

mod common;

use std::path::Path;
use std::process::Command;

use serde_json::Value;

const FENCELOG: &str = env!("CARGO_BIN_EXE_fencelog");

/// `fencelog ARGS` (the directory in `FENCELOG_DIR`), with extra environment and
/// optionally under the EIO helper: (exit code, stdout as JSON).
fn run(dir: &Path, args: &[&str], env: &[(&str, &str)], eio: Option<&str>) -> (i32, Value) {
    let mut cmd = match eio {
        Some(syscalls) => {
            let mut c = Command::new(common::torture_bin());
            c.args(["eio", syscalls, FENCELOG]);
            c
        }
        None => Command::new(FENCELOG),
    };
    cmd.args(args).env("FENCELOG_DIR", dir);
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().unwrap();
    let v = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
    (out.status.code().unwrap_or(-1), v)
}

/// A log whose subject `s` is held at generation 1 by this (live) test process,
/// with a heartbeat already stale: a takeover may replace it. Returns the
/// heartbeat the takeover must name.
fn stale_owner(dir: &Path) -> u64 {
    let pid = std::process::id().to_string();
    let (code, v) = run(dir, &["claim", "--subject", "s", "--pid", &pid, "--stale-after-ms", "50"], &[], None);
    assert_eq!(code, 0, "{v}");
    stale_heartbeat(dir)
}

/// Wait for the condition (the heartbeat's age past its staleness), not a time;
/// the heartbeat a takeover must name.
fn stale_heartbeat(dir: &Path) -> u64 {
    loop {
        let (_, st) = run(dir, &["state", "--subject", "s"], &[], None);
        let s = &st["subjects"][0];
        if s["status"] == "stale" {
            return s["heartbeat_ms"].as_u64().unwrap();
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
}

fn takeover_args(hb: &str) -> Vec<&str> {
    vec!["takeover", "--subject", "s", "--expect-generation", "1", "--expect-heartbeat-ms", hb, "--request-id", "t-1"]
}

/// What every other command sees of `s`: (generation, owner pid).
fn subject_s(dir: &Path) -> (u64, u64) {
    let (code, st) = run(dir, &["state", "--subject", "s"], &[], None);
    assert_eq!(code, 0, "{st}");
    let s = &st["subjects"][0];
    (s["generation"].as_u64().unwrap(), s["owner"]["pid"].as_u64().unwrap())
}

/// The old owner, still in place, heartbeats under generation 1: not FENCED.
fn old_owner_heartbeats(dir: &Path) {
    let (code, v) = run(dir, &["heartbeat", "--subject", "s", "--generation", "1"], &[], None);
    assert_eq!((code, v["kind"].as_str()), (0, Some("heartbeat")), "{v}");
}

/// Proves: a takeover whose sync fails — a failpoint, and a real EIO from the
/// kernel on `fdatasync` — answers `NOT_COMMITTED` (exit 1, `retryable`), and every
/// later reader and writer sees the old owner at generation 1: `state`, `request
/// show` ("never committed"), the old owner's own heartbeat (not FENCED). Before
/// the fix the answer was IO_ERROR while the takeover was in force (generation 2,
/// the old owner FENCED) from bytes only the page cache held. A retry with the
/// same request id then takes over once, at generation 2.
#[test]
fn a_takeover_whose_sync_fails_leaves_the_old_owner_in_place() {
    for how in ["failpoint", "eio"] {
        let (_t, dir) = common::new_cli_log();
        let hb = stale_owner(&dir).to_string();
        let (code, v) = match how {
            "failpoint" => run(&dir, &takeover_args(&hb), &[("FAILPOINTS", "segment::fdatasync=return")], None),
            _ => run(&dir, &takeover_args(&hb), &[], Some("fdatasync")),
        };
        assert_eq!((code, common::code_of(&v)), (1, "NOT_COMMITTED"), "{how}: {v}");
        if how == "eio" {
            assert!(v["error"]["message"].as_str().unwrap().contains("Input/output error"), "{v}");
        }
        assert_eq!(subject_s(&dir), (1, u64::from(std::process::id())), "{how}: the old owner stays");
        let (_, shown) = run(&dir, &["request", "show", "t-1"], &[], None);
        assert_eq!(shown["status"], "never_committed", "{how}: {shown}");
        old_owner_heartbeats(&dir);
        let hb = stale_heartbeat(&dir).to_string();
        let (code, v) = run(&dir, &takeover_args(&hb), &[], None);
        assert_eq!((code, v["generation"].as_u64()), (0, Some(2)), "{how}: the retry takes over once: {v}");
        let (code, v) = run(&dir, &["inspect", "verify", dir.to_str().unwrap(), "--json"], &[], None);
        assert_eq!((code, v["status"].as_str()), (0, Some("intact")), "{v}");
    }
}

/// Proves: when the sync fails and cutting the group back fails too — a failpoint
/// on the cut, and a real EIO on both `fdatasync` and `fsync` — the command
/// answers `SYNC_FAILED` (exit 1: its outcome unknown) and the log is refused to
/// every writer and every command that answers from it (`claim`, `state`,
/// `heartbeat`: `SYNC_FAILED`, naming segment, offset and sequence), `inspect
/// verify` reports it (`sync_failed`, exit 1), until `repair --cut-from SEQ` cuts
/// the group; after that the old owner is in place and the log goes on.
#[test]
fn a_failed_sync_that_cannot_be_cut_back_halts_the_log_until_repair() {
    for how in ["failpoint", "eio"] {
        let (_t, dir) = common::new_cli_log();
        let hb = stale_owner(&dir).to_string();
        let (code, v) = match how {
            "failpoint" => run(
                &dir,
                &takeover_args(&hb),
                &[("FAILPOINTS", "segment::fdatasync=return;segment::cut_back=return")],
                None,
            ),
            _ => run(&dir, &takeover_args(&hb), &[], Some("fdatasync,fsync")),
        };
        assert_eq!((code, common::code_of(&v)), (1, "SYNC_FAILED"), "{how}: {v}");
        assert_eq!(v["error"]["seq"], 2, "{how}: the group began at record 2: {v}");
        assert!(dir.join(fencelog::storage::SYNC_FAILED_FILE).exists(), "{how}");
        for args in [
            vec!["claim", "--subject", "other"],
            vec!["state"],
            vec!["heartbeat", "--subject", "s", "--generation", "1"],
            vec!["request", "show", "t-1"],
        ] {
            let (code, v) = run(&dir, &args, &[], None);
            assert_eq!((code, common::code_of(&v)), (1, "SYNC_FAILED"), "{how}: {args:?}: {v}");
            assert!(v["error"]["segment"].is_string() && v["error"]["offset"].is_u64(), "{v}");
        }
        let (code, v) = run(&dir, &["inspect", "verify", dir.to_str().unwrap(), "--json"], &[], None);
        assert_eq!(code, 1, "{v}");
        assert!(v["problems"].as_array().unwrap().iter().any(|p| p["kind"] == "sync_failed"), "{v}");
        let (code, v) = run(&dir, &["repair", "--cut-from", "2"], &[], None);
        assert_eq!(code, 0, "{how}: {v}");
        assert_eq!((v["last_seq"].as_u64(), v["intact"].as_bool()), (Some(1), Some(true)), "{v}");
        assert!(!dir.join(fencelog::storage::SYNC_FAILED_FILE).exists());
        assert_eq!(subject_s(&dir), (1, u64::from(std::process::id())), "{how}: the old owner stays");
        old_owner_heartbeats(&dir);
        let (code, v) = run(&dir, &["inspect", "verify", dir.to_str().unwrap(), "--json"], &[], None);
        assert_eq!((code, v["status"].as_str()), (0, Some("intact")), "{v}");
    }
}

/// Proves (review): a failed group cut back across a rotation — the group sealed
/// segment N and created N+1, then its sync failed, so N+1 was removed and N
/// replaced by a new file holding its old prefix (never cut in place: a reader may
/// have N mapped) — does not break another live writer of the log: it adopts the
/// rewritten segment (byte for byte what it knew) and goes on appending; every
/// record it acknowledged is in the log, which verifies intact. Before, the other
/// writer's next turn refused the log ("the segment file was replaced under the
/// writer") and stayed poisoned. Real processes, a real EIO on `fdatasync`; every
/// record fills a segment, so every append rotates.
#[test]
fn a_cut_back_across_a_rotation_leaves_other_writers_appending() {
    use std::io::BufRead;
    let d = tempfile::tempdir().unwrap();
    let dir = d.path().join("log");
    let (segment_bytes_max, torture) = ("300", common::torture_bin());
    fencelog::storage::Log::open(&dir, fencelog::storage::LogOptions { segment_bytes_max: 300, ..Default::default() })
        .unwrap()
        .close()
        .unwrap();
    let mut a = Command::new(&torture)
        .args([dir.to_str().unwrap(), "A", "0", "1", segment_bytes_max])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut a_out = std::io::BufReader::new(a.stdout.take().unwrap());
    let mut acked = vec![];
    let mut next_ack = |acked: &mut Vec<String>| {
        let mut line = String::new();
        assert!(a_out.read_line(&mut line).unwrap() > 0, "writer A stopped: {}", {
            let mut e = String::new();
            let _ = std::io::Read::read_to_string(a.stderr.as_mut().unwrap(), &mut e);
            e
        });
        acked.push(line.split_whitespace().nth(2).unwrap().to_owned());
    };
    next_ack(&mut acked);
    for _ in 0..3 {
        let b = Command::new(&torture)
            .args([
                "eio",
                "fdatasync",
                torture.to_str().unwrap(),
                dir.to_str().unwrap(),
                "B",
                "1",
                "1",
                segment_bytes_max,
            ])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&b.stderr);
        assert!(err.contains("not committed"), "B's append was cut back: {err}");
        let before = acked.len();
        while acked.len() < before + 20 {
            next_ack(&mut acked);
        }
    }
    a.kill().unwrap();
    a.wait().unwrap();
    // A's `kill -9` may land in a rotation (every append rotates here): a
    // segment created torn at the tail — what a crash leaves, not what B's cut
    // back does — which the next writer's open recovers. Recovered, the log
    // must verify intact: B's cut backs, mid-history by now, left no damage.
    let reopened = fencelog::storage::Log::open(
        &dir,
        fencelog::storage::LogOptions { segment_bytes_max: 300, create: false, ..Default::default() },
    )
    .unwrap();
    let repairs = reopened.open_report().repairs.clone();
    reopened.close().unwrap();
    assert!(repairs.len() <= 1, "at most the tail A was killed in: {repairs:?}");
    let in_log: Vec<String> = common::records(&dir).into_iter().map(|(_, p)| String::from_utf8(p).unwrap()).collect();
    for id in &acked {
        assert!(in_log.contains(id), "acknowledged {id} is in the log");
    }
    assert!(!in_log.iter().any(|p| p.starts_with("B-")), "none of B's cut-back records");
    let (code, v) = run(&dir, &["inspect", "verify", dir.to_str().unwrap(), "--json"], &[], None);
    assert_eq!((code, v["status"].as_str()), (0, Some("intact")), "{v}");
}

/// Proves (review): a `SYNC_FAILED` marker that names anything but a segment of
/// the log (a path outside it, a place past a file's end) is not believed: the log
/// is refused as halted all the same, `repair` refuses to act on the marker (exit
/// 2) and changes nothing — no file outside the log is cut, no segment set aside.
#[test]
fn a_forged_sync_failed_marker_makes_repair_touch_nothing() {
    let (t, dir) = common::new_cli_log();
    stale_owner(&dir);
    let victim = t.path().join("victim");
    std::fs::write(&victim, vec![b'v'; 4000]).unwrap();
    for forged in [
        format!(r#"{{"segment":"{}","offset":100,"seq":2,"cause":"x","pid":1}}"#, victim.display()),
        r#"{"segment":"../victim","offset":100,"seq":2,"cause":"x","pid":1}"#.to_owned(),
        r#"{"segment":"00000000000000000001.seg","offset":999999999,"seq":2,"cause":"x","pid":1}"#.to_owned(),
    ] {
        std::fs::write(dir.join(fencelog::storage::SYNC_FAILED_FILE), &forged).unwrap();
        let before = common::hash_tree(&dir);
        let (code, v) = run(&dir, &["state"], &[], None);
        assert_eq!((code, common::code_of(&v)), (1, "SYNC_FAILED"), "{v}");
        let (code, v) = run(&dir, &["repair", "--cut-from", "2"], &[], None);
        assert_eq!(code, 2, "repair refuses a marker naming no place in the log: {v}");
        assert_eq!(common::hash_tree(&dir), before, "nothing in the log changed: {forged}");
        assert_eq!(std::fs::read(&victim).unwrap().len(), 4000, "the file outside the log is untouched");
    }
}

/// Proves (review): a reader that read a group which was then cut back (its sync
/// failed; simulated here by cutting the segment back to where the group began,
/// as `cut_back` does) is told so — `CUT_UNDER_READER` from a tailer, never a
/// silent stall — and a ledger that applied it rebuilds its state from the log:
/// the phantom record is gone from its answers.
#[test]
fn a_reader_of_a_group_cut_back_under_it_is_told_and_a_ledger_rebuilds() {
    use fencelog::ledger::{Ledger, LedgerOptions};
    use fencelog::storage::{Log, LogOptions, Tailer};
    let d = tempfile::tempdir().unwrap();
    let dir = d.path().join("log");
    let log = Log::open(&dir, LogOptions::default()).unwrap();
    let l = Ledger::open(&dir, LedgerOptions::default()).unwrap();
    l.submit(None, common::claim("kept", &common::me())).unwrap();
    drop(l);
    let seg = fencelog::storage::segment_path(&dir, 1);
    let before = fencelog::storage::frames_end(&seg).unwrap();
    let reader = Ledger::open(&dir, LedgerOptions::default()).unwrap();
    let mut t = Tailer::new(&dir, fencelog::format::BODY_BYTES_HARD_MAX, 1);
    t.poll(|_| {}).unwrap();
    // Another writer's group, read by both before its "sync fails".
    let w = Ledger::open(&dir, LedgerOptions::default()).unwrap();
    w.submit(None, common::claim("phantom", &common::me())).unwrap();
    drop(w);
    assert_eq!(t.poll(|_| {}).unwrap(), 1);
    assert!(reader.refresh().unwrap().subject("phantom").is_some(), "read while it was in the page cache");
    // The cut back: the segment ends where the group began.
    std::fs::OpenOptions::new().write(true).open(&seg).unwrap().set_len(before).unwrap();
    let e = t.poll(|_| {}).unwrap_err();
    assert_eq!(e.code(), "CUT_UNDER_READER", "{e}");
    let p = reader.refresh().unwrap();
    assert!(p.subject("phantom").is_none() && p.subject("kept").is_some(), "rebuilt from the log: {p:?}");
    drop(log);
}
