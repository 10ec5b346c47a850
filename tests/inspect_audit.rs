//! The offline inspector and the audit, through the real binary, on real logs in
//! `fixtures/scenarios/` (regenerated only deliberately: FENCELOG_REGEN_GOLDEN=1,
//! deterministic: injected clock, writer ids and owner identities).

mod common;

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use common::offset_of;
use fencelog::ledger::{Ledger, LedgerOptions};
use fencelog::model::{DeathReason, Event, Identity, LeaseMode, Projection, Refusal, Txn};
use fencelog::storage::LogOptions;
use uuid::Uuid;

const FENCELOG: &str = env!("CARGO_BIN_EXE_fencelog");
const SCENARIOS: [&str; 10] = [
    "clean",
    "torn-tail",
    "mid-log-corruption",
    "payload-bit-flip",
    "clean-handover",
    "stale-takeover",
    "dead-owner-claim",
    "lease-pending-across-cutover",
    "multi-segment",
    "contested-refusals",
];

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/scenarios")
}

// ---- deterministic generation ------------------------------------------------

fn who(n: u8) -> Identity {
    Identity {
        instance: Uuid::from_u128(0x1000 + n as u128),
        pid: 4100 + n as u32,
        start_ticks: 90_000 + n as u64,
        boot_id: "00000000-0000-4000-8000-00000000b007".into(),
        exe: "/usr/local/bin/controller:1048576:1767225600".into(),
    }
}

struct World {
    dir: PathBuf,
    clock: Arc<AtomicU64>,
    segment_bytes_max: u64,
}

impl World {
    fn new(dir: &Path, segment_bytes_max: u64) -> World {
        let _ = fs::remove_dir_all(dir);
        World { dir: dir.into(), clock: Arc::new(AtomicU64::new(1_767_225_600_000)), segment_bytes_max }
    }

    /// A ledger as writer `w` (its own process, in the story).
    fn writer(&self, w: u8) -> Ledger {
        let c = self.clock.clone();
        let log = LogOptions {
            writer_id: Some(Uuid::from_u128(0xA000 + w as u128)),
            clock: Some(Arc::new(move || c.fetch_add(500, Ordering::SeqCst))),
            segment_bytes_max: self.segment_bytes_max,
            ..LogOptions::default()
        };
        // A 5 s window: the fixture clock moves 500 ms per reading, and the story should
        // show repeats being coalesced.
        let opts = LedgerOptions {
            log,
            snapshot_every_records: u64::MAX,
            snapshot_every_bytes: u64::MAX,
            fenced_audit_window_ms: 5_000,
            host: None,
            after_snapshot: None,
        };
        Ledger::open(&self.dir, opts).unwrap()
    }

    fn finish(self) {
        let _ = fs::remove_file(self.dir.join("LOCK"));
        let _ = fs::remove_dir_all(self.dir.join("snapshots"));
    }
}

fn txn(events: Vec<Event>) -> impl Fn(&Projection, u64, Uuid) -> Result<Txn, Refusal> {
    move |_p, time_ms, writer| Ok(Txn { request: None, time_ms, writer, conditions: vec![], events: events.clone() })
}

fn claim(s: &str, n: u8, stale_after_ms: u64) -> Event {
    Event::Claim { subject: s.into(), owner: who(n), stale_after_ms, lock: None, previous: None }
}

fn hb(s: &str, g: u64) -> Event {
    Event::Heartbeat { subject: s.into(), generation: g }
}

fn takeover(l: &Ledger, s: &str, n: u8) {
    l.submit(None, |p, time_ms, writer| {
        let o = p.subject(s).unwrap().owner.as_ref().unwrap();
        let e = Event::Takeover {
            subject: s.into(),
            expect_generation: p.subject(s).unwrap().generation,
            expect_heartbeat_ms: o.heartbeat_ms,
            owner: who(n),
            stale_after_ms: 60_000,
            reason: "heartbeat stale".into(),
        };
        Ok(Txn { request: None, time_ms, writer, conditions: vec![], events: vec![e] })
    })
    .unwrap();
}

