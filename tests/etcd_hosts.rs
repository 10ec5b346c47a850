//! Hosts and clocks on a log shared by hosts (a real 3-member etcd cluster on
//! loopback). Hosts are simulated on this one machine by their host ids
//! (`LedgerOptions::host` in the library, `FENCELOG_HOST_ID` for the binary):
//! they share a boot id and a pid space, which is exactly what proves that an
//! identity recorded on another host is never judged from this host's `/proc`.

mod common;

use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use common::etcd;
use fencelog::ledger::{Ledger, LedgerOptions};
use fencelog::model::{Event, Refusal};
use fencelog::ops::{self, Caller, ClaimRequest, OpError, TakeoverRequest};
use fencelog::storage::{Location, LogOptions, ProblemKind};

/// A host whose clock runs this far ahead.
const SKEW_MS: u64 = 10 * 60 * 1000;
/// The staleness of the owners here.
const STALE_AFTER_MS: u64 = 1_000;

fn wall_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as u64
}

fn new_log(what: &str) -> Location {
    let loc = etcd::fresh_location(what);
    let Location::Etcd(opts) = &loc else { unreachable!() };
    fencelog::storage::etcd::EtcdBackend::init(opts).unwrap();
    loc
}

/// A writer of the log at `loc` on host `host`, its clock `skew_ms` ahead.
fn writer(loc: &Location, host: &str, skew_ms: u64) -> Ledger {
    let mut log = LogOptions::default();
    if skew_ms > 0 {
        log.clock = Some(Arc::new(move || wall_ms() + skew_ms));
    }
    Ledger::open_at(loc, LedgerOptions { log, host: Some(host.into()), ..LedgerOptions::default() }).unwrap()
}

fn claim(l: &Ledger, subject: &str, pid: u32) -> Result<ops::OpResponse, OpError> {
    let req = ClaimRequest {
        subject: subject.into(),
        pid: Some(pid),
        instance: None,
        stale_after_ms: STALE_AFTER_MS,
        action: None,
        request_id: None,
    };
    ops::claim(l, &req, Caller::default())
}

/// `(generation, heartbeat_ms)` of `subject`'s owner as `l` sees it now.
fn owner_of(l: &Ledger, subject: &str) -> (u64, u64) {
    l.refresh_with(|p| {
        let s = p.subject(subject).unwrap();
        (s.generation, s.owner.as_ref().unwrap().heartbeat_ms)
    })
    .unwrap()
}

fn takeover(l: &Ledger, subject: &str, (generation, heartbeat_ms): (u64, u64)) -> Result<ops::OpResponse, OpError> {
    let req = TakeoverRequest {
        subject: subject.into(),
        expect_generation: generation,
        expect_heartbeat_ms: heartbeat_ms,
        pid: Some(std::process::id()),
        instance: None,
        stale_after_ms: STALE_AFTER_MS,
        reason: "no heartbeat".into(),
        request_id: None,
    };
    ops::takeover(l, &req, Caller::default())
}

/// The events of record `seq`, read back from the log.
fn events_at(l: &Ledger, seq: u64) -> Vec<Event> {
    let mut reader = l.backend().reader(seq);
    let mut found = None;
    reader
        .poll(&mut |r| {
            if r.seq == seq {
                found = Some(fencelog::model::decode_txn(r.payload).unwrap().events);
            }
        })
        .unwrap();
    found.expect("the record")
}

