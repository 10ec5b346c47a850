//! `supervisor`: process supervision on the ledger. Every spawn and every exit is
//! a record in the one log — the intent (with the leases the process holds), the
//! runner's start, a cancel request, and exactly one terminal record, which also
//! ends the process's leases — so nothing runs twice and nothing is forgotten:
//!
//! - **At most once.** A request id binds one command fingerprint. The spawn intent
//!   is compare-and-appended; a runner starts the command only if its `started`
//!   record lands (see [`runner`]: the command waits behind a gate until then).
//! - **Independent evidence.** The runner lives in its own session and records
//!   the exit itself; that record is never blocked by fencing.
//! - **Recovery never guesses.** A runner that is gone without an exit record makes
//!   the process `completed_unknown`; it is never run again.
//!
//! The CLI (`fencelog run`, `process …`, `recover`) and the daemon call these
//! functions. See `docs/SUPERVISOR.md`.

pub mod command;
// The runner's process entry points (`fencelog __runner`, the spare, the exec
// gate) are the binary's: public with the `internals` feature, which `cli` turns on.
#[cfg(feature = "internals")]
pub mod runner;
#[cfg(not(feature = "internals"))]
mod runner;
#[cfg(feature = "internals")]
pub use runner::fork_fresh_runners;
pub mod secrets;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::ledger::{Ledger, LedgerError, identity, intent_digest};
use crate::model::{
    Capture, CommandSpec, Event, LeaseMode, LeaseWant, Outcome, OwnerRef, Process, ProcessEnd, ProcessStatus,
    Projection, Refusal, Txn,
};
use crate::ops::OpError;

/// Where processes' files live under the log directory.
pub const PROCESS_DIR: &str = crate::storage::PROCESS_DIR;
/// Default bound on each output stream kept on disk.
pub const OUTPUT_BYTES_MAX_DEFAULT: u64 = 8 << 20;
/// Largest bound a request may ask for.
pub const OUTPUT_BYTES_MAX_LIMIT: u64 = 64 << 20;
/// Default time `run` waits for the result before it answers with a handle.
pub const WAIT_MS_DEFAULT: u64 = 10_000;
/// Longest any wait (`run`, `process wait`) may be asked to be.
pub const WAIT_MS_MAX: u64 = 3_600_000;
/// Longest `--lease-wait-ms`.
pub const LEASE_WAIT_MS_MAX: u64 = 30_000;
/// Longest `--timeout-ms` (a week); 0 means none.
pub const TIMEOUT_MS_MAX: u64 = 7 * 24 * 3_600_000;
/// A spawn intent no runner started for this long is abandoned on recovery.
pub const PRESPAWN_GRACE_MS_DEFAULT: u64 = 5 * 60_000;
/// Between polls of a lease conflict under `--lease-wait-ms`.
const LEASE_RETRY_MS: u64 = 50;

fn default_wait_ms() -> u64 {
    WAIT_MS_DEFAULT
}
fn default_output_bytes_max() -> u64 {
    OUTPUT_BYTES_MAX_DEFAULT
}

/// `DIR/processes/ID/`: the process's `stdout`, `stderr` and `runner.log`.
pub fn process_dir(dir: &Path, process: u64) -> PathBuf {
    dir.join(PROCESS_DIR).join(process.to_string())
}

fn invalid(detail: impl Into<String>) -> OpError {
    OpError::Refused(Refusal::InvalidInput { detail: detail.into() })
}

/// `fencelog run` / `POST /v1/run`: the CLI's flags in snake_case.
#[derive(Debug, Clone, Default, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RunRequest {
    /// The executable (searched in `PATH` when it has no `/`) and its arguments.
    #[schema(min_items = 1)]
    pub command: Vec<String>,
    #[serde(default)]
    pub request_id: Option<String>,
    /// `RESOURCE:read` or `RESOURCE:write`.
    #[serde(default)]
    pub leases: Vec<String>,
    /// How long to wait for the leases (at most `LEASE_WAIT_MS_MAX`).
    #[serde(default)]
    #[schema(maximum = 30_000)]
    pub lease_wait_ms: u64,
    /// 0: no timeout (at most `TIMEOUT_MS_MAX`, a week).
    #[serde(default)]
    #[schema(maximum = 604_800_000)]
    pub timeout_ms: u64,
    /// How long the answer waits for the process to end (over HTTP at most
    /// `HTTP_WAIT_MS_MAX`); the process goes on after it.
    #[serde(default = "default_wait_ms")]
    #[schema(maximum = 60_000)]
    pub wait_ms: u64,
    #[serde(default)]
    #[schema(value_type = Option<String>)]
    pub cwd: Option<PathBuf>,
    /// `NAME=VALUE`; values never enter the log (only their blake3).
    #[serde(default)]
    pub env: Vec<String>,
    /// Bytes of each output kept (1..=`OUTPUT_BYTES_MAX_LIMIT`).
    #[serde(default = "default_output_bytes_max")]
    #[schema(minimum = 1, maximum = 67_108_864)]
    pub output_bytes_max: u64,
    #[serde(default)]
    pub owner: Option<String>,
    #[serde(default)]
    pub generation: Option<u64>,
}

/// A process as every front end shows it. `exit_code` … `stderr_tail` appear once
/// it is terminal.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct ProcessView {
    pub id: u64,
    pub status: ProcessStatus,
    /// The command's pid (once started).
    pub pid: Option<u32>,
    pub deduplicated: bool,
    pub request_id: Option<String>,
    pub fingerprint: String,
    pub command: CommandSpec,
    pub owner: Option<OwnerRef>,
    pub leases: Vec<u64>,
    pub timeout_ms: u64,
    pub output_bytes_max: u64,
    pub requested_seq: u64,
    pub requested_ms: u64,
    /// The host it runs on (recorded on a log shared by hosts).
    pub host: Option<String>,
    pub runner_pid: Option<u32>,
    pub started_seq: Option<u64>,
    pub cancel_requested_seq: Option<u64>,
    #[serde(flatten)]
    #[schema(value_type = TerminalFields)]
    pub terminal: Option<TerminalView>,
}

/// [`TerminalView`]'s members as a process shows them: all present once it is
/// terminal, none before (the schema of the flattened `Option`).
pub struct TerminalFields;

