//! Creating a log on purpose (`init`) and cutting damage on purpose (`repair`).
//! Recovery never cuts a record that may have been acknowledged; `repair` does,
//! only when asked, and keeps every byte it cuts as evidence.

use std::path::{Path, PathBuf};

use serde::Serialize;

use super::dir::{EVIDENCE_INFIX, sync_dir, write_evidence};
use super::lock::AppendLock;
use super::reader::{ScanItem, verify_dir};
use super::writer::Log;
use crate::storage::error::{Error, Result};
use crate::storage::options::LogOptions;
use crate::storage::problem::{Problem, ProblemKind};

/// What `init` did.
#[derive(Debug, Clone, Serialize)]
pub struct InitReport {
    pub dir: PathBuf,
    pub last_seq: u64,
    pub chain_head: String,
    /// Torn tails cut while opening an existing log (empty for a new one).
    pub repairs: Vec<super::recovery::Repair>,
}

/// Create a log in `dir` (missing or empty; never among other files). On a
/// directory that already holds a log, open it as any writer would (a torn tail is
/// cut, its bytes kept as evidence) and report what was found and done.
pub fn init(dir: &Path, opts: LogOptions) -> Result<InitReport> {
    let log = Log::open(dir, LogOptions { create: true, ..opts })?;
    let r = log.open_report().clone();
    log.close()?;
    Ok(InitReport { dir: dir.to_path_buf(), last_seq: r.last_seq, chain_head: r.chain_head, repairs: r.repairs })
}

/// One cut made by `repair`.
#[derive(Debug, Clone, Serialize)]
pub struct Cut {
    pub segment: PathBuf,
    pub offset: u64,
    pub bytes: u64,
    pub evidence: PathBuf,
}

/// What `repair` did.
#[derive(Debug, Clone, Serialize)]
pub struct RepairReport {
    pub dir: PathBuf,
    pub cut_from_seq: u64,
    /// The first damage found (kind, segment, offset, sequence).
    pub damage: Problem,
    pub cuts: Vec<Cut>,
    /// Snapshots of state that included cut records, renamed to evidence names.
    pub snapshots_set_aside: Vec<PathBuf>,
    /// The log after the cut.
    pub last_seq: u64,
    pub chain_head: String,
    pub intact: bool,
}

/// Cut the log from record `cut_from_seq` on: the bytes from that record to the end
/// of its segment go to an evidence file, and every later segment is renamed to an
/// evidence name, whole. Only a damaged log is repaired, and only from the first
/// damaged record or earlier (cutting after the damage would leave it in place).
pub fn repair(dir: &Path, cut_from_seq: u64, opts: &LogOptions) -> Result<RepairReport> {
    super::history::check_whole_history(dir, opts.body_max()).or_else(|e| match e {
        Error::Corruption { .. } | Error::SyncFailed { .. } => Ok(()), // what repair is for
        other => Err(other),
    })?;
    let lock = AppendLock::open(dir)?;
    let _held = lock.acquire(opts.lock_wait_ms_max)?;
    let found = find_damage(dir, cut_from_seq, opts)?;
    let (segment, offset) = cut_place(dir, cut_from_seq, &found.damage, found.at)?;
    let cuts = cut(dir, &segment, offset, found.damage.seq, opts)?;
    sync_dir(dir)?;
    // What is left ends before the cut, and is durable (the cut is synced).
    lock.set_durable_mark(cut_from_seq.saturating_sub(1));
    if found.halted.is_some() {
        // The records in doubt are cut (and that is durable): the log is whole again.
        super::halt::clear(dir)?;
    }
    // Snapshots of state that included the cut records describe a history the log
    // no longer has: set aside too (never adopted, never read as "records cut").
    let snapshots_set_aside = set_aside_snapshots(dir, cut_from_seq)?;
    drop(_held);
    tracing::warn!(dir = %dir.display(), cut_from_seq, "repair cut the log; the cut bytes are kept as evidence");
    // What was cut is reported whatever the log looks like afterwards.
    let after = verify_dir(dir, opts.body_max()).ok();
    Ok(RepairReport {
        dir: dir.to_path_buf(),
        cut_from_seq,
        damage: found.damage,
        cuts,
        snapshots_set_aside,
        last_seq: after.as_ref().and_then(|a| a.last_seq).unwrap_or(0),
        chain_head: after.as_ref().map_or_else(String::new, |a| a.chain_head.clone()),
        intact: after.is_some_and(|a| a.is_intact()),
    })
}

