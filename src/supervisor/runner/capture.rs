//! The command's output: its files in `DIR/processes/ID/` (private, never
//! through a symbolic link), the threads that read its stdout and stderr into
//! them (bounded, digested, with a tail), and the redaction of its `--env` values
//! from what was kept.

use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::Path;
use std::sync::{Arc, Mutex, mpsc};
use std::time::Instant;

use crate::model::{Capture, OUTPUT_TAIL_BYTES_MAX};
use crate::supervisor::process_dir;

use super::say;

pub(super) fn open_outputs(dir: &Path, process: u64) -> std::io::Result<[Option<File>; 2]> {
    let d = private_process_dir(dir, process)?;
    Ok([Some(new_private_file(&d, "stdout")?), Some(new_private_file(&d, "stderr")?)])
}

/// `DIR/processes/ID/`, created 0700 — or, if it exists, checked to be a real
/// directory (never a symbolic link) and made 0700.
pub(super) fn private_process_dir(dir: &Path, process: u64) -> std::io::Result<std::path::PathBuf> {
    let d = process_dir(dir, process);
    private_dir(&dir.join(crate::supervisor::PROCESS_DIR))?;
    private_dir(&d)?;
    Ok(d)
}

/// `p`, created 0700 — or, if it exists, checked to be a real directory (never a
/// symbolic link) and made 0700.
fn private_dir(p: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    match std::fs::DirBuilder::new().mode(0o700).create(p) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
            let m = std::fs::symlink_metadata(p)?;
            if !m.file_type().is_dir() {
                return Err(std::io::Error::other(format!("{} is not a directory", p.display())));
            }
            std::fs::set_permissions(p, std::fs::Permissions::from_mode(0o700))
        }
        Err(e) => Err(e),
    }
}

/// Where spare runners make their process's files ahead (see [`Prepared`]), in
/// `DIR/processes/`: a name no process directory has (those are numbers).
const SPARES_DIR: &str = ".spares";

/// A process's files made ahead by a spare runner while it waits for its run:
/// `DIR/processes/.spares/PID-TICKS/` (the spare's pid and start time), 0700,
/// holding an empty `runner.log`, `stdout` and `stderr` (0600). Given its process,
/// the spare renames that directory to `DIR/processes/ID/`, never over one that
/// exists ([`Prepared::adopt`]). A directory and three files are four inode
/// allocations, and on some file systems each takes 0.4–0.9 ms (ext4 without a
/// journal scans the group's recently deleted inodes for one it may reuse): made
/// ahead, none of them is on the way to the run's answer; a rename allocates
/// nothing.
///
/// The directory is taken over before the process's start is judged: if the
/// process is then not started by this spare (taken by a runner started beside
/// it by its caller's watch, its executable changed, …), the empty `stdout` and
/// `stderr` stay in `processes/ID/` — never read, as nothing of an unstarted
/// process's output is; a runner that starts it sets them aside as it makes its
/// own, as it does with any file found there.
///
/// The spare holds an exclusive `flock` on its directory while it lives. A spare
/// that ends without a run removes its directory; one killed leaves it, and the
/// next spare to prepare removes every directory in `.spares` that no one holds
/// ([`remove_stale_preparations`]) — whatever its name, and whichever
/// pid namespace its spare lived in, since a live spare's lock is what keeps it.
pub(super) struct Prepared {
    /// `DIR/processes/`, opened as a directory (never through a link): both names
    /// of the rename are relative to it.
    processes: File,
    name: String,
    /// The directory made, opened and locked (`flock`, exclusive) for as long as
    /// this spare holds it.
    _held: File,
    runner_log: File,
    outputs: [File; 2],
}

/// A directory at `path`, opened (never through a link) and locked (`flock`,
/// exclusive, without waiting): `None` if it is not a directory, or someone holds it.
fn hold_dir(path: &Path) -> Option<File> {
    let d = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)
        .ok()?;
    fs4::FileExt::try_lock(&d).ok()?;
    Some(d)
}

impl Prepared {
    /// Make them for this process's run to come, in `dir`'s `processes/`.
    pub(super) fn make(dir: &Path) -> std::io::Result<Prepared> {
        let parent = dir.join(crate::supervisor::PROCESS_DIR);
        private_dir(&parent)?;
        let spares = parent.join(SPARES_DIR);
        private_dir(&spares)?;
        remove_stale_preparations(&spares);
        let pid = std::process::id();
        let ticks = crate::ledger::identity::start_ticks(pid)
            .ok_or_else(|| std::io::Error::other("cannot read this process's start time"))?;
        let name = format!("{pid}-{ticks}");
        let d = spares.join(&name);
        std::fs::DirBuilder::new().mode(0o700).create(&d)?;
        let made = (|| {
            // Locked before anything is made in it: another spare's cleanup that
            // took the lock first removes it, and then this one fails to make its
            // files (`ENOENT`) and prepares nothing.
            let held = hold_dir(&d).ok_or_else(|| std::io::Error::other(format!("{} is held", d.display())))?;
            let processes = OpenOptions::new()
                .read(true)
                .custom_flags(libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC)
                .open(&parent)?;
            let runner_log = super::start::open_runner_log(&d)?;
            let outputs = [new_private_file(&d, "stdout")?, new_private_file(&d, "stderr")?];
            Ok(Prepared { processes, name: name.clone(), _held: held, runner_log, outputs })
        })();
        if made.is_err() {
            let _ = std::fs::remove_dir_all(&d);
        }
        made
    }

