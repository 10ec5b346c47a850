//! The daemon answers what `docs/openapi.json` says: every route is driven through
//! its success and each error the document lists for it (but 500 and 503, which
//! need a failing disk or an overload), against a real `fencelog serve`, and every
//! answer is validated against the document with a JSON Schema validator. A request
//! body the document says is valid is never refused 400, and each 400 this test
//! provokes with a body is one the document says is invalid too.

mod common;

use std::collections::BTreeSet;
use std::io::{Read, Write};
use std::path::Path;

use common::daemon::{Daemon, call, header};
use serde_json::{Value, json};

struct Doc {
    doc: Value,
}

impl Doc {
    fn load() -> Doc {
        let text = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/openapi.json")).unwrap();
        Doc { doc: serde_json::from_str(&text).unwrap() }
    }

    fn op(&self, method: &str, template: &str) -> &Value {
        let op = &self.doc["paths"][template][method.to_ascii_lowercase()];
        assert!(op.is_object(), "{method} {template} is not in the document");
        op
    }

    /// The documented response of an operation for a status (a `$ref` resolved).
    fn response(&self, method: &str, template: &str, status: u16) -> Option<&Value> {
        let r = self.op(method, template)["responses"].get(status.to_string())?;
        Some(match r["$ref"].as_str() {
            Some(reference) => &self.doc["components"]["responses"][reference.rsplit('/').next().unwrap()],
            None => r,
        })
    }

    /// A validator for `schema`, its `$ref`s resolved against the document's components.
    fn validator(&self, schema: &Value) -> jsonschema::Validator {
        let mut root = schema.clone();
        if let Value::Object(o) = &mut root {
            o.insert("components".into(), self.doc["components"].clone());
        } else {
            root = json!({"allOf": [schema], "components": self.doc["components"]});
        }
        jsonschema::options()
            .with_draft(jsonschema::Draft::Draft202012)
            .should_validate_formats(true)
            .build(&root)
            .unwrap_or_else(|e| panic!("a schema of the document does not compile: {e}: {schema}"))
    }

    fn check(&self, what: &str, schema: &Value, instance: &Value) {
        let v = self.validator(schema);
        let errors: Vec<String> = v.iter_errors(instance).map(|e| format!("{e} at {}", e.instance_path())).collect();
        assert!(errors.is_empty(), "{what}: the answer does not match the document: {errors:?}\n{instance:#}");
    }

    /// Does the document say this request body is valid?
    fn body_is_valid(&self, method: &str, template: &str, body: &Value) -> bool {
        let schema = &self.op(method, template)["requestBody"]["content"]["application/json"]["schema"];
        assert!(schema.is_object(), "{method} {template} documents no JSON body");
        self.validator(schema).is_valid(body)
    }
}

/// One call, its answer checked against the document; what it answered.
struct Conformance {
    doc: Doc,
    d: Daemon,
    read_token: String,
    admin_token: String,
    seen: BTreeSet<(String, String, u16)>,
}

#[derive(Clone, Copy, PartialEq)]
enum Token {
    None,
    Read,
    Write,
    Admin,
}

impl Conformance {
    /// Call `method path` (the route `template`) and check the answer: its status is
    /// documented for the operation, and its body matches that status's schema.
    #[allow(clippy::too_many_arguments)]
    fn call(
        &mut self,
        method: &str,
        template: &str,
        path: &str,
        token: Token,
        body: Option<Value>,
        headers: &[(&str, &str)],
        expect: u16,
    ) -> (Value, Vec<(String, String)>) {
        let t = match token {
            Token::None => None,
            Token::Read => Some(self.read_token.clone()),
            Token::Write => Some(self.d.token.clone()),
            Token::Admin => Some(self.admin_token.clone()),
        };
        let (status, answer, hs) = call(&self.d.url(path), method, t.as_deref(), body.clone(), headers);
        assert_eq!(status, expect, "{method} {path}: {answer}");
        self.seen.insert((method.into(), template.into(), status));
        let documented = self
            .doc
            .response(method, template, status)
            .unwrap_or_else(|| panic!("{method} {template} answered {status}, which the document does not list"))
            .clone();
        let content_type = header(&hs, "content-type").unwrap_or("").split(';').next().unwrap().trim().to_owned();
        let content = &documented["content"];
        if let Some(m) = content.as_object().filter(|m| !m.is_empty()) {
            let media = m.keys().find(|k| k.split(';').next().unwrap().trim() == content_type);
            let media = media.unwrap_or_else(|| panic!("{method} {path} {status}: {content_type} is not documented"));
            if content_type.ends_with("json") {
                self.doc.check(&format!("{method} {path} {status}"), &m[media]["schema"], &answer);
            }
        }
        // A body the document says is valid is never refused as invalid; a body
        // refused as invalid is one the document says is invalid.
        if let Some(b) = &body
            && self.doc.op(method, template)["requestBody"].is_object()
            && token != Token::None
            && token != Token::Read
        {
            let valid = self.doc.body_is_valid(method, template, b);
            if status == 400
                && answer["code"] == "INVALID_INPUT"
                && answer["detail"].as_str().is_some_and(|d| d.starts_with("invalid request"))
            {
                assert!(!valid, "{method} {path}: the document accepts a body the daemon refused: {b}");
            }
            if valid {
                assert_ne!(
                    status, 400,
                    "{method} {path}: a body the document says is valid was refused: {b}: {answer}"
                );
            }
        }
        (answer, hs)
    }

