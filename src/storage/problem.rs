//! What a reader found wrong, and where: every kind of damage a verifying read of
//! any backend (or the inspector, on top of one) reports, as one closed enum whose
//! stable code is what the JSON, the text and the documentation show.

use std::path::{Path, PathBuf};

use serde::Serialize;

use crate::format::DamageKind;

/// The kind of a [`Problem`]. Its [`code`](ProblemKind::code) is the stable word
/// every output prints (`docs/ERRORS.md`, `inspect verify --json`); a variant is
/// never renamed, only added.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProblemKind {
    /// Damage inside a segment's frames, as the format's scan names it.
    Frame(DamageKind),
    /// A commit group whose sync failed and was not cut back (a marker file names it).
    SyncFailed,
    /// A file in the log's directory whose name looks like a segment's but is not one.
    OddSegmentName,
    /// A segment that is not a regular file owned and writable as the log's are.
    UnsafeSegment,
    /// Records missing between two segments, or a header that does not continue
    /// the one before.
    SegmentDiscontinuity,
    /// The last segment's header torn while it was created (recovery cuts it).
    TornSegmentCreation,
    /// A segment header that does not decode.
    SegmentHeader,
    /// Zeroes where records must be, inside a sealed (not the last) segment.
    ZeroTailInSealedSegment,
    /// etcd: the records asked for were moved to an archive not given.
    HistoryArchived,
    /// etcd: a key among the records that names no record.
    OddRecordKey,
    /// etcd: a gap in the record keys, or records missing up to the head.
    RecordsMissing,
    /// The chain head does not match: etcd's head key against its record, or a
    /// pinned head against the log's.
    HeadMismatch,
    /// etcd: record keys past the head key.
    RecordsAfterHead,
    /// An archive that does not continue into the log.
    ArchiveMismatch,
    /// A snapshot file that does not decode.
    SnapshotDamaged,
    /// A snapshot that is not the state a replay gives at its sequence.
    SnapshotMismatch,
    /// A head was pinned at a sequence the log's intact records do not reach.
    LogShorterThanPinned,
}

impl ProblemKind {
    /// The stable word for this kind.
    pub fn code(&self) -> &'static str {
        match self {
            ProblemKind::Frame(d) => d.code(),
            ProblemKind::SyncFailed => "sync_failed",
            ProblemKind::OddSegmentName => "odd_segment_name",
            ProblemKind::UnsafeSegment => "unsafe_segment",
            ProblemKind::SegmentDiscontinuity => "segment_discontinuity",
            ProblemKind::TornSegmentCreation => "torn_segment_creation",
            ProblemKind::SegmentHeader => "segment_header",
            ProblemKind::ZeroTailInSealedSegment => "zero_tail_in_sealed_segment",
            ProblemKind::HistoryArchived => "history_archived",
            ProblemKind::OddRecordKey => "odd_record_key",
            ProblemKind::RecordsMissing => "records_missing",
            ProblemKind::HeadMismatch => "head_mismatch",
            ProblemKind::RecordsAfterHead => "records_after_head",
            ProblemKind::ArchiveMismatch => "archive_mismatch",
            ProblemKind::SnapshotDamaged => "snapshot_damaged",
            ProblemKind::SnapshotMismatch => "snapshot_mismatch",
            ProblemKind::LogShorterThanPinned => "log_shorter_than_pinned",
        }
    }

    /// A snapshot or a pinned head is wrong, not the records themselves.
    pub fn is_snapshot_or_pin(&self) -> bool {
        matches!(
            self,
            ProblemKind::SnapshotMismatch
                | ProblemKind::SnapshotDamaged
                | ProblemKind::HeadMismatch
                | ProblemKind::LogShorterThanPinned
        )
    }
}

impl std::fmt::Display for ProblemKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.code())
    }
}

impl Serialize for ProblemKind {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.code())
    }
}

/// Compared with its code, as a test or a script reads it.
impl PartialEq<&str> for ProblemKind {
    fn eq(&self, other: &&str) -> bool {
        self.code() == *other
    }
}

impl From<DamageKind> for ProblemKind {
    fn from(d: DamageKind) -> ProblemKind {
        ProblemKind::Frame(d)
    }
}

/// One problem found by a reader.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Problem {
    pub kind: ProblemKind,
    pub segment: PathBuf,
    pub offset: u64,
    /// The sequence expected at that point.
    pub seq: u64,
    /// Damage at the very end that writer recovery would cut as a torn write (as
    /// opposed to corruption, which it refuses).
    pub torn_tail: bool,
    /// Bytes skipped before the next intact frame (to the end if none).
    pub damaged_bytes: u64,
    pub detail: String,
}

impl Problem {
    /// A problem that concerns a place but no damaged bytes (for readers that
    /// combine sources: an archive that does not continue into the log; the
    /// inspector's snapshot and pin checks).
    pub fn at(kind: ProblemKind, at: &Path, offset: u64, seq: u64, detail: String) -> Problem {
        problem(kind, at, offset, seq, false, 0, detail)
    }
}

pub(crate) fn problem(
    kind: ProblemKind,
    segment: &Path,
    offset: u64,
    seq: u64,
    torn_tail: bool,
    damaged_bytes: u64,
    detail: String,
) -> Problem {
    Problem { kind, segment: segment.to_path_buf(), offset, seq, torn_tail, damaged_bytes, detail }
}
