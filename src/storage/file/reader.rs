//! Verifying readers. They take no lock and never write: sealed segments are mapped
//! (memmap2), the last segment — which a recovering writer may truncate — is read
//! into memory. Every problem is reported with segment, byte offset and sequence,
//! and the scan resynchronises past damage so it decodes as much as it can.

use std::fs;
use std::path::{Path, PathBuf};

use serde::Serialize;

use super::ahead::with_links_ahead;
use super::dir::{list_segments, listing, open_regular, read_regular, read_regular_then};
use super::recovery::{Mapped, check_header_continuity, is_torn_creation};
use crate::format::{
    Action, BODY_FIXED_BYTES, Cursor, Damage, FRAME_HEADER_BYTES, FRAMES_END_MARK, GENESIS_LINK, Layout, RecordRef,
    SEGMENT_BYTES_HARD_MAX, SEGMENT_HEADER_BYTES, ScanOutcome, SegmentHeader, SegmentHeaderError, classify,
    decode_frame, hex, scan_segment_frames, scan_segment_frames_ahead, segment_file_bytes_max,
};
use crate::storage::error::{Error, READ_SYNC_OP, Result};
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
    #[cfg_attr(not(feature = "etcd"), allow(dead_code))] // etcd's scan
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
///
/// A record after the durable mark of `LOCK` (a group in flight, a dead
/// writer's: `lock.rs`) is visited only once this reader has synced its segment
/// ([`make_read_durable`]); if that fails, the scan stops there and fails.
pub fn scan_dir(dir: &Path, from_seq: u64, body_max: u32, on: impl FnMut(ScanItem<'_>) -> bool) -> Result<ReadSummary> {
    scan_dir_with(dir, from_seq, body_max, ReadSync::BeyondMark, on)
}

/// Whether a scan makes what it visits durable first ([`scan_dir`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ReadSync {
    /// Records after the durable mark are synced before they are visited.
    BeyondMark,
    /// Nothing is synced: the caller answers nothing from the records (it holds
    /// the append lock to find damage to cut, say).
    Never,
}

