//! What the ledger answers when a transaction is not committed, or the log cannot
//! be read into a projection: a refusal, storage's error, or the ledger's own
//! cases; each with its stable code (`docs/ERRORS.md`).

use crate::model::Refusal;
use crate::storage;
use crate::storage::commit::CommitError;

#[derive(Debug, thiserror::Error)]
pub enum LedgerError {
    #[error("refused: {0}")]
    Refused(Refusal),
    #[error(transparent)]
    Storage(#[from] storage::Error),
    #[error("the log does not hold the snapshot's {0}")]
    SnapshotNotInLog(String),
    /// Another writer kept appending first: judged again this many times.
    #[error("another writer appended first {retries} times in a row; the transaction was not appended")]
    HeadMovedTooOften { retries: u32 },
    /// The ledger is draining (a cutover): this transaction was not judged and
    /// will never be appended.
    #[error("the ledger is draining for a cutover: the transaction was not judged and will never be appended")]
    Draining,
    /// A record whose checksum and chain hold but whose payload does not decode:
    /// replay never skips it (the projection would silently diverge).
    #[error(
        "record {seq} does not decode ({detail}); the projection cannot be rebuilt past it. If a newer fencelog \
         wrote it, use that version"
    )]
    UndecodableRecord { seq: u64, detail: String },
    /// A snapshot (written only from durable state) covers records the log no
    /// longer holds: records were cut from the end, or the snapshot is another
    /// log's.
    #[error(
        "the log ends at sequence {log_last_seq} but the snapshot {snapshot} covers sequence {snapshot_seq}: records \
         were cut from the end of the log (if the snapshot belongs to another log, move it away)"
    )]
    LogShorterThanSnapshot { snapshot: String, snapshot_seq: u64, log_last_seq: u64 },
}

impl LedgerError {
    pub fn code(&self) -> &'static str {
        match self {
            LedgerError::Refused(r) => r.code(),
            LedgerError::Storage(e) => e.code(),
            LedgerError::SnapshotNotInLog(_) => "SNAPSHOT_NOT_IN_LOG",
            LedgerError::Draining => "DRAINING",
            LedgerError::HeadMovedTooOften { .. } => "HEAD_MOVED",
            LedgerError::UndecodableRecord { .. } | LedgerError::LogShorterThanSnapshot { .. } => "CORRUPTION",
        }
    }

    /// What a failed commit (`storage::commit`) answers the submitter.
    pub(super) fn from_commit(e: CommitError<LedgerError>) -> LedgerError {
        match e {
            CommitError::Storage(e) => LedgerError::Storage(e),
            CommitError::Hook(e) => e,
            CommitError::Draining => LedgerError::Draining,
            CommitError::HeadMovedTooOften { retries } => LedgerError::HeadMovedTooOften { retries },
            // Only a lead on the caller's own thread declines, and the ledger leads
            // again elsewhere when it does; should it reach a caller, nothing was
            // judged: withdrawn.
            CommitError::WouldBlock => {
                debug_assert!(false, "an inline lead's decline reached a caller: the ledger leads again on the pool");
                LedgerError::Storage(crate::storage::Error::Withdrawn { waited_ms: 0 })
            }
        }
    }
}
