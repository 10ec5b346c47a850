//! The ledger through its real interfaces: the `fencelog` CLI run as separate
//! processes, real owner processes (`sleep`) killed with SIGKILL, and the embedded
//! API for snapshots.

use std::io::Write;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use fencelog::ledger::{Ledger, LedgerOptions};
use fencelog::model::{Event, Txn, decode_txn};
use fencelog::storage::{LogOptions, read_records};
use serde_json::Value;

const FENCELOG: &str = env!("CARGO_BIN_EXE_fencelog");

fn cmd(dir: &Path, args: &[&str]) -> Command {
    let mut c = Command::new(FENCELOG);
    c.args(args).env("FENCELOG_DIR", dir);
    c
}

fn parse(out: std::process::Output) -> (i32, Value) {
    let s = String::from_utf8_lossy(&out.stdout);
    (out.status.code().unwrap_or(-1), serde_json::from_str(s.trim()).unwrap_or(Value::Null))
}

fn fl(dir: &Path, args: &[&str]) -> (i32, Value) {
    parse(cmd(dir, args).output().unwrap())
}

/// A fresh log, created on purpose (the CLI never creates one by accident).
fn new_log() -> tempfile::TempDir {
    let d = tempfile::tempdir().unwrap();
    let (code, v) = fl(d.path(), &["init"]);
    assert_eq!(code, 0, "{v}");
    d
}

struct Sleeper(Child);
impl Sleeper {
    fn new() -> Sleeper {
        Sleeper(Command::new("sleep").arg("600").stdout(Stdio::null()).stderr(Stdio::null()).spawn().unwrap())
    }
    fn pid(&self) -> String {
        self.0.id().to_string()
    }
    fn kill9(&mut self) {
        self.0.kill().unwrap();
        self.0.wait().unwrap();
    }
}
impl Drop for Sleeper {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn txns(dir: &Path) -> Vec<(u64, Txn)> {
    let mut v = vec![];
    read_records(dir, 1, LogOptions::default().body_max(), |r| {
        v.push((r.seq, decode_txn(r.payload).unwrap()));
        true
    })
    .unwrap();
    v
}

/// Proves: 16 processes racing to claim one free subject, 100 rounds: exactly one
/// winner each round; every loser is told ALREADY_ACTIVE naming the winner.
#[test]
fn sixteen_processes_race_to_claim_a_free_subject_and_exactly_one_wins() {
    let d = new_log();
    let owner = Sleeper::new();
    for round in 0..100 {
        let subject = format!("race/{round}");
        let children: Vec<Child> = (0..16)
            .map(|_| {
                cmd(d.path(), &["claim", "--subject", &subject, "--pid", &owner.pid()])
                    .stdout(Stdio::piped())
                    .stderr(Stdio::null())
                    .spawn()
                    .unwrap()
            })
            .collect();
        let results: Vec<(i32, Value)> = children.into_iter().map(|c| parse(c.wait_with_output().unwrap())).collect();
        let winners: Vec<&Value> = results.iter().filter(|r| r.0 == 0).map(|r| &r.1).collect();
        assert_eq!(winners.len(), 1, "round {round}: {results:?}");
        let winner = &winners[0]["owner"]["instance"];
        for (code, v) in results.iter().filter(|r| r.0 != 0) {
            assert_eq!((*code, v["error"]["code"].as_str()), (3, Some("ALREADY_ACTIVE")), "round {round}: {v}");
            assert_eq!(&v["error"]["instance"], winner);
        }
    }
    let claims = txns(d.path()).iter().filter(|(_, t)| matches!(t.events[0], Event::Claim { .. })).count();
    assert_eq!(claims, 100, "one claim record per round");
}

/// Proves: two concurrent takeovers of one stale owner: one wins, the other is
/// refused TAKEOVER_RACE (10 rounds).
#[test]
fn two_concurrent_takeovers_of_a_stale_owner_one_wins_one_races() {
    let d = new_log();
    let (a, b, c) = (Sleeper::new(), Sleeper::new(), Sleeper::new());
    for round in 0..10 {
        let s = format!("stale/{round}");
        let (code, v) = fl(d.path(), &["claim", "--subject", &s, "--pid", &a.pid(), "--stale-after-ms", "30"]);
        assert_eq!(code, 0, "{v}");
        std::thread::sleep(Duration::from_millis(60));
        let (_, st) = fl(d.path(), &["state", "--subject", &s]);
        let sub = &st["subjects"][0];
        assert_eq!(sub["status"], "stale");
        let (g, hb) = (sub["generation"].to_string(), sub["heartbeat_ms"].to_string());
        let spawn = |pid: String| {
            cmd(
                d.path(),
                &["takeover", "--subject", &s, "--expect-generation", &g, "--expect-heartbeat-ms", &hb, "--pid", &pid],
            )
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap()
        };
        let (x, y) = (spawn(b.pid()), spawn(c.pid()));
        let mut results = [parse(x.wait_with_output().unwrap()), parse(y.wait_with_output().unwrap())];
        results.sort_by_key(|r| r.0);
        assert_eq!(results[0].0, 0, "{results:?}");
        assert_eq!(results[0].1["retired"]["cut_off_seq"].as_u64().unwrap() + 1, results[0].1["seq"].as_u64().unwrap());
        assert_eq!((results[1].0, results[1].1["error"]["code"].as_str()), (3, Some("TAKEOVER_RACE")), "{results:?}");
    }
}

/// Proves: a writer that holds generation 1, pauses across a takeover and resumes is
/// FENCED (presented 1, current 2), and its attempt is kept as an audit record.
#[test]
fn a_paused_writer_resumes_after_a_takeover_and_is_fenced_with_an_audit_record() {
    let d = new_log();
    let (a, b) = (Sleeper::new(), Sleeper::new());
    let (code, _) = fl(d.path(), &["claim", "--subject", "home/x", "--pid", &a.pid(), "--stale-after-ms", "30"]);
    assert_eq!(code, 0);
    // The paused writer: holds its token (generation 1) and waits on stdin.
    let script = format!("read go; exec {FENCELOG} heartbeat --subject home/x --generation 1");
    let mut paused = Command::new("sh")
        .args(["-c", &script])
        .env("FENCELOG_DIR", d.path())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(60));
    let (_, st) = fl(d.path(), &["state", "--subject", "home/x"]);
    let hb = st["subjects"][0]["heartbeat_ms"].to_string();
    let (code, v) = fl(
        d.path(),
        &[
            "takeover",
            "--subject",
            "home/x",
            "--expect-generation",
            "1",
            "--expect-heartbeat-ms",
            &hb,
            "--pid",
            &b.pid(),
        ],
    );
    assert_eq!((code, v["generation"].as_u64()), (0, Some(2)), "{v}");
    paused.stdin.take().unwrap().write_all(b"go\n").unwrap();
    let (code, v) = parse(paused.wait_with_output().unwrap());
    assert_eq!(code, 3);
    let e = &v["error"];
    assert_eq!(
        (e["code"].as_str(), e["presented"].as_u64(), e["current"].as_u64()),
        (Some("FENCED"), Some(1), Some(2))
    );
    let (_, st) = fl(d.path(), &["state", "--subject", "home/x"]);
    assert_eq!(st["subjects"][0]["fenced_attempts"], 1);
    let audit: Vec<_> =
        txns(d.path()).into_iter().filter(|(_, t)| matches!(t.events[0], Event::Refused { .. })).collect();
    assert_eq!(audit.len(), 1);
    let Event::Refused { presented, current, count, ref op, ref code, ref caller, .. } = audit[0].1.events[0] else {
        unreachable!()
    };
    assert_eq!((presented, current, count, op.as_str(), code.as_str()), (Some(1), 2, 1, "heartbeat", "FENCED"));
    assert_eq!(caller.pid, std::process::id(), "the caller is the process that ran the CLI: {caller:?}");
}

