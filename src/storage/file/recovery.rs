//! Open-time recovery: the decision table of FORMAT.md §5, applied with the append
//! lock held. Torn tails are cut (bytes kept as evidence); anything else is refused.

use std::fs::{self, File};
use std::path::{Path, PathBuf};

use memmap2::Mmap;

use super::ahead::with_links_ahead;
use super::dir::{
    Listing, create_first_segment, listing, open_regular, read_regular, segment_path, sync_dir, write_evidence,
};
use super::history::check_history;
use super::index;
use crate::format::{
    Action, BODY_BYTES_HARD_MAX, Cursor, Damage, Evidence, GENESIS_LINK, Layout, SEGMENT_HEADER_BYTES, ScanOutcome,
    SegmentHeader, SegmentHeaderError, classify, find_next_frame, hex, scan_segment_frames_ahead,
    segment_file_bytes_max,
};
use crate::storage::error::{Error, Result};
use crate::storage::options::{LogOptions, VerifyOnOpen};

pub use crate::storage::backend::{OpenReport, Repair};

/// The state a writer continues from.
#[derive(Debug, Clone)]
pub(crate) struct TailState {
    pub segment: PathBuf,
    pub segment_first_seq: u64,
    /// Where the segment's frames end (the next append goes here).
    pub segment_len: u64,
    /// How the segment's frames end (its header's version).
    pub layout: Layout,
    /// The file's length: past `segment_len` a preallocated segment holds zeros.
    pub alloc_len: u64,
    pub cursor: Cursor,
}

/// Map a whole file read-only (an empty file maps to an empty slice).
pub(crate) struct Mapped {
    map: Option<Mmap>,
    /// The file mapped (a reader syncs it before it visits a record past the
    /// durable mark: `reader.rs`).
    file: File,
}

impl Mapped {
    /// Map a segment named for `seq`, refusing anything but a regular file of at
    /// most `bytes_max` bytes.
    pub fn open(path: &Path, bytes_max: u64, seq: u64) -> Result<Self> {
        let (f, len): (File, u64) = open_regular(path, bytes_max, seq)?;
        fail::fail_point!("segment::mmap", |_| Err(Error::io("mmap", path)(std::io::Error::other(
            "injected mmap failure"
        ))));
        if len == 0 {
            return Ok(Mapped { map: None, file: f });
        }
        // A mapped file never shrinks underneath. Readers map only sealed
        // segments, and a sealed segment is never truncated in place: `repair`
        // replaces it with a new file (`dir::rewrite_prefix`), so a mapping keeps
        // the old inode whole. Only the last segment is cut in place (a torn tail,
        // sealing), under the append lock; the writer maps it only while holding
        // that lock, and readers read it into memory instead (FORMAT.md §7).
        let map = crate::sys::fs::map_never_cut(&f).map_err(Error::io("mmap", path))?;
        Ok(Mapped { map: Some(map), file: f })
    }

    pub fn bytes(&self) -> &[u8] {
        self.map.as_deref().unwrap_or(&[])
    }

    pub fn file(&self) -> &File {
        &self.file
    }
}

/// A last segment whose header never made it to disk whole, and which holds no
/// intact frame, is the trace of a crash during rotation.
/// The first segment is created whole (temp file, then link), so it is never one.
pub(crate) fn is_torn_creation(bytes: &[u8], err: &SegmentHeaderError, body_max: u32, seq: u64) -> bool {
    seq != 1 && classify(header_evidence(bytes, err, body_max, false)) == Action::SetAsideTornSegment
}

/// The decision-table evidence for a segment header that does not decode.
pub(crate) fn header_evidence(bytes: &[u8], err: &SegmentHeaderError, body_max: u32, sealed: bool) -> Evidence {
    Evidence::Header {
        unsupported_version: matches!(err, SegmentHeaderError::UnsupportedVersion { .. }),
        sealed,
        intact_frame_after: find_next_frame(bytes, SEGMENT_HEADER_BYTES.min(bytes.len()), body_max, 1).is_some(),
    }
}

pub(crate) fn header_error(path: &Path, err: SegmentHeaderError, expected_seq: u64) -> Error {
    match err {
        SegmentHeaderError::UnsupportedVersion { .. } => {
            Error::UnsupportedFormat { segment: path.to_path_buf(), detail: err.to_string() }
        }
        _ => Error::Corruption { segment: path.to_path_buf(), offset: 0, seq: expected_seq, detail: err.to_string() },
    }
}

