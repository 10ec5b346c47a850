//! `ops`: every operation the front ends offer (the CLI today; the daemon's HTTP
//! handlers and the supervisor next), as a library: a typed request (the CLI's
//! flags, the HTTP body in snake_case) → its transaction builder → its request-id
//! intent digest → a typed, `Serialize` response or one error body. A request id
//! therefore hashes the same intent whichever front end it arrives by.
//!
//! The decisions the CLI binary used to make live here: the dead-owner probe a
//! claim records as evidence, and the status verdict of `state`.

mod error;
pub mod liveness;
#[cfg(feature = "etcd")]
pub mod transfer;
pub mod version;

pub use error::{ErrorBody, ErrorDetail, OpError};

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::ledger::{Committed, Ledger, ReadView, RequestStatus, identity, intent_digest};
use crate::model::{
    Event, Identity, Lease, LeaseMode, LockIntent, Outcome, Projection, Refusal, TenureEnd, Txn, validate_subject,
};

/// Default staleness of a claim (ms without a heartbeat before a takeover may
/// replace a live-looking owner).
pub const STALE_AFTER_MS_DEFAULT: u64 = 20_000;
/// Default lease time to live.
pub const LEASE_TTL_MS_DEFAULT: u64 = 30_000;

fn stale_after_ms_default() -> u64 {
    STALE_AFTER_MS_DEFAULT
}

fn lease_ttl_ms_default() -> u64 {
    LEASE_TTL_MS_DEFAULT
}

/// Who is asking, as far as the front end knows: the process a claim is held for
/// when the request names none (the CLI: its parent, the shell or program that ran
/// it).
#[derive(Debug, Clone, Copy, Default)]
pub struct Caller {
    pub default_pid: Option<u32>,
    /// A request naming no pid is an owner on another host (the daemon's clients):
    /// identified by its instance only, never provably dead.
    pub remote: bool,
}