fn gen_clean(dir: &Path) {
    let w = World::new(dir, 64 << 20);
    let a = w.writer(1);
    a.submit(None, txn(vec![claim("home/alpha", 1, 60_000)])).unwrap();
    for _ in 0..3 {
        a.submit(None, txn(vec![hb("home/alpha", 1)])).unwrap();
    }
    let lease = a
        .submit(
            None,
            txn(vec![Event::LeaseAcquire {
                resource: "repo/main".into(),
                mode: LeaseMode::Write,
                holder: "alpha".into(),
                ttl_ms: 30_000,
            }]),
        )
        .unwrap();
    let fencelog::model::Outcome::LeaseAcquired { lease, token, .. } = lease.outcomes[0].clone() else { panic!() };
    a.submit(None, txn(vec![Event::LeaseRelease { lease, token }])).unwrap();
    a.submit(
        Some(fencelog::model::RequestTag { id: "rel-1".into(), digest: [1; 32] }),
        txn(vec![Event::Release { subject: "home/alpha".into(), generation: 1 }]),
    )
    .unwrap();
    a.close().unwrap();
    w.finish();
}

fn segment(dir: &Path) -> PathBuf {
    fencelog::storage::list_segments(dir).unwrap().pop().unwrap().1
}

fn gen_damaged(dir: &Path, kind: &str) {
    gen_clean(dir);
    let seg = segment(dir);
    let mut b = fs::read(&seg).unwrap();
    match kind {
        "torn-tail" => {
            // The first half of one more frame: a write cut by a crash.
            let mut extra = Vec::new();
            fencelog::format::encode_frame(&mut extra, &[7; 32], 8, &[0xA1; 16], 1_767_225_699_000, b"never finished");
            b.extend_from_slice(&extra[..extra.len() / 2]);
        }
        "mid-log-corruption" => {
            let at = offset_of(dir, 3);
            b[at + 4] ^= 0xff; // the CRC field of record 3
        }
        "payload-bit-flip" => {
            let at = offset_of(dir, 4);
            let last = at + 8 + u32::from_le_bytes(b[at..at + 4].try_into().unwrap()) as usize - 1;
            b[last] ^= 0x04; // one bit in the payload of record 4
        }
        _ => unreachable!(),
    }
    fs::write(&seg, b).unwrap();
}

fn gen_handover(dir: &Path) {
    let w = World::new(dir, 64 << 20);
    let (a, b) = (w.writer(1), w.writer(2));
    a.submit(None, txn(vec![claim("home/ctl", 1, 60_000)])).unwrap();
    a.submit(None, txn(vec![hb("home/ctl", 1)])).unwrap();
    a.submit(None, txn(vec![Event::Release { subject: "home/ctl".into(), generation: 1 }])).unwrap();
    b.submit(None, txn(vec![claim("home/ctl", 2, 60_000)])).unwrap();
    b.submit(None, txn(vec![hb("home/ctl", 2)])).unwrap();
    a.close().unwrap();
    b.close().unwrap();
    w.finish();
}

fn gen_stale_takeover(dir: &Path) {
    let w = World::new(dir, 64 << 20);
    let (a, b) = (w.writer(1), w.writer(2));
    a.submit(None, txn(vec![claim("run/7", 1, 1_500)])).unwrap();
    a.submit(None, txn(vec![hb("run/7", 1)])).unwrap();
    a.submit(None, txn(vec![Event::Note { subject: "run/7".into(), generation: 1, text: "step 1 done".into() }]))
        .unwrap();
    for _ in 0..4 {
        w.clock.fetch_add(500, Ordering::SeqCst);
    }
    takeover(&b, "run/7", 2);
    // The old owner wakes up: a late note (kept, not authoritative) and three
    // heartbeats that are fenced (one audit record, then the coalesced count).
    a.submit(None, txn(vec![Event::Note { subject: "run/7".into(), generation: 1, text: "step 2 done".into() }]))
        .unwrap();
    for _ in 0..3 {
        let e = a.submit(None, txn(vec![hb("run/7", 1)])).unwrap_err();
        assert_eq!(e.code(), "FENCED");
    }
    b.submit(None, txn(vec![hb("run/7", 2)])).unwrap();
    a.close().unwrap();
    b.close().unwrap();
    w.finish();
}

