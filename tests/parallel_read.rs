//! Long reads are parallel: a verifying scan of more than a MiB has its chain links
//! checked ahead by helper threads (`LinksAhead`), and a replay of more than 4,096
//! records decodes and applies on a second thread. These tests prove that neither
//! changes an answer: the same records, the same damage at the same sequence and
//! offset, the same projection, the same refusal of an undecodable record.

mod common;

use std::path::Path;

use common::{code_of, fl};
use fencelog::ledger::{Ledger, LedgerOptions};
use fencelog::model::{Event, Projection, Txn, encode_txn};
use fencelog::storage::{Log, LogOptions};

/// Records enough for both: about 2.5 MB of frames (the helpers start at 1 MiB) and
/// three times the records a replay applies before it hands over to a thread.
const RECORDS: u64 = 12_000;

/// Helper threads start only where a core is spare; on one core these tests check
/// the one-thread path alone (and say so).
fn note_cores() {
    if std::thread::available_parallelism().map_or(1, |n| n.get()) < 2 {
        eprintln!("one core: no helper threads start; only the one-thread path is checked here");
    }
}

/// A history of claims, heartbeats, fence rotations and notes over 50 subjects,
/// written straight to storage; `garbage_at` replaces one record's payload with
/// bytes that are not a transaction. Returns the transactions in order.
fn write_history(dir: &Path, garbage_at: Option<u64>) -> Vec<Option<Txn>> {
    let log = Log::open(dir, LogOptions::default()).unwrap();
    let writer = log.writer_id();
    let owner = common::me();
    let mut generation = [1u64; 50];
    let (mut batch, mut txns) = (vec![], vec![]);
    for seq in 1..=RECORDS {
        let i = ((seq - 1) % 50) as usize;
        let subject = format!("parallel/subject-{i:02}");
        let event = if seq <= 50 {
            Event::Claim { subject, owner: owner.clone(), stale_after_ms: 3_600_000, lock: None, previous: None }
        } else if seq % 89 == 0 {
            generation[i] += 1;
            Event::RotateFence { subject, generation: generation[i] - 1 }
        } else if seq % 11 == 0 {
            Event::Note { subject, generation: generation[i], text: format!("note {seq}") }
        } else {
            Event::Heartbeat { subject, generation: generation[i] }
        };
        let txn = Txn::new(1_767_225_600_000 + seq, writer, vec![event]);
        if garbage_at == Some(seq) {
            batch.push(b"\xff\xff\xff not a transaction".to_vec());
            txns.push(None);
        } else {
            batch.push(encode_txn(&txn));
            txns.push(Some(txn));
        }
        if batch.len() == 1000 {
            log.append_batch(std::mem::take(&mut batch)).unwrap();
        }
    }
    assert!(batch.is_empty(), "whole batches");
    log.close().unwrap();
    txns
}

/// Proves: a replay long enough to run on two threads builds exactly the projection
/// that applying every transaction in order on one thread builds, and ends on the
/// chain head a verifying scan reports.
#[test]
fn a_long_replay_on_two_threads_builds_the_projection_one_thread_builds() {
    note_cores();
    let d = tempfile::tempdir().unwrap();
    let txns = write_history(d.path(), None);
    let mut expected = Projection::default();
    for (i, txn) in txns.iter().enumerate() {
        expected.apply(i as u64 + 1, txn.as_ref().unwrap()).expect("every transaction of the history applies");
    }
    let l = Ledger::open(d.path(), LedgerOptions::default()).unwrap();
    assert_eq!(l.open_report().replayed_records, RECORDS);
    let replayed = l.projection();
    assert_eq!((replayed.anomalies(), replayed.undecodable()), (0, 0));
    assert_eq!(replayed, expected);
    let scan = fencelog::storage::verify_dir(d.path(), 1 << 20).unwrap();
    assert!(scan.is_intact() && scan.records == RECORDS, "{scan:?}");
    assert_eq!(l.chain_head().unwrap(), scan.chain_head);
}

