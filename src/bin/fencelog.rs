//! The `fencelog` command: argument parsing and wiring only.
//!
//! Every command prints one JSON object on stdout. Exit codes: 0 success, 3 the state
//! machine refused (`{"error": {"code": ..., evidence}}`), 2 usage error, 1 I/O error
//! or a damaged log.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use clap::{Args, Parser, Subcommand, ValueEnum};
use fencelog::ledger::{Ledger, LedgerError, LedgerOptions, identity, intent_digest};
use fencelog::model::{Event, LeaseMode, LockIntent, Outcome, Projection, Refusal, Txn, validate_subject};
use fencelog::storage::{LogOptions, verify_dir};
use serde_json::{Value, json};

#[derive(Parser)]
#[command(name = "fencelog", version, about = "A durable, hash-chained ownership ledger")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Args, Clone)]
struct Dir {
    /// Log directory.
    #[arg(long, env = "FENCELOG_DIR")]
    dir: PathBuf,
}

#[derive(Args, Clone)]
struct Req {
    /// Makes the mutation idempotent: the same id and content returns the original result.
    #[arg(long)]
    request_id: Option<String>,
}

#[derive(Subcommand)]
enum Cmd {
    /// Create a log in DIR (missing or empty; never among other files). The only way,
    /// with the daemon's first start, that a log comes to exist: every other command
    /// on a directory that is not a log exits 2 with NOT_A_LOG.
    Init {
        #[command(flatten)]
        dir: Dir,
    },
    /// Cut a damaged log from record SEQ on, on purpose: the cut bytes (and any later
    /// segments, whole) are kept as evidence files. Only from the first damaged record
    /// or earlier; an intact log is not touched.
    Repair {
        #[command(flatten)]
        dir: Dir,
        #[arg(long)]
        cut_from: u64,
    },
    /// Claim a subject for a process (default: the caller's parent).
    Claim {
        #[command(flatten)]
        dir: Dir,
        #[arg(long)]
        subject: String,
        #[arg(long)]
        pid: Option<u32>,
        #[arg(long)]
        instance: Option<uuid::Uuid>,
        #[arg(long, default_value_t = 20_000)]
        stale_after_ms: u64,
        /// Claim as a mutation lock doing ACTION (requires --request-id).
        #[arg(long, requires = "request_id")]
        action: Option<String>,
        #[command(flatten)]
        req: Req,
    },
    /// Record a heartbeat of the owner at GENERATION.
    Heartbeat {
        #[command(flatten)]
        dir: Dir,
        #[arg(long)]
        subject: String,
        #[arg(long)]
        generation: u64,
        #[command(flatten)]
        req: Req,
    },
    /// Release the subject held at GENERATION.
    Release {
        #[command(flatten)]
        dir: Dir,
        #[arg(long)]
        subject: String,
        #[arg(long)]
        generation: u64,
        #[command(flatten)]
        req: Req,
    },
    /// Take over a stale owner, naming the generation and heartbeat you saw.
    Takeover {
        #[command(flatten)]
        dir: Dir,
        #[arg(long)]
        subject: String,
        #[arg(long)]
        expect_generation: u64,
        #[arg(long)]
        expect_heartbeat_ms: u64,
        #[arg(long)]
        pid: Option<u32>,
        #[arg(long)]
        instance: Option<uuid::Uuid>,
        #[arg(long, default_value_t = 20_000)]
        stale_after_ms: u64,
        #[arg(long, default_value = "")]
        reason: String,
        #[command(flatten)]
        req: Req,
    },
    /// Bump the generation without changing owner (fences old tokens).
    RotateFence {
        #[command(flatten)]
        dir: Dir,
        #[arg(long)]
        subject: String,
        #[arg(long)]
        generation: u64,
        #[command(flatten)]
        req: Req,
    },
    /// Append a note under GENERATION (kept always; authoritative only while current).
    Note {
        #[command(flatten)]
        dir: Dir,
        #[arg(long)]
        subject: String,
        #[arg(long)]
        generation: u64,
        #[arg(long)]
        text: String,
        #[command(flatten)]
        req: Req,
    },
    /// Resource leases.
    Lease {
        #[command(subcommand)]
        cmd: LeaseCmd,
    },
    /// What became of a request id.
    Request {
        #[command(subcommand)]
        cmd: RequestCmd,
    },
    /// Current state of subjects, with status judged now.
    State {
        #[command(flatten)]
        dir: Dir,
        #[arg(long)]
        subject: Option<String>,
    },
    /// Commit transactions from concurrent appenders through the ledger (each claims
    /// `demo/<pid>/appender-N`, then writes notes), then verify the log. Creates DIR if it
    /// is missing or empty.
    Demo {
        #[command(flatten)]
        dir: Dir,
        #[arg(long, default_value_t = 10_000)]
        records: u64,
        #[arg(long, default_value_t = 8)]
        appenders: u64,
        #[arg(long, default_value_t = 200)]
        payload_bytes: usize,
    },
    /// The offline inspector: reads a live log or a copy, never writes.
    Inspect {
        #[command(subcommand)]
        cmd: InspectCmd,
    },
    /// The forensic story of every change of owner, from the log alone (read-only).
    Audit {
        dir: PathBuf,
        #[arg(long)]
        subject: Option<String>,
        #[arg(long, value_enum, default_value = "text")]
        format: Format,
        /// Write the report to FILE instead of stdout.
        #[arg(long)]
        out: Option<PathBuf>,
    },
}

