//! Process identity evidence from Linux `/proc`, and the liveness verdict built on
//! it. A pid alone proves nothing: it is compared with start time, boot id and
//! executable, and the first check that fails is reported.

use std::fs;

use crate::model::{CallerId, DeathReason, Identity, Observed};

/// This machine's boot id, or `None` if it cannot be read (then nothing about
/// another boot can be concluded).
pub fn read_boot_id() -> Option<String> {
    fs::read_to_string("/proc/sys/kernel/random/boot_id").ok().map(|s| s.trim().to_owned()).filter(|s| !s.is_empty())
}

/// The environment variable that sets this process's host id instead of the
/// machine's (tests simulate hosts on one machine with it; documented in
/// docs/DISTRIBUTED.md). Never set it in production: two hosts with one id judge
/// each other's processes from their own `/proc`.
pub const HOST_ID_ENV: &str = "FENCELOG_HOST_ID";

/// This host's id, as owners, processes and observed staleness record it on a
/// log shared by hosts: `HOSTNAME/MACHINE` (the kernel's host name and the first
/// 12 hex digits of `/etc/machine-id`, which tells apart two hosts that share a
/// name), or [`HOST_ID_ENV`] when set. Printable, at most
/// [`crate::model::HOST_BYTES_MAX`] bytes.
pub fn host_id() -> String {
    if let Ok(id) = std::env::var(HOST_ID_ENV)
        && !id.is_empty()
    {
        return sanitize_host(&id);
    }
    let name = fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|s| s.trim().to_owned())
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "unknown-host".into());
    let machine = fs::read_to_string("/etc/machine-id")
        .ok()
        .map(|s| s.trim().chars().take(12).collect::<String>())
        .filter(|s| !s.is_empty());
    sanitize_host(&match machine {
        Some(m) => format!("{name}/{m}"),
        None => name,
    })
}

/// A host id as recorded: printable, at most [`crate::model::HOST_BYTES_MAX`] bytes.
pub fn sanitize_host(id: &str) -> String {
    let mut s: String = id.chars().filter(|c| !c.is_control()).collect();
    while s.len() > crate::model::HOST_BYTES_MAX {
        s.pop();
    }
    if s.is_empty() { "unknown-host".into() } else { s }
}

/// Where liveness is judged from: this host, and whether the log is shared by
/// hosts (a log in etcd) — then an identity recorded on another host is never
/// judged from this host's `/proc`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Here {
    pub host: String,
    pub shared: bool,
}

impl Here {
    /// For a log that is (`shared`) or is not shared by hosts.
    pub fn new(shared: bool) -> Here {
        Here { host: host_id(), shared }
    }

    /// For a log on this host alone (a directory): every identity is judged here.
    pub fn local() -> Here {
        Here::new(false)
    }

    /// Whether the identity `id`, recorded on `host` (if its host was recorded),
    /// is another host's. Recorded: another id is another host. Not recorded (an
    /// owner of a log on one host, imported into one shared by hosts): on a shared
    /// log, another boot id may be another host as well as a reboot, so it is
    /// never taken for this host's reboot; on a log on one host it is this host.
    pub fn is_other_host(&self, id: &Identity, host: Option<&str>) -> bool {
        match host {
            Some(h) => h != self.host,
            None => self.shared && !id.boot_id.is_empty() && read_boot_id().is_none_or(|b| b != id.boot_id),
        }
    }
}

/// `(state, start_ticks)` from `/proc/<pid>/stat`; `None` if there is no such process.
fn stat(pid: u32) -> Option<(char, u64)> {
    stat_read(pid).ok().flatten()
}

/// `/proc/<pid>/stat` read: `Ok(None)` when there is no such entry (or it does not
/// parse), `Err` when it could not be read for another reason (out of descriptors,
/// an I/O error) — which proves nothing.
fn stat_read(pid: u32) -> std::io::Result<Option<(char, u64)>> {
    let s = match fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(s) => s,
        // ESRCH: it exited between the open and the read.
        Err(e) if e.kind() == std::io::ErrorKind::NotFound || e.raw_os_error() == Some(libc::ESRCH) => {
            return Ok(None);
        }
        Err(e) => return Err(e),
    };
    Ok(parse_stat(&s))
}

fn parse_stat(s: &str) -> Option<(char, u64)> {
    // The command name (field 2) may hold spaces and parentheses: split after the last ')'.
    let rest = s.get(s.rfind(')')? + 2..)?;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let state = fields.first()?.chars().next()?;
    let start = fields.get(19)?.parse().ok()?; // field 22 overall
    Some((state, start))
}

/// Prefix of an executable fingerprint by the running image's file identity.
const EXE_INODE_PREFIX: &str = "inode:";

