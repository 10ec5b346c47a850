//! `demo`: the README's main job until the daemon lands. Concurrent appenders each
//! claim a subject and write notes under its generation, through the same
//! operations as every front end; then the whole log is verified.

use std::path::{Path, PathBuf};
use std::time::Instant;

use serde::Serialize;

use super::{Caller, ClaimRequest, NoteRequest, OpError, claim, note};
use crate::ledger::{Ledger, LedgerOptions};
use crate::model::{Outcome, TEXT_BYTES_MAX};
use crate::storage::{OpenReport, ReadSummary, verify_dir};

/// Most concurrent appenders a demo runs.
pub const DEMO_APPENDERS_MAX: u64 = 1024;

#[derive(Debug, Clone, Serialize)]
pub struct DemoReport {
    pub dir: PathBuf,
    /// What opening (and recovering) the log found.
    pub open: OpenReport,
    pub appended: u64,
    pub appenders: u64,
    pub durable_appends_per_s: f64,
    /// The last sequence after the run.
    pub head: u64,
    /// The whole log, verified after the run.
    pub verify: ReadSummary,
}

impl DemoReport {
    /// No corruption. (A torn tail is not: after the demo's own records, which are
    /// durable, it can only be another writer's append in progress.)
    pub fn intact(&self) -> bool {
        !self.verify.has_corruption()
    }
}

/// Commit `records` transactions from `appenders` threads into the log in `dir`
/// (created if missing or empty: the demo's own data directory), then verify it.
pub fn demo(dir: &Path, records: u64, appenders: u64, payload_bytes: usize) -> Result<DemoReport, OpError> {
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
