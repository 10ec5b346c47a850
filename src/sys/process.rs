//! Processes: signals, waiting for children, `posix_spawn`, and a gate's exec.

use std::ffi::CStr;

/// `kill(pid, signal)`: a negative `pid` names a process group; signal 0 sends
/// nothing and only asks whether the target exists (and may be signalled).
pub fn kill(pid: libc::pid_t, signal: libc::c_int) -> std::io::Result<()> {
    // SAFETY: kill(2) takes numbers only; no memory is shared.
    if unsafe { libc::kill(pid, signal) } == 0 { Ok(()) } else { Err(std::io::Error::last_os_error()) }
}

/// One `waitpid(pid, flags)` of a child of ours: its raw status once it has
/// ended, `None` if it has not (`WNOHANG`); `Interrupted` is the caller's to retry.
pub fn waitpid(pid: libc::pid_t, flags: libc::c_int) -> std::io::Result<Option<libc::c_int>> {
    let mut raw = 0;
    // SAFETY: waits for a child of ours, into a local.
    match unsafe { libc::waitpid(pid, &mut raw, flags) } {
        r if r > 0 => Ok(Some(raw)),
        0 => Ok(None),
        _ => Err(std::io::Error::last_os_error()),
    }
}

/// `pidfd_open(pid)`: a descriptor of process `pid` that `poll` reports readable
/// once the process has ended (Linux ≥ 5.3; `ENOSYS` before).
pub fn pidfd_open(pid: u32) -> std::io::Result<std::os::fd::OwnedFd> {
    use std::os::fd::FromRawFd;
    // SAFETY: the system call takes numbers only.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::pid_t, 0) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: a new descriptor (close-on-exec), owned by no one else.
    Ok(unsafe { std::os::fd::OwnedFd::from_raw_fd(fd as i32) })
}

/// Become the command (a gate's last act): SIGPIPE and glibc's two internal
/// signals back to their defaults, `chdir(cwd)`, `execvpe(exe, argv, env)`.
/// Returns only if that failed, with why.
pub fn exec_command(cwd: &CStr, exe: &CStr, argv: &[&CStr], env: &[&CStr]) -> std::io::Error {
    let ptrs = |v: &[&CStr]| v.iter().map(|s| s.as_ptr()).chain([std::ptr::null()]).collect::<Vec<_>>();
    let (argv_p, env_p) = (ptrs(argv), ptrs(env));
    // SAFETY: SIGPIPE back to its default for the command (this process, a Rust
    // program, ignores it); chdir(2) and execvpe(3) with NUL-terminated strings and
    // null-terminated arrays that live across the calls.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
        // glibc's posix_spawn leaves its two internal signals (32, 33) ignored in
        // the child, and glibc refuses to touch them through sigaction(3): back to
        // their defaults by the system call, with an all-zero (SIG_DFL, no flags,
        // empty mask) kernel sigaction, as any command started from a shell has
        // them. (glibc's numbers: gated to glibc on Linux.)
        #[cfg(all(target_os = "linux", target_env = "gnu"))]
        for sig in [32, 33] {
            let dfl = [0u64; 4];
            let (sig, sigset_bytes): (libc::c_long, libc::c_long) = (sig, 8);
            libc::syscall(
                libc::SYS_rt_sigaction,
                sig,
                dfl.as_ptr(),
                std::ptr::null_mut::<libc::c_void>(),
                sigset_bytes,
            );
        }
        if libc::chdir(cwd.as_ptr()) != 0 {
            std::io::Error::last_os_error()
        } else {
            // execvpe, not execve: the path has a slash, so no search, but a file
            // without a `#!` line is run by /bin/sh, as execvp (and so a command
            // started any other way) runs it.
            libc::execvpe(exe.as_ptr(), argv_p.as_ptr(), env_p.as_ptr());
            std::io::Error::last_os_error()
        }
    }
}

/// A descriptor a child is started with: ours as its `fd`, or `/dev/null` opened
/// with `flags`.
pub enum FdAction {
    Dup(std::os::fd::RawFd, libc::c_int),
    Null(libc::c_int, libc::c_int),
}

/// Where a child is started: a session of its own, with `/` as its directory (a
/// runner), or a process group of its own in ours (a gate).
pub enum Placement {
    OwnSession,
    OwnGroup,
}

