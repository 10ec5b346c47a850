//! What an operator reads on the daemon's stderr: `--log-format json` (one object
//! per line), one line at boot, one per recovery decision, one per refusal kept as
//! evidence, one per cutover, and with `--access-log` one per request — no Rust
//! `Debug` dumps in any field. A real daemon, real requests, a real SIGTERM.

mod common;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};

use common::daemon::{FENCELOG, call};
use serde_json::{Value, json};

/// Start `serve` with `args`, its stderr to a file; (child, ready line, stderr path).
fn serve(dir: &std::path::Path, args: &[&str]) -> (std::process::Child, Value, std::path::PathBuf) {
    let err = dir.with_extension("stderr");
    let mut child = Command::new(FENCELOG)
        .args(["serve", "--dir", dir.to_str().unwrap(), "--listen", "127.0.0.1:0"])
        .args(args)
        .env_remove("RUST_LOG")
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(&err).unwrap())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.as_mut().unwrap()).read_line(&mut line).unwrap();
    let ready: Value = serde_json::from_str(&line).unwrap_or_else(|_| panic!("not ready: {line}"));
    (child, ready, err)
}

fn stop(mut child: std::process::Child) {
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    assert_eq!(child.wait().unwrap().code(), Some(0));
}

/// Every string anywhere in `v` (to look for Debug artifacts).
fn strings(v: &Value, out: &mut Vec<String>) {
    match v {
        Value::String(s) => out.push(s.clone()),
        Value::Array(a) => a.iter().for_each(|x| strings(x, out)),
        Value::Object(o) => o.values().for_each(|x| strings(x, out)),
        _ => {}
    }
}

