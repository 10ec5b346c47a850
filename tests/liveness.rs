//! Liveness through the CLI: a claim over a dead owner records what it observed;
//! "cannot see" (hidepid, another pid namespace) is unknown, never dead; `state`
//! says which, why, and how old the heartbeat is. Real processes, real `kill -9`,
//! real namespaces (the namespace tests need root, as `.ci/run` has).

mod common;

use common::{code_of, fl};

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

const FENCELOG: &str = env!("CARGO_BIN_EXE_fencelog");

fn sleeper() -> Child {
    Command::new("sleep").arg("60").spawn().unwrap()
}

fn our_pid_ns() -> u64 {
    fencelog::ledger::identity::pid_ns()
}

fn subject_state(dir: &Path, subject: &str) -> Value {
    let (code, v) = fl(dir, &["state", "--subject", subject]);
    assert_eq!(code, 0, "{v}");
    v["subjects"][0].clone()
}

fn dump(dir: &Path) -> Vec<Value> {
    let out = Command::new(FENCELOG).args(["inspect", "dump", "--json", dir.to_str().unwrap()]).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).lines().map(|l| serde_json::from_str(l).unwrap()).collect()
}

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// Proves: `state` says `dead` with the first failed check and the heartbeat's
/// age once the owner is killed, and the claim over it records what was observed
/// ("no such process": no start time, no image; this boot, this pid namespace)
/// in the claim's own record, where `inspect dump` shows it.
#[test]
fn a_claim_over_a_killed_owner_records_what_it_observed() {
    let (_t, dir) = common::new_cli_log();
    let mut owner = sleeper();
    let pid = owner.id().to_string();
    let (code, c) = fl(&dir, &["claim", "--subject", "svc/a", "--pid", &pid]);
    assert_eq!(code, 0, "{c}");
    let s = subject_state(&dir, "svc/a");
    assert_eq!((s["status"].as_str(), s["status_reason"].as_str()), (Some("active"), None), "{s}");
    assert_eq!(s["owner_pid_ns"], our_pid_ns(), "the pid's namespace is recorded: {s}");

    owner.kill().unwrap();
    owner.wait().unwrap();
    std::thread::sleep(Duration::from_millis(20));
    let s = subject_state(&dir, "svc/a");
    assert_eq!((s["status"].as_str(), s["status_reason"].as_str()), (Some("dead"), Some("process_dead")), "{s}");
    assert!(s["heartbeat_age_ms"].as_u64().is_some_and(|a| a >= 20), "the heartbeat's age is given: {s}");

    let me = std::process::id().to_string();
    let (code, c) = fl(&dir, &["claim", "--subject", "svc/a", "--pid", &me]);
    assert_eq!(code, 0, "a provably dead owner is claimed over: {c}");
    let records = dump(&dir);
    let claim = records.iter().find(|r| r["seq"] == c["seq"]).expect("the claim's record");
    let events = claim["events"].as_array().unwrap();
    let kinds: Vec<&str> = events.iter().filter_map(|e| e["kind"].as_str()).collect();
    assert_eq!(
        kinds,
        ["claim", "owner_pid_namespace", "death_observed"],
        "the claim, its owner's pid namespace and what it observed, in one record: {claim}"
    );
    assert_eq!(events[1]["pid_ns"], our_pid_ns(), "{claim}");
    let seen = &events[2];
    assert_eq!(seen["kind"], "death_observed", "{claim}");
    assert_eq!((seen["generation"].as_u64(), seen["pid"].as_u64()), (Some(1), Some(u64::from(owner.id()))), "{seen}");
    assert_eq!(seen["observed"]["start_ticks"], Value::Null, "no such process: {seen}");
    assert_eq!(seen["observed"]["exe"], Value::Null, "{seen}");
    assert_eq!(seen["observed"]["pid_ns"], our_pid_ns(), "{seen}");
    let boot = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").unwrap();
    assert_eq!(seen["observed"]["boot_id"], boot.trim(), "{seen}");

    let out = Command::new(FENCELOG).args(["inspect", "dump", dir.to_str().unwrap()]).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("death-observed \"svc/a\" gen 1") && text.contains("no such process"), "{text}");

    let out = Command::new(FENCELOG).args(["audit", "--format", "json", dir.to_str().unwrap()]).output().unwrap();
    let audit: Value = serde_json::from_slice(&out.stdout).unwrap();
    let began = &audit["subjects"][0]["tenures"][1]["began"];
    assert_eq!(
        (began["kind"].as_str(), &began["observed"]),
        (Some("claim_over_dead_owner"), &seen["observed"]),
        "the audit shows what was seen: {began}"
    );
}

