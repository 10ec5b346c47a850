//! Owners and their tenures: judging and applying a claim, a heartbeat, a
//! release, a fence rotation, a takeover and a note.

use std::sync::Arc;

use std::collections::BTreeSet;

use serde::{Deserialize, Serialize};

use super::retention::push_bounded;
use super::{Judging, Outcome, Projection, refuse};
use crate::model::flat_enum_serialize;
use crate::model::types::validate_text;
use crate::model::{DeadOwner, DeathReason, Event, Identity, LockIntent, Refusal, Retired};

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

impl Projection {
    pub fn subject(&self, name: &str) -> Option<&Subject> {
        self.subjects.get(name).map(|s| &**s)
    }

    pub(super) fn current(&self, subject: &str) -> (u64, Option<&Owner>) {
        self.subjects.get(subject).map_or((0, None), |s| (s.generation, s.owner.as_ref()))
    }

    /// `FENCED` for `presented` on `subject`, with how that generation was retired
    /// when a takeover or a dead-owner claim ended its tenure.
    pub fn fenced(&self, subject: &str, presented: u64) -> Refusal {
        let s = self.subjects.get(subject);
        let retired = s
            .and_then(|s| s.ended.iter().rev().find(|t| t.generation == presented))
            .filter(|t| t.how != TenureEndHow::Released)
            .map(|t| Retired { cut_off_seq: t.cut_off_seq, how: t.how });
        Refusal::Fenced { subject: subject.into(), presented, current: s.map_or(0, |s| s.generation), retired }
    }

    /// The owner at exactly `presented`, or the refusal for a stale or idle token.
    pub(super) fn owner_at(&self, subject: &str, presented: u64) -> Result<&Owner, Refusal> {
        let (current, owner) = self.current(subject);
        if presented != current {
            return refuse(self.fenced(subject, presented));
        }
        owner.ok_or_else(|| Refusal::NotActive { subject: subject.into(), generation: current })
    }

