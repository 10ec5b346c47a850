//! The state machine's rules, through the pure model: each refusal code with its
//! evidence, the lease rules, and insta snapshots of scripted scenarios.

use fencelog::model::*;
use uuid::Uuid;

fn who(n: u8) -> Identity {
    Identity {
        instance: Uuid::from_bytes([n; 16]),
        pid: 1000 + n as u32,
        start_ticks: 555,
        boot_id: "boot-a".into(),
        exe: "/usr/bin/daemon:1:2".into(),
    }
}

/// A tiny driver: check then apply at the next sequence, as the ledger does.
struct M {
    p: Projection,
}

impl M {
    fn new() -> M {
        M { p: Projection::default() }
    }
    fn txn(&mut self, time_ms: u64, events: Vec<Event>) -> Result<Vec<Outcome>, Refusal> {
        self.tagged(time_ms, None, events)
    }
    fn tagged(
        &mut self,
        time_ms: u64,
        request: Option<(&str, u8)>,
        events: Vec<Event>,
    ) -> Result<Vec<Outcome>, Refusal> {
        let txn = Txn {
            request: request.map(|(id, d)| RequestTag { id: id.into(), digest: [d; 32] }),
            time_ms,
            writer: Uuid::nil(),
            conditions: vec![],
            events,
        };
        let seq = self.p.last_seq() + 1;
        match self.p.check(seq, &txn)? {
            Checked::Deduplicated(e) => Ok(e.outcomes),
            Checked::Valid { writes: false, outcomes } => Ok(outcomes),
            Checked::Valid { .. } => self.p.apply(seq, &txn),
        }
    }
    fn claim(&mut self, t: u64, s: &str, n: u8) -> Result<Vec<Outcome>, Refusal> {
        self.txn(t, vec![claim(s, n, None, None)])
    }
}

fn claim(s: &str, n: u8, lock: Option<(&str, &str)>, previous: Option<DeadOwner>) -> Event {
    Event::Claim {
        subject: s.into(),
        owner: who(n),
        stale_after_ms: 1_000,
        lock: lock.map(|(a, r)| LockIntent { action: a.into(), request: r.into() }),
        previous,
    }
}

fn code(r: &Refusal) -> serde_json::Value {
    serde_json::to_value(r).unwrap()
}

/// Proves: a live, fresh owner refuses a claim with ALREADY_ACTIVE naming the owner
/// instance, pid and generation; a stale one with STALE_REQUIRES_TAKEOVER.
#[test]
fn claim_of_a_held_subject_is_refused_already_active_or_stale() {
    let mut m = M::new();
    m.claim(0, "home/a", 1).unwrap();
    let r = code(&m.claim(500, "home/a", 2).unwrap_err());
    assert_eq!(r["code"], "ALREADY_ACTIVE");
    assert_eq!((r["pid"].as_u64(), r["generation"].as_u64()), (Some(1001), Some(1)));
    assert_eq!(r["instance"], Uuid::from_bytes([1; 16]).to_string());
    let r = code(&m.claim(5_000, "home/a", 2).unwrap_err());
    assert_eq!(r["code"], "STALE_REQUIRES_TAKEOVER");
    assert_eq!(
        (r["age_ms"].as_u64(), r["stale_after_ms"].as_u64(), r["heartbeat_ms"].as_u64()),
        (Some(5_000), Some(1_000), Some(0))
    );
}

/// Proves: a claim carrying proof of the owner's death succeeds without waiting for
/// staleness and records the retirement with its evidence; the generation goes up.
#[test]
fn claim_over_a_provably_dead_owner_retires_it_with_evidence() {
    let mut m = M::new();
    m.claim(0, "home/a", 1).unwrap();
    let dead = m.p.dead_owner("home/a", DeathReason::StartTimeChanged);
    let out = m.txn(10, vec![claim("home/a", 2, None, dead)]).unwrap();
    let Outcome::Claimed { generation: 2, retired: Some(r), .. } = &out[0] else { panic!("{out:?}") };
    assert_eq!((r.generation, r.pid, r.cut_off_seq), (1, 1001, 1));
    assert_eq!(r.how, TenureEndHow::DeadOwner(DeathReason::StartTimeChanged));
    // Evidence about a different generation proves nothing.
    let stale_evidence =
        DeadOwner { generation: 1, instance: Uuid::from_bytes([2; 16]), reason: DeathReason::ProcessDead };
    assert_eq!(
        code(&m.txn(20, vec![claim("home/a", 3, None, Some(stale_evidence))]).unwrap_err())["code"],
        "ALREADY_ACTIVE"
    );
}

