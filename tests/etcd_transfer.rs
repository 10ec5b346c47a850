//! Moving a log between a directory and etcd byte for byte, the inspector and the
//! audit on etcd, and archiving to keep etcd's keyspace bounded (issue 24). A real
//! 3-member cluster on loopback (`scripts/etcd-cluster.sh`), the real binary. Each
//! test opens with what it proves.

mod common;

use std::path::Path;
use std::process::Command;

use common::etcd;
use serde_json::Value;

const FENCELOG: &str = env!("CARGO_BIN_EXE_fencelog");

/// `fencelog ARGS` with the log's etcd in the environment: (exit code, stdout).
fn fl(endpoints: &str, prefix: &str, args: &[&str]) -> (i32, String) {
    let out = Command::new(FENCELOG)
        .args(args)
        .env("FENCELOG_ETCD", endpoints)
        .env("FENCELOG_ETCD_PREFIX", prefix)
        .output()
        .unwrap();
    (out.status.code().unwrap_or(-1), String::from_utf8_lossy(&out.stdout).into_owned())
}

fn json(s: &str) -> Value {
    serde_json::from_str(s.trim()).unwrap_or_else(|_| panic!("not JSON: {s}"))
}

/// `fencelog ARGS` without etcd in the environment.
fn plain(args: &[&str]) -> (i32, String) {
    let out = Command::new(FENCELOG).args(args).env_remove("FENCELOG_ETCD").output().unwrap();
    (out.status.code().unwrap_or(-1), String::from_utf8_lossy(&out.stdout).into_owned())
}

/// A file log of `records` records written through the embedded ledger (the
/// example `examples/demo.rs`: claims and notes from 8 threads).
fn file_log(dir: &Path, records: u64) {
    let out = Command::new(common::demo_bin())
        .args(["--dir", dir.to_str().unwrap(), "--records", &records.to_string(), "--appenders", "8"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stdout));
}

/// Proves: a file log imported into an empty prefix is the same log in etcd — the
/// same records, the same chain head (`inspect head` on both), the same state —
/// and a head pinned on the directory verifies on etcd; exported again, the etcd
/// log gives a directory that verifies with that head too, and whose dump is the
/// original's. The inspector (verify, head, dump, state, stat) and the audit read
/// the etcd log as they read a directory. An import into a prefix that holds keys
/// is refused, nothing written.
#[test]
fn import_and_export_move_a_log_byte_for_byte_with_the_same_chain_head() {
    let c = etcd::shared();
    let p = etcd::fresh_prefix("import");
    let t = tempfile::tempdir().unwrap();
    let (src, back) = (t.path().join("src"), t.path().join("back"));
    file_log(&src, 500);
    let (code, out) = plain(&["inspect", "head", src.to_str().unwrap(), "--json"]);
    assert_eq!(code, 0, "{out}");
    let head = json(&out);
    let pin = format!("{}:{}", head["seq"], head["chain_head"].as_str().unwrap());
    let (code, out) = fl(&c.endpoints, &p, &["import", "--dir", src.to_str().unwrap()]);
    assert_eq!(code, 0, "{out}");
    let r = json(&out);
    assert_eq!((&r["last_seq"], &r["chain_head"]), (&head["seq"], &head["chain_head"]), "{r}");
    let (code, out) = fl(&c.endpoints, &p, &["inspect", "head", "--json"]);
    assert_eq!((code, json(&out)), (0, head.clone()), "the same head in etcd");
    let (code, out) = fl(&c.endpoints, &p, &["inspect", "verify", "--json", "--expect-head", &pin]);
    assert_eq!((code, json(&out)["status"].as_str()), (0, Some("intact")), "{out}");
    let (code, st_etcd) = fl(&c.endpoints, &p, &["state"]);
    let (_, st_dir) = plain(&["state", "--dir", src.to_str().unwrap()]);
    assert_eq!(code, 0);
    let (mut a, mut b) = (json(&st_etcd), json(&st_dir));
    for v in [&mut a, &mut b] {
        for s in v["subjects"].as_array_mut().unwrap() {
            s.as_object_mut().unwrap().remove("heartbeat_age_ms"); // judged now, at two moments
        }
    }
    assert_eq!(a, b, "the same state");
    for tool in [vec!["inspect", "dump", "--json"], vec!["inspect", "state", "--json"], vec!["inspect", "stat"]] {
        let (code, out) = fl(&c.endpoints, &p, &tool);
        assert_eq!(code, 0, "{tool:?}: {out}");
    }
    let (code, out) = fl(&c.endpoints, &p, &["audit", "--format", "json"]);
    assert_eq!(code, 0, "{out}");
    assert_eq!(json(&out)["records"], head["seq"]);
    let (code, out) = fl(&c.endpoints, &p, &["export", "--to", back.to_str().unwrap()]);
    assert_eq!(code, 0, "{out}");
    let (code, out) = plain(&["inspect", "verify", back.to_str().unwrap(), "--json", "--expect-head", &pin]);
    assert_eq!((code, json(&out)["status"].as_str()), (0, Some("intact")), "{out}");
    assert_eq!(json(&out)["chain_head"], head["chain_head"]);
    let dump = |d: &Path| {
        let (_, out) = plain(&["inspect", "dump", d.to_str().unwrap(), "--json"]);
        out.lines()
            .map(|l| {
                let mut v = json(l);
                let o = v.as_object_mut().unwrap();
                o.remove("segment");
                o.remove("offset");
                v
            })
            .collect::<Vec<_>>()
    };
    assert_eq!(dump(&back), dump(&src), "the same records, byte for byte");
    // Into a prefix that holds keys: refused, nothing written.
    let (code, out) = fl(&c.endpoints, &p, &["import", "--dir", src.to_str().unwrap()]);
    assert_eq!((code, json(&out)["error"]["code"].as_str()), (2, Some("INVALID_OPTION")), "{out}");
}

