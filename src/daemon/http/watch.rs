//! The watch: committed records as Server-Sent Events, from a sequence on, until
//! the client hangs up or a cutover closes every stream.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use serde_json::Value;

use super::body::Reject;
use super::problem::{op_problem, plain};
use crate::daemon::App;
use crate::daemon::openapi::WatchQuery;
use crate::format::RecordRef;
use crate::ops::OpError;
use crate::storage::LogBackend;

/// How long a watch stream waits for the next record before it looks at its
/// client and the cutover again.
const WATCH_WAIT_MS: u64 = 250;
/// A keep-alive comment (`: keep-alive`) on a watch stream with nothing to send for
/// this long, so proxies and clients see the connection alive.
pub const WATCH_KEEPALIVE_MS: u64 = 15_000;
/// The `retry:` a watch stream sends first: how long an EventSource waits before
/// it reconnects.
pub const WATCH_CLIENT_RETRY_MS: u64 = 1_000;
/// How long a watch stream waits after its backend could not be read (etcd
/// unreachable) before it reads again.
const WATCH_RETRY_MS: u64 = 1_000;

/// Server-Sent Events: one committed record per event in the `inspect dump
/// --json` shape, `id:` = sequence (a standard EventSource resumes with
/// `Last-Event-ID` and misses nothing). At a cutover: a final `cutover` event.
pub(super) async fn watch(State(app): State<Arc<App>>, headers: HeaderMap, Query(q): Query<WatchQuery>) -> Response {
    let Ok(permit) = Arc::clone(&app.watchers).try_acquire_owned() else {
        return plain(StatusCode::SERVICE_UNAVAILABLE, "OVERLOADED", "too many watch streams");
    };
    let from = match start_of(&app, &headers, q.from).await {
        Ok(from) => from,
        Err(r) => return *r,
    };
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<SseEvent, Infallible>>(256);
    // First, how long a client waits before it reconnects (`retry:`), and where
    // this stream starts (a comment).
    // Its `id:` is the record before: a client that reconnects before the first
    // record (a cutover, a proxy's timeout) resumes here, missing nothing.
    let _ = tx.try_send(Ok(SseEvent::default()
        .id((from - 1).to_string())
        .retry(Duration::from_millis(WATCH_CLIENT_RETRY_MS))
        .comment(format!("from {from}"))));
    let backend = Arc::clone(app.ledger.backend());
    let closed = watch_closed(&app);
    // Reading the log is blocking file I/O: each stream tails on a blocking thread
    // of its own (at most WATCH_STREAMS_MAX), and hands events over one at a time
    // through a bounded channel — a slow client slows its reader, and a stream
    // from sequence 1 of a long log never holds the log in memory.
    tokio::task::spawn_blocking(move || {
        let _permit = permit;
        tail(&*backend, from, &tx, &closed);
    });
    Sse::new(tokio_stream::wrappers::ReceiverStream::new(rx))
        .keep_alive(KeepAlive::new().interval(Duration::from_millis(WATCH_KEEPALIVE_MS)).text("keep-alive"))
        .into_response()
}

/// The first sequence a watch stream sends, or the problem.
async fn start_of(app: &App, headers: &HeaderMap, from: Option<u64>) -> Result<u64, Reject> {
    // `Last-Event-ID` (a reconnecting EventSource) resumes just after it, and must
    // be a sequence; else `from`; else the records appended from now on, as
    // `inspect follow` starts (`from=1` replays the whole log).
    let resume = match headers.get("last-event-id").map(|v| v.to_str().ok().and_then(|v| v.trim().parse::<u64>().ok()))
    {
        Some(Some(last)) => Some(last.saturating_add(1)),
        Some(None) => {
            return Err(Box::new(plain(
                StatusCode::BAD_REQUEST,
                "INVALID_INPUT",
                "Last-Event-ID is the sequence of the last event seen",
            )));
        }
        None => None,
    };
    match resume.or(from) {
        Some(f) => Ok(f.max(1)),
        // The head waits for the engine (and may catch up with etcd): never on
        // an async worker.
        None => {
            let ledger = Arc::clone(&app.ledger);
            match tokio::task::spawn_blocking(move || ledger.head()).await {
                Ok(Ok(head)) => Ok(head.seq + 1),
                Ok(Err(e)) => Err(Box::new(op_problem(app, &OpError::from(e)))),
                Err(_) => {
                    Err(Box::new(plain(StatusCode::INTERNAL_SERVER_ERROR, "IO_ERROR", "reading the head failed")))
                }
            }
        }
    }
}