/// `posix_spawn` (the caller is not copied: glibc spawns with `CLONE_VFORK`) of
/// `exe` with `argv` and `envp`, its descriptors set by `fds` (applied in order;
/// every other descriptor closed), an empty signal mask and the default SIGPIPE,
/// placed as `placement` says. Returns its pid.
pub fn posix_spawn_with(
    exe: &std::ffi::CStr,
    argv: &[std::ffi::CString],
    envp: &[std::ffi::CString],
    fds: &[FdAction],
    placement: Placement,
) -> std::io::Result<u32> {
    let ptrs = |v: &[std::ffi::CString]| {
        v.iter().map(|s| s.as_ptr().cast_mut()).chain([std::ptr::null_mut()]).collect::<Vec<_>>()
    };
    let (argv_p, envp_p) = (ptrs(argv), ptrs(envp));
    let check = |rc: libc::c_int| if rc == 0 { Ok(()) } else { Err(std::io::Error::from_raw_os_error(rc)) };
    let mut pid: libc::pid_t = 0;
    // SAFETY: the attribute and file-action objects are initialised before use and
    // destroyed after; every pointer passed (paths, argv, envp, their arrays) lives
    // until posix_spawn returns; the arrays end with a null pointer; the
    // descriptors named are open (ours) until then.
    unsafe {
        let mut fa: libc::posix_spawn_file_actions_t = std::mem::zeroed();
        let mut attr: libc::posix_spawnattr_t = std::mem::zeroed();
        check(libc::posix_spawn_file_actions_init(&mut fa))?;
        if let Err(e) = check(libc::posix_spawnattr_init(&mut attr)) {
            libc::posix_spawn_file_actions_destroy(&mut fa);
            return Err(e);
        }
        let mut empty: libc::sigset_t = std::mem::zeroed();
        let mut pipe_only: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut empty);
        libc::sigemptyset(&mut pipe_only);
        libc::sigaddset(&mut pipe_only, libc::SIGPIPE);
        let place = match placement {
            Placement::OwnSession => libc::POSIX_SPAWN_SETSID as i32,
            Placement::OwnGroup => libc::POSIX_SPAWN_SETPGROUP,
        };
        let flags = place | libc::POSIX_SPAWN_SETSIGMASK | libc::POSIX_SPAWN_SETSIGDEF;
        let mut spawned = check(libc::posix_spawnattr_setflags(&mut attr, flags as libc::c_short))
            .and_then(|_| check(libc::posix_spawnattr_setpgroup(&mut attr, 0)))
            .and_then(|_| check(libc::posix_spawnattr_setsigmask(&mut attr, &empty)))
            .and_then(|_| check(libc::posix_spawnattr_setsigdefault(&mut attr, &pipe_only)));
        let mut highest = 2;
        for a in fds {
            spawned = spawned.and_then(|_| match *a {
                FdAction::Dup(fd, to) => {
                    highest = highest.max(to);
                    check(libc::posix_spawn_file_actions_adddup2(&mut fa, fd, to))
                }
                FdAction::Null(to, flags) => {
                    highest = highest.max(to);
                    check(libc::posix_spawn_file_actions_addopen(&mut fa, to, c"/dev/null".as_ptr(), flags, 0))
                }
            });
        }
        if let Placement::OwnSession = placement {
            spawned = spawned.and_then(|_| check(libc::posix_spawn_file_actions_addchdir_np(&mut fa, c"/".as_ptr())));
        }
        let spawned =
            spawned.and_then(|_| check(libc::posix_spawn_file_actions_addclosefrom_np(&mut fa, highest + 1))).and_then(
                |_| check(libc::posix_spawn(&mut pid, exe.as_ptr(), &fa, &attr, argv_p.as_ptr(), envp_p.as_ptr())),
            );
        libc::posix_spawn_file_actions_destroy(&mut fa);
        libc::posix_spawnattr_destroy(&mut attr);
        spawned?;
    }
    Ok(pid as u32)
}

/// Is this process running one thread only? (`/proc/self/stat`'s thread count;
/// false when it cannot be read.) Only a process that is can go on running
/// ordinary code in a `fork`ed child: another thread could hold a lock (the
/// allocator's, a logger's) that the child would then wait on for ever.
pub fn single_threaded() -> bool {
    let Ok(stat) = std::fs::read("/proc/self/stat") else { return false };
    // After the command name (which may hold anything, up to the last ')'):
    // state, then 16 more fields, then the thread count (field 20).
    let Some(end) = stat.iter().rposition(|&b| b == b')') else { return false };
    let threads = stat[end + 1..].split(|&b| b == b' ').filter(|f| !f.is_empty()).nth(17);
    threads == Some(b"1")
}

/// `fork` a child placed as `placement` says (a process group of its own; or a
/// session of its own with `/` as its directory, as [`posix_spawn_with`] places
/// a runner), its descriptors set by `fds` (applied in order; every other
/// descriptor closed, as `posix_spawn_with` does), an empty signal mask, and run
/// `child` in it; the child ends with what `child` returns (`_exit`: nothing of
/// the parent's is flushed or run again), or 127 if it panics or cannot be
/// placed. Returns the child's pid to the parent.
///
/// The child is a copy of this process, not a new program: no `exec` of a large
/// binary, no dynamic loading, no allocator start. Callers must be
/// [`single_threaded`] (checked: `Unsupported` otherwise, for the caller to
/// fall back to [`posix_spawn_with`]).
pub fn fork_into(placement: Placement, fds: &[FdAction], child: impl FnOnce() -> i32) -> std::io::Result<u32> {
    if !single_threaded() {
        return Err(std::io::Error::new(std::io::ErrorKind::Unsupported, "more than one thread: fork is not safe"));
    }
    // SAFETY: fork(2) in a process with one thread (checked above, and no
    // thread is started between: this thread is the only one to start any), so
    // the child's copy of every lock is free; it leaves only by `_exit`.
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        return Err(std::io::Error::last_os_error());
    }
    if pid > 0 {
        if let Placement::OwnGroup = placement {
            // Also from this side, so the group exists when fork returns here
            // (whichever of the two runs first); EACCES/ESRCH once the child
            // has done it or exec'd: nothing to do.
            // SAFETY: setpgid(2) of our own child; numbers only.
            unsafe { libc::setpgid(pid, pid) };
        }
        return Ok(pid as u32);
    }
    let code = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| match child_placed(&placement, fds) {
        // What posix_spawn would have refused: nothing is run.
        Err(e) => {
            let _ = std::io::Write::write_all(&mut std::io::stderr(), format!("fencelog: fork: {e}\n").as_bytes());
            127
        }
        Ok(()) => child(),
    }))
    .unwrap_or(127);
    // SAFETY: _exit(2) ends the child without running the parent's exit
    // handlers or flushing the buffers it copied.
    unsafe { libc::_exit(code) }
}

