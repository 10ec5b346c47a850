//! Process supervision (issue 10), through the real CLI: real commands, real
//! runner processes, real `kill -9`. Each test opens with what it proves.

mod common;

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use fencelog::ledger::{Ledger, LedgerOptions};
use fencelog::model::{CommandSpec, Event, ProcessEnd, Refusal, Txn};
use serde_json::Value;

const FENCELOG: &str = env!("CARGO_BIN_EXE_fencelog");

fn fl(dir: &Path, args: &[&str]) -> (i32, Value) {
    let out = Command::new(FENCELOG).args(args).env("FENCELOG_DIR", dir).output().unwrap();
    let s = String::from_utf8_lossy(&out.stdout);
    let v = serde_json::from_str(s.trim()).unwrap_or(Value::Null);
    (out.status.code().unwrap_or(-1), v)
}

fn code_of(v: &Value) -> &str {
    v["error"]["code"].as_str().unwrap_or("")
}

fn new_log() -> (tempfile::TempDir, PathBuf) {
    let t = tempfile::tempdir().unwrap();
    let dir = t.path().join("log");
    let (code, v) = fl(&dir, &["init"]);
    assert_eq!(code, 0, "{v}");
    (t, dir)
}

/// `fencelog run [ARGS] -- CMD…` → (exit code, JSON).
fn run(dir: &Path, args: &[&str], cmd: &[&str]) -> (i32, Value) {
    let mut all = vec!["run"];
    all.extend_from_slice(args);
    all.push("--");
    all.extend_from_slice(cmd);
    fl(dir, &all)
}

fn show(dir: &Path, id: u64) -> Value {
    let (code, v) = fl(dir, &["process", "show", &id.to_string()]);
    assert_eq!(code, 0, "{v}");
    v
}