/// Proves (clocks): staleness across hosts is judged on the observer's own
/// monotonic clock, never on two hosts' wall clocks. A host whose clock runs 10
/// minutes ahead sees a live owner's heartbeats as 10 minutes old, yet every
/// takeover it tries of that owner is refused while it heartbeats; and a dead
/// owner on that host — whose last heartbeat lies 10 minutes in the other hosts'
/// future — is taken over once another host has watched it unchanged for its
/// staleness on its own clock, not 10 minutes later. The takeover's record
/// carries what was watched (`staleness_observed`: generation, heartbeat, watched
/// ms, host), and a replay gives the same state.
#[test]
fn a_clock_ten_minutes_ahead_neither_takes_over_a_live_owner_nor_keeps_a_dead_one_fresh() {
    let loc = new_log("clock");
    let ahead = writer(&loc, "host-ahead", SKEW_MS);
    let on_time = writer(&loc, "host-on-time", 0);

    // A live owner on time, heartbeating every tenth of its staleness.
    claim(&on_time, "live", std::process::id()).unwrap();
    let (generation, _) = owner_of(&on_time, "live");
    let stop = Arc::new(AtomicBool::new(false));
    let beating = {
        let (stop, loc) = (Arc::clone(&stop), loc.clone());
        std::thread::spawn(move || {
            let l = writer(&loc, "host-on-time", 0);
            let req = ops::GenerationRequest { subject: "live".into(), generation, request_id: None, instance: None };
            while !stop.load(Ordering::SeqCst) {
                ops::generation(&l, ops::GenerationOp::Heartbeat, &req, Caller::default()).unwrap();
                std::thread::sleep(std::time::Duration::from_millis(STALE_AFTER_MS / 10));
            }
        })
    };
    for attempt in 0..3 {
        let seen = owner_of(&ahead, "live");
        // On the ahead host's wall clock the heartbeat is ten minutes old.
        assert!(
            ahead.backend().writer_id() != on_time.backend().writer_id()
                && wall_ms() + SKEW_MS - seen.1 > STALE_AFTER_MS
        );
        match takeover(&ahead, "live", seen) {
            Err(OpError::Refused(Refusal::TakeoverRace { .. } | Refusal::TakeoverActiveRefused { .. })) => {}
            other => panic!("attempt {attempt}: a live owner taken over by a skewed clock: {other:?}"),
        }
    }
    stop.store(true, Ordering::SeqCst);
    beating.join().unwrap();
    assert_eq!(owner_of(&on_time, "live").0, generation, "the live owner kept its tenure");

    // A dead owner on the ahead host: its last heartbeat is in the future of
    // every host on time.
    claim(&ahead, "dead", std::process::id()).unwrap();
    drop(ahead);
    let seen = owner_of(&on_time, "dead");
    assert!(seen.1 > wall_ms() + SKEW_MS / 2, "by the wall clocks it would look fresh for ten minutes");
    let r = takeover(&on_time, "dead", seen).expect("taken over after its staleness, watched on this host's clock");
    let observed = events_at(&on_time, r.seq.unwrap())
        .into_iter()
        .find_map(|e| match e {
            Event::StalenessObserved { subject, generation, heartbeat_ms, watched_ms, host } => {
                Some((subject, generation, heartbeat_ms, watched_ms, host))
            }
            _ => None,
        })
        .expect("the takeover records what it watched");
    assert_eq!((observed.0.as_str(), observed.1, observed.2), ("dead", seen.0, seen.1));
    assert!(observed.3 > STALE_AFTER_MS, "watched {} ms, more than the staleness", observed.3);
    assert_eq!(observed.4, "host-on-time");

    // Replay is deterministic: a new reader of the log has the same state.
    let replayed = writer(&loc, "host-third", 0);
    assert_eq!(replayed.projection().subjects(), on_time.projection().subjects());
    assert_eq!(owner_of(&replayed, "dead").0, seen.0 + 1);
}

/// A child process that lives until it is killed: its pid and the handle.
fn sleeper() -> std::process::Child {
    Command::new("sleep").arg("300").spawn().unwrap()
}