/// Proves: an owner process killed with SIGKILL is claimed at once (no waiting for
/// staleness), with the death evidence recorded; a live owner is refused.
#[test]
fn a_killed_owner_is_claimed_without_waiting_and_a_live_one_is_refused() {
    let d = new_log();
    let (mut a, b) = (Sleeper::new(), Sleeper::new());
    let (code, _) = fl(d.path(), &["claim", "--subject", "home/d", "--pid", &a.pid(), "--stale-after-ms", "3600000"]);
    assert_eq!(code, 0);
    let (code, v) = fl(d.path(), &["claim", "--subject", "home/d", "--pid", &b.pid()]);
    assert_eq!((code, v["error"]["code"].as_str()), (3, Some("ALREADY_ACTIVE")));
    assert_eq!(fl(d.path(), &["state", "--subject", "home/d"]).1["subjects"][0]["status"], "active");
    a.kill9();
    assert_eq!(fl(d.path(), &["state", "--subject", "home/d"]).1["subjects"][0]["status"], "dead");
    let (code, v) = fl(d.path(), &["claim", "--subject", "home/d", "--pid", &b.pid()]);
    assert_eq!(code, 0, "{v}");
    assert_eq!(v["generation"], 2);
    assert_eq!(v["retired"]["how"], serde_json::json!({"kind": "dead_owner", "reason": "process_dead"}));
    assert_eq!(v["retired"]["pid"].as_u64(), Some(a.0.id() as u64));
}

