//! Spare runners: runners started ahead of need, their log already open, each
//! waiting on a channel for the process to run. Both ends of that channel are
//! here: the caller's ([`SpareRunner`]) and the spare's ([`spare_main`]).

use std::io::{Read, Write};
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::Path;
use std::time::{Duration, Instant};

use crate::model::{EndCode, Event, ProcessEnd, Txn};

use super::capture::{Prepared, private_process_dir};
use super::start::{open_runner_log, runner_environment, spawn_runner, start_runner};
use super::{Ahead, Environment, Gate, Given, Site, end_unstarted, null_onto, run_process};

/// Most bytes of a spare runner's assignment (the process id, then the command's
/// whole environment as `NAME=VALUE\0` entries).
const ASSIGNMENT_BYTES_MAX: usize = 4 << 20;
/// The byte a spare runner sends on its channel once its log is open.
const SPARE_READY: u8 = b'R';

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
            if let Err(e) = start_runner(&site, process, &self_exe, &env, None) {
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

/// A spare runner's life (`fencelog __runner --dir D --spare`, see [`SpareRunner`]):
/// open the log, say so (`R` on its channel, its stdin), keep up with the log
/// while it waits for its run, then run it as [`runner_main`](super::runner_main)
/// would, saying `S` once the start is settled. End of file on the channel before
/// a run means the caller is gone: nothing to do.
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
    let ahead = Ahead::read(&ledger, gate);
    // Without them (a directory it cannot write, say), the run makes its files
    // as a fresh runner's does; why is said in its runner.log.
    let (prepared, unprepared) = match Prepared::make(dir) {
        Ok(p) => (Some(p), None),
        Err(e) => (None, Some(e)),
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
            Err(_) => {
                if let Some(p) = prepared {
                    p.discard(dir);
                }
                return 1;
            }
        }
    }
    let (process, env) = match read_assignment(&mut *chan) {
        Ok(assigned) => assigned,
        Err(code) => {
            if let Some(p) = prepared {
                p.discard(dir);
            }
            return code;
        }
    };
    let mut notice = StartNotice(true);
    // From here on its diagnostics go where a fresh runner's go: runner.log. A
    // runner that cannot have one is a runner that could not be started.
    let (log, outputs) = match prepared.map(|p| p.adopt(process)) {
        Some(Ok((log, outputs))) => (Ok(log), Some(outputs)),
        adopted => {
            if let Some(Err(p)) = adopted {
                p.discard(dir);
            }
            (private_process_dir(dir, process).and_then(|d| open_runner_log(&d)), None)
        }
    };
    match log {
        Ok(log) => {
            crate::sys::fd::dup_onto(log.as_raw_fd(), 2);
            if let Some(e) = unprepared {
                super::say(process, format!("no files were made ahead for the run: {e}"));
            }
        }
        Err(e) => {
            end_unstarted(&ledger, process, EndCode::SpawnFailed, &format!("cannot start a runner: {e}"));
            notice.settled();
            return 1;
        }
    }
    run_process(site, &ledger, process, Given { env: Some(env), outputs }, ahead, &mut notice)
}

/// A spare runner's assignment from its channel: the process and its command's
/// environment; or the runner's exit code: 0 if the channel ends before one
/// begins (the caller is gone before it had anything for this runner), 2 if it
/// ends within one (a caller that died while it was sending) or what came is
/// not an assignment.
fn read_assignment(chan: &mut impl Read) -> Result<(u64, Environment), i32> {
    let mut header = [0u8; 16];
    chan.read_exact(&mut header).map_err(|_| 0)?;
    let process = u64::from_le_bytes(header[..8].try_into().expect("8 bytes"));
    let len = u64::from_le_bytes(header[8..].try_into().expect("8 bytes"));
    if len > ASSIGNMENT_BYTES_MAX as u64 {
        return Err(2);
    }
    let mut entries = vec![0u8; len as usize];
    chan.read_exact(&mut entries).map_err(|_| 2)?;
    Ok((process, parse_environment(&entries).ok_or(2)?))
}

/// How often a waiting spare runner catches up with the log.
const SPARE_CATCH_UP_MS: libc::c_int = 100;
/// The byte a spare runner sends once its start is settled: recorded by it, found
/// taken by another, or recorded as never run.
const SPARE_SETTLED: u8 = b'S';

/// A spare runner's word to its caller that the start is settled (see
/// [`SPARE_SETTLED`]): after it, the caller's watch ends and no fresh runner is
/// started for the process. A fresh runner has no one to tell (`StartNotice(false)`).
pub(super) struct StartNotice(pub(super) bool);

impl StartNotice {
    pub(super) fn settled(&mut self) {
        if std::mem::take(&mut self.0) {
            crate::sys::fd::write_once(0, &[SPARE_SETTLED]);
            // Nothing of the caller's is held while the command runs.
            null_onto(0, libc::O_RDONLY);
        }
    }
}
