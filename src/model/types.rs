//! Record kinds and the values they carry. Every enum here is encoded by variant
//! index: variants are **append-only** — never reorder or remove one, or logs
//! written before stop meaning what they meant.

use serde::{Deserialize, Serialize};

/// Longest subject name, in bytes.
pub const SUBJECT_BYTES_MAX: usize = 256;
/// Longest free-text field (action, reason, note, holder), in bytes.
pub const TEXT_BYTES_MAX: usize = 1024;
/// Longest host id (`OwnerHost`, `ProcessHost`, `StalenessObserved`), in bytes.
pub const HOST_BYTES_MAX: usize = 255;
/// Most events in one transaction.
pub const TXN_EVENTS_MAX: usize = 64;
/// Most conditions in one transaction.
pub const TXN_CONDITIONS_MAX: usize = 64;

/// Identity evidence of an owner process. Liveness is judged on all of it: a pid
/// alone says nothing once it has been reused. (Its five fields are what every
/// build records and reads; the pid namespace the pid was seen in travels as an
/// event of its own, [`Event::OwnerPidNamespace`], so that a build that does not
/// know it stops at the record instead of misjudging the owner.)
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Identity {
    pub instance: uuid::Uuid,
    pub pid: u32,
    /// Start time of the process in clock ticks since boot (`/proc/<pid>/stat`, field 22).
    pub start_ticks: u64,
    /// `/proc/sys/kernel/random/boot_id`.
    pub boot_id: String,
    /// Fingerprint of the running image: `inode:DEV:INO` of the file behind
    /// `/proc/<pid>/exe` (which survives an upgrade on disk), `unknown` when
    /// unreadable, `remote` for an owner on another host.
    pub exe: String,
}

/// Why an owner is provably dead; the first failing check is reported.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum DeathReason {
    ProcessDead,
    StartTimeChanged,
    BootChanged,
    ExeChanged,
}

impl DeathReason {
    pub fn code(self) -> &'static str {
        match self {
            DeathReason::ProcessDead => "process_dead",
            DeathReason::StartTimeChanged => "start_time_changed",
            DeathReason::BootChanged => "boot_changed",
            DeathReason::ExeChanged => "exe_changed",
        }
    }
}

/// What a liveness check saw of a recorded owner's pid, at the moment it judged
/// it dead: a reader can re-check the verdict against the identity on record.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Observed {
    /// This machine's boot id when it looked.
    pub boot_id: String,
    /// The prober's pid namespace (0: unknown).
    pub pid_ns: u64,
    /// `None`: no such process (or only its zombie), and nothing more was seen.
    pub start_ticks: Option<u64>,
    /// The running image's fingerprint, when the process was there to look at.
    pub exe: Option<String>,
}

/// Who asked for a refused operation: evidence kept with the refusal. The CLI's
/// caller is the process that ran it (its parent), an embedding program is its own
/// process, and a daemon's HTTP client is known by its `instance` alone (pid 0,
/// `exe` = `remote`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CallerId {
    pub pid: u32,
    pub start_ticks: u64,
    pub exe: String,
    pub pid_ns: u64,
    /// `--instance` (or the request's `instance`), when given.
    pub instance: Option<uuid::Uuid>,
}

impl CallerId {
    /// The caller as one coalescing key: pid, start time and instance (an `exe`
    /// cannot change without the start time changing).
    pub fn key(&self) -> String {
        let instance = self.instance.map(|i| i.to_string()).unwrap_or_default();
        format!("{}:{}:{}:{instance}", self.pid_ns, self.pid, self.start_ticks)
    }
}

/// What a refused data write tried to write: its blake3, size and first
/// [`REFUSED_CONTENT_HEAD_BYTES`] bytes (cut at a character boundary). Evidence,
/// never data.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RefusedContent {
    #[serde(with = "super::process::hex32")]
    pub blake3: [u8; 32],
    pub bytes: u64,
    /// Its first bytes (at most `REFUSED_CONTENT_HEAD_BYTES`), as text.
    #[serde(rename = "head")]
    pub first_bytes: String,
}

impl RefusedContent {
    pub fn of(text: &str) -> Self {
        let mut end = text.len().min(REFUSED_CONTENT_HEAD_BYTES);
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        RefusedContent {
            blake3: *blake3::hash(text.as_bytes()).as_bytes(),
            bytes: text.len() as u64,
            first_bytes: text[..end].into(),
        }
    }
}

