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
        let Some(stem) = name.strip_suffix(SEGMENT_SUFFIX) else {
            continue;
        };
        if stem.len() == 20
            && stem.bytes().all(|b| b.is_ascii_digit())
            && let Ok(seq) = stem.parse::<u64>()
        {
            out.push((seq, entry.path()));
        }
    }
    out.sort();
    Ok(out)
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
