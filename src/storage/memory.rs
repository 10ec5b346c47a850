//! A log held in memory: the same frames, chain and checks as a segment, no
//! files — the second backend the ledger's scenarios run on.

use std::sync::{Arc, Mutex};

use super::backend::{
    AppendOutcome, Appended, Exclusive, Head, LogBackend, OpenReport, RecordReader, SNAPSHOTS_KEPT, SnapshotMeta,
    digest_of,
};
use super::error::{Error, Result};
use super::options::LogOptions;
use crate::format::{ChainLink, Cursor, GENESIS_LINK, RecordRef, ScanOutcome, encode_frame, hex, scan_frames};

/// Largest in-memory log (bytes of frames): a test backend still has a limit.
const MEMORY_LOG_BYTES_MAX: usize = 1 << 30;

/// A log held in memory: the same frames, chain and checks as on disk, no files.
/// Cheap to clone (clones share the log), so a test can play a second writer.
#[derive(Clone)]
pub struct MemoryBackend {
    log: Arc<Mutex<MemLog>>,
    writer_id: uuid::Uuid,
    clock: super::options::Clock,
}

struct MemLog {
    frames: Vec<u8>,
    cursor: Cursor,
    appended: u64,
    snapshots: Vec<(SnapshotMeta, Vec<u8>)>,
}

impl MemoryBackend {
    pub fn new() -> MemoryBackend {
        MemoryBackend {
            log: Arc::new(Mutex::new(MemLog {
                frames: Vec::new(),
                cursor: Cursor { next_seq: 1, prev_link: GENESIS_LINK },
                appended: 0,
                snapshots: Vec::new(),
            })),
            writer_id: uuid::Uuid::new_v4(),
            clock: Arc::new(|| LogOptions::default().now_ms()),
        }
    }

    /// Another writer of the same log (its own identity).
    pub fn another_writer(&self) -> MemoryBackend {
        MemoryBackend { writer_id: uuid::Uuid::new_v4(), ..self.clone() }
    }
}

impl Default for MemoryBackend {
    fn default() -> Self {
        Self::new()
    }
}

struct MemReader {
    log: Arc<Mutex<MemLog>>,
    offset: usize,
    cursor: Cursor,
    visit_from: u64,
}

impl RecordReader for MemReader {
    fn poll(&mut self, visit: &mut dyn FnMut(&RecordRef<'_>)) -> Result<u64> {
        let log = self.log.lock().expect("memory log");
        let mut visited = 0;
        let from = self.visit_from;
        let outcome = scan_frames(&log.frames, self.offset, &mut self.cursor, u32::MAX, |_, r| {
            if r.seq >= from {
                visited += 1;
                visit(r);
            }
        });
        debug_assert_eq!(outcome, ScanOutcome::Clean, "the memory log is written whole");
        self.offset = log.frames.len();
        Ok(visited)
    }
    fn next_seq(&self) -> u64 {
        self.cursor.next_seq
    }
    fn stopped_at_torn_tail(&self) -> bool {
        false
    }
    fn prev_link(&self) -> ChainLink {
        self.cursor.prev_link
    }
}

impl LogBackend for MemoryBackend {
    fn head(&self) -> Result<Head> {
        let log = self.log.lock().expect("memory log");
        Ok(Head { seq: log.cursor.next_seq - 1, link: log.cursor.prev_link })
    }

    fn reader(&self, from_seq: u64) -> Box<dyn RecordReader> {
        Box::new(MemReader {
            log: self.log.clone(),
            offset: 0,
            cursor: Cursor { next_seq: 1, prev_link: GENESIS_LINK },
            visit_from: from_seq.max(1),
        })
    }

    fn append_if_head(&self, expect_seq: u64, payloads: Vec<Vec<u8>>) -> Result<AppendOutcome> {
        let mut log = self.log.lock().expect("memory log");
        let last = log.cursor.next_seq - 1;
        if last != expect_seq {
            return Ok(AppendOutcome::HeadMoved { actual: last });
        }
        if payloads.is_empty() {
            return Err(Error::EmptyBatch);
        }
        let bytes: usize = payloads.iter().map(Vec::len).sum();
        if log.frames.len() + bytes > MEMORY_LOG_BYTES_MAX {
            return Err(Error::Full { detail: "the memory log is full".into() });
        }
        let (now_ms, writer) = ((self.clock)(), *self.writer_id.as_bytes());
        let first_seq = log.cursor.next_seq;
        let MemLog { frames, cursor, appended, .. } = &mut *log;
        for p in &payloads {
            cursor.prev_link = encode_frame(frames, &cursor.prev_link, cursor.next_seq, &writer, now_ms, p);
            cursor.next_seq += 1;
            *appended += 1;
        }
        Ok(AppendOutcome::Appended(Appended { first_seq, last_seq: cursor.next_seq - 1, chain_head: cursor.prev_link }))
    }

    fn exclusive(
        &self,
        _give_up: &dyn Fn() -> bool,
        f: &mut dyn FnMut(&mut dyn Exclusive) -> Result<()>,
    ) -> Result<()> {
        f(&mut super::backend::Unlocked(self))
    }

    fn put_snapshot(&self, seq: u64, chain_head: &ChainLink, body: &[u8]) -> Result<SnapshotMeta> {
        let meta =
            SnapshotMeta { seq, chain_head: *chain_head, digest: digest_of(body), source: format!("memory:{seq}") };
        let mut log = self.log.lock().expect("memory log");
        log.snapshots.retain(|(m, _)| m.seq != seq);
        log.snapshots.push((meta.clone(), body.to_vec()));
        log.snapshots.sort_by_key(|(m, _)| m.seq);
        while log.snapshots.len() > SNAPSHOTS_KEPT {
            log.snapshots.remove(0);
        }
        Ok(meta)
    }

    fn newest_snapshots(&self) -> (Vec<SnapshotMeta>, Vec<String>) {
        let log = self.log.lock().expect("memory log");
        (log.snapshots.iter().rev().map(|(m, _)| m.clone()).collect(), vec![])
    }

    fn snapshot_body(&self, meta: &SnapshotMeta) -> std::result::Result<Vec<u8>, String> {
        let log = self.log.lock().expect("memory log");
        log.snapshots.iter().find(|(m, _)| m == meta).map(|(_, b)| b.clone()).ok_or_else(|| "no such snapshot".into())
    }

    fn writer_id(&self) -> uuid::Uuid {
        self.writer_id
    }

    fn open_report(&self) -> OpenReport {
        let log = self.log.lock().expect("memory log");
        OpenReport {
            segments: 0,
            records_verified: log.cursor.next_seq - 1,
            last_seq: log.cursor.next_seq - 1,
            chain_head: hex(&log.cursor.prev_link),
            repairs: vec![],
        }
    }

    fn commit_stats(&self) -> crate::storage::CommitStats {
        let log = self.log.lock().expect("memory log");
        crate::storage::CommitStats { records: log.appended, syncs: log.appended }
    }
}