    /// A request whose `Content-Length` is over the limit: 413, before any body is read.
    fn too_large(&mut self, method: &str, template: &str, path: &str) {
        let mut s = std::net::TcpStream::connect(&self.d.addr).unwrap();
        write!(
            s,
            "{method} {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {}\r\nContent-Type: application/json\r\n\
             Content-Length: 70000\r\nConnection: close\r\n\r\n",
            self.d.token
        )
        .unwrap();
        let mut out = Vec::new();
        let _ = s.read_to_end(&mut out);
        let text = String::from_utf8_lossy(&out);
        let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
        assert!(head.starts_with("HTTP/1.1 413"), "{method} {path}: {head}");
        self.seen.insert((method.into(), template.into(), 413));
        let schema = &self.doc.response(method, template, 413).expect("413 documented")["content"]["application/problem+json"]
            ["schema"];
        self.doc.check(&format!("{method} {path} 413"), schema, &serde_json::from_str(body.trim()).unwrap());
    }
}

fn token_file(dir: &Path, name: &str) -> String {
    std::fs::read_to_string(dir.join(name)).unwrap().trim().to_owned()
}

/// Proves: every route's success and documented errors (400, 401, 403, 404, 409,
/// 413; 202 for the cutover) are answered as the document describes them, and the
/// document lists no such status this test could not provoke.
#[test]
fn every_route_answers_exactly_what_the_openapi_document_describes() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("log");
    let d = Daemon::start(&dir, &[]);
    let mut c = Conformance {
        doc: Doc::load(),
        read_token: token_file(&dir, "serve.read.token"),
        admin_token: token_file(&dir, "serve.admin.token"),
        d,
        seen: BTreeSet::new(),
    };
    use Token::{Admin, None as NoToken, Read, Write};
    let instance = "6f1c2a4e-3b5d-4c7e-9f80-1a2b3c4d5e6f";

    // Ownership.
    let (claimed, hs) = c.call(
        "POST",
        "/v1/claim",
        "/v1/claim",
        Write,
        Some(json!({"subject": "a", "instance": instance, "stale_after_ms": 60000})),
        &[("Idempotency-Key", "claim-a")],
        200,
    );
    assert_eq!(claimed["generation"], 1);
    assert_eq!(header(&hs, "idempotency-key"), Some("claim-a"));
    c.call("POST", "/v1/claim", "/v1/claim", Write, Some(json!({"subject": "a"})), &[], 409);
    c.call("POST", "/v1/claim", "/v1/claim", Write, Some(json!({"subject": "a", "bogus": 1})), &[], 400);
    c.call("POST", "/v1/heartbeat", "/v1/heartbeat", Write, Some(json!({"subject": "a", "generation": 1})), &[], 200);
    c.call("POST", "/v1/heartbeat", "/v1/heartbeat", Write, Some(json!({"subject": "a", "generation": 7})), &[], 409);
    c.call("POST", "/v1/heartbeat", "/v1/heartbeat", Write, Some(json!({"subject": "a"})), &[], 400);
    c.call(
        "POST",
        "/v1/note",
        "/v1/note",
        Write,
        Some(json!({"subject": "a", "generation": 1, "text": "n"})),
        &[],
        200,
    );
    c.call(
        "POST",
        "/v1/note",
        "/v1/note",
        Write,
        Some(json!({"subject": "nobody", "generation": 1, "text": "n"})),
        &[],
        409,
    );
    c.call(
        "POST",
        "/v1/note",
        "/v1/note",
        Write,
        Some(json!({"subject": "a", "generation": "1", "text": "n"})),
        &[],
        400,
    );
    c.call(
        "POST",
        "/v1/rotate-fence",
        "/v1/rotate-fence",
        Write,
        Some(json!({"subject": "a", "generation": 1})),
        &[],
        200,
    );
    let (fenced, _) = c.call(
        "POST",
        "/v1/rotate-fence",
        "/v1/rotate-fence",
        Write,
        Some(json!({"subject": "a", "generation": 1})),
        &[],
        409,
    );
    assert_eq!(fenced["code"], "FENCED");
    c.call("POST", "/v1/rotate-fence", "/v1/rotate-fence", Write, Some(json!({"generation": 1})), &[], 400);
    // A takeover of an owner that went stale at once.
    c.call("POST", "/v1/claim", "/v1/claim", Write, Some(json!({"subject": "b", "stale_after_ms": 1})), &[], 200);
    let (b, _) = c.call("GET", "/v1/state", "/v1/state?subject=b", Read, None, &[], 200);
    let hb = b["subjects"][0]["heartbeat_ms"].as_u64().unwrap();
    let takeover = json!({"subject": "b", "expect_generation": 1, "expect_heartbeat_ms": hb, "stale_after_ms": 60000});
    let (took, _) = c.call("POST", "/v1/takeover", "/v1/takeover", Write, Some(takeover.clone()), &[], 200);
    assert_eq!(took["retired"]["how"]["kind"], "taken_over");
    let again = json!({"subject": "b", "expect_generation": 1, "expect_heartbeat_ms": hb, "stale_after_ms": 60000, "request_id": "other"});
    c.call("POST", "/v1/takeover", "/v1/takeover", Write, Some(again), &[], 409);
    c.call("POST", "/v1/takeover", "/v1/takeover", Write, Some(json!({"subject": "b"})), &[], 400);
    c.call("POST", "/v1/release", "/v1/release", Write, Some(json!({"subject": "a", "generation": 2})), &[], 200);
    c.call("POST", "/v1/release", "/v1/release", Write, Some(json!({"subject": "a", "generation": 2})), &[], 409);
    c.call("POST", "/v1/release", "/v1/release", Write, Some(json!({"subject": 5, "generation": 2})), &[], 400);

    // Leases.
    let acquire = json!({"resource": "r", "mode": "write", "holder": "h", "ttl_ms": 60000});
    let (lease, _) = c.call("POST", "/v1/lease/acquire", "/v1/lease/acquire", Write, Some(acquire.clone()), &[], 200);
    c.call("POST", "/v1/lease/acquire", "/v1/lease/acquire", Write, Some(acquire), &[], 409);
    c.call(
        "POST",
        "/v1/lease/acquire",
        "/v1/lease/acquire",
        Write,
        Some(json!({"resource": "r", "mode": "exclusive"})),
        &[],
        400,
    );
    let wrong = json!({"lease": lease["lease"], "token": lease["token"].as_u64().unwrap() + 100});
    let (mismatch, _) = c.call("POST", "/v1/lease/release", "/v1/lease/release", Write, Some(wrong), &[], 409);
    assert_eq!(mismatch["code"], "LEASE_TOKEN_MISMATCH");
    let right = json!({"lease": lease["lease"], "token": lease["token"]});
    c.call("POST", "/v1/lease/release", "/v1/lease/release", Write, Some(right), &[], 200);
    c.call("POST", "/v1/lease/release", "/v1/lease/release", Write, Some(json!({"lease": 999, "token": 1})), &[], 404);
    c.call("POST", "/v1/lease/release", "/v1/lease/release", Write, Some(json!({"lease": -1, "token": 1})), &[], 400);

    // Processes.
    let (ran, _) = c.call(
        "POST",
        "/v1/run",
        "/v1/run",
        Write,
        Some(json!({"command": ["sh", "-c", "echo hi"], "wait_ms": 30000})),
        &[],
        200,
    );
    assert_eq!(ran["status"], "succeeded", "{ran}");
    let id = ran["id"].as_u64().unwrap();
    c.call("POST", "/v1/run", "/v1/run", Write, Some(json!({"command": "true"})), &[], 400);
    c.call(
        "POST",
        "/v1/run",
        "/v1/run",
        Write,
        Some(json!({"command": ["true"], "owner": "b", "generation": 1})),
        &[],
        409,
    );
    let (sleeper, _) =
        c.call("POST", "/v1/run", "/v1/run", Write, Some(json!({"command": ["sleep", "30"], "wait_ms": 0})), &[], 200);
    let sleeper = sleeper["id"].as_u64().unwrap();
    c.call("GET", "/v1/processes", "/v1/processes", Read, None, &[], 200);
    c.call("GET", "/v1/processes", "/v1/processes?status=succeeded", Read, None, &[], 200);
    c.call("GET", "/v1/processes", "/v1/processes?status=bogus", Read, None, &[], 400);
    c.call("GET", "/v1/processes/{id}", &format!("/v1/processes/{id}"), Read, None, &[], 200);
    c.call("GET", "/v1/processes/{id}", "/v1/processes/999", Read, None, &[], 404);
    c.call("GET", "/v1/processes/{id}", "/v1/processes/abc", Read, None, &[], 400);
    let wait = format!("/v1/processes/{id}/wait");
    c.call("POST", "/v1/processes/{id}/wait", &wait, Write, Some(json!({"timeout_ms": 1000})), &[], 200);
    c.call("POST", "/v1/processes/{id}/wait", "/v1/processes/999/wait", Write, Some(json!({})), &[], 404);
    c.call("POST", "/v1/processes/{id}/wait", &wait, Write, Some(json!({"timeout": 1})), &[], 400);
    // The sleeper is cancelled at once: 200 whatever its runner has done by then
    // (started: signalled; not yet: it never runs), the answer checked either way.
    let cancel = format!("/v1/processes/{sleeper}/cancel");
    let (cancelled, _) =
        c.call("POST", "/v1/processes/{id}/cancel", &cancel, Write, Some(json!({"grace_ms": 100})), &[], 200);
    assert!(cancelled["signalled"].is_boolean());
    // Cancelling a process that already ended answers it as it is (200, not signalled);
    // on the daemon's own home's behalf: 409.
    let home = json!({"owner": "fencelog/serve", "generation": 1});
    let (reserved, _) = c.call("POST", "/v1/processes/{id}/cancel", &cancel, Write, Some(home), &[], 409);
    assert_eq!(reserved["code"], "HOME_RESERVED");
    c.call("POST", "/v1/processes/{id}/cancel", "/v1/processes/999/cancel", Write, Some(json!({})), &[], 404);
    c.call("POST", "/v1/processes/{id}/cancel", &cancel, Write, Some(json!({"owner": "b"})), &[], 400);
    let logs = format!("/v1/processes/{id}/logs");
    let (out, _) = c.call("GET", "/v1/processes/{id}/logs", &logs, Read, None, &[], 200);
    assert_eq!(out, json!("hi\n"));
    c.call("GET", "/v1/processes/{id}/logs", "/v1/processes/999/logs", Read, None, &[], 404);
    c.call("GET", "/v1/processes/{id}/logs", &format!("{logs}?stream=both"), Read, None, &[], 400);

    // Reads.
    let (known, _) = c.call("GET", "/v1/requests/{id}", "/v1/requests/claim-a", Read, None, &[], 200);
    assert_eq!(known["status"], "committed");
    let (unknown, _) = c.call("GET", "/v1/requests/{id}", "/v1/requests/never", Read, None, &[], 200);
    assert_eq!(unknown["status"], "never_committed");
    c.call("GET", "/v1/state", "/v1/state", Read, None, &[], 200);
    c.call("GET", "/v1/state", "/v1/state?subject=", Read, None, &[], 400);
    c.call("GET", "/v1/state", "/v1/state?who=a", Read, None, &[], 400);
    c.call("GET", "/v1/head", "/v1/head", Read, None, &[], 200);
    c.call("GET", "/v1/version", "/v1/version", Read, None, &[], 200);
    let (served, _) = c.call("GET", "/v1/openapi.json", "/v1/openapi.json", Read, None, &[], 200);
    assert_eq!(served, c.doc.doc, "the served document is the committed one");
    c.call("GET", "/metrics", "/metrics", Read, None, &[], 200);
    c.call("GET", "/healthz", "/healthz", NoToken, None, &[], 200);
    c.call("GET", "/readyz", "/readyz", NoToken, None, &[], 200);
    c.call("GET", "/v1/watch", "/v1/watch?from=x", Read, None, &[], 400);
    c.call("GET", "/v1/watch", "/v1/watch", Read, None, &[("Last-Event-ID", "x")], 400);
    watch_records_match_the_document(&mut c);

    // The front door, on every operation.
    let ops: Vec<(String, String)> = c.doc.doc["paths"]
        .as_object()
        .unwrap()
        .iter()
        .flat_map(|(t, item)| item.as_object().unwrap().keys().map(move |m| (m.to_ascii_uppercase(), t.clone())))
        .collect();
    for (method, template) in &ops {
        let path = template.replace("{id}", &id.to_string());
        c.too_large(method, template, &path);
        if template == "/healthz" || template == "/readyz" {
            continue;
        }
        let body = (method == "POST").then(|| json!({}));
        c.call(method, template, &path, NoToken, body.clone(), &[], 401);
        if method == "POST" {
            c.call(method, template, &path, Read, body.clone(), &[], 403);
        }
    }
    c.call("POST", "/v1/admin/cutover", "/v1/admin/cutover", Write, None, &[], 403);

    // The cutover last: the daemon hands over and exits.
    c.call("POST", "/v1/admin/cutover", "/v1/admin/cutover?bogus=1", Admin, None, &[], 400);
    c.call("POST", "/v1/admin/cutover", "/v1/admin/cutover", Admin, Some(json!({"now": true})), &[], 400);
    c.call("POST", "/v1/admin/cutover", "/v1/admin/cutover?not_after_ms=1", Admin, None, &[], 409);
    c.call("POST", "/v1/admin/cutover", "/v1/admin/cutover", Admin, None, &[], 202);

    // Every documented status but 500 and 503 was provoked on every operation.
    let mut missing = vec![];
    for (method, template) in &ops {
        for status in c.doc.op(method, template)["responses"].as_object().unwrap().keys() {
            let s: u16 = status.parse().unwrap();
            if s != 500 && s != 503 && !c.seen.contains(&(method.clone(), template.clone(), s)) {
                missing.push(format!("{method} {template} {s}"));
            }
        }
    }
    assert!(missing.is_empty(), "documented but not provoked: {missing:?}");
}

