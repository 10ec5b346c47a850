//! Fuzzing on the stable toolchain (proptest): the decoders never panic and never
//! allocate in proportion to a length they are told, and `Projection::apply`
//! agrees with a plain reference model of the ownership rules.
//!
//! A short run is part of `cargo test`; a long one is
//! `PROPTEST_CASES=200000 cargo test --release --test fuzz_props`.

use std::collections::BTreeMap;

use fencelog::format::{GENESIS_LINK, SegmentHeader, decode_frame, encode_frame};
use fencelog::ledger::snapshot;
use fencelog::model::*;
use proptest::prelude::*;
use uuid::Uuid;

fn who(n: u8) -> Identity {
    Identity {
        instance: Uuid::from_bytes([n; 16]),
        pid: n as u32,
        start_ticks: 1,
        boot_id: "b".into(),
        exe: "e".into(),
    }
}

fn a_txn() -> Txn {
    Txn::new(
        7,
        Uuid::nil(),
        vec![
            Event::Claim { subject: "s/a".into(), owner: who(1), stale_after_ms: 10, lock: None, previous: None },
            Event::Note { subject: "s/b".into(), generation: 1, text: "text".into() },
        ],
    )
}

proptest! {
    /// Proves: the transaction and snapshot decoders return errors, never panic, on
    /// arbitrary bytes and on any mutation of a valid encoding.
    #[test]
    fn payload_and_snapshot_decoders_never_panic(
        bytes in prop::collection::vec(any::<u8>(), 0..600),
        flips in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 0..6),
    ) {
        let _ = decode_txn(&bytes);
        let _ = snapshot::decode(&bytes, 3);
        let mut valid = encode_txn(&a_txn());
        let mut body = snapshot::body_of(&Projection::default());
        for (at, v) in &flips {
            let i = at.index(valid.len());
            valid[i] ^= v;
            let j = at.index(body.len());
            body[j] ^= v;
        }
        let _ = decode_txn(&valid);
        let _ = snapshot::decode(&body, 0);
    }

    /// Proves: frames and segment headers built from arbitrary content decode to
    /// exactly that content; arbitrary bytes never panic the frame decoder.
    #[test]
    fn frames_round_trip_and_garbage_never_panics(
        payload in prop::collection::vec(any::<u8>(), 0..300),
        seq in 1u64..u64::MAX, time_ms in any::<u64>(), writer in any::<[u8; 16]>(),
        garbage in prop::collection::vec(any::<u8>(), 0..200),
    ) {
        let mut buf = Vec::new();
        encode_frame(&mut buf, &GENESIS_LINK, seq, &writer, time_ms, &payload);
        let (rec, used) = decode_frame(&buf, 1 << 20).unwrap();
        prop_assert_eq!((rec.seq, rec.time_ms, rec.writer, rec.payload, used), (seq, time_ms, writer, &payload[..], buf.len()));
        let _ = decode_frame(&garbage, u32::MAX);
        let _ = SegmentHeader::decode(&garbage);
    }
}

/// Proves: a payload that claims a huge length (a string of 2^60 bytes) is refused
/// at once, without allocating it.
#[test]
fn a_claimed_huge_length_is_refused_without_allocating() {
    // bincode standard: a Txn starts with Option<RequestTag>: 1 = Some, then the id
    // string's varint length: 0xFF + u64 little-endian.
    let mut evil = vec![1u8, 0xFF];
    evil.extend_from_slice(&(1u64 << 60).to_le_bytes());
    evil.extend_from_slice(b"abc");
    assert!(decode_txn(&evil).is_err());
    assert!(snapshot::decode(&[0xFD, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0x0F], 0).is_err());
}

/// The ownership rules, written plainly: per subject, the generation and the owner
/// (instance, last heartbeat, staleness).
#[derive(Debug, Default, Clone)]
struct Reference {
    subjects: BTreeMap<String, (u64, Option<RefOwner>)>,
}

/// (instance, last heartbeat ms, stale after ms).
type RefOwner = (Uuid, u64, u64);

impl Reference {
    /// Whether the event is accepted at `now`, applying it if so.
    fn apply(&mut self, e: &Event, now: u64) -> bool {
        let fresh = |o: &RefOwner| now.saturating_sub(o.1) <= o.2;
        match e {
            Event::Claim { subject, owner, stale_after_ms, .. } => {
                let s = self.subjects.entry(subject.clone()).or_default();
                if s.1.is_some() {
                    return false;
                }
                *s = (s.0 + 1, Some((owner.instance, now, *stale_after_ms)));
                true
            }
            Event::Heartbeat { subject, generation }
            | Event::Release { subject, generation }
            | Event::RotateFence { subject, generation } => {
                let Some(s) = self.subjects.get_mut(subject) else { return false };
                if s.0 != *generation || s.1.is_none() {
                    return false;
                }
                match e {
                    Event::Heartbeat { .. } => s.1.as_mut().expect("owner").1 = now,
                    Event::Release { .. } => s.1 = None,
                    _ => s.0 += 1,
                }
                true
            }
            Event::Takeover { subject, expect_generation, expect_heartbeat_ms, owner, stale_after_ms, .. } => {
                let Some(s) = self.subjects.get_mut(subject) else { return false };
                match &s.1 {
                    Some(o) if s.0 == *expect_generation && o.1 == *expect_heartbeat_ms && !fresh(o) => {
                        *s = (s.0 + 1, Some((owner.instance, now, *stale_after_ms)));
                        true
                    }
                    _ => false,
                }
            }
            Event::Note { subject, generation, .. } => {
                let current = self.subjects.get(subject).map_or(0, |s| s.0);
                *generation != 0 && *generation <= current
            }
            _ => unreachable!("not generated"),
        }
    }
}

