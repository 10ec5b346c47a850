//! Verifying readers. They take no lock and never write: sealed segments are mapped
//! (memmap2), the last segment — which a recovering writer may truncate — is read
//! into memory. Every problem is reported with segment, byte offset and sequence,
//! and the scan resynchronises past damage so it decodes as much as it can.

use std::fs;
use std::path::{Path, PathBuf};

use serde::Serialize;

use super::ahead::with_links_ahead;
use super::dir::{list_segments, listing, open_regular, read_regular};
use super::recovery::{Mapped, check_header_continuity, is_torn_creation};
use crate::format::{
    Action, BODY_FIXED_BYTES, Cursor, FRAME_HEADER_BYTES, FRAMES_END_MARK, GENESIS_LINK, Layout, RecordRef,
    SEGMENT_HEADER_BYTES, ScanOutcome, SegmentHeader, SegmentHeaderError, classify, decode_frame, hex,
    scan_segment_frames, scan_segment_frames_ahead, segment_file_bytes_max,
};
use crate::storage::error::{Error, Result};
use crate::storage::problem::{Problem, ProblemKind, problem};

/// What a read found.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct ReadSummary {
    pub segments: usize,
    pub bytes: u64,
    pub records: u64,
    pub first_seq: Option<u64>,
    pub last_seq: Option<u64>,
    pub first_time_ms: Option<u64>,
    pub last_time_ms: Option<u64>,
    /// Chain link of the last intact record read (hex).
    pub chain_head: String,
    #[serde(skip)]
    head_link: Option<crate::format::ChainLink>,
    pub problems: Vec<Problem>,
}

impl ReadSummary {
    /// Count an intact record read (what every scan does for each one).
    pub(crate) fn note_record(&mut self, rec: &RecordRef<'_>) {
        count(self, rec);
    }

    /// Add what a scan of the records after these found (records, problems).
    pub fn absorb(&mut self, later: ReadSummary) {
        self.segments += later.segments;
        self.bytes += later.bytes;
        self.problems.extend(later.problems.iter().cloned());
        merge(self, later);
        self.finish();
    }

    /// Set the chain head from the last intact record noted (once the scan ends).
    pub(crate) fn finish(&mut self) {
        if let Some(link) = self.head_link {
            self.chain_head = hex(&link);
        }
    }

    pub fn is_intact(&self) -> bool {
        self.problems.is_empty()
    }

    /// Damaged, and not only by a torn tail that recovery would cut.
    pub fn has_corruption(&self) -> bool {
        self.problems.iter().any(|p| !p.torn_tail)
    }
}

/// Verify every record of the log in `dir`.
pub fn verify_dir(dir: &Path, body_max: u32) -> Result<ReadSummary> {
    read_records(dir, 1, body_max, |_| true)
}

