//! `--server URL`: the operation commands as an HTTP client of `fencelog serve`,
//! printing the same JSON with the same exit codes as when they open the log.

use std::io::Write;
use std::time::Duration;

use fencelog::ops::{GenerationOp, OpError};
use serde_json::{Value, json};

use crate::Printed;
use crate::cli::{Cmd, Dir, LeaseCmd, ProcessCmd, RequestCmd, StreamArg};
use crate::mutate::{Op, op_of};

/// The directory/server arguments of a command, if it has them.
pub(crate) fn dir_of(cmd: &Cmd) -> Option<&Dir> {
    match cmd {
        Cmd::Init { dir }
        | Cmd::Repair { dir, .. }
        | Cmd::Claim { dir, .. }
        | Cmd::Heartbeat { dir, .. }
        | Cmd::Release { dir, .. }
        | Cmd::RotateFence { dir, .. }
        | Cmd::Note { dir, .. }
        | Cmd::Takeover { dir, .. }
        | Cmd::State { dir, .. }
        | Cmd::Run { dir, .. }
        | Cmd::Recover { dir, .. }
        | Cmd::Runner { dir, .. } => Some(dir),
        Cmd::Lease { cmd: LeaseCmd::Acquire { dir, .. } | LeaseCmd::Release { dir, .. } } => Some(dir),
        Cmd::Request { cmd: RequestCmd::Show { dir, .. } } => Some(dir),
        Cmd::Process { cmd } => Some(match cmd {
            ProcessCmd::Show { dir, .. }
            | ProcessCmd::Wait { dir, .. }
            | ProcessCmd::Cancel { dir, .. }
            | ProcessCmd::Logs { dir, .. }
            | ProcessCmd::List { dir, .. } => dir,
        }),
        Cmd::Inspect { .. }
        | Cmd::Audit { .. }
        | Cmd::Export { .. }
        | Cmd::Import { .. }
        | Cmd::Archive { .. }
        | Cmd::Completions { .. }
        | Cmd::Man { .. }
        | Cmd::Version { .. }
        | Cmd::Serve { .. } => None,
    }
}

fn usage(message: impl Into<String>) -> OpError {
    OpError::Usage { code: "USAGE", message: message.into() }
}

