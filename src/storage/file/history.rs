//! The whole history, or nothing: before any answer or append, check that every
//! segment from genesis is present and continues the one before. Cheap — a header
//! and the last record of each sealed segment, O(segments) — so every open does it,
//! even one that verifies only the tail (boot from a snapshot).

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use super::dir::{open_regular, segment_path};
use super::recovery::{check_header_continuity, header_error, refusal};
use crate::format::{
    BODY_FIXED_BYTES, ChainLink, Cursor, FRAME_HEADER_BYTES, SEGMENT_HEADER_BYTES, ScanOutcome, SegmentHeader,
    decode_frame, hex, scan_frames, segment_file_bytes_max,
};
use crate::storage::error::{Error, Result};

/// For readers, which take no lock: the directory is a log (else `NOT_A_LOG`), is
/// not writable by others, names no odd segment, has not lost its segments, and its
/// history is whole ([`check_history`]).
pub fn check_whole_history(dir: &Path, body_max: u32) -> Result<()> {
    if !dir.is_dir() {
        return Err(Error::NotALogDirectory {
            path: dir.into(),
            detail: "it does not exist or is not a directory".into(),
        });
    }
    super::dir::check_dir_mode(dir)?;
    let found = super::dir::listing(dir)?;
    found.refuse_odd_names(dir)?;
    if found.segments.is_empty() {
        found.refuse_lost_history(dir)?;
        return Err(Error::no_log_here(dir));
    }
    // A commit group in doubt (its sync failed, it could not be cut back): no
    // answer from a history that may hold records a power cut would take away.
    super::halt::check(dir)?;
    check_history(dir, &found.segments, body_max)
}

/// First look for a sealed segment's last record in this many final bytes (records
/// are usually small); only if it is not there, in one largest record's worth.
const LAST_RECORD_PROBE_BYTES: u64 = 4 * 1024;

/// Check the segments of `dir` (as listed, in order): the first is named for
/// sequence 1 and starts at the genesis link; every header matches its name; every
/// sealed segment ends exactly with the record before the next segment's first, and
/// that record's link is the one the next header carries. The last segment's header
/// and records are left to recovery (it may have been torn while being created).
pub(crate) fn check_history(dir: &Path, segments: &[(u64, PathBuf)], body_max: u32) -> Result<()> {
    let Some((first, _)) = segments.first() else { return Ok(()) };
    if *first != 1 {
        return Err(Error::Corruption {
            segment: segment_path(dir, 1),
            offset: 0,
            seq: 1,
            detail: format!(
                "the first segment is missing: the oldest segment starts at sequence {first}, so records 1..={} \
                 are gone; refusing to answer from a partial history",
                first - 1
            ),
        });
    }
    let bytes_max = segment_file_bytes_max(body_max);
    let mut prev: Option<(&Path, File, u64)> = None;
    for (i, (seq, path)) in segments.iter().enumerate() {
        let is_last = i + 1 == segments.len();
        let (file, len) = open_regular(path, bytes_max, *seq)?;
        let header = match read_header(&file, len) {
            Ok(h) => h,
            // The last segment may be torn while being created (recovery sets it
            // aside); its name still says where it must start, so the segment before
            // it must end right there — else records are missing.
            Err(_) if is_last && i > 0 => return seal(prev, *seq, None, body_max),
            Err(e) => return Err(header_error(path, e, *seq)),
        };
        check_header_continuity(path, *seq, &header, None, i == 0)?;
        seal(prev, header.first_seq, Some(&header.prev_link), body_max)?;
        prev = Some((path.as_path(), file, len));
    }
    Ok(())
}

fn read_header(f: &File, len: u64) -> std::result::Result<SegmentHeader, crate::format::SegmentHeaderError> {
    let mut hb = [0u8; SEGMENT_HEADER_BYTES];
    let n = (len as usize).min(SEGMENT_HEADER_BYTES);
    if f.read_exact_at(&mut hb[..n], 0).is_err() {
        return SegmentHeader::decode(&[]);
    }
    SegmentHeader::decode(&hb[..n])
}

