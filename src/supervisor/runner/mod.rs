//! The independent runner, and the gate it starts commands through.
//!
//! The runner (`fencelog __runner --dir D --process ID`, or a fork of `fencelog
//! run`: [`fork_fresh_runners`]) is started by whoever recorded the spawn
//! intent, in a session of its own, so it outlives its caller. It starts the
//! command *behind a gate*: first a gate process (a `fork` of the runner made
//! first thing, while it has one thread; else `fencelog __gate`, started with
//! `posix_spawn`), in a process group of its own, its stdout and stderr the
//! runner's capture pipes, which waits for the command on its stdin. Meanwhile
//! the runner appends `ProcessStarted` with the gate's pid and start time. Only if that record lands does the runner send the command; the
//! gate then `exec`s it, so the record names the exact process (pid and start
//! time survive the `exec`). If another runner took the process first, the record
//! is refused and the gate is closed: it sees end of file and exits without
//! running anything, as it does if this runner dies. So a command runs at most
//! once, however many runners race for it. The gate is started before the log is
//! opened (a fresh runner) or before the run is known (a spare runner), so its
//! start-up is off the answer's path.
//!
//! Then the runner captures stdout and stderr to files (bounded), enforces the
//! timeout on the whole process group (TERM, then KILL after a grace), and appends
//! the one terminal record, which also ends the process's leases.

use std::os::fd::OwnedFd;
use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::time::{Duration, Instant};

use crate::ledger::{Ledger, LedgerError, LedgerOptions, identity};
use crate::model::{EndCode, Event, Exit, Process, ProcessEnd, Refusal, Txn};

use super::secrets::Secret;

mod capture;
mod gate;
mod group;
mod spare;
mod start;

use capture::{Capturer, open_outputs, redact_capture};
use gate::{Gate, exec_failure, gate_spec};
use group::wait_with_timeout;
use spare::StartNotice;
use start::tell_caller_settled;

pub use gate::gate_main;
pub use group::{group_exists, signal_group, stop_group};
pub use spare::{SpareRunner, spare_main};
pub use start::{FORK_RUNNER_RESIDENT_BYTES_MAX, fork_fresh_runners, nap_until_settled, start_runner};

/// Exit code of a runner that found its process already started (or ended) by
/// another: it started nothing.
pub const EXIT_ALREADY_STARTED: i32 = 75;
/// Between TERM and KILL of a process group that is being stopped.
pub const TERM_TO_KILL_GRACE_MS: u64 = 1_000;
/// After the command exits, how long its output pipes may stay open (held by
/// processes it left behind) before the runner stops reading them.
pub const OUTPUT_DRAIN_MS: u64 = 2_000;
/// Records replayed at open (after the newest snapshot) from which a runner, its
/// exit on record, writes a snapshot (unless the state has more than
/// [`STATE_ENTRIES_PER_TAIL_RECORD_MAX`](crate::ledger::snapshot::STATE_ENTRIES_PER_TAIL_RECORD_MAX)
/// entries per record replayed, or a newer snapshot was written meanwhile): an
/// open of a log written by short-lived processes — the next runner's, the
/// CLI's — then replays at most about this many records, or a quarter of the
/// state's entries if that is more, instead of up to
/// `LedgerOptions::snapshot_every_records`. A replayed record of a supervised
/// run cost 3–4 µs on this project's 2-core machine: 1,000 of them (the bound
/// before) were 3–4 ms of every such open at worst, 1.5–2 ms on average.
pub const TAIL_RECORDS_SNAPSHOT_MIN: u64 = 200;
/// Attempts to append the terminal record before the runner gives up (the
/// process then reads `completed_unknown` on recovery: never a guess).
const TERMINAL_APPEND_ATTEMPTS_MAX: u32 = 30;

fn ledger_options() -> LedgerOptions {
    let mut o = LedgerOptions::default();
    o.log.create = false;
    // A runner lives as long as its command and may take a snapshot: the freed
    // copy of the state goes back to the system, as in the daemon.
    o.after_snapshot = Some(crate::sys::memory::release_free_memory);
    o
}

