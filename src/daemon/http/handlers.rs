//! The route handlers: mutations (through [`mutate`]), reads on a blocking
//! thread, a process's output streamed, the probes, the cutover and the metrics.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::Value;

use super::Peer;
use super::body::{Body, body_object, typed};
use super::mutate::{Answered, home_reserved, mutate, names_home, op_json};
use super::ok_json;
use super::problem::{not_admitting, op_problem, overloaded, plain};
use crate::daemon::openapi::{CancelBody, CutoverQuery, LogsQuery, ProcessFilter, StateQuery, WaitBody};
use crate::daemon::{App, HTTP_WAIT_MS_MAX};
use crate::model::{OwnerRef, Refusal};
use crate::ops::{self, Caller, GenerationOp, OpError};
use crate::supervisor;

fn to_value<T: serde::Serialize>(r: Result<T, OpError>) -> Result<Value, OpError> {
    r.map(|v| serde_json::to_value(v).expect("responses serialize"))
}

/// Owners over HTTP usually run on another host: without `pid` a claim is a
/// remote owner (instance only, never provably dead).
const REMOTE: Caller = Caller { default_pid: None, remote: true };

/// Who calls: over TCP a remote caller; over the Unix socket the peer process
/// (a claim without `pid` is then held for it, and can be proven dead).
fn caller(peer: Option<axum::Extension<Peer>>) -> Caller {
    match peer {
        Some(axum::Extension(p)) => Caller { default_pid: Some(p.pid), remote: false },
        None => REMOTE,
    }
}

pub(super) async fn claim(
    State(app): State<Arc<App>>,
    peer: Option<axum::Extension<Peer>>,
    h: HeaderMap,
    b: Body,
) -> Response {
    let who = caller(peer);
    mutate(app, "claim", h, b, move |app, r: ops::ClaimRequest| async move {
        op_json(ops::plan_claim(&app.ledger, &r, who)?.submit_async(&app.ledger).await)
    })
    .await
}

pub(super) async fn generation(
    State(app): State<Arc<App>>,
    peer: Option<axum::Extension<Peer>>,
    h: HeaderMap,
    b: Body,
    op: GenerationOp,
) -> Response {
    let who = caller(peer);
    let name = match op {
        GenerationOp::Heartbeat => "heartbeat",
        GenerationOp::Release => "release",
        GenerationOp::RotateFence => "rotate-fence",
    };
    mutate(app, name, h, b, move |app, r: ops::GenerationRequest| async move {
        op_json(ops::plan_generation(op, &r, who)?.submit_async(&app.ledger).await)
    })
    .await
}

pub(super) async fn takeover(
    State(app): State<Arc<App>>,
    peer: Option<axum::Extension<Peer>>,
    h: HeaderMap,
    b: Body,
) -> Response {
    let who = caller(peer);
    mutate(app, "takeover", h, b, move |app, r: ops::TakeoverRequest| async move {
        let planned = ops::plan_takeover(&app.ledger, &r, who)?;
        // On a log shared by hosts: staleness watched on this daemon's own clock.
        let (ledger, req) = (Arc::clone(&app.ledger), r.clone());
        tokio::task::spawn_blocking(move || ops::watch_before_takeover(&ledger, &req, HTTP_WAIT_MS_MAX))
            .await
            .map_err(|e| OpError::Io { message: format!("the takeover's watch: {e}") })??;
        op_json(planned.submit_async(&app.ledger).await)
    })
    .await
}

pub(super) async fn note(
    State(app): State<Arc<App>>,
    peer: Option<axum::Extension<Peer>>,
    h: HeaderMap,
    b: Body,
) -> Response {
    let who = caller(peer);
    mutate(app, "note", h, b, move |app, r: ops::NoteRequest| async move {
        op_json(ops::plan_note(&r, who)?.submit_async(&app.ledger).await)
    })
    .await
}

pub(super) async fn lease_acquire(State(app): State<Arc<App>>, h: HeaderMap, b: Body) -> Response {
    mutate(app, "lease-acquire", h, b, |app, r: ops::LeaseAcquireRequest| async move {
        op_json(ops::plan_lease_acquire(&r)?.submit_async(&app.ledger).await)
    })
    .await
}

