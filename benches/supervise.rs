//! Supervision overhead, one run, one machine: `/bin/true` spawned and waited for
//! directly, versus run through fencelog (intent recorded, a runner in its own
//! session, the start and the exit recorded, the answer read back from the log),
//! and runs per second with 16 concurrent callers. A raw fdatasync of a small
//! append is measured beside them: every run makes three durable records (intent,
//! start, exit).
//!
//! Two ways through fencelog, interleaved sample by sample: as the daemon and an
//! embedding program run commands (a spare runner, started ahead and with its log
//! open, is handed the run: `supervisor::Spares`; the sample waits until the
//! spare is ready, so its start-up never overlaps another measurement), and as
//! `fencelog run` does (a fresh runner started for the run: the top-level
//! `fresh_runner` figures). The 16 callers share one `Spares`, as a daemon's
//! requests do.
//!
//!   cargo bench --bench supervise                   # full run
//!   cargo bench --bench supervise -- --quick --json # short run, one JSON object
//!       # (the runs start a copy of this build's fencelog, as a user's
//!       # installed binary is a copy; --as-linked: the file cargo wrote)
//!   cargo bench --bench supervise -- --quick --runner-a OTHER/fencelog [--spares]
//!       # paired A/B of runner binaries: OTHER's runner against this build's,
//!       # alternated sample by sample under the same caller (this build's);
//!       # fresh runners, or with --spares each side's spare (ready) runners;
//!       # with --long-log on the log of `--log-records` records
//!   cargo bench --bench supervise -- --quick --cli-a OTHER/fencelog [--long-log | --on-log DIR]
//!       [--sleep-ms N] [--timeout-ms N] [--samples N]
//!       # paired A/B of the `fencelog run` command: OTHER's against this
//!       # build's, alternated sample by sample on one log (a new one, the long
//!       # one, or the existing log in DIR, which the runs append to); the
//!       # command is /bin/true, or /bin/sleep for N ms, run with --timeout-ms
//!       # if given (41 samples each with --sleep-ms, unless --samples)
//!
//! And the `fencelog run` command itself (`fencelog_run_cli`): the program a
//! user types, its own start and its log's replay included, whose runner is a
//! fork of it (a library caller with threads, like this bench, execs its
//! runners).
//!
//! The fresh runner is also measured on a log of 1,000,000 records
//! (`--log-records N`; written straight to storage, then snapshotted as the
//! ledger does every 10,000 records), interleaved with the others: a runner's
//! cost must not follow the log's length. The samples are taken in 3 rounds;
//! each round's p50s are reported beside the raw fdatasync of that round, with
//! their median and spread (max − min).
//!
//! Files live under $FENCELOG_BENCH_DIR (default target/bench-tmp).

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use fencelog::ledger::{Ledger, LedgerOptions};
use fencelog::supervisor::{self, RunRequest, Spares};
use serde_json::json;

mod common;

const FENCELOG: &str = env!("CARGO_BIN_EXE_fencelog");

fn percentile(sorted: &[f64], q: f64) -> f64 {
    sorted[((sorted.len() as f64 - 1.0) * q).round() as usize]
}

fn stats(mut us: Vec<f64>) -> serde_json::Value {
    us.sort_by(f64::total_cmp);
    json!({
        "samples": us.len(),
        "p50_ms": round3(percentile(&us, 0.5) / 1000.0),
        "p99_ms": round3(percentile(&us, 0.99) / 1000.0),
    })
}

fn round3(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}

fn request() -> RunRequest {
    RunRequest {
        command: vec!["/bin/true".into()],
        wait_ms: 10_000,
        output_bytes_max: supervisor::OUTPUT_BYTES_MAX_DEFAULT,
        ..Default::default()
    }
}

/// How long a sample waits for the spare runner to be ready (its log open).
const SPARE_READY_WAIT: Duration = Duration::from_secs(10);

/// One run through fencelog whose runner is started from `runner_exe` (or is the
/// spare of `spares`, when one is ready).
fn run_with(ledger: &Ledger, dir: &Path, runner_exe: &Path, spares: Option<&Spares>) -> f64 {
    let t = Instant::now();
    let never = std::sync::atomic::AtomicBool::new(false);
    let v = supervisor::run_until(ledger, dir, &request(), runner_exe, &never, spares).expect("run");
    assert_eq!(v.status.as_str(), "succeeded", "{v:?}");
    t.elapsed().as_secs_f64() * 1e6
}

