//! Evidence kept beside the decisions: refused attempts and writes, where an owner
//! or a process runs, what a takeover saw of staleness and a claim of a death,
//! cutovers and checkpoints. Evidence never decides; what it changes is counted
//! (refused attempts) or noted on what a sibling event installs (hosts,
//! namespaces).

use std::sync::Arc;

use super::{Judging, Outcome, Projection, refuse};
use crate::model::types::{validate_subject, validate_text};
use crate::model::{
    CUTOVER_SETTLED_MAX, CallerId, DeadOwner, DeathReason, Event, HOST_BYTES_MAX, Observed, OwnerRef,
    REFUSED_CONTENT_HEAD_BYTES, Refusal, RefusedContent, SettledRequest,
};

/// How long the projection remembers when a refusal was last recorded.
pub const REFUSAL_WINDOWS_RETAIN_MS: u64 = 60_000;
/// Most (subject, code, operation, caller) refusal windows remembered.
pub const REFUSAL_WINDOWS_MAX: usize = 4096;

/// The coalescing key of a refusal record: subject, code, refused operation and
/// caller (a refused note never hides in a window of refused heartbeats: what it
/// tried to write is kept).
pub fn refusal_window_key(subject: &str, code: &str, op: &str, caller: &CallerId) -> String {
    format!("{subject}\u{0}{code}\u{0}{op}\u{0}{}", caller.key())
}

impl Projection {
    /// When the last `Refused` record under `key` ([`refusal_window_key`]) was
    /// written, if within the retained past.
    pub fn refusal_recorded_ms(&self, key: &str) -> Option<u64> {
        self.refusal_windows.get(key).copied()
    }

    /// Evidence that the owner at `generation` is dead, for a claim.
    pub fn dead_owner(&self, subject: &str, reason: DeathReason) -> Option<DeadOwner> {
        let (generation, owner) = self.current(subject);
        owner.map(|o| DeadOwner { generation, instance: o.identity.instance, reason })
    }

    pub(super) fn check_death_observed(
        &self,
        subject: &str,
        generation: u64,
        observed: &Observed,
    ) -> Result<Outcome, Refusal> {
        validate_text("boot id", &observed.boot_id)?;
        validate_text("exe", observed.exe.as_deref().unwrap_or_default())?;
        let (current, _) = self.current(subject);
        if generation != current {
            return refuse(Refusal::InvalidInput {
                detail: format!("death evidence names generation {generation}; {subject} is at {current}"),
            });
        }
        Ok(Outcome::EvidenceRecorded { subject: subject.to_owned() })
    }

    pub(super) fn mutate_fenced_attempts(&mut self, e: &Event) {
        let (Event::FencedAttempts { subject, count, .. } | Event::RefusedWrites { subject, count, .. }) = e else {
            return;
        };
        // The record is kept either way; a subject that never existed gets
        // no entry from a refused attempt on it (a typo stays out of `state`).
        if let Some(s) = self.subjects.get_mut(subject.as_str()).map(Arc::make_mut) {
            s.fenced_attempts += count;
        }
    }

    pub(super) fn mutate_refused(&mut self, now_ms: u64, e: &Event) {
        let Event::Refused { subject, code, op, caller, count, last_ms, .. } = e else {
            return;
        };
        if matches!(code.as_str(), "FENCED" | "NOT_ACTIVE")
            && let Some(s) = self.subjects.get_mut(subject.as_str()).map(Arc::make_mut)
        {
            s.fenced_attempts += count;
        }
        self.remember_refusal_window(refusal_window_key(subject, code, op, caller), *last_ms, now_ms);
    }

    pub(super) fn mutate_owner_pid_namespace(&mut self, e: &Event) {
        let Event::OwnerPidNamespace { subject, pid_ns } = e else {
            return;
        };
        // After the claim or takeover before it in the transaction.
        if let Some(o) = self.owner_mut(subject) {
            o.pid_ns = *pid_ns;
        }
    }

    pub(super) fn mutate_owner_host(&mut self, e: &Event) {
        let Event::OwnerHost { subject, host } = e else {
            return;
        };
        // After the claim or takeover before it in the transaction.
        if let Some(o) = self.owner_mut(subject) {
            o.host = Some(host.clone());
        }
    }

    pub(super) fn mutate_process_host(&mut self, e: &Event) {
        let Event::ProcessHost { host } = e else {
            return;
        };
        // After the spawn before it in the transaction (checked).
        if let Some(p) = self.processes.get_mut(&self.last_process_id) {
            p.host = Some(host.clone());
        }
    }
}

pub(super) fn check_fenced_attempts(subject: &str, op: &str, count: u64) -> Result<Outcome, Refusal> {
    validate_text("op", op)?;
    Ok(Outcome::FencedAudit { subject: subject.to_owned(), count })
}

