//! Golden bytes of one record payload for every `Event` variant (and every
//! `Condition`): `log-format/vectors/events.json`. The log is append-only in its
//! meaning too: a variant's index and its fields' order are what every record
//! written with it holds, so a change that would re-number or re-shape one fails
//! here, not on a user's log. (`FENCELOG_BLESS=1` appends the entry of a *new*
//! variant; it never rewrites a pinned one.)

use std::path::Path;

use fencelog::model::{
    CallerId, Capture, CommandSpec, Condition, DeadOwner, DeathReason, EnvDigest, Event, Exit, Identity, LeaseMode,
    LeaseWant, LockIntent, Observed, OwnerRef, ProcessEnd, RefusedContent, RequestTag, SettledRequest, Txn, decode_txn,
    encode_txn,
};
use serde_json::{Value, json};

const INSTANCE: uuid::Uuid = uuid::Uuid::from_bytes(*b"golden-instance!");
const WRITER: uuid::Uuid = uuid::Uuid::from_bytes(*b"golden--writer!!");

fn identity() -> Identity {
    Identity { instance: INSTANCE, pid: 4242, start_ticks: 99, boot_id: "boot".into(), exe: "inode:8:1:7".into() }
}

fn owner() -> OwnerRef {
    OwnerRef { subject: "jobs/nightly".into(), generation: 3 }
}

/// The variant's position in `Event` — what bincode writes first. Exhaustive: a
/// new variant does not compile until it has a golden record here.
fn index(e: &Event) -> u32 {
    match e {
        Event::Claim { .. } => 0,
        Event::Heartbeat { .. } => 1,
        Event::Release { .. } => 2,
        Event::Takeover { .. } => 3,
        Event::RotateFence { .. } => 4,
        Event::Note { .. } => 5,
        Event::FencedAttempts { .. } => 6,
        Event::LeaseAcquire { .. } => 7,
        Event::LeaseRelease { .. } => 8,
        Event::Checkpoint { .. } => 9,
        Event::SpawnRequested { .. } => 10,
        Event::ProcessStarted { .. } => 11,
        Event::ProcessCancelRequested { .. } => 12,
        Event::ProcessEnded { .. } => 13,
        Event::OwnerLeaseAcquire { .. } => 14,
        Event::Cutover { .. } => 15,
        Event::RefusedWrites { .. } => 16,
        Event::DeathObserved { .. } => 17,
        Event::Refused { .. } => 18,
        Event::OwnerPidNamespace { .. } => 19,
        Event::OwnerHost { .. } => 20,
        Event::ProcessHost { .. } => 21,
        Event::StalenessObserved { .. } => 22,
    }
}