/// Poll until `f(process)` holds (bounded: a test never waits forever).
fn until(dir: &Path, id: u64, what: &str, f: impl Fn(&Value) -> bool) -> Value {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let v = show(dir, id);
        if f(&v) {
            return v;
        }
        assert!(Instant::now() < deadline, "process {id} never became {what}: {v}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A runner started by hand for `id` refuses before spawning anything.
fn assert_runner_starts_nothing(dir: &Path, id: u64) {
    let out = Command::new(FENCELOG)
        .args(["__runner", "--process", &id.to_string()])
        .env("FENCELOG_DIR", dir)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(fencelog::supervisor::runner::EXIT_ALREADY_STARTED));
}

/// Wait, at most 20 s, for `cond` to hold.
fn comes_true(what: &str, cond: impl Fn() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !cond() {
        assert!(Instant::now() < deadline, "waited 20 s for {what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn lines(path: &Path) -> usize {
    fs::read_to_string(path).map(|s| s.lines().count()).unwrap_or(0)
}

/// Members of process group `pgid` still alive (zombies excluded).
fn group_members(pgid: u32) -> Vec<u32> {
    live_processes_where(2, pgid)
}

/// Live (not zombie) processes whose /proc stat field `field` (counted after the
/// state: 1 = parent pid, 2 = process group) is `value`.
fn live_processes_where(field: usize, value: u32) -> Vec<u32> {
    let mut out = vec![];
    for e in fs::read_dir("/proc").unwrap().flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else { continue };
        let Ok(stat) = fs::read_to_string(format!("/proc/{pid}/stat")) else { continue };
        let rest = &stat[stat.rfind(')').unwrap() + 2..];
        let f: Vec<&str> = rest.split_whitespace().collect();
        if f[field].parse::<u32>().ok() == Some(value) && f[0] != "Z" {
            out.push(pid);
        }
    }
    out
}

fn wait_gone(pid: u32) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while fencelog::ledger::identity::start_ticks(pid).is_some() {
        assert!(Instant::now() < deadline, "pid {pid} still alive");
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn kill9(pid: u32) {
    unsafe { libc::kill(pid as i32, libc::SIGKILL) };
}

/// Proves: a short command's result comes back in one call — exit code, output
/// tails and their digests — and its intent, start and exit are three records.
#[test]
fn a_short_command_answers_with_its_exit_code_and_output() {
    let (_t, dir) = new_log();
    let (code, v) = run(&dir, &[], &["sh", "-c", "echo out; echo err >&2; exit 3"]);
    assert_eq!(code, 0, "{v}");
    assert_eq!(v["status"], "failed");
    assert_eq!(v["exit_code"], 3);
    assert_eq!(v["signal"], Value::Null);
    assert_eq!(v["stdout_tail"], "out\n");
    assert_eq!(v["stderr_tail"], "err\n");
    assert_eq!(v["deduplicated"], false);
    assert_eq!(v["stdout"]["kept_blake3"], blake3::hash(b"out\n").to_hex().as_str());
    assert_eq!(
        (v["requested_seq"].as_u64(), v["started_seq"].as_u64(), v["ended_seq"].as_u64()),
        (Some(1), Some(2), Some(3))
    );
    let (code, ok) = run(&dir, &[], &["true"]);
    assert_eq!((code, ok["status"].as_str(), ok["exit_code"].as_i64()), (0, Some("succeeded"), Some(0)));
    // The kept output is a file of its own, 0600, read back raw by `process logs`.
    let out = Command::new(FENCELOG)
        .args(["process", "logs", "1", "--stream", "stderr"])
        .env("FENCELOG_DIR", &dir)
        .output()
        .unwrap();
    assert_eq!(out.stdout, b"err\n");
    use std::os::unix::fs::PermissionsExt;
    let mode = fs::metadata(dir.join("processes/1/stdout")).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600);
}

/// Proves: with --wait-ms 50 a long command answers at once with a running
/// handle; `process wait` later returns the result under the same id.
#[test]
fn a_long_command_returns_a_handle_and_wait_returns_its_result() {
    let (_t, dir) = new_log();
    let (code, v) = run(&dir, &["--wait-ms", "50"], &["sh", "-c", "sleep 0.5; echo finished"]);
    assert_eq!(code, 0, "{v}");
    // A handle: running (or, on a loaded machine, its runner not started yet).
    assert!(v["status"] == "running" || v["status"] == "requested", "{v}");
    assert!(v.get("exit_code").is_none(), "not terminal: no exit code field: {v}");
    let r = until(&dir, 1, "started", |v| v["pid"].as_u64().is_some());
    assert!(r["status"] == "running" || r["status"] == "succeeded", "{r}");
    let id = v["id"].as_u64().unwrap().to_string();
    let (code, w) = fl(&dir, &["process", "wait", &id, "--timeout-ms", "20000"]);
    assert_eq!(code, 0, "{w}");
    assert_eq!(
        (w["id"].as_u64(), w["status"].as_str(), w["stdout_tail"].as_str()),
        (Some(1), Some("succeeded"), Some("finished\n"))
    );
    let (code, list) = fl(&dir, &["process", "list", "--status", "succeeded"]);
    assert_eq!((code, list["processes"].as_array().unwrap().len()), (0, 1));
    let (code, bad) = fl(&dir, &["process", "list", "--status", "sleeping"]);
    assert_eq!((code, code_of(&bad)), (2, "INVALID_INPUT"));
    let (code, missing) = fl(&dir, &["process", "show", "99"]);
    assert_eq!((code, code_of(&missing)), (3, "UNKNOWN_PROCESS"));
}

/// Proves: two concurrent `run`s with one request id run the command once (a
/// marker file gets one line); both answer for the same process, one of them
/// deduplicated; a retry after both ended is deduplicated and runs nothing.
#[test]
fn two_concurrent_runs_with_one_request_id_run_the_command_once() {
    let (t, dir) = new_log();
    let marker = t.path().join("marker");
    let script = format!("echo ran >> {}; sleep 0.2", marker.display());
    for round in 0..3 {
        let id = format!("once-{round}");
        let spawn = || {
            Command::new(FENCELOG)
                .args(["run", "--request-id", &id, "--", "sh", "-c", &script])
                .env("FENCELOG_DIR", &dir)
                .stdout(Stdio::piped())
                .spawn()
                .unwrap()
        };
        let (a, b) = (spawn(), spawn());
        let (a, b) = (a.wait_with_output().unwrap(), b.wait_with_output().unwrap());
        let a: Value = serde_json::from_slice(&a.stdout).unwrap();
        let b: Value = serde_json::from_slice(&b.stdout).unwrap();
        assert_eq!(a["id"], b["id"], "{a}\n{b}");
        assert_eq!((a["status"].as_str(), b["status"].as_str()), (Some("succeeded"), Some("succeeded")));
        assert_ne!(a["deduplicated"], b["deduplicated"], "exactly one recorded the intent: {a}\n{b}");
        assert_eq!(lines(&marker), round + 1, "round {round}: the command ran exactly once");
        let (code, again) = run(&dir, &["--request-id", &id], &["sh", "-c", &script]);
        assert_eq!((code, again["deduplicated"].as_bool(), again["id"].clone()), (0, Some(true), a["id"].clone()));
        assert_eq!(lines(&marker), round + 1, "a retry after the end ran nothing");
    }
}

/// Proves: the same request id with another command is REQUEST_ID_CONFLICT and
/// the second command never runs.
#[test]
fn the_same_request_id_with_another_command_is_a_conflict_and_never_runs() {
    let (t, dir) = new_log();
    let marker = t.path().join("marker");
    let (code, v) = run(&dir, &["--request-id", "r"], &["true"]);
    assert_eq!((code, v["status"].as_str()), (0, Some("succeeded")));
    let (code, v) = run(&dir, &["--request-id", "r"], &["sh", "-c", &format!("echo ran > {}", marker.display())]);
    assert_eq!((code, code_of(&v)), (3, "REQUEST_ID_CONFLICT"), "{v}");
    // Another --env value is another command too (compared by digest).
    let (code, _) = run(&dir, &["--request-id", "e", "--env", "X=1"], &["true"]);
    assert_eq!(code, 0);
    let (code, v) = run(&dir, &["--request-id", "e", "--env", "X=2"], &["true"]);
    assert_eq!((code, code_of(&v)), (3, "REQUEST_ID_CONFLICT"), "{v}");
    std::thread::sleep(Duration::from_millis(200));
    assert!(!marker.exists(), "the conflicting command never ran");
}

/// Proves: a write lease conflicts at once (LEASE_CONFLICT naming the holder, the
/// command never starts), two read leases coexist, and a process's leases end in
/// the same record as the process.
#[test]
fn write_leases_conflict_fast_read_leases_coexist_and_leases_end_with_the_process() {
    let (t, dir) = new_log();
    let marker = t.path().join("marker");
    let (code, holder) = run(&dir, &["--lease", "db:write", "--wait-ms", "0"], &["sleep", "30"]);
    assert_eq!(code, 0, "{holder}");
    let (code, v) = run(&dir, &["--lease", "db:read"], &["sh", "-c", &format!("echo ran > {}", marker.display())]);
    assert_eq!((code, code_of(&v)), (3, "LEASE_CONFLICT"), "{v}");
    assert_eq!(v["error"]["blockers"][0]["holder"], "process:1");
    // Refused at once, not after waiting for the holder: it has not ended (it
    // sleeps 30 s; on a busy machine its runner may not even have started it).
    let holder_now = show(&dir, 1);
    assert!(["requested", "running"].contains(&holder_now["status"].as_str().unwrap()), "fails fast: {holder_now}");
    // With a wait it still fails once the wait is over, having run nothing.
    let (code, v) = run(&dir, &["--lease", "db:write", "--lease-wait-ms", "200"], &["true"]);
    assert_eq!((code, code_of(&v)), (3, "LEASE_CONFLICT"));
    assert!(!marker.exists());
    let (code, r1) = run(&dir, &["--lease", "cache:read", "--wait-ms", "0"], &["sleep", "30"]);
    assert_eq!(code, 0, "{r1}");
    let (code, r2) = run(&dir, &["--lease", "cache:read", "--wait-ms", "0"], &["sleep", "30"]);
    assert_eq!(code, 0, "two read leases coexist: {r2}");
    // Cancel the writer: its lease ends in its terminal record; now a writer fits.
    let (code, c) = fl(&dir, &["process", "cancel", "1"]);
    assert_eq!(code, 0, "{c}");
    assert_eq!(
        (c["status"].as_str(), c["cancelled"].as_bool(), c["signalled"].as_bool()),
        (Some("cancelled"), Some(true), Some(true))
    );
    assert_eq!(c["leases_released"], serde_json::json!(holder["leases"]));
    let (code, w) = run(&dir, &["--lease", "db:write"], &["true"]);
    assert_eq!((code, w["status"].as_str()), (0, Some("succeeded")), "{w}");
    for id in [r1["id"].as_u64().unwrap(), r2["id"].as_u64().unwrap()] {
        let (code, _) = fl(&dir, &["process", "cancel", &id.to_string()]);
        assert_eq!(code, 0);
    }
    let (_, state) = fl(&dir, &["state"]);
    let live: Vec<&Value> =
        state["leases"].as_array().unwrap().iter().filter(|l| l["state"]["kind"] == "held").collect();
    assert!(live.is_empty(), "every lease ended with its process: {live:?}");
}

/// Proves: a kill -9 of the caller does not stop the run: the runner (its own
/// session) still records the exit.
#[test]
fn kill_9_of_the_caller_leaves_the_runner_to_record_the_exit() {
    let (t, dir) = new_log();
    let marker = t.path().join("marker");
    let mut caller = Command::new(FENCELOG)
        .args(["run", "--", "sh", "-c", &format!("sleep 0.4; echo done > {}", marker.display())])
        .env("FENCELOG_DIR", &dir)
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    // Wait until it is running, then kill the caller.
    let deadline = Instant::now() + Duration::from_secs(10);
    while !dir.join("processes/1/stdout").exists() {
        assert!(Instant::now() < deadline, "never started");
        std::thread::sleep(Duration::from_millis(5));
    }
    caller.kill().unwrap();
    caller.wait().unwrap();
    let v = until(&dir, 1, "terminal", |v| v["status"] != "running");
    assert_eq!(v["status"], "succeeded", "{v}");
    assert_eq!(fs::read_to_string(&marker).unwrap(), "done\n");
}

/// Proves: a kill -9 of the runner leaves no exit record. While its command (or
/// anything in its group) still runs, `recover` leaves it alone and its lease stays
/// held — another writer is refused; once nothing of it runs, `recover` says
/// `completed_unknown` (never a guessed failure), ends its lease in that record,
/// and never runs it again; a second recovery changes nothing.
#[test]
fn kill_9_of_the_runner_is_completed_unknown_on_recovery_and_recovery_is_idempotent() {
    let (t, dir) = new_log();
    let marker = t.path().join("marker");
    let (code, v) = run(
        &dir,
        &["--wait-ms", "0", "--lease", "db:write"],
        &["sh", "-c", &format!("echo ran >> {}; sleep 30", marker.display())],
    );
    assert_eq!(code, 0, "{v}");
    let v = until(&dir, 1, "running", |v| v["status"] == "running");
    let (runner, pid) = (v["runner_pid"].as_u64().unwrap() as u32, v["pid"].as_u64().unwrap() as u32);
    // A live runner is left alone.
    let (code, r) = fl(&dir, &["recover"]);
    assert_eq!((code, r["left_running"].clone()), (0, serde_json::json!([1])), "{r}");
    // The command itself runs (the runner has opened its gate) before the kill.
    comes_true("the command to run", || lines(&marker) == 1);
    kill9(runner);
    wait_gone(runner);
    let (code, r) = fl(&dir, &["recover"]);
    assert_eq!((code, r["runner_gone_command_alive"].clone()), (0, serde_json::json!([1])), "{r}");
    assert_eq!(show(&dir, 1)["status"], "running", "not over while its command runs");
    let (code, e) = run(&dir, &["--lease", "db:write"], &["true"]);
    assert_eq!((code, code_of(&e)), (3, "LEASE_CONFLICT"), "the lease is still held: {e}");
    fencelog::supervisor::runner::signal_group(pid, libc::SIGKILL);
    let deadline = Instant::now() + Duration::from_secs(10);
    while !group_members(pid).is_empty() {
        assert!(Instant::now() < deadline);
        std::thread::sleep(Duration::from_millis(10));
    }
    let (code, r) = fl(&dir, &["recover"]);
    assert_eq!(code, 0, "{r}");
    assert_eq!(r["completed_unknown"], serde_json::json!([1]), "{r}");
    let v = show(&dir, 1);
    assert_eq!(v["status"], "completed_unknown");
    assert_eq!(v["end_code"], "process_dead");
    assert_eq!(v["leases_released"], v["leases"], "its leases ended in the same record");
    let (_, head) = fl(&dir, &["inspect", "head", dir.to_str().unwrap(), "--json"]);
    let (code, again) = fl(&dir, &["recover"]);
    assert_eq!(code, 0);
    assert_eq!(again["completed_unknown"], serde_json::json!([]));
    let (_, head2) = fl(&dir, &["inspect", "head", dir.to_str().unwrap(), "--json"]);
    assert_eq!(head, head2, "a second recovery wrote nothing");
    assert_eq!(lines(&marker), 1, "never run again");
    let (code, w) = run(&dir, &["--lease", "db:write"], &["true"]);
    assert_eq!((code, w["status"].as_str()), (0, Some("succeeded")));
}

/// Proves: a timeout stops the whole process group (TERM, then KILL): no member
/// of it is left, background children included.
#[test]
fn a_timeout_kills_the_whole_process_group_and_leaves_no_orphan() {
    let (_t, dir) = new_log();
    // The shell ignores TERM, so the KILL after the grace is what ends it.
    let (code, v) = run(&dir, &["--timeout-ms", "300"], &["sh", "-c", "trap '' TERM; sleep 30 & sleep 30; wait"]);
    assert_eq!(code, 0, "{v}");
    assert_eq!((v["status"].as_str(), v["timed_out"].as_bool()), (Some("timed_out"), Some(true)), "{v}");
    assert_eq!(v["signal"], libc::SIGKILL);
    let pgid = v["pid"].as_u64().unwrap() as u32;
    let deadline = Instant::now() + Duration::from_secs(5);
    while !group_members(pgid).is_empty() {
        assert!(Instant::now() < deadline, "group {pgid} still has {:?}", group_members(pgid));
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Proves: a command that ends on its own before its timeout (waited for on its
/// pidfd) is recorded with its own exit — its code, not timed out — and one
/// that ends through TERM within the grace is recorded as timed out by that
/// signal. (What the pidfd changes is how soon the end is seen, which a test
/// does not time: `docs/BENCHMARKS.md` has the paired figures. This proves the
/// outcomes stay right under that wait.)
#[test]
fn a_command_ending_before_its_timeout_keeps_its_own_exit_and_a_term_ends_one_that_does_not() {
    let (_t, dir) = new_log();
    let (code, v) = run(&dir, &["--timeout-ms", "60000"], &["sh", "-c", "sleep 0.2; echo done; exit 4"]);
    assert_eq!(code, 0, "{v}");
    assert_eq!(
        (v["status"].as_str(), v["exit_code"].as_i64(), v["timed_out"].as_bool(), v["stdout_tail"].as_str()),
        (Some("failed"), Some(4), Some(false), Some("done\n")),
        "{v}"
    );
    let (code, v) = run(&dir, &["--timeout-ms", "200"], &["sleep", "30"]);
    assert_eq!(code, 0, "{v}");
    assert_eq!((v["status"].as_str(), v["timed_out"].as_bool()), (Some("timed_out"), Some(true)), "{v}");
    assert_eq!(v["signal"], libc::SIGTERM, "{v}");
}

/// Proves: output beyond --output-bytes-max is counted but not kept (truncated),
/// the digest covers exactly what was kept, and the tail is the last bytes seen.
#[test]
fn output_is_bounded_with_a_truncated_flag_a_digest_of_what_was_kept_and_a_tail() {
    let (_t, dir) = new_log();
    let (code, v) = run(&dir, &["--output-bytes-max", "1000"], &["sh", "-c", "head -c 100000 /dev/zero; printf END"]);
    assert_eq!(code, 0, "{v}");
    let out = &v["stdout"];
    assert_eq!(
        (out["bytes_seen"].as_u64(), out["bytes_kept"].as_u64(), out["truncated"].as_bool()),
        (Some(100_003), Some(1000), Some(true))
    );
    assert_eq!(out["kept_blake3"], blake3::hash(&[0u8; 1000]).to_hex().as_str());
    let tail = v["stdout_tail"].as_str().unwrap();
    assert!(tail.ends_with("END") && tail.len() == 4096, "last 4 KiB seen");
    let logs = Command::new(FENCELOG).args(["process", "logs", "1"]).env("FENCELOG_DIR", &dir).output().unwrap();
    assert_eq!(logs.stdout, vec![0u8; 1000]);
    let (code, big) = run(&dir, &["--output-bytes-max", &(65u64 << 20).to_string()], &["true"]);
    assert_eq!((code, code_of(&big)), (2, "INVALID_INPUT"));
}

/// Proves: both streams are read as they come, never one to its end before the
/// other: a command that fills its stderr pipe (200 KB, several times a pipe's
/// buffer) before it writes a byte of stdout, then writes 200 KB there, runs to
/// its end, and each stream's record counts, keeps and digests its bytes
/// exactly — the interleaving too (a command alternating between them).
#[test]
fn both_output_streams_are_read_as_they_come_and_kept_exactly() {
    let (_t, dir) = new_log();
    let script = "head -c 200000 /dev/zero | tr '\\0' e >&2; head -c 200000 /dev/zero | tr '\\0' o; \
                  for i in 1 2 3 4 5 6 7 8; do head -c 30000 /dev/zero | tr '\\0' x; \
                  head -c 30000 /dev/zero | tr '\\0' y >&2; done";
    let (code, v) = run(&dir, &[], &["sh", "-c", script]);
    assert_eq!((code, v["status"].as_str()), (0, Some("succeeded")), "{v}");
    let want_out: Vec<u8> = [vec![b'o'; 200_000], vec![b'x'; 240_000]].concat();
    let want_err: Vec<u8> = [vec![b'e'; 200_000], vec![b'y'; 240_000]].concat();
    for (name, want) in [("stdout", &want_out), ("stderr", &want_err)] {
        let c = &v[name];
        assert_eq!(
            (c["bytes_seen"].as_u64(), c["bytes_kept"].as_u64(), c["truncated"].as_bool()),
            (Some(want.len() as u64), Some(want.len() as u64), Some(false)),
            "{name}: {v}"
        );
        assert_eq!(c["kept_blake3"], blake3::hash(want).to_hex().as_str(), "{name}");
        let (code, kept, _) = logs(&dir, 1, name);
        assert_eq!((code, kept.len()), (0, want.len()), "{name}");
        assert!(kept == *want, "{name}: the file holds exactly the bytes seen");
    }
}

/// Proves: an owner whose generation was fenced cannot cancel (FENCED, exit 3,
/// before any signal: the command keeps running); the current generation can;
/// and a run for a fenced owner is refused before anything starts.
#[test]
fn a_fenced_owner_cannot_cancel_and_cannot_run() {
    let (t, dir) = new_log();
    let me = std::process::id().to_string();
    let (code, c) = fl(&dir, &["claim", "--subject", "svc", "--pid", &me]);
    assert_eq!(code, 0, "{c}");
    let (code, v) = run(&dir, &["--owner", "svc", "--generation", "1", "--wait-ms", "0"], &["sleep", "30"]);
    assert_eq!(code, 0, "{v}");
    let v = until(&dir, 1, "running", |v| v["status"] == "running");
    let pid = v["pid"].as_u64().unwrap() as u32;
    let (code, _) = fl(&dir, &["rotate-fence", "--subject", "svc", "--generation", "1"]);
    assert_eq!(code, 0);
    let (code, e) = fl(&dir, &["process", "cancel", "1", "--owner", "svc", "--generation", "1"]);
    assert_eq!((code, code_of(&e)), (3, "FENCED"), "{e}");
    std::thread::sleep(Duration::from_millis(100));
    assert!(fencelog::ledger::identity::start_ticks(pid).is_some(), "no signal was sent");
    assert_eq!(show(&dir, 1)["status"], "running");
    let marker = t.path().join("marker");
    let (code, e) =
        run(&dir, &["--owner", "svc", "--generation", "1"], &["sh", "-c", &format!("echo > {}", marker.display())]);
    assert_eq!((code, code_of(&e)), (3, "FENCED"), "{e}");
    // Presenting nothing is not a way around the fence.
    let (code, e) = fl(&dir, &["process", "cancel", "1"]);
    assert_eq!((code, code_of(&e), e["error"]["presented"].as_u64()), (3, "FENCED", Some(0)), "{e}");
    assert!(fencelog::ledger::identity::start_ticks(pid).is_some(), "no signal was sent");
    let (code, ok) = fl(&dir, &["process", "cancel", "1", "--owner", "svc", "--generation", "2"]);
    assert_eq!((code, ok["status"].as_str()), (0, Some("cancelled")), "{ok}");
    // Cancelling what has ended answers with the first outcome, sends nothing —
    // to the current generation; the fenced one is still refused.
    let (code, again) = fl(&dir, &["process", "cancel", "1", "--owner", "svc", "--generation", "2"]);
    assert_eq!((code, again["signalled"].as_bool(), again["status"].as_str()), (0, Some(false), Some("cancelled")));
    let (code, e) = fl(&dir, &["process", "cancel", "1", "--owner", "svc", "--generation", "1"]);
    assert_eq!((code, code_of(&e)), (3, "FENCED"));
    assert!(!marker.exists());
}

/// A spawn intent with no runner, as a caller killed right after recording it
/// leaves behind.
fn orphan_intent(dir: &Path) -> u64 {
    let l = Ledger::open(dir, LedgerOptions::default()).unwrap();
    let command = CommandSpec {
        exe: "/bin/true".into(),
        exe_fingerprint: "x".into(),
        argv: vec!["true".into()],
        cwd: "/".into(),
        env: vec![],
    };
    let e = Event::SpawnRequested {
        fingerprint: [7; 32],
        command,
        owner: None,
        leases: vec![],
        timeout_ms: 0,
        output_bytes_max: 1000,
    };
    let c = l.submit(None, |_, t, w| Ok(Txn::new(t, w, vec![e.clone()]))).unwrap();
    match &c.outcomes[0] {
        fencelog::model::Outcome::SpawnRecorded { process, .. } => *process,
        o => panic!("{o:?}"),
    }
}

/// Proves: an intent no runner started is left alone while young (a runner may be
/// starting) and failed PRESPAWN_ABANDONED once older than the grace; a second
/// terminal record is refused ALREADY_TERMINAL and the first outcome stands.
#[test]
fn prespawn_abandonment_waits_for_the_grace_and_terminal_is_final() {
    let (_t, dir) = new_log();
    let id = orphan_intent(&dir);
    let (code, r) = fl(&dir, &["recover"]);
    assert_eq!((code, r["young_untouched"].clone()), (0, serde_json::json!([id])), "{r}");
    assert_eq!(show(&dir, id)["status"], "requested");
    let (code, r) = fl(&dir, &["recover", "--prespawn-grace-ms", "0"]);
    assert_eq!((code, r["prespawn_abandoned"].clone()), (0, serde_json::json!([id])), "{r}");
    let v = show(&dir, id);
    assert_eq!((v["status"].as_str(), v["end_code"].as_str()), (Some("failed"), Some("PRESPAWN_ABANDONED")));
    let l = Ledger::open(&dir, LedgerOptions::default()).unwrap();
    let end = ProcessEnd::Failed { code: "X".into(), detail: "again".into() };
    let e = l.submit(None, |_, t, w| Ok(Txn::new(t, w, vec![Event::ProcessEnded { process: id, end: end.clone() }])));
    assert!(matches!(e, Err(fencelog::ledger::LedgerError::Refused(Refusal::AlreadyTerminal { .. }))), "{e:?}");
    drop(l);
    // A runner started now for it refuses before spawning anything.
    assert_runner_starts_nothing(&dir, id);
}

/// Proves: a second runner for a process that already started refuses before
/// spawning: the command ran once.
#[test]
fn a_second_runner_for_a_started_process_starts_nothing() {
    let (t, dir) = new_log();
    let marker = t.path().join("marker");
    let (code, v) = run(&dir, &[], &["sh", "-c", &format!("echo ran >> {}", marker.display())]);
    assert_eq!((code, v["status"].as_str()), (0, Some("succeeded")));
    assert_runner_starts_nothing(&dir, 1);
    assert_eq!(lines(&marker), 1);
}

/// Proves: an --env value reaches the command but never the log (only its digest).
#[test]
fn env_values_reach_the_command_but_never_the_log() {
    let (t, dir) = new_log();
    // The command compares with a file, so the secret is not in its arguments either.
    let expected = t.path().join("expected");
    fs::write(&expected, "hunter2-xyzzy").unwrap();
    let check = format!("test \"$SECRET\" = \"$(cat {})\"", expected.display());
    let (code, v) = run(&dir, &["--env", "SECRET=hunter2-xyzzy"], &["sh", "-c", &check]);
    assert_eq!((code, v["status"].as_str()), (0, Some("succeeded")), "{v}");
    assert_eq!(v["command"]["env"][0]["name"], "SECRET");
    for seg in common::segment_files(&dir) {
        let bytes = fs::read(seg).unwrap();
        assert!(!bytes.windows(7).any(|w| w == b"hunter2"), "the secret is in the log");
    }
}

/// Proves, across real kill -9s at every moment of a `run` (before, during and
/// after the intent and the runner's start): retrying with the same request id
/// always ends with the command run exactly once.
#[test]
fn a_retry_after_a_kill_9_of_the_caller_at_any_moment_runs_the_command_once() {
    let (t, dir) = new_log();
    for (i, delay_ms) in [0u64, 2, 5, 8, 12, 20, 40].into_iter().enumerate() {
        let marker = t.path().join(format!("marker-{i}"));
        let id = format!("retry-{i}");
        let script = format!("echo ran >> {}", marker.display());
        let mut caller = Command::new(FENCELOG)
            .args(["run", "--request-id", &id, "--", "sh", "-c", &script])
            .env("FENCELOG_DIR", &dir)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        std::thread::sleep(Duration::from_millis(delay_ms));
        let _ = caller.kill();
        caller.wait().unwrap();
        let (code, v) = run(&dir, &["--request-id", &id], &["sh", "-c", &script]);
        assert_eq!(code, 0, "{v}");
        assert_eq!(v["status"], "succeeded", "{v}");
        std::thread::sleep(Duration::from_millis(50));
        assert_eq!(lines(&marker), 1, "kill after {delay_ms} ms: the command ran exactly once");
    }
}

/// Proves: a lease held by an owner tenure ends in the record that ends the tenure
/// (here a claim over the dead owner), while its process keeps its own lease until
/// it ends; the audit lists at that cutover only that subject's leases and its
/// processes in flight — not another subject's lease — and how each ended.
#[test]
fn owner_leases_end_with_the_tenure_and_the_audit_lists_only_that_subjects_leases_and_processes() {
    let (_t, dir) = new_log();
    let mut owner = Command::new("sleep").arg("60").spawn().unwrap();
    let (code, c) = fl(&dir, &["claim", "--subject", "svc", "--pid", &owner.id().to_string()]);
    assert_eq!(code, 0, "{c}");
    let me = std::process::id().to_string();
    let (code, _) = fl(&dir, &["claim", "--subject", "other", "--pid", &me]);
    assert_eq!(code, 0);
    let (code, l) =
        fl(&dir, &["lease", "acquire", "--resource", "cfg", "--mode", "write", "--owner", "svc", "--generation", "1"]);
    assert_eq!(code, 0, "{l}");
    let owner_lease = l["lease"].as_u64().unwrap();
    let (code, other) = fl(
        &dir,
        &["lease", "acquire", "--resource", "unrelated", "--mode", "write", "--owner", "other", "--generation", "1"],
    );
    assert_eq!(code, 0, "{other}");
    let (code, fenced) =
        fl(&dir, &["lease", "acquire", "--resource", "x", "--mode", "read", "--owner", "svc", "--generation", "7"]);
    assert_eq!((code, code_of(&fenced)), (3, "FENCED"));
    let (code, p) =
        run(&dir, &["--owner", "svc", "--generation", "1", "--lease", "db:write", "--wait-ms", "0"], &["sleep", "30"]);
    assert_eq!(code, 0, "{p}");
    let process_lease = p["leases"][0].as_u64().unwrap();
    until(&dir, 1, "running", |v| v["status"] == "running");
    owner.kill().unwrap();
    owner.wait().unwrap();
    let (code, c) = fl(&dir, &["claim", "--subject", "svc", "--pid", &me]);
    assert_eq!((code, c["generation"].as_u64()), (0, Some(2)), "{c}");
    let (_, state) = fl(&dir, &["state"]);
    let lease = |id: u64| state["leases"].as_array().unwrap().iter().find(|l| l["id"] == id).unwrap().clone();
    assert_eq!(
        lease(owner_lease)["state"],
        serde_json::json!({"kind": "released", "seq": c["seq"]}),
        "ended in the claim's own record"
    );
    assert_eq!(lease(process_lease)["state"]["kind"], "held", "the process holds its own lease until it ends");
    // The process belongs to the retired tenure: recovery leaves it to the new owner.
    let (code, r) = fl(&dir, &["recover"]);
    assert_eq!((code, r["other_owner_untouched"].clone()), (0, serde_json::json!([1])), "{r}");
    let (code, x) = fl(&dir, &["process", "cancel", "1", "--owner", "svc", "--generation", "2"]);
    assert_eq!((code, x["status"].as_str()), (0, Some("cancelled")), "the new owner decides: {x}");
    let (code, audit) = fl(&dir, &["audit", dir.to_str().unwrap(), "--subject", "svc", "--format", "json"]);
    assert_eq!(code, 0, "{audit}");
    let cut = &audit["subjects"][0]["cutovers"][0];
    let leases: Vec<u64> =
        cut["leases_live"].as_array().unwrap().iter().map(|l| l["lease"].as_u64().unwrap()).collect();
    assert_eq!(leases, vec![owner_lease, process_lease], "{cut}");
    assert_eq!(cut["processes_in_flight"][0]["process"], 1);
    assert_eq!(cut["processes_in_flight"][0]["status"], "cancelled");
}

/// Proves: an executable the kernel refuses to execute (here: it is open for
/// writing, ETXTBSY) ends as `failed` with exit code 127 and the reason on stderr —
/// started on record, never run, never left open.
#[test]
fn an_executable_that_cannot_be_executed_fails_with_127_and_says_why() {
    use std::os::unix::fs::PermissionsExt;
    let (t, dir) = new_log();
    let marker = t.path().join("marker");
    let script = t.path().join("script");
    fs::write(&script, format!("#!/bin/sh\necho ran > {}\n", marker.display())).unwrap();
    fs::set_permissions(&script, fs::Permissions::from_mode(0o755)).unwrap();
    let _writer = fs::OpenOptions::new().append(true).open(&script).unwrap();
    let (code, v) = run(&dir, &[], &[script.to_str().unwrap()]);
    assert_eq!(code, 0, "{v}");
    assert_eq!((v["status"].as_str(), v["exit_code"].as_i64()), (Some("failed"), Some(127)), "{v}");
    assert!(v["stderr_tail"].as_str().unwrap().contains("could not be executed"), "{v}");
    assert!(!marker.exists());
}

/// Proves: what a command leaves running in its group when it exits is stopped
/// before its end (and its leases' end) is recorded: no member of the group is
/// left, and the lease is free for the next writer.
#[test]
fn background_children_are_stopped_before_the_end_and_the_lease_are_recorded() {
    let (_t, dir) = new_log();
    let (code, v) = run(&dir, &["--lease", "db:write"], &["sh", "-c", "sleep 30 & echo started"]);
    assert_eq!(code, 0, "{v}");
    assert_eq!((v["status"].as_str(), v["stdout_tail"].as_str()), (Some("succeeded"), Some("started\n")), "{v}");
    assert_eq!(v["stdout"]["truncated"], false, "the pipe closed when the group stopped: {v}");
    let pgid = v["pid"].as_u64().unwrap() as u32;
    assert!(group_members(pgid).is_empty(), "group {pgid} left {:?}", group_members(pgid));
    let (code, w) = run(&dir, &["--lease", "db:write"], &["true"]);
    assert_eq!((code, w["status"].as_str()), (0, Some("succeeded")));
}

/// Proves: a process not yet started is cancelled at once (`cancelled`, it never
/// runs, its leases end); a runner started for it afterwards starts nothing.
#[test]
fn cancelling_a_process_before_it_starts_ends_it_and_it_never_runs() {
    let (_t, dir) = new_log();
    let id = orphan_intent(&dir);
    let (code, c) = fl(&dir, &["process", "cancel", &id.to_string()]);
    assert_eq!(code, 0, "{c}");
    assert_eq!(
        (c["status"].as_str(), c["end_code"].as_str()),
        (Some("cancelled"), Some("CANCELLED_BEFORE_START")),
        "{c}"
    );
    assert_runner_starts_nothing(&dir, id);
}

/// Proves: a process run for a generation that was fenced, whose runner and
/// command died, is left by a plain `recover` to the current owner, who settles it
/// with `recover --owner S --generation G` (its lease then ends); a fenced
/// generation cannot.
#[test]
fn the_current_owner_settles_processes_of_its_subjects_earlier_generations() {
    let (_t, dir) = new_log();
    let me = std::process::id().to_string();
    let (code, _) = fl(&dir, &["claim", "--subject", "svc", "--pid", &me]);
    assert_eq!(code, 0);
    let (code, v) = run(
        &dir,
        &["--owner", "svc", "--generation", "1", "--lease", "disk:write", "--wait-ms", "0"],
        &["sleep", "30"],
    );
    assert_eq!(code, 0, "{v}");
    let v = until(&dir, 1, "running", |v| v["status"] == "running");
    let (runner, pid) = (v["runner_pid"].as_u64().unwrap() as u32, v["pid"].as_u64().unwrap() as u32);
    let (code, _) = fl(&dir, &["rotate-fence", "--subject", "svc", "--generation", "1"]);
    assert_eq!(code, 0);
    kill9(runner);
    wait_gone(runner);
    fencelog::supervisor::runner::signal_group(pid, libc::SIGKILL);
    wait_gone(pid);
    let (code, r) = fl(&dir, &["recover"]);
    assert_eq!((code, r["other_owner_untouched"].clone()), (0, serde_json::json!([1])), "{r}");
    let (code, e) = fl(&dir, &["recover", "--owner", "svc", "--generation", "1"]);
    assert_eq!((code, code_of(&e)), (3, "FENCED"), "{e}");
    let (code, r) = fl(&dir, &["recover", "--owner", "svc", "--generation", "2"]);
    assert_eq!((code, r["completed_unknown"].clone()), (0, serde_json::json!([1])), "{r}");
    let (code, w) = run(&dir, &["--lease", "disk:write"], &["true"]);
    assert_eq!((code, w["status"].as_str()), (0, Some("succeeded")), "the lease ended: {w}");
}

/// Proves: output files are created 0600 in a 0700 directory and never through a
/// symbolic link: a link planted where the output goes is set aside, and its
/// target is untouched.
#[test]
fn output_files_never_follow_a_planted_link_and_are_private() {
    use std::os::unix::fs::PermissionsExt;
    let (t, dir) = new_log();
    let victim = t.path().join("victim");
    fs::write(&victim, "precious").unwrap();
    let d = dir.join("processes/1");
    fs::create_dir_all(&d).unwrap();
    fs::set_permissions(&d, fs::Permissions::from_mode(0o755)).unwrap();
    std::os::unix::fs::symlink(&victim, d.join("stdout")).unwrap();
    let (code, v) = run(&dir, &[], &["sh", "-c", "echo OVERWRITTEN"]);
    assert_eq!((code, v["status"].as_str()), (0, Some("succeeded")), "{v}");
    assert_eq!(fs::read_to_string(&victim).unwrap(), "precious");
    assert_eq!(fs::read_to_string(d.join("stdout")).unwrap(), "OVERWRITTEN\n");
    assert_eq!(fs::metadata(&d).unwrap().permissions().mode() & 0o777, 0o700);
    for f in ["stdout", "stderr", "runner.log"] {
        assert_eq!(fs::symlink_metadata(d.join(f)).unwrap().permissions().mode() & 0o777, 0o600, "{f}");
    }
    let aside = fs::read_dir(&d)
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with("stdout.set-aside-"))
        .count();
    assert_eq!(aside, 1, "the planted link is kept aside");
}

/// Proves: a descriptor the caller inherited (a pipe its own caller waits on) is not
/// held by the runner or the command: with --wait-ms 0 the pipe ends when `run` does.
#[test]
fn the_runner_does_not_hold_descriptors_the_caller_inherited() {
    use std::io::Read;
    use std::os::fd::{AsRawFd, FromRawFd};
    use std::os::unix::process::CommandExt;
    let (_t, dir) = new_log();
    let mut fds = [0; 2];
    assert_eq!(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) }, 0);
    let (mut r, w) = unsafe { (fs::File::from_raw_fd(fds[0]), fs::File::from_raw_fd(fds[1])) };
    let wfd = w.as_raw_fd();
    let mut cmd = Command::new(FENCELOG);
    cmd.args(["run", "--wait-ms", "0", "--", "sleep", "600"]).env("FENCELOG_DIR", &dir).stdout(Stdio::null());
    // As a shell does with `7>&1`: fd 7 of the caller, inherited.
    unsafe {
        cmd.pre_exec(move || {
            if libc::dup2(wfd, 7) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let status = cmd.status().unwrap();
    assert!(status.success());
    drop(w);
    let mut buf = Vec::new();
    r.read_to_end(&mut buf).unwrap();
    // The pipe closed while the command still runs (a condition, not a time).
    let v = until(&dir, 1, "started", |v| v["pid"].as_u64().is_some());
    assert_eq!(show(&dir, 1)["status"], "running", "the pipe stayed open for the command's lifetime");
    fencelog::supervisor::runner::signal_group(v["pid"].as_u64().unwrap() as u32, libc::SIGKILL);
    until(&dir, 1, "ended", |v| v["status"] != "running");
}

/// Proves: a runner whose binary was replaced on disk (a package upgrade) is still
/// alive to `recover` (the running image is fingerprinted by device and inode),
/// and so is an owner whose executable was replaced: a second claim is refused.
#[test]
fn a_binary_replaced_on_disk_does_not_make_a_live_runner_or_owner_dead() {
    let (t, dir) = new_log();
    let bin = t.path().join("fencelog-copy");
    fs::copy(FENCELOG, &bin).unwrap();
    // The command ends when the test says so (a file appears), not after a time
    // that a busy machine could overrun before `recover` looks.
    let go = t.path().join("go");
    let script = format!("while [ ! -e {} ]; do sleep 0.02; done", go.display());
    let out = common::retry_busy(|| {
        Command::new(&bin).args(["run", "--wait-ms", "0", "--", "sh", "-c", &script]).env("FENCELOG_DIR", &dir).output()
    });
    assert!(out.status.success());
    until(&dir, 1, "running", |v| v["status"] == "running");
    let fresh = t.path().join("fencelog-copy.new");
    fs::copy(FENCELOG, &fresh).unwrap();
    fs::rename(&fresh, &bin).unwrap();
    let (code, r) = fl(&dir, &["recover"]);
    assert_eq!((code, r["left_running"].clone()), (0, serde_json::json!([1])), "{r}");
    fs::write(&go, b"").unwrap();
    let v = until(&dir, 1, "terminal", |v| v["status"] != "running");
    assert_eq!(v["status"], "succeeded", "the runner recorded the real exit: {v}");

    let sleep = t.path().join("sleep-copy");
    fs::copy("/bin/sleep", &sleep).unwrap();
    let mut owner = common::retry_busy(|| Command::new(&sleep).arg("30").spawn());
    // Claimed for it once it is the copy (exec done), not after a pause.
    let deadline = Instant::now() + Duration::from_secs(20);
    while fs::read_link(format!("/proc/{}/exe", owner.id())).ok().as_deref() != Some(sleep.as_path()) {
        assert!(Instant::now() < deadline, "the owner never became the copy");
        std::thread::sleep(Duration::from_millis(5));
    }
    let (code, c) = fl(&dir, &["claim", "--subject", "upgraded", "--pid", &owner.id().to_string()]);
    assert_eq!(code, 0, "{c}");
    let fresh = t.path().join("sleep-copy.new");
    fs::copy("/bin/sleep", &fresh).unwrap();
    fs::rename(&fresh, &sleep).unwrap();
    let me = std::process::id().to_string();
    let (code, e) = fl(&dir, &["claim", "--subject", "upgraded", "--pid", &me]);
    assert_eq!((code, code_of(&e)), (3, "ALREADY_ACTIVE"), "a live owner is not dead: {e}");
    owner.kill().unwrap();
    owner.wait().unwrap();
}

/// Proves: the limits on a command's size are checked before anything is recorded
/// (INVALID_INPUT, exit 2, the log untouched).
#[test]
fn oversized_commands_are_refused_before_anything_is_recorded() {
    let (_t, dir) = new_log();
    let many: Vec<String> = (0..=fencelog::model::ARGS_MAX).map(|i| i.to_string()).collect();
    let mut args: Vec<&str> = vec!["true"];
    args.extend(many.iter().map(String::as_str));
    let (code, e) = run(&dir, &[], &args);
    assert_eq!((code, code_of(&e)), (2, "INVALID_INPUT"), "{e}");
    let long = "x".repeat(fencelog::model::ARGS_BYTES_MAX + 1);
    let (code, e) = run(&dir, &[], &["echo", &long]);
    assert_eq!((code, code_of(&e)), (2, "INVALID_INPUT"), "{e}");
    let leases: Vec<String> = (0..=fencelog::model::PROCESS_LEASES_MAX).map(|i| format!("r{i}:read")).collect();
    let mut flags: Vec<&str> = vec![];
    for l in &leases {
        flags.extend(["--lease", l]);
    }
    let (code, e) = run(&dir, &flags, &["true"]);
    assert_eq!((code, code_of(&e)), (2, "INVALID_INPUT"), "{e}");
    let (_, head) = fl(&dir, &["inspect", "head", dir.to_str().unwrap(), "--json"]);
    assert_eq!(head["seq"], 0, "nothing was recorded: {head}");
}

/// `process logs ID [--stream S]` → (exit code, raw stdout, stderr).
fn logs(dir: &Path, id: u64, stream: &str) -> (i32, Vec<u8>, String) {
    let out = Command::new(FENCELOG)
        .args(["process", "logs", &id.to_string(), "--stream", stream])
        .env("FENCELOG_DIR", dir)
        .output()
        .unwrap();
    (out.status.code().unwrap_or(-1), out.stdout, String::from_utf8_lossy(&out.stderr).into_owned())
}

/// Proves: the output of an ended process is read exactly as far as its exit
/// record says was kept. An empty stream's file is not synced, so after a crash an
/// older file of that name may be back: it never shows. Bytes past what was kept
/// never show. A file that lost kept (synced) bytes is an I/O error naming both
/// counts, never a silently shorter output.
#[test]
fn logs_of_an_ended_process_print_exactly_what_its_exit_record_kept() {
    let (_t, dir) = new_log();
    let (code, v) = run(&dir, &[], &["sh", "-c", "echo hello"]);
    assert_eq!((code, v["status"].as_str()), (0, Some("succeeded")), "{v}");
    assert_eq!((v["stdout"]["bytes_kept"].as_u64(), v["stderr"]["bytes_kept"].as_u64()), (Some(6), Some(0)));
    let d = dir.join("processes/1");
    // An older stderr back under the name (what a crash could leave): not shown.
    fs::write(d.join("stderr"), "an older process's secret\n").unwrap();
    assert_eq!(logs(&dir, 1, "stderr"), (0, vec![], String::new()));
    // Bytes after what was kept: not shown.
    fs::write(d.join("stdout"), "hello\nappended later\n").unwrap();
    assert_eq!(logs(&dir, 1, "stdout").1, b"hello\n");
    // Damage is IO_ERROR (exit 1), and nothing but the error is printed: kept bytes
    // lost (the record's count and the file's named), other bytes of the same
    // length (the digest), the file gone.
    let io_error = |contents: Option<&str>| {
        match contents {
            Some(c) => fs::write(d.join("stdout"), c).unwrap(),
            None => fs::remove_file(d.join("stdout")).unwrap(),
        }
        let (code, out, err) = logs(&dir, 1, "stdout");
        assert_eq!((code, out.first()), (1, Some(&b'{')), "{err}");
        let v: Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(code_of(&v), "IO_ERROR", "{v}");
        v["error"]["message"].as_str().unwrap().to_owned()
    };
    let m = io_error(Some("he"));
    assert!(m.contains("says 6 bytes were kept, the file processes/1/stdout holds 2"), "{m}");
    let m = io_error(Some("HELLO\n"));
    assert!(m.contains("are not the ones its exit record kept"), "{m}");
    let m = io_error(None);
    assert!(m.contains("holds 0"), "{m}");
    // A stream that kept nothing needs no file at all.
    fs::remove_file(d.join("stderr")).unwrap();
    assert_eq!(logs(&dir, 1, "stderr"), (0, vec![], String::new()));
}

/// Proves: a command that leaves something outside its process group holding its
/// output open (a `setsid` grandchild) is still answered, once the output drain
/// bound has passed: what was kept before is recorded (marked truncated: the rest
/// was never read), and `process logs` reads it back, digest checked.
#[test]
fn an_escaped_grandchild_holding_the_output_open_does_not_hold_the_answer() {
    let (t, dir) = new_log();
    let pidfile = t.path().join("escaped.pid");
    let script = format!("echo hi; setsid sh -c 'echo $$ > {}; exec sleep 30' & sleep 0.2", pidfile.display());
    let started = Instant::now();
    let (code, v) = run(&dir, &[], &["sh", "-c", &script]);
    let took = started.elapsed();
    let deadline = Instant::now() + Duration::from_secs(10);
    let escaped: i32 = loop {
        if let Some(pid) = fs::read_to_string(&pidfile).ok().and_then(|s| s.trim().parse().ok()) {
            break pid;
        }
        assert!(Instant::now() < deadline, "the escaped grandchild never wrote its pid");
        std::thread::sleep(Duration::from_millis(20));
    };
    // Answered while the grandchild still holds the output open (it sleeps 30 s).
    let alive = fencelog::ledger::identity::start_ticks(escaped as u32).is_some();
    unsafe { libc::kill(escaped, libc::SIGKILL) };
    assert_eq!((code, v["status"].as_str()), (0, Some("succeeded")), "{v}");
    assert!(alive, "answered only after the grandchild let go of the output ({took:?})");
    assert_eq!((v["stdout_tail"].as_str(), v["stdout"]["truncated"].as_bool()), (Some("hi\n"), Some(true)), "{v}");
    assert_eq!(logs(&dir, 1, "stdout"), (0, b"hi\n".to_vec(), String::new()));
}

/// Proves: a caller napping on a runner's stdout wakes when the runner lets go of
/// it (the outcome settled, or the runner gone), long before its nap would end,
/// and a nap with nothing settled ends unwoken.
#[test]
fn a_caller_wakes_the_moment_its_runner_lets_go_of_the_settled_pipe() {
    use fencelog::supervisor::runner::nap_until_settled;
    use std::os::fd::{FromRawFd, OwnedFd};
    let mut fds = [0; 2];
    assert_eq!(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) }, 0);
    let (r, w) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    assert!(!nap_until_settled(&r, Duration::from_millis(20)), "nothing settled yet");
    let letting_go = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(50));
        drop(w);
    });
    // `true` is woken by the end of file (a nap that times out is `false`).
    assert!(nap_until_settled(&r, Duration::from_secs(600)), "woken by the end of file");
    letting_go.join().unwrap();
}

