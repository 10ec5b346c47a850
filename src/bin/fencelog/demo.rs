//! `demo`: the README's main job until the daemon lands.

use std::path::PathBuf;
use std::time::Instant;

use fencelog::ledger::{Ledger, LedgerOptions, identity};
use fencelog::model::{Event, Outcome, Txn};
use fencelog::ops::OpError;
use fencelog::storage::verify_dir;
use serde_json::json;

use crate::Printed;

pub(crate) fn demo(dir: PathBuf, records: u64, appenders: u64, payload_bytes: usize) -> Printed {
    use fencelog::model::TEXT_BYTES_MAX;
    if payload_bytes > TEXT_BYTES_MAX {
        return Err(OpError::Usage {
            code: "INVALID_INPUT",
            message: format!("--payload-bytes is at most {TEXT_BYTES_MAX}"),
        });
    }
    // The demo creates its data directory on purpose (it is the README's first
    // command); it writes ledger transactions, so the log it leaves is a ledger that
    // every other command reads.
    let mut opts = LedgerOptions::default();
    opts.log.create = true;
    let ledger = Ledger::open(&dir, opts.clone())?;
    let report = ledger.open_report().storage.clone();
    let appenders = appenders.clamp(1, 1024).min(records.max(1));
    let (per, extra) = (records / appenders, records % appenders);
    let started = Instant::now();
    std::thread::scope(|s| -> Result<(), OpError> {
        let handles: Vec<_> = (0..appenders)
            .map(|t| {
                let ledger = &ledger;
                s.spawn(move || demo_appender(ledger, t, per + u64::from(t < extra), payload_bytes))
            })
            .collect();
        handles.into_iter().try_for_each(|h| h.join().expect("appender thread"))
    })?;
    let elapsed = started.elapsed();
    let head = ledger.projection().last_seq;
    drop(ledger);
    let summary = verify_dir(&dir, opts.log.body_max())?;
    let code = if summary.is_intact() { 0 } else { 1 };
    Ok((
        json!({
            "dir": dir, "open": report, "appended": records, "appenders": appenders,
            "durable_appends_per_s": (records as f64 / elapsed.as_secs_f64()).round(),
            "head": head, "verify": summary,
        }),
        code,
    ))
}

/// One demo appender: claim `demo/<pid>/appender-T` for this process (over a dead
/// owner, with its death evidence, should a pid come round again), then write
/// notes under that generation until `count` transactions are committed. Subjects
/// are per process, so demos may run side by side on one log.
fn demo_appender(ledger: &Ledger, t: u64, count: u64, payload_bytes: usize) -> Result<(), OpError> {
    if count == 0 {
        return Ok(());
    }
    let subject = format!("demo/{}/appender-{t}", std::process::id());
    let me = identity::probe(std::process::id(), uuid::Uuid::new_v4()).ok_or_else(|| OpError::Usage {
        code: "NO_SUCH_PROCESS",
        message: "cannot read this process's identity".into(),
    })?;
    let claimed = ledger.submit(None, |p, now_ms, writer| {
        let previous = fencelog::ops::dead_owner_evidence(p, &subject);
        let claim =
            Event::Claim { subject: subject.clone(), owner: me.clone(), stale_after_ms: 60_000, lock: None, previous };
        Ok(Txn::new(now_ms, writer, vec![claim]))
    })?;
    let Some(Outcome::Claimed { generation, .. }) = claimed.outcomes.first().cloned() else {
        unreachable!("a committed claim reports Claimed")
    };
    for i in 1..count {
        let mut text = format!("demo appender {t} record {i} ");
        text.extend(std::iter::repeat_n('.', payload_bytes.saturating_sub(text.len())));
        let note = Event::Note { subject: subject.clone(), generation, text };
        ledger.submit(None, |_p, now_ms, writer| Ok(Txn::new(now_ms, writer, vec![note.clone()])))?;
    }
    Ok(())
}