/// The refusal codes whose attempts are kept as evidence (coalesced, see
/// [`Event::Refused`]): a writer fenced out or writing to a released subject,
/// and the contested claims and takeovers. `ALREADY_ACTIVE` and
/// `STALE_REQUIRES_TAKEOVER` are a standby's polling, and are not recorded.
pub const RECORDED_REFUSALS: [&str; 6] =
    ["FENCED", "NOT_ACTIVE", "IDENTITY_UNCERTAIN", "TAKEOVER_RACE", "TAKEOVER_ACTIVE_REFUSED", "BUSY"];

/// Proof, gathered by the writer before it appends, that the current owner is dead.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeadOwner {
    pub generation: u64,
    pub instance: uuid::Uuid,
    pub reason: DeathReason,
}

/// A mutation lock's attribution: what the holder is doing, for which request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct LockIntent {
    pub action: String,
    pub request: String,
}

/// In JSON `read` / `write` (the capitalised spellings earlier builds wrote and
/// sent are still accepted). Records hold the variant index: names never reach a log.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum LeaseMode {
    #[serde(alias = "Read")]
    Read,
    #[serde(alias = "Write")]
    Write,
}

impl LeaseMode {
    /// As in JSON: `read` or `write`.
    pub fn as_str(self) -> &'static str {
        match self {
            LeaseMode::Read => "read",
            LeaseMode::Write => "write",
        }
    }
}

