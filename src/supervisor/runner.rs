//! The independent runner, and the gate it starts commands through.
//!
//! The runner (`fencelog __runner --dir D --process ID`) is started by whoever
//! recorded the spawn intent, in a session of its own, so it outlives its caller.
//! It starts the command *behind a gate*: first a gate process (`fencelog
//! __gate`, started with `posix_spawn` in a process group of its own, its stdout
//! and stderr the runner's capture pipes), which waits for the command on its
//! stdin. Meanwhile the runner appends `ProcessStarted` with the gate's pid and
//! start time. Only if that record lands does the runner send the command; the
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

use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::ExitStatus;
use std::sync::{Arc, Mutex, mpsc};
use std::time::{Duration, Instant};

use crate::ledger::{Ledger, LedgerError, LedgerOptions, identity};
use crate::model::{Capture, EndCode, Event, Exit, OUTPUT_TAIL_BYTES_MAX, ProcessEnd, Refusal, Txn};

use super::process_dir;

/// Exit code of a runner that found its process already started (or ended) by
/// another: it started nothing.
pub const EXIT_ALREADY_STARTED: i32 = 75;
/// Between TERM and KILL of a process group that is being stopped.
pub const TERM_TO_KILL_GRACE_MS: u64 = 1_000;
/// After the command exits, how long its output pipes may stay open (held by
/// processes it left behind) before the runner stops reading them.
pub const OUTPUT_DRAIN_MS: u64 = 2_000;
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
    // The gate starts up on the other core while this runner opens the log.
    let gate = Gate::start();
    let ledger = match site.open() {
        Ok(l) => l,
        Err(e) => {
            say(process, format!("cannot open the log: {e}"));
            return 1;
        }
    };
    run_process(site, &ledger, process, None, gate, &mut StartNotice(false))
}

/// A spare runner's life (`fencelog __runner --dir D --spare`, see [`SpareRunner`]):
/// open the log, say so (`R` on its channel, its stdin), keep up with the log
/// while it waits for its run, then run it as [`runner_main`] would, saying `S`
/// once the start is settled. End of file on the channel before a run means the
/// caller is gone: nothing to do.
pub fn spare_main(site: &Site) -> i32 {
    let dir = site.dir.as_path();
    let gate = Gate::start();
    let ledger = match site.open() {
        Ok(l) => l,
        // Its stderr is /dev/null until it has a process: the caller's watch of
        // this channel sees it end, and starts a fresh runner, which says why in the
        // process's runner.log.
        Err(_) => return 1,
    };
    // Fd 0 is the channel this runner was started with (StartNotice replaces it).
    let mut chan = crate::sys::fd::inherited(0);
    let _ = chan.write_all(&[SPARE_READY]);
    // While it waits, it keeps up with the log: a run's catch-up is then only what
    // was appended since the last look.
    loop {
        match crate::sys::fd::poll_readable(0, SPARE_CATCH_UP_MS) {
            Ok(false) => {
                let _ = ledger.refresh_with(|_| ());
            }
            Ok(true) => break,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(_) => return 1,
        }
    }
    let mut header = [0u8; 16];
    if chan.read_exact(&mut header).is_err() {
        return 0; // the caller is gone before it had anything for this runner
    }
    let process = u64::from_le_bytes(header[..8].try_into().expect("8 bytes"));
    let len = u64::from_le_bytes(header[8..].try_into().expect("8 bytes"));
    if len > ASSIGNMENT_BYTES_MAX as u64 {
        return 2;
    }
    let mut entries = vec![0u8; len as usize];
    if chan.read_exact(&mut entries).is_err() {
        return 2; // a caller that died while it was sending
    }
    let Some(env) = parse_environment(&entries) else {
        return 2;
    };
    let mut notice = StartNotice(true);
    // From here on its diagnostics go where a fresh runner's go: runner.log. A
    // runner that cannot have one is a runner that could not be started.
    match private_process_dir(dir, process).and_then(|d| open_runner_log(&d)) {
        Ok(log) => {
            crate::sys::fd::dup_onto(log.as_raw_fd(), 2);
        }
        Err(e) => {
            end_unstarted(&ledger, process, EndCode::SpawnFailed, &format!("cannot start a runner: {e}"));
            notice.settled();
            return 1;
        }
    }
    run_process(site, &ledger, process, Some(env), gate, &mut notice)
}

/// How often a waiting spare runner catches up with the log.
const SPARE_CATCH_UP_MS: libc::c_int = 100;
/// The byte a spare runner sends once its start is settled: recorded by it, found
/// taken by another, or recorded as never run.
const SPARE_SETTLED: u8 = b'S';

/// A spare runner's word to its caller that the start is settled (see
/// [`SPARE_SETTLED`]): after it, the caller's watch ends and no fresh runner is
/// started for the process. A fresh runner has no one to tell (`StartNotice(false)`).
struct StartNotice(bool);

impl StartNotice {
    fn settled(&mut self) {
        if std::mem::take(&mut self.0) {
            crate::sys::fd::write_once(0, &[SPARE_SETTLED]);
            // Nothing of the caller's is held while the command runs.
            null_onto(0, libc::O_RDONLY);
        }
    }
}

