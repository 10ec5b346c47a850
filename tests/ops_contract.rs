//! The shared operations (`fencelog::ops`): one request, one intent digest, one
//! response and one error body, whichever front end it arrives by.

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
    let again = ops::note(&ledger, &note).unwrap();
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