#[derive(Clone, Copy, ValueEnum)]
enum Format {
    Text,
    Json,
    Html,
}

#[derive(Subcommand)]
enum InspectCmd {
    /// Check every checksum, the hash chain, sequence continuity and segment headers.
    /// Exit 0 intact, 1 damaged (torn tail or corruption, told apart), 2 not a log.
    Verify {
        dir: PathBuf,
        #[arg(long)]
        json: bool,
        /// SEQ:HEX, a chain head kept elsewhere (repeatable): exit 1 with
        /// head_mismatch or log_shorter_than_pinned if the log does not hold it.
        #[arg(long, value_parser = fencelog::inspect::parse_pin)]
        expect_head: Vec<fencelog::inspect::Pin>,
    },
    /// The chain head at SEQ (default: the last record), to keep elsewhere and check
    /// later with `verify --expect-head SEQ:HEX`.
    Head {
        dir: PathBuf,
        #[arg(long)]
        at: Option<u64>,
        #[arg(long)]
        json: bool,
    },
    /// One line per record (`--json`: NDJSON). `--raw` reads past damage.
    Dump {
        dir: PathBuf,
        #[arg(long)]
        json: bool,
        #[arg(long)]
        from: Option<u64>,
        #[arg(long)]
        to: Option<u64>,
        #[arg(long)]
        subject: Option<String>,
        #[arg(long)]
        kind: Option<String>,
        /// Unix ms, YYYY-MM-DD or YYYY-MM-DDTHH:MM:SS[.fff]Z (UTC).
        #[arg(long, value_parser = fencelog::inspect::parse_time)]
        since: Option<u64>,
        #[arg(long, value_parser = fencelog::inspect::parse_time)]
        until: Option<u64>,
        #[arg(long)]
        raw: bool,
    },
    /// The state as of sequence SEQ (default: the end).
    State {
        dir: PathBuf,
        #[arg(long)]
        at: Option<u64>,
        #[arg(long)]
        json: bool,
    },
    /// Counts and bytes by record kind, subject (top N), segment and writer (JSON).
    Stat {
        dir: PathBuf,
        #[arg(long, default_value_t = 10)]
        top: usize,
    },
    /// Print records as other processes append them, until interrupted.
    Follow {
        dir: PathBuf,
        #[arg(long)]
        json: bool,
        /// Start at this sequence (default: records appended from now on).
        #[arg(long)]
        from: Option<u64>,
        #[arg(long, default_value_t = 100)]
        poll_ms: u64,
        /// Stop after this many records.
        #[arg(long)]
        max_records: Option<u64>,
        /// Stop after this long.
        #[arg(long)]
        timeout_ms: Option<u64>,
    },
}

#[derive(Subcommand)]
enum LeaseCmd {
    Acquire {
        #[command(flatten)]
        dir: Dir,
        #[arg(long)]
        resource: String,
        #[arg(long, value_enum)]
        mode: Mode,
        #[arg(long)]
        holder: String,
        #[arg(long, default_value_t = 30_000)]
        ttl_ms: u64,
        #[command(flatten)]
        req: Req,
    },
    Release {
        #[command(flatten)]
        dir: Dir,
        #[arg(long)]
        lease: u64,
        #[arg(long)]
        token: u64,
        #[command(flatten)]
        req: Req,
    },
}

#[derive(Subcommand)]
enum RequestCmd {
    Show {
        #[command(flatten)]
        dir: Dir,
        id: String,
    },
}

#[derive(Clone, Copy, ValueEnum)]
enum Mode {
    Read,
    Write,
}

