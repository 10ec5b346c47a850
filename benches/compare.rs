//! Side-by-side durability benchmark, one run, one machine:
//! fencelog vs SQLite (WAL, synchronous=FULL) vs the write-temp/fsync/rename/fsync-dir
//! JSON pattern, plus raw fdatasync of a 4 KiB append and a verifying scan.
//!
//!   cargo bench --bench compare                  # full run, human table
//!   cargo bench --bench compare -- --quick --json  # short run, one JSON object
//!   cargo bench --bench compare -- --scan-only      # the verifying scan alone
//!   cargo bench --bench compare -- --quick --appenders 256   # one async figure alone
//!
//! Throughput runs in rounds (3 quick, 5 full), the contenders alternating within
//! each round, with a burst of raw fdatasyncs at the start of each: every figure is
//! the median of the rounds, reported with its spread (max − min) and each round's
//! value beside the raw fdatasync p50 of that round. A ratio is the median of the
//! rounds' ratios (each taken within one round's weather).
//!
//! Files live under $FENCELOG_BENCH_DIR (default target/bench-tmp) so they are on
//! the disk under test, not a tmpfs.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use fencelog::storage::{Log, LogOptions, verify_dir};
use serde_json::{Value, json};

const RECORD_BYTES: usize = 200;
const CONCURRENCY: [usize; 5] = [1, 8, 64, 256, 1024];

struct Cfg {
    quick: bool,
    latency_samples: usize,
    rounds: usize,
    run: Duration,
    scan_bytes: u64,
    root: PathBuf,
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let quick = args.iter().any(|a| a == "--quick");
    let as_json = args.iter().any(|a| a == "--json");
    let root = std::env::var_os("FENCELOG_BENCH_DIR").map_or_else(|| PathBuf::from("target/bench-tmp"), PathBuf::from);
    std::fs::create_dir_all(&root).expect("bench dir");
    let cfg = Cfg {
        quick,
        latency_samples: if quick { 300 } else { 3000 },
        rounds: if quick { 3 } else { 5 },
        run: Duration::from_millis(if quick { 1000 } else { 2000 }),
        scan_bytes: if quick { 64 << 20 } else { 1 << 30 },
        root,
    };
    if args.iter().any(|a| a == "--scan-only") {
        // Only the verifying scan (1 GiB; 64 MiB with --quick).
        println!("{}", json!({ "machine": machine(), "scan": scan(&cfg) }));
        return;
    }
    // `--appenders 256`: only the fencelog async figure at that fan-in (for
    // profiling one figure; the figures come from a run without it).
    if let Some(k) = args.iter().position(|a| a == "--appenders").and_then(|i| args.get(i + 1)) {
        let k: usize = k.parse().expect("--appenders takes a number");
        let (fl, per_sync) = fencelog_async(&cfg, k);
        println!(
            "{}",
            json!({ "appenders": k, "fencelog_async_per_s": fl.round(), "records_per_sync": round2(per_sync) })
        );
        return;
    }
    let mut out = serde_json::Map::new();
    out.insert("machine".into(), machine());
    out.insert("quick".into(), json!(cfg.quick));
    out.insert("record_bytes".into(), json!(RECORD_BYTES));

    // Interleaved sample by sample, so both see the same disk weather.
    let (raw, single) = latency_pair(cfg.latency_samples, raw_fdatasync_4k(&cfg), fencelog_single(&cfg));
    eprintln!("raw fdatasync 4 KiB append: p50 {:.1} µs", raw.p50_us);
    eprintln!("fencelog single appender: p50 {:.1} µs", single.p50_us);
    out.insert("raw_fdatasync_4k".into(), raw.json());
    out.insert("fencelog_single_appender".into(), single.json());
    out.insert("single_p50_over_raw_p50".into(), json!(round2(single.p50_us / raw.p50_us)));

