//! The log directory: naming, listing, permissions, safe opening of its files,
//! directory fsync, evidence files.

use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use crate::storage::error::{Error, Result};

/// Earlier builds locked only this file; it is still locked, second, after the
/// directory (see `lock.rs`), so old and new writers exclude each other.
pub const LOCK_FILE: &str = "LOCK";
pub const SNAPSHOT_DIR: &str = "snapshots";
/// Supervised processes' output files (`processes/ID/`): created only in a log.
pub const PROCESS_DIR: &str = "processes";
/// The daemon's bearer token (`fencelog serve`), created only in a log.
pub const SERVE_TOKEN_FILE: &str = "serve.token";
/// The daemon's read-only and admin tokens, beside [`SERVE_TOKEN_FILE`].
pub const SERVE_READ_TOKEN_FILE: &str = "serve.read.token";
pub const SERVE_ADMIN_TOKEN_FILE: &str = "serve.admin.token";
/// The key of the supervisor's environment digests, created only in a log.
pub const ENV_KEY_FILE: &str = "env.key";
const SEGMENT_SUFFIX: &str = ".seg";
/// Evidence files are named `<segment>.seg<EVIDENCE_INFIX><what>-<offset>`.
pub const EVIDENCE_INFIX: &str = ".evidence.";
const TEMP_SUFFIX: &str = ".tmp";

/// `dir/<first_seq, 20 digits>.seg`: lexical order is sequence order.
pub fn segment_path(dir: &Path, first_seq: u64) -> PathBuf {
    dir.join(format!("{first_seq:020}{SEGMENT_SUFFIX}"))
}

/// What a log directory holds, from one listing.
#[derive(Debug, Default)]
pub struct Listing {
    /// Segment files in sequence order, as `(first_seq from the name, path)`.
    pub segments: Vec<(u64, PathBuf)>,
    /// Entries named like segments that are not valid segment names (a number too
    /// large for a sequence, a wrong width, a name that is not UTF-8): a renamed or
    /// planted segment. Never skipped silently.
    pub odd_segment_names: Vec<String>,
    /// Entries that only a log leaves behind: the `snapshots/` directory (created
    /// right after the first segment), the legacy `LOCK` file, evidence of cut
    /// records, segments' position indexes. With no segment beside them, the
    /// log's history is gone, not absent.
    pub log_traces: Vec<String>,
    /// The first entry that belongs to no log, if any.
    pub foreign: Option<String>,
}

/// List `dir` once, classifying every entry; nothing is read.
///
/// One listing decides: another process may create the first segment while this
/// one looks, and a second pass could mistake that segment for a foreign file.
pub fn listing(dir: &Path) -> Result<Listing> {
    let mut out = Listing::default();
    for entry in fs::read_dir(dir).map_err(Error::io("list", dir))? {
        let entry = entry.map_err(Error::io("list", dir))?;
        let raw = entry.file_name();
        let name = raw.to_string_lossy().into_owned();
        if let Some(seq) = raw.to_str().and_then(segment_seq) {
            out.segments.push((seq, entry.path()));
        } else if raw.as_encoded_bytes().ends_with(SEGMENT_SUFFIX.as_bytes()) {
            out.odd_segment_names.push(name);
        } else if name == LOCK_FILE
            || name == SERVE_TOKEN_FILE
            || name == SERVE_READ_TOKEN_FILE
            || name == SERVE_ADMIN_TOKEN_FILE
            || name == ENV_KEY_FILE
            || name == super::halt::SYNC_FAILED_FILE
            || is_trace_of_records(&name)
            || super::index::is_index_name(&name)
        {
            out.log_traces.push(name);
        } else if name == SNAPSHOT_DIR || name == PROCESS_DIR {
            // Created only in a log (snapshots/ right after the first segment): it
            // marks a log that existed.
            out.log_traces.push(format!("{name}/"));
        } else if !is_evidence(&name) && !is_segment_temp(&name) && out.foreign.is_none() {
            out.foreign = Some(name);
        }
    }
    out.segments.sort();
    out.odd_segment_names.sort();
    Ok(out)
}

