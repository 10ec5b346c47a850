//! `inspect`: the offline inspector. It reads a live log or a copy and never writes:
//! no lock, no truncation, no repair. Everything here is built on the storage
//! readers (`scan_dir`, `Tailer`) and the pure model.

pub use crate::storage::Source;

use std::collections::BTreeMap;
use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::{Value, json};

use crate::format::{RecordRef, frame_bytes, hex};
use crate::model::{Event, Projection, Txn, decode_txn};
use crate::storage::{Error, Problem, ProblemKind, ReadSummary, ScanItem};
use crate::view::record::file_name;
pub use crate::view::record::{caller_text, record_json};
pub use crate::view::time::{format_ms, parse_time};

/// A progress bar on stderr over the log's bytes, only when stderr is a terminal
/// (and the `cli` feature brings indicatif; the library alone shows none).
#[cfg(feature = "cli")]
type Bar = indicatif::ProgressBar;
#[cfg(not(feature = "cli"))]
type Bar = NoBar;

#[cfg(not(feature = "cli"))]
struct NoBar;
#[cfg(not(feature = "cli"))]
impl NoBar {
    fn set_position(&self, _: u64) {}
    fn finish_and_clear(&self) {}
}

struct Progress {
    bar: Option<Bar>,
    base: BTreeMap<String, u64>,
    ticks: u64,
}

impl Progress {
    fn new(src: &Source, what: &str) -> Progress {
        if !std::io::stderr().is_terminal() || cfg!(not(feature = "cli")) {
            return Progress { bar: None, base: BTreeMap::new(), ticks: 0 };
        }
        let mut base = BTreeMap::new();
        let mut total = 0;
        for (_, p) in src.segments() {
            base.insert(file_name(&p), total);
            // The entry itself (a symlink is not followed: it is refused unread).
            total += std::fs::symlink_metadata(&p).map(|m| m.len()).unwrap_or(0);
        }
        Progress { bar: new_bar(total, what), base, ticks: 0 }
    }

    fn at(&mut self, segment: &Path, offset: u64) {
        self.ticks += 1;
        if let Some(bar) = self.bar.as_ref().filter(|_| self.ticks.is_multiple_of(4096)) {
            bar.set_position(self.base.get(&file_name(segment)).copied().unwrap_or(0) + offset);
        }
    }
}

#[cfg(feature = "cli")]
fn new_bar(total: u64, what: &str) -> Option<Bar> {
    let bar = indicatif::ProgressBar::new(total);
    bar.set_style(
        indicatif::ProgressStyle::with_template("{msg} [{bar:40}] {bytes}/{total_bytes} {bytes_per_sec} eta {eta}")
            .expect("template")
            .progress_chars("=> "),
    );
    bar.set_message(what.to_owned());
    Some(bar)
}

#[cfg(not(feature = "cli"))]
fn new_bar(_total: u64, _what: &str) -> Option<Bar> {
    None
}

impl Drop for Progress {
    fn drop(&mut self) {
        if let Some(b) = &self.bar {
            b.finish_and_clear();
        }
    }
}

/// Exit code of `verify`: 0 intact, 1 damaged.
pub fn verify(src: &Source) -> Result<(ReadSummary, u8), Error> {
    verify_pinned(src, &[])
}

/// A head kept elsewhere: the log must hold chain link `link` at sequence `seq`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pin {
    pub seq: u64,
    /// Lowercase hex, 64 digits.
    pub link: String,
}

/// Parse `SEQ:HEX` (as `inspect head` prints them).
pub fn parse_pin(s: &str) -> Result<Pin, String> {
    let (seq, link) = s.split_once(':').ok_or("expected SEQ:HEX, e.g. 42:9f1c…")?;
    let seq = seq.parse::<u64>().map_err(|e| format!("sequence {seq:?}: {e}"))?;
    let link = link.to_ascii_lowercase();
    if link.len() != 64 || !link.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(format!("chain head {link:?}: expected 64 hex digits"));
    }
    Ok(Pin { seq, link })
}

/// `verify`, then check the pinned heads and every snapshot against a replay of
/// the log up to its sequence; each mismatch is a problem (exit 1).
pub fn verify_pinned(src: &Source, pins: &[Pin]) -> Result<(ReadSummary, u8), Error> {
    let (mut s, _) = verify_with(src, || {})?;
    check_pins_and_snapshots(src, pins, &mut s)?;
    let code = if s.is_intact() { 0 } else { 1 };
    Ok((s, code))
}

fn extra_problem(kind: ProblemKind, segment: PathBuf, seq: u64, detail: String) -> Problem {
    Problem { kind, segment, offset: 0, seq, torn_tail: false, damaged_bytes: 0, detail }
}

/// Every snapshot and pinned head against the log (read once, as far as the last
/// of them): each mismatch is a problem in `s`.
fn check_pins_and_snapshots(src: &Source, pins: &[Pin], s: &mut ReadSummary) -> Result<(), Error> {
    // An archived history that was not given cannot be replayed: no snapshot or
    // pin before its end can be checked (the `history_archived` problem says so).
    if s.problems.iter().any(|p| p.kind == ProblemKind::HistoryArchived) {
        return Ok(());
    }
    let (snaps, wanted) = snapshots_to_compare(src, s);
    let (links, replayed_to) = replay_comparing_snapshots(src, pins, &snaps, &wanted, s)?;
    snapshots_beyond_the_log(&snaps, &wanted, replayed_to, s);
    check_pins(src, pins, links, s);
    Ok(())
}

