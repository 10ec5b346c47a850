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

/// Executable fingerprint: target path, size and mtime of `/proc/<pid>/exe`.
fn exe_fingerprint(pid: u32) -> String {
    let Ok(path) = fs::read_link(format!("/proc/{pid}/exe")) else { return "unknown".into() };
    match fs::metadata(format!("/proc/{pid}/exe")) {
        Ok(m) => {
            use std::os::unix::fs::MetadataExt;
            format!("{}:{}:{}", path.display(), m.size(), m.mtime())
        }
        Err(_) => format!("{}", path.display()),
    }
}

/// Start time (clock ticks since boot) of a live process; `None` if there is no
/// such process or it has exited (a zombie).
pub fn start_ticks(pid: u32) -> Option<u64> {
    stat(pid).filter(|(state, _)| !matches!(state, 'Z' | 'X')).map(|(_, start)| start)
}

/// Identity evidence of a running process, or `None` if it does not exist.
pub fn probe(pid: u32, instance: uuid::Uuid) -> Option<Identity> {
    let (state, start_ticks) = stat(pid)?;
    if matches!(state, 'Z' | 'X') {
        return None;
    }
    Some(Identity { instance, pid, start_ticks, boot_id: boot_id(), exe: exe_fingerprint(pid) })
}

/// `None` if the identity is that of a live process; else the first failed check.
pub fn death_of(id: &Identity) -> Option<DeathReason> {
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
    let exe = exe_fingerprint(id.pid);
    if exe != "unknown" && id.exe != "unknown" && exe != id.exe {
        return Some(DeathReason::ExeChanged);
    }
    None
}

/// The parent of the calling process (the CLI's default owner).
pub fn parent_pid() -> u32 {
    std::os::unix::process::parent_id()
}