impl Caller {
    /// Who asks, as the evidence a recorded refusal keeps: the process
    /// `default_pid` names (the CLI's parent; the daemon itself), or a remote
    /// client known by the `instance` it named.
    pub fn evidence(&self, instance: Option<uuid::Uuid>) -> crate::model::CallerId {
        match self.default_pid {
            Some(pid) if !self.remote => identity::caller_of(pid, instance),
            _ if self.remote => identity::remote_caller(instance),
            _ => identity::caller_of(std::process::id(), instance),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ClaimRequest {
    pub subject: String,
    #[serde(default)]
    pub pid: Option<u32>,
    #[serde(default)]
    pub instance: Option<uuid::Uuid>,
    #[serde(default = "stale_after_ms_default")]
    pub stale_after_ms: u64,
    /// Claim as a mutation lock doing this action (requires `request_id`).
    #[serde(default)]
    pub action: Option<String>,
    #[serde(default)]
    pub request_id: Option<String>,
}

/// Heartbeat, release and fence rotation name a subject and the generation held.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct GenerationRequest {
    pub subject: String,
    pub generation: u64,
    #[serde(default)]
    pub request_id: Option<String>,
    /// The caller's instance, named in the evidence of a refusal (not part of the
    /// request's intent).
    #[serde(default)]
    pub instance: Option<uuid::Uuid>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct NoteRequest {
    pub subject: String,
    pub generation: u64,
    pub text: String,
    #[serde(default)]
    pub request_id: Option<String>,
    /// The caller's instance, named in the evidence of a refusal (not part of the
    /// request's intent).
    #[serde(default)]
    pub instance: Option<uuid::Uuid>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct TakeoverRequest {
    pub subject: String,
    pub expect_generation: u64,
    pub expect_heartbeat_ms: u64,
    #[serde(default)]
    pub pid: Option<u32>,
    #[serde(default)]
    pub instance: Option<uuid::Uuid>,
    #[serde(default = "stale_after_ms_default")]
    pub stale_after_ms: u64,
    #[serde(default)]
    pub reason: String,
    #[serde(default)]
    pub request_id: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct LeaseAcquireRequest {
    pub resource: String,
    pub mode: LeaseMode,
    /// A free-text holder, or empty when `owner` holds the lease.
    #[serde(default)]
    pub holder: String,
    /// Held by this owner's tenure at `generation` (which must be current): the
    /// lease ends in the record that ends the tenure.
    #[serde(default)]
    pub owner: Option<String>,
    #[serde(default)]
    pub generation: Option<u64>,
    /// 1..=`LEASE_TTL_MS_MAX` (a day).
    #[serde(default = "lease_ttl_ms_default")]
    #[schema(minimum = 1, maximum = 86_400_000)]
    pub ttl_ms: u64,
    #[serde(default)]
    pub request_id: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct LeaseReleaseRequest {
    pub lease: u64,
    pub token: u64,
    #[serde(default)]
    pub request_id: Option<String>,
}

/// Which generation-only operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GenerationOp {
    Heartbeat,
    Release,
    RotateFence,
}

/// An outcome as a flat JSON object with its `kind` (`{"kind": "claimed", ...}`).
#[derive(Debug, Clone)]
pub struct FlatOutcome(pub Outcome);

impl Serialize for FlatOutcome {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.0.to_json().serialize(s)
    }
}

/// The answer to a committed (or deduplicated, or no-op) mutation: one JSON object
/// of the outcome's fields (its `kind` among them), `seq` and `deduplicated`.
#[derive(Debug, Clone)]
pub struct OpResponse {
    pub outcome: FlatOutcome,
    /// Sequence of the record, or `None` when nothing needed writing.
    pub seq: Option<u64>,
    /// The request id had already committed this content; this is that result.
    pub deduplicated: bool,
}

impl OpResponse {
    /// The JSON object, built in one pass: the outcome's object with `seq` and
    /// `deduplicated` added (what `#[serde(flatten)]` gave, without building the
    /// outcome's object twice and copying it into a third).
    pub fn to_json(&self) -> serde_json::Map<String, serde_json::Value> {
        let serde_json::Value::Object(mut m) = self.outcome_json() else {
            unreachable!("an outcome is a JSON object with its kind")
        };
        m.insert("seq".into(), self.seq.into());
        m.insert("deduplicated".into(), self.deduplicated.into());
        m
    }

    fn outcome_json(&self) -> serde_json::Value {
        self.outcome.0.to_json()
    }
}

impl Serialize for OpResponse {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.to_json().serialize(s)
    }
}

/// How a request admitted by a daemon ended, for its cutover record (decided from
/// the operation's typed answer; its words are the record's `how`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Settlement {
    /// In the log at `seq` (or nothing needed writing: `None`).
    Committed { seq: Option<u64> },
    /// A run whose spawn intent is at `seq` but whose start its runner had not
    /// recorded: reconcile before any retry.
    OutcomeUnknown { seq: u64 },
    /// Withdrawn by the drain: never in the log.
    NotCommitted,
    /// Refused with this code.
    Refused { code: &'static str },
}

impl Settlement {
    /// The settlement of a failed operation.
    pub fn of_error(e: &OpError) -> Settlement {
        match e {
            OpError::Ledger(crate::ledger::LedgerError::Draining) => Settlement::NotCommitted,
            e => Settlement::Refused { code: e.code() },
        }
    }

    /// As the cutover record says it: `committed`, `outcome_unknown`,
    /// `not_committed`, `refused:CODE`.
    pub fn how(&self) -> String {
        match self {
            Settlement::Committed { .. } => "committed".into(),
            Settlement::OutcomeUnknown { .. } => "outcome_unknown".into(),
            Settlement::NotCommitted => "not_committed".into(),
            Settlement::Refused { code } => format!("refused:{code}"),
        }
    }

    /// The record it names, if any.
    pub fn seq(&self) -> Option<u64> {
        match self {
            Settlement::Committed { seq } => *seq,
            Settlement::OutcomeUnknown { seq } => Some(*seq),
            Settlement::NotCommitted | Settlement::Refused { .. } => None,
        }
    }
}

impl OpResponse {
    /// A committed (or deduplicated, or no-op) mutation's settlement.
    pub fn settlement(&self) -> Settlement {
        Settlement::Committed { seq: self.seq }
    }
}

/// The intent a request id stands for: blake3 of the operation's name and content.
/// These tuples are part of the log's meaning (digests of earlier requests are in
/// the log): they never change.
pub trait Intent {
    fn request_id(&self) -> Option<&str>;
    fn digest(&self) -> [u8; 32];
    fn tag(&self) -> Option<crate::model::RequestTag> {
        self.request_id().map(|id| crate::model::RequestTag { id: id.to_owned(), digest: self.digest() })
    }
}

impl Intent for ClaimRequest {
    fn request_id(&self) -> Option<&str> {
        self.request_id.as_deref()
    }
    fn digest(&self) -> [u8; 32] {
        intent_digest(&("claim", &self.subject, self.pid, self.instance, self.stale_after_ms, &self.action))
    }
}

impl GenerationOp {
    fn name(self) -> &'static str {
        match self {
            GenerationOp::Heartbeat => "heartbeat",
            GenerationOp::Release => "release",
            GenerationOp::RotateFence => "rotate-fence",
        }
    }
}

/// A generation request with its operation (the digest names the operation).
pub struct Generation<'a>(pub GenerationOp, pub &'a GenerationRequest);

impl Intent for Generation<'_> {
    fn request_id(&self) -> Option<&str> {
        self.1.request_id.as_deref()
    }
    fn digest(&self) -> [u8; 32] {
        intent_digest(&(self.0.name(), &self.1.subject, self.1.generation))
    }
}

