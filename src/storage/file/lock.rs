//! The cross-process append lock: an exclusive advisory `flock` on the log
//! directory itself, taken by a commit group's leader and released after its
//! groups (`commit/`: after 8, when another writer waits). The wait is bounded.
//!
//! Why the directory and not only a `LOCK` file: a lock file can be deleted while a
//! writer holds its lock; the next writer then creates and locks a new file, and two
//! writers append at once, overwriting acknowledged records. The directory cannot
//! be unlinked while it holds the log, so the lock and the log share one inode.
//! `LOCK` is still locked second, for writers of earlier builds (they lock only it).
//!
//! Why a descriptor per waiter: `flock` belongs to an open file description, and a
//! description that holds it "re-acquires" it at once. A timed-out wait leaves a
//! helper thread blocked in `flock`; if it shared a description with later callers,
//! it could win the lock on their behalf and then release it under them. Each wait
//! therefore uses its own description, handed to the winner (`Held`), and an
//! abandoned one is only ever closed by its own helper.
//!
//! **Who waits.** A writer that finds the lock taken says so while it waits: a
//! shared open-file-description (`F_OFD_SETLK`) read lock on byte
//! `WAITING_BYTE` of `LOCK` — independent of `flock` on Linux, and dropped by the
//! kernel when the waiter's process dies, so a dead waiter never leaves it
//! standing (a stopped one does: `SIGSTOP`, a frozen cgroup, a debugger). The
//! holder asks (`F_OFD_GETLK`) before it keeps the lock for more commit groups: it
//! lets go only when someone waits. Writers of earlier builds do not say so; the
//! holder still lets go after a bounded number of turns.
//!
//! **Whose turn.** `flock` hands the lock to whoever asks first once it is free,
//! and the holder that just let it go asks first: its next leader is running, the
//! waiter is asleep in the kernel. Measured (`cargo bench --bench replay --
//! --cas-4-only`, 4 processes): p50 130–170 µs, but a process's p99 2.6–25 ms, up
//! to 150× its p50 — a waiter lost the race again and again. So the lock counts
//! the turns waiters get: a writer that waited adds one to a counter in `LOCK`
//! (bytes 0..8, little endian; advisory, written only under the lock; an
//! uncontended take does not count, and every release asks once whether someone
//! waits). A holder that lets go while another writer certainly waits (the query
//! succeeded and saw its lock) notes the count, and before it asks again it steps
//! aside until the count has moved (a waiter had its turn), nobody waits any more,
//! its caller gives up, its lock wait's deadline comes, or `YIELD_WAIT_MS_MAX`
//! passed. A step aside that runs out its bound with the count unmoved marks that
//! count stale: no holder of this writer steps aside again until a waiter's turn
//! moves it, so a waiter that says it waits and never takes the lock (a stopped
//! process) costs one bounded step aside, not one per turn.
//!
//! **Who let go cleanly.** Every holder syncs each group it writes before it lets
//! go (or cuts it back), so what the next holder finds in the log is durable —
//! unless the holder died first (`kill -9` between its write and its sync): the
//! kernel frees its lock, and its group may sit in the page cache only. So a
//! holder writes its pid into `LOCK` (bytes 8..16, little endian) once it holds
//! the lock, and 0 when it lets go; the next holder that finds a pid there (or
//! cannot read the mark) makes the log's last segment durable (`fdatasync`) before
//! it does anything else, and fails its turn (`IO_ERROR`, the mark left) if that
//! sync fails. What a holder reads under the lock is then durable. The holder also
//! writes the last sequence it knows durable (bytes 16..24) after each of its syncs
//! and after it caught up: readers, which take no lock, visit records up to it
//! without a sync of their own, and sync the last segment themselves before they
//! visit one after it (a group in flight, or a dead writer's). A holder that
//! finds records past the durable mark once it caught up (a writer that died
//! without a holder mark: one of an earlier build) syncs them before it marks them
//! durable (`writer.rs`).

use std::fs::File;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use super::dir::LOCK_FILE;
use crate::storage::error::{Error, Result};

pub(crate) struct AppendLock {
    /// The directory: what excludes every writer of this build.
    dir: Target,
    /// The `LOCK` file, taken second: what writers of earlier builds lock, so that
    /// an old and a new binary appending to one log during an upgrade still exclude
    /// each other. (Deleting it weakens that and its marks — the next holder then
    /// syncs the last segment at every turn, readers every read — but the
    /// directory lock holds.)
    legacy: Target,
    /// A description of `LOCK` that holds the "waiting" byte lock while this
    /// writer waits, and asks whether others wait while it holds (`None` while
    /// `LOCK` does not exist yet).
    waiting: Mutex<Option<File>>,
    /// A read-write description of `LOCK` for the turn counter (`None` until
    /// `LOCK` exists, or if it cannot be written: then no turn is counted and
    /// nobody steps aside).
    turns: Mutex<Option<File>>,
    /// The turn count this writer left at when it let the lock go while another
    /// writer waited, and when: its next acquire steps aside until the count moves.
    yielded: Mutex<Option<(u64, Instant)>>,
    /// A turn count a step aside ran out its bound at, unmoved: while the count is
    /// still that, nobody is stepped aside for (a waiter that never takes it).
    stale_turn: Mutex<Option<u64>>,
}

