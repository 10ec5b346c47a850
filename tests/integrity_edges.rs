//! Integrity at the edges (issue 7): a partial, tampered, swapped or oversized log
//! is refused, never answered from. Each test works on real files through the real
//! CLI (separate processes) or the embedded API, and opens with what it proves.

mod common;

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use fencelog::ledger::{Ledger, LedgerOptions};
use fencelog::model::{Event, Txn};
use fencelog::storage::{Log, LogOptions, segment_path};
use serde_json::Value;

const FENCELOG: &str = env!("CARGO_BIN_EXE_fencelog");

fn fl(dir: &Path, args: &[&str]) -> (i32, Value) {
    let out = Command::new(FENCELOG).args(args).env("FENCELOG_DIR", dir).output().unwrap();
    let s = String::from_utf8_lossy(&out.stdout);
    (out.status.code().unwrap_or(-1), serde_json::from_str(s.trim()).unwrap_or(Value::Null))
}

/// Run `fencelog ARGS` and return its exit code and its own peak memory (KiB),
/// as the kernel accounts it for that child alone (`wait4`).
fn run_measured(args: &[&str]) -> (i32, i64) {
    let child = Command::new(FENCELOG).args(args).stdout(Stdio::null()).stderr(Stdio::null()).spawn().unwrap();
    let (mut status, mut ru) = (0, unsafe { std::mem::zeroed::<libc::rusage>() });
    let pid = child.id() as i32;
    // Reaped here (wait4 gives this child's own usage); `child` is then only dropped.
    assert_eq!(unsafe { libc::wait4(pid, &mut status, 0, &mut ru) }, pid);
    #[allow(clippy::zombie_processes)]
    drop(child);
    (libc::WEXITSTATUS(status), ru.ru_maxrss)
}

fn code_of(v: &Value) -> &str {
    v["error"]["code"].as_str().unwrap_or("")
}

/// A log with `n` notes spread over small segments, written by the embedded ledger
/// (the first a claim by this test process); returns the directory.
fn small_segment_log(n: u64) -> tempfile::TempDir {
    let d = tempfile::tempdir().unwrap();
    let mut opts = LedgerOptions::default();
    opts.log.segment_bytes_max = 600;
    let l = Ledger::open(d.path(), opts).unwrap();
    let me = fencelog::ledger::identity::probe(std::process::id(), uuid::Uuid::new_v4()).unwrap();
    let claim =
        Event::Claim { subject: "home/a".into(), owner: me, stale_after_ms: 60_000, lock: None, previous: None };
    l.submit(Some(fencelog::model::RequestTag { id: "req-claim".into(), digest: [1; 32] }), |_, t, w| {
        Ok(Txn::new(t, w, vec![claim.clone()]))
    })
    .unwrap();
    for i in 1..n {
        let note = Event::Note { subject: "home/a".into(), generation: 1, text: format!("note {i}") };
        l.submit(None, |_, t, w| Ok(Txn::new(t, w, vec![note.clone()]))).unwrap();
    }
    drop(l);
    d
}

fn init(dir: &Path) {
    let (code, v) = fl(dir, &["init", "--dir", dir.to_str().unwrap()]);
    assert_eq!(code, 0, "{v}");
}

/// Proves, across real processes: two concurrent appending processes, with `LOCK`
/// removed and recreated again and again (a fresh inode each time, as a new writer
/// would create), end with a dense, intact chain holding every record both
/// acknowledged. (The deterministic proof that the old lock failed is
/// `a_deleted_lock_file_does_not_let_a_second_writer_in_beside_the_holder`.)
#[test]
fn two_writer_processes_with_lock_deleted_repeatedly_keep_one_intact_chain() {
    let d = tempfile::tempdir().unwrap();
    let dir = d.path().join("log");
    let dir_s = dir.to_str().unwrap();
    init(&dir);
    let spawn = || {
        Command::new(common::demo_bin())
            .args(["--dir", dir_s, "--records", "3000", "--appenders", "4"])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap()
    };
    let (a, b) = (spawn(), spawn());
    let start = Instant::now();
    while start.elapsed() < Duration::from_millis(1500) {
        let _ = fs::remove_file(dir.join("LOCK"));
        let _ = fs::write(dir.join("LOCK"), b""); // a fresh inode, as a new writer would create
        std::thread::sleep(Duration::from_millis(5));
    }
    for c in [a, b] {
        let out = c.wait_with_output().unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stdout));
    }
    let (code, v) = fl(&dir, &["inspect", "verify", dir_s, "--json"]);
    assert_eq!((code, v["status"].as_str(), v["records"].as_u64()), (0, Some("intact"), Some(6000)), "{v}");
}

/// Proves: a log whose first segment is gone is CORRUPTION (exit 1) for writers and
/// readers alike, naming the missing segment — never a fresh start that hands out
/// generation 1 again; and a log whose segments are all gone while its snapshots
/// remain is CORRUPTION too.
#[test]
fn a_missing_first_segment_or_all_segments_is_corruption_for_every_command() {
    let d = small_segment_log(30);
    let dir = d.path();
    let dir_s = dir.to_str().unwrap();
    assert!(common::segment_files(dir).len() >= 3);
    let snap = Ledger::open(dir, LedgerOptions::default()).unwrap().snapshot_now().unwrap();
    assert!(Path::new(&snap).exists());
    fs::remove_file(segment_path(dir, 1)).unwrap();
    for args in [
        vec!["claim", "--subject", "home/a", "--pid", "1"],
        vec!["state"],
        vec!["request", "show", "req-claim"],
        vec!["note", "--subject", "home/a", "--generation", "1", "--text", "zombie"],
    ] {
        let (code, v) = fl(dir, &args);
        assert_eq!((code, code_of(&v)), (1, "CORRUPTION"), "{args:?}: {v}");
        assert!(v["error"]["message"].as_str().unwrap().contains("00000000000000000001.seg"), "{v}");
    }
    assert_eq!(fl(dir, &["inspect", "verify", dir_s]).0, 1);
    for s in common::segment_files(dir) {
        fs::remove_file(s).unwrap();
    }
    let (code, v) = fl(dir, &["claim", "--subject", "home/a", "--pid", "1"]);
    assert_eq!((code, code_of(&v)), (1, "CORRUPTION"), "{v}");
    assert!(v["error"]["message"].as_str().unwrap().contains("snapshots/"), "{v}");
    assert!(common::segment_files(dir).is_empty(), "nothing was created");
    assert_eq!(fl(dir, &["state"]).0, 1);
}

