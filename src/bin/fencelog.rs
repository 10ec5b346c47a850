//! The `fencelog` command: argument parsing and wiring only.
//!
//! Exit codes: 0 success, 1 I/O error or damaged log, 2 usage error.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use clap::{Parser, Subcommand};
use fencelog::storage::{Log, LogOptions, verify_dir};
use serde_json::json;

#[derive(Parser)]
#[command(name = "fencelog", version, about = "A durable, hash-chained ownership ledger")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Open (recovering if needed) the log in DIR, append records from concurrent
    /// appenders, then verify the whole log. Prints one JSON object.
    Demo {
        #[arg(long, env = "FENCELOG_DIR")]
        dir: PathBuf,
        /// Records to append.
        #[arg(long, default_value_t = 10_000)]
        records: u64,
        /// Concurrent appending threads (their appends share syncs).
        #[arg(long, default_value_t = 8)]
        appenders: u64,
        /// Payload size in bytes.
        #[arg(long, default_value_t = 200)]
        payload_bytes: usize,
    },
    /// Verify every checksum, sequence and chain link of the log in DIR (read-only).
    Verify { dir: PathBuf },
}

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(c) => c,
        Err(e) => {
            let _ = e.print();
            return ExitCode::from(if e.use_stderr() { 2 } else { 0 });
        }
    };
    let result = match cli.cmd {
        Cmd::Demo { dir, records, appenders, payload_bytes } => demo(dir, records, appenders, payload_bytes),
        Cmd::Verify { dir } => verify(dir),
    };
    match result {
        Ok((value, code)) => {
            println!("{value}");
            ExitCode::from(code)
        }
        Err(e) => {
            println!("{}", json!({"error": {"code": e.code(), "message": e.to_string()}}));
            eprintln!("fencelog: {e}");
            ExitCode::from(match e {
                fencelog::storage::Error::NotALogDirectory { .. } => 2,
                _ => 1,
            })
        }
    }
}

type CmdResult = Result<(serde_json::Value, u8), fencelog::storage::Error>;

fn demo(dir: PathBuf, records: u64, appenders: u64, payload_bytes: usize) -> CmdResult {
    let opts = LogOptions::default();
    let log = Log::open(&dir, opts.clone())?;
    let report = log.open_report().clone();
    let started = Instant::now();
    let appenders = appenders.clamp(1, 1024);
    let per = records / appenders;
    let extra = records % appenders;
    std::thread::scope(|s| -> Result<(), fencelog::storage::Error> {
        let handles: Vec<_> = (0..appenders)
            .map(|t| {
                let log = &log;
                s.spawn(move || {
                    let n = per + u64::from(t < extra);
                    for i in 0..n {
                        let mut payload = format!("demo appender {t} record {i} ").into_bytes();
                        payload.resize(payload_bytes.max(payload.len()), b'.');
                        log.append(&payload)?;
                    }
                    Ok(())
                })
            })
            .collect();
        handles.into_iter().try_for_each(|h| h.join().expect("appender thread"))
    })?;
    let elapsed = started.elapsed();
    let head = log.head();
    log.close()?;
    let summary = verify_dir(&dir, opts.body_max())?;
    let code = if summary.is_intact() { 0 } else { 1 };
    Ok((
        json!({
            "dir": dir,
            "open": report,
            "appended": records,
            "appenders": appenders,
            "durable_appends_per_s": (records as f64 / elapsed.as_secs_f64()).round(),
            "head": head,
            "verify": summary,
        }),
        code,
    ))
}

fn verify(dir: PathBuf) -> CmdResult {
    let summary = verify_dir(&dir, LogOptions::default().body_max())?;
    let code = if summary.is_intact() { 0 } else { 1 };
    Ok((serde_json::to_value(&summary).expect("summary serializes"), code))
}
