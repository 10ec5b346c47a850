//! `audit`: the forensic story of every change of owner, reconstructed only from
//! the log (read-only, like the inspector). The log is replayed through the model;
//! each record's outcomes say how a tenure began or ended, so the story is exactly
//! what the writers validated.
//!
//! Definitions used in the report (also in docs/INSPECT-AND-AUDIT.md):
//! - a *tenure* is one (owner, generation) period; it begins with a claim of a free
//!   subject, a claim over a provably dead owner, a takeover of a stale owner, or a
//!   fence rotation, and ends with a release, a retirement (with its cut-off
//!   sequence), a rotation, or not at all (still active);
//! - a *cutover* is a change of owner by retirement (takeover or dead-owner claim);
//! - *requests in flight* at a cutover are request-tagged transactions on that
//!   subject committed after the old owner's last heartbeat: what a caller that lost
//!   its response around the cutover needs to know, with whether each counted.

mod render;

use std::collections::BTreeMap;
use std::path::Path;

use serde::Serialize;
use serde_json::{Value, json};

use crate::format::RecordRef;
use crate::model::{
    CallerId, DeathReason, Event, Identity, LeaseState, Observed, Outcome, Projection, TenureEnd, TenureEndHow, Txn,
    decode_txn, flatten_tagged,
};
use crate::storage::{Error, ReadSummary, ScanItem};
pub use render::{html, text};

#[derive(Debug, Clone, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Began {
    ClaimOfFreeSubject,
    /// `observed`: what the claimant saw of the dead owner's pid (logs written
    /// before it was recorded have none).
    ClaimOverDeadOwner {
        previous_generation: u64,
        evidence: DeathReason,
        observed: Option<Observed>,
    },
    /// `staleness_observed`: on a log shared by hosts, what the taker watched
    /// on its own clock (the takeover was judged on it).
    TakeoverOfStaleOwner {
        previous_generation: u64,
        expected_heartbeat_ms: u64,
        reason: String,
        #[serde(skip_serializing_if = "Option::is_none")]
        staleness_observed: Option<StalenessObserved>,
    },
    FenceRotation {
        previous_generation: u64,
    },
}

/// What a takeover's writer watched of the owner on its own clock.
#[derive(Debug, Clone, Serialize)]
pub struct StalenessObserved {
    pub watched_ms: u64,
    pub heartbeat_ms: u64,
    pub host: String,
}

#[derive(Debug, Clone, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Ended {
    StillActive,
    Released,
    Retired { cut_off_seq: u64, by: String },
    Rotated { new_generation: u64 },
}

#[derive(Debug, Clone, Serialize)]
pub struct Tenure {
    pub generation: u64,
    pub owner: Identity,
    pub began_seq: u64,
    pub began_ms: u64,
    pub began: Began,
    pub ended_seq: Option<u64>,
    pub ended_ms: Option<u64>,
    pub ended: Ended,
    pub heartbeats: u64,
    pub last_heartbeat_seq: u64,
    pub last_heartbeat_ms: u64,
    /// Refused attempts made against this tenure's generation (from the records
    /// that kept them), and late records under it.
    pub refused_attempts: u64,
    pub late_records: u64,
}

#[derive(Debug, Clone, Serialize)]
pub struct Gap {
    pub after_generation: u64,
    pub before_generation: u64,
    pub gap_ms: u64,
    /// `none` (the subject was free), `handed_over_in_one_record`, or a violation.
    pub authoritative_during: String,
}

/// A record of refused attempts (coalesced): a fenced-out or late writer, or a
/// contested claim or takeover.
#[derive(Debug, Clone, Serialize)]
pub struct Fenced {
    pub seq: u64,
    /// The refusal code (records written before codes were kept: `FENCED`, or
    /// `NOT_ACTIVE` for a note on a released subject).
    pub code: String,
    /// Who asked: process evidence and instance (`null` in records written before
    /// callers were kept; then only `writer` tells).
    pub caller: Option<CallerId>,
    pub writer: String,
    pub op: String,
    pub presented: Option<u64>,
    pub current: u64,
    /// The tenure the attempt was made against: the presented generation, or the
    /// current one when none was presented.
    pub generation: u64,
    pub count: u64,
    pub first_ms: u64,
    pub last_ms: u64,
    /// For refused data writes: what the first of them tried to write.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub refused_content: Option<RefusedContent>,
}

