//! Process identity evidence from Linux `/proc`, and the liveness verdict built on
//! it. A pid alone proves nothing: it is compared with start time, boot id and
//! executable, and the first check that fails is reported.

use std::fs;

use crate::model::{DeathReason, Identity};

/// This machine's boot id.
pub fn boot_id() -> String {
    fs::read_to_string("/proc/sys/kernel/random/boot_id").map(|s| s.trim().to_owned()).unwrap_or_default()
}

/// `(state, start_ticks)` from `/proc/<pid>/stat`; `None` if there is no such process.
fn stat(pid: u32) -> Option<(char, u64)> {
    let s = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) may hold spaces and parentheses: split after the last ')'.
    let rest = &s[s.rfind(')')? + 2..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let state = fields.first()?.chars().next()?;
    let start = fields.get(19)?.parse().ok()?; // field 22 overall
    Some((state, start))
}

/// Prefix of an executable fingerprint by the running image's file identity.
const EXE_INODE_PREFIX: &str = "inode:";

/// Executable fingerprint: `inode:DEV:INO` of the file the process is running
/// (`/proc/<pid>/exe` followed to the image itself), which survives the file being
/// replaced or deleted on disk, as a package upgrade does: a process whose binary
/// was upgraded under it is still the same process.
fn exe_fingerprint(pid: u32) -> String {
    use std::os::unix::fs::MetadataExt;
    match fs::metadata(format!("/proc/{pid}/exe")) {
        Ok(m) => format!("{EXE_INODE_PREFIX}{}:{}", m.dev(), m.ino()),
        Err(_) => "unknown".into(),
    }
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
pub fn probe(pid: u32, instance: uuid::Uuid) -> Option<Identity> {
    let (state, start_ticks) = stat(pid)?;
    if matches!(state, 'Z' | 'X') {
        return None;
    }
    Some(Identity { instance, pid, start_ticks, boot_id: boot_id(), exe: exe_fingerprint(pid) })
}

/// The identity of an owner on another host (a daemon's client without a pid):
/// only its instance is known. Its liveness is judged by heartbeat staleness
/// alone: it is never provably dead, so only a takeover replaces it.
pub fn remote(instance: uuid::Uuid) -> Identity {
    Identity { instance, pid: 0, start_ticks: 0, boot_id: String::new(), exe: "remote".into() }
}

/// `None` if the identity is that of a live process — or of a remote owner (pid
/// 0), which nothing here can prove dead; else the first failed check.
pub fn death_of(id: &Identity) -> Option<DeathReason> {
    if id.pid == 0 {
        return None;
    }
    let Some((state, start)) = stat(id.pid) else { return Some(DeathReason::ProcessDead) };
    if matches!(state, 'Z' | 'X') {
        return Some(DeathReason::ProcessDead);
    }
    if start != id.start_ticks {
        return Some(DeathReason::StartTimeChanged);
    }
    if boot_id() != id.boot_id {
        return Some(DeathReason::BootChanged);
    }
    // Only fingerprints of the same kind compare: identities recorded by earlier
    // versions (`path:size:mtime`, which an upgrade on disk changed under a live
    // process) are judged on pid, start time and boot id alone.
    let exe = exe_fingerprint(id.pid);
    if id.exe.starts_with(EXE_INODE_PREFIX) && exe.starts_with(EXE_INODE_PREFIX) && exe != id.exe {
        return Some(DeathReason::ExeChanged);
    }
    None
}

/// The parent of the calling process (the CLI's default owner).
pub fn parent_pid() -> u32 {
    std::os::unix::process::parent_id()
}