/// [`fork_into`] a process group of its own (a runner's gate).
pub fn fork_into_own_group(fds: &[FdAction], child: impl FnOnce() -> i32) -> std::io::Result<u32> {
    fork_into(Placement::OwnGroup, fds, child)
}

/// Make this process's environment exactly `vars`. Only in a process with one
/// thread (a forked child, before it runs anything that reads the environment
/// on another thread): `setenv(3)` is not safe beside a reader.
pub fn replace_environment(vars: &std::collections::BTreeMap<std::ffi::OsString, std::ffi::OsString>) {
    debug_assert!(single_threaded());
    let stale: Vec<std::ffi::OsString> =
        std::env::vars_os().map(|(k, _)| k).filter(|k| !vars.contains_key(k)).collect();
    // SAFETY: one thread (the caller's contract): no other reads or writes the
    // environment meanwhile.
    unsafe {
        for k in stale {
            std::env::remove_var(k);
        }
        for (k, v) in vars {
            std::env::set_var(k, v);
        }
    }
}

/// In a forked child: placed as `placement` says, an empty signal mask, the
/// descriptors `fds` say, every other one closed. An error where `posix_spawn`
/// would have failed the spawn.
fn child_placed(placement: &Placement, fds: &[FdAction]) -> std::io::Result<()> {
    let check = |rc: libc::c_int| if rc < 0 { Err(std::io::Error::last_os_error()) } else { Ok(()) };
    // SAFETY: system calls on numbers, on locals and on a constant path, in the
    // child only.
    unsafe {
        match placement {
            Placement::OwnGroup => check(libc::setpgid(0, 0))?,
            Placement::OwnSession => {
                check(libc::setsid())?;
                check(libc::chdir(c"/".as_ptr()))?;
            }
        }
        let mut empty: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut empty);
        check(libc::sigprocmask(libc::SIG_SETMASK, &empty, std::ptr::null_mut()))?;
        let mut highest = 2;
        for a in fds {
            match *a {
                FdAction::Dup(fd, to) => {
                    highest = highest.max(to);
                    if fd == to {
                        // dup2 onto itself keeps close-on-exec: clear it, as
                        // posix_spawn does.
                        check(libc::fcntl(to, libc::F_SETFD, 0))?;
                    } else {
                        check(libc::dup2(fd, to))?;
                    }
                }
                FdAction::Null(to, flags) => {
                    highest = highest.max(to);
                    let null = libc::open(c"/dev/null".as_ptr(), flags | libc::O_CLOEXEC);
                    check(null)?;
                    check(libc::dup2(null, to))?;
                    libc::close(null);
                }
            }
        }
        let first = (highest + 1) as libc::c_uint;
        if libc::syscall(libc::SYS_close_range, first, libc::c_uint::MAX, 0) != 0 {
            // Before Linux 5.9: one by one, up to the descriptor limit (or
            // 65,536 where it is not known).
            let limit = match libc::sysconf(libc::_SC_OPEN_MAX) {
                n if n > 0 => n.min(1 << 20),
                _ => 1 << 16,
            } as libc::c_int;
            for fd in first as libc::c_int..limit {
                libc::close(fd);
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Proves: a process with a second thread is never forked into running code
    /// (another thread could hold a lock the child would wait on for ever): the
    /// caller is told `Unsupported` and falls back to `posix_spawn`; the child's
    /// code never runs. (The forked path itself is every runner's gate: proved by
    /// the supervisor's tests, through real runners.)
    #[test]
    fn a_process_with_a_second_thread_is_not_forked() {
        let (stop_tx, stop_rx) = std::sync::mpsc::channel::<()>();
        let other = std::thread::spawn(move || stop_rx.recv());
        assert!(!single_threaded(), "a second thread is running");
        // Forked, this would return the child's pid here (and the child exit 0).
        let e = fork_into_own_group(&[], || 0).expect_err("not forked");
        assert_eq!(e.kind(), std::io::ErrorKind::Unsupported);
        drop(stop_tx);
        other.join().unwrap().unwrap_err();
    }
}