/// Proves: three stray bytes after a sealed segment make `request show` refuse
/// (CORRUPTION, exit 1) instead of answering `never_committed` for a committed
/// request, and writers report the same CORRUPTION (not WRITER_POISONED).
#[test]
fn stray_bytes_after_a_sealed_segment_are_corruption_for_readers_and_writers() {
    let d = small_segment_log(30);
    let dir = d.path();
    assert_eq!(fl(dir, &["request", "show", "req-claim"]).1["status"], "committed");
    let first = segment_path(dir, 1);
    let mut b = fs::read(&first).unwrap();
    b.extend_from_slice(b"xyz");
    fs::write(&first, &b).unwrap();
    for args in [
        vec!["request", "show", "req-claim"],
        vec!["state"],
        vec!["heartbeat", "--subject", "home/a", "--generation", "1"],
    ] {
        let (code, v) = fl(dir, &args);
        assert_eq!((code, code_of(&v)), (1, "CORRUPTION"), "{args:?}: {v}");
        assert!(v["error"]["message"].as_str().unwrap().contains("00000000000000000001.seg"), "{v}");
    }
}

/// Proves: read commands never write, lock or create: a missing directory and an
/// empty one are NOT_A_LOG (exit 2) and stay as they were; mutations there are
/// NOT_A_LOG with the hint to run `init`; a writer stopped while holding the lock
/// does not block `state`.
#[test]
fn read_commands_never_create_lock_or_write_and_mutations_ask_for_init() {
    let d = tempfile::tempdir().unwrap();
    let missing = d.path().join("missing");
    for args in [vec!["state"], vec!["request", "show", "r"]] {
        let (code, v) = fl(&missing, &args);
        assert_eq!((code, code_of(&v)), (2, "NOT_A_LOG"), "{v}");
        assert!(!missing.exists());
    }
    let empty = d.path().join("empty");
    fs::create_dir(&empty).unwrap();
    fs::set_permissions(&empty, fs::Permissions::from_mode(0o700)).unwrap();
    assert_eq!(fl(&empty, &["state"]).0, 2);
    let (code, v) = fl(&empty, &["claim", "--subject", "a", "--pid", "1"]);
    assert_eq!((code, code_of(&v)), (2, "NOT_A_LOG"), "{v}");
    assert!(v["error"]["message"].as_str().unwrap().contains("fencelog init --dir"), "{v}");
    assert_eq!(fs::read_dir(&empty).unwrap().count(), 0, "nothing was created");
    let (code, v) = fl(&missing, &["claim", "--subject", "a", "--pid", "1"]);
    assert_eq!((code, code_of(&v)), (2, "NOT_A_LOG"), "{v}");
    assert!(!missing.exists(), "a typo never creates a log");

    init(&empty);
    let before = common::hash_tree(&empty);
    let holder = fs::File::open(&empty).unwrap();
    fs4::FileExt::lock(&holder).unwrap(); // a writer holding the append lock, stopped
    // The lock stays held for the rest of the test: a `state` that needed it would
    // end LOCK_TIMEOUT (exit 1), never 0.
    let (code, v) = fl(&empty, &["state"]);
    assert_eq!((code, v["last_seq"].as_u64()), (0, Some(0)), "state answered without the lock: {v}");
    assert_eq!(common::hash_tree(&empty), before, "state changed nothing");
}

/// Proves: on a torn tail, read commands answer from the intact prefix and say
/// `torn_tail: true`, and leave the bytes for the next writer to cut.
#[test]
fn a_torn_tail_is_answered_from_the_intact_prefix_and_reported() {
    let d = tempfile::tempdir().unwrap();
    let dir = d.path();
    init(dir);
    let sleeper = Command::new("sleep").arg("60").spawn().unwrap();
    let pid = sleeper.id().to_string();
    assert_eq!(fl(dir, &["claim", "--subject", "t/a", "--pid", &pid]).0, 0);
    let seg = segment_path(dir, 1);
    let mut b = fs::read(&seg).unwrap();
    b.extend_from_slice(&[200, 0, 0, 0, 1, 2, 3, 4, 5, 6]); // half a frame
    fs::write(&seg, &b).unwrap();
    let before = common::hash_tree(dir);
    let (code, v) = fl(dir, &["state"]);
    assert_eq!((code, v["torn_tail"].as_bool(), v["last_seq"].as_u64()), (0, Some(true), Some(1)), "{v}");
    assert_eq!(common::hash_tree(dir), before);
    let (code, _) = fl(dir, &["heartbeat", "--subject", "t/a", "--generation", "1"]);
    assert_eq!(code, 0, "the next writer cuts the torn tail");
    assert_eq!(fl(dir, &["state"]).1["torn_tail"], false);
    drop(sleeper);
}

/// Proves: a complete last record that fails its checksum with no zeroed sector is
/// rot, not a torn write: refused (CORRUPTION, exit 1, naming `repair`), never cut
/// silently; `repair --cut-from SEQ` cuts it on purpose and keeps the bytes; a last
/// record whose sector was zeroed (a torn write) is cut on open.
#[test]
fn a_rotten_last_record_is_refused_until_repair_and_a_zeroed_sector_is_torn() {
    let d = tempfile::tempdir().unwrap();
    let dir = d.path();
    let dir_s = dir.to_str().unwrap();
    init(dir);
    let log = Log::open(dir, LogOptions::default()).unwrap();
    for i in 0..3 {
        log.append(format!("record {i} {}", "x".repeat(600)).as_bytes()).unwrap();
    }
    drop(log);
    let seg = segment_path(dir, 1);
    let good = fs::read(&seg).unwrap();
    let mut rotten = good.clone();
    // The end of the frames (v2 segments hold the end mark and zeros after them).
    let n = fencelog::storage::frames_end(&seg).unwrap() as usize;
    rotten[n - 10] ^= 0x04;
    fs::write(&seg, &rotten).unwrap();
    let err = Log::open(dir, LogOptions::default()).err().expect("refused");
    assert_eq!(err.code(), "CORRUPTION");
    assert!(err.to_string().contains("--cut-from 3"), "{err}");
    assert_eq!(fs::read(&seg).unwrap(), rotten, "nothing was cut");
    assert_eq!(fl(dir, &["inspect", "verify", dir_s]).0, 1);
    let (code, v) = fl(dir, &["repair", "--dir", dir_s, "--cut-from", "4"]);
    assert_eq!((code, code_of(&v)), (2, "INVALID_OPTION"), "cannot cut after the damage: {v}");
    let (code, v) = fl(dir, &["repair", "--dir", dir_s, "--cut-from", "3"]);
    assert_eq!(code, 0, "{v}");
    assert_eq!((v["last_seq"].as_u64(), v["intact"].as_bool()), (Some(2), Some(true)), "{v}");
    let evidence = v["cuts"][0]["evidence"].as_str().unwrap();
    let cut_at = v["cuts"][0]["offset"].as_u64().unwrap() as usize;
    let written = rotten.iter().rposition(|&b| b != 0).unwrap() + 1;
    assert_eq!(fs::read(evidence).unwrap(), &rotten[cut_at..written], "the cut bytes are kept");
    assert_eq!(fl(dir, &["repair", "--dir", dir_s, "--cut-from", "3"]).0, 2, "an intact log is not repaired");

    // A torn write: the last record's final sector never reached the disk.
    let mut torn = good.clone();
    let sector_start = (n - 1) / 512 * 512;
    assert!(n - sector_start >= 16);
    torn[sector_start..].fill(0);
    fs::write(&seg, &torn).unwrap();
    let log = Log::open(dir, LogOptions::default()).unwrap();
    assert_eq!(log.open_report().repairs.len(), 1, "cut as torn");
    assert_eq!(log.open_report().last_seq, 2);
}

