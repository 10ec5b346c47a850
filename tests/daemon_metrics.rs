//! `GET /metrics` as a Prometheus server receives it: a real daemon, a real
//! scrape, the answer parsed by a Prometheus text parser (prometheus-parse) and
//! checked by Prometheus' own `promtool check metrics` (Debian's `prometheus`).

mod common;

use std::io::Write;
use std::process::{Command, Stdio};

use common::daemon::{Daemon, agent};

/// (status, content type, body) of one scrape with `accept`.
fn scrape(d: &Daemon, accept: Option<&str>) -> (u16, String, String) {
    let mut r = agent().get(&d.url("/metrics")).header("Authorization", &format!("Bearer {}", d.token));
    if let Some(a) = accept {
        r = r.header("Accept", a);
    }
    let resp = r.call().unwrap();
    let status = resp.status().as_u16();
    let kind = resp.headers().get("content-type").and_then(|v| v.to_str().ok()).unwrap_or("").to_owned();
    (status, kind, resp.into_body().read_to_string().unwrap())
}

/// Proves: a scrape without `Accept` (what promtool, curl and a Prometheus server
/// that does not negotiate get) is the text format 0.0.4 that `promtool check
/// metrics` passes with no complaint (it failed with "no help text" on every
/// `_total` family before); every family has HELP and TYPE; counters are
/// counters named `_total` (appends and syncs were gauges; the leads on a
/// request's own worker are counters too); the process metrics,
/// the build info, the limits, readiness and the home's heartbeat age are there;
/// the commit latency is a histogram by operation.
#[test]
fn a_plain_scrape_is_prometheus_text_that_promtool_accepts() {
    let t = tempfile::tempdir().unwrap();
    let d = Daemon::start(&t.path().join("log"), &[]);
    assert_eq!(d.post("/v1/claim", serde_json::json!({"subject": "m"})).0, 200);
    assert_eq!(d.post("/v1/claim", serde_json::json!({"subject": "m"})).0, 409);
    let (status, kind, text) = scrape(&d, None);
    assert_eq!((status, kind.as_str()), (200, "text/plain; version=0.0.4; charset=utf-8"));
    assert!(!text.contains("# EOF") && !text.contains("# UNIT"), "not OpenMetrics");

    let mut promtool = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("promtool: {e} (scripts/deps.sh test installs Debian's prometheus)"));
    promtool.stdin.take().unwrap().write_all(text.as_bytes()).unwrap();
    let checked = promtool.wait_with_output().unwrap();
    let said = String::from_utf8_lossy(&checked.stdout).into_owned() + &String::from_utf8_lossy(&checked.stderr);
    assert!(checked.status.success() && said.trim().is_empty(), "promtool check metrics: {said}\n{text}");

    let scrape = prometheus_parse::Scrape::parse(text.lines().map(|l| Ok(l.to_owned()))).unwrap();
    let value = |name: &str| {
        scrape
            .samples
            .iter()
            .find(|s| s.metric == name)
            .map(|s| match s.value {
                prometheus_parse::Value::Counter(v)
                | prometheus_parse::Value::Gauge(v)
                | prometheus_parse::Value::Untyped(v) => v,
                _ => f64::NAN,
            })
            .unwrap_or_else(|| panic!("no {name} in:\n{text}"))
    };
    for s in &scrape.samples {
        let family = s.metric.trim_end_matches("_bucket").trim_end_matches("_sum").trim_end_matches("_count");
        assert!(scrape.docs.contains_key(&s.metric) || scrape.docs.contains_key(family), "{} has no HELP", s.metric);
    }
    let type_of = |name: &str| text.lines().find_map(|l| l.strip_prefix(&format!("# TYPE {name} "))).map(str::to_owned);
    for counter in [
        "fencelog_appends_total",
        "fencelog_syncs_total",
        "fencelog_inline_leads_total",
        "fencelog_inline_leads_declined_total",
        "fencelog_http_requests_total",
        "process_cpu_seconds_total",
    ] {
        assert_eq!(type_of(counter).as_deref(), Some("counter"), "{counter}");
    }
    // Each mutation led at most once on its worker (whether it led at all depends
    // on the home's own heartbeats meanwhile).
    let leads = value("fencelog_inline_leads_total") + value("fencelog_inline_leads_declined_total");
    assert!(leads <= 2.0, "two mutations, {leads} leads on a worker");
    assert!(value("fencelog_appends_total") >= 2.0, "the home's claim and the claim of m");
    assert_eq!(value("fencelog_ready"), 1.0);
    assert!(value("fencelog_home_heartbeat_age_seconds") >= 0.0);
    assert_eq!(value("fencelog_requests_in_flight_limit"), 256.0);
    assert_eq!(value("fencelog_connections_limit"), 512.0);
    assert!(value("fencelog_connections_open") >= 1.0, "this scrape's own connection");
    assert!(value("process_resident_memory_bytes") > 1e6);
    assert!(value("process_open_fds") > 3.0);
    let start = value("process_start_time_seconds");
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs_f64();
    assert!(start > now - 3600.0 && start <= now + 1.0, "started within the hour: {start} vs {now}");
    let build = scrape.samples.iter().find(|s| s.metric == "fencelog_build_info").expect("build info");
    assert_eq!(build.labels.get("version"), Some(env!("CARGO_PKG_VERSION")));
    assert_eq!(type_of("fencelog_commit_seconds").as_deref(), Some("histogram"));
    assert!(text.contains(r#"fencelog_commit_seconds_count{op="claim"} 2"#), "{text}");
    let refused = scrape
        .samples
        .iter()
        .find(|s| s.metric == "fencelog_refusals_total" && s.labels.get("code") == Some("ALREADY_ACTIVE"));
    assert!(refused.is_some(), "the 409 is counted by its code");
}

/// Proves: a scraper that asks for OpenMetrics (`Accept:
/// application/openmetrics-text`) gets OpenMetrics 1.0: its content type, its
/// `# EOF`, and the counter family named without `_total` in its HELP.
#[test]
fn a_scrape_that_asks_for_openmetrics_gets_it() {
    let t = tempfile::tempdir().unwrap();
    let d = Daemon::start(&t.path().join("log"), &[]);
    assert_eq!(d.post("/v1/claim", serde_json::json!({"subject": "m"})).0, 200);
    let (status, kind, text) =
        scrape(&d, Some("application/openmetrics-text; version=1.0.0,text/plain;version=0.0.4;q=0.5"));
    assert_eq!((status, kind.as_str()), (200, "application/openmetrics-text; version=1.0.0; charset=utf-8"));
    assert!(text.ends_with("# EOF\n"), "{text}");
    assert!(text.contains("# TYPE fencelog_appends counter"), "{text}");
    assert!(text.contains("# UNIT fencelog_commit_seconds seconds"), "{text}");
}

/// Proves: the example alert rules in `docs/fencelog.rules.yml` are valid for
/// Prometheus (`promtool check rules`) and use only families the daemon exports.
#[test]
fn the_example_alert_rules_are_valid_and_use_exported_families() {
    let rules = concat!(env!("CARGO_MANIFEST_DIR"), "/docs/fencelog.rules.yml");
    let out = Command::new("promtool").args(["check", "rules", rules]).output().unwrap();
    assert!(out.status.success(), "{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    let t = tempfile::tempdir().unwrap();
    let d = Daemon::start(&t.path().join("log"), &[]);
    assert_eq!(d.post("/v1/claim", serde_json::json!({"subject": "r"})).0, 200);
    assert_eq!(d.post("/v1/claim", serde_json::json!({"subject": "r"})).0, 409, "a refusal, counted");
    let (_, _, text) = scrape(&d, None);
    let yaml = std::fs::read_to_string(rules).unwrap();
    for family in ["fencelog_home_heartbeat_age_seconds", "fencelog_ready", "fencelog_refusals_total"] {
        assert!(yaml.contains(family), "a rule on {family}");
        assert!(text.contains(&format!("# TYPE {family} ")), "{family} is exported");
    }
}