/// Percent-encode one path segment or query value.
fn enc(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

enum Call {
    Post(String, Value, Option<String>),
    Get(String),
}

fn body<T: serde::Serialize>(v: &T) -> Value {
    serde_json::to_value(v).expect("requests serialize")
}

/// The HTTP request a command stands for, or why it has none.
fn call_of(cmd: Cmd) -> Result<Call, OpError> {
    let post = |path: &str, v: Value| {
        let id = v["request_id"].as_str().map(str::to_owned);
        Call::Post(path.into(), v, id)
    };
    let cmd = match op_of(cmd) {
        Ok((_, op)) => {
            return Ok(match op {
                Op::Claim(r) => post("/v1/claim", body(&r)),
                Op::Generation(op, r) => post(
                    match op {
                        GenerationOp::Heartbeat => "/v1/heartbeat",
                        GenerationOp::Release => "/v1/release",
                        GenerationOp::RotateFence => "/v1/rotate-fence",
                    },
                    body(&r),
                ),
                Op::Note(r) => post("/v1/note", body(&r)),
                Op::Takeover(r) => post("/v1/takeover", body(&r)),
                Op::LeaseAcquire(r) => post("/v1/lease/acquire", body(&r)),
                Op::LeaseRelease(r) => post("/v1/lease/release", body(&r)),
                Op::Run(r) => post("/v1/run", body(&r)),
            });
        }
        Err(cmd) => *cmd,
    };
    Ok(match cmd {
        Cmd::Request { cmd: RequestCmd::Show { id, .. } } => Call::Get(format!("/v1/requests/{}", enc(&id))),
        Cmd::State { subject, .. } => match subject {
            Some(s) => Call::Get(format!("/v1/state?subject={}", enc(&s))),
            None => Call::Get("/v1/state".into()),
        },
        Cmd::Process { cmd } => match cmd {
            ProcessCmd::Show { id, .. } => Call::Get(format!("/v1/processes/{id}")),
            ProcessCmd::List { status, owner, .. } => {
                let mut q = vec![];
                if let Some(s) = status {
                    q.push(format!("status={}", enc(&s)));
                }
                if let Some(o) = owner {
                    q.push(format!("owner={}", enc(&o)));
                }
                Call::Get(format!("/v1/processes{}{}", if q.is_empty() { "" } else { "?" }, q.join("&")))
            }
            ProcessCmd::Wait { id, timeout_ms, .. } => {
                Call::Post(format!("/v1/processes/{id}/wait"), json!({"timeout_ms": timeout_ms}), None)
            }
            ProcessCmd::Cancel { id, owner, generation, grace_ms, .. } => Call::Post(
                format!("/v1/processes/{id}/cancel"),
                json!({"owner": owner, "generation": generation, "grace_ms": grace_ms}),
                None,
            ),
            ProcessCmd::Logs { follow: true, .. } => return Err(usage("process logs --follow works on a directory")),
            ProcessCmd::Logs { id, stream, .. } => {
                let s = match stream {
                    StreamArg::Stdout => "stdout",
                    StreamArg::Stderr => "stderr",
                };
                Call::Get(format!("/v1/processes/{id}/logs?stream={s}"))
            }
        },
        _ => return Err(usage("this command works on a log directory, not over --server")),
    })
}

/// The CLI's exit code for a daemon's HTTP status.
fn exit_code(status: u16) -> u8 {
    match status {
        200..=299 => 0,
        400 | 401 | 413 => 2,
        404 | 409 => 3,
        _ => 1,
    }
}

pub(crate) fn run(cmd: Cmd, server: &str) -> Printed {
    let token_file = dir_of(&cmd)
        .and_then(|d| d.token_file.clone())
        .ok_or_else(|| usage("--server needs the daemon's token: --token-file FILE (or FENCELOG_TOKEN_FILE)"))?;
    let token = std::fs::read_to_string(&token_file)
        .map_err(|e| OpError::Io { message: format!("{}: {e}", token_file.display()) })?;
    let raw_logs = matches!(&cmd, Cmd::Process { cmd: ProcessCmd::Logs { .. } });
    let call = call_of(cmd)?;
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(Duration::from_secs(120)))
        .build()
        .into();
    let base = server.trim_end_matches('/');
    let auth = format!("Bearer {}", token.trim());
    let sent = match call {
        Call::Get(path) => agent.get(format!("{base}{path}")).header("Authorization", &auth).call(),
        Call::Post(path, body, request_id) => {
            let mut r = agent
                .post(format!("{base}{path}"))
                .header("Authorization", &auth)
                .header("Content-Type", "application/json");
            if let Some(id) = &request_id {
                r = r.header("Idempotency-Key", id);
            }
            r.send(body.to_string())
        }
    };
    let mut resp = sent.map_err(|e| OpError::Io { message: format!("{base}: {e}") })?;
    let status = resp.status().as_u16();
    let bytes = resp
        .body_mut()
        .with_config()
        .limit(128 << 20)
        .read_to_vec()
        .map_err(|e| OpError::Io { message: format!("{base}: reading the answer: {e}") })?;
    if raw_logs && status == 200 {
        let mut out = std::io::stdout().lock();
        out.write_all(&bytes).and_then(|_| out.flush()).map_err(crate::stdout_error)?;
        return Ok((Value::Null, 0));
    }
    let v: Value = serde_json::from_slice(&bytes)
        .map_err(|e| OpError::Io { message: format!("{base}: the answer is not JSON ({e})") })?;
    if (200..300).contains(&status) {
        return Ok((v, 0));
    }
    // A problem document back into the CLI's error body.
    let mut err = match v {
        Value::Object(m) => m,
        other => return Ok((json!({"error": {"code": "IO_ERROR", "message": other.to_string()}}), 1)),
    };
    for k in ["type", "title", "status"] {
        err.remove(k);
    }
    // RFC 9457's `detail` repeats the message; a refusal's own `detail` is evidence.
    if err.get("detail") == err.get("message") || !err.contains_key("message") {
        let detail = err.remove("detail").unwrap_or(Value::Null);
        err.entry("message").or_insert(detail);
    }
    if let Some(m) = err.get("message").and_then(Value::as_str) {
        eprintln!("fencelog: {m}");
    }
    Ok((json!({ "error": err }), exit_code(status)))
}