/// Proves: a transaction larger than 1 MiB, accepted on append, decodes on replay
/// (one limit for both); a record whose payload does not decode is CORRUPTION for
/// the ledger, never skipped.
#[test]
fn large_transactions_replay_and_undecodable_records_are_corruption() {
    let big = Txn::new(
        1,
        uuid::Uuid::nil(),
        vec![Event::Note { subject: "s".into(), generation: 1, text: "y".repeat(3 << 20) }],
    );
    let bytes = fencelog::model::encode_txn(&big);
    assert!(bytes.len() > 1 << 20);
    assert_eq!(fencelog::model::decode_txn(&bytes).unwrap(), big);

    let d = tempfile::tempdir().unwrap();
    let log = Log::open(d.path(), LogOptions::default()).unwrap();
    log.append(b"\xff\xff\xff not a transaction").unwrap();
    drop(log);
    let err = Ledger::open(d.path(), LedgerOptions::default()).err().expect("refused");
    assert_eq!(err.code(), "CORRUPTION", "{err}");
    let (code, v) = fl(d.path(), &["state"]);
    assert_eq!((code, code_of(&v)), (1, "CORRUPTION"), "{v}");
}

/// Proves: segments are read only if they are regular files of bounded size: a
/// symlink to /dev/zero, a FIFO and a 2 GiB sparse file are refused at once (exit
/// 1), with no memory or evidence in proportion to their claimed size.
#[test]
fn non_regular_and_oversized_segments_are_refused_unread() {
    let d = small_segment_log(20);
    let dir = d.path();
    let last = common::segment_files(dir).pop().unwrap();
    let saved = fs::read(&last).unwrap();
    let run = |what: &str| {
        let mut child = Command::new(FENCELOG)
            .args(["state", "--dir", dir.to_str().unwrap()])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let start = Instant::now();
        while child.try_wait().unwrap().is_none() {
            if start.elapsed() > Duration::from_secs(20) {
                child.kill().unwrap();
                panic!("{what}: state hung");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let out = child.wait_with_output().unwrap();
        let v: Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!((out.status.code(), code_of(&v)), (Some(1), "CORRUPTION"), "{what}: {v}");
        v
    };
    fs::remove_file(&last).unwrap();
    std::os::unix::fs::symlink("/dev/zero", &last).unwrap();
    assert!(run("symlink")["error"]["message"].as_str().unwrap().contains("symbolic link"));
    fs::remove_file(&last).unwrap();
    let c = std::ffi::CString::new(last.to_str().unwrap()).unwrap();
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    assert!(run("fifo")["error"]["message"].as_str().unwrap().contains("not a regular file"));
    fs::remove_file(&last).unwrap();
    fs::write(&last, &saved).unwrap();
    fs::OpenOptions::new().write(true).open(&last).unwrap().set_len(2 << 30).unwrap();
    assert!(run("sparse")["error"]["message"].as_str().unwrap().contains("refused unread"));
    let (code, _) = fl(dir, &["heartbeat", "--subject", "home/a", "--generation", "1"]);
    assert_eq!(code, 1);
    assert!(!fs::read_dir(dir).unwrap().any(|e| e.unwrap().file_name().to_string_lossy().contains("evidence")));
}

/// Proves: entries named like segments with invalid names are reported (inspector)
/// and refused (commands), never skipped; a group-writable log directory is refused
/// with the `chmod 700` command, and the inspector warns but reads it.
#[test]
fn odd_segment_names_and_unsafe_permissions_are_refused() {
    let d = small_segment_log(5);
    let dir = d.path();
    let dir_s = dir.to_str().unwrap();
    for odd in ["99999999999999999999.seg", "000001.seg"] {
        fs::write(dir.join(odd), b"").unwrap();
        let (code, v) = fl(dir, &["state"]);
        assert_eq!((code, code_of(&v)), (1, "CORRUPTION"), "{odd}: {v}");
        let (code, v) = fl(dir, &["inspect", "verify", dir_s, "--json"]);
        assert_eq!((code, v["problems"][0]["kind"].as_str()), (1, Some("odd_segment_name")), "{odd}: {v}");
        fs::remove_file(dir.join(odd)).unwrap();
    }
    use std::os::unix::ffi::OsStrExt;
    let non_utf8 = dir.join(std::ffi::OsStr::from_bytes(b"\xff\xfe.seg"));
    fs::write(&non_utf8, b"").unwrap();
    assert_eq!(fl(dir, &["state"]).0, 1);
    fs::remove_file(&non_utf8).unwrap();

    fs::set_permissions(dir, fs::Permissions::from_mode(0o770)).unwrap();
    let (code, v) = fl(dir, &["heartbeat", "--subject", "home/a", "--generation", "1"]);
    assert_eq!((code, code_of(&v)), (1, "UNSAFE_PERMISSIONS"), "{v}");
    assert!(v["error"]["message"].as_str().unwrap().contains("chmod 700"), "{v}");
    let out = Command::new(FENCELOG).args(["inspect", "verify", dir_s]).output().unwrap();
    assert_eq!(out.status.code(), Some(0));
    assert!(String::from_utf8_lossy(&out.stderr).contains("chmod 700"));
    fs::set_permissions(dir, fs::Permissions::from_mode(0o700)).unwrap();
}

/// Proves: a full disk (here: a file-size limit, so the evidence write fails with
/// EFBIG as it would with ENOSPC) during recovery leaves nothing behind, however
/// often it is retried; with room, the same recovery succeeds and keeps the bytes.
#[test]
fn a_full_disk_during_recovery_leaves_no_partial_evidence() {
    use std::os::unix::process::CommandExt;
    let d = tempfile::tempdir().unwrap();
    let dir = d.path();
    init(dir);
    let seg = segment_path(dir, 1);
    let mut b = fs::read(&seg).unwrap();
    b.extend_from_slice(&(1_000_000u32).to_le_bytes());
    b.extend_from_slice(&[7u8; 200_000]); // a torn frame of 200 KB
    fs::write(&seg, &b).unwrap();
    for _ in 0..3 {
        let mut c = Command::new(FENCELOG);
        c.args(["claim", "--dir", dir.to_str().unwrap(), "--subject", "a", "--pid", "1"]);
        unsafe {
            c.pre_exec(|| {
                libc::signal(libc::SIGXFSZ, libc::SIG_IGN);
                let lim = libc::rlimit { rlim_cur: 64 * 1024, rlim_max: 64 * 1024 };
                libc::setrlimit(libc::RLIMIT_FSIZE, &lim);
                Ok(())
            });
        }
        let out = c.output().unwrap();
        let v: Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!((out.status.code(), code_of(&v)), (Some(1), "IO_ERROR"), "{v}");
        let names: Vec<String> =
            fs::read_dir(dir).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
        assert!(!names.iter().any(|n| n.contains("evidence")), "{names:?}");
        assert_eq!(fs::read(&seg).unwrap(), b, "the segment is untouched");
    }
    let (code, v) = fl(dir, &["claim", "--subject", "a", "--pid", "1"]);
    assert_eq!(code, 0, "{v}");
    let evidence: Vec<_> = fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.to_string_lossy().contains("evidence"))
        .collect();
    assert_eq!(evidence.len(), 1);
    assert_eq!(fs::metadata(&evidence[0]).unwrap().len(), 200_004);
}

/// Proves: a snapshot edited with its CRC recomputed is not adopted (no checkpoint
/// record vouches for its digest): the ledger replays the log instead, and `inspect
/// verify` reports `snapshot_mismatch` (exit 1).
#[test]
fn a_tampered_snapshot_is_not_adopted_and_verify_reports_it() {
    let d = small_segment_log(10);
    let dir = d.path();
    let path = Ledger::open(dir, LedgerOptions::default()).unwrap().snapshot_now().unwrap();
    let l = Ledger::open(dir, LedgerOptions::default()).unwrap();
    assert!(l.open_report().snapshot_seq.is_some(), "{:?}", l.open_report());
    drop(l);
    assert_eq!(fl(dir, &["inspect", "verify", dir.to_str().unwrap()]).0, 0);
    // Forge: generation 1 → 5, re-encode (keeping this build's schema tag, so it is
    // a snapshot this build would read), recompute the CRC.
    let bytes = fs::read(&path).unwrap();
    let (head, body) = bytes.split_at(60);
    let (tag, body) = body.split_at(fencelog::ledger::snapshot::SCHEMA_PREFIX_BYTES);
    let (mut p, _): (fencelog::model::Projection, usize) =
        bincode::serde::decode_from_slice(body, bincode::config::standard()).unwrap();
    p.forge_subject("home/a").unwrap().generation = 5;
    let body = [tag.to_vec(), bincode::serde::encode_to_vec(&p, bincode::config::standard()).unwrap()].concat();
    let mut forged = head[..48].to_vec();
    forged.extend_from_slice(&(body.len() as u64).to_le_bytes());
    forged.extend_from_slice(&crc32fast::hash(&body).to_le_bytes());
    forged.extend_from_slice(&body);
    fs::write(&path, &forged).unwrap();
    let l = Ledger::open(dir, LedgerOptions::default()).unwrap();
    let r = l.open_report().clone();
    assert_eq!(r.snapshot_seq, None, "{r:?}");
    assert!(r.snapshot_warnings.iter().any(|w| w.contains("checkpoint")), "{r:?}");
    assert_eq!(l.projection().subject("home/a").unwrap().generation, 1);
    drop(l);
    let (code, v) = fl(dir, &["inspect", "verify", dir.to_str().unwrap(), "--json"]);
    assert_eq!(code, 1, "{v}");
    assert!(v["problems"].as_array().unwrap().iter().any(|p| p["kind"] == "snapshot_mismatch"), "{v}");
}

/// `fencelog state` on `dir`: its exit code and what it wrote to stderr.
fn state_stderr(dir: &Path) -> (i32, String) {
    let out = Command::new(FENCELOG).args(["state", "--dir", dir.to_str().unwrap()]).output().unwrap();
    (out.status.code().unwrap_or(-1), String::from_utf8_lossy(&out.stderr).into_owned())
}

/// Proves: a snapshot no checkpoint record names yet, stored just now (its
/// writer is appending the checkpoint), is ignored without a warning on stderr —
/// the open report still says why — and warned about once it is a minute old
/// (its writer is gone); a young one whose sequence a checkpoint names with
/// another digest (not the file it vouched for) is warned about at once.
#[test]
fn an_unvouched_snapshot_is_warned_about_unless_its_checkpoint_is_still_on_its_way() {
    let d = small_segment_log(6);
    let dir = d.path();
    let l = Ledger::open(dir, LedgerOptions::default()).unwrap();
    let (seq, link) = (l.projection().last_seq(), l.view().unwrap().chain_head);
    let body = fencelog::ledger::snapshot::body_of(&l.projection());
    drop(l);
    // Stored, and no checkpoint appended: as a writer leaves it for a moment.
    let meta = fencelog::storage::snapshots::write(dir, seq, &link, &body).unwrap();
    let l = Ledger::open(dir, LedgerOptions::default()).unwrap();
    let r = l.open_report().clone();
    assert_eq!(r.snapshot_seq, None, "{r:?}");
    assert!(r.snapshot_warnings.iter().any(|w| w.contains("vouches for it yet")), "{r:?}");
    drop(l);
    let (code, stderr) = state_stderr(dir);
    assert_eq!(code, 0, "{stderr}");
    assert!(!stderr.contains("snapshot ignored"), "{stderr}");

    // A minute old, still unvouched: its writer is gone.
    let f = fs::File::options().write(true).open(&meta.source).unwrap();
    f.set_modified(std::time::SystemTime::now() - std::time::Duration::from_secs(61)).unwrap();
    drop(f);
    let (code, stderr) = state_stderr(dir);
    assert_eq!(code, 0, "{stderr}");
    assert!(stderr.contains("no checkpoint record in the log vouches for it"), "{stderr}");

    // Young again, and a checkpoint names its sequence with another digest.
    let l = Ledger::open(dir, LedgerOptions::default()).unwrap();
    let other = [7u8; 32];
    l.submit(None, move |_, t, w| Ok(Txn::new(t, w, vec![Event::Checkpoint { snapshot_seq: seq, digest: other }])))
        .unwrap();
    drop(l);
    fencelog::storage::snapshots::write(dir, seq, &link, &body).unwrap();
    let (code, stderr) = state_stderr(dir);
    assert_eq!(code, 0, "{stderr}");
    assert!(stderr.contains("no checkpoint record in the log vouches for it"), "{stderr}");
}

/// Proves: `inspect head` prints {seq, chain_head, time_ms}; `verify --expect-head`
/// passes for a kept head and fails with `head_mismatch` for another, and with
/// `log_shorter_than_pinned` once the log is cut before the pinned sequence.
#[test]
fn pinned_heads_detect_rewrites_and_truncation() {
    let d = small_segment_log(6);
    let dir = d.path();
    let dir_s = dir.to_str().unwrap();
    let (code, h) = fl(dir, &["inspect", "head", dir_s, "--json", "--at", "5"]);
    assert_eq!((code, h["seq"].as_u64()), (0, Some(5)), "{h}");
    assert!(h["time_ms"].as_u64().is_some());
    let pin = format!("5:{}", h["chain_head"].as_str().unwrap());
    assert_eq!(fl(dir, &["inspect", "verify", dir_s, "--expect-head", &pin]).0, 0);
    let wrong = format!("5:{}", "0".repeat(64));
    let (code, v) = fl(dir, &["inspect", "verify", dir_s, "--json", "--expect-head", &wrong]);
    assert_eq!((code, v["problems"][0]["kind"].as_str()), (1, Some("head_mismatch")), "{v}");
    let (code, v) =
        fl(dir, &["inspect", "verify", dir_s, "--json", "--expect-head", &format!("99:{}", "a".repeat(64))]);
    assert_eq!((code, v["problems"][0]["kind"].as_str()), (1, Some("log_shorter_than_pinned")), "{v}");
    let (code, _) = fl(dir, &["inspect", "verify", dir_s, "--expect-head", "5:nothex"]);
    assert_eq!(code, 2, "a malformed pin is a usage error");
}

/// Proves: timed-out lock waits never leave a description that later "holds" the
/// lock for someone else. A second process holds the append lock and is stopped:
/// twenty appends of this process time out, each naming the holder's pid; once the
/// holder is gone, this process takes the lock, and while it holds it a third
/// process cannot take it (the abandoned waiters released only their own
/// descriptions); afterwards it can.
#[test]
fn abandoned_lock_waits_never_release_a_lock_another_caller_holds() {
    use std::io::BufRead;
    let d = tempfile::tempdir().unwrap();
    let dir = d.path();
    let log = Log::open(dir, LogOptions { lock_wait_ms_max: 100, ..LogOptions::default() }).unwrap();
    log.append(b"first").unwrap();
    let lock = |wait_ms: &str, hold_ms: &str| {
        Command::new(common::torture_bin())
            .args(["lock", dir.to_str().unwrap(), wait_ms, hold_ms])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap()
    };
    let mut holder = lock("5000", "60000");
    let mut line = String::new();
    std::io::BufReader::new(holder.stdout.as_mut().unwrap()).read_line(&mut line).unwrap();
    assert_eq!(line.trim(), "HELD");
    let pid = holder.id() as i32;
    unsafe { libc::kill(pid, libc::SIGSTOP) };
    for _ in 0..20 {
        match log.append(b"blocked") {
            Err(fencelog::storage::Error::LockTimeout { holder_pid, .. }) => assert_eq!(
                holder_pid,
                Some(pid as u32),
                "/proc/locks: {}",
                std::fs::read_to_string("/proc/locks").unwrap_or_default()
            ),
            other => panic!("expected LOCK_TIMEOUT, got {other:?}"),
        }
    }
    unsafe { libc::kill(pid, libc::SIGKILL) };
    holder.wait().unwrap();
    let me = std::process::id().to_string();
    log.with_lock(|_| {
        for _ in 0..5 {
            let out = lock("50", "0").wait_with_output().unwrap();
            let said = String::from_utf8_lossy(&out.stdout).trim().to_string();
            assert_eq!((out.status.code(), said), (Some(3), format!("TIMEOUT {me}")), "the lock was let go under us");
        }
    })
    .unwrap();
    let out = lock("2000", "0").wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(0));
    assert_eq!(log.append(b"after").unwrap().first_seq, 2, "the writer is not poisoned");
}
/// Proves: mutual exclusion survives `LOCK` being deleted under a live writer. A
/// writer holds the append lock; `LOCK` is removed and a second writer (another
/// open file description, as another process would have) tries to append: it must
/// wait and time out, not append beside the holder — before the fix it appended,
/// and the holder's next write overwrote that acknowledged record.
#[test]
fn a_deleted_lock_file_does_not_let_a_second_writer_in_beside_the_holder() {
    let d = tempfile::tempdir().unwrap();
    let opts = LogOptions { lock_wait_ms_max: 200, ..LogOptions::default() };
    let a = Log::open(d.path(), opts.clone()).unwrap();
    a.append(b"one").unwrap();
    let _ = fs::remove_file(d.path().join("LOCK"));
    let b = Log::open(d.path(), opts.clone()).unwrap();
    let (theirs, mine) = a
        .with_lock(|l| {
            let last_seq = l.last_seq();
            let theirs = b.append(b"theirs");
            (theirs, l.append_if_head(last_seq, vec![b"mine".to_vec()]))
        })
        .unwrap();
    assert!(matches!(theirs, Err(fencelog::storage::Error::LockTimeout { .. })), "{theirs:?}");
    assert_eq!(mine.unwrap().first_seq, 2);
    assert_eq!(b.append(b"later").unwrap().first_seq, 3);
    drop((a, b));
    let got: Vec<Vec<u8>> = common::records(d.path()).into_iter().map(|(_, p)| p).collect();
    assert_eq!(got, vec![b"one".to_vec(), b"mine".to_vec(), b"later".to_vec()]);
}