/// Longest a writer that let the lock go to a waiter steps aside before it asks
/// again (the waiter may have given up, or be slow to be scheduled).
pub const YIELD_WAIT_MS_MAX: u64 = 20;
/// How often a writer stepping aside looks whether the turn count moved.
const YIELD_POLL_US: u64 = 50;

/// The byte of `LOCK` that waiting writers hold a shared OFD lock on.
const WAITING_BYTE: i64 = 1;

/// Where in `LOCK` the holder's pid stands while it holds the lock (0 once it let
/// go cleanly): bytes `HOLDER_MARK_AT..HOLDER_MARK_AT + 8`, little endian.
const HOLDER_MARK_AT: u64 = 8;

/// Where in `LOCK` the last sequence known durable stands (bytes
/// `DURABLE_MARK_AT..DURABLE_MARK_AT + 8`, little endian): written by the holder
/// after each sync of its own, and after it caught up (what it found is durable:
/// the last holder let go cleanly, or this one synced it). Readers visit records
/// up to it without a sync of their own.
const DURABLE_MARK_AT: u64 = 16;

/// An OFD lock request on `WAITING_BYTE` (`F_OFD_SETLK` / `F_OFD_GETLK`).
fn waiting_byte(file: &File, cmd: libc::c_int, l_type: libc::c_int) -> std::io::Result<libc::c_int> {
    crate::sys::fs::ofd_byte_lock(file, cmd, l_type, WAITING_BYTE)
}

/// One lockable path and a spare description for it.
struct Target {
    path: PathBuf,
    is_dir: bool,
    /// A description that is not locked, kept for the next acquire (opening one
    /// costs a syscall per group commit otherwise).
    spare: Mutex<Option<File>>,
}

/// The lock, held until dropped.
pub(crate) struct Held<'a> {
    lock: &'a AppendLock,
    dir: Option<File>,
    legacy: Option<File>,
    /// This holder's pid is marked in `LOCK`: cleared when it lets go (unless it
    /// panicked holding the lock: bytes may be half written and unsynced).
    marked: bool,
}

/// Spin on `try_lock` this long before queueing in the kernel.
const SPIN_US: u64 = 100;

impl AppendLock {
    pub fn open(dir: &Path) -> Result<Self> {
        let target = |path: PathBuf, is_dir| Target { path, is_dir, spare: Mutex::new(None) };
        let lock = AppendLock {
            dir: target(dir.to_path_buf(), true),
            legacy: target(dir.join(LOCK_FILE), false),
            waiting: Mutex::new(None),
            turns: Mutex::new(None),
            yielded: Mutex::new(None),
            stale_turn: Mutex::new(None),
        };
        *lock.dir.spare.lock().expect("spare") = lock.dir.open_description()?;
        *lock.legacy.spare.lock().expect("spare") = lock.legacy.open_description()?;
        *lock.waiting.lock().expect("waiting") = lock.legacy.open_description()?;
        *lock.turns.lock().expect("turns") = lock.legacy.open_for_turns();
        Ok(lock)
    }

    /// The turn count in `LOCK` (0 for an empty file), or `None` when there is no
    /// counter to read.
    fn turn_count(&self) -> Option<u64> {
        use std::os::unix::fs::FileExt;
        let mut t = self.turns.lock().expect("turns");
        if t.is_none() {
            *t = self.legacy.open_for_turns();
        }
        let f = t.as_ref()?;
        let mut b = [0u8; 8];
        match f.read_at(&mut b, 0) {
            Ok(8) => Some(u64::from_le_bytes(b)),
            Ok(_) => Some(0),
            Err(_) => None,
        }
    }

    /// Count a turn: called by a holder that waited for it, under the lock. Best
    /// effort (a writer that cannot count only makes a yielding one wait its
    /// bounded time).
    fn count_turn(&self) -> Option<u64> {
        use std::os::unix::fs::FileExt;
        let next = self.turn_count()?.wrapping_add(1);
        let t = self.turns.lock().expect("turns");
        t.as_ref()?.write_all_at(&next.to_le_bytes(), 0).ok()?;
        Some(next)
    }

    /// Before asking for the lock: if this writer last let it go to a waiter, step
    /// aside until another writer has had its turn (the count moved), nobody waits
    /// any more, or `deadline` or [`YIELD_WAIT_MS_MAX`] passed (then the count is
    /// marked stale). Returns whether `give_up` said so meanwhile — then the step
    /// aside is still owed (kept for this writer's next acquire): a caller that
    /// would not wait must not take the waiter's turn away from the one after it.
    fn step_aside(&self, give_up: &dyn Fn() -> bool, deadline: Instant) -> bool {
        let Some((left_at, since)) = self.yielded.lock().expect("yielded").take() else { return false };
        let bound = Duration::from_millis(YIELD_WAIT_MS_MAX);
        loop {
            if give_up() {
                *self.yielded.lock().expect("yielded") = Some((left_at, since));
                return true;
            }
            if self.turn_count() != Some(left_at) || !self.waiter_seen() {
                return false;
            }
            if since.elapsed() >= bound || Instant::now() >= deadline {
                *self.stale_turn.lock().expect("stale") = Some(left_at);
                return false;
            }
            std::thread::sleep(Duration::from_micros(YIELD_POLL_US));
        }
    }