    let mut through = serde_json::Map::new();
    for &k in &CONCURRENCY {
        // Contenders alternate over several short rounds; each figure is the median.
        const NAMES: [&str; 8] = [
            "fencelog_async_per_s",
            "fencelog_async_records_per_sync",
            "fencelog_threads_per_s",
            "sqlite_wal_full_per_s",
            "rename_json_per_s",
            "fencelog_over_sqlite",
            "fencelog_over_rename",
            "raw_fdatasync_4k_p50_us",
        ];
        let mut runs: [Vec<f64>; 8] = Default::default();
        for _ in 0..cfg.rounds {
            runs[7].push(raw_sync_p50(&cfg));
            let (fl, per_sync) = fencelog_async(&cfg, k);
            runs[0].push(fl);
            runs[1].push(per_sync);
            runs[2].push(fencelog_threads(&cfg, k));
            let sq = sqlite(&cfg, k);
            runs[3].push(sq);
            let rn = rename_pattern(&cfg, k);
            runs[4].push(rn);
            runs[5].push(fl / sq);
            runs[6].push(fl / rn);
        }
        let mut row = serde_json::Map::new();
        let (mut spread, mut per_round) = (serde_json::Map::new(), serde_json::Map::new());
        for (name, v) in NAMES.iter().zip(&runs) {
            let (lo, hi) = v.iter().fold((f64::MAX, f64::MIN), |(a, b), &x| (a.min(x), b.max(x)));
            row.insert((*name).into(), json!(round2(median(v.clone()))));
            spread.insert((*name).into(), json!(round2(hi - lo)));
            per_round.insert((*name).into(), json!(v.iter().map(|&x| round2(x)).collect::<Vec<_>>()));
        }
        row.insert("spread".into(), Value::Object(spread));
        row.insert("per_round".into(), Value::Object(per_round));
        row.insert("rounds".into(), json!(cfg.rounds));
        row.insert("seconds_per_round".into(), json!(cfg.run.as_secs_f64()));
        eprintln!("{k:>2} appenders: {}", Value::Object(row.clone()));
        through.insert(format!("appenders_{k}"), Value::Object(row));
    }
    out.insert("durable_appends".into(), Value::Object(through));
    let scan = scan(&cfg);
    eprintln!("verifying scan: {scan}");
    out.insert("scan".into(), scan);

    let v = Value::Object(out);
    if as_json {
        println!("{v}");
    } else {
        println!("{}", serde_json::to_string_pretty(&v).unwrap());
    }
    let _ = std::fs::remove_dir_all(&cfg.root);
}

fn round2(x: f64) -> f64 {
    (x * 100.0).round() / 100.0
}

fn machine() -> Value {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let model = cpuinfo
        .lines()
        .find_map(|l| l.strip_prefix("model name"))
        .map(|s| s.trim_start_matches([' ', '\t', ':']).to_string());
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    json!({
        "cpu": model,
        "cores": std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0),
        "kernel": kernel.trim(),
    })
}

fn tmp(cfg: &Cfg, name: &str) -> tempfile::TempDir {
    tempfile::Builder::new().prefix(name).tempdir_in(&cfg.root).expect("tempdir")
}

/// A record of `RECORD_BYTES`, made in one allocation (the harness's own work: a
/// `format!` then two resizes cost three allocations per record, a tenth of the
/// CPU at 256 appenders, none of it the contenders').
fn payload(i: u64) -> Vec<u8> {
    use std::io::Write;
    let mut p = Vec::with_capacity(RECORD_BYTES);
    write!(p, "{{\"subject\":\"bench/{i}\",\"seq\":{i},\"pad\":\"").expect("to a Vec");
    p.resize(RECORD_BYTES - 2, b'x');
    p.extend_from_slice(b"\"}");
    debug_assert_eq!(p.capacity(), RECORD_BYTES);
    p
}

struct Lat {
    p50_us: f64,
    p99_us: f64,
    mean_us: f64,
}

