//! Records moved between backends byte for byte: frames written elsewhere (etcd)
//! put into segment files of a log directory, exactly as they are — the same
//! sequence, writer, time and chain link — so that `inspect verify DIR` gives the
//! same chain head, and a head pinned on one verifies on the other. Segments are
//! written in format version 1 (frames back to back, no preallocation: a log every
//! build reads and appends to).

use std::io::Write;
use std::path::{Path, PathBuf};

use super::dir::{create_dir_private, open_private, segment_path, sync_dir};
use crate::format::{ChainLink, FRAME_HEADER_BYTES, GENESIS_LINK, SEGMENT_BYTES_HARD_MAX, SegmentHeader};
use crate::storage::error::{Error, Result};

/// Frames appended to segment files of a directory, in sequence order.
pub struct SegmentSink {
    dir: PathBuf,
    /// The open segment: its file, path, first sequence and length.
    open: Option<(std::fs::File, PathBuf, u64, u64)>,
    next_seq: u64,
    prev_link: ChainLink,
    segment_bytes_max: u64,
    written: u64,
}

impl SegmentSink {
    /// A new log directory `dir` (missing or empty) to hold records from
    /// `first_seq` on, the record before them linking `prev_link`.
    pub fn create(dir: &Path, first_seq: u64, prev_link: ChainLink) -> Result<SegmentSink> {
        if dir.exists() && std::fs::read_dir(dir).map_err(Error::io("list", dir))?.next().is_some() {
            return Err(Error::InvalidOption {
                detail: format!("{} is not empty: records are written only into a new directory", dir.display()),
            });
        }
        create_dir_private(dir)?;
        Ok(SegmentSink::new(dir, first_seq, prev_link))
    }

    /// Records appended to the directory `dir` of a log (an archive) that ends at
    /// `first_seq - 1` with link `prev_link`: they go into new segments after it.
    pub fn continuing(dir: &Path, first_seq: u64, prev_link: ChainLink) -> SegmentSink {
        SegmentSink::new(dir, first_seq, prev_link)
    }

    fn new(dir: &Path, first_seq: u64, prev_link: ChainLink) -> SegmentSink {
        SegmentSink {
            dir: dir.to_path_buf(),
            open: None,
            next_seq: first_seq,
            prev_link,
            segment_bytes_max: SEGMENT_BYTES_HARD_MAX,
            written: 0,
        }
    }

    /// Append record `seq` (its frame as stored; its chain link `link`), which
    /// must be the next one.
    pub fn push(&mut self, seq: u64, frame: &[u8], link: &ChainLink) -> Result<()> {
        assert_eq!(seq, self.next_seq, "frames are pushed in sequence order");
        assert!(frame.len() > FRAME_HEADER_BYTES, "a whole frame");
        let full = self
            .open
            .as_ref()
            .is_some_and(|(_, _, first, len)| *first < seq && len + frame.len() as u64 > self.segment_bytes_max);
        if full {
            self.seal()?;
        }
        if self.open.is_none() {
            let path = segment_path(&self.dir, seq);
            let mut f = open_private(&path, true)?;
            let header = SegmentHeader { version: 1, first_seq: seq, prev_link: self.prev_link }.encode();
            f.write_all(&header).map_err(Error::io("write segment header", &path))?;
            self.open = Some((f, path, seq, header.len() as u64));
        }
        let (f, path, _, len) = self.open.as_mut().expect("open");
        f.write_all(frame).map_err(Error::io("write", path.as_path()))?;
        *len += frame.len() as u64;
        self.written += 1;
        self.next_seq += 1;
        self.prev_link = *link;
        Ok(())
    }

    /// Make the open segment durable and close it.
    fn seal(&mut self) -> Result<()> {
        if let Some((f, path, _, _)) = self.open.take() {
            f.sync_all().map_err(Error::io("fsync", &path))?;
        }
        Ok(())
    }

    /// Make everything durable: the segments, the directory, and the traces every
    /// log directory has (`LOCK`, `snapshots/`). Returns the records written.
    pub fn finish(mut self) -> Result<u64> {
        self.seal()?;
        let lock = self.dir.join(super::dir::LOCK_FILE);
        if !lock.exists() && self.written > 0 {
            open_private(&lock, true)?.sync_all().map_err(Error::io("fsync", &lock))?;
        }
        let snaps = self.dir.join(super::dir::SNAPSHOT_DIR);
        if !snaps.exists() {
            create_dir_private(&snaps)?;
        }
        sync_dir(&self.dir)?;
        Ok(self.written)
    }

    /// The sequence the next record must carry, and the link it must follow.
    pub fn next(&self) -> (u64, ChainLink) {
        (self.next_seq, self.prev_link)
    }
}

/// The link a log that begins at `first_seq` continues from (the genesis link for
/// a log from record 1).
pub fn start_link(first_seq: u64, archived: Option<ChainLink>) -> ChainLink {
    if first_seq == 1 { GENESIS_LINK } else { archived.unwrap_or(GENESIS_LINK) }
}
