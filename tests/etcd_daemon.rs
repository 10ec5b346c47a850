//! The daemon on a log in etcd: real `fencelog serve` processes on simulated
//! hosts (`FENCELOG_HOST_ID`), a real 3-member etcd cluster on loopback (the
//! binary's shared one, or one of a test's own when it kills members), real
//! `kill -9`, `SIGSTOP`, and a real runner process. Each test opens with what it
//! proves.

mod common;

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use common::daemon::{Daemon, FENCELOG, call, header};
use common::etcd::{self, Cluster};
use serde_json::{Value, json};

/// Everything here waits for a condition; this bounds each wait so that a
/// broken build fails instead of hanging (never a margin a test relies on).
const WAIT_BOUND: Duration = Duration::from_secs(60);

/// A log in etcd: its endpoints and prefix.
#[derive(Clone)]
struct Log {
    endpoints: String,
    prefix: String,
}

impl Log {
    fn new(endpoints: &str, what: &str) -> Log {
        let log = Log { endpoints: endpoints.to_owned(), prefix: etcd::fresh_prefix(what) };
        let (code, out) = log.fl(&["init"]);
        assert_eq!(code, 0, "{out}");
        log
    }

    fn args(&self) -> Vec<String> {
        vec!["--etcd".into(), self.endpoints.clone(), "--etcd-prefix".into(), self.prefix.clone()]
    }

    /// `fencelog CMD --etcd … --etcd-prefix … REST` (inspect and audit: `inspect
    /// verify` is two words).
    fn fl(&self, args: &[&str]) -> (i32, Value) {
        let (cmd, rest) = args.split_at(if matches!(args[0], "inspect" | "request" | "process") { 2 } else { 1 });
        let out = Command::new(FENCELOG).args(cmd).args(self.args()).args(rest).output().unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        (out.status.code().unwrap_or(-1), serde_json::from_str(text.trim()).unwrap_or(json!(text.trim())))
    }

    /// A daemon of host `host` on this log, its local state in `dir`.
    fn serve(&self, dir: &Path, host: &str, extra: &[&str]) -> Daemon {
        self.try_serve(dir, host, extra).unwrap_or_else(|(code, out)| panic!("serve exited {code:?}: {out}"))
    }

    fn try_serve(&self, dir: &Path, host: &str, extra: &[&str]) -> Result<Daemon, (Option<i32>, String)> {
        let mut args: Vec<String> = self.args();
        args.extend(extra.iter().map(|s| s.to_string()));
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        Daemon::try_start_with(dir, &args, &[("FENCELOG_HOST_ID", host)])
    }

    fn verify(&self) -> Value {
        let (code, v) = self.fl(&["inspect", "verify", "--json"]);
        assert_eq!((code, v["status"].as_str()), (0, Some("intact")), "{v}");
        v
    }
}

fn home_of(host: &str) -> String {
    format!("fencelog/serve/{host}")
}