/// Where a runner works: the directory of its process's files on this host
/// (output, `runner.log`) and its log — that directory itself, or a prefix in an
/// etcd cluster shared by several hosts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Site {
    pub dir: std::path::PathBuf,
    pub log: crate::storage::Location,
}

impl Site {
    /// The runners of the processes of `ledger`'s log, with their files in `dir`.
    pub fn of(dir: &Path, ledger: &Ledger) -> Site {
        let log = ledger.location().cloned().unwrap_or_else(|| crate::storage::Location::Dir(dir.to_path_buf()));
        Site { dir: dir.to_path_buf(), log }
    }

    /// A site whose log is its directory.
    pub fn dir(dir: &Path) -> Site {
        Site { dir: dir.to_path_buf(), log: crate::storage::Location::Dir(dir.to_path_buf()) }
    }

    fn open(&self) -> Result<Ledger, LedgerError> {
        Ledger::open_at(&self.log, ledger_options())
    }

    /// `--dir D` and, for a log in etcd, `--etcd ENDPOINTS --etcd-prefix P`: what
    /// a runner is started with after `__runner`.
    #[cfg_attr(not(feature = "etcd"), allow(unused_mut, unused_variables))]
    fn args(&self) -> Vec<std::ffi::OsString> {
        let mut a = vec!["--dir".into(), self.dir.clone().into_os_string()];
        #[cfg(feature = "etcd")]
        if let crate::storage::Location::Etcd(e) = &self.log {
            a.extend(["--etcd".into(), e.endpoints.join(",").into(), "--etcd-prefix".into(), e.prefix.clone().into()]);
        }
        a
    }
}

/// A diagnostic line for the runner's log (its stderr is `runner.log`).
fn say(process: u64, what: impl std::fmt::Display) {
    eprintln!("fencelog runner [process {process}, pid {}]: {what}", std::process::id());
}

/// The runner's whole life; returns its exit code.
pub fn runner_main(site: &Site, process: u64) -> i32 {
    runner_main_from(site, process, None)
}

/// [`runner_main`] of a runner forked from its caller, `from` the state of the
/// caller's ledger (see [`Ledger::hand_over`]): the log is opened from it, not
/// replayed — unless it does not follow the log, which is then replayed.
fn runner_main_from(site: &Site, process: u64, from: Option<crate::ledger::HandedOver>) -> i32 {
    // The gate starts up on the other core while this runner opens the log.
    let gate = Gate::start();
    let opened = match from {
        Some(h) => match Ledger::open_handed_over(&site.log, ledger_options(), h) {
            Err(e @ LedgerError::SnapshotNotInLog(_)) => {
                say(process, format!("the state handed over cannot be resumed ({e}); the log is replayed"));
                site.open()
            }
            opened => opened,
        },
        None => site.open(),
    };
    let ledger = match opened {
        Ok(l) => l,
        Err(e) => {
            say(process, format!("cannot open the log: {e}"));
            return 1;
        }
    };
    let ahead = Ahead::read(&ledger, gate);
    run_process(site, &ledger, process, Given::default(), ahead, &mut StartNotice(false))
}

/// What a runner reads of itself and of its gate before it knows its process:
/// its own identity and the gate's start time, which its `started` record names.
/// A spare reads them while it waits, off the path of its run's answer (some
/// twenty reads of `/proc` and `statx`es).
pub(super) struct Ahead {
    gate: std::io::Result<Gate>,
    me: Option<crate::model::Identity>,
    gate_start_ticks: Option<u64>,
}

impl Ahead {
    pub(super) fn read(ledger: &Ledger, gate: std::io::Result<Gate>) -> Ahead {
        // The gate is this runner's child, not yet waited for: its pid is not
        // reused, and its start time stays the one read here.
        let gate_start_ticks = gate.as_ref().ok().and_then(|g| identity::start_ticks(g.pid));
        Ahead { gate, me: identity::probe(std::process::id(), ledger.writer_id()), gate_start_ticks }
    }
}

/// What a spare runner is given, or makes, before its run: none of it for a
/// fresh runner.
#[derive(Default)]
pub(super) struct Given {
    /// The environment for the command (the spare's assignment); `None`: this
    /// runner's own.
    env: Option<Environment>,
    /// The command's new `stdout` and `stderr` files, made ahead (see
    /// [`capture::Prepared`]); `None`: they are made once the start is on record.
    outputs: Option<[std::fs::File; 2]>,
}