/// Move a segment that was being created when the process died out of the way.
pub(crate) fn set_aside_torn_segment(dir: &Path, path: &Path, expected_seq: u64) -> Result<Repair> {
    // Torn while being created: at most a header's worth of bytes, and no frame;
    // read as any segment is (a regular file, bounded).
    let bytes = read_regular(path, segment_file_bytes_max(BODY_BYTES_HARD_MAX), expected_seq)?;
    let evidence = write_evidence(path, "torn-segment", 0, &bytes)?;
    fs::remove_file(path).map_err(Error::io("remove", path))?;
    sync_dir(dir)?;
    tracing::warn!(segment = %path.display(), evidence = %evidence.display(), "set aside a segment torn during creation");
    Ok(Repair {
        kind: "torn_segment_creation",
        damage: "segment_header".into(),
        segment: path.to_path_buf(),
        offset: 0,
        bytes: bytes.len() as u64,
        seq: expected_seq,
        evidence,
    })
}

/// Cut a torn tail at `offset`, after making its bytes durable as evidence (in a
/// preallocated segment, up to the last non-zero byte: the zeros after it are space
/// never written).
pub(crate) fn cut_torn_tail(
    path: &Path,
    bytes_from_offset: &[u8],
    offset: u64,
    damage: &Damage,
    layout: Layout,
) -> Result<Repair> {
    let bytes_from_offset = match layout {
        Layout::Appended => bytes_from_offset,
        Layout::Preallocated => {
            &bytes_from_offset[..bytes_from_offset.iter().rposition(|&b| b != 0).map_or(0, |p| p + 1)]
        }
    };
    let evidence = write_evidence(path, "torn-tail", offset, bytes_from_offset)?;
    fail::fail_point!("segment::truncate", |_| {
        Err(Error::io("truncate", path)(std::io::Error::other("injected truncate failure")))
    });
    let f = fs::OpenOptions::new().write(true).open(path).map_err(Error::io("open", path))?;
    f.set_len(offset).map_err(Error::io("truncate", path))?;
    f.sync_all().map_err(Error::io("fsync", path))?;
    tracing::warn!(segment = %path.display(), offset, bytes = bytes_from_offset.len(), evidence = %evidence.display(),
        "truncated a torn tail");
    Ok(Repair {
        kind: "torn_tail",
        damage: damage.kind.code().into(),
        segment: path.to_path_buf(),
        offset,
        bytes: bytes_from_offset.len() as u64,
        seq: damage.expected_seq,
        evidence,
    })
}

/// The error for damage that recovery refuses (rows R4 to R7 of FORMAT.md §6).
pub(crate) fn refusal(path: &Path, base: u64, d: &Damage, sealed: bool) -> Error {
    if classify(d.evidence(sealed)) == Action::RefuseRotten {
        let dir = path.parent().unwrap_or(Path::new("."));
        return Error::Corruption {
            segment: path.to_path_buf(),
            offset: base + d.offset,
            seq: d.expected_seq,
            detail: format!(
                "{}: a complete record that fails its checksum with no sign of a torn write (no zeroed \
                 sector): it may have been acknowledged, so it is not cut silently. If it is known to be \
                 lost, cut it and everything after it with `fencelog repair --dir {} --cut-from {}` \
                 (the cut bytes are kept as evidence)",
                d.kind.code(),
                dir.display(),
                d.expected_seq
            ),
        };
    }
    damage_error(path, base, d, if sealed { "in a sealed segment (later segments exist)" } else { "" })
}

pub(crate) fn damage_error(path: &Path, base: u64, d: &Damage, what: &str) -> Error {
    let resync = match d.resync_at {
        Some(o) => format!("; intact records follow at byte {}", base + o),
        None => String::new(),
    };
    Error::Corruption {
        segment: path.to_path_buf(),
        offset: base + d.offset,
        seq: d.expected_seq,
        detail: format!("{} {what}{resync}", d.kind.code()),
    }
}

