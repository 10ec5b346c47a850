//! What a snapshot's copy of the state costs: the ledger clones its projection
//! under the commit engine's mutex before a background thread encodes and writes
//! it, so every request waits that long once per snapshot (docs/BENCHMARKS.md).
//!
//!   cargo run --release --example projection-clone [SUBJECTS]
//!
//! Builds a ledger under `target/bench-tmp` the way a busy daemon's looks: SUBJECTS
//! (default 100,000) remote owners, each claim with a request id (100,000 is the
//! bound on remembered ids), then times five clones of the projection and the
//! drop of each (the drop happens on the snapshot's thread, off the mutex).

use std::time::Instant;

use fencelog::ledger::{Ledger, LedgerOptions};
use fencelog::ops::{Caller, ClaimRequest, claim};

const THREADS: u64 = 16;

fn main() {
    let n: u64 = std::env::args().nth(1).map_or(100_000, |a| a.parse().expect("SUBJECTS"));
    std::fs::create_dir_all("target/bench-tmp").expect("target/bench-tmp");
    let tmp = tempfile::Builder::new().prefix("projection-clone").tempdir_in("target/bench-tmp").expect("tempdir");
    let mut opts = LedgerOptions::default();
    opts.log.create = true;
    let ledger = Ledger::open(tmp.path(), opts).expect("ledger");
    let t = Instant::now();
    std::thread::scope(|s| {
        for th in 0..THREADS {
            let ledger = &ledger;
            s.spawn(move || {
                for i in (th..n).step_by(THREADS as usize) {
                    let req = ClaimRequest {
                        subject: format!("svc/{i}"),
                        pid: None,
                        instance: Some(uuid::Uuid::new_v4()),
                        stale_after_ms: 60_000,
                        action: None,
                        request_id: Some(uuid::Uuid::new_v4().to_string()),
                    };
                    claim(ledger, &req, Caller { default_pid: None, remote: true }).expect("claim");
                }
            });
        }
    });
    let p = ledger.refresh().expect("state");
    println!(
        "built {n} claims in {:.1} s: {} subjects, {} request ids, {} entries",
        t.elapsed().as_secs_f64(),
        p.subjects().len(),
        p.requests().len(),
        p.entries()
    );
    drop(p);
    for _ in 0..5 {
        let t = Instant::now();
        let p = ledger.refresh().expect("state");
        let clone_ms = t.elapsed().as_secs_f64() * 1e3;
        let t = Instant::now();
        drop(p);
        println!("clone {clone_ms:.1} ms, drop {:.1} ms", t.elapsed().as_secs_f64() * 1e3);
    }
}
