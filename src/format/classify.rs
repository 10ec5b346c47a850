//! Recovery's decision table (FORMAT.md §6) as one pure function: each kind of
//! evidence maps to one action. Recovery, catch-up, the readers and the inspector
//! all ask this function, so "torn" means the same thing everywhere.

use super::scan::DamageKind;

/// Disk sector size assumed when telling a torn write from rot: a write interrupted
/// by a crash leaves whole sectors unwritten (zero on a freshly extended file).
pub const SECTOR_BYTES: u64 = 512;

/// A zero run shorter than this at the edge of a sector is no evidence of a torn
/// write: little-endian integers in a record are full of zero high bytes.
pub const ZERO_RUN_BYTES_MIN: usize = 16;

/// What recovery found at one place of the log.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Evidence {
    /// The segment ends cleanly at a frame boundary.
    Clean,
    /// A damaged frame.
    Frame {
        kind: DamageKind,
        /// The segment is sealed: a later segment exists.
        sealed: bool,
        /// An intact frame follows the damage in the same segment.
        intact_after: bool,
        /// The damaged region (damage to end of segment) has a sector-aligned run of
        /// at least [`ZERO_RUN_BYTES_MIN`] zero bytes filling its sector.
        zeroed_sector: bool,
    },
    /// A segment header that does not decode.
    Header {
        /// An intact header of a version this build does not read.
        unsupported_version: bool,
        sealed: bool,
        /// The segment holds an intact frame after the damaged header.
        intact_frame_after: bool,
    },
    /// A segment header that does not continue the previous segment, or a first
    /// segment that does not start at sequence 1 with the genesis link.
    Discontinuity,
}

/// What recovery does about it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    Keep,
    /// Copy the bytes from the damage to the end into an evidence file, then cut.
    CutTornTail,
    /// Move a segment torn while it was being created to evidence, whole.
    SetAsideTornSegment,
    /// Corruption: change nothing; name segment, offset and sequence.
    Refuse,
    /// A complete last frame that fails its checksum with no sign of a torn write:
    /// rot of a record that may have been acknowledged. Refused; only an explicit
    /// `fencelog repair --cut-from SEQ` cuts it.
    RefuseRotten,
    /// A newer format: refuse, naming the version.
    RefuseUnsupported,
}

/// The decision table. Each arm is labelled with its row in FORMAT.md §6.
pub fn classify(e: Evidence) -> Action {
    use DamageKind::*;
    match e {
        // R1: normal.
        Evidence::Clean => Action::Keep,
        // R5: damage followed by intact records, or anywhere in a sealed segment: a
        // crash only ever damages the tail.
        Evidence::Frame { sealed: true, .. } | Evidence::Frame { intact_after: true, .. } => Action::Refuse,
        // R2: the last frame runs past the end of the file (or, preallocated, into
        // zeros where its group's end mark belongs): an interrupted write.
        Evidence::Frame { kind: Incomplete, .. } => Action::CutTornTail,
        // R2b: after the end mark of a preallocated segment, bytes that hold no
        // intact frame: the group before the mark is whole; they were never
        // acknowledged.
        Evidence::Frame { kind: AfterEndMark, .. } => Action::CutTornTail,
        // R3: a complete last frame fails its checksum (or its length is impossible)
        // and a sector of it is zeros: sectors of the last write did not persist.
        Evidence::Frame { kind: Checksum | LengthOutOfRange, zeroed_sector: true, .. } => Action::CutTornTail,
        // R4: the same without a zeroed sector: rot of a record that may have been
        // acknowledged. Cutting it could hand out its generation again.
        Evidence::Frame { kind: Checksum | LengthOutOfRange, zeroed_sector: false, .. } => Action::RefuseRotten,
        // R4: a whole body that checksums, behind a length field that says more:
        // the length field rotted.
        Evidence::Frame { kind: LengthMismatch, .. } => Action::RefuseRotten,
        // R6: a frame whose checksum holds but whose sequence or link is wrong was
        // written whole: an edit, deletion, reorder or splice.
        Evidence::Frame { kind: SequenceMismatch { .. } | ChainMismatch, .. } => Action::Refuse,
        // R7: checksum holds but the body contradicts itself: a writer bug.
        Evidence::Frame { kind: Malformed, .. } => Action::Refuse,
        // R10: a newer fencelog wrote it.
        Evidence::Header { unsupported_version: true, .. } => Action::RefuseUnsupported,
        // R8: the last segment's header never reached the disk whole and nothing
        // intact follows: a crash while creating it.
        Evidence::Header { sealed: false, intact_frame_after: false, .. } => Action::SetAsideTornSegment,
        // R9: a damaged header with records after it, or of a sealed segment.
        Evidence::Header { .. } => Action::Refuse,
        // R11: a segment was deleted, replaced or renamed.
        Evidence::Discontinuity => Action::Refuse,
    }
}

