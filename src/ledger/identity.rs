//! Process identity evidence from Linux `/proc`: who a pid is (start time, boot
//! id, pid namespace, running image), this host's id, and where liveness is
//! judged from ([`Here`]). The verdict built on it — alive, dead with the first
//! failed check, or unknown — is the operations' (`ops::liveness`).

use std::fs;

use crate::model::{CallerId, Identity};

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
pub(crate) fn stat_read(pid: u32) -> std::io::Result<Option<(char, u64)>> {
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
pub(crate) const EXE_INODE_PREFIX: &str = "inode:";

/// Executable fingerprint: `inode:DEV:INO` of the image the process is running
/// (`/proc/<pid>/exe` followed to the file itself). That file stays what it was when
/// the binary is replaced or deleted on disk, as a package upgrade does: only an
/// `exec` into another program changes it. (Not its mtime: `touch` changes that
/// under a running process. Not its size: a running image cannot be written.)
/// `unknown` when it cannot be read (another user's process, for one who is not
/// root).
pub(crate) fn exe_fingerprint(pid: u32) -> String {
    use std::os::unix::fs::MetadataExt;
    match fs::metadata(format!("/proc/{pid}/exe")) {
        Ok(m) => format!("{EXE_INODE_PREFIX}{}:{}", m.dev(), m.ino()),
        Err(_) => "unknown".into(),
    }
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

/// The parent of the calling process (the CLI's default owner).
pub fn parent_pid() -> u32 {
    std::os::unix::process::parent_id()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Proves: a `/proc/<pid>/stat` line that ends early is no process, never a panic.
    #[test]
    fn a_short_stat_line_parses_to_nothing() {
        assert_eq!(parse_stat("1 (x)"), None);
        assert_eq!(parse_stat("1 (x) S"), None);
        assert_eq!(parse_stat(""), None);
    }
}
