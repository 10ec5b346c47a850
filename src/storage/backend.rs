//! The narrow seam between the ledger and where its log lives. The ledger reaches
//! the log only through [`LogBackend`]: the head, verified records from a
//! sequence, *append-if-head* (compare on the head, the only write a replicated
//! store can offer), and snapshot storage. [`FileBackend`] is the segment files of
//! this crate; [`MemoryBackend`] is a small in-memory log the ledger's tests also
//! run on (the proof that nothing above this seam relies on files or a lock held
//! across round trips).
//!
//! `HeadMoved` is not a failure: another writer appended first. The ledger catches
//! up, judges its transactions again against the new state, and tries again.
//! [`LogBackend::exclusive`] lets a backend that can hold a lock across a
//! transaction (the file backend's append lock) do so, so that on one machine
//! `HeadMoved` stays rare; nothing above this seam may rely on it.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use super::error::{Error, Result};
use super::options::LogOptions;
use super::reader::Tailer;
use super::recovery::OpenReport;
use super::snapshots::{self, SnapshotMeta};
use super::writer::{Appended, Log};
use crate::format::{ChainLink, Cursor, GENESIS_LINK, RecordRef, ScanOutcome, encode_frame, hex, scan_frames};

/// The last durable record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Head {
    pub seq: u64,
    pub link: ChainLink,
}

/// What an append-if-head did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AppendOutcome {
    /// Appended and durable.
    Appended(Appended),
    /// The log's last sequence was `actual`, not the one expected: nothing appended.
    HeadMoved { actual: u64 },
}

