//! A snapshot written by an earlier build (another projection schema) is never
//! decoded as this build's: the ledger ignores it with a warning and replays, and
//! `inspect verify` does not call the log damaged for it.

mod common;

use std::process::Command;

use fencelog::ledger::{Ledger, LedgerOptions, snapshot};
use fencelog::model::{Event, Txn};

/// Proves: after an upgrade that changed the projection's encoding, a log whose
/// newest snapshot (vouched for by a checkpoint record) was written by the earlier
/// build — an untagged body, schema 1 — opens: the ledger says the snapshot is
/// ignored and why, replays every record, and ends at the same state; `inspect
/// verify` reports the log intact (exit 0); and the next snapshot is this build's.
#[test]
fn a_snapshot_of_an_earlier_projection_schema_is_ignored_not_misread_nor_called_damage() {
    let t = tempfile::tempdir().unwrap();
    let dir = t.path().join("log");
    let mut opts = LedgerOptions::default();
    opts.log.create = true;
    let l = Ledger::open(&dir, opts.clone()).unwrap();
    let me = common::me();
    for i in 0..5 {
        l.submit(None, common::claim(&format!("s/{i}"), &me)).unwrap();
    }
    // What an earlier build wrote: the projection's bincode with no schema tag.
    let p = l.projection();
    let old_body = bincode::serde::encode_to_vec(&p, bincode::config::standard()).unwrap();
    assert_eq!(snapshot::schema_of(&old_body), 1);
    let link = l.view().unwrap().chain_head;
    fencelog::storage::snapshots::write(&dir, p.last_seq(), &link, &old_body).unwrap();
    let digest = fencelog::storage::snapshots::digest_of(&old_body);
    let seq = p.last_seq();
    l.submit(None, move |_, now_ms, writer| {
        Ok(Txn::new(now_ms, writer, vec![Event::Checkpoint { snapshot_seq: seq, digest }]))
    })
    .unwrap();
    let expected = l.projection();
    drop(l);

    let again = Ledger::open(&dir, opts).unwrap();
    let report = again.open_report();
    assert_eq!(report.snapshot_seq, None, "not adopted");
    assert!(
        report.snapshot_warnings.iter().any(|w| w.contains("schema 1") && w.contains("earlier build")),
        "{:?}",
        report.snapshot_warnings
    );
    assert_eq!(report.replayed_records, expected.last_seq(), "every record replayed");
    assert_eq!(again.projection(), expected);
    let out = Command::new(env!("CARGO_BIN_EXE_fencelog"))
        .args(["inspect", "verify", dir.to_str().unwrap()])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stdout));
    let written = again.snapshot_now().unwrap();
    let prefix = fencelog::storage::snapshots::body_prefix(std::path::Path::new(&written), 8).unwrap();
    assert_eq!(snapshot::schema_of(&prefix), snapshot::PROJECTION_SCHEMA, "the next snapshot is this build's");
}