/// Create a segment of format `version`: file, header, fsync the file and then the
/// directory. A preallocated (v2) segment is extended by the first append.
pub(crate) fn create_segment(dir: &Path, cursor: &Cursor, version: u16) -> Result<PathBuf> {
    use std::os::unix::fs::FileExt;
    let path = segment_path(dir, cursor.next_seq);
    fail::fail_point!("segment::create", |_| {
        Err(Error::io("create segment", &path)(std::io::Error::other("injected create failure")))
    });
    let f = super::dir::open_private(&path, true)?;
    let header = SegmentHeader { version, first_seq: cursor.next_seq, prev_link: cursor.prev_link }.encode();
    f.write_all_at(&header, 0).map_err(Error::io("write segment header", &path))?;
    f.sync_all().map_err(Error::io("fsync", &path))?;
    sync_dir(dir)?;
    Ok(path)
}

/// Recover the directory for writing. The caller holds the append lock.
pub(crate) fn recover(dir: &Path, opts: &LogOptions) -> Result<(TailState, OpenReport)> {
    // A commit group whose sync failed and could not be cut back: refused until
    // `repair` cuts it (its bytes may be in the page cache, not on the disk).
    super::halt::check(dir)?;
    let body_max = opts.body_max();
    let found = listing(dir)?;
    found.refuse_odd_names(dir)?;
    let mut segments = found.segments.clone();

    // The whole history, or nothing: every segment from genesis is present and
    // continues the one before (headers and seals: cheap, even when only the last
    // segment is verified below). Checked before R8, so that a torn last segment
    // is never set aside over a gap before it.
    check_history(dir, &segments, body_max)?;

    // R8: a last segment with a damaged header and no intact frame was torn during
    // creation → set aside. (Repeat: a crash loop could leave several.)
    let mut repairs = set_aside_torn_segments(dir, &mut segments, opts)?;

    if segments.is_empty() {
        return create_log(dir, opts, &found, repairs);
    }

    let start = match opts.verify_on_open {
        VerifyOnOpen::Full => 0,
        VerifyOnOpen::LastSegment => segments.len() - 1,
    };
    let mut cursor: Option<Cursor> = None;
    let mut records = 0u64;
    let mut tail = None;
    let mut fills = Vec::new();
    for (i, (name_seq, path)) in segments.iter().enumerate().skip(start) {
        let is_last = i + 1 == segments.len();
        let r = recover_segment(path, *name_seq, cursor.as_ref(), i == 0, is_last, opts)?;
        fills.push((path, r.index));
        records += r.records;
        repairs.extend(r.repair);
        cursor = Some(r.cursor);
        if is_last {
            tail = Some(TailState {
                segment: path.clone(),
                segment_first_seq: *name_seq,
                segment_len: r.len,
                layout: r.layout,
                alloc_len: r.alloc_len,
                cursor: r.cursor,
            });
        }
    }
    let tail = tail.expect("the last segment is always scanned");
    // Only a recovery that succeeded writes anything beside the segments.
    for (path, (known, found)) in fills {
        index::fill(path, &known, &found).map_err(Error::io("fdatasync", path))?;
    }
    let report = OpenReport {
        segments: segments.len(),
        records_verified: records,
        last_seq: tail.cursor.next_seq - 1,
        chain_head: hex(&tail.cursor.prev_link),
        repairs,
    };
    Ok((tail, report))
}

/// Set aside each last segment of `segments` that was torn during creation (R8),
/// dropping it from the list; what was set aside.
fn set_aside_torn_segments(dir: &Path, segments: &mut Vec<(u64, PathBuf)>, opts: &LogOptions) -> Result<Vec<Repair>> {
    let body_max = opts.body_max();
    let bytes_max = opts.segment_file_bytes_max();
    let mut repairs = Vec::new();
    while let Some((seq, path)) = segments.last().cloned() {
        let map = Mapped::open(&path, bytes_max, seq)?;
        match SegmentHeader::decode(map.bytes()) {
            Err(e) if is_torn_creation(map.bytes(), &e, body_max, seq) => {
                drop(map);
                repairs.push(set_aside_torn_segment(dir, &path, seq)?);
                segments.pop();
            }
            _ => break,
        }
    }
    Ok(repairs)
}