/// A condition of a transaction: all must hold or nothing is appended.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Condition {
    SubjectAt { subject: String, generation: u64 },
    SubjectAbsent { subject: String },
    LogAt { seq: u64 },
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Event {
    /// Take a free subject, or one whose owner is provably dead (`previous`).
    Claim {
        subject: String,
        owner: Identity,
        stale_after_ms: u64,
        lock: Option<LockIntent>,
        previous: Option<DeadOwner>,
    },
    Heartbeat {
        subject: String,
        generation: u64,
    },
    Release {
        subject: String,
        generation: u64,
    },
    /// Replace a stale (not provably dead) owner, naming exactly what was seen.
    Takeover {
        subject: String,
        expect_generation: u64,
        expect_heartbeat_ms: u64,
        owner: Identity,
        stale_after_ms: u64,
        reason: String,
    },
    /// New generation, same owner: fences every holder of the old token.
    RotateFence {
        subject: String,
        generation: u64,
    },
    /// Data written by an owner under its generation. Kept always; authoritative
    /// only while that generation is current (a retired owner's late notes are not).
    Note {
        subject: String,
        generation: u64,
        text: String,
    },
    /// Audit of refused writes by a stale writer (coalesced: `count` attempts).
    FencedAttempts {
        subject: String,
        writer: uuid::Uuid,
        op: String,
        presented: u64,
        current: u64,
        count: u64,
        first_ms: u64,
        last_ms: u64,
    },
    LeaseAcquire {
        resource: String,
        mode: LeaseMode,
        holder: String,
        ttl_ms: u64,
    },
    LeaseRelease {
        lease: u64,
        token: u64,
    },
    /// A snapshot of the projection as of `snapshot_seq` was written with this
    /// blake3 of its body: the chain vouches for it, and a snapshot no checkpoint
    /// vouches for is never adopted.
    Checkpoint {
        snapshot_seq: u64,
        digest: [u8; 32],
    },
    /// The intent to run a command (the projection gives it the next process id),
    /// and the leases it holds, all or none. `owner`, when given, must be current.
    SpawnRequested {
        #[serde(with = "super::process::hex32")]
        fingerprint: [u8; 32],
        command: super::CommandSpec,
        owner: Option<super::OwnerRef>,
        leases: Vec<super::LeaseWant>,
        timeout_ms: u64,
        output_bytes_max: u64,
    },
    /// A runner took the process and started its command: at most once.
    ProcessStarted {
        process: u64,
        runner: Identity,
        command_pid: u32,
        command_start_ticks: u64,
    },
    /// A cancel was asked for (before any signal); `by` is the owner presented.
    ProcessCancelRequested {
        process: u64,
        by: Option<super::OwnerRef>,
    },
    /// The one terminal record of a process; it ends every lease the process held.
    /// Never blocked by fencing: it is evidence, not a decision.
    ProcessEnded {
        process: u64,
        end: super::ProcessEnd,
    },
    /// A lease held by an owner tenure (`owner` must be current): it ends in the
    /// record that ends the tenure (release, takeover, claim over a dead owner).
    OwnerLeaseAcquire {
        resource: String,
        mode: LeaseMode,
        owner: super::OwnerRef,
        ttl_ms: u64,
    },
    /// A daemon handing over (`home` is its subject and generation): how every
    /// request it had admitted was settled. Evidence; always accepted.
    Cutover {
        home: super::OwnerRef,
        reason: String,
        settled: Vec<SettledRequest>,
        /// Requests beyond [`CUTOVER_SETTLED_MAX`] (counted, not listed).
        more: u64,
    },
    /// Data writes refused because the writer's generation is not the subject's
    /// current one (or its tenure ended), coalesced like [`Event::FencedAttempts`]:
    /// what the first of them tried to write is kept as evidence — its blake3, size
    /// and first [`REFUSED_CONTENT_HEAD_BYTES`] bytes — never as data.
    RefusedWrites {
        subject: String,
        writer: uuid::Uuid,
        op: String,
        presented: u64,
        current: u64,
        /// The last sequence of the presented generation's authoritative history,
        /// when a takeover or a dead-owner claim ended it.
        retired_cut_off_seq: Option<u64>,
        count: u64,
        first_ms: u64,
        last_ms: u64,
        content_blake3: [u8; 32],
        content_bytes: u64,
        content_head: String,
    },
    /// What the writer saw of a dead owner when it claimed over it — recorded in
    /// the claim's own transaction, after the claim: the evidence behind
    /// [`DeadOwner::reason`]. Evidence only; it changes no state.
    DeathObserved {
        subject: String,
        /// The generation whose owner was judged dead.
        generation: u64,
        pid: u32,
        reason: DeathReason,
        observed: Observed,
    },
    /// Refused attempts of one caller with one code on one subject, coalesced: at
    /// most one record per (subject, code, operation, caller) per window (a second), across
    /// processes. `count` is the attempts its writer saw in the window; `first_ms`
    /// / `last_ms` bound them. Evidence, never a decision; a subject that never
    /// existed gets no entry from it.
    Refused {
        subject: String,
        code: String,
        /// The event kind that was refused (`heartbeat`, `note`, `claim`, …).
        op: String,
        caller: CallerId,
        writer: uuid::Uuid,
        /// The generation the caller presented (or expected), when it named one.
        presented: Option<u64>,
        current: u64,
        /// When a takeover or a dead-owner claim ended the presented generation:
        /// the last sequence of its authoritative history.
        retired_cut_off_seq: Option<u64>,
        count: u64,
        first_ms: u64,
        last_ms: u64,
        /// For a refused data write: what the first of the window tried to write.
        content: Option<RefusedContent>,
    },
    /// The pid namespace (inode of the prober's `/proc/self/ns/pid`) the owner a
    /// claim or takeover of the same transaction installs was seen in: a pid from
    /// another namespace is never judged as if it were ours.
    OwnerPidNamespace {
        subject: String,
        pid_ns: u64,
    },
    /// The host (see `ledger::identity::host_id`) of the owner a claim or
    /// takeover of the same transaction installs — recorded on a log shared by
    /// hosts: an owner on another host is never judged from this host's `/proc`.
    OwnerHost {
        subject: String,
        host: String,
    },
    /// The host the spawn of the same transaction runs on (its runner is started
    /// there): a process is supervised, recovered and settled on its own host.
    ProcessHost {
        host: String,
    },
    /// The staleness behind the takeover of `subject` in the same transaction,
    /// judged on the observer's own clock (a log shared by hosts whose clocks
    /// differ): its writer, on `host`, watched `subject` at `generation` with its
    /// last heartbeat at `heartbeat_ms` (as the owner wrote it, by the owner's
    /// clock) and saw no change for `watched_ms` of its own monotonic time. The
    /// takeover is judged on this evidence, not on the difference of two hosts'
    /// wall clocks.
    StalenessObserved {
        subject: String,
        generation: u64,
        heartbeat_ms: u64,
        watched_ms: u64,
        host: String,
    },
}

/// How much of a refused data write's content its audit record keeps.
pub const REFUSED_CONTENT_HEAD_BYTES: usize = 256;

/// Most settled requests listed in one cutover record.
pub const CUTOVER_SETTLED_MAX: usize = 1024;

/// One admitted request at a cutover and how it was settled: `committed` (with
/// its sequence), `not_committed` (withdrawn; never appended later), or
/// `outcome_unknown` (a spawn whose runner had not recorded its start).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SettledRequest {
    pub request: String,
    pub op: String,
    pub how: String,
    pub seq: Option<u64>,
}

