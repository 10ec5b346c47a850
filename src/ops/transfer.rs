//! Moving a log between a directory and etcd, byte for byte, and keeping etcd's
//! keyspace bounded (`fencelog export`, `import`, `archive`; `docs/DISTRIBUTED.md`).
//! The frames move as they are — sequence, writer, time, chain link — so the chain
//! head is the same on both sides, and a head pinned on one verifies on the other.
//! Nothing is moved from a log that does not verify.

use std::path::{Path, PathBuf};

use serde::Serialize;

use super::OpError;
use crate::format::{ChainLink, FRAME_HEADER_BYTES, GENESIS_LINK, RecordRef, chain_link, decode_frame, hex};
use crate::storage::etcd::{EtcdBackend, EtcdOptions, Import};
use crate::storage::export::SegmentSink;
use crate::storage::{Error, Head, LogOptions, ScanItem, Source, verify_dir};

/// A record's frame as stored: length, CRC-32 of the body, the body.
fn frame_of(rec: &RecordRef<'_>) -> Vec<u8> {
    let mut f = Vec::with_capacity(FRAME_HEADER_BYTES + rec.body.len());
    f.extend_from_slice(&(rec.body.len() as u32).to_le_bytes());
    f.extend_from_slice(&crc32fast::hash(rec.body).to_le_bytes());
    f.extend_from_slice(rec.body);
    f
}

fn refused_damage(p: &crate::storage::Problem) -> OpError {
    OpError::from(Error::Corruption {
        segment: p.segment.clone(),
        offset: p.offset,
        seq: p.seq,
        detail: format!("{}: {}; nothing is moved from a log that does not verify", p.kind, p.detail),
    })
}

#[derive(Debug, Clone, Serialize)]
pub struct ExportReport {
    pub from: String,
    pub to: PathBuf,
    pub records: u64,
    pub last_seq: u64,
    /// The chain head of the last record: the same on both sides.
    pub chain_head: String,
}

/// Write the whole history of `src` (an etcd log, with its archive if its older
/// records were archived) as segment files in `to` (missing or empty), then verify
/// them: `inspect verify TO` gives the same chain head.
pub fn export(src: &Source, to: &Path) -> Result<ExportReport, OpError> {
    let mut sink = SegmentSink::create(to, 1, GENESIS_LINK)?;
    let mut failed: Option<OpError> = None;
    let summary = src.scan(1, |item| match item {
        ScanItem::Record { rec, .. } => match sink.push(rec.seq, &frame_of(rec), &rec.link) {
            Ok(()) => true,
            Err(e) => {
                failed = Some(e.into());
                false
            }
        },
        ScanItem::Damage(p) => {
            failed = Some(refused_damage(p));
            false
        }
    })?;
    if let Some(e) = failed {
        return Err(e);
    }
    let records = sink.finish()?;
    let check = verify_dir(to, LogOptions::default().body_max())?;
    if !check.is_intact() || check.chain_head != summary.chain_head {
        return Err(OpError::Io {
            message: format!(
                "the export in {} does not verify to the source's chain head {} ({:?})",
                to.display(),
                summary.chain_head,
                check.problems.first()
            ),
        });
    }
    Ok(ExportReport {
        from: src.label().display().to_string(),
        to: to.to_path_buf(),
        records,
        last_seq: summary.last_seq.unwrap_or(0),
        chain_head: summary.chain_head,
    })
}

#[derive(Debug, Clone, Serialize)]
pub struct ImportReport {
    pub from: PathBuf,
    pub to: String,
    pub records: u64,
    pub last_seq: u64,
    pub chain_head: String,
}

/// Move the log in `dir` (which must verify intact: a torn tail is cut by any
/// writer first) into the empty prefix `etcd` names, record for record; the
/// prefix becomes a log only once every record is in (its marker goes last).
pub fn import(dir: &Path, etcd: &EtcdOptions) -> Result<ImportReport, OpError> {
    let body_max = LogOptions::default().body_max();
    crate::storage::check_whole_history(dir, body_max)?;
    let src = Source::Dir(dir.to_path_buf());
    // Checked whole before anything is written.
    let check = src.scan(1, |_| true)?;
    if let Some(p) = check.problems.first() {
        return Err(refused_damage(p));
    }
    let mut import = Import::begin(etcd)?;
    let mut failed: Option<OpError> = None;
    let mut records = 0;
    src.scan(1, |item| {
        let ScanItem::Record { rec, .. } = item else { return true };
        match import.push(rec.seq, frame_of(rec), &rec.link) {
            Ok(()) => {
                records += 1;
                true
            }
            Err(e) => {
                failed = Some(e.into());
                false
            }
        }
    })?;
    if let Some(e) = failed {
        return Err(e);
    }
    let Head { seq: last_seq, link } = import.finish()?;
    if hex(&link) != check.chain_head {
        return Err(OpError::Io { message: format!("imported up to {last_seq}, but the chain head differs") });
    }
    Ok(ImportReport { from: dir.to_path_buf(), to: etcd.describe(), records, last_seq, chain_head: hex(&link) })
}