/// Proves (retention): `archive` moves the records below the newest snapshot the
/// chain vouches for into archive segments (the same frames and chain) and deletes
/// their keys; without the archive the inspector says the history before that
/// sequence is archived (`history_archived`, exit 1 — never "intact" over a gap
/// it cannot see); with `--archive` the inspector and the audit read archive and
/// etcd as one history that verifies with the head pinned before archiving, and
/// `export --archive` gives the whole log back. The ledger on etcd boots from its
/// snapshot and goes on; a second archive continues the same directory. 100,000
/// records here (`FENCELOG_ARCHIVE_RECORDS=1000000 cargo test --release --test
/// etcd_transfer archive` is the documented long run).
#[test]
fn archive_keeps_etcd_bounded_and_one_history_verifies_across_archive_and_etcd() {
    let records: u64 = std::env::var("FENCELOG_ARCHIVE_RECORDS").ok().and_then(|v| v.parse().ok()).unwrap_or(100_000);
    let c = etcd::shared();
    let p = etcd::fresh_prefix("archive");
    let t = tempfile::tempdir().unwrap();
    let (src, arch, whole) = (t.path().join("src"), t.path().join("archive"), t.path().join("whole"));
    file_log(&src, records);
    let (code, out) = fl(&c.endpoints, &p, &["import", "--dir", src.to_str().unwrap()]);
    assert_eq!(code, 0, "{out}");
    // Nothing to archive before a snapshot is vouched for.
    let (code, out) = fl(&c.endpoints, &p, &["archive", "--to", arch.to_str().unwrap()]);
    assert_eq!((code, json(&out)["records"].as_u64()), (0, Some(0)), "{out}");
    // A ledger on etcd writes a snapshot and its checkpoint, then appends more.
    let loc = fencelog::storage::Location::Etcd(fencelog::storage::etcd::EtcdOptions::parse(&c.endpoints, &p).unwrap());
    let l = fencelog::ledger::Ledger::open_at(&loc, fencelog::ledger::LedgerOptions::default()).unwrap();
    let snap_seq = l.projection().last_seq();
    l.snapshot_now().unwrap();
    for i in 0..5 {
        l.submit(None, common::claim(&format!("after/{i}"), &common::me())).unwrap();
    }
    drop(l);
    let (_, out) = fl(&c.endpoints, &p, &["inspect", "head", "--json"]);
    let head = json(&out);
    let pin = format!("{}:{}", head["seq"], head["chain_head"].as_str().unwrap());
    let (code, out) = fl(&c.endpoints, &p, &["archive", "--to", arch.to_str().unwrap()]);
    assert_eq!(code, 0, "{out}");
    let r = json(&out);
    assert_eq!((r["snapshot_seq"].as_u64(), r["below_seq"].as_u64()), (Some(snap_seq), Some(snap_seq)), "{r}");
    assert_eq!(r["records"].as_u64(), Some(snap_seq - 1));
    assert_eq!(r["keys_deleted"].as_u64(), Some(snap_seq - 1), "their keys are gone from etcd");
    let (code, out) = plain(&["inspect", "verify", arch.to_str().unwrap(), "--json"]);
    assert_eq!((code, json(&out)["last_seq"].as_u64()), (0, Some(snap_seq - 1)), "the archive is a log: {out}");
    let (code, out) = fl(&c.endpoints, &p, &["inspect", "verify", "--json"]);
    let v = json(&out);
    assert_eq!((code, v["status"].as_str()), (1, Some("history_archived")), "{v}");
    assert_eq!(v["problems"][0]["seq"], 1);
    let (code, out) = fl(
        &c.endpoints,
        &p,
        &["inspect", "verify", "--json", "--archive", arch.to_str().unwrap(), "--expect-head", &pin],
    );
    let v = json(&out);
    assert_eq!((code, v["status"].as_str(), v["records"].as_u64()), (0, Some("intact"), head["seq"].as_u64()), "{v}");
    let (code, out) = fl(&c.endpoints, &p, &["audit", "--format", "json", "--archive", arch.to_str().unwrap()]);
    assert_eq!(code, 0, "{out}");
    // Without the archive the audit's story is incomplete, and it says so (exit 1).
    let (code, out) = fl(&c.endpoints, &p, &["audit", "--format", "json"]);
    let v = json(&out);
    assert_eq!(code, 1, "{v}");
    assert!(
        v["log_problems"].as_array().unwrap().iter().any(|p| p["kind"] == "history_archived"),
        "the audit names the archived history: {}",
        v["log_problems"]
    );
    let (code, out) =
        fl(&c.endpoints, &p, &["export", "--archive", arch.to_str().unwrap(), "--to", whole.to_str().unwrap()]);
    assert_eq!(code, 0, "{out}");
    let (code, out) = plain(&["inspect", "verify", whole.to_str().unwrap(), "--json", "--expect-head", &pin]);
    assert_eq!((code, json(&out)["status"].as_str()), (0, Some("intact")), "the whole log back: {out}");
    // The ledger boots from its snapshot on the archived log and goes on.
    let l = fencelog::ledger::Ledger::open_at(&loc, fencelog::ledger::LedgerOptions::default()).unwrap();
    assert_eq!(l.open_report().snapshot_seq, Some(snap_seq));
    let c1 = l.submit(None, common::claim("after-archive", &common::me())).unwrap();
    assert_eq!(c1.seq, head["seq"].as_u64().map(|s| s + 1));
    let new_snap = l.projection().last_seq();
    l.snapshot_now().unwrap();
    l.submit(None, common::claim("later", &common::me())).unwrap();
    drop(l);
    // An archive that crashed between its marker and its delete leaves record
    // keys below the marker (nothing reads them): the next archive deletes them.
    let etcdctl = |args: &[&str]| {
        let out = std::process::Command::new("etcdctl")
            .env("ETCDCTL_API", "3")
            .arg(format!("--endpoints={}", c.endpoints))
            .args(args)
            .output()
            .unwrap();
        assert!(out.status.success(), "etcdctl {args:?}: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let left = format!("{p}r/{:020}", 2);
    etcdctl(&["put", &left, "left by a crashed archive"]);
    let (code, out) = fl(&c.endpoints, &p, &["inspect", "verify", "--json", "--archive", arch.to_str().unwrap()]);
    assert_eq!((code, json(&out)["status"].as_str()), (0, Some("intact")), "a key below the marker is not read: {out}");
    let (code, out) = fl(&c.endpoints, &p, &["archive", "--to", arch.to_str().unwrap()]);
    let r = json(&out);
    assert_eq!((code, r["from_seq"].as_u64(), r["below_seq"].as_u64()), (0, Some(snap_seq), Some(new_snap)), "{r}");
    assert_eq!(etcdctl(&["get", "--keys-only", &left]).trim(), "", "the key a crashed archive left is deleted");
    let (code, out) = fl(&c.endpoints, &p, &["inspect", "verify", "--json", "--archive", arch.to_str().unwrap()]);
    assert_eq!((code, json(&out)["status"].as_str()), (0, Some("intact")), "{out}");
}