/// Proves: `process logs --follow` prints a running command's output as it comes
/// and ends, exit 0, once the process has ended and everything its record kept
/// (count and digest checked) is printed.
#[test]
fn logs_follow_prints_the_output_as_it_comes_until_the_end() {
    let (_t, dir) = new_log();
    let (code, v) = run(&dir, &["--wait-ms", "0"], &["sh", "-c", "echo a; sleep 0.5; echo b"]);
    assert_eq!(code, 0, "{v}");
    assert!(matches!(v["status"].as_str(), Some("requested" | "running")), "a handle at once: {v}");
    let out =
        Command::new(FENCELOG).args(["process", "logs", "1", "--follow"]).env("FENCELOG_DIR", &dir).output().unwrap();
    assert_eq!((out.status.code(), out.stdout.as_slice()), (Some(0), &b"a\nb\n"[..]), "{out:?}");
    assert_eq!(show(&dir, 1)["status"], "succeeded");
}

// ---- Spare runners (`supervisor::Spares`: the daemon's and an embedding program's way) ----

fn spare_request(cmd: &[&str], env: &[&str], wait_ms: u64) -> fencelog::supervisor::RunRequest {
    fencelog::supervisor::RunRequest {
        command: cmd.iter().map(|s| s.to_string()).collect(),
        env: env.iter().map(|s| s.to_string()).collect(),
        wait_ms,
        output_bytes_max: fencelog::supervisor::OUTPUT_BYTES_MAX_DEFAULT,
        ..Default::default()
    }
}

