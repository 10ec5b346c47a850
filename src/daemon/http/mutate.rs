//! A mutation's way through the daemon: admission (not during a cutover, within
//! the in-flight slots, never on the daemon's home), its request id, a task of its
//! own, its settlement for a cutover's record, and its answer.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Instant;

use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::Response;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};

use super::body::{Body, body_object, typed};
use super::ok_json;
use super::problem::{not_admitting, op_problem, overloaded, plain, problem};
use crate::daemon::App;
use crate::model::SettledRequest;
use crate::ops::{self, OpError};

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

/// The field of a request body that names the daemon's home subject, if any:
/// `subject` (claim, heartbeat, release, takeover, rotate-fence, note) or `owner`
/// (a lease or a run held by an owner's tenure, a cancel on an owner's behalf).
pub(super) fn names_home(app: &App, m: &serde_json::Map<String, Value>) -> Option<&'static str> {
    ["subject", "owner"].into_iter().find(|f| m.get(*f).and_then(Value::as_str) == Some(app.home.subject.as_str()))
}

pub(super) fn home_reserved(app: &App, field: &str) -> Response {
    plain(
        StatusCode::CONFLICT,
        "HOME_RESERVED",
        &format!(
            "{} is this daemon's home subject ({field}); nobody acts on it or as it over its own API",
            app.home.subject
        ),
    )
}

/// A mutation's answer: its JSON and how it settled (for a cutover's record).
pub(super) struct Answered {
    pub(super) json: Value,
    pub(super) settlement: ops::Settlement,
}

/// Admit a mutation, run it through the shared operations in a task of its own
/// (it runs to its end even if the client hangs up), and answer. The request id is
/// the `Idempotency-Key` header, else the body's `request_id`, else one made here
/// (returned in the header and the body), so a client that lost the answer can ask
/// `GET /v1/requests/{id}`.
pub(super) async fn mutate<T, F, Fut>(app: Arc<App>, op: &'static str, headers: HeaderMap, body: Body, f: F) -> Response
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
    if app.phase() == crate::daemon::Phase::Released {
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
    if app.phase() >= crate::daemon::Phase::Settling {
        let s = match &r {
            Ok(a) => a.settlement.clone(),
            Err(e) => ops::Settlement::of_error(e),
        };
        let (how, seq) = (s.how(), s.seq());
        app.settled.lock().expect("settled").push(SettledRequest { request: rid.clone(), op: op.into(), how, seq });
    }
    drop(admitted);
    answer(&app, &rid, r)
}

/// A finished mutation's answer: its JSON (naming its request id), or its problem
/// — an outcome unknown at a cutover is one (reconcile before any retry).
fn answer(app: &App, rid: &str, r: Result<Answered, OpError>) -> Response {
    match r {
        Ok(Answered { json: mut v, settlement }) => {
            let unknown = matches!(settlement, ops::Settlement::OutcomeUnknown { .. });
            if unknown && app.phase() >= crate::daemon::Phase::Draining {
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
            ok_json(&v, Some(rid))
        }
        Err(e) => op_problem(app, &e),
    }
}

/// A mutation's answer as JSON, built once (`to_value` would build it twice).
pub(super) fn op_json(r: Result<ops::OpResponse, OpError>) -> Result<Answered, OpError> {
    r.map(|v| Answered { settlement: v.settlement(), json: Value::Object(v.to_json()) })
}