/// Proves: a pid the prober cannot see because `/proc` is mounted `hidepid`
/// (`kill(pid, 0)` says EPERM, not ESRCH) is *unknown*: `state` says so with the
/// reason, and a claim over the stale owner is refused (`STALE_REQUIRES_TAKEOVER`),
/// never taken as a claim over a dead one. Needs root (a mount namespace and a
/// second user); without it the test says so and checks nothing.
#[test]
fn an_owner_hidden_by_hidepid_is_unknown_never_dead() {
    if !is_root() {
        eprintln!("skipped: needs root for a hidepid /proc in a mount namespace");
        return;
    }
    let (t, dir) = common::new_cli_log();
    let mut owner = sleeper(); // root's: hidden from `nobody` under hidepid
    let pid = owner.id().to_string();
    let status = Command::new("chown").args(["-R", "65534:65534"]).arg(t.path()).status().unwrap();
    assert!(status.success());
    // A shell as `nobody`, in a mount namespace of its own; with `hide`, its /proc
    // is mounted `hidepid=invisible` (root's processes vanish from it).
    let as_nobody = |hide: bool, script: &str| {
        let mount = if hide { "mount -t proc -o hidepid=invisible proc /proc && " } else { "" };
        let out = Command::new("unshare")
            .args(["--mount", "--fork", "sh", "-c"])
            .arg(format!("{mount}exec setpriv --reuid 65534 --regid 65534 --clear-groups sh -c '{script}'"))
            .env("FENCELOG_DIR", &dir)
            .env("FL", FENCELOG)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        (out.status.code().unwrap_or(-1), String::from_utf8_lossy(&out.stdout).into_owned(), stderr)
    };
    // As nobody, with /proc as usual: the owner is seen and recorded.
    let (code, out, err) = as_nobody(false, &format!("\"$FL\" claim --subject svc/h --pid {pid} --stale-after-ms 1"));
    assert_eq!(code, 0, "{out} {err}");
    std::thread::sleep(Duration::from_millis(20));

    let (code, out, err) = as_nobody(true, "\"$FL\" claim --subject svc/h --pid $$");
    let v: Value = serde_json::from_str(out.trim()).unwrap_or(Value::Null);
    assert_eq!((code, code_of(&v)), (3, "STALE_REQUIRES_TAKEOVER"), "{out} {err}");
    let (code, out, _) = as_nobody(true, "\"$FL\" state --subject svc/h");
    assert_eq!(code, 0, "{out}");
    let v: Value = serde_json::from_str(out.trim()).unwrap();
    let s = &v["subjects"][0];
    assert_eq!((s["status"].as_str(), s["status_reason"].as_str()), (Some("unknown"), Some("hidden")), "{s}");
    assert_eq!(s["generation"], 1, "still the first tenure: {s}");
    owner.kill().unwrap();
    owner.wait().unwrap();
}

/// Proves: an owner recorded from another pid namespace is *unknown* here, never
/// dead — its pid names another process in ours (or none) — so a claim over it is
/// refused and `state` says `other_pid_namespace`. The owner is alive inside its
/// namespace throughout. Needs root (`unshare --pid`).
#[test]
fn an_owner_in_another_pid_namespace_is_unknown_never_dead() {
    if !is_root() {
        eprintln!("skipped: needs root for a pid namespace");
        return;
    }
    let (_t, dir) = common::new_cli_log();
    let mut ns = Command::new("unshare")
        .args([
            "--pid",
            "--fork",
            "--kill-child",
            "--mount-proc",
            "sh",
            "-c",
            "sleep 60 & \"$FL\" claim --subject svc/ns --pid $! --stale-after-ms 1 >/dev/null; wait",
        ])
        .env("FENCELOG_DIR", &dir)
        .env("FL", FENCELOG)
        .stdin(Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    let owner = loop {
        let s = subject_state(&dir, "svc/ns");
        if s["owner"].is_object() {
            break s;
        }
        assert!(Instant::now() < deadline, "the claim inside the namespace never landed");
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_ne!(owner["owner_pid_ns"], our_pid_ns(), "recorded in its own namespace: {owner}");
    assert_ne!(owner["owner_pid_ns"], 0, "{owner}");
    std::thread::sleep(Duration::from_millis(20));

    let me = std::process::id().to_string();
    let (code, e) = fl(&dir, &["claim", "--subject", "svc/ns", "--pid", &me]);
    assert_eq!((code, code_of(&e)), (3, "STALE_REQUIRES_TAKEOVER"), "{e}");
    let s = subject_state(&dir, "svc/ns");
    assert_eq!(
        (s["status"].as_str(), s["status_reason"].as_str()),
        (Some("unknown"), Some("other_pid_namespace")),
        "{s}"
    );
    // SAFETY: kill(2) on our own child.
    unsafe { libc::kill(ns.id() as i32, libc::SIGKILL) };
    ns.wait().unwrap();
}

/// Proves: touching a running binary (its mtime changes, its image does not) does
/// not make its live owner dead: a second claim is refused `ALREADY_ACTIVE`.
#[test]
fn touching_a_running_binary_does_not_make_its_owner_dead() {
    let (t, dir) = common::new_cli_log();
    let bin = t.path().join("sleep-copy");
    std::fs::copy("/bin/sleep", &bin).unwrap();
    let mut owner = common::retry_busy(|| Command::new(&bin).arg("60").spawn());
    std::thread::sleep(Duration::from_millis(50));
    let (code, c) = fl(&dir, &["claim", "--subject", "svc/t", "--pid", &owner.id().to_string()]);
    assert_eq!(code, 0, "{c}");
    let status = Command::new("touch").args(["-d", "2020-01-01"]).arg(&bin).status().unwrap();
    assert!(status.success());
    let s = subject_state(&dir, "svc/t");
    assert_eq!(s["status"], "active", "{s}");
    let me = std::process::id().to_string();
    let (code, e) = fl(&dir, &["claim", "--subject", "svc/t", "--pid", &me]);
    assert_eq!((code, code_of(&e)), (3, "ALREADY_ACTIVE"), "a live owner is not dead: {e}");
    owner.kill().unwrap();
    owner.wait().unwrap();
}