/// One `fencelog run --dir DIR -- /bin/true` of the `fencelog` binary at `exe`,
/// the command a user types: its own start, its log's open and replay, the
/// intent, its runner (a fork of it), the answer printed.
fn cli_once_of(exe: &Path, dir: &Path) -> f64 {
    cli_command_once(exe, dir, &CliCommand::default())
}

/// What the paired `fencelog run` A/B runs: `/bin/true`, or `/bin/sleep` for
/// `sleep_ms` (`--sleep-ms N`), with `--timeout-ms` if `timeout_ms` is set
/// (`--timeout-ms N`: the runner then waits for the command under a timeout).
#[derive(Default)]
struct CliCommand {
    sleep_ms: Option<u64>,
    timeout_ms: Option<u64>,
}

fn cli_command_once(exe: &Path, dir: &Path, c: &CliCommand) -> f64 {
    let mut cmd = Command::new(exe);
    cmd.args(["run", "--dir"]).arg(dir);
    if let Some(t) = c.timeout_ms {
        cmd.args(["--timeout-ms", &t.to_string()]);
    }
    match c.sleep_ms {
        Some(ms) => cmd.args(["--", "/bin/sleep", &format!("{}.{:03}", ms / 1000, ms % 1000)]),
        None => cmd.args(["--", "/bin/true"]),
    };
    let t = Instant::now();
    let s = cmd.stdout(std::process::Stdio::null()).status().expect("spawn fencelog run");
    assert!(s.success());
    t.elapsed().as_secs_f64() * 1e6
}

fn direct_once() -> f64 {
    let t = Instant::now();
    let s = Command::new("/bin/true").status().expect("spawn");
    assert!(s.success());
    t.elapsed().as_secs_f64() * 1e6
}

