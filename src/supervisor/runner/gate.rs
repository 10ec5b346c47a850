//! The gate a runner starts its command through: a process started ahead of the
//! command (a fork of the runner, or `fencelog __gate`), which becomes it only
//! once the runner's `started` record has landed, and exits having run nothing if
//! it never does.

use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::process::ExitStatusExt;
use std::process::ExitStatus;

use super::{Environment, null_onto, pipe_cloexec};

/// Most bytes of a gate's spec (the command's path, directory, arguments and
/// environment).
const GATE_SPEC_BYTES_MAX: usize = 16 << 20;
/// The room a gate reads its spec into first (a pipe's usual capacity).
const GATE_SPEC_READ_BYTES_FIRST: usize = 64 << 10;

/// A process started ahead of its command, to become it (see [`gate_main`]): a
/// fork of the runner, or `fencelog __gate`, in a process group of its own, its stdout and stderr the write
/// ends of our capture pipes. Dropped unopened, it is closed (end of file on its
/// stdin: it exits having run nothing) and reaped.
pub(crate) struct Gate {
    pub(super) pid: u32,
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

    pub(super) fn pid(&self) -> u32 {
        self.pid
    }

    pub(super) fn try_wait(&mut self) -> std::io::Result<Option<ExitStatus>> {
        self.wait_flags(libc::WNOHANG)
    }

    pub(super) fn wait(&mut self) -> std::io::Result<ExitStatus> {
        self.wait_flags(0).map(|s| s.expect("a blocking wait returns a status"))
    }
}

impl Gate {
    /// Start one. A runner with one thread (every runner starts its gate first
    /// thing, before its log is open) forks it: the child runs [`gate_main`], a
    /// copy of a runner that has done nothing yet. Otherwise (a runner that has
    /// started a thread) it is started from this very binary (`/proc/self/exe`: the file this runner was started
    /// from, even if it was replaced since) as `fencelog __gate`. Either way it
    /// has the same descriptors (its pipes on 0–3, nothing else), group and
    /// signal mask; the fork spares the `exec` of this binary (its loading, its
    /// page faults, its allocator's start), which competed with the runner for
    /// the two cores of a small machine.
    pub(super) fn start() -> std::io::Result<Gate> {
        use crate::sys::process::{FdAction, Placement, fork_into_own_group, posix_spawn_with};
        let (spec_r, spec_w) = pipe_cloexec()?;
        let (out_r, out_w) = pipe_cloexec()?;
        let (err_r, err_w) = pipe_cloexec()?;
        let (status_r, status_w) = pipe_cloexec()?;
        let fds = [
            FdAction::Dup(spec_r.as_raw_fd(), 0),
            FdAction::Dup(out_w.as_raw_fd(), 1),
            FdAction::Dup(err_w.as_raw_fd(), 2),
            FdAction::Dup(status_w.as_raw_fd(), GATE_STATUS_FD),
        ];
        let pid = match fork_into_own_group(&fds, gate_main) {
            Err(e) if e.kind() == std::io::ErrorKind::Unsupported => {
                let argv = [c"fencelog".to_owned(), c"__gate".to_owned()];
                posix_spawn_with(c"/proc/self/exe", &argv, &[], &fds, Placement::OwnGroup)?
            }
            forked => forked?,
        };
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
    pub(super) fn open(mut self, spec: &[u8]) -> (Spawned, [File; 2], File) {
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
pub(super) fn exec_failure(mut status: File) -> Option<std::io::Error> {
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
pub(super) fn gate_spec(command: &crate::model::CommandSpec, env: &Environment) -> Vec<u8> {
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

/// A gate's life (a runner's fork, or `fencelog __gate`; see [`Gate`]): wait for
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
    // Room for a usual spec at once: the runner writes it in one piece, so it is
    // read in one `read` (and the end of file in a second), not in a dozen
    // growing ones.
    let mut spec = Vec::with_capacity(GATE_SPEC_READ_BYTES_FIRST);
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