/// A runner's life once its log is open: `given` is what it was given or made
/// ahead; `ahead` holds the gate started for it (closed, the command never
/// started, on every way out before the start is on record); `notice` is told
/// once the start is settled.
fn run_process(
    site: &Site,
    ledger: &Ledger,
    process: u64,
    given: Given,
    ahead: Ahead,
    notice: &mut StartNotice,
) -> i32 {
    let dir = site.dir.as_path();
    let (p, secrets, gate) = match start_on_record(dir, ledger, process, given.env.as_ref(), ahead, notice) {
        Ok(started) => started,
        Err(code) => return code,
    };
    let exit = run_started(dir, ledger, process, &p, given, secrets, gate);
    record_exit(site, ledger, process, exit);
    0
}

/// Everything before the command runs, in this order: the process is found not
/// yet started, the environment this runner was given is the one recorded, the
/// executable is the file the request named, and this runner's `started` record
/// lands. Returns the process, its `--env` values and the gate to open; or the
/// runner's exit code, nothing started (the gate is closed as it is dropped).
fn start_on_record(
    dir: &Path,
    ledger: &Ledger,
    process: u64,
    env: Option<&Environment>,
    ahead: Ahead,
    notice: &mut StartNotice,
) -> Result<(Process, Vec<Secret>, Gate), i32> {
    let p = unstarted_process(ledger, process, notice)?;
    let secrets = recorded_secrets(dir, process, &p, env)?;
    unchanged_exe(ledger, process, &p, notice)?;
    let gate = record_start(ledger, process, ahead, notice)?;
    Ok((p, secrets, gate))
}

/// The process as the log has it now, if no runner has started (or ended) it;
/// else the runner's exit code: 2 if the log has no such process, 1 if it cannot
/// be read, [`EXIT_ALREADY_STARTED`] (the start settled) if it was taken.
fn unstarted_process(ledger: &Ledger, process: u64, notice: &mut StartNotice) -> Result<Process, i32> {
    let p = match ledger.refresh_with(|p| p.processes().get(&process).cloned()) {
        Ok(Some(p)) => p,
        Ok(None) => {
            say(process, "no such process in the log");
            return Err(2);
        }
        Err(e) => {
            say(process, format!("cannot read the log: {e}"));
            return Err(1);
        }
    };
    if p.started.is_some() || p.ended.is_some() {
        notice.settled();
        say(process, format!("already {}; nothing started", p.status().as_str()));
        return Err(EXIT_ALREADY_STARTED);
    }
    Ok(p)
}

/// The command's `--env` values from `env` (`None`: this runner's own
/// environment), each checked against its recorded digest; exit code 2 if one
/// differs.
fn recorded_secrets(dir: &Path, process: u64, p: &Process, env: Option<&Environment>) -> Result<Vec<Secret>, i32> {
    // The environment this runner was given must be the one recorded (by digest).
    let value_of = |name: &str| match env {
        Some(env) => env.get(std::ffi::OsStr::new(name)).cloned(),
        None => std::env::var_os(name),
    };
    let key = if p.command.env.is_empty() { None } else { super::secrets::env_key(dir).ok() };
    // The `--env` values: checked against their digests, and taken out of the
    // output before the exit record names it.
    let mut secrets = Vec::with_capacity(p.command.env.len());
    for e in &p.command.env {
        let value = value_of(&e.name).map(|v| std::os::unix::ffi::OsStrExt::as_bytes(v.as_os_str()).to_vec());
        match value {
            Some(v) if super::secrets::env_digest_matches(key.as_ref(), &v, &e.value_blake3) => {
                secrets.push(Secret { name: e.name.clone(), value: v });
            }
            _ => {
                say(
                    process,
                    format!("environment variable {} differs from the recorded digest; nothing started", e.name),
                );
                return Err(2);
            }
        }
    }
    Ok(secrets)
}