/// Proves (review findings): a gap before a last segment torn while being created
/// is CORRUPTION, not a torn segment to set aside (which would re-issue the missing
/// sequences); `init` refuses it too.
#[test]
fn a_gap_before_a_torn_last_segment_is_corruption_not_a_torn_creation() {
    let d = small_segment_log(30);
    let dir = d.path();
    let segs = common::segment_files(dir);
    assert!(segs.len() >= 3);
    fs::remove_file(&segs[segs.len() - 2]).unwrap();
    fs::write(&segs[segs.len() - 1], b"").unwrap(); // torn while being created
    for args in [vec!["state"], vec!["heartbeat", "--subject", "home/a", "--generation", "1"]] {
        let (code, v) = fl(dir, &args);
        assert_eq!((code, code_of(&v)), (1, "CORRUPTION"), "{args:?}: {v}");
        assert!(v["error"]["message"].as_str().unwrap().contains("are missing"), "{v}");
    }
    let (code, v) = fl(dir, &["init", "--dir", dir.to_str().unwrap()]);
    assert_eq!((code, code_of(&v)), (1, "CORRUPTION"), "{v}");
    let (code, v) = fl(dir, &["inspect", "verify", dir.to_str().unwrap(), "--json"]);
    assert_eq!((code, v["status"].as_str()), (1, Some("corrupt")), "{v}");
}

