//! Ledger benchmarks: replay rate, boot with a snapshot, peak memory of a replay,
//! and compare-and-append from 1 and 4 processes and from 16 and 64 threads of one process.
//!
//!   cargo bench --bench replay                   # 10 million records
//!   cargo bench --bench replay -- --quick --json   # 500 thousand, one JSON object
//!   cargo bench --bench replay -- --cas-4-only      # only 4 processes' compare-and-append
//!
//! Replays and compare-and-append clients run in child processes (this binary
//! re-executed), so peak memory (ru_maxrss) is that of the replay alone.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use fencelog::ledger::{Ledger, LedgerOptions};
use fencelog::model::{Event, Txn};
use serde_json::{Value, json};

mod common;

use common::{SUBJECTS, build_log, me, subject};

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if let Some(i) = args.iter().position(|a| a == "--replay-child") {
        return replay_child(Path::new(&args[i + 1]));
    }
    if let Some(i) = args.iter().position(|a| a == "--cas-child") {
        return cas_child(Path::new(&args[i + 1]), &args[i + 2], args[i + 3].parse().unwrap());
    }
    if let Some(i) = args.iter().position(|a| a == "--build-only") {
        // A log to profile a replay on: `--build-only DIR RECORDS`, then
        // `--replay-child DIR` under a profiler.
        let bytes = build_log(Path::new(&args[i + 1]), args[i + 2].parse().unwrap());
        eprintln!("built {} records ({:.0} MB) in {}", args[i + 2], bytes as f64 / 1e6, args[i + 1]);
        return;
    }
    let quick = args.iter().any(|a| a == "--quick");
    let as_json = args.iter().any(|a| a == "--json");
    if args.iter().any(|a| a == "--cas-4-only") {
        // Only the 4-process turn-taking figure (repeatable in seconds).
        let root =
            std::env::var_os("FENCELOG_BENCH_DIR").map_or_else(|| PathBuf::from("target/bench-tmp"), PathBuf::from);
        std::fs::create_dir_all(&root).unwrap();
        let tmp = tempfile::Builder::new().prefix("cas4").tempdir_in(&root).unwrap();
        let cas4 = cas(&tmp.path().join("cas"), 4, if quick { 300 } else { 2_000 });
        println!("{cas4}");
        return;
    }
    let records: u64 = if quick { 500_000 } else { 10_000_000 };
    let root = std::env::var_os("FENCELOG_BENCH_DIR").map_or_else(|| PathBuf::from("target/bench-tmp"), PathBuf::from);
    std::fs::create_dir_all(&root).unwrap();
    let tmp = tempfile::Builder::new().prefix("replay").tempdir_in(&root).unwrap();
    let dir = tmp.path().join("log");

    let t = Instant::now();
    let bytes = build_log(&dir, records);
    eprintln!("built {records} records ({:.0} MB) in {:.1} s", bytes as f64 / 1e6, t.elapsed().as_secs_f64());

    let full = child(&["--replay-child", dir.to_str().unwrap()]);
    eprintln!("full replay: {full}");
    // Snapshot the state, add a tail, boot again.
    let l = Ledger::open(&dir, LedgerOptions::default()).unwrap();
    l.snapshot_now().unwrap();
    drop(l);
    append_tail(&dir, 1_000);
    let boot = child(&["--replay-child", dir.to_str().unwrap()]);
    eprintln!("boot with snapshot: {boot}");

    // The log just built (66 MB quick, 1.3 GB full) is still being written back:
    // flushed now, so that its writeback does not land in the latencies below (one
    // quick run's 4 processes all showed a p99 of 15 ms from it, in the same ms).
    let _ = Command::new("sync").status();
    let cas_dir = tmp.path().join("cas");
    let ops = if quick { 300 } else { 2_000 };
    let cas1 = cas(&cas_dir, 1, ops);
    eprintln!("compare-and-append, 1 process: {cas1}");
    let cas4 = cas(&cas_dir, 4, ops);
    eprintln!("compare-and-append, 4 processes: {cas4}");
    let cas_threads = cas_in_threads(&tmp.path().join("cas-threads"), 16, ops);
    eprintln!("compare-and-append, 16 threads of 1 process: {cas_threads}");
    let cas_threads_64 = cas_in_threads(&tmp.path().join("cas-threads-64"), 64, ops);
    eprintln!("compare-and-append, 64 threads of 1 process: {cas_threads_64}");

    let out = json!({
        "quick": quick,
        "records": records,
        "subjects": SUBJECTS,
        "log_bytes": bytes,
        "full_replay": full,
        "boot_with_snapshot": boot,
        "cas_1_process": cas1,
        "cas_4_processes": cas4,
        "cas_16_threads_1_process": cas_threads,
        "cas_64_threads_1_process": cas_threads_64,
    });
    if as_json {
        println!("{out}");
    } else {
        println!("{}", serde_json::to_string_pretty(&out).unwrap());
    }
}

fn append_tail(dir: &Path, n: u64) {
    let l = Ledger::open(dir, LedgerOptions::default()).unwrap();
    for k in 0..n {
        let s = subject(k % SUBJECTS);
        l.submit(None, |p, now_ms, writer| {
            let g = p.subject(&s).unwrap().generation;
            Ok(Txn::new(now_ms, writer, vec![Event::Heartbeat { subject: s.clone(), generation: g }]))
        })
        .unwrap();
    }
}