fn run_with_spares(
    ledger: &Ledger,
    dir: &Path,
    spares: &fencelog::supervisor::Spares,
    cmd: &[&str],
    env: &[&str],
) -> fencelog::supervisor::ProcessView {
    run_with_spares_waiting(ledger, dir, spares, cmd, env, 20_000)
}

fn run_with_spares_waiting(
    ledger: &Ledger,
    dir: &Path,
    spares: &fencelog::supervisor::Spares,
    cmd: &[&str],
    env: &[&str],
    wait_ms: u64,
) -> fencelog::supervisor::ProcessView {
    let never = std::sync::atomic::AtomicBool::new(false);
    let req = spare_request(cmd, env, wait_ms);
    fencelog::supervisor::run_until(ledger, dir, &req, Path::new(FENCELOG), &never, Some(spares)).expect("run")
}

/// A spare for `dir` kept and left idle (its readiness never read, as in a
/// daemon between requests): one run has the next one started.
fn idle_spare(ledger: &Ledger, dir: &Path, spares: &fencelog::supervisor::Spares) -> u32 {
    let v = run_with_spares(ledger, dir, spares, &["/bin/true"], &[]);
    assert_eq!(v.status.as_str(), "succeeded", "{v:?}");
    let deadline = Instant::now() + Duration::from_secs(20);
    let pid = loop {
        if let Some(pid) = spares.spare_pid() {
            break pid;
        }
        assert!(Instant::now() < deadline, "a spare runner was started");
        std::thread::sleep(Duration::from_millis(5));
    };
    // Long enough for it to have opened the log and be waiting (not a bound on
    // anything: a spare still opening would take the run all the same).
    std::thread::sleep(Duration::from_millis(500));
    pid
}