/// Proves (review findings): tails that cannot hold a record are torn whatever
/// their length (10 zero bytes); a rotten last record is named as such by read
/// commands, with the `repair` command; a segment named for sequence 0 is an odd
/// name; a pin at sequence 0 is the genesis head; a log directory reached through
/// a symlink works for writers; `repair` refuses what a cut cannot mend.
#[test]
fn review_findings_short_tails_rot_names_zero_segment_pins_symlinks_and_repair_limits() {
    let d = tempfile::tempdir().unwrap();
    let dir = d.path().join("log");
    let dir_s = dir.to_str().unwrap();
    // A version 1 log (a file that ends where its frames end), as earlier builds
    // wrote: the commands keep appending to its segment in that format. (In a v2
    // segment, zeros after the frames are its preallocated space: the v2 tails are
    // covered in `storage_recovery`.)
    fencelog::storage::init(&dir, LogOptions { format_version: 1, ..LogOptions::default() }).unwrap();
    let sleeper = Command::new("sleep").arg("60").spawn().unwrap();
    let pid = sleeper.id().to_string();
    assert_eq!(fl(&dir, &["claim", "--subject", "r/a", "--pid", &pid]).0, 0);
    let seg = segment_path(&dir, 1);
    let good = fs::read(&seg).unwrap();

    let mut short = good.clone();
    short.extend_from_slice(&[0u8; 10]);
    fs::write(&seg, &short).unwrap();
    assert_eq!(fl(&dir, &["state"]).1["torn_tail"], true);
    assert_eq!(fl(&dir, &["heartbeat", "--subject", "r/a", "--generation", "1"]).0, 0, "cut as torn");

    let mut rotten = fs::read(&seg).unwrap();
    let n = rotten.len();
    rotten[n - 5] ^= 0x10;
    fs::write(&seg, &rotten).unwrap();
    let (code, v) = fl(&dir, &["state"]);
    assert_eq!(code, 1, "{v}");
    let msg = v["error"]["message"].as_str().unwrap();
    assert!(msg.contains("--cut-from 2") && !msg.contains("sealed"), "{msg}");
    fs::write(&seg, &good).unwrap();

    fs::write(dir.join("00000000000000000000.seg"), b"").unwrap();
    let (code, v) = fl(&dir, &["inspect", "verify", dir_s, "--json"]);
    assert_eq!((code, v["problems"][0]["kind"].as_str()), (1, Some("odd_segment_name")), "{v}");
    assert_eq!(fl(&dir, &["state"]).0, 1);
    fs::remove_file(dir.join("00000000000000000000.seg")).unwrap();

    let (_, h) = fl(&dir, &["inspect", "head", dir_s, "--json", "--at", "0"]);
    let pin = format!("0:{}", h["chain_head"].as_str().unwrap());
    assert_eq!(fl(&dir, &["inspect", "verify", dir_s, "--expect-head", &pin]).0, 0);

    let link = d.path().join("link");
    std::os::unix::fs::symlink(&dir, &link).unwrap();
    let (code, v) = fl(&link, &["heartbeat", "--subject", "r/a", "--generation", "1"]);
    assert_eq!(code, 0, "{v}");

    fs::OpenOptions::new().write(true).open(&seg).unwrap().set_len(2 << 30).unwrap();
    let (code, v) = fl(&dir, &["repair", "--dir", dir_s, "--cut-from", "1"]);
    assert_eq!(code, 2, "{v}");
    assert!(seg.exists(), "nothing was moved");
    drop(sleeper);
}

