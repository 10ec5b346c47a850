//! The shared operations (`fencelog::ops`): one request, one intent digest, one
//! response and one error body, whichever front end it arrives by.

mod common;

use std::process::Command;

use fencelog::ledger::{Ledger, LedgerOptions};
use fencelog::ops::{self, Caller, ClaimRequest, NoteRequest, OpError};
use serde_json::{Value, json};

const FENCELOG: &str = env!("CARGO_BIN_EXE_fencelog");

fn fl(args: &[&str]) -> (i32, Value) {
    let out = Command::new(FENCELOG).args(args).output().unwrap();
    let s = String::from_utf8_lossy(&out.stdout);
    (out.status.code().unwrap_or(-1), serde_json::from_str(s.trim()).unwrap_or(Value::Null))
}

/// Proves: a request id committed through the CLI, sent again as an HTTP-style
/// JSON body (the CLI's flags in snake_case) through `ops`, hashes the same intent:
/// it is deduplicated to the original result, and different content under the same
/// id is refused with REQUEST_ID_CONFLICT and the committed sequence.
#[test]
fn a_request_id_hashes_the_same_intent_from_the_cli_and_from_a_json_body() {
    let d = tempfile::tempdir().unwrap();
    let dir = d.path().to_str().unwrap();
    assert_eq!(fl(&["init", "--dir", dir]).0, 0);
    let mut sleeper = Command::new("sleep").arg("60").spawn().unwrap();
    let pid = sleeper.id();
    let (code, cli) = fl(&[
        "claim",
        "--dir",
        dir,
        "--subject",
        "ops/a",
        "--pid",
        &pid.to_string(),
        "--stale-after-ms",
        "5000",
        "--request-id",
        "r-claim",
    ]);
    assert_eq!(code, 0, "{cli}");
    let (code, cli_note) = fl(&[
        "note",
        "--dir",
        dir,
        "--subject",
        "ops/a",
        "--generation",
        "1",
        "--text",
        "hello",
        "--request-id",
        "r-note",
    ]);
    assert_eq!(code, 0, "{cli_note}");

    let ledger = Ledger::open(d.path(), LedgerOptions::default()).unwrap();
    let body = json!({"subject": "ops/a", "pid": pid, "stale_after_ms": 5000, "request_id": "r-claim"});
    let req: ClaimRequest = serde_json::from_value(body).unwrap();
    let again = ops::claim(&ledger, &req, Caller::default()).unwrap();
    assert!(again.deduplicated && again.seq == cli["seq"].as_u64(), "{:?}", again);
    let note: NoteRequest =
        serde_json::from_value(json!({"subject": "ops/a", "generation": 1, "text": "hello", "request_id": "r-note"}))
            .unwrap();
    let again = ops::note(&ledger, &note, Caller::default()).unwrap();
    assert!(again.deduplicated && again.seq == cli_note["seq"].as_u64());

    let other: ClaimRequest = serde_json::from_value(
        json!({"subject": "ops/a", "pid": pid, "stale_after_ms": 6000, "request_id": "r-claim"}),
    )
    .unwrap();
    let err = ops::claim(&ledger, &other, Caller::default()).unwrap_err();
    assert_eq!((err.code(), err.exit_code()), ("REQUEST_ID_CONFLICT", 3));
    let body = serde_json::to_value(err.body()).unwrap();
    assert_eq!(body["error"]["committed_seq"], cli["seq"], "{body}");
    assert!(body["error"]["message"].as_str().unwrap().contains("r-claim"), "{body}");
    sleeper.kill().unwrap();
    sleeper.wait().unwrap();
}

/// Proves: request bodies refuse unknown fields (a typo is an error, not a
/// default), and every error body has `code` and `message` beside its evidence,
/// with the exit code of its class.
#[test]
fn request_bodies_are_strict_and_every_error_body_has_code_and_message() {
    let typo = serde_json::from_value::<ClaimRequest>(json!({"subject": "a", "stale_after": 5}));
    assert!(typo.is_err());
    let cases: Vec<(OpError, &str, u8)> = vec![
        (OpError::Refused(fencelog::model::Refusal::NotActive { subject: "s".into(), generation: 2 }), "NOT_ACTIVE", 3),
        (
            OpError::Refused(fencelog::model::Refusal::InvalidSubject { subject: "".into(), detail: "empty".into() }),
            "INVALID_SUBJECT",
            2,
        ),
        (
            fencelog::storage::Error::NotALogDirectory { path: "/x".into(), detail: "missing".into() }.into(),
            "NOT_A_LOG",
            2,
        ),
        (
            fencelog::storage::Error::Corruption { segment: "/x/1.seg".into(), offset: 7, seq: 3, detail: "d".into() }
                .into(),
            "CORRUPTION",
            1,
        ),
    ];
    for (e, code, exit) in cases {
        let body = serde_json::to_value(e.body()).unwrap();
        assert_eq!((body["error"]["code"].as_str(), e.exit_code()), (Some(code), exit), "{body}");
        assert!(body["error"]["message"].as_str().is_some_and(|m| !m.is_empty()), "{body}");
        if code == "CORRUPTION" {
            assert_eq!((body["error"]["offset"].as_u64(), body["error"]["seq"].as_u64()), (Some(7), Some(3)));
        }
    }
}

