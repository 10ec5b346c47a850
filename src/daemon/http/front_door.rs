//! The front door every route passes through (one middleware): the access log and
//! the counts, the length gate, the time limit, problem documents only, and the
//! bearer token with its scopes.

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::extract::{Request, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::middleware::Next;
use axum::response::Response;
use serde_json::json;

use super::problem::{ProblemCode, plain, problem};
use super::{Peer, TcpPeer};
use crate::daemon::{App, BODY_BYTES_MAX};

/// The front door of every route, in this order: count the answer (by route and
/// status, and every problem by code); refuse a body announced larger than the
/// limit; bound the request in time; turn axum's own errors into problem documents;
/// require the bearer token. (One middleware: five layers cost a boxed future and a
/// clone of the inner service each, per request.)
pub(super) async fn front_door(State(app): State<Arc<App>>, req: Request, next: Next) -> Response {
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
    match tokio::time::timeout(Duration::from_millis(crate::daemon::REQUEST_TIME_MS_MAX), problems_only(app, req, next))
        .await
    {
        Ok(r) => r,
        Err(_) => plain(
            StatusCode::SERVICE_UNAVAILABLE,
            "REQUEST_TIMEOUT",
            &format!(
                "the request took longer than {} ms; a mutation may still land: ask GET /v1/requests/{{id}}",
                crate::daemon::REQUEST_TIME_MS_MAX
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
        crate::daemon::Scope::Admin
    } else if matches!(*req.method(), axum::http::Method::GET | axum::http::Method::HEAD) {
        crate::daemon::Scope::Read
    } else {
        crate::daemon::Scope::Write
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
