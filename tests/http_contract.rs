//! What the daemon's answers promise a client that was written against them: the
//! request id on every answer that has one (problems too), 401 that tells a
//! missing token from a wrong one, bodies read strictly (a key twice, an unknown
//! field: 400 on every route), and a watch that starts at the head, validates
//! `Last-Event-ID`, and says how to reconnect. A real daemon on loopback.

mod common;

use std::io::{BufRead, BufReader};

use common::daemon::{Daemon, agent, call, header};
use serde_json::{Value, json};

fn daemon() -> (tempfile::TempDir, Daemon) {
    let t = tempfile::tempdir().unwrap();
    let d = Daemon::start(&t.path().join("log"), &[]);
    (t, d)
}

/// POST a raw body (not re-encoded: a duplicate key survives), with the daemon's
/// write token, or its admin token for `/v1/admin/*`.
fn post_raw(d: &Daemon, path: &str, body: &str) -> (u16, Value) {
    let token = if path.starts_with("/v1/admin/") {
        std::fs::read_to_string(d.ready["admin_token_file"].as_str().unwrap()).unwrap().trim().to_owned()
    } else {
        d.token.clone()
    };
    let resp = agent()
        .post(&d.url(path))
        .header("Authorization", &format!("Bearer {token}"))
        .header("Content-Type", "application/json")
        .send(body)
        .unwrap();
    let status = resp.status().as_u16();
    (status, serde_json::from_str(&resp.into_body().read_to_string().unwrap()).unwrap_or(Value::Null))
}

/// Proves: a refused mutation's problem carries its request id in
/// `Idempotency-Key` — the client's own, or the one the server made (which was
/// lost with the refusal before) — and the log answers for that id.
#[test]
fn the_request_id_is_on_every_answer_problems_included() {
    let (_t, d) = daemon();
    assert_eq!(d.post("/v1/claim", json!({"subject": "x"})).0, 200);
    let (s, e, hs) = d.call("POST", "/v1/claim", Some(json!({"subject": "x"})), &[("Idempotency-Key", "mine-1")]);
    assert_eq!((s, e["code"].as_str()), (409, Some("ALREADY_ACTIVE")));
    assert_eq!(header(&hs, "idempotency-key"), Some("mine-1"));
    let (s, _, hs) = d.call("POST", "/v1/claim", Some(json!({"subject": "x"})), &[]);
    assert_eq!(s, 409);
    let made = header(&hs, "idempotency-key").expect("a server-made id on the problem").to_owned();
    assert!(made.starts_with("http-"), "{made}");
    let (s, r) = d.get(&format!("/v1/requests/{made}"));
    assert_eq!((s, r["status"].as_str()), (200, Some("never_committed")), "{r}");
    // An invalid body is refused with the id too (the id is known before the body is typed).
    let (s, _, hs) =
        d.call("POST", "/v1/claim", Some(json!({"subject": "y", "bogus": 1})), &[("Idempotency-Key", "k-2")]);
    assert_eq!((s, header(&hs, "idempotency-key")), (400, Some("k-2")));
}

/// Proves: 401 tells a missing token (`WWW-Authenticate: Bearer`) from a wrong
/// one (`Bearer error="invalid_token"`, RFC 6750 §3), both problem+json
/// `UNAUTHENTICATED`.
#[test]
fn a_missing_token_and_a_wrong_token_are_told_apart() {
    let (_t, d) = daemon();
    let (s, e, hs) = call(&d.url("/v1/state"), "GET", None, None, &[]);
    assert_eq!(
        (s, e["code"].as_str(), header(&hs, "www-authenticate")),
        (401, Some("UNAUTHENTICATED"), Some("Bearer"))
    );
    let (s, e, hs) = call(&d.url("/v1/state"), "GET", Some("not-the-token-not-the-token"), None, &[]);
    assert_eq!(
        (s, e["code"].as_str(), header(&hs, "www-authenticate")),
        (401, Some("UNAUTHENTICATED"), Some("Bearer error=\"invalid_token\""))
    );
}

