use std::path::PathBuf;
use std::sync::Arc;

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Every storage failure, with the evidence that locates it. `Clone` because one
/// group-commit failure is reported to every appender in the group.
#[derive(Debug, Clone, thiserror::Error)]
pub enum Error {
    #[error("I/O error: {op} {path}: {source}")]
    Io { op: &'static str, path: PathBuf, source: Arc<std::io::Error> },

    /// The file system (or the user's quota) is full: `ENOSPC` or `EDQUOT`. Said
    /// apart from other I/O errors so that a caller can free space and retry, or
    /// alert on it; its code (`IO_ERROR`) and words are an I/O error's, as they
    /// always were. Nothing was acknowledged: a failed write or preallocation
    /// leaves the log as it was, a failed sync cuts the group back or halts.
    #[error("I/O error: {op} {path}: {source}")]
    NoSpace { op: &'static str, path: PathBuf, source: Arc<std::io::Error> },

    #[error("corruption in segment {segment} at byte {offset} (sequence {seq}): {detail}")]
    Corruption { segment: PathBuf, offset: u64, seq: u64, detail: String },

    #[error("{segment}: {detail}")]
    UnsupportedFormat { segment: PathBuf, detail: String },

    #[error("{path} is not a fencelog log: {detail}")]
    NotALogDirectory { path: PathBuf, detail: String },

    #[error(
        "{path} is group- or world-writable (mode {mode:04o}): anyone who can write to it can rewrite the log; \
         run: chmod 700 {path}"
    )]
    UnsafePermissions { path: PathBuf, mode: u32 },

    #[error("record payload is {bytes} bytes; the limit is {max} bytes (payload_bytes_max)")]
    RecordTooLarge { bytes: u64, max: u64 },

    #[error(
        "batch of {records} records / {bytes} bytes exceeds the limit of {records_max} records / {bytes_max} bytes"
    )]
    BatchTooLarge { records: usize, bytes: usize, records_max: usize, bytes_max: usize },

    #[error("empty batch: nothing to append")]
    EmptyBatch,

    #[error("the log head is at sequence {actual}, not the expected {expected}; nothing was appended")]
    HeadMoved { expected: u64, actual: u64 },

    #[error(
        "writer is poisoned by an earlier failure ({cause}); no append is acknowledged until the log is reopened and recovered"
    )]
    Poisoned { cause: String },

    /// A commit group's write or sync failed, and the group was cut back (the
    /// segment truncated to where the group began, and that made durable) before
    /// anyone else could append: records `first_seq..=last_seq` were never
    /// committed and never will be. Retrying is safe (after a reopen: the writer
    /// is poisoned).
    #[error(
        "not committed: {cause}; the group (records {first_seq}..={last_seq}, and whatever was queued after it) \
         was cut back before anyone else could append: none of it is in the log"
    )]
    NotCommitted { first_seq: u64, last_seq: u64, cause: String },

    /// A commit group's write or sync failed and cutting it back failed too: its
    /// bytes may sit in the page cache, where every other writer would act on them,
    /// yet may not survive a power cut. The log is refused to every writer (and
    /// every command that answers from it) until `fencelog repair` cuts from
    /// `seq` — the file `SYNC_FAILED` in the log directory says where.
    #[error(
        "the sync of a commit group failed at {segment} byte {offset} (sequence {seq}) and it could not be cut \
         back: {detail}; the log is refused until `fencelog repair --dir {dir} --cut-from {seq}` cuts it",
        dir = segment.parent().map_or_else(|| ".".into(), |d| d.display().to_string())
    )]
    SyncFailed { segment: PathBuf, offset: u64, seq: u64, detail: String },

    #[error("could not take the append lock on {path} within {waited_ms} ms{}", holder_text(*holder_pid))]
    LockTimeout { path: PathBuf, waited_ms: u64, holder_pid: Option<u32> },

    /// A wait for the append lock given up because its caller said so (a cutover
    /// withdrawing what has not been judged): nothing was written. The commit
    /// engine answers it as its drain (`NOT_COMMITTED` at a daemon).
    #[error("withdrawn after waiting {waited_ms} ms for the append lock; nothing was written")]
    Withdrawn { waited_ms: u64 },

    /// A reader (which takes no lock) read records that a writer then cut back
    /// (their sync failed): the segment is now shorter than what it read, or was
    /// replaced or removed. Those records were never committed; the reader starts
    /// again from what the log holds.
    #[error(
        "the log was cut back under this reader at {segment} byte {offset} (sequence {seq}): {detail}; records \
         it read from there on were never committed (a failed sync); read again"
    )]
    CutUnderReader { segment: PathBuf, offset: u64, seq: u64, detail: String },

    /// The etcd cluster did not answer within the request deadline (no member
    /// reachable, or no quorum): nothing can be said of the log now. An append
    /// that ended so may or may not have landed: its request id tells, later.
    #[error("etcd unavailable ({cluster}): {detail}")]
    EtcdUnavailable { cluster: String, detail: String },

    /// etcd answered with an error that is not its unavailability (a request over
    /// its size limit, a full quota, …).
    #[error("etcd refused the request ({cluster}): {detail}")]
    Etcd { cluster: String, detail: String },

    /// The history before `below_seq` was moved to archive segments (`fencelog
    /// archive`); what was asked (from `asked`) needs them.
    #[error(
        "the history before sequence {below_seq} is archived (asked from {asked}): give the archive directory \
         (--archive DIR) to read it"
    )]
    Archived { below_seq: u64, asked: u64 },

    /// An option, an argument or a request that is not valid for this log.
    #[error("invalid option: {detail}")]
    InvalidOption { detail: String },

    /// An append to a log opened read-only. (`INVALID_OPTION`, as it always was.)
    #[error("invalid option: the log was opened read-only")]
    ReadOnly,

    /// A bounded log (the in-memory backend) has no room left. (`INVALID_OPTION`.)
    #[error("invalid option: {detail}")]
    Full { detail: String },

    /// `repair` asked of a log that has nothing a cut can mend. (`INVALID_OPTION`.)
    #[error("invalid option: {detail}")]
    NothingToRepair { detail: String },

    /// A record or a place asked for is not in the log. (`INVALID_OPTION`.)
    #[error("invalid option: {detail}")]
    NotFound { detail: String },

    #[error("the log is closed")]
    Closed,
}

