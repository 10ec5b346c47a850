//! Routes, authentication, problem responses, metrics and the watch stream.

use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, Path, Query, Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde::de::DeserializeOwned;
use serde_json::{Value, json};

use super::openapi::{CancelBody, CutoverQuery, LogsQuery, ProcessFilter, StateQuery, WaitBody, WatchQuery};
use super::{App, BODY_BYTES_MAX, HTTP_WAIT_MS_MAX};
use crate::model::{OwnerRef, Refusal, SettledRequest};
use crate::ops::{self, Caller, GenerationOp, OpError};
use crate::supervisor;

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

/// `application/problem+json` (RFC 9457) with the CLI's `code` and evidence.
fn problem(status: StatusCode, code: &str, detail: &str, mut extra: serde_json::Map<String, Value>) -> Response {
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
struct ProblemCode(String);

fn plain(status: StatusCode, code: &str, detail: &str) -> Response {
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

fn op_problem(app: &App, e: &OpError) -> Response {
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

fn ok_json(value: &Value, request_id: Option<&str>) -> Response {
    // `to_vec`, not `to_string`: no formatter between the serializer and the buffer.
    let body = serde_json::to_vec(value).expect("a JSON value serializes");
    let mut r = (StatusCode::OK, [(header::CONTENT_TYPE, "application/json")], body).into_response();
    if let Some(id) = request_id.and_then(|i| HeaderValue::from_str(i).ok()) {
        r.headers_mut().insert("idempotency-key", id);
    }
    r
}

/// Removes an admitted request from the cutover's view however its handler ends
/// (answered, or dropped by the time limit).
struct Admitted<'a> {
    app: &'a App,
    ticket: u64,
}

impl Drop for Admitted<'_> {
    fn drop(&mut self) {
        self.app.admitted.lock().expect("admitted").remove(&self.ticket);
    }
}

/// The front door of every route, in this order: count the answer (by route and
/// status, and every problem by code); refuse a body announced larger than the
/// limit; bound the request in time; turn axum's own errors into problem documents;
/// require the bearer token. (One middleware: five layers cost a boxed future and a
/// clone of the inner service each, per request.)
async fn front_door(State(app): State<Arc<App>>, req: Request, next: Next) -> Response {
    let route = req.extensions().get::<axum::extract::MatchedPath>().cloned();
    let access = app.access_log.then(|| AccessEntry::of(&req));
    let key = req.headers().get("idempotency-key").cloned();
    let mut r = length_gate(&app, req, next).await;
    // Answers made before the request id is known (an unreadable body, overload,
    // a cutover under way) still name the client's own key.
    if let Some(k) = key
        && !r.headers().contains_key("idempotency-key")
    {
        r.headers_mut().insert("idempotency-key", k);
    }
    let route = route.as_ref().map_or("unmatched", axum::extract::MatchedPath::as_str);
    if let Some(a) = access {
        a.log(route, &r);
    }
    app.metrics
        .requests
        .get_or_create(&vec![("route".into(), route.to_owned()), ("status".into(), r.status().as_u16().to_string())])
        .inc();
    // Every problem answered, by code: refusals of operations and the front door's
    // own (unauthorized, invalid body, too large, overloaded, not admitting).
    if let Some(ProblemCode(code)) = r.extensions().get::<ProblemCode>() {
        app.metrics.refusals.get_or_create(&vec![("code".into(), code.clone())]).inc();
    }
    r
}

/// What the access log (`serve --access-log`) says of one request, taken before it
/// is handled: one line at `info` per request, target `fencelog::access`.
struct AccessEntry {
    t0: Instant,
    method: axum::http::Method,
    request_id: Option<String>,
    caller: String,
    trace_id: Option<String>,
}

impl AccessEntry {
    fn of(req: &Request) -> AccessEntry {
        let h = req.headers();
        let text = |name: &str| h.get(name).and_then(|v| v.to_str().ok()).map(str::to_owned);
        let caller = match (req.extensions().get::<Peer>(), req.extensions().get::<TcpPeer>()) {
            (Some(p), _) => format!("unix pid {}", p.pid),
            (None, Some(TcpPeer(a))) => format!("tcp {a}"),
            _ => "unknown".into(),
        };
        AccessEntry {
            t0: Instant::now(),
            method: req.method().clone(),
            request_id: text("idempotency-key"),
            caller,
            trace_id: text("traceparent").and_then(|t| trace_id(&t)),
        }
    }

    fn log(self, route: &str, r: &Response) {
        // A server-made request id is on the answer.
        let request_id = r
            .headers()
            .get("idempotency-key")
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
            .or(self.request_id)
            .unwrap_or_default();
        tracing::info!(
            target: "fencelog::access",
            method = %self.method,
            route,
            status = r.status().as_u16(),
            latency_ms = (self.t0.elapsed().as_secs_f64() * 1e6).round() / 1e3,
            request_id = %crate::view::escape_controls(&request_id),
            caller = %self.caller,
            trace_id = self.trace_id.as_deref().unwrap_or(""),
            "request"
        );
    }
}

/// The trace id of a W3C `traceparent` header (`00-<32 hex>-<16 hex>-<2 hex>`),
/// if it is one.
fn trace_id(traceparent: &str) -> Option<String> {
    let mut parts = traceparent.trim().split('-');
    let (version, id) = (parts.next()?, parts.next()?);
    let hex = |s: &str, n: usize| s.len() == n && s.bytes().all(|b| b.is_ascii_hexdigit());
    (hex(version, 2) && hex(id, 32) && id.bytes().any(|b| b != b'0')).then(|| id.to_ascii_lowercase())
}

/// The TCP peer of a connection (inserted only when the access log is on).
#[derive(Debug, Clone, Copy)]
pub(crate) struct TcpPeer(pub std::net::SocketAddr);

/// A body announced larger than the limit is refused from its `Content-Length`,
/// before any of it is read — so a client that sent `Expect: 100-continue` hears
/// 413 instead of "continue" and never sends it.
async fn length_gate(app: &App, req: Request, next: Next) -> Response {
    let announced = req.headers().get(header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
    if announced.is_some_and(|n| n > BODY_BYTES_MAX as u64) {
        return plain(
            StatusCode::PAYLOAD_TOO_LARGE,
            "BODY_TOO_LARGE",
            &format!("a request body is at most {BODY_BYTES_MAX} bytes"),
        );
    }
    time_limit(app, req, next).await
}

/// Every request but a watch stream is bounded in time (reading its body
/// included): past the bound, 503 `REQUEST_TIMEOUT`. A mutation may still land
/// after that answer; its request id says (`GET /v1/requests/{id}`).
async fn time_limit(app: &App, req: Request, next: Next) -> Response {
    // A watch streams for as long as its client reads; the probes, the version and
    // the document answer at once, from memory (and so never 503 `REQUEST_TIMEOUT`,
    // as the OpenAPI document says).
    if matches!(req.uri().path(), "/v1/watch" | "/healthz" | "/readyz" | "/v1/version" | "/v1/openapi.json") {
        return problems_only(app, req, next).await;
    }
    match tokio::time::timeout(Duration::from_millis(super::REQUEST_TIME_MS_MAX), problems_only(app, req, next)).await {
        Ok(r) => r,
        Err(_) => plain(
            StatusCode::SERVICE_UNAVAILABLE,
            "REQUEST_TIMEOUT",
            &format!(
                "the request took longer than {} ms; a mutation may still land: ask GET /v1/requests/{{id}}",
                super::REQUEST_TIME_MS_MAX
            ),
        ),
    }
}

/// Errors axum answers itself (a path or query that does not parse, a method a
/// route does not have) become problem documents like every other error.
async fn problems_only(app: &App, req: Request, next: Next) -> Response {
    let r = auth(app, req, next).await;
    let status = r.status();
    let is_problem =
        r.headers().get(header::CONTENT_TYPE).is_some_and(|v| v.as_bytes().starts_with(b"application/problem+json"));
    if !(status.is_client_error() || status.is_server_error()) || is_problem {
        return r;
    }
    let text = axum::body::to_bytes(r.into_body(), 4096).await.unwrap_or_default();
    let detail = String::from_utf8_lossy(&text).trim().to_owned();
    let code = match status {
        StatusCode::NOT_FOUND => "NOT_FOUND",
        StatusCode::METHOD_NOT_ALLOWED => "METHOD_NOT_ALLOWED",
        StatusCode::PAYLOAD_TOO_LARGE => "BODY_TOO_LARGE",
        StatusCode::UNSUPPORTED_MEDIA_TYPE => "UNSUPPORTED_MEDIA_TYPE",
        s if s.is_client_error() => "INVALID_INPUT",
        _ => "IO_ERROR",
    };
    let detail = if detail.is_empty() { status.canonical_reason().unwrap_or("error").to_owned() } else { detail };
    plain(status, code, &detail)
}

/// The bearer token, on every route but `/healthz` and `/readyz`.
async fn auth(app: &App, req: Request, next: Next) -> Response {
    let path = req.uri().path();
    if path == "/healthz" || path == "/readyz" {
        return next.run(req).await;
    }
    let presented = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split_once(' '))
        .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
        .map(|(_, t)| t.trim().to_owned());
    let needed = if path.starts_with("/v1/admin/") {
        super::Scope::Admin
    } else if matches!(*req.method(), axum::http::Method::GET | axum::http::Method::HEAD) {
        super::Scope::Read
    } else {
        super::Scope::Write
    };
    match presented.as_deref().map(|t| app.scope_of(t.as_bytes())) {
        Some(Some(scope)) if scope >= needed => next.run(req).await,
        Some(Some(scope)) => {
            let mut extra = serde_json::Map::new();
            extra.insert("scope".into(), json!(needed.name()));
            extra.insert("token_scope".into(), json!(scope.name()));
            let mut r = problem(
                StatusCode::FORBIDDEN,
                "INSUFFICIENT_SCOPE",
                &format!("this needs a token with the {} scope; this one has {}", needed.name(), scope.name()),
                extra,
            );
            let challenge = format!("Bearer error=\"insufficient_scope\", scope=\"{}\"", needed.name());
            r.headers_mut().insert(header::WWW_AUTHENTICATE, HeaderValue::from_str(&challenge).expect("ascii"));
            r
        }
        // RFC 6750 §3: no credentials, no error code; wrong ones, `invalid_token`.
        Some(None) => {
            let mut r = plain(StatusCode::UNAUTHORIZED, "UNAUTHENTICATED", "the bearer token is not this daemon's");
            r.headers_mut()
                .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer error=\"invalid_token\""));
            r
        }
        None => {
            let mut r = plain(StatusCode::UNAUTHORIZED, "UNAUTHENTICATED", "a bearer token is required (serve.token)");
            r.headers_mut().insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
            r
        }
    }
}

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