/// Wait for `cond`, within [`WAIT_BOUND`].
fn wait_until(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + WAIT_BOUND;
    while !cond() {
        assert!(Instant::now() < deadline, "waited {WAIT_BOUND:?} for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The exit code of `d`'s process, once it has exited.
fn exit_of(d: &mut Daemon) -> Option<i32> {
    let mut code = None;
    wait_until("the daemon to exit", || match d.child.try_wait().unwrap() {
        Some(s) => {
            code = Some(s.code());
            true
        }
        None => false,
    });
    code.flatten()
}

/// Proves: two daemons on two hosts race 100 claims on 20 shared subjects (5
/// rounds: both claim every subject at once, the winner releases): exactly one
/// winner each time — the loser is refused `ALREADY_ACTIVE` (409) — the
/// generations each subject issued are 1..=5, each once, and the chain is intact
/// (`inspect verify --etcd`). Each daemon's home is its host's.
#[test]
fn two_daemons_on_two_hosts_race_100_claims_with_one_winner_each() {
    let log = Log::new(&etcd::shared().endpoints, "race");
    let t = tempfile::tempdir().unwrap();
    let a = log.serve(&t.path().join("a"), "host-a", &[]);
    let b = log.serve(&t.path().join("b"), "host-b", &[]);
    let (_, s) = a.get(&format!("/v1/state?subject={}", home_of("host-b")));
    assert_eq!(s["subjects"][0]["owner_host"], "host-b", "{s}");
    let issued: Mutex<BTreeMap<String, Vec<u64>>> = Mutex::new(BTreeMap::new());
    for _round in 0..5 {
        for i in 0..20 {
            let subject = format!("race/{i}");
            let answers: Vec<(u16, Value)> = std::thread::scope(|sc| {
                let hs: Vec<_> = [&a, &b]
                    .into_iter()
                    .map(|d| {
                        let subject = subject.clone();
                        sc.spawn(move || d.post("/v1/claim", json!({"subject": subject})))
                    })
                    .collect();
                hs.into_iter().map(|h| h.join().unwrap()).collect()
            });
            let won: Vec<&(u16, Value)> = answers.iter().filter(|(s, _)| *s == 200).collect();
            assert_eq!(won.len(), 1, "exactly one winner: {answers:?}");
            let lost = answers.iter().find(|(s, _)| *s != 200).unwrap();
            assert_eq!((lost.0, lost.1["code"].as_str()), (409, Some("ALREADY_ACTIVE")), "{answers:?}");
            let generation = won[0].1["generation"].as_u64().unwrap();
            issued.lock().unwrap().entry(subject.clone()).or_default().push(generation);
            let winner = if answers[0].0 == 200 { &a } else { &b };
            let (code, r) = winner.post("/v1/release", json!({"subject": subject, "generation": generation}));
            assert_eq!(code, 200, "{r}");
        }
    }
    for (subject, gens) in issued.into_inner().unwrap() {
        assert_eq!(gens, vec![1, 2, 3, 4, 5], "{subject}: generations dense, each issued once");
    }
    log.verify();
}

/// One mutation's answer under load: the request id, the status, the body.
type Answer = (String, u16, Value);

/// `clients` threads claiming on `daemons` (with request ids) until `stop`;
/// every answer. Even clients claim fresh subjects (each answered 2xx unless
/// the cluster is unavailable); odd clients contend for 10 shared subjects
/// `contested/K`, of which only the first claim of each can win (the rest are
/// 409 `ALREADY_ACTIVE`: answers that must never be in the log).
fn load(daemons: &[&Daemon], clients: usize, stop: &AtomicBool) -> Vec<Answer> {
    let answers = Mutex::new(Vec::new());
    std::thread::scope(|sc| {
        for c in 0..clients {
            let (d, answers) = (daemons[c % daemons.len()], &answers);
            sc.spawn(move || {
                let mut n = 0;
                while !stop.load(Ordering::SeqCst) {
                    let id = format!("load-{c}-{n}");
                    let subject = if c % 2 == 0 { format!("load/{c}/{n}") } else { format!("contested/{}", n % 10) };
                    let (status, v) = d.post("/v1/claim", json!({"subject": subject, "request_id": id}));
                    answers.lock().unwrap().push((id, status, v));
                    n += 1;
                }
            });
        }
    });
    answers.into_inner().unwrap()
}

/// Every answer against the log: a 2xx is committed at its sequence with its
/// generation; a 409 is never committed; a 503 (outcome unknown) is resolved by
/// its request id, committed at most once; no (subject, generation) twice.
/// Returns (acknowledged, refused, unavailable).
fn check_answers(log: &Log, answers: &[Answer]) -> (usize, usize, usize) {
    let (code, dump) = log.fl(&["inspect", "dump", "--json"]);
    assert_eq!(code, 0);
    let lines: Vec<Value> = match &dump {
        Value::String(s) => s.lines().map(|l| serde_json::from_str(l).unwrap()).collect(),
        one => vec![one.clone()],
    };
    let by_seq: BTreeMap<u64, &Value> = lines.iter().map(|r| (r["seq"].as_u64().unwrap(), r)).collect();
    // Each load subject is claimed once: one claim of it in the log at most (a
    // second would be a generation issued twice).
    let mut claims: BTreeMap<String, u64> = BTreeMap::new();
    for r in &lines {
        for e in r["events"].as_array().unwrap() {
            if e["kind"] == "claim" {
                *claims.entry(e["subject"].as_str().unwrap().to_owned()).or_default() += 1;
            }
        }
    }
    assert!(claims.values().all(|n| *n == 1), "a subject claimed twice: {:?}", claims.iter().find(|(_, n)| **n > 1));
    let committed_ids: BTreeMap<&str, usize> =
        lines.iter().filter_map(|r| r["request"].as_str()).fold(BTreeMap::new(), |mut m, id| {
            *m.entry(id).or_default() += 1;
            m
        });
    let (mut ok, mut refused, mut unavailable) = (0, 0, 0);
    for (id, status, v) in answers {
        match status {
            200..=299 => {
                let seq = v["seq"].as_u64().unwrap();
                let r = by_seq.get(&seq).unwrap_or_else(|| panic!("{id} answered at {seq}, not in the log"));
                assert_eq!(r["request"], json!(id), "{id} answered at {seq}: {r}");
                ok += 1;
            }
            409 => {
                assert!(!committed_ids.contains_key(id.as_str()), "{id} was answered 409 and is in the log");
                // The log's own answer too, for the first few (a process each).
                if refused < 10 {
                    let (_, shown) = log.fl(&["request", "show", id]);
                    assert_eq!(shown["status"], "never_committed", "{id} was answered 409: {shown}");
                }
                refused += 1;
            }
            503 => {
                assert!(committed_ids.get(id.as_str()).copied().unwrap_or(0) <= 1, "{id} committed twice");
                let (_, shown) = log.fl(&["request", "show", id]);
                assert!(
                    matches!(shown["status"].as_str(), Some("committed" | "never_committed")),
                    "{id} was answered 503; its outcome is resolvable: {shown}"
                );
                unavailable += 1;
            }
            _ => {}
        }
    }
    for (id, n) in &committed_ids {
        assert_eq!(*n, 1, "request {id} committed {n} times");
    }
    (ok, refused, unavailable)
}

/// Proves: `kill -9` of the etcd leader while two daemons on two hosts take
/// claims from 8 clients: every mutation answered 2xx is in the log at its
/// sequence (its request id there) once the cluster has a leader again, none
/// answered 409 was committed, no claim is in the log twice, and `inspect verify
/// --etcd` says intact. Requests in between are answered 503 (`ETCD_UNAVAILABLE`,
/// `Retry-After`) or succeed — never hang.
#[test]
fn kill_9_of_the_etcd_leader_under_load_loses_no_acknowledged_mutation() {
    let mut cluster = Cluster::start(3);
    let log = Log::new(&cluster.endpoints, "leader");
    let t = tempfile::tempdir().unwrap();
    let a = log.serve(&t.path().join("a"), "host-a", &[]);
    let b = log.serve(&t.path().join("b"), "host-b", &[]);
    let stop = AtomicBool::new(false);
    let leader = Mutex::new(None);
    let answers = std::thread::scope(|sc| {
        let loader = sc.spawn(|| load(&[&a, &b], 8, &stop));
        // Some answers before, the kill under load, some answers after.
        let count = |d: &Daemon| d.get("/v1/head").1["seq"].as_u64().unwrap_or(0);
        wait_until("load before the kill", || count(&a) > 100);
        let l = cluster.leader().expect("a leader");
        cluster.kill(l);
        *leader.lock().unwrap() = Some(l);
        let before = count(&a).max(count(&b));
        wait_until("load after a new leader", || count(&a) > before + 100 || count(&b) > before + 100);
        stop.store(true, Ordering::SeqCst);
        loader.join().unwrap()
    });
    cluster.restart(leader.into_inner().unwrap().unwrap());
    let unavailable: Vec<&Answer> = answers.iter().filter(|(_, s, _)| *s == 503).collect();
    for (_, _, v) in &unavailable {
        assert!(matches!(v["code"].as_str(), Some("ETCD_UNAVAILABLE" | "NOT_COMMITTED" | "REQUEST_TIMEOUT")), "{v}");
    }
    assert!(answers.iter().all(|(_, s, _)| matches!(s, 200 | 409 | 503)), "{:?}", &answers[..5]);
    let (ok, refused, unavailable) = check_answers(&log, &answers);
    eprintln!("{ok} acknowledged, {refused} refused (409), {unavailable} unavailable (503)");
    assert!(ok > 100, "the load ran: {ok} acknowledged");
    assert!(refused > 0, "contended claims were refused, and none of them is in the log");
    log.verify();
    drop((a, b));
}

/// Proves: with quorum lost (2 of 3 members killed) mutations are answered 503
/// `ETCD_UNAVAILABLE` with `Retry-After` — an answer, not a hang — reads refuse
/// the same way (never an answer from a state that may be behind), and the
/// daemon is not ready; when quorum returns the daemon goes on: ready, its home
/// still its own, mutations answered. A mutation answered 503 with a request id
/// is settled by asking again with that id.
#[test]
fn with_quorum_lost_the_daemon_answers_503_and_goes_on_when_it_returns() {
    let mut cluster = Cluster::start(3);
    let log = Log::new(&cluster.endpoints, "quorum");
    let t = tempfile::tempdir().unwrap();
    let a = log.serve(&t.path().join("a"), "host-a", &[]);
    assert_eq!(a.post("/v1/claim", json!({"subject": "before"})).0, 200);
    cluster.kill(1);
    cluster.kill(2);
    let (status, v, hs) = a.call("POST", "/v1/claim", Some(json!({"subject": "during", "request_id": "q-1"})), &[]);
    assert_eq!((status, v["code"].as_str()), (503, Some("ETCD_UNAVAILABLE")), "{v}");
    assert_eq!(header(&hs, "retry-after"), Some("1"));
    let (status, v) = a.get("/v1/state");
    assert_eq!((status, v["code"].as_str()), (503, Some("ETCD_UNAVAILABLE")), "reads refuse: {v}");
    wait_until("not ready", || call(&a.url("/readyz"), "GET", None, None, &[]).0 == 503);
    cluster.restart(1);
    cluster.restart(2);
    wait_until("ready again", || call(&a.url("/readyz"), "GET", None, None, &[]).0 == 200);
    let (status, v) = a.post("/v1/claim", json!({"subject": "during", "request_id": "q-1"}));
    assert_eq!(status, 200, "the same request, asked again: {v}");
    let (_, s) = a.get(&format!("/v1/state?subject={}", home_of("host-a")));
    assert_eq!(s["subjects"][0]["generation"], 1, "its home is still its own: {s}");
    log.verify();
}

/// The audit of a home taken over from a daemon that then wrote on: its tenure
/// retired by a takeover whose writer (on `taker`) watched it unchanged for more
/// than `stale_after_ms` on its own clock, then its refused heartbeat (`FENCED`,
/// presented the old generation) after the takeover.
fn audit_tells_the_story(log: &Log, home: &str, taker: &str, stale_after_ms: u64) {
    let (code, audit) = log.fl(&["audit", "--format", "json", "--subject", home]);
    assert_eq!(code, 0, "{audit}");
    let s = &audit["subjects"][0];
    let tenures = s["tenures"].as_array().unwrap();
    assert_eq!(tenures[0]["ended"]["by"], "takeover of a stale owner", "{s}");
    let began = &tenures[1]["began"];
    assert_eq!(began["kind"], "takeover_of_stale_owner", "{s}");
    let seen = &began["staleness_observed"];
    assert_eq!(seen["host"], taker, "{s}");
    assert!(seen["watched_ms"].as_u64().unwrap() > stale_after_ms, "{s}");
    let refused = &s["fenced_attempts"][0];
    assert_eq!(
        (refused["code"].as_str(), refused["op"].as_str(), refused["presented"].as_u64()),
        (Some("FENCED"), Some("heartbeat"), Some(1)),
        "{s}"
    );
    assert!(refused["seq"].as_u64() > tenures[1]["began_seq"].as_u64(), "refused after the takeover: {s}");
}

/// Proves: a daemon cut off from etcd (its only endpoint is a member that is
/// killed; the cluster keeps quorum) answers 503; the other host's daemon takes
/// its home over once it has watched it stale on its own clock; when the member
/// returns, the cut-off daemon's heartbeat is refused `FENCED` and it cuts over
/// and exits 5 (`HOME_LOST`), its refused heartbeat kept in the log as evidence.
#[test]
fn a_daemon_whose_home_was_taken_while_it_was_cut_off_exits_5() {
    let mut cluster = Cluster::start(3);
    let log = Log::new(&cluster.endpoints, "cutoff");
    let only_m0 = Log { endpoints: format!("127.0.0.1:{}", cluster.members[0].client), prefix: log.prefix.clone() };
    let others = Log {
        endpoints: format!("127.0.0.1:{},127.0.0.1:{}", cluster.members[1].client, cluster.members[2].client),
        prefix: log.prefix.clone(),
    };
    let t = tempfile::tempdir().unwrap();
    let mut a = only_m0.serve(&t.path().join("a"), "host-a", &["--home-stale-after-ms", "1000"]);
    let b = others.serve(&t.path().join("b"), "host-b", &[]);
    cluster.kill(0);
    let (status, v) = a.post("/v1/claim", json!({"subject": "x"}));
    assert_eq!((status, v["code"].as_str()), (503, Some("ETCD_UNAVAILABLE")), "{v}");
    let (status, s) = b.get(&format!("/v1/state?subject={}", home_of("host-a")));
    assert_eq!(status, 200, "{s}");
    let home = &s["subjects"][0];
    let (status, r) = b.post(
        "/v1/takeover",
        json!({"subject": home_of("host-a"), "expect_generation": home["generation"],
               "expect_heartbeat_ms": home["heartbeat_ms"], "stale_after_ms": 1000, "reason": "host-a silent"}),
    );
    assert_eq!(status, 200, "taken over after its staleness, watched on host-b's clock: {r}");
    cluster.restart(0);
    assert_eq!(exit_of(&mut a), Some(5), "HOME_LOST");
    audit_tells_the_story(&log, &home_of("host-a"), "host-b", 1000);
    log.verify();
}

/// Proves: a daemon stopped (`SIGSTOP`) past its home's staleness has its home
/// taken over by the other host's daemon; continued (`SIGCONT`), every write it
/// attempts is refused `FENCED` — its home's heartbeat first, kept as evidence
/// in the log — and it exits 5 without releasing what is no longer its own; the
/// audit of its home tells the story: its tenure, the takeover with what was
/// watched, then its refused attempts.
#[test]
fn a_daemon_stopped_past_its_staleness_is_fenced_when_it_continues() {
    let log = Log::new(&etcd::shared().endpoints, "sigstop");
    let t = tempfile::tempdir().unwrap();
    let mut a = log.serve(&t.path().join("a"), "host-a", &["--home-stale-after-ms", "1000"]);
    let b = log.serve(&t.path().join("b"), "host-b", &[]);
    // SAFETY: signals to this test's own child.
    unsafe { libc::kill(a.child.id() as i32, libc::SIGSTOP) };
    let (_, s) = b.get(&format!("/v1/state?subject={}", home_of("host-a")));
    let home = s["subjects"][0].clone();
    let (status, r) = b.post(
        "/v1/takeover",
        json!({"subject": home_of("host-a"), "expect_generation": home["generation"],
               "expect_heartbeat_ms": home["heartbeat_ms"], "stale_after_ms": 60000, "reason": "host-a stopped"}),
    );
    assert_eq!(status, 200, "{r}");
    unsafe { libc::kill(a.child.id() as i32, libc::SIGCONT) };
    assert_eq!(exit_of(&mut a), Some(5), "HOME_LOST");
    let (_, st) = log.fl(&["state", "--subject", &home_of("host-a")]);
    assert_eq!(st["subjects"][0]["generation"], home["generation"].as_u64().unwrap() + 1, "{st}");
    assert_eq!(st["subjects"][0]["fenced_attempts"].as_u64().map(|n| n >= 1), Some(true), "{st}");
    audit_tells_the_story(&log, &home_of("host-a"), "host-b", 1000);
    log.verify();
}

/// Proves: a runner whose daemon was killed (`kill -9`) records its command's
/// exit in etcd itself, and the successor daemon on that host (which proves the
/// old one dead from its own `/proc` and takes its home) shows it: `exited`, the
/// command's exit code (status `failed`: it exited non-zero).
#[test]
fn a_runner_whose_daemon_was_killed_records_its_exit_and_the_successor_sees_it() {
    let log = Log::new(&etcd::shared().endpoints, "runner");
    let t = tempfile::tempdir().unwrap();
    let gate = t.path().join("gate");
    let a = log.serve(&t.path().join("a"), "host-a", &[]);
    let script = format!("while [ ! -e {} ]; do sleep 0.02; done; exit 7", gate.display());
    let (status, r) = a.post("/v1/run", json!({"command": ["sh", "-c", script], "wait_ms": 0}));
    assert_eq!(status, 200, "{r}");
    let id = r["id"].as_u64().unwrap();
    wait_until("the command to start", || a.get(&format!("/v1/processes/{id}")).1["pid"].is_u64());
    a.kill9();
    std::fs::write(&gate, b"").unwrap();
    let a_dir = t.path().join("a");
    let (code, w) =
        log.fl(&["process", "wait", "--dir", a_dir.to_str().unwrap(), "--timeout-ms", "60000", &id.to_string()]);
    assert_eq!((code, w["status"].as_str(), w["exit_code"].as_i64()), (0, Some("failed"), Some(7)), "{w}");
    let a2 = log.serve(&t.path().join("a"), "host-a", &[]);
    let (status, p) = a2.get(&format!("/v1/processes/{id}"));
    assert_eq!((status, p["status"].as_str(), p["exit_code"].as_i64()), (200, Some("failed"), Some(7)), "{p}");
    assert_eq!(p["host"], "host-a");
}

/// Proves: a log on one host imported into etcd is the same state there — a
/// daemon on etcd boots on it and answers the subjects, generations and owners
/// the directory's `state` gave (its own home beside them).
#[test]
fn import_then_a_daemon_boots_on_etcd_with_the_same_state() {
    let t = tempfile::tempdir().unwrap();
    let src = t.path().join("src");
    let d = Daemon::start(&src, &[]);
    for i in 0..20 {
        assert_eq!(d.post("/v1/claim", json!({"subject": format!("s/{i}")})).0, 200);
    }
    assert_eq!(d.post("/v1/rotate-fence", json!({"subject": "s/3", "generation": 1})).0, 200);
    assert_eq!(d.term(), Some(0));
    let out = Command::new(FENCELOG).args(["state", "--dir", src.to_str().unwrap()]).output().unwrap();
    let before: Value = serde_json::from_slice(&out.stdout).unwrap();
    let log = Log { endpoints: etcd::shared().endpoints.clone(), prefix: etcd::fresh_prefix("import") };
    let (code, r) = log.fl(&["import", "--dir", src.to_str().unwrap()]);
    assert_eq!(code, 0, "{r}");
    let e = log.serve(&t.path().join("state"), "host-a", &[]);
    assert_eq!(e.ready["replayed"].as_u64(), before["last_seq"].as_u64(), "{}", e.ready);
    let (_, after) = e.get("/v1/state");
    let pick = |v: &Value| -> BTreeMap<String, (Value, Value)> {
        v["subjects"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|s| s["subject"].as_str().unwrap().starts_with("s/"))
            .map(|s| (s["subject"].as_str().unwrap().to_owned(), (s["generation"].clone(), s["owner"].clone())))
            .collect()
    };
    assert_eq!(pick(&after), pick(&before));
    assert_eq!(pick(&after)["s/3"].0, 2);
}

/// Proves: on a log in etcd, `/v1/watch` on one host's daemon and `inspect follow
/// --etcd` both see the records another host's daemon appends — each once, in
/// order, the watch's event id the record's sequence — through etcd's watch, and
/// a watch resumed with `Last-Event-ID` continues exactly after it.
#[test]
fn watch_and_follow_on_etcd_see_what_another_host_appends() {
    use std::io::BufRead;
    let c = etcd::shared();
    let log = Log::new(&c.endpoints, "watch");
    let t = tempfile::tempdir().unwrap();
    let a = log.serve(&t.path().join("a"), "host-a", &[]);
    let b = log.serve(&t.path().join("b"), "host-b", &[]);
    let head = a.get("/v1/head").1["seq"].as_u64().unwrap();
    // The follower starts just after that head (a heartbeat may land before it
    // looks: --from, not "from now on").
    let mut args = vec!["inspect".to_owned(), "follow".into()];
    args.extend(log.args());
    let from = (head + 1).to_string();
    args.extend(["--json", "--from", &from, "--max-records", "6", "--timeout-ms", "120000", "-v"].map(String::from));
    let mut follower = Command::new(FENCELOG)
        .args(&args)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let _stderr = common::follower_started(&mut follower);
    // A watch on host a's daemon, from just after the head.
    let watch = |last: u64| {
        let r = common::daemon::agent()
            .get(&a.url("/v1/watch"))
            .header("Authorization", &format!("Bearer {}", a.token))
            .header("Last-Event-ID", &last.to_string())
            .call()
            .unwrap();
        assert_eq!(r.status().as_u16(), 200);
        std::io::BufReader::new(r.into_body().into_reader())
    };
    let mut stream = watch(head);
    let mut claimed = vec![];
    for i in 0..6 {
        let (s, v) = b.post("/v1/claim", json!({"subject": format!("watched/{i}")}));
        assert_eq!(s, 200, "{v}");
        claimed.push(v["seq"].as_u64().unwrap());
    }
    // Events from the stream until every claim's sequence was seen (the home's
    // heartbeats may come between): ids dense from head + 1, each once.
    let read_until = |stream: &mut std::io::BufReader<_>, last_wanted: u64| -> Vec<(u64, Value)> {
        let (mut out, mut id, mut line) = (vec![], None, String::new());
        while out.last().is_none_or(|(i, _)| *i < last_wanted) {
            line.clear();
            assert!(stream.read_line(&mut line).unwrap() > 0, "the watch ended early: {out:?}");
            let l = line.trim_end();
            if let Some(v) = l.strip_prefix("id:") {
                id = v.trim().parse::<u64>().ok();
            } else if let Some(data) = l.strip_prefix("data:") {
                out.push((id.expect("an id before its data"), serde_json::from_str(data.trim()).unwrap()));
            }
        }
        out
    };
    let events = read_until(&mut stream, claimed[5]);
    let ids: Vec<u64> = events.iter().map(|(i, _)| *i).collect();
    assert_eq!(ids, (head + 1..=claimed[5]).collect::<Vec<_>>(), "every record once, in order");
    for (id, v) in &events {
        assert_eq!(v["seq"].as_u64(), Some(*id));
    }
    for seq in &claimed {
        let (_, v) = events.iter().find(|(i, _)| i == seq).unwrap();
        assert_eq!(v["kinds"], json!(["claim"]), "{v}");
    }
    drop(stream);
    // Resumed after the third claim: exactly what follows it.
    let mut resumed = watch(claimed[2]);
    let rest = read_until(&mut resumed, claimed[5]);
    assert_eq!(rest.iter().map(|(i, _)| *i).collect::<Vec<_>>(), (claimed[2] + 1..=claimed[5]).collect::<Vec<_>>());
    // The follower: the first six records after the head, in order.
    let out = follower.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(0));
    let seqs: Vec<u64> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap()["seq"].as_u64().unwrap())
        .collect();
    assert_eq!(seqs, (head + 1..=head + 6).collect::<Vec<_>>());
    drop((a, b));
}

/// Proves: appends keep landing when a member dies between them and when it
/// comes back — each follower in turn is killed and restarted (the quorum holds
/// throughout), and every append lands at the next sequence, none answered
/// `ETCD_UNAVAILABLE` or lost; the chain verifies. (The first `Txn` after a kill
/// may go out on the dead member's connection and come back reset: its outcome is
/// told from the head, and it is sent again. Before that, one run in six here
/// failed on it.)
#[test]
fn appends_keep_landing_while_followers_die_and_return_between_them() {
    use fencelog::storage::{AppendOutcome, LogBackend};
    let mut cluster = Cluster::start(3);
    let (opts, backend) = etcd::new_backend(&cluster.endpoints, "followers-die");
    let mut head = backend.head().unwrap().seq;
    let mut appends = |n: usize, when: &str| {
        for i in 0..n {
            match backend.append_if_head(head, vec![format!("{when} {i}").into_bytes()]) {
                Ok(AppendOutcome::Appended(a)) => {
                    assert_eq!(a.first_seq, head + 1, "{when}");
                    head = a.last_seq;
                }
                other => panic!("append {i} {when}: {other:?}"),
            }
        }
    };
    appends(5, "at first");
    let mut leader = None;
    wait_until("a leader", || {
        leader = cluster.leader();
        leader.is_some()
    });
    let leader = leader.unwrap();
    for i in (0..3).filter(|&i| i != leader) {
        cluster.kill(i);
        appends(20, &format!("with member {i} killed"));
        cluster.restart(i);
        appends(20, &format!("with member {i} back"));
    }
    assert_eq!(backend.head().unwrap().seq, head);
    let log = Log { endpoints: cluster.endpoints.clone(), prefix: opts.prefix.clone() };
    assert_eq!(log.verify()["last_seq"].as_u64(), Some(head));
}
