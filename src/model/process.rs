//! Supervised processes as the log records them: the intent to spawn (with the
//! leases it holds), the runner's start, a cancel request, and the one terminal
//! record — which also ends every lease the process held.
//!
//! Like every type in `model`, these enums are encoded by variant index and are
//! append-only.

use serde::{Deserialize, Serialize};

use super::flat_enum_serialize;

use super::{Identity, LeaseMode};

/// Most arguments of one command.
pub const ARGS_MAX: usize = 1024;
/// Most bytes of all arguments of one command together.
pub const ARGS_BYTES_MAX: usize = 64 * 1024;
/// Most `--env` entries of one command.
pub const ENV_ENTRIES_MAX: usize = 256;
/// Most leases one process asks for.
pub const PROCESS_LEASES_MAX: usize = 16;
/// Bytes of each output stream's end kept in the terminal record.
pub const OUTPUT_TAIL_BYTES_MAX: usize = 4096;
/// Longest path (executable, working directory) in a record, in bytes.
pub const PATH_BYTES_MAX: usize = 4096;

/// An environment variable given to the command: the name in clear, the value
/// only as its blake3 (a value is often a secret; no secret enters the log).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize, utoipa::ToSchema)]
pub struct EnvDigest {
    pub name: String,
    #[serde(with = "hex32")]
    pub value_blake3: [u8; 32],
}

/// What is run, as resolved before anything starts.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct CommandSpec {
    /// Real path of the executable.
    pub exe: String,
    /// `dev:inode:size:mtime_ns` of that file when the intent was recorded.
    pub exe_fingerprint: String,
    /// `argv[0]` as given, then the arguments.
    pub argv: Vec<String>,
    /// Real path of the working directory.
    pub cwd: String,
    /// Sorted by name.
    pub env: Vec<EnvDigest>,
}

/// A subject at a generation: who a process or a lease belongs to.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct OwnerRef {
    pub subject: String,
    pub generation: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeaseWant {
    pub resource: String,
    pub mode: LeaseMode,
}

/// One output stream as captured: what was seen, what was kept (the first
/// `output_bytes_max` bytes, in the process's log file), the blake3 of what was kept,
/// and the last bytes seen (at most [`OUTPUT_TAIL_BYTES_MAX`]).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Capture {
    pub bytes_seen: u64,
    pub bytes_kept: u64,
    pub truncated: bool,
    #[serde(with = "hex32")]
    pub kept_blake3: [u8; 32],
    pub tail: Vec<u8>,
}

/// How a command that ran ended, as its runner saw it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Exit {
    pub exit_code: Option<i32>,
    pub signal: Option<i32>,
    pub timed_out: bool,
    pub cancelled: bool,
    pub duration_ms: u64,
    pub stdout: Capture,
    pub stderr: Capture,
}

/// The terminal fact about a process. Exactly one per process.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub enum ProcessEnd {
    /// The runner saw the command end.
    Exited(Exit),
    /// The runner is gone and recorded no exit: whether and how the command ended
    /// is not known. Never a guessed failure, and never run again.
    CompletedUnknown {
        /// The first failed check of the runner's identity (`process_dead`, ...).
        runner: String,
        /// Whether the command's own identity still matched a live process when
        /// this was recorded (it may outlive its runner).
        command_alive: bool,
    },
    /// Never ran: `PRESPAWN_ABANDONED` (no runner took it within the grace),
    /// `SPAWN_FAILED` (no runner or command could be started), `EXE_CHANGED` (the
    /// executable is no longer the file requested), `CANCELLED_BEFORE_START`.
    Failed { code: String, detail: String },
}

flat_enum_serialize!(ProcessEnd {
    0 Exited "exited" { 0: exit: Exit }
    1 CompletedUnknown "completed_unknown" { runner: runner: String, command_alive: command_alive: bool }
    2 Failed "failed" { code: code: String, detail: detail: String }
});

/// The code of a process cancelled before any runner started it (status
/// `cancelled`; it never ran): [`EndCode::CancelledBeforeStart`]'s text.
pub const CANCELLED_BEFORE_START: &str = "CANCELLED_BEFORE_START";

/// Why a process never ran: [`ProcessEnd::Failed`]'s `code`. The log holds the
/// text (`as_str`), as it always has; this is the one list of them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, strum::IntoStaticStr, strum::EnumString, strum::VariantArray)]
#[strum(serialize_all = "SCREAMING_SNAKE_CASE")]
pub enum EndCode {
    /// `recover`: no runner started it within the prespawn grace.
    PrespawnAbandoned,
    /// No runner could be started, or the runner could not start the command.
    SpawnFailed,
    /// The executable is no longer the file the request named.
    ExeChanged,
    /// Cancelled before any runner started it.
    CancelledBeforeStart,
}

impl EndCode {
    pub fn as_str(self) -> &'static str {
        self.into()
    }
}