    /// On letting the lock go: note the turn count to step aside at, if another
    /// writer certainly waits and the count is not one a step aside already ran
    /// out at.
    fn note_yield(&self) {
        if !self.waiter_seen() {
            return;
        }
        let Some(turn) = self.turn_count() else { return };
        if *self.stale_turn.lock().expect("stale") != Some(turn) {
            *self.yielded.lock().expect("yielded") = Some((turn, Instant::now()));
        }
    }

    /// Whether another writer certainly says it waits: the query succeeded and
    /// saw its lock. (Unlike [`others_waiting`](Self::others_waiting), which takes
    /// an unanswered query for yes to keep turns short, an unanswered one is no
    /// here: stepping aside for nobody would cost every turn its bound.)
    fn waiter_seen(&self) -> bool {
        self.waiting_query().is_some_and(|t| t != libc::F_UNLCK)
    }

    /// What `F_OFD_GETLK` on the "waiting" byte answers (`F_UNLCK`: nobody waits),
    /// or `None` when it cannot be asked or does not answer.
    fn waiting_query(&self) -> Option<libc::c_int> {
        let mut w = self.waiting.lock().expect("waiting");
        if w.is_none() {
            *w = self.legacy.open_description().ok().flatten();
        }
        waiting_byte(w.as_ref()?, libc::F_OFD_GETLK, libc::F_WRLCK).ok()
    }

    /// Say (or stop saying) that this writer waits for the lock. Best effort: a
    /// writer that cannot say so only makes the holder keep the lock for its
    /// bounded turns.
    fn set_waiting(&self, on: bool) {
        let mut w = self.waiting.lock().expect("waiting");
        if w.is_none() {
            *w = self.legacy.open_description().ok().flatten();
        }
        if let Some(f) = w.as_ref() {
            let l_type = if on { libc::F_RDLCK } else { libc::F_UNLCK };
            let _ = waiting_byte(f, libc::F_OFD_SETLK, l_type);
        }
    }

    /// Whether another writer (another open file description: another process, or
    /// another `Log` of this one) says it waits for the lock. When this cannot be
    /// told, yes: the holder then takes turns as if someone waited.
    pub fn others_waiting(&self) -> bool {
        self.waiting_query() != Some(libc::F_UNLCK)
    }

    /// Take the lock within `wait_ms_max`: the directory, then `LOCK`, with one
    /// deadline for both.
    pub fn acquire(&self, wait_ms_max: u64) -> Result<Held<'_>> {
        self.acquire_or_give_up(wait_ms_max, &|| false)
    }

    /// [`acquire`](Self::acquire), giving up (`WITHDRAWN`, nothing taken) as soon as
    /// `give_up` says so while it waits — asked once the lock is found taken
    /// (after a short spin, before the wait queues in the kernel), then at least
    /// every [`GIVE_UP_POLL_MS`] ms of the wait (a daemon's cutover withdraws a request
    /// still waiting for another process's turn: its grace bounds that wait).
    pub fn acquire_or_give_up(&self, wait_ms_max: u64, give_up: &dyn Fn() -> bool) -> Result<Held<'_>> {
        fail::fail_point!("lock::acquire", |_| {
            Err(Error::io("lock", &self.dir.path)(std::io::Error::other("injected lock failure")))
        });
        let deadline = Instant::now() + Duration::from_millis(wait_ms_max);
        let start = Instant::now();
        if self.step_aside(give_up, deadline) {
            return Err(Error::Withdrawn { waited_ms: start.elapsed().as_millis() as u64 });
        }
        let timeout = |t: &Target| Error::LockTimeout {
            path: t.path.clone(),
            waited_ms: start.elapsed().as_millis() as u64,
            holder_pid: holder_pid(&t.path),
        };
        // Said only once the lock is found taken, and unsaid however the wait ends.
        struct Waiting<'a>(&'a AppendLock, bool);
        impl Drop for Waiting<'_> {
            fn drop(&mut self) {
                if self.1 {
                    self.0.set_waiting(false);
                }
            }
        }
        let mut waiting = Waiting(self, false);
        let mut contended = || {
            if !waiting.1 {
                waiting.1 = true;
                self.set_waiting(true);
            }
        };
        let withdrawn = || Error::Withdrawn { waited_ms: start.elapsed().as_millis() as u64 };
        let dir = match self.dir.acquire(deadline, &mut contended, give_up)? {
            Acquired::Locked(dir) => dir,
            Acquired::GaveUp => return Err(withdrawn()),
            Acquired::Absent | Acquired::TimedOut => return Err(timeout(&self.dir)),
        };
        let mut held = Held { lock: self, dir: Some(dir), legacy: None, marked: false };
        match self.legacy.acquire(deadline, &mut contended, give_up)? {
            Acquired::Locked(f) => held.legacy = Some(f),
            Acquired::Absent => {} // a log being created: `LOCK` comes right after its first segment
            Acquired::TimedOut => return Err(timeout(&self.legacy)),
            Acquired::GaveUp => return Err(withdrawn()),
        }
        // A waiter's turn is counted: a writer that let the lock go to it steps
        // aside until then. (An uncontended take is not.)
        if waiting.1 {
            self.count_turn();
        }
        drop(waiting);
        // The last holder let go without clearing its mark (it died holding the
        // lock): its last group may be in the page cache only. Made durable
        // before anyone reads it under the lock; if that fails, the turn does
        // (the mark stays for the next holder).
        if self.holder_mark() != Some(0) {
            sync_last_segment(&self.dir.path, UNCLEAN_SYNC_OP)?;
        }
        held.marked = self.set_holder_mark(u64::from(std::process::id()));
        Ok(held)
    }

    /// The pid marked in `LOCK` by the holder that has not let go cleanly (0:
    /// the last one did), or `None` when it cannot be read (no `LOCK` yet).
    fn holder_mark(&self) -> Option<u64> {
        use std::os::unix::fs::FileExt;
        let mut t = self.turns.lock().expect("turns");
        if t.is_none() {
            *t = self.legacy.open_for_turns();
        }
        let mut b = [0u8; 8];
        match t.as_ref()?.read_at(&mut b, HOLDER_MARK_AT) {
            Ok(8) => Some(u64::from_le_bytes(b)),
            // Written by a build without the mark (or a new log): nobody died in it.
            Ok(_) => Some(0),
            Err(_) => None,
        }
    }

    /// As the holder: records up to `seq` are durable (see [`DURABLE_MARK_AT`]).
    /// Best effort: a reader that cannot read it syncs what it reads itself.
    pub(crate) fn set_durable_mark(&self, seq: u64) {
        use std::os::unix::fs::FileExt;
        let t = self.turns.lock().expect("turns");
        if let Some(f) = t.as_ref() {
            let _ = f.write_all_at(&seq.to_le_bytes(), DURABLE_MARK_AT);
        }
    }

    /// The durable mark as it stands (`None`: none, or it cannot be read).
    pub(crate) fn durable_mark_now(&self) -> Option<u64> {
        let mut t = self.turns.lock().expect("turns");
        if t.is_none() {
            *t = self.legacy.open_for_turns();
        }
        durable_mark(t.as_ref()?)
    }

    /// Write `pid` as the holder's mark; whether it was written.
    fn set_holder_mark(&self, pid: u64) -> bool {
        use std::os::unix::fs::FileExt;
        let t = self.turns.lock().expect("turns");
        t.as_ref().is_some_and(|f| f.write_all_at(&pid.to_le_bytes(), HOLDER_MARK_AT).is_ok())
    }
}