/// Proves: takeover names exact expectations: TAKEOVER_RACE when the generation or
/// heartbeat moved, TAKEOVER_ACTIVE_REFUSED while fresh; success retires the old owner
/// with a cut-off and there is no ownerless instant.
#[test]
fn takeover_refuses_races_and_fresh_owners_and_cuts_off_the_old_owner() {
    let mut m = M::new();
    m.claim(0, "run/1", 1).unwrap();
    m.txn(100, vec![Event::Heartbeat { subject: "run/1".into(), generation: 1 }]).unwrap();
    let tk = |g: u64, hb: u64, n: u8| Event::Takeover {
        subject: "run/1".into(),
        expect_generation: g,
        expect_heartbeat_ms: hb,
        owner: who(n),
        stale_after_ms: 1_000,
        reason: "stale".into(),
    };
    let r = code(&m.txn(5_000, vec![tk(1, 0, 2)]).unwrap_err());
    assert_eq!(r["code"], "TAKEOVER_RACE");
    assert_eq!((r["expected_heartbeat_ms"].as_u64(), r["current_heartbeat_ms"].as_u64()), (Some(0), Some(100)));
    let r = code(&m.txn(5_000, vec![tk(7, 100, 2)]).unwrap_err());
    assert_eq!(
        (r["code"].as_str(), r["expected_generation"].as_u64(), r["current_generation"].as_u64()),
        (Some("TAKEOVER_RACE"), Some(7), Some(1))
    );
    let r = code(&m.txn(600, vec![tk(1, 100, 2)]).unwrap_err());
    assert_eq!((r["code"].as_str(), r["age_ms"].as_u64()), (Some("TAKEOVER_ACTIVE_REFUSED"), Some(500)));
    let out = m.txn(5_000, vec![tk(1, 100, 2)]).unwrap();
    let Outcome::TookOver { generation: 2, retired, .. } = &out[0] else { panic!() };
    assert_eq!((retired.cut_off_seq, retired.how), (2, TenureEndHow::TakenOver));
    assert_eq!(m.p.subject("run/1").unwrap().owner.as_ref().unwrap().identity, who(2), "never ownerless");
}

/// Proves (a log shared by hosts): a takeover that carries observed staleness
/// (`StalenessObserved`) is judged on what was watched, never on the records'
/// wall clocks — refused TAKEOVER_ACTIVE_REFUSED while the watch is within the
/// staleness however old the heartbeat looks, valid once it is past it however
/// young the heartbeat looks (a skewed owner's clock); evidence naming another
/// generation or heartbeat than the state's is invalid; and host evidence only
/// goes with what it describes (an owner's with its claim or takeover, a
/// process's with its spawn), recorded on the owner and the process.
#[test]
fn a_takeover_with_observed_staleness_is_judged_on_the_watch_not_on_wall_clocks() {
    let mut m = M::new();
    m.claim(0, "s", 1).unwrap();
    // The owner's clock ran ahead: its heartbeat is far in the taker's future.
    m.txn(10_000_000, vec![Event::Heartbeat { subject: "s".into(), generation: 1 }]).unwrap();
    let tk = || Event::Takeover {
        subject: "s".into(),
        expect_generation: 1,
        expect_heartbeat_ms: 10_000_000,
        owner: who(2),
        stale_after_ms: 1_000,
        reason: "stale".into(),
    };
    let seen = |g: u64, hb: u64, watched_ms: u64| Event::StalenessObserved {
        subject: "s".into(),
        generation: g,
        heartbeat_ms: hb,
        watched_ms,
        host: "host-b".into(),
    };
    // Far past the heartbeat by the records' clocks, yet watched for less than
    // the staleness: refused, the watch as its age.
    let r = code(&m.txn(99_000_000, vec![tk(), seen(1, 10_000_000, 1_000)]).unwrap_err());
    assert_eq!((r["code"].as_str(), r["age_ms"].as_u64()), (Some("TAKEOVER_ACTIVE_REFUSED"), Some(1_000)));
    let r = code(&m.txn(99_000_000, vec![tk(), seen(1, 9_999_999, 5_000)]).unwrap_err());
    assert_eq!(r["code"], "INVALID_INPUT", "evidence of another heartbeat: {r}");
    let r = code(&m.txn(1_000, vec![Event::OwnerHost { subject: "s".into(), host: "host-b".into() }]).unwrap_err());
    assert_eq!(r["code"], "INVALID_INPUT", "an owner's host alone: {r}");
    let r = code(&m.txn(1_000, vec![Event::ProcessHost { host: "host-b".into() }]).unwrap_err());
    assert_eq!(r["code"], "INVALID_INPUT", "a process's host alone: {r}");
    // Before the heartbeat by the records' clocks (it would look fresh for hours),
    // watched past the staleness: taken over, the owner's host recorded.
    let out = m
        .txn(
            20_000,
            vec![tk(), seen(1, 10_000_000, 1_001), Event::OwnerHost { subject: "s".into(), host: "host-b".into() }],
        )
        .unwrap();
    assert!(matches!(out[0], Outcome::TookOver { generation: 2, .. }), "{out:?}");
    assert_eq!(m.p.subject("s").unwrap().owner.as_ref().unwrap().host.as_deref(), Some("host-b"));
}

