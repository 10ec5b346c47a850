//! Where one heartbeat's time goes on etcd, sequentially (one client): a raw
//! compare-and-put `Txn` through the etcd client crate, the etcd backend's
//! `append_if_head` (one `Txn` carrying a frame and the head), and a heartbeat
//! through the embedded ledger (judge, encode, append). `docs/BENCHMARKS.md`
//! ("The daemon with its log in etcd") quotes it.
//!
//!   scripts/etcd-cluster.sh start /tmp/etcd 1      # prints the endpoints
//!   cargo run --release --example etcd-latency -- 127.0.0.1:PORT [COUNT]

use std::time::Instant;

use fencelog::ledger::{Ledger, LedgerOptions};
use fencelog::model::{Event, Identity, Txn};
use fencelog::storage::etcd::{EtcdBackend, EtcdOptions};
use fencelog::storage::{Location, LogBackend};

fn p50(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    let mut args = std::env::args().skip(1);
    let Some(endpoints) = args.next() else {
        eprintln!("usage: etcd-latency HOST:PORT[,HOST:PORT…] [COUNT]");
        std::process::exit(2);
    };
    let count: usize = args.next().and_then(|c| c.parse().ok()).unwrap_or(2000);
    let prefix = format!("/etcd-latency/{}/", uuid::Uuid::new_v4().simple());

    // The backend alone: frames appended at the head, one at a time.
    let raw_log = EtcdOptions::parse(&endpoints, &format!("{prefix}backend/")).expect("endpoints");
    EtcdBackend::init(&raw_log).expect("init");
    let backend =
        EtcdBackend::open(&raw_log, &Location::Etcd(raw_log.clone()).log_options(Default::default())).expect("open");
    let first = backend.head().expect("head").seq;
    let mut lat = Vec::with_capacity(count);
    for head in first..first + count as u64 {
        let t = Instant::now();
        backend.append_if_head(head, vec![vec![0u8; 100]]).expect("append");
        lat.push(t.elapsed().as_secs_f64() * 1e6);
    }
    let backend_p50 = p50(lat);
    drop(backend);

    // A heartbeat through the ledger.
    let ledger_log = EtcdOptions::parse(&endpoints, &format!("{prefix}ledger/")).expect("endpoints");
    EtcdBackend::init(&ledger_log).expect("init");
    let ledger = Ledger::open_at(&Location::Etcd(ledger_log), LedgerOptions::default()).expect("ledger");
    let owner = Identity {
        pid: std::process::id(),
        start_ticks: 0,
        boot_id: String::new(),
        exe: "etcd-latency".into(),
        instance: uuid::Uuid::new_v4(),
    };
    ledger
        .submit(None, move |_, now_ms, w| {
            let claim = Event::Claim {
                subject: "s".into(),
                owner: owner.clone(),
                stale_after_ms: 60_000,
                lock: None,
                previous: None,
            };
            Ok(Txn::new(now_ms, w, vec![claim]))
        })
        .expect("claim");
    let mut lat = Vec::with_capacity(count);
    for _ in 0..count {
        let t = Instant::now();
        ledger
            .submit(None, |p, now_ms, w| {
                let generation = p.subject("s").expect("claimed").generation;
                Ok(Txn::new(now_ms, w, vec![Event::Heartbeat { subject: "s".into(), generation }]))
            })
            .expect("heartbeat");
        lat.push(t.elapsed().as_secs_f64() * 1e6);
    }
    let ledger_p50 = p50(lat);
    drop(ledger);

    // The raw equivalent: compare a key's revision, put it.
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().expect("runtime");
    let key = format!("{prefix}raw");
    let raw_p50 = rt.block_on(async move {
        use etcd_client::{Client, Compare, CompareOp, Txn as EtcdTxn, TxnOp};
        let eps: Vec<String> = endpoints.split(',').map(str::to_owned).collect();
        let mut c = Client::connect(eps, None).await.expect("connect");
        let (mut rev, mut lat) = (0i64, Vec::with_capacity(count));
        for _ in 0..count {
            let txn = EtcdTxn::new()
                .when([Compare::mod_revision(key.as_str(), CompareOp::Equal, rev)])
                .and_then([TxnOp::put(key.as_str(), vec![0u8; 300], None)]);
            let t = Instant::now();
            let r = c.txn(txn).await.expect("txn");
            rev = r.header().map_or(0, |h| h.revision());
            lat.push(t.elapsed().as_secs_f64() * 1e6);
        }
        p50(lat)
    });
    println!(
        "{}",
        serde_json::json!({
            "count": count,
            "raw_txn_p50_us": raw_p50.round(),
            "backend_append_p50_us": backend_p50.round(),
            "ledger_heartbeat_p50_us": ledger_p50.round(),
        })
    );
}