/// Proves (issue 9): a retired owner's late data write always hears "no" — `note`
/// under a generation a dead-owner claim retired is refused, exit 3, `FENCED` with
/// `retired: {cut_off_seq, how}` — and the attempt is still kept for forensics: a
/// `refused_writes` record with the content's blake3, size and first 256 bytes (cut
/// at a character boundary), never as a note; the inspector and the audit show it.
/// A refused note on a subject that never existed creates no subject entry.
#[test]
fn a_retired_owners_late_note_is_refused_and_kept_as_evidence_not_data() {
    let d = new_log();
    let (mut a, b) = (Sleeper::new(), Sleeper::new());
    fl(d.path(), &["claim", "--subject", "run/r", "--pid", &a.pid()]);
    let (_, v) = fl(d.path(), &["note", "--subject", "run/r", "--generation", "1", "--text", "before"]);
    assert_eq!(v["authoritative"], true);
    a.kill9();
    let (_, v) = fl(d.path(), &["claim", "--subject", "run/r", "--pid", &b.pid()]);
    let cut_off = v["retired"]["cut_off_seq"].as_u64().unwrap();
    let zombie_text = format!("zombie {}", "é".repeat(200)); // 407 bytes; byte 256 is inside an 'é'
    let (code, v) = fl(d.path(), &["note", "--subject", "run/r", "--generation", "1", "--text", &zombie_text]);
    assert_eq!(code, 3, "{v}");
    let e = &v["error"];
    assert_eq!(
        (e["code"].as_str(), e["presented"].as_u64(), e["current"].as_u64()),
        (Some("FENCED"), Some(1), Some(2))
    );
    // `retired.how` has the shape a claim's answer gives it (issue 25): an
    // object with its kind and, for a dead owner, the reason.
    assert_eq!(
        (e["retired"]["cut_off_seq"].as_u64(), e["retired"]["how"]["kind"].as_str()),
        (Some(cut_off), Some("dead_owner"))
    );
    assert!(e["retired"]["how"]["reason"].is_string(), "{e}");

    let st = fl(d.path(), &["state", "--subject", "run/r"]).1;
    assert_eq!(
        (st["subjects"][0]["late_notes"].as_u64(), st["subjects"][0]["fenced_attempts"].as_u64()),
        (Some(0), Some(1))
    );
    let all = txns(d.path());
    assert_eq!(
        all.iter().filter(|(_, t)| matches!(t.events[0], Event::Note { .. })).count(),
        1,
        "only the note that was accepted"
    );
    let refused: Vec<_> = all
        .iter()
        .filter_map(|(s, t)| match &t.events[0] {
            Event::Refused { op, presented, current, retired_cut_off_seq, content: Some(c), code, .. } => {
                assert_eq!(code, "FENCED");
                Some((
                    *s,
                    op.clone(),
                    *presented,
                    *current,
                    *retired_cut_off_seq,
                    c.blake3,
                    c.bytes,
                    c.first_bytes.clone(),
                ))
            }
            _ => None,
        })
        .collect();
    assert_eq!(refused.len(), 1, "the refused attempt is kept: {refused:?}");
    let (seq, op, presented, current, retired, digest, bytes, head) = refused[0].clone();
    assert!(seq > cut_off);
    assert_eq!((op.as_str(), presented, current, retired), ("note", Some(1), 2, Some(cut_off)));
    assert_eq!((digest, bytes), (*blake3::hash(zombie_text.as_bytes()).as_bytes(), zombie_text.len() as u64));
    assert!(head.len() <= 256 && head.len() >= 255 && zombie_text.starts_with(&head), "{} bytes", head.len());

    let dir_s = d.path().to_str().unwrap();
    let dump = String::from_utf8(
        std::process::Command::new(env!("CARGO_BIN_EXE_fencelog"))
            .args(["inspect", "dump", dir_s])
            .output()
            .unwrap()
            .stdout,
    )
    .unwrap();
    assert!(dump.contains("refused \"run/r\": 1x note") && dump.contains(&fencelog::format::hex(&digest)), "{dump}");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_fencelog"))
        .args(["audit", dir_s, "--format", "json"])
        .output()
        .unwrap();
    let audit: Value = serde_json::from_slice(&out.stdout).unwrap();
    let story = audit["subjects"].as_array().unwrap().iter().find(|s| s["subject"] == "run/r").unwrap().clone();
    let c = &story["fenced_attempts"][0]["refused_content"];
    assert_eq!((c["bytes"].as_u64(), c["retired_cut_off_seq"].as_u64()), (Some(bytes), Some(cut_off)), "{story}");

    let (code, v) = fl(d.path(), &["note", "--subject", "never/was", "--generation", "1", "--text", "typo"]);
    assert_eq!((code, v["error"]["code"].as_str()), (3, Some("FENCED")), "{v}");
    let st = fl(d.path(), &["state"]).1;
    assert!(!st["subjects"].as_array().unwrap().iter().any(|s| s["subject"] == "never/was"), "{st}");
}

/// Proves: request-id idempotency across process restarts, conflicting reuse
/// refused, and `request show` answers committed-at-N or never-committed.
#[test]
fn request_ids_survive_restarts_and_conflicting_reuse_is_refused() {
    let d = new_log();
    let a = Sleeper::new();
    let args = ["claim", "--subject", "home/r", "--pid", &a.pid(), "--request-id", "req-42"];
    let (code, first) = fl(d.path(), &args);
    assert_eq!((code, &first["deduplicated"]), (0, &Value::Bool(false)));
    let (code, again) = fl(d.path(), &args);
    assert_eq!(code, 0);
    assert_eq!(
        (&again["seq"], &again["generation"], &again["deduplicated"]),
        (&first["seq"], &first["generation"], &Value::Bool(true))
    );
    let (code, v) = fl(d.path(), &["claim", "--subject", "home/other", "--pid", &a.pid(), "--request-id", "req-42"]);
    assert_eq!((code, v["error"]["code"].as_str()), (3, Some("REQUEST_ID_CONFLICT")));
    assert_eq!(v["error"]["committed_seq"], first["seq"]);
    let (_, v) = fl(d.path(), &["request", "show", "req-42"]);
    assert_eq!((v["status"].as_str(), &v["seq"]), (Some("committed"), &first["seq"]));
    let (_, v) = fl(d.path(), &["request", "show", "req-never"]);
    assert_eq!(v["status"], "never_committed");
}

