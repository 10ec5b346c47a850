//! The log directory: naming, listing, permissions, directory fsync, evidence files.

use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use super::error::{Error, Result};

pub const LOCK_FILE: &str = "LOCK";
pub const SNAPSHOT_DIR: &str = "snapshots";
const SEGMENT_SUFFIX: &str = ".seg";
/// Evidence files are named `<segment>.seg<EVIDENCE_INFIX><what>-<offset>`.
pub const EVIDENCE_INFIX: &str = ".evidence.";

/// `dir/<first_seq, 20 digits>.seg`: lexical order is sequence order.
pub fn segment_path(dir: &Path, first_seq: u64) -> PathBuf {
    dir.join(format!("{first_seq:020}{SEGMENT_SUFFIX}"))
}

/// Segment files in sequence order, as `(first_seq from the name, path)`. Other
/// files (lock, evidence, snapshots) are ignored.
pub fn list_segments(dir: &Path) -> Result<Vec<(u64, PathBuf)>> {
    let mut out = Vec::new();
    for entry in fs::read_dir(dir).map_err(Error::io("list", dir))? {
        let entry = entry.map_err(Error::io("list", dir))?;
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        if let Some(seq) = segment_seq(name) {
            out.push((seq, entry.path()));
        }
    }
    out.sort();
    Ok(out)
}

/// In a directory holding no segment, the first entry that does not belong to a log
/// (anything but the lock, the snapshot folder and evidence files); `None` if it
/// holds a segment or only log entries.
///
/// One listing pass decides: another process may create the first segment while
/// this one looks, and a second pass would then mistake that segment for a foreign
/// file.
pub fn foreign_entry(dir: &Path) -> Result<Option<String>> {
    let mut foreign = None;
    for entry in fs::read_dir(dir).map_err(Error::io("list", dir))? {
        let entry = entry.map_err(Error::io("list", dir))?;
        let name = entry.file_name().to_string_lossy().into_owned();
        if segment_seq(&name).is_some() {
            return Ok(None);
        }
        if foreign.is_none() && name != LOCK_FILE && name != SNAPSHOT_DIR && !name.contains(EVIDENCE_INFIX) {
            foreign = Some(name);
        }
    }
    Ok(foreign)
}

/// The first sequence named by a segment file name (`<20 digits>.seg`).
fn segment_seq(name: &str) -> Option<u64> {
    let stem = name.strip_suffix(SEGMENT_SUFFIX)?;
    if stem.len() == 20 && stem.bytes().all(|b| b.is_ascii_digit()) { stem.parse().ok() } else { None }
}

/// Make the directory durable: needed after creating, renaming or removing a file.
pub(crate) fn sync_dir(dir: &Path) -> Result<()> {
    File::open(dir).and_then(|d| d.sync_all()).map_err(Error::io("fsync directory", dir))
}

pub(crate) fn create_dir_private(dir: &Path) -> Result<()> {
    fs::DirBuilder::new().recursive(true).mode(0o700).create(dir).map_err(Error::io("create directory", dir))
}

pub(crate) fn open_private(path: &Path, create_new: bool) -> Result<File> {
    let mut o = OpenOptions::new();
    o.read(true).write(true).mode(0o600);
    if create_new {
        o.create_new(true);
    } else {
        o.create(true);
    }
    o.open(path).map_err(Error::io("open", path))
}

/// Write `bytes` to a new evidence file beside `segment` and make it durable before
/// the caller cuts anything: the cut bytes are never lost.
pub(crate) fn write_evidence(segment: &Path, what: &str, offset: u64, bytes: &[u8]) -> Result<PathBuf> {
    let base = format!("{}{EVIDENCE_INFIX}{what}-{offset}", segment.display());
    let mut path = PathBuf::from(&base);
    let mut n = 1;
    while path.exists() {
        path = PathBuf::from(format!("{base}.{n}"));
        n += 1;
    }
    let mut f = open_private(&path, true)?;
    f.write_all(bytes).map_err(Error::io("write evidence", &path))?;
    f.sync_all().map_err(Error::io("fsync evidence", &path))?;
    sync_dir(segment.parent().unwrap_or(Path::new(".")))?;
    Ok(path)
}