/// Proves (hosts): an owner recorded on another host is never judged dead from
/// this host's `/proc` — its pid is dead here too (one machine), yet a claim from
/// the other host is refused and `state` there says `unknown` (`other_host`),
/// while a claim on the owner's own host proves the death and takes the subject
/// (`dead_owner`, with the evidence recorded). The owner's host is in the log.
#[test]
fn an_owner_on_another_host_is_never_judged_dead_from_this_hosts_proc() {
    let loc = new_log("hosts");
    let (a, b) = (writer(&loc, "host-a", 0), writer(&loc, "host-b", 0));
    let mut child = sleeper();
    let r = claim(&b, "s", child.id()).unwrap();
    assert!(
        events_at(&b, r.seq.unwrap())
            .iter()
            .any(|e| matches!(e, Event::OwnerHost { subject, host } if subject == "s" && host == "host-b"))
    );
    child.kill().unwrap();
    child.wait().unwrap();
    // Past its staleness: only a proof of death or a takeover could replace it.
    let stale_since = owner_of(&a, "s").1;
    while wall_ms() <= stale_since + STALE_AFTER_MS {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    match claim(&a, "s", std::process::id()) {
        Err(OpError::Refused(Refusal::StaleRequiresTakeover { .. })) => {}
        other => panic!("a claim from another host judged the owner: {other:?}"),
    }
    let state = ops::state(&a.view().unwrap(), Some("s"), wall_ms()).unwrap();
    let s = &state.subjects[0];
    assert_eq!(
        (serde_json::to_value(s.status).unwrap(), s.status_reason, s.owner_host.as_deref()),
        (serde_json::json!("unknown"), Some("other_host"), Some("host-b"))
    );
    // On its own host the death is proven.
    let r = claim(&b, "s", std::process::id()).unwrap();
    let p = b.projection();
    let ended = p.subject("s").unwrap().ended.last().unwrap();
    assert_eq!(serde_json::to_value(ended).unwrap()["how"]["kind"], "dead_owner", "{ended:?}");
    assert!(events_at(&b, r.seq.unwrap()).iter().any(|e| matches!(e, Event::DeathObserved { .. })));
}

/// `fencelog CMD… --dir DIR --etcd … REST…` on host `host`.
fn fl(host: &str, dir: &std::path::Path, loc: &Location, args: &[&str]) -> (i32, serde_json::Value) {
    let Location::Etcd(o) = loc else { unreachable!() };
    let (cmd, rest) = args.split_at(if args[0] == "process" { 2 } else { 1 });
    let out = Command::new(env!("CARGO_BIN_EXE_fencelog"))
        .args(cmd)
        .args(["--dir", dir.to_str().unwrap(), "--etcd", &o.endpoints.join(","), "--etcd-prefix", &o.prefix])
        .args(rest)
        .env("FENCELOG_HOST_ID", host)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    (out.status.code().unwrap_or(-1), serde_json::from_str(text.trim()).unwrap_or(serde_json::Value::Null))
}

/// Proves (hosts): processes are supervised on the host that ran them. A command
/// run on host B whose runner and command are then killed (`kill -9`) is left
/// alone by `recover` on host A (`other_host_untouched`: its pids mean nothing
/// there), and settled by `recover` on host B (`completed_unknown`). The
/// process's host is in the log.
#[test]
fn recover_touches_only_its_own_hosts_processes() {
    let loc = new_log("recover");
    let t = tempfile::tempdir().unwrap();
    let (dir_a, dir_b) = (t.path().join("a"), t.path().join("b"));
    let (code, run) = fl("host-b", &dir_b, &loc, &["run", "--wait-ms", "0", "--", "sleep", "300"]);
    assert_eq!(code, 0, "{run}");
    let id = run["id"].as_u64().unwrap();
    let (_, shown) = fl("host-b", &dir_b, &loc, &["process", "show", &id.to_string()]);
    assert_eq!(shown["host"], "host-b", "{shown}");
    // Wait for the runner to have started the command (a condition, not a time).
    let mut shown = shown;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while shown["pid"].is_null() {
        assert!(std::time::Instant::now() < deadline, "the process never started: {shown}");
        std::thread::sleep(std::time::Duration::from_millis(20));
        shown = fl("host-b", &dir_b, &loc, &["process", "show", &id.to_string()]).1;
    }
    let (runner, command) = (shown["runner_pid"].as_i64().unwrap() as i32, shown["pid"].as_i64().unwrap() as i32);
    // SAFETY: plain kill(2) of this test's own children (the runner, and the
    // command's process group).
    unsafe {
        libc::kill(runner, libc::SIGKILL);
        libc::kill(-command, libc::SIGKILL);
    }
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while fencelog::ledger::identity::start_ticks(runner as u32).is_some()
        || fencelog::ledger::identity::start_ticks(command as u32).is_some()
    {
        assert!(std::time::Instant::now() < deadline, "the killed runner and command are still there");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let (code, a) = fl("host-a", &dir_a, &loc, &["recover"]);
    assert_eq!(code, 0, "{a}");
    assert_eq!(a["other_host_untouched"], serde_json::json!([id]), "{a}");
    assert_eq!(a["completed_unknown"], serde_json::json!([]), "{a}");
    let (code, b) = fl("host-b", &dir_b, &loc, &["recover"]);
    assert_eq!(code, 0, "{b}");
    assert_eq!(b["completed_unknown"], serde_json::json!([id]), "{b}");
}

/// Proves: a reader that opens the etcd log (which checks the whole history the
/// prefix claims) and scans it while another host appends never takes a record
/// appended meanwhile for one "after the head": the head, the count of the record
/// keys and the pages of a scan are read at one revision of the store. (Read at the
/// newest revision each, an open raced an append and refused the log as
/// `CORRUPTION`; a scan reported `records_after_head` on a live log.)
#[test]
fn readers_opening_and_scanning_while_another_host_appends_see_one_consistent_history() {
    let loc = new_log("consistent-reads");
    let Location::Etcd(opts) = &loc else { unreachable!() };
    let done = Arc::new(AtomicBool::new(false));
    let appender = {
        let (loc, done) = (loc.clone(), Arc::clone(&done));
        std::thread::spawn(move || {
            let w = writer(&loc, "host-a", 0);
            for i in 0..300 {
                claim(&w, &format!("subject-{i}"), std::process::id()).unwrap();
            }
            done.store(true, Ordering::SeqCst);
        })
    };
    let mut opened = 0;
    while !done.load(Ordering::SeqCst) {
        let b = fencelog::storage::etcd::EtcdBackend::open(opts, &LogOptions::default())
            .unwrap_or_else(|e| panic!("opening a live log after {opened} opens: {e}"));
        let sum = b.scan(1, |_| true).unwrap();
        assert!(sum.is_intact(), "a scan of a live log: {:?}", sum.problems);
        opened += 1;
    }
    appender.join().unwrap();
    assert!(opened > 0, "the reader ran beside the appends");
}

/// Proves: a scan of an etcd log still tells a record key planted after the head
/// (`records_after_head`) and a record deleted below it (`records_missing`) —
/// its pages are read up to the head at the newest revision, and what lies after
/// the head is counted at the head's revision.
#[test]
fn a_scan_reports_a_key_planted_after_the_head_and_a_record_deleted_below_it() {
    let loc = new_log("planted");
    let Location::Etcd(opts) = &loc else { unreachable!() };
    {
        let w = writer(&loc, "host-a", 0);
        for i in 0..5 {
            claim(&w, &format!("s-{i}"), std::process::id()).unwrap();
        }
    }
    let etcdctl = |args: &[&str]| {
        let out = Command::new("etcdctl")
            .env("ETCDCTL_API", "3")
            .arg(format!("--endpoints={}", etcd::shared().endpoints))
            .args(args)
            .output()
            .unwrap();
        assert!(out.status.success(), "etcdctl {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    };
    let scan_kinds = || {
        let b = fencelog::storage::etcd::EtcdBackend::open_unchecked(opts, &LogOptions::default()).unwrap();
        let sum = b.scan(1, |_| true).unwrap();
        sum.problems.iter().map(|p| p.kind).collect::<Vec<_>>()
    };
    assert!(scan_kinds().is_empty(), "an intact log");
    let head = {
        use fencelog::storage::LogBackend;
        fencelog::storage::etcd::EtcdBackend::open(opts, &LogOptions::default()).unwrap().open_report().last_seq
    };
    let planted = format!("{}r/{:020}", opts.prefix, head + 1);
    etcdctl(&["put", &planted, "no append wrote this"]);
    assert!(scan_kinds().contains(&ProblemKind::RecordsAfterHead), "{:?}", scan_kinds());
    assert!(fencelog::storage::etcd::EtcdBackend::open(opts, &LogOptions::default()).is_err(), "an open refuses it");
    etcdctl(&["del", &planted]);
    etcdctl(&["del", &format!("{}r/{:020}", opts.prefix, 3)]);
    assert!(scan_kinds().contains(&ProblemKind::RecordsMissing), "{:?}", scan_kinds());
}
