//! Why the state machine refuses a transaction: a stable code and the evidence.

use serde::Serialize;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub struct Blocker {
    pub lease: u64,
    pub holder: String,
    pub mode: super::LeaseMode,
    pub token: u64,
    pub expires_ms: u64,
}

/// How a fenced writer's generation was retired (`FENCED` evidence).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub struct Retired {
    pub cut_off_seq: u64,
    /// How the tenure ended, in the one shape every answer gives it (a claim's
    /// and a takeover's `retired.how`): `{"kind": "taken_over"}` or `{"kind":
    /// "dead_owner", "reason": …}`.
    pub how: super::TenureEndHow,
}

/// Serialized as `{"code": "ALREADY_ACTIVE", <evidence fields>}`; the same code
/// as a `&'static str` from [`Refusal::code`] (one spelling, two derives).
#[derive(
    Debug,
    Clone,
    PartialEq,
    Eq,
    Serialize,
    thiserror::Error,
    strum::IntoStaticStr,
    strum::VariantNames,
    utoipa::ToSchema,
)]
#[serde(tag = "code", rename_all = "SCREAMING_SNAKE_CASE")]
#[strum(serialize_all = "SCREAMING_SNAKE_CASE")]
pub enum Refusal {
    #[error("invalid subject {subject:?}: {detail}")]
    InvalidSubject { subject: String, detail: String },
    #[error("invalid input: {detail}")]
    InvalidInput { detail: String },
    #[error("{subject} is held by live owner {instance} (pid {pid}) at generation {generation}")]
    AlreadyActive { subject: String, instance: uuid::Uuid, pid: u32, generation: u64, heartbeat_ms: u64 },
    #[error(
        "{subject}: heartbeat is {age_ms} ms old (stale after {stale_after_ms} ms) but the owner is not provably dead; take over explicitly"
    )]
    StaleRequiresTakeover {
        subject: String,
        instance: uuid::Uuid,
        pid: u32,
        generation: u64,
        heartbeat_ms: u64,
        age_ms: u64,
        stale_after_ms: u64,
    },
    #[error(
        "{subject} changed before the takeover: expected generation {expected_generation} / heartbeat {expected_heartbeat_ms}, found {current_generation} / {current_heartbeat_ms:?}"
    )]
    TakeoverRace {
        subject: String,
        expected_generation: u64,
        current_generation: u64,
        expected_heartbeat_ms: u64,
        current_heartbeat_ms: Option<u64>,
    },
    #[error("{subject} still has a fresh heartbeat ({age_ms} ms old, stale after {stale_after_ms} ms)")]
    TakeoverActiveRefused { subject: String, generation: u64, heartbeat_ms: u64, age_ms: u64, stale_after_ms: u64 },
    #[error("{subject}: generation {presented} is fenced; the current generation is {current}")]
    Fenced {
        subject: String,
        presented: u64,
        current: u64,
        /// When the presented generation's tenure was ended by a takeover or a
        /// dead-owner claim: where its authoritative history stops, and how.
        #[serde(skip_serializing_if = "Option::is_none")]
        retired: Option<Retired>,
    },
    #[error("{subject} has no active owner (generation {generation})")]
    NotActive { subject: String, generation: u64 },
    #[error("{subject}: live lock holder {instance} (pid {pid}) carries no action/request identity")]
    IdentityUncertain { subject: String, instance: uuid::Uuid, pid: u32, generation: u64 },
    #[error("{subject}: mutation already in progress: action={action} request={request} pid={pid}")]
    Busy { subject: String, action: String, request: String, pid: u32, instance: uuid::Uuid, generation: u64 },
    #[error("lease on {resource} conflicts with {} holder(s)", blockers.len())]
    LeaseConflict { resource: String, blockers: Vec<Blocker> },
    #[error("no lease {lease}")]
    UnknownLease { lease: u64 },
    #[error("request id {request:?} was committed at sequence {committed_seq} with different content")]
    RequestIdConflict { request: String, committed_seq: u64 },
    #[error("condition failed: {condition}: expected {expected}, actual {actual}")]
    ConditionFailed { condition: String, expected: String, actual: String },
    #[error("{subject}: generation {generation} is the last one; it never wraps")]
    GenerationExhausted { subject: String, generation: u64 },
    #[error("no process {process}")]
    UnknownProcess { process: u64 },
    #[error("process {process} was already started by runner pid {runner_pid}")]
    AlreadyStarted { process: u64, runner_pid: u32 },
    #[error("process {process} already ended ({status}) at sequence {seq}; the first outcome stands")]
    AlreadyTerminal { process: u64, status: String, seq: u64 },
    #[error("process {process} is {status}, not running")]
    NotRunning { process: u64, status: String },
}

impl Refusal {
    /// The stable code, as in the JSON.
    pub fn code(&self) -> &'static str {
        self.into()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_code_is_the_serialized_tag() {
        let r = Refusal::TakeoverActiveRefused {
            subject: "s".into(),
            generation: 1,
            heartbeat_ms: 2,
            age_ms: 3,
            stale_after_ms: 4,
        };
        assert_eq!(r.code(), "TAKEOVER_ACTIVE_REFUSED");
        assert_eq!(serde_json::to_value(&r).unwrap()["code"], r.code());
        assert_eq!(Refusal::RequestIdConflict { request: "r".into(), committed_seq: 1 }.code(), "REQUEST_ID_CONFLICT");
    }
}