/// Proves: heartbeat, release, rotation and notes under a stale generation are
/// FENCED with presented and current; on a released subject NOT_ACTIVE.
#[test]
fn stale_generations_are_fenced_and_idle_subjects_not_active() {
    let mut m = M::new();
    m.claim(0, "s", 1).unwrap();
    m.txn(1, vec![Event::RotateFence { subject: "s".into(), generation: 1 }]).unwrap();
    for e in [
        Event::Heartbeat { subject: "s".into(), generation: 1 },
        Event::Release { subject: "s".into(), generation: 1 },
        Event::RotateFence { subject: "s".into(), generation: 1 },
    ] {
        let r = code(&m.txn(2, vec![e]).unwrap_err());
        assert_eq!(
            (r["code"].as_str(), r["presented"].as_u64(), r["current"].as_u64()),
            (Some("FENCED"), Some(1), Some(2))
        );
        assert_eq!(r["subject"], "s");
    }
    m.txn(3, vec![Event::Release { subject: "s".into(), generation: 2 }]).unwrap();
    let r = code(&m.txn(4, vec![Event::Heartbeat { subject: "s".into(), generation: 2 }]).unwrap_err());
    assert_eq!((r["code"].as_str(), r["generation"].as_u64()), (Some("NOT_ACTIVE"), Some(2)));
    // Re-claim after release: the generation never repeats.
    let out = m.claim(5, "s", 3).unwrap();
    assert!(matches!(out[0], Outcome::Claimed { generation: 3, .. }));
}

/// Proves: replaying a log an earlier build wrote, a retired owner's late notes in
/// it are applied (counted) but are not authoritative; a note from a future
/// generation is refused. (A new late note never reaches the log: the ledger
/// refuses it `FENCED` and keeps only evidence of it — `ledger_processes`.)
#[test]
fn retired_owner_notes_after_the_cut_off_are_kept_but_not_authoritative() {
    let mut m = M::new();
    m.claim(0, "run/9", 1).unwrap();
    let note = |g: u64| vec![Event::Note { subject: "run/9".into(), generation: g, text: "event".into() }];
    assert!(matches!(m.txn(1, note(1)).unwrap()[0], Outcome::Noted { authoritative: true, .. }));
    let dead = m.p.dead_owner("run/9", DeathReason::ProcessDead);
    m.txn(2, vec![claim("run/9", 2, None, dead)]).unwrap();
    assert!(matches!(m.txn(3, note(1)).unwrap()[0], Outcome::Noted { authoritative: false, .. }));
    let s = m.p.subject("run/9").unwrap();
    assert_eq!((s.notes, s.late_notes), (1, 1));
    assert_eq!(code(&m.txn(4, note(9)).unwrap_err())["code"], "FENCED");
}