/// A runner's life once its log is open: `env` is the environment for the
/// command (a spare's assignment), or `None` for this runner's own; `gate` is the
/// gate started for it (closed, the command never started, on every way out
/// before the start is on record); `notice` is told once the start is settled.
fn run_process(
    site: &Site,
    ledger: &Ledger,
    process: u64,
    env: Option<Environment>,
    gate: std::io::Result<Gate>,
    notice: &mut StartNotice,
) -> i32 {
    let dir = site.dir.as_path();
    let p = match ledger.refresh_with(|p| p.processes.get(&process).cloned()) {
        Ok(Some(p)) => p,
        Ok(None) => {
            say(process, "no such process in the log");
            return 2;
        }
        Err(e) => {
            say(process, format!("cannot read the log: {e}"));
            return 1;
        }
    };
    if p.started.is_some() || p.ended.is_some() {
        notice.settled();
        say(process, format!("already {}; nothing started", p.status().as_str()));
        return EXIT_ALREADY_STARTED;
    }
    // The environment this runner was given must be the one recorded (by digest).
    let value_of = |name: &str| match &env {
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
                secrets.push(super::secrets::Secret { name: e.name.clone(), value: v });
            }
            _ => {
                say(
                    process,
                    format!("environment variable {} differs from the recorded digest; nothing started", e.name),
                );
                return 2;
            }
        }
    }
    match super::command::file_fingerprint(Path::new(&p.command.exe)) {
        Ok(f) if f == p.command.exe_fingerprint => {}
        found => {
            let detail = format!(
                "{} is no longer the file the request named (recorded {}, found {})",
                p.command.exe,
                p.command.exe_fingerprint,
                found.unwrap_or_else(|e| e.to_string())
            );
            end_unstarted(ledger, process, EndCode::ExeChanged, &detail);
            notice.settled();
            return 1;
        }
    }
    let Some(me) = identity::probe(std::process::id(), ledger.writer_id()) else {
        say(process, "cannot read this runner's identity from /proc; nothing started");
        return 1;
    };
    let gate = match gate {
        Ok(g) => g,
        Err(e) => {
            end_unstarted(ledger, process, EndCode::SpawnFailed, &format!("cannot start the command: {e}"));
            notice.settled();
            return 1;
        }
    };
    let pid = gate.pid;
    let Some(command_start_ticks) = identity::start_ticks(pid) else {
        say(process, "the gate process vanished before the start was recorded; nothing started");
        return 1;
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
            return EXIT_ALREADY_STARTED;
        }
        Err(e) => {
            say(process, format!("the start was not recorded ({e}); nothing started"));
            return 1;
        }
    }
    // Started on record: the gate becomes the command. If the exec fails, the gate
    // says why on the command's stderr and exits 127, as a shell would: the command
    // never ran, and that is its recorded end.
    let env = env.unwrap_or_else(|| std::env::vars_os().collect());
    let (mut child, [out_pipe, err_pipe], exec_status) = gate.open(&gate_spec(&p.command, &env));
    let t0 = Instant::now();
    let [out_file, err_file] = match open_outputs(dir, process) {
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
        ledger.refresh_with(|x| x.processes.get(&process).is_some_and(|x| x.cancel_requested_seq.is_some()));
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
    let exit = Exit {
        exit_code: status.and_then(|s| s.code()),
        signal: status.and_then(|s| s.signal()),
        timed_out,
        cancelled: cancelled.unwrap_or(false),
        duration_ms,
        stdout,
        stderr,
    };
    record_exit(site, ledger, process, exit);
    0
}