fn fdatasync_once(f: &mut std::fs::File) -> f64 {
    let t = Instant::now();
    f.write_all(&[b'x'; 200]).unwrap();
    f.sync_data().unwrap();
    t.elapsed().as_secs_f64() * 1e6
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let quick = args.iter().any(|a| a == "--quick");
    let as_json = args.iter().any(|a| a == "--json");
    let other_binary = |flag: &str| {
        args.iter().position(|x| x == flag).map(|i| {
            args.get(i + 1).filter(|a| !a.starts_with("--")).unwrap_or_else(|| {
                eprintln!("{flag} needs the path of another fencelog binary");
                std::process::exit(2)
            })
        })
    };
    let (runner_a, cli_a) = (other_binary("--runner-a"), other_binary("--cli-a"));
    let root = std::env::var_os("FENCELOG_BENCH_DIR").map_or_else(|| PathBuf::from("target/bench-tmp"), PathBuf::from);
    std::fs::create_dir_all(&root).expect("bench dir");
    let root = std::path::absolute(root).unwrap();
    let samples = if quick { 201 } else { 1002 };
    let log_records: u64 = args
        .iter()
        .position(|a| a == "--log-records")
        .map_or(1_000_000, |i| args.get(i + 1).and_then(|n| n.parse().ok()).expect("--log-records N"));
    let tmp = tempfile::Builder::new().prefix("supervise").tempdir_in(&root).unwrap();
    let dir = tmp.path().join("log");
    let ledger = Ledger::open(&dir, LedgerOptions::default()).unwrap();
    if let Some(a) = cli_a {
        let on_log =
            args.iter().position(|a| a == "--on-log").map(|i| PathBuf::from(args.get(i + 1).expect("--on-log DIR")));
        let dir = if let Some(d) = on_log {
            d
        } else if args.iter().any(|a| a == "--long-log") {
            let big_dir = tmp.path().join("big");
            drop(long_log(&big_dir, log_records));
            big_dir
        } else {
            dir
        };
        drop(ledger);
        let number = |flag: &str| {
            args.iter().position(|a| a == flag).map(|i| args.get(i + 1).and_then(|n| n.parse().ok()).expect(flag))
        };
        let c = CliCommand { sleep_ms: number("--sleep-ms"), timeout_ms: number("--timeout-ms") };
        // A command that sleeps is timed fewer times (`--samples N`, else 41).
        let samples = number("--samples").map_or(if c.sleep_ms.is_some() { 41 } else { samples }, |n| n as usize);
        paired_clis(&dir, Path::new(a), &copy_of_this_build(tmp.path()), samples, &c, as_json);
        return;
    }
    if let Some(a) = runner_a {
        let spares = args.iter().any(|a| a == "--spares");
        if args.iter().any(|a| a == "--long-log") {
            let big_dir = tmp.path().join("big");
            let big = long_log(&big_dir, log_records);
            paired_runners(&big, &big_dir, Path::new(a), &copy_of_this_build(tmp.path()), samples, spares, as_json);
        } else {
            paired_runners(&ledger, &dir, Path::new(a), &copy_of_this_build(tmp.path()), samples, spares, as_json);
        }
        return;
    }
    let mut raw = std::fs::File::create(tmp.path().join("raw")).unwrap();
    let big_dir = tmp.path().join("big");
    let big = long_log(&big_dir, log_records);

    // Interleaved sample by sample, so all four see the same machine weather. A
    // spare runner starting up never runs beside a measurement: each sample waits
    // until the one started after the last spare run is ready.
    let spares = Spares::new();
    // The binary the runs start, as a user's installed copy would be (see
    // `copy_of_this_build`); `--as-linked`: the file the linker wrote.
    let installed = copy_of_this_build(tmp.path());
    let exe = if args.iter().any(|a| a == "--as-linked") { Path::new(FENCELOG) } else { installed.as_path() };
    let ready = |spares: &Spares| assert!(spares.wait_ready(&dir, exe, SPARE_READY_WAIT), "a spare runner is ready");
    let (mut direct, mut through, mut fresh, mut fresh_big, mut sync) = (vec![], vec![], vec![], vec![], vec![]);
    let mut cli = vec![];
    for _ in 0..10 {
        run_with(&ledger, &dir, exe, None);
        run_with(&big, &big_dir, exe, None);
        run_with(&ledger, &dir, exe, Some(&spares));
        cli_once_of(exe, &dir);
    }
    for _ in 0..samples {
        ready(&spares);
        direct.push(direct_once());
        through.push(run_with(&ledger, &dir, exe, Some(&spares)));
        ready(&spares);
        fresh.push(run_with(&ledger, &dir, exe, None));
        fresh_big.push(run_with(&big, &big_dir, exe, None));
        cli.push(cli_once_of(exe, &dir));
        sync.push(fdatasync_once(&mut raw));
    }
    let med = |v: &[f64]| {
        let mut s = v.to_vec();
        s.sort_by(f64::total_cmp);
        (percentile(&s, 0.5), percentile(&s, 0.99))
    };
    let ((d50, d99), (t50, t99), (f50, _), (b50, _), (s50, _)) =
        (med(&direct), med(&through), med(&fresh), med(&fresh_big), med(&sync));
    let rounds = rounds_of(
        &direct,
        &[
            ("spare_runner", &through),
            ("fresh_runner", &fresh),
            ("fresh_runner_long_log", &fresh_big),
            ("fencelog_run_cli", &cli),
        ],
        &sync,
    );

    // 16 callers, each with its own ledger handle (as 16 callers would be).
    let callers = 16;
    let run_for = Duration::from_millis(if quick { 3000 } else { 10_000 });
    let done = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let threads: Vec<_> = (0..callers)
        .map(|_| {
            let (dir, done, spares, exe) = (dir.clone(), Arc::clone(&done), spares.clone(), exe.to_path_buf());
            std::thread::spawn(move || {
                let l = Ledger::open(&dir, LedgerOptions::default()).unwrap();
                while start.elapsed() < run_for {
                    run_with(&l, &dir, &exe, Some(&spares));
                    done.fetch_add(1, Ordering::Relaxed);
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let runs_per_s = done.load(Ordering::Relaxed) as f64 / start.elapsed().as_secs_f64();

    // One way through fencelog: its samples, and its overheads above the direct
    // spawn (p50, p99, and p50 less the two syncs every run makes).
    let path_figures = |runner: &str, v: Vec<f64>| {
        let (p50, p99) = med(&v);
        json!({
            "runner": runner,
            "through_fencelog": stats(v),
            "overhead_p50_ms": round3((p50 - d50) / 1000.0),
            "overhead_p99_ms": round3((p99 - d99) / 1000.0),
            "overhead_p50_minus_two_fdatasyncs_ms": round3((p50 - d50 - 2.0 * s50) / 1000.0),
        })
    };
    let mut long_log_figures =
        path_figures("a runner started for the run, on a log of `log_records` records", fresh_big);
    long_log_figures["log_records"] = json!(log_records);
    long_log_figures["overhead_p50_over_fresh_log"] = json!(round3((b50 - d50) / (f50 - d50)));
    let out = json!({
        "quick": quick,
        "fencelog_run_as": exe.display().to_string(),
        "cores": std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0),
        "direct_spawn": stats(direct),
        "runner": "a spare runner, ready (the daemon's and an embedding program's way)",
        "through_fencelog": stats(through),
        "raw_fdatasync_200b": stats(sync),
        "overhead_p50_ms": round3((t50 - d50) / 1000.0),
        "overhead_p99_ms": round3((t99 - d99) / 1000.0),
        "overhead_p50_minus_two_fdatasyncs_ms": round3((t50 - d50 - 2.0 * s50) / 1000.0),
        "fresh_runner": path_figures("a runner started for the run (`fencelog run`'s way)", fresh),
        "fresh_runner_long_log": long_log_figures,
        "fencelog_run_cli": path_figures(
            "the `fencelog run` command itself, as a user runs it (its own start included)",
            cli,
        ),
        "rounds": rounds,
        "runs_per_s_16_callers": runs_per_s.round(),
    });
    if as_json {
        println!("{out}");
    } else {
        println!("{}", serde_json::to_string_pretty(&out).unwrap());
    }
}

/// A log of `records` records (1,000 subjects claimed, then heartbeats, notes and
/// fence rotations), snapshotted as a ledger's would be, open as a caller's.
fn long_log(dir: &Path, records: u64) -> Ledger {
    let t = Instant::now();
    common::build_log(dir, records);
    let l = Ledger::open(dir, LedgerOptions::default()).unwrap();
    l.snapshot_now().unwrap();
    eprintln!("a log of {records} records, snapshotted, in {:.1} s", t.elapsed().as_secs_f64());
    // Its ~130 MB are still being written back: flushed now, not during the samples.
    let _ = Command::new("sync").status();
    l
}

/// The samples cut in 3 rounds (in the order taken): in each, every path's
/// overhead p50 above the direct spawn's p50, and the raw fdatasync's p50; then
/// each figure's median and spread (max − min) over the rounds.
fn rounds_of(direct: &[f64], paths: &[(&str, &[f64])], sync: &[f64]) -> serde_json::Value {
    const ROUNDS: usize = 3;
    let p50 = |v: &[f64]| {
        let mut s = v.to_vec();
        s.sort_by(f64::total_cmp);
        percentile(&s, 0.5)
    };
    let n = direct.len() / ROUNDS;
    let round = |r: usize| {
        let cut = |v: &[f64]| v[r * n..(r + 1) * n].to_vec();
        let d = p50(&cut(direct));
        let mut o = serde_json::Map::new();
        for (name, v) in paths {
            o.insert(format!("{name}_overhead_p50_ms"), json!(round3((p50(&cut(v)) - d) / 1000.0)));
        }
        o.insert("raw_fdatasync_p50_ms".into(), json!(round3(p50(&cut(sync)) / 1000.0)));
        serde_json::Value::Object(o)
    };
    let each: Vec<serde_json::Value> = (0..ROUNDS).map(round).collect();
    let mut summary = serde_json::Map::new();
    for key in each[0].as_object().unwrap().keys() {
        let mut v: Vec<f64> = each.iter().map(|r| r[key].as_f64().unwrap()).collect();
        v.sort_by(f64::total_cmp);
        summary.insert(key.clone(), json!({"median": v[ROUNDS / 2], "spread": round3(v[ROUNDS - 1] - v[0])}));
    }
    json!({"each": each, "summary": summary})
}

/// `fencelog run --dir DIR -- /bin/true` of binary `a` against this build's,
/// alternated sample by sample, with a direct spawn of `/bin/true` beside them.
fn paired_clis(dir: &Path, a: &Path, b: &Path, samples: usize, c: &CliCommand, as_json: bool) {
    let (mut ta, mut tb, mut direct) = (vec![], vec![], vec![]);
    let warm_up = if c.sleep_ms.is_some() { 2 } else { 10 };
    for _ in 0..warm_up {
        cli_command_once(a, dir, c);
        cli_command_once(b, dir, c);
    }
    for i in 0..samples {
        direct.push(direct_once());
        if i % 2 == 0 {
            ta.push(cli_command_once(a, dir, c));
            tb.push(cli_command_once(b, dir, c));
        } else {
            tb.push(cli_command_once(b, dir, c));
            ta.push(cli_command_once(a, dir, c));
        }
    }
    let about = json!({"cli_a": a.display().to_string(), "cli_b": FENCELOG, "cli_b_run_as": b.display().to_string(),
                       "direct_spawn": stats(direct),
                       "command_sleep_ms": c.sleep_ms, "timeout_ms": c.timeout_ms});
    print_paired(about, ta, tb, as_json);
}

/// This build's binary copied into `dir`, as a user's installed copy would be:
/// the binary the runs start. The file the linker wrote was measured slower to
/// start than a copy of it, both identical: a paired `fencelog run` A/B of the
/// two took 1.0–1.3 ms longer from the linker's file on this project's test
/// machines (why is not established; perhaps how the page cache holds a file
/// written in one piece). In a paired A/B, whose A side is a copy (`cp`), that
/// was a bias against B that had nothing to do with the code.
fn copy_of_this_build(dir: &Path) -> PathBuf {
    let b = dir.join("fencelog-b");
    std::fs::copy(FENCELOG, &b).expect("copy this build's fencelog");
    b
}

/// Print `about` with the A and B samples and their paired differences (B − A).
fn print_paired(mut about: serde_json::Value, ta: Vec<f64>, tb: Vec<f64>, as_json: bool) {
    let diff: Vec<f64> = ta.iter().zip(&tb).map(|(x, y)| y - x).collect();
    about["a"] = stats(ta);
    about["b"] = stats(tb);
    about["b_minus_a_paired"] = stats(diff);
    if as_json {
        println!("{about}");
    } else {
        println!("{}", serde_json::to_string_pretty(&about).unwrap());
    }
}

/// A/B of two runner binaries under one caller: `a`'s runner, then this build's,
/// then this build's, then `a`'s…, so both see the same machine and the same log
/// length; the p50 of the paired differences (B − A) is the figure to read. The
/// log grows by 3 records a run (6 a pair): both halves replay the same amount.
fn paired_runners(ledger: &Ledger, dir: &Path, a: &Path, b: &Path, samples: usize, with_spares: bool, as_json: bool) {
    let (spares_a, spares_b) = (Spares::new(), Spares::new());
    // One run by `exe`: with its spare (waited for), or a fresh runner.
    let one = |exe: &Path, spares: &Spares| {
        if with_spares {
            assert!(spares.wait_ready(dir, exe, SPARE_READY_WAIT), "a spare runner is ready");
            let t = run_with(ledger, dir, exe, Some(spares));
            assert!(spares.wait_ready(dir, exe, SPARE_READY_WAIT), "a spare runner is ready");
            t
        } else {
            run_with(ledger, dir, exe, None)
        }
    };
    let (mut ta, mut tb) = (vec![], vec![]);
    for _ in 0..10 {
        run_with(ledger, dir, a, with_spares.then_some(&spares_a));
        run_with(ledger, dir, b, with_spares.then_some(&spares_b));
    }
    for i in 0..samples {
        if i % 2 == 0 {
            ta.push(one(a, &spares_a));
            tb.push(one(b, &spares_b));
        } else {
            tb.push(one(b, &spares_b));
            ta.push(one(a, &spares_a));
        }
    }
    let about = json!({"runner_a": a.display().to_string(), "runner_b": FENCELOG,
                       "runner_b_run_as": b.display().to_string(), "spares": with_spares});
    print_paired(about, ta, tb, as_json);
}