type Body = Result<Bytes, BytesRejection>;

/// The JSON object of a request body (empty: `{}`), or the problem.
/// A request refused before it reached an operation (boxed: a response is large).
type Reject = Box<Response>;

fn body_object(body: Body) -> Result<serde_json::Map<String, Value>, Reject> {
    let bytes = body.map_err(|rej| {
        Box::new(if rej.status() == StatusCode::PAYLOAD_TOO_LARGE {
            plain(
                StatusCode::PAYLOAD_TOO_LARGE,
                "BODY_TOO_LARGE",
                &format!("a request body is at most {BODY_BYTES_MAX} bytes"),
            )
        } else {
            plain(StatusCode::BAD_REQUEST, "INVALID_INPUT", &rej.body_text())
        })
    })?;
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Ok(serde_json::Map::new());
    }
    match strict_json(&bytes) {
        Ok(Value::Object(m)) => Ok(m),
        Ok(_) => Err(Box::new(plain(StatusCode::BAD_REQUEST, "INVALID_INPUT", "the body is a JSON object"))),
        Err(e) => Err(Box::new(plain(StatusCode::BAD_REQUEST, "INVALID_INPUT", &format!("the body is not JSON: {e}")))),
    }
}

/// JSON as `serde_json` reads it, but a key twice in one object is an error (JSON
/// parsers disagree on which one wins: refused, never guessed).
fn strict_json(bytes: &[u8]) -> Result<Value, serde_json::Error> {
    struct Strict(Value);
    impl<'de> serde::Deserialize<'de> for Strict {
        fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Strict, D::Error> {
            d.deserialize_any(StrictVisitor).map(Strict)
        }
    }
    struct StrictVisitor;
    impl<'de> serde::de::Visitor<'de> for StrictVisitor {
        type Value = Value;
        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("a JSON value")
        }
        fn visit_bool<E>(self, v: bool) -> Result<Value, E> {
            Ok(Value::Bool(v))
        }
        fn visit_i64<E>(self, v: i64) -> Result<Value, E> {
            Ok(Value::from(v))
        }
        fn visit_u64<E>(self, v: u64) -> Result<Value, E> {
            Ok(Value::from(v))
        }
        fn visit_f64<E>(self, v: f64) -> Result<Value, E> {
            Ok(serde_json::Number::from_f64(v).map_or(Value::Null, Value::Number))
        }
        fn visit_str<E>(self, v: &str) -> Result<Value, E> {
            Ok(Value::String(v.to_owned()))
        }
        fn visit_string<E>(self, v: String) -> Result<Value, E> {
            Ok(Value::String(v))
        }
        fn visit_unit<E>(self) -> Result<Value, E> {
            Ok(Value::Null)
        }
        fn visit_none<E>(self) -> Result<Value, E> {
            Ok(Value::Null)
        }
        fn visit_some<D: serde::Deserializer<'de>>(self, d: D) -> Result<Value, D::Error> {
            Strict::deserialize(d).map(|s| s.0)
        }
        fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut a: A) -> Result<Value, A::Error> {
            let mut v = Vec::new();
            while let Some(Strict(x)) = a.next_element()? {
                v.push(x);
            }
            Ok(Value::Array(v))
        }
        fn visit_map<A: serde::de::MapAccess<'de>>(self, mut a: A) -> Result<Value, A::Error> {
            let mut m = serde_json::Map::new();
            while let Some(k) = a.next_key::<String>()? {
                let Strict(v) = a.next_value()?;
                if m.insert(k.clone(), v).is_some() {
                    return Err(serde::de::Error::custom(format!("the key {k:?} appears twice in one object")));
                }
            }
            Ok(Value::Object(m))
        }
    }
    use serde::Deserialize;
    let mut de = serde_json::Deserializer::from_slice(bytes);
    let Strict(v) = Strict::deserialize(&mut de)?;
    de.end()?;
    Ok(v)
}

