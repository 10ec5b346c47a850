//! The load generator, through the library's public API only: concurrent appenders
//! each claim a subject (`demo/<pid>/appender-N`) and write notes under its
//! generation, through the same operations as every front end (`fencelog::ops`);
//! then the whole log is verified. Creates DIR if it is missing or empty.
//!
//!   cargo run --release --example demo -- --dir DIR [--records N] [--appenders K] [--payload-bytes B]
//!
//! `--records`: transactions to commit in all (default 10,000); `--appenders`:
//! concurrent appender threads (default 8, at most 1024); `--payload-bytes`: bytes of
//! each note (default 200, at most 1024: `fencelog::model::TEXT_BYTES_MAX`).
//!
//! It prints one JSON object on stdout, as the `fencelog` command does: the report
//! (`dir`, `open`, `appended`, `appenders`, `durable_appends_per_s`, `head`,
//! `verify`), or `{"error": {"code": ..., "message": ...}}`. Exit codes: 0 the log
//! verified intact, 1 the verify found corruption (or an I/O error), 2 a usage error
//! (USAGE) or invalid input (INVALID_INPUT: `--payload-bytes` over the limit).
//! Subjects are per process, so demos may run side by side on one log.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Instant;

use fencelog::ledger::{Ledger, LedgerOptions};
use fencelog::model::{Outcome, TEXT_BYTES_MAX};
use fencelog::ops::{Caller, ClaimRequest, NoteRequest, OpError, claim, note};
use fencelog::storage::{OpenReport, ReadSummary, verify_dir};
use serde::Serialize;

/// Most concurrent appenders a demo runs.
const DEMO_APPENDERS_MAX: u64 = 1024;

const USAGE: &str = "Usage: demo --dir <DIR> [--records <N>] [--appenders <K>] [--payload-bytes <B>]";

#[derive(Debug, Clone, Serialize)]
struct DemoReport {
    dir: PathBuf,
    /// What opening (and recovering) the log found.
    open: OpenReport,
    appended: u64,
    appenders: u64,
    durable_appends_per_s: f64,
    /// The last sequence after the run.
    head: u64,
    /// The whole log, verified after the run.
    verify: ReadSummary,
}

impl DemoReport {
    /// No corruption. (A torn tail is not: after the demo's own records, which are
    /// durable, it can only be another writer's append in progress.)
    fn intact(&self) -> bool {
        !self.verify.has_corruption()
    }
}

/// The command line: `--dir DIR` (required), `--records N` (10,000),
/// `--appenders K` (8), `--payload-bytes B` (200); each flag also as `--flag=VALUE`.
struct Args {
    dir: PathBuf,
    records: u64,
    appenders: u64,
    payload_bytes: usize,
}

fn usage(message: impl Into<String>) -> OpError {
    OpError::Usage { code: "USAGE", message: message.into() }
}

/// The arguments, `None` for `--help`.
fn parse_args(mut args: impl Iterator<Item = String>) -> Result<Option<Args>, OpError> {
    fn number<T: std::str::FromStr>(flag: &str, value: &str) -> Result<T, OpError>
    where
        T::Err: std::fmt::Display,
    {
        value.parse().map_err(|e| usage(format!("invalid value '{value}' for '{flag}': {e}")))
    }
    let (mut dir, mut records, mut appenders, mut payload_bytes) = (None, None, None, None);
    while let Some(arg) = args.next() {
        if arg == "-h" || arg == "--help" {
            return Ok(None);
        }
        let (flag, inline) = match arg.split_once('=') {
            Some((f, v)) if f.starts_with("--") => (f.to_owned(), Some(v.to_owned())),
            _ => (arg.clone(), None),
        };
        if !matches!(flag.as_str(), "--dir" | "--records" | "--appenders" | "--payload-bytes") {
            return Err(usage(format!("unexpected argument '{arg}' found")));
        }
        let value = match inline.or_else(|| args.next()) {
            Some(v) => v,
            None => return Err(usage(format!("a value is required for '{flag}' but none was supplied"))),
        };
        let once = |slot: bool| {
            if slot { Err(usage(format!("the argument '{flag}' cannot be used multiple times"))) } else { Ok(()) }
        };
        match flag.as_str() {
            "--dir" => {
                once(dir.is_some())?;
                dir = Some(PathBuf::from(value));
            }
            "--records" => {
                once(records.is_some())?;
                records = Some(number(&flag, &value)?);
            }
            "--appenders" => {
                once(appenders.is_some())?;
                appenders = Some(number(&flag, &value)?);
            }
            _ => {
                once(payload_bytes.is_some())?;
                payload_bytes = Some(number(&flag, &value)?);
            }
        }
    }
    let dir = dir.filter(|d| !d.as_os_str().is_empty()).ok_or_else(|| usage("--dir DIR is required"))?;
    Ok(Some(Args {
        dir,
        records: records.unwrap_or(10_000),
        appenders: appenders.unwrap_or(8),
        payload_bytes: payload_bytes.unwrap_or(200),
    }))
}

