//! The position index beside each segment (`<segment>.idx`, FORMAT.md §3b): where
//! some records start, so that a reader looking for sequence N, and a writer
//! looking for the end of the frames, read from near there instead of from the
//! segment's start. Without it both cost the size of the last segment (up to 64
//! MiB, read and checksummed) on every open: `fencelog run`, which opens the log
//! twice (the CLI and the runner), slowed with the log's length until the segment
//! rotated (issue 28).
//!
//! A hint, never the truth. An entry says "the frame of sequence S starts at byte
//! O, and the link of the record before it is L". It is used only once the frame
//! there proves it: intact (length, checksum), of sequence S, its stored link
//! following L (blake3). A missing, torn, damaged or stale entry proves nothing
//! and costs only time (the scan starts earlier, at worst at the segment's start).
//! The proof cannot tell a frame carried inside a payload from a real one, so an
//! entry *forged* to name one proves: against whoever can write the directory the
//! index is trusted as the segments are (FORMAT.md §3b, §6b). The index is written
//! without `fsync`, after the frames it names are durable, and never poisons a
//! writer when it cannot be written.
//!
//! Layout: entry `k` (k ≥ 1) describes a record starting in bytes `[k·S, (k+1)·S)`
//! of the segment (S = [`INDEX_STRIDE_BYTES`]), at `(k − 1) · 52` in the file:
//! `seq u64 LE | offset u64 LE | prev_link [32] | crc32 u32 LE` of the first 48
//! bytes. A slot never written reads as zeros, whose checksum does not match.

use std::fs::{File, OpenOptions};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use crate::format::{ChainLink, Cursor, FRAME_HEADER_BYTES, decode_frame};

/// One entry per this many bytes of a segment: a seek or a recovery reads at most
/// about this much before the place it looks for (more only where entries are
/// missing).
pub const INDEX_STRIDE_BYTES: u64 = 256 * 1024;
/// Bytes of one entry.
pub const INDEX_ENTRY_BYTES: usize = 52;
const INDEX_SUFFIX: &str = "idx";
/// Entries tried (newest first) before a reader gives up on the index and reads
/// from the segment's start.
const PROOF_TRIES_MAX: usize = 4;

/// A place in a segment: the record of sequence `cursor.next_seq` starts at byte
/// `offset`, and `cursor.prev_link` is the link of the record before it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Position {
    pub offset: u64,
    pub cursor: Cursor,
}

/// `…/<first seq>.idx` beside `…/<first seq>.seg`.
pub fn index_path(segment: &Path) -> PathBuf {
    segment.with_extension(INDEX_SUFFIX)
}

/// Is `name` an index file's name (`<20 digits>.idx`)?
pub(crate) fn is_index_name(name: &str) -> bool {
    name.strip_suffix(".idx").is_some_and(|stem| super::dir::segment_seq(&format!("{stem}.seg")).is_some())
}

fn slot_of(offset: u64) -> u64 {
    offset / INDEX_STRIDE_BYTES
}

/// The 52 bytes of an entry (FORMAT.md §3b).
pub fn encode(p: &Position) -> [u8; INDEX_ENTRY_BYTES] {
    let mut e = [0u8; INDEX_ENTRY_BYTES];
    e[0..8].copy_from_slice(&p.cursor.next_seq.to_le_bytes());
    e[8..16].copy_from_slice(&p.offset.to_le_bytes());
    e[16..48].copy_from_slice(&p.cursor.prev_link);
    let crc = crc32fast::hash(&e[..48]);
    e[48..52].copy_from_slice(&crc.to_le_bytes());
    e
}

/// An entry's claim, if its checksum holds and it names a sequence (`e`: 52 bytes).
pub fn decode(e: &[u8]) -> Option<Position> {
    let crc = u32::from_le_bytes(e[48..52].try_into().ok()?);
    if crc32fast::hash(&e[..48]) != crc {
        return None;
    }
    let seq = u64::from_le_bytes(e[0..8].try_into().ok()?);
    let offset = u64::from_le_bytes(e[8..16].try_into().ok()?);
    let prev_link: ChainLink = e[16..48].try_into().ok()?;
    (seq > 0).then_some(Position { offset, cursor: Cursor { next_seq: seq, prev_link } })
}