/// Proves: CLI refusals exit 3 with codes and evidence (FENCED, BUSY,
/// INVALID_SUBJECT, LEASE_CONFLICT, LEASE_TOKEN_MISMATCH), a release with the right
/// token then succeeds, a second release is a no-op reporting the first, and usage
/// errors exit 2.
#[test]
fn cli_refusals_exit_3_with_evidence_and_usage_errors_exit_2() {
    let d = new_log();
    let a = Sleeper::new();
    fl(d.path(), &["claim", "--subject", "s", "--pid", &a.pid()]);
    let (code, v) = fl(d.path(), &["heartbeat", "--subject", "s", "--generation", "7"]);
    assert_eq!((code, v["error"]["code"].as_str(), v["error"]["presented"].as_u64()), (3, Some("FENCED"), Some(7)));
    let (code, v) =
        fl(d.path(), &["claim", "--subject", "lock/m", "--pid", &a.pid(), "--action", "recover", "--request-id", "q1"]);
    assert_eq!(code, 0, "{v}");
    let (code, v) =
        fl(d.path(), &["claim", "--subject", "lock/m", "--pid", &a.pid(), "--action", "stop", "--request-id", "q2"]);
    assert_eq!((code, v["error"]["code"].as_str(), v["error"]["action"].as_str()), (3, Some("BUSY"), Some("recover")));
    let (code, v) = fl(d.path(), &["claim", "--subject", "bad\u{1}name", "--pid", &a.pid()]);
    // Invalid input is a usage error (exit 2), as the CLI contract names it.
    assert_eq!((code, v["error"]["code"].as_str()), (2, Some("INVALID_SUBJECT")));
    let (code, w) = fl(d.path(), &["lease", "acquire", "--resource", "db", "--mode", "write", "--holder", "h1"]);
    assert_eq!(code, 0);
    let (lease, token) = (w["lease"].to_string(), w["token"].as_u64().unwrap());
    let (code, v) = fl(d.path(), &["lease", "acquire", "--resource", "db", "--mode", "read", "--holder", "h2"]);
    assert_eq!(
        (code, v["error"]["code"].as_str(), v["error"]["blockers"][0]["holder"].as_str()),
        (3, Some("LEASE_CONFLICT"), Some("h1"))
    );
    let (code, v) = fl(d.path(), &["lease", "release", "--lease", &lease, "--token", &(token + 1).to_string()]);
    assert_eq!(
        (code, v["error"]["code"].as_str(), v["error"]["attempts"].as_u64()),
        (3, Some("LEASE_TOKEN_MISMATCH"), Some(1))
    );
    let (code, v) = fl(d.path(), &["lease", "release", "--lease", &lease, "--token", &token.to_string()]);
    assert_eq!((code, v["kind"].as_str()), (0, Some("lease_released")));
    let (code, v) = fl(d.path(), &["lease", "release", "--lease", &lease, "--token", &token.to_string()]);
    assert_eq!((code, v["kind"].as_str(), v["seq"].is_null()), (0, Some("lease_already_ended"), true));
    assert_eq!(fl(d.path(), &["claim", "--subject", "x", "--action", "a"]).0, 2, "--action requires --request-id");
    assert_eq!(fl(d.path(), &["claim", "--subject", "x", "--pid", "4000000000"]).0, 2);
}

fn claim_txn(
    subject: String,
) -> impl Fn(&fencelog::model::Projection, u64, uuid::Uuid) -> Result<Txn, fencelog::model::Refusal> {
    let me = fencelog::ledger::identity::probe(std::process::id(), uuid::Uuid::new_v4()).unwrap();
    move |_p, now_ms, writer| {
        Ok(Txn::new(
            now_ms,
            writer,
            vec![Event::Claim {
                subject: subject.clone(),
                owner: me.clone(),
                stale_after_ms: 1,
                lock: None,
                previous: None,
            }],
        ))
    }
}