/// Does `region` (which starts at file offset `file_offset`) hold a sector-aligned
/// piece of at least [`ZERO_RUN_BYTES_MIN`] bytes that is all zeros? The pieces are
/// the region cut at every multiple of [`SECTOR_BYTES`] (as etcd's WAL judges a torn
/// entry), so a piece is zero exactly when its sector's write did not persist.
pub fn has_zeroed_sector(region: &[u8], file_offset: u64) -> bool {
    // Zeros to the end of the file are never a record (a frame's length is ≥ 72).
    if !region.is_empty() && region.iter().all(|&b| b == 0) {
        return true;
    }
    let mut at = 0usize;
    while at < region.len() {
        let sector_end = ((file_offset + at as u64) / SECTOR_BYTES + 1) * SECTOR_BYTES;
        let end = ((sector_end - file_offset) as usize).min(region.len());
        let piece = &region[at..end];
        if piece.len() >= ZERO_RUN_BYTES_MIN && piece.iter().all(|&b| b == 0) {
            return true;
        }
        at = end;
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(kind: DamageKind, sealed: bool, intact_after: bool, zeroed_sector: bool) -> Evidence {
        Evidence::Frame { kind, sealed, intact_after, zeroed_sector }
    }

    /// Proves: every row of FORMAT.md §6 maps to its action, and every combination
    /// of frame evidence is covered (no combination panics or falls through).
    #[test]
    fn every_row_of_the_decision_table() {
        use Action::*;
        use DamageKind::*;
        assert_eq!(classify(Evidence::Clean), Keep, "R1");
        assert_eq!(classify(frame(Incomplete, false, false, false)), CutTornTail, "R2");
        assert_eq!(classify(frame(Incomplete, false, false, true)), CutTornTail, "R2");
        assert_eq!(classify(frame(Checksum, false, false, true)), CutTornTail, "R3");
        assert_eq!(classify(frame(LengthOutOfRange, false, false, true)), CutTornTail, "R3");
        assert_eq!(classify(frame(Checksum, false, false, false)), RefuseRotten, "R4");
        assert_eq!(classify(frame(LengthOutOfRange, false, false, false)), RefuseRotten, "R4");
        assert_eq!(classify(frame(LengthMismatch, false, false, true)), RefuseRotten, "R4 length field");
        assert_eq!(classify(frame(AfterEndMark, false, false, false)), CutTornTail, "R2b");
        for kind in [
            Incomplete,
            Checksum,
            LengthOutOfRange,
            Malformed,
            ChainMismatch,
            SequenceMismatch { found: 9 },
            LengthMismatch,
            AfterEndMark,
        ] {
            for z in [false, true] {
                assert_eq!(classify(frame(kind, true, false, z)), Refuse, "R5 sealed {kind:?}");
                assert_eq!(classify(frame(kind, false, true, z)), Refuse, "R5 intact after {kind:?}");
            }
        }
        assert_eq!(classify(frame(SequenceMismatch { found: 3 }, false, false, false)), Refuse, "R6");
        assert_eq!(classify(frame(ChainMismatch, false, false, true)), Refuse, "R6");
        assert_eq!(classify(frame(Malformed, false, false, true)), Refuse, "R7");
        let header = |unsupported_version, sealed, intact_frame_after| Evidence::Header {
            unsupported_version,
            sealed,
            intact_frame_after,
        };
        assert_eq!(classify(header(false, false, false)), SetAsideTornSegment, "R8");
        assert_eq!(classify(header(false, false, true)), Refuse, "R9");
        assert_eq!(classify(header(false, true, false)), Refuse, "R9");
        for (s, i) in [(false, false), (true, true)] {
            assert_eq!(classify(header(true, s, i)), RefuseUnsupported, "R10");
        }
        assert_eq!(classify(Evidence::Discontinuity), Refuse, "R11");
    }

    #[test]
    fn a_zeroed_sector_is_judged_at_file_offsets_not_buffer_offsets() {
        // 600 bytes starting at file offset 500: pieces are 500..512 (12 bytes),
        // 512..1024 (512), 1024..1100 (76).
        let mut r = vec![7u8; 600];
        assert!(!has_zeroed_sector(&r, 500));
        r[..12].fill(0); // too short a run to be evidence
        assert!(!has_zeroed_sector(&r, 500));
        r[12..524].fill(0); // the whole sector 512..1024
        assert!(has_zeroed_sector(&r, 500));
        let mut tail = vec![7u8; 600];
        tail[524..].fill(0); // the last, partial piece 1024..1100
        assert!(has_zeroed_sector(&tail, 500));
        assert!(has_zeroed_sector(&[0u8; 10], 3), "zeros to the end are never a record");
        let mut unaligned = vec![7u8; 600];
        unaligned[100..400].fill(0); // 300 zeros, but not filling any piece
        assert!(!has_zeroed_sector(&unaligned, 500));
    }
}