impl utoipa::PartialSchema for TerminalFields {
    fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
        use utoipa::openapi::{RefOr, schema::Schema};
        let mut s = <TerminalView as utoipa::PartialSchema>::schema();
        if let RefOr::T(Schema::Object(o)) = &mut s {
            o.required.clear();
            o.description = Some("Present, all together, once the process is terminal.".into());
        }
        s
    }
}
impl utoipa::ToSchema for TerminalFields {
    fn schemas(schemas: &mut Vec<(String, utoipa::openapi::RefOr<utoipa::openapi::schema::Schema>)>) {
        <TerminalView as utoipa::ToSchema>::schemas(schemas);
    }
}

impl ProcessView {
    /// A run's settlement: its spawn intent is in the log; if no runner had
    /// recorded its start, whether it ran is not known yet.
    pub fn settlement(&self) -> crate::ops::Settlement {
        if self.status == ProcessStatus::Requested {
            crate::ops::Settlement::OutcomeUnknown { seq: self.requested_seq }
        } else {
            crate::ops::Settlement::Committed { seq: Some(self.requested_seq) }
        }
    }
}

#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct TerminalView {
    pub ended_seq: u64,
    pub ended_ms: u64,
    pub exit_code: Option<i32>,
    pub signal: Option<i32>,
    pub timed_out: bool,
    pub cancelled: bool,
    pub duration_ms: Option<u64>,
    pub stdout_tail: String,
    pub stderr_tail: String,
    pub stdout: Option<CaptureView>,
    pub stderr: Option<CaptureView>,
    /// Why it never ran or why its outcome is unknown (`PRESPAWN_ABANDONED`,
    /// `SPAWN_FAILED`, `EXE_CHANGED`, or the runner's failed identity check).
    pub end_code: Option<String>,
    pub end_detail: Option<String>,
    pub leases_released: Vec<u64>,
}

#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct CaptureView {
    pub bytes_seen: u64,
    pub bytes_kept: u64,
    pub truncated: bool,
    pub kept_blake3: String,
}

impl From<&Capture> for CaptureView {
    fn from(c: &Capture) -> Self {
        CaptureView {
            bytes_seen: c.bytes_seen,
            bytes_kept: c.bytes_kept,
            truncated: c.truncated,
            kept_blake3: crate::format::hex(&c.kept_blake3),
        }
    }
}

/// Bytes as text for JSON (invalid UTF-8 replaced; a tail cut inside a character
/// loses only that character).
fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

impl ProcessView {
    pub fn of(p: &Process, deduplicated: bool) -> ProcessView {
        let terminal = p.ended.as_ref().map(|e| {
            let mut t = TerminalView {
                ended_seq: e.seq,
                ended_ms: e.time_ms,
                exit_code: None,
                signal: None,
                timed_out: false,
                cancelled: false,
                duration_ms: None,
                stdout_tail: String::new(),
                stderr_tail: String::new(),
                stdout: None,
                stderr: None,
                end_code: None,
                end_detail: None,
                leases_released: e.leases_released.clone(),
            };
            match &e.end {
                ProcessEnd::Exited(x) => {
                    t.exit_code = x.exit_code;
                    t.signal = x.signal;
                    t.timed_out = x.timed_out;
                    t.cancelled = x.cancelled;
                    t.duration_ms = Some(x.duration_ms);
                    t.stdout_tail = text(&x.stdout.tail);
                    t.stderr_tail = text(&x.stderr.tail);
                    t.stdout = Some((&x.stdout).into());
                    t.stderr = Some((&x.stderr).into());
                }
                ProcessEnd::CompletedUnknown { runner, command_alive } => {
                    t.end_code = Some(runner.clone());
                    t.end_detail = Some(format!(
                        "the runner is gone ({runner}) and recorded no exit; the command {}",
                        if *command_alive { "was still running when this was recorded" } else { "is gone" }
                    ));
                }
                ProcessEnd::Failed { code, detail } => {
                    t.end_code = Some(code.clone());
                    t.end_detail = Some(detail.clone());
                }
            }
            t
        });
        ProcessView {
            id: p.id,
            status: p.status(),
            pid: p.started.as_ref().map(|s| s.command_pid),
            deduplicated,
            request_id: p.request.clone(),
            fingerprint: crate::format::hex(&p.fingerprint),
            command: p.command.clone(),
            owner: p.owner.clone(),
            leases: p.leases.clone(),
            timeout_ms: p.timeout_ms,
            output_bytes_max: p.output_bytes_max,
            requested_seq: p.requested_seq,
            requested_ms: p.requested_ms,
            host: p.host.clone(),
            runner_pid: p.started.as_ref().map(|s| s.runner.pid),
            started_seq: p.started.as_ref().map(|s| s.seq),
            cancel_requested_seq: p.cancel_requested_seq,
            terminal,
        }
    }
}

fn parse_leases(specs: &[String]) -> Result<Vec<LeaseWant>, OpError> {
    specs
        .iter()
        .map(|s| {
            let (resource, mode) =
                s.rsplit_once(':').ok_or_else(|| invalid(format!("lease {s:?} is RESOURCE:read or RESOURCE:write")))?;
            let mode = match mode {
                "read" => LeaseMode::Read,
                "write" => LeaseMode::Write,
                _ => return Err(invalid(format!("lease {s:?}: the mode is read or write"))),
            };
            crate::ops::valid(resource)?;
            Ok(LeaseWant { resource: resource.to_owned(), mode })
        })
        .collect()
}

fn parse_env(specs: &[String]) -> Result<Vec<(String, String)>, OpError> {
    specs
        .iter()
        .map(|s| {
            s.split_once('=')
                .map(|(k, v)| (k.to_owned(), v.to_owned()))
                .ok_or_else(|| invalid(format!("--env {:?} is NAME=VALUE", s.split('=').next().unwrap_or(""))))
        })
        .collect()
}

fn owner_ref(owner: &Option<String>, generation: Option<u64>) -> Result<Option<OwnerRef>, OpError> {
    match (owner, generation) {
        (None, None) => Ok(None),
        (Some(subject), Some(generation)) => {
            crate::ops::valid(subject)?;
            Ok(Some(OwnerRef { subject: subject.clone(), generation }))
        }
        _ => Err(invalid("--owner and --generation go together")),
    }
}

/// Everything the intent of a run is: the request id stands for exactly this.
fn run_digest(
    fingerprint: &[u8; 32],
    leases: &[LeaseWant],
    owner: &Option<OwnerRef>,
    timeout_ms: u64,
    output_bytes_max: u64,
) -> [u8; 32] {
    intent_digest(&("run", fingerprint, leases, owner, timeout_ms, output_bytes_max))
}

