//! Contested refusals leave a trace, through the CLI: which codes are recorded,
//! who asked (the process that ran the CLI, and `--instance`), coalescing per
//! (subject, code, operation, caller) per second across separate processes, and the audit's
//! grouping by caller.

mod common;

use common::{code_of, fl};

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use fencelog::model::{Event, decode_txn};
use serde_json::Value;

const FENCELOG: &str = env!("CARGO_BIN_EXE_fencelog");

/// Every `Refused` event in the log, with its record's sequence.
fn refused(dir: &Path) -> Vec<(u64, Event)> {
    common::records(dir)
        .into_iter()
        .flat_map(|(seq, payload)| decode_txn(&payload).unwrap().events.into_iter().map(move |e| (seq, e)))
        .filter(|(_, e)| matches!(e, Event::Refused { .. }))
        .collect()
}

/// Proves: 20 refused heartbeats from 20 separate CLI processes run by one caller
/// (this test process) under a fenced generation are answered `FENCED` every
/// time, but leave at most one record per second they spanned — not 20 — and
/// each record names the caller: this process's pid, start time and image.
#[test]
fn refused_cli_heartbeats_from_one_caller_are_coalesced_across_processes() {
    let (_t, dir) = common::new_cli_log();
    let me = std::process::id().to_string();
    assert_eq!(fl(&dir, &["claim", "--subject", "svc/z", "--pid", &me]).0, 0);
    assert_eq!(fl(&dir, &["rotate-fence", "--subject", "svc/z", "--generation", "1"]).0, 0);
    let started = Instant::now();
    for _ in 0..20 {
        let (code, e) = fl(&dir, &["heartbeat", "--subject", "svc/z", "--generation", "1"]);
        assert_eq!((code, code_of(&e)), (3, "FENCED"), "{e}");
    }
    let spanned_s = started.elapsed().as_millis().div_ceil(1000) as usize;
    let records = refused(&dir);
    assert!(
        !records.is_empty() && records.len() <= spanned_s + 1,
        "{} records for 20 attempts over {spanned_s} s: {records:?}",
        records.len()
    );
    let mine = fencelog::ledger::identity::caller_of(std::process::id(), None);
    for (_, e) in &records {
        let Event::Refused { code, op, caller, presented, current, count, .. } = e else { unreachable!() };
        assert_eq!((code.as_str(), op.as_str(), *presented, *current), ("FENCED", "heartbeat", Some(1), 2));
        assert_eq!(caller, &mine, "the caller is the process that ran the CLI");
        assert!(*count >= 1);
    }
    let (_, st) = fl(&dir, &["state", "--subject", "svc/z"]);
    let counted = st["subjects"][0]["fenced_attempts"].as_u64().unwrap();
    assert!(counted >= records.len() as u64 && counted <= 20, "{st}");
}

