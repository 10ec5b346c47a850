//! The projection (current state) and the transition rules.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use super::flat_enum_serialize;

use super::types::{validate_subject, validate_text};
use super::{
    ARGS_BYTES_MAX, ARGS_MAX, Blocker, Condition, DeadOwner, DeathReason, ENV_ENTRIES_MAX, Ended, Event, Identity,
    LeaseMode, LockIntent, OUTPUT_TAIL_BYTES_MAX, OwnerRef, PATH_BYTES_MAX, PROCESS_LEASES_MAX, Process, ProcessEnd,
    ProcessStatus, Refusal, Started, TXN_CONDITIONS_MAX, TXN_EVENTS_MAX, Txn,
};

/// Request ids remembered in the projection (the most recent, by sequence). Older
/// ones are answered from the log itself (`request show` scans it).
pub const REQUESTS_RETAINED: usize = 100_000;
/// Released or displaced leases remembered, so a second release reports the first.
pub const TERMINAL_LEASES_RETAINED: usize = 10_000;
/// Ended tenures remembered per subject (the audit reads the full story from the log).
pub const TENURES_RETAINED: usize = 32;
/// Ended processes remembered (live ones are always kept). Each may carry 8 KiB of
/// output tails, so this bounds them to about 8 MiB of the projection (and of each
/// snapshot); older ones are in the log (`inspect dump --kind process_ended`).
pub const TERMINAL_PROCESSES_RETAINED: usize = 1_000;
/// A lease held by a process never expires by time: it ends with the process.
pub const LEASE_HELD_UNTIL_END_MS: u64 = u64::MAX;