/// `fencelog run`: record the intent (and leases), start a runner, and answer
/// within `wait_ms` with the result or a handle. `self_exe` is the fencelog binary
/// the runner is started from.
pub fn run(ledger: &Ledger, dir: &Path, req: &RunRequest, self_exe: &Path) -> Result<ProcessView, OpError> {
    run_until(ledger, dir, req, self_exe, &AtomicBool::new(false), None)
}

/// A spare runner kept ready for the next run on one log (see
/// [`runner::SpareRunner`]), for a caller that runs commands again and again — a
/// daemon, an embedding program. A run takes it if it is there (else starts a
/// runner as [`run`] does) and has the next one started in the background. At most
/// one is kept; dropping the last clone lets it go (it exits having done nothing).
#[derive(Clone, Default)]
pub struct Spares {
    slot: std::sync::Arc<std::sync::Mutex<Option<Spare>>>,
    /// A spare is being started: one at a time, so concurrent runs never start
    /// spares only to let all but one go.
    starting: std::sync::Arc<AtomicBool>,
}

struct Spare {
    site: runner::Site,
    exe: PathBuf,
    runner: runner::SpareRunner,
}

impl Spares {
    pub fn new() -> Spares {
        Spares::default()
    }

    fn slot(&self) -> std::sync::MutexGuard<'_, Option<Spare>> {
        self.slot.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The spare for `site` started from `exe`, if one is kept.
    fn take(&self, site: &runner::Site, exe: &Path) -> Option<runner::SpareRunner> {
        let mut slot = self.slot();
        match slot.take() {
            Some(s) if s.site == *site && s.exe == exe => Some(s.runner),
            other => {
                *slot = other;
                None
            }
        }
    }

    fn holds(&self, site: &runner::Site, exe: &Path) -> bool {
        self.slot().as_ref().is_some_and(|s| s.site == *site && s.exe == exe)
    }

    /// Start a spare for `site` on a thread of its own, unless one is kept (one
    /// for another log is let go).
    fn refill(&self, site: &runner::Site, exe: &Path) {
        if self.holds(site, exe) || self.starting.swap(true, Ordering::AcqRel) {
            return;
        }
        let (this, site, exe) = (self.clone(), site.clone(), exe.to_path_buf());
        let started = std::thread::Builder::new().name("fencelog-spare-start".into()).spawn(move || {
            // Without a spare, runs start their own runner, as without spares.
            if let Ok(runner) = runner::SpareRunner::start(&site, &exe) {
                *this.slot() = Some(Spare { site, exe, runner });
            }
            this.starting.store(false, Ordering::Release);
        });
        if started.is_err() {
            self.starting.store(false, Ordering::Release);
        }
    }