/// The pid of the runner that recorded `id`'s start.
fn runner_pid(ledger: &Ledger, id: u64) -> u32 {
    ledger.refresh_with(|p| p.processes()[&id].started.as_ref().expect("started").runner.pid).expect("read the log")
}

/// A ready spare for `dir`: one run through `spares` has the next one started.
fn ready_spare(ledger: &Ledger, dir: &Path, spares: &fencelog::supervisor::Spares) -> u32 {
    let v = run_with_spares(ledger, dir, spares, &["/bin/true"], &[]);
    assert_eq!(v.status.as_str(), "succeeded", "{v:?}");
    assert!(spares.wait_ready(dir, Path::new(FENCELOG), Duration::from_secs(20)), "a spare runner became ready");
    spares.spare_pid().expect("a spare is kept")
}

/// Proves: the next run is handed to the spare runner (it records the start and
/// the exit), and the command gets its `--env` values through the hand-over (not
/// the spare's own environment, which was fixed before the run was asked for),
/// with the log holding only their digests, as with a fresh runner.
#[test]
fn a_spare_runner_runs_the_next_command_with_its_env_values() {
    let (_t, dir) = new_log();
    let ledger = Ledger::open(&dir, LedgerOptions::default()).unwrap();
    let spares = fencelog::supervisor::Spares::new();
    let spare = ready_spare(&ledger, &dir, &spares);
    let v = run_with_spares(
        &ledger,
        &dir,
        &spares,
        &["/bin/sh", "-c", "printf %s \"$SPARE_SECRET\" | tr a-z A-Z"],
        &["SPARE_SECRET=hunter2-spare"],
    );
    assert_eq!(v.status.as_str(), "succeeded", "{v:?}");
    assert_eq!(v.terminal.as_ref().unwrap().stdout_tail, "HUNTER2-SPARE");
    assert_eq!(runner_pid(&ledger, v.id), spare, "the spare runner ran it");
    let log: Vec<u8> = fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "seg"))
        .flat_map(|p| fs::read(p).unwrap())
        .collect();
    assert!(!log.windows(13).any(|w| w == b"hunter2-spare"), "no env value in the log");
}

/// Proves: a spare left idle — its word that it is ready never read by anyone, as
/// in a daemon between requests — takes the next run and runs it itself (the
/// caller's end of the channel is read to the end before it closes, so the spare
/// never sees its run reset away).
#[test]
fn an_idle_spare_runner_runs_the_next_command_itself() {
    let (_t, dir) = new_log();
    let ledger = Ledger::open(&dir, LedgerOptions::default()).unwrap();
    let spares = fencelog::supervisor::Spares::new();
    for _ in 0..3 {
        let spare = idle_spare(&ledger, &dir, &spares);
        let v = run_with_spares(&ledger, &dir, &spares, &["/bin/sh", "-c", "echo idle"], &[]);
        assert_eq!(v.status.as_str(), "succeeded", "{v:?}");
        assert_eq!(v.terminal.as_ref().unwrap().stdout_tail, "idle\n");
        assert_eq!(runner_pid(&ledger, v.id), spare, "the idle spare ran it");
    }
}

/// Proves: a run handed to a spare and not waited for (`wait_ms: 0`) still runs,
/// by the spare, to its recorded end.
#[test]
fn a_run_handed_to_a_spare_without_waiting_runs_to_its_end() {
    let (_t, dir) = new_log();
    let ledger = Ledger::open(&dir, LedgerOptions::default()).unwrap();
    let spares = fencelog::supervisor::Spares::new();
    let spare = idle_spare(&ledger, &dir, &spares);
    let v = run_with_spares_waiting(&ledger, &dir, &spares, &["/bin/sh", "-c", "echo later"], &[], 0);
    let id = v.id;
    let p = until(&dir, id, "succeeded", |p| p["status"] == "succeeded");
    assert_eq!(p["stdout_tail"], "later\n");
    assert_eq!(runner_pid(&ledger, id), spare, "the spare ran it");
}

/// Proves: a spare that is gone before its run (killed) costs nothing but its
/// speed: the run starts a fresh runner and answers as usual.
#[test]
fn a_spare_runner_killed_before_its_run_is_replaced_by_a_fresh_runner() {
    let (_t, dir) = new_log();
    let ledger = Ledger::open(&dir, LedgerOptions::default()).unwrap();
    let spares = fencelog::supervisor::Spares::new();
    let spare = ready_spare(&ledger, &dir, &spares);
    kill9(spare);
    wait_gone(spare);
    let v = run_with_spares(&ledger, &dir, &spares, &["/bin/sh", "-c", "echo fresh"], &[]);
    assert_eq!(v.status.as_str(), "succeeded", "{v:?}");
    assert_eq!(v.terminal.as_ref().unwrap().stdout_tail, "fresh\n");
    assert_ne!(runner_pid(&ledger, v.id), spare);
}

/// Proves: a spare that was handed its run and then died without starting it
/// (stopped before the hand-over, killed after it) is followed by a fresh runner,
/// even though no one waits for the answer (`wait_ms: 0`): the command runs once,
/// to its recorded end, never left `requested`.
#[test]
fn a_spare_runner_that_dies_holding_its_run_is_followed_by_a_fresh_runner() {
    let (t, dir) = new_log();
    let ledger = Ledger::open(&dir, LedgerOptions::default()).unwrap();
    let spares = fencelog::supervisor::Spares::new();
    let spare = idle_spare(&ledger, &dir, &spares);
    // SAFETY: signals a process this test started (through `spares`).
    unsafe { libc::kill(spare as i32, libc::SIGSTOP) };
    let marker = t.path().join("marker");
    let script = format!("echo ran >> {}", marker.display());
    // Returns once the run was handed over (the stopped spare's socket buffers it).
    let v = run_with_spares_waiting(&ledger, &dir, &spares, &["/bin/sh", "-c", &script], &[], 0);
    assert_eq!(v.status.as_str(), "requested", "{v:?}");
    kill9(spare);
    let p = until(&dir, v.id, "succeeded", |p| p["status"] == "succeeded");
    assert_ne!(runner_pid(&ledger, v.id), spare, "a fresh runner ran it: {p}");
    assert_eq!(lines(&marker), 1, "the command ran once");
}

/// Proves: a spare runner holds nothing once let go: dropping the `Spares` that
/// keeps it ends it (end of file on its channel), having appended nothing.
#[test]
fn a_spare_runner_let_go_exits_having_appended_nothing() {
    let (_t, dir) = new_log();
    let ledger = Ledger::open(&dir, LedgerOptions::default()).unwrap();
    let spares = fencelog::supervisor::Spares::new();
    let spare = ready_spare(&ledger, &dir, &spares);
    let gates = children_of(spare);
    assert_eq!(gates.len(), 1, "the spare's gate waits beside it: {gates:?}");
    let head = ledger.refresh_with(|p| p.last_seq()).unwrap();
    drop(spares);
    wait_gone(spare);
    wait_gone(gates[0]);
    assert_eq!(ledger.refresh_with(|p| p.last_seq()).unwrap(), head);
}

/// The directories spare runners made their files in ahead, in `dir`
/// (`processes/.spares/PID-TICKS`), by name.
fn spare_preparations(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = fs::read_dir(dir.join("processes/.spares"))
        .map(|d| d.map(|e| e.unwrap().file_name().into_string().unwrap()).collect())
        .unwrap_or_default();
    v.sort();
    v
}

/// The one preparation of spare `pid`, waited for (a spare makes it before it
/// says it is ready, so this finds it at once).
fn preparation_of(dir: &Path, pid: u32) -> String {
    let mine: Vec<String> = spare_preparations(dir).into_iter().filter(|n| n.starts_with(&format!("{pid}-"))).collect();
    assert_eq!(mine.len(), 1, "spare {pid} made one directory ahead: {:?}", spare_preparations(dir));
    mine[0].clone()
}