/// One event of every variant, in declaration order (optional fields set, but
/// where `nested_variants` covers their other values).
fn every_event() -> Vec<Event> {
    let capture =
        Capture { bytes_seen: 5, bytes_kept: 5, truncated: false, kept_blake3: [7; 32], tail: b"hello".to_vec() };
    vec![
        Event::Claim {
            subject: "jobs/nightly".into(),
            owner: identity(),
            stale_after_ms: 30_000,
            lock: Some(LockIntent { action: "migrate".into(), request: "req-1".into() }),
            previous: Some(DeadOwner { generation: 2, instance: INSTANCE, reason: DeathReason::StartTimeChanged }),
        },
        Event::Heartbeat { subject: "jobs/nightly".into(), generation: 3 },
        Event::Release { subject: "jobs/nightly".into(), generation: 3 },
        Event::Takeover {
            subject: "jobs/nightly".into(),
            expect_generation: 3,
            expect_heartbeat_ms: 1_700_000_000_000,
            owner: identity(),
            stale_after_ms: 30_000,
            reason: "stale".into(),
        },
        Event::RotateFence { subject: "jobs/nightly".into(), generation: 3 },
        Event::Note { subject: "jobs/nightly".into(), generation: 3, text: "step 2 done".into() },
        Event::FencedAttempts {
            subject: "jobs/nightly".into(),
            writer: WRITER,
            op: "heartbeat".into(),
            presented: 2,
            current: 3,
            count: 4,
            first_ms: 10,
            last_ms: 20,
        },
        Event::LeaseAcquire { resource: "db".into(), mode: LeaseMode::Write, holder: "h".into(), ttl_ms: 60_000 },
        Event::LeaseRelease { lease: 7, token: 8 },
        Event::Checkpoint { snapshot_seq: 100, digest: [9; 32] },
        Event::SpawnRequested {
            fingerprint: [1; 32],
            command: CommandSpec {
                exe: "/bin/sh".into(),
                exe_fingerprint: "8:1:2:3".into(),
                argv: vec!["sh".into(), "-c".into(), "true".into()],
                cwd: "/".into(),
                env: vec![EnvDigest { name: "TOKEN".into(), value_blake3: [2; 32] }],
            },
            owner: Some(owner()),
            leases: vec![LeaseWant { resource: "db".into(), mode: LeaseMode::Read }],
            timeout_ms: 5_000,
            output_bytes_max: 1 << 20,
        },
        Event::ProcessStarted { process: 1, runner: identity(), command_pid: 4343, command_start_ticks: 100 },
        Event::ProcessCancelRequested { process: 1, by: Some(owner()) },
        Event::ProcessEnded {
            process: 1,
            end: ProcessEnd::Exited(Exit {
                exit_code: Some(0),
                signal: None,
                timed_out: false,
                cancelled: false,
                duration_ms: 12,
                stdout: capture.clone(),
                stderr: Capture::default(),
            }),
        },
        Event::OwnerLeaseAcquire { resource: "db".into(), mode: LeaseMode::Read, owner: owner(), ttl_ms: 60_000 },
        Event::Cutover {
            home: OwnerRef { subject: "fencelog/serve".into(), generation: 1 },
            reason: "SIGTERM".into(),
            settled: vec![SettledRequest {
                request: "r".into(),
                op: "claim".into(),
                how: "committed".into(),
                seq: Some(5),
            }],
            more: 0,
        },
        Event::RefusedWrites {
            subject: "jobs/nightly".into(),
            writer: WRITER,
            op: "note".into(),
            presented: 2,
            current: 3,
            retired_cut_off_seq: Some(40),
            count: 1,
            first_ms: 10,
            last_ms: 10,
            content_blake3: [3; 32],
            content_bytes: 4,
            content_head: "text".into(),
        },
        Event::DeathObserved {
            subject: "jobs/nightly".into(),
            generation: 3,
            pid: 4242,
            reason: DeathReason::ProcessDead,
            observed: Observed { boot_id: "boot".into(), pid_ns: 4026531836, start_ticks: None, exe: None },
        },
        Event::Refused {
            subject: "jobs/nightly".into(),
            code: "FENCED".into(),
            op: "heartbeat".into(),
            caller: CallerId {
                pid: 4242,
                start_ticks: 99,
                exe: "inode:8:1:7".into(),
                pid_ns: 4026531836,
                instance: Some(INSTANCE),
            },
            writer: WRITER,
            presented: Some(2),
            current: 3,
            retired_cut_off_seq: Some(40),
            count: 1,
            first_ms: 10,
            last_ms: 10,
            content: Some(RefusedContent { blake3: [4; 32], bytes: 4, first_bytes: "text".into() }),
        },
        Event::OwnerPidNamespace { subject: "jobs/nightly".into(), pid_ns: 4026531836 },
        Event::OwnerHost { subject: "jobs/nightly".into(), host: "host-a".into() },
        Event::ProcessHost { host: "host-a".into() },
        Event::StalenessObserved {
            subject: "jobs/nightly".into(),
            generation: 3,
            heartbeat_ms: 1_700_000_000_000,
            watched_ms: 31_000,
            host: "host-b".into(),
        },
    ]
}

/// One event for every variant of the enums events hold (`ProcessEnd`,
/// `DeathReason`, `LeaseMode`), every `Option` in them set.
fn nested_variants() -> Vec<(String, Event)> {
    let ended =
        |label: &str, end: ProcessEnd| (format!("process_ended/{label}"), Event::ProcessEnded { process: 2, end });
    let mut v = vec![
        ended(
            "exited_signalled",
            ProcessEnd::Exited(Exit {
                exit_code: None,
                signal: Some(9),
                timed_out: true,
                cancelled: true,
                duration_ms: 40,
                stdout: Capture::default(),
                stderr: Capture {
                    bytes_seen: 9,
                    bytes_kept: 3,
                    truncated: true,
                    kept_blake3: [8; 32],
                    tail: b"err".to_vec(),
                },
            }),
        ),
        ended("completed_unknown", ProcessEnd::CompletedUnknown { runner: "process_dead".into(), command_alive: true }),
        ended("failed", ProcessEnd::Failed { code: "SPAWN_FAILED".into(), detail: "no such file".into() }),
    ];
    for (label, reason) in [
        ("process_dead", DeathReason::ProcessDead),
        ("start_time_changed", DeathReason::StartTimeChanged),
        ("boot_changed", DeathReason::BootChanged),
        ("exe_changed", DeathReason::ExeChanged),
    ] {
        v.push((
            format!("death_observed/{label}"),
            Event::DeathObserved {
                subject: "jobs/nightly".into(),
                generation: 3,
                pid: 4242,
                reason,
                observed: Observed {
                    boot_id: "boot".into(),
                    pid_ns: 4026531836,
                    start_ticks: Some(77),
                    exe: Some("inode:8:1:9".into()),
                },
            },
        ));
    }
    v.push((
        "lease_acquire/read".into(),
        Event::LeaseAcquire { resource: "db".into(), mode: LeaseMode::Read, holder: "h".into(), ttl_ms: 1 },
    ));
    v
}