/// Take the command's `--env` values out of what is kept of `stream` — the output
/// file (rewritten, synced, renamed into place) and the tail — before the exit
/// record names them: the record then carries the redacted file's length and
/// digest. A file that cannot be redacted is removed (nothing kept, said so in
/// `runner.log`); its tail is redacted all the same.
fn redact_capture(
    dir: &Path,
    process: u64,
    stream: super::Stream,
    c: &mut crate::model::Capture,
    r: &super::secrets::Redactor,
    bytes_max: u64,
) {
    if c.bytes_kept > 0 {
        let cut = c.bytes_seen > c.bytes_kept;
        match r.redact_file(&super::output_path(dir, process, stream), cut, bytes_max) {
            Ok(Some(red)) => {
                (c.bytes_kept, c.kept_blake3) = (red.bytes, red.blake3);
                c.truncated |= red.truncated;
            }
            Ok(None) => {}
            // A secret must not outlive the command in the open: a kept file that
            // cannot be redacted is removed, and the record says nothing was kept.
            Err(e) => {
                let path = super::output_path(dir, process, stream);
                // Synced away before the record says nothing was kept: a removal
                // lost in a crash would bring the secret back.
                let removed = match std::fs::remove_file(&path) {
                    Err(rm) if rm.kind() != std::io::ErrorKind::NotFound => Err(rm),
                    _ => path.parent().map_or(Ok(()), |d| std::fs::File::open(d).and_then(|d| d.sync_all())),
                };
                match removed {
                    Ok(()) => {
                        say(process, format!("cannot redact the kept {}: {e}; removed it", stream.file_name()));
                        (c.bytes_kept, c.kept_blake3) = (0, *blake3::hash(b"").as_bytes());
                        c.truncated = c.bytes_seen > 0;
                    }
                    Err(rm) => {
                        say(process, format!("cannot redact the kept {}: {e}; nor remove it: {rm}", stream.file_name()))
                    }
                }
            }
        }
    }
    let (tail, _) = r.redact(&c.tail, c.bytes_seen > c.tail.len() as u64, false);
    // A marker can be longer than what it replaced: the tail stays within its bound.
    let skip = tail.len().saturating_sub(OUTPUT_TAIL_BYTES_MAX);
    c.tail = tail[skip..].to_vec();
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

/// Wait for the command; after `timeout_ms` (0: none) stop its process group:
/// TERM, then KILL after a grace. Returns the exit status (`None` if waiting
/// failed) and whether it timed out.
fn wait_with_timeout(child: &mut Spawned, timeout_ms: u64, pgid: u32) -> (Option<ExitStatus>, bool) {
    if timeout_ms == 0 {
        return (child.wait().ok(), false);
    }
    let deadline = Instant::now() + Duration::from_millis(timeout_ms);
    let poll = |child: &mut Spawned, until: Instant| -> Option<ExitStatus> {
        let mut nap = Duration::from_millis(1);
        loop {
            if let Ok(Some(s)) = child.try_wait() {
                return Some(s);
            }
            let now = Instant::now();
            if now >= until {
                return None;
            }
            std::thread::sleep(nap.min(until - now));
            nap = (nap * 2).min(Duration::from_millis(20));
        }
    };
    if let Some(s) = poll(child, deadline) {
        return (Some(s), false);
    }
    signal_group(pgid, libc::SIGTERM);
    if let Some(s) = poll(child, Instant::now() + Duration::from_millis(TERM_TO_KILL_GRACE_MS)) {
        return (Some(s), true); // the rest of the group: `stop_group`
    }
    signal_group(pgid, libc::SIGKILL);
    (child.wait().ok(), true)
}

/// Stop what is left of process group `pgid`: TERM, then KILL after `grace_ms`;
/// returns how many members there were.
pub fn stop_group(pgid: u32, grace_ms: u64) -> usize {
    if !group_exists(pgid) {
        return 0; // the common case, answered by one system call
    }
    let members = identity::process_group_members(pgid).len().max(1);
    let gone_by = |until: Instant| {
        while group_exists(pgid) {
            if Instant::now() >= until {
                return false;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        true
    };
    signal_group(pgid, libc::SIGTERM);
    if !gone_by(Instant::now() + Duration::from_millis(grace_ms)) {
        signal_group(pgid, libc::SIGKILL);
        gone_by(Instant::now() + Duration::from_millis(1_000));
    }
    members
}

/// Does process group `pgid` have a live member? `kill(-pgid, 0)` answers "no" in
/// one system call (the common case); a "yes" may be zombies only (reaped late by
/// whoever adopted them), so it is confirmed from `/proc`.
pub fn group_exists(pgid: u32) -> bool {
    // Signal 0 checks for existence and permission; nothing is sent.
    pgid > 1
        && crate::sys::process::kill(-(pgid as i32), 0).is_ok()
        && !identity::process_group_members(pgid).is_empty()
}

/// Send `signal` to process group `pgid`.
pub fn signal_group(pgid: u32, signal: i32) -> bool {
    // A negative pid signals a process group.
    pgid > 1 && crate::sys::process::kill(-(pgid as i32), signal).is_ok()
}

fn open_outputs(dir: &Path, process: u64) -> std::io::Result<[Option<File>; 2]> {
    let d = private_process_dir(dir, process)?;
    Ok([Some(new_private_file(&d, "stdout")?), Some(new_private_file(&d, "stderr")?)])
}

/// `DIR/processes/ID/`, created 0700 — or, if it exists, checked to be a real
/// directory (never a symbolic link) and made 0700.
fn private_process_dir(dir: &Path, process: u64) -> std::io::Result<std::path::PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    let parent = dir.join(super::PROCESS_DIR);
    let d = process_dir(dir, process);
    for p in [&parent, &d] {
        match std::fs::DirBuilder::new().mode(0o700).create(p) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                let m = std::fs::symlink_metadata(p)?;
                if !m.file_type().is_dir() {
                    return Err(std::io::Error::other(format!("{} is not a directory", p.display())));
                }
                std::fs::set_permissions(p, std::fs::Permissions::from_mode(0o700))?;
            }
            Err(e) => return Err(e),
        }
    }
    Ok(d)
}

/// A new file `name` in `d`, 0600, never through a symbolic link. Whatever has that
/// name already (output of a process of an earlier history that had this id, or
/// something planted) is renamed aside and kept, never followed or overwritten.
fn new_private_file(d: &Path, name: &str) -> std::io::Result<File> {
    let path = d.join(name);
    if std::fs::symlink_metadata(&path).is_ok() {
        let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default().as_nanos();
        std::fs::rename(&path, d.join(format!("{name}.set-aside-{nanos}")))?;
    }
    OpenOptions::new().write(true).create_new(true).mode(0o600).custom_flags(libc::O_NOFOLLOW).open(path)
}

struct CaptureState {
    capture: Capture,
    hasher: blake3::Hasher,
    tail: std::collections::VecDeque<u8>,
    /// The stream ended (end of file, or a read error): everything was read.
    eof: bool,
    /// What was kept is durable (synced by the reading thread).
    synced: bool,
    /// Set when the result was taken: nothing more is written or counted, so the
    /// record matches the file.
    stopped: bool,
}