/// Proves: new subjects that would print alike are refused at the front door
/// (exit 2, INVALID_SUBJECT): blank names, whitespace other than a plain space,
/// zero-width and bidirectional-override characters; a plain space inside a name
/// is fine. Lease time to live has a stated maximum (a day), and 0 is refused.
#[test]
fn lookalike_subjects_and_unbounded_lease_ttls_are_refused_at_the_front_door() {
    let d = tempfile::tempdir().unwrap();
    let dir = d.path().to_str().unwrap();
    assert_eq!(fl(&["init", "--dir", dir]).0, 0);
    for bad in ["   ", "a\u{200B}b", "evil\u{202E}txt", "tab\tname", "nb\u{00A0}sp", "line\u{2028}sep"] {
        let (code, v) = fl(&["heartbeat", "--dir", dir, "--subject", bad, "--generation", "1"]);
        assert_eq!((code, v["error"]["code"].as_str()), (2, Some("INVALID_SUBJECT")), "{bad:?}: {v}");
    }
    let (code, v) = fl(&["heartbeat", "--dir", dir, "--subject", "plain space", "--generation", "1"]);
    assert_eq!((code, v["error"]["code"].as_str()), (3, Some("FENCED")), "a plain space is a valid subject: {v}");
    let acquire = |ttl: &str| {
        fl(&["lease", "acquire", "--dir", dir, "--resource", "r", "--mode", "write", "--holder", "h", "--ttl-ms", ttl])
    };
    for ttl in ["0", "86400001"] {
        let (code, v) = acquire(ttl);
        assert_eq!((code, v["error"]["code"].as_str()), (2, Some("INVALID_INPUT")), "{ttl}: {v}");
    }
    assert_eq!(acquire("86400000").0, 0);
}

/// Proves: a generation never wraps: at u64::MAX a fence rotation is refused with
/// GENERATION_EXHAUSTED instead of handing out generation 0 (or 1) again.
#[test]
fn generations_never_wrap() {
    use fencelog::model::{Event, Projection, Txn};
    let mut p = Projection::default();
    let me = fencelog::ledger::identity::probe(std::process::id(), uuid::Uuid::nil()).unwrap();
    let claim = Event::Claim { subject: "g".into(), owner: me, stale_after_ms: 1_000, lock: None, previous: None };
    p.apply(1, &Txn::new(1, uuid::Uuid::nil(), vec![claim])).unwrap();
    p.forge_subject("g").unwrap().generation = u64::MAX;
    let rotate = Event::RotateFence { subject: "g".into(), generation: u64::MAX };
    let err = p.apply(2, &Txn::new(2, uuid::Uuid::nil(), vec![rotate])).unwrap_err();
    assert_eq!(err.code(), "GENERATION_EXHAUSTED");
    assert_eq!(p.subject("g").unwrap().generation, u64::MAX);
}

