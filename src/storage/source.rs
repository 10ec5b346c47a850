//! What the readers of a whole history read (the inspector, the audit, `export`):
//! a log directory, or a log in etcd —
//! with, when its older records were archived (`fencelog archive`), the archive
//! directory that holds them, read as one history. Nothing here writes.

use std::path::{Path, PathBuf};

use super::snapshots::SnapshotMeta;
use super::{Error, Location, ReadSummary, RecordReader, ScanItem, Tailer, list_segments, scan_dir};
use crate::format::BODY_BYTES_HARD_MAX;
#[cfg(feature = "etcd")]
use crate::format::ChainLink;

pub enum Source {
    Dir(PathBuf),
    #[cfg(feature = "etcd")]
    Etcd {
        log: Box<crate::storage::etcd::EtcdBackend>,
        archive: Option<PathBuf>,
    },
}

/// A snapshot as the inspector checks it: its description (or why it could not be
/// read) and where it is.
pub struct StoredSnapshot {
    pub meta: std::result::Result<SnapshotMeta, String>,
    pub place: PathBuf,
}

impl Source {
    /// Open what `location` names, reading only (an etcd log is checked to be one
    /// first: `NOT_A_LOG` otherwise). `archive` is read as the history before an
    /// etcd log's oldest record.
    #[cfg_attr(not(feature = "etcd"), allow(unused_mut, unused_variables))]
    pub fn open(location: &Location, archive: Option<&Path>) -> Result<Source, Error> {
        match location {
            Location::Dir(d) => Ok(Source::Dir(d.clone())),
            #[cfg(feature = "etcd")]
            Location::Etcd(e) => {
                // Unchecked: the inspector reports damage at the history's ends
                // (its scan checks them) rather than refusing to open.
                let log =
                    crate::storage::etcd::EtcdBackend::open_unchecked(e, &location.log_options(Default::default()))?;
                Ok(Source::Etcd { log: Box::new(log), archive: archive.map(Path::to_path_buf) })
            }
        }
    }

    /// The log directory, when the source is one.
    pub fn dir(&self) -> Option<&Path> {
        match self {
            Source::Dir(d) => Some(d),
            #[cfg(feature = "etcd")]
            Source::Etcd { .. } => None,
        }
    }

    /// For messages and for problems that concern the whole log.
    pub fn label(&self) -> PathBuf {
        match self {
            Source::Dir(d) => d.clone(),
            #[cfg(feature = "etcd")]
            Source::Etcd { log, .. } => log.options().describe().into(),
        }
    }