/// Reads one output stream on its own thread: the first `max` bytes go to the
/// file (and the digest), every byte is counted, the last ones are kept as the tail.
struct Capturer {
    state: Arc<Mutex<CaptureState>>,
    done: mpsc::Receiver<()>,
    /// Another handle on the output file, to sync what was kept when the result is
    /// taken before the stream ended (the reading thread then never syncs it).
    file: Option<File>,
}

impl Capturer {
    fn start(mut pipe: impl Read + Send + 'static, mut file: Option<File>, max: u64) -> Capturer {
        let handle = file.as_ref().and_then(|f| f.try_clone().ok());
        let state = Arc::new(Mutex::new(CaptureState {
            capture: Capture::default(),
            hasher: blake3::Hasher::new(),
            tail: std::collections::VecDeque::with_capacity(OUTPUT_TAIL_BYTES_MAX),
            eof: false,
            synced: false,
            stopped: false,
        }));
        let (tx, done) = mpsc::channel();
        let shared = Arc::clone(&state);
        std::thread::spawn(move || {
            let mut buf = vec![0u8; 64 * 1024];
            loop {
                let n = match pipe.read(&mut buf) {
                    Ok(0) => break,
                    Ok(n) => n,
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                    Err(_) => break,
                };
                let chunk = &buf[..n];
                let mut s = shared.lock().expect("capture state");
                if s.stopped {
                    return;
                }
                let c = &mut s.capture;
                c.bytes_seen += n as u64;
                let room = max.saturating_sub(c.bytes_kept) as usize;
                let keep = &chunk[..room.min(n)];
                if keep.len() < n {
                    c.truncated = true;
                }
                if !keep.is_empty() {
                    let written = file.as_mut().is_some_and(|f| f.write_all(keep).is_ok());
                    if written {
                        s.capture.bytes_kept += keep.len() as u64;
                        s.hasher.update(keep);
                    } else {
                        s.capture.truncated = true;
                        file = None;
                    }
                }
                let tail = &mut s.tail;
                let from = n.saturating_sub(OUTPUT_TAIL_BYTES_MAX);
                tail.extend(&chunk[from..]);
                while tail.len() > OUTPUT_TAIL_BYTES_MAX {
                    tail.pop_front();
                }
            }
            // Durable before the exit record names its digest. A file with nothing
            // kept is not synced (a journal commit on the way to every answer):
            // the record says nothing was kept, and the output of an ended process
            // is read only as far as its record says (`read_output`), so an empty
            // file lost in a crash — or an older file of that name back in its
            // place — shows nothing.
            let kept = {
                let mut s = shared.lock().expect("capture state");
                s.eof = true;
                s.capture.bytes_kept
            };
            let synced = kept > 0 && file.is_some_and(|f| f.sync_all().is_ok());
            shared.lock().expect("capture state").synced = synced;
            let _ = tx.send(());
        });
        Capturer { state, done, file: handle }
    }

    /// What was captured, once the stream ended or `until` passed (then the part
    /// read so far, marked truncated: the rest was never read).
    fn finish(self, until: Instant) -> Capture {
        let _ = self.done.recv_timeout(until.saturating_duration_since(Instant::now()));
        let mut s = self.state.lock().expect("capture state");
        s.stopped = true;
        let mut c = s.capture.clone();
        if !s.eof {
            c.truncated = true;
        }
        c.kept_blake3 = *s.hasher.clone().finalize().as_bytes();
        c.tail = s.tail.iter().copied().collect();
        let synced = s.synced;
        drop(s);
        // What was kept and is not yet known durable is synced here, before the
        // exit record names its digest: the stream is still held open (by
        // something the command left outside its group) and the reading thread
        // stops without syncing, or its sync is under way or failed, or a write
        // failed and it let go of the file. Nothing more is written to the file
        // once `stopped` is set.
        if !synced
            && c.bytes_kept > 0
            && let Some(f) = &self.file
            && let Err(e) = f.sync_all()
        {
            eprintln!("fencelog runner: cannot sync the kept output ({e}); its exit record names it anyway");
        }
        c
    }
}

fn pipe_cloexec() -> std::io::Result<(OwnedFd, OwnedFd)> {
    crate::sys::fd::pipe_cloexec()
}

/// Most bytes of a gate's spec (the command's path, directory, arguments and
/// environment).
const GATE_SPEC_BYTES_MAX: usize = 16 << 20;

/// A process started ahead of its command, to become it: `fencelog __gate` (see
/// [`gate_main`]), in a process group of its own, its stdout and stderr the write
/// ends of our capture pipes. Dropped unopened, it is closed (end of file on its
/// stdin: it exits having run nothing) and reaped.
pub(crate) struct Gate {
    pid: u32,
    spec: Option<File>,
    status: Option<File>,
    outputs: Option<[File; 2]>,
}

/// A child process of ours, waited for by pid.
pub(crate) struct Spawned {
    pid: u32,
    status: Option<ExitStatus>,
}