/// Proves: `inspect follow` without `--from` prints only records appended from now
/// on (as its help says), not the history from sequence 1.
#[test]
fn follow_without_from_starts_at_records_appended_from_now_on() {
    let d = tempfile::tempdir().unwrap();
    let dir = d.path().to_str().unwrap();
    assert_eq!(fl(&["init", "--dir", dir]).0, 0);
    let pid = std::process::id().to_string();
    for i in 0..5 {
        assert_eq!(fl(&["claim", "--dir", dir, "--subject", &format!("f/{i}"), "--pid", &pid]).0, 0);
    }
    let mut follower = Command::new(FENCELOG)
        .args(["inspect", "follow", dir, "--json", "--max-records", "2", "--timeout-ms", "600000", "-v"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // Appended only once the follower says where it starts (a condition, not a
    // pause: on a busy machine 500 ms was not always enough).
    let _stderr = common::follower_started(&mut follower);
    for i in 5..7 {
        assert_eq!(fl(&["claim", "--dir", dir, "--subject", &format!("f/{i}"), "--pid", &pid]).0, 0);
    }
    let out = follower.wait_with_output().unwrap();
    let seqs: Vec<u64> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap()["seq"].as_u64().unwrap())
        .collect();
    assert_eq!(seqs, vec![6, 7]);
}

/// Proves: the intent digests are frozen — the tuples each operation hashes, and
/// their bincode encoding — because digests of earlier requests are in logs and a
/// retry after an upgrade must still be recognised (pinned bytes, not ops vs ops).
#[test]
fn intent_digests_are_pinned() {
    use fencelog::ledger::intent_digest;
    use fencelog::ops::{GenerationOp, GenerationRequest, Intent};
    let claim = ClaimRequest {
        subject: "pin/a".into(),
        pid: Some(42),
        instance: None,
        stale_after_ms: 20_000,
        action: None,
        request_id: Some("r".into()),
    };
    assert_eq!(
        claim.digest(),
        intent_digest(&("claim", "pin/a", Some(42u32), None::<uuid::Uuid>, 20_000u64, None::<String>))
    );
    // The caller's instance is evidence, not intent: it is in no digest.
    let instance = Some(uuid::Uuid::from_u128(5));
    let hb = GenerationRequest { subject: "pin/a".into(), generation: 3, request_id: Some("r".into()), instance };
    let g = fencelog::ops::Generation(GenerationOp::Heartbeat, &hb);
    assert_eq!(g.digest(), intent_digest(&("heartbeat", "pin/a", 3u64)));
    let note = NoteRequest { subject: "pin/a".into(), generation: 3, text: "t".into(), request_id: None, instance };
    assert_eq!(note.digest(), intent_digest(&("note", "pin/a", 3u64, "t")));
    assert_eq!(fencelog::format::hex(&claim.digest()), PINNED_CLAIM_DIGEST, "the claim digest's bytes changed");
}

/// Computed by the code before `ops` existed (commit 7b14295, its CLI tuple).
const PINNED_CLAIM_DIGEST: &str = "244fd0a8a05b7fc43a924dc4b2737ed4b699a17afd7b42f76a5d1fdaa4e7775a";

/// Proves: `audit` exits 0 on a consistent log and 4 when a record does not decode,
/// saying which in its output (text and JSON `findings`).
#[test]
fn audit_exits_4_and_names_the_finding_when_a_record_does_not_decode() {
    let d = tempfile::tempdir().unwrap();
    let dir = d.path().to_str().unwrap();
    assert_eq!(fl(&["init", "--dir", dir]).0, 0);
    let pid = std::process::id().to_string();
    assert_eq!(fl(&["claim", "--dir", dir, "--subject", "a/1", "--pid", &pid]).0, 0);
    let out = Command::new(FENCELOG).args(["audit", dir]).output().unwrap();
    assert_eq!(out.status.code(), Some(0));
    let log = fencelog::storage::Log::open(d.path(), fencelog::storage::LogOptions::default()).unwrap();
    log.append(b"\xff\xfe not a transaction").unwrap();
    drop(log);
    let out = Command::new(FENCELOG).args(["audit", dir]).output().unwrap();
    assert_eq!(out.status.code(), Some(4));
    assert!(String::from_utf8_lossy(&out.stdout).contains("finding: 1 record(s) do not decode (first: 2)"));
    let out = Command::new(FENCELOG).args(["audit", dir, "--format", "json"]).output().unwrap();
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!((out.status.code(), v["findings"].as_array().map(Vec::len)), (Some(4), Some(1)), "{v}");
}

/// Proves: a refused operation on a subject that never existed leaves no subject
/// entry (a mistyped name does not appear in `state`), while the refused attempt
/// is still kept in the log; an empty request id is invalid input (exit 2).
#[test]
fn a_refusal_on_a_subject_that_never_existed_creates_no_entry_and_empty_request_ids_are_invalid() {
    let d = tempfile::tempdir().unwrap();
    let dir = d.path().to_str().unwrap();
    assert_eq!(fl(&["init", "--dir", dir]).0, 0);
    let (code, v) = fl(&["heartbeat", "--dir", dir, "--subject", "typo/x", "--generation", "1"]);
    assert_eq!((code, v["error"]["code"].as_str()), (3, Some("FENCED")), "{v}");
    let (code, v) = fl(&["state", "--dir", dir]);
    assert_eq!(code, 0);
    assert_eq!(v["subjects"].as_array().unwrap().len(), 0, "{v}");
    assert_eq!(v["last_seq"].as_u64(), Some(1), "the refused attempt is kept in the log: {v}");
    let (code, v) = fl(&["heartbeat", "--dir", dir, "--subject", "a", "--generation", "1", "--request-id", " "]);
    assert_eq!((code, v["error"]["code"].as_str()), (2, Some("INVALID_INPUT")), "{v}");
}