/// Proves: a ready spare has made its process's files ahead — a private
/// directory holding an empty `runner.log`, `stdout` and `stderr` — and its run
/// takes that very directory as `processes/ID/` (the same inodes, so nothing was
/// created on the way to the answer), writes the command's output there, and
/// leaves nothing behind in `.spares`.
#[test]
fn a_spare_runner_makes_its_process_files_ahead_and_its_run_takes_them() {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let (_t, dir) = new_log();
    let ledger = Ledger::open(&dir, LedgerOptions::default()).unwrap();
    let spares = fencelog::supervisor::Spares::new();
    let spare = ready_spare(&ledger, &dir, &spares);
    let ahead = dir.join("processes/.spares").join(preparation_of(&dir, spare));
    let inode = |p: &Path| fs::symlink_metadata(p).unwrap().ino();
    let made: Vec<(u64, u32)> = ["", "runner.log", "stdout", "stderr"]
        .iter()
        .map(|n| {
            let m = fs::symlink_metadata(ahead.join(n)).unwrap();
            (m.ino(), m.permissions().mode() & 0o777)
        })
        .collect();
    assert_eq!(made.iter().map(|m| m.1).collect::<Vec<_>>(), [0o700, 0o600, 0o600, 0o600], "private");
    let v = run_with_spares(&ledger, &dir, &spares, &["/bin/sh", "-c", "echo out; echo err >&2"], &[]);
    assert_eq!(v.status.as_str(), "succeeded", "{v:?}");
    assert_eq!(runner_pid(&ledger, v.id), spare, "the spare ran it");
    let d = dir.join("processes").join(v.id.to_string());
    let taken: Vec<u64> = ["", "runner.log", "stdout", "stderr"].iter().map(|n| inode(&d.join(n))).collect();
    assert_eq!(taken, made.iter().map(|m| m.0).collect::<Vec<_>>(), "the files made ahead are the process's");
    assert_eq!(fs::read_to_string(d.join("stdout")).unwrap(), "out\n");
    assert_eq!(fs::read_to_string(d.join("stderr")).unwrap(), "err\n");
    assert!(!ahead.exists(), "nothing left of the spare's directory: {:?}", spare_preparations(&dir));
}

/// Proves: a spare whose process's directory already exists (left by an earlier
/// history of the log, with a file where the output goes) does not take it over:
/// the run makes its files there as a fresh runner does — the file found is set
/// aside and kept, never overwritten — and the spare removes what it made ahead.
#[test]
fn a_spare_runner_whose_process_directory_exists_sets_aside_what_it_finds() {
    let (_t, dir) = new_log();
    let ledger = Ledger::open(&dir, LedgerOptions::default()).unwrap();
    let spares = fencelog::supervisor::Spares::new();
    let spare = ready_spare(&ledger, &dir, &spares);
    let ahead = dir.join("processes/.spares").join(preparation_of(&dir, spare));
    let next = ledger.refresh_with(|p| p.processes().keys().max().copied()).unwrap().unwrap() + 1;
    let d = dir.join("processes").join(next.to_string());
    fs::create_dir(&d).unwrap();
    fs::write(d.join("stdout"), "an earlier history's output\n").unwrap();
    let v = run_with_spares(&ledger, &dir, &spares, &["/bin/sh", "-c", "echo now"], &[]);
    assert_eq!((v.id, v.status.as_str()), (next, "succeeded"), "{v:?}");
    assert_eq!(runner_pid(&ledger, v.id), spare, "the spare ran it");
    assert_eq!(fs::read_to_string(d.join("stdout")).unwrap(), "now\n");
    let aside: Vec<String> = fs::read_dir(&d)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| n.starts_with("stdout.set-aside-"))
        .collect();
    assert_eq!(aside.len(), 1, "{aside:?}");
    assert_eq!(fs::read_to_string(d.join(&aside[0])).unwrap(), "an earlier history's output\n");
    assert!(!ahead.exists(), "the spare removed what it made ahead: {:?}", spare_preparations(&dir));
}

/// Proves: what a spare made ahead does not outlive it. Let go, it removes its
/// directory as it exits; killed, it cannot, and the next spare to prepare
/// removes the directories no one holds — and only those: one held (locked, as
/// a live spare of another pid namespace would hold its own, whatever
/// its name says) stays, and so does anything there that is not a directory.
#[test]
fn a_spare_runners_files_made_ahead_do_not_outlive_it() {
    let (_t, dir) = new_log();
    let ledger = Ledger::open(&dir, LedgerOptions::default()).unwrap();
    let spares = fencelog::supervisor::Spares::new();
    let killed = ready_spare(&ledger, &dir, &spares);
    let left = preparation_of(&dir, killed);
    kill9(killed);
    wait_gone(killed);
    assert_eq!(spare_preparations(&dir), [left], "a killed spare leaves its directory");
    // Beside it: a directory held by someone alive (its name no spare's here:
    // only the lock keeps it), an unheld one of another name, and a file.
    let spares_dir = dir.join("processes/.spares");
    fs::create_dir(spares_dir.join("4000000-1")).unwrap();
    let held = fs::File::open(spares_dir.join("4000000-1")).unwrap();
    fs4::FileExt::try_lock(&held).expect("lock the held one");
    fs::create_dir(spares_dir.join("stray")).unwrap();
    fs::write(spares_dir.join("stray/runner.log"), "").unwrap();
    fs::write(spares_dir.join("a-file"), "kept").unwrap();
    // The run starts a fresh runner (its spare is gone), and a new spare is
    // started after it: that one prepares, and removes the killed one's and
    // the stray one.
    let next = ready_spare(&ledger, &dir, &spares);
    let mut want = vec!["4000000-1".to_string(), "a-file".to_string(), preparation_of(&dir, next)];
    want.sort();
    assert_eq!(spare_preparations(&dir), want, "the unheld directories are removed, nothing else");
    drop(held);
    fs::remove_dir(spares_dir.join("4000000-1")).unwrap();
    fs::remove_file(spares_dir.join("a-file")).unwrap();
    drop(spares);
    wait_gone(next);
    assert_eq!(spare_preparations(&dir), Vec::<String>::new(), "a spare let go removes its own");
}

/// The live children of `parent`, from /proc.
fn children_of(parent: u32) -> Vec<u32> {
    live_processes_where(1, parent)
}

/// Proves: `fencelog run` starts its runner as a fork of itself (no exec of
/// `fencelog __runner`): the command's parent is the runner the log names, with
/// the CLI's command line, in a session of its own (as an exec'd runner is) and
/// with `/` as its directory.
#[test]
fn fencelog_run_forks_its_runner() {
    let (_t, dir) = new_log();
    let script = "echo $PPID; tr '\\0' ' ' < /proc/$PPID/cmdline; echo; \
                  cut -d' ' -f6 /proc/$PPID/stat; readlink /proc/$PPID/cwd";
    let (code, v) = run(&dir, &[], &["/bin/sh", "-c", script]);
    assert_eq!(code, 0, "{v}");
    let out = v["stdout_tail"].as_str().unwrap();
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 4, "{out}");
    let runner = v["runner_pid"].as_u64().unwrap();
    assert_eq!(lines[0], runner.to_string(), "the command's parent is its runner");
    assert!(lines[1].contains(" run ") && !lines[1].contains("__runner"), "{out}");
    assert_eq!(lines[2], runner.to_string(), "the runner leads a session of its own");
    assert_eq!(lines[3], "/");
}

/// Proves: `fencelog run`'s forked runner takes the CLI's state over instead of
/// replaying the log: its open reads only what follows the intent (its
/// `ledger opened` line says `handed_over_at` the intent's sequence), and the
/// command runs to its recorded end. An exec'd runner (a run with `--env`
/// values) replays the log.
#[test]
fn a_forked_runner_takes_the_clis_state_over_instead_of_replaying_the_log() {
    let (_t, dir) = new_log();
    for _ in 0..3 {
        assert_eq!(run(&dir, &[], &["/bin/true"]).0, 0);
    }
    let opened = |v: &Value| -> Vec<String> {
        let log = dir.join("processes").join(v["id"].to_string()).join("runner.log");
        let log = fs::read_to_string(&log).unwrap();
        log.lines().filter(|l| l.contains("ledger opened")).map(String::from).collect()
    };
    // Both runners log their open: a forked one keeps the CLI's filter, an
    // exec'd one reads the environment.
    let debug = |args: &[&str]| {
        let out =
            Command::new(FENCELOG).args(args).env("FENCELOG_DIR", &dir).env("RUST_LOG", "fencelog=debug").output();
        let out = out.unwrap();
        (out.status.code().unwrap_or(-1), serde_json::from_slice::<Value>(&out.stdout).unwrap_or(Value::Null))
    };
    let (code, v) = debug(&["run", "--", "/bin/echo", "hi"]);
    assert_eq!((code, v["status"].as_str(), v["stdout_tail"].as_str()), (0, Some("succeeded"), Some("hi\n")), "{v}");
    let lines = opened(&v);
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert!(lines[0].contains(&format!(" handed_over_at={}", v["requested_seq"])), "{lines:?} {v}");
    // Nothing followed the intent: nothing read (the log holds 10 records).
    assert!(lines[0].contains(" read=0 "), "{lines:?}");
    let (code, v) = debug(&["run", "--env", "X_RUN=1", "--", "/bin/true"]);
    assert_eq!((code, v["status"].as_str()), (0, Some("succeeded")), "{v}");
    let lines = opened(&v);
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert!(!lines[0].contains("handed_over_at"), "exec'd, it replays: {lines:?}");
    assert!(lines[0].ends_with(" read=13"), "all 13 records (no snapshot yet): {lines:?}");
}

/// Proves: a forked runner finds its log however the caller named it: `fencelog
/// run --dir log` from the log's parent directory (the runner works in `/`).
/// And a run with `--env` values still execs its runner (the runner would
/// otherwise keep the CLI's command line, values included, for the command's
/// whole life).
#[test]
fn a_forked_runner_finds_a_log_named_by_a_relative_path_and_env_values_get_an_exec() {
    let (t, _dir) = new_log();
    let fl_in = |args: &[&str]| {
        let out = Command::new(FENCELOG).args(args).current_dir(t.path()).env_remove("FENCELOG_DIR").output().unwrap();
        let v: Value = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
        (out.status.code().unwrap_or(-1), v)
    };
    let script = "tr '\\0' ' ' < /proc/$PPID/cmdline";
    let (code, v) = fl_in(&["run", "--dir", "log", "--", "/bin/sh", "-c", script]);
    assert_eq!((code, v["status"].as_str()), (0, Some("succeeded")), "{v}");
    assert!(v["stdout_tail"].as_str().unwrap().contains(" run "), "forked: {v}");
    let (code, v) = fl_in(&["run", "--dir", "log", "--env", "SECRET_X=1", "--", "/bin/sh", "-c", script]);
    assert_eq!((code, v["status"].as_str()), (0, Some("succeeded")), "{v}");
    assert!(v["stdout_tail"].as_str().unwrap().contains("__runner --dir "), "exec'd: {v}");
}

/// Proves: a runner's gate is a fork of the runner (no `exec` of `fencelog
/// __gate`): the spare's gate, waiting beside it, has the runner's command line.
#[test]
fn a_runner_forks_its_gate() {
    let (_t, dir) = new_log();
    let ledger = Ledger::open(&dir, LedgerOptions::default()).unwrap();
    let spares = fencelog::supervisor::Spares::new();
    let spare = idle_spare(&ledger, &dir, &spares);
    let gates = children_of(spare);
    assert_eq!(gates.len(), 1, "the spare's gate waits beside it: {gates:?}");
    let cmdline = |pid: u32| fs::read(format!("/proc/{pid}/cmdline")).unwrap();
    assert_eq!(cmdline(gates[0]), cmdline(spare));
    assert!(String::from_utf8_lossy(&cmdline(spare)).contains("__runner"));
}

/// Proves: a command holds nothing but its three standard descriptors — none of
/// its runner's (the log, the caller's pipe, runner.log, a spare's socket) — both
/// when a fresh runner starts it (`fencelog run`) and when a spare does.
#[test]
fn a_command_holds_only_its_three_standard_descriptors() {
    let (_t, dir) = new_log();
    // `; :` keeps the shell (`$$`) alive while `ls` runs: bash would otherwise exec
    // `ls` in its place, and list `ls`'s own descriptor on the directory too.
    let list = ["/bin/sh", "-c", "ls /proc/$$/fd; :"];
    let (code, v) = run(&dir, &[], &list);
    assert_eq!(code, 0, "{v}");
    assert_eq!(v["stdout_tail"], "0\n1\n2\n", "{v}");
    let ledger = Ledger::open(&dir, LedgerOptions::default()).unwrap();
    let spares = fencelog::supervisor::Spares::new();
    let spare = idle_spare(&ledger, &dir, &spares);
    let v = run_with_spares(&ledger, &dir, &spares, &list, &[]);
    assert_eq!(runner_pid(&ledger, v.id), spare);
    assert_eq!(v.terminal.as_ref().unwrap().stdout_tail, "0\n1\n2\n", "{v:?}");
}