pub(crate) fn scan_dir_with(
    dir: &Path,
    from_seq: u64,
    body_max: u32,
    sync: ReadSync,
    on: impl FnMut(ScanItem<'_>) -> bool,
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
    let sum = ReadSummary { segments: segments.len(), chain_head: hex(&GENESIS_LINK), ..Default::default() };
    // Read before any segment is: records up to it were durable before they were read.
    let durable_mark = super::lock::open_for_marks(dir).and_then(|f| super::lock::durable_mark(&f)).unwrap_or(0);
    let gate = ReadGate { sync, durable_mark, file: None, synced: false, failed: None };
    let mut scan = DirScan { on, sum, stopped: false, from_seq, body_max, gate };
    let mut cursor: Option<Cursor> = None;
    if let Some((segment, offset, seq)) = super::halt::halted_at(dir) {
        let detail = format!(
            "{}: the sync of the commit group from sequence {seq} failed and it could not be cut back; the records \
             from there on may not be durable (writers refuse the log until `fencelog repair --cut-from {seq}`)",
            super::halt::SYNC_FAILED_FILE
        );
        let p = problem(ProblemKind::SyncFailed, &segment, offset, seq, false, 0, detail);
        scan.report(p);
    }
    for name in &found.odd_segment_names {
        let detail = "named like a segment but not a valid segment name (20 decimal digits of a u64, then .seg): \
                      a renamed or planted segment; not read"
            .to_string();
        let p = problem(ProblemKind::OddSegmentName, &dir.join(name), 0, 0, false, 0, detail);
        scan.report(p);
    }
    for (i, (name_seq, path)) in segments.iter().enumerate().skip(start) {
        if scan.stopped {
            break;
        }
        let is_last = i + 1 == segments.len();
        cursor = scan.segment(path, *name_seq, i == 0, is_last, cursor)?;
        if let Some(e) = scan.gate.failed.take() {
            return Err(e);
        }
    }
    let mut sum = scan.sum;
    if let Some(link) = sum.head_link {
        sum.chain_head = hex(&link);
    }
    Ok(sum)
}

/// A scan of a log directory under way ([`scan_dir`]): what it reports to, what
/// it has found, and what it reads.
struct DirScan<F> {
    on: F,
    sum: ReadSummary,
    /// `on` said to stop.
    stopped: bool,
    from_seq: u64,
    body_max: u32,
    gate: ReadGate,
}

/// What a scan syncs before it visits a record ([`scan_dir`]).
struct ReadGate {
    sync: ReadSync,
    /// Records up to it are durable (the durable mark of `LOCK` when the scan began).
    durable_mark: u64,
    /// The segment being scanned: what is synced.
    file: Option<(fs::File, PathBuf)>,
    /// It was synced after it was read (or mapped).
    synced: bool,
    /// The sync failed: nothing more is visited.
    failed: Option<Error>,
}

impl ReadGate {
    /// May the record `seq` be visited? Syncs its segment first (once) when it is
    /// after the durable mark (in a sealed segment only if its writer of an
    /// earlier build, or a writer that died, left it so).
    fn admits(&mut self, seq: u64) -> bool {
        if self.failed.is_some() {
            return false;
        }
        if self.sync == ReadSync::Never || self.synced || seq <= self.durable_mark {
            return true;
        }
        let Some((f, path)) = &self.file else { return true };
        match make_read_durable(f, path) {
            Ok(()) => {
                self.synced = true;
                true
            }
            Err(e) => {
                self.failed = Some(e);
                false
            }
        }
    }
}

impl<F: FnMut(ScanItem<'_>) -> bool> DirScan<F> {
    fn report(&mut self, p: Problem) {
        report(&mut self.on, &mut self.sum, p, &mut self.stopped);
    }

    /// One segment, after the segments that leave the chain at `cursor`: its
    /// header, then its frames. Where the chain stands after it (`None`: the
    /// segment could not be read, or its header is damaged).
    fn segment(
        &mut self,
        path: &Path,
        name_seq: u64,
        is_first: bool,
        is_last: bool,
        cursor: Option<Cursor>,
    ) -> Result<Option<Cursor>> {
        let bytes_max = segment_file_bytes_max(self.body_max);
        // The last segment (which a recovering writer may truncate) is read into
        // memory; sealed ones are mapped.
        (self.gate.file, self.gate.synced) = (None, false);
        let held = if is_last {
            // What is there: a writer sealing it may have cut it to its last
            // record since it was measured. Kept open: its records after the
            // durable mark are synced before they are visited (its writer may
            // not have synced its last group yet).
            let gate = &mut self.gate;
            read_regular_then(path, bytes_max, name_seq, |f| {
                gate.file = Some((f.try_clone().map_err(Error::io("open", path))?, path.to_path_buf()));
                Ok(())
            })
            .map(Held::Owned)
        } else {
            // Synced by its writer before the next one was created — its records
            // are under the durable mark then; gated all the same.
            Mapped::open(path, bytes_max, name_seq).and_then(|m| {
                self.gate.file = Some((m.file().try_clone().map_err(Error::io("open", path))?, path.to_path_buf()));
                Ok(Held::Mapped(m))
            })
        };
        let held = match held {
            Ok(h) => h,
            Err(Error::Corruption { detail, .. }) => {
                // Not a regular file, or too long to be a segment: reported, not read.
                let p = problem(ProblemKind::UnsafeSegment, path, 0, name_seq, false, 0, detail);
                self.report(p);
                return Ok(None);
            }
            Err(e) => return Err(e),
        };
        let bytes = held.bytes();
        self.sum.bytes += bytes.len() as u64;
        let Some(header) = self.header(path, name_seq, bytes, is_last, cursor)? else { return Ok(None) };
        if let Err(Error::Corruption { detail, .. }) =
            check_header_continuity(path, name_seq, &header, cursor.as_ref(), is_first)
        {
            let p = problem(ProblemKind::SegmentDiscontinuity, path, 0, header.first_seq, false, 0, detail);
            self.report(p);
        }
        let c = Cursor { next_seq: header.first_seq, prev_link: header.prev_link };
        Ok(Some(self.frames(path, bytes, header.layout(), c, is_last)))
    }

    /// The header of the segment at `path` (its `bytes`); `None` where it does not
    /// decode, the damage reported (a later segment torn while being created, where
    /// the history before it ends right at its name, as a torn tail).
    fn header(
        &mut self,
        path: &Path,
        name_seq: u64,
        bytes: &[u8],
        is_last: bool,
        cursor: Option<Cursor>,
    ) -> Result<Option<SegmentHeader>> {
        let expected_seq = cursor.map_or(name_seq, |c| c.next_seq);
        match SegmentHeader::decode(bytes) {
            Ok(h) => Ok(Some(h)),
            Err(e @ SegmentHeaderError::UnsupportedVersion { .. }) => {
                Err(Error::UnsupportedFormat { segment: path.to_path_buf(), detail: e.to_string() })
            }
            Err(e) => {
                // A segment torn while being created is harmless only where the
                // history before it ends right at its name.
                let continues = cursor.is_none_or(|c| c.next_seq == name_seq);
                if !continues {
                    let detail = format!(
                        "records {}..{} are missing before this segment",
                        cursor.map_or(0, |c| c.next_seq),
                        name_seq
                    );
                    let p = problem(ProblemKind::SegmentDiscontinuity, path, 0, expected_seq, false, 0, detail);
                    self.report(p);
                }
                let torn = continues && is_last && is_torn_creation(bytes, &e, self.body_max, name_seq);
                let kind = if torn { ProblemKind::TornSegmentCreation } else { ProblemKind::SegmentHeader };
                let p = problem(kind, path, 0, expected_seq, torn, bytes.len() as u64, e.to_string());
                self.report(p);
                Ok(None)
            }
        }
    }

    /// The frame loop of one segment: its frames from the header on, from the chain
    /// at `c`; each intact record from `from_seq` on visited, each damaged region
    /// reported and the scan resynchronised on the intact frame after it. Where the
    /// chain stands at the segment's end.
    fn frames(&mut self, path: &Path, bytes: &[u8], layout: Layout, mut c: Cursor, is_last: bool) -> Cursor {
        let (from_seq, body_max) = (self.from_seq, self.body_max);
        let mut at = SEGMENT_HEADER_BYTES;
        loop {
            let mut local = ReadSummary::default();
            let (on, stopped, gate) = (&mut self.on, &mut self.stopped, &mut self.gate);
            let outcome = with_links_ahead(bytes, at, c.prev_link, body_max, |ahead| {
                scan_segment_frames_ahead(bytes, at, 0, &mut c, body_max, layout, 0, ahead, |offset, rec| {
                    if rec.seq >= from_seq && !*stopped {
                        if !gate.admits(rec.seq) {
                            *stopped = true;
                            return;
                        }
                        count(&mut local, rec);
                        *stopped = !on(ScanItem::Record { rec, segment: path, offset });
                    }
                })
            });
            merge(&mut self.sum, local);
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
                    self.report(p);
                    break;
                }
                ScanOutcome::Damaged(d) => d,
            };
            if self.stopped {
                break;
            }
            self.report(damage_problem(path, &d, is_last, bytes.len() as u64));
            let Some(resync) = d.resync_at.filter(|_| !self.stopped) else { break };
            // Anchor on the intact frame after the damage; its own link cannot be
            // checked against a lost predecessor, so start the chain from it.
            let (rec, used) = decode_frame(&bytes[resync as usize..], body_max).expect("resync found an intact frame");
            if rec.seq >= from_seq {
                if !self.gate.admits(rec.seq) {
                    self.stopped = true;
                    break;
                }
                let mut local = ReadSummary::default();
                count(&mut local, &rec);
                merge(&mut self.sum, local);
                self.stopped = !(self.on)(ScanItem::Record { rec: &rec, segment: path, offset: resync });
            }
            c = Cursor { next_seq: rec.seq + 1, prev_link: rec.link };
            at = resync as usize + used;
        }
        c
    }
}