/// Evidence of a refused data write's content (never the data itself beyond its
/// first bytes).
#[derive(Debug, Clone, Serialize)]
pub struct RefusedContent {
    pub blake3: String,
    pub bytes: u64,
    /// Its first bytes, as text.
    #[serde(rename = "head")]
    pub first_bytes: String,
    /// Where the presented generation's authoritative history stops, when a
    /// takeover or a dead-owner claim retired it.
    pub retired_cut_off_seq: Option<u64>,
}

/// Group refusal records by who made them (in order of first appearance).
fn by_caller(records: &[Fenced]) -> Vec<CallerAttempts> {
    let mut groups: Vec<(String, CallerAttempts)> = vec![];
    for f in records {
        let key = f.caller.as_ref().map_or_else(|| format!("writer:{}", f.writer), CallerId::key);
        let at = match groups.iter().position(|(k, _)| *k == key) {
            Some(i) => i,
            None => {
                let who = match &f.caller {
                    Some(c) => crate::view::record::caller_text(c),
                    None => format!("writer {} (no caller recorded)", f.writer),
                };
                let g = CallerAttempts {
                    who,
                    caller: f.caller.clone(),
                    attempts: 0,
                    records: 0,
                    codes: Default::default(),
                    generations: vec![],
                    first_ms: f.first_ms,
                    last_ms: f.last_ms,
                    seqs: vec![],
                };
                groups.push((key, g));
                groups.len() - 1
            }
        };
        let g = &mut groups[at].1;
        g.attempts += f.count;
        g.records += 1;
        *g.codes.entry(f.code.clone()).or_default() += f.count;
        if !g.generations.contains(&f.generation) {
            g.generations.push(f.generation);
        }
        g.first_ms = g.first_ms.min(f.first_ms);
        g.last_ms = g.last_ms.max(f.last_ms);
        g.seqs.push(f.seq);
    }
    groups.into_iter().map(|(_, g)| g).collect()
}

/// Every refused attempt on a subject by one caller, across its records.
#[derive(Debug, Clone, Serialize)]
pub struct CallerAttempts {
    /// The caller as text (`pid P (start T, exe E) instance I`, a remote caller,
    /// or the writer of records that kept no caller).
    pub who: String,
    pub caller: Option<CallerId>,
    pub attempts: u64,
    pub records: u64,
    /// Attempts by refusal code.
    pub codes: std::collections::BTreeMap<String, u64>,
    /// The tenures (generations) they were made against.
    pub generations: Vec<u64>,
    pub first_ms: u64,
    pub last_ms: u64,
    pub seqs: Vec<u64>,
}

#[derive(Debug, Clone, Serialize)]
pub struct Late {
    pub seq: u64,
    pub time_ms: u64,
    pub writer: String,
    pub kind: String,
    pub presented_generation: u64,
    pub current_generation: u64,
}

#[derive(Debug, Clone, Serialize)]
pub struct LeaseFate {
    pub lease: u64,
    pub resource: String,
    pub holder: String,
    pub token: u64,
    /// What the end of the log says became of it.
    pub fate: Value,
}

#[derive(Debug, Clone, Serialize)]
pub struct RequestFate {
    pub request: String,
    pub seq: u64,
    pub kinds: Vec<String>,
    pub authoritative: bool,
    pub said: String,
}

#[derive(Debug, Clone, Serialize)]
pub struct Cutover {
    pub seq: u64,
    pub time_ms: u64,
    pub from_generation: u64,
    pub to_generation: u64,
    pub how: String,
    /// Leases live at the cutover that belong to the tenure handed over or to its
    /// processes — plus free-text-holder leases, which the ledger cannot attribute.
    pub leases_live: Vec<LeaseFate>,
    /// Processes owned by the subject that had not ended at the cutover.
    pub processes_in_flight: Vec<ProcessFate>,
    pub requests_in_flight: Vec<RequestFate>,
}

