//! A fenced writer's writes, and the refusals kept as evidence: a data write under
//! a generation that is not the subject's current one (or whose tenure ended) is
//! refused, and refused attempts that are recorded are coalesced into `Refused`
//! records, at most one per (subject, code, operation, caller) per window
//! (`LedgerOptions::fenced_audit_window_ms`), with a count.

use crate::model::{CallerId, Event, Projection, Refusal, RefusedContent, Txn};
use crate::storage::commit::Admission;

use super::{Inner, Ledger, LedgerError};

/// Refused attempts of one (subject, code, operation, caller), since the last record of
/// them this writer wrote.
pub(super) struct FencedWindow {
    /// When this writer last wrote a record of them (0: never).
    last_written_ms: u64,
    /// Attempts not yet written, the first of them at `first_pending_ms`.
    pending: u64,
    first_pending_ms: u64,
    /// The last attempt's details (what the record says).
    subject: String,
    code: &'static str,
    op: String,
    caller: CallerId,
    presented: Option<u64>,
    current: u64,
    retired: Option<u64>,
    /// The content of the first refused data write not yet written.
    content: Option<RefusedContent>,
}

/// What a refusal that is kept as evidence says: subject, presented generation,
/// current generation, cut-off of the presented generation when it was retired.
/// `None` for refusals that are not recorded ([`crate::model::RECORDED_REFUSALS`]).
pub(super) fn recorded(r: &Refusal, txn: &Txn) -> Option<(String, Option<u64>, u64, Option<u64>)> {
    let (subject, presented, current, retired) = match r {
        Refusal::Fenced { subject, presented, current, retired } => {
            (subject, Some(*presented), *current, retired.as_ref().map(|t| t.cut_off_seq))
        }
        // Only a data write to a released subject: a heartbeat or release after a
        // release is the owner's own late bookkeeping.
        Refusal::NotActive { subject, generation }
            if txn.events.iter().any(|e| matches!(e, Event::Note { subject: s, .. } if s == subject)) =>
        {
            (subject, Some(*generation), *generation, None)
        }
        Refusal::IdentityUncertain { subject, generation, .. } | Refusal::Busy { subject, generation, .. } => {
            (subject, None, *generation, None)
        }
        Refusal::TakeoverRace { subject, expected_generation, current_generation, .. } => {
            (subject, Some(*expected_generation), *current_generation, None)
        }
        Refusal::TakeoverActiveRefused { subject, generation, .. } => (subject, Some(*generation), *generation, None),
        _ => return None,
    };
    // Only the refusal of an event on that subject (a heartbeat, a note, a claim, a
    // takeover): a lease or a spawn on behalf of a fenced owner is the supervisor's
    // and the lease table's business, not kept.
    if !txn.events.iter().any(|e| e.subject() == Some(subject.as_str())) {
        return None;
    }
    debug_assert!(crate::model::RECORDED_REFUSALS.contains(&r.code()));
    Some((subject.clone(), presented, current, retired))
}

/// The refusal for a transaction whose data write (a note) comes under a
/// generation that is not the subject's current one, or whose tenure ended.
pub(super) fn late_write(p: &Projection, txn: &Txn, outcomes: &[crate::model::Outcome]) -> Option<Refusal> {
    txn.events.iter().zip(outcomes).find_map(|(e, o)| match (e, o) {
        (Event::Note { subject, generation, .. }, crate::model::Outcome::Noted { authoritative: false, .. }) => {
            let current = p.subject(subject).map_or(0, |s| s.generation);
            Some(if *generation == current {
                Refusal::NotActive { subject: subject.clone(), generation: current }
            } else {
                p.fenced(subject, *generation)
            })
        }
        _ => None,
    })
}

