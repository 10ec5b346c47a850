//! The command's process group: waiting for the command under its timeout, and
//! stopping the group (TERM, then KILL after a grace).

use std::process::ExitStatus;
use std::time::{Duration, Instant};

use crate::ledger::identity;

use super::TERM_TO_KILL_GRACE_MS;
use super::gate::Spawned;

/// Wait for the command; after `timeout_ms` (0: none) stop its process group:
/// TERM, then KILL after a grace. Returns the exit status (`None` if waiting
/// failed) and whether it timed out.
///
/// Under a timeout the command's end is waited for on its pidfd (`poll` with
/// the time left): it is seen the moment it comes. Without pidfds (Linux before
/// 5.3) it is looked for after naps of 1 ms, doubling up to 20 ms: up to 20 ms
/// late, which the pidfd spares every run with a timeout (`docs/BENCHMARKS.md`).
pub(super) fn wait_with_timeout(child: &mut Spawned, timeout_ms: u64, pgid: u32) -> (Option<ExitStatus>, bool) {
    use std::os::fd::AsRawFd;
    if timeout_ms == 0 {
        return (child.wait().ok(), false);
    }
    let deadline = Instant::now() + Duration::from_millis(timeout_ms);
    let mut ended = crate::sys::process::pidfd_open(child.pid()).ok();
    let mut poll = |child: &mut Spawned, until: Instant| -> Option<ExitStatus> {
        let mut nap = Duration::from_millis(1);
        let mut said_ended = false;
        loop {
            let waited = child.try_wait();
            if let Ok(Some(s)) = waited {
                return Some(s);
            }
            if said_ended {
                // The pidfd says the command ended, yet it cannot be reaped yet
                // (a tracer holds it): naps from here on, never a spin.
                ended = None;
            }
            let now = Instant::now();
            if now >= until {
                return None;
            }
            match (&ended, waited) {
                (Some(fd), Ok(None)) => {
                    said_ended = crate::sys::fd::ppoll_ready(fd.as_raw_fd(), until - now);
                }
                // (A wait that failed is not retried in a spin on a pidfd that
                // says the command ended.)
                _ => {
                    std::thread::sleep(nap.min(until - now));
                    nap = (nap * 2).min(Duration::from_millis(20));
                }
            }
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