/// Proves (review finding): a snapshot file of 1 GiB that is not a snapshot is
/// refused from its header: `state` stays small (max RSS of the child < 200 MB).
#[test]
fn a_huge_bogus_snapshot_is_refused_without_reading_it() {
    let d = small_segment_log(5);
    let dir = d.path();
    let snap = dir.join("snapshots").join(format!("{:020}.snap", 3));
    fs::File::create(&snap).unwrap().set_len(1 << 30).unwrap();
    let (code, rss_kib) = run_measured(&["state", "--dir", dir.to_str().unwrap()]);
    assert_eq!(code, 0);
    assert!(rss_kib < 200 * 1024, "state used {rss_kib} KiB");
}

/// Proves (second review): the first segment is created whole, so a first segment
/// truncated below its header is CORRUPTION for every command — never set aside
/// as a torn creation, which would start a new history and hand out generation 1
/// again.
#[test]
fn a_truncated_first_segment_is_corruption_never_a_new_history() {
    let d = small_segment_log(1);
    let dir = d.path();
    let first = segment_path(dir, 1);
    fs::OpenOptions::new().write(true).open(&first).unwrap().set_len(10).unwrap();
    for args in
        [vec!["state"], vec!["claim", "--subject", "x", "--pid", "1"], vec!["init", "--dir", dir.to_str().unwrap()]]
    {
        let (code, v) = fl(dir, &args);
        assert_eq!((code, code_of(&v)), (1, "CORRUPTION"), "{args:?}: {v}");
    }
    assert_eq!(fs::metadata(&first).unwrap().len(), 10, "nothing was set aside or created");
}

