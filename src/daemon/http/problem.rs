//! Problem documents (`application/problem+json`, RFC 9457, with the CLI's `code`
//! and evidence): the HTTP status of an operation's error, and the daemon's own
//! refusals (overloaded, not admitting).

use std::sync::atomic::Ordering;

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

use crate::daemon::App;
use crate::model::Refusal;
use crate::ops::OpError;

/// `application/problem+json` (RFC 9457) with the CLI's `code` and evidence.
pub(super) fn problem(
    status: StatusCode,
    code: &str,
    detail: &str,
    mut extra: serde_json::Map<String, Value>,
) -> Response {
    extra.insert("type".into(), json!(format!("urn:fencelog:problem:{}", code.to_ascii_lowercase())));
    extra.insert("title".into(), json!(code));
    extra.insert("status".into(), json!(status.as_u16()));
    // A refusal's own `detail` (evidence) is kept; otherwise RFC 9457's `detail`.
    extra.entry("detail").or_insert(json!(detail));
    extra.insert("code".into(), json!(code));
    let mut r = (status, serde_json::to_string(&Value::Object(extra)).expect("problem")).into_response();
    r.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/problem+json"));
    // Counted by `count`, whichever layer answered (front door or operation).
    r.extensions_mut().insert(ProblemCode(code.to_owned()));
    if status == StatusCode::SERVICE_UNAVAILABLE {
        r.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
    }
    r
}

/// The `code` of a problem response, for the refusals metric.
#[derive(Clone)]
pub(super) struct ProblemCode(pub(super) String);

pub(super) fn plain(status: StatusCode, code: &str, detail: &str) -> Response {
    problem(status, code, detail, serde_json::Map::new())
}

/// The HTTP status of an operation's error: refused 409, invalid 400, unknown 404,
/// draining 503, anything else (I/O, damage) 500.
pub fn problem_status(e: &OpError) -> StatusCode {
    match e {
        OpError::Refused(Refusal::UnknownProcess { .. } | Refusal::UnknownLease { .. }) => StatusCode::NOT_FOUND,
        OpError::Ledger(crate::ledger::LedgerError::Draining) => StatusCode::SERVICE_UNAVAILABLE,
        // etcd unreachable or without quorum (its outcome unknown, for a
        // mutation: retry with the same request id), or a reader cut under.
        OpError::Ledger(crate::ledger::LedgerError::Storage(s)) if s.is_transient() => StatusCode::SERVICE_UNAVAILABLE,
        // Known not to be in the log (a failed sync cut back): retry elsewhere.
        OpError::Ledger(crate::ledger::LedgerError::Storage(crate::storage::Error::NotCommitted { .. })) => {
            StatusCode::SERVICE_UNAVAILABLE
        }
        e => match e.exit_code() {
            3 => StatusCode::CONFLICT,
            2 => StatusCode::BAD_REQUEST,
            _ => StatusCode::INTERNAL_SERVER_ERROR,
        },
    }
}

pub(super) fn op_problem(app: &App, e: &OpError) -> Response {
    // The writer is poisoned after any of these: not ready until restarted.
    if matches!(e, OpError::Ledger(crate::ledger::LedgerError::Storage(_)))
        && matches!(e.code(), "WRITER_POISONED" | "NOT_COMMITTED" | "SYNC_FAILED")
    {
        app.broken.store(true, Ordering::SeqCst);
    }
    let status = problem_status(e);
    let body = serde_json::to_value(e.body()).expect("error body");
    // The CLI's error members, `message` included, beside RFC 9457's.
    let mut inner = body.get("error").and_then(Value::as_object).cloned().unwrap_or_default();
    let detail = inner.get("message").and_then(Value::as_str).unwrap_or_default().to_owned();
    let mut code = inner.remove("code").and_then(|c| c.as_str().map(str::to_owned)).unwrap_or_default();
    if matches!(e, OpError::Ledger(crate::ledger::LedgerError::Draining)) {
        code = "NOT_COMMITTED".into();
    }
    // A refusal the log keeps as evidence (a fenced write, a takeover race, …):
    // one line for the operator too.
    if crate::model::RECORDED_REFUSALS.contains(&code.as_str()) {
        let subject = inner.get("subject").and_then(|v| v.as_str()).unwrap_or("").to_owned();
        let (subject, detail) = (crate::view::escape_controls(&subject), crate::view::escape_controls(&detail));
        tracing::info!(code = %code, subject = %subject, detail = %detail, "refusal kept as evidence");
    }
    if code == "NOT_COMMITTED" {
        inner.insert("retryable".into(), json!(true));
    }
    problem(status, &code, &detail, inner)
}

pub(super) fn overloaded() -> Response {
    plain(StatusCode::SERVICE_UNAVAILABLE, "OVERLOADED", "too many requests in flight; retry shortly")
}

pub(super) fn not_admitting() -> Response {
    plain(
        StatusCode::SERVICE_UNAVAILABLE,
        "CUTOVER_IN_PROGRESS",
        "this daemon is handing over; retry against its successor",
    )
}