impl Intent for NoteRequest {
    fn request_id(&self) -> Option<&str> {
        self.request_id.as_deref()
    }
    fn digest(&self) -> [u8; 32] {
        intent_digest(&("note", &self.subject, self.generation, &self.text))
    }
}

impl Intent for TakeoverRequest {
    fn request_id(&self) -> Option<&str> {
        self.request_id.as_deref()
    }
    fn digest(&self) -> [u8; 32] {
        // `stale_after_ms` is not part of this digest (as first written); keep it so.
        let t = self;
        intent_digest(&(
            "takeover",
            &t.subject,
            t.expect_generation,
            t.expect_heartbeat_ms,
            t.pid,
            t.instance,
            &t.reason,
        ))
    }
}

impl Intent for LeaseAcquireRequest {
    fn request_id(&self) -> Option<&str> {
        self.request_id.as_deref()
    }
    fn digest(&self) -> [u8; 32] {
        match (&self.owner, self.generation) {
            (None, None) => intent_digest(&("lease-acquire", &self.resource, self.mode, &self.holder, self.ttl_ms)),
            (owner, generation) => {
                intent_digest(&("lease-acquire-owner", &self.resource, self.mode, owner, generation, self.ttl_ms))
            }
        }
    }
}

impl Intent for LeaseReleaseRequest {
    fn request_id(&self) -> Option<&str> {
        self.request_id.as_deref()
    }
    fn digest(&self) -> [u8; 32] {
        intent_digest(&("lease-release", self.lease, self.token))
    }
}

/// Refuse an invalid subject name (before anything is opened). Beyond the state
/// machine's own rule (1..=256 bytes, no control characters), new names may not be
/// blank, hold whitespace other than a plain space, or invisible format characters
/// (zero-width, bidirectional overrides, …): two subjects that print alike must be
/// the same subject. (Checked here, at the front door, not on replay: names already
/// in a log stay readable.)
pub fn valid(s: &str) -> Result<(), OpError> {
    validate_subject(s).map_err(OpError::Refused)?;
    let bad = |detail: &str| {
        Err(OpError::Refused(Refusal::InvalidSubject { subject: s.chars().take(64).collect(), detail: detail.into() }))
    };
    if s.trim().is_empty() {
        return bad("a subject is not blank");
    }
    if let Some(c) = s.chars().find(|&c| (c.is_whitespace() && c != ' ') || is_format_char(c)) {
        return bad(&format!(
            "a subject holds no whitespace but a plain space and no invisible format character (found U+{:04X})",
            c as u32
        ));
    }
    Ok(())
}

/// Unicode format characters (category Cf) and the like: invisible, or reordering
/// what is shown.
fn is_format_char(c: char) -> bool {
    matches!(c as u32,
        0x00AD | 0x034F | 0x061C | 0x115F | 0x1160 | 0x17B4 | 0x17B5 | 0x180B..=0x180F | 0x200B..=0x200F
        | 0x202A..=0x202E | 0x2060..=0x206F | 0x3164 | 0xFE00..=0xFE0F | 0xFEFF | 0xFFA0 | 0xFFF0..=0xFFFB
        | 0x0600..=0x0605 | 0x06DD | 0x070F | 0x08E2 | 0x110BD | 0x110CD | 0x1D173..=0x1D17A
        | 0xE0000..=0xE0FFF)
}

/// Longest lease time to live a request may ask for (a day): a lease outliving its
/// holder by more is a resource lost, not a lease.
pub const LEASE_TTL_MS_MAX: u64 = 24 * 60 * 60 * 1000;

/// The identity evidence of `pid` (default: the caller's), probed now.
fn owner(pid: Option<u32>, instance: Option<uuid::Uuid>, caller: Caller) -> Result<Identity, OpError> {
    if pid.is_none() && caller.default_pid.is_none() && caller.remote {
        return Ok(identity::remote(instance.unwrap_or_else(uuid::Uuid::new_v4)));
    }
    let pid = pid.or(caller.default_pid).ok_or_else(|| OpError::Usage {
        code: "INVALID_INPUT",
        message: "the request names no pid, and the caller has none to give".into(),
    })?;
    identity::probe(pid, instance.unwrap_or_else(uuid::Uuid::new_v4))
        .ok_or_else(|| OpError::Usage { code: "NO_SUCH_PROCESS", message: format!("no live process with pid {pid}") })
}

