//! One error body for every front end: `{"error": {"code", "message", ...evidence}}`,
//! and one mapping to exit codes (HTTP statuses follow the same classes).

use std::path::PathBuf;

use serde::Serialize;

use super::OpResponse;
use crate::ledger::LedgerError;
use crate::model::Refusal;
use crate::storage;

/// Why an operation did not succeed.
#[derive(Debug, thiserror::Error)]
pub enum OpError {
    /// The state machine refused; nothing was written (except coalesced audit
    /// records of contested refusals).
    #[error("{0}")]
    Refused(Refusal),
    /// Any other failure of the ledger (never `LedgerError::Refused`: that becomes
    /// [`OpError::Refused`]).
    #[error(transparent)]
    Ledger(LedgerError),
    /// Invalid use that the state machine never saw (an unknown pid, say).
    #[error("{message}")]
    Usage { code: &'static str, message: String },
    /// An I/O failure outside the log (writing a report, say): `IO_ERROR`, exit 1.
    #[error("{message}")]
    Io { message: String },
    /// A lease release with the wrong token: committed as an attempt (the lease
    /// stays held, release pending), answered as an error.
    #[error("the release presented the wrong token; the lease stays held, release pending")]
    LeaseTokenMismatch(Box<OpResponse>),
}

impl From<LedgerError> for OpError {
    fn from(e: LedgerError) -> Self {
        match e {
            LedgerError::Refused(r) => OpError::Refused(r),
            other => OpError::Ledger(other),
        }
    }
}

impl From<storage::Error> for OpError {
    fn from(e: storage::Error) -> Self {
        OpError::Ledger(LedgerError::Storage(e))
    }
}

/// `{"error": {...}}`.
#[derive(Debug, Serialize)]
pub struct ErrorBody {
    pub error: ErrorDetail,
}

/// The inside of an error body: always `code` and `message`, then the evidence.
#[derive(Debug, Serialize)]
#[serde(untagged)]
pub enum ErrorDetail {
    /// A refusal: its code and evidence fields (subject, generations, holders…).
    Refused {
        #[serde(flatten)]
        refusal: Refusal,
        message: String,
    },
    /// A storage failure, with where it is when it is somewhere.
    Storage {
        code: &'static str,
        message: String,
        #[serde(skip_serializing_if = "Option::is_none")]
        segment: Option<PathBuf>,
        #[serde(skip_serializing_if = "Option::is_none")]
        offset: Option<u64>,
        #[serde(skip_serializing_if = "Option::is_none")]
        seq: Option<u64>,
    },
    Plain {
        code: &'static str,
        message: String,
    },
    /// A committed attempt answered as an error (`LEASE_TOKEN_MISMATCH`): the
    /// response's fields (its own outcome code left out: one `code` per body).
    Committed {
        #[serde(flatten)]
        response: serde_json::Map<String, serde_json::Value>,
        code: &'static str,
        message: String,
    },
}

impl OpError {
    /// The stable code.
    pub fn code(&self) -> &'static str {
        match self {
            OpError::Refused(r) => r.code(),
            OpError::Ledger(e) => e.code(),
            OpError::Usage { code, .. } => code,
            OpError::Io { .. } => "IO_ERROR",
            OpError::LeaseTokenMismatch(_) => "LEASE_TOKEN_MISMATCH",
        }
    }

    /// 0 success · 1 I/O error or damaged log · 2 usage, invalid input, not a log
    /// (or one in a format this build does not read) · 3 refused by the state
    /// machine. (`audit`'s 4 is its own; `docs/ERRORS.md` lists every code.)
    pub fn exit_code(&self) -> u8 {
        use storage::Error as E;
        match self {
            OpError::Refused(r) => {
                if matches!(r, Refusal::InvalidSubject { .. } | Refusal::InvalidInput { .. }) {
                    2
                } else {
                    3
                }
            }
            // Not a log, a bad option, or a request too big for a record: the
            // caller's input, not the log's state.
            OpError::Ledger(LedgerError::Storage(
                E::NotALogDirectory { .. }
                | E::InvalidOption { .. }
                | E::ReadOnly
                | E::Full { .. }
                | E::NothingToRepair { .. }
                | E::NotFound { .. }
                | E::UnsupportedFormat { .. }
                | E::RecordTooLarge { .. }
                | E::BatchTooLarge { .. }
                | E::EmptyBatch,
            )) => 2,
            OpError::Ledger(_) => 1,
            OpError::Usage { .. } => 2,
            OpError::Io { .. } => 1,
            OpError::LeaseTokenMismatch(_) => 3,
        }
    }

    pub fn body(&self) -> ErrorBody {
        let message = self.to_string();
        let error = match self {
            OpError::Refused(r) => ErrorDetail::Refused { refusal: r.clone(), message },
            OpError::Ledger(LedgerError::Storage(e)) => {
                let (segment, offset, seq) = match e {
                    storage::Error::Corruption { segment, offset, seq, .. }
                    | storage::Error::SyncFailed { segment, offset, seq, .. }
                    | storage::Error::CutUnderReader { segment, offset, seq, .. } => {
                        (Some(segment.clone()), Some(*offset), Some(*seq))
                    }
                    _ => (None, None, None),
                };
                ErrorDetail::Storage { code: e.code(), message, segment, offset, seq }
            }
            OpError::LeaseTokenMismatch(r) => {
                let mut response = match serde_json::to_value(r) {
                    Ok(serde_json::Value::Object(m)) => m,
                    _ => serde_json::Map::new(),
                };
                response.remove("code");
                ErrorDetail::Committed { response, code: "LEASE_TOKEN_MISMATCH", message }
            }
            other => ErrorDetail::Plain { code: other.code(), message },
        };
        ErrorBody { error }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn exit(e: storage::Error) -> u8 {
        OpError::Ledger(LedgerError::Storage(e)).exit_code()
    }

    /// Proves: a request too big for a record, or a log this build cannot read, is
    /// the caller's input (2); an I/O failure or damage is 1 (`docs/ERRORS.md`).
    #[test]
    fn input_errors_exit_2_and_the_logs_failures_exit_1() {
        use std::sync::Arc;
        assert_eq!(exit(storage::Error::RecordTooLarge { bytes: 2, max: 1 }), 2);
        assert_eq!(exit(storage::Error::EmptyBatch), 2);
        let io = storage::Error::Io {
            op: "read",
            path: "/x".into(),
            source: Arc::new(std::io::Error::from(std::io::ErrorKind::PermissionDenied)),
        };
        assert_eq!(exit(io), 1);
        let rot = storage::Error::Corruption { segment: "s".into(), offset: 1, seq: 2, detail: "d".into() };
        assert_eq!(exit(rot), 1);
        // What `InvalidOption` was split into keeps its code, its exit and its words.
        for (e, words) in [
            (storage::Error::ReadOnly, "invalid option: the log was opened read-only"),
            (
                storage::Error::Full { detail: "the memory log is full".into() },
                "invalid option: the memory log is full",
            ),
            (storage::Error::NothingToRepair { detail: "d".into() }, "invalid option: d"),
            (storage::Error::NotFound { detail: "d".into() }, "invalid option: d"),
        ] {
            assert_eq!((e.code(), e.to_string().as_str()), ("INVALID_OPTION", words));
            assert_eq!(exit(e), 2);
        }
    }
}