#[derive(Debug, Clone, Serialize)]
pub struct ProcessFate {
    pub process: u64,
    pub argv: Vec<String>,
    pub owner_generation: u64,
    /// Its status at the end of the log, and the record that ended it.
    pub status: String,
    pub ended_seq: Option<u64>,
}

#[derive(Debug, Clone, Serialize)]
pub struct SubjectStory {
    pub subject: String,
    pub tenures: Vec<Tenure>,
    pub gaps: Vec<Gap>,
    pub cutovers: Vec<Cutover>,
    /// Refused attempts kept as evidence, in log order.
    pub fenced_attempts: Vec<Fenced>,
    /// The same, grouped by who made them.
    pub attempts_by_caller: Vec<CallerAttempts>,
    pub late_records: Vec<Late>,
    pub verdict: String,
}

#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub records: u64,
    pub last_seq: Option<u64>,
    pub chain_head: String,
    pub log_problems: Vec<Value>,
    /// What makes the audit fail (exit 4): a subject whose verdict is violated, a
    /// record that does not decode. One line each, at most `FINDINGS_LISTED_MAX`.
    pub findings: Vec<String>,
    pub subjects: Vec<SubjectStory>,
    /// Daemon cutovers (`fencelog serve` handing over): every admitted request and
    /// how it was settled.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub daemon_cutovers: Vec<DaemonCutover>,
}

#[derive(Debug, Clone, Serialize)]
pub struct DaemonCutover {
    pub seq: u64,
    pub time_ms: u64,
    pub home: String,
    pub generation: u64,
    pub reason: String,
    pub settled: Vec<crate::model::SettledRequest>,
    /// Settled requests beyond those listed.
    pub more: u64,
}

/// Findings listed in a report (the count of undecodable records is always given).
pub const FINDINGS_LISTED_MAX: usize = 1000;

impl Report {
    /// 0 consistent · 1 the log is damaged (the story is incomplete) · 4 a verdict is
    /// violated or a record does not decode.
    pub fn exit_code(&self) -> u8 {
        if !self.log_problems.is_empty() {
            1
        } else if !self.findings.is_empty() {
            4
        } else {
            0
        }
    }
}

/// A request-tagged record touching a subject.
struct Tagged {
    seq: u64,
    id: String,
    kinds: Vec<String>,
    authoritative: bool,
}

#[derive(Default)]
struct Work {
    story: Option<SubjectStory>,
    tagged: Vec<Tagged>,
    violations: Vec<String>,
    /// Lease ids live at each cutover (indexed like `cutovers`).
    cutover_leases: Vec<Vec<u64>>,
    /// Processes in flight at each cutover: (id, owner generation).
    cutover_processes: Vec<Vec<(u64, u64)>>,
}

/// The subject a live lease belongs to, for the cutover listing: `None` for a
/// free-text holder (unattributable: listed at every cutover).
fn lease_subject(p: &Projection, l: &crate::model::Lease) -> Option<String> {
    if let Some(o) = &l.owner {
        return Some(o.subject.clone());
    }
    l.process
        .map(|id| p.processes().get(&id).and_then(|x| x.owner.as_ref()).map(|o| o.subject.clone()).unwrap_or_default())
}

impl Work {
    fn story(&mut self, subject: &str) -> &mut SubjectStory {
        self.story.get_or_insert_with(|| SubjectStory {
            subject: subject.to_owned(),
            tenures: vec![],
            gaps: vec![],
            cutovers: vec![],
            fenced_attempts: vec![],
            attempts_by_caller: vec![],
            late_records: vec![],
            verdict: String::new(),
        })
    }

    fn open_tenure(&mut self, subject: &str) -> Option<&mut Tenure> {
        self.story(subject).tenures.last_mut().filter(|t| matches!(t.ended, Ended::StillActive))
    }

    fn end(&mut self, subject: &str, seq: u64, ms: u64, ended: Ended) {
        match self.open_tenure(subject) {
            Some(t) => {
                t.ended = ended;
                t.ended_seq = Some(seq);
                t.ended_ms = Some(ms);
            }
            None => self.violations.push(format!("a tenure ended at sequence {seq} but none was open")),
        }
    }