/// Evidence that the current owner of `subject` is dead, judged on its identity
/// now: what a claim over it records — the proof the state machine checks, and
/// what was observed (a `DeathObserved` event in the same transaction).
pub fn dead_owner_evidence(
    here: &identity::Here,
    p: &Projection,
    subject: &str,
) -> Option<(crate::model::DeadOwner, Event)> {
    let s = p.subject(subject)?;
    let o = s.owner.as_ref()?;
    let liveness::Liveness::Dead { reason, observed } =
        liveness::liveness(here, &o.identity, o.pid_ns, o.host.as_deref())
    else {
        return None;
    };
    let proof = p.dead_owner(subject, reason)?;
    let seen = Event::DeathObserved {
        subject: subject.to_owned(),
        generation: s.generation,
        pid: o.identity.pid,
        reason,
        observed,
    };
    Some((proof, seen))
}

/// The event that records which pid namespace a local owner's pid was seen in
/// (none for a remote owner, or when this process cannot tell its namespace).
fn pid_namespace_of(subject: &str, owner: &Identity) -> Option<Event> {
    if owner.pid == 0 {
        return None;
    }
    let pid_ns = identity::pid_ns();
    (pid_ns != 0).then(|| Event::OwnerPidNamespace { subject: subject.to_owned(), pid_ns })
}

/// The event that records which host a local owner runs on, on a log shared by
/// hosts (none for a remote owner, or on a log on one host).
fn host_of(here: &identity::Here, subject: &str, owner: &Identity) -> Option<Event> {
    (here.shared && owner.pid != 0).then(|| Event::OwnerHost { subject: subject.to_owned(), host: here.host.clone() })
}

/// The longest the CLI's takeover on a log shared by hosts waits to have watched
/// the owner's heartbeat unchanged for the owner's staleness, on this writer's
/// own clock (see `ledger::observer`): 5 minutes (the daemon's: its longest wait,
/// `daemon::HTTP_WAIT_MS_MAX`). An owner whose staleness is longer is refused
/// `TAKEOVER_ACTIVE_REFUSED` with what was watched (`age_ms`); the watch goes on
/// in a writer that lives on (the daemon), so a retry after the rest of the
/// staleness succeeds.
pub const TAKEOVER_WATCH_MS_MAX: u64 = 300_000;

/// How often a takeover's watch looks at the log again.
const TAKEOVER_WATCH_POLL_MS: u64 = 100;

/// On a log shared by hosts, before a takeover: watch the owner of `req.subject`
/// on this writer's own monotonic clock until its heartbeat has not changed for
/// its staleness (waiting at most `wait_ms_max` after its first look, which
/// starts the watch; none if the staleness is longer), or until it changes — a heartbeat, a new tenure (the takeover is then
/// judged, and refused, on the state it finds). A log on one host judges
/// staleness on its one clock: no wait.
pub fn watch_before_takeover(ledger: &Ledger, req: &TakeoverRequest, wait_ms_max: u64) -> Result<(), OpError> {
    if !ledger.here().shared {
        return Ok(());
    }
    valid(&req.subject)?;
    // The wait is bounded from the first look, where the watch starts: a first
    // catch-up held up (an etcd cluster electing a leader) spends none of it.
    let mut first_look = None;
    loop {
        let seen = ledger.refresh_with(|p| {
            let s = p.subject(&req.subject)?;
            let o = s.owner.as_ref()?;
            Some((s.generation, o.heartbeat_ms, o.stale_after_ms))
        })?;
        let Some((generation, heartbeat_ms, stale_after_ms)) = seen else { return Ok(()) };
        if (generation, heartbeat_ms) != (req.expect_generation, req.expect_heartbeat_ms) {
            return Ok(());
        }
        let watched_ms = ledger.observer().watched_ms(&req.subject, generation, heartbeat_ms);
        let waited_ms = first_look.get_or_insert_with(Instant::now).elapsed().as_millis() as u64;
        // A staleness past the bound is judged (and refused) on what was
        // watched: never a wait that long.
        let limit_ms = stale_after_ms.saturating_add(2 * TAKEOVER_WATCH_POLL_MS).min(wait_ms_max);
        if watched_ms > stale_after_ms || stale_after_ms >= wait_ms_max || waited_ms >= limit_ms {
            return Ok(());
        }
        let left_ms = stale_after_ms + 1 - watched_ms;
        std::thread::sleep(Duration::from_millis(left_ms.clamp(1, TAKEOVER_WATCH_POLL_MS)));
    }
}