/// Proves: mutation locks need action and request; a second requester is BUSY
/// (naming holder action, request and pid); the same request again is a reuse; a
/// live holder without attribution is IDENTITY_UNCERTAIN, never free.
#[test]
fn mutation_locks_are_busy_reused_or_identity_uncertain() {
    let mut m = M::new();
    m.txn(0, vec![claim("lock/recovery", 1, Some(("recover", "req-1")), None)]).unwrap();
    let r = code(&m.txn(1, vec![claim("lock/recovery", 2, Some(("stop", "req-2")), None)]).unwrap_err());
    assert_eq!(r["code"], "BUSY");
    assert_eq!(
        (r["action"].as_str(), r["request"].as_str(), r["pid"].as_u64()),
        (Some("recover"), Some("req-1"), Some(1001))
    );
    let seq = m.p.last_seq();
    let out = m.txn(2, vec![claim("lock/recovery", 1, Some(("recover", "req-1")), None)]).unwrap();
    assert!(matches!(out[0], Outcome::LockReused { generation: 1, .. }));
    assert_eq!(m.p.last_seq(), seq, "a reuse writes nothing");
    m.claim(0, "lock/legacy", 3).unwrap();
    let r = code(&m.txn(1, vec![claim("lock/legacy", 2, Some(("stop", "req-9")), None)]).unwrap_err());
    assert_eq!((r["code"].as_str(), r["pid"].as_u64()), (Some("IDENTITY_UNCERTAIN"), Some(1003)));
    let r = code(&m.txn(1, vec![claim("lock/x", 2, Some(("", "req")), None)]).unwrap_err());
    assert_eq!(r["code"], "INVALID_INPUT");
}

fn acquire(res: &str, mode: LeaseMode, holder: &str, ttl_ms: u64) -> Vec<Event> {
    vec![Event::LeaseAcquire { resource: res.into(), mode, holder: holder.into(), ttl_ms }]
}

/// Proves: readers coexist, a writer conflicts (LEASE_CONFLICT naming blockers),
/// tokens only increase, release is exactly once, a wrong token stays pending with
/// the failure recorded and can be retried, expired leases are displaced.
#[test]
fn leases_conflict_release_once_record_failures_and_displace_expired() {
    let mut m = M::new();
    let lease_of = |o: &[Outcome]| match &o[0] {
        Outcome::LeaseAcquired { lease, token, .. } => (*lease, *token),
        other => panic!("{other:?}"),
    };
    let (r1, t1) = lease_of(&m.txn(0, acquire("db", LeaseMode::Read, "a", 1_000)).unwrap());
    let (r2, t2) = lease_of(&m.txn(0, acquire("db", LeaseMode::Read, "b", 1_000)).unwrap());
    assert!(t2 > t1);
    let r = code(&m.txn(10, acquire("db", LeaseMode::Write, "c", 1_000)).unwrap_err());
    assert_eq!(r["code"], "LEASE_CONFLICT");
    let holders: Vec<_> =
        r["blockers"].as_array().unwrap().iter().map(|b| b["holder"].as_str().unwrap().to_owned()).collect();
    assert_eq!(holders, vec!["a", "b"]);
    // Wrong token: committed as a failure, lease still held, attempts counted.
    let out = m.txn(20, vec![Event::LeaseRelease { lease: r1, token: t1 + 100 }]).unwrap();
    assert!(matches!(&out[0], Outcome::LeaseReleaseFailed { attempts: 1, .. }));
    let out = m.txn(21, vec![Event::LeaseRelease { lease: r1, token: t1 + 100 }]).unwrap();
    assert!(matches!(&out[0], Outcome::LeaseReleaseFailed { attempts: 2, .. }));
    assert!(
        matches!(&m.p.leases()[&r1].state, LeaseState::ReleasePending { code, attempts: 2 } if code == "TOKEN_MISMATCH")
    );
    assert!(matches!(
        m.txn(22, vec![Event::LeaseRelease { lease: r1, token: t1 }]).unwrap()[0],
        Outcome::LeaseReleased { .. }
    ));
    let seq = m.p.last_seq();
    let again = m.txn(23, vec![Event::LeaseRelease { lease: r1, token: t1 }]).unwrap();
    assert!(
        matches!(&again[0], Outcome::LeaseAlreadyEnded { state: LeaseState::Released { seq: s }, .. } if *s == seq)
    );
    assert_eq!(m.p.last_seq(), seq, "a second release writes nothing");
    // r2 expires at 1000: a writer at 2000 displaces it, and that is recorded.
    let out = m.txn(2_000, acquire("db", LeaseMode::Write, "c", 1_000)).unwrap();
    let Outcome::LeaseAcquired { displaced, token, .. } = &out[0] else { panic!() };
    assert_eq!((displaced.as_slice(), *token > t2), (&[r2][..], true));
    assert!(matches!(m.p.leases()[&r2].state, LeaseState::Displaced { .. }));
    assert_eq!(
        code(&m.txn(3_000, vec![Event::LeaseRelease { lease: 999, token: 1 }]).unwrap_err())["code"],
        "UNKNOWN_LEASE"
    );
}

