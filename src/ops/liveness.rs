//! The liveness verdict on a recorded identity: alive, provably dead (the first
//! failed check, and what was seen), or unknown (never dead). A pid alone proves
//! nothing: it is compared with start time, boot id and executable. The evidence
//! itself is read by `ledger::identity`; every operation that judges an owner
//! (a claim over a dead owner, `status`, the supervisor's settling) asks here.

use crate::ledger::identity::{EXE_INODE_PREFIX, Here, exe_fingerprint, pid_ns, read_boot_id, stat_read};
use crate::model::{DeathReason, Identity, Observed};

/// Why an owner's liveness cannot be judged here. Unknown is never dead: no
/// claim is made over it (a stale one is replaced only by a takeover).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum UnknownReason {
    /// An owner on another host (no pid): judged by its heartbeat alone.
    Remote,
    /// A process recorded on another host (a log shared by hosts): only its
    /// heartbeat, or a record written on its own host, tells of it.
    OtherHost,
    /// Its pid was recorded in another pid namespace: the same number here names
    /// another process, or none.
    OtherPidNamespace,
    /// The pid exists but `/proc` does not show it to us (`hidepid`, or another
    /// user's process): `kill(pid, 0)` says EPERM, not ESRCH.
    Hidden,
    /// `/proc` could not be read (out of descriptors, an I/O error): nothing is
    /// concluded from a failed read.
    Unreadable,
}

impl UnknownReason {
    pub fn code(self) -> &'static str {
        match self {
            UnknownReason::Remote => "remote",
            UnknownReason::OtherHost => "other_host",
            UnknownReason::OtherPidNamespace => "other_pid_namespace",
            UnknownReason::Hidden => "hidden",
            UnknownReason::Unreadable => "unreadable",
        }
    }
}

/// The verdict on a recorded identity, now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Liveness {
    Alive,
    /// Provably dead: the first failed check, and what was seen.
    Dead {
        reason: DeathReason,
        observed: Observed,
    },
    Unknown(UnknownReason),
}

impl Liveness {
    pub fn death(&self) -> Option<DeathReason> {
        match self {
            Liveness::Dead { reason, .. } => Some(*reason),
            _ => None,
        }
    }
}

/// Judge a recorded identity now, from `here` (`pid_ns_recorded`: the pid
/// namespace it was seen in, 0 if not recorded; `host`: the host it was recorded
/// on, if recorded). The checks, in this order; the first that decides is
/// reported:
/// 1. no pid (an owner on another host) → unknown (`remote`); recorded on
///    another host ([`Here::is_other_host`]) → unknown (`other_host`): never
///    judged from this host's `/proc`;
/// 2. this machine's boot id differs → dead (`boot_changed`): no process survives
///    a reboot, whatever its pid says now;
/// 3. the pid was recorded in another pid namespace → unknown
///    (`other_pid_namespace`);
/// 4. `/proc/<pid>/stat` cannot be read: `kill(pid, 0)` says ESRCH → dead
///    (`process_dead`, no such process); anything else (EPERM: hidden by `hidepid`
///    or permissions) → unknown (`hidden`);
/// 5. a zombie → dead (`process_dead`);
/// 6. another start time → dead (`start_time_changed`: the pid was reused);
/// 7. another running image → dead (`exe_changed`: an `exec` into another program;
///    a binary replaced on disk is the same image);
/// 8. otherwise alive.
pub fn liveness(here: &Here, id: &Identity, pid_ns_recorded: u64, host: Option<&str>) -> Liveness {
    if id.pid == 0 {
        return Liveness::Unknown(UnknownReason::Remote);
    }
    if here.is_other_host(id, host) {
        return Liveness::Unknown(UnknownReason::OtherHost);
    }
    let Some(boot_id) = read_boot_id() else { return Liveness::Unknown(UnknownReason::Unreadable) };
    let mut observed = Observed { boot_id, pid_ns: pid_ns(), start_ticks: None, exe: None };
    let dead = |reason, observed| Liveness::Dead { reason, observed };
    if !id.boot_id.is_empty() && observed.boot_id != id.boot_id {
        return dead(DeathReason::BootChanged, observed);
    }
    if pid_ns_recorded != 0 && observed.pid_ns != 0 && pid_ns_recorded != observed.pid_ns {
        return Liveness::Unknown(UnknownReason::OtherPidNamespace);
    }
    let Ok(stat) = stat_read(id.pid) else { return Liveness::Unknown(UnknownReason::Unreadable) };
    let Some((state, start)) = stat else {
        return match signal_probe(id.pid) {
            Probe::NoSuchProcess => dead(DeathReason::ProcessDead, observed),
            Probe::Exists => Liveness::Unknown(UnknownReason::Hidden),
        };
    };
    if matches!(state, 'Z' | 'X') {
        return dead(DeathReason::ProcessDead, observed);
    }
    observed.start_ticks = Some(start);
    if start != id.start_ticks {
        return dead(DeathReason::StartTimeChanged, observed);
    }
    let exe = exe_fingerprint(id.pid);
    observed.exe = Some(exe.clone());
    if exe_differs(&id.exe, &exe) {
        return dead(DeathReason::ExeChanged, observed);
    }
    Liveness::Alive
}

enum Probe {
    NoSuchProcess,
    Exists,
}