pub(super) async fn lease_release(State(app): State<Arc<App>>, h: HeaderMap, b: Body) -> Response {
    mutate(app, "lease-release", h, b, |app, r: ops::LeaseReleaseRequest| async move {
        op_json(ops::plan_lease_release(&r)?.submit_async(&app.ledger).await)
    })
    .await
}

pub(super) async fn run(State(app): State<Arc<App>>, h: HeaderMap, b: Body) -> Response {
    mutate(app, "run", h, b, |app, r: supervisor::RunRequest| async move {
        if r.wait_ms > HTTP_WAIT_MS_MAX {
            return Err(OpError::Refused(Refusal::InvalidInput {
                detail: format!("wait_ms is at most {HTTP_WAIT_MS_MAX} over HTTP"),
            }));
        }
        // Starting a runner and waiting for its answer blocks: a thread of its own.
        tokio::task::spawn_blocking(move || {
            let p =
                supervisor::run_until(&app.ledger, &app.dir, &r, &app.self_exe, &app.abort_waits, Some(&app.spares))?;
            Ok(Answered { settlement: p.settlement(), json: serde_json::to_value(p).expect("responses serialize") })
        })
        .await
        .unwrap_or_else(|e| Err(OpError::Io { message: format!("the operation panicked: {e}") }))
    })
    .await
}

/// A read on a blocking thread, answered as JSON or a problem.
async fn read<F>(app: Arc<App>, f: F) -> Response
where
    F: FnOnce(&App) -> Result<Value, OpError> + Send + 'static,
{
    let Ok(permit) = Arc::clone(&app.inflight).try_acquire_owned() else {
        return overloaded();
    };
    let worker = Arc::clone(&app);
    match tokio::task::spawn_blocking(move || {
        let _permit = permit;
        f(&worker)
    })
    .await
    {
        Ok(Ok(v)) => ok_json(&v, None),
        Ok(Err(e)) => op_problem(&app, &e),
        Err(e) => plain(StatusCode::INTERNAL_SERVER_ERROR, "IO_ERROR", &format!("the read panicked: {e}")),
    }
}

pub(super) async fn processes(State(app): State<Arc<App>>, Query(q): Query<ProcessFilter>) -> Response {
    read(app, move |app| {
        let r = app.ledger.refresh_with(|p| supervisor::list(p, q.status.as_deref(), q.owner.as_deref()))?;
        to_value(r)
    })
    .await
}

pub(super) async fn process_show(State(app): State<Arc<App>>, Path(id): Path<u64>) -> Response {
    read(app, move |app| {
        // A read settles a process left without its runner only while this daemon
        // admits writes (during a cutover it answers what the log says).
        if app.admitting() {
            to_value(supervisor::show_settled(&app.ledger, id))
        } else {
            to_value(app.ledger.refresh_with(|p| supervisor::show(p, id))?)
        }
    })
    .await
}

pub(super) async fn process_wait(State(app): State<Arc<App>>, Path(id): Path<u64>, b: Body) -> Response {
    let w: WaitBody = match body_object(b).and_then(typed) {
        Ok(w) => w,
        Err(r) => return *r,
    };
    let timeout_ms = w.timeout_ms.unwrap_or(supervisor::WAIT_MS_DEFAULT).min(HTTP_WAIT_MS_MAX);
    read(app, move |app| to_value(supervisor::wait(&app.ledger, id, timeout_ms))).await
}

pub(super) async fn process_cancel(State(app): State<Arc<App>>, Path(id): Path<u64>, b: Body) -> Response {
    if !app.admitting() {
        return not_admitting();
    }
    let m = match body_object(b) {
        Ok(m) => m,
        Err(r) => return *r,
    };
    if let Some(field) = names_home(&app, &m) {
        return home_reserved(&app, field);
    }
    let c: CancelBody = match typed(m) {
        Ok(c) => c,
        Err(r) => return *r,
    };
    let by = match (c.owner, c.generation) {
        (Some(subject), Some(generation)) => Some(OwnerRef { subject, generation }),
        (None, None) => None,
        _ => return plain(StatusCode::BAD_REQUEST, "INVALID_INPUT", "owner and generation go together"),
    };
    let grace = c.grace_ms.unwrap_or(2_000).min(HTTP_WAIT_MS_MAX);
    read(app, move |app| to_value(supervisor::cancel(&app.ledger, id, by, grace))).await
}