    /// Wait up to `timeout` for a spare for `dir` (from `exe`) to be kept and to
    /// have its log open; true if one is. Runs never need this; a benchmark that
    /// measures a run finding one ready does.
    pub fn wait_ready(&self, dir: &Path, exe: &Path, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        loop {
            // A look of at most 1 ms under the lock: runs are never held up by it.
            if let Some(s) = self.slot().as_mut().filter(|s| s.site.dir == dir && s.exe == exe)
                && s.runner.wait_ready(Duration::from_millis(1))
            {
                return true;
            }
            if Instant::now() >= deadline {
                return false;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// The pid of the spare kept, if any.
    pub fn spare_pid(&self) -> Option<u32> {
        self.slot().as_ref().map(|s| s.runner.pid())
    }
}

/// [`run`], whose wait for the result also ends when `abort` is set (a daemon's
/// cutover): the answer is then the process as it is. With `spares`, the runner
/// is a spare started ahead of this run when one is ready (see [`Spares`]).
pub fn run_until(
    ledger: &Ledger,
    dir: &Path,
    req: &RunRequest,
    self_exe: &Path,
    abort: &AtomicBool,
    spares: Option<&Spares>,
) -> Result<ProcessView, OpError> {
    crate::ops::valid_request_id(req.request_id.as_deref())?;
    // Its runner works in `dir` on the ledger's log (a directory, or etcd).
    let site = runner::Site::of(dir, ledger);
    let intent = SpawnIntent::of(dir, req)?;
    let (process, deduplicated) = record_intent(ledger, req, &intent)?;
    let runner = start_runner_if_requested(ledger, &site, process, self_exe, &intent.env, spares)?;
    let done = |p: &Process| p.status().is_terminal() || abort.load(Ordering::Relaxed);
    let p = wait_for_runner(ledger, process, req.wait_ms, runner, done);
    // The next run's spare starts once this one is answered: its start-up (an exec
    // and the log's replay) never competes with this run for the machine.
    if let Some(s) = spares {
        s.refill(&site, self_exe);
    }
    Ok(ProcessView::of(&p?, deduplicated))
}

/// A run request checked and resolved: what its spawn intent records, and the
/// environment its command gets.
struct SpawnIntent {
    leases: Vec<LeaseWant>,
    env: Vec<(String, String)>,
    owner: Option<OwnerRef>,
    spec: CommandSpec,
    fingerprint: [u8; 32],
    tag: Option<crate::model::RequestTag>,
}

impl SpawnIntent {
    /// `req` checked against the bounds, its leases, environment and owner parsed,
    /// its command resolved (in `dir`'s environment key, when it has `--env`).
    fn of(dir: &Path, req: &RunRequest) -> Result<SpawnIntent, OpError> {
        if req.wait_ms > WAIT_MS_MAX || req.lease_wait_ms > LEASE_WAIT_MS_MAX || req.timeout_ms > TIMEOUT_MS_MAX {
            return Err(invalid(format!(
                "wait_ms is at most {WAIT_MS_MAX}, lease_wait_ms at most {LEASE_WAIT_MS_MAX}, timeout_ms at most \
                 {TIMEOUT_MS_MAX}"
            )));
        }
        if req.output_bytes_max == 0 || req.output_bytes_max > OUTPUT_BYTES_MAX_LIMIT {
            return Err(invalid(format!("output_bytes_max is 1..={OUTPUT_BYTES_MAX_LIMIT}")));
        }
        let leases = parse_leases(&req.leases)?;
        let env = parse_env(&req.env)?;
        let owner = owner_ref(&req.owner, req.generation)?;
        // The key of the environment digests: made on the first run that has --env.
        let key = if env.is_empty() {
            None
        } else {
            Some(
                secrets::env_key(dir)
                    .map_err(|e| OpError::Io { message: format!("{}: {e}", secrets::ENV_KEY_FILE) })?,
            )
        };
        let spec = command::resolve(&req.command, req.cwd.as_deref(), &env, key.as_ref())?;
        let fingerprint = command::fingerprint(&spec);
        let tag = req.request_id.clone().map(|id| crate::model::RequestTag {
            id,
            digest: run_digest(&fingerprint, &leases, &owner, req.timeout_ms, req.output_bytes_max),
        });
        Ok(SpawnIntent { leases, env, owner, spec, fingerprint, tag })
    }
}

/// Record the spawn intent (waiting up to `lease_wait_ms` while its leases
/// conflict); the process's id, and whether the request id had it recorded before.
fn record_intent(ledger: &Ledger, req: &RunRequest, intent: &SpawnIntent) -> Result<(u64, bool), OpError> {
    let SpawnIntent { leases, owner, spec, fingerprint, tag, .. } = intent;
    let deadline = Instant::now() + Duration::from_millis(req.lease_wait_ms);
    // On a log shared by hosts: the process runs (and is recovered) on this host.
    let here = ledger.here();
    let host = here.shared.then(|| Event::ProcessHost { host: here.host.clone() });
    let committed = loop {
        let r = ledger.submit(tag.clone(), |_, now_ms, writer| {
            Ok(Txn::new(
                now_ms,
                writer,
                std::iter::once(Event::SpawnRequested {
                    fingerprint: *fingerprint,
                    command: spec.clone(),
                    owner: owner.clone(),
                    leases: leases.clone(),
                    timeout_ms: req.timeout_ms,
                    output_bytes_max: req.output_bytes_max,
                })
                .chain(host.clone())
                .collect(),
            ))
        });
        match r {
            Err(LedgerError::Refused(Refusal::LeaseConflict { .. })) if Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(LEASE_RETRY_MS));
            }
            other => break other?,
        }
    };
    let Some(Outcome::SpawnRecorded { process, .. }) = committed.outcomes.first() else {
        return Err(OpError::Io { message: "the spawn intent was recorded without a process id".into() });
    };
    Ok((*process, committed.deduplicated))
}

/// Start the runner of `process` unless one was started for it already: a spare
/// from `spares` if one takes it, else a new runner. The read end of its stdout
/// (see [`wait_for_runner`]), or `None` when no runner was started here.
fn start_runner_if_requested(
    ledger: &Ledger,
    site: &runner::Site,
    process: u64,
    self_exe: &Path,
    env: &[(String, String)],
    spares: Option<&Spares>,
) -> Result<Option<std::os::fd::OwnedFd>, OpError> {
    // A retried request whose first caller never started a runner (it was killed,
    // say) starts one now. Runners race safely: only one `started` record lands.
    let p = find(ledger, process)?;
    let mut runner = None;
    if p.status() == ProcessStatus::Requested {
        // A spare that is gone, or does not take the run, is passed over; one that
        // dies holding it is followed by a fresh runner (see `SpareRunner::assign`).
        let spare = spares.and_then(|s| s.take(site, self_exe)).and_then(|s| s.assign(process, env).ok());
        let settled = match spare {
            Some(settled) => Ok(settled),
            None => runner::start_runner(site, process, self_exe, env, Some(ledger)),
        };
        match settled {
            Ok(settled) => runner = Some(settled),
            Err(e) => {
                // Never started: say so on record (its leases end with it), unless a
                // runner of another caller got it meanwhile.
                let detail = format!("cannot start a runner: {e}");
                let end = ProcessEnd::never_ran(crate::model::EndCode::SpawnFailed, detail.clone());
                let _ = ledger.submit(None, |_, t, w| {
                    Ok(Txn::new(t, w, vec![Event::ProcessEnded { process, end: end.clone() }]))
                });
                return Err(OpError::Io { message: format!("process {process}: {detail}") });
            }
        }
    }
    Ok(runner)
}

/// A process from the ledger (caught up with the log), or `UNKNOWN_PROCESS`.
pub fn find(ledger: &Ledger, process: u64) -> Result<Process, OpError> {
    ledger
        .refresh_with(|p| p.processes().get(&process).cloned())?
        .ok_or(OpError::Refused(Refusal::UnknownProcess { process }))
}

/// Poll the log until `done(process)` or `wait_ms` passed; the process as last seen.
/// How long a command counts as quick, for the naps of a wait.
const QUICK_COMMAND_MS: Duration = Duration::from_millis(100);
/// Longest nap of a wait while the command may still be quick.
const WAIT_NAP_QUICK: Duration = Duration::from_micros(750);
/// Longest nap of a wait.
const WAIT_NAP_MAX: Duration = Duration::from_millis(20);

fn wait_for(ledger: &Ledger, process: u64, wait_ms: u64, done: impl Fn(&Process) -> bool) -> Result<Process, OpError> {
    wait_for_runner(ledger, process, wait_ms, None, done)
}

/// [`wait_for`] that also wakes the moment the runner it started has settled the
/// outcome or exited (`runner`: the read end of its stdout, from
/// [`runner::start_runner`]) — so a quick command's answer is read as soon as its
/// exit record is durable, not at the end of a nap; meanwhile the log is looked at
/// only every `WAIT_NAP_MAX`. After that the wait goes on by naps (a runner that
/// died without its record: recovery's).
fn wait_for_runner(
    ledger: &Ledger,
    process: u64,
    wait_ms: u64,
    mut runner: Option<std::os::fd::OwnedFd>,
    done: impl Fn(&Process) -> bool,
) -> Result<Process, OpError> {
    // Without the runner's word: short naps while a quick command is likely to
    // end (a look at the log costs a one-page read when nothing was appended),
    // then longer ones, up to 20 ms.
    let started = Instant::now();
    let deadline = started + Duration::from_millis(wait_ms);
    let mut nap = Duration::from_micros(250);
    loop {
        let mut p = find(ledger, process)?;
        if !done(&p) && orphaned(ledger.here(), &p).is_some() {
            // Its runner and its command are both gone: no exit record will come
            // after a short grace; settled as `recover` would, never waited out.
            p = settle_orphan(ledger, p)?;
        }
        let now = Instant::now();
        if done(&p) || now >= deadline {
            return Ok(p);
        }
        match &runner {
            // The runner's word comes the moment the outcome is settled (or it is
            // gone): until then a look at the log would find nothing to answer
            // with, and would compete with the runner for the machine — or sync
            // the runner's records itself, catching up while they are in flight.
            // (A look every `WAIT_NAP_MAX` all the same: `done` may also say an
            // abort.)
            Some(fd) => {
                if runner::nap_until_settled(fd, WAIT_NAP_MAX.min(deadline - now)) {
                    runner = None;
                }
            }
            None => {
                std::thread::sleep(nap.min(deadline - now));
                let cap = if started.elapsed() < QUICK_COMMAND_MS { WAIT_NAP_QUICK } else { WAIT_NAP_MAX };
                nap = (nap * 3 / 2).min(cap);
            }
        }
    }
}

/// How long a wait (or the daemon's `process show`) gives a gone runner's exit
/// record to appear before it records `completed_unknown` — the seed runtimes'
/// `PROCESS_RECOVERY_RECEIPT_GRACE_MS`. A runner makes its exit record durable
/// before it exits, so on one host the record is there already; the grace is for
/// a reader that looked between the two.
pub const EXIT_RECORD_GRACE_MS: u64 = 500;

/// How often the grace looks again.
const EXIT_RECORD_POLL_MS: u64 = 25;

/// Why `p` can only have ended unseen: started, not ended, its runner provably
/// dead (the code of its failed identity check), and nothing of its command still
/// running. `None` otherwise (not started, ended, or a runner or command alive).
/// A process on another host (always `None`: only its own host sees its runner
/// and command).
fn orphaned(here: &identity::Here, p: &Process) -> Option<&'static str> {
    if p.ended.is_some() || on_other_host(here, p) {
        return None;
    }
    runner_dead(here, p).filter(|_| !command_group_alive(p))
}

