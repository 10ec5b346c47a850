//! The log halted after a commit group whose write or sync failed and which could
//! not be cut back (FORMAT.md §7, "A failed write or sync").
//!
//! Such a group's bytes may sit in the page cache: every other writer would catch
//! up with them and act on them (a takeover in force, a generation handed out),
//! yet a power cut may still erase them — a generation that could be handed out
//! twice. So the writer that failed leaves `SYNC_FAILED` in the log directory,
//! naming where the group began, and every writer and every command that answers
//! from the log refuses while it is there (`SYNC_FAILED`, exit 1); `fencelog repair
//! --cut-from SEQ` cuts from the group's first record and removes it. The file is
//! written without waiting on its own sync (the disk is failing): within this boot
//! it stops everyone as surely as the page cache shows them the group.

use std::io::Write;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::dir::{open_private, stat_path, sync_dir};
use crate::storage::error::{Error, Result};

/// The marker's name in the log directory.
pub const SYNC_FAILED_FILE: &str = "SYNC_FAILED";

/// Longest marker read back (it is a line of JSON).
const MARKER_BYTES_MAX: u64 = 4096;

#[derive(Debug, Serialize, Deserialize)]
struct Marker {
    /// The segment's file name (the marker sits beside it).
    segment: String,
    /// Where the group began in it.
    offset: u64,
    /// The group's first sequence: `repair --cut-from` this.
    seq: u64,
    /// What failed, and why the cut back failed.
    cause: String,
    pid: u32,
}

/// Leave the marker (best effort: each step is tried, none is waited on twice)
/// and return the error every writer will now refuse with. A marker already there
/// is kept: it names the earliest group in doubt, where a repair must cut.
pub(crate) fn halt(dir: &Path, segment: &Path, offset: u64, seq: u64, cause: String) -> Error {
    let path = dir.join(SYNC_FAILED_FILE);
    let name = segment.file_name().map_or_else(String::new, |n| n.to_string_lossy().into_owned());
    let marker = Marker { segment: name, offset, seq, cause: cause.clone(), pid: std::process::id() };
    match open_private(&path, true) {
        Ok(mut f) => {
            let line = serde_json::to_string(&marker).expect("a marker serializes");
            let written = writeln!(f, "{line}").and_then(|_| f.sync_all());
            let synced = sync_dir(dir);
            if written.is_err() || synced.is_err() {
                tracing::error!(marker = %path.display(), "the SYNC_FAILED marker may not be durable");
            }
        }
        Err(e) => tracing::error!(marker = %path.display(), error = %e, "could not leave the SYNC_FAILED marker"),
    }
    tracing::error!(segment = %segment.display(), offset, seq, %cause, "the log is halted until repair");
    check(dir).err().unwrap_or(Error::SyncFailed { segment: segment.to_path_buf(), offset, seq, detail: cause })
}

/// `Err(SyncFailed)` while the marker is in `dir` (one `statx` of a missing file
/// when it is not: every writer asks at every turn of the append lock).
pub(crate) fn check(dir: &Path) -> Result<()> {
    let path = dir.join(SYNC_FAILED_FILE);
    if stat_path(&path).is_err() {
        return Ok(());
    }
    Err(read(dir, &path))
}

/// The error the marker stands for (an unreadable marker still halts the log).
fn read(dir: &Path, path: &Path) -> Error {
    let text = super::dir::read_regular(path, MARKER_BYTES_MAX, 0)
        .map_err(|e| e.to_string())
        .and_then(|b| String::from_utf8(b).map_err(|e| e.to_string()));
    // The marker names a segment of this directory by its file name, and a place
    // after its header: anything else (a path, `..`) is not believed.
    let valid = |m: &Marker| {
        super::dir::segment_seq(&m.segment).is_some_and(|first| first <= m.seq)
            && m.offset >= crate::format::SEGMENT_HEADER_BYTES as u64
            && m.seq > 0
    };
    match text.and_then(|t| serde_json::from_str::<Marker>(t.trim()).map_err(|e| e.to_string())) {
        Ok(m) if !valid(&m) => Error::SyncFailed {
            segment: path.to_path_buf(),
            offset: 0,
            seq: 0,
            detail: format!(
                "{} names no segment of this log ({:?} at byte {}, sequence {}); move it away only after checking \
                 the log",
                path.display(),
                m.segment,
                m.offset,
                m.seq
            ),
        },
        Ok(m) => Error::SyncFailed {
            segment: dir.join(&m.segment),
            offset: m.offset,
            seq: m.seq,
            detail: format!("{} (pid {}; {})", m.cause, m.pid, path.display()),
        },
        Err(why) => Error::SyncFailed {
            segment: path.to_path_buf(),
            offset: 0,
            seq: 0,
            detail: format!(
                "{} is there but cannot be read ({why}); move it away only after checking the log",
                path.display()
            ),
        },
    }
}

/// Where the halted group began (segment, offset, sequence), if the log is halted
/// by a marker that names a place in it (sequence 0: one that does not).
pub(crate) fn halted_at(dir: &Path) -> Option<(PathBuf, u64, u64)> {
    match check(dir) {
        Err(Error::SyncFailed { segment, offset, seq, .. }) => Some((segment, offset, seq)),
        _ => None,
    }
}

/// Remove the marker once a repair's cut is durable.
pub(crate) fn clear(dir: &Path) -> Result<()> {
    let path = dir.join(SYNC_FAILED_FILE);
    match std::fs::remove_file(&path) {
        Ok(()) => sync_dir(dir),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(Error::io("remove", &path)(e)),
    }
}