const SUBJECTS: [&str; 3] = ["a", "b", "c"];

#[derive(Debug, Clone)]
enum Op {
    Claim(usize, u8, u64),
    Beat(usize, i8),
    Release(usize, i8),
    Rotate(usize, i8),
    Takeover(usize, u8, bool),
    Note(usize, i8),
}

fn op() -> impl Strategy<Value = Op> {
    let s = 0..SUBJECTS.len();
    prop_oneof![
        (s.clone(), 1u8..4, 1u64..50).prop_map(|(s, w, st)| Op::Claim(s, w, st)),
        (s.clone(), -1i8..=1).prop_map(|(s, k)| Op::Beat(s, k)),
        (s.clone(), -1i8..=1).prop_map(|(s, k)| Op::Release(s, k)),
        (s.clone(), -1i8..=1).prop_map(|(s, k)| Op::Rotate(s, k)),
        (s.clone(), 1u8..4, any::<bool>()).prop_map(|(s, w, exact)| Op::Takeover(s, w, exact)),
        (s, -1i8..=1).prop_map(|(s, k)| Op::Note(s, k)),
    ]
}

/// An operation made concrete against the current state, so that a fair share of
/// them are valid (generations near the current one, takeovers naming what is seen).
fn concrete(r: &Reference, op: &Op) -> Event {
    let cur = |s: usize| r.subjects.get(SUBJECTS[s]).cloned().unwrap_or_default();
    let skewed = |s: usize, k: i8| cur(s).0.saturating_add_signed(k as i64);
    let subject = |s: usize| SUBJECTS[s].to_string();
    match *op {
        Op::Claim(s, w, st) => {
            Event::Claim { subject: subject(s), owner: who(w), stale_after_ms: st, lock: None, previous: None }
        }
        Op::Beat(s, k) => Event::Heartbeat { subject: subject(s), generation: skewed(s, k) },
        Op::Release(s, k) => Event::Release { subject: subject(s), generation: skewed(s, k) },
        Op::Rotate(s, k) => Event::RotateFence { subject: subject(s), generation: skewed(s, k) },
        Op::Takeover(s, w, exact) => {
            let (g, o) = cur(s);
            let hb = o.map_or(0, |o| o.1);
            Event::Takeover {
                subject: subject(s),
                expect_generation: g,
                expect_heartbeat_ms: if exact { hb } else { hb + 1 },
                owner: who(w),
                stale_after_ms: 20,
                reason: String::new(),
            }
        }
        Op::Note(s, k) => Event::Note { subject: subject(s), generation: skewed(s, k), text: "n".into() },
    }
}