/// A stored snapshot: what it says of itself (or why it cannot be read), and where
/// it is.
type StoredMeta = (Result<crate::storage::SnapshotMeta, String>, PathBuf);

/// The stored snapshots, and those to compare with a replay by the sequence they
/// cover (indexes into the first); one that cannot be read is a problem.
fn snapshots_to_compare(src: &Source, s: &mut ReadSummary) -> (Vec<StoredMeta>, BTreeMap<u64, Vec<usize>>) {
    use crate::ledger::snapshot;
    // Streamed (digest only): a snapshot file is never held whole to be checked.
    let stored = src.snapshots();
    let snaps: Vec<_> = stored.iter().map(|x| (x.meta.clone(), x.place.clone())).collect();
    let mut wanted: std::collections::BTreeMap<u64, Vec<usize>> = Default::default();
    for (i, (snap, path)) in snaps.iter().enumerate() {
        // A snapshot of another projection schema (another build's) is never
        // adopted by a writer, so it is not compared: not damage.
        let schema = src.snapshot_prefix(&stored[i], snapshot::SCHEMA_PREFIX_BYTES).map(|b| snapshot::schema_of(&b));
        let _ = path;
        match snap {
            Ok(_) if schema.is_ok_and(|s| s != snapshot::PROJECTION_SCHEMA) => {}
            Ok(l) => wanted.entry(l.seq).or_default().push(i),
            Err(e) => s.problems.push(extra_problem(ProblemKind::SnapshotDamaged, path.clone(), 0, e.clone())),
        }
    }
    (snaps, wanted)
}

/// Read the log up to the last pinned or wanted sequence, replaying it up to the
/// last wanted snapshot: a snapshot that is not the state the replay gives at its
/// sequence is a problem. Returns the chain links at the pinned sequences read, and
/// the replay's last sequence.
fn replay_comparing_snapshots(
    src: &Source,
    pins: &[Pin],
    snaps: &[StoredMeta],
    wanted: &BTreeMap<u64, Vec<usize>>,
    s: &mut ReadSummary,
) -> Result<(BTreeMap<u64, String>, u64), Error> {
    use crate::ledger::snapshot;
    let replay_to = wanted.keys().next_back().copied().unwrap_or(0);
    let read_to = pins.iter().map(|p| p.seq).max().unwrap_or(0).max(replay_to);
    let mut links = std::collections::BTreeMap::new();
    let mut p = Projection::default();
    if read_to > 0 {
        src.scan(1, |item| {
            let ScanItem::Record { rec, .. } = item else { return true };
            if rec.seq <= p.last_seq() {
                return true; // never apply out of order after a resync
            }
            if pins.iter().any(|pin| pin.seq == rec.seq) {
                links.insert(rec.seq, hex(&rec.link));
            }
            if rec.seq <= replay_to {
                match decode_txn(rec.payload) {
                    Ok(txn) => drop(p.apply(rec.seq, &txn)),
                    Err(_) => p.skip_undecodable(rec.seq),
                }
                for &i in wanted.get(&rec.seq).into_iter().flatten() {
                    let (Ok(l), path) = &snaps[i] else { continue };
                    let body = snapshot::body_of(&p);
                    if snapshot::digest_of(&body) != l.digest || l.chain_head != rec.link {
                        s.problems.push(extra_problem(
                            ProblemKind::SnapshotMismatch,
                            path.clone(),
                            l.seq,
                            format!(
                                "the snapshot at sequence {} is not the state a replay of the log gives there \
                                 (snapshot blake3 {}, replay {}); a writer would not adopt it",
                                l.seq,
                                hex(&l.digest),
                                hex(&snapshot::digest_of(&body))
                            ),
                        ));
                    }
                }
            }
            rec.seq < read_to
        })?;
    }
    Ok((links, p.last_seq()))
}

/// A wanted snapshot beyond the replay's last sequence: the log ends before it.
fn snapshots_beyond_the_log(
    snaps: &[StoredMeta],
    wanted: &BTreeMap<u64, Vec<usize>>,
    replayed_to: u64,
    s: &mut ReadSummary,
) {
    for (seq, idx) in wanted {
        if *seq > replayed_to {
            for &i in idx {
                let path = snaps[i].1.clone();
                let d = format!("the snapshot covers sequence {seq} but the log ends at {replayed_to}");
                s.problems.push(extra_problem(ProblemKind::SnapshotMismatch, path, *seq, d));
            }
        }
    }
}

/// Each pin against the chain link the log holds at its sequence.
fn check_pins(src: &Source, pins: &[Pin], mut links: BTreeMap<u64, String>, s: &mut ReadSummary) {
    links.insert(0, hex(&crate::format::GENESIS_LINK)); // the head of the empty log
    for pin in pins {
        match links.get(&pin.seq) {
            Some(h) if *h == pin.link => {}
            Some(h) => s.problems.push(extra_problem(
                ProblemKind::HeadMismatch,
                src.label(),
                pin.seq,
                format!("the chain head at sequence {} is {h}, not the pinned {}", pin.seq, pin.link),
            )),
            None => s.problems.push(extra_problem(
                ProblemKind::LogShorterThanPinned,
                src.label(),
                pin.seq,
                format!(
                    "a head was pinned at sequence {} but the log's intact records end at {}: records were cut or \
                     the log was replaced",
                    pin.seq,
                    s.last_seq.unwrap_or(0)
                ),
            )),
        }
    }
}