/// The entries of `segment`'s index that decode, each in its own slot (so in
/// order of offset; an entry whose offset is not in its slot is dropped, and the
/// sequences are not assumed to rise: see [`proven`]); empty if there is no
/// index, or it is not a regular file of at most the size a segment of
/// `segment_bytes_max` bytes needs. Nothing here is believed yet: see [`proven`].
pub fn read(segment: &Path, segment_first_seq: u64, segment_bytes_max: u64) -> Vec<Position> {
    let path = index_path(segment);
    let bytes_max = (segment_bytes_max / INDEX_STRIDE_BYTES + 1) * INDEX_ENTRY_BYTES as u64;
    let Ok(f) =
        OpenOptions::new().read(true).custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC).open(&path)
    else {
        return Vec::new();
    };
    let len = match super::dir::stat_file(&f) {
        Ok(m) if m.is_file && m.len <= bytes_max => m.len,
        _ => return Vec::new(),
    };
    let mut buf = vec![0u8; len as usize];
    if f.read_exact_at(&mut buf, 0).is_err() {
        return Vec::new();
    }
    buf.chunks_exact(INDEX_ENTRY_BYTES)
        .enumerate()
        .filter_map(|(i, e)| decode(e).filter(|p| slot_of(p.offset) == i as u64 + 1))
        .filter(|p| p.cursor.next_seq >= segment_first_seq)
        .collect()
}

/// Does the frame at the start of `bytes` prove `p`: intact, of `p`'s sequence, its
/// stored link following `p`'s link?
pub fn proves(bytes: &[u8], p: &Position, body_max: u32) -> bool {
    matches!(decode_frame(bytes, body_max),
        Ok((rec, _)) if rec.seq == p.cursor.next_seq && rec.link_follows(&p.cursor.prev_link))
}

/// The last of `positions` (in slot order) naming a sequence at or before `seq`
/// (`u64::MAX`: any) that `frame_at` proves, trying at most a few; `frame_at(p)`
/// says whether the frame at `p.offset` proves `p`.
pub fn proven(positions: &[Position], seq: u64, mut frame_at: impl FnMut(&Position) -> bool) -> Option<Position> {
    positions.iter().rev().filter(|p| p.cursor.next_seq <= seq).take(PROOF_TRIES_MAX).find(|p| frame_at(p)).copied()
}

/// Does the frame at `p.offset` of `f` (`len` bytes long) prove `p`? Reads one
/// frame (at most `body_max` and its header).
pub fn proves_in_file(f: &File, len: u64, p: &Position, body_max: u32) -> bool {
    let mut head = [0u8; FRAME_HEADER_BYTES];
    if p.offset + FRAME_HEADER_BYTES as u64 > len || f.read_exact_at(&mut head, p.offset).is_err() {
        return false;
    }
    let body = u64::from(u32::from_le_bytes(head[..4].try_into().expect("4 bytes")));
    let frame = FRAME_HEADER_BYTES as u64 + body;
    if body > u64::from(body_max) || p.offset + frame > len {
        return false;
    }
    let mut bytes = vec![0u8; frame as usize];
    f.read_exact_at(&mut bytes, p.offset).is_ok() && proves(&bytes, p, body_max)
}

/// What a writer records in the index of the segment it appends to: the first
/// record it writes in each slot it reaches, once that record is durable.
#[derive(Debug)]
pub struct IndexWriter {
    segment: PathBuf,
    file: Option<File>,
    /// Slots at or below this one are not written again (written, or passed).
    slot_done: u64,
    /// Noted, not yet durable (dropped with the writer of a group that fails:
    /// see `Writer::cut_back`).
    pending: Vec<Position>,
    /// Writing failed once: not tried again for this segment.
    failed: bool,
}