enum Fail {
    Usage(String, String),
    Ledger(LedgerError),
    Storage(fencelog::storage::Error),
}

impl From<LedgerError> for Fail {
    fn from(e: LedgerError) -> Self {
        Fail::Ledger(e)
    }
}

impl From<fencelog::storage::Error> for Fail {
    fn from(e: fencelog::storage::Error) -> Self {
        Fail::Storage(e)
    }
}

type CmdResult = Result<(Value, u8), Fail>;

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(c) => c,
        Err(e) => {
            let _ = e.print();
            if !e.use_stderr() {
                return ExitCode::SUCCESS; // --help, --version
            }
            let message = e.render().to_string();
            let first = message.lines().next().unwrap_or("usage error").trim_start_matches("error: ");
            println!("{}", json!({"error": {"code": "USAGE", "message": first}}));
            return ExitCode::from(2);
        }
    };
    let (value, code) = match run(cli.cmd) {
        Ok(ok) => ok,
        Err(Fail::Usage(code, message)) => (json!({"error": {"code": code, "message": message}}), 2),
        Err(Fail::Ledger(LedgerError::Refused(r))) => {
            // Invalid input is a usage error (2); a refusal of the state machine is 3.
            let code = if matches!(r, Refusal::InvalidSubject { .. } | Refusal::InvalidInput { .. }) { 2 } else { 3 };
            (json!({"error": r, "message": r.to_string()}), code)
        }
        Err(Fail::Ledger(e @ (LedgerError::SnapshotNotInLog(_) | LedgerError::UndecodableRecord { .. }))) => {
            (json!({"error": {"code": e.code(), "message": e.to_string()}}), 1)
        }
        Err(Fail::Ledger(LedgerError::Storage(e))) | Err(Fail::Storage(e)) => {
            use fencelog::storage::Error as E;
            let code = if matches!(e, E::NotALogDirectory { .. } | E::InvalidOption { .. }) { 2 } else { 1 };
            (json!({"error": {"code": e.code(), "message": e.to_string()}}), code)
        }
    };
    if let Some(m) = value.get("message").and_then(Value::as_str).or(value["error"]["message"].as_str()) {
        eprintln!("fencelog: {m}");
    }
    if !value.is_null() {
        println!("{value}");
    }
    ExitCode::from(code)
}

/// The command line never creates a log by accident: only `init` does.
fn ledger_options() -> LedgerOptions {
    let mut opts = LedgerOptions::default();
    opts.log.create = false;
    opts
}

fn open(dir: &Dir) -> Result<Ledger, Fail> {
    Ok(Ledger::open(&dir.dir, ledger_options())?)
}

fn subject_ok(s: &str) -> Result<(), Fail> {
    validate_subject(s).map_err(|r| Fail::Ledger(LedgerError::Refused(r)))
}

/// The identity evidence of `pid` (default: the caller's parent).
fn owner(pid: Option<u32>, instance: Option<uuid::Uuid>) -> Result<fencelog::model::Identity, Fail> {
    let pid = pid.unwrap_or_else(identity::parent_pid);
    identity::probe(pid, instance.unwrap_or_else(uuid::Uuid::new_v4))
        .ok_or_else(|| Fail::Usage("NO_SUCH_PROCESS".into(), format!("no live process with pid {pid}")))
}

fn single(events: Vec<Event>) -> impl Fn(&Projection, u64, uuid::Uuid) -> Result<Txn, Refusal> {
    move |_p, now_ms, writer| Ok(Txn::new(now_ms, writer, events.clone()))
}

fn tag<T: serde::Serialize>(req: &Req, intent: &T) -> Option<(String, [u8; 32])> {
    req.request_id.clone().map(|id| (id, intent_digest(intent)))
}

/// One JSON object for a committed single-event transaction.
fn report(c: fencelog::ledger::Committed) -> CmdResult {
    let outcome = c.outcomes.into_iter().next().expect("one event, one outcome");
    let mut v = outcome.to_json();
    v["seq"] = json!(c.seq);
    v["deduplicated"] = json!(c.deduplicated);
    if let Outcome::LeaseReleaseFailed { .. } = outcome {
        v["code"] = json!("LEASE_TOKEN_MISMATCH");
        v["message"] = json!("the release presented the wrong token; the lease stays held, release pending");
        return Ok((json!({ "error": v }), 3));
    }
    Ok((v, 0))
}