/// Proves: a request id with the same content returns the original result; with
/// different content REQUEST_ID_CONFLICT naming the committed sequence.
#[test]
fn request_ids_deduplicate_same_content_and_refuse_different_content() {
    let mut m = M::new();
    let first = m.tagged(0, Some(("r-1", 7)), vec![claim("home/z", 1, None, None)]).unwrap();
    let seq = m.p.last_seq();
    let again = m.tagged(5, Some(("r-1", 7)), vec![claim("home/z", 1, None, None)]).unwrap();
    assert_eq!((again, m.p.last_seq()), (first, seq));
    let r = code(&m.tagged(5, Some(("r-1", 8)), vec![claim("home/z", 1, None, None)]).unwrap_err());
    assert_eq!((r["code"].as_str(), r["committed_seq"].as_u64()), (Some("REQUEST_ID_CONFLICT"), Some(seq)));
}

/// Proves: subject names are validated (length, control characters), and
/// conditions report expected vs actual.
#[test]
fn bad_subject_names_and_failed_conditions_are_refused_with_evidence() {
    let mut m = M::new();
    for bad in ["", "a\nb", &"x".repeat(257)] {
        assert_eq!(code(&m.claim(0, bad, 1).unwrap_err())["code"], "INVALID_SUBJECT");
    }
    assert!(m.claim(0, &"x".repeat(256), 1).is_ok());
    let txn = Txn {
        request: None,
        time_ms: 0,
        writer: Uuid::nil(),
        conditions: vec![Condition::SubjectAt { subject: "x".into(), generation: 5 }],
        events: vec![claim("y", 1, None, None)],
    };
    let r = code(&m.p.check(2, &txn).unwrap_err());
    assert_eq!(
        (r["code"].as_str(), r["expected"].as_str(), r["actual"].as_str()),
        (Some("CONDITION_FAILED"), Some("5"), Some("0"))
    );
}

/// Pins the projection JSON of a scripted hand-over: claim, heartbeat, notes,
/// takeover with a zombie note, a lease left pending across the cutover.
#[test]
fn projection_json_of_a_scripted_cutover() {
    let mut m = M::new();
    m.claim(1_000, "home/ctl", 1).unwrap();
    m.txn(1_500, vec![Event::Heartbeat { subject: "home/ctl".into(), generation: 1 }]).unwrap();
    m.txn(1_600, acquire("repo", LeaseMode::Write, "ctl-1", 60_000)).unwrap();
    m.txn(1_700, vec![Event::LeaseRelease { lease: 1, token: 99 }]).unwrap();
    m.txn(
        9_000,
        vec![Event::Takeover {
            subject: "home/ctl".into(),
            expect_generation: 1,
            expect_heartbeat_ms: 1_500,
            owner: who(2),
            stale_after_ms: 1_000,
            reason: "heartbeat stale".into(),
        }],
    )
    .unwrap();
    m.txn(9_100, vec![Event::Note { subject: "home/ctl".into(), generation: 1, text: "zombie".into() }]).unwrap();
    m.txn(
        9_200,
        vec![Event::FencedAttempts {
            subject: "home/ctl".into(),
            writer: Uuid::from_bytes([1; 16]),
            op: "heartbeat".into(),
            presented: 1,
            current: 2,
            count: 3,
            first_ms: 9_150,
            last_ms: 9_190,
        }],
    )
    .unwrap();
    insta::assert_snapshot!("scripted_cutover_projection", serde_json::to_string_pretty(&m.p).unwrap());
}