/// The problem a scan reports for damage `d` in the segment at `path` (`len`
/// bytes; the last segment if `is_last`): its kind and region, whether it is a
/// torn tail recovery would cut, and what a rotten record needs to be cut.
fn damage_problem(path: &Path, d: &Damage, is_last: bool, len: u64) -> Problem {
    let end = d.resync_at.unwrap_or(len);
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
    problem(d.kind.into(), path, d.offset, d.expected_seq, torn, end - d.offset, detail)
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

/// Make what a reader read from `f` durable before it is answered from: a reader
/// takes no lock, so the last segment may hold a commit group its writer has
/// written and not yet synced (and could still cut back, or lose to a power cut).
/// `fdatasync` from the reader's own descriptor makes every byte written before
/// it durable. A file that cannot be synced at all (`EINVAL`: a file system
/// without `fsync`, such as a read-only image a log was copied to — no writer
/// could ever have synced a record there either) is read as it is; any other
/// failure is the reader's answer: nothing read is given (`EROFS` too: on ext4
/// a file system that aborted, whose dirty pages will never reach the disk).
pub(crate) fn make_read_durable(f: &fs::File, path: &Path) -> Result<()> {
    fail::fail_point!("reader::fdatasync", |_| {
        Err(Error::io(READ_SYNC_OP, path)(std::io::Error::other("injected fdatasync failure")))
    });
    match f.sync_data() {
        Ok(()) => Ok(()),
        Err(e) if e.raw_os_error() == Some(libc::EINVAL) => Ok(()),
        Err(e) => Err(Error::io(READ_SYNC_OP, path)(e)),
    }
}

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
    /// Records up to this sequence are known durable: the append lock's holders
    /// said so (the durable mark in `LOCK`, read at each poll: `lock.rs`), or this
    /// reader made them so ([`make_read_durable`]). A record after it is visited
    /// only once the chunk it was read in has been synced.
    durable_seq: u64,
    /// The log's `LOCK`, for its durable mark (opened at the first poll).
    marks: Option<fs::File>,
    /// A sync of this reader's failed: every later poll fails with it. (The kernel
    /// tells a descriptor of a writeback error once; a sync tried again would
    /// succeed over pages that never reached the disk.)
    failed: Option<Error>,
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
            durable_seq: 0,
            marks: None,
            failed: None,
        }
    }

    /// Take in what the append lock's holders say is durable (`lock.rs`).
    fn read_durable_mark(&mut self) {
        if self.marks.is_none() {
            self.marks = super::lock::open_for_marks(&self.dir);
        }
        // As it stands now, lower too (after a cut, sequences are written again).
        self.durable_seq = self.marks.as_ref().and_then(super::lock::durable_mark).unwrap_or(0);
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
        self.torn_tail = false;
        if let Some(e) = &self.failed {
            return Err(e.clone());
        }
        // Before anything is read: records up to the mark are durable.
        self.read_durable_mark();
        // A commit group in doubt (its sync failed and it was not cut back): no
        // record from here is trusted.
        super::halt::check(&self.dir)?;
        self.check_not_cut_under()?;
        if self.file.is_none() && !self.open_start_segment()? {
            return Ok(0);
        }
        // A reader takes no lock: what it reads may be changing under it (a group
        // being copied over the zeros and end mark of a preallocated segment, the
        // segment cut to its last record when it is sealed). Damage or a short read
        // is therefore looked at again, after a pause, before it is believed.
        // The budget is per place: it starts again wherever the reader got further.
        let mut pass = Pass {
            rereads: 0,
            retrying_at: None,
            read_buf: Vec::new(),
            read_window: TAIL_READ_BYTES_FIRST,
            visited: 0,
        };
        loop {
            let (first_seq, path, f) = self.file.as_ref().expect("open");
            let (first_seq, path) = (*first_seq, path.clone());
            let len = super::dir::stat_file(f).map_err(Error::io("stat", &path))?.len;
            match self.read_segment(first_seq, &path, len, &mut pass, &mut visit)? {
                Next::SegmentEnd => {}
                Next::LookAgain => continue,
                Next::Done => return Ok(pass.visited),
            }
            if !self.open_next_segment(first_seq)? {
                return Ok(pass.visited);
            }
        }
    }

    /// Open the segment a poll starts in (the last one at or before `visit_from`,
    /// else the first); `false` if there is none yet, or it is being created.
    fn open_start_segment(&mut self) -> Result<bool> {
        let segments = list_segments(&self.dir)?;
        let Some((seq, path)) =
            segments.iter().rev().find(|(s, _)| *s <= self.visit_from).or(segments.first()).cloned()
        else {
            return Ok(false);
        };
        if super::dir::stat_path(&path).map_err(Error::io("stat", &path))?.len < SEGMENT_HEADER_BYTES as u64 {
            return Ok(false); // being created
        }
        self.open_segment(seq, path, false)?;
        self.seek_by_index();
        Ok(true)
    }

    /// In the segment a poll starts in, move to the newest place before the first
    /// record to visit that the segment's position index proves (FORMAT.md §3b):
    /// the records before it are neither visited nor verified, as those of the
    /// segments before. Without a proven place, the read starts at the segment's
    /// first record.
    fn seek_by_index(&mut self) {
        let Some((first_seq, path, f)) = self.file.as_ref() else { return };
        if self.visit_from <= *first_seq {
            return;
        }
        let positions = super::index::read(path, *first_seq, SEGMENT_BYTES_HARD_MAX);
        let Ok(len) = super::dir::stat_file(f).map(|m| m.len) else { return };
        let body_max = self.body_max;
        if let Some(p) =
            super::index::proven(&positions, self.visit_from, |p| super::index::proves_in_file(f, len, p, body_max))
        {
            self.offset = p.offset;
            self.cursor = p.cursor;
        }
    }

    /// At the end of the open segment's frames (the segment named for
    /// `first_seq`): open the segment after it; `false` if there is none (yet), or
    /// it was torn while being created (a torn tail).
    fn open_next_segment(&mut self, first_seq: u64) -> Result<bool> {
        if self.cursor.next_seq == first_seq {
            return Ok(false);
        }
        let next = super::dir::segment_path(&self.dir, self.cursor.next_seq);
        let opened = match super::dir::stat_path(&next) {
            Err(_) => return Ok(false),
            // Being created by a live writer, or torn while being created.
            Ok(m) if m.len < SEGMENT_HEADER_BYTES as u64 => false,
            Ok(_) => self.open_segment(self.cursor.next_seq, next, true)?,
        };
        if !opened {
            self.torn_tail = true;
        }
        Ok(opened)
    }

    /// Read and verify the open segment (named for `first_seq`, `len` bytes long
    /// when the poll looked) from the offset reached, read by read, up to the end
    /// of its frames or to where the poll ends.
    fn read_segment(
        &mut self,
        first_seq: u64,
        path: &Path,
        len: u64,
        pass: &mut Pass,
        visit: &mut impl FnMut(&RecordRef<'_>),
    ) -> Result<Next> {
        while len > self.offset {
            if self.zeros_checked && self.at_frames_end {
                let f = &self.file.as_ref().expect("open").2;
                match self.nothing_appended(f, path, len) {
                    Ok(true) => break,
                    Ok(false) => {}
                    Err(_) if retry(&mut pass.rereads, &mut pass.retrying_at, (first_seq, self.offset)) => {
                        self.zeros_checked = false;
                        std::thread::sleep(LIVE_REREAD_PAUSE);
                        return Ok(Next::LookAgain);
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
            let mut chunk = (len - at).min(pass.read_window);
            if self.zeros_checked {
                chunk = chunk.min(TAIL_WINDOW_BYTES);
            }
            let Some(read) = self.read_chunk(first_seq, path, len, chunk, pass, visit)? else {
                return Ok(Next::LookAgain);
            };
            if let Some(next) = self.advance(first_seq, path, len, read, pass)? {
                return Ok(next);
            }
        }
        Ok(Next::SegmentEnd)
    }

    /// One bounded read of the open segment from the offset reached: `chunk`
    /// bytes first, more where they may have cut a frame or end in zeros that
    /// could lie over one. Verified (its records visited); `None` where the file
    /// was shorter than measured and is to be looked at again (after the pause).
    fn read_chunk(
        &mut self,
        first_seq: u64,
        path: &Path,
        len: u64,
        mut chunk: u64,
        pass: &mut Pass,
        visit: &mut impl FnMut(&RecordRef<'_>),
    ) -> Result<Option<ChunkRead>> {
        let at = self.offset;
        loop {
            // One buffer per poll, grown as needed (not one per chunk: a
            // fresh one costs a page fault per page).
            if pass.read_buf.len() < chunk as usize {
                pass.read_buf.resize(chunk as usize, 0);
            }
            let bytes = &mut pass.read_buf[..chunk as usize];
            match std::os::unix::fs::FileExt::read_exact_at(&self.file.as_ref().expect("open").2, bytes, at) {
                Ok(()) => {}
                // Shorter than it was a moment ago: cut to its last record
                // as it was sealed. Look again.
                Err(e)
                    if e.kind() == std::io::ErrorKind::UnexpectedEof
                        && retry(&mut pass.rereads, &mut pass.retrying_at, (first_seq, at)) =>
                {
                    // Not yet known to be the end of the frames: no probe there.
                    self.zeros_checked = false;
                    std::thread::sleep(LIVE_REREAD_PAUSE);
                    return Ok(None);
                }
                Err(e) => return Err(Error::io("read", path)(e)),
            }
            let bytes = &*bytes;
            let (outcome, marked) = self.scan_chunk(bytes, at, &mut pass.visited, visit)?;
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
                (BODY_FIXED_BYTES as u64..=u64::from(self.body_max)).contains(&body) && end > chunk && at + end <= len
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
                    let f = &self.file.as_ref().expect("open").2;
                    if zeros_in_file(f, at + chunk, len).map_err(Error::io("read", path))? {
                        return Ok(Some(ChunkRead { at, outcome, scanned: len - at, marked }));
                    }
                    chunk = len - at
                }
                _ => return Ok(Some(ChunkRead { at, outcome, scanned: chunk, marked })),
            }
        }
    }

    /// Verify the frames in `bytes`, read from byte `at` of the open segment,
    /// visiting (and counting in `visited`) the records from `visit_from` on. The
    /// outcome, and whether the frames end at a whole end mark.
    ///
    /// A record not known durable (after `durable_seq`: a group in flight, a
    /// dead writer's, or one a writer of an earlier build appended) is visited
    /// only after the segment was synced from this reader ([`make_read_durable`]),
    /// once per chunk: the chunk was read before that sync, so the sync covers
    /// every record in it. If the sync fails, no record from there on is
    /// visited: the tailer stops before it, and this poll and every later one
    /// fail (a sync tried again could succeed over pages that never reached the
    /// disk: the kernel reports a writeback error once).
    fn scan_chunk(
        &mut self,
        bytes: &[u8],
        at: u64,
        visited: &mut u64,
        visit: &mut impl FnMut(&RecordRef<'_>),
    ) -> Result<(ScanOutcome, bool)> {
        let visit_from = self.visit_from;
        let (cursor, body_max, layout) = (&mut self.cursor, self.body_max, self.layout);
        let (_, path, file) = self.file.as_ref().expect("open");
        let durable_seq = self.durable_seq;
        // Links are checked from `visit_from` on: helpers only where they are.
        let (checks_links, prev) = (cursor.next_seq >= visit_from, cursor.prev_link);
        let (mut synced, mut failed) = (false, None);
        let mut last_link = prev;
        let mut scan = |ahead: Option<&crate::format::LinksAhead<'_>>| {
            // `in_chunk`: the record's offset in `bytes`.
            scan_segment_frames_ahead(bytes, 0, at, cursor, body_max, layout, visit_from, ahead, |in_chunk, r| {
                let link_before = std::mem::replace(&mut last_link, r.link);
                if r.seq < visit_from || failed.is_some() {
                    return;
                }
                if !(synced || r.seq <= durable_seq) {
                    match make_read_durable(file, path) {
                        Ok(()) => synced = true,
                        Err(e) => {
                            failed = Some((e, at + in_chunk, Cursor { next_seq: r.seq, prev_link: link_before }));
                            return;
                        }
                    }
                }
                *visited += 1;
                visit(r);
            })
        };
        let outcome = if checks_links { with_links_ahead(bytes, 0, prev, body_max, scan) } else { scan(None) };
        if let Some((e, offset, stopped_at)) = failed {
            self.offset = offset;
            self.cursor = stopped_at;
            self.zeros_checked = false;
            self.at_frames_end = false;
            self.failed = Some(e.clone());
            return Err(e);
        }
        if synced {
            self.durable_seq = self.durable_seq.max(self.cursor.next_seq.saturating_sub(1));
        }
        // The frames end at a whole end mark: where a writer left them.
        let marked = matches!(outcome, ScanOutcome::ZeroTail { offset }
            if bytes[offset as usize..].starts_with(&FRAMES_END_MARK));
        Ok((outcome, marked))
    }

    /// Move the offset past what a read verified, and say where the poll goes
    /// on: `None` to read on in this segment.
    fn advance(
        &mut self,
        first_seq: u64,
        path: &Path,
        len: u64,
        read: ChunkRead,
        pass: &mut Pass,
    ) -> Result<Option<Next>> {
        let ChunkRead { at, outcome, scanned, marked } = read;
        // Only where the frames are known to end may a probe say that nothing
        // was appended: never at damage or at a mere window's end, where zeros
        // over a record's first bytes would pass for the end.
        self.at_frames_end = false;
        match outcome {
            ScanOutcome::Clean => {
                self.offset += scanned;
                pass.read_window = (pass.read_window * 2).min(TAIL_READ_BYTES_MAX);
            }
            // The end of the frames: zeros to the end of the file, or (checked
            // whole once) the end mark a writer left — appends only ever
            // overwrite the zeros from there on.
            ScanOutcome::ZeroTail { offset } if at + scanned == len || (self.zeros_checked && marked) => {
                self.offset += offset;
                self.zeros_checked = true;
                self.at_frames_end = true;
                return Ok(Some(Next::SegmentEnd));
            }
            // Zeros to the end of this chunk only: look on from there.
            ScanOutcome::ZeroTail { offset } => self.offset += offset,
            // A chunk that cut a frame: read on from that frame.
            ScanOutcome::Damaged(d) if at + scanned < len && d.offset > 0 => {
                self.offset += d.offset;
                pass.read_window = (pass.read_window * 2).min(TAIL_READ_BYTES_MAX);
            }
            // An append in progress, or a torn write the next writer cuts — but
            // only at the end of the last segment: a later segment means this
            // one is sealed, and damage in it is corruption.
            ScanOutcome::Damaged(d) if d.is_torn_tail() && !self.later_segment_exists(first_seq)? => {
                self.offset += d.offset;
                self.torn_tail = true;
                return Ok(Some(Next::Done));
            }
            // Before it is believed, damage is read again: a group being
            // copied, or a segment sealed since this poll looked, reads whole
            // a moment later; corruption does not.
            ScanOutcome::Damaged(d) if retry(&mut pass.rereads, &mut pass.retrying_at, (first_seq, at + d.offset)) => {
                self.offset += d.offset;
                // The damage is not the end of the frames: the next look
                // reads it, never a probe that could take zeros
                // there for the end.
                self.zeros_checked = false;
                std::thread::sleep(LIVE_REREAD_PAUSE);
                return Ok(Some(Next::LookAgain));
            }
            ScanOutcome::Damaged(d) => {
                let sealed = self.later_segment_exists(first_seq)?;
                return Err(super::recovery::refusal(path, at, &d, sealed));
            }
        }
        Ok(None)
    }
}

/// What one poll carries from read to read.
struct Pass {
    /// Looks again at one place so far ([`retry`]), and that place.
    rereads: u32,
    retrying_at: Option<(u64, u64)>,
    /// The poll's one read buffer, grown as needed.
    read_buf: Vec<u8>,
    /// The next read's size (doubled by each read that ends clean).
    read_window: u64,
    /// Records visited.
    visited: u64,
}

/// One bounded read of the open segment ([`Tailer::read_chunk`]).
struct ChunkRead {
    /// Where it was read from (the tailer's offset then).
    at: u64,
    outcome: ScanOutcome,
    /// The bytes the outcome covers from `at`.
    scanned: u64,
    /// The frames end at a whole end mark.
    marked: bool,
}

/// Where a poll goes on after reading the open segment.
enum Next {
    /// The segment's frames end: on to the next segment, if there is one.
    SegmentEnd,
    /// Look at the segment again from its length on (the pause was taken).
    LookAgain,
    /// The poll ends here.
    Done,
}