/// Proves: `IDENTITY_UNCERTAIN`, `BUSY`, `TAKEOVER_RACE` and
/// `TAKEOVER_ACTIVE_REFUSED` are kept as records naming the caller and its
/// `--instance`; a standby's polling (`ALREADY_ACTIVE`, `STALE_REQUIRES_TAKEOVER`)
/// is not; and two callers (two instances) are never coalesced into one record.
#[test]
fn contested_refusals_are_recorded_per_caller_and_polling_is_not() {
    let (_t, dir) = common::new_cli_log();
    let me = std::process::id().to_string();
    let (a, b) = ("00000000-0000-4000-8000-00000000000a", "00000000-0000-4000-8000-00000000000b");
    // Held without a lock intent: a lock claim over it cannot tell what it does.
    assert_eq!(fl(&dir, &["claim", "--subject", "db/plain", "--pid", &me]).0, 0);
    let (code, e) =
        fl(&dir, &["claim", "--subject", "db/plain", "--action", "migrate", "--request-id", "m1", "--instance", a]);
    assert_eq!((code, code_of(&e)), (3, "IDENTITY_UNCERTAIN"), "{e}");
    // Held as a lock doing something else.
    let lock = ["claim", "--subject", "db/lock", "--pid", &me, "--action", "vacuum", "--request-id", "v1"];
    assert_eq!(fl(&dir, &lock).0, 0);
    let (code, e) =
        fl(&dir, &["claim", "--subject", "db/lock", "--action", "migrate", "--request-id", "m2", "--instance", a]);
    assert_eq!((code, code_of(&e)), (3, "BUSY"), "{e}");
    // A takeover naming what it did not see, and one of a fresh owner.
    let takeover = |generation: &str, heartbeat_ms: &str, instance: &str| {
        let args = [
            "takeover",
            "--subject",
            "db/plain",
            "--expect-generation",
            generation,
            "--expect-heartbeat-ms",
            heartbeat_ms,
            "--instance",
            instance,
        ];
        fl(&dir, &args)
    };
    let (code, e) = takeover("7", "1", b);
    assert_eq!((code, code_of(&e)), (3, "TAKEOVER_RACE"), "{e}");
    let (_, st) = fl(&dir, &["state", "--subject", "db/plain"]);
    let hb = st["subjects"][0]["heartbeat_ms"].as_u64().unwrap().to_string();
    for instance in [a, b] {
        let (code, e) = takeover("1", &hb, instance);
        assert_eq!((code, code_of(&e)), (3, "TAKEOVER_ACTIVE_REFUSED"), "{e}");
    }
    // Polling by a standby.
    let (code, e) = fl(&dir, &["claim", "--subject", "db/plain", "--instance", b]);
    assert_eq!((code, code_of(&e)), (3, "ALREADY_ACTIVE"), "{e}");
    assert_eq!(fl(&dir, &["claim", "--subject", "db/stale", "--pid", &me, "--stale-after-ms", "1"]).0, 0);
    std::thread::sleep(Duration::from_millis(10));
    let (code, e) = fl(&dir, &["claim", "--subject", "db/stale", "--instance", b]);
    assert_eq!((code, code_of(&e)), (3, "STALE_REQUIRES_TAKEOVER"), "{e}");

    let got: Vec<(String, String, Option<String>)> = refused(&dir)
        .into_iter()
        .map(|(_, e)| {
            let Event::Refused { subject, code, caller, .. } = e else { unreachable!() };
            assert_eq!(caller.pid, std::process::id(), "{caller:?}");
            (subject, code, caller.instance.map(|i| i.to_string()))
        })
        .collect();
    let want = vec![
        ("db/plain".to_owned(), "IDENTITY_UNCERTAIN".to_owned(), Some(a.to_owned())),
        ("db/lock".into(), "BUSY".into(), Some(a.into())),
        ("db/plain".into(), "TAKEOVER_RACE".into(), Some(b.into())),
        ("db/plain".into(), "TAKEOVER_ACTIVE_REFUSED".into(), Some(a.into())),
        ("db/plain".into(), "TAKEOVER_ACTIVE_REFUSED".into(), Some(b.into())),
    ];
    assert_eq!(got, want, "one record per (subject, code, operation, caller); polling not recorded");

    // The audit groups the attempts on db/plain by caller.
    let out = Command::new(FENCELOG).args(["audit", "--format", "json", dir.to_str().unwrap()]).output().unwrap();
    let audit: Value = serde_json::from_slice(&out.stdout).unwrap();
    let plain = audit["subjects"].as_array().unwrap().iter().find(|s| s["subject"] == "db/plain").unwrap();
    let groups = plain["attempts_by_caller"].as_array().unwrap();
    let by: Vec<(Option<&str>, u64, Value)> = groups
        .iter()
        .map(|g| (g["caller"]["instance"].as_str(), g["attempts"].as_u64().unwrap(), g["codes"].clone()))
        .collect();
    assert_eq!(
        by,
        vec![
            (Some(a), 2, serde_json::json!({"IDENTITY_UNCERTAIN": 1, "TAKEOVER_ACTIVE_REFUSED": 1})),
            (Some(b), 2, serde_json::json!({"TAKEOVER_ACTIVE_REFUSED": 1, "TAKEOVER_RACE": 1})),
        ],
        "{plain}"
    );
    let out = Command::new(FENCELOG).args(["audit", dir.to_str().unwrap()]).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    let line = format!("refused caller pid {} ", std::process::id());
    assert!(text.contains(&line) && text.contains(&format!("instance {a}")), "{text}");
}

/// Proves: a lease acquired or a command run on behalf of a fenced owner is refused
/// `FENCED` but not kept as a refusal record (the lease table's and the
/// supervisor's business; `docs/STATE-MACHINE.md`): ten of them write nothing.
#[test]
fn refused_owner_leases_are_answered_but_not_recorded() {
    let (_t, dir) = common::new_cli_log();
    let me = std::process::id().to_string();
    assert_eq!(fl(&dir, &["claim", "--subject", "svc/l", "--pid", &me]).0, 0);
    assert_eq!(fl(&dir, &["rotate-fence", "--subject", "svc/l", "--generation", "1"]).0, 0);
    for _ in 0..10 {
        let (code, e) = fl(
            &dir,
            &["lease", "acquire", "--resource", "db", "--mode", "write", "--owner", "svc/l", "--generation", "1"],
        );
        assert_eq!((code, code_of(&e)), (3, "FENCED"), "{e}");
    }
    assert!(refused(&dir).is_empty(), "{:?}", refused(&dir));
}