impl Lat {
    fn json(&self) -> Value {
        json!({"p50_us": round2(self.p50_us), "p99_us": round2(self.p99_us), "mean_us": round2(self.mean_us)})
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}

fn lat_of(v: Vec<f64>) -> Lat {
    let mean_us = v.iter().sum::<f64>() / v.len() as f64;
    let mut v = v;
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    Lat { p50_us: v[v.len() / 2], p99_us: v[v.len() * 99 / 100], mean_us }
}

/// Time `a` and `b` alternately, `n` samples each, after a short warm-up.
fn latency_pair(n: usize, mut a: impl FnMut(u64), mut b: impl FnMut(u64)) -> (Lat, Lat) {
    for i in 0..50 {
        a(i);
        b(i);
    }
    let (mut va, mut vb) = (Vec::with_capacity(n), Vec::with_capacity(n));
    let time = |op: &mut dyn FnMut(u64), i: u64| {
        let t = Instant::now();
        op(i);
        t.elapsed().as_secs_f64() * 1e6
    };
    for i in 0..n as u64 {
        va.push(time(&mut a, i));
        vb.push(time(&mut b, i));
    }
    (lat_of(va), lat_of(vb))
}

/// The raw fdatasync's p50 over a burst of 50 (the weather of this round).
fn raw_sync_p50(cfg: &Cfg) -> f64 {
    let mut sync = raw_fdatasync_4k(cfg);
    let mut v: Vec<f64> = (0..50)
        .map(|i| {
            let t = Instant::now();
            sync(i);
            t.elapsed().as_secs_f64() * 1e6
        })
        .collect();
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn raw_fdatasync_4k(cfg: &Cfg) -> impl FnMut(u64) {
    let d = tmp(cfg, "raw");
    let f = File::create(d.path().join("raw")).unwrap();
    let block = vec![7u8; 4096];
    let mut off = 0u64;
    move |_| {
        let _keep = &d;
        f.write_all_at(&block, off).unwrap();
        f.sync_data().unwrap();
        off += 4096;
    }
}

fn fencelog_single(cfg: &Cfg) -> impl FnMut(u64) {
    let d = tmp(cfg, "single");
    let log = Log::open(d.path(), LogOptions::default()).unwrap();
    move |i| {
        let _keep = &d;
        log.append(&payload(i)).unwrap();
    }
}

/// Run `k` workers until the deadline; returns completed operations per second.
fn timed_threads(cfg: &Cfg, k: usize, work: impl Fn(usize, &AtomicBool) -> u64 + Sync) -> f64 {
    let stop = AtomicBool::new(false);
    let start = Instant::now();
    let total: u64 = std::thread::scope(|s| {
        let hs: Vec<_> = (0..k)
            .map(|w| {
                s.spawn({
                    let (work, stop) = (&work, &stop);
                    move || work(w, stop)
                })
            })
            .collect();
        std::thread::sleep(cfg.run);
        stop.store(true, Ordering::Relaxed);
        hs.into_iter().map(|h| h.join().unwrap()).sum()
    });
    total as f64 / start.elapsed().as_secs_f64()
}

/// Returns (appends per second, mean records per sync).
fn fencelog_async(cfg: &Cfg, k: usize) -> (f64, f64) {
    let d = tmp(cfg, "async");
    let log = Arc::new(Log::open(d.path(), LogOptions::default()).unwrap());
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let count = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let start = Instant::now();
    rt.block_on(async {
        let tasks: Vec<_> = (0..k)
            .map(|w| {
                let (log, count, stop) = (log.clone(), count.clone(), stop.clone());
                tokio::spawn(async move {
                    let mut i = w as u64 * 1_000_000_000;
                    while !stop.load(Ordering::Relaxed) {
                        log.append_async(payload(i)).await.unwrap();
                        count.fetch_add(1, Ordering::Relaxed);
                        i += 1;
                    }
                })
            })
            .collect();
        tokio::time::sleep(cfg.run).await;
        stop.store(true, Ordering::Relaxed);
        for t in tasks {
            t.await.unwrap();
        }
    });
    let rate = count.load(Ordering::Relaxed) as f64 / start.elapsed().as_secs_f64();
    let fencelog::storage::CommitStats { records, syncs } = log.commit_stats();
    (rate, records as f64 / syncs.max(1) as f64)
}

fn fencelog_threads(cfg: &Cfg, k: usize) -> f64 {
    let d = tmp(cfg, "threads");
    let log = Log::open(d.path(), LogOptions::default()).unwrap();
    timed_threads(cfg, k, |w, stop| {
        let mut n = 0;
        while !stop.load(Ordering::Relaxed) {
            log.append(&payload(w as u64 * 1_000_000_000 + n)).unwrap();
            n += 1;
        }
        n
    })
}

fn sqlite(cfg: &Cfg, k: usize) -> f64 {
    let d = tmp(cfg, "sqlite");
    let path = d.path().join("bench.db");
    let open = |p: &Path| {
        let c = rusqlite::Connection::open(p).unwrap();
        c.busy_timeout(Duration::from_secs(30)).unwrap();
        c.pragma_update(None, "journal_mode", "WAL").unwrap();
        c.pragma_update(None, "synchronous", "FULL").unwrap();
        c
    };
    open(&path).execute("CREATE TABLE log (seq INTEGER PRIMARY KEY, payload BLOB NOT NULL)", []).unwrap();
    timed_threads(cfg, k, |w, stop| {
        let c = open(&path);
        let mut st = c.prepare("INSERT INTO log (payload) VALUES (?1)").unwrap();
        let mut n = 0;
        while !stop.load(Ordering::Relaxed) {
            st.execute([payload(w as u64 * 1_000_000_000 + n)]).unwrap();
            n += 1;
        }
        n
    })
}

/// The seeds' per-mutation pattern: write a temp file, fsync it, rename it over the
/// state file, fsync the directory.
fn rename_pattern(cfg: &Cfg, k: usize) -> f64 {
    let d = tmp(cfg, "rename");
    let dir = d.path().to_path_buf();
    timed_threads(cfg, k, |w, stop| {
        let mut n = 0;
        let target = dir.join(format!("owner-{w}.json"));
        let temp = dir.join(format!(".owner-{w}.json.tmp"));
        while !stop.load(Ordering::Relaxed) {
            let mut f = OpenOptions::new().write(true).create(true).truncate(true).open(&temp).unwrap();
            f.write_all(&payload(n)).unwrap();
            f.sync_all().unwrap();
            std::fs::rename(&temp, &target).unwrap();
            File::open(&dir).unwrap().sync_all().unwrap();
            n += 1;
        }
        n
    })
}

fn scan(cfg: &Cfg) -> Value {
    let d = tmp(cfg, "scan");
    let opts = LogOptions::default();
    let log = Log::open(d.path(), opts.clone()).unwrap();
    let per_batch = 4096u64;
    let mut written = 0u64;
    let mut i = 0u64;
    let build = Instant::now();
    while written < cfg.scan_bytes {
        let batch: Vec<Vec<u8>> = (i..i + per_batch).map(payload).collect();
        written += batch.iter().map(|p| fencelog::format::frame_bytes(p.len()) as u64).sum::<u64>();
        log.append_batch(batch).unwrap();
        i += per_batch;
    }
    let build_s = build.elapsed().as_secs_f64();
    log.close().unwrap();
    let t = Instant::now();
    let s = verify_dir(d.path(), opts.body_max()).unwrap();
    let secs = t.elapsed().as_secs_f64();
    assert!(s.is_intact() && s.records == i, "scan must verify every record");
    // The operator's command on the same log: `fencelog inspect verify` (a process).
    let t = Instant::now();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_fencelog"))
        .args(["inspect", "verify", "--json"])
        .arg(d.path())
        .output()
        .unwrap();
    let cli_secs = t.elapsed().as_secs_f64();
    assert!(out.status.success(), "inspect verify must pass: {}", String::from_utf8_lossy(&out.stdout));
    json!({
        "log_bytes": s.bytes,
        "records": s.records,
        "segments": s.segments,
        "seconds": round2(secs),
        "records_per_s": (s.records as f64 / secs).round(),
        "mb_per_s": round2(s.bytes as f64 / secs / 1e6),
        "build_batched_appends_mb_per_s": round2(s.bytes as f64 / build_s / 1e6),
        "inspect_verify_cli_seconds": round2(cli_secs),
        "inspect_verify_cli_records_per_s": (s.records as f64 / cli_secs).round(),
        "page_cache": "warm (just written)",
    })
}