/// Proves: a forged record (its checksum recomputed, its chain broken) deep in a
/// long segment is found by the parallel scan exactly where a one-thread scan finds
/// it — `chain_mismatch` at its sequence and byte offset — and the ledger refuses
/// to answer from that history (CORRUPTION), through the CLI.
#[test]
fn a_forged_record_deep_in_a_long_log_is_found_at_its_sequence_and_offset() {
    note_cores();
    let d = tempfile::tempdir().unwrap();
    write_history(d.path(), None);
    let forged = 9_001;
    let (segment, offset) = common::record_at(d.path(), forged);
    assert!(std::fs::metadata(&segment).unwrap().len() > 2 << 20, "long enough for helper threads");
    common::forge_record(d.path(), forged);

    let (code, v) = fl(d.path(), &["inspect", "verify", d.path().to_str().unwrap(), "--json"]);
    assert_eq!(code, 1, "{v}");
    let p = &v["problems"][0];
    assert_eq!(p["kind"], "chain_mismatch", "{v}");
    assert_eq!((p["seq"].as_u64(), p["offset"].as_u64()), (Some(forged), Some(offset as u64)), "{v}");
    // The records before it are counted; the one after it resynchronises the scan.
    assert_eq!(v["records"].as_u64(), Some(RECORDS - 1), "{v}");

    let (code, v) = fl(d.path(), &["state"]);
    assert_eq!((code, code_of(&v)), (1, "CORRUPTION"), "{v}");
    assert!(v["error"]["message"].as_str().unwrap().contains("chain_mismatch"), "{v}");
}

/// Proves: a record that does not decode, met after the replay went to two
/// threads, is refused as it is on one — CORRUPTION naming its sequence — and no
/// state is answered.
#[test]
fn an_undecodable_record_met_by_the_second_thread_is_refused_by_its_sequence() {
    note_cores();
    let d = tempfile::tempdir().unwrap();
    let bad = 7_777;
    write_history(d.path(), Some(bad));
    let err = Ledger::open(d.path(), LedgerOptions::default()).err().expect("refused");
    assert_eq!(err.code(), "CORRUPTION", "{err}");
    assert!(err.to_string().contains(&bad.to_string()), "names record {bad}: {err}");
    let (code, v) = fl(d.path(), &["state"]);
    assert_eq!((code, code_of(&v)), (1, "CORRUPTION"), "{v}");
}

/// Proves: records so large that the batches handed to the applying thread are cut
/// by their bytes (4 MiB) rather than their count are applied all, in order: the
/// replay equals applying every transaction on one thread.
#[test]
fn batches_cut_by_their_bytes_apply_every_record_in_order() {
    note_cores();
    let d = tempfile::tempdir().unwrap();
    let log = Log::open(d.path(), LogOptions::default()).unwrap();
    let (writer, owner) = (log.writer_id(), common::me());
    let subjects: Vec<String> = (0..50).map(|i| format!("big/subject-{i:02}")).collect();
    let mut txns = vec![];
    for (i, s) in subjects.iter().enumerate() {
        let claim =
            Event::Claim { subject: s.clone(), owner: owner.clone(), stale_after_ms: 1, lock: None, previous: None };
        txns.push(Txn::new(1_000 + i as u64, writer, vec![claim]));
    }
    // Past the records applied inline, then records of 50 notes of 1,000 bytes
    // (about 51 KB each: a batch is full by its bytes after some 80 of them).
    while txns.len() < 4_200 {
        let s = &subjects[txns.len() % 50];
        txns.push(Txn::new(
            2_000 + txns.len() as u64,
            writer,
            vec![Event::Heartbeat { subject: s.clone(), generation: 1 }],
        ));
    }
    for k in 0..300u64 {
        let notes = subjects
            .iter()
            .map(|s| Event::Note { subject: s.clone(), generation: 1, text: format!("{k:04}").repeat(250) })
            .collect();
        txns.push(Txn::new(10_000 + k, writer, notes));
    }
    for chunk in txns.chunks(500) {
        log.append_batch(chunk.iter().map(encode_txn).collect()).unwrap();
    }
    log.close().unwrap();
    let mut expected = Projection::default();
    for (i, txn) in txns.iter().enumerate() {
        expected.apply(i as u64 + 1, txn).expect("every transaction applies");
    }
    let l = Ledger::open(d.path(), LedgerOptions::default()).unwrap();
    let replayed = l.projection();
    assert_eq!((replayed.last_seq(), replayed.anomalies(), replayed.undecodable()), (txns.len() as u64, 0, 0));
    assert_eq!(replayed, expected);
}