/// What `repair` found to cut.
struct Found {
    /// The first damage: a damaged record, or the commit group whose sync failed.
    damage: Problem,
    /// Where record `cut_from_seq` starts (segment, offset), if the scan met it intact.
    at: Option<(PathBuf, u64)>,
    /// The marker of a commit group whose sync failed (segment, offset, sequence).
    halted: Option<(PathBuf, u64, u64)>,
}

/// The first damage of the log in `dir` (a commit group whose sync failed counts),
/// and where record `cut_from_seq` starts; an intact log is `NOTHING_TO_REPAIR`.
fn find_damage(dir: &Path, cut_from_seq: u64, opts: &LogOptions) -> Result<Found> {
    let mut at: Option<(PathBuf, u64)> = None;
    let mut damage = None;
    // Under the lock, to find what to cut: nothing is answered from what it reads.
    super::reader::scan_dir_with(dir, 1, opts.body_max(), super::reader::ReadSync::Never, |item| match item {
        ScanItem::Record { rec, segment, offset } => {
            if rec.seq == cut_from_seq {
                at = Some((segment.to_path_buf(), offset));
            }
            true
        }
        // Taken from the marker below (the scan reports it before any record).
        ScanItem::Damage(p) if p.kind == ProblemKind::SyncFailed => true,
        ScanItem::Damage(p) => {
            damage = Some(p.clone());
            false
        }
    })?;
    // A commit group whose sync failed and could not be cut back is damage there,
    // however intact its bytes read from the page cache.
    let halted = super::halt::halted_at(dir);
    if let Some((_, _, 0)) = &halted {
        return Err(Error::InvalidOption {
            detail: format!(
                "{} does not name a place in this log: check the log (fencelog inspect verify) and move the file \
                 away by hand",
                dir.join(super::halt::SYNC_FAILED_FILE).display()
            ),
        });
    }
    if let Some((segment, offset, seq)) = &halted
        && damage.as_ref().is_none_or(|d| d.seq > *seq)
    {
        let detail = format!("the sync of the group from sequence {seq} failed and it was not cut back");
        damage = Some(Problem::at(ProblemKind::SyncFailed, segment, *offset, *seq, detail));
    }
    let Some(damage) = damage else {
        return Err(Error::NothingToRepair {
            detail: "the log is intact: there is nothing to repair (repair cuts only a damaged log)".into(),
        });
    };
    Ok(Found { damage, at, halted })
}

/// Where the cut from `cut_from_seq` starts (segment, offset), once it is one that
/// mends `damage`: a damaged record (not a file that is no segment), from the first
/// damage or earlier, never the whole history, within the segment's bytes.
fn cut_place(dir: &Path, cut_from_seq: u64, damage: &Problem, at: Option<(PathBuf, u64)>) -> Result<(PathBuf, u64)> {
    // Damage a cut cannot mend: a file that is not a segment at all.
    if matches!(damage.kind, ProblemKind::UnsafeSegment | ProblemKind::OddSegmentName) {
        return Err(Error::InvalidOption {
            detail: format!(
                "the damage is {} ({}): not a damaged record a cut can remove; move that file away",
                damage.kind,
                damage.segment.display()
            ),
        });
    }
    if cut_from_seq == 0 || cut_from_seq > damage.seq {
        return Err(Error::InvalidOption {
            detail: format!(
                "the first damage is at sequence {} ({} in {} at byte {}); cut from {} or earlier",
                damage.seq,
                damage.kind,
                damage.segment.display(),
                damage.offset,
                damage.seq
            ),
        });
    }
    let (segment, offset) = if cut_from_seq == damage.seq {
        (damage.segment.clone(), damage.offset)
    } else {
        at.ok_or_else(|| Error::NotFound { detail: format!("record {cut_from_seq} was not found") })?
    };
    if offset == 0 && segment == super::dir::segment_path(dir, 1) {
        return Err(Error::InvalidOption {
            detail: "the first segment's header is damaged: cutting it would remove the whole history; \
                     restore the segment from a copy"
                .into(),
        });
    }
    let held = super::dir::stat_path(&segment).map_err(Error::io("stat", &segment))?.len;
    if offset > held {
        return Err(Error::InvalidOption {
            detail: format!("{} is {held} bytes: there is nothing at byte {offset} to cut from", segment.display()),
        });
    }
    Ok((segment, offset))
}

