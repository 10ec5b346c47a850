//! Property tests of the state machine: replay is deterministic and generations
//! only go up.

use fencelog::model::*;
use proptest::prelude::*;
use uuid::Uuid;

const SUBJECTS: [&str; 3] = ["home/a", "run/b", "lock/c"];

fn who(n: u8) -> Identity {
    Identity {
        instance: Uuid::from_bytes([n; 16]),
        pid: n as u32,
        start_ticks: 1,
        boot_id: "b".into(),
        exe: "e".into(),
    }
}

/// An abstract operation, made concrete against the current projection so that a
/// fair share of them are valid.
#[derive(Debug, Clone)]
enum Op {
    Claim { s: usize, who: u8, dead: bool, lock: Option<u8> },
    Heartbeat { s: usize, skew: i8 },
    Release { s: usize, skew: i8 },
    Rotate { s: usize, skew: i8 },
    Takeover { s: usize, who: u8, exact: bool },
    Note { s: usize, skew: i8 },
    Acquire { r: u8, write: bool, ttl: u16 },
    LeaseRelease { lease: u8, right_token: bool },
}

fn op() -> impl Strategy<Value = Op> {
    let s = 0..SUBJECTS.len();
    let skew = -1i8..=1;
    prop_oneof![
        (s.clone(), 1u8..4, any::<bool>(), prop::option::of(0u8..3)).prop_map(|(s, who, dead, lock)| Op::Claim {
            s,
            who,
            dead,
            lock
        }),
        (s.clone(), skew.clone()).prop_map(|(s, skew)| Op::Heartbeat { s, skew }),
        (s.clone(), skew.clone()).prop_map(|(s, skew)| Op::Release { s, skew }),
        (s.clone(), skew.clone()).prop_map(|(s, skew)| Op::Rotate { s, skew }),
        (s.clone(), 1u8..4, any::<bool>()).prop_map(|(s, who, exact)| Op::Takeover { s, who, exact }),
        (s, skew).prop_map(|(s, skew)| Op::Note { s, skew }),
        (0u8..2, any::<bool>(), 1u16..3000).prop_map(|(r, write, ttl)| Op::Acquire { r, write, ttl }),
        (1u8..6, any::<bool>()).prop_map(|(lease, right_token)| Op::LeaseRelease { lease, right_token }),
    ]
}

fn concrete(p: &Projection, op: &Op) -> Event {
    let gen_of = |s: usize, skew: i8| {
        let g = p.subject(SUBJECTS[s]).map_or(0, |x| x.generation);
        g.saturating_add_signed(skew as i64)
    };
    match op {
        Op::Claim { s, who: w, dead, lock } => Event::Claim {
            subject: SUBJECTS[*s].into(),
            owner: who(*w),
            stale_after_ms: 500,
            lock: lock.map(|l| LockIntent { action: "act".into(), request: format!("req-{l}") }),
            previous: if *dead { p.dead_owner(SUBJECTS[*s], DeathReason::ProcessDead) } else { None },
        },
        Op::Heartbeat { s, skew } => Event::Heartbeat { subject: SUBJECTS[*s].into(), generation: gen_of(*s, *skew) },
        Op::Release { s, skew } => Event::Release { subject: SUBJECTS[*s].into(), generation: gen_of(*s, *skew) },
        Op::Rotate { s, skew } => Event::RotateFence { subject: SUBJECTS[*s].into(), generation: gen_of(*s, *skew) },
        Op::Note { s, skew } => {
            Event::Note { subject: SUBJECTS[*s].into(), generation: gen_of(*s, *skew), text: "n".into() }
        }
        Op::Takeover { s, who: w, exact } => {
            let cur = p.subject(SUBJECTS[*s]);
            let hb = cur.and_then(|x| x.owner.as_ref()).map_or(0, |o| o.heartbeat_ms);
            Event::Takeover {
                subject: SUBJECTS[*s].into(),
                expect_generation: gen_of(*s, 0),
                expect_heartbeat_ms: if *exact { hb } else { hb + 1 },
                owner: who(*w),
                stale_after_ms: 500,
                reason: String::new(),
            }
        }
        Op::Acquire { r, write, ttl } => Event::LeaseAcquire {
            resource: format!("res/{r}"),
            mode: if *write { LeaseMode::Write } else { LeaseMode::Read },
            holder: "h".into(),
            ttl_ms: *ttl as u64,
        },
        Op::LeaseRelease { lease, right_token } => {
            let token = p.leases().get(&(*lease as u64)).map_or(1, |l| l.token);
            Event::LeaseRelease { lease: *lease as u64, token: if *right_token { token } else { token + 50 } }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 200, ..ProptestConfig::default() })]

    /// Proves: for random transaction sequences, the projection built incrementally
    /// (check then apply, as the ledger does) equals a full replay of the committed
    /// records and equals snapshot (serialized as the ledger does) + tail replay;
    /// and no subject's generation ever decreases.
    #[test]
    fn replay_incremental_and_snapshot_plus_tail_agree(
        ops in prop::collection::vec((op(), 0u64..700, prop::option::of(0u8..4)), 1..120),
        split in any::<prop::sample::Index>(),
    ) {
        let mut live = Projection::default();
        let mut committed: Vec<(u64, Txn)> = vec![];
        let mut time_ms = 0;
        for (op, dt, req) in &ops {
            time_ms += dt;
            let txn = Txn {
                request: req.map(|r| RequestTag { id: format!("id-{r}"), digest: [r; 32] }),
                time_ms,
                writer: Uuid::nil(),
                conditions: vec![],
                events: vec![concrete(&live, op)],
            };
            let seq = live.last_seq() + 1;
            let before: Vec<u64> = SUBJECTS.iter().map(|s| live.subject(s).map_or(0, |x| x.generation)).collect();
            if let Ok(Checked::Valid { writes: true, .. }) = live.check(seq, &txn) {
                live.apply(seq, &txn).unwrap();
                committed.push((seq, txn));
            }
            for (i, s) in SUBJECTS.iter().enumerate() {
                prop_assert!(live.subject(s).map_or(0, |x| x.generation) >= before[i], "generation of {} went down", s);
            }
        }
        let mut replayed = Projection::default();
        for (seq, txn) in &committed {
            replayed.apply(*seq, txn).unwrap();
        }
        prop_assert_eq!(&replayed, &live);
        prop_assert_eq!(live.anomalies(), 0);

        let k = split.index(committed.len() + 1);
        let mut head = Projection::default();
        for (seq, txn) in &committed[..k] {
            head.apply(*seq, txn).unwrap();
        }
        let bytes = bincode::serde::encode_to_vec(&head, bincode::config::standard()).unwrap();
        let (mut from_snapshot, _): (Projection, usize) = bincode::serde::decode_from_slice(&bytes, bincode::config::standard()).unwrap();
        for (seq, txn) in &committed[k..] {
            from_snapshot.apply(*seq, txn).unwrap();
        }
        prop_assert_eq!(&from_snapshot, &live);

        // Every committed record survives the payload codec unchanged.
        for (_, txn) in &committed {
            prop_assert_eq!(&decode_txn(&encode_txn(txn)).unwrap(), txn);
        }
    }
}