/// Proves: a body with a key twice is 400 `INVALID_INPUT` naming the key (JSON
/// parsers disagree on which wins: nothing is guessed, nothing committed), and an
/// unknown field is 400 on every route — a mutation, a process wait, and the
/// admin route, which takes no body.
#[test]
fn duplicate_keys_and_unknown_fields_are_refused_on_every_route() {
    let (_t, d) = daemon();
    let head = d.get("/v1/head").1["seq"].clone();
    let (s, e) = post_raw(&d, "/v1/claim", r#"{"subject": "a", "subject": "b"}"#);
    assert_eq!((s, e["code"].as_str()), (400, Some("INVALID_INPUT")), "{e}");
    assert!(e["detail"].as_str().unwrap().contains("\"subject\" appears twice"), "{e}");
    let (s, _) = post_raw(&d, "/v1/claim", r#"{"subject": "a", "nested": {"k": 1, "k": 2}}"#);
    assert_eq!(s, 400, "twice in a nested object too");
    assert_eq!(d.get("/v1/head").1["seq"], head, "nothing committed");
    for (path, body) in [
        ("/v1/claim", r#"{"subject": "a", "stale_after": 5}"#),
        ("/v1/processes/1/wait", r#"{"timeout": 5}"#),
        ("/v1/admin/cutover", r#"{"reason": "why not"}"#),
    ] {
        let (s, e) = post_raw(&d, path, body);
        assert_eq!((s, e["code"].as_str()), (400, Some("INVALID_INPUT")), "{path}: {e}");
    }
    let (s, _) = d.get("/v1/state?subjet=a");
    assert_eq!(s, 400, "an unknown query parameter too");
    assert_eq!(call(&d.url("/readyz"), "GET", None, None, &[]).0, 200, "the refused admin call started no cutover");
}

/// Reads SSE lines from a watch until `until` says stop; every line read.
fn watch_lines(d: &Daemon, query: &str, last: Option<&str>, until: impl Fn(&[String]) -> bool) -> Vec<String> {
    let mut r =
        agent().get(&d.url(&format!("/v1/watch{query}"))).header("Authorization", &format!("Bearer {}", d.token));
    if let Some(l) = last {
        r = r.header("Last-Event-ID", l);
    }
    let resp = r.call().unwrap();
    assert_eq!(resp.status().as_u16(), 200);
    let mut reader = BufReader::new(resp.into_body().into_reader());
    let mut lines = vec![];
    while !until(&lines) {
        let mut line = String::new();
        assert!(reader.read_line(&mut line).unwrap() > 0, "the stream ended: {lines:?}");
        lines.push(line.trim_end().to_owned());
    }
    lines
}

/// Proves: a watch without `from` or `Last-Event-ID` starts at the head (only
/// records appended from then on, as `inspect follow`), and says so; every stream
/// first sends `retry:` (how long to wait before reconnecting); `from=1` replays
/// from the start; an invalid `Last-Event-ID` is 400.
#[test]
fn a_watch_starts_at_the_head_says_how_to_reconnect_and_checks_last_event_id() {
    let (_t, d) = daemon();
    for i in 0..3 {
        assert_eq!(d.post("/v1/claim", json!({"subject": format!("w{i}")})).0, 200);
    }
    let head = d.get("/v1/head").1["seq"].as_u64().unwrap();
    let url = d.url("/v1/claim");
    let token = d.token.clone();
    // The id of the first record a stream shows (the `id:` before its first
    // `data:`; the stream's opening event has an id and no data).
    let first_id = |lines: &[String]| {
        let data = lines.iter().position(|l| l.starts_with("data:"))?;
        lines[..data].iter().rev().find_map(|l| l.strip_prefix("id:").map(|v| v.trim().to_owned()))
    };
    let claimer = std::thread::spawn(move || {
        // Started before the stream is read: it may land before or after the
        // stream fixes its start; either way the stream shows nothing older
        // than the head it found.
        call(&url, "POST", Some(&token), Some(json!({"subject": "new"})), &[]).0
    });
    let lines = watch_lines(&d, "", None, |l| first_id(l).is_some());
    assert_eq!(claimer.join().unwrap(), 200);
    // The opening event: where the stream starts (`: from N`), the id of the
    // record before it (a client reconnecting before any record resumes there),
    // and the reconnection delay.
    let opening: Vec<&String> = lines.iter().take_while(|l| !l.is_empty()).collect();
    assert!(opening.iter().any(|l| l.starts_with("retry:")), "retry first: {lines:?}");
    let from: u64 = opening.iter().find_map(|l| l.strip_prefix(": from ")).expect("from").parse().unwrap();
    assert!(from > head, "{lines:?}");
    assert!(
        opening.iter().any(|l| l.trim() == format!("id: {}", from - 1) || l.trim() == format!("id:{}", from - 1)),
        "{lines:?}"
    );
    let id: u64 = first_id(&lines).unwrap().parse().unwrap();
    assert!(id > head, "nothing from before the head ({head}): {id}");
    let replay = watch_lines(&d, "?from=1", None, |l| first_id(l).is_some());
    assert_eq!(first_id(&replay).as_deref(), Some("1"), "from=1 replays from the start");
    for bad in ["x", "-1", "1.5"] {
        let (s, e, _) = d.call("GET", "/v1/watch", None, &[("Last-Event-ID", bad)]);
        assert_eq!((s, e["code"].as_str()), (400, Some("INVALID_INPUT")), "Last-Event-ID {bad}: {e}");
    }
}

/// Proves: the daemon makes three tokens on first start — `serve.token` (write),
/// `serve.read.token`, `serve.admin.token`, each 0600, all different, named in
/// the ready line — and each can do what its scope says and no more: read
/// GETs, watches and scrapes, and is refused a mutation with 403
/// `INSUFFICIENT_SCOPE` naming the scope needed; write mutates and is refused the
/// admin route; admin starts a cutover.
#[test]
fn tokens_have_scopes_read_write_and_admin() {
    use std::os::unix::fs::PermissionsExt;
    let t = tempfile::tempdir().unwrap();
    let dir = t.path().join("log");
    let d = Daemon::start(&dir, &[]);
    let token = |name: &str| {
        let p = dir.join(name);
        assert_eq!(std::fs::metadata(&p).unwrap().permissions().mode() & 0o777, 0o600, "{name}");
        std::fs::read_to_string(p).unwrap().trim().to_owned()
    };
    let (read, write, admin) = (token("serve.read.token"), token("serve.token"), token("serve.admin.token"));
    assert!(read != write && write != admin && read != admin);
    assert_eq!(d.ready["read_token_file"], dir.join("serve.read.token").to_str().unwrap());
    assert_eq!(d.ready["admin_token_file"], dir.join("serve.admin.token").to_str().unwrap());
    for path in ["/v1/state", "/v1/head", "/metrics", "/v1/version"] {
        assert_eq!(call(&d.url(path), "GET", Some(&read), None, &[]).0, 200, "read may GET {path}");
    }
    let (s, e, hs) = call(&d.url("/v1/claim"), "POST", Some(&read), Some(json!({"subject": "s"})), &[]);
    assert_eq!((s, e["code"].as_str(), e["scope"].as_str()), (403, Some("INSUFFICIENT_SCOPE"), Some("write")), "{e}");
    assert_eq!(e["token_scope"], "read");
    assert_eq!(header(&hs, "www-authenticate"), Some("Bearer error=\"insufficient_scope\", scope=\"write\""));
    assert_eq!(call(&d.url("/v1/claim"), "POST", Some(&write), Some(json!({"subject": "s"})), &[]).0, 200);
    assert_eq!(call(&d.url("/v1/claim"), "POST", Some(&admin), Some(json!({"subject": "t"})), &[]).0, 200);
    let (s, e, _) = call(&d.url("/v1/admin/cutover"), "POST", Some(&write), None, &[]);
    assert_eq!((s, e["scope"].as_str()), (403, Some("admin")), "{e}");
    assert_eq!(call(&d.url("/readyz"), "GET", None, None, &[]).0, 200, "no cutover from a write token");
    let (s, _, _) = call(&d.url("/v1/admin/cutover"), "POST", Some(&admin), None, &[]);
    assert_eq!(s, 202);
    let mut d = d;
    assert_eq!(d.child.wait().unwrap().code(), Some(0), "cut over");
}

/// Proves: a token file that others may read is refused at start (exit 2,
/// `INVALID_TOKEN_FILE`, naming the file and `chmod 600`), as ssh refuses such a
/// key; nothing is claimed.
#[test]
fn a_token_file_others_can_read_is_refused_at_start() {
    use std::os::unix::fs::PermissionsExt;
    let t = tempfile::tempdir().unwrap();
    let dir = t.path().join("log");
    let mut d = Daemon::start(&dir, &[]);
    unsafe { libc::kill(d.child.id() as i32, libc::SIGTERM) };
    assert_eq!(d.child.wait().unwrap().code(), Some(0));
    let read = dir.join("serve.read.token");
    std::fs::set_permissions(&read, std::fs::Permissions::from_mode(0o644)).unwrap();
    match Daemon::try_start(&dir, &[]) {
        Ok(_) => panic!("a world-readable token file was accepted"),
        Err((code, out)) => {
            let v: Value = serde_json::from_str(out.trim()).unwrap_or_else(|_| panic!("{out}"));
            assert_eq!((code, v["error"]["code"].as_str()), (Some(2), Some("INVALID_TOKEN_FILE")), "{v}");
            let message = v["error"]["message"].as_str().unwrap();
            assert!(message.contains("serve.read.token") && message.contains("chmod 600"), "{message}");
        }
    }
}

/// Proves: an answer made before the request id is known — a body that is not
/// JSON — still names the client's `Idempotency-Key`.
#[test]
fn early_refusals_still_name_the_clients_key() {
    let (_t, d) = daemon();
    let resp = agent()
        .post(&d.url("/v1/claim"))
        .header("Authorization", &format!("Bearer {}", d.token))
        .header("Idempotency-Key", "early-1")
        .send("{not json")
        .unwrap();
    assert_eq!(resp.status().as_u16(), 400);
    assert_eq!(resp.headers().get("idempotency-key").and_then(|v| v.to_str().ok()), Some("early-1"));
}