/// Refusals kept as evidence with their callers, and a claim over a dead owner with
/// what was observed (the record kinds of format 2's ledger: `refused`,
/// `death_observed`, identities with a pid namespace).
fn gen_contested(dir: &Path) {
    use fencelog::model::{CallerId, Observed};
    let w = World::new(dir, 64 << 20);
    let (a, b, c) = (w.writer(1), w.writer(2), w.writer(3));
    let ns = || Event::OwnerPidNamespace { subject: "svc/c".into(), pid_ns: 4_026_531_836 };
    let caller = |n: u8, instance: Option<u128>| CallerId {
        pid: 5100 + n as u32,
        start_ticks: 95_000 + n as u64,
        exe: "inode:65024:1234".into(),
        pid_ns: 4_026_531_836,
        instance: instance.map(Uuid::from_u128),
    };
    let e = Event::Claim { subject: "svc/c".into(), owner: who(1), stale_after_ms: 60_000, lock: None, previous: None };
    a.submit(None, txn(vec![e, ns()])).unwrap();
    a.submit(None, txn(vec![hb("svc/c", 1)])).unwrap();
    b.submit(None, |p, time_ms, writer| {
        let previous = p.dead_owner("svc/c", DeathReason::ProcessDead);
        let claim =
            Event::Claim { subject: "svc/c".into(), owner: who(2), stale_after_ms: 60_000, lock: None, previous };
        let seen = Event::DeathObserved {
            subject: "svc/c".into(),
            generation: 1,
            pid: 4101,
            reason: DeathReason::ProcessDead,
            observed: Observed {
                boot_id: "00000000-0000-4000-8000-00000000b007".into(),
                pid_ns: 4_026_531_836,
                start_ticks: None,
                exe: None,
            },
        };
        Ok(Txn { request: None, time_ms, writer, conditions: vec![], events: vec![claim, ns(), seen] })
    })
    .unwrap();
    // The first owner's process, still around in the story, keeps writing.
    for _ in 0..3 {
        let r = a.submit_as(&caller(1, Some(0xA1)), None, txn(vec![hb("svc/c", 1)]));
        assert!(matches!(r, Err(fencelog::ledger::LedgerError::Refused(Refusal::Fenced { .. }))));
    }
    let note = Event::Note { subject: "svc/c".into(), generation: 1, text: "late write from the old owner".into() };
    assert!(a.submit_as(&caller(1, Some(0xA1)), None, txn(vec![note])).is_err());
    // A lock claim over a holder that carries no lock intent, and a takeover that
    // names what it did not see.
    let lock = Event::Claim {
        subject: "svc/c".into(),
        owner: who(3),
        stale_after_ms: 60_000,
        lock: Some(fencelog::model::LockIntent { action: "migrate".into(), request: "m-1".into() }),
        previous: None,
    };
    assert!(c.submit_as(&caller(3, None), None, txn(vec![lock])).is_err());
    let race = Event::Takeover {
        subject: "svc/c".into(),
        expect_generation: 1,
        expect_heartbeat_ms: 1,
        owner: who(3),
        stale_after_ms: 60_000,
        reason: "stale".into(),
    };
    assert!(c.submit_as(&caller(3, None), None, txn(vec![race])).is_err());
    a.close().unwrap();
    b.close().unwrap();
    c.close().unwrap();
    w.finish();
}

fn gen_dead_owner(dir: &Path) {
    let w = World::new(dir, 64 << 20);
    let (a, b) = (w.writer(1), w.writer(2));
    a.submit(None, txn(vec![claim("home/d", 1, 3_600_000)])).unwrap();
    a.submit(None, txn(vec![hb("home/d", 1)])).unwrap();
    b.submit(None, |p, time_ms, writer| {
        let previous = p.dead_owner("home/d", DeathReason::StartTimeChanged);
        let e =
            Event::Claim { subject: "home/d".into(), owner: who(2), stale_after_ms: 3_600_000, lock: None, previous };
        Ok(Txn { request: None, time_ms, writer, conditions: vec![], events: vec![e] })
    })
    .unwrap();
    b.submit(None, txn(vec![hb("home/d", 2)])).unwrap();
    a.close().unwrap();
    b.close().unwrap();
    w.finish();
}

fn gen_lease_pending(dir: &Path) {
    let w = World::new(dir, 64 << 20);
    let (a, b) = (w.writer(1), w.writer(2));
    a.submit(None, txn(vec![claim("run/lease", 1, 1_500)])).unwrap();
    let got = a
        .submit(
            None,
            txn(vec![Event::LeaseAcquire {
                resource: "repo/shared".into(),
                mode: LeaseMode::Write,
                holder: "owner-1".into(),
                ttl_ms: 600_000,
            }]),
        )
        .unwrap();
    let fencelog::model::Outcome::LeaseAcquired { lease, token, .. } = got.outcomes[0].clone() else { panic!() };
    a.submit(None, txn(vec![Event::LeaseRelease { lease, token: token + 1 }])).unwrap();
    a.submit(
        Some(fencelog::model::RequestTag { id: "req-commit-9".into(), digest: [9; 32] }),
        txn(vec![Event::Note { subject: "run/lease".into(), generation: 1, text: "commit 9".into() }]),
    )
    .unwrap();
    for _ in 0..4 {
        w.clock.fetch_add(500, Ordering::SeqCst);
    }
    takeover(&b, "run/lease", 2);
    a.submit(
        Some(fencelog::model::RequestTag { id: "req-commit-10".into(), digest: [10; 32] }),
        txn(vec![Event::Note { subject: "run/lease".into(), generation: 1, text: "commit 10".into() }]),
    )
    .unwrap();
    b.submit(None, txn(vec![hb("run/lease", 2)])).unwrap();
    a.close().unwrap();
    b.close().unwrap();
    w.finish();
}