/// The watch's first events, read off the wire: the `record` events' data match the
/// schema the document gives them (`x-sse-events`).
fn watch_records_match_the_document(c: &mut Conformance) {
    let events =
        c.doc.op("GET", "/v1/watch")["responses"]["200"]["content"]["text/event-stream"]["schema"]["x-sse-events"]
            .clone();
    let mut s = std::net::TcpStream::connect(&c.d.addr).unwrap();
    s.set_read_timeout(Some(std::time::Duration::from_secs(30))).unwrap();
    write!(s, "GET /v1/watch?from=1 HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {}\r\n\r\n", c.read_token).unwrap();
    let mut text = String::new();
    let mut buf = [0u8; 4096];
    // Read until the stream has sent three records (the log holds more).
    while text.matches("event: record").count() < 4 {
        let n = s.read(&mut buf).unwrap();
        assert!(n > 0, "the stream ended: {text}");
        text.push_str(&String::from_utf8_lossy(&buf[..n]));
    }
    assert!(text.starts_with("HTTP/1.1 200"), "{text}");
    assert!(text.contains("content-type: text/event-stream"), "{text}");
    c.seen.insert(("GET".into(), "/v1/watch".into(), 200));
    let mut checked = 0;
    for block in text.split("\n\n") {
        if !block.contains("event: record") {
            continue;
        }
        let data = block.lines().find_map(|l| l.strip_prefix("data: "));
        let Some(data) = data else { continue };
        let Ok(v) = serde_json::from_str::<Value>(data) else { continue }; // the last may be cut short
        c.doc.check("a watch record", &events["record"], &v);
        checked += 1;
    }
    assert!(checked >= 3, "{text}");
}