impl Listing {
    /// Refuse entries that look like segments but are not.
    pub fn refuse_odd_names(&self, dir: &Path) -> Result<()> {
        match self.odd_segment_names.first() {
            None => Ok(()),
            Some(name) => Err(Error::Corruption {
                segment: dir.join(name),
                offset: 0,
                seq: 0,
                detail: format!(
                    "{name:?} is named like a segment but is not a valid segment name \
                     (20 decimal digits of a u64, then .seg): a segment was renamed or planted"
                ),
            }),
        }
    }

    /// With no segment: is this a log that lost its history (corruption), rather
    /// than no log at all?
    pub fn refuse_lost_history(&self, dir: &Path) -> Result<()> {
        if self.segments.is_empty()
            && let Some(trace) = self.log_traces.first()
        {
            return Err(Error::Corruption {
                segment: segment_path(dir, 1),
                offset: 0,
                seq: 1,
                detail: format!(
                    "every segment is missing but {trace:?} remains: this log lost its history; \
                     refusing to answer from nothing or to start a new history in its place"
                ),
            });
        }
        Ok(())
    }
}

/// Segment files in sequence order, as `(first_seq from the name, path)`. An entry
/// named like a segment with an invalid name is refused as corruption.
pub fn list_segments(dir: &Path) -> Result<Vec<(u64, PathBuf)>> {
    let l = listing(dir)?;
    l.refuse_odd_names(dir)?;
    Ok(l.segments)
}

/// An evidence file: `<valid segment name><EVIDENCE_INFIX><what>`.
fn is_evidence(name: &str) -> bool {
    name.split_once(EVIDENCE_INFIX).is_some_and(|(seg, what)| segment_seq(seg).is_some() && !what.is_empty())
}

/// Evidence of records cut from a segment: only a log that held records leaves it.
/// (A segment set aside whole while it was being created held none.)
fn is_trace_of_records(name: &str) -> bool {
    is_evidence(name) && !name.contains(&format!("{EVIDENCE_INFIX}torn-segment-"))
}

/// A first segment being created by [`create_first_segment`], or a segment being
/// rewritten by [`rewrite_prefix`]: `.<segment name>.<pid>-<n>.tmp`.
fn is_segment_temp(name: &str) -> bool {
    let Some(rest) = name.strip_prefix('.').and_then(|n| n.strip_suffix(TEMP_SUFFIX)) else { return false };
    let Some((seg, tag)) = rest.rsplit_once('.') else { return false };
    segment_seq(seg).is_some()
        && tag.split_once('-').is_some_and(|(a, b)| {
            !a.is_empty() && !b.is_empty() && a.bytes().chain(b.bytes()).all(|c| c.is_ascii_digit())
        })
}

/// The first sequence named by a segment file name (`<20 digits>.seg`).
pub(crate) fn segment_seq(name: &str) -> Option<u64> {
    let stem = name.strip_suffix(SEGMENT_SUFFIX)?;
    // Sequences start at 1: a segment named for 0 is no segment.
    if stem.len() == 20 && stem.bytes().all(|b| b.is_ascii_digit()) {
        stem.parse().ok().filter(|&s| s > 0)
    } else {
        None
    }
}

/// Refuse a log directory that other users could write to: whoever can create,
/// remove or rename entries in it can rewrite the history.
pub fn check_dir_mode(dir: &Path) -> Result<()> {
    use std::os::unix::fs::PermissionsExt;
    let mode = fs::metadata(dir).map_err(Error::io("stat", dir))?.permissions().mode() & 0o7777;
    if mode & 0o022 != 0 {
        return Err(Error::UnsafePermissions { path: dir.to_path_buf(), mode });
    }
    Ok(())
}

/// Open a file of the log read-only, only if it is a regular file (never through a
/// symlink, never a FIFO or device: `O_NOFOLLOW | O_NONBLOCK`, then `fstat`) of at
/// most `bytes_max` bytes. Returns the file and its length. `seq` is the sequence
/// the file is named for, for the error.
pub(crate) fn open_regular(path: &Path, bytes_max: u64, seq: u64) -> Result<(File, u64)> {
    open_checked(path, bytes_max, seq, false)
}