/// Create the log in `dir`, where `found` lists no segment (`repairs`: the torn
/// segments set aside before): only where no history was lost, when asked to
/// create, and never among other files. The state a writer continues from.
fn create_log(dir: &Path, opts: &LogOptions, found: &Listing, repairs: Vec<Repair>) -> Result<(TailState, OpenReport)> {
    found.refuse_lost_history(dir)?;
    if !opts.create {
        return Err(Error::no_log_here(dir));
    }
    if let Some(name) = &found.foreign {
        return Err(Error::NotALogDirectory {
            path: dir.into(),
            detail: format!("it holds no segment but holds {name:?}; refusing to create a log among other files"),
        });
    }
    let cursor = Cursor { next_seq: 1, prev_link: GENESIS_LINK };
    let header = SegmentHeader { version: opts.format_version, first_seq: 1, prev_link: GENESIS_LINK };
    let path = create_first_segment(dir, &header.encode())?;
    // After the first segment (so that either marks a log that existed): the
    // legacy lock file earlier builds lock, and the snapshot folder.
    super::dir::open_private(&dir.join(super::dir::LOCK_FILE), false)?;
    super::dir::create_dir_private(&dir.join(super::dir::SNAPSHOT_DIR))?;
    let tail = TailState {
        segment: path,
        segment_first_seq: 1,
        segment_len: SEGMENT_HEADER_BYTES as u64,
        layout: header.layout(),
        alloc_len: SEGMENT_HEADER_BYTES as u64,
        cursor,
    };
    let report = OpenReport { segments: 1, records_verified: 0, last_seq: 0, chain_head: hex(&GENESIS_LINK), repairs };
    Ok((tail, report))
}

/// One segment as recovery leaves it.
struct Recovered {
    /// Where its last intact record leaves the chain.
    cursor: Cursor,
    /// Where its frames end, and the file's length (past the frames, zeros).
    len: u64,
    alloc_len: u64,
    layout: Layout,
    /// Intact records verified in it.
    records: u64,
    /// The torn tail cut from it, if it had one.
    repair: Option<Repair>,
    /// Its position index as read, and the first record of each slot the scan
    /// passed: what [`index::fill`] writes once the whole recovery succeeded.
    index: (Vec<index::Position>, Vec<index::Position>),
}

/// Verify the segment at `path` (named for `name_seq`, after the segments that
/// leave the chain at `prev`) and apply the decision table to what its scan finds:
/// a torn tail is cut (bytes kept as evidence); anything else is refused.
fn recover_segment(
    path: &Path,
    name_seq: u64,
    prev: Option<&Cursor>,
    is_first: bool,
    is_last: bool,
    opts: &LogOptions,
) -> Result<Recovered> {
    let body_max = opts.body_max();
    let map = Mapped::open(path, opts.segment_file_bytes_max(), name_seq)?;
    let bytes = map.bytes();
    let expected_seq = prev.map_or(name_seq, |c| c.next_seq);
    let header = SegmentHeader::decode(bytes).map_err(|e| header_error(path, e, expected_seq))?;
    check_header_continuity(path, name_seq, &header, prev, is_first)?;
    let first = Cursor { next_seq: header.first_seq, prev_link: header.prev_link };
    let (mut len, mut alloc_len) = (bytes.len() as u64, bytes.len() as u64);
    let layout = header.layout();
    // Verifying only the last segment (a ledger's open): its frames are checked
    // from the newest place its position index proves (§3b; else from its
    // start) to their end, and the chain is left to the reader that applies the
    // records (from the snapshot it boots from on), as for the sealed segments
    // before it.
    let chain_from = match opts.verify_on_open {
        VerifyOnOpen::Full => 0,
        VerifyOnOpen::LastSegment => u64::MAX,
    };
    let indexed = index::read(path, name_seq, crate::format::SEGMENT_BYTES_HARD_MAX);
    let hint = (chain_from == u64::MAX && is_last)
        .then(|| {
            index::proven(&indexed, u64::MAX, |p| {
                usize::try_from(p.offset).is_ok_and(|o| o < bytes.len() && index::proves(&bytes[o..], p, body_max))
            })
        })
        .flatten();
    let scan = |from: usize, c: Cursor| scan_frames(bytes, from, c, body_max, layout, chain_from);
    let mut scanned = match hint {
        Some(p) => scan(p.offset as usize, p.cursor),
        None => scan(SEGMENT_HEADER_BYTES, first),
    };
    // An entry only says where to start. Damage met from there is judged on a
    // scan from the segment's first frame, which decides what is cut or refused:
    // a stale or damaged entry never costs a record. (What a forged entry over a
    // crafted payload can still do is in FORMAT.md §3b.)
    if hint.is_some() && matches!(scanned.outcome, ScanOutcome::Damaged(_)) {
        scanned = scan(SEGMENT_HEADER_BYTES, first);
    }
    let Scanned { outcome, cursor: c, records, slots } = scanned;
    let mut repair = None;
    match outcome {
        ScanOutcome::Clean => {}
        ScanOutcome::ZeroTail { offset } if is_last => len = offset,
        ScanOutcome::ZeroTail { offset } => return Err(sealed_zero_tail(path, offset, c.next_seq)),
        ScanOutcome::Damaged(d) if classify(d.evidence(!is_last)) == Action::CutTornTail => {
            repair = Some(cut_torn_tail(path, &bytes[d.offset as usize..], d.offset, &d, layout)?);
            (len, alloc_len) = (d.offset, d.offset);
        }
        ScanOutcome::Damaged(d) => return Err(refusal(path, 0, &d, !is_last)),
    }
    let index = (indexed, slots);
    Ok(Recovered { cursor: c, len, alloc_len, layout, records, repair, index })
}

