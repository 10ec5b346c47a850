//! The whole history, or nothing: before any answer or append, check that every
//! segment from genesis is present and continues the one before. Cheap — a header
//! and the last record of each sealed segment, O(segments) — so every open does it,
//! even one that verifies only the tail (boot from a snapshot).

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use super::dir::{open_regular, segment_path};
use super::error::{Error, Result};
use super::recovery::{check_header_continuity, header_error, refusal};
use crate::format::{
    BODY_FIXED_BYTES, ChainLink, Cursor, FRAME_HEADER_BYTES, SEGMENT_HEADER_BYTES, ScanOutcome, SegmentHeader,
    decode_frame, hex, scan_frames, segment_file_bytes_max,
};

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
        return Err(Error::NotALogDirectory {
            path: dir.into(),
            detail: format!("it holds no log; create one with `fencelog init --dir {}`", dir.display()),
        });
    }
    check_history(dir, &found.segments, body_max)
}

/// First look for a sealed segment's last record in this many final bytes (records
/// are usually small); only if it is not there, in one largest record's worth.
const LAST_RECORD_PROBE_BYTES: u64 = 64 * 1024;

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
            Err(_) if is_last => return Ok(()),
            Err(e) => return Err(header_error(path, e, *seq)),
        };
        check_header_continuity(path, *seq, &header, None, i == 0)?;
        seal(prev, Some(&header), body_max)?;
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

/// The sealed segment `prev` must end with the record just before `next` starts,
/// linked to it. With `next` unknown (its header is torn), nothing is checked here.
fn seal(prev: Option<(&Path, File, u64)>, next: Option<&SegmentHeader>, body_max: u32) -> Result<()> {
    let (Some((path, file, len)), Some(next)) = (prev, next) else { return Ok(()) };
    let want_seq = next.first_seq - 1;
    let refuse = |offset: u64, seq: u64, detail: String| {
        Err(Error::Corruption { segment: path.to_path_buf(), offset, seq, detail })
    };
    let found = last_record(&file, len, path, body_max)?;
    if found.as_ref().is_none_or(|l| l.seq != want_seq || l.link != next.prev_link) {
        // Damage inside the segment is named exactly (segment, offset, sequence) by
        // a full scan of it; only on this failure path is the segment read whole.
        damage_in(&file, len, path, body_max)?;
    }
    let Some(last) = found else {
        return refuse(
            len,
            want_seq,
            format!(
                "this sealed segment does not end with a complete record (the next segment starts at sequence \
                 {}): stray bytes after its last record, or its last record is damaged",
                next.first_seq
            ),
        );
    };
    if last.seq != want_seq {
        return refuse(
            last.offset,
            last.seq,
            format!(
                "this sealed segment ends with record {} but the next segment starts at {}: {}",
                last.seq,
                next.first_seq,
                if last.seq < want_seq {
                    format!("records {}..={want_seq} are missing (a segment was deleted)", last.seq + 1)
                } else {
                    "the segments overlap (a segment was replaced)".into()
                }
            ),
        );
    }
    if last.link != next.prev_link {
        return refuse(
            last.offset,
            last.seq,
            format!(
                "the next segment's header carries chain link {} but this segment's last record has {}: a \
                 segment was replaced",
                hex(&next.prev_link),
                hex(&last.link)
            ),
        );
    }
    Ok(())
}

/// Scan a whole sealed segment; the first damage is refused with its location.
fn damage_in(file: &File, len: u64, path: &Path, body_max: u32) -> Result<()> {
    let mut bytes = vec![0u8; len as usize];
    file.read_exact_at(&mut bytes, 0).map_err(Error::io("read", path))?;
    let h = SegmentHeader::decode(&bytes).map_err(|e| header_error(path, e, 0))?;
    let mut c = Cursor { next_seq: h.first_seq, prev_link: h.prev_link };
    match scan_frames(&bytes, SEGMENT_HEADER_BYTES, &mut c, body_max, |_, _| {}) {
        ScanOutcome::Damaged(d) => Err(refusal(path, 0, &d, true)),
        ScanOutcome::Clean => Ok(()),
    }
}

struct LastRecord {
    offset: u64,
    seq: u64,
    link: ChainLink,
}

/// Find the intact frame that ends exactly at the end of a segment: scan back from
/// the end for a length field that reaches it and a frame that verifies. Reads at
/// most one largest record's worth.
fn last_record(file: &File, len: u64, path: &Path, body_max: u32) -> Result<Option<LastRecord>> {
    let data = len.saturating_sub(SEGMENT_HEADER_BYTES as u64);
    let largest = data.min(FRAME_HEADER_BYTES as u64 + u64::from(body_max));
    let mut window = data.min(LAST_RECORD_PROBE_BYTES);
    let min_frame = FRAME_HEADER_BYTES + BODY_FIXED_BYTES;
    loop {
        let mut buf = vec![0u8; window as usize];
        file.read_exact_at(&mut buf, len - window).map_err(Error::io("read", path))?;
        if buf.len() >= min_frame {
            for start in (0..=buf.len() - min_frame).rev() {
                let body_len = u32::from_le_bytes(buf[start..start + 4].try_into().expect("4 bytes")) as usize;
                if FRAME_HEADER_BYTES + body_len != buf.len() - start {
                    continue;
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