/// A chain head to keep elsewhere (`inspect head`).
#[derive(Debug, Clone, serde::Serialize)]
pub struct Head {
    pub seq: u64,
    pub chain_head: String,
    pub time_ms: Option<u64>,
}

/// The chain head at sequence `at` (default: the last intact record). The log's
/// whole history must be intact up to there.
pub fn head(src: &Source, at: Option<u64>) -> Result<Head, Error> {
    let mut found = Head { seq: 0, chain_head: hex(&crate::format::GENESIS_LINK), time_ms: None };
    let mut damage = None;
    src.scan(1, |item| match item {
        ScanItem::Record { rec, .. } => {
            if at.is_some_and(|a| rec.seq > a) {
                return false;
            }
            found = Head { seq: rec.seq, chain_head: hex(&rec.link), time_ms: Some(rec.time_ms) };
            true
        }
        ScanItem::Damage(p) if p.torn_tail => true,
        ScanItem::Damage(p) => {
            damage = Some(p.clone());
            false
        }
    })?;
    if let Some(p) = damage {
        return Err(Error::Corruption { segment: p.segment, offset: p.offset, seq: p.seq, detail: p.detail });
    }
    if let Some(a) = at.filter(|a| *a != found.seq) {
        return Err(Error::NotFound { detail: format!("the log ends at sequence {}, before {a}", found.seq) });
    }
    Ok(found)
}

/// How many times `verify` reads a log again when it shows damage while it changes
/// (an append in progress on a live log, not damage).
pub const VERIFY_LIVE_REREADS_MAX: u32 = 3;

/// `verify`, calling `after_read` after each read of the log (a seam for tests).
///
/// On a live log, the last frame may be an append in progress and look like a torn
/// tail (or, in a preallocated segment, a group half copied over the end mark can
/// look like corruption). Damage therefore stands only if the segments did not
/// change from before the read to after it; if the log changed meanwhile, it is read
/// again (at most `VERIFY_LIVE_REREADS_MAX` times, then the last reading is reported
/// as it is).
fn verify_with(src: &Source, mut after_read: impl FnMut()) -> Result<(ReadSummary, u8), Error> {
    let mut rereads = 0;
    loop {
        let before = src.fingerprint();
        let mut progress = Progress::new(src, "verify");
        let s = src.scan(1, |item| {
            if let ScanItem::Record { segment, offset, .. } = item {
                progress.at(segment, offset);
            }
            true
        })?;
        drop(progress);
        after_read();
        // Damage of either kind stands only if nothing changed meanwhile: in a
        // preallocated segment a group being copied over the end mark can look
        // like corruption for a moment.
        if s.is_intact() || rereads == VERIFY_LIVE_REREADS_MAX || src.fingerprint() == before {
            let code = if s.is_intact() { 0 } else { 1 };
            return Ok((s, code));
        }
        rereads += 1;
        tracing::info!(log = %src.label().display(), rereads, "the log grew while it was read: reading it again");
    }
}

fn problem_json(p: &Problem) -> Value {
    json!({
        "kind": p.kind, "segment": file_name(&p.segment), "offset": p.offset, "seq": p.seq,
        "torn_tail": p.torn_tail, "damaged_bytes": p.damaged_bytes, "detail": p.detail,
    })
}

fn verdict(s: &ReadSummary) -> &'static str {
    if s.is_intact() {
        "intact"
    } else if s.problems.iter().all(|p| p.kind == ProblemKind::HistoryArchived) {
        // What is there verifies; what is not was moved to an archive not given.
        "history_archived"
    } else if s.has_corruption() {
        "corrupt"
    } else {
        "torn_tail"
    }
}

pub fn verify_json(s: &ReadSummary) -> Value {
    json!({
        "status": verdict(s),
        "segments": s.segments, "bytes": s.bytes, "records": s.records,
        "first_seq": s.first_seq, "last_seq": s.last_seq,
        "first_time_ms": s.first_time_ms, "last_time_ms": s.last_time_ms,
        "chain_head": s.chain_head,
        "problems": s.problems.iter().map(problem_json).collect::<Vec<_>>(),
    })
}

