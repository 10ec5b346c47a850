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
pub(super) fn wait_with_timeout(child: &mut Spawned, timeout_ms: u64, pgid: u32) -> (Option<ExitStatus>, bool) {
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