impl Spawned {
    fn wait_flags(&mut self, flags: libc::c_int) -> std::io::Result<Option<ExitStatus>> {
        if let Some(s) = self.status {
            return Ok(Some(s));
        }
        loop {
            match crate::sys::process::waitpid(self.pid as libc::pid_t, flags) {
                Ok(Some(raw)) => {
                    self.status = Some(ExitStatus::from_raw(raw));
                    return Ok(self.status);
                }
                Ok(None) => return Ok(None),
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
    }

    fn try_wait(&mut self) -> std::io::Result<Option<ExitStatus>> {
        self.wait_flags(libc::WNOHANG)
    }

    fn wait(&mut self) -> std::io::Result<ExitStatus> {
        self.wait_flags(0).map(|s| s.expect("a blocking wait returns a status"))
    }
}

impl Gate {
    /// Start one from this very binary (`/proc/self/exe`: the file this runner
    /// was started from, even if it was replaced since).
    fn start() -> std::io::Result<Gate> {
        let (spec_r, spec_w) = pipe_cloexec()?;
        let (out_r, out_w) = pipe_cloexec()?;
        let (err_r, err_w) = pipe_cloexec()?;
        let (status_r, status_w) = pipe_cloexec()?;
        let argv = [c"fencelog".to_owned(), c"__gate".to_owned()];
        let pid = crate::sys::process::posix_spawn_with(
            c"/proc/self/exe",
            &argv,
            &[],
            &[
                crate::sys::process::FdAction::Dup(spec_r.as_raw_fd(), 0),
                crate::sys::process::FdAction::Dup(out_w.as_raw_fd(), 1),
                crate::sys::process::FdAction::Dup(err_w.as_raw_fd(), 2),
                crate::sys::process::FdAction::Dup(status_w.as_raw_fd(), GATE_STATUS_FD),
            ],
            crate::sys::process::Placement::OwnGroup,
        )?;
        Ok(Gate {
            pid,
            spec: Some(File::from(spec_w)),
            status: Some(File::from(status_r)),
            outputs: Some([File::from(out_r), File::from(err_r)]),
        })
    }

    /// Send the command (`spec`, from [`gate_spec`]): the gate `exec`s it. Returns
    /// the child, the read ends of its stdout and stderr, and the pipe that tells
    /// how the exec went (see [`exec_failure`]).
    fn open(mut self, spec: &[u8]) -> (Spawned, [File; 2], File) {
        let mut input = self.spec.take().expect("an unopened gate");
        // A gate that died cannot read it; its end is then what waiting records.
        let _ = input.write_all(spec);
        drop(input);
        let outputs = self.outputs.take().expect("an unopened gate");
        let status = self.status.take().expect("an unopened gate");
        (Spawned { pid: self.pid, status: None }, outputs, status)
    }
}

impl Drop for Gate {
    fn drop(&mut self) {
        if self.spec.take().is_some() {
            let _ = Spawned { pid: self.pid, status: None }.wait();
        }
    }
}

/// The exec's outcome, from a gate's status pipe: `None` once the command is
/// running (the pipe closed on exec), or why the exec failed.
fn exec_failure(mut status: File) -> Option<std::io::Error> {
    let mut errno = [0u8; 4];
    let mut got = 0;
    while got < errno.len() {
        match status.read(&mut errno[got..]) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(_) => break,
        }
    }
    (got == errno.len()).then(|| std::io::Error::from_raw_os_error(i32::from_ne_bytes(errno)))
}

/// The gate's descriptor for the exec's outcome (close-on-exec in the gate).
const GATE_STATUS_FD: libc::c_int = 3;

/// What a gate is sent: its length (8 bytes, little-endian), then `NUL`-ended
/// fields: the executable, the directory, the number of arguments (decimal), the
/// arguments (`argv[0]` first), then the environment as `NAME=VALUE`.
fn gate_spec(command: &crate::model::CommandSpec, env: &Environment) -> Vec<u8> {
    use std::os::unix::ffi::OsStrExt;
    let mut fields: Vec<&[u8]> = vec![command.exe.as_bytes(), command.cwd.as_bytes()];
    let argc = command.argv.len().to_string();
    fields.push(argc.as_bytes());
    fields.extend(command.argv.iter().map(|a| a.as_bytes()));
    let entries: Vec<Vec<u8>> = env
        .iter()
        .map(|(k, v)| {
            let mut e = k.as_bytes().to_vec();
            e.push(b'=');
            e.extend_from_slice(v.as_bytes());
            e
        })
        .collect();
    fields.extend(entries.iter().map(|e| e.as_slice()));
    let body_len: usize = fields.iter().map(|f| f.len() + 1).sum();
    let mut spec = Vec::with_capacity(8 + body_len);
    spec.extend_from_slice(&(body_len as u64).to_le_bytes());
    for f in fields {
        spec.extend_from_slice(f);
        spec.push(0);
    }
    spec
}

/// A gate's life (`fencelog __gate`, started by a runner; see [`Gate`]): wait for
/// the command on stdin, then become it. End of file first (the runner closed
/// the gate, or died): exit 0, having run nothing. If the command cannot be
/// executed, say why on stderr (the command's) and on the status pipe, and exit
/// 127. Returns only if the exec did not happen.
pub fn gate_main() -> i32 {
    use std::ffi::{CStr, OsStr};
    use std::os::unix::ffi::OsStrExt;
    // The status descriptor this gate was started with: a successful exec closes
    // it, which is how the runner learns of it.
    crate::sys::fd::set_cloexec(GATE_STATUS_FD);
    let mut spec = Vec::new();
    // Fd 0 is the runner's pipe (replaced below).
    let mut input = crate::sys::fd::inherited(0);
    let read = (&mut *input).take(GATE_SPEC_BYTES_MAX as u64 + 8).read_to_end(&mut spec);
    if read.is_err() || spec.is_empty() {
        return 0; // closed: nothing runs
    }
    null_onto(0, libc::O_RDONLY);
    let fail = |what: &[u8], e: std::io::Error| -> i32 {
        let errno = e.raw_os_error().unwrap_or(libc::EIO).to_ne_bytes();
        crate::sys::fd::write_once(GATE_STATUS_FD, &errno);
        let message = format!("fencelog: {} could not be executed: {e}\n", String::from_utf8_lossy(what));
        let _ = std::io::stderr().write_all(message.as_bytes());
        127
    };
    let body = match spec.split_first_chunk::<8>() {
        Some((len, body)) if u64::from_le_bytes(*len) == body.len() as u64 && body.last() == Some(&0) => body,
        _ => return fail(b"the command", std::io::Error::from_raw_os_error(libc::EINVAL)),
    };
    let fields: Vec<&CStr> =
        body.split_inclusive(|&b| b == 0).map(|f| CStr::from_bytes_with_nul(f).expect("one NUL, at the end")).collect();
    let argc = fields.get(2).and_then(|n| n.to_str().ok()?.parse::<usize>().ok());
    let (exe, cwd, argv, env) = match argc {
        Some(argc) if argc >= 1 && fields.len() >= 3 + argc => {
            (fields[0], fields[1], &fields[3..3 + argc], &fields[3 + argc..])
        }
        _ => return fail(b"the command", std::io::Error::from_raw_os_error(libc::EINVAL)),
    };
    let e = crate::sys::process::exec_command(cwd, exe, argv, env);
    fail(OsStr::from_bytes(exe.to_bytes()).as_bytes(), e)
}

/// The environment a command runs with, name → value.
pub type Environment = std::collections::BTreeMap<std::ffi::OsString, std::ffi::OsString>;

/// Most bytes of a spare runner's assignment (the process id, then the command's
/// whole environment as `NAME=VALUE\0` entries).
const ASSIGNMENT_BYTES_MAX: usize = 4 << 20;
/// The byte a spare runner sends on its channel once its log is open.
const SPARE_READY: u8 = b'R';

/// The environment a runner started now gives its command: this process's own,
/// with `env` (the command's `--env` values, which never enter the log) added, and
/// without the variables that would send a fencelog started by the command to a
/// daemon rather than to a directory of its choosing.
fn runner_environment(env: &[(String, String)]) -> Environment {
    use std::ffi::{OsStr, OsString};
    let mut vars: Environment = std::env::vars_os().collect();
    vars.extend(env.iter().map(|(k, v)| (OsString::from(k), OsString::from(v))));
    for k in ["FENCELOG_SERVER", "FENCELOG_TOKEN_FILE", "FENCELOG_DIR"] {
        vars.remove(OsStr::new(k));
    }
    vars
}

/// `DIR/processes/ID/runner.log`, opened to append (0600, never through a link).
fn open_runner_log(d: &Path) -> std::io::Result<File> {
    use std::os::unix::fs::PermissionsExt;
    let log = OpenOptions::new()
        .append(true)
        .create(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW)
        .open(d.join("runner.log"))?;
    log.set_permissions(std::fs::Permissions::from_mode(0o600))?;
    Ok(log)
}

/// Start a runner for `process` in a session of its own, its stderr appended to
/// the process's `runner.log`, with `env` added to its environment (the command's
/// `--env` values, which never enter the log). It is reaped on a thread of ours.
/// Returns the read end of a pipe that is the runner's stdout: it reports end of
/// file the moment the runner has settled the process's outcome (see
/// [`tell_caller_settled`]) or is gone, whichever comes first — so a quick
/// command's answer is read as soon as its exit record is durable, not once the
/// runner has also torn itself down.
pub fn start_runner(site: &Site, process: u64, self_exe: &Path, env: &[(String, String)]) -> std::io::Result<OwnedFd> {
    use std::ffi::OsString;
    let log = open_runner_log(&private_process_dir(&site.dir, process)?)?;
    let mut args: Vec<OsString> = vec!["__runner".into()];
    args.extend(site.args());
    args.extend(["--process".into(), process.to_string().into()]);
    let args: Vec<&std::ffi::OsStr> = args.iter().map(OsString::as_os_str).collect();
    let (settled, _) = spawn_runner(self_exe, &args, None, Some(&log), runner_environment(env))?;
    Ok(settled)
}

/// A runner started ahead of need (`__runner --dir D --spare`): in its own session
/// like any runner, its log already open, waiting on a channel (a socket that is
/// its stdin) for the process to run. Handing it a process
/// ([`SpareRunner::assign`]) takes the runner's start and the log's replay off the
/// path of that process's answer; from then on it is a runner like any other, and
/// appends the process's `started` and terminal records itself. Dropped without an
/// assignment, it sees end of file and exits having done nothing; so does it when
/// the process holding it exits.
pub struct SpareRunner {
    chan: std::os::unix::net::UnixStream,
    settled: OwnedFd,
    pid: u32,
    ready: bool,
    site: Site,
    self_exe: std::path::PathBuf,
}

/// How long sending a spare runner its run may block (a spare that is stopped,
/// say): past it the run gets a fresh runner.
const SPARE_SEND_TIMEOUT_MS: u64 = 2_000;
/// How long a handed-over run waits for its spare to say the start is settled
/// (the spare may still be opening a long log) before a fresh runner is started
/// beside it (runners race safely: one start lands).
const SPARE_SETTLE_WAIT_MS: u64 = 30_000;

impl SpareRunner {
    /// Start one for the log in `dir`, from the fencelog binary `self_exe`.
    pub fn start(site: &Site, self_exe: &Path) -> std::io::Result<SpareRunner> {
        use std::ffi::OsString;
        // Close-on-exec on both ends; the runner's end becomes its fd 0 only.
        let (chan, theirs) = std::os::unix::net::UnixStream::pair()?;
        let mut args: Vec<OsString> = vec!["__runner".into()];
        args.extend(site.args());
        args.push("--spare".into());
        let args: Vec<&std::ffi::OsStr> = args.iter().map(OsString::as_os_str).collect();
        let (settled, pid) = spawn_runner(self_exe, &args, Some(theirs.as_raw_fd()), None, runner_environment(&[]))?;
        Ok(SpareRunner { chan, settled, pid, ready: false, site: site.clone(), self_exe: self_exe.into() })
    }