/// Is the executable still the file the request named (by fingerprint)? If not,
/// the process is recorded as never run (`EXE_CHANGED`): exit code 1.
fn unchanged_exe(ledger: &Ledger, process: u64, p: &Process, notice: &mut StartNotice) -> Result<(), i32> {
    match super::command::file_fingerprint(Path::new(&p.command.exe)) {
        Ok(f) if f == p.command.exe_fingerprint => Ok(()),
        found => {
            let detail = format!(
                "{} is no longer the file the request named (recorded {}, found {})",
                p.command.exe,
                p.command.exe_fingerprint,
                found.unwrap_or_else(|e| e.to_string())
            );
            end_unstarted(ledger, process, EndCode::ExeChanged, &detail);
            notice.settled();
            Err(1)
        }
    }
}

/// Append `ProcessStarted`, naming this runner and the gate (its pid and start
/// time, which the command keeps). Returns the gate, to be opened; or the
/// runner's exit code, nothing started: [`EXIT_ALREADY_STARTED`] if another start
/// (or an end) is on record first, 1 otherwise.
fn record_start(ledger: &Ledger, process: u64, ahead: Ahead, notice: &mut StartNotice) -> Result<Gate, i32> {
    let Ahead { gate, me, gate_start_ticks } = ahead;
    let Some(me) = me else {
        say(process, "cannot read this runner's identity from /proc; nothing started");
        return Err(1);
    };
    let gate = match gate {
        Ok(g) => g,
        Err(e) => {
            end_unstarted(ledger, process, EndCode::SpawnFailed, &format!("cannot start the command: {e}"));
            notice.settled();
            return Err(1);
        }
    };
    let pid = gate.pid;
    let Some(command_start_ticks) = gate_start_ticks else {
        say(process, "the gate process vanished before the start was recorded; nothing started");
        return Err(1);
    };
    let r = ledger.submit(None, |_, now_ms, writer| {
        Ok(Txn::new(
            now_ms,
            writer,
            vec![Event::ProcessStarted { process, runner: me.clone(), command_pid: pid, command_start_ticks }],
        ))
    });
    match r {
        Ok(_) => notice.settled(),
        Err(LedgerError::Refused(r @ (Refusal::AlreadyStarted { .. } | Refusal::AlreadyTerminal { .. }))) => {
            notice.settled();
            say(process, format!("{r}; nothing started"));
            return Err(EXIT_ALREADY_STARTED);
        }
        Err(e) => {
            say(process, format!("the start was not recorded ({e}); nothing started"));
            return Err(1);
        }
    }
    Ok(gate)
}

/// The command's run, its start on record: the gate becomes the command (with
/// `given.env`, or this runner's own environment), its output is captured (to
/// `given.outputs`, or to files made now), its timeout
/// enforced, and what it left in its group stopped. Returns how it ended, for
/// the terminal record.
fn run_started(
    dir: &Path,
    ledger: &Ledger,
    process: u64,
    p: &Process,
    given: Given,
    secrets: Vec<Secret>,
    gate: Gate,
) -> Exit {
    let Given { env, outputs } = given;
    let pid = gate.pid;
    // Started on record: the gate becomes the command. If the exec fails, the gate
    // says why on the command's stderr and exits 127, as a shell would: the command
    // never ran, and that is its recorded end.
    let env = env.unwrap_or_else(|| std::env::vars_os().collect());
    let (mut child, [out_pipe, err_pipe], exec_status) = gate.open(&gate_spec(&p.command, &env));
    let t0 = Instant::now();
    let made = match outputs {
        Some([out, err]) => Ok([Some(out), Some(err)]),
        None => open_outputs(dir, process),
    };
    let [out_file, err_file] = match made {
        Ok(o) => o,
        Err(e) => {
            // Started on record: the command must still run and end on record; its
            // output is discarded rather than the run lost.
            say(process, format!("cannot create output files ({e}); output is counted but not kept"));
            [None, None]
        }
    };
    let max = p.output_bytes_max;
    let stdout = Capturer::start(out_pipe, out_file, max);
    let stderr = Capturer::start(err_pipe, err_file, max);
    if let Some(e) = exec_failure(exec_status) {
        say(process, format!("started on record, but the executable could not be executed: {e}"));
    }
    let (status, timed_out) = wait_with_timeout(&mut child, p.timeout_ms, pid);
    let duration_ms = t0.elapsed().as_millis() as u64;
    // A cancel is recorded before its signal is sent: one on record when the
    // command ended is what ended it.
    let cancelled =
        ledger.refresh_with(|x| x.processes().get(&process).is_some_and(|x| x.cancel_requested_seq.is_some()));
    // The process is its whole group: what the command left running is stopped
    // before its end (and its leases' end) is recorded.
    let leftovers = stop_group(pid, TERM_TO_KILL_GRACE_MS);
    if leftovers > 0 {
        say(process, format!("stopped {leftovers} process(es) the command left in its group"));
    }
    let drain_until = Instant::now() + Duration::from_millis(OUTPUT_DRAIN_MS);
    let (mut stdout, mut stderr) = (stdout.finish(drain_until), stderr.finish(drain_until));
    if let Some(r) = super::secrets::Redactor::new(secrets) {
        redact_capture(dir, process, super::Stream::Stdout, &mut stdout, &r, max);
        redact_capture(dir, process, super::Stream::Stderr, &mut stderr, &r, max);
    }
    Exit {
        exit_code: status.and_then(|s| s.code()),
        signal: status.and_then(|s| s.signal()),
        timed_out,
        cancelled: cancelled.unwrap_or(false),
        duration_ms,
        stdout,
        stderr,
    }
}

