//! Starting a runner: in a session of its own, holding nothing of its caller's,
//! its stdout a pipe whose end of file tells the caller that the outcome is
//! settled.

use std::fs::{File, OpenOptions};
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

use super::capture::private_process_dir;
use super::{Environment, Site, null_onto, pipe_cloexec};
use crate::ledger::Ledger;

/// The environment a runner started now gives its command: this process's own,
/// with `env` (the command's `--env` values, which never enter the log) added, and
/// without the variables that would send a fencelog started by the command to a
/// daemon rather than to a directory of its choosing.
pub(super) fn runner_environment(env: &[(String, String)]) -> Environment {
    use std::ffi::{OsStr, OsString};
    let mut vars: Environment = std::env::vars_os().collect();
    vars.extend(env.iter().map(|(k, v)| (OsString::from(k), OsString::from(v))));
    for k in ["FENCELOG_SERVER", "FENCELOG_TOKEN_FILE", "FENCELOG_DIR"] {
        vars.remove(OsStr::new(k));
    }
    vars
}

/// `DIR/processes/ID/runner.log`, opened to append (0600, never through a link).
pub(super) fn open_runner_log(d: &Path) -> std::io::Result<File> {
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
/// runner has also torn itself down. `caller`: the ledger this process recorded
/// the intent with, whose state a forked runner takes over (see
/// [`fork_fresh_runners`]).
pub fn start_runner(
    site: &Site,
    process: u64,
    self_exe: &Path,
    env: &[(String, String)],
    caller: Option<&Ledger>,
) -> std::io::Result<OwnedFd> {
    use std::ffi::OsString;
    let log = open_runner_log(&private_process_dir(&site.dir, process)?)?;
    // Not with `--env` values: the forked runner would keep its caller's command
    // line (and whatever it says) for the command's whole life, where an exec'd
    // one shows `__runner --dir D --process N`.
    if FORK_RUNNERS.load(std::sync::atomic::Ordering::Relaxed) && env.is_empty() {
        match fork_runner(site, process, &log, runner_environment(env), caller) {
            // Not to be forked (a second thread, a large caller, a variable
            // setenv cannot set): exec'd, as below.
            Err(e) if e.kind() == std::io::ErrorKind::Unsupported => {}
            forked => return forked,
        }
    }
    let mut args: Vec<OsString> = vec!["__runner".into()];
    args.extend(site.args());
    args.extend(["--process".into(), process.to_string().into()]);
    let args: Vec<&std::ffi::OsStr> = args.iter().map(OsString::as_os_str).collect();
    let (settled, _) = spawn_runner(self_exe, &args, None, Some(&log), runner_environment(env))?;
    Ok(settled)
}

/// The most memory of its own (resident, not shared with files) a caller may
/// hold and still fork a runner.
pub const FORK_RUNNER_RESIDENT_BYTES_MAX: u64 = 64 << 20;

/// Set by [`fork_fresh_runners`].
static FORK_RUNNERS: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// From now on, start each fresh runner as a `fork` of this process rather than
/// an `exec` of `fencelog __runner` — when this process has one thread at that
/// moment (checked; else the runner is exec'd as before). The child is placed
/// as the exec'd runner would be (a session of its own, `/`, stdin `/dev/null`,
/// stdout the settled pipe, stderr `runner.log`, every other descriptor closed,
/// nothing blocked, the same environment) and runs the runner, opening the log
/// anew (its own descriptors: `flock` locks belong to open files, which a fork
/// shares) from the caller's state, handed over (see
/// [`Ledger::hand_over`]): not replayed. It
/// spares the runner an `exec` of fencelog, its dynamic loading and page faults:
/// about 2 ms on a small machine, on every `fencelog run`.
///
/// Only for the `fencelog` program itself, whose one command starts at most one
/// runner and which installs no signal handler of its own (a forked runner
/// keeps its parent's, where an exec'd one starts from the defaults): a program
/// embedding the library keeps the exec. Even then the runner is exec'd for a
/// command with `--env` values (see [`start_runner`]), from a caller holding
/// more than [`FORK_RUNNER_RESIDENT_BYTES_MAX`] (the runner would keep that
/// memory for its command's whole life), or
/// with an environment variable `setenv` cannot set (a name holding `=`).
#[cfg_attr(not(feature = "internals"), allow(dead_code))]
pub fn fork_fresh_runners() {
    FORK_RUNNERS.store(true, std::sync::atomic::Ordering::Relaxed);
}

/// [`start_runner`]'s fork (see [`fork_fresh_runners`]): `Unsupported` if this
/// process has a second thread.
fn fork_runner(
    site: &Site,
    process: u64,
    log: &File,
    vars: Environment,
    caller: Option<&Ledger>,
) -> std::io::Result<OwnedFd> {
    use crate::sys::process::{FdAction, Placement, fork_into};
    let unsupported = |why: &str| Err(std::io::Error::new(std::io::ErrorKind::Unsupported, why.to_string()));
    if crate::sys::memory::private_resident_bytes().is_none_or(|b| b > FORK_RUNNER_RESIDENT_BYTES_MAX) {
        return unsupported("a caller this large is not copied");
    }
    if vars.keys().any(|k| k.is_empty() || k.as_encoded_bytes().contains(&b'=')) {
        return unsupported("an environment variable setenv cannot set");
    }
    // What an exec'd runner is given (`--dir` with the absolute directory, and
    // `--etcd …` for a log in etcd): its log is found from there after the
    // `chdir("/")`, whatever path the caller opened it by.
    let site = match &site.log {
        crate::storage::Location::Dir(_) => Site::dir(&site.dir),
        #[allow(unreachable_patterns)]
        _ => site.clone(),
    };
    let (settled_r, settled_w) = pipe_cloexec()?;
    let fds =
        [FdAction::Null(0, libc::O_RDONLY), FdAction::Dup(settled_w.as_raw_fd(), 1), FdAction::Dup(log.as_raw_fd(), 2)];
    let pid = fork_into(Placement::OwnSession, &fds, move || {
        crate::sys::process::replace_environment(&vars);
        // The caller's copy, ours alone now: taken out, not copied.
        super::runner_main_from(&site, process, caller.and_then(Ledger::hand_over))
    })? as libc::pid_t;
    drop(settled_w);
    reap_on_a_thread(pid);
    Ok(settled_r)
}

/// Reap our child `pid` on a thread of its own (EINTR is retried).
fn reap_on_a_thread(pid: libc::pid_t) {
    std::thread::spawn(move || {
        while matches!(crate::sys::process::waitpid(pid, 0), Err(e) if e.kind() == std::io::ErrorKind::Interrupted) {}
    });
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
pub(super) fn spawn_runner(
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
    reap_on_a_thread(pid);
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
pub(super) fn tell_caller_settled() {
    if !null_onto(1, libc::O_WRONLY) {
        // Close stdout: the pipe is let go all the same.
        crate::sys::fd::close(1);
    }
}
