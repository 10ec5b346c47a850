//! The projection (current state) and the transition rules.
//!
//! `check` judges a transaction and `apply` folds a committed one in; both here.
//! Each kind of event is judged and applied by one function in the file of its
//! domain: `ownership.rs` (claims, heartbeats, releases, fence rotations,
//! takeovers, notes), `leases.rs`, `processes.rs` and `evidence.rs`;
//! `retention.rs` bounds what the projection remembers.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::flat_enum_serialize;

use super::types::{validate_subject, validate_text};
use super::{
    Condition, Event, Identity, LeaseMode, Process, ProcessStatus, Refusal, TXN_CONDITIONS_MAX, TXN_EVENTS_MAX, Txn,
};

mod evidence;
mod leases;
mod ownership;
mod processes;
mod retention;

// Every item keeps the path it had when the projection was one file (some are
// used only inside their own file today, hence the allows).
pub use evidence::{REFUSAL_WINDOWS_MAX, REFUSAL_WINDOWS_RETAIN_MS, refusal_window_key};
pub use leases::{GrantedLease, Lease, LeaseState, Resource};
pub use ownership::{Owner, Subject, TenureEnd, TenureEndHow};
#[allow(unused_imports)]
pub use processes::{LEASE_HELD_UNTIL_END_MS, process_holder};
#[allow(unused_imports)]
pub use retention::{REQUESTS_RETAINED, TENURES_RETAINED, TERMINAL_LEASES_RETAINED, TERMINAL_PROCESSES_RETAINED};

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
    last_seq: u64,
    /// (Subjects and requests are shared with the projection's clones, a
    /// snapshot's above all: a clone copies the maps' nodes and counts references,
    /// never the entries — it is taken under the commit engine's mutex — and a
    /// subject changed while a clone holds it is copied then, alone. Serialized
    /// as the plain strings and values they hold: the same bytes.)
    subjects: BTreeMap<Arc<str>, Arc<Subject>>,
    resources: BTreeMap<String, Resource>,
    leases: BTreeMap<u64, Lease>,
    last_lease_id: u64,
    requests: BTreeMap<Arc<str>, Arc<RequestEntry>>,
    processes: BTreeMap<u64, Process>,
    last_process_id: u64,
    /// Ended processes by the sequence that ended them, for bounded retention.
    terminal_processes: BTreeMap<u64, u64>,
    /// Request ids by commit sequence, for bounded retention.
    request_order: BTreeMap<u64, Arc<str>>,
    /// Terminal leases by the sequence that ended them, for bounded retention, and
    /// how many there are (kept, not recounted: ending a lease must stay O(log n)).
    terminal_leases: BTreeMap<u64, Vec<u64>>,
    terminal_lease_count: usize,
    /// Committed records that no longer validate on replay (should stay 0).
    anomalies: u64,
    /// Committed records whose payload did not decode.
    undecodable: u64,
    /// When the last `Refused` record of each (subject, code, operation, caller) was written
    /// (its `last_ms`), for coalescing across processes; entries older than
    /// [`REFUSAL_WINDOWS_RETAIN_MS`] go, and at most [`REFUSAL_WINDOWS_MAX`] stay.
    /// (Last in the struct: a snapshot written before it existed fails to decode
    /// and is ignored, never misread.)
    refusal_windows: BTreeMap<String, u64>,
}

/// What the state holds, read-only: only applying a record changes it.
impl Projection {
    /// The sequence of the last record applied (0: none).
    pub fn last_seq(&self) -> u64 {
        self.last_seq
    }

    /// Every subject ever claimed, by name.
    pub fn subjects(&self) -> &BTreeMap<Arc<str>, Arc<Subject>> {
        &self.subjects
    }

    /// Resources under leases, by name.
    pub fn resources(&self) -> &BTreeMap<String, Resource> {
        &self.resources
    }

    /// Leases by id: the active ones and the terminal ones retained.
    pub fn leases(&self) -> &BTreeMap<u64, Lease> {
        &self.leases
    }

    /// The last lease id handed out.
    pub fn last_lease_id(&self) -> u64 {
        self.last_lease_id
    }

    /// Request ids remembered (for idempotent retries), by id.
    pub fn requests(&self) -> &BTreeMap<Arc<str>, Arc<RequestEntry>> {
        &self.requests
    }