/// Proves: with `--log-format json --access-log` every stderr line is one JSON
/// object; there is exactly one boot line (`ready`: the log, records replayed,
/// the home and its generation, the address), a recovery line for the process
/// the daemon found running, one access line per request (method, route
/// template, status, latency, request id, caller, the trace id of a
/// `traceparent`), a line for the fenced heartbeat the log keeps as evidence,
/// and exactly one cutover line saying how the admitted requests were settled;
/// no field holds a `Debug` rendering (`Some(`, `None`, `{ `).
#[test]
fn json_logs_say_boot_recovery_requests_refusals_and_the_cutover_once_each() {
    let t = tempfile::tempdir().unwrap();
    let dir = t.path().join("log");
    let d = dir.to_str().unwrap();
    assert!(Command::new(FENCELOG).args(["init", "--dir", d]).output().unwrap().status.success());
    // A process running under its runner when the daemon boots: left running.
    let run = Command::new(FENCELOG).args(["run", "--dir", d, "--wait-ms", "0", "--", "sleep", "60"]).output().unwrap();
    assert!(run.status.success(), "{}", String::from_utf8_lossy(&run.stdout));
    // Started (its runner recorded it) before the daemon boots: else recovery
    // finds it young, not running.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    loop {
        let out = Command::new(FENCELOG).args(["process", "show", "1", "--dir", d]).output().unwrap();
        let v: Value = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
        if v["status"] == "running" {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "the process never started: {v}");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let (child, ready, err) = serve(&dir, &["--log-format", "json", "--access-log"]);
    let url = |p: &str| format!("http://{}{p}", ready["listening"].as_str().unwrap());
    let token = std::fs::read_to_string(dir.join("serve.token")).unwrap().trim().to_owned();
    let trace = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    let (s, _, _) = call(
        &url("/v1/claim"),
        "POST",
        Some(&token),
        Some(json!({"subject": "logged"})),
        &[("Idempotency-Key", "claim-1"), ("traceparent", trace)],
    );
    assert_eq!(s, 200);
    let (s, _, _) =
        call(&url("/v1/heartbeat"), "POST", Some(&token), Some(json!({"subject": "logged", "generation": 7})), &[]);
    assert_eq!(s, 409, "fenced");
    let (s, _, _) = call(&url("/v1/processes/1"), "GET", None, None, &[]);
    assert_eq!(s, 401);
    stop(child);
    let _ = Command::new(FENCELOG).args(["process", "cancel", "1", "--dir", d]).output();

    let text = std::fs::read_to_string(&err).unwrap();
    let lines: Vec<Value> =
        text.lines().map(|l| serde_json::from_str(l).unwrap_or_else(|_| panic!("not JSON: {l}"))).collect();
    let with = |message: &str| lines.iter().filter(|l| l["message"] == message).collect::<Vec<_>>();
    let boot = with("ready");
    assert_eq!(boot.len(), 1, "{text}");
    assert_eq!((boot[0]["home"].as_str(), boot[0]["generation"].as_u64()), (Some("fencelog/serve"), Some(1)));
    assert_eq!(boot[0]["listening"], ready["listening"]);
    assert!(boot[0]["replayed"].is_u64() && boot[0]["log"].as_str().is_some_and(|l| l.ends_with("log")), "{text}");
    let recovery = with("process recovery");
    assert_eq!(recovery.len(), 1, "{text}");
    assert_eq!((recovery[0]["decision"].as_str(), recovery[0]["process"].as_u64()), (Some("left_running"), Some(1)));
    let access = with("request");
    assert_eq!(access.len(), 3, "one line per request: {text}");
    let claim = access.iter().find(|l| l["route"] == "/v1/claim").expect("the claim");
    assert_eq!((claim["method"].as_str(), claim["status"].as_u64()), (Some("POST"), Some(200)));
    assert_eq!(claim["request_id"], "claim-1");
    assert_eq!(claim["trace_id"], "4bf92f3577b34da6a3ce929d0e0e4736");
    assert!(claim["latency_ms"].as_f64().is_some_and(|ms| ms >= 0.0));
    assert!(claim["caller"].as_str().unwrap().starts_with("tcp 127.0.0.1:"), "{claim}");
    assert!(access.iter().any(|l| l["route"] == "/v1/processes/{id}" && l["status"] == 401), "a template: {text}");
    let refused = with("refusal kept as evidence");
    assert_eq!(refused.len(), 1, "{text}");
    assert_eq!((refused[0]["code"].as_str(), refused[0]["subject"].as_str()), (Some("FENCED"), Some("logged")));
    let cutover = with("cutover");
    assert_eq!(cutover.len(), 1, "one line per cutover: {text}");
    assert_eq!((cutover[0]["reason"].as_str(), cutover[0]["admitted"].as_u64()), (Some("SIGTERM"), Some(0)));
    let mut all = vec![];
    lines.iter().for_each(|l| strings(l, &mut all));
    for s in all {
        assert!(!s.contains("Some(") && s != "None" && !s.contains(" { "), "a Debug dump: {s}");
    }
}

/// Proves: with no flags the daemon logs as text, and says it is ready in one
/// line at the default level (it said nothing before); a plain command (`state`)
/// stays quiet on stderr.
#[test]
fn text_logs_by_default_one_line_at_boot_and_quiet_commands() {
    let t = tempfile::tempdir().unwrap();
    let dir = t.path().join("log");
    let (child, _, err) = serve(&dir, &[]);
    stop(child);
    let text = std::fs::read_to_string(&err).unwrap();
    let boot: Vec<&str> = text.lines().filter(|l| l.contains(" ready ") || l.ends_with(" ready")).collect();
    assert_eq!(boot.len(), 1, "{text}");
    assert!(boot[0].contains("INFO") && boot[0].contains("home=fencelog/serve"), "{text}");
    assert!(serde_json::from_str::<Value>(boot[0]).is_err(), "text, not JSON");
    let out =
        Command::new(FENCELOG).args(["state", "--dir", dir.to_str().unwrap()]).env_remove("RUST_LOG").output().unwrap();
    assert_eq!((out.status.code(), out.stderr.len()), (Some(0), 0), "{}", String::from_utf8_lossy(&out.stderr));
}