/// Pins the projection JSON of a second script: a dead-owner claim, a mutation lock,
/// readers then an expired-lease displacement, and idempotent requests.
#[test]
fn projection_json_of_a_dead_owner_lock_and_lease_script() {
    let mut m = M::new();
    m.tagged(100, Some(("boot-1", 1)), vec![claim("home/daemon", 1, None, None)]).unwrap();
    let dead = m.p.dead_owner("home/daemon", DeathReason::ProcessDead);
    m.tagged(200, Some(("boot-2", 2)), vec![claim("home/daemon", 2, None, dead)]).unwrap();
    m.txn(210, vec![claim("lock/recovery", 2, Some(("recover-run", "req-7")), None)]).unwrap();
    m.txn(220, acquire("artifacts", LeaseMode::Read, "reader-a", 50)).unwrap();
    m.txn(230, acquire("artifacts", LeaseMode::Read, "reader-b", 5_000)).unwrap();
    m.txn(240, vec![Event::LeaseRelease { lease: 2, token: 2 }]).unwrap();
    m.txn(400, acquire("artifacts", LeaseMode::Write, "writer-c", 1_000)).unwrap();
    m.txn(410, vec![Event::Release { subject: "lock/recovery".into(), generation: 1 }]).unwrap();
    insta::assert_snapshot!("dead_owner_lock_and_lease_projection", serde_json::to_string_pretty(&m.p).unwrap());
}

/// Proves the model's limits: text fields, events per transaction, remembered
/// tenures per subject and remembered request ids are all bounded.
#[test]
fn model_limits_on_text_events_tenures_and_request_ids_hold() {
    let mut m = M::new();
    m.claim(0, "s", 1).unwrap();
    let long = "x".repeat(TEXT_BYTES_MAX + 1);
    let r = m.txn(1, vec![Event::Note { subject: "s".into(), generation: 1, text: long }]).unwrap_err();
    assert_eq!(code(&r)["code"], "INVALID_INPUT");
    assert_eq!(code(&m.txn(1, vec![]).unwrap_err())["code"], "INVALID_INPUT");
    let too_many: Vec<Event> = (0..=TXN_EVENTS_MAX).map(|i| claim(&format!("many/{i}"), 1, None, None)).collect();
    assert_eq!(code(&m.txn(1, too_many).unwrap_err())["code"], "INVALID_INPUT");
    // 40 rotations end 40 tenures; only the newest 32 are remembered.
    for g in 1..=40 {
        m.txn(2, vec![Event::RotateFence { subject: "s".into(), generation: g }]).unwrap_or_default();
    }
    let mut m = M::new();
    for g in 0..40u64 {
        m.claim(10 * g, "t", 1).unwrap();
        m.txn(10 * g + 1, vec![Event::Release { subject: "t".into(), generation: g + 1 }]).unwrap();
    }
    let ended = &m.p.subject("t").unwrap().ended;
    assert_eq!((ended.len(), ended[0].generation, ended[31].generation), (32, 9, 40));
    // Request ids: the newest REQUESTS_RETAINED are remembered, the oldest forgotten.
    let mut p = Projection::default();
    for i in 0..=REQUESTS_RETAINED as u64 {
        let txn = Txn {
            request: Some(RequestTag { id: format!("r{i}"), digest: [0; 32] }),
            time_ms: i,
            writer: Uuid::nil(),
            conditions: vec![],
            events: vec![Event::LeaseAcquire {
                resource: format!("res/{}", i % 7),
                mode: LeaseMode::Read,
                holder: "h".into(),
                ttl_ms: 1,
            }],
        };
        p.apply(i + 1, &txn).unwrap();
    }
    assert_eq!(p.requests().len(), REQUESTS_RETAINED);
    assert!(!p.requests().contains_key("r0") && p.requests().contains_key("r1"));
}