fn single(events: Vec<Event>) -> impl FnMut(&Projection, u64, uuid::Uuid) -> Result<Txn, Refusal> + Send + 'static {
    move |_p, now_ms, writer| Ok(Txn::new(now_ms, writer, events.clone()))
}

/// The transaction builder of a planned operation (it may run more than once).
type Build = Box<dyn FnMut(&Projection, u64, uuid::Uuid) -> Result<Txn, Refusal> + Send>;

/// One operation checked and ready to submit: who asks (`None`: this process),
/// its request tag and its transaction builder. The CLI submits it on its own
/// thread ([`Planned::submit`]); the daemon awaits it ([`Planned::submit_async`]):
/// one code path, two ways to wait.
pub struct Planned {
    caller: Option<crate::model::CallerId>,
    tag: Option<crate::model::RequestTag>,
    build: Build,
}

impl Planned {
    fn new(
        caller: Option<crate::model::CallerId>,
        tag: Option<crate::model::RequestTag>,
        build: impl FnMut(&Projection, u64, uuid::Uuid) -> Result<Txn, Refusal> + Send + 'static,
    ) -> Planned {
        Planned { caller, tag, build: Box::new(build) }
    }

    pub fn submit(self, ledger: &Ledger) -> Result<OpResponse, OpError> {
        let c = match &self.caller {
            Some(who) => ledger.submit_as(who, self.tag, self.build)?,
            None => ledger.submit(self.tag, self.build)?,
        };
        respond(c)
    }

    pub async fn submit_async(self, ledger: &std::sync::Arc<Ledger>) -> Result<OpResponse, OpError> {
        respond(ledger.submit_as_async(self.caller, self.tag, self.build).await?)
    }
}

/// A request id is printable text: an empty one is no request id at all, and one
/// with a control character (ESC, newline, NUL, …) is refused before it can reach
/// the log, where every tool and client would show it. Both are invalid input.
/// (The model does not judge this on replay: logs of earlier builds keep reading.)
pub(crate) fn valid_request_id(id: Option<&str>) -> Result<(), OpError> {
    match id {
        Some(id) if id.trim().is_empty() => {
            Err(OpError::Refused(Refusal::InvalidInput { detail: "a request id is not empty".into() }))
        }
        Some(id) if id.chars().any(crate::view::is_hidden) => Err(OpError::Refused(Refusal::InvalidInput {
            detail: format!(
                "a request id is printable text, without control or invisible format characters: {:?}",
                id.chars().take(64).collect::<String>()
            ),
        })),
        _ => Ok(()),
    }
}

/// One committed single-event transaction as a response; a lease release with the
/// wrong token is committed (the attempt is on record) but answered as an error.
fn respond(c: Committed) -> Result<OpResponse, OpError> {
    let outcome = c.outcomes.into_iter().next().expect("one event, one outcome");
    let failed = matches!(outcome, Outcome::LeaseReleaseFailed { .. });
    let response = OpResponse { outcome: FlatOutcome(outcome), seq: c.seq, deduplicated: c.deduplicated };
    if failed {
        return Err(OpError::LeaseTokenMismatch(Box::new(response)));
    }
    Ok(response)
}

pub fn claim(ledger: &Ledger, req: &ClaimRequest, caller: Caller) -> Result<OpResponse, OpError> {
    plan_claim(ledger, req, caller)?.submit(ledger)
}

pub fn plan_claim(ledger: &Ledger, req: &ClaimRequest, caller: Caller) -> Result<Planned, OpError> {
    valid_request_id(req.request_id.as_deref())?;
    valid(&req.subject)?;
    if req.action.is_some() && req.request_id.is_none() {
        return Err(OpError::Refused(Refusal::InvalidInput {
            detail: "a lock claim (action) needs a request id".into(),
        }));
    }
    let me = owner(req.pid, req.instance, caller)?;
    let lock =
        req.action.clone().map(|action| LockIntent { action, request: req.request_id.clone().unwrap_or_default() });
    let (subject, stale_after_ms) = (req.subject.clone(), req.stale_after_ms);
    let ns = pid_namespace_of(&subject, &me);
    let here = ledger.here().clone();
    let host = host_of(&here, &subject, &me);
    Ok(Planned::new(Some(caller.evidence(req.instance)), req.tag(), move |p, now_ms, writer| {
        // Liveness is judged here, on identity, and enters the log as evidence.
        let (previous, seen) = dead_owner_evidence(&here, p, &subject).unzip();
        let event =
            Event::Claim { subject: subject.clone(), owner: me.clone(), stale_after_ms, lock: lock.clone(), previous };
        let events = std::iter::once(event).chain(ns.clone()).chain(host.clone()).chain(seen).collect();
        Ok(Txn::new(now_ms, writer, events))
    }))
}