/// [`open_regular`], for reading and writing (the writer's tail segment).
pub(crate) fn open_regular_rw(path: &Path, bytes_max: u64, seq: u64) -> Result<(File, u64)> {
    open_checked(path, bytes_max, seq, true)
}

fn open_checked(path: &Path, bytes_max: u64, seq: u64, write: bool) -> Result<(File, u64)> {
    fail::fail_point!("segment::open", |_| Err(Error::io("open", path)(std::io::Error::other(
        "injected open failure"
    ))));
    let f = OpenOptions::new()
        .read(true)
        .write(write)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path)
        .map_err(|e| match e.raw_os_error() {
            Some(libc::ELOOP) => not_regular(path, seq, "a symbolic link"),
            _ => Error::io("open", path)(e),
        })?;
    let meta = stat_file(&f).map_err(Error::io("stat", path))?;
    if !meta.is_file {
        return Err(not_regular(path, seq, "not a regular file (a FIFO, device, socket or directory)"));
    }
    if meta.len > bytes_max {
        return Err(Error::Corruption {
            segment: path.to_path_buf(),
            offset: 0,
            seq,
            detail: format!(
                "the file is {} bytes, more than any segment may hold ({bytes_max} bytes: segment_bytes_max \
                 plus one largest record); refused unread",
                meta.len
            ),
        });
    }
    Ok((f, meta.len))
}

/// The bytes of a log file, read as [`open_regular`] opens it: only a regular file
/// of at most `bytes_max` bytes, and no more than its length when opened (a file
/// that grows meanwhile is read to that length; one cut meanwhile, to its end).
/// What every whole-file read of a segment goes through: no input makes it read
/// without bound, block on a FIFO, or follow a symlink.
pub(crate) fn read_regular(path: &Path, bytes_max: u64, seq: u64) -> Result<Vec<u8>> {
    read_regular_then(path, bytes_max, seq, |_| Ok(()))
}

/// [`read_regular`], then `then` on the file it read (before the bytes are
/// given: a reader's sync of what it read).
pub(crate) fn read_regular_then(
    path: &Path,
    bytes_max: u64,
    seq: u64,
    then: impl FnOnce(&std::fs::File) -> Result<()>,
) -> Result<Vec<u8>> {
    let (f, len) = open_regular(path, bytes_max, seq)?;
    debug_assert!(len <= bytes_max, "open_regular bounds the length");
    let mut b = vec![0u8; len as usize];
    let mut got = 0;
    while got < b.len() {
        match std::os::unix::fs::FileExt::read_at(&f, &mut b[got..], got as u64) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(Error::io("read", path)(e)),
        }
    }
    b.truncate(got);
    then(&f)?;
    Ok(b)
}

/// Replace the file at `path` by a new file holding its first `keep_bytes`
/// bytes: written beside it, synced, renamed over it, the directory synced.
/// Never a truncation in place: a reader that mapped the old file (a sealed
/// segment: readers take no lock) keeps reading the old inode, whole, instead of
/// dying with SIGBUS on the pages a truncation would take from under it.
pub(crate) fn rewrite_prefix(path: &Path, keep_bytes: u64) -> Result<()> {
    static COUNTER: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let dir = path.parent().unwrap_or(Path::new("."));
    let name = path.file_name().map_or_else(String::new, |n| n.to_string_lossy().into_owned());
    let n = COUNTER.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let tmp = dir.join(format!(".{name}.{}-{n}{TEMP_SUFFIX}", std::process::id()));
    let written = (|| {
        let src = OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
            .open(path)
            .map_err(Error::io("open", path))?;
        let len = stat_file(&src).map_err(Error::io("stat", path))?.len;
        if keep_bytes > len {
            return Err(Error::InvalidOption {
                detail: format!("{} is {len} bytes: it cannot keep its first {keep_bytes}", path.display()),
            });
        }
        let mut dst = open_private(&tmp, true)?;
        let copied =
            std::io::copy(&mut std::io::Read::take(&src, keep_bytes), &mut dst).map_err(Error::io("copy", path))?;
        if copied != keep_bytes {
            return Err(Error::io("copy", path)(std::io::Error::other(format!(
                "copied {copied} of {keep_bytes} bytes: the file shrank meanwhile"
            ))));
        }
        fail::fail_point!("segment::truncate", |_| {
            Err(Error::io("truncate", path)(std::io::Error::other("injected truncate failure")))
        });
        dst.sync_all().map_err(Error::io("fsync", &tmp))?;
        fs::rename(&tmp, path).map_err(Error::io("rename", path))
    })();
    if let Err(e) = written {
        let _ = fs::remove_file(&tmp);
        return Err(e);
    }
    sync_dir(dir)
}