fn child(args: &[&str]) -> Value {
    let out = Command::new(std::env::current_exe().unwrap()).args(args).output().unwrap();
    assert!(out.status.success(), "child failed: {}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap()
}

fn max_rss_mb() -> f64 {
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: getrusage writes into the struct we own.
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) };
    ru.ru_maxrss as f64 / 1024.0
}

fn replay_child(dir: &Path) {
    let t = Instant::now();
    let l = Ledger::open(dir, LedgerOptions::default()).unwrap();
    let secs = t.elapsed().as_secs_f64();
    let r = l.open_report();
    let p = l.projection();
    assert_eq!((p.anomalies(), p.undecodable()), (0, 0), "every record must apply");
    println!(
        "{}",
        json!({
            "open_seconds": (secs * 1000.0).round() / 1000.0,
            "last_seq": p.last_seq(),
            "snapshot_seq": r.snapshot_seq,
            "replayed_records": r.replayed_records,
            "replay_records_per_s": (r.replayed_records as f64 / secs).round(),
            "subjects": p.subjects().len(),
            "peak_rss_mb": (max_rss_mb() * 10.0).round() / 10.0,
        })
    );
}

/// `n` processes, each claiming its own subject then heartbeating `ops` times
/// through the ledger (compare-and-append against every other process).
fn cas(dir: &Path, n: usize, ops: u64) -> Value {
    let t = Instant::now();
    let kids: Vec<_> = (0..n)
        .map(|k| {
            Command::new(std::env::current_exe().unwrap())
                .args(["--cas-child", dir.to_str().unwrap(), &format!("cas/{n}/{k}"), &ops.to_string()])
                .stdout(std::process::Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    let results: Vec<Value> =
        kids.into_iter().map(|c| serde_json::from_slice(&c.wait_with_output().unwrap().stdout).unwrap()).collect();
    let secs = t.elapsed().as_secs_f64();
    let p50: Vec<f64> = results.iter().map(|r| r["p50_us"].as_f64().unwrap()).collect();
    let p99: Vec<f64> = results.iter().map(|r| r["p99_us"].as_f64().unwrap()).collect();
    json!({
        "processes": n,
        "ops_per_process": ops,
        "txn_per_s": ((n as u64 * ops) as f64 / secs).round(),
        "p50_us_per_process": p50,
        "p99_us_per_process": p99,
        // Fairness: the worst process's p99 over its own p50.
        "worst_p99_over_p50": p50.iter().zip(&p99).map(|(a, b)| (b / a * 10.0).round() / 10.0).fold(0.0, f64::max),
    })
}

/// `threads` threads of this process sharing one ledger, each claiming its own
/// subject then heartbeating `ops` times (the ledger's group commit shares syncs).
fn cas_in_threads(dir: &Path, threads: usize, ops: u64) -> Value {
    let l = Ledger::open(dir, LedgerOptions::default()).unwrap();
    let t = Instant::now();
    let mut lat: Vec<f64> = std::thread::scope(|sc| {
        let hs: Vec<_> = (0..threads)
            .map(|k| {
                let l = &l;
                sc.spawn(move || heartbeats(l, &format!("threads/{k}"), ops))
            })
            .collect();
        hs.into_iter().flat_map(|h| h.join().unwrap()).collect()
    });
    let secs = t.elapsed().as_secs_f64();
    let fencelog::storage::CommitStats { records: appended, syncs } = l.commit_stats();
    lat.sort_by(|a, b| a.partial_cmp(b).unwrap());
    json!({
        "threads": threads,
        "ops_per_thread": ops,
        "txn_per_s": ((threads as u64 * (ops + 1)) as f64 / secs).round(),
        "records_per_sync": (appended as f64 / syncs.max(1) as f64 * 10.0).round() / 10.0,
        "p50_us": lat[lat.len() / 2].round(),
        "p99_us": lat[lat.len() * 99 / 100].round(),
    })
}

fn cas_child(dir: &Path, s: &str, ops: u64) {
    let l = Ledger::open(dir, LedgerOptions::default()).unwrap();
    let mut lat = heartbeats(&l, s, ops);
    lat.sort_by(|a, b| a.partial_cmp(b).unwrap());
    println!("{}", json!({"p50_us": lat[lat.len() / 2].round(), "p99_us": lat[lat.len() * 99 / 100].round()}));
}

/// Claim `s`, then heartbeat it `ops` times; the heartbeat latencies in µs.
fn heartbeats(l: &Ledger, s: &str, ops: u64) -> Vec<f64> {
    let owner = me();
    l.submit(None, |_p, now_ms, writer| {
        Ok(Txn::new(
            now_ms,
            writer,
            vec![Event::Claim {
                subject: s.into(),
                owner: owner.clone(),
                stale_after_ms: 60_000,
                lock: None,
                previous: None,
            }],
        ))
    })
    .unwrap();
    let mut lat = Vec::with_capacity(ops as usize);
    for _ in 0..ops {
        let t = Instant::now();
        l.submit(None, |p, now_ms, writer| {
            let g = p.subject(s).unwrap().generation;
            Ok(Txn::new(now_ms, writer, vec![Event::Heartbeat { subject: s.into(), generation: g }]))
        })
        .unwrap();
        lat.push(t.elapsed().as_secs_f64() * 1e6);
    }
    lat
}