impl ProcessEnd {
    /// A process that never ran, and why.
    pub fn never_ran(code: EndCode, detail: impl Into<String>) -> ProcessEnd {
        ProcessEnd::Failed { code: code.as_str().to_owned(), detail: detail.into() }
    }
}

/// Status of a process, derived from its records.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, strum::IntoStaticStr, strum::EnumString, utoipa::ToSchema,
)]
#[serde(rename_all = "snake_case")]
#[strum(serialize_all = "snake_case")]
pub enum ProcessStatus {
    Requested,
    Running,
    Succeeded,
    Failed,
    TimedOut,
    Cancelled,
    CompletedUnknown,
}

impl ProcessStatus {
    pub fn is_terminal(self) -> bool {
        !matches!(self, ProcessStatus::Requested | ProcessStatus::Running)
    }
    pub fn as_str(self) -> &'static str {
        self.into()
    }
}

impl ProcessEnd {
    pub fn status(&self) -> ProcessStatus {
        match self {
            ProcessEnd::Exited(e) if e.cancelled => ProcessStatus::Cancelled,
            ProcessEnd::Exited(e) if e.timed_out => ProcessStatus::TimedOut,
            ProcessEnd::Exited(e) if e.exit_code == Some(0) => ProcessStatus::Succeeded,
            ProcessEnd::Exited(_) => ProcessStatus::Failed,
            ProcessEnd::CompletedUnknown { .. } => ProcessStatus::CompletedUnknown,
            ProcessEnd::Failed { code, .. } if code == CANCELLED_BEFORE_START => ProcessStatus::Cancelled,
            ProcessEnd::Failed { .. } => ProcessStatus::Failed,
        }
    }
}

/// The runner's start: its own identity, and the command's (pid and start time:
/// what `cancel` checks before any signal).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Started {
    pub runner: Identity,
    pub command_pid: u32,
    pub command_start_ticks: u64,
    pub seq: u64,
    pub time_ms: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Ended {
    pub seq: u64,
    pub time_ms: u64,
    pub end: ProcessEnd,
    /// Leases this record ended.
    pub leases_released: Vec<u64>,
}

/// A supervised process in the projection.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Process {
    pub id: u64,
    pub request: Option<String>,
    #[serde(with = "hex32")]
    pub fingerprint: [u8; 32],
    pub command: CommandSpec,
    pub owner: Option<OwnerRef>,
    pub leases: Vec<u64>,
    pub timeout_ms: u64,
    pub output_bytes_max: u64,
    pub requested_seq: u64,
    pub requested_ms: u64,
    /// The host it runs on, on a log shared by hosts (`None`: not recorded).
    pub host: Option<String>,
    pub started: Option<Started>,
    pub cancel_requested_seq: Option<u64>,
    pub ended: Option<Ended>,
}

impl Process {
    pub fn status(&self) -> ProcessStatus {
        match (&self.ended, &self.started) {
            (Some(e), _) => e.end.status(),
            (None, Some(_)) => ProcessStatus::Running,
            (None, None) => ProcessStatus::Requested,
        }
    }
}

/// 32-byte digests as hex in JSON (and as plain bytes in bincode).
pub(crate) mod hex32 {
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(v: &[u8; 32], s: S) -> Result<S::Ok, S::Error> {
        if s.is_human_readable() { s.serialize_str(&crate::format::hex(v)) } else { serde::Serialize::serialize(v, s) }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<[u8; 32], D::Error> {
        if d.is_human_readable() {
            let s = String::deserialize(d)?;
            let mut out = [0u8; 32];
            if s.len() != 64 {
                return Err(serde::de::Error::custom("a digest is 64 hex digits"));
            }
            for (i, b) in out.iter_mut().enumerate() {
                *b = u8::from_str_radix(&s[2 * i..2 * i + 2], 16).map_err(serde::de::Error::custom)?;
            }
            Ok(out)
        } else {
            <[u8; 32]>::deserialize(d)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Proves: the end codes are the texts the log has always held (records
    /// written before they were an enum decode to the same statuses).
    #[test]
    fn end_codes_are_the_texts_in_the_log() {
        let texts: Vec<&str> = <EndCode as strum::VariantArray>::VARIANTS.iter().map(|c| c.as_str()).collect();
        assert_eq!(texts, ["PRESPAWN_ABANDONED", "SPAWN_FAILED", "EXE_CHANGED", "CANCELLED_BEFORE_START"]);
        assert_eq!(EndCode::CancelledBeforeStart.as_str(), CANCELLED_BEFORE_START);
        assert_eq!(ProcessEnd::never_ran(EndCode::CancelledBeforeStart, "").status(), ProcessStatus::Cancelled);
        assert_eq!(ProcessEnd::never_ran(EndCode::SpawnFailed, "").status(), ProcessStatus::Failed);
    }
}