impl IndexWriter {
    /// For appends to `segment` after byte `end` (the end of its frames): the slots
    /// before the one holding `end` are taken as done.
    pub fn new(segment: &Path, end: u64) -> IndexWriter {
        IndexWriter {
            segment: segment.to_path_buf(),
            file: None,
            slot_done: slot_of(end.saturating_sub(1)),
            pending: Vec::new(),
            failed: false,
        }
    }

    /// Frames this writer did not write reach `end` (another process's appends,
    /// adopted): the slots they crossed are theirs.
    pub fn passed(&mut self, end: u64) {
        self.slot_done = self.slot_done.max(slot_of(end.saturating_sub(1)));
    }

    /// A record is about to be written at `offset`, the cursor at `cursor`.
    pub fn note(&mut self, offset: u64, cursor: &Cursor) {
        let slot = slot_of(offset);
        if slot > self.slot_done {
            self.slot_done = slot;
            self.pending.push(Position { offset, cursor: *cursor });
        }
    }

    /// The records noted are durable: write their entries (no `fsync`: a lost
    /// entry costs a longer scan, never a wrong answer). Failures are logged once
    /// and never fail the append.
    pub fn write_pending(&mut self) {
        if self.pending.is_empty() {
            return;
        }
        let pending = std::mem::take(&mut self.pending);
        if self.failed {
            return;
        }
        if let Err(e) = self.write(&pending) {
            self.failed = true;
            tracing::warn!(index = %index_path(&self.segment).display(), error = %e,
                "the segment's position index was not written (appends go on; seeks read more)");
        }
    }

    fn write(&mut self, positions: &[Position]) -> std::io::Result<()> {
        fail::fail_point!("index::write", |_| Err(std::io::Error::other("injected index write failure")));
        if self.file.is_none() {
            let f = OpenOptions::new()
                .write(true)
                .create(true)
                .mode(0o600)
                .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC)
                .open(index_path(&self.segment))?;
            if !super::dir::stat_file(&f)?.is_file {
                return Err(std::io::Error::other("not a regular file"));
            }
            self.file = Some(f);
        }
        let f = self.file.as_ref().expect("opened");
        for p in positions {
            f.write_all_at(&encode(p), (slot_of(p.offset) - 1) * INDEX_ENTRY_BYTES as u64)?;
        }
        Ok(())
    }
}

/// Write the entries of `positions` (found by a scan of `segment`) that `known`
/// does not already hold: recovery fills the index of the segment it scanned, so
/// the next open reads from near the end. The entries' own write is best effort,
/// as every index write.
///
/// The frames a recovery scanned may never have been synced (a writer that died
/// between its write and its `fdatasync` leaves them in the page cache, and
/// recovery adopts them). An entry must never be on disk before the frames it
/// names and every frame before them, or a power cut could keep the entry and
/// lose a page before it, and an open starting there would not see the hole. So
/// the segment is synced first. That sync failing is the open's failure, as any
/// failed sync of the log is (its error is reported once, to this descriptor:
/// the writer's own would not see it); nothing is written then.
pub fn fill(segment: &Path, known: &[Position], positions: &[Position]) -> std::io::Result<()> {
    let missing: Vec<Position> = positions.iter().filter(|p| !known.contains(p)).copied().collect();
    if missing.is_empty() {
        return Ok(());
    }
    let f = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(segment)?;
    fail::fail_point!("index::fill_sync", |_| Err(std::io::Error::other("injected fdatasync failure")));
    f.sync_data()?;
    let mut w = IndexWriter::new(segment, 0);
    w.pending = missing;
    w.write_pending();
    Ok(())
}

/// The first record of each slot, as a scan visits records: for [`fill`].
#[derive(Debug, Default)]
pub struct SlotFinder {
    last_slot: u64,
    pub found: Vec<Position>,
}

impl SlotFinder {
    /// A finder for a scan starting at byte `from`: its slot is not looked for.
    pub fn from(from: u64) -> SlotFinder {
        SlotFinder { last_slot: slot_of(from), found: Vec::new() }
    }