/// The last sequence the holders of the append lock say is durable (see
/// [`DURABLE_MARK_AT`]), read from `lock` (the log's `LOCK`, opened by
/// [`open_for_marks`]); `None` when there is no such mark (a `LOCK` written only by
/// builds without it, or none).
pub(crate) fn durable_mark(lock: &File) -> Option<u64> {
    use std::os::unix::fs::FileExt;
    let mut b = [0u8; 8];
    match lock.read_at(&mut b, DURABLE_MARK_AT) {
        Ok(8) => Some(u64::from_le_bytes(b)),
        _ => None,
    }
}

/// The log's `LOCK`, opened for reading its marks (never through a link, never a
/// FIFO or device); `None` if there is none.
pub(crate) fn open_for_marks(dir: &Path) -> Option<File> {
    std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(dir.join(LOCK_FILE))
        .ok()
        .filter(|f| f.metadata().is_ok_and(|m| m.file_type().is_file()))
}

/// Make the last segment of the log in `dir` durable: what a holder that died
/// between its write and its sync left in the page cache. (Sealed segments were
/// synced before their successor was created.)
/// `op` names the sync in an error.
pub(crate) fn sync_last_segment(dir: &Path, op: &'static str) -> Result<()> {
    let Some((_, path)) = super::dir::list_segments(dir)?.pop() else { return Ok(()) };
    if op == UNCLEAN_SYNC_OP {
        fail::fail_point!("lock::sync_after_unclean_holder", |_| {
            Err(Error::io(op, &path)(std::io::Error::other("injected fdatasync failure")))
        });
    }
    let f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(&path)
        .map_err(Error::io(op, &path))?;
    f.sync_data().map_err(Error::io(op, &path))
}

/// What a failed sync after a holder that died is called (in `IO_ERROR`'s message).
const UNCLEAN_SYNC_OP: &str = "fdatasync what a writer that died holding the append lock left";

enum Acquired {
    Locked(File),
    /// The target does not exist (only `LOCK` may be absent).
    Absent,
    TimedOut,
    /// The caller's `give_up` said so while it waited.
    GaveUp,
}

/// How often a wait for the lock asks its caller whether to give up.
pub const GIVE_UP_POLL_MS: u64 = 5;