/// Whether `p` runs on another host than this one (a log shared by hosts): its
/// host as recorded with its spawn; with none recorded (a log on one host,
/// imported), its runner's boot id says (see [`identity::Here::is_other_host`]),
/// and a process not started is this host's only on a log on one host.
pub fn on_other_host(here: &identity::Here, p: &Process) -> bool {
    match (&p.host, &p.started) {
        (Some(h), _) => *h != here.host,
        (None, Some(s)) => here.is_other_host(&s.runner, None),
        (None, None) => here.shared,
    }
}

/// Settle an orphaned process (see [`orphaned`]): wait at most
/// [`EXIT_RECORD_GRACE_MS`] for its runner's exit record, then record
/// `completed_unknown` — never a guessed failure, never a second run — exactly as
/// `fencelog recover` would (the state machine refuses it if the exit record came
/// meanwhile: that record stands). Returns the process as the log now has it.
pub fn settle_orphan(ledger: &Ledger, mut p: Process) -> Result<Process, OpError> {
    let grace_end = Instant::now() + Duration::from_millis(EXIT_RECORD_GRACE_MS);
    while Instant::now() < grace_end {
        std::thread::sleep(Duration::from_millis(EXIT_RECORD_POLL_MS));
        p = find(ledger, p.id)?;
        if orphaned(ledger.here(), &p).is_none() {
            return Ok(p);
        }
    }
    let Some(reason) = orphaned(ledger.here(), &p) else { return Ok(p) };
    tracing::warn!(process = p.id, reason, "runner and command gone without an exit record: completed_unknown");
    end_unknown(ledger, p.id, reason)?;
    find(ledger, p.id)
}

/// `process show` at a writer (the daemon; the CLI once [`needs_settling`] says
/// so): the process, settled first if its runner and command are both gone
/// ([`settle_orphan`]).
pub fn show_settled(ledger: &Ledger, process: u64) -> Result<ProcessView, OpError> {
    let p = find(ledger, process)?;
    let p = if orphaned(ledger.here(), &p).is_some() { settle_orphan(ledger, p)? } else { p };
    Ok(ProcessView::of(&p, false))
}

/// Does `process` in a read of the log need settling ([`settle_orphan`]) — started,
/// its runner and command both gone on this host, no exit record? A reader (the
/// CLI's `process show`) then opens the log as a writer and settles it
/// ([`show_settled`]); otherwise it answers from its read and writes nothing.
pub fn needs_settling(here: &identity::Here, projection: &Projection, process: u64) -> bool {
    projection.processes().get(&process).is_some_and(|p| orphaned(here, p).is_some())
}

/// `process show`.
pub fn show(projection: &Projection, process: u64) -> Result<ProcessView, OpError> {
    projection
        .processes()
        .get(&process)
        .map(|p| ProcessView::of(p, false))
        .ok_or(OpError::Refused(Refusal::UnknownProcess { process }))
}

/// `process wait`: the process once terminal, or as it is when `timeout_ms` passed.
pub fn wait(ledger: &Ledger, process: u64, timeout_ms: u64) -> Result<ProcessView, OpError> {
    if timeout_ms > WAIT_MS_MAX {
        return Err(invalid(format!("timeout_ms is at most {WAIT_MS_MAX}")));
    }
    Ok(ProcessView::of(&wait_for(ledger, process, timeout_ms, |p| p.status().is_terminal())?, false))
}

#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct ListResponse {
    pub processes: Vec<ProcessView>,
}

/// `process list [--status S] [--owner SUBJECT]`.
pub fn list(projection: &Projection, status: Option<&str>, owner: Option<&str>) -> Result<ListResponse, OpError> {
    let status = status
        .map(|s| {
            s.parse::<ProcessStatus>().map_err(|_| {
                invalid(format!(
                    "status {s:?} is one of requested, running, succeeded, failed, timed_out, cancelled, \
                     completed_unknown"
                ))
            })
        })
        .transpose()?;
    let processes = projection
        .processes()
        .values()
        .filter(|p| status.is_none_or(|s| p.status() == s))
        .filter(|p| owner.is_none_or(|o| p.owner.as_ref().is_some_and(|x| x.subject == o)))
        .map(|p| ProcessView::of(p, false))
        .collect();
    Ok(ListResponse { processes })
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum Stream {
    Stdout,
    Stderr,
}

impl Stream {
    /// Its file's name in the process's directory.
    pub fn file_name(self) -> &'static str {
        match self {
            Stream::Stdout => "stdout",
            Stream::Stderr => "stderr",
        }
    }
}

/// The file holding a process's kept output.
pub fn output_path(dir: &Path, process: u64, stream: Stream) -> PathBuf {
    process_dir(dir, process).join(stream.file_name())
}

/// What the exit record says was kept of `stream`: (bytes, blake3 of them) — none
/// before the exit, or for an end with no exit record (never started, unknown).
pub fn recorded_output(p: &Process, stream: Stream) -> Option<(u64, [u8; 32])> {
    match p.ended.as_ref().map(|e| &e.end) {
        Some(ProcessEnd::Exited(x)) => {
            let c = match stream {
                Stream::Stdout => &x.stdout,
                Stream::Stderr => &x.stderr,
            };
            Some((c.bytes_kept, c.kept_blake3))
        }
        _ => None,
    }
}

