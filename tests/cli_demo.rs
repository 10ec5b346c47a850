//! The load generator (`examples/demo.rs`, a real child process) and the `fencelog`
//! binary reading its log, end to end: `inspect verify`, `state`, `audit`.

mod common;

use std::path::Path;
use std::process::Command;

const FENCELOG: &str = env!("CARGO_BIN_EXE_fencelog");

fn exec(program: &Path, args: &[&str]) -> (i32, serde_json::Value) {
    let out = Command::new(program).args(args).output().unwrap();
    let stdout = String::from_utf8(out.stdout).unwrap();
    let v = serde_json::from_str(stdout.trim()).unwrap_or(serde_json::Value::Null);
    (out.status.code().unwrap(), v)
}

/// `fencelog ARGS`: (exit code, the JSON on stdout).
fn run(args: &[&str]) -> (i32, serde_json::Value) {
    exec(Path::new(FENCELOG), args)
}

/// The example `demo ARGS`: (exit code, the JSON on stdout).
fn demo(args: &[&str]) -> (i32, serde_json::Value) {
    exec(&common::demo_bin(), args)
}

/// Proves: the demo appends from concurrent appenders, verifies the whole log, and
/// a second run continues the same log (recovering and re-verifying it).
#[test]
fn demo_appends_verifies_and_a_second_run_continues_the_log() {
    let d = tempfile::tempdir().unwrap();
    let dir = d.path().join("data");
    let dir_s = dir.to_str().unwrap();
    let (code, v) = demo(&["--dir", dir_s, "--records", "500", "--appenders", "4"]);
    assert_eq!(code, 0, "{v}");
    assert_eq!((v["head"].as_u64(), v["verify"]["records"].as_u64()), (Some(500), Some(500)));
    assert!(v["verify"]["problems"].as_array().unwrap().is_empty());
    let (code, v) = demo(&["--dir", dir_s, "--records", "100", "--appenders", "2"]);
    assert_eq!(code, 0);
    assert_eq!((v["open"]["last_seq"].as_u64(), v["verify"]["records"].as_u64()), (Some(500), Some(600)));
    let (code, v) = run(&["inspect", "verify", dir_s, "--json"]);
    assert_eq!(code, 0);
    assert_eq!(v["last_seq"].as_u64(), Some(600));
    assert_eq!(v["chain_head"].as_str().unwrap().len(), 64);
}

/// Proves: `inspect verify` exits 1 on a damaged log and names the damage; 2 when the
/// directory is not a log; a usage error exits 2.
#[test]
fn verify_exit_codes_distinguish_damaged_missing_and_usage() {
    let d = tempfile::tempdir().unwrap();
    let dir = d.path().join("data");
    let dir_s = dir.to_str().unwrap();
    assert_eq!(demo(&["--dir", dir_s, "--records", "20", "--appenders", "1"]).0, 0);
    let seg = fencelog::storage::segment_path(&dir, 1);
    let mut b = std::fs::read(&seg).unwrap();
    b[200] ^= 0xff;
    std::fs::write(&seg, &b).unwrap();
    let (code, v) = run(&["inspect", "verify", dir_s, "--json"]);
    assert_eq!((code, v["status"].as_str()), (1, Some("corrupt")));
    let p = &v["problems"][0];
    assert_eq!(p["torn_tail"], false);
    assert!(p["offset"].as_u64().unwrap() <= 200 && p["seq"].as_u64().unwrap() >= 1, "{p}");
    let (code, v) = run(&["inspect", "verify", d.path().join("nowhere").to_str().unwrap()]);
    assert_eq!((code, v["error"]["code"].as_str()), (2, Some("NOT_A_LOG")));
    let (code, v) = run(&["inspect", "verify", dir_s, "--bogus"]);
    assert_eq!((code, v["error"]["code"].as_str()), (2, Some("USAGE")), "a usage error still prints one JSON object");
    let (code, v) = demo(&["--bogus"]);
    assert_eq!((code, v["error"]["code"].as_str()), (2, Some("USAGE")), "the demo's too");
}

/// Proves: the demo's log is a ledger every command reads (its records are
/// transactions, not raw payloads), and two demos may run on one log.
#[test]
fn the_demo_log_is_a_ledger_that_state_and_inspect_read() {
    let d = tempfile::tempdir().unwrap();
    let dir = d.path().join("data");
    let dir_s = dir.to_str().unwrap();
    assert_eq!(demo(&["--dir", dir_s, "--records", "40", "--appenders", "4"]).0, 0);
    let (code, v) = run(&["state", "--dir", dir_s]);
    assert_eq!((code, v["last_seq"].as_u64()), (0, Some(40)), "{v}");
    assert_eq!(v["subjects"].as_array().unwrap().len(), 4, "{v}");
    assert_eq!(run(&["audit", dir_s, "--format", "json"]).0, 0);
    let (code, v) = demo(&["--dir", dir_s, "--records", "10", "--payload-bytes", "5000"]);
    assert_eq!((code, v["error"]["code"].as_str()), (2, Some("INVALID_INPUT")), "validated before allocating");
}

/// Proves: `fencelog demo` is no command any more (the load generator is the
/// example `examples/demo.rs`): an unknown command is a usage error (exit 2, one
/// JSON object, USAGE naming it) that writes nothing — no log in the current
/// directory.
#[test]
fn demo_is_an_unknown_command_of_the_fencelog_binary() {
    let d = tempfile::tempdir().unwrap();
    let out = Command::new(FENCELOG)
        .args(["demo", "--dir", "data", "--records", "5"])
        .env_remove("FENCELOG_DIR")
        .current_dir(d.path())
        .output()
        .unwrap();
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
    assert_eq!((out.status.code(), v["error"]["code"].as_str()), (Some(2), Some("USAGE")), "{v}");
    assert!(v["error"]["message"].as_str().unwrap().contains("'demo'"), "{v}");
    assert_eq!(std::fs::read_dir(d.path()).unwrap().count(), 0, "nothing written here");
}