/// The holder name of the leases a process holds.
pub fn process_holder(process: u64) -> String {
    format!("process:{process}")
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Owner {
    pub identity: Identity,
    /// The pid namespace the owner's pid was seen in (0: not recorded).
    pub pid_ns: u64,
    /// The host the owner runs on, on a log shared by hosts (`None`: not
    /// recorded — a log on one host, or an owner without a pid).
    pub host: Option<String>,
    pub since_seq: u64,
    pub claimed_ms: u64,
    pub heartbeat_ms: u64,
    pub stale_after_ms: u64,
    pub lock: Option<LockIntent>,
}

impl Owner {
    fn new(identity: &Identity, seq: u64, now_ms: u64, stale_after_ms: u64, lock: Option<LockIntent>) -> Owner {
        Owner {
            identity: identity.clone(),
            pid_ns: 0,
            host: None,
            since_seq: seq,
            claimed_ms: now_ms,
            heartbeat_ms: now_ms,
            stale_after_ms,
            lock,
        }
    }

    pub fn is_fresh(&self, now_ms: u64) -> bool {
        now_ms.saturating_sub(self.heartbeat_ms) <= self.stale_after_ms
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
pub enum TenureEndHow {
    Released,
    /// Replaced by a takeover of a stale owner.
    TakenOver,
    /// Replaced by a claim with proof of death.
    DeadOwner(DeathReason),
}

flat_enum_serialize!(TenureEndHow {
    0 Released "released" {}
    1 TakenOver "taken_over" {}
    2 DeadOwner "dead_owner" { 0: reason: DeathReason }
});

/// How a tenure ended; `cut_off_seq` is the last sequence that counts as that
/// owner's authoritative history.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct TenureEnd {
    pub generation: u64,
    pub instance: uuid::Uuid,
    pub pid: u32,
    pub cut_off_seq: u64,
    pub ended_ms: u64,
    pub how: TenureEndHow,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Subject {
    /// The fencing token: increases on every change of owner and fence rotation.
    pub generation: u64,
    pub owner: Option<Owner>,
    pub ended: Vec<TenureEnd>,
    pub notes: u64,
    /// Notes presented under a retired generation: kept in the log, not authoritative.
    pub late_notes: u64,
    pub fenced_attempts: u64,
    /// Live leases held by the current tenure (`lease acquire --owner`): they end
    /// in the record that ends the tenure.
    pub leases: BTreeSet<u64>,
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub enum LeaseState {
    Held,
    /// A release failed (wrong token); still held, can be retried.
    ReleasePending {
        code: String,
        attempts: u64,
    },
    Released {
        seq: u64,
    },
    /// Expired and displaced by a later acquire at `seq`.
    Displaced {
        seq: u64,
    },
}

flat_enum_serialize!(LeaseState {
    0 Held "held" {}
    1 ReleasePending "release_pending" { code: code: String, attempts: attempts: u64 }
    2 Released "released" { seq: seq: u64 }
    3 Displaced "displaced" { seq: seq: u64 }
});

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Lease {
    pub id: u64,
    pub resource: String,
    pub mode: LeaseMode,
    pub holder: String,
    pub token: u64,
    pub acquired_seq: u64,
    pub expires_ms: u64,
    pub state: LeaseState,
    /// Held by this owner tenure (ends with it), if it is.
    pub owner: Option<OwnerRef>,
    /// Held by this supervised process (ends with it), if it is.
    pub process: Option<u64>,
}

/// Who holds a lease, as the ledger knows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum HeldBy<'a> {
    /// A free-text holder the ledger cannot attribute.
    Text,
    Owner(&'a OwnerRef),
    Process(u64),
}

impl Lease {
    pub fn is_live(&self) -> bool {
        matches!(self.state, LeaseState::Held | LeaseState::ReleasePending { .. })
    }
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Resource {
    /// Last token issued: tokens for a resource only increase.
    pub token: u64,
    pub live: BTreeSet<u64>,
}

/// What one event did (or, for a no-op, what it found). Stored in snapshots by
/// variant index (bincode cannot decode internally tagged enums); in JSON a flat
/// object with `kind` ([`flat_enum_serialize`]).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub enum Outcome {
    Claimed {
        subject: String,
        generation: u64,
        owner: Identity,
        retired: Option<TenureEnd>,
    },
    /// The same lock request again: the existing holding, nothing written.
    LockReused {
        subject: String,
        generation: u64,
        owner: Identity,
    },
    Heartbeat {
        subject: String,
        generation: u64,
        heartbeat_ms: u64,
    },
    Released {
        subject: String,
        generation: u64,
    },
    TookOver {
        subject: String,
        generation: u64,
        owner: Identity,
        retired: TenureEnd,
    },
    Rotated {
        subject: String,
        generation: u64,
    },
    Noted {
        subject: String,
        generation: u64,
        authoritative: bool,
    },
    FencedAudit {
        subject: String,
        count: u64,
    },
    LeaseAcquired {
        lease: u64,
        resource: String,
        mode: LeaseMode,
        token: u64,
        expires_ms: u64,
        displaced: Vec<u64>,
    },
    LeaseReleased {
        lease: u64,
        token: u64,
    },
    /// Already released (or displaced): nothing written, the first end reported.
    LeaseAlreadyEnded {
        lease: u64,
        state: LeaseState,
    },
    /// Committed failure: the lease stays held, release pending, can be retried.
    LeaseReleaseFailed {
        lease: u64,
        code: String,
        attempts: u64,
        presented: u64,
    },
    Checkpointed {
        snapshot_seq: u64,
    },
    /// A spawn intent recorded as process `process`, with the leases it now holds.
    SpawnRecorded {
        process: u64,
        leases: Vec<GrantedLease>,
        displaced: Vec<u64>,
    },
    ProcessStarted {
        process: u64,
        command_pid: u32,
    },
    CancelRecorded {
        process: u64,
    },
    ProcessEnded {
        process: u64,
        status: ProcessStatus,
        leases_released: Vec<u64>,
    },
    CutoverRecorded {
        settled: u64,
    },
    /// Evidence kept beside a decision (what a claim saw of a dead owner).
    EvidenceRecorded {
        subject: String,
    },
}

flat_enum_serialize!(Outcome {
    0 Claimed "claimed" { subject: subject: String, generation: generation: u64, owner: owner: Identity, retired: retired: Option<TenureEnd> }
    1 LockReused "lock_reused" { subject: subject: String, generation: generation: u64, owner: owner: Identity }
    2 Heartbeat "heartbeat" { subject: subject: String, generation: generation: u64, heartbeat_ms: heartbeat_ms: u64 }
    3 Released "released" { subject: subject: String, generation: generation: u64 }
    4 TookOver "took_over" { subject: subject: String, generation: generation: u64, owner: owner: Identity, retired: retired: TenureEnd }
    5 Rotated "rotated" { subject: subject: String, generation: generation: u64 }
    6 Noted "noted" { subject: subject: String, generation: generation: u64, authoritative: authoritative: bool }
    7 FencedAudit "fenced_audit" { subject: subject: String, count: count: u64 }
    8 LeaseAcquired "lease_acquired" { lease: lease: u64, resource: resource: String, mode: mode: LeaseMode, token: token: u64, expires_ms: expires_ms: u64, displaced: displaced: Vec<u64> }
    9 LeaseReleased "lease_released" { lease: lease: u64, token: token: u64 }
    10 LeaseAlreadyEnded "lease_already_ended" { lease: lease: u64, state: state: LeaseState }
    11 LeaseReleaseFailed "lease_release_failed" { lease: lease: u64, code: code: String, attempts: attempts: u64, presented: presented: u64 }
    12 Checkpointed "checkpointed" { snapshot_seq: snapshot_seq: u64 }
    13 SpawnRecorded "spawn_recorded" { process: process: u64, leases: leases: Vec<GrantedLease>, displaced: displaced: Vec<u64> }
    14 ProcessStarted "process_started" { process: process: u64, command_pid: command_pid: u32 }
    15 CancelRecorded "cancel_recorded" { process: process: u64 }
    16 ProcessEnded "process_ended" { process: process: u64, status: status: ProcessStatus, leases_released: leases_released: Vec<u64> }
    17 CutoverRecorded "cutover_recorded" { settled: settled: u64 }
    18 EvidenceRecorded "evidence_recorded" { subject: subject: String }
});

/// A lease granted with a spawn (held until the process ends).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct GrantedLease {
    pub lease: u64,
    pub resource: String,
    pub mode: LeaseMode,
    pub token: u64,
}

impl Outcome {
    /// `{"kind": "claimed", <fields>}`: the variant name in snake_case beside its fields.
    pub fn to_json(&self) -> serde_json::Value {
        super::flatten_tagged(self)
    }

    /// Outcomes that change nothing: a transaction made only of them is not written.
    fn is_noop(&self) -> bool {
        // Evidence rides with a decision: alone (beside a reused lock, say) it is
        // not worth a record.
        matches!(
            self,
            Outcome::LockReused { .. } | Outcome::LeaseAlreadyEnded { .. } | Outcome::EvidenceRecorded { .. }
        )
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RequestEntry {
    pub seq: u64,
    pub digest: [u8; 32],
    pub outcomes: Vec<Outcome>,
}

/// The result of checking a transaction against the projection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Checked {
    /// Valid: these outcomes; `writes` is false when every outcome is a no-op.
    Valid { outcomes: Vec<Outcome>, writes: bool },
    /// The same request id with the same content was committed already.
    Deduplicated(RequestEntry),
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Projection {
    pub last_seq: u64,
    pub subjects: BTreeMap<String, Subject>,
    pub resources: BTreeMap<String, Resource>,
    pub leases: BTreeMap<u64, Lease>,
    pub last_lease_id: u64,
    pub requests: BTreeMap<String, RequestEntry>,
    pub processes: BTreeMap<u64, Process>,
    pub last_process_id: u64,
    /// Ended processes by the sequence that ended them, for bounded retention.
    terminal_processes: BTreeMap<u64, u64>,
    /// Request ids by commit sequence, for bounded retention.
    request_order: BTreeMap<u64, String>,
    /// Terminal leases by the sequence that ended them, for bounded retention, and
    /// how many there are (kept, not recounted: ending a lease must stay O(log n)).
    terminal_leases: BTreeMap<u64, Vec<u64>>,
    terminal_lease_count: usize,
    /// Committed records that no longer validate on replay (should stay 0).
    pub anomalies: u64,
    /// Committed records whose payload did not decode.
    pub undecodable: u64,
    /// When the last `Refused` record of each (subject, code, operation, caller) was written
    /// (its `last_ms`), for coalescing across processes; entries older than
    /// [`REFUSAL_WINDOWS_RETAIN_MS`] go, and at most [`REFUSAL_WINDOWS_MAX`] stay.
    /// (Last in the struct: a snapshot written before it existed fails to decode
    /// and is ignored, never misread.)
    refusal_windows: BTreeMap<String, u64>,
}

impl Projection {
    /// Entries of the state a snapshot copies: subjects, resources, leases,
    /// requests remembered and processes.
    pub fn entries(&self) -> u64 {
        (self.subjects.len() + self.resources.len() + self.leases.len() + self.requests.len() + self.processes.len())
            as u64
    }
}

/// How long the projection remembers when a refusal was last recorded.
pub const REFUSAL_WINDOWS_RETAIN_MS: u64 = 60_000;
/// Most (subject, code, operation, caller) refusal windows remembered.
pub const REFUSAL_WINDOWS_MAX: usize = 4096;

/// The coalescing key of a refusal record: subject, code, refused operation and
/// caller (a refused note never hides in a window of refused heartbeats: what it
/// tried to write is kept).
pub fn refusal_window_key(subject: &str, code: &str, op: &str, caller: &super::CallerId) -> String {
    format!("{subject}\u{0}{code}\u{0}{op}\u{0}{}", caller.key())
}

fn refuse<T>(r: Refusal) -> Result<T, Refusal> {
    Err(r)
}

impl Projection {
    pub fn subject(&self, name: &str) -> Option<&Subject> {
        self.subjects.get(name)
    }

    /// When the last `Refused` record under `key` ([`refusal_window_key`]) was
    /// written, if within the retained past.
    pub fn refusal_recorded_ms(&self, key: &str) -> Option<u64> {
        self.refusal_windows.get(key).copied()
    }

    /// Validate `txn` as the record at `seq`, computing what it would do.
    pub fn check(&self, seq: u64, txn: &Txn) -> Result<Checked, Refusal> {
        if let Some(tag) = &txn.request {
            validate_text("request id", &tag.id)?;
            if let Some(entry) = self.requests.get(&tag.id) {
                if entry.digest == tag.digest {
                    return Ok(Checked::Deduplicated(entry.clone()));
                }
                return refuse(Refusal::RequestIdConflict { request: tag.id.clone(), committed_seq: entry.seq });
            }
        }
        if txn.events.is_empty() || txn.events.len() > TXN_EVENTS_MAX || txn.conditions.len() > TXN_CONDITIONS_MAX {
            return refuse(Refusal::InvalidInput {
                detail: format!(
                    "a transaction has 1..={TXN_EVENTS_MAX} events and at most {TXN_CONDITIONS_MAX} conditions"
                ),
            });
        }
        for c in &txn.conditions {
            self.check_condition(c)?;
        }
        // Events of one transaction are checked against the same state, so each must
        // touch a different subject, lease or resource. (One event other than a
        // spawn, whose leases may name a resource twice, touches one target: most
        // transactions, and most of a replay.)
        let single = txn.events.len() == 1 && !matches!(txn.events[0], Event::SpawnRequested { .. });
        let mut targets = BTreeSet::new();
        for e in txn.events.iter().filter(|_| !single) {
            let names: Vec<String> = match e {
                Event::Cutover { .. } => vec!["cutover".to_owned()],
                Event::LeaseAcquire { resource, .. } | Event::OwnerLeaseAcquire { resource, .. } => {
                    vec![format!("resource:{resource}")]
                }
                Event::LeaseRelease { lease, .. } => vec![format!("lease:{lease}")],
                Event::Checkpoint { snapshot_seq, .. } => vec![format!("checkpoint:{snapshot_seq}")],
                Event::DeathObserved { subject, .. } => vec![format!("evidence:{subject}")],
                Event::OwnerPidNamespace { subject, .. } => vec![format!("pid-namespace:{subject}")],
                Event::OwnerHost { subject, .. } => vec![format!("owner-host:{subject}")],
                Event::StalenessObserved { subject, .. } => vec![format!("staleness:{subject}")],
                Event::ProcessHost { .. } => vec!["process-host".to_owned()],
                Event::SpawnRequested { leases, .. } => std::iter::once("spawn".to_owned())
                    .chain(leases.iter().map(|l| format!("resource:{}", l.resource)))
                    .collect(),
                Event::ProcessStarted { process, .. }
                | Event::ProcessCancelRequested { process, .. }
                | Event::ProcessEnded { process, .. } => vec![format!("process:{process}")],
                other => vec![format!("subject:{}", other.subject().unwrap_or_default())],
            };
            for target in names {
                if !targets.insert(target.clone()) {
                    return refuse(Refusal::InvalidInput {
                        detail: format!("{target} appears twice in one transaction"),
                    });
                }
            }
        }
        let mut ids = Ids { lease: self.last_lease_id, process: self.last_process_id };
        let outcomes = txn
            .events
            .iter()
            .map(|e| self.check_event(seq, txn.time_ms, e, &txn.events, &mut ids))
            .collect::<Result<Vec<_>, _>>()?;
        let writes = outcomes.iter().any(|o| !o.is_noop());
        Ok(Checked::Valid { outcomes, writes })
    }

    /// Fold the committed record at `seq` into the state. Total: a record that does
    /// not validate (which a correct writer never appends) is counted, not applied.
    pub fn apply(&mut self, seq: u64, txn: &Txn) -> Result<Vec<Outcome>, Refusal> {
        debug_assert!(seq > self.last_seq, "records apply in sequence order");
        // Judged on the state it follows — `last_seq` still the record before it,
        // as the commit path judged it (`LogAt` names that record) — then the log
        // is at this record whatever the verdict.
        let checked = self.check(seq, txn);
        self.last_seq = seq;
        let outcomes = match checked {
            Ok(Checked::Valid { outcomes, .. }) => outcomes,
            Ok(Checked::Deduplicated(entry)) => return Ok(entry.outcomes),
            Err(r) => {
                self.anomalies += 1;
                return Err(r);
            }
        };
        let request = txn.request.as_ref().map(|t| t.id.as_str());
        for (e, o) in txn.events.iter().zip(&outcomes) {
            self.mutate(seq, txn.time_ms, request, e, o);
        }
        if let Some(tag) = &txn.request {
            self.remember_request(seq, &tag.id, tag.digest, outcomes.clone());
        }
        Ok(outcomes)
    }

    /// [`Self::apply`] of a transaction `check` has just found valid at `seq`
    /// against this same state, with the outcomes it returned: the state changes as
    /// `apply` would change it, without judging the transaction a second time (the
    /// commit path judges before it queues; judging twice was a fifth of its work).
    /// Debug builds judge again and assert the same outcomes.
    pub fn apply_checked(&mut self, seq: u64, txn: &Txn, outcomes: Vec<Outcome>) -> Vec<Outcome> {
        debug_assert!(seq > self.last_seq, "records apply in sequence order");
        debug_assert_eq!(
            self.check(seq, txn),
            Ok(Checked::Valid { outcomes: outcomes.clone(), writes: true }),
            "apply_checked is given what check said of this transaction on this state"
        );
        self.last_seq = seq;
        let request = txn.request.as_ref().map(|t| t.id.as_str());
        for (e, o) in txn.events.iter().zip(&outcomes) {
            self.mutate(seq, txn.time_ms, request, e, o);
        }
        if let Some(tag) = &txn.request {
            self.remember_request(seq, &tag.id, tag.digest, outcomes.clone());
        }
        outcomes
    }

    /// [`Self::apply`] for a replay, which has no use for the outcomes: the same
    /// resulting state. A plain heartbeat — one event, no request id, no condition:
    /// most of a log — is judged and applied with one lookup and no allocation, by
    /// the rules `check` and `mutate` apply to it (a test holds the two equal).
    pub fn apply_replayed(&mut self, seq: u64, txn: &Txn) {
        let [Event::Heartbeat { subject, generation }] = txn.events.as_slice() else {
            let _ = self.apply(seq, txn);
            return;
        };
        if txn.request.is_some() || !txn.conditions.is_empty() {
            let _ = self.apply(seq, txn);
            return;
        }
        debug_assert!(seq > self.last_seq, "records apply in sequence order");
        self.last_seq = seq;
        // `check_event`: a valid name, the presented generation the current one
        // (else FENCED), an owner at it (else NOT_ACTIVE); `mutate`: its heartbeat.
        let owner = match validate_subject(subject) {
            Ok(()) => self.subjects.get_mut(subject.as_str()).filter(|s| s.generation == *generation),
            Err(_) => None,
        };
        match owner.and_then(|s| s.owner.as_mut()) {
            Some(o) => o.heartbeat_ms = txn.time_ms,
            None => self.anomalies += 1,
        }
    }

    /// A record whose payload could not be decoded still advances the sequence.
    pub fn skip_undecodable(&mut self, seq: u64) {
        self.last_seq = seq;
        self.undecodable += 1;
    }

    fn check_condition(&self, c: &Condition) -> Result<(), Refusal> {
        let failed = |condition: String, expected: String, actual: String| {
            refuse(Refusal::ConditionFailed { condition, expected, actual })
        };
        match c {
            Condition::SubjectAt { subject, generation } => {
                let actual = self.subjects.get(subject).map_or(0, |s| s.generation);
                if actual != *generation {
                    return failed(
                        format!("subject {subject} at generation"),
                        generation.to_string(),
                        actual.to_string(),
                    );
                }
            }
            Condition::SubjectAbsent { subject } => {
                if let Some(s) = self.subjects.get(subject).filter(|s| s.owner.is_some()) {
                    return failed(
                        format!("subject {subject} absent"),
                        "no owner".into(),
                        format!("owned at generation {}", s.generation),
                    );
                }
            }
            Condition::LogAt { seq } => {
                if self.last_seq != *seq {
                    return failed("log at sequence".into(), seq.to_string(), self.last_seq.to_string());
                }
            }
        }
        Ok(())
    }

    fn current(&self, subject: &str) -> (u64, Option<&Owner>) {
        self.subjects.get(subject).map_or((0, None), |s| (s.generation, s.owner.as_ref()))
    }

    /// `FENCED` for `presented` on `subject`, with how that generation was retired
    /// when a takeover or a dead-owner claim ended its tenure.
    pub fn fenced(&self, subject: &str, presented: u64) -> Refusal {
        let s = self.subjects.get(subject);
        let retired = s
            .and_then(|s| s.ended.iter().rev().find(|t| t.generation == presented))
            .filter(|t| t.how != TenureEndHow::Released)
            .map(|t| super::Retired { cut_off_seq: t.cut_off_seq, how: t.how });
        Refusal::Fenced { subject: subject.into(), presented, current: s.map_or(0, |s| s.generation), retired }
    }

    /// The owner at exactly `presented`, or the refusal for a stale or idle token.
    fn owner_at(&self, subject: &str, presented: u64) -> Result<&Owner, Refusal> {
        let (current, owner) = self.current(subject);
        if presented != current {
            return refuse(self.fenced(subject, presented));
        }
        owner.ok_or_else(|| Refusal::NotActive { subject: subject.into(), generation: current })
    }

    /// One event of a transaction (`siblings`: all of its events, this one
    /// among them), judged on the state before the transaction.
    fn check_event(
        &self,
        seq: u64,
        now_ms: u64,
        e: &Event,
        siblings: &[Event],
        ids: &mut Ids,
    ) -> Result<Outcome, Refusal> {
        if let Some(s) = e.subject() {
            validate_subject(s)?;
        }
        match e {
            Event::Claim { subject, owner, lock, previous, .. } => {
                if let Some(l) = lock {
                    validate_text("action", &l.action)?;
                    if l.action.trim().is_empty() || l.request.trim().is_empty() {
                        return refuse(Refusal::InvalidInput {
                            detail: "a lock claim carries an action and a request id".into(),
                        });
                    }
                }
                let (generation, current) = self.current(subject);
                let next = next_generation(subject, generation)?;
                let Some(cur) = current else {
                    return Ok(Outcome::Claimed {
                        subject: subject.clone(),
                        generation: next,
                        owner: owner.clone(),
                        retired: None,
                    });
                };
                if let Some(dead) =
                    previous.as_ref().filter(|d| d.generation == generation && d.instance == cur.identity.instance)
                {
                    let retired = Self::tenure_end(seq, now_ms, generation, cur, TenureEndHow::DeadOwner(dead.reason));
                    return Ok(Outcome::Claimed {
                        subject: subject.clone(),
                        generation: next,
                        owner: owner.clone(),
                        retired: Some(retired),
                    });
                }
                if let Some(l) = lock {
                    return match &cur.lock {
                        None => refuse(Refusal::IdentityUncertain {
                            subject: subject.clone(),
                            instance: cur.identity.instance,
                            pid: cur.identity.pid,
                            generation,
                        }),
                        Some(held) if held.request == l.request => Ok(Outcome::LockReused {
                            subject: subject.clone(),
                            generation,
                            owner: cur.identity.clone(),
                        }),
                        Some(held) => refuse(Refusal::Busy {
                            subject: subject.clone(),
                            action: held.action.clone(),
                            request: held.request.clone(),
                            pid: cur.identity.pid,
                            instance: cur.identity.instance,
                            generation,
                        }),
                    };
                }
                if cur.is_fresh(now_ms) {
                    return refuse(Refusal::AlreadyActive {
                        subject: subject.clone(),
                        instance: cur.identity.instance,
                        pid: cur.identity.pid,
                        generation,
                        heartbeat_ms: cur.heartbeat_ms,
                    });
                }
                refuse(Refusal::StaleRequiresTakeover {
                    subject: subject.clone(),
                    instance: cur.identity.instance,
                    pid: cur.identity.pid,
                    generation,
                    heartbeat_ms: cur.heartbeat_ms,
                    age_ms: now_ms.saturating_sub(cur.heartbeat_ms),
                    stale_after_ms: cur.stale_after_ms,
                })
            }
            Event::Heartbeat { subject, generation } => {
                self.owner_at(subject, *generation)?;
                Ok(Outcome::Heartbeat { subject: subject.clone(), generation: *generation, heartbeat_ms: now_ms })
            }
            Event::Release { subject, generation } => {
                self.owner_at(subject, *generation)?;
                Ok(Outcome::Released { subject: subject.clone(), generation: *generation })
            }
            Event::RotateFence { subject, generation } => {
                self.owner_at(subject, *generation)?;
                Ok(Outcome::Rotated { subject: subject.clone(), generation: next_generation(subject, *generation)? })
            }
            Event::Takeover { subject, expect_generation, expect_heartbeat_ms, owner, reason, .. } => {
                validate_text("reason", reason)?;
                let (generation, current) = self.current(subject);
                let cur = match current {
                    Some(c) if generation == *expect_generation && c.heartbeat_ms == *expect_heartbeat_ms => c,
                    _ => {
                        return refuse(Refusal::TakeoverRace {
                            subject: subject.clone(),
                            expected_generation: *expect_generation,
                            current_generation: generation,
                            expected_heartbeat_ms: *expect_heartbeat_ms,
                            current_heartbeat_ms: current.map(|c| c.heartbeat_ms),
                        });
                    }
                };
                // On a log shared by hosts the takeover carries what its writer
                // watched on its own clock (`StalenessObserved`), and is judged
                // on that alone: two hosts' wall clocks are never compared.
                let observed = siblings.iter().find_map(|e| match e {
                    Event::StalenessObserved { subject: s, generation: g, heartbeat_ms: h, watched_ms, .. }
                        if s == subject =>
                    {
                        Some((*g, *h, *watched_ms))
                    }
                    _ => None,
                });
                let (fresh, age_ms) = match observed {
                    Some((g, h, watched_ms)) if g == generation && h == cur.heartbeat_ms => {
                        (watched_ms <= cur.stale_after_ms, watched_ms)
                    }
                    Some((g, h, _)) => {
                        return refuse(Refusal::InvalidInput {
                            detail: format!(
                                "the staleness observed names generation {g} with its heartbeat at {h}; \
                                 {subject} is at generation {generation} with its heartbeat at {}",
                                cur.heartbeat_ms
                            ),
                        });
                    }
                    None => (cur.is_fresh(now_ms), now_ms.saturating_sub(cur.heartbeat_ms)),
                };
                if fresh {
                    return refuse(Refusal::TakeoverActiveRefused {
                        subject: subject.clone(),
                        generation,
                        heartbeat_ms: cur.heartbeat_ms,
                        age_ms,
                        stale_after_ms: cur.stale_after_ms,
                    });
                }
                let next = next_generation(subject, generation)?;
                let retired = Self::tenure_end(seq, now_ms, generation, cur, TenureEndHow::TakenOver);
                Ok(Outcome::TookOver { subject: subject.clone(), generation: next, owner: owner.clone(), retired })
            }
            Event::Note { subject, generation, text } => {
                validate_text("note", text)?;
                let (current, owner) = self.current(subject);
                if *generation > current || *generation == 0 {
                    return refuse(self.fenced(subject, *generation));
                }
                let authoritative = *generation == current && owner.is_some();
                Ok(Outcome::Noted { subject: subject.clone(), generation: *generation, authoritative })
            }
            Event::FencedAttempts { subject, op, count, .. } => {
                validate_text("op", op)?;
                Ok(Outcome::FencedAudit { subject: subject.clone(), count: *count })
            }
            Event::RefusedWrites { subject, op, count, content_head, .. } => {
                validate_text("op", op)?;
                if content_head.len() > super::REFUSED_CONTENT_HEAD_BYTES {
                    return refuse(Refusal::InvalidInput {
                        detail: format!("refused content is kept to {} bytes", super::REFUSED_CONTENT_HEAD_BYTES),
                    });
                }
                Ok(Outcome::FencedAudit { subject: subject.clone(), count: *count })
            }
            Event::OwnerPidNamespace { subject, .. } => Ok(Outcome::EvidenceRecorded { subject: subject.clone() }),
            Event::OwnerHost { subject, host } => {
                validate_host(host)?;
                let installs = siblings.iter().any(|e| {
                    matches!(e, Event::Claim { subject: s, .. } | Event::Takeover { subject: s, .. } if s == subject)
                });
                if !installs {
                    return refuse(Refusal::InvalidInput {
                        detail: format!("an owner's host goes with the claim or takeover of {subject}"),
                    });
                }
                Ok(Outcome::EvidenceRecorded { subject: subject.clone() })
            }
            Event::ProcessHost { host } => {
                validate_host(host)?;
                if !siblings.iter().any(|e| matches!(e, Event::SpawnRequested { .. })) {
                    return refuse(Refusal::InvalidInput { detail: "a process's host goes with its spawn".into() });
                }
                Ok(Outcome::EvidenceRecorded { subject: String::new() })
            }
            Event::StalenessObserved { subject, host, .. } => {
                validate_host(host)?;
                if !siblings.iter().any(|e| matches!(e, Event::Takeover { subject: s, .. } if s == subject)) {
                    return refuse(Refusal::InvalidInput {
                        detail: format!("observed staleness goes with a takeover of {subject}"),
                    });
                }
                Ok(Outcome::EvidenceRecorded { subject: subject.clone() })
            }
            Event::Refused { subject, code, op, caller, count, content, .. } => {
                validate_text("code", code)?;
                validate_text("op", op)?;
                validate_text("exe", &caller.exe)?;
                if content.as_ref().is_some_and(|c| c.head.len() > super::REFUSED_CONTENT_HEAD_BYTES) {
                    return refuse(Refusal::InvalidInput {
                        detail: format!("refused content is kept to {} bytes", super::REFUSED_CONTENT_HEAD_BYTES),
                    });
                }
                Ok(Outcome::FencedAudit { subject: subject.clone(), count: *count })
            }
            Event::DeathObserved { subject, generation, observed, .. } => {
                validate_text("boot id", &observed.boot_id)?;
                validate_text("exe", observed.exe.as_deref().unwrap_or_default())?;
                let (current, _) = self.current(subject);
                if *generation != current {
                    return refuse(Refusal::InvalidInput {
                        detail: format!("death evidence names generation {generation}; {subject} is at {current}"),
                    });
                }
                Ok(Outcome::EvidenceRecorded { subject: subject.clone() })
            }
            Event::LeaseAcquire { resource, mode, holder, ttl_ms } => {
                validate_text("holder", holder)?;
                self.lease_acquired(resource, *mode, *ttl_ms, now_ms, ids)
            }
            Event::Cutover { home, reason, settled, more } => {
                validate_subject(&home.subject)?;
                validate_text("reason", reason)?;
                if settled.len() > super::CUTOVER_SETTLED_MAX {
                    return refuse(Refusal::InvalidInput {
                        detail: format!("a cutover lists at most {} requests", super::CUTOVER_SETTLED_MAX),
                    });
                }
                for r in settled {
                    validate_text("request", &r.request)?;
                    validate_text("how", &r.how)?;
                    validate_text("op", &r.op)?;
                }
                Ok(Outcome::CutoverRecorded { settled: settled.len() as u64 + more })
            }
            Event::OwnerLeaseAcquire { resource, mode, owner, ttl_ms } => {
                validate_subject(&owner.subject)?;
                self.owner_at(&owner.subject, owner.generation)?;
                self.lease_acquired(resource, *mode, *ttl_ms, now_ms, ids)
            }
            Event::SpawnRequested { command, owner, leases, .. } => {
                validate_command(command)?;
                if let Some(o) = owner {
                    validate_subject(&o.subject)?;
                    self.owner_at(&o.subject, o.generation)?;
                }
                if leases.len() > PROCESS_LEASES_MAX {
                    return refuse(Refusal::InvalidInput {
                        detail: format!("a process holds at most {PROCESS_LEASES_MAX} leases"),
                    });
                }
                let mut granted = Vec::new();
                let mut displaced = Vec::new();
                for want in leases {
                    validate_subject(&want.resource)?;
                    let (token, mut gone) = self.lease_grant(&want.resource, want.mode, now_ms)?;
                    ids.lease += 1;
                    granted.push(GrantedLease {
                        lease: ids.lease,
                        resource: want.resource.clone(),
                        mode: want.mode,
                        token,
                    });
                    displaced.append(&mut gone);
                }
                ids.process += 1;
                Ok(Outcome::SpawnRecorded { process: ids.process, leases: granted, displaced })
            }
            Event::ProcessStarted { process, command_pid, .. } => {
                let p = self.live_process(*process)?;
                if let Some(s) = &p.started {
                    return refuse(Refusal::AlreadyStarted { process: *process, runner_pid: s.runner.pid });
                }
                Ok(Outcome::ProcessStarted { process: *process, command_pid: *command_pid })
            }
            Event::ProcessCancelRequested { process, by } => {
                let p = self.live_process(*process)?;
                self.cancel_allowed(p, by.as_ref())?;
                if p.started.is_none() {
                    return refuse(Refusal::NotRunning { process: *process, status: p.status().as_str().into() });
                }
                Ok(Outcome::CancelRecorded { process: *process })
            }
            Event::ProcessEnded { process, end } => {
                let p = self.live_process(*process)?;
                let needs_start = matches!(end, ProcessEnd::Exited(_) | ProcessEnd::CompletedUnknown { .. });
                if needs_start && p.started.is_none() {
                    return refuse(Refusal::NotRunning { process: *process, status: p.status().as_str().into() });
                }
                // "Never ran" is only true of a process no runner started.
                if let (ProcessEnd::Failed { .. }, Some(s)) = (end, &p.started) {
                    return refuse(Refusal::AlreadyStarted { process: *process, runner_pid: s.runner.pid });
                }
                if let ProcessEnd::Exited(x) = end
                    && (x.stdout.tail.len() > OUTPUT_TAIL_BYTES_MAX || x.stderr.tail.len() > OUTPUT_TAIL_BYTES_MAX)
                {
                    return refuse(Refusal::InvalidInput {
                        detail: format!("an output tail is at most {OUTPUT_TAIL_BYTES_MAX} bytes"),
                    });
                }
                match end {
                    ProcessEnd::Failed { code, detail } => {
                        validate_text("code", code)?;
                        validate_text("detail", detail)?;
                    }
                    ProcessEnd::CompletedUnknown { runner, .. } => validate_text("runner", runner)?,
                    ProcessEnd::Exited(_) => {}
                }
                let leases_released = p.leases.iter().copied().filter(|id| self.lease_is_live(*id)).collect();
                Ok(Outcome::ProcessEnded { process: *process, status: end.status(), leases_released })
            }
            Event::Checkpoint { snapshot_seq, .. } if *snapshot_seq >= seq => refuse(Refusal::InvalidInput {
                detail: format!("a checkpoint at {seq} cannot vouch for a snapshot at {snapshot_seq}"),
            }),
            Event::Checkpoint { snapshot_seq, .. } => Ok(Outcome::Checkpointed { snapshot_seq: *snapshot_seq }),
            Event::LeaseRelease { lease, token } => {
                let Some(l) = self.leases.get(lease) else { return refuse(Refusal::UnknownLease { lease: *lease }) };
                match &l.state {
                    LeaseState::Released { .. } | LeaseState::Displaced { .. } => {
                        Ok(Outcome::LeaseAlreadyEnded { lease: *lease, state: l.state.clone() })
                    }
                    _ if l.token != *token => {
                        let attempts = match &l.state {
                            LeaseState::ReleasePending { attempts, .. } => attempts + 1,
                            _ => 1,
                        };
                        Ok(Outcome::LeaseReleaseFailed {
                            lease: *lease,
                            code: "TOKEN_MISMATCH".into(),
                            attempts,
                            presented: *token,
                        })
                    }
                    _ => Ok(Outcome::LeaseReleased { lease: *lease, token: *token }),
                }
            }
        }
    }

    /// A new lease on `resource` (the next id), or the conflict.
    fn lease_acquired(
        &self,
        resource: &str,
        mode: LeaseMode,
        ttl_ms: u64,
        now_ms: u64,
        ids: &mut Ids,
    ) -> Result<Outcome, Refusal> {
        validate_subject(resource)?;
        let (token, displaced) = self.lease_grant(resource, mode, now_ms)?;
        ids.lease += 1;
        Ok(Outcome::LeaseAcquired {
            lease: ids.lease,
            resource: resource.to_owned(),
            mode,
            token,
            expires_ms: now_ms.saturating_add(ttl_ms),
            displaced,
        })
    }

    /// The token a new lease on `resource` would get and the expired leases it
    /// displaces, or the conflict.
    fn lease_grant(&self, resource: &str, mode: LeaseMode, now_ms: u64) -> Result<(u64, Vec<u64>), Refusal> {
        let res = self.resources.get(resource);
        let mut displaced = Vec::new();
        let mut blockers = Vec::new();
        for id in res.map(|r| r.live.iter()).into_iter().flatten() {
            let l = &self.leases[id];
            if l.expires_ms <= now_ms {
                displaced.push(l.id);
            } else if mode == LeaseMode::Write || l.mode == LeaseMode::Write {
                blockers.push(Blocker {
                    lease: l.id,
                    holder: l.holder.clone(),
                    mode: l.mode,
                    token: l.token,
                    expires_ms: l.expires_ms,
                });
            }
        }
        if !blockers.is_empty() {
            return refuse(Refusal::LeaseConflict { resource: resource.to_owned(), blockers });
        }
        Ok((res.map_or(0, |r| r.token) + 1, displaced))
    }

    fn lease_is_live(&self, id: u64) -> bool {
        self.leases.get(&id).is_some_and(Lease::is_live)
    }

    /// May the presenter of `by` cancel `p`? A process run for an owner is
    /// cancelled only by that subject's *current* generation (a fenced or absent
    /// one is `FENCED`, presented 0 when none); an unowned one by anyone (a
    /// presented generation must still be current).
    pub fn cancel_allowed(&self, p: &Process, by: Option<&OwnerRef>) -> Result<(), Refusal> {
        match (&p.owner, by) {
            (Some(owner), None) => refuse(self.fenced(&owner.subject, 0)),
            (Some(owner), Some(b)) if b.subject != owner.subject => refuse(Refusal::InvalidInput {
                detail: format!("process {} runs for {}, not {}", p.id, owner.subject, b.subject),
            }),
            (_, Some(b)) => self.owner_at(&b.subject, b.generation).map(|_| ()),
            (None, None) => Ok(()),
        }
    }

    /// A process that has not ended, or why not.
    fn live_process(&self, process: u64) -> Result<&Process, Refusal> {
        let Some(p) = self.processes.get(&process) else {
            return refuse(Refusal::UnknownProcess { process });
        };
        if let Some(e) = &p.ended {
            return refuse(Refusal::AlreadyTerminal { process, status: e.end.status().as_str().into(), seq: e.seq });
        }
        Ok(p)
    }

    fn tenure_end(seq: u64, now_ms: u64, generation: u64, cur: &Owner, how: TenureEndHow) -> TenureEnd {
        TenureEnd {
            generation,
            instance: cur.identity.instance,
            pid: cur.identity.pid,
            // Everything before this record is the old owner's authoritative history.
            cut_off_seq: seq - 1,
            ended_ms: now_ms,
            how,
        }
    }

    fn mutate(&mut self, seq: u64, now_ms: u64, request: Option<&str>, e: &Event, o: &Outcome) {
        match (e, o) {
            (
                Event::Claim { subject, owner, stale_after_ms, lock, .. },
                Outcome::Claimed { generation, retired, .. },
            ) => {
                let owner = Owner::new(owner, seq, now_ms, *stale_after_ms, lock.clone());
                self.install(seq, subject, *generation, owner, retired.clone());
            }
            (Event::Takeover { subject, owner, stale_after_ms, .. }, Outcome::TookOver { generation, retired, .. }) => {
                let owner = Owner::new(owner, seq, now_ms, *stale_after_ms, None);
                self.install(seq, subject, *generation, owner, Some(retired.clone()));
            }
            (Event::Heartbeat { subject, .. }, Outcome::Heartbeat { heartbeat_ms, .. }) => {
                if let Some(o) = self.subjects.get_mut(subject).and_then(|s| s.owner.as_mut()) {
                    o.heartbeat_ms = *heartbeat_ms;
                }
            }
            (Event::Release { subject, .. }, Outcome::Released { .. }) => {
                self.end_tenure_leases(subject, seq);
                let s = self.subjects.get_mut(subject).expect("checked");
                let o = s.owner.take().expect("checked");
                let end = TenureEnd {
                    generation: s.generation,
                    instance: o.identity.instance,
                    pid: o.identity.pid,
                    cut_off_seq: seq,
                    ended_ms: now_ms,
                    how: TenureEndHow::Released,
                };
                push_bounded(&mut s.ended, end);
            }
            (Event::RotateFence { subject, .. }, Outcome::Rotated { generation, .. }) => {
                self.subjects.get_mut(subject).expect("checked").generation = *generation;
            }
            (Event::Note { subject, .. }, Outcome::Noted { authoritative, .. }) => {
                let s = self.subjects.get_mut(subject).expect("checked");
                if *authoritative { s.notes += 1 } else { s.late_notes += 1 }
            }
            (Event::OwnerPidNamespace { subject, pid_ns }, _) => {
                // After the claim or takeover before it in the transaction.
                if let Some(o) = self.subjects.get_mut(subject).and_then(|s| s.owner.as_mut()) {
                    o.pid_ns = *pid_ns;
                }
            }
            (Event::OwnerHost { subject, host }, _) => {
                // After the claim or takeover before it in the transaction.
                if let Some(o) = self.subjects.get_mut(subject).and_then(|s| s.owner.as_mut()) {
                    o.host = Some(host.clone());
                }
            }
            (Event::ProcessHost { host }, _) => {
                // After the spawn before it in the transaction (checked).
                if let Some(p) = self.processes.get_mut(&self.last_process_id) {
                    p.host = Some(host.clone());
                }
            }
            (Event::Refused { subject, code, op, caller, count, last_ms, .. }, _) => {
                if matches!(code.as_str(), "FENCED" | "NOT_ACTIVE")
                    && let Some(s) = self.subjects.get_mut(subject)
                {
                    s.fenced_attempts += count;
                }
                self.refusal_windows.insert(refusal_window_key(subject, code, op, caller), *last_ms);
                let horizon = now_ms.saturating_sub(REFUSAL_WINDOWS_RETAIN_MS);
                if self.refusal_windows.len() > REFUSAL_WINDOWS_MAX / 2 {
                    self.refusal_windows.retain(|_, ms| *ms >= horizon);
                }
                while self.refusal_windows.len() > REFUSAL_WINDOWS_MAX {
                    let oldest =
                        self.refusal_windows.iter().min_by_key(|(k, ms)| (**ms, (*k).clone())).map(|(k, _)| k.clone());
                    if let Some(k) = oldest {
                        self.refusal_windows.remove(&k);
                    }
                }
            }
            (Event::FencedAttempts { subject, count, .. } | Event::RefusedWrites { subject, count, .. }, _) => {
                // The record is kept either way; a subject that never existed gets
                // no entry from a refused attempt on it (a typo stays out of `state`).
                if let Some(s) = self.subjects.get_mut(subject) {
                    s.fenced_attempts += count;
                }
            }
            (
                Event::LeaseAcquire { holder, .. },
                Outcome::LeaseAcquired { lease, resource, mode, token, expires_ms, displaced },
            ) => {
                for id in displaced {
                    self.end_lease(*id, LeaseState::Displaced { seq }, seq);
                }
                self.install_lease(seq, *lease, resource, *mode, holder.clone(), *token, *expires_ms, HeldBy::Text);
            }
            (
                Event::OwnerLeaseAcquire { owner, .. },
                Outcome::LeaseAcquired { lease, resource, mode, token, expires_ms, displaced },
            ) => {
                for id in displaced {
                    self.end_lease(*id, LeaseState::Displaced { seq }, seq);
                }
                let holder = format!("owner:{}@{}", owner.subject, owner.generation);
                self.install_lease(seq, *lease, resource, *mode, holder, *token, *expires_ms, HeldBy::Owner(owner));
            }
            (
                Event::SpawnRequested { fingerprint, command, owner, timeout_ms, output_bytes_max, .. },
                Outcome::SpawnRecorded { process, leases, displaced },
            ) => {
                for id in displaced {
                    if self.lease_is_live(*id) {
                        self.end_lease(*id, LeaseState::Displaced { seq }, seq);
                    }
                }
                for g in leases {
                    self.install_lease(
                        seq,
                        g.lease,
                        &g.resource,
                        g.mode,
                        process_holder(*process),
                        g.token,
                        LEASE_HELD_UNTIL_END_MS,
                        HeldBy::Process(*process),
                    );
                }
                self.last_process_id = *process;
                self.processes.insert(
                    *process,
                    Process {
                        id: *process,
                        request: request.map(str::to_owned),
                        fingerprint: *fingerprint,
                        command: command.clone(),
                        owner: owner.clone(),
                        leases: leases.iter().map(|g| g.lease).collect(),
                        timeout_ms: *timeout_ms,
                        output_bytes_max: *output_bytes_max,
                        requested_seq: seq,
                        requested_ms: now_ms,
                        host: None,
                        started: None,
                        cancel_requested_seq: None,
                        ended: None,
                    },
                );
            }
            (Event::ProcessStarted { process, runner, command_pid, command_start_ticks }, _) => {
                let p = self.processes.get_mut(process).expect("checked");
                p.started = Some(Started {
                    runner: runner.clone(),
                    command_pid: *command_pid,
                    command_start_ticks: *command_start_ticks,
                    seq,
                    time_ms: now_ms,
                });
            }
            (Event::ProcessCancelRequested { process, .. }, _) => {
                self.processes.get_mut(process).expect("checked").cancel_requested_seq = Some(seq);
            }
            (Event::ProcessEnded { process, end }, Outcome::ProcessEnded { leases_released, .. }) => {
                for id in leases_released {
                    self.end_lease(*id, LeaseState::Released { seq }, seq);
                }
                let p = self.processes.get_mut(process).expect("checked");
                p.ended =
                    Some(Ended { seq, time_ms: now_ms, end: end.clone(), leases_released: leases_released.clone() });
                self.terminal_processes.insert(seq, *process);
                while self.terminal_processes.len() > TERMINAL_PROCESSES_RETAINED {
                    let (_, old) = self.terminal_processes.pop_first().expect("non-empty");
                    self.processes.remove(&old);
                }
            }
            (Event::LeaseRelease { .. }, Outcome::LeaseReleased { lease, .. }) => {
                self.end_lease(*lease, LeaseState::Released { seq }, seq);
            }
            (Event::LeaseRelease { .. }, Outcome::LeaseReleaseFailed { lease, code, attempts, .. }) => {
                self.leases.get_mut(lease).expect("checked").state =
                    LeaseState::ReleasePending { code: code.clone(), attempts: *attempts };
            }
            _ => {} // no-op outcomes
        }
    }

    /// A new owner at `generation`, in the same record that ends the previous tenure.
    fn install(&mut self, seq: u64, subject: &str, generation: u64, owner: Owner, ended: Option<TenureEnd>) {
        if ended.is_some() {
            self.end_tenure_leases(subject, seq);
        }
        let s = self.subjects.entry(subject.to_owned()).or_default();
        if let Some(e) = ended {
            push_bounded(&mut s.ended, e);
        }
        s.generation = generation;
        s.owner = Some(owner);
    }

    /// End the live leases the current tenure of `subject` holds (in the record
    /// at `seq` that ends the tenure).
    fn end_tenure_leases(&mut self, subject: &str, seq: u64) {
        let ids: Vec<u64> = self.subjects.get(subject).map(|s| s.leases.iter().copied().collect()).unwrap_or_default();
        for id in ids {
            if self.lease_is_live(id) {
                self.end_lease(id, LeaseState::Released { seq }, seq);
            }
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn install_lease(
        &mut self,
        seq: u64,
        lease: u64,
        resource: &str,
        mode: LeaseMode,
        holder: String,
        token: u64,
        expires_ms: u64,
        held_by: HeldBy<'_>,
    ) {
        let (owner, process) = match held_by {
            HeldBy::Text => (None, None),
            HeldBy::Owner(o) => {
                if let Some(s) = self.subjects.get_mut(&o.subject) {
                    s.leases.insert(lease);
                }
                (Some(o.clone()), None)
            }
            HeldBy::Process(p) => (None, Some(p)),
        };
        let r = self.resources.entry(resource.to_owned()).or_default();
        r.token = token;
        r.live.insert(lease);
        self.last_lease_id = lease;
        self.leases.insert(
            lease,
            Lease {
                id: lease,
                resource: resource.to_owned(),
                mode,
                holder,
                token,
                acquired_seq: seq,
                expires_ms,
                state: LeaseState::Held,
                owner,
                process,
            },
        );
    }

    fn end_lease(&mut self, id: u64, state: LeaseState, seq: u64) {
        let l = self.leases.get_mut(&id).expect("live lease");
        debug_assert!(l.is_live());
        l.state = state;
        if let Some(s) = l.owner.as_ref().and_then(|o| self.subjects.get_mut(&o.subject)) {
            s.leases.remove(&id);
        }
        if let Some(r) = self.resources.get_mut(&l.resource) {
            r.live.remove(&id);
        }
        self.terminal_leases.entry(seq).or_default().push(id);
        self.terminal_lease_count += 1;
        while self.terminal_lease_count > TERMINAL_LEASES_RETAINED {
            let (_, ids) = self.terminal_leases.pop_first().expect("non-empty");
            self.terminal_lease_count -= ids.len();
            for id in ids {
                self.leases.remove(&id);
            }
        }
    }

    fn remember_request(&mut self, seq: u64, id: &str, digest: [u8; 32], outcomes: Vec<Outcome>) {
        self.requests.insert(id.to_owned(), RequestEntry { seq, digest, outcomes });
        self.request_order.insert(seq, id.to_owned());
        while self.request_order.len() > REQUESTS_RETAINED {
            let (_, old) = self.request_order.pop_first().expect("non-empty");
            self.requests.remove(&old);
        }
    }

    /// Evidence that the owner at `generation` is dead, for a claim.
    pub fn dead_owner(&self, subject: &str, reason: DeathReason) -> Option<DeadOwner> {
        let (generation, owner) = self.current(subject);
        owner.map(|o| DeadOwner { generation, instance: o.identity.instance, reason })
    }
}

/// Ids a transaction hands out, one after another.
struct Ids {
    lease: u64,
    process: u64,
}

/// A host id (`ledger::identity::host_id`): 1..=[`super::HOST_BYTES_MAX`] bytes
/// of printable text.
fn validate_host(host: &str) -> Result<(), Refusal> {
    if host.is_empty() || host.len() > super::HOST_BYTES_MAX || host.chars().any(char::is_control) {
        return refuse(Refusal::InvalidInput {
            detail: format!("a host id is 1..={} bytes of printable text", super::HOST_BYTES_MAX),
        });
    }
    Ok(())
}

fn validate_command(c: &super::CommandSpec) -> Result<(), Refusal> {
    let bad = |detail: String| refuse(Refusal::InvalidInput { detail });
    if c.argv.is_empty() || c.argv.len() > ARGS_MAX {
        return bad(format!("a command has 1..={ARGS_MAX} arguments (argv[0] included)"));
    }
    if c.argv.iter().map(String::len).sum::<usize>() > ARGS_BYTES_MAX {
        return bad(format!("a command's arguments total at most {ARGS_BYTES_MAX} bytes"));
    }
    if c.exe.len() > PATH_BYTES_MAX || c.cwd.len() > PATH_BYTES_MAX || c.exe_fingerprint.len() > PATH_BYTES_MAX {
        return bad(format!("a path is at most {PATH_BYTES_MAX} bytes"));
    }
    if c.env.len() > ENV_ENTRIES_MAX || c.env.iter().any(|e| e.name.is_empty() || e.name.len() > PATH_BYTES_MAX) {
        return bad(format!("at most {ENV_ENTRIES_MAX} environment entries, each with a name"));
    }
    Ok(())
}

/// The generation after `g`: generations never wrap (a fencing token that came
/// round again would let a fenced writer in).
fn next_generation(subject: &str, g: u64) -> Result<u64, Refusal> {
    g.checked_add(1).ok_or_else(|| Refusal::GenerationExhausted { subject: subject.to_owned(), generation: g })
}

fn push_bounded(v: &mut Vec<TenureEnd>, e: TenureEnd) {
    if v.len() == TENURES_RETAINED {
        v.remove(0);
    }
    v.push(e);
}