impl Ledger {
    /// Keep a compact record of a refused attempt that is kept as evidence: at
    /// most one per (subject, code, operation, caller) per window — across processes, by the
    /// `Refused` records already in the log. Repeats within the window are counted
    /// and written with the next record, or on `close`, by the writer whose record
    /// opened the window; a writer that finds the window opened by another
    /// process's record counts its repeats but does not write them unless it
    /// outlives the window (the bound on the log wins over an exact count across
    /// short-lived processes: `docs/STATE-MACHINE.md`).
    pub(super) fn audit_refusal(
        &self,
        inner: &mut Inner,
        refusal: &Refusal,
        txn: &Txn,
        caller: &CallerId,
        (subject, presented, current, retired): (String, Option<u64>, u64, Option<u64>),
        now_ms: u64,
    ) -> Result<(), LedgerError> {
        const WINDOWS_TRACKED_MAX: usize = 10_000;
        let code = refusal.code();
        let attempted = txn.events.iter().find(|e| e.subject() == Some(subject.as_str()));
        let op = attempted.map_or("?", Event::kind);
        let key = crate::model::refusal_window_key(&subject, code, op, caller);
        if inner.fenced.len() >= WINDOWS_TRACKED_MAX && !inner.fenced.contains_key(&key) {
            inner.fenced.retain(|_, f| f.pending > 0);
        }
        let window_ms = self.opts.fenced_audit_window_ms;
        let recorded_ms = inner.projection.refusal_recorded_ms(&key);
        let w = inner.fenced.entry(key.clone()).or_insert_with(|| FencedWindow {
            last_written_ms: 0,
            pending: 0,
            first_pending_ms: now_ms,
            subject: subject.clone(),
            code,
            op: op.to_owned(),
            caller: caller.clone(),
            presented,
            current,
            retired: None,
            content: None,
        });
        if w.pending == 0 {
            w.first_pending_ms = now_ms;
        }
        w.pending += 1;
        (w.presented, w.current, w.retired) = (presented, current, retired);
        // What the first refused data write of the window tried to write.
        if let (Some(Event::Note { text, .. }), None) = (attempted, &w.content) {
            w.content = Some(RefusedContent::of(text));
        }
        // A record stamped ahead of this clock (a clock stepped back, a skewed
        // writer) opens no window here: the bound must not become a blackout.
        let within = |ms: u64| ms != 0 && ms <= now_ms && now_ms - ms < window_ms;
        if within(w.last_written_ms) || recorded_ms.is_some_and(within) {
            return Ok(());
        }
        self.write_refused(inner, &key, now_ms)
    }

    /// Queue the `Refused` record for the attempts pending under `key`.
    fn write_refused(&self, inner: &mut Inner, key: &str, now_ms: u64) -> Result<(), LedgerError> {
        let w = inner.fenced.get_mut(key).expect("a window exists for a pending key");
        let event = Event::Refused {
            subject: w.subject.clone(),
            code: w.code.to_owned(),
            op: w.op.clone(),
            caller: w.caller.clone(),
            writer: self.writer_id(),
            presented: w.presented,
            current: w.current,
            retired_cut_off_seq: w.retired,
            count: std::mem::take(&mut w.pending),
            first_ms: w.first_pending_ms,
            last_ms: now_ms,
            content: w.content.take(),
        };
        w.last_written_ms = now_ms;
        let txn = Txn::new(now_ms, self.writer_id(), vec![event]);
        self.queue(inner, &txn, None).map(|_| ())
    }

    /// Write the counts of refusals not yet recorded — those of windows this
    /// writer opened, or that no record covers any more. Repeats inside a window
    /// another process's record opened are not written (see `audit_refusal`).
    pub(super) fn flush_fenced(&self) -> Result<(), LedgerError> {
        if self.group.lock().fenced.values().all(|f| f.pending == 0) {
            return Ok(());
        }
        self.commit_with(Admission::Internal, |inner| {
            let now_ms = self.opts.log.now_ms();
            let window_ms = self.opts.fenced_audit_window_ms;
            let pending: Vec<String> = inner
                .fenced
                .iter()
                .filter(|(_, f)| f.pending > 0)
                .filter(|(key, f)| {
                    let other = inner.projection.refusal_recorded_ms(key);
                    let opened_by_another =
                        other.is_some_and(|ms| ms != f.last_written_ms && ms <= now_ms && now_ms - ms < window_ms);
                    !opened_by_another
                })
                .map(|(k, _)| k.clone())
                .collect();
            let written = pending.iter().try_for_each(|key| self.write_refused(inner, key, now_ms));
            (written, inner.projection.last_seq())
        })
    }
}
