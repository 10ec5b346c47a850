//! The inspector, the audit and the daemon's watch on hostile input (issue 23,
//! items 1–4): a last segment that is a symlink to `/dev/zero`, a FIFO or a huge
//! sparse file is refused unread; a record whose time no calendar can write is
//! printed, never a panic; `repair` cutting a segment that a reader has mapped
//! never kills that reader; a log written with a larger record limit than the
//! default reads intact. Real files, the real binary; each test opens with what it
//! proves.

mod common;

use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use fencelog::ledger::{Ledger, LedgerOptions};
use fencelog::model::{Event, OwnerRef, SettledRequest, Txn};
use fencelog::storage::{Log, LogOptions, ScanItem, scan_dir, segment_path};
use serde_json::Value;

const FENCELOG: &str = env!("CARGO_BIN_EXE_fencelog");

/// Run `fencelog ARGS` under an address-space limit (so that a regression cannot
/// take the machine's memory), waiting for its exit at most `bound` (a hang is a
/// failure, reported as exit `None`). Returns (exit code, peak RSS in KiB, stdout,
/// stderr).
fn run_bounded(args: &[&str], bound: Duration) -> (Option<i32>, i64, String, String) {
    let dir = tempfile::tempdir().unwrap();
    let (out, err) = (dir.path().join("out"), dir.path().join("err"));
    let mut cmd = Command::new(FENCELOG);
    cmd.args(args)
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&out).unwrap())
        .stderr(std::fs::File::create(&err).unwrap());
    // SAFETY: setrlimit is async-signal-safe; nothing else runs between fork and exec.
    unsafe {
        cmd.pre_exec(|| {
            let lim = libc::rlimit { rlim_cur: 8 << 30, rlim_max: 8 << 30 };
            libc::setrlimit(libc::RLIMIT_AS, &lim);
            Ok(())
        });
    }
    let child = cmd.spawn().unwrap();
    let pid = child.id() as i32;
    let started = Instant::now();
    let (mut status, mut ru) = (0, unsafe { std::mem::zeroed::<libc::rusage>() });
    let code = loop {
        // Reaped here (wait4 gives this child's own usage); `child` is only dropped.
        let r = unsafe { libc::wait4(pid, &mut status, libc::WNOHANG, &mut ru) };
        if r == pid {
            break if libc::WIFEXITED(status) {
                Some(libc::WEXITSTATUS(status))
            } else {
                Some(-libc::WTERMSIG(status))
            };
        }
        if started.elapsed() > bound {
            unsafe { libc::kill(pid, libc::SIGKILL) };
            unsafe { libc::wait4(pid, &mut status, 0, &mut ru) };
            break None;
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    #[allow(clippy::zombie_processes)]
    drop(child);
    (code, ru.ru_maxrss, std::fs::read_to_string(out).unwrap(), std::fs::read_to_string(err).unwrap())
}

/// A log made by the CLI with a few claims: one segment, which is the last.
fn small_log() -> (tempfile::TempDir, std::path::PathBuf) {
    let (t, dir) = common::new_cli_log();
    for s in ["a", "b", "c"] {
        let (code, v) = common::fl(&dir, &["claim", "--subject", s]);
        assert_eq!(code, 0, "{v}");
    }
    (t, dir)
}

/// Proves: `inspect verify` on a log whose last segment is a symlink to
/// `/dev/zero`, a FIFO, or a 2 GiB sparse file reports it (`unsafe_segment`,
/// exit 1) without reading it: it returns (a FIFO would block a plain read forever) and
/// its memory stays small (a plain read of `/dev/zero` grows without bound, of the
/// sparse file to 2 GiB). Before the fix, the fingerprint taken around a damaged
/// pass read the last segment with `std::fs::read`.
#[test]
fn verify_refuses_a_hostile_last_segment_unread_in_bounded_memory() {
    const RSS_KIB_MAX: i64 = 256 * 1024;
    for hostile in ["dev-zero-symlink", "fifo", "sparse-2gib"] {
        let (_t, dir) = small_log();
        let seg = segment_path(&dir, 1);
        match hostile {
            "dev-zero-symlink" => {
                std::fs::remove_file(&seg).unwrap();
                std::os::unix::fs::symlink("/dev/zero", &seg).unwrap();
            }
            "fifo" => {
                std::fs::remove_file(&seg).unwrap();
                let c = std::ffi::CString::new(seg.to_str().unwrap()).unwrap();
                assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
            }
            _ => std::fs::OpenOptions::new().write(true).open(&seg).unwrap().set_len(2 << 30).unwrap(),
        }
        for json in [false, true] {
            let mut args = vec!["inspect", "verify", dir.to_str().unwrap()];
            if json {
                args.push("--json");
            }
            let (code, rss_kib, out, err) = run_bounded(&args, Duration::from_secs(120));
            assert_eq!(code, Some(1), "{hostile}: verify must finish, exit 1 (damaged): {out} {err}");
            assert!(rss_kib < RSS_KIB_MAX, "{hostile}: verify used {rss_kib} KiB: the segment was read");
            assert!(out.contains("unsafe_segment"), "{hostile}: {out}");
        }
    }
}

/// A log whose first record (a claim) was written by a clock at `u64::MAX` ms
/// (valid checksum and chain: only the time is absurd), then two ordinary claims.
fn log_with_absurd_time() -> (tempfile::TempDir, std::path::PathBuf) {
    let (t, dir) = common::new_cli_log();
    let absurd = LogOptions { clock: Some(Arc::new(|| u64::MAX)), create: false, ..LogOptions::default() };
    let l = Ledger::open(&dir, LedgerOptions { log: absurd, ..LedgerOptions::default() }).unwrap();
    l.submit(None, common::claim("late", &common::me())).unwrap();
    drop(l);
    for s in ["a", "b"] {
        let (code, v) = common::fl(&dir, &["claim", "--subject", s]);
        assert_eq!(code, 0, "{v}");
    }
    (t, dir)
}

/// Proves: every inspector command, the audit in each format and `inspect follow`
/// print a log holding a record whose `time_ms` is `u64::MAX` (beyond any RFC 3339
/// year) without panicking — before the fix each died with exit 101, "a Display
/// implementation returned an error" — and show that time as its number.
#[test]
fn a_record_whose_time_cannot_be_formatted_is_printed_by_every_tool() {
    let (_t, dir) = log_with_absurd_time();
    let d = dir.to_str().unwrap();
    let commands: Vec<Vec<&str>> = vec![
        vec!["inspect", "verify", d],
        vec!["inspect", "verify", d, "--json"],
        vec!["inspect", "dump", d],
        vec!["inspect", "dump", d, "--raw"],
        vec!["inspect", "dump", d, "--json"],
        vec!["inspect", "stat", d],
        vec!["inspect", "head", d],
        vec!["inspect", "state", d],
        vec!["inspect", "state", d, "--json"],
        vec!["inspect", "follow", d, "--from", "1", "--max-records", "3", "--timeout-ms", "60000"],
        vec!["inspect", "follow", d, "--json", "--from", "1", "--max-records", "3", "--timeout-ms", "60000"],
        vec!["state", "--dir", d],
        vec!["audit", d],
        vec!["audit", d, "--format", "json"],
        vec!["audit", d, "--format", "html"],
    ];
    for args in commands {
        let (code, _, out, err) = run_bounded(&args, Duration::from_secs(120));
        assert!(matches!(code, Some(0 | 4)), "{args:?} exited {code:?}: {err}");
        assert!(!err.contains("panicked"), "{args:?}: {err}");
        if args[1] == "dump" || args[1] == "follow" {
            assert!(out.contains("18446744073709551615"), "{args:?} shows the time as its number: {out}");
        }
    }
}

/// Proves: the daemon's watch streams a record whose time cannot be formatted
/// like any other, and the records after it — before the fix its task panicked
/// there and the stream ended without an error event, so a client that resumed
/// died at the same record forever.
#[test]
fn the_daemons_watch_streams_past_a_record_whose_time_cannot_be_formatted() {
    let (_t, dir) = log_with_absurd_time();
    let mut child = Command::new(FENCELOG)
        .args(["serve", "--dir", dir.to_str().unwrap(), "--listen", "127.0.0.1:0"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut line = String::new();
    std::io::BufRead::read_line(&mut std::io::BufReader::new(child.stdout.as_mut().unwrap()), &mut line).unwrap();
    let ready: Value = serde_json::from_str(line.trim()).unwrap_or_else(|_| panic!("ready line: {line:?}"));
    let addr = ready["listening"].as_str().unwrap().to_owned();
    let token = std::fs::read_to_string(dir.join("serve.token")).unwrap().trim().to_owned();
    let agent: ureq::Agent = ureq::Agent::config_builder().timeout_global(Some(Duration::from_secs(60))).build().into();
    let resp = agent
        .get(&format!("http://{addr}/v1/watch?from=1"))
        .header("Authorization", &format!("Bearer {token}"))
        .call()
        .unwrap();
    let mut reader = std::io::BufReader::new(resp.into_body().into_reader());
    let (mut ids, mut times, mut event) = (vec![], vec![], String::new());
    while ids.len() < 4 {
        line.clear();
        if std::io::BufRead::read_line(&mut reader, &mut line).unwrap() == 0 {
            break;
        }
        let l = line.trim_end();
        if let Some(e) = l.strip_prefix("event:") {
            event = e.trim().to_owned();
        } else if let Some(data) = l.strip_prefix("data:") {
            assert_eq!(event, "record", "{data}");
            let v: Value = serde_json::from_str(data.trim()).unwrap();
            ids.push(v["seq"].as_u64().unwrap());
            times.push(v["time"].as_str().unwrap().to_owned());
        }
    }
    // The three records, then the daemon's own home claim.
    assert_eq!(ids, vec![1, 2, 3, 4], "every record streamed, the absurd one included");
    assert!(times[0].contains("18446744073709551615"), "{times:?}");
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    child.wait().unwrap();
}

/// Proves: `repair` cutting a sealed segment while a reader has it mapped (a
/// reader takes no lock) never takes the mapped pages from under that reader: the
/// reader goes on reading what it mapped. Before the fix, repair truncated the
/// segment in place and the reader died of SIGBUS at its next page (this test
/// process with it). The cut itself is unchanged: evidence kept, the log intact
/// after it.
#[test]
fn repair_cutting_a_segment_a_reader_has_mapped_does_not_kill_the_reader() {
    let d = tempfile::tempdir().unwrap();
    let dir = d.path().join("log");
    let opts = LogOptions { segment_bytes_max: 64 << 10, ..LogOptions::default() };
    let log = Log::open(&dir, opts.clone()).unwrap();
    // ~40 KiB of records per segment, several segments.
    for _ in 0..200 {
        log.append(&vec![7u8; 1000]).unwrap();
    }
    log.close().unwrap();
    let segments = common::segment_files(&dir);
    assert!(segments.len() >= 3, "{segments:?}");
    // Rot in the first (sealed) segment, well past its first page: a repair may cut there.
    let (first_seg, at) = common::record_at(&dir, 40);
    assert_eq!(first_seg, segments[0]);
    let mut bytes = std::fs::read(&first_seg).unwrap();
    bytes[at + 200] ^= 0x55;
    std::fs::write(&first_seg, &bytes).unwrap();
    let mut repaired = None;
    let mut seen_after_repair = 0u64;
    let _ = scan_dir(&dir, 1, opts.body_max(), |item| {
        if let ScanItem::Record { rec, .. } = item {
            if rec.seq == 2 && repaired.is_none() {
                // The reader has segment 1 mapped, at record 2: cut from record 3.
                repaired = Some(fencelog::storage::repair(&dir, 3, &opts).unwrap());
            } else if repaired.is_some() {
                seen_after_repair += 1;
            }
        }
        true
    });
    let report = repaired.expect("repair ran inside the scan");
    assert!(seen_after_repair >= 30, "the reader read on through its mapping: {seen_after_repair} records");
    assert_eq!(report.last_seq, 2);
    assert!(report.intact, "{report:?}");
    assert!(report.cuts.iter().all(|c| c.evidence.exists()), "{report:?}");
    let after = fencelog::storage::verify_dir(&dir, opts.body_max()).unwrap();
    assert!(after.is_intact() && after.last_seq == Some(2), "{after:?}");
}

/// A log written by a writer whose `payload_bytes_max` is 4 MiB, holding a valid
/// transaction of over 1 MiB (a cutover listing 1024 long request ids) between
/// two ordinary claims.
fn log_with_a_large_record() -> (tempfile::TempDir, std::path::PathBuf) {
    let (t, dir) = common::new_cli_log();
    let big = LogOptions { payload_bytes_max: 4 << 20, create: false, ..LogOptions::default() };
    let l = Ledger::open(&dir, LedgerOptions { log: big, ..LedgerOptions::default() }).unwrap();
    l.submit(None, common::claim("before", &common::me())).unwrap();
    // A cutover's list of settled requests: 1024 of them, each id 1020 bytes.
    let settled = (0..1024)
        .map(|i| SettledRequest {
            request: format!("{i:04}").repeat(255),
            op: "claim".into(),
            how: "not_committed".into(),
            seq: None,
        })
        .collect::<Vec<_>>();
    let cutover = Event::Cutover {
        home: OwnerRef { subject: "before".into(), generation: 1 },
        reason: "a large record".into(),
        settled,
        more: 0,
    };
    let c = l.submit(None, |_, t, w| Ok(Txn::new(t, w, vec![cutover.clone()]))).unwrap();
    assert_eq!(c.seq, Some(2));
    drop(l);
    // The CLI's writer has the default limit: it appends no such record, but
    // reads past one.
    let (code, v) = common::fl(&dir, &["claim", "--subject", "after"]);
    assert_eq!(code, 0, "{v}");
    let (seg, at) = common::record_at(&dir, 2);
    let len = u32::from_le_bytes(std::fs::read(seg).unwrap()[at..at + 4].try_into().unwrap());
    assert!(len > (1 << 20) + 72, "record 2 is larger than the default limit: {len}");
    (t, dir)
}

/// Proves: the inspector and the audit read a log whose writer had a larger
/// `payload_bytes_max` than the default (FORMAT.md §5) — verify says intact, dump
/// shows the large record, the audit finds nothing wrong — and so does a writer
/// with the default limit (the CLI's). Before the fix they read with the default
/// limit and reported `length_out_of_range`.
#[test]
fn readers_take_the_record_bound_from_the_log_not_from_the_default() {
    let (_t, dir) = log_with_a_large_record();
    let d = dir.to_str().unwrap();
    let (code, _, out, err) = run_bounded(&["inspect", "verify", d, "--json"], Duration::from_secs(120));
    let v: Value = serde_json::from_str(&out).unwrap_or_else(|_| panic!("{out} {err}"));
    assert_eq!(code, Some(0), "{v}");
    assert_eq!(v["status"], "intact");
    assert_eq!(v["records"], 3);
    let (code, _, out, _) = run_bounded(&["inspect", "dump", d, "--json"], Duration::from_secs(120));
    assert_eq!(code, Some(0));
    let lines: Vec<Value> = out.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(lines.len(), 3, "{out}");
    assert_eq!(lines[1]["kinds"], serde_json::json!(["cutover"]));
    let (code, _, out, _) = run_bounded(&["audit", d, "--format", "json"], Duration::from_secs(120));
    assert_eq!(code, Some(0), "{out}");
    let v: Value = serde_json::from_str(&out).unwrap();
    assert!(v["log_problems"].as_array().is_none_or(|p| p.is_empty()), "{v}");
}

/// Proves: the daemon's watch streams a record larger than the default limit that
/// another writer appended (before the fix the watch read with the default limit,
/// ended the stream with an error event there, and a resumed client met it again).
#[test]
fn the_daemons_watch_streams_a_record_larger_than_the_default_limit() {
    let (_t, dir) = log_with_a_large_record();
    let mut child = Command::new(FENCELOG)
        .args(["serve", "--dir", dir.to_str().unwrap(), "--listen", "127.0.0.1:0"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut line = String::new();
    std::io::BufRead::read_line(&mut std::io::BufReader::new(child.stdout.as_mut().unwrap()), &mut line).unwrap();
    let ready: Value = serde_json::from_str(line.trim()).unwrap_or_else(|_| panic!("ready line: {line:?}"));
    let addr = ready["listening"].as_str().unwrap().to_owned();
    let token = std::fs::read_to_string(dir.join("serve.token")).unwrap().trim().to_owned();
    let agent: ureq::Agent = ureq::Agent::config_builder().timeout_global(Some(Duration::from_secs(60))).build().into();
    let resp = agent
        .get(&format!("http://{addr}/v1/watch?from=1"))
        .header("Authorization", &format!("Bearer {token}"))
        .call()
        .unwrap();
    let mut reader = std::io::BufReader::new(resp.into_body().into_reader());
    let (mut events, mut event) = (vec![], String::new());
    while events.len() < 4 {
        line.clear();
        if std::io::BufRead::read_line(&mut reader, &mut line).unwrap() == 0 {
            break;
        }
        let l = line.trim_end();
        if let Some(e) = l.strip_prefix("event:") {
            event = e.trim().to_owned();
        } else if let Some(data) = l.strip_prefix("data:") {
            events.push((event.clone(), data.trim().to_owned()));
        }
    }
    assert!(events.iter().all(|(e, _)| e == "record"), "{events:?}");
    let seqs: Vec<u64> =
        events.iter().map(|(_, d)| serde_json::from_str::<Value>(d).unwrap()["seq"].as_u64().unwrap()).collect();
    // The three records, then the daemon's own home claim.
    assert_eq!(seqs, vec![1, 2, 3, 4]);
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    child.wait().unwrap();
}

/// Proves (review): a resync through damaged bytes stays linear, whatever they
/// hold. With readers bounded by the format's 64 MiB limit, four bytes at almost
/// every offset of 8 MiB of 0x01 read as a possible length, and checking the CRC
/// at each (as the scanner did) would take hours — holding the append lock for a
/// writer's recovery meanwhile. `inspect verify`, `state` (a reader) and `claim`
/// (a writer's recovery) each finish within the bound and say what they found.
#[test]
fn a_resync_through_megabytes_of_damage_is_linear() {
    let (_t, dir) = small_log();
    let seg = segment_path(&dir, 1);
    let end = common::written_bytes(&seg).len() - fencelog::format::FRAMES_END_MARK.len();
    let f = std::fs::OpenOptions::new().write(true).open(&seg).unwrap();
    std::os::unix::fs::FileExt::write_all_at(&f, &vec![0x01; 8 << 20], end as u64).unwrap();
    drop(f);
    let d = dir.to_str().unwrap();
    for args in
        [vec!["inspect", "verify", d, "--json"], vec!["state", "--dir", d], vec!["claim", "--dir", d, "--subject", "z"]]
    {
        let (code, _, out, err) = run_bounded(&args, Duration::from_secs(120));
        assert!(code.is_some(), "{args:?} did not finish: {err}");
        assert!(!err.contains("panicked"), "{args:?}: {err}");
        assert!(!out.is_empty(), "{args:?} said what it found");
    }
}