/// One watch stream's reader, on its blocking thread: every record from `from` on
/// into `tx`, until the client hangs up, the log cannot be read (an `error` event)
/// or a cutover closes the stream (a `cutover` event).
fn tail(
    backend: &dyn LogBackend,
    from: u64,
    tx: &tokio::sync::mpsc::Sender<Result<SseEvent, Infallible>>,
    closed: &tokio::sync::watch::Receiver<bool>,
) {
    // The backend's own reader: a directory's segments, or etcd's keys (woken
    // by etcd's watch of the head).
    let mut reader = backend.reader(from);
    loop {
        let mut gone = false;
        let polled = reader.poll(&mut |r| {
            if gone {
                return;
            }
            gone = match record_event(r) {
                Ok(ev) => tx.blocking_send(Ok(ev)).is_err(),
                Err(detail) => {
                    let _ = tx.blocking_send(Ok(SseEvent::default().event("error").data(detail)));
                    true
                }
            };
        });
        if gone {
            return;
        }
        match polled {
            // etcd unreachable for now: the stream waits (keep-alives go on)
            // and resumes where it stopped.
            Err(e) if e.is_transient() => {
                tracing::warn!("watch: {e}; retrying");
                std::thread::sleep(Duration::from_millis(WATCH_RETRY_MS));
                if e.code() == "CUT_UNDER_READER" {
                    reader = backend.reader(reader.next_seq());
                }
            }
            Err(e) => {
                let _ = tx.blocking_send(Ok(SseEvent::default().event("error").data(e.to_string())));
                return;
            }
            Ok(_) => {}
        }
        if *closed.borrow() {
            let _ = tx.blocking_send(Ok(SseEvent::default().event("cutover").data("{\"cutover\":true}")));
            return;
        }
        // The client hung up: free the slot now, not at the next record.
        if tx.is_closed() {
            return;
        }
        if let Err(e) = reader.wait_for_more(Duration::from_millis(WATCH_WAIT_MS)) {
            tracing::warn!("watch: {e}; retrying");
            std::thread::sleep(Duration::from_millis(WATCH_RETRY_MS));
        }
    }
}

/// A record's `record` event (`id:` its sequence), or — a record that cannot be
/// shown — the detail of the `error` event that ends the stream before it.
fn record_event(r: &RecordRef<'_>) -> Result<SseEvent, String> {
    // Whatever a record holds (it may be tampered with), the stream
    // ends with an `error` event naming it, never silently: a client
    // that resumed would otherwise meet the same end forever.
    let json = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let mut v = crate::view::record::record_json(r, std::path::Path::new(""), 0);
        if let Value::Object(o) = &mut v {
            o.remove("segment");
            o.remove("offset");
        }
        v.to_string()
    }));
    match json {
        Ok(data) => Ok(SseEvent::default().id(r.seq.to_string()).event("record").data(data)),
        Err(_) => Err(format!("record {} could not be shown; the stream ends before it", r.seq)),
    }
}

fn watch_closed(app: &App) -> tokio::sync::watch::Receiver<bool> {
    app.watch_close.subscribe()
}

pub(crate) fn close_watches(app: &App) {
    let _ = app.watch_close.send(true);
}