pub fn verify_text(s: &ReadSummary, out: &mut dyn Write) -> std::io::Result<()> {
    crate::text_line!(out, "segments {}  bytes {}  records {}", s.segments, s.bytes, s.records)?;
    if let (Some(a), Some(b)) = (s.first_seq, s.last_seq) {
        crate::text_line!(out, "sequence {a}..{b}")?;
    }
    if let (Some(a), Some(b)) = (s.first_time_ms, s.last_time_ms) {
        crate::text_line!(out, "time {} .. {}", format_ms(a), format_ms(b))?;
    }
    crate::text_line!(out, "chain head {}", s.chain_head)?;
    for p in &s.problems {
        let what = match p.kind {
            _ if p.torn_tail => "torn tail: recovery would truncate it",
            ProblemKind::HistoryArchived => "archived: not here, not verified",
            ProblemKind::SnapshotMismatch | ProblemKind::SnapshotDamaged => "snapshot: a writer would not adopt it",
            ProblemKind::HeadMismatch | ProblemKind::LogShorterThanPinned => "the log does not hold a pinned head",
            _ => "corruption: recovery refuses",
        };
        crate::text_line!(
            out,
            "problem: {} at segment {} byte {} (sequence {}), {} bytes: {} [{what}]",
            p.kind,
            file_name(&p.segment),
            p.offset,
            p.seq,
            p.damaged_bytes,
            p.detail
        )?;
    }
    let only_snapshots_or_pins = s.problems.iter().filter(|p| !p.torn_tail).all(|p| p.kind.is_snapshot_or_pin());
    let status = match verdict(s) {
        "intact" => "intact",
        "history_archived" => {
            "INCOMPLETE: the records held verify, but the history before them is archived (give --archive DIR to \
             verify it all)"
        }
        "corrupt" if only_snapshots_or_pins => {
            "DAMAGED: the records verify, but the log does not match its snapshots or pinned heads"
        }
        "corrupt" => "DAMAGED: corruption (a writer refuses to open this log)",
        _ => "DAMAGED: torn tail only (a writer would truncate it on open)",
    };
    crate::text_line!(out, "status: {status}")
}

/// One event as text, by family: a subject's ownership, the evidence behind an
/// owner, refused attempts, leases, processes, the log's own records.
fn event_text(e: &Event) -> String {
    match e {
        Event::Claim { .. }
        | Event::Heartbeat { .. }
        | Event::Release { .. }
        | Event::Takeover { .. }
        | Event::RotateFence { .. }
        | Event::Note { .. } => ownership_event_text(e),
        Event::OwnerPidNamespace { .. }
        | Event::OwnerHost { .. }
        | Event::StalenessObserved { .. }
        | Event::DeathObserved { .. } => owner_evidence_text(e),
        Event::FencedAttempts { .. } | Event::RefusedWrites { .. } | Event::Refused { .. } => refusal_event_text(e),
        Event::LeaseAcquire { .. } | Event::LeaseRelease { .. } | Event::OwnerLeaseAcquire { .. } => {
            lease_event_text(e)
        }
        Event::SpawnRequested { .. }
        | Event::ProcessStarted { .. }
        | Event::ProcessCancelRequested { .. }
        | Event::ProcessEnded { .. }
        | Event::ProcessHost { .. } => process_event_text(e),
        Event::Checkpoint { .. } | Event::Cutover { .. } => log_event_text(e),
    }
}

/// A subject's ownership: claims, heartbeats, releases, takeovers, rotations, notes.
fn ownership_event_text(e: &Event) -> String {
    match e {
        Event::Claim { subject, owner, lock, previous, .. } => {
            let mut s = format!("claim {subject:?} by {} pid {}", owner.instance, owner.pid);
            if let Some(l) = lock {
                s += &format!(" lock action={} request={}", l.action, l.request);
            }
            if let Some(p) = previous {
                s += &format!(" over dead gen {} ({})", p.generation, p.reason.code());
            }
            s
        }
        Event::Heartbeat { subject, generation } => format!("heartbeat {subject:?} gen {generation}"),
        Event::Release { subject, generation } => format!("release {subject:?} gen {generation}"),
        Event::Takeover { subject, expect_generation, expect_heartbeat_ms, owner, reason, .. } => format!(
            "takeover {subject:?} gen {expect_generation} (heartbeat {}) by {} pid {}: {reason:?}",
            format_ms(*expect_heartbeat_ms),
            owner.instance,
            owner.pid
        ),
        Event::RotateFence { subject, generation } => format!("rotate-fence {subject:?} gen {generation}"),
        Event::Note { subject, generation, text } => format!("note {subject:?} gen {generation}: {text:?}"),
        _ => unreachable!("dispatched in event_text"),
    }
}

/// The evidence behind an owner or its end: its pid namespace and host, the
/// staleness a taker watched, the death a claimant saw.
fn owner_evidence_text(e: &Event) -> String {
    match e {
        Event::OwnerPidNamespace { subject, pid_ns } => format!("owner-pid-namespace {subject:?} {pid_ns}"),
        Event::OwnerHost { subject, host } => format!("owner-host {subject:?} {host:?}"),
        Event::StalenessObserved { subject, generation, heartbeat_ms, watched_ms, host } => format!(
            "staleness-observed {subject:?} gen {generation} heartbeat {} unchanged for {watched_ms} ms watched on {host:?}",
            format_ms(*heartbeat_ms)
        ),
        Event::DeathObserved { subject, generation, pid, reason, observed } => {
            let seen = match (observed.start_ticks, &observed.exe) {
                (None, _) => "no such process".to_owned(),
                (Some(t), Some(exe)) => format!("start ticks {t}, exe {exe}"),
                (Some(t), None) => format!("start ticks {t}"),
            };
            format!(
                "death-observed {subject:?} gen {generation} pid {pid} ({}): {seen}; boot {} pid ns {}",
                reason.code(),
                observed.boot_id,
                observed.pid_ns
            )
        }
        _ => unreachable!("dispatched in event_text"),
    }
}

