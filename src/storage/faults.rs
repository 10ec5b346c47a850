//! Fault injection for tests of the failure paths. Always compiled (a relaxed atomic
//! load per write and per sync) so the shipped code is the tested code.

use std::sync::atomic::{AtomicI64, Ordering};

/// Countdowns: when one reaches zero, that operation fails (once armed, every later
/// one fails too, as a dead disk would). Negative means disarmed.
#[derive(Debug)]
pub struct Faults {
    writes_until_failure: AtomicI64,
    syncs_until_failure: AtomicI64,
    /// When a write fails, first write this many of its bytes (a torn write).
    torn_write_bytes: AtomicI64,
}

impl Default for Faults {
    fn default() -> Self {
        Faults {
            writes_until_failure: AtomicI64::new(-1),
            syncs_until_failure: AtomicI64::new(-1),
            torn_write_bytes: AtomicI64::new(0),
        }
    }
}

impl Faults {
    /// Fail the write after `n` more successful writes; write `torn_bytes` of it first.
    pub fn fail_write_after(&self, n: i64, torn_bytes: i64) {
        self.torn_write_bytes.store(torn_bytes, Ordering::SeqCst);
        self.writes_until_failure.store(n, Ordering::SeqCst);
    }

    /// Fail the sync after `n` more successful syncs.
    pub fn fail_sync_after(&self, n: i64) {
        self.syncs_until_failure.store(n, Ordering::SeqCst);
    }

    fn tick(counter: &AtomicI64) -> bool {
        let left = counter.load(Ordering::Relaxed);
        if left < 0 {
            return false;
        }
        if left == 0 {
            return true;
        }
        counter.store(left - 1, Ordering::Relaxed);
        false
    }

    /// `Some(prefix_len)` when this write must fail after writing `prefix_len` bytes.
    pub(crate) fn write_fails(&self, len: usize) -> Option<usize> {
        Self::tick(&self.writes_until_failure)
            .then(|| (self.torn_write_bytes.load(Ordering::Relaxed).max(0) as usize).min(len))
    }

    pub(crate) fn sync_fails(&self) -> bool {
        Self::tick(&self.syncs_until_failure)
    }
}