/// `kill(pid, 0)`: ESRCH is the kernel saying there is no such process in our
/// namespace; success or EPERM says there is one.
fn signal_probe(pid: u32) -> Probe {
    let Ok(pid) = libc::pid_t::try_from(pid) else { return Probe::NoSuchProcess };
    // Signal 0 sends nothing; it only checks that the pid exists.
    if crate::sys::process::kill(pid, 0).is_err_and(|e| e.raw_os_error() == Some(libc::ESRCH)) {
        return Probe::NoSuchProcess;
    }
    Probe::Exists
}

/// `None` if the identity (recorded on `host`, if recorded) is that of a live
/// process — or one whose liveness cannot be judged here (never provably dead);
/// else the first failed check.
pub fn death_of(here: &Here, id: &Identity, host: Option<&str>) -> Option<DeathReason> {
    liveness(here, id, 0, host).death()
}

/// Whether two fingerprints name different images. Only fingerprints of the image
/// compare; of those, the fields both have (an earlier build recorded `DEV:INO`
/// only; before that `path:size:mtime`, which an upgrade on disk changed under a
/// live process, and which is not compared at all).
fn exe_differs(recorded: &str, now: &str) -> bool {
    let (Some(a), Some(b)) = (recorded.strip_prefix(EXE_INODE_PREFIX), now.strip_prefix(EXE_INODE_PREFIX)) else {
        return false;
    };
    a.split(':').zip(b.split(':')).any(|(x, y)| x != y)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ledger::identity::{probe, remote};

    fn me() -> Identity {
        probe(std::process::id(), uuid::Uuid::from_u128(1)).expect("this process")
    }

    /// Proves: the order of the checks, on this process's own identity: alive as
    /// probed; another boot is dead with this boot observed; a pid from another pid
    /// namespace is unknown, never dead (even with a reused-looking start time); no
    /// pid is remote; another start time is dead, with the start time observed.
    #[test]
    fn liveness_checks_in_their_documented_order() {
        assert_eq!(liveness(&Here::local(), &me(), pid_ns(), None), Liveness::Alive);
        let other_boot = Identity { boot_id: "another-boot".into(), ..me() };
        match liveness(&Here::local(), &other_boot, pid_ns(), None) {
            Liveness::Dead { reason: DeathReason::BootChanged, observed } => {
                assert_eq!(Some(observed.boot_id), read_boot_id());
                assert_eq!(observed.start_ticks, None, "nothing of another boot is looked at");
            }
            other => panic!("{other:?}"),
        }
        let reused_looking = Identity { start_ticks: 1, ..me() };
        assert_eq!(
            liveness(&Here::local(), &reused_looking, pid_ns() + 1, None),
            Liveness::Unknown(UnknownReason::OtherPidNamespace)
        );
        assert_eq!(
            liveness(&Here::local(), &remote(uuid::Uuid::nil()), 0, None),
            Liveness::Unknown(UnknownReason::Remote)
        );
        let reused = Identity { start_ticks: me().start_ticks + 1, ..me() };
        match liveness(&Here::local(), &reused, 0, None) {
            Liveness::Dead { reason: DeathReason::StartTimeChanged, observed } => {
                assert_eq!(observed.start_ticks, Some(me().start_ticks));
            }
            other => panic!("{other:?}"),
        }
        let exec_elsewhere = Identity { exe: "inode:1:2".into(), ..me() };
        assert_eq!(liveness(&Here::local(), &exec_elsewhere, 0, None).death(), Some(DeathReason::ExeChanged));
        // An identity recorded with no boot id (never written now) is not judged
        // on it.
        assert_eq!(liveness(&Here::local(), &Identity { boot_id: String::new(), ..me() }, 0, None), Liveness::Alive);
    }

    /// Proves (hosts): on a log shared by hosts, an identity recorded on another
    /// host is never judged from this host's `/proc` — not even a dead-looking
    /// one (another boot id, a pid that does not exist here) — while this host's
    /// own are judged as ever; an identity with no host recorded is this host's
    /// only if its boot id is this boot's (another may be another host as well
    /// as a reboot), and on a log on one host it is this host's.
    #[test]
    fn an_identity_on_another_host_is_never_judged_from_this_hosts_proc() {
        let shared = Here { host: "host-a".into(), shared: true };
        let other_boot_dead_pid = Identity { boot_id: "another-boot".into(), pid: u32::MAX - 1, ..me() };
        assert_eq!(
            liveness(&shared, &other_boot_dead_pid, pid_ns(), Some("host-b")),
            Liveness::Unknown(UnknownReason::OtherHost)
        );
        assert_eq!(
            liveness(&shared, &Identity { pid: u32::MAX - 1, ..me() }, pid_ns(), Some("host-b")),
            Liveness::Unknown(UnknownReason::OtherHost),
            "a pid that does not exist here says nothing of host-b"
        );
        assert_eq!(liveness(&shared, &me(), pid_ns(), Some("host-a")), Liveness::Alive);
        assert_eq!(
            liveness(&shared, &other_boot_dead_pid, pid_ns(), Some("host-a")).death(),
            Some(DeathReason::BootChanged),
            "this host's own, after a reboot"
        );
        assert_eq!(
            liveness(&shared, &other_boot_dead_pid, pid_ns(), None),
            Liveness::Unknown(UnknownReason::OtherHost),
            "no host recorded, another boot: another host as well as a reboot"
        );
        assert_eq!(liveness(&shared, &me(), pid_ns(), None), Liveness::Alive, "no host recorded, this boot");
        assert_eq!(
            liveness(&Here { shared: false, ..shared }, &other_boot_dead_pid, pid_ns(), None).death(),
            Some(DeathReason::BootChanged),
            "a log on one host"
        );
    }
}