/// Refused attempts kept as evidence.
fn refusal_event_text(e: &Event) -> String {
    match e {
        Event::FencedAttempts { subject, writer, op, presented, current, count, .. } => {
            format!("fenced {subject:?}: {count}x {op} by writer {} presented {presented} current {current}", writer)
        }
        Event::RefusedWrites {
            subject,
            writer,
            op,
            presented,
            current,
            count,
            content_blake3,
            content_bytes,
            content_head,
            ..
        } => format!(
            "refused {subject:?}: {count}x {op} by writer {writer} presented {presented} current {current}, first: {content_bytes} bytes blake3 {} {content_head:?}",
            crate::format::hex(content_blake3)
        ),
        Event::Refused { subject, code, op, caller, presented, current, count, content, .. } => {
            let presented = presented.map(|g| format!(" presented {g}")).unwrap_or_default();
            let mut s = format!(
                "refused {subject:?}: {count}x {op} {code} by {}{presented} current {current}",
                caller_text(caller)
            );
            if let Some(c) = content {
                s +=
                    &format!(", first: {} bytes blake3 {} {:?}", c.bytes, crate::format::hex(&c.blake3), c.first_bytes);
            }
            s
        }
        _ => unreachable!("dispatched in event_text"),
    }
}

/// Leases: acquired by a holder or an owner tenure, released.
fn lease_event_text(e: &Event) -> String {
    match e {
        Event::LeaseAcquire { resource, mode, holder, ttl_ms } => {
            format!("lease-acquire {resource} {} holder {holder:?} ttl {ttl_ms} ms", mode.as_str())
        }
        Event::LeaseRelease { lease, token } => format!("lease-release {lease} token {token}"),
        Event::OwnerLeaseAcquire { resource, mode, owner, ttl_ms } => {
            format!(
                "lease-acquire {resource} {} owner {:?}@{} ttl {ttl_ms} ms",
                mode.as_str(),
                owner.subject,
                owner.generation
            )
        }
        _ => unreachable!("dispatched in event_text"),
    }
}

/// Processes: spawned, started, cancelled, ended, and the host they run on.
fn process_event_text(e: &Event) -> String {
    match e {
        Event::SpawnRequested { command, owner, leases, .. } => {
            let mut s = format!("spawn-requested {:?} in {}", command.argv, command.cwd);
            if let Some(o) = owner {
                s += &format!(" owner {:?}@{}", o.subject, o.generation);
            }
            for l in leases {
                s += &format!(" lease {}:{}", l.resource, l.mode.as_str());
            }
            s
        }
        Event::ProcessStarted { process, runner, command_pid, .. } => {
            format!("process-started {process} pid {command_pid} runner pid {}", runner.pid)
        }
        Event::ProcessCancelRequested { process, by } => match by {
            Some(o) => format!("process-cancel {process} by {:?}@{}", o.subject, o.generation),
            None => format!("process-cancel {process}"),
        },
        Event::ProcessEnded { process, end } => format!("process-ended {process} {}", end.status().as_str()),
        Event::ProcessHost { host } => format!("process-host {host:?}"),
        _ => unreachable!("dispatched in event_text"),
    }
}

/// The log's own records: a snapshot's checkpoint, a daemon's cutover.
fn log_event_text(e: &Event) -> String {
    match e {
        Event::Checkpoint { snapshot_seq, digest } => {
            format!("checkpoint of snapshot at {snapshot_seq} blake3 {}", crate::format::hex(digest))
        }
        Event::Cutover { home, reason, settled, more } => {
            let mut s = format!(
                "cutover of {:?}@{} ({reason}): {} request(s) settled",
                home.subject,
                home.generation,
                settled.len() as u64 + more
            );
            for r in settled.iter().take(8) {
                s += &format!(" {}={}", r.request, r.how);
            }
            s
        }
        _ => unreachable!("dispatched in event_text"),
    }
}

pub fn record_text(rec: &RecordRef<'_>) -> String {
    let head = format!("{:>8}  {}  writer {}", rec.seq, format_ms(rec.time_ms), uuid::Uuid::from_bytes(rec.writer));
    match decode_txn(rec.payload) {
        Ok(txn) => {
            let events: Vec<String> = txn.events.iter().map(event_text).collect();
            let req = txn.request.map(|r| format!("  [request {}]", r.id)).unwrap_or_default();
            format!("{head}  {}{req}", events.join("; "))
        }
        Err(e) => format!("{head}  UNDECODABLE {} bytes: {e}", rec.payload.len()),
    }
}

/// Apply the record at `seq` to `state`; why it is not authoritative, if it is not:
/// a refused attempt kept as evidence, a late note under a retired generation (in a
/// log an earlier build wrote), or a record that does not apply to the state it
/// follows.
fn not_authoritative(state: &mut crate::model::Projection, seq: u64, txn: Option<&Txn>) -> Option<String> {
    let Some(txn) = txn else {
        state.skip_undecodable(seq);
        return Some("undecodable".into());
    };
    let outcomes = match state.apply(seq, txn) {
        Ok(o) => o,
        Err(r) => return Some(format!("does not apply to the state it follows ({})", r.code())),
    };
    txn.events.iter().zip(&outcomes).find_map(|(e, o)| match (e, o) {
        (Event::FencedAttempts { .. } | Event::RefusedWrites { .. } | Event::Refused { .. }, _) => {
            Some("refused attempts, kept as evidence".to_string())
        }
        (_, crate::model::Outcome::Noted { authoritative: false, generation, .. }) => {
            Some(format!("a late note under generation {generation}, after its tenure ended"))
        }
        _ => None,
    })
}