fn holder_text(pid: Option<u32>) -> String {
    pid.map_or_else(|| "; the holder could not be identified".into(), |p| format!("; it is held by pid {p}"))
}

/// What a reader's failed sync of what it read is called (in `IO_ERROR`'s message).
pub(crate) const READ_SYNC_OP: &str = "fdatasync what was read before answering from it";

impl Error {
    /// The backend could not be reached now (etcd without a quorum): the log is
    /// neither known damaged nor this writer poisoned; a later attempt may work.
    pub fn is_transient(&self) -> bool {
        matches!(self, Error::EtcdUnavailable { .. } | Error::CutUnderReader { .. })
    }

    /// A reader's sync of what it read failed ([`READ_SYNC_OP`]): that reader gives
    /// no answer from the log any more (it could not tell what is on the disk).
    pub fn is_read_sync_failure(&self) -> bool {
        matches!(self, Error::Io { op, .. } | Error::NoSpace { op, .. } if *op == READ_SYNC_OP)
    }

    /// A stable, machine-readable code for each kind of failure.
    pub fn code(&self) -> &'static str {
        match self {
            Error::Io { .. } | Error::NoSpace { .. } => "IO_ERROR",
            Error::Corruption { .. } => "CORRUPTION",
            Error::UnsupportedFormat { .. } => "UNSUPPORTED_FORMAT",
            Error::NotALogDirectory { .. } => "NOT_A_LOG",
            Error::UnsafePermissions { .. } => "UNSAFE_PERMISSIONS",
            Error::RecordTooLarge { .. } => "RECORD_TOO_LARGE",
            Error::BatchTooLarge { .. } => "BATCH_TOO_LARGE",
            Error::EmptyBatch => "EMPTY_BATCH",
            Error::HeadMoved { .. } => "HEAD_MOVED",
            Error::Poisoned { .. } => "WRITER_POISONED",
            Error::NotCommitted { .. } => "NOT_COMMITTED",
            Error::SyncFailed { .. } => "SYNC_FAILED",
            Error::LockTimeout { .. } => "LOCK_TIMEOUT",
            Error::InvalidOption { .. }
            | Error::ReadOnly
            | Error::Full { .. }
            | Error::NothingToRepair { .. }
            | Error::NotFound { .. } => "INVALID_OPTION",
            Error::Withdrawn { .. } => "WITHDRAWN",
            Error::EtcdUnavailable { .. } => "ETCD_UNAVAILABLE",
            Error::CutUnderReader { .. } => "CUT_UNDER_READER",
            Error::Etcd { .. } => "ETCD_ERROR",
            Error::Archived { .. } => "HISTORY_ARCHIVED",
            Error::Closed => "CLOSED",
        }
    }

    /// `NOT_A_LOG` for a directory that holds no log, with the way to make one.
    pub(crate) fn no_log_here(dir: &std::path::Path) -> Error {
        Error::NotALogDirectory {
            path: dir.into(),
            detail: format!("it holds no log; create one with `fencelog init --dir {}`", dir.display()),
        }
    }

    pub(crate) fn io(op: &'static str, path: impl Into<PathBuf>) -> impl FnOnce(std::io::Error) -> Error {
        let path = path.into();
        move |e| Error::from_io(op, path, e)
    }

    /// An I/O failure of `op` on `path`: [`Error::NoSpace`] when the file system
    /// or the quota is full, [`Error::Io`] otherwise.
    pub fn from_io(op: &'static str, path: PathBuf, e: std::io::Error) -> Error {
        let full = matches!(e.kind(), std::io::ErrorKind::StorageFull | std::io::ErrorKind::QuotaExceeded);
        let source = Arc::new(e);
        if full { Error::NoSpace { op, path, source } } else { Error::Io { op, path, source } }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Proves: a real `ENOSPC` (a write to `/dev/full`) is `NoSpace`, with an I/O
    /// error's code and words; another I/O failure stays `Io`.
    #[test]
    fn a_full_disk_is_its_own_error_with_an_io_errors_code_and_words() {
        use std::io::Write;
        let mut full = std::fs::OpenOptions::new().write(true).open("/dev/full").expect("/dev/full");
        let enospc = full.write_all(b"x").and_then(|()| full.flush()).expect_err("/dev/full is always full");
        let words = format!("I/O error: write /dev/full: {enospc}");
        let e = Error::io("write", "/dev/full")(enospc);
        assert!(matches!(e, Error::NoSpace { op: "write", .. }), "{e:?}");
        assert_eq!((e.code(), e.to_string()), ("IO_ERROR", words));
        let quota = Error::from_io("write", "/q".into(), std::io::Error::from_raw_os_error(libc::EDQUOT));
        assert!(matches!(quota, Error::NoSpace { .. }), "{quota:?}");
        let denied = Error::io("open", "/x")(std::io::Error::from(std::io::ErrorKind::PermissionDenied));
        assert!(matches!(denied, Error::Io { .. }), "{denied:?}");
    }
}