    fn begin(&mut self, subject: &str, t: Tenure, handover: bool) {
        if self.open_tenure(subject).is_some() {
            self.violations.push(format!("two owners authoritative at sequence {}", t.began_seq));
        }
        let story = self.story(subject);
        if let Some(prev) = story.tenures.last() {
            if t.generation <= prev.generation {
                let msg = format!("generation {} after {} at sequence {}", t.generation, prev.generation, t.began_seq);
                self.violations.push(msg);
            }
            let story = self.story(subject);
            let prev = story.tenures.last().expect("checked");
            let gap = Gap {
                after_generation: prev.generation,
                before_generation: t.generation,
                gap_ms: t.began_ms.saturating_sub(prev.ended_ms.unwrap_or(t.began_ms)),
                authoritative_during: if handover { "handed_over_in_one_record".into() } else { "none".into() },
            };
            story.gaps.push(gap);
        }
        self.story(subject).tenures.push(t);
    }
}

/// Replay the log and tell every subject's story (`only`: one subject).
pub fn audit(src: &crate::inspect::Source, only: Option<&str>) -> Result<Report, Error> {
    let mut replay = Replay::new(only);
    let summary = src.scan(1, |item| {
        if let ScanItem::Record { rec, .. } = item {
            replay.record(rec);
        }
        true
    })?;
    Ok(replay.report(&summary))
}

/// The audit's replay of the log: the model's state, and each subject's story as
/// far as it has been told.
struct Replay<'a> {
    only: Option<&'a str>,
    p: Projection,
    undecodable: Vec<u64>,
    work: BTreeMap<String, Work>,
    daemon_cutovers: Vec<DaemonCutover>,
}

/// One record as replayed: what its events need to tell their part of a story.
struct Replayed<'a> {
    seq: u64,
    ms: u64,
    writer: String,
    txn: &'a Txn,
    /// Each subject's generation before this record.
    pre_generation: BTreeMap<String, u64>,
    live: LiveBefore,
}

/// What is live before a record that may be a cutover (a claim or a takeover; for
/// any other record, nothing): the held leases with the subject each belongs to, and
/// the processes not ended with their owner's subject and generation.
struct LiveBefore {
    leases: Vec<(u64, Option<String>)>,
    processes: Vec<(u64, String, u64)>,
}

impl LiveBefore {
    fn of(p: &Projection, txn: &Txn) -> LiveBefore {
        let may_cut = txn.events.iter().any(|e| matches!(e, Event::Claim { .. } | Event::Takeover { .. }));
        let leases: Vec<(u64, Option<String>)> = if may_cut {
            p.leases()
                .values()
                .filter(|l| matches!(l.state, LeaseState::Held | LeaseState::ReleasePending { .. }))
                .map(|l| (l.id, lease_subject(p, l)))
                .collect()
        } else {
            vec![]
        };
        let processes: Vec<(u64, String, u64)> = if may_cut {
            p.processes()
                .values()
                .filter(|x| x.ended.is_none())
                .filter_map(|x| x.owner.as_ref().map(|o| (x.id, o.subject.clone(), o.generation)))
                .collect()
        } else {
            vec![]
        };
        LiveBefore { leases, processes }
    }

    /// What is in flight for `subject` at a cutover: its leases (and every
    /// free-text-holder lease), and its processes with their owner generation.
    fn in_flight(&self, subject: &str) -> (Vec<u64>, Vec<(u64, u64)>) {
        let leases =
            self.leases.iter().filter(|(_, s)| s.as_deref().is_none_or(|s| s == subject)).map(|(id, _)| *id).collect();
        let procs = self.processes.iter().filter(|(_, s, _)| s == subject).map(|(id, _, g)| (*id, *g)).collect();
        (leases, procs)
    }
}

impl Replayed<'_> {
    /// A tenure that begins at this record.
    fn tenure(&self, generation: u64, owner: &Identity, began: Began) -> Tenure {
        Tenure {
            generation,
            owner: owner.clone(),
            began_seq: self.seq,
            began_ms: self.ms,
            began,
            ended_seq: None,
            ended_ms: None,
            ended: Ended::StillActive,
            heartbeats: 0,
            last_heartbeat_seq: self.seq,
            last_heartbeat_ms: self.ms,
            refused_attempts: 0,
            late_records: 0,
        }
    }
}