/// A flat JSON object as text: its `kind`, then `field=value` for the rest
/// (`released seq=6`).
fn flat_text(v: &Value) -> String {
    let Some(o) = v.as_object() else { return v.to_string() };
    let kind = o.get("kind").and_then(Value::as_str).unwrap_or("?");
    o.iter().filter(|(k, _)| *k != "kind").fold(kind.to_owned(), |acc, (k, v)| format!("{acc} {k}={v}"))
}

/// `dump` filters; all optional.
#[derive(Debug, Default, Clone)]
pub struct Filter {
    pub from: Option<u64>,
    pub to: Option<u64>,
    pub subject: Option<String>,
    pub kind: Option<String>,
    pub since_ms: Option<u64>,
    pub until_ms: Option<u64>,
}

impl Filter {
    fn keeps(&self, rec: &RecordRef<'_>, txn: Option<&Txn>) -> bool {
        if self.to.is_some_and(|t| rec.seq > t)
            || self.since_ms.is_some_and(|t| rec.time_ms < t)
            || self.until_ms.is_some_and(|t| rec.time_ms > t)
        {
            return false;
        }
        if let Some(s) = &self.subject
            && !txn.is_some_and(|t| t.events.iter().any(|e| e.subject() == Some(s.as_str())))
        {
            return false;
        }
        if let Some(k) = &self.kind {
            let kinds: Vec<&str> = txn.map_or(vec!["undecodable"], |t| t.events.iter().map(Event::kind).collect());
            if !kinds.iter().any(|x| x == k) {
                return false;
            }
        }
        true
    }
}

/// `dump`: one line per record. Without `raw` it stops at the first damage (and
/// reports it); with `raw` it reports each damaged region and reads on.
pub fn dump(src: &Source, f: &Filter, as_json: bool, raw: bool, out: &mut dyn Write) -> Result<ReadSummary, Error> {
    let mut progress = Progress::new(src, "dump");
    let mut io_err = None;
    // Replayed from record 1 (printed from `from`): whether a record is
    // authoritative depends on the state it follows.
    let mut state = crate::model::Projection::default();
    let from = f.from.unwrap_or(1);
    let summary = src.scan(1, |item| {
        let (line, damage) = match item {
            ScanItem::Record { rec, segment, offset } => {
                progress.at(segment, offset);
                if f.to.is_some_and(|t| rec.seq > t) {
                    return false;
                }
                let txn = decode_txn(rec.payload).ok();
                let not_authoritative = not_authoritative(&mut state, rec.seq, txn.as_ref());
                if rec.seq < from || !f.keeps(rec, txn.as_ref()) {
                    return true;
                }
                let line = match (as_json, not_authoritative) {
                    (true, why) => {
                        let mut v = record_json(rec, segment, offset);
                        if let Some(why) = why {
                            v["authoritative"] = json!(false);
                            v["why"] = json!(why);
                        }
                        v.to_string()
                    }
                    (false, None) => record_text(rec),
                    (false, Some(why)) => format!("{}  [not authoritative: {why}]", record_text(rec)),
                };
                (line, false)
            }
            ScanItem::Damage(p) => {
                let mut v = problem_json(p);
                v["damage"] = json!(true);
                let line = if as_json {
                    v.to_string()
                } else {
                    format!(
                        "-- damaged region: segment {} byte {} length {} (expected sequence {}): {}{}",
                        file_name(&p.segment),
                        p.offset,
                        p.damaged_bytes,
                        p.seq,
                        p.kind,
                        if p.torn_tail { " [torn tail]" } else { "" }
                    )
                };
                (line, true)
            }
        };
        let keep_going = raw || !damage;
        if let Err(e) = writeln!(out, "{}", crate::view::escape_controls(&line)) {
            io_err = Some(e);
            return false;
        }
        keep_going
    })?;
    match io_err {
        Some(e) if e.kind() != std::io::ErrorKind::BrokenPipe => Err(Error::io("write", "stdout")(e)),
        _ => Ok(summary),
    }
}

/// The projection as of sequence `at` (default: the end), rebuilt from the log.
pub fn state_at(src: &Source, at: Option<u64>) -> Result<(Projection, ReadSummary), Error> {
    let mut p = Projection::default();
    let s = src.scan(1, |item| {
        let ScanItem::Record { rec, .. } = item else { return true };
        if at.is_some_and(|a| rec.seq > a) {
            return false;
        }
        if rec.seq <= p.last_seq() {
            return true; // after a resync, never apply out of order
        }
        match decode_txn(rec.payload) {
            Ok(txn) => drop(p.apply(rec.seq, &txn)),
            Err(_) => p.skip_undecodable(rec.seq),
        }
        true
    })?;
    Ok((p, s))
}