/// Proves: boot from snapshot + tail gives the same projection as a full replay; a
/// damaged snapshot is never trusted (warning, fallback); request-id dedup works
/// after a restart from a snapshot.
#[test]
fn snapshot_plus_tail_equals_full_replay_and_a_damaged_snapshot_is_not_trusted() {
    let d = tempfile::tempdir().unwrap();
    let opts = LedgerOptions { snapshot_every_records: 20, ..LedgerOptions::default() };
    let l = Ledger::open(d.path(), opts.clone()).unwrap();
    for i in 0..50 {
        let req = (i == 3).then(|| fencelog::model::RequestTag { id: "req-3".to_string(), digest: [3u8; 32] });
        l.submit(req, claim_txn(format!("s/{i}"))).unwrap();
    }
    l.close().unwrap();
    let l = Ledger::open(d.path(), opts.clone()).unwrap();
    // Close wrote a snapshot of everything and then the checkpoint record that
    // vouches for it (background snapshots add checkpoints of their own, as many as
    // finished in time): the snapshot covers all but that last record.
    let last = l.open_report().storage.last_seq;
    assert!(last > 50, "checkpoint records follow the 50 claims");
    assert_eq!(l.open_report().snapshot_seq, Some(last - 1));
    assert_eq!(l.open_report().replayed_records, 1);
    for i in 50..57 {
        l.submit(None, claim_txn(format!("s/{i}"))).unwrap();
    }
    let dedup = l
        .submit(Some(fencelog::model::RequestTag { id: "req-3".into(), digest: [3u8; 32] }), claim_txn("s/3".into()))
        .unwrap();
    assert!(dedup.deduplicated && dedup.seq == Some(4));
    drop(l);
    let from_snapshot = Ledger::open(d.path(), opts.clone()).unwrap();
    let r = from_snapshot.open_report().clone();
    assert_eq!((r.snapshot_seq, r.replayed_records), (Some(last - 1), 8), "{r:?}");
    let snap_dir = d.path().join("snapshots");
    let saved = tempfile::tempdir().unwrap();
    for e in std::fs::read_dir(&snap_dir).unwrap() {
        let e = e.unwrap();
        std::fs::rename(e.path(), saved.path().join(e.file_name())).unwrap();
    }
    let full = Ledger::open(d.path(), opts.clone()).unwrap();
    assert_eq!(full.open_report().snapshot_seq, None);
    assert_eq!(from_snapshot.projection(), full.projection());
    drop((from_snapshot, full));
    // Put the snapshots back, damaged: never trusted, the log is replayed instead.
    for e in std::fs::read_dir(saved.path()).unwrap() {
        let e = e.unwrap();
        let mut b = std::fs::read(e.path()).unwrap();
        let n = b.len();
        b[n - 3] ^= 0x55;
        std::fs::write(snap_dir.join(e.file_name()), b).unwrap();
    }
    let l = Ledger::open(d.path(), opts).unwrap();
    let r = l.open_report();
    assert_eq!(r.snapshot_seq, None);
    assert!(!r.snapshot_warnings.is_empty() && r.snapshot_warnings[0].contains("checksum"), "{r:?}");
    assert_eq!(l.projection().last_seq(), last + 7, "every record: claims, checkpoints and the 7 after reopening");
    drop(l);
    // A checksum-valid snapshot of another history (another log's chain head) is
    // ignored too, with the reason named.
    let other = tempfile::tempdir().unwrap();
    let o = Ledger::open(other.path(), LedgerOptions::default()).unwrap();
    // Fewer records than this log holds: a snapshot beyond this log's end would be
    // refused outright (records cut), not ignored.
    for i in 0..30 {
        o.submit(None, claim_txn(format!("other/{i}"))).unwrap();
    }
    o.close().unwrap();
    for e in std::fs::read_dir(&snap_dir).unwrap() {
        std::fs::remove_file(e.unwrap().path()).unwrap();
    }
    for e in std::fs::read_dir(other.path().join("snapshots")).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), snap_dir.join(e.file_name())).unwrap();
    }
    let l = Ledger::open(d.path(), LedgerOptions::default()).unwrap();
    let r = l.open_report();
    assert_eq!(r.snapshot_seq, None);
    assert!(r.snapshot_warnings.iter().any(|w| w.contains("does not hold the snapshot's sequence")), "{r:?}");
    assert_eq!(l.projection().last_seq(), last + 7);
}

/// Proves: a snapshot temp file left by a crashed writer is removed once it is older
/// than the 10-minute limit, and one a live writer may still be filling is kept.
#[test]
fn abandoned_snapshot_temp_files_are_removed_and_fresh_ones_kept() {
    let d = tempfile::tempdir().unwrap();
    let l = Ledger::open(d.path(), LedgerOptions::default()).unwrap();
    l.submit(None, claim_txn("t/1".into())).unwrap();
    let snaps = d.path().join("snapshots");
    let (old, fresh) =
        (snaps.join(".00000000000000000001.snap.99999-0.tmp"), snaps.join(".00000000000000000001.snap.99999-1.tmp"));
    for p in [&old, &fresh] {
        std::fs::write(p, b"half a snapshot").unwrap();
    }
    let eleven_minutes_ago = std::time::SystemTime::now() - Duration::from_secs(11 * 60);
    std::fs::File::options().write(true).open(&old).unwrap().set_modified(eleven_minutes_ago).unwrap();
    l.snapshot_now().unwrap();
    assert!(!old.exists(), "an abandoned temp file is removed");
    assert!(fresh.exists(), "a recent temp file may belong to a live writer");
}

/// Proves: a background snapshot is also triggered by bytes applied, not only by a
/// record count (and neither fires below its threshold); each counts a record once.
#[test]
fn snapshots_are_triggered_by_bytes_as_well_as_by_records() {
    let run = |every_bytes: u64| {
        let d = tempfile::tempdir().unwrap();
        let opts =
            LedgerOptions { snapshot_every_records: u64::MAX, snapshot_every_bytes: every_bytes, ..Default::default() };
        let l = Ledger::open(d.path(), opts).unwrap();
        for i in 0..40 {
            l.submit(None, claim_txn(format!("bytes/{i}/{}", "x".repeat(200)))).unwrap();
        }
        // A snapshot is written off the append path and vouched for by a checkpoint
        // in a later group: on a busy disk it may still be in flight after the 40th
        // claim. Go on claiming (bounded) until a checkpoint is in the log.
        let checkpointed =
            |d: &Path| txns(d).iter().any(|(_, t)| t.events.iter().any(|e| matches!(e, Event::Checkpoint { .. })));
        let mut extra = 0;
        while every_bytes != u64::MAX && !checkpointed(d.path()) && extra < 250 {
            std::thread::sleep(Duration::from_millis(20));
            l.submit(None, claim_txn(format!("bytes/extra/{extra}"))).unwrap();
            extra += 1;
        }
        drop(l); // no close: only background snapshots exist
        let snaps = std::fs::read_dir(d.path().join("snapshots")).unwrap().count();
        let reopened = Ledger::open(d.path(), LedgerOptions::default()).unwrap();
        (snaps, reopened.open_report().snapshot_seq, reopened.projection().last_seq())
    };
    // The 40 claims and the checkpoint records of the snapshots taken meanwhile: a
    // snapshot taken in the background covers fewer records than the log holds.
    let (snaps, seq, last) = run(4096);
    assert!(snaps >= 1 && seq.is_some_and(|s| s < last), "{snaps} snapshots, newest at {seq:?}, log at {last}");
    assert_eq!(run(u64::MAX), (0, None, 40), "no trigger, no snapshot");
}