/// Proves: ended leases are remembered up to TERMINAL_LEASES_RETAINED, the oldest
/// forgotten first (a release of a forgotten lease is then UNKNOWN_LEASE).
#[test]
fn ended_leases_are_remembered_up_to_the_retention_limit() {
    let mut p = Projection::default();
    let n = fencelog::model::TERMINAL_LEASES_RETAINED as u64 + 5;
    for i in 0..=n {
        // Each acquire displaces the previous, expired, lease on the same resource.
        let txn = Txn {
            request: None,
            time_ms: 10 * i,
            writer: Uuid::nil(),
            conditions: vec![],
            events: vec![Event::LeaseAcquire {
                resource: "r".into(),
                mode: LeaseMode::Write,
                holder: "h".into(),
                ttl_ms: 5,
            }],
        };
        p.apply(i + 1, &txn).unwrap();
    }
    let ended = p.leases().values().filter(|l| matches!(l.state, LeaseState::Displaced { .. })).count();
    assert_eq!(ended, fencelog::model::TERMINAL_LEASES_RETAINED);
    assert!(!p.leases().contains_key(&1) && p.leases().contains_key(&(n + 1)));
}

/// Proves: the projection's memory of refusal windows is bounded: 5,000 callers
/// refused within a second leave at most `REFUSAL_WINDOWS_MAX` windows (the oldest
/// go first), and a window older than `REFUSAL_WINDOWS_RETAIN_MS` is forgotten once
/// more arrive — all from record times alone, so every replay forgets the same.
#[test]
fn refusal_windows_are_bounded_in_number_and_age() {
    let mut m = M::new();
    let refused = |pid: u32, at_ms: u64| Event::Refused {
        subject: "s".into(),
        code: "FENCED".into(),
        op: "heartbeat".into(),
        caller: CallerId { pid, start_ticks: 1, exe: "e".into(), pid_ns: 0, instance: None },
        writer: Uuid::nil(),
        presented: Some(1),
        current: 2,
        retired_cut_off_seq: None,
        count: 1,
        first_ms: at_ms,
        last_ms: at_ms,
        content: None,
    };
    let key = |pid: u32| {
        refusal_window_key(
            "s",
            "FENCED",
            "heartbeat",
            &CallerId { pid, start_ticks: 1, exe: "e".into(), pid_ns: 0, instance: None },
        )
    };
    let t0 = 1_000_000u64;
    m.txn(t0, vec![refused(1, t0)]).unwrap();
    assert_eq!(m.p.refusal_recorded_ms(&key(1)), Some(t0));
    // Later than the retention: the first window is gone once more arrive.
    let t1 = t0 + REFUSAL_WINDOWS_RETAIN_MS + 1;
    for pid in 2..=5_000u32 {
        m.txn(t1 + u64::from(pid) / 10, vec![refused(pid, t1 + u64::from(pid) / 10)]).unwrap();
    }
    assert_eq!(m.p.refusal_recorded_ms(&key(1)), None, "older than the retention");
    let kept = (2..=5_000u32).filter(|&p| m.p.refusal_recorded_ms(&key(p)).is_some()).count();
    assert!(kept <= REFUSAL_WINDOWS_MAX, "{kept} windows kept");
    assert_eq!(m.p.refusal_recorded_ms(&key(5_000)), Some(t1 + 500), "the newest stays");
    assert_eq!(m.p.refusal_recorded_ms(&key(2)), None, "the oldest went first");
}

/// A projection with subjects (claimed, heartbeating, taken over, released),
/// requests remembered, and a lease: the maps a snapshot holds most of.
fn shared_maps_state() -> M {
    let mut m = M::new();
    for i in 0..40u64 {
        let id = format!("req/{i}");
        m.tagged(i, Some((&id, i as u8)), vec![claim(&format!("svc/{i}"), (i % 5) as u8, None, None)]).unwrap();
    }
    m.txn(50, vec![Event::Heartbeat { subject: "svc/1".into(), generation: 1 }]).unwrap();
    m.txn(
        5_000,
        vec![Event::Takeover {
            subject: "svc/2".into(),
            expect_generation: 1,
            expect_heartbeat_ms: 2,
            owner: who(9),
            stale_after_ms: 1_000,
            reason: "stale".into(),
        }],
    )
    .unwrap();
    m.txn(5_001, vec![Event::Release { subject: "svc/3".into(), generation: 1 }]).unwrap();
    m.txn(
        5_002,
        vec![Event::LeaseAcquire { resource: "db".into(), mode: LeaseMode::Write, holder: "h".into(), ttl_ms: 9 }],
    )
    .unwrap();
    m
}