pub fn state_text(p: &Projection, out: &mut dyn Write) -> std::io::Result<()> {
    crate::text_line!(out, "state as of sequence {}", p.last_seq())?;
    for (name, s) in p.subjects() {
        match &s.owner {
            Some(o) => crate::text_line!(
                out,
                "  {name:?}  gen {}  owner {} pid {} since seq {}  heartbeat {}  stale after {} ms{}",
                s.generation,
                o.identity.instance,
                o.identity.pid,
                o.since_seq,
                format_ms(o.heartbeat_ms),
                o.stale_after_ms,
                o.lock.as_ref().map(|l| format!("  lock {}/{}", l.action, l.request)).unwrap_or_default()
            )?,
            None => crate::text_line!(out, "  {name:?}  gen {}  free", s.generation)?,
        }
        if s.fenced_attempts + s.late_notes > 0 {
            crate::text_line!(out, "      fenced attempts {}  late notes {}", s.fenced_attempts, s.late_notes)?;
        }
    }
    for l in p.leases().values() {
        crate::text_line!(
            out,
            "  lease {} on {} {} holder {:?} token {} expires {}  {}",
            l.id,
            l.resource,
            l.mode.as_str(),
            l.holder,
            l.token,
            format_ms(l.expires_ms),
            flat_text(&serde_json::to_value(&l.state).unwrap_or_default())
        )?;
    }
    if p.anomalies() + p.undecodable() > 0 {
        crate::text_line!(
            out,
            "  WARNING: {} records did not validate, {} did not decode",
            p.anomalies(),
            p.undecodable()
        )?;
    }
    Ok(())
}

/// `stat`: counts and bytes by record kind, by subject (top `top`), by writer.
pub fn stat(src: &Source, top: usize) -> Result<Value, Error> {
    let mut kinds: BTreeMap<String, (u64, u64)> = BTreeMap::new();
    let mut subjects: BTreeMap<String, (u64, u64)> = BTreeMap::new();
    let mut writers: BTreeMap<String, u64> = BTreeMap::new();
    let s = src.scan(1, |item| {
        let ScanItem::Record { rec, .. } = item else { return true };
        let bytes = frame_bytes(rec.payload.len()) as u64;
        *writers.entry(uuid::Uuid::from_bytes(rec.writer).to_string()).or_default() += 1;
        let (ks, ss) = match decode_txn(rec.payload) {
            Ok(t) => (
                t.events.iter().map(|e| e.kind().to_owned()).collect::<Vec<_>>(),
                t.events.iter().filter_map(|e| e.subject().map(str::to_owned)).collect::<Vec<_>>(),
            ),
            Err(_) => (vec!["undecodable".to_owned()], vec![]),
        };
        for k in ks {
            let e = kinds.entry(k).or_default();
            e.0 += 1;
            e.1 += bytes;
        }
        for sub in ss {
            let e = subjects.entry(sub).or_default();
            e.0 += 1;
            e.1 += bytes;
        }
        true
    })?;
    let mut by_subject: Vec<_> = subjects.into_iter().collect();
    by_subject.sort_by(|a, b| b.1.0.cmp(&a.1.0).then(a.0.cmp(&b.0)));
    let segs: Vec<Value> = src
        .segments()
        .into_iter()
        .map(|(seq, p)| json!({"segment": file_name(&p), "first_seq": seq, "bytes": std::fs::metadata(&p).map(|m| m.len()).unwrap_or(0)}))
        .collect();
    Ok(json!({
        "records": s.records,
        "bytes": s.bytes,
        "first_seq": s.first_seq, "last_seq": s.last_seq,
        "first_time": s.first_time_ms.map(format_ms), "last_time": s.last_time_ms.map(format_ms),
        "span_ms": s.first_time_ms.zip(s.last_time_ms).map(|(a, b)| b.saturating_sub(a)),
        "by_kind": kinds.into_iter().map(|(k, (n, b))| json!({"kind": k, "records": n, "bytes": b})).collect::<Vec<_>>(),
        "subjects": by_subject.len(),
        "top_subjects": by_subject.iter().take(top).map(|(k, (n, b))| json!({"subject": k, "records": n, "bytes": b})).collect::<Vec<_>>(),
        "by_writer": writers.into_iter().map(|(w, n)| json!({"writer": w, "appends": n})).collect::<Vec<_>>(),
        "segments": segs,
        "problems": s.problems.iter().map(problem_json).collect::<Vec<_>>(),
    }))
}