/// The sealed segment `prev` must end with the record just before `next_first_seq`,
/// and that record's link must be `next_link` (when the next header is readable).
fn seal(
    prev: Option<(&Path, File, u64)>,
    next_first_seq: u64,
    next_link: Option<&ChainLink>,
    body_max: u32,
) -> Result<()> {
    let Some((path, file, len)) = prev else { return Ok(()) };
    let want_seq = next_first_seq - 1;
    let fits = |l: &LastRecord| l.seq == want_seq && next_link.is_none_or(|n| *n == l.link);
    // Fast: find the last record from the end. If that fails or does not fit, the
    // whole segment is scanned: damage is then named exactly, and the scan's own
    // last record is the truth (a payload may imitate a frame).
    let last = match last_record(&file, len, path, body_max)? {
        Some(l) if fits(&l) => l,
        _ => scan_segment(&file, len, path, body_max)?,
    };
    let refuse = |detail: String| {
        Err(Error::Corruption { segment: path.to_path_buf(), offset: last.offset, seq: last.seq, detail })
    };
    if last.seq != want_seq {
        return refuse(format!(
            "this sealed segment ends with record {} but the next segment starts at {next_first_seq}: {}",
            last.seq,
            if last.seq < want_seq {
                format!("records {}..={want_seq} are missing (a segment was deleted)", last.seq + 1)
            } else {
                "the segments overlap (a segment was replaced)".into()
            }
        ));
    }
    if let Some(n) = next_link.filter(|n| **n != last.link) {
        return refuse(format!(
            "the next segment's header carries chain link {} but this segment's last record has {}: a segment \
             was replaced",
            hex(n),
            hex(&last.link)
        ));
    }
    Ok(())
}

/// Scan a whole sealed segment: the first damage is refused with its location;
/// otherwise its last record (for a segment with none, the record before it).
fn scan_segment(file: &File, len: u64, path: &Path, body_max: u32) -> Result<LastRecord> {
    let mut bytes = vec![0u8; len as usize];
    file.read_exact_at(&mut bytes, 0).map_err(Error::io("read", path))?;
    let h = SegmentHeader::decode(&bytes).map_err(|e| header_error(path, e, 0))?;
    let mut c = Cursor { next_seq: h.first_seq, prev_link: h.prev_link };
    let mut offset = len;
    match scan_frames(&bytes, SEGMENT_HEADER_BYTES, &mut c, body_max, |o, _| offset = o) {
        ScanOutcome::Damaged(d) => Err(refusal(path, 0, &d, true)),
        ScanOutcome::Clean => Ok(LastRecord { offset, seq: c.next_seq - 1, link: c.prev_link }),
        ScanOutcome::ZeroTail { .. } => unreachable!("a scan of the appended layout never reports a zero tail"),
    }
}

struct LastRecord {
    offset: u64,
    seq: u64,
    link: ChainLink,
}

/// Candidate frames checked (CRC) by the fast search before it gives up and the
/// caller scans the segment: bounds the work a crafted tail can cause.
const LAST_RECORD_CANDIDATES_MAX: usize = 64;

/// Find the intact frame that ends exactly at the end of a segment: scan back from
/// the end for a length field that reaches it and a frame that verifies. Reads at
/// most one largest record's worth; `None` if not found within the bounds.
fn last_record(file: &File, len: u64, path: &Path, body_max: u32) -> Result<Option<LastRecord>> {
    let data = len.saturating_sub(SEGMENT_HEADER_BYTES as u64);
    let largest = data.min(FRAME_HEADER_BYTES as u64 + u64::from(body_max));
    let mut window = data.min(LAST_RECORD_PROBE_BYTES);
    let min_frame = FRAME_HEADER_BYTES + BODY_FIXED_BYTES;
    let mut candidates = 0;
    loop {
        let mut buf = vec![0u8; window as usize];
        file.read_exact_at(&mut buf, len - window).map_err(Error::io("read", path))?;
        if buf.len() >= min_frame {
            for start in (0..=buf.len() - min_frame).rev() {
                let body_len = u32::from_le_bytes(buf[start..start + 4].try_into().expect("4 bytes")) as usize;
                if FRAME_HEADER_BYTES + body_len != buf.len() - start {
                    continue;
                }
                candidates += 1;
                if candidates > LAST_RECORD_CANDIDATES_MAX {
                    return Ok(None);
                }
                if let Ok((rec, _)) = decode_frame(&buf[start..], body_max) {
                    return Ok(Some(LastRecord { offset: len - window + start as u64, seq: rec.seq, link: rec.link }));
                }
            }
        }
        if window >= largest {
            return Ok(None);
        }
        window = largest;
    }
}