/// Proves (second review): a writer never writes into a file nobody reads. Its
/// segment replaced under it by a file with other bytes (a new inode) makes it
/// refuse its next append; replaced by a byte-for-byte copy (what a cut back
/// across a rotation leaves: the prefix rewritten into a new file) it appends to
/// the new file, where every reader reads it. A segment grown past any segment's
/// size under a writer is refused unread (no evidence file in proportion to it).
#[test]
fn a_segment_replaced_or_grown_under_a_live_writer_is_refused() {
    let d = tempfile::tempdir().unwrap();
    let log = Log::open(d.path(), LogOptions::default()).unwrap();
    log.append(b"one").unwrap();
    let seg = segment_path(d.path(), 1);
    let copy = d.path().join("copy");
    let mut other = fs::read(&seg).unwrap();
    let last = other.iter().rposition(|&b| b == b'e').unwrap(); // the payload's last byte
    other[last] = b'E';
    fs::write(&copy, &other).unwrap();
    fs::rename(&copy, &seg).unwrap();
    let err = log.append(b"two").unwrap_err();
    assert_eq!(err.code(), "CORRUPTION", "{err}");
    assert!(err.to_string().contains("replaced"), "{err}");
    drop(log);

    let d = tempfile::tempdir().unwrap();
    let log = Log::open(d.path(), LogOptions::default()).unwrap();
    log.append(b"one").unwrap();
    let seg = segment_path(d.path(), 1);
    let copy = d.path().join("copy");
    fs::copy(&seg, &copy).unwrap();
    fs::rename(&copy, &seg).unwrap();
    assert_eq!(log.append(b"two").unwrap().first_seq, 2, "appended to the copy, the file at the path");
    drop(log);
    let recs: Vec<Vec<u8>> = common::records(d.path()).into_iter().map(|(_, p)| p).collect();
    assert_eq!(recs, vec![b"one".to_vec(), b"two".to_vec()], "every reader reads both");

    let d = tempfile::tempdir().unwrap();
    let log = Log::open(d.path(), LogOptions::default()).unwrap();
    log.append(b"one").unwrap();
    let seg = segment_path(d.path(), 1);
    fs::OpenOptions::new().write(true).open(&seg).unwrap().set_len(1 << 30).unwrap();
    let err = log.append(b"two").unwrap_err();
    assert!(err.to_string().contains("refused unread"), "{err}");
    let names: Vec<_> = fs::read_dir(d.path()).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert!(!names.iter().any(|n| n.to_string_lossy().contains("evidence")), "{names:?}");
}

/// Proves (second review): records cut from the end at a record boundary (which
/// the chain alone cannot see) are caught by a snapshot that covers them: every
/// command refuses with CORRUPTION instead of re-issuing their sequences.
#[test]
fn a_snapshot_beyond_the_end_of_the_log_means_records_were_cut() {
    let d = tempfile::tempdir().unwrap();
    let dir = d.path();
    let l = Ledger::open(dir, LedgerOptions::default()).unwrap();
    let me = fencelog::ledger::identity::probe(std::process::id(), uuid::Uuid::new_v4()).unwrap();
    for i in 0..10 {
        let claim = Event::Claim {
            subject: format!("c/{i}"),
            owner: me.clone(),
            stale_after_ms: 1,
            lock: None,
            previous: None,
        };
        l.submit(None, |_, t, w| Ok(Txn::new(t, w, vec![claim.clone()]))).unwrap();
    }
    l.snapshot_now().unwrap();
    drop(l);
    // Cut the log after record 5, at a frame boundary.
    let mut offsets = vec![];
    fencelog::storage::scan_dir(dir, 1, LogOptions::default().body_max(), |item| {
        if let fencelog::storage::ScanItem::Record { rec, offset, .. } = item {
            offsets.push((rec.seq, offset));
        }
        true
    })
    .unwrap();
    let cut_at = offsets.iter().find(|(s, _)| *s == 6).unwrap().1;
    fs::OpenOptions::new().write(true).open(segment_path(dir, 1)).unwrap().set_len(cut_at).unwrap();
    for args in [vec!["state"], vec!["note", "--subject", "c/1", "--generation", "1", "--text", "t"]] {
        let (code, v) = fl(dir, &args);
        assert_eq!((code, code_of(&v)), (1, "CORRUPTION"), "{args:?}: {v}");
        assert!(v["error"]["message"].as_str().unwrap().contains("records were cut"), "{v}");
    }
    let (code, v) = fl(dir, &["inspect", "verify", dir.to_str().unwrap(), "--json"]);
    assert_eq!(code, 1, "{v}");
}

/// Proves (second review): a later segment torn while being created is read as a
/// torn tail by read commands (as writers treat it), not as corruption; a crafted
/// large snapshot that no checkpoint vouches for is only streamed, never held.
#[test]
fn a_torn_new_segment_is_a_torn_tail_for_readers_and_unvouched_snapshots_are_not_held() {
    let d = small_segment_log(20);
    let dir = d.path();
    let (_, before) = fl(dir, &["state"]);
    let last = before["last_seq"].as_u64().unwrap();
    // A writer seals a segment (cuts it to its last record) before creating the next.
    let last_seg = common::segment_files(dir).pop().unwrap();
    let sealed_at = fencelog::storage::frames_end(&last_seg).unwrap();
    fs::OpenOptions::new().write(true).open(&last_seg).unwrap().set_len(sealed_at).unwrap();
    for len in [100usize, 30] {
        fs::write(segment_path(dir, last + 1), vec![0u8; len]).unwrap();
        let (code, v) = fl(dir, &["state"]);
        assert_eq!((code, v["torn_tail"].as_bool(), v["last_seq"].as_u64()), (0, Some(true), Some(last)), "{len}: {v}");
    }
    fs::remove_file(segment_path(dir, last + 1)).unwrap();

    // A snapshot header with a valid CRC over 300 MiB of zeros (sparse on disk).
    let body_len: u64 = 300 << 20;
    let mut h = b"FLSNAP01".to_vec();
    h.extend_from_slice(&3u64.to_le_bytes());
    h.extend_from_slice(&[0u8; 32]);
    h.extend_from_slice(&body_len.to_le_bytes());
    let mut crc = crc32fast::Hasher::new();
    let zeros = vec![0u8; 1 << 20];
    for _ in 0..300 {
        crc.update(&zeros);
    }
    h.extend_from_slice(&crc.finalize().to_le_bytes());
    let snap = dir.join("snapshots").join(format!("{:020}.snap", 3));
    fs::write(&snap, &h).unwrap();
    fs::OpenOptions::new().write(true).open(&snap).unwrap().set_len(60 + body_len).unwrap();
    let (code, rss_kib) = run_measured(&["state", "--dir", dir.to_str().unwrap()]);
    assert_eq!(code, 0);
    assert!(rss_kib < 200 * 1024, "state used {rss_kib} KiB");
}