/// `follow`: print records as other processes append them. Stops after
/// `max_records` or `timeout_ms` when given, else runs until interrupted.
pub fn follow(
    src: &Source,
    from_seq: Option<u64>,
    as_json: bool,
    poll_ms: u64,
    max_records: Option<u64>,
    timeout_ms: Option<u64>,
    out: &mut dyn Write,
) -> Result<u64, Error> {
    let from = match from_seq {
        Some(s) => s,
        // From now on: after the last record there is (verified from the start of
        // the last segment, nothing visited).
        None => {
            let mut end = src.reader(u64::MAX);
            end.poll(&mut |_| {})?;
            end.next_seq().max(1)
        }
    };
    // Said once the starting point is fixed (with -v): what comes after it is
    // printed, whenever it is appended.
    tracing::info!(from_seq = from, "following: every record from this sequence on");
    let mut tailer = src.reader(from);
    let started = std::time::Instant::now();
    let mut printed = 0u64;
    loop {
        let mut failed = None;
        tailer.poll(&mut |rec| {
            if failed.is_some() || max_records.is_some_and(|m| printed >= m) {
                return;
            }
            let line = if as_json {
                // The tailer does not say where a record sits; omit rather than invent.
                let mut v = record_json(rec, Path::new(""), 0);
                if let Some(o) = v.as_object_mut() {
                    o.remove("segment");
                    o.remove("offset");
                }
                v.to_string()
            } else {
                record_text(rec)
            };
            if let Err(e) = writeln!(out, "{}", crate::view::escape_controls(&line)).and_then(|_| out.flush()) {
                failed = Some(e);
            }
            printed += 1;
        })?;
        if let Some(e) = failed {
            return if e.kind() == std::io::ErrorKind::BrokenPipe {
                Ok(printed)
            } else {
                Err(Error::io("write", "stdout")(e))
            };
        }
        if max_records.is_some_and(|m| printed >= m)
            || timeout_ms.is_some_and(|t| started.elapsed().as_millis() as u64 >= t)
        {
            return Ok(printed);
        }
        // A file log is looked at again after `poll_ms`; etcd says when its head
        // changes (a watch), waiting at most that long.
        match src {
            Source::Dir(_) => std::thread::sleep(Duration::from_millis(poll_ms)),
            #[cfg(feature = "etcd")]
            Source::Etcd { .. } => tailer.wait_for_more(Duration::from_millis(poll_ms.max(1000)))?,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::{Log, LogOptions, list_segments};

    /// A log of format `version` whose last frame lost its second half (cut off the
    /// file in v1; in v2 zeros where it and the end mark after it were, as a write
    /// stopped part way leaves it); returns the segment, where the lost bytes were
    /// and the lost bytes.
    fn log_with_half_a_last_frame(dir: &Path, version: u16) -> (PathBuf, u64, Vec<u8>) {
        let log = Log::open(dir, LogOptions { format_version: version, ..LogOptions::default() }).unwrap();
        let mut end = 0;
        for i in 0..5 {
            let a = log.append(format!("record {i}").as_bytes()).unwrap();
            end = a.last_seq;
        }
        assert_eq!(end, 5);
        log.close().unwrap();
        let (_, seg) = list_segments(dir).unwrap().pop().unwrap();
        let bytes = std::fs::read(&seg).unwrap();
        let frame = frame_bytes(b"record 4".len());
        let frames_end = crate::storage::frames_end(&seg).unwrap() as usize;
        let cut = frames_end - frame / 2;
        let f = std::fs::OpenOptions::new().write(true).open(&seg).unwrap();
        if version == 1 {
            f.set_len(cut as u64).unwrap();
        } else {
            // The end mark after it was never written either.
            std::os::unix::fs::FileExt::write_all_at(&f, &vec![0u8; bytes.len() - cut], cut as u64).unwrap();
        }
        let end = if version == 1 { frames_end } else { frames_end + crate::format::FRAMES_END_MARK.len() };
        (seg, cut as u64, bytes[cut..end].to_vec())
    }

    #[test]
    fn an_append_completing_while_verify_reads_is_not_reported_as_a_torn_tail() {
        for version in [1, 2] {
            let d = tempfile::tempdir().unwrap();
            let (seg, cut, rest) = log_with_half_a_last_frame(d.path(), version);
            let mut reads = 0;
            let (s, code) = verify_with(&Source::Dir(d.path().to_path_buf()), || {
                reads += 1;
                if reads == 1 {
                    // The "writer" finishes its append after the first read.
                    let f = std::fs::OpenOptions::new().write(true).open(&seg).unwrap();
                    std::os::unix::fs::FileExt::write_all_at(&f, &rest, cut).unwrap();
                }
            })
            .unwrap();
            assert_eq!((code, s.records, reads), (0, 5, 2), "v{version}: {s:?}");
            assert!(s.is_intact());
        }
    }

    #[test]
    fn a_torn_tail_on_a_log_that_does_not_move_is_reported_after_one_read() {
        for version in [1, 2] {
            let d = tempfile::tempdir().unwrap();
            log_with_half_a_last_frame(d.path(), version);
            let mut reads = 0;
            let (s, code) = verify_with(&Source::Dir(d.path().to_path_buf()), || reads += 1).unwrap();
            assert_eq!((code, s.records, reads), (1, 4, 1), "v{version}: {s:?}");
            assert!(!s.has_corruption() && s.problems[0].torn_tail, "v{version}: {s:?}");
        }
    }

    #[test]
    fn a_log_that_keeps_changing_is_read_a_bounded_number_of_times() {
        for version in [1, 2] {
            let d = tempfile::tempdir().unwrap();
            let (seg, cut, _) = log_with_half_a_last_frame(d.path(), version);
            let mut reads = 0u64;
            let (s, code) = verify_with(&Source::Dir(d.path().to_path_buf()), || {
                // One more garbage byte after every read: never settles.
                let f = std::fs::OpenOptions::new().write(true).open(&seg).unwrap();
                std::os::unix::fs::FileExt::write_all_at(&f, &[0xAB], cut + 40 + reads).unwrap();
                reads += 1;
            })
            .unwrap();
            assert_eq!(reads, u64::from(VERIFY_LIVE_REREADS_MAX) + 1, "v{version}");
            assert_eq!(code, 1, "v{version}: {s:?}");
        }
    }
}