/// `process logs`: the kept output of `stream` from byte `from` on (at most
/// [`OUTPUT_BYTES_MAX_LIMIT`] bytes, more than any stream keeps), in memory: what
/// [`stream_output`] gives, collected (the CLI's follow reads what is new this way).
pub fn read_output(dir: &Path, p: &Process, stream: Stream, from: u64) -> Result<Vec<u8>, OpError> {
    let mut buf = Vec::new();
    stream_output(dir, p, stream, from, |chunk| {
        buf.extend_from_slice(chunk);
        Ok(())
    })?;
    Ok(buf)
}

/// Largest piece of a process's output read (and handed on) at once: what one
/// reader of a 64 MiB output holds in memory, not the output.
pub const OUTPUT_CHUNK_BYTES: usize = 64 << 10;

/// The kept output of `stream` from byte `from` on, handed to `sink` in pieces of
/// at most [`OUTPUT_CHUNK_BYTES`] (at most [`OUTPUT_BYTES_MAX_LIMIT`] bytes in all);
/// returns how many bytes it handed on.
///
/// Nothing before a runner started the process (a file under its name then is not
/// its own; in the moment between the start and the runner creating its files,
/// which sets aside whatever had the names, an older file can still be read — the
/// ended process's count and digest below keep it from passing for this one's).
/// Once the exit is on record, exactly the bytes the record says were kept: an
/// empty stream's file is never synced, so after a crash it may be missing, or an
/// older file of that name may be back in its place; neither shows. A file that
/// holds fewer bytes than the record says were kept (and synced), or whose bytes
/// read from the start do not match the record's digest, is damage: `IO_ERROR`
/// saying which — found by a first pass over the file (in pieces, hashing) before
/// `sink` sees a byte, and checked again on the bytes handed on. Before the exit
/// (or after a runner that recorded none), whatever the file holds so far.
pub fn stream_output(
    dir: &Path,
    p: &Process,
    stream: Stream,
    from: u64,
    mut sink: impl FnMut(&[u8]) -> std::io::Result<()>,
) -> Result<u64, OpError> {
    let Some(mut out) = OutputFile::open(dir, p, stream, from)? else { return Ok(0) };
    if out.checks_digest() {
        // The whole kept range, hashed before anything is handed on.
        out.pass(|_| Ok(()))?;
        out.rewind()?;
    }
    out.pass(|chunk| sink(chunk))
}

/// A process's kept output, opened to be read in pieces (see [`stream_output`]).
struct OutputFile {
    file: Option<std::fs::File>,
    process: u64,
    /// Below the log directory, never the absolute path (the daemon returns it).
    name: String,
    from: u64,
    /// Bytes to read: what the record kept from `from` on, or the limit.
    want: u64,
    file_len: u64,
    recorded: Option<(u64, [u8; 32])>,
}

impl OutputFile {
    fn open(dir: &Path, p: &Process, stream: Stream, from: u64) -> Result<Option<OutputFile>, OpError> {
        if p.started.is_none() {
            return Ok(None);
        }
        let recorded = recorded_output(p, stream);
        // What the record kept (never clamped: the record is the measure), else what
        // a running process's file may hold at most.
        let want = recorded.map_or(OUTPUT_BYTES_MAX_LIMIT, |(kept, _)| kept.saturating_sub(from));
        if want == 0 {
            return Ok(None);
        }
        let name = format!("{PROCESS_DIR}/{}/{}", p.id, stream.file_name());
        let mut out = OutputFile { file: None, process: p.id, name, from, want, file_len: 0, recorded };
        match std::fs::File::open(output_path(dir, p.id, stream)) {
            Ok(f) => {
                out.file_len = f.metadata().map_err(|e| out.io(e))?.len();
                out.file = Some(f);
            }
            // Missing: nothing yet, or (with kept bytes on record) the shortfall below.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(out.io(e)),
        }
        if let Some((kept, _)) = recorded
            && out.file_len < from + want
        {
            return Err(OpError::Io {
                message: format!(
                    "process {}'s exit record says {kept} bytes were kept, the file {} holds {}",
                    p.id, out.name, out.file_len
                ),
            });
        }
        Ok(Some(out))
    }

    fn io(&self, e: std::io::Error) -> OpError {
        OpError::Io { message: format!("process {} output {}: {e}", self.process, self.name) }
    }

    /// Read from the start of the whole kept range: its digest is checked.
    fn checks_digest(&self) -> bool {
        self.from == 0 && self.recorded.is_some_and(|(kept, _)| kept == self.want)
    }

    fn rewind(&mut self) -> Result<(), OpError> {
        use std::io::{Seek, SeekFrom};
        let Some(f) = self.file.as_mut() else { return Ok(()) };
        f.seek(SeekFrom::Start(0)).map(drop).map_err(|e| OpError::Io { message: e.to_string() })
    }

    /// One pass over the range, in pieces: count, hash, hand on. With a record,
    /// a short read or other bytes than it kept are `IO_ERROR`.
    fn pass(&mut self, mut sink: impl FnMut(&[u8]) -> std::io::Result<()>) -> Result<u64, OpError> {
        use std::io::{Read, Seek, SeekFrom};
        let Some(f) = self.file.as_mut() else { return Ok(0) };
        let (process, name) = (self.process, self.name.clone());
        let io = |e: std::io::Error| OpError::Io { message: format!("process {process} output {name}: {e}") };
        f.seek(SeekFrom::Start(self.from)).map_err(io)?;
        let mut reader = f.take(self.want);
        let mut chunk = vec![0u8; OUTPUT_CHUNK_BYTES.min(self.want as usize)];
        let (mut got, mut hasher) = (0u64, blake3::Hasher::new());
        loop {
            let n = match reader.read(&mut chunk) {
                Ok(0) => break,
                Ok(n) => n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(io(e)),
            };
            hasher.update(&chunk[..n]);
            got += n as u64;
            sink(&chunk[..n]).map_err(io)?;
        }
        if let Some((kept, digest)) = self.recorded {
            if got < self.want {
                return Err(OpError::Io {
                    message: format!(
                        "process {process}'s exit record says {kept} bytes were kept, the file {name} holds {}",
                        self.from + got
                    ),
                });
            }
            if self.checks_digest() && *hasher.finalize().as_bytes() != digest {
                return Err(OpError::Io {
                    message: format!(
                        "process {process}: the {kept} bytes in {name} are not the ones its exit record kept (blake3 \
                         differs)"
                    ),
                });
            }
        }
        Ok(got)
    }
}