impl Event {
    pub fn kind(&self) -> &'static str {
        match self {
            Event::Claim { .. } => "claim",
            Event::Heartbeat { .. } => "heartbeat",
            Event::Release { .. } => "release",
            Event::Takeover { .. } => "takeover",
            Event::RotateFence { .. } => "rotate_fence",
            Event::Note { .. } => "note",
            Event::FencedAttempts { .. } => "fenced_attempts",
            Event::LeaseAcquire { .. } => "lease_acquire",
            Event::LeaseRelease { .. } => "lease_release",
            Event::Checkpoint { .. } => "checkpoint",
            Event::SpawnRequested { .. } => "spawn_requested",
            Event::ProcessStarted { .. } => "process_started",
            Event::ProcessCancelRequested { .. } => "process_cancel_requested",
            Event::ProcessEnded { .. } => "process_ended",
            Event::OwnerLeaseAcquire { .. } => "owner_lease_acquire",
            Event::Cutover { .. } => "cutover",
            Event::RefusedWrites { .. } => "refused_writes",
            Event::DeathObserved { .. } => "death_observed",
            Event::Refused { .. } => "refused",
            Event::OwnerPidNamespace { .. } => "owner_pid_namespace",
            Event::OwnerHost { .. } => "owner_host",
            Event::ProcessHost { .. } => "process_host",
            Event::StalenessObserved { .. } => "staleness_observed",
        }
    }

    /// The subject this event changes, if it is a subject event.
    pub fn subject(&self) -> Option<&str> {
        match self {
            Event::Claim { subject, .. }
            | Event::Heartbeat { subject, .. }
            | Event::Release { subject, .. }
            | Event::Takeover { subject, .. }
            | Event::RotateFence { subject, .. }
            | Event::Note { subject, .. }
            | Event::FencedAttempts { subject, .. }
            | Event::RefusedWrites { subject, .. }
            | Event::DeathObserved { subject, .. }
            | Event::Refused { subject, .. }
            | Event::OwnerPidNamespace { subject, .. }
            | Event::OwnerHost { subject, .. }
            | Event::StalenessObserved { subject, .. } => Some(subject),
            Event::LeaseAcquire { .. }
            | Event::LeaseRelease { .. }
            | Event::Checkpoint { .. }
            | Event::SpawnRequested { .. }
            | Event::ProcessStarted { .. }
            | Event::ProcessCancelRequested { .. }
            | Event::ProcessEnded { .. }
            | Event::OwnerLeaseAcquire { .. }
            | Event::ProcessHost { .. }
            | Event::Cutover { .. } => None,
        }
    }
}

/// A request id and the digest of the caller's intent, for idempotency.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RequestTag {
    pub id: String,
    pub digest: [u8; 32],
}

/// One transaction = one log record. `time_ms` is the writer's clock when it
/// validated the transaction: time enters the model only through records.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Txn {
    pub request: Option<RequestTag>,
    pub time_ms: u64,
    pub writer: uuid::Uuid,
    pub conditions: Vec<Condition>,
    pub events: Vec<Event>,
}

impl Txn {
    /// A transaction of `events` with no conditions and no request id (`submit`
    /// sets the request id from its own argument).
    pub fn new(time_ms: u64, writer: uuid::Uuid, events: Vec<Event>) -> Txn {
        Txn { request: None, time_ms, writer, conditions: vec![], events }
    }
}

/// Validate a subject name: 1..=256 bytes, no control characters.
pub fn validate_subject(name: &str) -> Result<(), super::Refusal> {
    // Printable ASCII (nearly every subject) needs no decoding of characters.
    let printable_ascii = name.bytes().all(|b| (0x20..0x7f).contains(&b));
    if name.is_empty() || name.len() > SUBJECT_BYTES_MAX || (!printable_ascii && name.chars().any(char::is_control)) {
        return Err(super::Refusal::InvalidSubject {
            subject: name.chars().take(64).collect(),
            detail: format!("a subject is 1 to {SUBJECT_BYTES_MAX} bytes with no control characters"),
        });
    }
    Ok(())
}

pub(crate) fn validate_text(field: &'static str, text: &str) -> Result<(), super::Refusal> {
    if text.len() > TEXT_BYTES_MAX {
        return Err(super::Refusal::InvalidInput { detail: format!("{field} exceeds {TEXT_BYTES_MAX} bytes") });
    }
    Ok(())
}
