//! The daemon's HTTP side, one room per seam: `problem` (problem documents and the
//! HTTP status of an operation's error), `front_door` (the middleware every route
//! passes: access log, counts, length gate, time limit, problem documents only,
//! bearer token and scopes), `body` (strict JSON request bodies), `mutate` (a
//! mutation's admission, run and answer), `handlers` (the routes), `watch` (the
//! Server-Sent Events stream) and `listen` (the capped listeners and the
//! connection loop). Here: the routes and the small items the rooms share.

mod body;
mod front_door;
mod handlers;
mod listen;
mod mutate;
mod problem;
mod watch;

use std::sync::Arc;

use axum::Router;
use axum::extract::DefaultBodyLimit;
use axum::http::{HeaderValue, StatusCode, header};
use axum::middleware;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde_json::Value;

use super::{App, BODY_BYTES_MAX};
use crate::ops::{self, GenerationOp};
use front_door::front_door;
use handlers::{
    admin_cutover, claim, generation, head, lease_acquire, lease_release, metrics, note, process_cancel, process_logs,
    process_show, process_wait, processes, readyz, request_show, run, state, takeover,
};
use problem::plain;
use watch::watch;

pub(crate) use listen::{CappedListener, UnixCapped, serve};
pub use problem::problem_status;
pub(crate) use watch::close_watches;

/// Every route the daemon serves (method, path): the OpenAPI document lists each
/// (a test holds them to it).
pub const ROUTES: &[(&str, &str)] = &[
    ("POST", "/v1/claim"),
    ("POST", "/v1/heartbeat"),
    ("POST", "/v1/release"),
    ("POST", "/v1/takeover"),
    ("POST", "/v1/rotate-fence"),
    ("POST", "/v1/note"),
    ("POST", "/v1/lease/acquire"),
    ("POST", "/v1/lease/release"),
    ("POST", "/v1/run"),
    ("GET", "/v1/processes"),
    ("GET", "/v1/processes/{id}"),
    ("POST", "/v1/processes/{id}/wait"),
    ("POST", "/v1/processes/{id}/cancel"),
    ("GET", "/v1/processes/{id}/logs"),
    ("GET", "/v1/requests/{id}"),
    ("GET", "/v1/state"),
    ("GET", "/v1/head"),
    ("GET", "/v1/version"),
    ("GET", "/v1/watch"),
    ("POST", "/v1/admin/cutover"),
    ("GET", "/v1/openapi.json"),
    ("GET", "/metrics"),
    ("GET", "/healthz"),
    ("GET", "/readyz"),
];

pub(crate) fn router(app: Arc<App>) -> Router {
    Router::new()
        .route("/v1/claim", post(claim))
        .route("/v1/heartbeat", post(|s, p, h, b| generation(s, p, h, b, GenerationOp::Heartbeat)))
        .route("/v1/release", post(|s, p, h, b| generation(s, p, h, b, GenerationOp::Release)))
        .route("/v1/rotate-fence", post(|s, p, h, b| generation(s, p, h, b, GenerationOp::RotateFence)))
        .route("/v1/takeover", post(takeover))
        .route("/v1/note", post(note))
        .route("/v1/lease/acquire", post(lease_acquire))
        .route("/v1/lease/release", post(lease_release))
        .route("/v1/run", post(run))
        .route("/v1/processes", get(processes))
        .route("/v1/processes/{id}", get(process_show))
        .route("/v1/processes/{id}/wait", post(process_wait))
        .route("/v1/processes/{id}/cancel", post(process_cancel))
        .route("/v1/processes/{id}/logs", get(process_logs))
        .route("/v1/requests/{id}", get(request_show))
        .route("/v1/state", get(state))
        .route("/v1/head", get(head))
        .route("/v1/version", get(|| async { axum::Json(ops::version::version_info()) }))
        .route("/v1/watch", get(watch))
        .route("/v1/admin/cutover", post(admin_cutover))
        .route(
            "/v1/openapi.json",
            get(|| async { ([(header::CONTENT_TYPE, "application/json")], super::openapi::document_json()) }),
        )
        .route("/metrics", get(metrics))
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz))
        .fallback(|| async { plain(StatusCode::NOT_FOUND, "NOT_FOUND", "no such route (see /v1/openapi.json)") })
        .layer(middleware::from_fn_with_state(Arc::clone(&app), front_door))
        .layer(DefaultBodyLimit::max(BODY_BYTES_MAX))
        .with_state(app)
}

/// A success: the value as JSON, naming the request id (`Idempotency-Key`) if any.
fn ok_json(value: &Value, request_id: Option<&str>) -> Response {
    // `to_vec`, not `to_string`: no formatter between the serializer and the buffer.
    let body = serde_json::to_vec(value).expect("a JSON value serializes");
    let mut r = (StatusCode::OK, [(header::CONTENT_TYPE, "application/json")], body).into_response();
    if let Some(id) = request_id.and_then(|i| HeaderValue::from_str(i).ok()) {
        r.headers_mut().insert("idempotency-key", id);
    }
    r
}

/// The process at the other end of a Unix-socket connection, by the kernel's
/// peer credentials (`SO_PEERCRED`): a caller on this host, known by its pid.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Peer {
    pub pid: u32,
}

/// The TCP peer of a connection (inserted only when the access log is on).
#[derive(Debug, Clone, Copy)]
pub(crate) struct TcpPeer(pub std::net::SocketAddr);
