//! Scanning a run of frames with full verification: checksum, dense sequence and the
//! hash chain. One scanner serves the writer's recovery, the writer's catch-up and
//! every reader; the caller decides what a damage means (FORMAT.md §5).

use super::ahead::LinksAhead;
use super::classify::{Action, Evidence, classify, has_zeroed_sector};
use super::frame::{BODY_FIXED_BYTES, ChainLink, FRAME_HEADER_BYTES, FrameError, RecordRef, decode_frame};
use super::segment::{FRAMES_END_MARK, Layout};

/// Where verification stands: the sequence the next record must carry and the link
/// it must follow from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cursor {
    pub next_seq: u64,
    pub prev_link: ChainLink,
}

/// What is wrong at an offset.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DamageKind {
    /// The bytes end inside a frame header or body.
    Incomplete,
    /// The length field is impossible.
    LengthOutOfRange,
    /// The body checksum does not match.
    Checksum,
    /// The checksum matches but the body is self-contradictory.
    Malformed,
    /// An intact frame carries the wrong sequence number.
    SequenceMismatch { found: u64 },
    /// An intact frame does not link to its predecessor (edit, reorder, splice).
    ChainMismatch,
    /// The length field says the frame runs past the end, yet the bytes to the end
    /// are a whole body that matches the stored checksum: the length field rotted
    /// (a torn write cannot leave a prefix that checksums as the whole).
    LengthMismatch,
    /// Bytes that are not a frame after the end mark of a preallocated segment: the
    /// group before the mark was written whole; what follows it was never
    /// acknowledged (a later group whose write did not complete, or damage to
    /// space no record uses).
    AfterEndMark,
}

impl DamageKind {
    pub fn code(&self) -> &'static str {
        match self {
            DamageKind::Incomplete => "incomplete_frame",
            DamageKind::LengthOutOfRange => "length_out_of_range",
            DamageKind::Checksum => "checksum_mismatch",
            DamageKind::Malformed => "malformed_body",
            DamageKind::SequenceMismatch { .. } => "sequence_mismatch",
            DamageKind::ChainMismatch => "chain_mismatch",
            DamageKind::LengthMismatch => "length_mismatch",
            DamageKind::AfterEndMark => "bytes_after_end_mark",
        }
    }
}

/// Damage found by a scan. Offsets are relative to the scanned buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Damage {
    pub kind: DamageKind,
    pub offset: u64,
    /// The sequence the damaged frame should have carried.
    pub expected_seq: u64,
    /// Offset of the next intact frame after the damage in the same buffer, if any.
    pub resync_at: Option<u64>,
    /// The bytes from the damage to the end of the buffer hold a zeroed sector
    /// (see [`has_zeroed_sector`]); judged at file offsets.
    pub zeroed_sector: bool,
}

impl Damage {
    /// The decision-table evidence for this damage, in a segment that is `sealed`
    /// (a later segment exists) or the last one.
    pub fn evidence(&self, sealed: bool) -> Evidence {
        Evidence::Frame {
            kind: self.kind,
            sealed,
            intact_after: self.resync_at.is_some(),
            zeroed_sector: self.zeroed_sector,
        }
    }