fn gen_multi_segment(dir: &Path) {
    let w = World::new(dir, 600);
    let a = w.writer(1);
    for s in ["seg/a", "seg/b", "seg/c"] {
        a.submit(None, txn(vec![claim(s, 1, 60_000)])).unwrap();
    }
    for i in 0..27 {
        a.submit(None, txn(vec![hb(["seg/a", "seg/b", "seg/c"][i % 3], 1)])).unwrap();
    }
    a.close().unwrap();
    w.finish();
}

fn generate(name: &str, dir: &Path) {
    match name {
        "clean" => gen_clean(dir),
        "torn-tail" | "mid-log-corruption" | "payload-bit-flip" => gen_damaged(dir, name),
        "clean-handover" => gen_handover(dir),
        "stale-takeover" => gen_stale_takeover(dir),
        "dead-owner-claim" => gen_dead_owner(dir),
        "lease-pending-across-cutover" => gen_lease_pending(dir),
        "multi-segment" => gen_multi_segment(dir),
        "contested-refusals" => gen_contested(dir),
        _ => unreachable!(),
    }
}

fn fixtures() -> Vec<(String, PathBuf)> {
    // Tests run in parallel: regenerate once, before anyone reads.
    static REGEN: std::sync::OnceLock<()> = std::sync::OnceLock::new();
    REGEN.get_or_init(|| {
        // `1` makes every fixture again; a scenario's name makes only that one (a
        // fixture written by an earlier build must stay as that build wrote it).
        match std::env::var("FENCELOG_REGEN_GOLDEN").as_deref() {
            Ok("1") => SCENARIOS.iter().for_each(|name| generate(name, &root().join(name))),
            Ok(name) if SCENARIOS.contains(&name) => generate(name, &root().join(name)),
            _ => {}
        }
    });
    SCENARIOS
        .iter()
        .map(|name| {
            let dir = root().join(name);
            assert!(dir.is_dir(), "missing fixture {} (FENCELOG_REGEN_GOLDEN=1 makes it)", dir.display());
            (name.to_string(), dir)
        })
        .collect()
}

// ---- running the tools --------------------------------------------------------

fn run(args: &[&str]) -> (i32, String) {
    let out = Command::new(FENCELOG).args(args).output().unwrap();
    (out.status.code().unwrap_or(-1), String::from_utf8(out.stdout).unwrap())
}

fn tools(dir: &str) -> Vec<(&'static str, Vec<String>)> {
    let s = |v: &[&str]| v.iter().map(|x| x.to_string()).collect::<Vec<_>>();
    vec![
        ("verify", s(&["inspect", "verify", dir])),
        ("dump", s(&["inspect", "dump", dir])),
        ("dump_json", s(&["inspect", "dump", dir, "--json"])),
        ("dump_raw", s(&["inspect", "dump", dir, "--raw"])),
        ("state_at_5", s(&["inspect", "state", dir, "--at", "5"])),
        ("stat", s(&["inspect", "stat", dir])),
        ("audit_text", s(&["audit", dir])),
        ("audit_json", s(&["audit", dir, "--format", "json"])),
    ]
}

/// Pins the output of verify, dump, dump --json, dump --raw, state --at, stat and
/// audit (text and json) for every fixture (exit code included).
#[test]
fn inspector_and_audit_output_is_pinned_for_every_fixture() {
    for (name, dir) in fixtures() {
        for (tool, args) in tools(dir.to_str().unwrap()) {
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            let (code, out) = run(&args);
            insta::assert_snapshot!(format!("{tool}__{name}"), format!("exit {code}\n{out}"));
        }
    }
}