pub(super) async fn process_logs(
    State(app): State<Arc<App>>,
    Path(id): Path<u64>,
    Query(q): Query<LogsQuery>,
) -> Response {
    let stream = q.stream.unwrap_or(supervisor::Stream::Stdout);
    let Ok(permit) = Arc::clone(&app.log_streams).try_acquire_owned() else {
        return plain(
            StatusCode::SERVICE_UNAVAILABLE,
            "OVERLOADED",
            "too many process outputs streaming; retry shortly",
        );
    };
    let worker = Arc::clone(&app);
    let handle = tokio::runtime::Handle::current();
    // Streamed in pieces through a bounded channel, never held whole: a reader of
    // a 64 MiB output costs at most LOGS_CHUNKS_IN_FLIGHT pieces of
    // OUTPUT_CHUNK_BYTES (12 concurrent reads of one took the daemon from 9 MiB
    // to 2.1 GiB when each read it into memory). The first piece, or the problem
    // (unknown process, a file short of its record or other bytes than it kept:
    // checked by a first pass before a byte is sent), decides the status; damage
    // found while sending ends the body short (the client sees an incomplete body,
    // never other bytes passed off as the output).
    let (first_tx, first_rx) = tokio::sync::oneshot::channel::<Result<(), OpError>>();
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<Bytes, std::io::Error>>(LOGS_CHUNKS_IN_FLIGHT);
    tokio::task::spawn_blocking(move || {
        let _permit = permit;
        let mut first = Some(first_tx);
        let r = supervisor::find(&worker.ledger, id).and_then(|p| {
            supervisor::stream_output(&worker.dir, &p, stream, 0, |chunk| {
                if let Some(f) = first.take() {
                    let _ = f.send(Ok(()));
                }
                // A client that stops reading gets LOG_SEND_TIMEOUT_MS per piece,
                // then its stream ends (short: it sees an incomplete body).
                let piece = Ok(Bytes::copy_from_slice(chunk));
                handle
                    .block_on(tx.send_timeout(piece, Duration::from_millis(crate::daemon::LOG_SEND_TIMEOUT_MS)))
                    .map_err(|_| std::io::Error::other("the client hung up or stopped reading"))
            })
        });
        match (r, first.take()) {
            (Ok(_), Some(f)) => drop(f.send(Ok(()))), // nothing to send: an empty body
            (Err(e), Some(f)) => drop(f.send(Err(e))),
            (Err(e), None) => drop(tx.blocking_send(Err(std::io::Error::other(e.to_string())))),
            (Ok(_), None) => {}
        }
    });
    match first_rx.await {
        Ok(Ok(())) => {
            let body = axum::body::Body::from_stream(tokio_stream::wrappers::ReceiverStream::new(rx));
            ([(header::CONTENT_TYPE, "application/octet-stream")], body).into_response()
        }
        Ok(Err(e)) => op_problem(&app, &e),
        Err(_) => plain(StatusCode::INTERNAL_SERVER_ERROR, "IO_ERROR", "the output reader ended without an answer"),
    }
}

/// Pieces of a process's output in flight per `logs` request (see `process_logs`;
/// slots: `LOG_STREAMS_MAX`, each piece waits `LOG_SEND_TIMEOUT_MS` at most).
const LOGS_CHUNKS_IN_FLIGHT: usize = 4;

pub(super) async fn request_show(State(app): State<Arc<App>>, Path(id): Path<String>) -> Response {
    read(app, move |app| {
        let status = app.ledger.request_status(&id)?;
        to_value(Ok::<_, OpError>(ops::RequestShowResponse { status, torn_tail: false }))
    })
    .await
}