    /// The scan reached a record at `offset` with the cursor before it at `cursor`.
    pub fn visit(&mut self, offset: u64, cursor: &Cursor) {
        let slot = slot_of(offset);
        if slot > self.last_slot {
            self.last_slot = slot;
            self.found.push(Position { offset, cursor: *cursor });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pos(seq: u64, offset: u64) -> Position {
        Position { offset, cursor: Cursor { next_seq: seq, prev_link: [seq as u8; 32] } }
    }

    #[test]
    fn an_entry_round_trips_and_a_flipped_bit_or_zeros_decode_to_nothing() {
        let p = pos(42, 3 * INDEX_STRIDE_BYTES + 17);
        let e = encode(&p);
        assert_eq!(decode(&e), Some(p));
        for i in 0..INDEX_ENTRY_BYTES {
            let mut bad = e;
            bad[i] ^= 0x10;
            assert_eq!(decode(&bad), None, "bit flipped in byte {i}");
        }
        assert_eq!(decode(&[0u8; INDEX_ENTRY_BYTES]), None);
    }

    #[test]
    fn only_entries_in_their_own_slot_are_read_and_the_newest_proven_one_at_or_before_a_sequence_is_used() {
        let dir = tempfile::tempdir().unwrap();
        let seg = dir.path().join("00000000000000000001.seg");
        let mut bytes = Vec::new();
        bytes.extend(encode(&pos(100, INDEX_STRIDE_BYTES + 5))); // slot 1: kept
        bytes.extend(encode(&pos(90, 2 * INDEX_STRIDE_BYTES + 5))); // slot 2: kept (a sequence that goes back)
        bytes.extend(encode(&pos(300, 5))); // slot 3 holding an offset of slot 0
        bytes.extend([0u8; INDEX_ENTRY_BYTES]); // slot 4: never written
        bytes.extend(encode(&pos(500, 5 * INDEX_STRIDE_BYTES))); // slot 5: kept
        std::fs::write(index_path(&seg), &bytes).unwrap();
        let read = read(&seg, 1, 64 << 20);
        let (a, b, c) =
            (pos(100, INDEX_STRIDE_BYTES + 5), pos(90, 2 * INDEX_STRIDE_BYTES + 5), pos(500, 5 * INDEX_STRIDE_BYTES));
        assert_eq!(read, vec![a, b, c]);
        assert_eq!(proven(&read, 499, |_| true), Some(b));
        assert_eq!(proven(&read, u64::MAX, |p| p.cursor.next_seq != 500), Some(b));
        assert_eq!(proven(&read, u64::MAX, |p| p.cursor.next_seq == 100), Some(a));
        assert_eq!(proven(&read, 89, |_| true), None);
    }

    #[test]
    fn an_index_larger_than_a_segment_needs_or_not_a_file_is_not_read() {
        let dir = tempfile::tempdir().unwrap();
        let seg = dir.path().join("00000000000000000001.seg");
        let mut bytes = encode(&pos(100, INDEX_STRIDE_BYTES + 5)).to_vec();
        bytes.resize(((1 << 20) / INDEX_STRIDE_BYTES + 2) as usize * INDEX_ENTRY_BYTES, 0);
        std::fs::write(index_path(&seg), &bytes).unwrap();
        assert!(read(&seg, 1, 1 << 20).is_empty(), "too large for a 1 MiB segment");
        assert_eq!(read(&seg, 1, 64 << 20).len(), 1);
        std::fs::remove_file(index_path(&seg)).unwrap();
        std::os::unix::fs::symlink("/dev/zero", index_path(&seg)).unwrap();
        assert!(read(&seg, 1, 64 << 20).is_empty(), "a symlink is not followed");
    }

    #[test]
    fn index_names_are_known_only_for_valid_segment_names() {
        assert!(is_index_name("00000000000000000001.idx"));
        assert!(!is_index_name("1.idx"));
        assert!(!is_index_name("00000000000000000000.idx"));
        assert!(!is_index_name("notes.idx"));
    }
}
