//! Readers waiting for a settled view (nothing in flight), and the drain: callers'
//! records refused, the queued ones waited for.

use std::sync::{MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use super::{Core, DrainOutcome, GroupCommit};
use crate::storage::error::Error;

impl<S> GroupCommit<S> {
    /// The state with nothing in flight: waits while records are (meanwhile new
    /// arrivals do not join the open group, so this is bounded by the groups
    /// already formed).
    pub fn settled(&self) -> Result<MutexGuard<'_, Core<S>>, Error> {
        let mut core = self.lock();
        core.readers_waiting += 1;
        while core.durable_seq < core.last_seq && core.poisoned.is_none() {
            core = self.recover(self.changed.wait(core));
        }
        core.readers_waiting -= 1;
        self.wake_phase();
        core.poison_check()?;
        Ok(core)
    }

    /// Stop admitting callers' records (they are refused: `Draining`) and wait, at
    /// most `wait_ms_max`, until every record already queued is durable or failed.
    pub fn drain(&self, wait_ms_max: u64) -> Result<DrainOutcome, Error> {
        let deadline = Instant::now() + Duration::from_millis(wait_ms_max);
        let mut core = self.lock();
        core.draining = true;
        self.wake_phase();
        loop {
            if core.is_settled() || core.poisoned.is_some() {
                core.poison_check()?;
                return Ok(DrainOutcome { settled: true, last_seq: core.durable_seq });
            }
            let now = Instant::now();
            if now >= deadline {
                return Ok(DrainOutcome { settled: false, last_seq: core.durable_seq });
            }
            core = match self.changed.wait_timeout(core, deadline - now) {
                Ok((g, _)) => g,
                Err(p) => self.recover(Err(PoisonError::new(p.into_inner().0))),
            };
        }
    }
}