    /// A claim: of a free subject, or over an owner `previous` proves dead.
    pub(super) fn check_claim(
        &self,
        at: &Judging<'_>,
        subject: &str,
        owner: &Identity,
        lock: Option<&LockIntent>,
        previous: Option<&DeadOwner>,
    ) -> Result<Outcome, Refusal> {
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
                subject: subject.to_owned(),
                generation: next,
                owner: owner.clone(),
                retired: None,
            });
        };
        if let Some(dead) = previous.filter(|d| d.generation == generation && d.instance == cur.identity.instance) {
            let retired = Self::tenure_end(at.seq, at.now_ms, generation, cur, TenureEndHow::DeadOwner(dead.reason));
            return Ok(Outcome::Claimed {
                subject: subject.to_owned(),
                generation: next,
                owner: owner.clone(),
                retired: Some(retired),
            });
        }
        Self::claim_over_live(subject, generation, cur, lock, at.now_ms)
    }

    /// A claim of `subject`, held at `generation` by `cur` with no proof of its
    /// death: the same lock request again is the existing holding; anything else
    /// is refused (busy, active, or stale: a takeover's to replace).
    fn claim_over_live(
        subject: &str,
        generation: u64,
        cur: &Owner,
        lock: Option<&LockIntent>,
        now_ms: u64,
    ) -> Result<Outcome, Refusal> {
        if let Some(l) = lock {
            return match &cur.lock {
                None => refuse(Refusal::IdentityUncertain {
                    subject: subject.to_owned(),
                    instance: cur.identity.instance,
                    pid: cur.identity.pid,
                    generation,
                }),
                Some(held) if held.request == l.request => {
                    Ok(Outcome::LockReused { subject: subject.to_owned(), generation, owner: cur.identity.clone() })
                }
                Some(held) => refuse(Refusal::Busy {
                    subject: subject.to_owned(),
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
                subject: subject.to_owned(),
                instance: cur.identity.instance,
                pid: cur.identity.pid,
                generation,
                heartbeat_ms: cur.heartbeat_ms,
            });
        }
        refuse(Refusal::StaleRequiresTakeover {
            subject: subject.to_owned(),
            instance: cur.identity.instance,
            pid: cur.identity.pid,
            generation,
            heartbeat_ms: cur.heartbeat_ms,
            age_ms: now_ms.saturating_sub(cur.heartbeat_ms),
            stale_after_ms: cur.stale_after_ms,
        })
    }

    pub(super) fn check_heartbeat(&self, now_ms: u64, subject: &str, generation: u64) -> Result<Outcome, Refusal> {
        self.owner_at(subject, generation)?;
        Ok(Outcome::Heartbeat { subject: subject.to_owned(), generation, heartbeat_ms: now_ms })
    }

    pub(super) fn check_release(&self, subject: &str, generation: u64) -> Result<Outcome, Refusal> {
        self.owner_at(subject, generation)?;
        Ok(Outcome::Released { subject: subject.to_owned(), generation })
    }

    pub(super) fn check_rotate_fence(&self, subject: &str, generation: u64) -> Result<Outcome, Refusal> {
        self.owner_at(subject, generation)?;
        Ok(Outcome::Rotated { subject: subject.to_owned(), generation: next_generation(subject, generation)? })
    }

    /// A takeover of a stale owner, naming exactly the generation and heartbeat
    /// its writer saw.
    pub(super) fn check_takeover(
        &self,
        at: &Judging<'_>,
        subject: &str,
        expect_generation: u64,
        expect_heartbeat_ms: u64,
        owner: &Identity,
        reason: &str,
    ) -> Result<Outcome, Refusal> {
        validate_text("reason", reason)?;
        let (generation, current) = self.current(subject);
        let cur = match current {
            Some(c) if generation == expect_generation && c.heartbeat_ms == expect_heartbeat_ms => c,
            _ => {
                return refuse(Refusal::TakeoverRace {
                    subject: subject.to_owned(),
                    expected_generation: expect_generation,
                    current_generation: generation,
                    expected_heartbeat_ms: expect_heartbeat_ms,
                    current_heartbeat_ms: current.map(|c| c.heartbeat_ms),
                });
            }
        };
        let (fresh, age_ms) = Self::staleness(at, subject, generation, cur)?;
        if fresh {
            return refuse(Refusal::TakeoverActiveRefused {
                subject: subject.to_owned(),
                generation,
                heartbeat_ms: cur.heartbeat_ms,
                age_ms,
                stale_after_ms: cur.stale_after_ms,
            });
        }
        let next = next_generation(subject, generation)?;
        let retired = Self::tenure_end(at.seq, at.now_ms, generation, cur, TenureEndHow::TakenOver);
        Ok(Outcome::TookOver { subject: subject.to_owned(), generation: next, owner: owner.clone(), retired })
    }

    /// Whether `cur`, the owner of `subject` at `generation`, is still fresh for a
    /// takeover, and the age it is judged at.
    fn staleness(at: &Judging<'_>, subject: &str, generation: u64, cur: &Owner) -> Result<(bool, u64), Refusal> {
        // On a log shared by hosts the takeover carries what its writer
        // watched on its own clock (`StalenessObserved`), and is judged
        // on that alone: two hosts' wall clocks are never compared.
        let observed = at.siblings.iter().find_map(|e| match e {
            Event::StalenessObserved { subject: s, generation: g, heartbeat_ms: h, watched_ms, .. } if s == subject => {
                Some((*g, *h, *watched_ms))
            }
            _ => None,
        });
        match observed {
            Some((g, h, watched_ms)) if g == generation && h == cur.heartbeat_ms => {
                Ok((watched_ms <= cur.stale_after_ms, watched_ms))
            }
            Some((g, h, _)) => refuse(Refusal::InvalidInput {
                detail: format!(
                    "the staleness observed names generation {g} with its heartbeat at {h}; \
                     {subject} is at generation {generation} with its heartbeat at {}",
                    cur.heartbeat_ms
                ),
            }),
            None => Ok((cur.is_fresh(at.now_ms), at.now_ms.saturating_sub(cur.heartbeat_ms))),
        }
    }

    pub(super) fn check_note(&self, subject: &str, generation: u64, text: &str) -> Result<Outcome, Refusal> {
        validate_text("note", text)?;
        let (current, owner) = self.current(subject);
        if generation > current || generation == 0 {
            return refuse(self.fenced(subject, generation));
        }
        let authoritative = generation == current && owner.is_some();
        Ok(Outcome::Noted { subject: subject.to_owned(), generation, authoritative })
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

    /// A claim installs its owner (a reused lock changes nothing).
    pub(super) fn mutate_claim(&mut self, seq: u64, now_ms: u64, e: &Event, o: &Outcome) {
        let (Event::Claim { subject, owner, stale_after_ms, lock, .. }, Outcome::Claimed { generation, retired, .. }) =
            (e, o)
        else {
            return;
        };
        let owner = Owner::new(owner, seq, now_ms, *stale_after_ms, lock.clone());
        self.install(seq, subject, *generation, owner, retired.clone());
    }

    pub(super) fn mutate_takeover(&mut self, seq: u64, now_ms: u64, e: &Event, o: &Outcome) {
        let (Event::Takeover { subject, owner, stale_after_ms, .. }, Outcome::TookOver { generation, retired, .. }) =
            (e, o)
        else {
            return;
        };
        let owner = Owner::new(owner, seq, now_ms, *stale_after_ms, None);
        self.install(seq, subject, *generation, owner, Some(retired.clone()));
    }

    pub(super) fn mutate_heartbeat(&mut self, e: &Event, o: &Outcome) {
        let (Event::Heartbeat { subject, .. }, Outcome::Heartbeat { heartbeat_ms, .. }) = (e, o) else {
            return;
        };
        if let Some(o) = self.owner_mut(subject) {
            o.heartbeat_ms = *heartbeat_ms;
        }
    }

    pub(super) fn mutate_release(&mut self, seq: u64, now_ms: u64, e: &Event, o: &Outcome) {
        let (Event::Release { subject, .. }, Outcome::Released { .. }) = (e, o) else {
            return;
        };
        self.end_tenure_leases(subject, seq);
        let s = self.subjects.get_mut(subject.as_str()).map(Arc::make_mut).expect("checked");
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

    pub(super) fn mutate_rotate_fence(&mut self, e: &Event, o: &Outcome) {
        let (Event::RotateFence { subject, .. }, Outcome::Rotated { generation, .. }) = (e, o) else {
            return;
        };
        self.subjects.get_mut(subject.as_str()).map(Arc::make_mut).expect("checked").generation = *generation;
    }

    pub(super) fn mutate_note(&mut self, e: &Event, o: &Outcome) {
        let (Event::Note { subject, .. }, Outcome::Noted { authoritative, .. }) = (e, o) else {
            return;
        };
        let s = self.subjects.get_mut(subject.as_str()).map(Arc::make_mut).expect("checked");
        if *authoritative { s.notes += 1 } else { s.late_notes += 1 }
    }

    /// A new owner at `generation`, in the same record that ends the previous tenure.
    fn install(&mut self, seq: u64, subject: &str, generation: u64, owner: Owner, ended: Option<TenureEnd>) {
        if ended.is_some() {
            self.end_tenure_leases(subject, seq);
        }
        let s = Arc::make_mut(self.subjects.entry(Arc::from(subject)).or_default());
        if let Some(e) = ended {
            push_bounded(&mut s.ended, e);
        }
        s.generation = generation;
        s.owner = Some(owner);
    }
}

/// The generation after `g`: generations never wrap (a fencing token that came
/// round again would let a fenced writer in).
fn next_generation(subject: &str, g: u64) -> Result<u64, Refusal> {
    g.checked_add(1).ok_or_else(|| Refusal::GenerationExhausted { subject: subject.to_owned(), generation: g })
}