/// Record that a process never ran (`code`): only while no runner has started it.
fn end_unstarted(ledger: &Ledger, process: u64, code: EndCode, detail: &str) {
    say(process, detail);
    let end = ProcessEnd::never_ran(code, detail.chars().take(1000).collect::<String>());
    if let Err(e) = ledger.submit(None, |_, now_ms, writer| {
        Ok(Txn::new(now_ms, writer, vec![Event::ProcessEnded { process, end: end.clone() }]))
    }) {
        say(process, format!("cannot record {}: {e}", code.as_str()));
    }
}

/// Append the terminal record, retrying (reopening the log) on failure: it is the
/// only evidence of how the command ended.
fn record_exit(site: &Site, first: &Ledger, process: u64, exit: Exit) {
    record_exit_attempts(site, first, process, exit);
    tell_caller_settled();
    // Off the answer's path (the caller reads the exit from the log, and was
    // just told to look): a runner that replayed a long tail at open leaves a
    // snapshot, so that the next runner's open (and the next CLI's) does not.
    if let Err(e) = first.snapshot_if_tail_exceeds(TAIL_RECORDS_SNAPSHOT_MIN) {
        say(process, format!("no snapshot written: {e}"));
    }
}

fn record_exit_attempts(site: &Site, first: &Ledger, process: u64, exit: Exit) {
    let mut reopened;
    let mut ledger = first;
    for attempt in 1..=TERMINAL_APPEND_ATTEMPTS_MAX {
        let r = ledger.submit(None, |_, now_ms, writer| {
            Ok(Txn::new(now_ms, writer, vec![Event::ProcessEnded { process, end: ProcessEnd::Exited(exit.clone()) }]))
        });
        match r {
            Ok(_) => return,
            Err(LedgerError::Refused(r)) => {
                // Ended already (a recovery that judged this runner gone): the first
                // outcome stands.
                say(process, format!("exit not recorded: {r}"));
                return;
            }
            Err(e) => {
                say(process, format!("cannot record the exit (attempt {attempt}): {e}"));
                std::thread::sleep(Duration::from_millis(100 * u64::from(attempt.min(10))));
                match site.open() {
                    Ok(l) => {
                        reopened = l;
                        ledger = &reopened;
                    }
                    Err(e) => say(process, format!("cannot reopen the log: {e}")),
                }
            }
        }
    }
    say(process, "giving up: the exit is not on record; recovery will say completed_unknown");
}

fn pipe_cloexec() -> std::io::Result<(OwnedFd, OwnedFd)> {
    crate::sys::fd::pipe_cloexec()
}

/// The environment a command runs with, name → value.
pub type Environment = std::collections::BTreeMap<std::ffi::OsString, std::ffi::OsString>;

fn null_onto(fd: libc::c_int, flags: libc::c_int) -> bool {
    crate::sys::fd::null_onto(fd, flags)
}
