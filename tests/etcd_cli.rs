//! The CLI on a log in etcd (issue 24): a real 3-member cluster on loopback,
//! started by `scripts/etcd-cluster.sh`, the real binary with `--etcd` and
//! `--etcd-prefix`. Each test opens with what it proves.

mod common;

use std::path::Path;
use std::process::Command;

use common::etcd;
use serde_json::Value;

const FENCELOG: &str = env!("CARGO_BIN_EXE_fencelog");

/// `fencelog ARGS --etcd E --etcd-prefix P` (and `--dir D` when given): (exit code,
/// stdout as JSON).
fn fl(endpoints: &str, prefix: &str, dir: Option<&Path>, args: &[&str]) -> (i32, Value) {
    let mut cmd = Command::new(FENCELOG);
    cmd.args(args).env("FENCELOG_ETCD", endpoints).env("FENCELOG_ETCD_PREFIX", prefix);
    if let Some(d) = dir {
        cmd.env("FENCELOG_DIR", d);
    }
    let out = cmd.output().unwrap();
    let v = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
    (out.status.code().unwrap_or(-1), v)
}

/// How many keys are under `prefix` (etcdctl, the cluster's own client).
fn keys_under(endpoints: &str, prefix: &str) -> usize {
    let out = Command::new("etcdctl")
        .env("ETCDCTL_API", "3")
        .args([&format!("--endpoints={endpoints}"), "get", "--prefix", "--keys-only", prefix])
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).lines().filter(|l| !l.is_empty()).count()
}

/// Proves: `init --etcd` creates a log under an empty prefix (once: a second init
/// reports the log it finds), and the operations work on it through the CLI —
/// claim, heartbeat, state, request show — with the same JSON as on a directory.
#[test]
fn init_creates_a_log_in_etcd_and_the_operations_work_on_it() {
    let c = etcd::shared();
    let p = etcd::fresh_prefix("cli");
    let (code, v) = fl(&c.endpoints, &p, None, &["init"]);
    assert_eq!((code, v["created"].as_bool(), v["last_seq"].as_u64()), (0, Some(true), Some(0)), "{v}");
    let (code, v) = fl(&c.endpoints, &p, None, &["init"]);
    assert_eq!((code, v["created"].as_bool()), (0, Some(false)), "{v}");
    let pid = std::process::id().to_string();
    let (code, claim) =
        fl(&c.endpoints, &p, None, &["claim", "--subject", "jobs/a", "--pid", &pid, "--request-id", "r1"]);
    assert_eq!((code, claim["kind"].as_str(), claim["generation"].as_u64()), (0, Some("claimed"), Some(1)), "{claim}");
    let (code, hb) = fl(&c.endpoints, &p, None, &["heartbeat", "--subject", "jobs/a", "--generation", "1"]);
    assert_eq!((code, hb["kind"].as_str()), (0, Some("heartbeat")), "{hb}");
    let (code, again) =
        fl(&c.endpoints, &p, None, &["claim", "--subject", "jobs/a", "--pid", &pid, "--request-id", "r1"]);
    assert_eq!(
        (code, again["deduplicated"].as_bool()),
        (0, Some(true)),
        "the request id answers from the log: {again}"
    );
    let (code, st) = fl(&c.endpoints, &p, None, &["state", "--subject", "jobs/a"]);
    assert_eq!(
        (code, st["subjects"][0]["generation"].as_u64(), st["last_seq"].as_u64()),
        (0, Some(1), Some(2)),
        "{st}"
    );
    let (code, r) = fl(&c.endpoints, &p, None, &["request", "show", "r1"]);
    assert_eq!((code, r["status"].as_str(), r["seq"].as_u64()), (0, Some("committed"), Some(1)), "{r}");
    let (code, e) = fl(&c.endpoints, &p, None, &["heartbeat", "--subject", "jobs/a", "--generation", "7"]);
    assert_eq!((code, common::code_of(&e)), (3, "FENCED"), "{e}");
}