impl Target {
    /// A fresh description, or `None` when `LOCK` does not exist (it is created
    /// with the first segment, never by a lock attempt: its presence marks a log).
    fn open_description(&self) -> Result<Option<File>> {
        let mut o = std::fs::OpenOptions::new();
        if self.is_dir {
            // The log directory itself may be reached through a symlink the user
            // chose; files inside it never are.
            o.read(true).custom_flags(libc::O_DIRECTORY);
        } else {
            o.read(true).custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK);
        }
        match o.open(&self.path) {
            Ok(f) if !self.is_dir && !f.metadata().is_ok_and(|m| m.file_type().is_file()) => Err(Error::Corruption {
                segment: self.path.clone(),
                offset: 0,
                seq: 0,
                detail: "LOCK is not a regular file (a FIFO, device, socket or directory); a log holds only regular \
                             files"
                    .into(),
            }),
            Ok(f) => Ok(Some(f)),
            Err(e) if !self.is_dir && e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(Error::io("open for locking", &self.path)(e)),
        }
    }

    /// A read-write description of `LOCK` for its turn counter, or `None` (no
    /// `LOCK` yet, or not writable by this process).
    fn open_for_turns(&self) -> Option<File> {
        std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
            .open(&self.path)
            .ok()
            .filter(|f| f.metadata().is_ok_and(|m| m.file_type().is_file()))
    }

    fn try_once(&self, file: &File) -> Result<bool> {
        match fs4::FileExt::try_lock(file) {
            Ok(()) => Ok(true),
            Err(fs4::TryLockError::WouldBlock) => Ok(false),
            Err(fs4::TryLockError::Error(e)) => Err(Error::io("lock", &self.path)(e)),
        }
    }

    /// The locked description, or `None` at the deadline. Short waits spin on
    /// `try_lock`; longer ones queue in the kernel (a blocking `flock`, without
    /// polling) on a helper thread with its own description, because `flock` cannot
    /// time out and a stopped holder must not hang every other writer forever. If
    /// the deadline passes first, the helper closes its description as soon as it
    /// wins, which releases a lock nobody else believes they hold.
    /// `contended` runs once the first try finds the lock taken.
    fn acquire(&self, deadline: Instant, contended: &mut dyn FnMut(), give_up: &dyn Fn() -> bool) -> Result<Acquired> {
        let start = Instant::now();
        let spare = self.spare.lock().expect("spare").take();
        let Some(file) = spare.map_or_else(|| self.open_description(), |f| Ok(Some(f)))? else {
            return Ok(Acquired::Absent);
        };
        if self.try_once(&file)? {
            return Ok(Acquired::Locked(file));
        }
        contended();
        while start.elapsed() < Duration::from_micros(SPIN_US) {
            if self.try_once(&file)? {
                return Ok(Acquired::Locked(file));
            }
            std::hint::spin_loop();
        }
        // A caller that would rather not wait (an async caller leading on its own
        // thread, a drain already begun) hears so before the wait queues in the
        // kernel.
        if give_up() {
            return Ok(Acquired::GaveUp);
        }
        let (tx, rx) = mpsc::sync_channel::<(std::io::Result<()>, File)>(1);
        std::thread::Builder::new()
            .name("fencelog-lock-wait".into())
            .spawn(move || {
                let got = fs4::FileExt::lock(&file);
                // If the waiter gave up, the channel is closed (or closes with the
                // message in it): either way `file` is closed, releasing the lock.
                let _ = tx.send((got, file));
            })
            .map_err(Error::io("spawn lock waiter", &self.path))?;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match rx.recv_timeout(left.min(Duration::from_millis(GIVE_UP_POLL_MS))) {
                Ok((Ok(()), file)) => return Ok(Acquired::Locked(file)),
                Ok((Err(e), _)) => return Err(Error::io("lock", &self.path)(e)),
                // Dropping `rx` makes the helper close its description when it wins.
                Err(mpsc::RecvTimeoutError::Timeout) if give_up() => return Ok(Acquired::GaveUp),
                Err(mpsc::RecvTimeoutError::Timeout) if !left.is_zero() => {}
                Err(_) => return Ok(Acquired::TimedOut),
            }
        }
    }

    /// Unlock and keep the description for the next acquire (closing it would also
    /// release it; it is kept only if the unlock certainly happened).
    fn release(&self, file: File) {
        if fs4::FileExt::unlock(&file).is_ok() {
            *self.spare.lock().expect("spare") = Some(file);
        }
    }
}

impl Drop for Held<'_> {
    fn drop(&mut self) {
        // Let go cleanly: everything this holder wrote is synced or cut back. Not
        // after a panic holding the lock (bytes may be written and not synced).
        if self.marked && !std::thread::panicking() {
            self.lock.set_holder_mark(0);
        }
        // Let go to a waiter: this writer steps aside at its next acquire, until
        // the count moves from where it is now.
        self.lock.note_yield();
        // Reverse order of taking.
        if let Some(f) = self.legacy.take() {
            self.lock.legacy.release(f);
        }
        if let Some(f) = self.dir.take() {
            self.lock.dir.release(f);
        }
    }
}

/// How many times `/proc/locks` is read looking for a holder before saying it
/// cannot tell.
const PROC_LOCKS_READS_MAX: usize = 4;
/// Largest `/proc/locks` read (a system with more locks than this is told about
/// in part: the holder may then not be found).
const PROC_LOCKS_BYTES_MAX: usize = 4 << 20;

