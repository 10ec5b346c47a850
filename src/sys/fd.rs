//! Descriptors: the ones a process was started with, pipes, poll, and writes that
//! never raise SIGPIPE.

use std::fs::File;
use std::mem::ManuallyDrop;
use std::os::fd::{FromRawFd, OwnedFd, RawFd};

/// Descriptor `fd`, which this process was started with and which stays open for
/// its whole life, as a `File` that never closes it.
pub fn inherited(fd: RawFd) -> ManuallyDrop<File> {
    // SAFETY: the caller names a descriptor the process was started with (its
    // stdin channel); ManuallyDrop keeps the File from closing it, so no other
    // owner of the number is disturbed (it is replaced later with `null_onto`).
    ManuallyDrop::new(unsafe { File::from_raw_fd(fd) })
}

/// Is `fd` readable within `timeout_ms` (`poll`)? An interrupted wait is an
/// `Interrupted` error, for the caller to retry.
pub fn poll_readable(fd: RawFd, timeout_ms: libc::c_int) -> std::io::Result<bool> {
    let mut fds = libc::pollfd { fd, events: libc::POLLIN, revents: 0 };
    // SAFETY: one valid pollfd.
    match unsafe { libc::poll(&mut fds, 1, timeout_ms) } {
        0 => Ok(false),
        n if n > 0 => Ok(true),
        _ => Err(std::io::Error::last_os_error()),
    }
}

/// Wait up to `nap` for `fd` to be readable, hung up or in error (`ppoll`, no
/// signal mask); true if it is.
pub fn ppoll_ready(fd: RawFd, nap: std::time::Duration) -> bool {
    let mut fds = libc::pollfd { fd, events: libc::POLLIN, revents: 0 };
    let ts = libc::timespec { tv_sec: nap.as_secs() as libc::time_t, tv_nsec: nap.subsec_nanos() as libc::c_long };
    // SAFETY: one valid pollfd, a valid timespec, no signal mask.
    let n = unsafe { libc::ppoll(&mut fds, 1, &ts, std::ptr::null()) };
    n > 0 && fds.revents & (libc::POLLIN | libc::POLLHUP | libc::POLLERR) != 0
}

/// `dup2(from, to)`: `to` becomes a copy of `from` (what was at `to` is let go).
pub fn dup_onto(from: RawFd, to: RawFd) -> bool {
    // SAFETY: dup2(2) of descriptors the caller owns; no memory is shared.
    unsafe { libc::dup2(from, to) >= 0 }
}

/// One `write(2)` of `bytes` to `fd`, its result ignored (a word to a peer that
/// may be gone: nothing to do if it is).
pub fn write_once(fd: RawFd, bytes: &[u8]) {
    // SAFETY: write(2) from a live buffer of the length given.
    unsafe { libc::write(fd, bytes.as_ptr().cast(), bytes.len()) };
}

/// `send(2)` with `MSG_NOSIGNAL`: a peer that is gone is an error, never a SIGPIPE.
pub fn send_nosignal(fd: RawFd, bytes: &[u8]) -> std::io::Result<usize> {
    // SAFETY: sends from a live buffer of the length given on a socket the caller owns.
    let n = unsafe { libc::send(fd, bytes.as_ptr().cast(), bytes.len(), libc::MSG_NOSIGNAL) };
    if n < 0 { Err(std::io::Error::last_os_error()) } else { Ok(n as usize) }
}

/// Mark `fd` close-on-exec.
pub fn set_cloexec(fd: RawFd) {
    // SAFETY: fcntl(2) F_SETFD on a descriptor number; no memory is shared.
    unsafe { libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC) };
}

/// Close descriptor `fd` (one the caller owns by number, such as stdout).
pub fn close(fd: RawFd) {
    // SAFETY: close(2) of a number the caller owns; no File or OwnedFd holds it.
    unsafe { libc::close(fd) };
}

/// Put `/dev/null` (opened with `flags`) on descriptor `fd`, which lets go of
/// what was there atomically; false if `/dev/null` cannot be opened (`fd` is then
/// left as it was).
pub fn null_onto(fd: RawFd, flags: libc::c_int) -> bool {
    // SAFETY: open(2) of a constant path, dup2(2) onto `fd`, close(2) of the
    // descriptor just opened.
    unsafe {
        let null = libc::open(c"/dev/null".as_ptr(), flags | libc::O_CLOEXEC);
        if null < 0 {
            return false;
        }
        libc::dup2(null, fd);
        libc::close(null);
    }
    true
}

/// A pipe whose both ends are close-on-exec: (read, write).
pub fn pipe_cloexec() -> std::io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0; 2];
    // SAFETY: pipe2 fills two new descriptors, which we then own.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: both were just created and are owned by nothing else.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}
