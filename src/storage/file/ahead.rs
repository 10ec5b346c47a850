//! Threads that check a scan's chain links ahead of it ([`LinksAhead`]), for scans
//! long enough to be worth them: a verifying read of a whole log, a replay.

use std::sync::OnceLock;

use crate::format::{ChainLink, LinksAhead};

/// A scan of fewer bytes, or fewer frames, than these checks its links itself
/// (a preallocated segment can be a MiB of zeros after a few frames).
pub const LINKS_AHEAD_BYTES_MIN: usize = 1 << 20;
pub const LINKS_AHEAD_FRAMES_MIN: usize = 4096;
/// Helper threads per scan, at most (fewer on a machine with fewer cores).
pub const LINKS_AHEAD_THREADS_MAX: usize = 3;

fn helper_threads() -> usize {
    static THREADS: OnceLock<usize> = OnceLock::new();
    *THREADS.get_or_init(|| {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        cores.saturating_sub(1).min(LINKS_AHEAD_THREADS_MAX)
    })
}

/// Run `scan` over `buf[start..]` with the links of its frames checked ahead by
/// helper threads when the bytes are many and the machine has a core to spare;
/// `None` otherwise. The helpers stop when `scan` returns.
pub fn with_links_ahead<R>(
    buf: &[u8],
    start: usize,
    prev: ChainLink,
    body_max: u32,
    scan: impl FnOnce(Option<&LinksAhead<'_>>) -> R,
) -> R {
    if buf.len().saturating_sub(start) < LINKS_AHEAD_BYTES_MIN {
        return scan(None);
    }
    let ahead = LinksAhead::new(buf, start, prev, body_max);
    let helpers = helper_threads();
    if helpers == 0 || ahead.frames() < LINKS_AHEAD_FRAMES_MIN {
        return scan(None);
    }
    /// Stops the helpers however the scan ends (a `visit` that panics too).
    struct StopOnDrop<'a, 'b>(&'a LinksAhead<'b>);
    impl Drop for StopOnDrop<'_, '_> {
        fn drop(&mut self) {
            self.0.stop();
        }
    }
    std::thread::scope(|s| {
        let _stop = StopOnDrop(&ahead);
        for _ in 0..helpers {
            // No thread to be had (a pid limit): the scan checks what is left.
            if std::thread::Builder::new().name("fencelog-links".into()).spawn_scoped(s, || ahead.work()).is_err() {
                break;
            }
        }
        scan(Some(&ahead))
    })
}