impl<'a> Replay<'a> {
    fn new(only: Option<&'a str>) -> Replay<'a> {
        Replay {
            only,
            p: Projection::default(),
            undecodable: Vec::new(),
            work: BTreeMap::new(),
            daemon_cutovers: Vec::new(),
        }
    }

    /// Apply one record, and give each of its events to its subject's story.
    fn record(&mut self, rec: &RecordRef<'_>) {
        if rec.seq <= self.p.last_seq() {
            return;
        }
        let Ok(txn) = decode_txn(rec.payload) else {
            self.p.skip_undecodable(rec.seq);
            if self.undecodable.len() < FINDINGS_LISTED_MAX {
                self.undecodable.push(rec.seq);
            }
            return;
        };
        let writer = uuid::Uuid::from_bytes(rec.writer).to_string();
        // What is live before this record, if it may be a cutover.
        let live = LiveBefore::of(&self.p, &txn);
        let pre_generation: BTreeMap<String, u64> = txn
            .events
            .iter()
            .filter_map(Event::subject)
            .map(|s| (s.to_owned(), self.p.subject(s).map_or(0, |x| x.generation)))
            .collect();
        let outcomes = match self.p.apply(rec.seq, &txn) {
            Ok(o) => o,
            Err(r) => {
                for s in txn.events.iter().filter_map(Event::subject) {
                    self.work.entry(s.to_owned()).or_default().violations.push(format!(
                        "record {} does not validate: {}",
                        rec.seq,
                        r.code()
                    ));
                }
                return;
            }
        };
        let at = Replayed { seq: rec.seq, ms: txn.time_ms, writer, txn: &txn, pre_generation, live };
        self.keep_daemon_cutovers(&at);
        for (e, o) in txn.events.iter().zip(&outcomes) {
            let Some(subject) = e.subject() else { continue };
            if self.only.is_some_and(|s| s != subject) {
                continue;
            }
            let w = self.work.entry(subject.to_owned()).or_default();
            if let Some(r) = &txn.request {
                let authoritative = !matches!(o, Outcome::Noted { authoritative: false, .. });
                w.tagged.push(Tagged { seq: at.seq, id: r.id.clone(), kinds: vec![e.kind().into()], authoritative });
            }
            w.event(&at, subject, e, o);
        }
    }

    /// The record's daemon cutovers (`fencelog serve` handing over), of the
    /// subject audited if there is one.
    fn keep_daemon_cutovers(&mut self, at: &Replayed<'_>) {
        for e in &at.txn.events {
            if let Event::Cutover { home, reason, settled, more } = e
                && self.only.is_none_or(|s| s == home.subject)
            {
                self.daemon_cutovers.push(DaemonCutover {
                    seq: at.seq,
                    time_ms: at.ms,
                    home: home.subject.clone(),
                    generation: home.generation,
                    reason: reason.clone(),
                    settled: settled.clone(),
                    more: *more,
                });
            }
        }
    }

    /// Every story finished against the end of the log, and the findings.
    fn report(self, summary: &ReadSummary) -> Report {
        let subjects: Vec<SubjectStory> = self.work.into_values().filter_map(|w| w.finish(&self.p)).collect();
        let mut findings: Vec<String> = Vec::new();
        if self.p.undecodable() > 0 {
            findings.push(format!(
                "{} record(s) do not decode (first: {}); their effect on the state is unknown",
                self.p.undecodable(),
                self.undecodable.iter().map(u64::to_string).collect::<Vec<_>>().join(", ")
            ));
        }
        for s in subjects.iter().filter(|s| s.verdict != "consistent") {
            if findings.len() < FINDINGS_LISTED_MAX {
                findings.push(format!("{}: {}", s.subject, s.verdict));
            }
        }
        Report {
            findings,
            records: summary.records,
            last_seq: summary.last_seq,
            chain_head: summary.chain_head.clone(),
            log_problems: summary
                .problems
                .iter()
                .map(|pr| json!({"kind": pr.kind, "offset": pr.offset, "seq": pr.seq, "torn_tail": pr.torn_tail}))
                .collect(),
            subjects,
            daemon_cutovers: self.daemon_cutovers,
        }
    }
}

/// What the claimant over `subject`'s dead owner saw of it, from the claim's own
/// transaction.
fn death_observed(txn: &Txn, subject: &str) -> Option<Observed> {
    txn.events.iter().find_map(|e| match e {
        Event::DeathObserved { subject: s, observed, .. } if s == subject => Some(observed.clone()),
        _ => None,
    })
}

/// What the taker of `subject` watched on its own clock, from the takeover's own
/// transaction.
fn staleness_observed(txn: &Txn, subject: &str) -> Option<StalenessObserved> {
    txn.events.iter().find_map(|e| match e {
        Event::StalenessObserved { subject: s, watched_ms, heartbeat_ms, host, .. } if s == subject => {
            Some(StalenessObserved { watched_ms: *watched_ms, heartbeat_ms: *heartbeat_ms, host: host.clone() })
        }
        _ => None,
    })
}

impl Fenced {
    /// A refusal record at `seq` as evidence (`None`: `e` is no refusal record).
    fn of(seq: u64, e: &Event) -> Option<Fenced> {
        Fenced::of_fenced_attempts(seq, e)
            .or_else(|| Fenced::of_refused_writes(seq, e))
            .or_else(|| Fenced::of_refused(seq, e))
    }