/// Proves (second review): a report is never written into the log directory; an
/// answer that cannot be written to stdout (a full device) exits 1 and says on
/// stderr what was committed; `LOCK` must be a regular file; names that only look
/// like ours are foreign.
#[test]
fn reports_stay_out_of_the_log_lost_answers_are_told_and_lookalike_names_are_foreign() {
    let d = small_segment_log(3);
    let dir = d.path();
    let seg = segment_path(dir, 1);
    let before = fs::read(&seg).unwrap();
    let (code, v) = fl(dir, &["audit", dir.to_str().unwrap(), "--out", seg.to_str().unwrap()]);
    assert_eq!((code, code_of(&v)), (2, "INVALID_INPUT"), "{v}");
    assert_eq!(fs::read(&seg).unwrap(), before);

    let full = fs::OpenOptions::new().write(true).open("/dev/full").unwrap();
    let out = Command::new(FENCELOG)
        .args(["note", "--dir", dir.to_str().unwrap(), "--subject", "home/a", "--generation", "1", "--text", "t"])
        .stdout(full)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("the answer was") && err.contains("\"seq\":4"), "{err}");

    let lock = dir.join("LOCK");
    fs::remove_file(&lock).unwrap();
    fs::create_dir(&lock).unwrap();
    let (code, v) = fl(dir, &["heartbeat", "--subject", "home/a", "--generation", "1"]);
    assert_eq!((code, code_of(&v)), (1, "CORRUPTION"), "{v}");
    fs::remove_dir(&lock).unwrap();

    let e = tempfile::tempdir().unwrap();
    let other = e.path().join("other");
    fs::create_dir(&other).unwrap();
    fs::set_permissions(&other, fs::Permissions::from_mode(0o700)).unwrap();
    fs::write(other.join(".my.seg.backup.tmp"), b"x").unwrap();
    let (code, v) = fl(&other, &["init", "--dir", other.to_str().unwrap()]);
    assert_eq!((code, code_of(&v)), (2, "NOT_A_LOG"), "a foreign file: {v}");
    fs::remove_file(other.join(".my.seg.backup.tmp")).unwrap();
    fs::write(other.join("case.evidence.photos"), b"x").unwrap();
    let (code, v) = fl(&other, &["state"]);
    assert_eq!((code, code_of(&v)), (2, "NOT_A_LOG"), "not a trace of a log: {v}");
}

/// Proves: a sealed segment whose last record's payload imitates frame headers
/// (hundreds of length fields that reach the end of the file) does not fool or
/// stall the history check: past `LAST_RECORD_CANDIDATES_MAX` candidates it scans the
/// segment, finds the real last record, and the log opens and reads whole.
#[test]
fn a_payload_imitating_frames_at_the_end_of_a_sealed_segment_is_read_correctly() {
    let d = tempfile::tempdir().unwrap();
    let opts = LogOptions { segment_bytes_max: 1_200, ..LogOptions::default() };
    let log = Log::open(d.path(), opts.clone()).unwrap();
    let mut payload = vec![b'x'; 1_000];
    for k in 0..150usize {
        let to_end = 80 + 4 * k; // bytes from this field to the end of the segment
        let at = payload.len() - to_end;
        payload[at..at + 4].copy_from_slice(&((to_end - 8) as u32).to_le_bytes());
    }
    log.append(b"first").unwrap();
    log.append(&payload).unwrap();
    log.append(b"in the next segment").unwrap();
    drop(log);
    assert_eq!(common::segment_files(d.path()).len(), 3, "the crafted record ends a sealed segment");
    let log = Log::open(d.path(), opts).unwrap();
    assert_eq!(log.open_report().last_seq, 3);
    drop(log);
    let (code, v) = fl(d.path(), &["inspect", "verify", d.path().to_str().unwrap(), "--json"]);
    assert_eq!((code, v["records"].as_u64()), (0, Some(3)), "{v}");
}

/// Proves: booting from a snapshot, every record the answer rests on is
/// chain-verified — a forged record after the snapshot is CORRUPTION
/// (`chain_mismatch`) for reads and writes — while a forged record before it (not
/// read at boot, as sealed segments are not) is found by `inspect verify`.
#[test]
fn booting_from_a_snapshot_verifies_the_chain_of_every_record_it_applies() {
    for (forged, refused) in [(8u64, true), (3, false)] {
        let d = small_segment_log(6);
        let dir = d.path();
        let l = Ledger::open(dir, LedgerOptions::default()).unwrap();
        l.snapshot_now().unwrap();
        for i in 0..4 {
            let note = Event::Note { subject: "home/a".into(), generation: 1, text: format!("after {i}") };
            l.submit(None, |_, t, w| Ok(Txn::new(t, w, vec![note.clone()]))).unwrap();
        }
        drop(l);
        common::forge_record(dir, forged);
        for args in [vec!["state"], vec!["note", "--subject", "home/a", "--generation", "1", "--text", "t"]] {
            let (code, v) = fl(dir, &args);
            if refused {
                assert_eq!((code, code_of(&v)), (1, "CORRUPTION"), "record {forged}, {args:?}: {v}");
                assert!(v["error"]["message"].as_str().unwrap().contains("chain_mismatch"), "{v}");
            } else {
                assert_eq!(code, 0, "record {forged} (before the snapshot), {args:?}: {v}");
            }
        }
        let (code, v) = fl(dir, &["inspect", "verify", dir.to_str().unwrap(), "--json"]);
        assert_eq!((code, v["problems"][0]["kind"].as_str()), (1, Some("chain_mismatch")), "{v}");
    }
}