/// Executable fingerprint: `inode:DEV:INO` of the image the process is running
/// (`/proc/<pid>/exe` followed to the file itself). That file stays what it was when
/// the binary is replaced or deleted on disk, as a package upgrade does: only an
/// `exec` into another program changes it. (Not its mtime: `touch` changes that
/// under a running process. Not its size: a running image cannot be written.)
/// `unknown` when it cannot be read (another user's process, for one who is not
/// root).
fn exe_fingerprint(pid: u32) -> String {
    use std::os::unix::fs::MetadataExt;
    match fs::metadata(format!("/proc/{pid}/exe")) {
        Ok(m) => format!("{EXE_INODE_PREFIX}{}:{}", m.dev(), m.ino()),
        Err(_) => "unknown".into(),
    }
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

/// The pid namespace of this process (the inode of `/proc/self/ns/pid`): the one
/// every pid this process reads or records is in. 0 when unreadable.
pub fn pid_ns() -> u64 {
    fs::read_link("/proc/self/ns/pid")
        .ok()
        .and_then(|l| {
            let l = l.to_string_lossy().into_owned();
            l.strip_prefix("pid:[")?.strip_suffix(']')?.parse().ok()
        })
        .unwrap_or(0)
}

/// Start time (clock ticks since boot) of a live process; `None` if there is no
/// such process or it has exited (a zombie).
pub fn start_ticks(pid: u32) -> Option<u64> {
    stat(pid).filter(|(state, _)| !matches!(state, 'Z' | 'X')).map(|(_, start)| start)
}

/// Live (not zombie) members of process group `pgid`, from `/proc`.
pub fn process_group_members(pgid: u32) -> Vec<u32> {
    let Ok(entries) = fs::read_dir("/proc") else { return vec![] };
    entries
        .flatten()
        .filter_map(|e| e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()))
        .filter(|pid| {
            let Ok(s) = fs::read_to_string(format!("/proc/{pid}/stat")) else { return false };
            let Some(rest) = s.rfind(')').and_then(|i| s.get(i + 2..)) else { return false };
            let f: Vec<&str> = rest.split_whitespace().collect();
            f.first().is_some_and(|st| !matches!(*st, "Z" | "X")) && f.get(2).and_then(|g| g.parse().ok()) == Some(pgid)
        })
        .collect()
}

/// Identity evidence of a running process, or `None` if it does not exist.
/// (An identity is never recorded without a boot id: one read as empty would
/// later look like another boot, and a live owner like a dead one.)
pub fn probe(pid: u32, instance: uuid::Uuid) -> Option<Identity> {
    let (state, start_ticks) = stat(pid)?;
    if matches!(state, 'Z' | 'X') {
        return None;
    }
    let boot_id = read_boot_id()?;
    Some(Identity { instance, pid, start_ticks, boot_id, exe: exe_fingerprint(pid) })
}

/// The identity of an owner on another host (a daemon's client without a pid):
/// only its instance is known. Its liveness is judged by heartbeat staleness
/// alone: it is never provably dead, so only a takeover replaces it.
pub fn remote(instance: uuid::Uuid) -> Identity {
    Identity { instance, pid: 0, start_ticks: 0, boot_id: String::new(), exe: "remote".into() }
}

/// A caller's identity evidence: process `pid` as probed now (what is left of it
/// if it is already gone: its pid alone), with the `instance` it named.
pub fn caller_of(pid: u32, instance: Option<uuid::Uuid>) -> CallerId {
    match stat(pid) {
        Some((_, start_ticks)) => CallerId { pid, start_ticks, exe: exe_fingerprint(pid), pid_ns: pid_ns(), instance },
        None => CallerId { pid, start_ticks: 0, exe: "unknown".into(), pid_ns: pid_ns(), instance },
    }
}

/// A caller on another host (a daemon's HTTP client): its `instance`, if it
/// named one, is all that is known.
pub fn remote_caller(instance: Option<uuid::Uuid>) -> CallerId {
    CallerId { pid: 0, start_ticks: 0, exe: "remote".into(), pid_ns: 0, instance }
}

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

/// The parent of the calling process (the CLI's default owner).
pub fn parent_pid() -> u32 {
    std::os::unix::process::parent_id()
}

#[cfg(test)]
mod tests {
    use super::*;

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

    /// Proves: a `/proc/<pid>/stat` line that ends early is no process, never a panic.
    #[test]
    fn a_short_stat_line_parses_to_nothing() {
        assert_eq!(parse_stat("1 (x)"), None);
        assert_eq!(parse_stat("1 (x) S"), None);
        assert_eq!(parse_stat(""), None);
    }
}