#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct CancelResponse {
    #[serde(flatten)]
    pub process: ProcessView,
    /// Whether a signal was sent (only to the process recorded: pid and start time
    /// checked first).
    pub signalled: bool,
    /// Why not, when not.
    pub not_signalled_because: Option<String>,
}

/// Is anything of the command recorded for `p` still running: its leader (pid and
/// start time, same boot) or, once the leader is gone, any member of its process
/// group? (A pid in use as a group id is never given to a new process, so members of
/// that group are the command's.)
pub fn command_group_alive(p: &Process) -> bool {
    let Some(s) = &p.started else { return false };
    // Another boot: nothing of it runs. (A boot id that cannot be read proves
    // nothing; the checks below decide.)
    if identity::read_boot_id().is_some_and(|b| b != s.runner.boot_id) {
        return false;
    }
    match identity::start_ticks(s.command_pid) {
        Some(t) => t == s.command_start_ticks,
        None => runner::group_exists(s.command_pid),
    }
}

/// Record that a started process ended unseen: its runner is gone (`reason`) and
/// nothing of its command is left running.
fn end_unknown(ledger: &Ledger, process: u64, reason: &str) -> Result<(), OpError> {
    let end = ProcessEnd::CompletedUnknown { runner: reason.to_owned(), command_alive: false };
    match ledger.submit(None, |_, t, w| Ok(Txn::new(t, w, vec![Event::ProcessEnded { process, end: end.clone() }]))) {
        Ok(_) | Err(LedgerError::Refused(Refusal::AlreadyTerminal { .. })) => Ok(()),
        Err(e) => Err(e.into()),
    }
}

fn runner_dead(here: &identity::Here, p: &Process) -> Option<&'static str> {
    p.started
        .as_ref()
        .and_then(|s| crate::ops::liveness::death_of(here, &s.runner, p.host.as_deref()))
        .map(|r| r.code())
}

/// `process cancel`: a process run for an owner is cancelled only by that
/// subject's current generation (`FENCED` otherwise, before any signal). One not
/// started yet ends at once (`cancelled`, it never runs). A running one: the cancel
/// is recorded, the command's identity checked, TERM sent to its process group,
/// KILL after `grace_ms`. If its runner is gone too, the end is recorded here
/// (`completed_unknown`) once nothing of it runs.
pub fn cancel(ledger: &Ledger, process: u64, by: Option<OwnerRef>, grace_ms: u64) -> Result<CancelResponse, OpError> {
    if grace_ms > WAIT_MS_MAX {
        return Err(invalid(format!("grace_ms is at most {WAIT_MS_MAX}")));
    }
    if let Some(o) = &by {
        crate::ops::valid(&o.subject)?;
    }
    let p = find(ledger, process)?;
    ledger.refresh_with(|x| x.cancel_allowed(&p, by.as_ref()))?.map_err(OpError::Refused)?;
    if p.ended.is_some() {
        return Ok(cancel_answer(&p, false, Some("already terminal: the first outcome stands")));
    }
    if p.started.is_none()
        && let Some(answer) = cancel_before_start(ledger, process, by.as_ref())?
    {
        return Ok(answer);
    }
    let recorded = ledger
        .submit(None, |_, t, w| Ok(Txn::new(t, w, vec![Event::ProcessCancelRequested { process, by: by.clone() }])));
    match recorded {
        Ok(_) => {}
        Err(LedgerError::Refused(Refusal::AlreadyTerminal { .. })) => {
            return Ok(cancel_answer(
                &find(ledger, process)?,
                false,
                Some("already terminal: the first outcome stands"),
            ));
        }
        Err(e) => return Err(e.into()),
    }
    let p = find(ledger, process)?;
    if on_other_host(ledger.here(), &p) {
        // Its pids are another host's: nothing here is signalled, nothing judged.
        let why = format!(
            "it runs on host {}: the cancel is recorded; only its own host signals it",
            p.host.as_deref().unwrap_or("(not recorded)")
        );
        return Ok(cancel_answer(&p, false, Some(&why)));
    }
    signal_until_ended(ledger, process, &p, grace_ms)
}

/// What `cancel` answers: the process as it is, and whether (or why not) it was
/// signalled.
fn cancel_answer(p: &Process, signalled: bool, why: Option<&str>) -> CancelResponse {
    CancelResponse { process: ProcessView::of(p, false), signalled, not_signalled_because: why.map(str::to_owned) }
}

/// Cancel a process no runner has started: it ends at once, never run. `None`
/// when a runner started it meanwhile (then it is cancelled running).
fn cancel_before_start(
    ledger: &Ledger,
    process: u64,
    by: Option<&OwnerRef>,
) -> Result<Option<CancelResponse>, OpError> {
    let end = ProcessEnd::never_ran(
        crate::model::EndCode::CancelledBeforeStart,
        "cancelled before any runner started it; it never ran",
    );
    let r = ledger.submit(None, |x, t, w| {
        if let Some(q) = x.processes().get(&process) {
            x.cancel_allowed(q, by)?;
        }
        Ok(Txn::new(t, w, vec![Event::ProcessEnded { process, end: end.clone() }]))
    });
    match r {
        Ok(_) => Ok(Some(cancel_answer(&find(ledger, process)?, false, Some("it had not started: nothing to signal")))),
        // A runner started it meanwhile: cancel it running.
        Err(LedgerError::Refused(Refusal::AlreadyStarted { .. })) => Ok(None),
        Err(LedgerError::Refused(Refusal::AlreadyTerminal { .. })) => {
            Ok(Some(cancel_answer(&find(ledger, process)?, false, Some("already terminal: the first outcome stands"))))
        }
        Err(e) => Err(e.into()),
    }
}

/// The cancel recorded, signal the command of `process` (`p`, on this host): TERM to its
/// process group if anything of it runs, KILL after `grace_ms` if it still does;
/// its end recorded here (`completed_unknown`) if its runner is gone too.
fn signal_until_ended(ledger: &Ledger, process: u64, p: &Process, grace_ms: u64) -> Result<CancelResponse, OpError> {
    let pgid = p.started.as_ref().map_or(0, |s| s.command_pid);
    let signalled = command_group_alive(p) && runner::signal_group(pgid, libc::SIGTERM);
    let mut p = wait_for(ledger, process, grace_ms, |p| p.ended.is_some())?;
    if p.ended.is_none() && command_group_alive(&p) {
        runner::signal_group(pgid, libc::SIGKILL);
        p = wait_for(ledger, process, grace_ms, |p| p.ended.is_some())?;
    }
    if p.ended.is_none()
        && !command_group_alive(&p)
        && let Some(reason) = runner_dead(ledger.here(), &p)
    {
        end_unknown(ledger, process, reason)?;
        p = find(ledger, process)?;
    }
    let why = (!signalled).then_some("nothing of the recorded command (pid and start time, or its group) was running");
    Ok(cancel_answer(&p, signalled, why))
}