/// What a scan meets, in log order.
pub enum ScanItem<'a> {
    /// An intact, verified record, with where it sits.
    Record { rec: &'a RecordRef<'a>, segment: &'a Path, offset: u64 },
    /// Damage, already added to the summary's problems.
    Damage(&'a Problem),
}

/// Read and verify records with sequence ≥ `from_seq`, in order, calling `visit` for
/// each intact one (return `false` to stop). Starts at the segment holding
/// `from_seq`, trusting its header for the preceding link.
pub fn read_records(
    dir: &Path,
    from_seq: u64,
    body_max: u32,
    mut visit: impl FnMut(&RecordRef<'_>) -> bool,
) -> Result<ReadSummary> {
    scan_dir(dir, from_seq, body_max, |item| match item {
        ScanItem::Record { rec, .. } => visit(rec),
        ScanItem::Damage(_) => true,
    })
}

/// The reader's core: every intact record and every damaged region, in log order.
/// Past damage it resynchronises on the next intact frame (or the next segment), so
/// it decodes as much as it can; it never writes.
pub fn scan_dir(
    dir: &Path,
    from_seq: u64,
    body_max: u32,
    mut on: impl FnMut(ScanItem<'_>) -> bool,
) -> Result<ReadSummary> {
    if !dir.is_dir() {
        return Err(Error::NotALogDirectory {
            path: dir.into(),
            detail: "it does not exist or is not a readable directory".into(),
        });
    }
    let found = listing(dir)?;
    let segments = &found.segments;
    if segments.is_empty() {
        found.refuse_lost_history(dir)?;
        return Err(Error::NotALogDirectory { path: dir.into(), detail: "it holds no segment file".into() });
    }
    let start = segments.iter().rposition(|(s, _)| *s <= from_seq).unwrap_or(0);
    let mut sum = ReadSummary { segments: segments.len(), chain_head: hex(&GENESIS_LINK), ..Default::default() };
    let mut cursor: Option<Cursor> = None;
    let mut stopped = false;
    if let Some((segment, offset, seq)) = super::halt::halted_at(dir) {
        let detail = format!(
            "{}: the sync of the commit group from sequence {seq} failed and it could not be cut back; the records \
             from there on may not be durable (writers refuse the log until `fencelog repair --cut-from {seq}`)",
            super::halt::SYNC_FAILED_FILE
        );
        let p = problem(ProblemKind::SyncFailed, &segment, offset, seq, false, 0, detail);
        report(&mut on, &mut sum, p, &mut stopped);
    }
    for name in &found.odd_segment_names {
        let detail = "named like a segment but not a valid segment name (20 decimal digits of a u64, then .seg): \
                      a renamed or planted segment; not read"
            .to_string();
        let p = problem(ProblemKind::OddSegmentName, &dir.join(name), 0, 0, false, 0, detail);
        report(&mut on, &mut sum, p, &mut stopped);
    }
    let bytes_max = segment_file_bytes_max(body_max);
    for (i, (name_seq, path)) in segments.iter().enumerate().skip(start) {
        if stopped {
            break;
        }
        let is_last = i + 1 == segments.len();
        // The last segment (which a recovering writer may truncate) is read into
        // memory; sealed ones are mapped.
        let held = if is_last {
            // What is there: a writer sealing it may have cut it to its last
            // record since it was measured.
            read_regular(path, bytes_max, *name_seq).map(Held::Owned)
        } else {
            Mapped::open(path, bytes_max, *name_seq).map(Held::Mapped)
        };
        let held = match held {
            Ok(h) => h,
            Err(Error::Corruption { detail, .. }) => {
                // Not a regular file, or too long to be a segment: reported, not read.
                let p = problem(ProblemKind::UnsafeSegment, path, 0, *name_seq, false, 0, detail);
                report(&mut on, &mut sum, p, &mut stopped);
                cursor = None;
                continue;
            }
            Err(e) => return Err(e),
        };
        let bytes = held.bytes();
        sum.bytes += bytes.len() as u64;
        let expected_seq = cursor.map_or(*name_seq, |c| c.next_seq);
        let header = match SegmentHeader::decode(bytes) {
            Ok(h) => h,
            Err(e @ SegmentHeaderError::UnsupportedVersion { .. }) => {
                return Err(Error::UnsupportedFormat { segment: path.clone(), detail: e.to_string() });
            }
            Err(e) => {
                // A segment torn while being created is harmless only where the
                // history before it ends right at its name.
                let continues = cursor.is_none_or(|c| c.next_seq == *name_seq);
                if !continues {
                    let detail = format!(
                        "records {}..{} are missing before this segment",
                        cursor.map_or(0, |c| c.next_seq),
                        name_seq
                    );
                    let p = problem(ProblemKind::SegmentDiscontinuity, path, 0, expected_seq, false, 0, detail);
                    report(&mut on, &mut sum, p, &mut stopped);
                }
                let torn = continues && is_last && is_torn_creation(bytes, &e, body_max, *name_seq);
                let kind = if torn { ProblemKind::TornSegmentCreation } else { ProblemKind::SegmentHeader };
                let p = problem(kind, path, 0, expected_seq, torn, bytes.len() as u64, e.to_string());
                report(&mut on, &mut sum, p, &mut stopped);
                cursor = None;
                continue;
            }
        };
        if let Err(Error::Corruption { detail, .. }) =
            check_header_continuity(path, *name_seq, &header, cursor.as_ref(), i == 0)
        {
            let p = problem(ProblemKind::SegmentDiscontinuity, path, 0, header.first_seq, false, 0, detail);
            report(&mut on, &mut sum, p, &mut stopped);
        }
        let mut c = Cursor { next_seq: header.first_seq, prev_link: header.prev_link };
        let mut at = SEGMENT_HEADER_BYTES;
        loop {
            let mut local = ReadSummary::default();
            let outcome = with_links_ahead(bytes, at, c.prev_link, body_max, |ahead| {
                scan_segment_frames_ahead(bytes, at, 0, &mut c, body_max, header.layout(), 0, ahead, |offset, rec| {
                    if rec.seq >= from_seq && !stopped {
                        count(&mut local, rec);
                        stopped = !on(ScanItem::Record { rec, segment: path, offset });
                    }
                })
            });
            merge(&mut sum, local);
            let d = match outcome {
                ScanOutcome::Clean => break,
                ScanOutcome::ZeroTail { .. } if is_last => break,
                ScanOutcome::ZeroTail { offset } => {
                    let e = super::recovery::sealed_zero_tail(path, offset, c.next_seq);
                    let p = problem(
                        ProblemKind::ZeroTailInSealedSegment,
                        path,
                        offset,
                        c.next_seq,
                        false,
                        bytes.len() as u64 - offset,
                        e.to_string(),
                    );
                    report(&mut on, &mut sum, p, &mut stopped);
                    break;
                }
                ScanOutcome::Damaged(d) => d,
            };
            if stopped {
                break;
            }
            let end = d.resync_at.unwrap_or(bytes.len() as u64);
            let detail = match d.kind {
                crate::format::DamageKind::SequenceMismatch { found } => {
                    format!("expected sequence {} but found {found}", d.expected_seq)
                }
                _ => format!("damaged frame where sequence {} was expected", d.expected_seq),
            };
            let action = classify(d.evidence(!is_last));
            let torn = action == Action::CutTornTail;
            let detail = if action == Action::RefuseRotten {
                format!(
                    "{detail}: a complete record fails its checksum with no sign of a torn write; refused, not cut \
                     (fencelog repair --cut-from {} cuts it explicitly)",
                    d.expected_seq
                )
            } else {
                detail
            };
            let p = problem(d.kind.into(), path, d.offset, d.expected_seq, torn, end - d.offset, detail);
            report(&mut on, &mut sum, p, &mut stopped);
            let Some(resync) = d.resync_at.filter(|_| !stopped) else { break };
            // Anchor on the intact frame after the damage; its own link cannot be
            // checked against a lost predecessor, so start the chain from it.
            let (rec, used) = decode_frame(&bytes[resync as usize..], body_max).expect("resync found an intact frame");
            if rec.seq >= from_seq {
                let mut local = ReadSummary::default();
                count(&mut local, &rec);
                merge(&mut sum, local);
                stopped = !on(ScanItem::Record { rec: &rec, segment: path, offset: resync });
            }
            c = Cursor { next_seq: rec.seq + 1, prev_link: rec.link };
            at = resync as usize + used;
        }
        cursor = Some(c);
    }
    if let Some(link) = sum.head_link {
        sum.chain_head = hex(&link);
    }
    Ok(sum)
}

enum Held {
    Owned(Vec<u8>),
    Mapped(Mapped),
}

impl Held {
    fn bytes(&self) -> &[u8] {
        match self {
            Held::Owned(b) => b,
            Held::Mapped(m) => m.bytes(),
        }
    }
}

fn report(on: &mut impl FnMut(ScanItem<'_>) -> bool, sum: &mut ReadSummary, p: Problem, stopped: &mut bool) {
    sum.problems.push(p);
    if !on(ScanItem::Damage(sum.problems.last().expect("pushed"))) {
        *stopped = true;
    }
}

fn count(sum: &mut ReadSummary, rec: &RecordRef<'_>) {
    sum.records += 1;
    sum.first_seq.get_or_insert(rec.seq);
    sum.first_time_ms.get_or_insert(rec.time_ms);
    sum.last_seq = Some(rec.seq);
    sum.last_time_ms = Some(rec.time_ms);
    sum.head_link = Some(rec.link);
}

fn merge(into: &mut ReadSummary, from: ReadSummary) {
    if from.records == 0 {
        return;
    }
    into.records += from.records;
    into.first_seq = into.first_seq.or(from.first_seq);
    into.first_time_ms = into.first_time_ms.or(from.first_time_ms);
    into.last_seq = from.last_seq;
    into.last_time_ms = from.last_time_ms;
    into.head_link = from.head_link;
}

/// Where the frames of the segment at `path` end: its length for a version 1
/// segment, the start of its zeros for a preallocated one — or the first damage.
/// (For tools and tests that look at a segment's bytes; it reads the whole file,
/// as every reader does: a regular file of at most a segment's hard bound.)
pub fn frames_end(path: &Path) -> Result<u64> {
    let bytes = read_regular(path, segment_file_bytes_max(crate::format::BODY_BYTES_HARD_MAX), 0)?;
    let header = SegmentHeader::decode(&bytes).map_err(|e| super::recovery::header_error(path, e, 0))?;
    let mut c = Cursor { next_seq: header.first_seq, prev_link: header.prev_link };
    let layout = header.layout();
    Ok(match scan_segment_frames(&bytes, SEGMENT_HEADER_BYTES, 0, &mut c, u32::MAX, layout, |_, _| {}) {
        ScanOutcome::Clean => bytes.len() as u64,
        ScanOutcome::ZeroTail { offset } => offset,
        ScanOutcome::Damaged(d) => d.offset,
    })
}

/// A fingerprint of a segment's content that changes when anything is appended
/// (`inspect verify` compares one taken before and after a pass that found
/// damage). Read as every reader reads a segment: a symlink, FIFO, device or
/// file longer than a segment may be is never read, and fingerprints as what it
/// is (so its damage, already reported, stands).
pub fn segment_fingerprint(path: &Path, body_max: u32) -> u64 {
    match read_regular(path, segment_file_bytes_max(body_max), 0) {
        Ok(b) => (b.len() as u64) << 32 | u64::from(crc32fast::hash(&b)),
        Err(e) => u64::from(crc32fast::hash(e.code().as_bytes())) | 1 << 63,
    }
}

/// Largest read the tailer makes at once (a frame is at most 64 MiB + 80 bytes, and
/// the default record limit is 1 MiB, so a chunk holds many frames).
const TAIL_READ_BYTES_MAX: u64 = 4 << 20;
/// A poll's first read; each read that ends clean doubles the next, up to
/// [`TAIL_READ_BYTES_MAX`] (a short tail in a preallocated segment is not worth a
/// read of the whole segment: its zeros are checked by [`zeros_in_file`]).
const TAIL_READ_BYTES_FIRST: u64 = 64 << 10;

/// Are the bytes of `f` in `from..to` all zero? Read in small windows into one
/// buffer. `Ok(false)` also where the file is shorter than `to` now (a segment
/// being sealed): the caller then reads the bytes whole, as it would have.
fn zeros_in_file(f: &fs::File, from: u64, to: u64) -> std::io::Result<bool> {
    const WINDOW_BYTES: u64 = 64 << 10;
    let mut buf = vec![0u8; WINDOW_BYTES.min(to.saturating_sub(from)) as usize];
    let mut at = from;
    while at < to {
        let n = (to - at).min(WINDOW_BYTES) as usize;
        match std::os::unix::fs::FileExt::read_exact_at(f, &mut buf[..n], at) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(false),
            Err(e) => return Err(e),
        }
        if !crate::format::all_zero(&buf[..n]) {
            return Ok(false);
        }
        at += n as u64;
    }
    Ok(true)
}

/// What a tailer or a writer reads at the end of the frames it knows to see
/// whether anything was appended since.
pub(crate) const PROBE_BYTES: usize = 4096;

/// How many times a tailer reads damage (or a short read) again before it believes
/// it, and the pause before each look.
const LIVE_REREADS_MAX: u32 = 3;
const LIVE_REREAD_PAUSE: std::time::Duration = std::time::Duration::from_millis(2);

/// May the tailer look again at `here` (segment, offset)? The budget of
/// [`LIVE_REREADS_MAX`] looks is per place: it starts again at a new place.
fn retry(rereads: &mut u32, retrying_at: &mut Option<(u64, u64)>, here: (u64, u64)) -> bool {
    if *retrying_at != Some(here) {
        *retrying_at = Some(here);
        *rereads = 0;
    }
    *rereads += 1;
    *rereads <= LIVE_REREADS_MAX
}

/// What a tailer reads past the end of the frames of a preallocated segment whose
/// zeros it has already checked: enough to see a few appended records at once.
const TAIL_WINDOW_BYTES: u64 = 16 * 1024;

/// An incremental verifying reader: remembers where it stopped (segment, byte
/// offset, sequence and chain link) and on each `poll` reads only what was appended
/// since. An incomplete frame at the end is an append in progress (or a torn write a
/// writer will cut): the tailer stops before it and looks again next time.
pub struct Tailer {
    dir: PathBuf,
    body_max: u32,
    file: Option<(u64, PathBuf, fs::File)>,
    offset: u64,
    cursor: Cursor,
    /// Records below this sequence are verified but not visited.
    visit_from: u64,
    /// The last poll stopped before a torn tail (an append in progress, or a torn
    /// write the next writer will cut).
    torn_tail: bool,
    /// How the open segment's frames end.
    layout: Layout,
    /// The zeros after the frames of the open (preallocated) segment were read to
    /// the file's end once.
    zeros_checked: bool,
    /// `offset` is where the frames were last seen to end (not a place of damage).
    at_frames_end: bool,
}

impl Tailer {
    /// A tailer that will visit records from `from_seq` on (verifying the chain from
    /// the start of the segment holding it).
    pub fn new(dir: &Path, body_max: u32, from_seq: u64) -> Tailer {
        Tailer {
            dir: dir.to_path_buf(),
            body_max,
            file: None,
            offset: 0,
            cursor: Cursor { next_seq: 0, prev_link: GENESIS_LINK },
            visit_from: from_seq.max(1),
            torn_tail: false,
            layout: Layout::Appended,
            zeros_checked: false,
            at_frames_end: false,
        }
    }

    /// Has the segment this reader is in been cut back below what it read, or
    /// replaced, or removed? A reader takes no lock, so it may read a commit group
    /// while it is being synced; if the sync fails, the writer cuts the group back
    /// (FORMAT.md §7) and the records this reader passed on were never committed.
    /// Then `CUT_UNDER_READER` (the caller starts again from what the log holds:
    /// the ledger rebuilds its state, a stream says so) — never a silent stall on a
    /// file nobody appends to. A segment replaced by a new file holding at least
    /// what this reader read (a cut back across a rotation rewrites the sealed
    /// segment's prefix byte for byte) is followed into the new file.
    fn check_not_cut_under(&mut self) -> Result<()> {
        let Some((first_seq, path, f)) = self.file.as_ref() else { return Ok(()) };
        let mine = super::dir::stat_file(f).map_err(Error::io("stat", path))?;
        let at_path = super::dir::stat_path(path).ok().filter(|m| m.is_file);
        let cut = |detail: String| Error::CutUnderReader {
            segment: path.clone(),
            offset: self.offset,
            seq: self.cursor.next_seq,
            detail,
        };
        match at_path {
            Some(m) if (m.dev, m.ino) == (mine.dev, mine.ino) => {
                if mine.len < self.offset {
                    return Err(cut(format!("the segment was cut to {} bytes below what was read", mine.len)));
                }
                Ok(())
            }
            Some(m) if m.len >= self.offset => {
                let (first_seq, path) = (*first_seq, path.clone());
                let (file, _) = open_regular(&path, segment_file_bytes_max(self.body_max), first_seq)?;
                if let Some(held) = self.file.as_mut() {
                    held.2 = file;
                }
                self.zeros_checked = false;
                self.at_frames_end = false;
                Ok(())
            }
            Some(m) => Err(cut(format!("the segment was replaced by a file of {} bytes, below what was read", m.len))),
            None => Err(cut("the segment was removed".into())),
        }
    }

    /// Chain link of the record before `next_seq` (the last one verified).
    pub fn prev_link(&self) -> crate::format::ChainLink {
        self.cursor.prev_link
    }

    /// Did the last poll stop before a torn tail?
    pub fn stopped_at_torn_tail(&self) -> bool {
        self.torn_tail
    }

    /// In a preallocated segment whose zeros were checked: is the end of the frames
    /// still the end mark (or zeros), and only zeros after it? A page of bytes
    /// tells: appends overwrite from there (and records appended whose first bytes
    /// were zeroed since are seen as damage, not as the end).
    fn nothing_appended(&self, f: &fs::File, path: &Path, len: u64) -> Result<bool> {
        let mut probe = [0u8; PROBE_BYTES];
        let n = (len - self.offset).min(probe.len() as u64) as usize;
        std::os::unix::fs::FileExt::read_exact_at(f, &mut probe[..n], self.offset).map_err(Error::io("read", path))?;
        Ok(crate::format::ends_at_mark(&probe[..n]))
    }

    fn later_segment_exists(&self, first_seq: u64) -> Result<bool> {
        Ok(list_segments(&self.dir)?.iter().any(|(s, _)| *s > first_seq))
    }

    /// Next sequence this tailer expects.
    pub fn next_seq(&self) -> u64 {
        self.cursor.next_seq
    }

    /// Open a segment to read on; `false` if it is a later segment torn while being
    /// created (a header that never reached the disk whole and no intact record:
    /// what the next writer sets aside), which ends the readable log.
    fn open_segment(&mut self, first_seq: u64, path: PathBuf, continuing: bool) -> Result<bool> {
        let (f, len) = open_regular(&path, segment_file_bytes_max(self.body_max), first_seq)?;
        let mut hb = [0u8; SEGMENT_HEADER_BYTES];
        std::os::unix::fs::FileExt::read_exact_at(&f, &mut hb, 0).map_err(Error::io("read segment header", &path))?;
        let header = match SegmentHeader::decode(&hb) {
            Ok(h) => h,
            Err(e) => {
                let mut bytes = vec![0u8; len as usize];
                std::os::unix::fs::FileExt::read_exact_at(&f, &mut bytes, 0).map_err(Error::io("read", &path))?;
                if continuing && is_torn_creation(&bytes, &e, self.body_max, first_seq) {
                    return Ok(false);
                }
                return Err(super::recovery::header_error(&path, e, first_seq));
            }
        };
        let prev = continuing.then_some(self.cursor);
        check_header_continuity(&path, first_seq, &header, prev.as_ref(), first_seq == 1)?;
        self.cursor = Cursor { next_seq: header.first_seq, prev_link: header.prev_link };
        self.file = Some((first_seq, path, f));
        self.offset = SEGMENT_HEADER_BYTES as u64;
        self.layout = header.layout();
        self.zeros_checked = false;
        self.at_frames_end = false;
        Ok(true)
    }

    /// Read and verify everything appended since the last poll; returns how many
    /// records were visited.
    pub fn poll(&mut self, mut visit: impl FnMut(&RecordRef<'_>)) -> Result<u64> {
        let mut visited = 0;
        self.torn_tail = false;
        // A commit group in doubt (its sync failed and it was not cut back): no
        // record from here is trusted.
        super::halt::check(&self.dir)?;
        self.check_not_cut_under()?;
        if self.file.is_none() {
            let segments = list_segments(&self.dir)?;
            let Some((seq, path)) =
                segments.iter().rev().find(|(s, _)| *s <= self.visit_from).or(segments.first()).cloned()
            else {
                return Ok(0);
            };
            if super::dir::stat_path(&path).map_err(Error::io("stat", &path))?.len < SEGMENT_HEADER_BYTES as u64 {
                return Ok(0); // being created
            }
            self.open_segment(seq, path, false)?;
        }
        // A reader takes no lock: what it reads may be changing under it (a group
        // being copied over the zeros and end mark of a preallocated segment, the
        // segment cut to its last record when it is sealed). Damage or a short read
        // is therefore looked at again, after a pause, before it is believed.
        // The budget is per place: it starts again wherever the reader got further.
        let (mut rereads, mut retrying_at) = (0u32, None::<(u64, u64)>);
        let mut read_buf = Vec::new();
        let mut read_window = TAIL_READ_BYTES_FIRST;
        'segments: loop {
            let (first_seq, path, f) = self.file.as_ref().expect("open");
            let (first_seq, path) = (*first_seq, path.clone());
            let len = super::dir::stat_file(f).map_err(Error::io("stat", &path))?.len;
            while len > self.offset {
                if self.zeros_checked && self.at_frames_end {
                    match self.nothing_appended(f, &path, len) {
                        Ok(true) => break,
                        Ok(false) => {}
                        Err(_) if retry(&mut rereads, &mut retrying_at, (first_seq, self.offset)) => {
                            self.zeros_checked = false;
                            std::thread::sleep(LIVE_REREAD_PAUSE);
                            continue 'segments;
                        }
                        Err(e) => return Err(e),
                    }
                }
                // Bounded reads. When a chunk that is not the file's end shows damage,
                // the chunk may simply have cut a frame: read again from that frame.
                // Damage at the very start of such a chunk is judged against the
                // whole rest of the file, as an unchunked read would. In a
                // preallocated segment whose zeros were checked to the end once, a
                // small window is enough to see whether anything was appended.
                let at = self.offset;
                let mut chunk = (len - at).min(read_window);
                if self.zeros_checked {
                    chunk = chunk.min(TAIL_WINDOW_BYTES);
                }
                let (outcome, scanned, marked) = loop {
                    // One buffer per poll, grown as needed (not one per chunk: a
                    // fresh one costs a page fault per page).
                    if read_buf.len() < chunk as usize {
                        read_buf.resize(chunk as usize, 0);
                    }
                    let bytes = &mut read_buf[..chunk as usize];
                    match std::os::unix::fs::FileExt::read_exact_at(f, bytes, at) {
                        Ok(()) => {}
                        // Shorter than it was a moment ago: cut to its last record
                        // as it was sealed. Look again.
                        Err(e)
                            if e.kind() == std::io::ErrorKind::UnexpectedEof
                                && retry(&mut rereads, &mut retrying_at, (first_seq, at)) =>
                        {
                            // Not yet known to be the end of the frames: no probe there.
                            self.zeros_checked = false;
                            std::thread::sleep(LIVE_REREAD_PAUSE);
                            continue 'segments;
                        }
                        Err(e) => return Err(Error::io("read", &path)(e)),
                    }
                    let visit_from = self.visit_from;
                    let (cursor, body_max, layout) = (&mut self.cursor, self.body_max, self.layout);
                    let bytes = &*bytes;
                    // Links are checked from `visit_from` on: helpers only where they are.
                    let (checks_links, prev) = (cursor.next_seq >= visit_from, cursor.prev_link);
                    let mut scan = |ahead: Option<&crate::format::LinksAhead<'_>>| {
                        scan_segment_frames_ahead(bytes, 0, at, cursor, body_max, layout, visit_from, ahead, |_, r| {
                            if r.seq >= visit_from {
                                visited += 1;
                                visit(r);
                            }
                        })
                    };
                    let outcome =
                        if checks_links { with_links_ahead(bytes, 0, prev, body_max, scan) } else { scan(None) };
                    // The frames end at a whole end mark: where a writer left them.
                    let marked = matches!(outcome, ScanOutcome::ZeroTail { offset }
                        if bytes[offset as usize..].starts_with(&FRAMES_END_MARK));
                    // Past a page of zeros the damage is judged as it stands (a torn
                    // tail is looked at again next poll; anything else is read again
                    // whole before it is believed): no poll at a torn tail reads all
                    // the zeros after it.
                    let settled = self.zeros_checked
                        && bytes.len() >= 2 * PROBE_BYTES
                        && crate::format::all_zero(&bytes[bytes.len() - PROBE_BYTES..]);
                    // A frame whose length says it ends past this read but within
                    // the file is read to its end before it is judged, zeros in it
                    // or not (a record may hold a page of zeros).
                    let claims_more = bytes.get(..4).is_some_and(|l| {
                        let body = u64::from(u32::from_le_bytes(l.try_into().expect("4 bytes")));
                        let end = FRAME_HEADER_BYTES as u64 + body;
                        (BODY_FIXED_BYTES as u64..=u64::from(body_max)).contains(&body)
                            && end > chunk
                            && at + end <= len
                    });
                    match outcome {
                        // Twice the read, up to the rest of the file (a record larger
                        // than the window needs no read of all the zeros after it).
                        ScanOutcome::Damaged(d) if d.offset == 0 && at + chunk < len && (!settled || claims_more) => {
                            chunk = (chunk * 2).min(len - at)
                        }
                        // Zeros where no end mark is: checked to the end of the file
                        // (they could lie over a record's first bytes).
                        ScanOutcome::ZeroTail { offset: 0 } if at + chunk < len && !(self.zeros_checked && marked) => {
                            // Zeros after the chunk too: as if it were read whole.
                            if zeros_in_file(f, at + chunk, len).map_err(Error::io("read", &path))? {
                                break (outcome, len - at, marked);
                            }
                            chunk = len - at
                        }
                        _ => break (outcome, chunk, marked),
                    }
                };
                // Only where the frames are known to end may a probe say that nothing
                // was appended: never at damage or at a mere window's end, where zeros
                // over a record's first bytes would pass for the end.
                self.at_frames_end = false;
                match outcome {
                    ScanOutcome::Clean => {
                        self.offset += scanned;
                        read_window = (read_window * 2).min(TAIL_READ_BYTES_MAX);
                    }
                    // The end of the frames: zeros to the end of the file, or (checked
                    // whole once) the end mark a writer left — appends only ever
                    // overwrite the zeros from there on.
                    ScanOutcome::ZeroTail { offset } if at + scanned == len || (self.zeros_checked && marked) => {
                        self.offset += offset;
                        self.zeros_checked = true;
                        self.at_frames_end = true;
                        break;
                    }
                    // Zeros to the end of this chunk only: look on from there.
                    ScanOutcome::ZeroTail { offset } => self.offset += offset,
                    // A chunk that cut a frame: read on from that frame.
                    ScanOutcome::Damaged(d) if at + scanned < len && d.offset > 0 => {
                        self.offset += d.offset;
                        read_window = (read_window * 2).min(TAIL_READ_BYTES_MAX);
                    }
                    // An append in progress, or a torn write the next writer cuts — but
                    // only at the end of the last segment: a later segment means this
                    // one is sealed, and damage in it is corruption.
                    ScanOutcome::Damaged(d) if d.is_torn_tail() && !self.later_segment_exists(first_seq)? => {
                        self.offset += d.offset;
                        self.torn_tail = true;
                        return Ok(visited);
                    }
                    // Before it is believed, damage is read again: a group being
                    // copied, or a segment sealed since this poll looked, reads whole
                    // a moment later; corruption does not.
                    ScanOutcome::Damaged(d) if retry(&mut rereads, &mut retrying_at, (first_seq, at + d.offset)) => {
                        self.offset += d.offset;
                        // The damage is not the end of the frames: the next look
                        // reads it, never a probe that could take zeros
                        // there for the end.
                        self.zeros_checked = false;
                        std::thread::sleep(LIVE_REREAD_PAUSE);
                        continue 'segments;
                    }
                    ScanOutcome::Damaged(d) => {
                        let sealed = self.later_segment_exists(first_seq)?;
                        return Err(super::recovery::refusal(&path, at, &d, sealed));
                    }
                }
            }
            if self.cursor.next_seq == first_seq {
                return Ok(visited);
            }
            let next = super::dir::segment_path(&self.dir, self.cursor.next_seq);
            let opened = match super::dir::stat_path(&next) {
                Err(_) => return Ok(visited),
                // Being created by a live writer, or torn while being created.
                Ok(m) if m.len < SEGMENT_HEADER_BYTES as u64 => false,
                Ok(_) => self.open_segment(self.cursor.next_seq, next, true)?,
            };
            if !opened {
                self.torn_tail = true;
                return Ok(visited);
            }
        }
    }
}
