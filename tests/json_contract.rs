//! The JSON contract through the CLI: every enum value is snake_case, and every
//! outcome — `request show` included — is a flat object with `kind`.

mod common;

use common::fl;

use std::process::Command;

use serde_json::Value;

const FENCELOG: &str = env!("CARGO_BIN_EXE_fencelog");

/// Every NDJSON line of a read-only command's output.
fn lines(args: &[&str]) -> Vec<Value> {
    let out = Command::new(FENCELOG).args(args).output().unwrap();
    assert!(out.status.success(), "{args:?}: {}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8_lossy(&out.stdout);
    match serde_json::from_str(&text) {
        Ok(v) => vec![v],
        Err(_) => text.lines().map(|l| serde_json::from_str(l).unwrap()).collect(),
    }
}

/// A value that looks like a Rust variant name: `Write`, `ProcessDead`, `Claimed`.
fn pascal(s: &str) -> bool {
    let mut chars = s.chars();
    chars.next().is_some_and(|c| c.is_ascii_uppercase())
        && s.len() > 2
        && s.chars().all(|c| c.is_ascii_alphanumeric())
        && s.chars().any(|c| c.is_ascii_lowercase())
}

/// Paths in `v` where an enum leaks as a variant name: a PascalCase string, or an
/// object keyed by one (`{"Claimed": {…}}`).
fn leaks(v: &Value, path: &str, out: &mut Vec<String>) {
    match v {
        Value::String(s) if pascal(s) => out.push(format!("{path} = {s:?}")),
        Value::Array(a) => a.iter().enumerate().for_each(|(i, x)| leaks(x, &format!("{path}[{i}]"), out)),
        Value::Object(o) => {
            for (k, x) in o {
                if pascal(k) {
                    out.push(format!("{path}.{k} (a variant as a key)"));
                }
                leaks(x, &format!("{path}.{k}"), out);
            }
        }
        _ => {}
    }
}

/// Proves: after claims, heartbeats, a takeover, a claim over a killed owner, a
/// refused late note, read and write leases (released, released with a wrong
/// token, already ended) and a supervised command, no JSON the CLI prints —
/// mutation answers, `request show`, `state`, `inspect dump --json`, `inspect
/// state --json`, `audit --format json`, `process show` — holds a variant name,
/// and every outcome `request show` lists is flat with a snake_case `kind`.
#[test]
fn every_enum_value_in_cli_json_is_snake_case_and_outcomes_are_flat() {
    // The detector itself: what earlier builds printed is caught.
    let mut old = vec![];
    leaks(&serde_json::json!({"mode": "Write", "how": {"DeadOwner": "ProcessDead"}, "subject": "svc/a"}), "", &mut old);
    assert_eq!(old.len(), 3, "{old:?}");
    let t = tempfile::tempdir().unwrap();
    let dir = t.path().join("log");
    let mut printed: Vec<(String, Value)> = vec![];
    let mut run = |args: &[&str]| {
        let (code, v) = fl(&dir, args);
        printed.push((args.join(" "), v.clone()));
        (code, v)
    };
    assert_eq!(run(&["init"]).0, 0);
    let mut owner = Command::new("sleep").arg("60").spawn().unwrap();
    let pid = owner.id().to_string();
    let me = std::process::id().to_string();
    assert_eq!(run(&["claim", "--subject", "svc/a", "--pid", &pid, "--request-id", "r-claim"]).0, 0);
    assert_eq!(run(&["heartbeat", "--subject", "svc/a", "--generation", "1"]).0, 0);
    owner.kill().unwrap();
    owner.wait().unwrap();
    let (code, c) = run(&["claim", "--subject", "svc/a", "--pid", &me, "--request-id", "r-dead"]);
    assert_eq!((code, c["retired"]["how"]["kind"].as_str()), (0, Some("dead_owner")), "{c}");
    assert_eq!(run(&["note", "--subject", "svc/a", "--generation", "1", "--text", "late"]).0, 3);
    assert_eq!(run(&["claim", "--subject", "svc/b", "--pid", &me, "--stale-after-ms", "1"]).0, 0);
    std::thread::sleep(std::time::Duration::from_millis(20));
    let (_, st) = run(&["state", "--subject", "svc/b"]);
    let hb = st["subjects"][0]["heartbeat_ms"].as_u64().unwrap().to_string();
    let (code, tk) = run(&[
        "takeover",
        "--subject",
        "svc/b",
        "--expect-generation",
        "1",
        "--expect-heartbeat-ms",
        &hb,
        "--pid",
        &me,
        "--request-id",
        "r-take",
    ]);
    assert_eq!(code, 0, "{tk}");
    let (code, w) =
        run(&["lease", "acquire", "--resource", "db", "--mode", "write", "--holder", "h", "--request-id", "r-lw"]);
    assert_eq!(code, 0, "{w}");
    let lease = w["lease"].as_u64().unwrap().to_string();
    let token = w["token"].as_u64().unwrap();
    assert_eq!(run(&["lease", "release", "--lease", &lease, "--token", &(token + 7).to_string()]).0, 3);
    assert_eq!(run(&["lease", "release", "--lease", &lease, "--token", &token.to_string()]).0, 0);
    assert_eq!(run(&["lease", "release", "--lease", &lease, "--token", &token.to_string()]).0, 0);
    assert_eq!(run(&["lease", "acquire", "--resource", "db", "--mode", "read", "--holder", "r"]).0, 0);
    let (code, p) = run(&["run", "--request-id", "r-run", "--lease", "files:write", "--", "true"]);
    assert_eq!((code, p["status"].as_str()), (0, Some("succeeded")), "{p}");
    run(&["process", "show", &p["id"].to_string()]);
    run(&["state"]);
    for id in ["r-claim", "r-dead", "r-take", "r-lw", "r-run"] {
        let (code, r) = run(&["request", "show", id]);
        assert_eq!(code, 0, "{r}");
        let outcomes = r["outcomes"].as_array().unwrap_or_else(|| panic!("request {id}: {r}"));
        assert!(!outcomes.is_empty(), "{r}");
        for o in outcomes {
            let kind = o["kind"].as_str().unwrap_or_else(|| panic!("an outcome without kind: {o}"));
            assert!(kind.chars().all(|c| c.is_ascii_lowercase() || c == '_'), "{o}");
        }
    }
    let d = dir.to_str().unwrap();
    for args in [
        vec!["inspect", "dump", "--json", d],
        vec!["inspect", "state", "--json", d],
        vec!["audit", "--format", "json", d],
    ] {
        for v in lines(&args) {
            printed.push((args.join(" "), v));
        }
    }
    let mut found = vec![];
    for (cmd, v) in &printed {
        let mut here = vec![];
        leaks(v, "", &mut here);
        found.extend(here.into_iter().map(|l| format!("{cmd}: {l}")));
    }
    assert!(found.is_empty(), "variant names in JSON:\n{}", found.join("\n"));
    assert!(printed.len() > 20, "the commands printed JSON: {}", printed.len());
}

/// Proves: text output quotes subjects, so two that print alike are told apart:
/// `svc` and `svc ` (a trailing space is allowed in a name) in `inspect state`,
/// `inspect dump` and `audit`.
#[test]
fn text_output_quotes_subjects_so_look_alikes_are_visible() {
    let t = tempfile::tempdir().unwrap();
    let dir = t.path().join("log");
    assert_eq!(fl(&dir, &["init"]).0, 0);
    let me = std::process::id().to_string();
    for s in ["svc", "svc "] {
        let (code, v) = fl(&dir, &["claim", "--subject", s, "--pid", &me]);
        assert_eq!(code, 0, "{v}");
    }
    let d = dir.to_str().unwrap();
    for args in [vec!["inspect", "state", d], vec!["inspect", "dump", d], vec!["audit", d]] {
        let out = Command::new(FENCELOG).args(&args).output().unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(text.contains("\"svc\"") && text.contains("\"svc \""), "{args:?}:\n{text}");
    }
}
