//! The file backend: a log as segment files in a directory (format v1/v2,
//! `log-format/FORMAT.md`), the cross-process append lock, fsync and recovery of
//! a torn tail, verifying readers, snapshot files, repair by evidence.

pub(crate) mod ahead;
pub(crate) mod dir;
pub mod export;
pub(crate) mod halt;
pub(crate) mod history;
pub mod index;
pub(crate) mod lock;
pub(crate) mod reader;
pub(crate) mod recovery;
pub(crate) mod repair;
pub mod snapshots;
pub(crate) mod writer;

use std::path::{Path, PathBuf};

use crate::format::{ChainLink, GENESIS_LINK, RecordRef, hex};
use crate::storage::backend::{
    AppendOutcome, Appended, Exclusive, Head, LogBackend, OpenReport, RecordReader, SnapshotMeta,
};
use crate::storage::error::{Error, Result};
use crate::storage::options::LogOptions;
use reader::Tailer;
use writer::Log;

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
    /// ([`history::check_whole_history`]).
    pub fn open_read_only(dir: impl AsRef<Path>, body_max: u32) -> Result<FileBackend> {
        let dir = dir.as_ref().to_path_buf();
        history::check_whole_history(&dir, body_max)?;
        Ok(FileBackend { dir, body_max, log: None })
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    fn log(&self) -> Result<&Log> {
        self.log.as_ref().ok_or(Error::ReadOnly)
    }
}

impl LogBackend for FileBackend {
    fn head(&self) -> Result<Head> {
        // Read from the start of the last segment (cheap), verifying as it goes.
        let mut t = Tailer::new(&self.dir, self.body_max, u64::MAX);
        t.poll(|_| {})?;
        let seq = t.next_seq().saturating_sub(1);
        // No record was visited: a head past the durable mark (a group in flight)
        // is made durable before it is given.
        let mark = lock::open_for_marks(&self.dir).and_then(|f| lock::durable_mark(&f));
        if mark.is_none_or(|m| m < seq) {
            lock::sync_last_segment(&self.dir, crate::storage::error::READ_SYNC_OP)?;
        }
        Ok(Head { seq, link: t.prev_link() })
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

    fn put_snapshot(&self, seq: u64, chain_head: &ChainLink, body: &[u8]) -> Result<SnapshotMeta> {
        snapshots::write(&self.dir, seq, chain_head, body)
    }

    fn newest_snapshots(&self) -> (Vec<SnapshotMeta>, Vec<String>) {
        snapshots::newest(&self.dir)
    }

    fn snapshot_body(&self, meta: &SnapshotMeta) -> std::result::Result<Vec<u8>, String> {
        snapshots::body(&self.dir, meta)
    }

    fn snapshot_age_ms(&self, meta: &SnapshotMeta) -> Option<u64> {
        snapshots::age_ms(&self.dir, meta)
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

    fn commit_stats(&self) -> crate::storage::CommitStats {
        self.log.as_ref().map_or_else(Default::default, Log::commit_stats)
    }
}
