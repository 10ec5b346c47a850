//! The cutover, where a daemon hands over (SIGTERM, SIGINT, `POST
//! /v1/admin/cutover`, or its home lost): admission stops, admitted requests get
//! the drain grace, the ledger drains so that every admitted request is settled
//! from the log, one `cutover` record lists how each ended, and the home is
//! released last — a successor claims it only once all of that is durable.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use super::{App, DRAIN_SETTLE_MS, Phase, exit, http, sd_notify};
use crate::model::{Event, SettledRequest, Txn};

/// The daemon's log lines keep the target they had before this room was cut out
/// of `daemon/mod.rs` (a log pipeline may filter on it).
const LOG_TARGET: &str = "fencelog::daemon";

/// Requests listed by name in a cutover's log line (all are in its record).
const SETTLED_LOGGED_MAX: usize = 50;

/// One line per cutover: how many admitted requests were settled each way, and
/// the first [`SETTLED_LOGGED_MAX`] of them (`request op how[@seq]`).
fn log_settlement(reason: &str, settled: &[SettledRequest]) {
    let count = |how: &str| settled.iter().filter(|s| s.how == how).count();
    let listed: Vec<String> = settled
        .iter()
        .take(SETTLED_LOGGED_MAX)
        .map(|s| {
            let at = s.seq.map(|q| format!("@{q}")).unwrap_or_default();
            format!("{} {} {}{at}", crate::view::escape_controls(&s.request), s.op, s.how)
        })
        .collect();
    tracing::info!(
        target: LOG_TARGET,
        reason,
        admitted = settled.len(),
        committed = count("committed"),
        not_committed = count("not_committed"),
        outcome_unknown = count("outcome_unknown"),
        settled = %listed.join(", "),
        "cutover"
    );
}

/// The cutover: stop admitting, give admitted requests the grace, drain the
/// ledger so each is settled from the log, record how, release the home last.
pub(super) async fn cutover(app: &Arc<App>, reason: &str, home_lost: bool) -> u8 {
    tracing::debug!(target: LOG_TARGET, reason, "cutover begins");
    sd_notify("STOPPING=1");
    app.advance(Phase::Settling);
    // Watch streams get their final event now; they never consume the grace.
    http::close_watches(app);
    let grace_end = Instant::now() + Duration::from_millis(app.drain_grace_ms);
    while !app.admitted.lock().expect("admitted").is_empty() && Instant::now() < grace_end {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    // Whatever is still waiting: its wait ends; the ledger judges nothing new, and
    // what it already judged becomes durable (or failed): every answer is known.
    app.advance(Phase::Draining);
    let ledger = Arc::clone(&app.ledger);
    let drained = tokio::task::spawn_blocking(move || ledger.drain(DRAIN_SETTLE_MS)).await;
    match &drained {
        Ok(Ok(d)) => tracing::debug!(target: LOG_TARGET, settled = d.settled, "drained"),
        Ok(Err(e)) => tracing::warn!(target: LOG_TARGET, error = %e, "drain"),
        Err(e) => tracing::warn!(target: LOG_TARGET, error = %e, "drain"),
    }
    let settle_end = Instant::now() + Duration::from_millis(DRAIN_SETTLE_MS);
    while !app.admitted.lock().expect("admitted").is_empty() && Instant::now() < settle_end {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let mut settled = std::mem::take(&mut *app.settled.lock().expect("settled"));
    // Any handler that has still not answered: its request is settled from the log.
    for (_, (request, op)) in std::mem::take(&mut *app.admitted.lock().expect("admitted")) {
        let how = match app.ledger.request_status(&request) {
            Ok(crate::ledger::RequestStatus::Committed { seq, .. }) => ("committed", Some(seq)),
            _ => ("not_committed", None),
        };
        settled.push(SettledRequest { request, op, how: how.0.into(), seq: how.1 });
    }
    log_settlement(reason, &settled);
    let more = settled.len().saturating_sub(crate::model::CUTOVER_SETTLED_MAX) as u64;
    settled.truncate(crate::model::CUTOVER_SETTLED_MAX);
    let (ledger, home, reason) = (Arc::clone(&app.ledger), app.home.clone(), reason.to_owned());
    let worker = Arc::clone(app);
    tokio::task::spawn_blocking(move || {
        let event = Event::Cutover { home: home.clone(), reason, settled, more };
        let recorded = ledger.submit_internal(None, |_, t, w| Ok(Txn::new(t, w, vec![event.clone()])));
        if let Err(e) = &recorded {
            tracing::error!(target: LOG_TARGET, "cannot record the cutover: {e}");
        }
        if home_lost || worker.home_lost.load(Ordering::SeqCst) {
            return exit::HOME_LOST;
        }
        // The home last: a successor claims it only once everything above is durable.
        let release = Event::Release { subject: home.subject, generation: home.generation };
        let released = ledger.submit_internal(None, |_, t, w| Ok(Txn::new(t, w, vec![release.clone()])));
        worker.advance(Phase::Released);
        match released {
            Err(crate::ledger::LedgerError::Refused(r)) => {
                tracing::error!(target: LOG_TARGET, "the home was taken during the cutover: {r}");
                exit::HOME_LOST
            }
            Err(e) => {
                tracing::error!(target: LOG_TARGET, "cannot release the home: {e}");
                exit::IO
            }
            Ok(_) if recorded.is_err() || worker.broken.load(Ordering::SeqCst) => exit::IO,
            Ok(_) => exit::CUT_OVER,
        }
    })
    .await
    .unwrap_or(exit::IO)
}