pub(super) async fn state(State(app): State<Arc<App>>, Query(q): Query<StateQuery>) -> Response {
    read(app, move |app| {
        let now_ms = crate::storage::LogOptions::default().now_ms();
        // Built under the commit engine's lock straight from the state (no copy of
        // it first): one subject is a lookup; the whole state costs what it holds.
        to_value(app.ledger.refresh_with_chain_head(|p, h| {
            ops::state_of(app.ledger.here(), p, h, false, q.subject.as_deref(), now_ms)
        })?)
    })
    .await
}

pub(super) async fn head(State(app): State<Arc<App>>) -> Response {
    read(app, move |app| {
        let head = app.ledger.head()?;
        to_value(Ok(crate::daemon::openapi::HeadAnswer { seq: head.seq, chain_head: crate::format::hex(&head.link) }))
    })
    .await
}

pub(super) async fn readyz(State(app): State<Arc<App>>) -> Response {
    if app.broken.load(Ordering::SeqCst) {
        return plain(
            StatusCode::SERVICE_UNAVAILABLE,
            "WRITER_POISONED",
            "the log cannot be written; restart the daemon",
        );
    }
    if let Some(why) = app.log_unavailable.lock().expect("log_unavailable").clone() {
        return plain(StatusCode::SERVICE_UNAVAILABLE, "ETCD_UNAVAILABLE", &why);
    }
    if app.admitting() { "ready\n".into_response() } else { not_admitting() }
}

pub(super) async fn admin_cutover(State(app): State<Arc<App>>, Query(q): Query<CutoverQuery>, body: Body) -> Response {
    // It takes no body: one with any field in it is refused as on every route.
    match body_object(body) {
        Ok(m) if m.is_empty() => {}
        Ok(m) => {
            let names: Vec<&str> = m.keys().map(String::as_str).collect();
            return plain(
                StatusCode::BAD_REQUEST,
                "INVALID_INPUT",
                &format!("unknown field(s) {names:?}: this route takes no body"),
            );
        }
        Err(r) => return *r,
    }
    if q.not_after_ms.is_some_and(|t| crate::storage::LogOptions::default().now_ms() > t) {
        return plain(StatusCode::CONFLICT, "EXPIRED", "this cutover request came after its deadline; ignored");
    }
    let tx = app_cutover(&app);
    match tx {
        Some(tx) => {
            let _ = tx.send(crate::daemon::CutoverAsked::because("POST /v1/admin/cutover")).await;
            (
                StatusCode::ACCEPTED,
                [(header::CONTENT_TYPE, "application/json")],
                serde_json::to_string(&crate::daemon::openapi::CutoverStarted { cutover: "started" })
                    .expect("serializes"),
            )
                .into_response()
        }
        None => plain(StatusCode::SERVICE_UNAVAILABLE, "CUTOVER_IN_PROGRESS", "a cutover is already under way"),
    }
}

pub(super) async fn metrics(State(app): State<Arc<App>>, headers: HeaderMap) -> Response {
    let Ok(permit) = Arc::clone(&app.inflight).try_acquire_owned() else {
        return overloaded();
    };
    // OpenMetrics only for a scraper that asks for it; the Prometheus text format
    // 0.0.4 otherwise (what promtool and curl read).
    let openmetrics = headers
        .get_all(header::ACCEPT)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .any(|v| v.contains("application/openmetrics-text"));
    let worker = Arc::clone(&app);
    let encoded = tokio::task::spawn_blocking(move || {
        let _permit = permit;
        crate::daemon::metrics::Metrics::scrape(&worker, openmetrics)
    })
    .await;
    let Ok(Ok(out)) = encoded else {
        return plain(StatusCode::INTERNAL_SERVER_ERROR, "IO_ERROR", "metrics encoding failed");
    };
    let kind =
        if openmetrics { crate::daemon::metrics::OPENMETRICS_TYPE } else { crate::daemon::metrics::TEXT_004_TYPE };
    ([(header::CONTENT_TYPE, kind)], out).into_response()
}

fn app_cutover(app: &App) -> Option<tokio::sync::mpsc::Sender<crate::daemon::CutoverAsked>> {
    app.admitting().then(|| app.cutover_tx.clone())
}