fn every_condition() -> Vec<Condition> {
    vec![
        Condition::SubjectAt { subject: "jobs/nightly".into(), generation: 3 },
        Condition::SubjectAbsent { subject: "jobs/nightly".into() },
        Condition::LogAt { seq: 41 },
    ]
}

fn txn(conditions: Vec<Condition>, events: Vec<Event>) -> Txn {
    Txn {
        request: Some(RequestTag { id: "golden".into(), digest: [5; 32] }),
        time_ms: 1_700_000_000_000,
        writer: WRITER,
        conditions,
        events,
    }
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// Proves: every `Event` variant (and every `Condition`) encodes, in a record's
/// payload, to exactly the bytes pinned in `log-format/vectors/events.json`, and
/// those bytes decode back to it: no variant was re-numbered, re-shaped or dropped.
#[test]
fn every_event_variant_keeps_its_golden_bytes() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("log-format/vectors/events.json");
    let events = every_event();
    for (i, e) in events.iter().enumerate() {
        assert_eq!(index(e) as usize, i, "{} is listed out of declaration order", e.kind());
    }
    let mut cases: Vec<(String, Txn)> =
        events.into_iter().map(|e| (e.kind().to_owned(), txn(vec![], vec![e]))).collect();
    // The enums inside events, variant by variant: their indices are in the log too.
    for (label, e) in nested_variants() {
        cases.push((label, txn(vec![], vec![e])));
    }
    cases.push((
        "conditions".into(),
        txn(every_condition(), vec![Event::Heartbeat { subject: "s".into(), generation: 1 }]),
    ));
    let made: Vec<Value> =
        cases.iter().map(|(kind, t)| json!({"kind": kind, "payload_hex": hex(&encode_txn(t))})).collect();
    if std::env::var_os("FENCELOG_BLESS").is_some() {
        // Blessing only appends what is not pinned yet; pinned entries stay as they are.
        let mut pinned: Vec<Value> = match std::fs::read_to_string(&path) {
            Ok(t) => serde_json::from_str(&t).unwrap(),
            Err(_) => vec![],
        };
        for m in &made {
            if !pinned.iter().any(|p| p["kind"] == m["kind"]) {
                pinned.push(m.clone());
            }
        }
        std::fs::write(&path, serde_json::to_string_pretty(&Value::Array(pinned)).unwrap() + "\n").unwrap();
    }
    let pinned: Vec<Value> = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    // An entry, once pinned, never changes; a new variant appends one.
    assert!(made.len() >= pinned.len(), "a variant was dropped: {} pinned, {} made", pinned.len(), made.len());
    for (i, p) in pinned.iter().enumerate() {
        let kind = p["kind"].as_str().unwrap();
        let m = made.iter().find(|m| m["kind"] == kind).unwrap_or_else(|| panic!("{kind} is pinned but not made"));
        assert_eq!(m["payload_hex"], p["payload_hex"], "{kind}: its bytes changed");
        let bytes: Vec<u8> = (0..p["payload_hex"].as_str().unwrap().len())
            .step_by(2)
            .map(|j| u8::from_str_radix(&p["payload_hex"].as_str().unwrap()[j..j + 2], 16).unwrap())
            .collect();
        let decoded = decode_txn(&bytes).unwrap_or_else(|e| panic!("{kind}: pinned bytes do not decode: {e}"));
        assert_eq!(decoded, cases.iter().find(|(k, _)| k == kind).unwrap().1, "{kind} (entry {i})");
    }
    assert_eq!(made.len(), pinned.len(), "a new variant: pin it (FENCELOG_BLESS=1) and review");
}
