//! What several benches share: a realistic history written straight to storage.

#![allow(dead_code)] // each bench uses its own part

use std::path::Path;

use fencelog::ledger::identity;
use fencelog::model::{Event, Identity, Txn, encode_txn};
use fencelog::storage::{Log, LogOptions};

/// Subjects of the history [`build_log`] writes.
pub const SUBJECTS: u64 = 1_000;

pub fn me() -> Identity {
    identity::probe(std::process::id(), uuid::Uuid::from_u128(7)).unwrap()
}

pub fn subject(i: u64) -> String {
    format!("home/controller-{i:04}")
}

/// A realistic history: every subject claimed, then heartbeats, with a fence
/// rotation every 97th record and a note every 13th. Written straight to storage in
/// big batches (valid transactions: replay must apply every one).
pub fn build_log(dir: &Path, records: u64) -> u64 {
    let log = Log::open(dir, LogOptions::default()).unwrap();
    let writer = log.writer_id();
    let owner = me();
    let mut generation = vec![1u64; SUBJECTS as usize];
    let mut batch = Vec::with_capacity(4096);
    let mut bytes = 0u64;
    for seq in 1..=records {
        let time_ms = 1_767_225_600_000 + seq;
        let i = (seq - 1) % SUBJECTS;
        let s = subject(i);
        let g = &mut generation[i as usize];
        let event = if seq <= SUBJECTS {
            Event::Claim { subject: s, owner: owner.clone(), stale_after_ms: 3_600_000_000, lock: None, previous: None }
        } else if seq % 97 == 0 {
            *g += 1;
            Event::RotateFence { subject: s, generation: *g - 1 }
        } else if seq % 13 == 0 {
            Event::Note { subject: s, generation: *g, text: "checkpoint".into() }
        } else {
            Event::Heartbeat { subject: s, generation: *g }
        };
        let p = encode_txn(&Txn::new(time_ms, writer, vec![event]));
        bytes += fencelog::format::frame_bytes(p.len()) as u64;
        batch.push(p);
        if batch.len() == 4096 {
            log.append_batch(std::mem::take(&mut batch)).unwrap();
        }
    }
    if !batch.is_empty() {
        log.append_batch(batch).unwrap();
    }
    log.close().unwrap();
    bytes
}