fn run(cmd: Cmd) -> CmdResult {
    match cmd {
        Cmd::Claim { dir, subject, pid, instance, stale_after_ms, action, req } => {
            subject_ok(&subject)?;
            let t = tag(&req, &("claim", &subject, pid, instance, stale_after_ms, &action));
            let me = owner(pid, instance)?;
            let lock = action.map(|action| LockIntent { action, request: req.request_id.clone().unwrap_or_default() });
            let ledger = open(&dir)?;
            let c = ledger.submit(t.clone(), |p, now_ms, writer| {
                // Liveness is judged here, on identity, and enters the log as evidence.
                let previous = p
                    .subject(&subject)
                    .and_then(|s| s.owner.as_ref())
                    .and_then(|o| identity::death_of(&o.identity))
                    .and_then(|reason| p.dead_owner(&subject, reason));
                let event = Event::Claim {
                    subject: subject.clone(),
                    owner: me.clone(),
                    stale_after_ms,
                    lock: lock.clone(),
                    previous,
                };
                Ok(Txn::new(now_ms, writer, vec![event]))
            })?;
            report(c)
        }
        Cmd::Heartbeat { dir, subject, generation, req } => {
            subject_ok(&subject)?;
            let t = tag(&req, &("heartbeat", &subject, generation));
            report(open(&dir)?.submit(t.clone(), single(vec![Event::Heartbeat { subject, generation }]))?)
        }
        Cmd::Release { dir, subject, generation, req } => {
            subject_ok(&subject)?;
            let t = tag(&req, &("release", &subject, generation));
            report(open(&dir)?.submit(t.clone(), single(vec![Event::Release { subject, generation }]))?)
        }
        Cmd::RotateFence { dir, subject, generation, req } => {
            subject_ok(&subject)?;
            let t = tag(&req, &("rotate-fence", &subject, generation));
            report(open(&dir)?.submit(t.clone(), single(vec![Event::RotateFence { subject, generation }]))?)
        }
        Cmd::Note { dir, subject, generation, text, req } => {
            subject_ok(&subject)?;
            let t = tag(&req, &("note", &subject, generation, &text));
            report(open(&dir)?.submit(t.clone(), single(vec![Event::Note { subject, generation, text }]))?)
        }
        Cmd::Takeover {
            dir,
            subject,
            expect_generation,
            expect_heartbeat_ms,
            pid,
            instance,
            stale_after_ms,
            reason,
            req,
        } => {
            subject_ok(&subject)?;
            let t = tag(&req, &("takeover", &subject, expect_generation, expect_heartbeat_ms, pid, instance, &reason));
            let owner = owner(pid, instance)?;
            let event =
                Event::Takeover { subject, expect_generation, expect_heartbeat_ms, owner, stale_after_ms, reason };
            report(open(&dir)?.submit(t.clone(), single(vec![event]))?)
        }
        Cmd::Lease { cmd: LeaseCmd::Acquire { dir, resource, mode, holder, ttl_ms, req } } => {
            let mode = match mode {
                Mode::Read => LeaseMode::Read,
                Mode::Write => LeaseMode::Write,
            };
            let t = tag(&req, &("lease-acquire", &resource, mode, &holder, ttl_ms));
            let event = Event::LeaseAcquire { resource, mode, holder, ttl_ms };
            report(open(&dir)?.submit(t.clone(), single(vec![event]))?)
        }
        Cmd::Lease { cmd: LeaseCmd::Release { dir, lease, token, req } } => {
            let t = tag(&req, &("lease-release", lease, token));
            report(open(&dir)?.submit(t.clone(), single(vec![Event::LeaseRelease { lease, token }]))?)
        }
        Cmd::Request { cmd: RequestCmd::Show { dir, id } } => {
            let view = Ledger::read_only(&dir.dir, &ledger_options())?;
            let mut v = serde_json::to_value(view.request_status(&id)?).expect("status serializes");
            v["torn_tail"] = json!(view.torn_tail);
            Ok((v, 0))
        }
        Cmd::Init { dir } => {
            let r = fencelog::storage::init(&dir.dir, LogOptions::default())?;
            Ok((serde_json::to_value(r).expect("report serializes"), 0))
        }
        Cmd::Repair { dir, cut_from } => {
            let r = fencelog::storage::repair(&dir.dir, cut_from, &LogOptions::default())?;
            let code = if r.intact { 0 } else { 1 };
            Ok((serde_json::to_value(r).expect("report serializes"), code))
        }
        Cmd::State { dir, subject } => state(&dir, subject),
        Cmd::Demo { dir, records, appenders, payload_bytes } => demo(dir.dir, records, appenders, payload_bytes),
        Cmd::Inspect { cmd } => inspect(cmd).map_err(|e| match e {
            // For the inspector, anything it cannot read is "not a log / unreadable".
            Fail::Storage(e) if !matches!(e, fencelog::storage::Error::Corruption { .. }) => {
                Fail::Usage(e.code().into(), e.to_string())
            }
            other => other,
        }),
        Cmd::Audit { dir, subject, format, out } => {
            let report = fencelog::audit::audit(&dir, subject.as_deref())?;
            let body = match format {
                Format::Text => fencelog::audit::text(&report),
                Format::Json => serde_json::to_string_pretty(&report).expect("report serializes") + "\n",
                Format::Html => fencelog::audit::html(&report),
            };
            match out {
                Some(path) => std::fs::write(&path, body)
                    .map_err(|e| Fail::Usage("IO_ERROR".into(), format!("{}: {e}", path.display())))?,
                None => print!("{body}"),
            }
            Ok((Value::Null, if report.log_problems.is_empty() { 0 } else { 1 }))
        }
    }
}