/// Proves: every command other than `init` on a prefix that holds no fencelog log
/// — an empty one, or one with another program's keys — exits 2 `NOT_A_LOG` and
/// writes nothing there; `init` refuses to create a log among foreign keys.
#[test]
fn a_prefix_without_a_log_is_not_a_log_and_nothing_is_written() {
    let c = etcd::shared();
    let empty = etcd::fresh_prefix("empty");
    for args in [vec!["claim", "--subject", "x", "--pid", "1"], vec!["state"], vec!["request", "show", "r"]] {
        let (code, v) = fl(&c.endpoints, &empty, None, &args);
        assert_eq!((code, common::code_of(&v)), (2, "NOT_A_LOG"), "{args:?}: {v}");
    }
    assert_eq!(keys_under(&c.endpoints, &empty), 0, "nothing written");
    let foreign = etcd::fresh_prefix("foreign");
    let out = Command::new("etcdctl")
        .env("ETCDCTL_API", "3")
        .args([&format!("--endpoints={}", c.endpoints), "put", &format!("{foreign}config"), "theirs"])
        .output()
        .unwrap();
    assert!(out.status.success());
    let (code, v) = fl(&c.endpoints, &foreign, None, &["claim", "--subject", "x", "--pid", "1"]);
    assert_eq!((code, common::code_of(&v)), (2, "NOT_A_LOG"), "{v}");
    let (code, v) = fl(&c.endpoints, &foreign, None, &["init"]);
    assert_eq!((code, common::code_of(&v)), (2, "NOT_A_LOG"), "{v}");
    assert_eq!(keys_under(&c.endpoints, &foreign), 1, "their key alone");
}

/// Proves: a cluster that cannot be reached is `ETCD_UNAVAILABLE`, exit 1, after a
/// bounded time — never a hang (the test's own bound is far above the 5 s one).
#[test]
fn an_unreachable_cluster_is_etcd_unavailable_not_a_hang() {
    // A port nothing listens on (bound, then released).
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let endpoints = format!("127.0.0.1:{port}");
    let mut child = Command::new(FENCELOG)
        .args(["state", "--etcd", &endpoints])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        assert!(std::time::Instant::now() < deadline, "the command hung on an unreachable cluster");
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    let mut out = String::new();
    std::io::Read::read_to_string(child.stdout.as_mut().unwrap(), &mut out).unwrap();
    let v: Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!((status.code(), common::code_of(&v)), (Some(1), "ETCD_UNAVAILABLE"), "{v}");
}

/// Proves: `run --etcd E --dir D` supervises a command whose records are in etcd
/// and whose output is kept in this host's D: the runner (a process of its own)
/// records its start and exit in etcd, `process show`/`wait`/`logs` answer from
/// there; `run` without `--dir` says it needs one (USAGE), running nothing.
#[test]
fn a_supervised_run_on_etcd_keeps_its_records_there_and_its_output_here() {
    let c = etcd::shared();
    let p = etcd::fresh_prefix("run");
    assert_eq!(fl(&c.endpoints, &p, None, &["init"]).0, 0);
    let state = tempfile::tempdir().unwrap();
    let (code, v) = fl(
        &c.endpoints,
        &p,
        Some(state.path()),
        &["run", "--wait-ms", "30000", "--", "sh", "-c", "echo hello; exit 3"],
    );
    assert_eq!((code, v["status"].as_str(), v["exit_code"].as_i64()), (0, Some("failed"), Some(3)), "{v}");
    assert_eq!(v["stdout_tail"], "hello\n");
    let (code, shown) = fl(&c.endpoints, &p, None, &["process", "show", "1"]);
    assert_eq!((code, shown["ended_seq"].as_u64()), (0, Some(3)), "intent, start, exit: {shown}");
    let out = Command::new(FENCELOG)
        .args(["process", "logs", "1"])
        .env("FENCELOG_ETCD", &c.endpoints)
        .env("FENCELOG_ETCD_PREFIX", &p)
        .env("FENCELOG_DIR", state.path())
        .output()
        .unwrap();
    assert_eq!((out.status.code(), out.stdout.as_slice()), (Some(0), &b"hello\n"[..]));
    let (code, e) = fl(&c.endpoints, &p, None, &["run", "--", "true"]);
    assert_eq!((code, common::code_of(&e)), (2, "USAGE"), "{e}");
    let (code, list) = fl(&c.endpoints, &p, None, &["process", "list"]);
    assert_eq!((code, list["processes"].as_array().map(Vec::len)), (0, Some(1)), "nothing else ran: {list}");
}