    /// True when, at the end of the last segment, this damage is a torn write that
    /// recovery cuts (FORMAT.md §6 rows R2 and R3).
    pub fn is_torn_tail(&self) -> bool {
        classify(self.evidence(false)) == Action::CutTornTail
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ScanOutcome {
    /// Every byte from `start` to the end is intact frames.
    Clean,
    /// Intact frames end at `offset`, and every byte from there to the end of the
    /// buffer is zero: the unused, preallocated space of a version 2 segment
    /// ([`Layout::Preallocated`] only).
    ZeroTail {
        offset: u64,
    },
    Damaged(Damage),
}

/// Verify frames in `buf[start..]`, advancing `cursor` and calling `visit(offset,
/// record)` for each intact record in order. Stops at the first damage.
pub fn scan_frames(
    buf: &[u8],
    start: usize,
    cursor: &mut Cursor,
    body_max: u32,
    visit: impl FnMut(u64, &RecordRef<'_>),
) -> ScanOutcome {
    scan_frames_in(buf, start, 0, cursor, body_max, visit)
}

/// [`scan_frames`] on a buffer that starts at byte `file_offset` of its segment
/// (sector alignment, for telling a torn write from rot, is judged in the file).
pub fn scan_frames_in(
    buf: &[u8],
    start: usize,
    file_offset: u64,
    cursor: &mut Cursor,
    body_max: u32,
    visit: impl FnMut(u64, &RecordRef<'_>),
) -> ScanOutcome {
    scan_segment_frames(buf, start, file_offset, cursor, body_max, Layout::Appended, visit)
}

/// [`scan_frames_in`] for a segment of either layout. In a preallocated segment a
/// frame boundary followed only by zeros is the end of the frames
/// ([`ScanOutcome::ZeroTail`]); damage is judged on the *damaged region*: from the
/// damage to the later of the end of the non-zero bytes and the end the damaged
/// frame's length claims — the zeros after it are space never written, not evidence
/// of a torn write (FORMAT.md §3a).
pub fn scan_segment_frames(
    buf: &[u8],
    start: usize,
    file_offset: u64,
    cursor: &mut Cursor,
    body_max: u32,
    layout: Layout,
    visit: impl FnMut(u64, &RecordRef<'_>),
) -> ScanOutcome {
    scan_segment_frames_from(buf, start, file_offset, cursor, body_max, layout, 0, visit)
}

/// [`scan_segment_frames`] that checks the hash chain only from sequence
/// `chain_from` on. Before it, each frame is still checked whole (length, checksum,
/// its place in the dense sequence), and the cursor takes each record's *stored*
/// link: what a reader that does not answer from those records needs (their
/// successors' links are then checked against it).
#[allow(clippy::too_many_arguments)]
pub fn scan_segment_frames_from(
    buf: &[u8],
    start: usize,
    file_offset: u64,
    cursor: &mut Cursor,
    body_max: u32,
    layout: Layout,
    chain_from: u64,
    visit: impl FnMut(u64, &RecordRef<'_>),
) -> ScanOutcome {
    scan_segment_frames_ahead(buf, start, file_offset, cursor, body_max, layout, chain_from, None, visit)
}

/// [`scan_segment_frames_from`] taking what `ahead` (built on the same `buf`) has
/// checked of the chain: the same outcome, with the links checked by other threads.
#[allow(clippy::too_many_arguments)]
pub fn scan_segment_frames_ahead(
    buf: &[u8],
    start: usize,
    file_offset: u64,
    cursor: &mut Cursor,
    body_max: u32,
    layout: Layout,
    chain_from: u64,
    ahead: Option<&LinksAhead<'_>>,
    mut visit: impl FnMut(u64, &RecordRef<'_>),
) -> ScanOutcome {
    let mut hint = 0;
    let mut follows = |at: usize, prev: &ChainLink, rec: &RecordRef<'_>| match ahead {
        Some(a) => a.follows(&mut hint, at, prev, rec),
        None => rec.link_follows(prev),
    };
    let mut at = start;
    while at < buf.len() {
        // In a preallocated segment the frames end at the end mark (or, where no
        // group was ever written, at zeros), and only zeros may follow.
        // (A mark cut short by a write that stopped in it counts: its bytes are
        // never zero, so a prefix of it followed by zeros is nothing else.)
        let mut after_mark = false;
        if layout == Layout::Preallocated {
            if ends_frames(&buf[at..]) {
                return ScanOutcome::ZeroTail { offset: at as u64 };
            }
            after_mark = buf[at..].starts_with(&FRAMES_END_MARK);
        }
        let kind = match decode_frame(&buf[at..], body_max) {
            Ok((rec, used)) => {
                if rec.seq != cursor.next_seq {
                    DamageKind::SequenceMismatch { found: rec.seq }
                } else if rec.seq >= chain_from && !follows(at, &cursor.prev_link, &rec) {
                    DamageKind::ChainMismatch
                } else {
                    visit(at as u64, &rec);
                    cursor.next_seq += 1;
                    cursor.prev_link = rec.link;
                    at += used;
                    continue;
                }
            }
            Err(FrameError::Incomplete { .. }) => DamageKind::Incomplete,
            Err(FrameError::LengthOutOfRange { .. }) => DamageKind::LengthOutOfRange,
            Err(FrameError::Checksum { .. }) => DamageKind::Checksum,
            Err(FrameError::Malformed) => DamageKind::Malformed,
        };
        // Damage ends the scan: what it is, and where intact frames follow it, are
        // judged once, out of the frame loop (`damage_kind`, `damage_at`).
        let kind = damage_kind(buf, at, kind, after_mark, body_max, layout);
        return ScanOutcome::Damaged(damage_at(buf, at, file_offset, kind, cursor.next_seq, body_max, layout));
    }
    ScanOutcome::Clean
}

/// What the damage at `at` is, from what decoding the frame there said (`kind`):
/// the first answer refined, in this order, by what the bytes around it show (a
/// length that rotted, too few bytes for any frame, a write that stopped part way,
/// the end mark). Only where a scan stops at damage: never on its hot path.
fn damage_kind(buf: &[u8], at: usize, kind: DamageKind, after_mark: bool, body_max: u32, layout: Layout) -> DamageKind {
    let kind = if kind == DamageKind::Incomplete && whole_body_after_rotten_length(&buf[at..]) {
        DamageKind::LengthMismatch
    } else {
        kind
    };
    // Fewer bytes than the smallest frame cannot hold a complete (possibly
    // acknowledged) record, whatever their length field says: incomplete.
    let kind = if buf.len() - at < FRAME_HEADER_BYTES + BODY_FIXED_BYTES
        && matches!(kind, DamageKind::LengthOutOfRange | DamageKind::Checksum)
    {
        DamageKind::Incomplete
    } else {
        kind
    };
    // A frame that checks out to no sum, followed by zeros where the end mark
    // of its group would be, was never written whole: its write stopped part
    // way (a process killed while copying it, or a reader looking while it is
    // copied). With the mark after it, it was written whole: damage is rot.
    let kind = match (layout, claimed_end(buf, at, body_max)) {
        _ if after_mark => DamageKind::AfterEndMark,
        (Layout::Preallocated, Some(end))
            if kind == DamageKind::Checksum && end < buf.len() && all_zero(&buf[end..]) =>
        {
            DamageKind::Incomplete
        }
        _ => kind,
    };
    // At most 8 written bytes, with no possible length and only zeros after
    // them: a write that stopped in the first bytes of a frame (a page boundary
    // can fall anywhere), or in the old end mark it was overwriting —
    // `B[..k] ‖ mark[k..]` — never a complete record (its sequence, bytes
    // 8..16, is not zero).
    let kind = match layout {
        Layout::Preallocated
            if matches!(kind, DamageKind::LengthOutOfRange | DamageKind::Checksum)
                && claimed_end(buf, at, body_max).is_none()
                && stopped_in_length_field(&buf[at..written_end(buf, at)]) =>
        {
            DamageKind::Incomplete
        }
        _ => kind,
    };
    // An impossible length before a whole body that checks out, followed by a
    // real end mark: the length field rotted (R4), whatever zeros the body holds.
    let kind = match layout {
        Layout::Preallocated if kind == DamageKind::LengthOutOfRange && whole_body_before_end_mark(&buf[at..]) => {
            DamageKind::LengthMismatch
        }
        _ => kind,
    };
    // A length field that grew past the end mark, with a whole body that checks
    // out before the mark: the length field rotted (as `LengthMismatch` in v1).
    match layout {
        Layout::Preallocated if kind == DamageKind::Incomplete && whole_body_before_end_mark(&buf[at..]) => {
            DamageKind::LengthMismatch
        }
        _ => kind,
    }
}

/// The damage of kind `kind` at `at`, where sequence `next_seq` was expected: the
/// damaged region, the next intact frame in it (a resync) and whether it holds a
/// zeroed sector (judged at file offsets, from `file_offset`).
fn damage_at(
    buf: &[u8],
    at: usize,
    file_offset: u64,
    kind: DamageKind,
    next_seq: u64,
    body_max: u32,
    layout: Layout,
) -> Damage {
    let region_end = match layout {
        Layout::Appended => buf.len(),
        Layout::Preallocated => damaged_region_end(buf, at, body_max),
    };
    // No frame starts in the zeros after the region (its length would be 0).
    // The cheap checks first (length, payload length, sequence), the CRC only
    // for what passes them: a resync is linear in the damaged bytes, whatever
    // they hold (with the hard bound, four bytes at most offsets read as a
    // possible length, and a CRC at each would cost up to a largest frame).
    let resync_at = (at + 1..region_end)
        .find(|&o| {
            plausible_frame_at(&buf[o..], body_max, next_seq)
                && matches!(decode_frame(&buf[o..], body_max), Ok((rec, _)) if rec.seq >= next_seq)
        })
        .map(|o| o as u64);
    // A frame followed by its group's end mark was written whole: a zero run
    // inside it is its own content, never a sector that did not persist (R4).
    let mark_follows = layout == Layout::Preallocated
        && claimed_end(buf, at, body_max).is_some_and(|end| buf[end..].starts_with(&FRAMES_END_MARK));
    let zeroed_sector =
        resync_at.is_none() && !mark_follows && has_zeroed_sector(&buf[at..region_end], file_offset + at as u64);
    Damage { kind, offset: at as u64, expected_seq: next_seq, resync_at, zeroed_sector }
}

/// In a preallocated segment, do these bytes — from a frame boundary on — end the
/// frames: the end mark (or a prefix of it: a write stopped in it) or a zero length
/// field, and only zeros after?
pub fn ends_frames(rest: &[u8]) -> bool {
    let marked = rest.iter().zip(&FRAMES_END_MARK).take_while(|(a, b)| a == b).count();
    // Cheap first (a frame's length field is neither 0 nor the mark's).
    let may_end = match marked {
        0 => all_zero(&rest[..rest.len().min(4)]),
        m if m == FRAMES_END_MARK.len() => true,
        m => rest.get(m).is_none_or(|&b| b == 0),
    };
    may_end && all_zero(&rest[marked..])
}

/// Do these bytes hold the whole end mark and then only zeros — the frames end
/// exactly where a writer left them? (The probe of a reader or writer that knows
/// where the frames ended: zeros there without the mark could lie over records.)
pub fn ends_at_mark(rest: &[u8]) -> bool {
    rest.starts_with(&FRAMES_END_MARK) && all_zero(&rest[FRAMES_END_MARK.len()..])
}

/// Are all these bytes zero? (OR-folded in blocks, which compiles to wide loads.)
pub fn all_zero(bytes: &[u8]) -> bool {
    bytes.chunks(4096).all(|c| c.iter().fold(0u8, |acc, &b| acc | b) == 0)
}

/// In a preallocated segment, where the region damaged at `at` ends: after the last
/// non-zero byte, or after the end the frame's length field claims if that is later
/// and within the buffer (a record may end with zero bytes of its own).
fn damaged_region_end(buf: &[u8], at: usize, body_max: u32) -> usize {
    written_end(buf, at).max(claimed_end(buf, at, body_max).unwrap_or(at)).max(at + 1).min(buf.len())
}

/// Are these written bytes (up to the zeros) too few to be any complete frame? A
/// complete frame has a non-zero sequence in bytes 8..16, so it always has more than
/// 8; at most 8 are what a write that stopped in a frame's first bytes leaves
/// (`B[..k]`, or `B[..k] ‖ mark[k..]` over the old end mark), or a damaged end mark.
fn stopped_in_length_field(written: &[u8]) -> bool {
    written.len() <= FRAMES_END_MARK.len()
}

/// After the last non-zero byte at or after `at` (`at` if there is none).
fn written_end(buf: &[u8], at: usize) -> usize {
    buf[at..].iter().rposition(|&b| b != 0).map_or(at, |p| at + p + 1)
}

/// Where the frame at `at` ends by its length field, if that length is possible
/// and the buffer holds that many bytes.
fn claimed_end(buf: &[u8], at: usize, body_max: u32) -> Option<usize> {
    buf.get(at..at + 4)
        .map(|l| u32::from_le_bytes(l.try_into().expect("4 bytes")))
        .filter(|&len| (BODY_FIXED_BYTES as u32..=body_max).contains(&len))
        .map(|len| at + FRAME_HEADER_BYTES + len as usize)
        .filter(|&end| end <= buf.len())
}

/// In a preallocated segment: is there an end mark after the frame header at the
/// start of `rest` such that the bytes before it are a whole frame?
fn whole_body_before_end_mark(rest: &[u8]) -> bool {
    let min = FRAME_HEADER_BYTES + BODY_FIXED_BYTES;
    // Every place the mark's bytes appear (a payload may hold them too).
    rest.get(min..).is_some_and(|tail| {
        tail.windows(FRAMES_END_MARK.len())
            .enumerate()
            .any(|(p, w)| w == FRAMES_END_MARK && whole_body_after_rotten_length(&rest[..min + p]))
    })
}

/// Do the bytes after a frame header whose length runs past the end form a whole
/// body — its checksum is the stored one and its payload length fits exactly?
fn whole_body_after_rotten_length(rest: &[u8]) -> bool {
    if rest.len() < FRAME_HEADER_BYTES + BODY_FIXED_BYTES {
        return false;
    }
    let stored = u32::from_le_bytes(rest[4..8].try_into().expect("4 bytes"));
    let body = &rest[FRAME_HEADER_BYTES..];
    let payload_len = u64::from_le_bytes(body[64..72].try_into().expect("8 bytes"));
    payload_len == (body.len() - BODY_FIXED_BYTES) as u64 && crc32fast::hash(body) == stored
}

/// The first offset at or after `from` where an intact frame with a sequence of at
/// least `min_seq` starts. Used to tell a torn tail (nothing intact after it) from
/// corruption (intact records after it), and by `dump --raw` to resynchronise.
/// A payload that itself contains a complete frame could be mistaken for one; that
/// errs towards refusing, never towards dropping data.
pub fn find_next_frame(buf: &[u8], from: usize, body_max: u32, min_seq: u64) -> Option<usize> {
    (from..buf.len()).find(|&o| {
        plausible_frame_at(&buf[o..], body_max, min_seq)
            && matches!(decode_frame(&buf[o..], body_max), Ok((rec, _)) if rec.seq >= min_seq)
    })
}

/// The checks of [`decode_frame`] that cost no checksum, for a candidate frame at
/// the start of `buf`: a length in range that fits, a `payload_len` field that
/// matches it, a sequence of at least `min_seq`. A frame that fails one of them is
/// never one `find_next_frame` finds (it would not decode as an intact record of
/// that sequence), so skipping its CRC changes no result — and keeps a resync
/// through damaged bytes linear, not a checksum of up to a largest frame at every
/// offset whose four bytes happen to read as a possible length.
fn plausible_frame_at(buf: &[u8], body_max: u32, min_seq: u64) -> bool {
    let Some(len) = buf.get(..4).map(|b| u32::from_le_bytes(b.try_into().expect("4 bytes"))) else { return false };
    if (len as usize) < BODY_FIXED_BYTES || len > body_max || buf.len() < FRAME_HEADER_BYTES + len as usize {
        return false;
    }
    let body = &buf[FRAME_HEADER_BYTES..FRAME_HEADER_BYTES + len as usize];
    let at = |o: usize| u64::from_le_bytes(body[o..o + 8].try_into().expect("8 bytes"));
    // Body offsets 0 (seq) and 64 (payload_len), FORMAT.md §3.
    at(64) == u64::from(len) - BODY_FIXED_BYTES as u64 && at(0) >= min_seq
}

#[cfg(test)]
pub(super) mod tests {
    use super::super::frame::{GENESIS_LINK, encode_frame};
    use super::*;

    /// `n` records, sequence 1 on, linked from the genesis link.
    pub(in crate::format) fn log_of(n: u64) -> Vec<u8> {
        let mut out = Vec::new();
        let mut link = GENESIS_LINK;
        for seq in 1..=n {
            link = encode_frame(&mut out, &link, seq, &[2; 16], seq * 10, format!("record {seq}").as_bytes());
        }
        out
    }

    #[test]
    fn clean_run_visits_every_record_in_order() {
        let buf = log_of(5);
        let mut c = Cursor { next_seq: 1, prev_link: GENESIS_LINK };
        let mut seen = vec![];
        assert_eq!(scan_frames(&buf, 0, &mut c, 1 << 20, |_, r| seen.push(r.seq)), ScanOutcome::Clean);
        assert_eq!(seen, vec![1, 2, 3, 4, 5]);
        assert_eq!(c.next_seq, 6);
    }

    #[test]
    fn damage_in_the_middle_resyncs_on_the_next_intact_frame() {
        let mut buf = log_of(5);
        buf[100] ^= 0x40; // inside record 2's body
        let mut c = Cursor { next_seq: 1, prev_link: GENESIS_LINK };
        let ScanOutcome::Damaged(d) = scan_frames(&buf, 0, &mut c, 1 << 20, |_, _| {}) else { panic!() };
        assert_eq!(d.expected_seq, 2);
        assert!(d.resync_at.is_some() && !d.is_torn_tail());
    }

    #[test]
    fn a_cut_last_record_is_a_torn_tail() {
        let buf = log_of(3);
        let cut = &buf[..buf.len() - 5];
        let mut c = Cursor { next_seq: 1, prev_link: GENESIS_LINK };
        let ScanOutcome::Damaged(d) = scan_frames(cut, 0, &mut c, 1 << 20, |_, _| {}) else { panic!() };
        assert!(d.is_torn_tail() && d.expected_seq == 3);
    }
}