fn inspect(cmd: InspectCmd) -> CmdResult {
    use fencelog::inspect as ins;
    let stdout = std::io::stdout();
    let mut out = std::io::BufWriter::new(stdout.lock());
    let io = |e: std::io::Error| Fail::Usage("IO_ERROR".into(), e.to_string());
    let code = match cmd {
        InspectCmd::Verify { dir, json, expect_head } => {
            warn_if_unsafe(&dir);
            let (s, code) = ins::verify_pinned(&dir, &expect_head)?;
            if json {
                writeln!(out, "{}", ins::verify_json(&s)).map_err(io)?;
            } else {
                ins::verify_text(&s, &mut out).map_err(io)?;
            }
            code
        }
        InspectCmd::Dump { dir, json, from, to, subject, kind, since, until, raw } => {
            let f = ins::Filter { from, to, subject, kind, since_ms: since, until_ms: until };
            let s = ins::dump(&dir, &f, json, raw, &mut out)?;
            if s.is_intact() { 0 } else { 1 }
        }
        InspectCmd::State { dir, at, json } => {
            let (p, s) = ins::state_at(&dir, at)?;
            if json {
                writeln!(out, "{}", serde_json::to_string_pretty(&p).expect("projection serializes")).map_err(io)?;
            } else {
                ins::state_text(&p, &mut out).map_err(io)?;
            }
            if s.is_intact() { 0 } else { 1 }
        }
        InspectCmd::Head { dir, at, json } => {
            let h = ins::head(&dir, at)?;
            if json {
                writeln!(out, "{}", serde_json::to_string(&h).expect("head serializes")).map_err(io)?;
            } else {
                writeln!(out, "{}:{}", h.seq, h.chain_head).map_err(io)?;
            }
            0
        }
        InspectCmd::Stat { dir, top } => {
            let v = ins::stat(&dir, top)?;
            writeln!(out, "{}", serde_json::to_string_pretty(&v).expect("stat serializes")).map_err(io)?;
            if v["problems"].as_array().is_some_and(|p| p.is_empty()) { 0 } else { 1 }
        }
        InspectCmd::Follow { dir, json, from, poll_ms, max_records, timeout_ms } => {
            ins::follow(&dir, from, json, poll_ms.max(1), max_records, timeout_ms, &mut out)?;
            0
        }
    };
    out.flush().map_err(io)?;
    Ok((Value::Null, code))
}

/// The inspector reads a log whatever its permissions, but says when others could
/// have rewritten it.
fn warn_if_unsafe(dir: &std::path::Path) {
    if let Err(e @ fencelog::storage::Error::UnsafePermissions { .. }) = fencelog::storage::check_dir_mode(dir) {
        eprintln!("fencelog: warning: {e}");
    }
}