pub(super) fn check_refused_writes(
    subject: &str,
    op: &str,
    count: u64,
    content_head: &str,
) -> Result<Outcome, Refusal> {
    validate_text("op", op)?;
    if content_head.len() > REFUSED_CONTENT_HEAD_BYTES {
        return refuse(Refusal::InvalidInput {
            detail: format!("refused content is kept to {REFUSED_CONTENT_HEAD_BYTES} bytes"),
        });
    }
    Ok(Outcome::FencedAudit { subject: subject.to_owned(), count })
}

pub(super) fn check_refused(
    subject: &str,
    code: &str,
    op: &str,
    caller: &CallerId,
    count: u64,
    content: Option<&RefusedContent>,
) -> Result<Outcome, Refusal> {
    validate_text("code", code)?;
    validate_text("op", op)?;
    validate_text("exe", &caller.exe)?;
    if content.is_some_and(|c| c.first_bytes.len() > REFUSED_CONTENT_HEAD_BYTES) {
        return refuse(Refusal::InvalidInput {
            detail: format!("refused content is kept to {REFUSED_CONTENT_HEAD_BYTES} bytes"),
        });
    }
    Ok(Outcome::FencedAudit { subject: subject.to_owned(), count })
}

pub(super) fn check_owner_pid_namespace(subject: &str) -> Result<Outcome, Refusal> {
    Ok(Outcome::EvidenceRecorded { subject: subject.to_owned() })
}

/// An owner's host goes with the claim or takeover that installs it.
pub(super) fn check_owner_host(at: &Judging<'_>, subject: &str, host: &str) -> Result<Outcome, Refusal> {
    validate_host(host)?;
    let installs = at
        .siblings
        .iter()
        .any(|e| matches!(e, Event::Claim { subject: s, .. } | Event::Takeover { subject: s, .. } if s == subject));
    if !installs {
        return refuse(Refusal::InvalidInput {
            detail: format!("an owner's host goes with the claim or takeover of {subject}"),
        });
    }
    Ok(Outcome::EvidenceRecorded { subject: subject.to_owned() })
}

/// A process's host goes with its spawn.
pub(super) fn check_process_host(at: &Judging<'_>, host: &str) -> Result<Outcome, Refusal> {
    validate_host(host)?;
    if !at.siblings.iter().any(|e| matches!(e, Event::SpawnRequested { .. })) {
        return refuse(Refusal::InvalidInput { detail: "a process's host goes with its spawn".into() });
    }
    Ok(Outcome::EvidenceRecorded { subject: String::new() })
}

/// Observed staleness goes with the takeover it is judged for.
pub(super) fn check_staleness_observed(at: &Judging<'_>, subject: &str, host: &str) -> Result<Outcome, Refusal> {
    validate_host(host)?;
    if !at.siblings.iter().any(|e| matches!(e, Event::Takeover { subject: s, .. } if s == subject)) {
        return refuse(Refusal::InvalidInput {
            detail: format!("observed staleness goes with a takeover of {subject}"),
        });
    }
    Ok(Outcome::EvidenceRecorded { subject: subject.to_owned() })
}

pub(super) fn check_cutover(
    home: &OwnerRef,
    reason: &str,
    settled: &[SettledRequest],
    more: u64,
) -> Result<Outcome, Refusal> {
    validate_subject(&home.subject)?;
    validate_text("reason", reason)?;
    if settled.len() > CUTOVER_SETTLED_MAX {
        return refuse(Refusal::InvalidInput {
            detail: format!("a cutover lists at most {CUTOVER_SETTLED_MAX} requests"),
        });
    }
    for r in settled {
        validate_text("request", &r.request)?;
        validate_text("how", &r.how)?;
        validate_text("op", &r.op)?;
    }
    Ok(Outcome::CutoverRecorded { settled: settled.len() as u64 + more })
}

/// A checkpoint vouches only for a snapshot before it.
pub(super) fn check_checkpoint(seq: u64, snapshot_seq: u64) -> Result<Outcome, Refusal> {
    if snapshot_seq >= seq {
        return refuse(Refusal::InvalidInput {
            detail: format!("a checkpoint at {seq} cannot vouch for a snapshot at {snapshot_seq}"),
        });
    }
    Ok(Outcome::Checkpointed { snapshot_seq })
}

/// A host id (`ledger::identity::host_id`): 1..=[`HOST_BYTES_MAX`] bytes
/// of printable text.
fn validate_host(host: &str) -> Result<(), Refusal> {
    if host.is_empty() || host.len() > HOST_BYTES_MAX || host.chars().any(char::is_control) {
        return refuse(Refusal::InvalidInput {
            detail: format!("a host id is 1..={HOST_BYTES_MAX} bytes of printable text"),
        });
    }
    Ok(())
}