fn typed<T: DeserializeOwned>(m: serde_json::Map<String, Value>) -> Result<T, Reject> {
    serde_json::from_value(Value::Object(m))
        .map_err(|e| Box::new(plain(StatusCode::BAD_REQUEST, "INVALID_INPUT", &format!("invalid request: {e}"))))
}

/// The field of a request body that names the daemon's home subject, if any:
/// `subject` (claim, heartbeat, release, takeover, rotate-fence, note) or `owner`
/// (a lease or a run held by an owner's tenure, a cancel on an owner's behalf).
fn names_home(app: &App, m: &serde_json::Map<String, Value>) -> Option<&'static str> {
    ["subject", "owner"].into_iter().find(|f| m.get(*f).and_then(Value::as_str) == Some(app.home.subject.as_str()))
}

fn home_reserved(app: &App, field: &str) -> Response {
    plain(
        StatusCode::CONFLICT,
        "HOME_RESERVED",
        &format!(
            "{} is this daemon's home subject ({field}); nobody acts on it or as it over its own API",
            app.home.subject
        ),
    )
}

fn overloaded() -> Response {
    plain(StatusCode::SERVICE_UNAVAILABLE, "OVERLOADED", "too many requests in flight; retry shortly")
}

fn not_admitting() -> Response {
    plain(
        StatusCode::SERVICE_UNAVAILABLE,
        "CUTOVER_IN_PROGRESS",
        "this daemon is handing over; retry against its successor",
    )
}

