//! Staleness on the observer's own clock. On a log shared by hosts, records carry
//! each writer's wall clock, and hosts' clocks differ: a heartbeat written by a
//! host whose clock runs ahead looks fresh for as long as it runs ahead, and a
//! host whose clock runs ahead sees every other host's heartbeat as old. So a
//! takeover there is judged as Kubernetes' leader election judges a lease: on how
//! long *this* writer has watched the owner's heartbeat not change, by its own
//! monotonic clock — never on the difference of two hosts' wall clocks. What it
//! watched goes into the takeover's transaction (`StalenessObserved`), and the
//! state machine judges the takeover on that record: replay stays deterministic.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Instant;

use super::identity::Here;

/// Most subjects one observer keeps watches of; past it the oldest watch is
/// dropped (a subject watched again starts from zero: never a shorter wait).
pub const WATCHES_MAX: usize = 65_536;

/// One watch: the owner's tenure and last heartbeat as first seen, and when.
#[derive(Debug, Clone, Copy)]
struct Watch {
    generation: u64,
    heartbeat_ms: u64,
    since: Instant,
}

/// Where this writer judges liveness from, and what it has watched.
#[derive(Debug)]
pub struct Observer {
    here: Here,
    watches: Mutex<HashMap<String, Watch>>,
}

impl Observer {
    pub fn new(here: Here) -> Observer {
        Observer { here, watches: Mutex::new(HashMap::new()) }
    }

    /// This host, and whether the log is shared by hosts.
    pub fn here(&self) -> &Here {
        &self.here
    }

    /// How long (ms, this writer's monotonic clock) `subject` has been seen at
    /// `generation` with its heartbeat at `heartbeat_ms`, unchanged. The watch
    /// starts the first time this writer looks (0 then), and starts again at
    /// every change it sees: only a change it missed entirely — between two
    /// looks, the owner's heartbeat back at the same millisecond — could make it
    /// longer than the truth, and a heartbeat always moves it.
    pub fn watched_ms(&self, subject: &str, generation: u64, heartbeat_ms: u64) -> u64 {
        let now = Instant::now();
        let mut w = self.watches.lock().expect("watches");
        match w.get_mut(subject) {
            Some(seen) if seen.generation == generation && seen.heartbeat_ms == heartbeat_ms => {
                now.duration_since(seen.since).as_millis() as u64
            }
            Some(seen) => {
                *seen = Watch { generation, heartbeat_ms, since: now };
                0
            }
            None => {
                if w.len() >= WATCHES_MAX
                    && let Some(oldest) = w.iter().min_by_key(|(_, v)| v.since).map(|(k, _)| k.clone())
                {
                    w.remove(&oldest);
                }
                w.insert(subject.to_owned(), Watch { generation, heartbeat_ms, since: now });
                0
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Proves: a watch starts at zero the first time, grows while nothing
    /// changes, and starts again at zero when the heartbeat or the generation
    /// moves (waits for the clock to pass a millisecond, never sleeps a margin).
    #[test]
    fn a_watch_grows_while_nothing_changes_and_restarts_at_every_change() {
        let o = Observer::new(Here { host: "h".into(), shared: true });
        assert_eq!(o.watched_ms("s", 1, 100), 0);
        let t = Instant::now();
        while t.elapsed().as_millis() < 2 {
            std::hint::spin_loop();
        }
        assert!(o.watched_ms("s", 1, 100) >= 1);
        assert_eq!(o.watched_ms("s", 1, 101), 0, "a heartbeat");
        assert_eq!(o.watched_ms("s", 2, 101), 0, "a new tenure");
        assert_eq!(o.watched_ms("other", 1, 100), 0);
    }
}