    /// Supervised processes by id: the live ones and the ended ones retained.
    pub fn processes(&self) -> &BTreeMap<u64, Process> {
        &self.processes
    }

    /// The last process id handed out.
    pub fn last_process_id(&self) -> u64 {
        self.last_process_id
    }

    /// Committed records that no longer validate on replay (should stay 0).
    pub fn anomalies(&self) -> u64 {
        self.anomalies
    }

    /// Committed records whose payload did not decode.
    pub fn undecodable(&self) -> u64 {
        self.undecodable
    }

    /// The owner of `subject`, writable, if it has one: the subject is copied
    /// first only if a clone of the projection shares it (and only then: one
    /// without an owner is left shared).
    pub(super) fn owner_mut(&mut self, subject: &str) -> Option<&mut Owner> {
        self.subjects.get_mut(subject).filter(|s| s.owner.is_some()).map(Arc::make_mut).and_then(|s| s.owner.as_mut())
    }

    /// A subject's state, writable: for tests that forge a state no log reaches
    /// (a generation at its limit, a snapshot that lies). Feature `internals`.
    #[cfg(feature = "internals")]
    pub fn forge_subject(&mut self, name: &str) -> Option<&mut Subject> {
        self.subjects.get_mut(name).map(Arc::make_mut)
    }

    /// Entries of the state a snapshot copies: subjects, resources, leases,
    /// requests remembered and processes.
    pub fn entries(&self) -> u64 {
        (self.subjects.len() + self.resources.len() + self.leases.len() + self.requests.len() + self.processes.len())
            as u64
    }
}

fn refuse<T>(r: Refusal) -> Result<T, Refusal> {
    Err(r)
}

/// Ids a transaction hands out, one after another.
struct Ids {
    lease: u64,
    process: u64,
}

/// The record an event is judged for: its sequence and time, and every event of
/// its transaction (this one among them: evidence goes with the event it is for).
struct Judging<'a> {
    seq: u64,
    now_ms: u64,
    siblings: &'a [Event],
}