fn state(dir: &Dir, only: Option<String>) -> CmdResult {
    if let Some(o) = &only {
        subject_ok(o)?;
    }
    let view = Ledger::read_only(&dir.dir, &ledger_options())?;
    let p = &view.projection;
    let now_ms = LogOptions::default().now_ms();
    let subjects: Vec<Value> = p
        .subjects
        .iter()
        .filter(|(name, _)| only.as_ref().is_none_or(|o| o == *name))
        .map(|(name, s)| {
            let status = match &s.owner {
                None => "free",
                Some(o) if identity::death_of(&o.identity).is_some() => "dead",
                Some(o) if !o.is_fresh(now_ms) => "stale",
                Some(_) => "active",
            };
            json!({
                "subject": name,
                "generation": s.generation,
                "owner": s.owner.as_ref().map(|o| &o.identity),
                "lock": s.owner.as_ref().and_then(|o| o.lock.as_ref()),
                "heartbeat_ms": s.owner.as_ref().map(|o| o.heartbeat_ms),
                "stale_after_ms": s.owner.as_ref().map(|o| o.stale_after_ms),
                "status": status,
                "ended": s.ended,
                "fenced_attempts": s.fenced_attempts,
                "late_notes": s.late_notes,
            })
        })
        .collect();
    let leases: Vec<_> = if only.is_none() { p.leases.values().collect() } else { vec![] };
    let head = fencelog::format::hex(&view.head);
    let v = json!({
        "last_seq": p.last_seq, "chain_head": head, "torn_tail": view.torn_tail, "subjects": subjects, "leases": leases,
    });
    Ok((v, 0))
}

fn demo(dir: PathBuf, records: u64, appenders: u64, payload_bytes: usize) -> CmdResult {
    use fencelog::model::TEXT_BYTES_MAX;
    if payload_bytes > TEXT_BYTES_MAX {
        return Err(Fail::Usage("INVALID_INPUT".into(), format!("--payload-bytes is at most {TEXT_BYTES_MAX}")));
    }
    // The demo creates its data directory on purpose (it is the README's first
    // command); it writes ledger transactions, so the log it leaves is a ledger that
    // every other command reads.
    let mut opts = LedgerOptions::default();
    opts.log.create = true;
    let ledger = Ledger::open(&dir, opts.clone())?;
    let report = ledger.open_report().storage.clone();
    let appenders = appenders.clamp(1, 1024).min(records.max(1));
    let (per, extra) = (records / appenders, records % appenders);
    let started = Instant::now();
    std::thread::scope(|s| -> Result<(), Fail> {
        let handles: Vec<_> = (0..appenders)
            .map(|t| {
                let ledger = &ledger;
                s.spawn(move || demo_appender(ledger, t, per + u64::from(t < extra), payload_bytes))
            })
            .collect();
        handles.into_iter().try_for_each(|h| h.join().expect("appender thread"))
    })?;
    let elapsed = started.elapsed();
    let head = ledger.projection().last_seq;
    drop(ledger);
    let summary = verify_dir(&dir, opts.log.body_max())?;
    let code = if summary.is_intact() { 0 } else { 1 };
    Ok((
        json!({
            "dir": dir, "open": report, "appended": records, "appenders": appenders,
            "durable_appends_per_s": (records as f64 / elapsed.as_secs_f64()).round(),
            "head": head, "verify": summary,
        }),
        code,
    ))
}

/// One demo appender: claim `demo/<pid>/appender-T` for this process (over a dead
/// owner, with its death evidence, should a pid come round again), then write
/// notes under that generation until `count` transactions are committed. Subjects
/// are per process, so demos may run side by side on one log.
fn demo_appender(ledger: &Ledger, t: u64, count: u64, payload_bytes: usize) -> Result<(), Fail> {
    if count == 0 {
        return Ok(());
    }
    let subject = format!("demo/{}/appender-{t}", std::process::id());
    let me = identity::probe(std::process::id(), uuid::Uuid::new_v4())
        .ok_or_else(|| Fail::Usage("NO_SUCH_PROCESS".into(), "cannot read this process's identity".into()))?;
    let claimed = ledger.submit(None, |p, now_ms, writer| {
        let previous = p
            .subject(&subject)
            .and_then(|s| s.owner.as_ref())
            .and_then(|o| identity::death_of(&o.identity))
            .and_then(|reason| p.dead_owner(&subject, reason));
        let claim =
            Event::Claim { subject: subject.clone(), owner: me.clone(), stale_after_ms: 60_000, lock: None, previous };
        Ok(Txn::new(now_ms, writer, vec![claim]))
    })?;
    let Some(Outcome::Claimed { generation, .. }) = claimed.outcomes.first().cloned() else {
        unreachable!("a committed claim reports Claimed")
    };
    for i in 1..count {
        let mut text = format!("demo appender {t} record {i} ");
        text.extend(std::iter::repeat_n('.', payload_bytes.saturating_sub(text.len())));
        let note = Event::Note { subject: subject.clone(), generation, text };
        ledger.submit(None, |_p, now_ms, writer| Ok(Txn::new(now_ms, writer, vec![note.clone()])))?;
    }
    Ok(())
}