/// Proves: an executable file without a `#!` line runs under /bin/sh, as `execvp`
/// (a shell, `env`, any other launcher) runs it.
#[test]
fn an_executable_script_without_a_shebang_line_runs_under_sh() {
    let (t, dir) = new_log();
    let script = t.path().join("no-shebang");
    fs::write(&script, "echo \"ran as a script: $1\"\n").unwrap();
    fs::set_permissions(&script, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let (code, v) = run(&dir, &[], &[script.to_str().unwrap(), "arg"]);
    assert_eq!(code, 0, "{v}");
    assert_eq!(v["status"], "succeeded", "{v}");
    assert_eq!(v["stdout_tail"], "ran as a script: arg\n", "{v}");
}

/// Ignored signals as /proc/PID/status shows them (`SigIgn`, a hex mask).
fn sig_ign(status: &str) -> u64 {
    let line = status.lines().find(|l| l.starts_with("SigIgn:")).expect("a SigIgn line");
    u64::from_str_radix(line["SigIgn:".len()..].trim(), 16).unwrap()
}

/// Proves: a command starts with the signal dispositions of the program that
/// asked for it, less what fencelog's own machinery ignores — SIGPIPE (a Rust
/// program ignores it) and glibc's internal 32 and 33 (`posix_spawn` leaves them
/// ignored) are back to their defaults — and with nothing blocked.
#[test]
fn a_command_starts_with_default_signal_dispositions_and_nothing_blocked() {
    let (_t, dir) = new_log();
    let mine = sig_ign(&fs::read_to_string("/proc/self/status").unwrap());
    let expected = mine & !(1 << (libc::SIGPIPE - 1)) & !(1 << 31) & !(1 << 32);
    let (code, v) = run(&dir, &[], &["/bin/grep", "-E", "^Sig(Ign|Blk)", "/proc/self/status"]);
    assert_eq!(code, 0, "{v}");
    let out = v["stdout_tail"].as_str().unwrap();
    assert_eq!(sig_ign(out), expected, "{out}");
    assert!(out.contains("SigBlk:\t0000000000000000"), "{out}");
}

/// Proves: callers sharing one `Spares` concurrently (as a daemon's requests do)
/// each get their command run exactly once — spares take some of the runs, fresh
/// runners the rest — and two of them asking with one request id get one process.
#[test]
fn concurrent_runs_sharing_spares_each_run_once() {
    let (t, dir) = new_log();
    let spares = fencelog::supervisor::Spares::new();
    // The spares kept while the callers run (each is kept until a run takes it).
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let watcher = {
        let (spares, stop) = (spares.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut seen = std::collections::BTreeSet::new();
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                seen.extend(spares.spare_pid());
                std::thread::sleep(Duration::from_micros(200));
            }
            seen
        })
    };
    let callers: Vec<_> = (0..8)
        .map(|i| {
            let (dir, spares, root) = (dir.clone(), spares.clone(), t.path().to_path_buf());
            std::thread::spawn(move || {
                let ledger = Ledger::open(&dir, LedgerOptions::default()).unwrap();
                let never = std::sync::atomic::AtomicBool::new(false);
                let mut ids = vec![];
                for n in 0..4 {
                    // Callers 0 and 1 share their request ids (and so their marker).
                    let key = if i < 2 { format!("shared-{n}") } else { format!("{i}-{n}") };
                    let marker = root.join(format!("marker-{key}"));
                    let script = format!("echo ran >> {}", marker.display());
                    let mut req = spare_request(&["/bin/sh", "-c", &script], &[], 20_000);
                    req.request_id = Some(key.clone());
                    let v = fencelog::supervisor::run_until(
                        &ledger,
                        &dir,
                        &req,
                        Path::new(FENCELOG),
                        &never,
                        Some(&spares),
                    )
                    .expect("run");
                    assert_eq!(v.status.as_str(), "succeeded", "{v:?}");
                    ids.push((key, v.id, marker));
                }
                ids
            })
        })
        .collect();
    let mut by_key = std::collections::BTreeMap::new();
    for c in callers {
        for (key, id, marker) in c.join().unwrap() {
            assert_eq!(*by_key.entry(key).or_insert(id), id, "one request id, one process");
            assert_eq!(lines(&marker), 1, "{} ran once", marker.display());
        }
    }
    assert_eq!(by_key.len(), 4 + 6 * 4);
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let spare_pids = watcher.join().unwrap();
    let ledger = Ledger::open(&dir, LedgerOptions::default()).unwrap();
    let by_spares = by_key.values().filter(|&&id| spare_pids.contains(&runner_pid(&ledger, id))).count();
    assert!(by_spares > 0, "some runs were taken by spares ({} spares seen)", spare_pids.len());
}

/// Proves: a run whose environment is more than a spare runner takes (4 MiB) is
/// not handed to the spare, and a fresh runner cannot be started with it either
/// (the system's limit on an exec's environment is lower): the run is refused
/// with the reason, recorded `SPAWN_FAILED`, and nothing ran.
#[test]
fn a_run_with_an_environment_too_large_for_any_runner_fails_on_record() {
    let (t, dir) = new_log();
    let ledger = Ledger::open(&dir, LedgerOptions::default()).unwrap();
    let spares = fencelog::supervisor::Spares::new();
    idle_spare(&ledger, &dir, &spares);
    let value = "x".repeat(110 * 1024);
    let env: Vec<String> = (0..40).map(|i| format!("BIG_{i}={value}")).collect();
    let env: Vec<&str> = env.iter().map(String::as_str).collect();
    let marker = t.path().join("marker");
    let script = format!("echo ran >> {}", marker.display());
    let never = std::sync::atomic::AtomicBool::new(false);
    let req = spare_request(&["/bin/sh", "-c", &script], &env, 20_000);
    let e = fencelog::supervisor::run_until(&ledger, &dir, &req, Path::new(FENCELOG), &never, Some(&spares))
        .expect_err("no runner can take it");
    assert!(e.to_string().contains("cannot start a runner"), "{e}");
    let ended = ledger
        .refresh_with(|p| p.processes().values().last().and_then(|p| p.ended.clone()))
        .unwrap()
        .expect("the process ended on record");
    assert!(matches!(&ended.end, ProcessEnd::Failed { code, .. } if code == "SPAWN_FAILED"), "{ended:?}");
    assert!(!marker.exists(), "nothing ran");
}

/// Proves (issue 23, item 7; seed 004's `waitForProcess` and its receipt grace):
/// `process wait` of a process whose runner and command are both dead (kill -9 of
/// each, no exit record) settles it — after a short grace for the exit record —
/// as `completed_unknown` with the runner's failed identity check as its end code
/// (never `failed` by guess, never run again), and answers that; before the fix
/// it waited out its whole timeout and answered `running`, and only `recover`
/// settled it. A process whose command still runs is left running.
#[test]
fn process_wait_settles_a_process_whose_runner_and_command_are_gone() {
    let (t, dir) = new_log();
    let marker = t.path().join("marker");
    let (code, v) =
        run(&dir, &["--wait-ms", "0"], &["sh", "-c", &format!("echo ran >> {}; sleep 300", marker.display())]);
    assert_eq!(code, 0, "{v}");
    let v = until(&dir, 1, "running", |v| v["status"] == "running");
    let (runner, pid) = (v["runner_pid"].as_u64().unwrap() as u32, v["pid"].as_u64().unwrap() as u32);
    // `running` is the start on record; the command itself runs once the runner
    // has opened its gate (a runner killed before that leaves nothing running).
    comes_true("the command to run", || lines(&marker) == 1);
    kill9(runner);
    wait_gone(runner);
    // Its command still runs: a short wait is answered `running`, nothing recorded.
    let (code, w) = fl(&dir, &["process", "wait", "1", "--timeout-ms", "50"]);
    assert_eq!((code, w["status"].as_str()), (0, Some("running")), "{w}");
    fencelog::supervisor::runner::signal_group(pid, libc::SIGKILL);
    let deadline = Instant::now() + Duration::from_secs(10);
    while !group_members(pid).is_empty() {
        assert!(Instant::now() < deadline);
        std::thread::sleep(Duration::from_millis(10));
    }
    let (code, w) = fl(&dir, &["process", "wait", "1", "--timeout-ms", "600000"]);
    assert_eq!(code, 0, "{w}");
    assert_eq!(
        (w["status"].as_str(), w["end_code"].as_str()),
        (Some("completed_unknown"), Some("process_dead")),
        "{w}"
    );
    assert_eq!(show(&dir, 1)["status"], "completed_unknown", "it is on record");
    let (code, r) = fl(&dir, &["recover"]);
    assert_eq!((code, r["completed_unknown"].clone()), (0, serde_json::json!([])), "nothing left to settle: {r}");
    assert_eq!(lines(&marker), 1, "never run again");
}

/// Proves (issue 23, item 7, the CLI's `process show`): a show of a process whose
/// runner is gone but whose command still runs reads only — `running`, nothing
/// appended (the head is unchanged); once the command is gone too, `process show`
/// itself settles it as `completed_unknown` (after the exit record's grace) and
/// answers that, instead of showing `running` until a wait or `recover`.
#[test]
fn process_show_settles_a_process_whose_runner_and_command_are_gone() {
    let (_t, dir) = new_log();
    let (code, v) = run(&dir, &["--wait-ms", "0"], &["sleep", "300"]);
    assert_eq!(code, 0, "{v}");
    let v = until(&dir, 1, "running", |v| v["status"] == "running");
    let (runner, pid) = (v["runner_pid"].as_u64().unwrap() as u32, v["pid"].as_u64().unwrap() as u32);
    // The gate (`fencelog __gate`, the command's process) has exec'd the command:
    // its executable is no longer fencelog (whatever binary `sleep` is here).
    let fencelog = fs::canonicalize(FENCELOG).unwrap();
    comes_true("the command to run", || fs::read_link(format!("/proc/{pid}/exe")).is_ok_and(|exe| exe != fencelog));
    kill9(runner);
    wait_gone(runner);
    let head = |dir: &Path| fl(dir, &["inspect", "head", dir.to_str().unwrap(), "--json"]).1;
    let before = head(&dir);
    assert_eq!(show(&dir, 1)["status"], "running", "its command still runs");
    assert_eq!(head(&dir), before, "a show that finds nothing to settle writes nothing");
    fencelog::supervisor::runner::signal_group(pid, libc::SIGKILL);
    let deadline = Instant::now() + Duration::from_secs(10);
    while !group_members(pid).is_empty() {
        assert!(Instant::now() < deadline);
        std::thread::sleep(Duration::from_millis(10));
    }
    let shown = show(&dir, 1);
    assert_eq!(
        (shown["status"].as_str(), shown["end_code"].as_str()),
        (Some("completed_unknown"), Some("process_dead")),
        "{shown}"
    );
    let (code, r) = fl(&dir, &["recover"]);
    assert_eq!((code, r["completed_unknown"].clone()), (0, serde_json::json!([])), "nothing left to settle: {r}");
}

/// Every file under `dir`, recursively, that holds `needle`.
fn files_holding(dir: &Path, needle: &[u8]) -> Vec<PathBuf> {
    let mut hits = vec![];
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in fs::read_dir(&d).unwrap().flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else if fs::read(&p).unwrap().windows(needle.len()).any(|w| w == needle) {
                hits.push(p);
            }
        }
    }
    hits
}

/// Proves (issue 23, item 13; seed 004's `sanitizeTerminalProcessArtifacts`): a
/// command that prints its `--env` values leaves none of them anywhere — not in
/// the log (its exit record's tails), not in the kept output files, not in what
/// `process show` and `process logs` print: each is `[REDACTED:NAME]`, and the
/// exit record's kept length and digest are those of the redacted file (so `logs`
/// checks out). A value shorter than the redaction minimum is left, as documented.
/// Before the fix the key sat in the log forever, where it cannot be scrubbed.
#[test]
fn env_values_are_redacted_from_kept_output_before_the_exit_record() {
    let (_t, dir) = new_log();
    let secret = "sk-live-0123456789abcdef";
    let script = r#"echo "key=$API_KEY"; echo "to stderr: $API_KEY" >&2; printf 'short=%s\n' "$PIN""#;
    let (code, v) = run(
        &dir,
        &["--env", &format!("API_KEY={secret}"), "--env", "PIN=123", "--wait-ms", "30000"],
        &["sh", "-c", script],
    );
    assert_eq!((code, v["status"].as_str()), (0, Some("succeeded")), "{v}");
    assert_eq!(v["stdout_tail"], "key=[REDACTED:API_KEY]\nshort=123\n", "{v}");
    assert_eq!(v["stderr_tail"], "to stderr: [REDACTED:API_KEY]\n");
    let out = Command::new(FENCELOG).args(["process", "logs", "1"]).env("FENCELOG_DIR", &dir).output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(String::from_utf8_lossy(&out.stdout), "key=[REDACTED:API_KEY]\nshort=123\n");
    assert_eq!(files_holding(&dir, secret.as_bytes()), Vec::<PathBuf>::new(), "the value is nowhere");
    let (code, _) = fl(&dir, &["inspect", "verify", dir.to_str().unwrap()]);
    assert_eq!(code, 0);
}