/// A mutation's answer: its JSON and how it settled (for a cutover's record).
struct Answered {
    json: Value,
    settlement: ops::Settlement,
}

/// Admit a mutation, run it through the shared operations in a task of its own
/// (it runs to its end even if the client hangs up), and answer. The request id is
/// the `Idempotency-Key` header, else the body's `request_id`, else one made here
/// (returned in the header and the body), so a client that lost the answer can ask
/// `GET /v1/requests/{id}`.
async fn mutate<T, F, Fut>(app: Arc<App>, op: &'static str, headers: HeaderMap, body: Body, f: F) -> Response
where
    T: DeserializeOwned + Send + 'static,
    F: FnOnce(Arc<App>, T) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = Result<Answered, OpError>> + Send + 'static,
{
    if !app.admitting() {
        return not_admitting();
    }
    let Ok(permit) = Arc::clone(&app.inflight).try_acquire_owned() else {
        return overloaded();
    };
    let mut m = match body_object(body) {
        Ok(m) => m,
        Err(r) => return *r,
    };
    if m.get("request_id").is_some_and(|v| !v.is_string() && !v.is_null()) {
        return plain(StatusCode::BAD_REQUEST, "INVALID_INPUT", "request_id is a string");
    }
    if headers.get_all("idempotency-key").iter().count() > 1 {
        return plain(StatusCode::BAD_REQUEST, "INVALID_INPUT", "one Idempotency-Key header, not several");
    }
    // The daemon's home is its own: no client may release, rotate or take it, nor
    // act as it (a lease or a run held by the home's tenure).
    if let Some(field) = names_home(&app, &m) {
        return home_reserved(&app, field);
    }
    let header_id = headers.get("idempotency-key").map(|v| v.to_str().map(str::to_owned));
    let body_id = m.get("request_id").and_then(Value::as_str).map(str::to_owned);
    let rid = match (header_id, body_id) {
        (Some(Err(_)), _) => return plain(StatusCode::BAD_REQUEST, "INVALID_INPUT", "Idempotency-Key is not text"),
        (Some(Ok(h)), Some(b)) if h != b => {
            return plain(StatusCode::BAD_REQUEST, "INVALID_INPUT", "Idempotency-Key and request_id differ");
        }
        (Some(Ok(h)), _) => h,
        (None, Some(b)) => b,
        (None, None) => format!("http-{}", uuid::Uuid::new_v4()),
    };
    m.insert("request_id".into(), json!(rid));
    // Every answer from here on names its request id — refusals too, so a
    // server-made id is never lost with a problem.
    let mut answer = admitted_answer(app, op, rid.clone(), m, permit, f).await;
    if !answer.headers().contains_key("idempotency-key")
        && let Ok(v) = HeaderValue::from_str(&rid)
    {
        answer.headers_mut().insert("idempotency-key", v);
    }
    answer
}

/// [`mutate`] once the request id is known: parse, admit, run, answer.
async fn admitted_answer<T, F, Fut>(
    app: Arc<App>,
    op: &'static str,
    rid: String,
    m: serde_json::Map<String, Value>,
    permit: tokio::sync::OwnedSemaphorePermit,
    f: F,
) -> Response
where
    T: DeserializeOwned + Send + 'static,
    F: FnOnce(Arc<App>, T) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = Result<Answered, OpError>> + Send + 'static,
{
    let req: T = match typed(m) {
        Ok(r) => r,
        Err(r) => return *r,
    };
    let ticket = app.next_ticket.fetch_add(1, Ordering::SeqCst);
    app.admitted.lock().expect("admitted").insert(ticket, (rid.clone(), op.to_owned()));
    let admitted = Admitted { app: &app, ticket };
    // Admission was checked before registering: a cutover that began in between
    // must see this request (it waits for the admitted set) or refuse it.
    if app.phase() == super::Phase::Released {
        return not_admitting();
    }
    let t0 = Instant::now();
    let worker = Arc::clone(&app);
    // The permit goes with the work: a client that hangs up does not free its
    // slot while its operation still runs.
    let r = tokio::spawn(async move {
        let _permit = permit;
        f(worker, req).await
    })
    .await
    .unwrap_or_else(|e| Err(OpError::Io { message: format!("the operation panicked: {e}") }));
    app.metrics.commit_seconds.get_or_create(&vec![("op".into(), op.to_owned())]).observe(t0.elapsed().as_secs_f64());
    if app.phase() >= super::Phase::Settling {
        let s = match &r {
            Ok(a) => a.settlement.clone(),
            Err(e) => ops::Settlement::of_error(e),
        };
        let (how, seq) = (s.how(), s.seq());
        app.settled.lock().expect("settled").push(SettledRequest { request: rid.clone(), op: op.into(), how, seq });
    }
    drop(admitted);
    match r {
        Ok(Answered { json: mut v, settlement }) => {
            let unknown = matches!(settlement, ops::Settlement::OutcomeUnknown { .. });
            if unknown && app.phase() >= super::Phase::Draining {
                let mut extra = serde_json::Map::new();
                extra.insert("retryable".into(), json!(false));
                extra.insert("action".into(), json!("reconcile"));
                extra.insert("request_id".into(), json!(rid));
                extra.insert("process".into(), v["id"].clone());
                return problem(
                    StatusCode::CONFLICT,
                    "OUTCOME_UNKNOWN",
                    "the spawn intent is recorded but its runner had not recorded a start at the cutover: reconcile \
                     (GET /v1/processes/{id}) before any retry",
                    extra,
                );
            }
            if let Value::Object(o) = &mut v {
                o.entry("request_id").or_insert(json!(rid));
            }
            ok_json(&v, Some(&rid))
        }
        Err(e) => op_problem(&app, &e),
    }
}

fn to_value<T: serde::Serialize>(r: Result<T, OpError>) -> Result<Value, OpError> {
    r.map(|v| serde_json::to_value(v).expect("responses serialize"))
}

/// A mutation's answer as JSON, built once (`to_value` would build it twice).
fn op_json(r: Result<ops::OpResponse, OpError>) -> Result<Answered, OpError> {
    r.map(|v| Answered { settlement: v.settlement(), json: Value::Object(v.to_json()) })
}

/// Owners over HTTP usually run on another host: without `pid` a claim is a
/// remote owner (instance only, never provably dead).
const REMOTE: Caller = Caller { default_pid: None, remote: true };

/// The process at the other end of a Unix-socket connection, by the kernel's
/// peer credentials (`SO_PEERCRED`): a caller on this host, known by its pid.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Peer {
    pub pid: u32,
}

