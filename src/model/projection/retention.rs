//! What the projection remembers, and for how long: the bounds on requests,
//! ended tenures, ended leases and processes and refusal windows, and the
//! trimming that keeps to them (in the record that adds the one past the bound).
//! What is forgotten here is still in the log.

use std::sync::Arc;

use super::evidence::{REFUSAL_WINDOWS_MAX, REFUSAL_WINDOWS_RETAIN_MS};
use super::{Outcome, Projection, RequestEntry, TenureEnd};

/// Request ids remembered in the projection (the most recent, by sequence). Older
/// ones are answered from the log itself (`request show` scans it).
pub const REQUESTS_RETAINED: usize = 100_000;
/// Released or displaced leases remembered, so a second release reports the first.
pub const TERMINAL_LEASES_RETAINED: usize = 10_000;
/// Ended tenures remembered per subject (the audit reads the full story from the log).
pub const TENURES_RETAINED: usize = 32;
/// Ended processes remembered (live ones are always kept). Each may carry 8 KiB of
/// output tails, so this bounds them to about 8 MiB of the projection (and of each
/// snapshot); older ones are in the log (`inspect dump --kind process_ended`).
pub const TERMINAL_PROCESSES_RETAINED: usize = 1_000;

impl Projection {
    pub(super) fn remember_request(&mut self, seq: u64, id: &str, digest: [u8; 32], outcomes: Vec<Outcome>) {
        let id: Arc<str> = Arc::from(id);
        self.requests.insert(Arc::clone(&id), Arc::new(RequestEntry { seq, digest, outcomes }));
        self.request_order.insert(seq, id);
        while self.request_order.len() > REQUESTS_RETAINED {
            let (_, old) = self.request_order.pop_first().expect("non-empty");
            self.requests.remove(&old);
        }
    }

    /// After decoding (a snapshot): each remembered request's id in the order by
    /// sequence becomes the one string its entry's key holds, as when it was
    /// remembered (decoding gives each its own copy: about 5 MB at the bound).
    pub fn share_request_ids(&mut self) {
        for id in self.request_order.values_mut() {
            if let Some((key, _)) = self.requests.get_key_value(id) {
                *id = Arc::clone(key);
            }
        }
    }

    /// Lease `id` ended at `seq`: the oldest ended leases past
    /// [`TERMINAL_LEASES_RETAINED`] are forgotten.
    pub(super) fn remember_terminal_lease(&mut self, seq: u64, id: u64) {
        self.terminal_leases.entry(seq).or_default().push(id);
        self.terminal_lease_count += 1;
        while self.terminal_lease_count > TERMINAL_LEASES_RETAINED {
            let (_, ids) = self.terminal_leases.pop_first().expect("non-empty");
            self.terminal_lease_count -= ids.len();
            for id in ids {
                self.leases.remove(&id);
            }
        }
    }

    /// Process `process` ended at `seq`: the oldest ended processes past
    /// [`TERMINAL_PROCESSES_RETAINED`] are forgotten.
    pub(super) fn remember_terminal_process(&mut self, seq: u64, process: u64) {
        self.terminal_processes.insert(seq, process);
        while self.terminal_processes.len() > TERMINAL_PROCESSES_RETAINED {
            let (_, old) = self.terminal_processes.pop_first().expect("non-empty");
            self.processes.remove(&old);
        }
    }

    /// A `Refused` record under `key` was written at `last_ms` (applied at
    /// `now_ms`): windows older than [`REFUSAL_WINDOWS_RETAIN_MS`] go once half
    /// the room is used, and never more than [`REFUSAL_WINDOWS_MAX`] stay.
    pub(super) fn remember_refusal_window(&mut self, key: String, last_ms: u64, now_ms: u64) {
        self.refusal_windows.insert(key, last_ms);
        let horizon = now_ms.saturating_sub(REFUSAL_WINDOWS_RETAIN_MS);
        if self.refusal_windows.len() > REFUSAL_WINDOWS_MAX / 2 {
            self.refusal_windows.retain(|_, ms| *ms >= horizon);
        }
        while self.refusal_windows.len() > REFUSAL_WINDOWS_MAX {
            let oldest = self.refusal_windows.iter().min_by_key(|(k, ms)| (**ms, (*k).clone())).map(|(k, _)| k.clone());
            if let Some(k) = oldest {
                self.refusal_windows.remove(&k);
            }
        }
    }
}

/// Keep an ended tenure, forgetting the oldest past [`TENURES_RETAINED`].
pub(super) fn push_bounded(v: &mut Vec<TenureEnd>, e: TenureEnd) {
    if v.len() == TENURES_RETAINED {
        v.remove(0);
    }
    v.push(e);
}