/// What a segment's readers and writer need to know of a file: size, identity,
/// whether it is a regular file — and nothing about its times.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Stat {
    pub len: u64,
    pub dev: (u32, u32),
    pub ino: u64,
    pub is_file: bool,
}

/// `statx` asking only for type, size and inode. Never for the times: since Linux
/// 6.13, a query of a file's ctime makes its next write take a fine-grained
/// timestamp, a journalled inode update — measured here as +25–30 µs on every append
/// that follows a `stat` of its segment (`docs/BENCHMARKS.md`).
fn statx_lite(dirfd: i32, path: &std::ffi::CStr, flags: i32) -> std::io::Result<Stat> {
    let st = crate::sys::fs::statx_lite(dirfd, path, flags)?;
    Ok(Stat { len: st.size, dev: (st.dev_major, st.dev_minor), ino: st.ino, is_file: st.is_regular })
}

/// [`Stat`] of an open file.
pub(crate) fn stat_file(f: &File) -> std::io::Result<Stat> {
    use std::os::fd::AsRawFd;
    statx_lite(f.as_raw_fd(), c"", libc::AT_EMPTY_PATH)
}

/// [`Stat`] of the entry at `path` itself (a symlink is not followed).
pub(crate) fn stat_path(path: &Path) -> std::io::Result<Stat> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(path.as_os_str().as_bytes()).map_err(std::io::Error::other)?;
    statx_lite(libc::AT_FDCWD, &c, libc::AT_SYMLINK_NOFOLLOW)
}

fn not_regular(path: &Path, seq: u64, what: &str) -> Error {
    Error::Corruption {
        segment: path.to_path_buf(),
        offset: 0,
        seq,
        detail: format!("the entry is {what}; a log holds only regular files; refused unread"),
    }
}

/// Create the first segment atomically (temp file, fsync, link into place, fsync
/// the directory): it exists whole or not at all, so "no first segment" means a
/// log that never existed, or one that lost its history.
pub(crate) fn create_first_segment(dir: &Path, header: &[u8]) -> Result<PathBuf> {
    static COUNTER: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let path = segment_path(dir, 1);
    let n = COUNTER.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let tmp = dir.join(format!(".{:020}{SEGMENT_SUFFIX}.{}-{n}{TEMP_SUFFIX}", 1, std::process::id()));
    let result = (|| {
        fail::fail_point!("segment::create", |_| {
            Err(Error::io("create segment", &tmp)(std::io::Error::other("injected create failure")))
        });
        let mut f = open_private(&tmp, true)?;
        f.write_all(header).map_err(Error::io("write segment header", &tmp))?;
        f.sync_all().map_err(Error::io("fsync", &tmp))?;
        fail::fail_point!("segment::link", |_| {
            Err(Error::io("link first segment", &path)(std::io::Error::other("injected link failure")))
        });
        match fs::hard_link(&tmp, &path) {
            Ok(()) => Ok(()),
            // Another creator won; its header is the same bytes.
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(()),
            Err(e) => Err(Error::io("link first segment", &path)(e)),
        }
    })();
    let _ = fs::remove_file(&tmp);
    result?;
    sync_dir(dir)?;
    Ok(path)
}