/// Make the cut at `offset` of `segment` (a segment of `dir`), keeping every byte
/// cut as evidence: every later segment set aside whole, then the segment itself
/// (whole from offset 0, else its bytes from `offset` on, and the kept prefix
/// rewritten). `damage_seq` is the sequence a refused read of the segment names.
fn cut(dir: &Path, segment: &Path, offset: u64, damage_seq: u64, opts: &LogOptions) -> Result<Vec<Cut>> {
    let mut cuts = Vec::new();
    let segments = super::dir::listing(dir)?.segments;
    // Later segments by their sequence (names from this listing), never by comparing
    // paths of different forms.
    let cut_seq = segment
        .file_name()
        .and_then(|n| n.to_str())
        .and_then(super::dir::segment_seq)
        .filter(|_| {
            segment.parent() == Some(dir)
                || segment.parent().and_then(|p| p.canonicalize().ok()) == dir.canonicalize().ok()
        })
        .ok_or_else(|| Error::InvalidOption {
            detail: format!("{} is not a segment of {}", segment.display(), dir.display()),
        })?;
    let segment = super::dir::segment_path(dir, cut_seq);
    for (_, path) in segments.iter().filter(|(s, _)| *s > cut_seq) {
        cuts.push(set_aside_whole(dir, path)?);
    }
    if offset == 0 {
        cuts.push(set_aside_whole(dir, &segment)?);
    } else {
        let bytes = super::dir::read_regular(&segment, opts.segment_file_bytes_max(), damage_seq)?;
        let mut tail = &bytes[(offset as usize).min(bytes.len())..];
        if crate::format::SegmentHeader::decode(&bytes).is_ok_and(|h| h.layout() == crate::format::Layout::Preallocated)
        {
            // The zeros of the preallocated space after the written bytes are not evidence.
            tail = &tail[..tail.iter().rposition(|&b| b != 0).map_or(0, |p| p + 1)];
        }
        let evidence = write_evidence(&segment, "repair-cut", offset, tail)?;
        // A new file holding the kept prefix replaces the segment (never a cut in
        // place): a reader may have this segment mapped — it takes no lock — and
        // keeps reading the old file whole instead of dying of SIGBUS.
        super::dir::rewrite_prefix(&segment, offset)?;
        // Entries past the cut name nothing now (they would prove nothing either).
        let _ = std::fs::remove_file(super::index::index_path(&segment));
        cuts.push(Cut { segment: segment.clone(), offset, bytes: tail.len() as u64, evidence });
    }
    Ok(cuts)
}

/// Rename every snapshot of state at `cut_from_seq` or later to an evidence name;
/// the names they were given.
fn set_aside_snapshots(dir: &Path, cut_from_seq: u64) -> Result<Vec<PathBuf>> {
    let mut snapshots_set_aside = Vec::new();
    let sdir = dir.join(super::dir::SNAPSHOT_DIR);
    for e in std::fs::read_dir(&sdir).into_iter().flatten().filter_map(|e| e.ok()) {
        let name = e.file_name().to_string_lossy().into_owned();
        let covers = name.strip_suffix(".snap").and_then(|n| n.parse::<u64>().ok());
        if covers.is_some_and(|seq| seq >= cut_from_seq) {
            let to = sdir.join(format!("{name}{EVIDENCE_INFIX}repair-cut"));
            std::fs::rename(e.path(), &to).map_err(Error::io("rename to evidence", e.path()))?;
            snapshots_set_aside.push(to);
        }
    }
    if !snapshots_set_aside.is_empty() {
        sync_dir(&sdir)?;
    }
    Ok(snapshots_set_aside)
}

fn set_aside_whole(dir: &Path, path: &Path) -> Result<Cut> {
    let bytes = std::fs::metadata(path).map_err(Error::io("stat", path))?.len();
    let evidence = super::dir::evidence_path(path, "repair-whole", 0);
    fail::fail_point!("segment::rename", |_| {
        Err(Error::io("rename to evidence", path)(std::io::Error::other("injected rename failure")))
    });
    std::fs::rename(path, &evidence).map_err(Error::io("rename to evidence", path))?;
    let _ = std::fs::remove_file(super::index::index_path(path));
    sync_dir(dir)?;
    Ok(Cut { segment: path.to_path_buf(), offset: 0, bytes, evidence })
}