/// What one recovery pass did, by process id.
#[derive(Debug, Clone, Default, Serialize)]
pub struct RecoverReport {
    /// Runner alive (its identity matches): left running.
    pub left_running: Vec<u64>,
    /// Runner gone, but the command (or what it started in its group) still runs:
    /// untouched, its leases still held — it is not over. `process cancel` stops it.
    pub runner_gone_command_alive: Vec<u64>,
    /// Runner gone without an exit record, nothing of the command running.
    pub completed_unknown: Vec<u64>,
    /// Intent older than the grace, never started.
    pub prespawn_abandoned: Vec<u64>,
    /// Intent younger than the grace: a runner may still be starting.
    pub young_untouched: Vec<u64>,
    /// Run for a subject generation another live owner has replaced: that owner
    /// settles them (`recover --owner S --generation G`).
    pub other_owner_untouched: Vec<u64>,
    /// Ended by someone else while this pass looked.
    pub ended_meanwhile: Vec<u64>,
    /// Run on another host (a log shared by hosts): its own host recovers it.
    pub other_host_untouched: Vec<u64>,
    pub prespawn_grace_ms: u64,
}

impl RecoverReport {
    /// Each decision with the processes it was taken for (those taken for none
    /// left out), as the daemon logs them.
    pub fn decisions(&self) -> Vec<(&'static str, &[u64])> {
        [
            ("left_running", &self.left_running),
            ("runner_gone_command_alive", &self.runner_gone_command_alive),
            ("completed_unknown", &self.completed_unknown),
            ("prespawn_abandoned", &self.prespawn_abandoned),
            ("young_untouched", &self.young_untouched),
            ("other_owner_untouched", &self.other_owner_untouched),
            ("ended_meanwhile", &self.ended_meanwhile),
            ("other_host_untouched", &self.other_host_untouched),
        ]
        .into_iter()
        .filter(|(_, v)| !v.is_empty())
        .map(|(k, v)| (k, v.as_slice()))
        .collect()
    }
}

/// `fencelog recover`: settle every process that has not ended, from the log and
/// the identities of its runner and command — never by guessing, never by running
/// anything. With `as_owner` (which must be the subject's current generation), the
/// processes run for that subject's earlier generations are settled too.
pub fn recover(
    ledger: &Ledger,
    prespawn_grace_ms: u64,
    now_ms: u64,
    as_owner: Option<&OwnerRef>,
) -> Result<RecoverReport, OpError> {
    let projection = ledger.refresh()?;
    if let Some(o) = as_owner {
        crate::ops::valid(&o.subject)?;
        let (current, owned) = projection.subject(&o.subject).map_or((0, false), |s| (s.generation, s.owner.is_some()));
        if current != o.generation || !owned {
            return Err(OpError::Refused(projection.fenced(&o.subject, o.generation)));
        }
    }
    let mut report = RecoverReport { prespawn_grace_ms, ..Default::default() };
    let open: Vec<&Process> = projection.processes().values().filter(|p| p.ended.is_none()).collect();
    let here = ledger.here();
    for p in open {
        let Some(end) = recovery_end(here, &projection, p, as_owner, now_ms, &mut report) else { continue };
        record_recovery_end(ledger, p.id, end, &mut report)?;
    }
    Ok(report)
}

/// How recovery settles the open process `p`: the end to record, or `None` when
/// it is left as it is (which of `report`'s lists it went to says why).
fn recovery_end(
    here: &identity::Here,
    projection: &Projection,
    p: &Process,
    as_owner: Option<&OwnerRef>,
    now_ms: u64,
    report: &mut RecoverReport,
) -> Option<ProcessEnd> {
    let prespawn_grace_ms = report.prespawn_grace_ms;
    if on_other_host(here, p) {
        report.other_host_untouched.push(p.id);
        return None;
    }
    if let Some(o) = &p.owner
        && as_owner.is_none_or(|me| me.subject != o.subject)
        && let Some(s) = projection.subject(&o.subject)
        && s.generation != o.generation
        && s.owner
            .as_ref()
            .is_some_and(|cur| crate::ops::liveness::death_of(here, &cur.identity, cur.host.as_deref()).is_none())
    {
        report.other_owner_untouched.push(p.id);
        return None;
    }
    let end = match &p.started {
        Some(s) => match crate::ops::liveness::death_of(here, &s.runner, p.host.as_deref()) {
            None => {
                report.left_running.push(p.id);
                return None;
            }
            Some(_) if command_group_alive(p) => {
                report.runner_gone_command_alive.push(p.id);
                return None;
            }
            Some(reason) => ProcessEnd::CompletedUnknown { runner: reason.code().into(), command_alive: false },
        },
        None if now_ms.saturating_sub(p.requested_ms) < prespawn_grace_ms => {
            report.young_untouched.push(p.id);
            return None;
        }
        None => ProcessEnd::never_ran(
            crate::model::EndCode::PrespawnAbandoned,
            format!(
                "no runner started it within {prespawn_grace_ms} ms of its request (at sequence {})",
                p.requested_seq
            ),
        ),
    };
    Some(end)
}

/// Record the end recovery found for process `id`, and where it went in `report`.
fn record_recovery_end(ledger: &Ledger, id: u64, end: ProcessEnd, report: &mut RecoverReport) -> Result<(), OpError> {
    let unknown = matches!(end, ProcessEnd::CompletedUnknown { .. });
    // Judged again by the state machine against the state it will follow: if
    // the runner recorded its exit meanwhile, this is refused ALREADY_TERMINAL.
    let r = ledger.submit(None, |_, t_ms, writer| {
        Ok(Txn::new(t_ms, writer, vec![Event::ProcessEnded { process: id, end: end.clone() }]))
    });
    match r {
        Ok(_) if unknown => report.completed_unknown.push(id),
        Ok(_) => report.prespawn_abandoned.push(id),
        Err(LedgerError::Refused(Refusal::AlreadyTerminal { .. } | Refusal::AlreadyStarted { .. })) => {
            report.ended_meanwhile.push(id)
        }
        Err(e) => return Err(e.into()),
    }
    Ok(())
}