fn main() -> ExitCode {
    let args = match parse_args(std::env::args().skip(1)) {
        Ok(Some(args)) => args,
        Ok(None) => {
            println!("{USAGE}");
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            eprintln!("demo: {e}\n{USAGE}");
            return answer(&serde_json::to_value(e.body()).expect("error body serializes"), e.exit_code());
        }
    };
    match demo(&args.dir, args.records, args.appenders, args.payload_bytes) {
        Ok(report) => {
            let code = if report.intact() { 0 } else { 1 };
            answer(&serde_json::to_value(&report).expect("report serializes"), code)
        }
        Err(e) => {
            eprintln!("demo: {e}");
            answer(&serde_json::to_value(e.body()).expect("error body serializes"), e.exit_code())
        }
    }
}

/// Print the one JSON line and exit with `code` (1 if stdout fails, unless its
/// reader went away).
fn answer(value: &serde_json::Value, code: u8) -> ExitCode {
    let mut stdout = std::io::stdout().lock();
    match writeln!(stdout, "{value}").and_then(|_| stdout.flush()) {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => {
            eprintln!("demo: cannot write the answer to stdout ({e}); the answer was: {value}");
            ExitCode::from(1)
        }
        _ => ExitCode::from(code),
    }
}

/// Commit `records` transactions from `appenders` threads into the log in `dir`
/// (created if missing or empty: the demo's own data directory), then verify it.
fn demo(dir: &Path, records: u64, appenders: u64, payload_bytes: usize) -> Result<DemoReport, OpError> {
    if payload_bytes > TEXT_BYTES_MAX {
        return Err(OpError::Usage {
            code: "INVALID_INPUT",
            message: format!("--payload-bytes is at most {TEXT_BYTES_MAX}"),
        });
    }
    let mut opts = LedgerOptions::default();
    opts.log.create = true;
    let ledger = Ledger::open(dir, opts.clone())?;
    let open = ledger.open_report().storage.clone();
    let appenders = appenders.clamp(1, DEMO_APPENDERS_MAX).min(records.max(1));
    let (per, extra) = (records / appenders, records % appenders);
    let started = Instant::now();
    std::thread::scope(|s| -> Result<(), OpError> {
        let handles: Vec<_> = (0..appenders)
            .map(|t| {
                let ledger = &ledger;
                s.spawn(move || appender(ledger, t, per + u64::from(t < extra), payload_bytes))
            })
            .collect();
        handles.into_iter().try_for_each(|h| h.join().expect("appender thread"))
    })?;
    let elapsed = started.elapsed();
    let head = ledger.projection().last_seq();
    drop(ledger);
    let verify = verify_dir(dir, opts.log.body_max())?;
    Ok(DemoReport {
        dir: dir.to_path_buf(),
        open,
        appended: records,
        appenders,
        durable_appends_per_s: (records as f64 / elapsed.as_secs_f64()).round(),
        head,
        verify,
    })
}

/// One appender: claim `demo/<pid>/appender-T` for this process (over a dead owner,
/// with its death evidence, should a pid come round again), then notes under that
/// generation until `count` transactions are committed. Subjects are per process,
/// so demos may run side by side on one log.
fn appender(ledger: &Ledger, t: u64, count: u64, payload_bytes: usize) -> Result<(), OpError> {
    if count == 0 {
        return Ok(());
    }
    let pid = std::process::id();
    let subject = format!("demo/{pid}/appender-{t}");
    let req = ClaimRequest {
        subject: subject.clone(),
        pid: Some(pid),
        instance: None,
        stale_after_ms: 60_000,
        action: None,
        request_id: None,
    };
    let claimed = claim(ledger, &req, Caller::default())?;
    let Outcome::Claimed { generation, .. } = claimed.outcome.0 else {
        unreachable!("a committed claim reports Claimed")
    };
    for i in 1..count {
        let mut text = format!("demo appender {t} record {i} ");
        text.extend(std::iter::repeat_n('.', payload_bytes.saturating_sub(text.len())));
        note(
            ledger,
            &NoteRequest { subject: subject.clone(), generation, text, request_id: None, instance: None },
            Caller::default(),
        )?;
    }
    Ok(())
}
