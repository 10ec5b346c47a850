//! The cross-process append lock: an advisory exclusive lock (fs4) on `LOCK`, taken
//! for each group commit (or ledger transaction) and released right after its sync.
//! The wait is bounded.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use super::dir::{LOCK_FILE, open_private};
use super::error::{Error, Result};

pub(crate) struct AppendLock {
    file: Arc<File>,
    path: PathBuf,
}

pub(crate) struct Held<'a>(&'a AppendLock);

/// Spin on `try_lock` this long before queueing in the kernel.
const SPIN_US: u64 = 100;

#[derive(PartialEq)]
enum Handoff {
    Waiting,
    Acquired,
    Failed(String),
    Abandoned,
}

impl AppendLock {
    pub fn open(dir: &Path) -> Result<Self> {
        let path = dir.join(LOCK_FILE);
        Ok(AppendLock { file: Arc::new(open_private(&path, false)?), path })
    }

    fn try_once(&self) -> Result<bool> {
        match fs4::FileExt::try_lock(&*self.file) {
            Ok(()) => Ok(true),
            Err(fs4::TryLockError::WouldBlock) => Ok(false),
            Err(fs4::TryLockError::Error(e)) => Err(Error::io("lock", &self.path)(e)),
        }
    }

    /// Take the lock within `wait_ms_max`. Short waits spin on `try_lock`; longer
    /// ones queue in the kernel (a blocking `flock`, fair and without polling) on a
    /// helper thread, because `flock` itself cannot time out and a stopped holder
    /// must not hang every other writer forever. If the deadline passes first, the
    /// helper releases the lock as soon as it gets it.
    pub fn acquire(&self, wait_ms_max: u64) -> Result<Held<'_>> {
        let start = Instant::now();
        while start.elapsed() < Duration::from_micros(SPIN_US) {
            if self.try_once()? {
                return Ok(Held(self));
            }
            std::hint::spin_loop();
        }
        let state = Arc::new((Mutex::new(Handoff::Waiting), Condvar::new()));
        let (file, st) = (self.file.clone(), state.clone());
        std::thread::Builder::new()
            .name("fencelog-lock-wait".into())
            .spawn(move || {
                let got = fs4::FileExt::lock(&*file);
                let (m, cv) = &*st;
                let mut s = m.lock().expect("handoff");
                match (&*s, got) {
                    (Handoff::Abandoned, Ok(())) => drop(fs4::FileExt::unlock(&*file)),
                    (Handoff::Abandoned, Err(_)) => {}
                    (_, Ok(())) => *s = Handoff::Acquired,
                    (_, Err(e)) => *s = Handoff::Failed(e.to_string()),
                }
                cv.notify_all();
            })
            .map_err(Error::io("spawn lock waiter", &self.path))?;
        let (m, cv) = &*state;
        let deadline = start + Duration::from_millis(wait_ms_max);
        let mut s = m.lock().expect("handoff");
        while *s == Handoff::Waiting {
            let now = Instant::now();
            if now >= deadline {
                break;
            }
            s = cv.wait_timeout(s, deadline - now).expect("handoff").0;
        }
        match &*s {
            Handoff::Acquired => return Ok(Held(self)),
            Handoff::Failed(e) => return Err(Error::io("lock", &self.path)(std::io::Error::other(e.clone()))),
            _ => {}
        }
        *s = Handoff::Abandoned;
        Err(Error::LockTimeout { path: self.path.clone(), waited_ms: start.elapsed().as_millis() as u64 })
    }
}

impl Drop for Held<'_> {
    fn drop(&mut self) {
        // Closing the process also releases it; an unlock error leaves nothing to do.
        let _ = fs4::FileExt::unlock(&*self.0.file);
    }
}