pub fn generation(
    ledger: &Ledger,
    op: GenerationOp,
    req: &GenerationRequest,
    caller: Caller,
) -> Result<OpResponse, OpError> {
    plan_generation(op, req, caller)?.submit(ledger)
}

pub fn plan_generation(op: GenerationOp, req: &GenerationRequest, caller: Caller) -> Result<Planned, OpError> {
    valid_request_id(req.request_id.as_deref())?;
    valid(&req.subject)?;
    let (subject, generation) = (req.subject.clone(), req.generation);
    let event = match op {
        GenerationOp::Heartbeat => Event::Heartbeat { subject, generation },
        GenerationOp::Release => Event::Release { subject, generation },
        GenerationOp::RotateFence => Event::RotateFence { subject, generation },
    };
    Ok(Planned::new(Some(caller.evidence(req.instance)), Generation(op, req).tag(), single(vec![event])))
}

pub fn note(ledger: &Ledger, req: &NoteRequest, caller: Caller) -> Result<OpResponse, OpError> {
    plan_note(req, caller)?.submit(ledger)
}

pub fn plan_note(req: &NoteRequest, caller: Caller) -> Result<Planned, OpError> {
    valid_request_id(req.request_id.as_deref())?;
    valid(&req.subject)?;
    let event = Event::Note { subject: req.subject.clone(), generation: req.generation, text: req.text.clone() };
    Ok(Planned::new(Some(caller.evidence(req.instance)), req.tag(), single(vec![event])))
}

/// A takeover of a stale owner. On a log shared by hosts it first watches the
/// owner on this writer's own clock ([`watch_before_takeover`]), and records what
/// it watched with it (`StalenessObserved`): the state machine judges it on that.
pub fn takeover(ledger: &Ledger, req: &TakeoverRequest, caller: Caller) -> Result<OpResponse, OpError> {
    let planned = plan_takeover(ledger, req, caller)?;
    watch_before_takeover(ledger, req, TAKEOVER_WATCH_MS_MAX)?;
    planned.submit(ledger)
}

pub fn plan_takeover(ledger: &Ledger, req: &TakeoverRequest, caller: Caller) -> Result<Planned, OpError> {
    valid_request_id(req.request_id.as_deref())?;
    valid(&req.subject)?;
    let owner = owner(req.pid, req.instance, caller)?;
    let ns = pid_namespace_of(&req.subject, &owner);
    let host = host_of(ledger.here(), &req.subject, &owner);
    let event = Event::Takeover {
        subject: req.subject.clone(),
        expect_generation: req.expect_generation,
        expect_heartbeat_ms: req.expect_heartbeat_ms,
        owner,
        stale_after_ms: req.stale_after_ms,
        reason: req.reason.clone(),
    };
    let fixed: Vec<Event> = std::iter::once(event).chain(ns).chain(host).collect();
    let observer = Arc::clone(ledger.observer());
    let subject = req.subject.clone();
    Ok(Planned::new(Some(caller.evidence(req.instance)), req.tag(), move |p, now_ms, writer| {
        let mut events = fixed.clone();
        // Judged on this writer's own clock, on the state the takeover follows.
        if observer.here().shared
            && let Some(s) = p.subject(&subject)
            && let Some(o) = &s.owner
        {
            events.push(Event::StalenessObserved {
                subject: subject.clone(),
                generation: s.generation,
                heartbeat_ms: o.heartbeat_ms,
                watched_ms: observer.watched_ms(&subject, s.generation, o.heartbeat_ms),
                host: observer.here().host.clone(),
            });
        }
        Ok(Txn::new(now_ms, writer, events))
    }))
}

pub fn lease_acquire(ledger: &Ledger, req: &LeaseAcquireRequest) -> Result<OpResponse, OpError> {
    plan_lease_acquire(req)?.submit(ledger)
}