/// Proves: verify tells intact (0) from a torn tail and from corruption (both 1,
/// named apart), and a missing or foreign directory exits 2.
#[test]
fn verify_exit_codes_tell_intact_torn_and_corrupt_apart() {
    let f: std::collections::HashMap<_, _> = fixtures().into_iter().collect();
    let status = |name: &str| {
        let (code, out) = run(&["inspect", "verify", f[name].to_str().unwrap(), "--json"]);
        (code, serde_json::from_str::<serde_json::Value>(&out).unwrap()["status"].as_str().unwrap().to_owned())
    };
    assert_eq!(status("clean"), (0, "intact".into()));
    assert_eq!(status("multi-segment"), (0, "intact".into()));
    assert_eq!(status("torn-tail"), (1, "torn_tail".into()));
    assert_eq!(status("mid-log-corruption"), (1, "corrupt".into()));
    assert_eq!(status("payload-bit-flip"), (1, "corrupt".into()));
    let d = tempfile::tempdir().unwrap();
    assert_eq!(run(&["inspect", "verify", d.path().join("none").to_str().unwrap()]).0, 2);
    fs::write(d.path().join("x.txt"), "not a log").unwrap();
    assert_eq!(run(&["inspect", "verify", d.path().to_str().unwrap()]).0, 2);
}

/// Proves: `dump --raw` recovers every readable record from a corrupt log, and
/// plain `dump` stops at the damage.
#[test]
fn dump_raw_recovers_every_readable_record_past_damage() {
    let f: std::collections::HashMap<_, _> = fixtures().into_iter().collect();
    let dir = f["mid-log-corruption"].to_str().unwrap();
    let seqs = |out: &str| -> Vec<u64> {
        let records = out
            .lines()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .filter(|v| v["damage"].is_null());
        records.filter_map(|v| v["seq"].as_u64()).collect()
    };
    let (code, raw) = run(&["inspect", "dump", dir, "--json", "--raw"]);
    assert_eq!(code, 1);
    let clean = run(&["inspect", "dump", f["clean"].to_str().unwrap(), "--json"]).1;
    let all = seqs(&clean);
    let recovered = seqs(&raw);
    assert_eq!(recovered, all.iter().copied().filter(|s| *s != 3).collect::<Vec<_>>(), "all but the damaged record");
    assert!(raw.lines().any(|l| l.contains("\"damage\":true") && l.contains("\"seq\":3")));
    let (_, plain) = run(&["inspect", "dump", dir, "--json"]);
    assert_eq!(seqs(&plain), vec![1, 2]);
}

fn well_formed(html: &str) -> Result<(), String> {
    let mut stack: Vec<String> = vec![];
    let mut rest = html;
    while let Some(i) = rest.find('<') {
        rest = &rest[i + 1..];
        let end = rest.find('>').ok_or("unclosed tag")?;
        let tag = &rest[..end];
        rest = &rest[end + 1..];
        if tag.starts_with('!') || tag.ends_with('/') {
            continue;
        }
        let name = tag.trim_start_matches('/').split_whitespace().next().unwrap_or("").to_owned();
        if tag.starts_with('/') {
            match stack.pop() {
                Some(open) if open == name => {}
                other => return Err(format!("</{name}> closes {other:?}")),
            }
        } else {
            stack.push(name);
        }
    }
    if stack.is_empty() { Ok(()) } else { Err(format!("unclosed: {stack:?}")) }
}

/// Proves: the HTML report is one well-formed, self-contained file with one
/// timeline entry per tenure.
#[test]
fn html_audit_is_self_contained_well_formed_with_one_entry_per_tenure() {
    let out_dir = tempfile::tempdir().unwrap();
    for (name, dir) in fixtures() {
        let file = out_dir.path().join(format!("{name}.html"));
        let (code, _) = run(&["audit", dir.to_str().unwrap(), "--format", "html", "--out", file.to_str().unwrap()]);
        assert!(code == 0 || code == 1, "{name}");
        let html = fs::read_to_string(&file).unwrap();
        well_formed(&html).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert!(
            !html.contains("http://")
                || html.matches("http://").count() == html.matches("xmlns=\"http://www.w3.org/2000/svg\"").count(),
            "{name}: no network references"
        );
        assert!(!html.contains("<script") && !html.contains("<link"), "{name}");
        let json: serde_json::Value =
            serde_json::from_str(&run(&["audit", dir.to_str().unwrap(), "--format", "json"]).1).unwrap();
        let tenures: usize =
            json["subjects"].as_array().unwrap().iter().map(|s| s["tenures"].as_array().unwrap().len()).sum();
        assert_eq!(html.matches("class=\"tenure\"").count(), tenures, "{name}");
        assert!(tenures > 0, "{name}");
    }
}