/// Verified records, in order, from a sequence on; each `poll` delivers what was
/// appended since the last.
pub trait RecordReader: Send {
    /// Visit every intact record not yet visited; returns how many.
    fn poll(&mut self, visit: &mut dyn FnMut(&RecordRef<'_>)) -> Result<u64>;
    /// The sequence the next record must carry.
    fn next_seq(&self) -> u64;
    /// The last poll stopped before a torn tail (a writer will cut it).
    fn stopped_at_torn_tail(&self) -> bool;
    /// The chain link of the record before `next_seq` (the last one verified).
    fn prev_link(&self) -> ChainLink;
    /// Wait, at most `timeout`, for something to be appended after what was read
    /// (a backend that can be told, as etcd's watch, returns as soon as it is;
    /// the others nap a little and say nothing).
    fn wait_for_more(&mut self, timeout: std::time::Duration) -> Result<()> {
        std::thread::sleep(timeout.min(std::time::Duration::from_millis(50)));
        Ok(())
    }
    /// Records `first_seq..=last_seq` (chain link of the last: `chain_head`) were
    /// appended by the reader's own writer: a reader that is exactly at
    /// `first_seq` may go past them without reading them back (a reader of a
    /// remote log saves the round trip; a local one may ignore this).
    fn skip_own(&mut self, _first_seq: u64, _last_seq: u64, _chain_head: ChainLink) {}
}

/// What the holder of [`LogBackend::exclusive`] may do.
pub trait Exclusive {
    fn append_if_head(&mut self, expect_seq: u64, payloads: Vec<Vec<u8>>) -> Result<AppendOutcome>;
    /// The chain link of each record the last successful `append_if_head`
    /// appended, in order — or nothing, if the backend does not tell.
    fn links(&self) -> &[ChainLink] {
        &[]
    }
    /// Whether another writer waits to append (then the holder lets go after its
    /// turn). Yes unless the backend can tell.
    fn others_waiting(&self) -> bool {
        true
    }
}

/// Where a ledger's log lives.
pub trait LogBackend: Send + Sync {
    /// The last durable record (sequence 0 and the genesis link for an empty log).
    fn head(&self) -> Result<Head>;
    /// A verifying reader that visits records from `from_seq` on.
    fn reader(&self, from_seq: u64) -> Box<dyn RecordReader>;
    /// Append `payloads` as consecutive records if the last sequence is
    /// `expect_seq`; durable when it returns `Appended`.
    fn append_if_head(&self, expect_seq: u64, payloads: Vec<Vec<u8>>) -> Result<AppendOutcome>;
    /// Make everything appended durable (appends already are: a no-op for both
    /// backends here; a replicated backend may batch).
    fn sync(&self) -> Result<()> {
        Ok(())
    }
    /// Run `f` with exclusive appending where the backend offers it (the file
    /// backend holds its cross-process lock, having caught up), else plainly. A
    /// backend that must wait for it asks `give_up` while it waits, and gives up
    /// with [`Error::Withdrawn`] (nothing run) when it says so.
    fn exclusive(&self, give_up: &dyn Fn() -> bool, f: &mut dyn FnMut(&mut dyn Exclusive) -> Result<()>) -> Result<()>;
    /// Store a snapshot body covering `seq` (chain link `head`).
    fn put_snapshot(&self, seq: u64, head: &ChainLink, body: &[u8]) -> Result<SnapshotMeta>;
    /// The newest stored snapshots, newest first (each checked on its own), with a
    /// warning for each one skipped.
    fn newest_snapshots(&self) -> (Vec<SnapshotMeta>, Vec<String>);
    /// The body of a snapshot `newest_snapshots` described (the same bytes, or an
    /// error).
    fn snapshot_body(&self, meta: &SnapshotMeta) -> std::result::Result<Vec<u8>, String>;
    /// This writer's identity in the records it appends.
    fn writer_id(&self) -> uuid::Uuid;
    /// What opening found and did.
    fn open_report(&self) -> OpenReport;
    /// Records appended and syncs made through this backend.
    fn commit_stats(&self) -> (u64, u64) {
        (0, 0)
    }
    /// Whether writers on several hosts share this log (etcd): then identities
    /// recorded on another host are never judged from this host's `/proc`, and
    /// staleness is judged on the observer's own clock (`ledger::observer`).
    fn shared_by_hosts(&self) -> bool {
        false
    }
    /// Whether an append's compare is all that orders writers (etcd): a writer
    /// may judge on the state it has and learn of another writer's records from
    /// a failed compare (`HeadMoved`), instead of reading before every turn.
    /// `false` for a backend whose exclusive section must be caught up with first
    /// (the file backend's lock, across processes).
    fn optimistic(&self) -> bool {
        false
    }
    /// What a long-running writer (the daemon) checks of the service under the
    /// log at boot: an error if it cannot work (etcd refuses a commit group),
    /// else warnings (etcd keeps every revision: no compaction).
    fn check_service(&self) -> Result<Vec<String>> {
        Ok(vec![])
    }
}

impl RecordReader for Tailer {
    fn poll(&mut self, visit: &mut dyn FnMut(&RecordRef<'_>)) -> Result<u64> {
        Tailer::poll(self, visit)
    }
    fn next_seq(&self) -> u64 {
        Tailer::next_seq(self)
    }
    fn stopped_at_torn_tail(&self) -> bool {
        Tailer::stopped_at_torn_tail(self)
    }
    fn prev_link(&self) -> ChainLink {
        Tailer::prev_link(self)
    }
}

fn outcome(r: Result<Appended>) -> Result<AppendOutcome> {
    match r {
        Ok(a) => Ok(AppendOutcome::Appended(a)),
        Err(Error::HeadMoved { actual, .. }) => Ok(AppendOutcome::HeadMoved { actual }),
        Err(e) => Err(e),
    }
}

/// The segment files of a log directory. Opened for writing (recovery, the
/// append lock) or read-only (no lock, no write, nothing created).
pub struct FileBackend {
    dir: PathBuf,
    body_max: u32,
    log: Option<Log>,
}

impl FileBackend {
    /// Open (recovering; creating only if `opts.create`) for writing.
    pub fn open(dir: impl AsRef<Path>, opts: LogOptions) -> Result<FileBackend> {
        let dir = dir.as_ref().to_path_buf();
        let body_max = opts.body_max();
        let log = Log::open(&dir, opts)?;
        Ok(FileBackend { dir, body_max, log: Some(log) })
    }

    /// Open for reading only, after checking the whole history
    /// ([`super::check_whole_history`]).
    pub fn open_read_only(dir: impl AsRef<Path>, body_max: u32) -> Result<FileBackend> {
        let dir = dir.as_ref().to_path_buf();
        super::history::check_whole_history(&dir, body_max)?;
        Ok(FileBackend { dir, body_max, log: None })
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    fn log(&self) -> Result<&Log> {
        self.log.as_ref().ok_or_else(|| Error::InvalidOption { detail: "the log was opened read-only".into() })
    }
}

impl LogBackend for FileBackend {
    fn head(&self) -> Result<Head> {
        // Read from the start of the last segment (cheap), verifying as it goes.
        let mut t = Tailer::new(&self.dir, self.body_max, u64::MAX);
        t.poll(|_| {})?;
        Ok(Head { seq: t.next_seq().saturating_sub(1), link: t.prev_link() })
    }

    fn reader(&self, from_seq: u64) -> Box<dyn RecordReader> {
        Box::new(Tailer::new(&self.dir, self.body_max, from_seq))
    }

    fn append_if_head(&self, expect_seq: u64, payloads: Vec<Vec<u8>>) -> Result<AppendOutcome> {
        outcome(self.log()?.append_if_head(expect_seq, payloads))
    }

    fn exclusive(&self, give_up: &dyn Fn() -> bool, f: &mut dyn FnMut(&mut dyn Exclusive) -> Result<()>) -> Result<()> {
        self.log()?.with_lock_or_give_up(give_up, |l| f(l))?
    }

    fn put_snapshot(&self, seq: u64, head: &ChainLink, body: &[u8]) -> Result<SnapshotMeta> {
        snapshots::write(&self.dir, seq, head, body)
    }

    fn newest_snapshots(&self) -> (Vec<SnapshotMeta>, Vec<String>) {
        snapshots::newest(&self.dir)
    }

    fn snapshot_body(&self, meta: &SnapshotMeta) -> std::result::Result<Vec<u8>, String> {
        snapshots::body(&self.dir, meta)
    }

    fn writer_id(&self) -> uuid::Uuid {
        self.log.as_ref().map_or(uuid::Uuid::nil(), Log::writer_id)
    }

    fn open_report(&self) -> OpenReport {
        match &self.log {
            Some(log) => log.open_report().clone(),
            None => OpenReport {
                segments: 0,
                records_verified: 0,
                last_seq: 0,
                chain_head: hex(&GENESIS_LINK),
                repairs: vec![],
            },
        }
    }

    fn commit_stats(&self) -> (u64, u64) {
        self.log.as_ref().map_or((0, 0), Log::commit_stats)
    }
}

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
            return Err(Error::InvalidOption { detail: "the memory log is full".into() });
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
        struct Plain<'a>(&'a MemoryBackend);
        impl Exclusive for Plain<'_> {
            fn append_if_head(&mut self, expect_seq: u64, payloads: Vec<Vec<u8>>) -> Result<AppendOutcome> {
                self.0.append_if_head(expect_seq, payloads)
            }
        }
        f(&mut Plain(self))
    }

    fn put_snapshot(&self, seq: u64, head: &ChainLink, body: &[u8]) -> Result<SnapshotMeta> {
        let meta =
            SnapshotMeta { seq, head: *head, digest: snapshots::digest_of(body), source: format!("memory:{seq}") };
        let mut log = self.log.lock().expect("memory log");
        log.snapshots.retain(|(m, _)| m.seq != seq);
        log.snapshots.push((meta.clone(), body.to_vec()));
        log.snapshots.sort_by_key(|(m, _)| m.seq);
        while log.snapshots.len() > snapshots::SNAPSHOTS_KEPT {
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

    fn commit_stats(&self) -> (u64, u64) {
        let log = self.log.lock().expect("memory log");
        (log.appended, log.appended)
    }
}