/// Create `path` (0600) holding exactly `bytes`, whole or not at all: written and
/// synced under a name of its own, then linked into place, then the directory
/// synced. `Ok(false)`: the path existed already (another creator won; the file
/// there is left as it is). A reader never sees it empty or half-written. On a
/// file system without hard links it is made in place (`create_new`), where a
/// concurrent reader may see it before its bytes.
pub fn create_file_whole(path: &Path, bytes: &[u8]) -> std::io::Result<bool> {
    let name = path.file_name().map_or_else(String::new, |n| n.to_string_lossy().into_owned());
    let tmp = path.with_file_name(format!(".{name}.{}.{}.tmp", std::process::id(), uuid::Uuid::new_v4().simple()));
    let write = |at: &Path| -> std::io::Result<()> {
        let mut f =
            fs::OpenOptions::new().write(true).create_new(true).mode(0o600).custom_flags(libc::O_NOFOLLOW).open(at)?;
        f.write_all(bytes)?;
        f.sync_all()
    };
    let linked = write(&tmp).and_then(|()| match fs::hard_link(&tmp, path) {
        Err(e) if matches!(e.raw_os_error(), Some(libc::EPERM | libc::EOPNOTSUPP)) => write(path),
        other => other,
    });
    let _ = fs::remove_file(&tmp);
    match linked {
        Ok(()) => {
            if let Some(dir) = path.parent() {
                File::open(dir)?.sync_all()?;
            }
            Ok(true)
        }
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(false),
        Err(e) => Err(e),
    }
}

/// Make the directory durable: needed after creating, renaming or removing a file.
pub(crate) fn sync_dir(dir: &Path) -> Result<()> {
    fail::fail_point!("dir::fsync", |_| {
        Err(Error::io("fsync directory", dir)(std::io::Error::other("injected directory fsync failure")))
    });
    File::open(dir).and_then(|d| d.sync_all()).map_err(Error::io("fsync directory", dir))
}

pub(crate) fn create_dir_private(dir: &Path) -> Result<()> {
    fs::DirBuilder::new().recursive(true).mode(0o700).create(dir).map_err(Error::io("create directory", dir))
}

pub(crate) fn open_private(path: &Path, create_new: bool) -> Result<File> {
    let mut o = OpenOptions::new();
    o.read(true).write(true).mode(0o600).custom_flags(libc::O_NOFOLLOW);
    if create_new {
        o.create_new(true);
    } else {
        o.create(true);
    }
    o.open(path).map_err(Error::io("open", path))
}

/// A name not yet taken for evidence of `what` cut from `segment` at `offset`:
/// `<segment><EVIDENCE_INFIX><what>-<offset>`, then `.1`, `.2`, … (evidence is never
/// overwritten).
pub(crate) fn evidence_path(segment: &Path, what: &str, offset: u64) -> PathBuf {
    let base = format!("{}{EVIDENCE_INFIX}{what}-{offset}", segment.display());
    let mut path = PathBuf::from(&base);
    let mut n = 1;
    while fs::symlink_metadata(&path).is_ok() {
        path = PathBuf::from(format!("{base}.{n}"));
        n += 1;
    }
    path
}

/// Write `bytes` to a new evidence file beside `segment` and make it durable before
/// the caller cuts anything: the cut bytes are never lost. If any step fails (a
/// full disk), the partial evidence file is removed: a failed repair leaves the
/// directory as it found it, however often it is retried.
pub(crate) fn write_evidence(segment: &Path, what: &str, offset: u64, bytes: &[u8]) -> Result<PathBuf> {
    let path = evidence_path(segment, what, offset);
    let dir = segment.parent().unwrap_or(Path::new("."));
    let written = (|| {
        let mut f = open_private(&path, true)?;
        fail::fail_point!("evidence::write", |torn: Option<String>| {
            let n = torn.and_then(|t| t.parse::<usize>().ok()).unwrap_or(0).min(bytes.len());
            let _ = f.write_all(&bytes[..n]);
            Err(Error::io("write evidence", &path)(std::io::Error::other("injected evidence write failure")))
        });
        f.write_all(bytes).map_err(Error::io("write evidence", &path))?;
        f.sync_all().map_err(Error::io("fsync evidence", &path))
    })();
    if let Err(e) = written {
        if fs::remove_file(&path).is_ok() {
            let _ = sync_dir(dir);
        }
        return Err(e);
    }
    sync_dir(dir)?;
    Ok(path)
}