/// What a scan of a segment's frames found.
struct Scanned {
    outcome: ScanOutcome,
    /// Where its last intact record leaves the chain.
    cursor: Cursor,
    /// Intact records verified.
    records: u64,
    /// The first record of each index slot it passed (§3b).
    slots: Vec<index::Position>,
}

/// Scan the frames of a segment's `bytes` from byte `from`, where the chain is at
/// `c`, checking links from sequence `chain_from` on (0: every link, by helper
/// threads too, and then `from` is the first frame).
fn scan_frames(bytes: &[u8], from: usize, c: Cursor, body_max: u32, layout: Layout, chain_from: u64) -> Scanned {
    let (mut cursor, mut records) = (c, 0u64);
    let (mut slots, mut prev_link) = (index::SlotFinder::from(from as u64), c.prev_link);
    let count = |at: u64, r: &crate::format::RecordRef<'_>| {
        records += 1;
        slots.visit(at, &Cursor { next_seq: r.seq, prev_link });
        prev_link = r.link;
    };
    // Links checked ahead by helper threads only where links are checked at all.
    let scanned = |ahead: Option<&crate::format::LinksAhead<'_>>| {
        scan_segment_frames_ahead(bytes, from, 0, &mut cursor, body_max, layout, chain_from, ahead, count)
    };
    let outcome = match chain_from {
        0 => with_links_ahead(bytes, from, c.prev_link, body_max, scanned),
        _ => scanned(None),
    };
    Scanned { outcome, cursor, records, slots: slots.found }
}

/// A sealed segment is cut to its last record before the next one is created, so
/// zeros after its frames mean it was extended or altered afterwards.
pub(crate) fn sealed_zero_tail(path: &Path, offset: u64, seq: u64) -> Error {
    Error::Corruption {
        segment: path.to_path_buf(),
        offset,
        seq,
        detail: "zeros after the last record of a sealed segment (a sealed segment ends exactly with its last \
                 record)"
            .into(),
    }
}

/// The header must match the file name and continue the chain of the segment before.
pub(crate) fn check_header_continuity(
    path: &Path,
    name_seq: u64,
    header: &SegmentHeader,
    prev: Option<&Cursor>,
    is_first_segment: bool,
) -> Result<()> {
    let refuse = |detail: String| {
        Err(Error::Corruption { segment: path.to_path_buf(), offset: 0, seq: header.first_seq, detail })
    };
    if header.first_seq != name_seq {
        return refuse(format!("header says first sequence {} but the file is named for {name_seq}", header.first_seq));
    }
    match prev {
        Some(c) if c.next_seq != header.first_seq => refuse(format!(
            "segment starts at sequence {} but the previous one ends at {}",
            header.first_seq,
            c.next_seq - 1
        )),
        Some(c) if c.prev_link != header.prev_link => refuse(format!(
            "segment header chain link {} does not match the previous segment's head {}",
            hex(&header.prev_link),
            hex(&c.prev_link)
        )),
        None if is_first_segment && (header.first_seq != 1 || header.prev_link != GENESIS_LINK) => {
            refuse("the first segment does not start at sequence 1 with the genesis link (a segment is missing)".into())
        }
        _ => Ok(()),
    }
}