    /// Its process id.
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// Wait up to `timeout` for it to have its log open; true once it has. (A run
    /// never needs this: a run handed to a spare still opening waits in the
    /// channel. A benchmark does, to measure a run that finds one ready.)
    pub fn wait_ready(&mut self, timeout: Duration) -> bool {
        if !self.ready {
            let mut b = [0u8];
            let _ = self.chan.set_read_timeout(Some(timeout.max(Duration::from_millis(1))));
            self.ready = matches!(self.chan.read(&mut b), Ok(1) if b[0] == SPARE_READY);
        }
        self.ready
    }

    /// Hand it `process`, whose command runs with this process's environment and
    /// `env` added (as a fresh runner's would). Returns what [`start_runner`]
    /// returns; an error if the spare is gone or does not take it within
    /// [`SPARE_SEND_TIMEOUT_MS`] (start a fresh runner then). Once handed over, a
    /// thread of ours watches the channel until the spare says the start is settled;
    /// if it ends first (the spare died holding the run) or stays silent for
    /// [`SPARE_SETTLE_WAIT_MS`], that thread starts a fresh runner (or records
    /// `SPAWN_FAILED` if it cannot), whether or not anyone still waits for the run.
    pub fn assign(self, process: u64, env: &[(String, String)]) -> std::io::Result<OwnedFd> {
        use std::os::unix::ffi::OsStrExt;
        let mut entries = Vec::new();
        for (k, v) in runner_environment(env) {
            entries.extend_from_slice(k.as_bytes());
            entries.push(b'=');
            entries.extend_from_slice(v.as_bytes());
            entries.push(0);
        }
        if entries.len() > ASSIGNMENT_BYTES_MAX {
            return Err(std::io::Error::other(format!(
                "the environment is {} bytes, more than a spare runner takes ({ASSIGNMENT_BYTES_MAX})",
                entries.len()
            )));
        }
        let mut message = Vec::with_capacity(16 + entries.len());
        message.extend_from_slice(&process.to_le_bytes());
        message.extend_from_slice(&(entries.len() as u64).to_le_bytes());
        message.extend_from_slice(&entries);
        self.chan.set_write_timeout(Some(Duration::from_millis(SPARE_SEND_TIMEOUT_MS)))?;
        let mut sent = 0;
        while sent < message.len() {
            // A spare that is gone is an error here, never a SIGPIPE for the caller.
            match crate::sys::fd::send_nosignal(self.chan.as_raw_fd(), &message[sent..]) {
                Ok(n) if n > 0 => sent += n,
                Ok(_) => return Err(std::io::ErrorKind::WriteZero.into()),
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        let SpareRunner { chan, settled, site, self_exe, .. } = self;
        let env = env.to_vec();
        let watch = move || {
            if settled_by_spare(chan) {
                return;
            }
            // Runners race safely: if the spare did record the start after all, this
            // one finds it and starts nothing.
            if let Err(e) = start_runner(&site, process, &self_exe, &env) {
                // As a caller that cannot start a runner says so: unless a start
                // landed meanwhile, the process never ran.
                let detail = format!("cannot start a runner: {e}");
                let end = ProcessEnd::never_ran(EndCode::SpawnFailed, detail);
                if let Ok(ledger) = site.open() {
                    let _ = ledger.submit(None, |_, t, w| {
                        Ok(Txn::new(t, w, vec![Event::ProcessEnded { process, end: end.clone() }]))
                    });
                }
            }
        };
        // Without the watch (no thread to be had), the spare still has the run.
        let _ = std::thread::Builder::new().name("fencelog-spare-watch".into()).spawn(watch);
        Ok(settled)
    }
}

/// Read a spare runner's channel until it says the start is settled (true), or
/// it ends, fails, or stays silent for [`SPARE_SETTLE_WAIT_MS`] (false). Reads
/// everything the spare sent before our end closes.
fn settled_by_spare(mut chan: std::os::unix::net::UnixStream) -> bool {
    let deadline = Instant::now() + Duration::from_millis(SPARE_SETTLE_WAIT_MS);
    let mut b = [0u8];
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() || chan.set_read_timeout(Some(left)).is_err() {
            return false;
        }
        match chan.read(&mut b) {
            Ok(1) if b[0] == SPARE_SETTLED => return true,
            Ok(1) => {} // SPARE_READY
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            _ => return false,
        }
    }
}

/// The environment of a spare runner's assignment (`NAME=VALUE\0` entries), if
/// well formed.
fn parse_environment(entries: &[u8]) -> Option<Environment> {
    use std::os::unix::ffi::OsStrExt;
    if entries.last().is_some_and(|&b| b != 0) {
        return None;
    }
    let mut env = Environment::new();
    for e in entries.split(|&b| b == 0).filter(|e| !e.is_empty()) {
        let eq = e.iter().position(|&b| b == b'=')?;
        env.insert(std::ffi::OsStr::from_bytes(&e[..eq]).into(), std::ffi::OsStr::from_bytes(&e[eq + 1..]).into());
    }
    Some(env)
}

/// Start `self_exe args…` as a runner: `posix_spawn` (the caller is not copied:
/// glibc spawns with `CLONE_VFORK`), asking for a new session
/// (`POSIX_SPAWN_SETSID`), `/` as its directory, `stdin` (or `/dev/null`) as fd 0,
/// a new pipe's write end as fd 1, `stderr` (or `/dev/null`) as fd 2, the default
/// SIGPIPE and an empty signal mask, and every descriptor from 3 up closed: a
/// runner holds nothing of its caller's (a pipe a shell waits on, a daemon's
/// sockets) for the command's lifetime. (Our copies of the pipe's ends are
/// close-on-exec, so no other process this caller starts meanwhile inherits
/// them.) Returns the pipe's read end and the runner's pid; the runner is reaped
/// on a thread of ours.
fn spawn_runner(
    self_exe: &Path,
    args: &[&std::ffi::OsStr],
    stdin: Option<std::os::fd::RawFd>,
    stderr: Option<&File>,
    vars: Environment,
) -> std::io::Result<(OwnedFd, u32)> {
    use std::ffi::{CString, OsStr};
    use std::os::unix::ffi::{OsStrExt, OsStringExt};
    let c = |s: &OsStr| CString::new(s.as_bytes()).map_err(|_| std::io::Error::other("a NUL byte in an argument"));
    let argv: Vec<CString> =
        std::iter::once(self_exe.as_os_str()).chain(args.iter().copied()).map(c).collect::<std::io::Result<_>>()?;
    let envp: Vec<CString> = vars
        .into_iter()
        .map(|(k, v)| {
            let mut kv = k.into_vec();
            kv.push(b'=');
            kv.extend(v.into_vec());
            CString::new(kv).map_err(|_| std::io::Error::other("a NUL byte in the environment"))
        })
        .collect::<std::io::Result<_>>()?;
    let (settled_r, settled_w) = pipe_cloexec()?;
    let pid = crate::sys::process::posix_spawn_with(
        &argv[0],
        &argv,
        &envp,
        &[
            stdin.map_or(crate::sys::process::FdAction::Null(0, libc::O_RDONLY), |fd| {
                crate::sys::process::FdAction::Dup(fd, 0)
            }),
            crate::sys::process::FdAction::Dup(settled_w.as_raw_fd(), 1),
            stderr.map_or(crate::sys::process::FdAction::Null(2, libc::O_WRONLY), |f| {
                crate::sys::process::FdAction::Dup(f.as_raw_fd(), 2)
            }),
        ],
        crate::sys::process::Placement::OwnSession,
    )? as libc::pid_t;
    // The runner holds the only write end now: its end of file is the runner's word.
    drop(settled_w);
    std::thread::spawn(move || {
        // Reaps our own child; EINTR is retried.
        while matches!(crate::sys::process::waitpid(pid, 0), Err(e) if e.kind() == std::io::ErrorKind::Interrupted) {}
    });
    Ok((settled_r, pid as u32))
}

/// Sleep up to `nap`, or less if the runner behind `settled` (the read end of its
/// stdout, from [`start_runner`]) settles the outcome or exits first; true if it has.
pub fn nap_until_settled(settled: &OwnedFd, nap: std::time::Duration) -> bool {
    // End of file (POLLHUP), or bytes a runner never writes: either way, look now.
    crate::sys::fd::ppoll_ready(settled.as_raw_fd(), nap)
}

/// Tell the caller that started this runner that the outcome is settled (on
/// record, or given up on): its stdout — the pipe the caller waits on — becomes
/// `/dev/null`, and the caller reads the log now rather than once this process has
/// exited. Nothing is written: a caller that has stopped waiting is not disturbed.
fn tell_caller_settled() {
    if !null_onto(1, libc::O_WRONLY) {
        // Close stdout: the pipe is let go all the same.
        crate::sys::fd::close(1);
    }
}

fn null_onto(fd: libc::c_int, flags: libc::c_int) -> bool {
    crate::sys::fd::null_onto(fd, flags)
}