/// Proves (review of issue 23, item 13): when the kept output file cannot be
/// redacted (the failpoint `redact::file` fails the rewrite in the runner), the
/// file is removed rather than left holding the secret: the exit record says
/// nothing was kept of stdout, the tail is still redacted, and the value is in no
/// file of the log's directory. Before, the failure went only to `runner.log`.
#[test]
fn a_kept_output_that_cannot_be_redacted_is_removed_not_left_holding_the_secret() {
    let (_t, dir) = new_log();
    let secret = "sk-live-fedcba9876543210";
    let out = Command::new(FENCELOG)
        .args(["run", "--env", &format!("API_KEY={secret}"), "--wait-ms", "30000", "--"])
        .args(["sh", "-c", "echo \"key=$API_KEY\""])
        .env("FENCELOG_DIR", &dir)
        .env("FAILPOINTS", "redact::file=return")
        .output()
        .unwrap();
    let v: Value = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
    assert_eq!((out.status.code(), v["status"].as_str()), (Some(0), Some("succeeded")), "{v}");
    assert_eq!(v["stdout_tail"], "key=[REDACTED:API_KEY]\n", "{v}");
    let shown = show(&dir, 1);
    let stdout = &shown["stdout"];
    assert_eq!((stdout["bytes_kept"].as_u64(), stdout["bytes_seen"].as_u64()), (Some(0), Some(29)), "{shown}");
    assert_eq!(
        (stdout["truncated"].as_bool(), stdout["kept_blake3"].as_str()),
        (Some(true), Some(blake3::hash(b"").to_hex().as_str()))
    );
    let out = Command::new(FENCELOG).args(["process", "logs", "1"]).env("FENCELOG_DIR", &dir).output().unwrap();
    assert_eq!((out.status.code(), out.stdout.len()), (Some(0), 0), "nothing kept, nothing printed, no damage");
    assert_eq!(files_holding(&dir, secret.as_bytes()), Vec::<PathBuf>::new(), "the value is nowhere");
    let log = fs::read_to_string(dir.join("processes/1/runner.log")).unwrap_or_default();
    assert!(log.contains("cannot redact the kept stdout") && log.contains("removed it"), "{log}");
}

/// Proves (issue 23, item 14): environment values are recorded as a *keyed*
/// blake3, the key a per-log file kept outside the log (`env.key`, 0600): the
/// recorded digest is not the plain blake3 of the value (which anyone with a
/// `/v1/processes` answer could test guesses against offline), it is the keyed
/// one, and the same value in another log has another digest (not linkable). A key
/// file others can read is refused (`run` exits 1, nothing recorded).
#[test]
fn env_digests_are_keyed_by_a_per_log_key_outside_the_log() {
    use std::os::unix::fs::PermissionsExt;
    let digest_in = |dir: &Path| -> String {
        let (code, v) = run(dir, &["--env", "DB_PASSWORD=hunter2", "--wait-ms", "30000"], &["true"]);
        assert_eq!(code, 0, "{v}");
        v["command"]["env"][0]["value_blake3"].as_str().unwrap().to_owned()
    };
    let (_t1, one) = new_log();
    let (_t2, two) = new_log();
    let (d1, d2) = (digest_in(&one), digest_in(&two));
    assert_ne!(d1, blake3::hash(b"hunter2").to_hex().to_string(), "not the plain blake3");
    let key: [u8; 32] = fs::read(one.join("env.key")).unwrap().try_into().unwrap();
    assert_eq!(d1, blake3::keyed_hash(&key, b"hunter2").to_hex().to_string(), "the keyed blake3");
    assert_ne!(d1, d2, "another log, another key: not linkable");
    assert_eq!(fs::metadata(one.join("env.key")).unwrap().permissions().mode() & 0o777, 0o600);
    assert!(files_holding(&one, &key).iter().all(|p| p.ends_with("env.key")), "the key is in no record");
    fs::set_permissions(one.join("env.key"), fs::Permissions::from_mode(0o640)).unwrap();
    let (_, head) = fl(&one, &["inspect", "head", one.to_str().unwrap(), "--json"]);
    let (code, e) = run(&one, &["--env", "DB_PASSWORD=hunter2"], &["true"]);
    assert_eq!((code, code_of(&e)), (1, "IO_ERROR"), "{e}");
    assert!(e["error"]["message"].as_str().unwrap().contains("chmod 600"), "{e}");
    let (_, head2) = fl(&one, &["inspect", "head", one.to_str().unwrap(), "--json"]);
    assert_eq!(head, head2, "nothing recorded");
}

/// Proves (review): `process logs --follow` of a process whose kept output was
/// redacted when it ended (it printed an `--env` value) does not report the
/// redaction as damage: it checks the kept file against its record and says, on
/// stderr, that what was printed while the process ran was not redacted (exit 0);
/// `process logs` afterwards prints the redacted bytes.
#[test]
fn following_a_process_whose_output_was_redacted_is_not_damage() {
    let (t, dir) = new_log();
    let go = t.path().join("go");
    let script = format!("printf 'a %s\\n' \"$SEC\"; while [ ! -e {} ]; do sleep 0.02; done; echo end", go.display());
    let (code, v) = run(&dir, &["--env", "SEC=hunter2xyz-SECRET", "--wait-ms", "0"], &["sh", "-c", &script]);
    assert_eq!(code, 0, "{v}");
    let mut follower = Command::new(FENCELOG)
        .args(["process", "logs", "1", "--follow"])
        .env("FENCELOG_DIR", &dir)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = std::io::BufReader::new(follower.stdout.take().unwrap());
    let mut line = String::new();
    std::io::BufRead::read_line(&mut out, &mut line).unwrap();
    assert_eq!(line, "a hunter2xyz-SECRET\n", "printed live, before the end");
    fs::write(&go, b"").unwrap();
    let status = follower.wait().unwrap();
    let mut err = String::new();
    std::io::Read::read_to_string(follower.stderr.as_mut().unwrap(), &mut err).unwrap();
    assert_eq!(status.code(), Some(0), "{err}");
    assert!(err.contains("redacted"), "{err}");
    assert_eq!(logs(&dir, 1, "stdout").1, b"a [REDACTED:SEC]\nend\n".to_vec());
}

/// Each event in a transaction of its own, through `l`.
fn submit_each(l: &Ledger, events: impl IntoIterator<Item = Event>) {
    for e in events {
        l.submit(None, |_, now_ms, writer| Ok(Txn::new(now_ms, writer, vec![e.clone()]))).unwrap();
    }
}

/// A claim of `subject` by this process, for `l`'s writer.
fn claim_of(l: &Ledger, subject: &str) -> Event {
    let owner = fencelog::ledger::identity::probe(std::process::id(), l.writer_id()).unwrap();
    Event::Claim { subject: subject.into(), owner, stale_after_ms: 60_000, lock: None, previous: None }
}

/// A heartbeat of `subject`'s first generation.
fn beat(subject: &str) -> Event {
    Event::Heartbeat { subject: subject.into(), generation: 1 }
}

/// The newest snapshot an open of `dir` starts from, and how many records it
/// replayed after it.
fn snapshot_and_tail(dir: &Path) -> (Option<u64>, u64) {
    let l = Ledger::open(dir, LedgerOptions::default()).unwrap();
    let r = l.open_report();
    (r.snapshot_seq, r.replayed_records)
}

/// Proves: a runner whose open replayed a long tail (at least
/// `TAIL_RECORDS_SNAPSHOT_MIN` records after the newest snapshot, far fewer than
/// the ledger's own interval) leaves a snapshot once its exit is on record, so
/// the next open replays only what came after it; a runner whose open replayed
/// one record fewer writes none, nor does one after the snapshot. (Without it, a
/// log written by short-lived processes has every open replay up to
/// `snapshot_every_records`: 10,000 records.)
#[test]
fn a_runner_that_replayed_a_long_tail_leaves_a_snapshot_for_the_next_open() {
    let (_t, dir) = new_log();
    let runner_gone = |v: &Value| wait_gone(v["runner_pid"].as_u64().expect("a runner") as u32);
    let run_true = || {
        let (code, v) = run(&dir, &[], &["/bin/true"]);
        assert_eq!((code, v["status"].as_str()), (0, Some("succeeded")), "{v}");
        // Anything it writes, it writes after its exit is on record and its
        // caller was told: wait for it to be gone.
        runner_gone(&v);
        v["ended_seq"].as_u64().unwrap()
    };
    assert_eq!(run_true(), 3);
    assert_eq!(snapshot_and_tail(&dir), (None, 3), "a tail of 3 records: no snapshot");

    // The next runner's open replays all but its own start and exit: the
    // 3 records above, a claim, the heartbeats, its intent.
    let min = fencelog::supervisor::runner::TAIL_RECORDS_SNAPSHOT_MIN;
    let beats = min - 6;
    let l = Ledger::open(&dir, LedgerOptions::default()).unwrap();
    submit_each(&l, std::iter::once(claim_of(&l, "long/tail")).chain((0..beats).map(|_| beat("long/tail"))));
    drop(l);
    let ended = run_true();
    assert_eq!(ended, 3 + 1 + beats + 3);
    assert_eq!(snapshot_and_tail(&dir), (None, ended), "its runner replayed {} records: no snapshot", min - 1);

    let ended = run_true();
    assert_eq!(snapshot_and_tail(&dir), (Some(ended), 1), "{min} or more: the snapshot, then its checkpoint");

    run_true();
    assert_eq!(snapshot_and_tail(&dir), (Some(ended), 4), "a short tail again: no new snapshot");
}

/// Proves: a runner leaves no snapshot after a tail of fewer records than a
/// quarter of the state's entries (`STATE_ENTRIES_PER_TAIL_RECORD_MAX`),
/// however far past `TAIL_RECORDS_SNAPSHOT_MIN`: writing a snapshot costs in
/// proportion to the state, more than that tail saves (a state of 1,308
/// subjects, snapshotted, then 300 records).
#[test]
fn a_runner_leaves_no_snapshot_after_a_tail_short_for_the_state() {
    let (_t, dir) = new_log();
    let beats = fencelog::supervisor::runner::TAIL_RECORDS_SNAPSHOT_MIN + 100;
    // The runner replays the checkpoint, the beats and its intent.
    let subjects = fencelog::ledger::snapshot::STATE_ENTRIES_PER_TAIL_RECORD_MAX * (beats + 2) + 100;
    let l = Ledger::open(&dir, LedgerOptions::default()).unwrap();
    submit_each(&l, (0..subjects).map(|i| claim_of(&l, &format!("s/{i}"))));
    l.close().unwrap();
    let (snapshot, _) = snapshot_and_tail(&dir);
    let snapshot = snapshot.expect("close writes one");
    let l = Ledger::open(&dir, LedgerOptions::default()).unwrap();
    submit_each(&l, (0..beats).map(|_| beat("s/0")));
    drop(l);
    let (code, v) = run(&dir, &[], &["/bin/true"]);
    assert_eq!(code, 0, "{v}");
    wait_gone(v["runner_pid"].as_u64().unwrap() as u32);
    assert_eq!(snapshot_and_tail(&dir), (Some(snapshot), 1 + beats + 3));
}

/// Proves: `fencelog run` execs its runner, rather than forking it, when the CLI
/// holds more than `FORK_RUNNER_RESIDENT_BYTES_MAX` of its own memory (here the
/// state of a log of many subjects, which it replayed): a forked runner would
/// keep that copy for its command's whole life, beside its own.
#[test]
fn a_cli_holding_a_large_state_execs_its_runner() {
    let (_t, dir) = new_log();
    let log = fencelog::storage::Log::open(&dir, fencelog::storage::LogOptions::default()).unwrap();
    let (writer, owner) = (log.writer_id(), fencelog::ledger::identity::probe(std::process::id(), log.writer_id()));
    let owner = owner.unwrap();
    let subjects: u64 = 200_000;
    let claim = |i: u64| {
        let subject = format!("a/subject/of/a/large/state/{i:08}");
        let e = Event::Claim { subject, owner: owner.clone(), stale_after_ms: 3_600_000, lock: None, previous: None };
        fencelog::model::encode_txn(&Txn::new(1_767_225_600_000 + i, writer, vec![e]))
    };
    for chunk in (0..subjects).collect::<Vec<_>>().chunks(4_096) {
        log.append_batch(chunk.iter().map(|&i| claim(i)).collect()).unwrap();
    }
    log.close().unwrap();
    // Snapshotted: the run's own records start no snapshot thread in the CLI
    // (a second thread would make it exec its runner whatever its size).
    Ledger::open(&dir, LedgerOptions::default()).unwrap().close().unwrap();
    let (code, v) = run(&dir, &[], &["/bin/sh", "-c", "tr '\\0' ' ' < /proc/$PPID/cmdline"]);
    assert_eq!((code, v["status"].as_str()), (0, Some("succeeded")), "{v}");
    assert!(v["stdout_tail"].as_str().unwrap().contains("__runner --dir "), "exec'd: {v}");
}