/// Proves: the audit tells each story: a stale takeover with a cut-off, zombie
/// writes kept but not authoritative, fenced attempts with their count; a dead-owner
/// claim with its evidence; a lease left pending across a cutover, and requests in
/// flight settled by what the log says.
#[test]
fn audit_reconstructs_cutovers_fenced_and_late_writes_leases_and_requests() {
    let f: std::collections::HashMap<_, _> = fixtures().into_iter().collect();
    let audit = |name: &str| -> serde_json::Value {
        serde_json::from_str(&run(&["audit", f[name].to_str().unwrap(), "--format", "json"]).1).unwrap()
    };
    let s = &audit("stale-takeover")["subjects"][0];
    assert_eq!(s["verdict"], "consistent");
    assert_eq!(s["tenures"][1]["began"]["kind"], "takeover_of_stale_owner");
    assert_eq!(s["tenures"][1]["began"]["previous_generation"], 1);
    assert!(
        s["tenures"][0]["ended"]["kind"] == "retired" && s["tenures"][0]["ended"]["cut_off_seq"].as_u64().is_some()
    );
    assert_eq!(s["gaps"][0]["authoritative_during"], "handed_over_in_one_record");
    assert_eq!(s["late_records"].as_array().unwrap().len(), 1);
    let counts: Vec<u64> =
        s["fenced_attempts"].as_array().unwrap().iter().map(|f| f["count"].as_u64().unwrap()).collect();
    assert_eq!(counts.iter().sum::<u64>(), 3, "three refused heartbeats, coalesced: {counts:?}");
    let s = &audit("dead-owner-claim")["subjects"][0];
    assert_eq!(s["tenures"][1]["began"]["kind"], "claim_over_dead_owner");
    assert_eq!(s["tenures"][1]["began"]["evidence"], "start_time_changed");
    let s = &audit("lease-pending-across-cutover")["subjects"][0];
    let c = &s["cutovers"][0];
    assert_eq!(c["leases_live"][0]["fate"]["kind"], "release_pending");
    let reqs: Vec<(&str, bool)> = c["requests_in_flight"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| (r["request"].as_str().unwrap(), r["authoritative"].as_bool().unwrap()))
        .collect();
    assert_eq!(reqs, vec![("req-commit-9", true), ("req-commit-10", false)]);
    let s = &audit("clean-handover")["subjects"][0];
    assert_eq!(
        (s["gaps"][0]["authoritative_during"].as_str(), s["verdict"].as_str()),
        (Some("none"), Some("consistent"))
    );
}

/// Proves: the tools write nothing — every file of a read-only copy of every fixture
/// hashes the same before and after running all of them, and no file appears.
#[test]
fn inspector_and_audit_write_nothing_even_on_a_read_only_directory() {
    use std::os::unix::fs::PermissionsExt;
    for (name, dir) in fixtures() {
        let copy = common::copy_dir(&dir);
        for e in fs::read_dir(copy.path()).unwrap() {
            fs::set_permissions(e.unwrap().path(), fs::Permissions::from_mode(0o444)).unwrap();
        }
        fs::set_permissions(copy.path(), fs::Permissions::from_mode(0o555)).unwrap();
        let before = common::hash_tree(copy.path());
        for (tool, args) in tools(copy.path().to_str().unwrap()) {
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            let (code, _) = run(&args);
            assert!(code == 0 || code == 1, "{name} {tool}: exit {code}");
        }
        assert_eq!(common::hash_tree(copy.path()), before, "{name}: nothing written");
        fs::set_permissions(copy.path(), fs::Permissions::from_mode(0o755)).unwrap();
    }
}

