//! The daemon (issue 11): a real `fencelog serve` process on loopback, real HTTP.
//! Each test opens with what it proves.

use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

mod common;

use serde_json::{Value, json};

use common::daemon::{Daemon, FENCELOG, agent, call, header};

fn log_dir() -> (tempfile::TempDir, PathBuf) {
    let t = tempfile::tempdir().unwrap();
    let d = t.path().join("log");
    (t, d)
}

/// `fencelog request show` from the log itself (no daemon).
fn request_in_log(dir: &Path, id: &str) -> Value {
    let out = Command::new(FENCELOG).args(["request", "show", "--dir", dir.to_str().unwrap(), id]).output().unwrap();
    serde_json::from_slice(&out.stdout).unwrap()
}

/// Proves: the daemon creates its log on first start, prints its ready line,
/// serves every operation with the CLI's bodies, refuses without the token (401)
/// and past the body limit (413), answers refusals as problem+json 409, makes a
/// request id when none is given (and `GET /v1/requests/{id}` answers for it), and
/// every route is in the committed OpenAPI document.
#[test]
fn every_endpoint_answers_with_the_clis_bodies_behind_a_token() {
    let (_t, dir) = log_dir();
    let d = Daemon::start(&dir, &[]);
    assert_eq!(d.ready["home_generation"], 1, "{}", d.ready);
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(std::fs::metadata(dir.join("serve.token")).unwrap().permissions().mode() & 0o777, 0o600);

    let (s, v, hs) = call(&d.url("/v1/claim"), "POST", None, Some(json!({"subject": "a"})), &[]);
    assert_eq!((s, v["code"].as_str()), (401, Some("UNAUTHENTICATED")), "{v}");
    assert_eq!(header(&hs, "content-type"), Some("application/problem+json"));
    let (s, _, _) = call(&d.url("/v1/state"), "GET", Some("wrong-token-wrong-token"), None, &[]);
    assert_eq!(s, 401);
    assert_eq!(call(&d.url("/healthz"), "GET", None, None, &[]).0, 200);
    assert_eq!(call(&d.url("/readyz"), "GET", None, None, &[]).0, 200);

    let (s, c, hs) = d.call("POST", "/v1/claim", Some(json!({"subject": "a"})), &[]);
    assert_eq!((s, c["kind"].as_str(), c["generation"].as_u64()), (200, Some("claimed"), Some(1)), "{c}");
    assert_eq!(c["owner"]["pid"], 0, "a claim without pid is a remote owner");
    let made = header(&hs, "idempotency-key").unwrap().to_owned();
    assert_eq!(c["request_id"], made.as_str());
    let (s, r) = d.get(&format!("/v1/requests/{made}"));
    assert_eq!((s, r["status"].as_str(), r["seq"].clone()), (200, Some("committed"), c["seq"].clone()), "{r}");

    let (s, h) = d.post("/v1/heartbeat", json!({"subject": "a", "generation": 1}));
    assert_eq!((s, h["kind"].as_str()), (200, Some("heartbeat")));
    let (s, f) = d.post("/v1/heartbeat", json!({"subject": "a", "generation": 9}));
    assert_eq!(
        (s, f["code"].as_str(), f["status"].as_u64(), f["presented"].as_u64()),
        (409, Some("FENCED"), Some(409), Some(9))
    );
    assert!(f["type"].is_string() && f["title"].is_string() && f["detail"].is_string(), "{f}");
    // A refused client is on record as a remote caller, by the instance it named.
    let instance = "00000000-0000-4000-8000-0000000000c1";
    let (s, _) = d.post("/v1/heartbeat", json!({"subject": "a", "generation": 9, "instance": instance}));
    assert_eq!(s, 409);
    let out = Command::new(FENCELOG).args(["inspect", "dump", "--json", dir.to_str().unwrap()]).output().unwrap();
    let callers: Vec<Value> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .flat_map(|r| r["events"].as_array().cloned().unwrap_or_default())
        .filter(|e| e["kind"] == "refused" && e["code"] == "FENCED")
        .map(|e| e["caller"].clone())
        .collect();
    assert_eq!(callers.len(), 2, "one record per caller: {callers:?}");
    assert_eq!((callers[0]["pid"].as_u64(), callers[0]["exe"].as_str()), (Some(0), Some("remote")), "{callers:?}");
    assert_eq!(callers[1]["instance"], instance, "{callers:?}");
    let (s, n) = d.post("/v1/note", json!({"subject": "a", "generation": 1, "text": "hello"}));
    assert_eq!((s, n["kind"].as_str()), (200, Some("noted")));
    let (s, r) = d.post("/v1/rotate-fence", json!({"subject": "a", "generation": 1}));
    assert_eq!((s, r["generation"].as_u64()), (200, Some(2)));
    let (s, t) = d.post("/v1/takeover", json!({"subject": "a", "expect_generation": 2, "expect_heartbeat_ms": 1}));
    assert_eq!((s, t["code"].as_str()), (409, Some("TAKEOVER_RACE")), "{t}");
    let (s, l) = d.post("/v1/lease/acquire", json!({"resource": "db", "mode": "write", "owner": "a", "generation": 2}));
    assert_eq!((s, l["kind"].as_str()), (200, Some("lease_acquired")), "{l}");
    let (s, lr) = d.post("/v1/lease/release", json!({"lease": l["lease"], "token": l["token"]}));
    assert_eq!((s, lr["kind"].as_str()), (200, Some("lease_released")), "{lr}");
    let (s, rel) = d.post("/v1/release", json!({"subject": "a", "generation": 2}));
    assert_eq!((s, rel["kind"].as_str()), (200, Some("released")));

    // Idempotency-Key is the request id: the same key and body again is deduplicated.
    let key = [("Idempotency-Key", "k-1")];
    let (s1, a, _) = d.call("POST", "/v1/claim", Some(json!({"subject": "b"})), &key);
    let (s2, b, _) = d.call("POST", "/v1/claim", Some(json!({"subject": "b"})), &key);
    assert_eq!((s1, s2, a["seq"].clone(), b["deduplicated"].as_bool()), (200, 200, b["seq"].clone(), Some(true)));
    let (s, e, _) = d.call("POST", "/v1/claim", Some(json!({"subject": "b", "request_id": "other"})), &key);
    assert_eq!((s, e["code"].as_str()), (400, Some("INVALID_INPUT")));
    let (s, e) = d.post("/v1/claim", json!({"subject": "c", "bogus": 1}));
    assert_eq!((s, e["code"].as_str()), (400, Some("INVALID_INPUT")), "{e}");
    let (s, e) = d.post("/v1/note", json!({"subject": "a", "generation": 1, "text": "x", "request_id": 7}));
    assert_eq!(
        (s, e["code"].as_str()),
        (400, Some("INVALID_INPUT")),
        "a numeric request id is refused, not replaced: {e}"
    );
    let (s, e) = d.post("/v1/release", json!({"subject": "fencelog/serve", "generation": 1}));
    assert_eq!((s, e["code"].as_str()), (409, Some("HOME_RESERVED")), "{e}");
    let (s, _, _) = call(&d.url("/v1/head"), "GET", None, None, &[("Authorization", &format!("bearer {}", d.token))]);
    assert_eq!(s, 200, "the scheme is case-insensitive");
    let (s, e) = d.get("/v1/no-such-route");
    assert_eq!((s, e["code"].as_str()), (404, Some("NOT_FOUND")));
    // Errors axum answers itself are problem documents too.
    for (path, status, code) in [
        ("/v1/processes/-1", 400, "INVALID_INPUT"),
        ("/v1/processes/1/logs?stream=../x", 400, "INVALID_INPUT"),
        ("/v1/watch?from=abc", 400, "INVALID_INPUT"),
    ] {
        let (s, e, hs) = d.call("GET", path, None, &[]);
        assert_eq!((s, e["code"].as_str()), (status, Some(code)), "{path}: {e}");
        assert_eq!(header(&hs, "content-type"), Some("application/problem+json"), "{path}");
    }
    let (s, e, _) = d.call("GET", "/v1/claim", None, &[]);
    assert_eq!((s, e["code"].as_str()), (405, Some("METHOD_NOT_ALLOWED")), "{e}");
    let big = "x".repeat(70 * 1024);
    let (s, e) = d.post("/v1/note", json!({"subject": "a", "generation": 1, "text": big}));
    assert_eq!((s, e["code"].as_str()), (413, Some("BODY_TOO_LARGE")), "{e}");

    let (s, run) = d.post("/v1/run", json!({"command": ["sh", "-c", "echo out"], "wait_ms": 10000}));
    assert_eq!(
        (s, run["status"].as_str(), run["stdout_tail"].as_str()),
        (200, Some("succeeded"), Some("out\n")),
        "{run}"
    );
    let id = run["id"].as_u64().unwrap();
    let (s, list) = d.get("/v1/processes?status=succeeded");
    assert_eq!((s, list["processes"].as_array().map(Vec::len)), (200, Some(1)));
    let (s, p) = d.get(&format!("/v1/processes/{id}"));
    assert_eq!((s, p["status"].as_str()), (200, Some("succeeded")));
    let (s, w) = d.post(&format!("/v1/processes/{id}/wait"), json!({"timeout_ms": 10}));
    assert_eq!((s, w["status"].as_str()), (200, Some("succeeded")));
    let (s, logs, _) = d.call("GET", &format!("/v1/processes/{id}/logs?stream=stdout"), None, &[]);
    assert_eq!((s, logs), (200, Value::String("out\n".into())));
    let (s, c) = d.post(&format!("/v1/processes/{id}/cancel"), json!({}));
    assert_eq!((s, c["signalled"].as_bool()), (200, Some(false)));
    let (s, e) = d.get("/v1/processes/999");
    assert_eq!((s, e["code"].as_str()), (404, Some("UNKNOWN_PROCESS")));
    let (s, st) = d.get("/v1/state?subject=b");
    assert_eq!((s, st["subjects"][0]["subject"].as_str()), (200, Some("b")));
    let (s, h) = d.get("/v1/head");
    assert_eq!((s, h["seq"].as_u64().is_some()), (200, true));
    // The build, as `fencelog version --json` says it.
    let (s, v) = d.get("/v1/version");
    let cli = Command::new(FENCELOG).args(["version", "--json"]).output().unwrap();
    assert_eq!((s, v), (200, serde_json::from_slice::<Value>(&cli.stdout).unwrap()));
    assert_eq!(call(&d.url("/v1/version"), "GET", None, None, &[]).0, 401, "behind the token");
    // A problem the front door answers (a body that is not JSON) is counted too.
    let (s, _, _) = d.call("POST", "/v1/claim", Some(Value::String("not an object".into())), &[]);
    assert_eq!(s, 400);
    let (s, m, _) = d.call("GET", "/metrics", None, &[]);
    let m = m.as_str().unwrap_or_default().to_owned();
    assert_eq!(s, 200);
    assert!(m.contains(r#"fencelog_refusals_total{code="INVALID_INPUT"}"#), "{m}");
    assert!(m.contains(r#"fencelog_refusals_total{code="UNKNOWN_PROCESS"}"#), "{m}");
    for name in [
        "fencelog_http_requests_total",
        "fencelog_refusals_total",
        "fencelog_commit_seconds_bucket",
        "fencelog_head_seq",
        "fencelog_syncs",
        "fencelog_processes",
        "fencelog_log_bytes",
    ] {
        assert!(m.contains(name), "{name} missing from /metrics");
    }
    let (s, doc) = d.get("/v1/openapi.json");
    assert_eq!(s, 200);
    for (method, path) in fencelog::daemon::ROUTES {
        let op = &doc["paths"][*path][method.to_ascii_lowercase()];
        assert!(op.is_object(), "{method} {path} is not in docs/openapi.json");
    }
    assert_eq!(d.term(), Some(0));
}

/// Proves: a second daemon on the same directory is refused (exit 2, naming the
/// live home owner) while the first keeps serving.
#[test]
fn a_second_daemon_on_the_same_directory_is_refused() {
    let (_t, dir) = log_dir();
    let d = Daemon::start(&dir, &[]);
    let Err((code, out)) = Daemon::try_start(&dir, &[]) else { panic!("a second daemon started") };
    assert_eq!(code, Some(2), "{out}");
    let v: Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(v["error"]["code"], "ALREADY_ACTIVE", "{v}");
    assert_eq!(v["error"]["pid"], d.child.id());
    assert_eq!(d.get("/v1/head").0, 200);
    assert_eq!(d.term(), Some(0));
}

/// Proves, across a kill -9 under traffic and a restart: every mutation answered
/// 2xx is in the log, and none answered with a refusal is.
#[test]
fn kill_9_under_traffic_loses_no_acknowledged_mutation() {
    let (_t, dir) = log_dir();
    let d = Daemon::start(&dir, &[]);
    let stop = Arc::new(AtomicBool::new(false));
    let acked = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let workers: Vec<_> = (0..4)
        .map(|w| {
            let (url, token, stop, acked) =
                (d.url("/v1/claim"), d.token.clone(), Arc::clone(&stop), Arc::clone(&acked));
            std::thread::spawn(move || {
                let mut answered = vec![];
                let mut i = 0;
                while !stop.load(Ordering::Relaxed) {
                    let id = format!("w{w}-{i}");
                    // Even ids claim fresh subjects (2xx); odd ones claim a held one (409).
                    let subject = if i % 2 == 0 { format!("s-{w}-{i}") } else { format!("s-{w}-0") };
                    let (s, _, _) = call(
                        &url,
                        "POST",
                        Some(&token),
                        Some(json!({"subject": subject})),
                        &[("Idempotency-Key", &id)],
                    );
                    if s == 200 {
                        acked.fetch_add(1, Ordering::Relaxed);
                    }
                    if s != 0 {
                        answered.push((id, s));
                    }
                    i += 1;
                }
                answered
            })
        })
        .collect();
    // Kill it mid-traffic, once some mutations were acknowledged.
    let deadline = Instant::now() + Duration::from_secs(20);
    while acked.load(Ordering::Relaxed) < 40 {
        assert!(Instant::now() < deadline, "no traffic got through");
        std::thread::sleep(Duration::from_millis(5));
    }
    d.kill9();
    stop.store(true, Ordering::Relaxed);
    let answered: Vec<(String, u16)> = workers.into_iter().flat_map(|w| w.join().unwrap()).collect();
    assert!(answered.iter().filter(|(_, s)| *s == 200).count() > 10, "traffic ran: {answered:?}");
    // Restart: the home's previous owner is provably dead, so the claim succeeds.
    let d2 = Daemon::start(&dir, &[]);
    assert_eq!(d2.ready["home_generation"], 2);
    for (id, s) in &answered {
        let r = request_in_log(&dir, id);
        match s {
            200 => assert_eq!(r["status"], "committed", "{id} was acknowledged: {r}"),
            409 => assert_eq!(r["status"], "never_committed", "{id} was refused: {r}"),
            other => panic!("{id}: unexpected status {other}"),
        }
    }
    assert_eq!(d2.term(), Some(0));
}

/// Proves: at a cutover (SIGTERM) an admitted slow request is settled — it
/// completes within the grace and the `cutover` record lists it as committed; new
/// requests meanwhile get 503 with Retry-After; the home is released last; the
/// successor's `GET /v1/requests/{id}` agrees.
#[test]
fn a_cutover_settles_admitted_requests_and_the_successor_agrees() {
    let (_t, dir) = log_dir();
    let d = Daemon::start(&dir, &["--drain-grace-ms", "5000"]);
    let (url, token) = (d.url("/v1/run"), d.token.clone());
    let slow = std::thread::spawn(move || {
        call(
            &url,
            "POST",
            Some(&token),
            Some(json!({"command": ["sleep", "0.6"], "wait_ms": 10000})),
            &[("Idempotency-Key", "slow-1")],
        )
    });
    // SIGTERM once the run is admitted and its intent is on record.
    let deadline = Instant::now() + Duration::from_secs(20);
    while d.get("/v1/processes").1["processes"].as_array().is_none_or(Vec::is_empty) {
        assert!(Instant::now() < deadline, "the run never reached the log");
        std::thread::sleep(Duration::from_millis(10));
    }
    let pid = d.child.id();
    unsafe { libc::kill(pid as i32, libc::SIGTERM) };
    // Wait for the cutover to have begun (admission withdrawn: /readyz stops
    // answering 200, or the listener is gone), not for a time.
    let deadline = Instant::now() + Duration::from_secs(20);
    while call(&d.url("/readyz"), "GET", None, None, &[]).0 == 200 {
        assert!(Instant::now() < deadline, "SIGTERM never withdrew admission");
        std::thread::sleep(Duration::from_millis(5));
    }
    let (s, e, hs) = d.call("POST", "/v1/claim", Some(json!({"subject": "late"})), &[]);
    if s != 0 {
        assert_eq!((s, e["code"].as_str()), (503, Some("CUTOVER_IN_PROGRESS")), "{e}");
        assert_eq!(header(&hs, "retry-after"), Some("1"));
    }
    let (s, v, _) = slow.join().unwrap();
    assert_eq!((s, v["status"].as_str()), (200, Some("succeeded")), "{v}");
    let mut d = d;
    assert_eq!(d.child.wait().unwrap().code(), Some(0));
    let dump = Command::new(FENCELOG).args(["inspect", "dump", dir.to_str().unwrap(), "--json"]).output().unwrap();
    let records: Vec<Value> =
        String::from_utf8_lossy(&dump.stdout).lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    let n = records.len();
    assert_eq!(records[n - 2]["kinds"], json!(["cutover"]));
    let settled = &records[n - 2]["events"][0]["settled"];
    assert_eq!(settled[0]["request"], "slow-1", "{settled}");
    assert_eq!(settled[0]["how"], "committed");
    assert_eq!(records[n - 1]["kinds"], json!(["release"]), "the home is released last");
    let audit = Command::new(FENCELOG).args(["audit", dir.to_str().unwrap(), "--format", "json"]).output().unwrap();
    let audit: Value = serde_json::from_slice(&audit.stdout).unwrap();
    assert_eq!(audit["daemon_cutovers"][0]["settled"][0]["request"], "slow-1", "the audit shows the cutover: {audit}");
    // As text: a blank line, then the cutover on a line of its own (an escaped
    // "\n" was once printed before it).
    let text = Command::new(FENCELOG).args(["audit", dir.to_str().unwrap()]).output().unwrap();
    let text = String::from_utf8(text.stdout).unwrap();
    assert!(text.contains("\n\ndaemon cutover at seq ") && !text.contains("\\n"), "{text}");
    assert!(text.contains("  request \"slow-1\" (") && text.contains("): committed at seq "), "{text}");
    let d2 = Daemon::start(&dir, &[]);
    let (s, r) = d2.get("/v1/requests/slow-1");
    assert_eq!((s, r["status"].as_str()), (200, Some("committed")), "{r}");
    assert_eq!(d2.term(), Some(0));
}

/// Proves: a watch stream sends every committed record once, in order, with its
/// sequence as the event id; resumed with Last-Event-ID it continues exactly after.
#[test]
fn watch_resumed_with_last_event_id_sees_every_record_once_in_order() {
    let (_t, dir) = log_dir();
    let d = Daemon::start(&dir, &[]);
    for i in 0..5 {
        assert_eq!(d.post("/v1/claim", json!({"subject": format!("w{i}")})).0, 200);
    }
    let read_events = |last: Option<&str>, want: usize| -> Vec<(u64, Value)> {
        // From the start: without `from` (or Last-Event-ID) a stream starts at the
        // records appended from now on.
        let mut r = agent().get(&d.url("/v1/watch?from=1")).header("Authorization", &format!("Bearer {}", d.token));
        if let Some(l) = last {
            r = r.header("Last-Event-ID", l);
        }
        let resp = r.call().unwrap();
        assert_eq!(resp.status().as_u16(), 200);
        let mut reader = BufReader::new(resp.into_body().into_reader());
        let (mut out, mut id, mut line) = (vec![], None, String::new());
        while out.len() < want {
            line.clear();
            if reader.read_line(&mut line).unwrap() == 0 {
                break;
            }
            let l = line.trim_end();
            if let Some(v) = l.strip_prefix("id:") {
                id = v.trim().parse::<u64>().ok();
            } else if let Some(data) = l.strip_prefix("data:") {
                out.push((id.unwrap(), serde_json::from_str(data.trim()).unwrap()));
            }
        }
        out
    };
    let first = read_events(None, 3);
    assert_eq!(first.iter().map(|(i, _)| *i).collect::<Vec<_>>(), vec![1, 2, 3]);
    assert_eq!(first[2].1["seq"], 3);
    assert!(first[2].1["kinds"].is_array());
    let rest = read_events(Some("3"), 3);
    assert_eq!(rest.iter().map(|(i, _)| *i).collect::<Vec<_>>(), vec![4, 5, 6], "resumed exactly after 3");
    assert_eq!(d.term(), Some(0));
}

/// Proves: a daemon whose home is taken (its generation fenced) stops admitting
/// and exits with the documented code, without releasing what is not its own.
#[test]
fn a_daemon_that_loses_its_home_stops_admitting_and_exits() {
    let (_t, dir) = log_dir();
    let mut d = Daemon::start(&dir, &["--home-stale-after-ms", "400"]);
    let out = Command::new(FENCELOG)
        .args(["rotate-fence", "--dir", dir.to_str().unwrap(), "--subject", "fencelog/serve", "--generation", "1"])
        .output()
        .unwrap();
    assert!(out.status.success());
    let deadline = Instant::now() + Duration::from_secs(10);
    let code = loop {
        if let Some(s) = d.child.try_wait().unwrap() {
            break s.code();
        }
        assert!(Instant::now() < deadline, "the daemon kept running after losing its home");
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(code, Some(5));
    let out = Command::new(FENCELOG)
        .args(["state", "--dir", dir.to_str().unwrap(), "--subject", "fencelog/serve"])
        .output()
        .unwrap();
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["subjects"][0]["generation"], 2, "not released by the daemon that lost it: {v}");
    assert!(v["subjects"][0]["owner"].is_object());
}

/// Proves: `--handover` asks the live daemon to cut over and takes the home the
/// moment it is released; the old daemon exits 0.
#[test]
fn handover_between_two_daemons() {
    let (_t, dir) = log_dir();
    let mut a = Daemon::start(&dir, &[]);
    assert_eq!(a.post("/v1/claim", json!({"subject": "x"})).0, 200);
    let t0 = Instant::now();
    let b = Daemon::start(&dir, &["--handover"]);
    let window = t0.elapsed();
    assert_eq!(b.ready["home_generation"], 2, "{}", b.ready);
    assert_eq!(a.child.wait().unwrap().code(), Some(0));
    assert_eq!(
        std::fs::read_to_string(dir.join("serve.addr")).unwrap(),
        b.addr,
        "the old daemon left its successor's address"
    );
    assert!(window < Duration::from_secs(10), "handover took {window:?}");
    let (s, st) = b.get("/v1/state?subject=x");
    assert_eq!((s, st["subjects"][0]["generation"].as_u64()), (200, Some(1)));
    let mut buf = String::new();
    let _ = a.child.stdout.take().map(|mut o| o.read_to_string(&mut buf));
    assert_eq!(b.term(), Some(0));
}

/// Proves: the CLI's operation commands with `--server` go through the daemon and
/// print the same JSON with the same exit codes as when they open the log.
#[test]
fn the_cli_with_server_prints_the_same_json_and_exit_codes() {
    let (_t, dir) = log_dir();
    let d = Daemon::start(&dir, &[]);
    let url = format!("http://{}", d.addr);
    let token = dir.join("serve.token");
    let cli = |args: &[&str]| {
        let out = Command::new(FENCELOG)
            .args(args)
            .env("FENCELOG_SERVER", &url)
            .env("FENCELOG_TOKEN_FILE", &token)
            .output()
            .unwrap();
        (out.status.code(), serde_json::from_slice::<Value>(&out.stdout).unwrap_or(Value::Null), out.stdout)
    };
    let me = std::process::id().to_string();
    let (code, c, _) = cli(&["claim", "--subject", "s", "--pid", &me, "--request-id", "r1"]);
    assert_eq!(
        (code, c["kind"].as_str(), c["owner"]["pid"].as_u64()),
        (Some(0), Some("claimed"), Some(std::process::id() as u64)),
        "{c}"
    );
    let (code, again, _) = cli(&["claim", "--subject", "s", "--pid", &me, "--request-id", "r1"]);
    assert_eq!((code, again["deduplicated"].as_bool()), (Some(0), Some(true)));
    let (code, e, _) = cli(&["claim", "--subject", "s", "--pid", &me]);
    assert_eq!((code, e["error"]["code"].as_str()), (Some(3), Some("ALREADY_ACTIVE")), "{e}");
    assert!(e["error"]["message"].is_string() && e["error"]["status"].is_null(), "the CLI's error body: {e}");
    let (code, e, _) = cli(&["heartbeat", "--subject", "", "--generation", "1"]);
    assert_eq!((code, e["error"]["code"].as_str()), (Some(2), Some("INVALID_SUBJECT")), "{e}");
    let (code, st, _) = cli(&["state", "--subject", "s"]);
    assert_eq!((code, st["subjects"][0]["generation"].as_u64()), (Some(0), Some(1)));
    let (code, r, _) = cli(&["request", "show", "r1"]);
    assert_eq!((code, r["status"].as_str()), (Some(0), Some("committed")));
    // The same JSON as from the directory, answers and refusals alike.
    let local = |args: &[&str]| {
        let out = Command::new(FENCELOG).args(args).env("FENCELOG_DIR", &dir).output().unwrap();
        (out.status.code(), serde_json::from_slice::<Value>(&out.stdout).unwrap_or(Value::Null))
    };
    assert_eq!(local(&["request", "show", "r1"]), (code, r.clone()));
    let (code, bad, _) = cli(&["process", "list", "--status", "bogus"]);
    assert_eq!(local(&["process", "list", "--status", "bogus"]), (code, bad.clone()), "{bad}");
    let (code, run, _) = cli(&["run", "--", "sh", "-c", "printf out"]);
    assert_eq!((code, run["status"].as_str()), (Some(0), Some("succeeded")), "{run}");
    let id = run["id"].as_u64().unwrap().to_string();
    let (code, _, raw) = cli(&["process", "logs", &id]);
    assert_eq!((code, raw), (Some(0), b"out".to_vec()));
    let (code, e, _) = cli(&["process", "show", "77"]);
    assert_eq!((code, e["error"]["code"].as_str()), (Some(3), Some("UNKNOWN_PROCESS")));
    let (code, e, _) = cli(&["init"]);
    assert_eq!((code, e["error"]["code"].as_str()), (Some(2), Some("USAGE")));
    let out =
        Command::new(FENCELOG).args(["state", "--server", &url]).env_remove("FENCELOG_TOKEN_FILE").output().unwrap();
    assert_eq!(out.status.code(), Some(2), "no token: usage error");
    assert_eq!(d.term(), Some(0));
}

/// Proves: idle connections cannot take the daemon's descriptors: past the
/// connection cap they wait in the backlog (the daemon's open descriptors stay
/// bounded), and once they close it serves again.
#[test]
fn idle_connections_cannot_exhaust_the_daemons_descriptors() {
    let (_t, dir) = log_dir();
    let d = Daemon::start(&dir, &[]);
    let fds = || std::fs::read_dir(format!("/proc/{}/fd", d.child.id())).unwrap().count();
    let before = fds();
    let idle: Vec<std::net::TcpStream> = (0..fencelog::daemon::CONNECTIONS_MAX + 100)
        .filter_map(|_| std::net::TcpStream::connect(&d.addr).ok())
        .collect();
    assert!(idle.len() > fencelog::daemon::CONNECTIONS_MAX, "the backlog took the rest: {}", idle.len());
    // Once the daemon has taken connections up to its cap, it holds no more.
    let deadline = Instant::now() + Duration::from_secs(20);
    while fds() < before + fencelog::daemon::CONNECTIONS_MAX {
        assert!(Instant::now() < deadline, "the daemon never took {} connections", fencelog::daemon::CONNECTIONS_MAX);
        std::thread::sleep(Duration::from_millis(10));
    }
    let during = fds();
    assert!(
        during <= before + fencelog::daemon::CONNECTIONS_MAX + 8,
        "{during} descriptors open with {} idle connections (cap {})",
        idle.len(),
        fencelog::daemon::CONNECTIONS_MAX
    );
    drop(idle);
    let deadline = Instant::now() + Duration::from_secs(20);
    while d.get("/v1/head").0 != 200 {
        assert!(Instant::now() < deadline, "the daemon did not serve again");
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(d.term(), Some(0));
}

/// Proves: past the cap on requests in flight (here: waits, which hold their slot
/// while they wait) the next one is refused at once — 503 OVERLOADED with
/// Retry-After, never queued — and past the cap on watch streams the next stream is
/// refused the same way.
#[test]
fn requests_and_watch_streams_past_their_caps_are_refused_not_queued() {
    let (_t, dir) = log_dir();
    let d = Daemon::start(&dir, &[]);
    let (s, run) = d.post("/v1/run", json!({"command": ["sleep", "30"], "wait_ms": 0}));
    assert_eq!(s, 200, "{run}");
    // One request more than the cap, all waits that hold their slot for 6 s: exactly
    // one is refused, at once. (No separate probe: a probe sent while the waits
    // arrive could take the last slot from one of them.)
    let n = fencelog::daemon::CONCURRENT_REQUESTS_MAX + 1;
    // The order in which answers came back: the refusal must come before any
    // admitted wait has ended (a condition, not a time bound).
    let answered = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let waiters: Vec<_> = (0..n)
        .map(|_| {
            let (url, token, answered) = (d.url("/v1/processes/1/wait"), d.token.clone(), Arc::clone(&answered));
            std::thread::spawn(move || {
                let t0 = Instant::now();
                let (s, e, hs) = call(&url, "POST", Some(&token), Some(json!({"timeout_ms": 6000})), &[]);
                let order = answered.fetch_add(1, Ordering::SeqCst);
                (s, e, header(&hs, "retry-after").map(str::to_owned), t0.elapsed(), order)
            })
        })
        .collect();
    let results: Vec<_> = waiters.into_iter().map(|w| w.join().unwrap()).collect();
    let refused: Vec<_> = results.iter().filter(|r| r.0 != 200).collect();
    assert_eq!(refused.len(), 1, "exactly one past the cap of {}: {:?}", n - 1, refused);
    let (s, e, retry_after, _, order) = refused[0];
    assert_eq!((*s, e["code"].as_str(), retry_after.as_deref()), (503, Some("OVERLOADED"), Some("1")), "{e}");
    assert_eq!(*order, 0, "refused at once, before any admitted wait ended, not after queueing");
    // A lower bound only (a busy machine makes things slower, never faster).
    assert!(
        results.iter().filter(|r| r.0 == 200).all(|r| r.3 >= Duration::from_secs(5)),
        "every admitted wait held its slot"
    );
    let (s, _) = d.post("/v1/processes/1/cancel", json!({}));
    assert_eq!(s, 200);

    let open = |d: &Daemon| {
        agent().get(&d.url("/v1/watch")).header("Authorization", &format!("Bearer {}", d.token)).call().unwrap()
    };
    let streams: Vec<_> = (0..fencelog::daemon::WATCH_STREAMS_MAX).map(|_| open(&d)).collect();
    assert!(streams.iter().all(|r| r.status().as_u16() == 200));
    let (s, e, _) = d.call("GET", "/v1/watch", None, &[]);
    assert_eq!((s, e["code"].as_str()), (503, Some("OVERLOADED")), "{e}");
    drop(streams);
    let deadline = Instant::now() + Duration::from_secs(10);
    while open(&d).status().as_u16() != 200 {
        assert!(Instant::now() < deadline, "closed streams never gave their slots back");
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(d.term(), Some(0));
}

/// Proves: a body announced larger than the limit is refused from its
/// `Content-Length` — 413 `BODY_TOO_LARGE` as the first answer to a client that
/// sent `Expect: 100-continue`, which is never told to continue (and sends nothing).
#[test]
fn an_oversized_body_is_refused_before_the_client_is_told_to_continue() {
    use std::io::{Read, Write};
    let (_t, dir) = log_dir();
    let d = Daemon::start(&dir, &[]);
    let mut c = std::net::TcpStream::connect(&d.addr).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let req = format!(
        "POST /v1/note HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {}\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\nExpect: 100-continue\r\n\r\n",
        d.token,
        10 * 1024 * 1024
    );
    c.write_all(req.as_bytes()).unwrap();
    let mut got = vec![0u8; 4096];
    let n = c.read(&mut got).unwrap();
    let head = String::from_utf8_lossy(&got[..n]).to_string();
    assert!(head.starts_with("HTTP/1.1 413"), "the first answer is 413, not 100 Continue: {head}");
    assert!(head.contains("BODY_TOO_LARGE") && !head.contains("100 Continue"), "{head}");
    drop(c);
    assert_eq!(d.term(), Some(0));
}

/// Reads until the server closes the connection; `None` if it is still open at
/// the deadline.
fn closed_within(s: &mut (impl Read + ?Sized), bound: Duration, set_timeout: impl Fn(Duration)) -> Option<Vec<u8>> {
    let deadline = Instant::now() + bound;
    let mut got = vec![];
    let mut buf = [0u8; 4096];
    while Instant::now() < deadline {
        set_timeout(Duration::from_millis(200));
        match s.read(&mut buf) {
            Ok(0) => return Some(got),
            Ok(n) => got.extend_from_slice(&buf[..n]),
            Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {}
            Err(_) => return Some(got), // reset by the server: closed too
        }
    }
    None
}

/// Proves: a client that sends half its headers and stalls, and a kept-alive
/// connection left idle after its request, are closed once the header-read
/// timeout passes (here 300 ms; the bound checked is 10 s), so slow or idle
/// clients give their slots back; a client that sends its request in time is
/// served as before.
#[test]
fn slow_header_and_idle_connections_are_closed_after_the_header_read_timeout() {
    let (_t, dir) = log_dir();
    let d = Daemon::start(&dir, &["--header-read-timeout-ms", "300"]);
    let mut slow = std::net::TcpStream::connect(&d.addr).unwrap();
    use std::io::Write;
    slow.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n").unwrap();
    let c = slow.try_clone().unwrap();
    let got = closed_within(&mut slow, Duration::from_secs(10), |t| c.set_read_timeout(Some(t)).unwrap());
    assert!(got.is_some(), "a connection with half its headers stayed open");

    let mut idle = std::net::TcpStream::connect(&d.addr).unwrap();
    idle.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
    let c = idle.try_clone().unwrap();
    let got = closed_within(&mut idle, Duration::from_secs(10), |t| c.set_read_timeout(Some(t)).unwrap())
        .expect("an idle kept-alive connection stayed open");
    let text = String::from_utf8_lossy(&got);
    assert!(text.starts_with("HTTP/1.1 200"), "it was served first: {text}");

    let (s, _) = d.get("/v1/head");
    assert_eq!(s, 200, "clients that keep to the timeout are served");
    let out = Command::new(FENCELOG)
        .args(["serve", "--dir", dir.to_str().unwrap(), "--header-read-timeout-ms", "5"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "out of bounds: {}", String::from_utf8_lossy(&out.stdout));
    assert_eq!(d.term(), Some(0));
}

/// One HTTP/1.1 request over a Unix socket (Connection: close): status and JSON.
fn unix_call(path: &Path, token: &str, method: &str, route: &str, body: Option<Value>) -> (u16, Value) {
    use std::io::Write;
    let mut s = std::os::unix::net::UnixStream::connect(path).unwrap();
    let body = body.map(|b| b.to_string()).unwrap_or_default();
    write!(
        s,
        "{method} {route} HTTP/1.1\r\nHost: fencelog\r\nAuthorization: Bearer {token}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    let status = out.split_whitespace().nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
    let json = out.split("\r\n\r\n").nth(1).and_then(|b| serde_json::from_str(b).ok()).unwrap_or(Value::Null);
    (status, json)
}

/// Proves: with `--unix PATH` the daemon also listens on a Unix socket (mode 0600,
/// named in the ready line, removed at exit) whose callers are known by the pid
/// the kernel gives: a claim without `pid` is held for the calling process itself
/// (a local owner, judged on its identity — not a remote one), and a refusal kept
/// as evidence names that process; the token is still required.
#[test]
fn a_unix_socket_caller_is_known_by_its_pid() {
    use std::os::unix::fs::PermissionsExt;
    let (t, dir) = log_dir();
    let sock = t.path().join("fencelog.sock");
    let d = Daemon::start(&dir, &["--unix", sock.to_str().unwrap()]);
    assert_eq!(d.ready["unix"], sock.to_str().unwrap(), "{}", d.ready);
    assert_eq!(std::fs::metadata(&sock).unwrap().permissions().mode() & 0o777, 0o600);
    let (s, _) = unix_call(&sock, "wrong-token-wrong-token", "GET", "/v1/head", None);
    assert_eq!(s, 401, "the token is still required");
    let (s, c) = unix_call(&sock, &d.token, "POST", "/v1/claim", Some(json!({"subject": "local/a"})));
    assert_eq!(s, 200, "{c}");
    let me = std::process::id();
    assert_eq!(c["owner"]["pid"].as_u64(), Some(u64::from(me)), "held for the calling process: {c}");
    assert_ne!(c["owner"]["exe"], "remote", "{c}");
    let (s, st) = unix_call(&sock, &d.token, "GET", "/v1/state?subject=local/a", None);
    assert_eq!((s, st["subjects"][0]["status"].as_str()), (200, Some("active")), "{st}");
    let (s, e) =
        unix_call(&sock, &d.token, "POST", "/v1/heartbeat", Some(json!({"subject": "local/a", "generation": 7})));
    assert_eq!((s, e["code"].as_str()), (409, Some("FENCED")), "{e}");
    // Over TCP the same claim would be a remote owner.
    let (s, r) = d.post("/v1/claim", json!({"subject": "remote/a"}));
    assert_eq!((s, r["owner"]["pid"].as_u64(), r["owner"]["exe"].as_str()), (200, Some(0), Some("remote")), "{r}");
    assert_eq!(d.term(), Some(0));
    assert!(!sock.exists(), "the socket is removed at exit");
    let out = Command::new(FENCELOG).args(["inspect", "dump", "--json", dir.to_str().unwrap()]).output().unwrap();
    let refused: Vec<Value> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .flat_map(|r| r["events"].as_array().cloned().unwrap_or_default())
        .filter(|e| e["kind"] == "refused")
        .collect();
    assert_eq!(refused.len(), 1, "{refused:?}");
    assert_eq!(refused[0]["caller"]["pid"].as_u64(), Some(u64::from(me)), "the refused caller is this process");
}

/// Proves: `--unix` never removes what is not its own: a path that is a regular
/// file is refused (exit 2) and left as it was — before the log is touched.
#[test]
fn a_unix_socket_path_that_is_not_a_socket_is_refused_and_left_alone() {
    let (t, dir) = log_dir();
    let path = t.path().join("not-a-socket");
    std::fs::write(&path, b"keep me").unwrap();
    let out = Command::new(FENCELOG)
        .args(["serve", "--dir", dir.to_str().unwrap(), "--listen", "127.0.0.1:0", "--unix", path.to_str().unwrap()])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{}", String::from_utf8_lossy(&out.stdout));
    assert_eq!(std::fs::read(&path).unwrap(), b"keep me");
    assert!(!dir.exists(), "refused before the log was created or its home claimed");
}

/// Proves: `--handover` with traffic running loses nothing and answers nothing
/// twice: a client claims new subjects, each with its own request id, against
/// whichever daemon `serve.addr` names, retrying the same request id on a 503 or a
/// broken connection. Afterwards every request is committed exactly once (one
/// claim record per subject, at generation 1; a retry answered from the log is
/// `deduplicated`), and the successor's `GET /v1/requests/{id}` agrees. The longest
/// gap between two answered requests (the unavailability window) is printed.
#[test]
fn handover_with_traffic_running_loses_nothing_and_answers_nothing_twice() {
    let (_t, dir) = log_dir();
    let mut a = Daemon::start(&dir, &[]);
    let token = a.token.clone();
    let stop = Arc::new(AtomicBool::new(false));
    let answered_n = Arc::new(AtomicU64::new(0));
    let client = {
        let (dir, stop, token, answered_n) = (dir.clone(), Arc::clone(&stop), token.clone(), Arc::clone(&answered_n));
        std::thread::spawn(move || {
            let mut answered: Vec<(String, u64, bool, Instant)> = vec![];
            let mut n = 0u64;
            while !stop.load(Ordering::SeqCst) || n < 20 {
                let id = format!("h-{n}");
                let deadline = Instant::now() + Duration::from_secs(30);
                loop {
                    assert!(Instant::now() < deadline, "request {id} never answered");
                    let addr = std::fs::read_to_string(dir.join("serve.addr")).unwrap_or_default();
                    let url = format!("http://{}/v1/claim", addr.trim());
                    let body = json!({"subject": format!("traffic/{n}")});
                    let (s, v, _) = call(&url, "POST", Some(&token), Some(body), &[("Idempotency-Key", &id)]);
                    match s {
                        200 => {
                            answered.push((id, v["seq"].as_u64().unwrap(), v["deduplicated"] == true, Instant::now()));
                            answered_n.fetch_add(1, Ordering::SeqCst);
                            break;
                        }
                        0 | 503 => std::thread::sleep(Duration::from_millis(5)),
                        other => panic!("request {id}: {other} {v}"),
                    }
                }
                n += 1;
            }
            answered
        })
    };
    // Traffic before the handover, and traffic answered by the successor after it.
    let answered_at_least = |n: u64| {
        let deadline = Instant::now() + Duration::from_secs(60);
        while answered_n.load(Ordering::SeqCst) < n {
            assert!(Instant::now() < deadline, "only {} requests answered", answered_n.load(Ordering::SeqCst));
            std::thread::sleep(Duration::from_millis(5));
        }
    };
    answered_at_least(10);
    let b = Daemon::start(&dir, &["--handover"]);
    assert_eq!(a.child.wait().unwrap().code(), Some(0));
    answered_at_least(answered_n.load(Ordering::SeqCst) + 10);
    stop.store(true, Ordering::SeqCst);
    let answered = client.join().unwrap();
    assert!(answered.len() >= 20, "{} requests", answered.len());
    let window = answered.windows(2).map(|w| w[1].3 - w[0].3).max().unwrap();
    eprintln!("handover with traffic: {} requests, longest gap between answers {window:?}", answered.len());
    // Exactly one claim record per subject, the one each answer names.
    let out = Command::new(FENCELOG).args(["inspect", "dump", "--json", dir.to_str().unwrap()]).output().unwrap();
    let mut claims: std::collections::BTreeMap<String, Vec<u64>> = Default::default();
    for r in String::from_utf8_lossy(&out.stdout).lines().filter_map(|l| serde_json::from_str::<Value>(l).ok()) {
        for e in r["events"].as_array().into_iter().flatten() {
            if e["kind"] == "claim" && e["subject"].as_str().is_some_and(|s| s.starts_with("traffic/")) {
                claims.entry(e["subject"].as_str().unwrap().to_owned()).or_default().push(r["seq"].as_u64().unwrap());
            }
        }
    }
    for (i, (id, seq, _, _)) in answered.iter().enumerate() {
        let subject = format!("traffic/{i}");
        assert_eq!(claims.get(&subject), Some(&vec![*seq]), "{id}: one claim, the one answered");
        let (s, r) = b.get(&format!("/v1/requests/{id}"));
        assert_eq!((s, r["status"].as_str(), r["seq"].as_u64()), (200, Some("committed"), Some(*seq)), "{r}");
    }
    assert_eq!(claims.len(), answered.len(), "no claim the client was not answered for");
    let (s, st) = b.get("/v1/state?subject=traffic/0");
    assert_eq!((s, st["subjects"][0]["generation"].as_u64()), (200, Some(1)));
    assert_eq!(b.term(), Some(0));
}

/// Proves (issue 23, item 8): `serve --dir D` on a missing D under umask 002 (the
/// default for users with a private group) creates D 0700, as `init` does, and
/// boots — before the fix it created D 0775 and then refused it
/// (`UNSAFE_PERMISSIONS`, exit 1), so the README's first command failed.
#[test]
fn serve_under_umask_002_creates_its_directory_0700_and_boots() {
    use std::os::unix::fs::PermissionsExt;
    use std::os::unix::process::CommandExt;
    let (_t, dir) = log_dir();
    let mut cmd = Command::new(FENCELOG);
    cmd.args(["serve", "--dir", dir.to_str().unwrap(), "--listen", "127.0.0.1:0"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null());
    // SAFETY: umask is async-signal-safe; nothing else runs between fork and exec.
    unsafe {
        cmd.pre_exec(|| {
            libc::umask(0o002);
            Ok(())
        });
    }
    let mut child = cmd.spawn().unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.as_mut().unwrap()).read_line(&mut line).unwrap();
    let ready: Value = serde_json::from_str(line.trim()).unwrap_or(Value::Null);
    assert!(ready.get("listening").is_some(), "serve did not boot: {line}");
    let mode = std::fs::metadata(&dir).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o700, "the log directory is private");
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    assert_eq!(child.wait().unwrap().code(), Some(0));
}

/// Proves (issue 23, item 9): every field that names an owner is kept from the
/// daemon's home — a lease held by the home's tenure, a run on its behalf and a
/// cancel "as the home" are refused `HOME_RESERVED` (409) and nothing is written;
/// the same requests under another owner are answered as before. Before the fix
/// only `subject` was checked and all three were answered 200.
#[test]
fn no_request_acts_as_the_daemons_home() {
    let (_t, dir) = log_dir();
    let d = Daemon::start(&dir, &[]);
    let home = "fencelog/serve";
    let home_gen = d.ready["home_generation"].as_u64().unwrap();
    let (s, e) =
        d.post("/v1/lease/acquire", json!({"resource": "db", "mode": "write", "owner": home, "generation": home_gen}));
    assert_eq!((s, e["code"].as_str()), (409, Some("HOME_RESERVED")), "{e}");
    let (s, e) = d.post("/v1/run", json!({"command": ["true"], "owner": home, "generation": home_gen, "wait_ms": 0}));
    assert_eq!((s, e["code"].as_str()), (409, Some("HOME_RESERVED")), "{e}");
    let (s, run) = d.post("/v1/run", json!({"command": ["sleep", "30"], "wait_ms": 0}));
    assert_eq!(s, 200, "{run}");
    let id = run["id"].as_u64().unwrap();
    let (s, e) = d.post(&format!("/v1/processes/{id}/cancel"), json!({"owner": home, "generation": home_gen}));
    assert_eq!((s, e["code"].as_str()), (409, Some("HOME_RESERVED")), "{e}");
    let (s, c) = d.post(&format!("/v1/processes/{id}/cancel"), json!({}));
    assert_eq!(s, 200, "{c}");
    assert_eq!(d.term(), Some(0));
    // Nothing in the log acts as the home: no lease, spawn or cancel names it.
    let dump = Command::new(FENCELOG).args(["inspect", "dump", dir.to_str().unwrap(), "--json"]).output().unwrap();
    for line in String::from_utf8_lossy(&dump.stdout).lines() {
        let r: Value = serde_json::from_str(line).unwrap();
        for e in r["events"].as_array().unwrap() {
            let owner = e.get("owner").or_else(|| e.get("by")).and_then(|o| o.get("subject"));
            assert_ne!(owner.and_then(Value::as_str), Some(home), "{e}");
        }
    }
}

/// Proves (issue 23, item 11): a request id with a control character — in the
/// HTTP body's `request_id` or the CLI's `--request-id` — is refused
/// `INVALID_INPUT` and never reaches the log; and the text reports escape control
/// characters that a field holds (a lock claim's action, here): no ESC byte and no
/// forged line reaches the terminal from `inspect dump`, `inspect state` or `audit`.
#[test]
fn request_ids_are_printable_and_text_reports_escape_control_characters() {
    let (_t, dir) = log_dir();
    let d = Daemon::start(&dir, &[]);
    let before = d.get("/v1/head").1["seq"].as_u64().unwrap();
    for id in ["esc\u{1b}[2J", "line\nforged", "nul\u{0}"] {
        let (s, e) = d.post("/v1/claim", json!({"subject": "x", "request_id": id}));
        assert_eq!((s, e["code"].as_str()), (400, Some("INVALID_INPUT")), "{id:?}: {e}");
    }
    assert_eq!(d.get("/v1/head").1["seq"].as_u64().unwrap(), before, "nothing written");
    assert_eq!(d.term(), Some(0));
    let d_s = dir.to_str().unwrap();
    let out = Command::new(FENCELOG)
        .args(["claim", "--dir", d_s, "--subject", "y", "--request-id", "r\u{1b}]0;owned\u{7}"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["error"]["code"], "INVALID_INPUT", "{v}");
    // A field that may hold any text: a lock claim's action.
    let out = Command::new(FENCELOG)
        .args(["claim", "--dir", d_s, "--subject", "lock/z", "--request-id", "r1"])
        .args(["--action", "deploy\u{1b}[31m\n    99  1970-01-01T00:00:00.000Z  forged"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stdout));
    for args in [vec!["inspect", "dump", d_s], vec!["inspect", "state", d_s], vec!["audit", d_s]] {
        let out = Command::new(FENCELOG).args(&args).output().unwrap();
        let text = String::from_utf8(out.stdout).unwrap();
        assert!(!text.contains('\u{1b}'), "{args:?} printed an ESC byte: {text}");
        assert!(!text.lines().any(|l| l.trim_start().starts_with("99 ")), "{args:?} printed a forged line: {text}");
        if args[0] != "audit" {
            assert!(text.contains("deploy\\u{1b}[31m\\n"), "{args:?} shows the action escaped: {text}");
        }
    }
}

/// The torture helper holding the append lock of `dir` until killed; returns it
/// once it says `HELD`, with its stdout for the `WAITING` line.
fn hold_the_lock(dir: &Path) -> (Child, BufReader<std::process::ChildStdout>) {
    let torture = {
        let exe = std::env::current_exe().unwrap();
        exe.parent().and_then(Path::parent).unwrap().join("examples").join("fencelog-torture")
    };
    let mut holder = Command::new(torture)
        .args(["lock", dir.to_str().unwrap(), "10000", "120000"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut out = BufReader::new(holder.stdout.take().unwrap());
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    assert_eq!(line.trim(), "HELD");
    (holder, out)
}

/// Proves (issue 23, item 6): the drain grace bounds every admitted request, also
/// one still waiting for the append lock that another process holds. A claim is
/// admitted while a CLI writer (the torture helper) holds the lock; once the claim
/// waits for it (the holder sees it waiting) the daemon gets SIGTERM with a 300 ms
/// grace. The claim is answered — while the holder still holds the lock, so not by
/// a turn of it — 503 `NOT_COMMITTED`, `retryable`, and it never reaches the log:
/// the cutover record lists it `not_committed`, and its subject is nobody's. Before
/// the fix the claim waited for the lock (answered at 5.7 s with a 6 s holder) and
/// then committed after the cutover had begun. When the holder lets go, the
/// daemon records its cutover, releases its home and exits 0.
#[test]
fn a_request_waiting_for_another_processs_lock_is_withdrawn_at_the_grace() {
    let (_t, dir) = log_dir();
    let d = Daemon::start(&dir, &["--drain-grace-ms", "300"]);
    let (mut holder, mut holder_out) = hold_the_lock(&dir);
    let (url, token) = (d.url("/v1/claim"), d.token.clone());
    let claim = std::thread::spawn(move || {
        call(&url, "POST", Some(&token), Some(json!({"subject": "blocked"})), &[("Idempotency-Key", "waits-1")])
    });
    let mut line = String::new();
    holder_out.read_line(&mut line).unwrap();
    assert_eq!(line.trim(), "WAITING", "the claim waits for the lock");
    unsafe { libc::kill(d.child.id() as i32, libc::SIGTERM) };
    let (s, e, hs) = claim.join().unwrap();
    assert!(holder.try_wait().unwrap().is_none(), "answered while the lock is still held by another process");
    assert_eq!((s, e["code"].as_str(), e["retryable"].as_bool()), (503, Some("NOT_COMMITTED"), Some(true)), "{e}");
    assert_eq!(header(&hs, "retry-after"), Some("1"));
    holder.kill().unwrap();
    holder.wait().unwrap();
    let mut d = d;
    assert_eq!(d.child.wait().unwrap().code(), Some(0));
    let shown = request_in_log(&dir, "waits-1");
    assert_eq!(shown["status"], "never_committed", "{shown}");
    let dump = Command::new(FENCELOG).args(["inspect", "dump", dir.to_str().unwrap(), "--json"]).output().unwrap();
    let records: Vec<Value> =
        String::from_utf8_lossy(&dump.stdout).lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    let cutover = records.iter().find(|r| r["kinds"] == json!(["cutover"])).expect("a cutover record");
    let settled = &cutover["events"][0]["settled"];
    assert_eq!((settled[0]["request"].as_str(), settled[0]["how"].as_str()), (Some("waits-1"), Some("not_committed")));
    assert!(!records.iter().any(|r| r["subjects"].as_array().is_some_and(|s| s.contains(&json!("blocked")))));
}

/// Proves (issue 23, item 7): the daemon's `GET /v1/processes/{id}` and `POST
/// /v1/processes/{id}/wait` of a process whose runner and command were both
/// killed (-9, no exit record) answer `completed_unknown` — recorded once, after a
/// short grace for the exit record — instead of `running` until a `recover`.
#[test]
fn the_daemon_settles_a_process_whose_runner_and_command_are_gone() {
    let (_t, dir) = log_dir();
    let d = Daemon::start(&dir, &[]);
    let (s, run) = d.post("/v1/run", json!({"command": ["sleep", "300"], "wait_ms": 0}));
    assert_eq!(s, 200, "{run}");
    let id = run["id"].as_u64().unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    let v = loop {
        let (_, v) = d.get(&format!("/v1/processes/{id}"));
        if v["status"] == "running" {
            break v;
        }
        assert!(Instant::now() < deadline, "never started: {v}");
        std::thread::sleep(Duration::from_millis(10));
    };
    let (runner, pid) = (v["runner_pid"].as_i64().unwrap() as i32, v["pid"].as_i64().unwrap() as i32);
    unsafe { libc::kill(runner, libc::SIGKILL) };
    unsafe { libc::kill(-pid, libc::SIGKILL) };
    let deadline = Instant::now() + Duration::from_secs(20);
    while fencelog::ledger::identity::start_ticks(runner as u32).is_some()
        || fencelog::ledger::identity::start_ticks(pid as u32).is_some()
    {
        assert!(Instant::now() < deadline, "the runner or the command survived kill -9");
        std::thread::sleep(Duration::from_millis(10));
    }
    let (s, v) = d.get(&format!("/v1/processes/{id}"));
    assert_eq!((s, v["status"].as_str()), (200, Some("completed_unknown")), "{v}");
    let (s, w) = d.post(&format!("/v1/processes/{id}/wait"), json!({"timeout_ms": 60000}));
    assert_eq!(
        (s, w["status"].as_str(), w["end_code"].as_str()),
        (200, Some("completed_unknown"), Some("process_dead"))
    );
    assert_eq!(d.term(), Some(0));
}

/// The daemon's peak resident memory so far (KiB), as the kernel counts it.
fn peak_rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status.lines().find(|l| l.starts_with("VmHWM:")).unwrap();
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

/// Proves (issue 23, item 10): `GET /v1/processes/{id}/logs` streams a large kept
/// output in bounded pieces: 12 clients reading a 32 MiB output at once each get
/// every byte (the digest of what they read is the digest of the file), and the
/// daemon's peak memory grows by far less than one copy per reader (before the
/// fix each request read the whole output into memory: 12 × 32 MiB).
#[test]
fn process_logs_stream_in_bounded_pieces() {
    const OUTPUT_BYTES: u64 = 32 << 20;
    let (_t, dir) = log_dir();
    let d = Daemon::start(&dir, &[]);
    let cmd = format!("head -c {OUTPUT_BYTES} /dev/urandom");
    let (s, run) =
        d.post("/v1/run", json!({"command": ["sh", "-c", cmd], "output_bytes_max": OUTPUT_BYTES, "wait_ms": 60000}));
    assert_eq!((s, run["status"].as_str()), (200, Some("succeeded")), "{run}");
    let id = run["id"].as_u64().unwrap();
    let file = dir.join("processes").join(id.to_string()).join("stdout");
    let want = blake3::hash(&std::fs::read(&file).unwrap());
    let before = peak_rss_kib(d.child.id());
    let readers: Vec<_> = (0..12)
        .map(|_| {
            let (url, token) = (d.url(&format!("/v1/processes/{id}/logs")), d.token.clone());
            std::thread::spawn(move || {
                let resp = agent().get(&url).header("Authorization", &format!("Bearer {token}")).call().unwrap();
                assert_eq!(resp.status().as_u16(), 200);
                let mut body = resp.into_body().into_with_config().limit(OUTPUT_BYTES + 1).reader();
                let (mut hasher, mut buf, mut total) = (blake3::Hasher::new(), vec![0u8; 1 << 16], 0u64);
                loop {
                    let n = body.read(&mut buf).unwrap();
                    if n == 0 {
                        break;
                    }
                    hasher.update(&buf[..n]);
                    total += n as u64;
                }
                (total, hasher.finalize())
            })
        })
        .collect();
    for r in readers {
        let (total, digest) = r.join().unwrap();
        assert_eq!((total, digest), (OUTPUT_BYTES, want), "every reader got every byte");
    }
    let grown_kib = peak_rss_kib(d.child.id()).saturating_sub(before);
    assert!(grown_kib < 96 * 1024, "the daemon's peak memory grew by {grown_kib} KiB for 12 readers");
    assert_eq!(d.term(), Some(0));
}

/// Proves (review): clients that ask for a large process output and never read it
/// hold only the output streams' own slots (`LOG_STREAMS_MAX`): past them the next
/// download is refused at once (503 `OVERLOADED`), and every other request —
/// `/v1/head`, a heartbeat — is still answered.
#[test]
fn slow_readers_of_process_output_do_not_starve_other_requests() {
    use std::io::Write;
    let (_t, dir) = log_dir();
    let d = Daemon::start(&dir, &[]);
    let (s, run) = d.post(
        "/v1/run",
        json!({"command": ["head", "-c", "33554432", "/dev/zero"], "output_bytes_max": 33554432, "wait_ms": 60000}),
    );
    assert_eq!((s, run["status"].as_str()), (200, Some("succeeded")), "{run}");
    let id = run["id"].as_u64().unwrap();
    let (s, c) = d.post("/v1/claim", json!({"subject": "busy"}));
    assert_eq!(s, 200, "{c}");
    let addr: std::net::SocketAddr = d.addr.parse().unwrap();
    let request =
        format!("GET /v1/processes/{id}/logs HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {}\r\n\r\n", d.token);
    // Each holds its stream: its first bytes arrive, then it reads nothing more.
    let mut stalled = vec![];
    for _ in 0..fencelog::daemon::LOG_STREAMS_MAX {
        let mut conn = std::net::TcpStream::connect(addr).unwrap();
        conn.write_all(request.as_bytes()).unwrap();
        let mut first = [0u8; 12];
        conn.read_exact(&mut first).unwrap();
        assert_eq!(&first, b"HTTP/1.1 200");
        stalled.push(conn);
    }
    let (s, e) = d.get(&format!("/v1/processes/{id}/logs"));
    assert_eq!((s, e["code"].as_str()), (503, Some("OVERLOADED")), "{e}");
    for _ in 0..20 {
        assert_eq!(d.get("/v1/head").0, 200, "other requests are answered");
        let (s, h) = d.post("/v1/heartbeat", json!({"subject": "busy", "generation": c["generation"]}));
        assert_eq!(s, 200, "{h}");
    }
    drop(stalled);
    assert_eq!(d.term(), Some(0));
}

/// Proves (review): the daemon's reads, not only the CLI's, refuse a log halted by
/// a `SYNC_FAILED` marker (a group whose sync failed and was not cut back may sit
/// in the page cache): `GET /v1/state` and `GET /v1/head` answer `SYNC_FAILED`
/// instead of state that a power cut could erase.
#[test]
fn the_daemons_reads_refuse_a_halted_log() {
    let (_t, dir) = log_dir();
    let d = Daemon::start(&dir, &[]);
    assert_eq!(d.post("/v1/claim", json!({"subject": "a"})).0, 200);
    let marker = r#"{"segment":"00000000000000000001.seg","offset":64,"seq":2,"cause":"injected","pid":1}"#;
    std::fs::write(dir.join(fencelog::storage::SYNC_FAILED_FILE), marker).unwrap();
    for path in ["/v1/state", "/v1/head", "/v1/state?subject=a"] {
        let (s, e) = d.get(path);
        assert_eq!((s, e["code"].as_str()), (500, Some("SYNC_FAILED")), "{path}: {e}");
    }
}