    fn of_fenced_attempts(seq: u64, e: &Event) -> Option<Fenced> {
        let Event::FencedAttempts { writer, op, presented, current, count, first_ms, last_ms, .. } = e else {
            return None;
        };
        Some(Fenced {
            seq,
            code: "FENCED".into(),
            caller: None,
            writer: writer.to_string(),
            op: op.clone(),
            presented: Some(*presented),
            current: *current,
            generation: *presented,
            count: *count,
            first_ms: *first_ms,
            last_ms: *last_ms,
            refused_content: None,
        })
    }

    fn of_refused_writes(seq: u64, e: &Event) -> Option<Fenced> {
        let Event::RefusedWrites {
            writer,
            op,
            presented,
            current,
            retired_cut_off_seq,
            count,
            first_ms,
            last_ms,
            content_blake3,
            content_bytes,
            content_head,
            ..
        } = e
        else {
            return None;
        };
        Some(Fenced {
            seq,
            code: if presented == current { "NOT_ACTIVE" } else { "FENCED" }.into(),
            caller: None,
            writer: writer.to_string(),
            op: op.clone(),
            presented: Some(*presented),
            current: *current,
            generation: *presented,
            count: *count,
            first_ms: *first_ms,
            last_ms: *last_ms,
            refused_content: Some(RefusedContent {
                blake3: crate::format::hex(content_blake3),
                bytes: *content_bytes,
                first_bytes: content_head.clone(),
                retired_cut_off_seq: *retired_cut_off_seq,
            }),
        })
    }