/// The pid of the process holding an exclusive `flock` on `path`, as the kernel
/// reports it in `/proc/locks` (the process that took the lock), when it can tell.
///
/// The kernel renders `/proc/locks` a page at a time and lets the list change
/// between pages: a lock taken or let go elsewhere between two `read`s shifts the
/// entries, so a line can be skipped (or shown twice). One read of a large buffer
/// gets the first page whole, and the file is read again, a bounded number of
/// times, while the holder's line is missing.
pub(crate) fn holder_pid(path: &Path) -> Option<u32> {
    use std::os::unix::fs::MetadataExt;
    let meta = std::fs::metadata(path).ok()?;
    let (major, minor) = (libc::major(meta.dev()), libc::minor(meta.dev()));
    (0..PROC_LOCKS_READS_MAX).find_map(|_| {
        let text = read_proc_locks().ok()?;
        parse_proc_locks(&text, major, minor, meta.ino())
    })
}

/// `/proc/locks`, read with a large buffer from the first `read` (a small first
/// read would render it one entry per `read`, each a chance for the list to move).
fn read_proc_locks() -> std::io::Result<String> {
    use std::io::Read;
    let mut f = File::open("/proc/locks")?;
    let mut buf = vec![0u8; 256 << 10];
    let mut len = 0;
    loop {
        if len == buf.len() {
            if buf.len() >= PROC_LOCKS_BYTES_MAX {
                break;
            }
            buf.resize(buf.len() * 2, 0);
        }
        match f.read(&mut buf[len..]) {
            Ok(0) => break,
            Ok(n) => len += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    buf.truncate(len);
    Ok(String::from_utf8_lossy(&buf).into_owned())
}

/// Find the holder in `/proc/locks` lines such as
/// `3: FLOCK  ADVISORY  WRITE 4242 fd:01:131 0 EOF` (device in hex, inode decimal);
/// lines of waiters (`3: -> FLOCK ...`) are skipped.
fn parse_proc_locks(text: &str, major: u32, minor: u32, ino: u64) -> Option<u32> {
    text.lines().find_map(|line| {
        let f: Vec<&str> = line.split_whitespace().collect();
        if f.len() < 6 || f[1] != "FLOCK" {
            return None;
        }
        let mut id = f[5].split(':');
        let (maj, min, i) = (id.next()?, id.next()?, id.next()?);
        let same = u32::from_str_radix(maj, 16).ok()? == major
            && u32::from_str_radix(min, 16).ok()? == minor
            && i.parse::<u64>().ok()? == ino;
        if same { f[4].parse().ok() } else { None }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proc_locks_holder_is_found_by_device_and_inode_and_waiters_are_skipped() {
        let text = "1: POSIX  ADVISORY  WRITE 99 fd:01:131 0 EOF\n\
                    2: FLOCK  ADVISORY  WRITE 4242 fd:01:131 0 EOF\n\
                    2: -> FLOCK  ADVISORY  WRITE 77 fd:01:131 0 EOF\n\
                    3: FLOCK  ADVISORY  WRITE 5 08:02:131 0 EOF\n";
        assert_eq!(parse_proc_locks(text, 0xfd, 1, 131), Some(4242));
        assert_eq!(parse_proc_locks(text, 8, 2, 131), Some(5));
        assert_eq!(parse_proc_locks(text, 8, 2, 132), None);
    }

    /// Proves: the holder is named while locks elsewhere are taken and let go all
    /// the time (other logs of this process, other processes): `/proc/locks`,
    /// rendered a page per `read` with the list free to move between reads, used to
    /// lose the holder's line about one read in twenty here.
    #[test]
    fn the_holder_is_named_while_other_locks_churn() {
        use std::sync::atomic::{AtomicBool, Ordering};
        let d = tempfile::tempdir().unwrap();
        let held = File::create(d.path().join("held")).unwrap();
        fs4::FileExt::lock(&held).unwrap();
        let stop = std::sync::Arc::new(AtomicBool::new(false));
        let churners: Vec<_> = (0..2)
            .map(|k| {
                let files: Vec<File> =
                    (0..40).map(|i| File::create(d.path().join(format!("churn-{k}-{i}"))).unwrap()).collect();
                let stop = stop.clone();
                std::thread::spawn(move || {
                    while !stop.load(Ordering::Relaxed) {
                        files.iter().for_each(|f| fs4::FileExt::lock(f).unwrap());
                        files.iter().for_each(|f| fs4::FileExt::unlock(f).unwrap());
                    }
                })
            })
            .collect();
        let named = (0..500).filter(|_| holder_pid(&d.path().join("held")) == Some(std::process::id())).count();
        stop.store(true, Ordering::Relaxed);
        churners.into_iter().for_each(|t| t.join().unwrap());
        assert_eq!(named, 500, "the holder was not found in every read of /proc/locks");
    }

    #[test]
    fn a_holder_is_marked_while_it_holds_and_unmarked_only_when_it_lets_go_cleanly() {
        // Proves: the holder's pid stands in `LOCK` while it holds the lock and is
        // cleared when it lets go; a holder that panics holding it leaves its
        // mark (the next one then syncs the last segment before it holds).
        let d = tempfile::tempdir().unwrap();
        std::fs::write(d.path().join(LOCK_FILE), b"").unwrap();
        let seg = d.path().join("00000000000000000001.seg");
        std::fs::write(&seg, b"not read here").unwrap();
        let mark = || {
            let b = std::fs::read(d.path().join(LOCK_FILE)).unwrap();
            b.get(8..16).map(|m| u64::from_le_bytes(m.try_into().unwrap()))
        };
        let lock = AppendLock::open(d.path()).unwrap();
        let held = lock.acquire(1_000).unwrap();
        assert_eq!(mark(), Some(u64::from(std::process::id())));
        drop(held);
        assert_eq!(mark(), Some(0), "let go cleanly");
        let panicked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let _held = lock.acquire(1_000).unwrap();
            panic!("holding the lock");
        }));
        assert!(panicked.is_err());
        assert_eq!(mark(), Some(u64::from(std::process::id())), "a panic holding the lock leaves the mark");
        // (That the next holder's sync then comes first, and fails its turn when
        // it fails: `tests/failpoints.rs`, where failpoints are serialised.)
        drop(lock.acquire(1_000).unwrap());
        assert_eq!(mark(), Some(0));
    }

    #[test]
    fn a_lock_held_elsewhere_times_out_naming_the_holder_and_a_later_wait_is_not_fooled() {
        // Proves: a timed-out wait does not leave a description that later "holds"
        // the lock for another caller: while this process's first description holds
        // the lock, a second `AppendLock` (another description, as another process
        // would have) times out and names this pid; after release it gets the lock.
        let d = tempfile::tempdir().unwrap();
        let a = AppendLock::open(d.path()).unwrap();
        let b = AppendLock::open(d.path()).unwrap();
        let held = a.acquire(100).unwrap();
        for _ in 0..3 {
            match b.acquire(30) {
                Err(Error::LockTimeout { holder_pid, .. }) => assert_eq!(holder_pid, Some(std::process::id())),
                Err(e) => panic!("unexpected {e}"),
                Ok(_) => panic!("two descriptions held one lock"),
            }
        }
        drop(held);
        // The abandoned helpers of `b` may win and close their descriptions; `a`
        // must still be able to take the lock, and while `a` holds it, `b` must not.
        std::thread::sleep(Duration::from_millis(50));
        let held = a.acquire(1_000).unwrap();
        assert!(matches!(b.acquire(30), Err(Error::LockTimeout { .. })));
        drop(held);
        let _b = b.acquire(1_000).unwrap();
    }

    /// Proves: a caller that would rather not wait (an async caller leading on its
    /// own thread) is asked once the lock is found taken — before any wait in the
    /// kernel, which the lock's whole `wait_ms_max` could not end — and, saying so,
    /// gets `WITHDRAWN` with nothing taken and no word left that it waits; a free
    /// lock is taken without asking.
    #[test]
    fn a_caller_that_will_not_wait_for_a_taken_lock_gives_up_before_the_wait_queues() {
        let d = tempfile::tempdir().unwrap();
        std::fs::write(d.path().join(LOCK_FILE), b"").unwrap();
        let a = AppendLock::open(d.path()).unwrap();
        let b = AppendLock::open(d.path()).unwrap();
        let asked = std::cell::Cell::new(0);
        let will_not_wait = || {
            asked.set(asked.get() + 1);
            true
        };
        let held = a.acquire(100).unwrap();
        match b.acquire_or_give_up(3_600_000, &will_not_wait) {
            Err(Error::Withdrawn { .. }) => {}
            Err(e) => panic!("unexpected {e}"),
            Ok(_) => panic!("two descriptions held one lock"),
        }
        assert_eq!(asked.get(), 1, "asked once, before queueing");
        assert!(!a.others_waiting(), "the caller that gave up still says it waits");
        drop(held);
        let _b = b.acquire_or_give_up(3_600_000, &will_not_wait).expect("a free lock");
        assert_eq!(asked.get(), 1, "a free lock is taken without asking");
    }
}
#[cfg(test)]
mod waiting_tests {
    use super::*;

    /// Proves: a writer blocked on the lock (another description, as another
    /// process would have) is seen by the holder while it waits, and no longer once
    /// it holds the lock itself.
    #[test]
    fn a_blocked_writer_is_seen_waiting_until_it_holds_the_lock() {
        let d = tempfile::tempdir().unwrap();
        std::fs::write(d.path().join(LOCK_FILE), b"").unwrap();
        let a = AppendLock::open(d.path()).unwrap();
        let b = AppendLock::open(d.path()).unwrap();
        let held = a.acquire(100).unwrap();
        assert!(!a.others_waiting());
        std::thread::scope(|s| {
            let waiter = s.spawn(|| b.acquire(10_000).map(|h| (b.others_waiting(), drop(h))));
            let deadline = Instant::now() + Duration::from_secs(10);
            while !a.others_waiting() {
                assert!(Instant::now() < deadline, "the blocked writer is not seen");
                std::thread::sleep(Duration::from_millis(2));
            }
            drop(held);
            let (others_while_b_holds, ()) = waiter.join().unwrap().unwrap();
            assert!(!others_while_b_holds, "b sees nobody waiting");
        });
        assert!(!a.others_waiting(), "b's word outlived its wait");
    }

    /// Proves (fair turns): a holder that lets the lock go while another writer
    /// waits notes the turn count; the waiter counts its turn when it takes the
    /// lock, and a count that moved ends the stepping aside; a holder that lets go
    /// with nobody waiting notes nothing, and an uncontended take counts nothing.
    #[test]
    fn a_holder_that_lets_go_to_a_waiter_steps_aside_until_the_waiter_had_its_turn() {
        let d = tempfile::tempdir().unwrap();
        std::fs::write(d.path().join(LOCK_FILE), b"").unwrap();
        let a = AppendLock::open(d.path()).unwrap();
        let b = AppendLock::open(d.path()).unwrap();
        drop(a.acquire(100).unwrap());
        assert_eq!((a.turn_count(), a.yielded.lock().unwrap().is_some()), (Some(0), false), "nobody waited");
        let held = a.acquire(100).unwrap();
        let (got_tx, got_rx) = std::sync::mpsc::channel();
        let (go_tx, go_rx) = std::sync::mpsc::channel::<()>();
        std::thread::scope(|s| {
            let b = &b;
            s.spawn(move || {
                let h = b.acquire(10_000).unwrap();
                got_tx.send(b.turn_count()).unwrap();
                go_rx.recv().unwrap();
                drop(h);
            });
            let deadline = Instant::now() + Duration::from_secs(10);
            while !a.others_waiting() {
                assert!(Instant::now() < deadline, "the blocked writer is not seen");
                std::thread::yield_now();
            }
            drop(held);
            assert_eq!(a.yielded.lock().unwrap().map(|(t, _)| t), Some(0), "a let go to a waiter");
            assert_eq!(got_rx.recv().unwrap(), Some(1), "the waiter counted its turn");
            // The count moved: `a` steps aside no longer, whatever the bound.
            assert!(!a.step_aside(&|| false, Instant::now() + Duration::from_secs(3600)));
            assert_eq!(*a.stale_turn.lock().unwrap(), None, "ended by the count, not by the bound");
            go_tx.send(()).unwrap();
        });
        drop(a.acquire(1_000).unwrap());
        assert_eq!(a.turn_count(), Some(1), "an uncontended take counts nothing");
    }

    /// Proves (a waiter that never takes the lock, as a stopped process's): the
    /// holder steps aside once, to its bound, marks the count stale and does not
    /// step aside again while it stays; a waiter's turn moves the count and turns
    /// stepping aside back on; nobody waiting any more ends a step aside without
    /// marking anything; a caller that gives up while stepping aside is withdrawn,
    /// and the step aside stays owed to the next caller (an async caller leading
    /// on its own thread gives up at once: it must not cost the waiter its turn).
    /// (No clock is waited on: the bound is a deadline already passed.)
    #[test]
    fn a_waiter_that_never_takes_the_lock_costs_one_step_aside_not_one_per_turn() {
        let d = tempfile::tempdir().unwrap();
        std::fs::write(d.path().join(LOCK_FILE), b"").unwrap();
        let (a, b, stopped) = (
            AppendLock::open(d.path()).unwrap(),
            AppendLock::open(d.path()).unwrap(),
            AppendLock::open(d.path()).unwrap(),
        );
        stopped.set_waiting(true);
        drop(a.acquire(100).unwrap());
        assert_eq!(a.yielded.lock().unwrap().map(|(t, _)| t), Some(0), "a waiter is seen");
        assert!(!a.step_aside(&|| false, Instant::now()), "the deadline ends it");
        assert_eq!(*a.stale_turn.lock().unwrap(), Some(0), "and marks the count stale");
        drop(a.acquire(100).unwrap());
        assert!(a.yielded.lock().unwrap().is_none(), "no second step aside for the same waiter");
        // A real waiter's turn moves the count.
        let held = a.acquire(100).unwrap();
        std::thread::scope(|s| {
            let b = &b;
            // The stopped waiter steps back a moment so that `b`'s own word is seen:
            // `b` then certainly found the lock taken (it counts its turn).
            stopped.set_waiting(false);
            let waiter = s.spawn(move || b.acquire(10_000).map(drop));
            let deadline = Instant::now() + Duration::from_secs(10);
            while !a.waiter_seen() {
                assert!(Instant::now() < deadline, "the blocked writer is not seen");
                std::thread::yield_now();
            }
            stopped.set_waiting(true);
            drop(held);
            waiter.join().unwrap().unwrap();
        });
        assert_eq!(a.turn_count(), Some(1), "b counted its turn");
        drop(a.acquire(100).unwrap());
        assert_eq!(a.yielded.lock().unwrap().map(|(t, _)| t), Some(1), "the stale count moved: stepping aside is back");
        // Nobody waits any more: the step aside ends, nothing marked.
        stopped.set_waiting(false);
        assert!(!a.step_aside(&|| false, Instant::now() + Duration::from_secs(3600)));
        assert_eq!(*a.stale_turn.lock().unwrap(), Some(0), "ended because nobody waits, not by the bound");
        // A caller that gives up while this writer steps aside is withdrawn.
        stopped.set_waiting(true);
        *a.yielded.lock().unwrap() = Some((1, Instant::now()));
        assert!(matches!(a.acquire_or_give_up(10_000, &|| true), Err(Error::Withdrawn { .. })));
        // ...and the step aside is still owed: the next caller, who waits, steps
        // aside for the waiter (here until the deadline already passed).
        assert_eq!(a.yielded.lock().unwrap().map(|(t, _)| t), Some(1), "a caller that gave up kept the waiter's turn");
        assert!(!a.step_aside(&|| false, Instant::now()));
        assert_eq!(*a.stale_turn.lock().unwrap(), Some(1), "the step aside ran, to its bound");
    }
}