    /// Every intact record and every damaged region from `from_seq` on, in log
    /// order (see `storage::scan_dir`); for etcd with an archive, the archive's
    /// records first, then etcd's, checked to continue them.
    #[cfg_attr(not(feature = "etcd"), allow(unused_mut, unused_variables))]
    pub fn scan(&self, from_seq: u64, mut on: impl FnMut(ScanItem<'_>) -> bool) -> Result<ReadSummary, Error> {
        let body_max = BODY_BYTES_HARD_MAX;
        match self {
            Source::Dir(d) => scan_dir(d, from_seq, body_max, on),
            #[cfg(feature = "etcd")]
            Source::Etcd { log, archive } => {
                let below = log.archived().map(|a| a.below_seq);
                let (Some(archive), Some(below)) = (archive, below.filter(|b| from_seq < *b)) else {
                    return log.scan(from_seq, on);
                };
                let mut stopped = false;
                let mut last: Option<(u64, ChainLink)> = None;
                let mut sum = scan_dir(archive, from_seq, body_max, |item| {
                    if let ScanItem::Record { rec, .. } = &item {
                        if rec.seq >= below {
                            return false;
                        }
                        last = Some((rec.seq, rec.link));
                    }
                    let go = on(item);
                    stopped = !go;
                    go
                })?;
                if stopped {
                    return Ok(sum);
                }
                let marker = log.archived().expect("archived");
                if last != Some((below - 1, marker.link)) {
                    let detail = format!(
                        "the archive ends at {} but etcd continues from {} with the link of record {} = {}: this is \
                         not the archive of this log, or not all of it",
                        last.map_or_else(
                            || "nothing".into(),
                            |(s, l)| format!("{s} (link {})", crate::format::hex(&l))
                        ),
                        below,
                        below - 1,
                        crate::format::hex(&marker.link)
                    );
                    let p = crate::storage::Problem::at(
                        crate::storage::ProblemKind::ArchiveMismatch,
                        archive,
                        0,
                        below,
                        detail,
                    );
                    sum.problems.push(p);
                    if !on(ScanItem::Damage(sum.problems.last().expect("pushed"))) {
                        return Ok(sum);
                    }
                }
                let rest = log.scan(below, on)?;
                sum.absorb(rest);
                Ok(sum)
            }
        }
    }

    /// A verifying reader from `from_seq` on (`follow`, the daemon's watch).
    pub fn reader(&self, from_seq: u64) -> Box<dyn RecordReader> {
        match self {
            Source::Dir(d) => Box::new(Tailer::new(d, BODY_BYTES_HARD_MAX, from_seq)),
            #[cfg(feature = "etcd")]
            Source::Etcd { log, .. } => crate::storage::LogBackend::reader(log.as_ref(), from_seq),
        }
    }

    /// What changes when anything is appended (`verify` reads a log that changed
    /// while it read it again).
    pub fn fingerprint(&self) -> Vec<u8> {
        match self {
            Source::Dir(d) => dir_fingerprint(d),
            #[cfg(feature = "etcd")]
            Source::Etcd { log, .. } => crate::storage::LogBackend::head(log.as_ref())
                .map(|h| [h.seq.to_le_bytes().as_slice(), &h.link].concat())
                .unwrap_or_default(),
        }
    }

    /// The snapshots stored with the log (only described: a body is read only to
    /// be checked).
    pub fn snapshots(&self) -> Vec<StoredSnapshot> {
        use crate::storage::snapshots as stored;
        match self {
            Source::Dir(d) => {
                stored::list_files(d).into_iter().map(|p| StoredSnapshot { meta: stored::peek(&p), place: p }).collect()
            }
            #[cfg(feature = "etcd")]
            Source::Etcd { log, .. } => {
                let (metas, warnings) = crate::storage::LogBackend::newest_snapshots(log.as_ref());
                let mut out: Vec<StoredSnapshot> =
                    metas.into_iter().map(|m| StoredSnapshot { place: m.source.clone().into(), meta: Ok(m) }).collect();
                out.extend(warnings.into_iter().map(|w| StoredSnapshot { place: self.label(), meta: Err(w) }));
                out
            }
        }
    }

    /// The first bytes of a snapshot's body (its schema tag).
    pub fn snapshot_prefix(&self, s: &StoredSnapshot, n: usize) -> std::result::Result<Vec<u8>, String> {
        match self {
            Source::Dir(_) => crate::storage::snapshots::body_prefix(&s.place, n),
            #[cfg(feature = "etcd")]
            Source::Etcd { log, .. } => {
                let meta = s.meta.as_ref().map_err(Clone::clone)?;
                let body = crate::storage::LogBackend::snapshot_body(log.as_ref(), meta)?;
                Ok(body[..n.min(body.len())].to_vec())
            }
        }
    }

    /// The segment files, for `stat` (none for etcd).
    pub fn segments(&self) -> Vec<(u64, PathBuf)> {
        match self {
            Source::Dir(d) => list_segments(d).unwrap_or_default(),
            #[cfg(feature = "etcd")]
            Source::Etcd { .. } => vec![],
        }
    }
}

/// What changes when anything is appended to a log directory: the segments and
/// their lengths, and the content of the last one (a preallocated segment keeps its
/// length while appends overwrite its zeros) — read as every reader reads a
/// segment (never through a symlink, never a FIFO or device, never more than a
/// segment may hold).
fn dir_fingerprint(dir: &Path) -> Vec<u8> {
    // A directory the scan reports problems with (odd names, say) has no fingerprint.
    let segments = list_segments(dir).unwrap_or_default();
    let mut out = Vec::new();
    for (s, p) in &segments {
        out.extend_from_slice(&s.to_le_bytes());
        out.extend_from_slice(&std::fs::symlink_metadata(p).map_or(0, |m| m.len()).to_le_bytes());
    }
    let last = segments.last().map_or(0, |(_, p)| super::segment_fingerprint(p, BODY_BYTES_HARD_MAX));
    out.extend_from_slice(&last.to_le_bytes());
    out
}
