//! Leases on resources: judging and applying an acquire (by a free-text holder
//! or by an owner's tenure) and a release; how a lease is granted, installed and
//! ended.

use std::sync::Arc;

use std::collections::BTreeSet;

use serde::{Deserialize, Serialize};

use super::{Ids, Outcome, Projection, refuse};
use crate::model::flat_enum_serialize;
use crate::model::types::{validate_subject, validate_text};
use crate::model::{Blocker, Event, LeaseMode, OwnerRef, Refusal};

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
pub(super) enum HeldBy<'a> {
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

/// A lease granted with a spawn (held until the process ends).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct GrantedLease {
    pub lease: u64,
    pub resource: String,
    pub mode: LeaseMode,
    pub token: u64,
}

impl Projection {
    pub(super) fn check_lease_acquire(
        &self,
        now_ms: u64,
        resource: &str,
        mode: LeaseMode,
        holder: &str,
        ttl_ms: u64,
        ids: &mut Ids,
    ) -> Result<Outcome, Refusal> {
        validate_text("holder", holder)?;
        self.lease_acquired(resource, mode, ttl_ms, now_ms, ids)
    }

    pub(super) fn check_owner_lease_acquire(
        &self,
        now_ms: u64,
        resource: &str,
        mode: LeaseMode,
        owner: &OwnerRef,
        ttl_ms: u64,
        ids: &mut Ids,
    ) -> Result<Outcome, Refusal> {
        validate_subject(&owner.subject)?;
        self.owner_at(&owner.subject, owner.generation)?;
        self.lease_acquired(resource, mode, ttl_ms, now_ms, ids)
    }

    pub(super) fn check_lease_release(&self, lease: u64, token: u64) -> Result<Outcome, Refusal> {
        let Some(l) = self.leases.get(&lease) else { return refuse(Refusal::UnknownLease { lease }) };
        match &l.state {
            LeaseState::Released { .. } | LeaseState::Displaced { .. } => {
                Ok(Outcome::LeaseAlreadyEnded { lease, state: l.state.clone() })
            }
            _ if l.token != token => {
                let attempts = match &l.state {
                    LeaseState::ReleasePending { attempts, .. } => attempts + 1,
                    _ => 1,
                };
                Ok(Outcome::LeaseReleaseFailed { lease, code: "TOKEN_MISMATCH".into(), attempts, presented: token })
            }
            _ => Ok(Outcome::LeaseReleased { lease, token }),
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
    pub(super) fn lease_grant(&self, resource: &str, mode: LeaseMode, now_ms: u64) -> Result<(u64, Vec<u64>), Refusal> {
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

    pub(super) fn lease_is_live(&self, id: u64) -> bool {
        self.leases.get(&id).is_some_and(Lease::is_live)
    }

    /// A lease granted: to a free-text holder, or to an owner's tenure (it ends
    /// with the tenure); the leases it displaced end first.
    pub(super) fn mutate_lease_acquire(&mut self, seq: u64, e: &Event, o: &Outcome) {
        let Outcome::LeaseAcquired { lease, resource, mode, token, expires_ms, displaced } = o else { return };
        let (holder, held_by) = match e {
            Event::LeaseAcquire { holder, .. } => (holder.clone(), HeldBy::Text),
            Event::OwnerLeaseAcquire { owner, .. } => {
                (format!("owner:{}@{}", owner.subject, owner.generation), HeldBy::Owner(owner))
            }
            _ => return,
        };
        for id in displaced {
            self.end_lease(*id, LeaseState::Displaced { seq }, seq);
        }
        self.install_lease(seq, *lease, resource, *mode, holder, *token, *expires_ms, held_by);
    }

    /// A release ends the lease; a failed one leaves it held, release pending (one
    /// already ended changes nothing).
    pub(super) fn mutate_lease_release(&mut self, seq: u64, o: &Outcome) {
        match o {
            Outcome::LeaseReleased { lease, .. } => {
                self.end_lease(*lease, LeaseState::Released { seq }, seq);
            }
            Outcome::LeaseReleaseFailed { lease, code, attempts, .. } => {
                self.leases.get_mut(lease).expect("checked").state =
                    LeaseState::ReleasePending { code: code.clone(), attempts: *attempts };
            }
            _ => {}
        }
    }

    /// End the live leases the current tenure of `subject` holds (in the record
    /// at `seq` that ends the tenure).
    pub(super) fn end_tenure_leases(&mut self, subject: &str, seq: u64) {
        let ids: Vec<u64> = self.subjects.get(subject).map(|s| s.leases.iter().copied().collect()).unwrap_or_default();
        for id in ids {
            if self.lease_is_live(id) {
                self.end_lease(id, LeaseState::Released { seq }, seq);
            }
        }
    }

    #[allow(clippy::too_many_arguments)]
    pub(super) fn install_lease(
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
                if let Some(s) = self.subjects.get_mut(o.subject.as_str()).map(Arc::make_mut) {
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

    pub(super) fn end_lease(&mut self, id: u64, state: LeaseState, seq: u64) {
        let l = self.leases.get_mut(&id).expect("live lease");
        debug_assert!(l.is_live());
        l.state = state;
        if let Some(s) = l.owner.as_ref().and_then(|o| self.subjects.get_mut(o.subject.as_str()).map(Arc::make_mut)) {
            s.leases.remove(&id);
        }
        if let Some(r) = self.resources.get_mut(&l.resource) {
            r.live.remove(&id);
        }
        self.remember_terminal_lease(seq, id);
    }
}