impl Projection {
    /// Validate `txn` as the record at `seq`, computing what it would do.
    pub fn check(&self, seq: u64, txn: &Txn) -> Result<Checked, Refusal> {
        if let Some(tag) = &txn.request {
            validate_text("request id", &tag.id)?;
            if let Some(entry) = self.requests.get(tag.id.as_str()) {
                if entry.digest == tag.digest {
                    return Ok(Checked::Deduplicated(RequestEntry::clone(entry)));
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
        let at = Judging { seq, now_ms: txn.time_ms, siblings: &txn.events };
        let outcomes = txn.events.iter().map(|e| self.check_event(&at, e, &mut ids)).collect::<Result<Vec<_>, _>>()?;
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
            Ok(()) => self
                .subjects
                .get_mut(subject.as_str())
                .filter(|s| s.generation == *generation && s.owner.is_some())
                .map(Arc::make_mut),
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
                let actual = self.subjects.get(subject.as_str()).map_or(0, |s| s.generation);
                if actual != *generation {
                    return failed(
                        format!("subject {subject} at generation"),
                        generation.to_string(),
                        actual.to_string(),
                    );
                }
            }
            Condition::SubjectAbsent { subject } => {
                if let Some(s) = self.subjects.get(subject.as_str()).filter(|s| s.owner.is_some()) {
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

    /// One event of a transaction (`at.siblings`: all of its events, this one
    /// among them), judged on the state before the transaction by the function
    /// of its kind.
    fn check_event(&self, at: &Judging<'_>, e: &Event, ids: &mut Ids) -> Result<Outcome, Refusal> {
        if let Some(s) = e.subject() {
            validate_subject(s)?;
        }
        match e {
            Event::Claim { subject, owner, lock, previous, .. } => {
                self.check_claim(at, subject, owner, lock.as_ref(), previous.as_ref())
            }
            Event::Heartbeat { subject, generation } => self.check_heartbeat(at.now_ms, subject, *generation),
            Event::Release { subject, generation } => self.check_release(subject, *generation),
            Event::RotateFence { subject, generation } => self.check_rotate_fence(subject, *generation),
            Event::Takeover { subject, expect_generation, expect_heartbeat_ms, owner, reason, .. } => {
                self.check_takeover(at, subject, *expect_generation, *expect_heartbeat_ms, owner, reason)
            }
            Event::Note { subject, generation, text } => self.check_note(subject, *generation, text),
            Event::FencedAttempts { subject, op, count, .. } => evidence::check_fenced_attempts(subject, op, *count),
            Event::RefusedWrites { subject, op, count, content_head, .. } => {
                evidence::check_refused_writes(subject, op, *count, content_head)
            }
            Event::OwnerPidNamespace { subject, .. } => evidence::check_owner_pid_namespace(subject),
            Event::OwnerHost { subject, host } => evidence::check_owner_host(at, subject, host),
            Event::ProcessHost { host } => evidence::check_process_host(at, host),
            Event::StalenessObserved { subject, host, .. } => evidence::check_staleness_observed(at, subject, host),
            Event::Refused { subject, code, op, caller, count, content, .. } => {
                evidence::check_refused(subject, code, op, caller, *count, content.as_ref())
            }
            Event::DeathObserved { subject, generation, observed, .. } => {
                self.check_death_observed(subject, *generation, observed)
            }
            Event::LeaseAcquire { resource, mode, holder, ttl_ms } => {
                self.check_lease_acquire(at.now_ms, resource, *mode, holder, *ttl_ms, ids)
            }
            Event::Cutover { home, reason, settled, more } => evidence::check_cutover(home, reason, settled, *more),
            Event::OwnerLeaseAcquire { resource, mode, owner, ttl_ms } => {
                self.check_owner_lease_acquire(at.now_ms, resource, *mode, owner, *ttl_ms, ids)
            }
            Event::SpawnRequested { command, owner, leases, .. } => {
                self.check_spawn(at.now_ms, command, owner.as_ref(), leases, ids)
            }
            Event::ProcessStarted { process, command_pid, .. } => self.check_process_started(*process, *command_pid),
            Event::ProcessCancelRequested { process, by } => self.check_cancel_requested(*process, by.as_ref()),
            Event::ProcessEnded { process, end } => self.check_process_ended(*process, end),
            Event::Checkpoint { snapshot_seq, .. } => evidence::check_checkpoint(at.seq, *snapshot_seq),
            Event::LeaseRelease { lease, token } => self.check_lease_release(*lease, *token),
        }
    }

    /// Fold one event and the outcome `check_event` gave it into the state, by the
    /// function of its kind. Each acts on the outcome it expects; any other (a
    /// reused lock, a lease already ended) changes nothing.
    fn mutate(&mut self, seq: u64, now_ms: u64, request: Option<&str>, e: &Event, o: &Outcome) {
        match e {
            Event::Claim { .. } => self.mutate_claim(seq, now_ms, e, o),
            Event::Takeover { .. } => self.mutate_takeover(seq, now_ms, e, o),
            Event::Heartbeat { .. } => self.mutate_heartbeat(e, o),
            Event::Release { .. } => self.mutate_release(seq, now_ms, e, o),
            Event::RotateFence { .. } => self.mutate_rotate_fence(e, o),
            Event::Note { .. } => self.mutate_note(e, o),
            Event::OwnerPidNamespace { .. } => self.mutate_owner_pid_namespace(e),
            Event::OwnerHost { .. } => self.mutate_owner_host(e),
            Event::ProcessHost { .. } => self.mutate_process_host(e),
            Event::Refused { .. } => self.mutate_refused(now_ms, e),
            Event::FencedAttempts { .. } | Event::RefusedWrites { .. } => self.mutate_fenced_attempts(e),
            Event::LeaseAcquire { .. } | Event::OwnerLeaseAcquire { .. } => self.mutate_lease_acquire(seq, e, o),
            Event::SpawnRequested { .. } => self.mutate_spawn(seq, now_ms, request, e, o),
            Event::ProcessStarted { .. } => self.mutate_process_started(seq, now_ms, e),
            Event::ProcessCancelRequested { .. } => self.mutate_cancel_requested(seq, e),
            Event::ProcessEnded { .. } => self.mutate_process_ended(seq, now_ms, e, o),
            Event::LeaseRelease { .. } => self.mutate_lease_release(seq, o),
            // Evidence kept in the log only (a takeover or a claim was judged on
            // it), and checkpoints and cutovers: the state does not change.
            Event::StalenessObserved { .. }
            | Event::DeathObserved { .. }
            | Event::Checkpoint { .. }
            | Event::Cutover { .. } => {}
        }
    }
}