#[derive(Debug, Clone, Serialize)]
pub struct ArchiveReport {
    pub etcd: String,
    pub to: PathBuf,
    /// The newest snapshot the chain vouches for: records before it are archived
    /// (it and what follows stay in etcd).
    pub snapshot_seq: Option<u64>,
    /// Records moved this time: `from_seq..below_seq`.
    pub from_seq: u64,
    pub below_seq: u64,
    pub records: u64,
    pub keys_deleted: u64,
}

/// Move the records of the etcd log below the newest snapshot the chain vouches
/// for into archive segments in `to` (the same frames, the same chain; a new
/// directory the first time, the same one after), make them durable and check
/// them, and only then mark them archived and delete their keys.
pub fn archive(etcd: &EtcdOptions, to: &Path) -> Result<ArchiveReport, OpError> {
    let location = crate::storage::Location::Etcd(etcd.clone());
    let opts = crate::ledger::LedgerOptions::default();
    let view = crate::ledger::Ledger::read_only_at(&location, &opts)?;
    let mut log = EtcdBackend::open(etcd, &location.log_options(LogOptions::default()))?;
    let first = log.archived().map_or(1, |a| a.below_seq);
    let report = |from_seq, below_seq, records, keys_deleted| ArchiveReport {
        etcd: etcd.describe(),
        to: to.to_path_buf(),
        snapshot_seq: view.snapshot_seq,
        from_seq,
        below_seq,
        records,
        keys_deleted,
    };
    // Record S itself stays: a replay from the snapshot at S reads its link.
    let below = view.snapshot_seq.unwrap_or(0);
    if below <= first {
        return Ok(report(first, first, 0, 0));
    }
    let mut sink = archive_sink(&log, to, first)?;
    let prev = copy_frames(&log, etcd, &mut sink, first, below)?;
    let records = sink.finish()?;
    let held = verify_dir(to, LogOptions::default().body_max())?;
    if !held.is_intact() || held.last_seq != Some(below - 1) || held.chain_head != hex(&prev) {
        return Err(OpError::Io {
            message: format!("the archive in {} does not verify up to {}: nothing deleted", to.display(), below - 1),
        });
    }
    let keys_deleted = log.set_archived(below, &prev)?;
    Ok(report(first, below, records, keys_deleted))
}

/// Where the archive goes on from record `first`: a new one in `to` when nothing
/// was archived yet, else the one there, checked to end right before `first`.
fn archive_sink(log: &EtcdBackend, to: &Path, first: u64) -> Result<SegmentSink, OpError> {
    Ok(if first == 1 {
        SegmentSink::create(to, 1, GENESIS_LINK)?
    } else {
        // The archive there must end right where etcd's records begin.
        let marker = log.archived().expect("archived before");
        let held = verify_dir(to, LogOptions::default().body_max())?;
        if !held.is_intact() || held.last_seq != Some(first - 1) || held.chain_head != hex(&marker.link) {
            return Err(OpError::Usage {
                code: "INVALID_OPTION",
                message: format!(
                    "{} is not this log's archive up to {}: it ends at {:?} (chain head {}), not {} ({})",
                    to.display(),
                    first - 1,
                    held.last_seq,
                    held.chain_head,
                    first - 1,
                    hex(&marker.link)
                ),
            });
        }
        SegmentSink::continuing(to, first, marker.link)
    })
}

/// Push the frames `first..below` of the etcd log into `sink`, each checked whole
/// and following the one before; the chain link of the last.
fn copy_frames(
    log: &EtcdBackend,
    etcd: &EtcdOptions,
    sink: &mut SegmentSink,
    first: u64,
    below: u64,
) -> Result<ChainLink, OpError> {
    let mut prev: ChainLink = sink.next().1;
    log.frames(first, below - 1, |seq, frame| {
        let (rec, used) = decode_frame(frame, crate::format::BODY_BYTES_HARD_MAX).map_err(|e| Error::Corruption {
            segment: log_key(etcd, seq),
            offset: 0,
            seq,
            detail: format!("record {seq} is damaged: {e:?}; nothing is archived from a log that does not verify"),
        })?;
        if used != frame.len()
            || rec.seq != seq
            || chain_link(&prev, rec.seq, &rec.writer, rec.time_ms, rec.payload) != rec.link
        {
            return Err(Error::Corruption {
                segment: log_key(etcd, seq),
                offset: 0,
                seq,
                detail: "the record does not follow the one before: nothing is archived".into(),
            });
        }
        prev = rec.link;
        sink.push(seq, frame, &rec.link)
    })?;
    Ok(prev)
}

fn log_key(etcd: &EtcdOptions, seq: u64) -> PathBuf {
    format!("{}r/{seq:020}", etcd.describe()).into()
}