    fn of_refused(seq: u64, e: &Event) -> Option<Fenced> {
        let Event::Refused {
            code,
            op,
            caller,
            writer,
            presented,
            current,
            retired_cut_off_seq,
            count,
            first_ms,
            last_ms,
            content,
            ..
        } = e
        else {
            return None;
        };
        Some(Fenced {
            seq,
            code: code.clone(),
            caller: Some(caller.clone()),
            writer: writer.to_string(),
            op: op.clone(),
            presented: *presented,
            current: *current,
            generation: presented.unwrap_or(*current),
            count: *count,
            first_ms: *first_ms,
            last_ms: *last_ms,
            refused_content: content.as_ref().map(|c| RefusedContent {
                blake3: crate::format::hex(&c.blake3),
                bytes: c.bytes,
                first_bytes: c.first_bytes.clone(),
                retired_cut_off_seq: *retired_cut_off_seq,
            }),
        })
    }
}

impl Work {
    /// One event's part in its subject's story, by what the model made of it.
    fn event(&mut self, at: &Replayed<'_>, subject: &str, e: &Event, o: &Outcome) {
        match (e, o) {
            (_, Outcome::Claimed { generation, owner, retired: Some(r), .. }) => {
                self.claimed_over_dead_owner(at, subject, *generation, owner, r);
            }
            (_, Outcome::Claimed { generation, owner, retired: None, .. }) => {
                self.begin(subject, at.tenure(*generation, owner, Began::ClaimOfFreeSubject), false);
            }
            (
                Event::Takeover { expect_heartbeat_ms, reason, .. },
                Outcome::TookOver { generation, owner, retired, .. },
            ) => {
                let began = Began::TakeoverOfStaleOwner {
                    previous_generation: retired.generation,
                    expected_heartbeat_ms: *expect_heartbeat_ms,
                    reason: reason.clone(),
                    staleness_observed: staleness_observed(at.txn, subject),
                };
                let (by, how) = ("takeover of a stale owner".into(), "stale owner taken over".into());
                self.hand_over(at, subject, retired, by, how, at.tenure(*generation, owner, began));
            }
            (_, Outcome::Rotated { generation, .. }) => self.rotated(at, subject, *generation),
            (_, Outcome::Released { .. }) => self.end(subject, at.seq, at.ms, Ended::Released),
            (_, Outcome::Heartbeat { .. }) => {
                if let Some(t) = self.open_tenure(subject) {
                    t.heartbeats += 1;
                    t.last_heartbeat_seq = at.seq;
                    t.last_heartbeat_ms = at.ms;
                }
            }
            (_, Outcome::Noted { authoritative: false, generation, .. }) => self.late(at, subject, e, *generation),
            (Event::FencedAttempts { .. } | Event::RefusedWrites { .. } | Event::Refused { .. }, _) => {
                self.story(subject).fenced_attempts.extend(Fenced::of(at.seq, e));
            }
            _ => {}
        }
    }

    /// A claim over a provably dead owner (a claim that retired a tenure any other
    /// way is passed over).
    fn claimed_over_dead_owner(
        &mut self,
        at: &Replayed<'_>,
        subject: &str,
        generation: u64,
        owner: &Identity,
        r: &TenureEnd,
    ) {
        let TenureEndHow::DeadOwner(reason) = r.how else { return };
        let began = Began::ClaimOverDeadOwner {
            previous_generation: r.generation,
            evidence: reason,
            observed: death_observed(at.txn, subject),
        };
        let by = format!("claim over dead owner ({})", reason.code());
        let how = format!("dead owner claimed ({})", reason.code());
        self.hand_over(at, subject, r, by, how, at.tenure(generation, owner, began));
    }

    /// A change of owner by retirement, in one record: the retired tenure ends at
    /// its cut-off (`by`), the cutover (`how`) keeps what was in flight, and `next`
    /// begins.
    fn hand_over(
        &mut self,
        at: &Replayed<'_>,
        subject: &str,
        retired: &TenureEnd,
        by: String,
        how: String,
        next: Tenure,
    ) {
        self.end(subject, at.seq, at.ms, Ended::Retired { cut_off_seq: retired.cut_off_seq, by });
        self.cutover(at.seq, at.ms, retired.generation, next.generation, how, at.live.in_flight(subject));
        self.begin(subject, next, true);
    }

    /// A fence rotation: the same owner's tenure ends and its next one begins.
    fn rotated(&mut self, at: &Replayed<'_>, subject: &str, generation: u64) {
        let owner = self.open_tenure(subject).map(|t| t.owner.clone());
        self.end(subject, at.seq, at.ms, Ended::Rotated { new_generation: generation });
        if let Some(owner) = owner {
            self.begin(
                subject,
                at.tenure(generation, &owner, Began::FenceRotation { previous_generation: generation - 1 }),
                true,
            );
        }
    }

    /// A note under a retired generation (kept, not authoritative).
    fn late(&mut self, at: &Replayed<'_>, subject: &str, e: &Event, generation: u64) {
        let current = at.pre_generation.get(subject).copied().unwrap_or(0);
        let late = Late {
            seq: at.seq,
            time_ms: at.ms,
            writer: at.writer.clone(),
            kind: e.kind().into(),
            presented_generation: generation,
            current_generation: current,
        };
        self.story(subject).late_records.push(late);
    }

    fn cutover(&mut self, seq: u64, ms: u64, from: u64, to: u64, how: String, live: (Vec<u64>, Vec<(u64, u64)>)) {
        let story = self.story.as_mut().expect("a cutover follows a tenure");
        story.cutovers.push(Cutover {
            seq,
            time_ms: ms,
            from_generation: from,
            to_generation: to,
            how,
            leases_live: vec![],
            processes_in_flight: vec![],
            requests_in_flight: vec![],
        });
        self.cutover_leases.push(live.0);
        self.cutover_processes.push(live.1);
    }