/// Flip one byte of record `seq`'s frame (its payload: the CRC then fails), in
/// etcd itself, through the cluster's own client.
fn damage_record(endpoints: &str, prefix: &str, seq: u64) {
    let key = format!("{prefix}r/{seq:020}");
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async {
        let eps: Vec<&str> = endpoints.split(',').collect();
        let mut c = etcd_client::Client::connect(eps, None).await.unwrap();
        let mut v = c.get(key.as_bytes(), None).await.unwrap().kvs()[0].value().to_vec();
        let at = v.len() - 1;
        v[at] ^= 0x40;
        c.put(key.as_bytes(), v, None).await.unwrap();
    });
}

/// Proves: `repair --etcd` cuts a damaged log in etcd as `repair` cuts a
/// directory: an intact log is not touched (exit 2), a cut after the first damage
/// is refused (exit 2, naming the damage), a cut from the damaged record keeps the
/// cut records as evidence keys (`ev/…`, their bytes as they were) and leaves a
/// log that verifies intact with the head set back and takes appends again.
#[test]
fn repair_on_etcd_cuts_from_the_damage_and_keeps_the_cut_records_as_evidence() {
    let c = etcd::shared();
    let p = etcd::fresh_prefix("repair");
    assert_eq!(fl(&c.endpoints, &p, None, &["init"]).0, 0);
    let pid = std::process::id().to_string();
    for i in 0..10 {
        let (code, v) = fl(&c.endpoints, &p, None, &["claim", "--subject", &format!("s/{i}"), "--pid", &pid]);
        assert_eq!(code, 0, "{v}");
    }
    let (code, v) = fl(&c.endpoints, &p, None, &["repair", "--cut-from", "3"]);
    assert_eq!((code, v["error"]["code"].as_str()), (2, Some("INVALID_OPTION")), "an intact log: {v}");
    damage_record(&c.endpoints, &p, 6);
    let (code, v) = fl(&c.endpoints, &p, None, &["inspect", "verify", "--json"]);
    assert_eq!((code, v["problems"][0]["seq"].as_u64()), (1, Some(6)), "{v}");
    assert_eq!(v["problems"][0]["kind"], "checksum_mismatch", "{v}");
    let (code, v) = fl(&c.endpoints, &p, None, &["repair", "--cut-from", "7"]);
    assert_eq!(code, 2, "after the damage: {v}");
    assert!(v["error"]["message"].as_str().unwrap().contains("cut from 6 or earlier"), "{v}");
    let before = keys_under(&c.endpoints, &format!("{p}r/"));
    let (code, v) = fl(&c.endpoints, &p, None, &["repair", "--cut-from", "6"]);
    assert_eq!((code, v["intact"].as_bool(), v["last_seq"].as_u64()), (0, Some(true), Some(5)), "{v}");
    assert_eq!(keys_under(&c.endpoints, &format!("{p}ev/")), before - 5, "the cut records, kept");
    assert_eq!(keys_under(&c.endpoints, &format!("{p}r/")), 5);
    let (code, v) = fl(&c.endpoints, &p, None, &["inspect", "verify", "--json"]);
    assert_eq!((code, v["status"].as_str(), v["last_seq"].as_u64()), (0, Some("intact"), Some(5)), "{v}");
    let (code, v) = fl(&c.endpoints, &p, None, &["claim", "--subject", "after", "--pid", &pid]);
    assert_eq!((code, v["seq"].as_u64()), (0, Some(6)), "{v}");
}