/// Proves: `follow` prints every record another process appends, in order.
#[test]
fn follow_sees_every_record_another_process_appends_in_order() {
    let d = tempfile::tempdir().unwrap();
    let dir = d.path().to_str().unwrap().to_owned();
    let mut sleeper = Command::new("sleep").arg("120").stdout(Stdio::null()).stderr(Stdio::null()).spawn().unwrap();
    let pid = sleeper.id().to_string();
    // The log exists before follow starts.
    assert_eq!(Command::new(FENCELOG).args(["init", "--dir", &dir]).output().unwrap().status.code(), Some(0));
    assert_eq!(
        Command::new(FENCELOG)
            .args(["claim", "--dir", &dir, "--subject", "f/0", "--pid", &pid])
            .output()
            .unwrap()
            .status
            .code(),
        Some(0)
    );
    let follower = Command::new(FENCELOG)
        .args([
            "inspect",
            "follow",
            &dir,
            "--json",
            "--from",
            "1",
            "--max-records",
            "25",
            "--timeout-ms",
            "60000",
            "--poll-ms",
            "20",
        ])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    for i in 1..25 {
        let st = Command::new(FENCELOG)
            .args(["claim", "--dir", &dir, "--subject", &format!("f/{i}"), "--pid", &pid])
            .output()
            .unwrap();
        assert_eq!(st.status.code(), Some(0));
    }
    let out = follower.wait_with_output().unwrap();
    let lines: Vec<serde_json::Value> =
        String::from_utf8(out.stdout).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    let seqs: Vec<u64> = lines.iter().map(|v| v["seq"].as_u64().unwrap()).collect();
    assert_eq!(seqs, (1..=25).collect::<Vec<u64>>());
    let subjects: Vec<String> = lines.iter().map(|v| v["subjects"][0].as_str().unwrap().to_owned()).collect();
    assert_eq!(subjects, (0..25).map(|i| format!("f/{i}")).collect::<Vec<_>>());
    // Dropping a Child does not end it: kill and reap the owner process.
    sleeper.kill().unwrap();
    sleeper.wait().unwrap();
}

/// Proves: dump's filters select by sequence range, subject, kind and time.
#[test]
fn dump_filters_select_by_sequence_subject_kind_and_time() {
    let f: std::collections::HashMap<_, _> = fixtures().into_iter().collect();
    let dir = f["clean-handover"].to_str().unwrap();
    let seqs = |extra: &[&str]| -> Vec<u64> {
        let mut args = vec!["inspect", "dump", dir, "--json"];
        args.extend_from_slice(extra);
        let (code, out) = run(&args);
        assert_eq!(code, 0, "{extra:?}");
        out.lines().map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap()["seq"].as_u64().unwrap()).collect()
    };
    assert_eq!(seqs(&[]), vec![1, 2, 3, 4, 5]);
    assert_eq!(seqs(&["--from", "2", "--to", "4"]), vec![2, 3, 4]);
    assert_eq!(seqs(&["--kind", "heartbeat"]), vec![2, 5]);
    assert_eq!(seqs(&["--subject", "home/ctl", "--kind", "claim"]), vec![1, 4]);
    assert_eq!(seqs(&["--subject", "elsewhere"]), Vec::<u64>::new());
    // Records are 1 s apart from 00:00:00.500Z.
    assert_eq!(seqs(&["--since", "2026-01-01T00:00:02Z", "--until", "1767225603500"]), vec![3, 4]);
    let (code, _) = run(&["inspect", "dump", dir, "--since", "yesterday"]);
    assert_eq!(code, 2, "a bad time is a usage error");
}

/// Proves: with stderr not a terminal, verify and dump print no progress output.
#[test]
fn verify_and_dump_are_quiet_on_stderr_when_it_is_not_a_terminal() {
    let f: std::collections::HashMap<_, _> = fixtures().into_iter().collect();
    for args in [vec!["inspect", "verify"], vec!["inspect", "dump"]] {
        let out = Command::new(FENCELOG).args(&args).arg(&f["multi-segment"]).output().unwrap();
        assert_eq!((out.status.code(), out.stderr.len()), (Some(0), 0), "{args:?}");
    }
}

/// The HTML's skeleton: each opening tag with its class, indented by depth (text,
/// other attributes and values left out), so a change of structure shows in review.
fn skeleton(html: &str) -> String {
    let mut out = String::new();
    let mut depth = 0usize;
    let mut rest = html;
    while let Some(i) = rest.find('<') {
        rest = &rest[i + 1..];
        let end = rest.find('>').unwrap();
        let tag = &rest[..end];
        rest = &rest[end + 1..];
        if tag.starts_with('!') {
            continue;
        }
        if let Some(closing) = tag.strip_prefix('/') {
            let _ = closing;
            depth = depth.saturating_sub(1);
            continue;
        }
        let name = tag.split_whitespace().next().unwrap_or("").trim_end_matches('/');
        // Rows and cells repeat with the data: the structure is their first one.
        let class = tag.split("class=\"").nth(1).and_then(|c| c.split('"').next()).unwrap_or("");
        let line = format!(
            "{}{name}{}",
            "  ".repeat(depth),
            if class.is_empty() { String::new() } else { format!(".{class}") }
        );
        if !out.ends_with(&format!("{line}\n")) {
            out.push_str(&line);
            out.push('\n');
        }
        if !tag.ends_with('/') && !matches!(name, "meta" | "br") {
            depth += 1;
        }
    }
    out
}