/// Proves: the projection's encoding — what every snapshot holds — is byte for
/// byte what it was before its subjects and requests became shared entries
/// (`Arc`): the digest below was computed by the build before that change
/// (`95a66cb`) from the same state. A snapshot written by either build reads in
/// the other.
#[test]
fn the_projection_encodes_to_the_same_bytes_as_before_its_maps_were_shared() {
    let m = shared_maps_state();
    let bytes = bincode::serde::encode_to_vec(&m.p, bincode::config::standard()).unwrap();
    let decoded: Projection = bincode::serde::decode_from_slice(&bytes, bincode::config::standard()).unwrap().0;
    assert_eq!(decoded, m.p, "decodes to the same state");
    assert_eq!(blake3::hash(&bytes).to_hex().as_str(), GOLDEN_PROJECTION_BLAKE3, "{} bytes", bytes.len());
}

const GOLDEN_PROJECTION_BLAKE3: &str = "4655a691ddd39a71ebbf65e369c9271c999432743369807788def075a4fd32e6";

/// Proves: a clone of the projection (what a snapshot takes, under the commit
/// engine's mutex) keeps the state it was taken at while the original moves on —
/// the subject a later record changes, a subject it creates, a request it
/// remembers — and the original is the same as a projection that never had a
/// clone taken.
/// Proves: a decoded projection (a snapshot's) holds each remembered request's id
/// once, shared by the entry and the order by sequence, as the one that remembered
/// them did; decoding alone gives each id two copies.
#[test]
fn a_decoded_projection_shares_each_request_id_between_its_entry_and_its_order() {
    let m = shared_maps_state();
    let counts = |p: &Projection| p.requests().keys().map(std::sync::Arc::strong_count).collect::<Vec<_>>();
    assert_eq!(counts(&m.p), vec![2; 40]);
    let bytes = bincode::serde::encode_to_vec(&m.p, bincode::config::standard()).unwrap();
    let mut decoded: Projection = bincode::serde::decode_from_slice(&bytes, bincode::config::standard()).unwrap().0;
    assert_eq!(counts(&decoded), vec![1; 40], "decoding gives the order its own copies");
    decoded.share_request_ids();
    assert_eq!(counts(&decoded), vec![2; 40]);
    assert_eq!(decoded, m.p);
}

#[test]
fn a_clone_of_the_projection_keeps_its_state_while_the_original_moves_on() {
    let mut m = shared_maps_state();
    let mut untouched = shared_maps_state();
    let taken = m.p.clone();
    assert_eq!(taken, m.p);
    let before = |p: &Projection| (p.subject("svc/1").cloned(), p.subject("new").cloned(), p.requests().len());
    let then = before(&taken);
    for m in [&mut m, &mut untouched] {
        m.txn(6_000, vec![Event::Heartbeat { subject: "svc/1".into(), generation: 1 }]).unwrap();
        m.tagged(6_001, Some(("req/new", 1)), vec![claim("new", 1, None, None)]).unwrap();
    }
    assert_eq!(before(&taken), then, "the clone is as it was taken");
    assert_eq!(taken.subject("svc/1").unwrap().owner.as_ref().unwrap().heartbeat_ms, 50);
    assert_eq!(m.p.subject("svc/1").unwrap().owner.as_ref().unwrap().heartbeat_ms, 6_000);
    assert!(taken.subject("new").is_none() && m.p.subject("new").is_some());
    assert!(!taken.requests().contains_key("req/new") && m.p.requests().contains_key("req/new"));
    assert_eq!(m.p, untouched.p, "the original moved on as if no clone had been taken");
    // Shared, not copied: an entry neither side changed is one entry in both; the
    // one the original changed was copied for it alone.
    let same = |name: &str| std::ptr::eq(taken.subject(name).unwrap(), m.p.subject(name).unwrap());
    assert!(same("svc/5") && same("svc/39"), "an untouched subject is shared by the clone and the original");
    assert!(!same("svc/1"), "a subject changed after the clone was copied");
    let request = |p: &Projection| std::sync::Arc::as_ptr(p.requests().get("req/7").unwrap());
    assert_eq!(request(&taken), request(&m.p), "an untouched remembered request is shared");
}