    /// Rename them to `DIR/processes/ID/` for `process`: its `runner.log` (to
    /// append to) and its `stdout` and `stderr` (new, to write). `Err(self)` if
    /// that directory exists (another runner's, or an earlier history's: nothing
    /// moved, and its files are made there as before) or the rename fails.
    pub(super) fn adopt(self, process: u64) -> Result<(File, [File; 2]), Prepared> {
        let from = std::ffi::CString::new(format!("{SPARES_DIR}/{}", self.name)).expect("no NUL in a number");
        let to = std::ffi::CString::new(process.to_string()).expect("no NUL in a number");
        match crate::sys::fs::rename_noreplace_in(&self.processes, &from, &to) {
            Ok(()) => Ok((self.runner_log, self.outputs)),
            Err(_) => Err(self),
        }
    }

    /// Remove them (a spare that ends without a run, or whose process's
    /// directory exists).
    pub(super) fn discard(self, dir: &Path) {
        let d = dir.join(crate::supervisor::PROCESS_DIR).join(SPARES_DIR).join(&self.name);
        // Removed while still held.
        let _ = std::fs::remove_dir_all(d);
    }
}

/// Remove the directories in `spares` that no spare holds (see [`Prepared`]):
/// those of spares killed while they waited. Anything there that is not a
/// directory (a link included) is left alone.
fn remove_stale_preparations(spares: &Path) {
    for e in std::fs::read_dir(spares).into_iter().flatten().filter_map(|e| e.ok()) {
        if let Some(held) = hold_dir(&e.path()) {
            // Removed while this holds it, so no spare can take it meanwhile;
            // `remove_dir_all` follows no link inside it.
            let _ = std::fs::remove_dir_all(e.path());
            drop(held);
        }
    }
}

/// A new file `name` in `d`, 0600, never through a symbolic link. Whatever has that
/// name already (output of a process of an earlier history that had this id, or
/// something planted) is renamed aside and kept, never followed or overwritten.
fn new_private_file(d: &Path, name: &str) -> std::io::Result<File> {
    let path = d.join(name);
    if std::fs::symlink_metadata(&path).is_ok() {
        let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default().as_nanos();
        std::fs::rename(&path, d.join(format!("{name}.set-aside-{nanos}")))?;
    }
    OpenOptions::new().write(true).create_new(true).mode(0o600).custom_flags(libc::O_NOFOLLOW).open(path)
}

struct CaptureState {
    capture: Capture,
    hasher: blake3::Hasher,
    tail: std::collections::VecDeque<u8>,
    /// The stream ended (end of file, or a read error): everything was read.
    eof: bool,
    /// What was kept is durable (synced by the reading thread).
    synced: bool,
    /// Set when the result was taken: nothing more is written or counted, so the
    /// record matches the file.
    stopped: bool,
}

/// Reads one output stream on its own thread: the first `max` bytes go to the
/// file (and the digest), every byte is counted, the last ones are kept as the tail.
pub(super) struct Capturer {
    state: Arc<Mutex<CaptureState>>,
    done: mpsc::Receiver<()>,
    /// Another handle on the output file, to sync what was kept when the result is
    /// taken before the stream ended (the reading thread then never syncs it).
    file: Option<File>,
}