/// Proves: the HTML audit is the page an incident review is held over, and its
/// structure is pinned: a summary first (subjects and verdicts, record range,
/// chain head and the command that pins it), then per subject a timeline over time
/// with an axis and a legend where every mark has a `<title>`, the tenures as a
/// table, each cutover as a panel with what was in flight, and refused and late
/// attempts grouped by caller.
#[test]
fn html_audit_has_a_summary_timelines_tenure_tables_cutover_panels_and_callers() {
    let f: std::collections::HashMap<_, _> = fixtures().into_iter().collect();
    for name in ["stale-takeover", "lease-pending-across-cutover"] {
        let dir = f[name].to_str().unwrap();
        let (code, html) = run(&["audit", dir, "--format", "html"]);
        assert_eq!(code, 0, "{name}");
        let summary = html.find("id=\"summary\"").expect("a summary");
        let first_subject = html.find("class=\"subject\"").expect("a subject section");
        assert!(summary < first_subject, "{name}: the summary comes first");
        let json: serde_json::Value = serde_json::from_str(&run(&["audit", dir, "--format", "json"]).1).unwrap();
        let head = json["chain_head"].as_str().unwrap();
        let last = json["last_seq"].as_u64().unwrap();
        assert!(
            html.contains(&format!("fencelog inspect verify {dir} --expect-head {last}:{head}")),
            "{name}: the pin"
        );
        for class in ["axis", "legend", "tenures", "cutover-panel", "in-flight"] {
            assert!(html.contains(&format!("class=\"{class}\"")), "{name}: {class}");
        }
        // Every mark on a timeline says what, when, who and which sequence.
        for mark in
            ["<g class=\"tenure\"", "<path class=\"cutover\"", "<rect class=\"refused\"", "<circle class=\"late\""]
        {
            for (i, _) in html.match_indices(mark) {
                let end = html[i..].find("</title>").map(|e| i + e).expect("a title");
                let open = html[i..end].find("<title>").expect("a title");
                assert!(html[i + open..end].contains("seq"), "{name}: {mark} has a title naming its sequence");
            }
        }
        let tenure_rows =
            json["subjects"].as_array().unwrap().iter().map(|s| s["tenures"].as_array().unwrap().len()).sum::<usize>();
        assert_eq!(html.matches("class=\"tenure-row\"").count(), tenure_rows, "{name}");
        insta::assert_snapshot!(format!("audit_html_skeleton__{name}"), skeleton(&html));
    }
    let f = &f["stale-takeover"];
    let (_, html) = run(&["audit", f.to_str().unwrap(), "--format", "html"]);
    assert!(
        html.contains("class=\"callers\"") && html.contains("class=\"refused\"") && html.contains("class=\"late\"")
    );
}

/// Proves: everything the log's writers chose — subjects, notes, holders, reasons
/// — is escaped in the HTML report: a subject named like markup stays text.
#[test]
fn html_audit_escapes_what_writers_wrote() {
    let t = tempfile::tempdir().unwrap();
    // A directory a shell would split or redirect: the pin command quotes it.
    let dir = t.path().join("it's a <log>");
    let fl = |args: &[&str]| Command::new(FENCELOG).args(args).env("FENCELOG_DIR", &dir).output().unwrap();
    assert!(fl(&["init"]).status.success());
    let me = std::process::id().to_string();
    let evil = "<img src=x onerror=alert(1)>&\"'";
    assert!(fl(&["claim", "--subject", evil, "--pid", &me]).status.success());
    assert!(
        !fl(&["note", "--subject", evil, "--generation", "9", "--text", "</pre><script>x</script>"]).status.success()
    );
    let (code, html) = run(&["audit", dir.to_str().unwrap(), "--format", "html"]);
    assert_eq!(code, 0);
    assert!(!html.contains("<img") && !html.contains("<script"), "{html}");
    assert!(html.contains("&lt;img src=x onerror=alert(1)&gt;&amp;"), "the name is shown, escaped");
    let quoted = format!("'{}'", dir.display().to_string().replace('\'', "'\\''"));
    let pin = format!(
        "fencelog inspect verify {} --expect-head",
        quoted.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;").replace('\'', "&#39;")
    );
    assert!(html.contains(&pin), "the pin command is one shell word: {pin}");
    well_formed(&html).unwrap();
}
