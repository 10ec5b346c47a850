//! The cross-process append lock: an advisory exclusive lock (fs4) on `LOCK`, taken
//! for each group commit and released right after its sync. The wait is bounded.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use super::dir::{LOCK_FILE, open_private};
use super::error::{Error, Result};

pub(crate) struct AppendLock {
    file: File,
    path: PathBuf,
}

pub(crate) struct Held<'a>(&'a AppendLock);

impl AppendLock {
    pub fn open(dir: &Path) -> Result<Self> {
        let path = dir.join(LOCK_FILE);
        Ok(AppendLock { file: open_private(&path, false)?, path })
    }

    /// Take the lock, polling with exponential backoff (20 µs → 1 ms) up to
    /// `wait_ms_max`. `flock` cannot time out by itself, and a holder that was
    /// stopped (SIGSTOP) must not hang every other writer forever.
    pub fn acquire(&self, wait_ms_max: u64) -> Result<Held<'_>> {
        let start = Instant::now();
        let mut pause = Duration::from_micros(20);
        loop {
            match fs4::FileExt::try_lock(&self.file) {
                Ok(()) => return Ok(Held(self)),
                Err(fs4::TryLockError::WouldBlock) => {}
                Err(fs4::TryLockError::Error(e)) => return Err(Error::io("lock", &self.path)(e)),
            }
            let waited = start.elapsed();
            if waited >= Duration::from_millis(wait_ms_max) {
                return Err(Error::LockTimeout { path: self.path.clone(), waited_ms: waited.as_millis() as u64 });
            }
            std::thread::sleep(pause);
            pause = (pause * 2).min(Duration::from_millis(1));
        }
    }
}

impl Drop for Held<'_> {
    fn drop(&mut self) {
        // Closing the process also releases it; an unlock error leaves nothing to do.
        let _ = fs4::FileExt::unlock(&self.0.file);
    }
}