impl Capturer {
    pub(super) fn start(mut pipe: impl Read + Send + 'static, mut file: Option<File>, max: u64) -> Capturer {
        let handle = file.as_ref().and_then(|f| f.try_clone().ok());
        let state = Arc::new(Mutex::new(CaptureState {
            capture: Capture::default(),
            hasher: blake3::Hasher::new(),
            tail: std::collections::VecDeque::with_capacity(OUTPUT_TAIL_BYTES_MAX),
            eof: false,
            synced: false,
            stopped: false,
        }));
        let (tx, done) = mpsc::channel();
        let shared = Arc::clone(&state);
        std::thread::spawn(move || {
            let mut buf = vec![0u8; 64 * 1024];
            loop {
                let n = match pipe.read(&mut buf) {
                    Ok(0) => break,
                    Ok(n) => n,
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                    Err(_) => break,
                };
                let chunk = &buf[..n];
                let mut s = shared.lock().expect("capture state");
                if s.stopped {
                    return;
                }
                let c = &mut s.capture;
                c.bytes_seen += n as u64;
                let room = max.saturating_sub(c.bytes_kept) as usize;
                let keep = &chunk[..room.min(n)];
                if keep.len() < n {
                    c.truncated = true;
                }
                if !keep.is_empty() {
                    let written = file.as_mut().is_some_and(|f| f.write_all(keep).is_ok());
                    if written {
                        s.capture.bytes_kept += keep.len() as u64;
                        s.hasher.update(keep);
                    } else {
                        s.capture.truncated = true;
                        file = None;
                    }
                }
                let tail = &mut s.tail;
                let from = n.saturating_sub(OUTPUT_TAIL_BYTES_MAX);
                tail.extend(&chunk[from..]);
                while tail.len() > OUTPUT_TAIL_BYTES_MAX {
                    tail.pop_front();
                }
            }
            // Durable before the exit record names its digest. A file with nothing
            // kept is not synced (a journal commit on the way to every answer):
            // the record says nothing was kept, and the output of an ended process
            // is read only as far as its record says (`read_output`), so an empty
            // file lost in a crash — or an older file of that name back in its
            // place — shows nothing.
            let kept = {
                let mut s = shared.lock().expect("capture state");
                s.eof = true;
                s.capture.bytes_kept
            };
            let synced = kept > 0 && file.is_some_and(|f| f.sync_all().is_ok());
            shared.lock().expect("capture state").synced = synced;
            let _ = tx.send(());
        });
        Capturer { state, done, file: handle }
    }

    /// What was captured, once the stream ended or `until` passed (then the part
    /// read so far, marked truncated: the rest was never read).
    pub(super) fn finish(self, until: Instant) -> Capture {
        let _ = self.done.recv_timeout(until.saturating_duration_since(Instant::now()));
        let mut s = self.state.lock().expect("capture state");
        s.stopped = true;
        let mut c = s.capture.clone();
        if !s.eof {
            c.truncated = true;
        }
        c.kept_blake3 = *s.hasher.clone().finalize().as_bytes();
        c.tail = s.tail.iter().copied().collect();
        let synced = s.synced;
        drop(s);
        // What was kept and is not yet known durable is synced here, before the
        // exit record names its digest: the stream is still held open (by
        // something the command left outside its group) and the reading thread
        // stops without syncing, or its sync is under way or failed, or a write
        // failed and it let go of the file. Nothing more is written to the file
        // once `stopped` is set.
        if !synced
            && c.bytes_kept > 0
            && let Some(f) = &self.file
            && let Err(e) = f.sync_all()
        {
            eprintln!("fencelog runner: cannot sync the kept output ({e}); its exit record names it anyway");
        }
        c
    }
}

/// Take the command's `--env` values out of what is kept of `stream` — the output
/// file (rewritten, synced, renamed into place) and the tail — before the exit
/// record names them: the record then carries the redacted file's length and
/// digest. A file that cannot be redacted is removed (nothing kept, said so in
/// `runner.log`); its tail is redacted all the same.
pub(super) fn redact_capture(
    dir: &Path,
    process: u64,
    stream: crate::supervisor::Stream,
    c: &mut crate::model::Capture,
    r: &crate::supervisor::secrets::Redactor,
    bytes_max: u64,
) {
    if c.bytes_kept > 0 {
        let cut = c.bytes_seen > c.bytes_kept;
        match r.redact_file(&crate::supervisor::output_path(dir, process, stream), cut, bytes_max) {
            Ok(Some(red)) => {
                (c.bytes_kept, c.kept_blake3) = (red.bytes, red.blake3);
                c.truncated |= red.truncated;
            }
            Ok(None) => {}
            // A secret must not outlive the command in the open: a kept file that
            // cannot be redacted is removed, and the record says nothing was kept.
            Err(e) => {
                let path = crate::supervisor::output_path(dir, process, stream);
                // Synced away before the record says nothing was kept: a removal
                // lost in a crash would bring the secret back.
                let removed = match std::fs::remove_file(&path) {
                    Err(rm) if rm.kind() != std::io::ErrorKind::NotFound => Err(rm),
                    _ => path.parent().map_or(Ok(()), |d| std::fs::File::open(d).and_then(|d| d.sync_all())),
                };
                match removed {
                    Ok(()) => {
                        say(process, format!("cannot redact the kept {}: {e}; removed it", stream.file_name()));
                        (c.bytes_kept, c.kept_blake3) = (0, *blake3::hash(b"").as_bytes());
                        c.truncated = c.bytes_seen > 0;
                    }
                    Err(rm) => {
                        say(process, format!("cannot redact the kept {}: {e}; nor remove it: {rm}", stream.file_name()))
                    }
                }
            }
        }
    }
    let (tail, _) = r.redact(&c.tail, c.bytes_seen > c.tail.len() as u64, false);
    // A marker can be longer than what it replaced: the tail stays within its bound.
    let skip = tail.len().saturating_sub(OUTPUT_TAIL_BYTES_MAX);
    c.tail = tail[skip..].to_vec();
}