/// Proves: writers sharing a directory (six independent ledgers, each with its own
/// files and lock, like six processes) may snapshot the same sequence at the same
/// moment: every snapshot write succeeds, no temp file is left behind, and the next
/// open boots from a snapshot without a warning.
#[test]
fn concurrent_snapshots_of_one_sequence_by_several_writers_all_succeed() {
    let d = tempfile::tempdir().unwrap();
    let l = Ledger::open(d.path(), LedgerOptions::default()).unwrap();
    for i in 0..30 {
        l.submit(None, claim_txn(format!("s/{i}"))).unwrap();
    }
    drop(l);
    let barrier = std::sync::Barrier::new(6);
    std::thread::scope(|s| {
        for _ in 0..6 {
            s.spawn(|| {
                let l = Ledger::open(d.path(), LedgerOptions::default()).unwrap();
                barrier.wait();
                for _ in 0..20 {
                    l.snapshot_now().unwrap();
                }
            });
        }
    });
    let names: Vec<String> = std::fs::read_dir(d.path().join("snapshots"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(names, vec![format!("{:020}.snap", 30)], "one snapshot, no temp files left");
    let l = Ledger::open(d.path(), LedgerOptions::default()).unwrap();
    let r = l.open_report();
    // Each writer appended one checkpoint (vouching for the same snapshot at 30).
    assert_eq!((r.snapshot_seq, r.replayed_records), (Some(30), 6), "{r:?}");
    assert!(r.snapshot_warnings.is_empty(), "{r:?}");
}

/// Proves: `request show` stays truthful for request ids the projection no longer
/// remembers (more than REQUESTS_RETAINED later): the ledger finds them in the log.
#[test]
fn request_status_finds_ids_older_than_the_projection_remembers() {
    let d = tempfile::tempdir().unwrap();
    let log = fencelog::storage::Log::open(d.path(), LogOptions::default()).unwrap();
    let n = fencelog::model::REQUESTS_RETAINED as u64 + 10;
    let writer = log.writer_id();
    let mut batch = vec![];
    for i in 0..n {
        let txn = Txn {
            request: Some(fencelog::model::RequestTag { id: format!("old-{i}"), digest: [1; 32] }),
            time_ms: i,
            writer,
            conditions: vec![],
            events: vec![Event::LeaseAcquire {
                resource: "r".into(),
                mode: fencelog::model::LeaseMode::Read,
                holder: "h".into(),
                ttl_ms: 1,
            }],
        };
        batch.push(fencelog::model::encode_txn(&txn));
        if batch.len() == 4096 {
            log.append_batch(std::mem::take(&mut batch)).unwrap();
        }
    }
    log.append_batch(batch).unwrap();
    log.close().unwrap();
    let l = Ledger::open(d.path(), LedgerOptions::default()).unwrap();
    assert!(!l.projection().requests().contains_key("old-0"), "forgotten by the projection");
    match l.request_status("old-0").unwrap() {
        fencelog::ledger::RequestStatus::Committed { seq, .. } => assert_eq!(seq, 1),
        other => panic!("{other:?}"),
    }
    assert!(matches!(l.request_status("never").unwrap(), fencelog::ledger::RequestStatus::NeverCommitted { .. }));
}

/// Proves: `snapshot_if_tail_exceeds` writes a snapshot only where this
/// ledger's own open replayed at least the bound and enough records for the
/// state's entries (a quarter of them: the next test), and only if no writer has written a newer snapshot
/// since it opened; the next open starts from it.
#[test]
fn a_snapshot_after_a_long_replay_is_written_once_and_only_if_none_is_newer() {
    let d = tempfile::tempdir().unwrap();
    let opts = LedgerOptions::default();
    let l = Ledger::open(d.path(), opts.clone()).unwrap();
    for i in 0..30 {
        l.submit(None, claim_txn(format!("s/{i}"))).unwrap();
    }
    drop(l);
    let a = Ledger::open(d.path(), opts.clone()).unwrap();
    assert_eq!(a.open_report().replayed_records, 30);
    assert_eq!(a.snapshot_if_tail_exceeds(31).unwrap(), None, "a tail shorter than the bound");
    // Another writer snapshots first: `a` writes none.
    let b = Ledger::open(d.path(), opts.clone()).unwrap();
    b.snapshot_now().unwrap();
    assert_eq!(a.snapshot_if_tail_exceeds(30).unwrap(), None, "a newer snapshot exists");
    drop((a, b));
    let c = Ledger::open(d.path(), opts.clone()).unwrap();
    assert_eq!((c.open_report().snapshot_seq, c.open_report().replayed_records), (Some(30), 1));
    // One record replayed (the checkpoint), 30 entries: not worth a snapshot.
    assert_eq!(c.snapshot_if_tail_exceeds(1).unwrap(), None, "a tail of under a quarter of the state");
    for _ in 0..40 {
        let beat = Event::Heartbeat { subject: "s/0".into(), generation: 1 };
        c.submit(None, |_, now_ms, writer| Ok(Txn::new(now_ms, writer, vec![beat.clone()]))).unwrap();
    }
    drop(c);
    let e = Ledger::open(d.path(), opts.clone()).unwrap();
    assert_eq!(e.open_report().replayed_records, 41);
    assert_eq!(e.snapshot_if_tail_exceeds(42).unwrap(), None, "one record short of the bound");
    assert!(e.snapshot_if_tail_exceeds(41).unwrap().is_some(), "41 records replayed, 30 entries");
    drop(e);
    let f = Ledger::open(d.path(), opts).unwrap();
    assert_eq!((f.open_report().snapshot_seq, f.open_report().replayed_records), (Some(71), 1));
}

/// Proves: a short-lived writer's snapshot is worth writing from a tail of a
/// quarter of the state's entries (`STATE_ENTRIES_PER_TAIL_RECORD_MAX`), not
/// only from a tail as long as the state: 40 subjects, then a tail of 9 records
/// (36 < 40) leaves none, and a tail of 10 (40) leaves one.
#[test]
fn a_tail_of_a_quarter_of_the_states_entries_is_worth_a_snapshot() {
    let per_record = fencelog::ledger::snapshot::STATE_ENTRIES_PER_TAIL_RECORD_MAX;
    assert_eq!(per_record, 4, "the figures below are for four entries per record");
    let d = tempfile::tempdir().unwrap();
    let opts = LedgerOptions::default();
    let beat = |l: &Ledger| {
        let e = Event::Heartbeat { subject: "s/0".into(), generation: 1 };
        l.submit(None, |_, now_ms, writer| Ok(Txn::new(now_ms, writer, vec![e.clone()]))).unwrap();
    };
    let l = Ledger::open(d.path(), opts.clone()).unwrap();
    for i in 0..40 {
        l.submit(None, claim_txn(format!("s/{i}"))).unwrap();
    }
    l.snapshot_now().unwrap(); // covers seq 40; its checkpoint is 41
    for _ in 0..8 {
        beat(&l);
    }
    drop(l);
    let a = Ledger::open(d.path(), opts.clone()).unwrap();
    assert_eq!((a.open_report().snapshot_seq, a.open_report().replayed_records), (Some(40), 9));
    assert_eq!(a.snapshot_if_tail_exceeds(1).unwrap(), None, "9 records, 40 entries: 36 < 40");
    beat(&a);
    drop(a);
    let b = Ledger::open(d.path(), opts.clone()).unwrap();
    assert_eq!(b.open_report().replayed_records, 10);
    assert!(b.snapshot_if_tail_exceeds(1).unwrap().is_some(), "10 records, 40 entries");
    drop(b);
    let c = Ledger::open(d.path(), opts).unwrap();
    assert_eq!((c.open_report().snapshot_seq, c.open_report().replayed_records), (Some(50), 1));
}

/// Proves: a ledger opened from a state handed over (`hand_over`, as a forked
/// runner takes its caller's) reads only the records after that state — another
/// writer's included — and answers as a full replay does, appending after them;
/// the ledger that handed its state over answers nothing more
/// (`WRITER_POISONED`); a state handed over from another log is refused
/// (`SNAPSHOT_NOT_IN_LOG`) and nothing is appended.
#[test]
fn a_ledger_opened_from_a_handed_over_state_reads_only_what_followed_it() {
    let d = tempfile::tempdir().unwrap();
    let opts = LedgerOptions::default();
    let here = fencelog::storage::Location::Dir(d.path().to_path_buf());
    let a = Ledger::open(d.path(), opts.clone()).unwrap();
    for i in 0..20 {
        a.submit(None, claim_txn(format!("s/{i}"))).unwrap();
    }
    a.snapshot_now().unwrap();
    for i in 20..30 {
        a.submit(None, claim_txn(format!("s/{i}"))).unwrap();
    }
    let handed = a.hand_over().expect("a ledger that is not poisoned hands its state over");
    // Another writer appends after the state was handed over.
    let b = Ledger::open(d.path(), opts.clone()).unwrap();
    let beat = Event::Heartbeat { subject: "s/3".into(), generation: 1 };
    b.submit(None, |_, now_ms, writer| Ok(Txn::new(now_ms, writer, vec![beat.clone()]))).unwrap();
    b.submit(None, claim_txn("s/30".into())).unwrap();
    drop(b);
    let c = Ledger::open_handed_over(&here, opts.clone(), handed).unwrap();
    let r = c.open_report();
    // 31 records handed over (30 claims and the checkpoint); 2 more read.
    assert_eq!((r.handed_over_at, r.records_read), (Some(31), 2), "{r:?}");
    assert_eq!((r.snapshot_seq, r.replayed_records), (Some(20), 13), "what an open would replay: {r:?}");
    let full = Ledger::read_only(d.path(), &opts).unwrap().projection;
    assert_eq!(c.projection(), full);
    assert_eq!(c.chain_head().unwrap(), Ledger::open(d.path(), opts.clone()).unwrap().chain_head().unwrap());
    // It appends after the other writer's records, with a writer id of its own.
    assert_ne!(c.writer_id(), a.writer_id());
    assert_eq!(c.submit(None, claim_txn("s/31".into())).unwrap().seq, Some(34));
    // The ledger that handed its state over answers nothing more.
    assert_eq!(a.refresh().err().map(|e| e.code()), Some("WRITER_POISONED"));
    assert_eq!(a.submit(None, claim_txn("s/32".into())).err().map(|e| e.code()), Some("WRITER_POISONED"));
    assert!(a.hand_over().is_none(), "its state is handed over once");

    // A state handed over from another log, whose record at that sequence
    // differs: refused, and that log is left as it was.
    let other = tempfile::tempdir().unwrap();
    let o = Ledger::open(other.path(), opts.clone()).unwrap();
    for i in 0..34 {
        o.submit(None, claim_txn(format!("o/{i}"))).unwrap();
    }
    let head = o.chain_head().unwrap();
    drop(o);
    let foreign = c.hand_over().unwrap();
    let e =
        Ledger::open_handed_over(&fencelog::storage::Location::Dir(other.path().to_path_buf()), opts.clone(), foreign)
            .err()
            .expect("a state the log does not hold is refused");
    assert_eq!(e.code(), "SNAPSHOT_NOT_IN_LOG", "{e}");
    let o = Ledger::open(other.path(), opts.clone()).unwrap();
    assert_eq!((o.open_report().storage.last_seq, o.chain_head().unwrap()), (34, head));
    // A log shorter than the state handed over: refused.
    let foreign = o.hand_over().unwrap();
    let short = tempfile::tempdir().unwrap();
    let s = Ledger::open(short.path(), opts.clone()).unwrap();
    for i in 0..20 {
        s.submit(None, claim_txn(format!("x/{i}"))).unwrap();
    }
    drop(s);
    let e =
        Ledger::open_handed_over(&fencelog::storage::Location::Dir(short.path().to_path_buf()), opts.clone(), foreign)
            .err()
            .expect("a log shorter than the state is refused");
    assert_eq!(e.code(), "SNAPSHOT_NOT_IN_LOG", "{e}");

    // A ledger whose snapshot is being written (its checkpoint not yet
    // appended) hands nothing over: the caller replays the log instead.
    let mut every_5 = opts;
    every_5.snapshot_every_records = 5;
    let w = tempfile::tempdir().unwrap();
    let l = Ledger::open(w.path(), every_5).unwrap();
    for i in 0..5 {
        l.submit(None, claim_txn(format!("w/{i}"))).unwrap();
    }
    assert!(l.hand_over().is_none(), "a snapshot without its checkpoint is not handed over");
    assert!(l.refresh().is_ok(), "and the ledger is not poisoned");
}

/// Proves: a command on a log whose tail after the newest snapshot is long
/// leaves a snapshot the log vouches for — its checkpoint appended before the
/// command ends — and the next open starts from it; a command after a short
/// tail writes none. (A command used to write one in the background at 10,000
/// records and end before its checkpoint: every later open ignored it, and two
/// in a row pruned the last vouched one.)
#[test]
fn a_command_after_a_long_tail_leaves_a_snapshot_the_log_vouches_for() {
    let d = new_log();
    // 10,101 records straight to storage: a claim, then heartbeats.
    {
        let log = fencelog::storage::Log::open(d.path(), LogOptions::default()).unwrap();
        let writer = log.writer_id();
        let me = fencelog::ledger::identity::probe(std::process::id(), writer).unwrap();
        let claim =
            Event::Claim { subject: "s".into(), owner: me, stale_after_ms: 3_600_000_000, lock: None, previous: None };
        let mut txns = vec![fencelog::model::encode_txn(&Txn::new(1, writer, vec![claim]))];
        for i in 0..10_100 {
            let beat = Event::Heartbeat { subject: "s".into(), generation: 1 };
            txns.push(fencelog::model::encode_txn(&Txn::new(2 + i, writer, vec![beat])));
        }
        let mut txns = txns.into_iter().peekable();
        while txns.peek().is_some() {
            log.append_batch(txns.by_ref().take(4096).collect()).unwrap();
        }
    }
    let pid = std::process::id().to_string();
    let (code, v) = fl(d.path(), &["claim", "--subject", "t", "--pid", &pid]);
    assert_eq!((code, v["seq"].as_u64()), (0, Some(10_102)), "{v}");
    let r = Ledger::open(d.path(), LedgerOptions::default()).unwrap().open_report().clone();
    assert!(r.snapshot_warnings.is_empty(), "{r:?}");
    // The snapshot at the claim; its checkpoint after it.
    assert_eq!((r.snapshot_seq, r.replayed_records), (Some(10_102), 1), "{r:?}");
    // A command after a short tail writes none.
    let (code, v) = fl(d.path(), &["claim", "--subject", "u", "--pid", &pid]);
    assert_eq!(code, 0, "{v}");
    let r = Ledger::open(d.path(), LedgerOptions::default()).unwrap().open_report().clone();
    assert_eq!((r.snapshot_seq, r.replayed_records), (Some(10_102), 2), "{r:?}");
}