proptest! {
    /// Proves: for any sequence of operations at advancing times, `Projection::apply`
    /// accepts exactly what the plain reference model accepts, and leaves every
    /// subject at the same generation with the same owner.
    #[test]
    fn apply_agrees_with_the_reference_model(steps in prop::collection::vec((op(), 0u64..40), 1..80)) {
        let (mut p, mut r, mut now) = (Projection::default(), Reference::default(), 1_000u64);
        for (i, (op, dt)) in steps.iter().enumerate() {
            now += dt;
            let event = concrete(&r, op);
            let seq = i as u64 + 1;
            let accepted_by_model = r.apply(&event, now);
            let outcome = p.apply(seq, &Txn::new(now, Uuid::nil(), vec![event.clone()]));
            prop_assert_eq!(outcome.is_ok(), accepted_by_model, "step {} {:?}: {:?}", i, event, outcome);
            for name in SUBJECTS {
                let (g, o) = r.subjects.get(name).cloned().unwrap_or_default();
                let s = p.subject(name);
                prop_assert_eq!(s.map_or(0, |s| s.generation), g, "generation of {}", name);
                prop_assert_eq!(
                    s.and_then(|s| s.owner.as_ref()).map(|o| o.identity.instance),
                    o.map(|o| o.0),
                    "owner of {}", name
                );
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    /// Proves: structure-aware mutations (valid segment headers and snapshot files
    /// with bytes changed, truncated or extended) never panic the decoders; a
    /// mutated snapshot is either refused or read back as exactly what its own
    /// checksum vouches for.
    #[test]
    fn mutated_headers_and_snapshot_files_never_panic(
        first_seq in 1u64..u64::MAX,
        link in any::<[u8; 32]>(),
        flips in prop::collection::vec((any::<prop::sample::Index>(), 1u8..=255), 1..4),
        cut in prop::option::of(any::<prop::sample::Index>()),
        extra in prop::collection::vec(any::<u8>(), 0..8),
    ) {
        let mut h = SegmentHeader { version: 1 + (first_seq % 2) as u16, first_seq, prev_link: link }.encode().to_vec();
        for (at, v) in &flips {
            let i = at.index(h.len());
            h[i] ^= v;
        }
        if let Ok(d) = SegmentHeader::decode(&h) {
            prop_assert_eq!(d.encode().to_vec(), h.clone(), "a header that decodes re-encodes to the same bytes");
        }

        let dir = tempfile::tempdir().unwrap();
        let body = snapshot::body_of(&Projection::default());
        let meta = fencelog::storage::snapshots::write(dir.path(), 0, &link, &body).unwrap();
        let path = std::path::PathBuf::from(&meta.source);
        let mut bytes = std::fs::read(&path).unwrap();
        for (at, v) in &flips {
            let i = at.index(bytes.len());
            bytes[i] ^= v;
        }
        if let Some(c) = cut {
            bytes.truncate(c.index(bytes.len() + 1));
        }
        bytes.extend_from_slice(&extra);
        std::fs::write(&path, &bytes).unwrap();
        if let Ok(m) = fencelog::storage::snapshots::peek(&path) {
            // Only a file whose checksum still holds is read, and it reads back whole.
            let b = fencelog::storage::snapshots::body(dir.path(), &m);
            prop_assert!(b.is_err() || fencelog::storage::snapshots::digest_of(&b.unwrap()) == m.digest);
            let _ = snapshot::decode(&body, m.seq);
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]
    /// Proves: `Projection::apply_replayed` (a replay's fast way for plain
    /// heartbeats) leaves exactly the state `apply` leaves — every field, the
    /// anomaly count included — for any mix of operations, heartbeats at stale,
    /// current and future generations, to unknown subjects, with invalid names, with
    /// a request id or a condition (which take `apply`'s way).
    #[test]
    fn replaying_a_record_leaves_the_state_applying_it_leaves(
        steps in prop::collection::vec((op(), 0u64..40, 0u8..12), 1..120)
    ) {
        let (mut applied, mut replayed, mut r, mut now) =
            (Projection::default(), Projection::default(), Reference::default(), 1_000u64);
        for (i, (op, dt, twist)) in steps.iter().enumerate() {
            now += dt;
            let mut event = concrete(&r, op);
            if let Event::Heartbeat { subject, .. } = &mut event {
                match twist {
                    0 => *subject = "bad\u{1}name".into(),
                    1 => *subject = "nobody".into(),
                    _ => {}
                }
            }
            let mut txn = Txn::new(now, Uuid::nil(), vec![event.clone()]);
            match twist {
                2 => txn.request = Some(fencelog::model::RequestTag { id: format!("r{}", i % 5), digest: [*twist; 32] }),
                3 => txn.conditions.push(fencelog::model::Condition::LogAt { seq: i as u64 }),
                _ => {}
            }
            let seq = i as u64 + 1;
            // The reference only steers the choice of generations: it follows what
            // the projection accepted.
            if applied.apply(seq, &txn).is_ok() {
                r.apply(&event, now);
            }
            replayed.apply_replayed(seq, &txn);
            prop_assert_eq!(&replayed, &applied, "step {}: {:?}", i, txn);
        }
    }

    /// Proves: the commit path's `apply_checked` (a transaction `check` just found
    /// valid, applied without judging it again) leaves exactly the state `apply`
    /// leaves, with the same outcomes — over the same mix as above.
    #[test]
    fn applying_a_checked_transaction_leaves_the_state_applying_it_leaves(
        steps in prop::collection::vec((op(), 0u64..40, 0u8..12), 1..120)
    ) {
        let (mut applied, mut checked, mut r, mut now) =
            (Projection::default(), Projection::default(), Reference::default(), 1_000u64);
        for (i, (op, dt, twist)) in steps.iter().enumerate() {
            now += dt;
            let event = concrete(&r, op);
            let mut txn = Txn::new(now, Uuid::nil(), vec![event.clone()]);
            match twist {
                2 => txn.request = Some(fencelog::model::RequestTag { id: format!("r{}", i % 5), digest: [*twist; 32] }),
                // The log's head as the commit path judges it (holds) and a stale one.
                3 => txn.conditions.push(fencelog::model::Condition::LogAt { seq: i as u64 }),
                4 => txn.conditions.push(fencelog::model::Condition::LogAt { seq: (i as u64).saturating_sub(1) }),
                _ => {}
            }
            let seq = i as u64 + 1;
            let expected = applied.apply(seq, &txn);
            if expected.is_ok() {
                r.apply(&event, now);
            }
            match checked.check(seq, &txn) {
                Ok(fencelog::model::Checked::Valid { outcomes, writes: true }) => {
                    prop_assert_eq!(Ok(checked.apply_checked(seq, &txn, outcomes)), expected);
                }
                _ => {
                    let _ = checked.apply(seq, &txn);
                }
            }
            prop_assert_eq!(&checked, &applied, "step {}: {:?}", i, txn);
        }
    }
}