/// Who calls: over TCP a remote caller; over the Unix socket the peer process
/// (a claim without `pid` is then held for it, and can be proven dead).
fn caller(peer: Option<axum::Extension<Peer>>) -> Caller {
    match peer {
        Some(axum::Extension(p)) => Caller { default_pid: Some(p.pid), remote: false },
        None => REMOTE,
    }
}

async fn claim(State(app): State<Arc<App>>, peer: Option<axum::Extension<Peer>>, h: HeaderMap, b: Body) -> Response {
    let who = caller(peer);
    mutate(app, "claim", h, b, move |app, r: ops::ClaimRequest| async move {
        op_json(ops::plan_claim(&app.ledger, &r, who)?.submit_async(&app.ledger).await)
    })
    .await
}

async fn generation(
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

async fn takeover(State(app): State<Arc<App>>, peer: Option<axum::Extension<Peer>>, h: HeaderMap, b: Body) -> Response {
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

async fn note(State(app): State<Arc<App>>, peer: Option<axum::Extension<Peer>>, h: HeaderMap, b: Body) -> Response {
    let who = caller(peer);
    mutate(app, "note", h, b, move |app, r: ops::NoteRequest| async move {
        op_json(ops::plan_note(&r, who)?.submit_async(&app.ledger).await)
    })
    .await
}

async fn lease_acquire(State(app): State<Arc<App>>, h: HeaderMap, b: Body) -> Response {
    mutate(app, "lease-acquire", h, b, |app, r: ops::LeaseAcquireRequest| async move {
        op_json(ops::plan_lease_acquire(&r)?.submit_async(&app.ledger).await)
    })
    .await
}

async fn lease_release(State(app): State<Arc<App>>, h: HeaderMap, b: Body) -> Response {
    mutate(app, "lease-release", h, b, |app, r: ops::LeaseReleaseRequest| async move {
        op_json(ops::plan_lease_release(&r)?.submit_async(&app.ledger).await)
    })
    .await
}

async fn run(State(app): State<Arc<App>>, h: HeaderMap, b: Body) -> Response {
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

async fn processes(State(app): State<Arc<App>>, Query(q): Query<ProcessFilter>) -> Response {
    read(app, move |app| {
        let r = app.ledger.refresh_with(|p| supervisor::list(p, q.status.as_deref(), q.owner.as_deref()))?;
        to_value(r)
    })
    .await
}

async fn process_show(State(app): State<Arc<App>>, Path(id): Path<u64>) -> Response {
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

async fn process_wait(State(app): State<Arc<App>>, Path(id): Path<u64>, b: Body) -> Response {
    let w: WaitBody = match body_object(b).and_then(typed) {
        Ok(w) => w,
        Err(r) => return *r,
    };
    let timeout_ms = w.timeout_ms.unwrap_or(supervisor::WAIT_MS_DEFAULT).min(HTTP_WAIT_MS_MAX);
    read(app, move |app| to_value(supervisor::wait(&app.ledger, id, timeout_ms))).await
}

async fn process_cancel(State(app): State<Arc<App>>, Path(id): Path<u64>, b: Body) -> Response {
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

async fn process_logs(State(app): State<Arc<App>>, Path(id): Path<u64>, Query(q): Query<LogsQuery>) -> Response {
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

async fn request_show(State(app): State<Arc<App>>, Path(id): Path<String>) -> Response {
    read(app, move |app| {
        let status = app.ledger.request_status(&id)?;
        to_value(Ok::<_, OpError>(ops::RequestShowResponse { status, torn_tail: false }))
    })
    .await
}

async fn state(State(app): State<Arc<App>>, Query(q): Query<StateQuery>) -> Response {
    read(app, move |app| {
        let now_ms = crate::storage::LogOptions::default().now_ms();
        // Built under the commit engine's lock straight from the state (no copy of
        // it first): one subject is a lookup; the whole state costs what it holds.
        to_value(
            app.ledger.refresh_with_head(|p, h| {
                ops::state_of(app.ledger.here(), p, h, false, q.subject.as_deref(), now_ms)
            })?,
        )
    })
    .await
}

async fn head(State(app): State<Arc<App>>) -> Response {
    read(app, move |app| {
        let (seq, link) = app.ledger.head()?;
        to_value(Ok(super::openapi::HeadAnswer { seq, chain_head: crate::format::hex(&link) }))
    })
    .await
}

async fn readyz(State(app): State<Arc<App>>) -> Response {
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

async fn admin_cutover(State(app): State<Arc<App>>, Query(q): Query<CutoverQuery>, body: Body) -> Response {
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
            let _ = tx.send(super::CutoverAsked::because("POST /v1/admin/cutover")).await;
            (
                StatusCode::ACCEPTED,
                [(header::CONTENT_TYPE, "application/json")],
                serde_json::to_string(&super::openapi::CutoverStarted { cutover: "started" }).expect("serializes"),
            )
                .into_response()
        }
        None => plain(StatusCode::SERVICE_UNAVAILABLE, "CUTOVER_IN_PROGRESS", "a cutover is already under way"),
    }
}

async fn metrics(State(app): State<Arc<App>>, headers: HeaderMap) -> Response {
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
        super::metrics::Metrics::scrape(&worker, openmetrics)
    })
    .await;
    let Ok(Ok(out)) = encoded else {
        return plain(StatusCode::INTERNAL_SERVER_ERROR, "IO_ERROR", "metrics encoding failed");
    };
    let kind = if openmetrics { super::metrics::OPENMETRICS_TYPE } else { super::metrics::TEXT_004_TYPE };
    ([(header::CONTENT_TYPE, kind)], out).into_response()
}

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
async fn watch(State(app): State<Arc<App>>, headers: HeaderMap, Query(q): Query<WatchQuery>) -> Response {
    let Ok(permit) = Arc::clone(&app.watchers).try_acquire_owned() else {
        return plain(StatusCode::SERVICE_UNAVAILABLE, "OVERLOADED", "too many watch streams");
    };
    // `Last-Event-ID` (a reconnecting EventSource) resumes just after it, and must
    // be a sequence; else `from`; else the records appended from now on, as
    // `inspect follow` starts (`from=1` replays the whole log).
    let resume = match headers.get("last-event-id").map(|v| v.to_str().ok().and_then(|v| v.trim().parse::<u64>().ok()))
    {
        Some(Some(last)) => Some(last.saturating_add(1)),
        Some(None) => {
            return plain(
                StatusCode::BAD_REQUEST,
                "INVALID_INPUT",
                "Last-Event-ID is the sequence of the last event seen",
            );
        }
        None => None,
    };
    let from = match resume.or(q.from) {
        Some(f) => f.max(1),
        // The head waits for the engine (and may catch up with etcd): never on
        // an async worker.
        None => {
            let ledger = Arc::clone(&app.ledger);
            match tokio::task::spawn_blocking(move || ledger.head()).await {
                Ok(Ok((seq, _))) => seq + 1,
                Ok(Err(e)) => return op_problem(&app, &OpError::from(e)),
                Err(_) => return plain(StatusCode::INTERNAL_SERVER_ERROR, "IO_ERROR", "reading the head failed"),
            }
        }
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
        // The backend's own reader: a directory's segments, or etcd's keys (woken
        // by etcd's watch of the head).
        let mut reader = backend.reader(from);
        loop {
            let mut gone = false;
            let polled = reader.poll(&mut |r| {
                if gone {
                    return;
                }
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
                let ev = match json {
                    Ok(data) => SseEvent::default().id(r.seq.to_string()).event("record").data(data),
                    Err(_) => {
                        gone = true;
                        let detail = format!("record {} could not be shown; the stream ends before it", r.seq);
                        let _ = tx.blocking_send(Ok(SseEvent::default().event("error").data(detail)));
                        return;
                    }
                };
                gone = tx.blocking_send(Ok(ev)).is_err();
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
    });
    Sse::new(tokio_stream::wrappers::ReceiverStream::new(rx))
        .keep_alive(KeepAlive::new().interval(Duration::from_millis(WATCH_KEEPALIVE_MS)).text("keep-alive"))
        .into_response()
}

fn app_cutover(app: &App) -> Option<tokio::sync::mpsc::Sender<super::CutoverAsked>> {
    app.admitting().then(|| app.cutover_tx.clone())
}

fn watch_closed(app: &App) -> tokio::sync::watch::Receiver<bool> {
    app.watch_close.subscribe()
}

pub(crate) fn close_watches(app: &App) {
    let _ = app.watch_close.send(true);
}

/// A listener that holds at most `max` connections open: the next is accepted
/// only when one closes (it waits in the kernel's backlog meanwhile). Connections
/// cost descriptors, and the ledger needs descriptors of its own: a flood of idle
/// connections must never make an append or a sync fail.
pub(crate) struct CappedListener {
    pub inner: tokio::net::TcpListener,
    pub slots: Arc<tokio::sync::Semaphore>,
}

pub(crate) struct CappedIo<S> {
    io: S,
    _slot: tokio::sync::OwnedSemaphorePermit,
}

impl<S: tokio::io::AsyncRead + Unpin> tokio::io::AsyncRead for CappedIo<S> {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl<S: tokio::io::AsyncWrite + Unpin> tokio::io::AsyncWrite for CappedIo<S> {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        std::pin::Pin::new(&mut self.io).poll_write(cx, buf)
    }
    fn poll_flush(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.io).poll_flush(cx)
    }
    fn poll_shutdown(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

impl CappedListener {
    /// The next connection, once one of the slots is free.
    async fn accept(&self) -> (CappedIo<tokio::net::TcpStream>, std::net::SocketAddr) {
        let slot = Arc::clone(&self.slots).acquire_owned().await.expect("the semaphore is never closed");
        loop {
            match self.inner.accept().await {
                Ok((io, addr)) => {
                    let _ = io.set_nodelay(true);
                    return (CappedIo { io, _slot: slot }, addr);
                }
                // Out of descriptors or similar: wait a little, never spin.
                Err(e) => {
                    tracing::warn!("accept: {e}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
        }
    }
}

/// The Unix-socket listener: it shares the connection slots with TCP, and each of
/// its connections carries the peer's credentials.
pub(crate) struct UnixCapped {
    pub inner: tokio::net::UnixListener,
    pub slots: Arc<tokio::sync::Semaphore>,
}

impl UnixCapped {
    async fn accept(&self) -> (CappedIo<tokio::net::UnixStream>, Option<Peer>) {
        let slot = Arc::clone(&self.slots).acquire_owned().await.expect("the semaphore is never closed");
        loop {
            match self.inner.accept().await {
                Ok((io, _)) => {
                    let peer = io.peer_cred().ok().and_then(|c| {
                        let pid = u32::try_from(c.pid()?).ok()?;
                        Some(Peer { pid })
                    });
                    return (CappedIo { io, _slot: slot }, peer);
                }
                Err(e) => {
                    tracing::warn!("accept (unix): {e}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
        }
    }
}

/// The daemon's connection loop: HTTP/1.1 on every accepted connection, with
/// hyper's header-read timeout (`header_read`): a client has that long to send a
/// request's headers — on a new connection, and between requests on a kept-alive
/// one (hyper starts the timer when it waits for a request head), so idle and
/// slow-header connections are closed and their slots freed. On `shutdown` it
/// stops accepting, lets every connection finish its request (graceful), and
/// returns once all are closed.
pub(crate) async fn serve(
    tcp: CappedListener,
    unix: Option<UnixCapped>,
    router: Router,
    header_read: Duration,
    shutdown: tokio::sync::watch::Receiver<bool>,
    access_log: bool,
) {
    // Every connection task holds a clone of `alive`; `closed()` resolves once
    // all are dropped.
    let (alive, _) = tokio::sync::watch::channel(());
    let mut stop = shutdown.clone();
    loop {
        let unix_accept = async {
            match &unix {
                Some(u) => u.accept().await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            (io, addr) = tcp.accept() => {
                // The peer's address is carried only for the access log (a layer
                // per connection costs every request a little).
                let svc = if access_log { router.clone().layer(axum::Extension(TcpPeer(addr))) } else { router.clone() };
                connection(io, svc, header_read, shutdown.clone(), alive.subscribe());
            }
            (io, peer) = unix_accept => {
                let svc = match peer {
                    Some(p) => router.clone().layer(axum::Extension(p)),
                    // A peer the kernel does not name is served as a remote caller.
                    None => router.clone(),
                };
                connection(io, svc, header_read, shutdown.clone(), alive.subscribe());
            }
            _ = stop.wait_for(|d| *d) => break,
        }
    }
    drop(tcp);
    drop(unix);
    alive.closed().await;
}

fn connection<I>(
    io: I,
    svc: Router,
    header_read: Duration,
    mut shutdown: tokio::sync::watch::Receiver<bool>,
    alive: tokio::sync::watch::Receiver<()>,
) where
    I: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    tokio::spawn(async move {
        let svc = hyper_util::service::TowerToHyperService::new(svc);
        let mut builder = hyper::server::conn::http1::Builder::new();
        builder.timer(hyper_util::rt::TokioTimer::new()).header_read_timeout(header_read).keep_alive(true);
        let conn = builder.serve_connection(hyper_util::rt::TokioIo::new(io), svc);
        let mut conn = std::pin::pin!(conn);
        let mut closing = false;
        loop {
            tokio::select! {
                r = conn.as_mut() => {
                    if let Err(e) = r {
                        tracing::debug!("connection: {e}");
                    }
                    break;
                }
                _ = shutdown.wait_for(|d| *d), if !closing => {
                    closing = true;
                    conn.as_mut().graceful_shutdown();
                }
            }
        }
        drop(alive);
    });
}