pub fn plan_lease_acquire(req: &LeaseAcquireRequest) -> Result<Planned, OpError> {
    valid_request_id(req.request_id.as_deref())?;
    if req.ttl_ms == 0 || req.ttl_ms > LEASE_TTL_MS_MAX {
        return Err(OpError::Refused(Refusal::InvalidInput {
            detail: format!("ttl_ms is 1..={LEASE_TTL_MS_MAX} (a day)"),
        }));
    }
    let invalid = |detail: &str| Err(OpError::Refused(Refusal::InvalidInput { detail: detail.into() }));
    let event = match (&req.owner, req.generation) {
        (None, None) if req.holder.trim().is_empty() => return invalid("a lease names a holder, or an owner"),
        (None, None) => Event::LeaseAcquire {
            resource: req.resource.clone(),
            mode: req.mode,
            holder: req.holder.clone(),
            ttl_ms: req.ttl_ms,
        },
        (Some(subject), Some(generation)) if req.holder.is_empty() => {
            valid(subject)?;
            Event::OwnerLeaseAcquire {
                resource: req.resource.clone(),
                mode: req.mode,
                owner: crate::model::OwnerRef { subject: subject.clone(), generation },
                ttl_ms: req.ttl_ms,
            }
        }
        (Some(_), Some(_)) => return invalid("a lease is held by a holder or by an owner, not both"),
        _ => return invalid("owner and generation go together"),
    };
    Ok(Planned::new(None, req.tag(), single(vec![event])))
}

pub fn lease_release(ledger: &Ledger, req: &LeaseReleaseRequest) -> Result<OpResponse, OpError> {
    plan_lease_release(req)?.submit(ledger)
}

pub fn plan_lease_release(req: &LeaseReleaseRequest) -> Result<Planned, OpError> {
    valid_request_id(req.request_id.as_deref())?;
    Ok(Planned::new(None, req.tag(), single(vec![Event::LeaseRelease { lease: req.lease, token: req.token }])))
}

/// How an owner looks now.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    Free,
    /// Provably dead on its identity evidence.
    Dead,
    /// No heartbeat within `stale_after_ms`, alive on its identity evidence (or an
    /// owner on another host, judged by its heartbeat alone).
    Stale,
    /// No heartbeat within `stale_after_ms`, and its liveness cannot be judged
    /// here (its pid is hidden from us, or in another pid namespace): never dead.
    Unknown,
    Active,
}

/// The status of one subject's owner now, and why (a death reason, why its
/// liveness is unknown, or that its heartbeat is old).
pub fn status_of(
    here: &identity::Here,
    owner: Option<&crate::model::Owner>,
    now_ms: u64,
) -> (Status, Option<&'static str>) {
    let Some(o) = owner else { return (Status::Free, None) };
    let liveness = liveness::liveness(here, &o.identity, o.pid_ns, o.host.as_deref());
    match liveness {
        liveness::Liveness::Dead { reason, .. } => (Status::Dead, Some(reason.code())),
        _ if o.is_fresh(now_ms) => (Status::Active, None),
        liveness::Liveness::Unknown(why) if why != liveness::UnknownReason::Remote => {
            (Status::Unknown, Some(why.code()))
        }
        _ => (Status::Stale, Some("heartbeat_stale")),
    }
}

/// The status verdict of one subject's owner, now.
pub fn status(here: &identity::Here, owner: Option<&crate::model::Owner>, now_ms: u64) -> Status {
    status_of(here, owner, now_ms).0
}

#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct SubjectState {
    pub subject: String,
    pub generation: u64,
    pub owner: Option<Identity>,
    /// The pid namespace the owner's pid was seen in (0: not recorded).
    pub owner_pid_ns: Option<u64>,
    /// The host the owner runs on (recorded on a log shared by hosts).
    pub owner_host: Option<String>,
    pub lock: Option<LockIntent>,
    pub heartbeat_ms: Option<u64>,
    /// How old the last heartbeat is, now.
    pub heartbeat_age_ms: Option<u64>,
    pub stale_after_ms: Option<u64>,
    pub status: Status,
    /// Why: the death reason (`process_dead`, `start_time_changed`, `boot_changed`,
    /// `exe_changed`), why liveness is unknown (`hidden`, `other_pid_namespace`,
    /// `unreadable`), or `heartbeat_stale`.
    pub status_reason: Option<&'static str>,
    pub ended: Vec<TenureEnd>,
    pub fenced_attempts: u64,
    pub late_notes: u64,
}

#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct StateResponse {
    pub last_seq: u64,
    pub chain_head: String,
    /// Answered from the intact prefix of a log that ends in a torn write.
    pub torn_tail: bool,
    pub subjects: Vec<SubjectState>,
    /// Every lease the projection holds (only when no subject is asked for).
    pub leases: Vec<Lease>,
}

/// The state of every subject (or of `only`), with each owner's status judged now.
pub fn state(view: &ReadView, only: Option<&str>, now_ms: u64) -> Result<StateResponse, OpError> {
    state_of(&view.here, &view.projection, &view.chain_head, view.torn_tail, only, now_ms)
}