    /// Fill in what the end of the log says (lease fates, requests), and the verdict.
    fn finish(mut self, end: &Projection) -> Option<SubjectStory> {
        let mut story = self.story.take()?;
        story.attempts_by_caller = by_caller(&story.fenced_attempts);
        for t in &mut story.tenures {
            t.refused_attempts =
                story.fenced_attempts.iter().filter(|f| f.generation == t.generation).map(|f| f.count).sum();
            t.late_records =
                story.late_records.iter().filter(|l| l.presented_generation == t.generation).count() as u64;
        }
        for (c, leases) in story.cutovers.iter_mut().zip(&self.cutover_leases) {
            c.leases_live = leases.iter().map(|id| lease_fate(end, *id)).collect();
        }
        for (c, procs) in story.cutovers.iter_mut().zip(&self.cutover_processes) {
            c.processes_in_flight = procs.iter().map(|(id, generation)| process_fate(end, *id, *generation)).collect();
        }
        for c in story.cutovers.iter_mut() {
            let retired = story.tenures.iter().find(|t| t.generation == c.from_generation);
            let since = retired.map_or(0, |t| t.last_heartbeat_seq);
            c.requests_in_flight = requests_in_flight(&self.tagged, since, c.seq);
        }
        story.verdict = match self.violations.first() {
            None => "consistent".into(),
            Some(v) => format!("violated: {v}"),
        };
        Some(story)
    }
}

/// What the end of the log says became of lease `id`, live at a cutover.
fn lease_fate(end: &Projection, id: u64) -> LeaseFate {
    match end.leases().get(&id) {
        Some(l) => LeaseFate {
            lease: id,
            resource: l.resource.clone(),
            holder: l.holder.clone(),
            token: l.token,
            fate: flatten_tagged(&l.state),
        },
        None => LeaseFate {
            lease: id,
            resource: String::new(),
            holder: String::new(),
            token: 0,
            fate: json!({"kind": "forgotten", "detail": "beyond the projection's retention"}),
        },
    }
}

/// What the end of the log says became of process `id`, in flight at a cutover
/// under its owner's `generation`.
fn process_fate(end: &Projection, id: u64, generation: u64) -> ProcessFate {
    let x = end.processes().get(&id);
    ProcessFate {
        process: id,
        argv: x.map(|x| x.command.argv.clone()).unwrap_or_default(),
        owner_generation: generation,
        status: x.map_or("forgotten (beyond retention)", |x| x.status().as_str()).into(),
        ended_seq: x.and_then(|x| x.ended.as_ref().map(|e| e.seq)),
    }
}

/// The request-tagged records in flight at the cutover at sequence `cut`: those
/// after the retired owner's last heartbeat (`since`), and whether each counted.
fn requests_in_flight(tagged: &[Tagged], since: u64, cut: u64) -> Vec<RequestFate> {
    tagged
        .iter()
        .filter(|r| r.seq > since && r.seq != cut)
        .filter(|r| r.seq < cut || !r.authoritative)
        .map(|r| RequestFate {
            request: r.id.clone(),
            seq: r.seq,
            kinds: r.kinds.clone(),
            authoritative: r.authoritative && r.seq < cut,
            said: if r.seq < cut {
                format!("committed at {} before the cut-off: it counted", r.seq)
            } else {
                format!(
                    "committed at {} after the cut-off under the retired generation: kept, not authoritative",
                    r.seq
                )
            },
        })
        .collect()
}

/// A report is never written into the log directory (it could replace a segment or
/// the lock file): refuse `out` there.
pub fn check_report_path(log_dir: &Path, out: &Path) -> Result<(), String> {
    let parent = out.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
    let (Ok(log), Ok(target)) = (log_dir.canonicalize(), parent.canonicalize()) else { return Ok(()) };
    if target.starts_with(&log) {
        return Err(format!("refusing to write the report inside the log directory {}", log.display()));
    }
    Ok(())
}