/// [`state`] from a projection and its chain head (what a ledger's
/// `refresh_with_chain_head` lends: no copy of the state, and for one subject a lookup).
pub fn state_of(
    here: &identity::Here,
    p: &Projection,
    head: &crate::format::ChainLink,
    torn_tail: bool,
    only: Option<&str>,
    now_ms: u64,
) -> Result<StateResponse, OpError> {
    if let Some(o) = only {
        valid(o)?;
    }
    // One subject is a lookup, not a walk of every subject.
    type Named<'p> = (&'p std::sync::Arc<str>, &'p std::sync::Arc<crate::model::Subject>);
    let chosen: Box<dyn Iterator<Item = Named<'_>>> = match only {
        Some(o) => Box::new(p.subjects().get_key_value(o).into_iter()),
        None => Box::new(p.subjects().iter()),
    };
    let subjects = chosen
        .map(|(name, s)| (name, s, status_of(here, s.owner.as_ref(), now_ms)))
        .map(|(name, s, (status, status_reason))| SubjectState {
            subject: name.to_string(),
            generation: s.generation,
            owner: s.owner.as_ref().map(|o| o.identity.clone()),
            owner_pid_ns: s.owner.as_ref().map(|o| o.pid_ns),
            owner_host: s.owner.as_ref().and_then(|o| o.host.clone()),
            lock: s.owner.as_ref().and_then(|o| o.lock.clone()),
            heartbeat_ms: s.owner.as_ref().map(|o| o.heartbeat_ms),
            heartbeat_age_ms: s.owner.as_ref().map(|o| now_ms.saturating_sub(o.heartbeat_ms)),
            stale_after_ms: s.owner.as_ref().map(|o| o.stale_after_ms),
            status,
            status_reason,
            ended: s.ended.clone(),
            fenced_attempts: s.fenced_attempts,
            late_notes: s.late_notes,
        })
        .collect();
    let leases = if only.is_none() { p.leases().values().cloned().collect() } else { vec![] };
    Ok(StateResponse { last_seq: p.last_seq(), chain_head: crate::format::hex(head), torn_tail, subjects, leases })
}

#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct RequestShowResponse {
    #[serde(flatten)]
    pub status: RequestStatus,
    pub torn_tail: bool,
}

/// "Committed at N" or "never committed", from a read-only view.
pub fn request_show(view: &ReadView, id: &str) -> Result<RequestShowResponse, OpError> {
    Ok(RequestShowResponse { status: view.request_status(id)?, torn_tail: view.torn_tail })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Proves: the words a settlement gives a cutover record are the ones records
    /// written before it was a type hold (`committed`, `outcome_unknown`,
    /// `not_committed`, `refused:CODE`), with the sequence each names.
    #[test]
    fn settlements_say_what_cutover_records_have_always_said() {
        let cases = [
            (Settlement::Committed { seq: Some(4) }, "committed", Some(4)),
            (Settlement::Committed { seq: None }, "committed", None),
            (Settlement::OutcomeUnknown { seq: 9 }, "outcome_unknown", Some(9)),
            (Settlement::of_error(&OpError::Ledger(crate::ledger::LedgerError::Draining)), "not_committed", None),
            (
                Settlement::of_error(&OpError::Refused(crate::model::Refusal::UnknownLease { lease: 1 })),
                "refused:UNKNOWN_LEASE",
                None,
            ),
        ];
        for (s, how, seq) in cases {
            assert_eq!((s.how().as_str(), s.seq()), (how, seq), "{s:?}");
        }
    }

    /// What `OpResponse` serialized to when it was `#[serde(flatten)]`-derived.
    #[derive(Serialize)]
    struct DerivedFlatten<'a> {
        #[serde(flatten)]
        outcome: &'a FlatOutcome,
        seq: Option<u64>,
        deduplicated: bool,
    }

    #[test]
    fn the_one_pass_answer_is_exactly_what_the_derived_flatten_gave() {
        let outcomes = [
            Outcome::Heartbeat { subject: "a".into(), generation: 3, heartbeat_ms: 1_700_000_000_000 },
            Outcome::Released { subject: "b/c".into(), generation: 1 },
            Outcome::CutoverRecorded { settled: 7 },
            Outcome::LeaseReleased { lease: 4, token: 11 },
        ];
        for outcome in outcomes {
            for (seq, deduplicated) in [(Some(9), false), (None, true)] {
                let r = OpResponse { outcome: FlatOutcome(outcome.clone()), seq, deduplicated };
                let old = DerivedFlatten { outcome: &r.outcome, seq, deduplicated };
                // Every front end prints an answer through a JSON value (keys sorted):
                // the same value, so the same bytes.
                let old = serde_json::to_value(&old).unwrap();
                assert_eq!(serde_json::Value::Object(r.to_json()), old);
                assert_eq!(serde_json::to_value(&r).unwrap(), old);
            }
        }
    }
}
