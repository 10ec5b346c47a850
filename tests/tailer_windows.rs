//! The tailer reads a preallocated segment in growing windows (64 KiB first) and
//! checks the zeros after the frames in small windows, instead of reading the whole
//! segment into memory at once. These tests prove it sees exactly what a whole read
//! sees: every record, records appended later, and any byte that is not zero
//! anywhere in the unused space — however far past the first window.

mod common;

use std::fs;
use std::path::Path;

use fencelog::storage::{Log, LogOptions, Tailer, verify_dir};

/// A v2 log of `n` small records in one segment preallocated to 1 MiB.
fn short_log(dir: &Path, n: u64) {
    let log = Log::open(dir, LogOptions::default()).unwrap();
    for i in 0..n {
        log.append(format!("record {i}").as_bytes()).unwrap();
    }
    drop(log);
}

fn body_max() -> u32 {
    LogOptions::default().body_max()
}

/// Poll a new tailer once: (records visited, stopped at a torn tail).
fn tail_once(dir: &Path) -> (u64, bool) {
    let mut t = Tailer::new(dir, body_max(), 1);
    let n = t.poll(|_| {}).unwrap();
    (n, t.stopped_at_torn_tail())
}

/// Proves: a short tail in a 1 MiB preallocated segment is read whole by a tailer
/// that reads 64 KiB first, and records appended later (enough to need windows of
/// several sizes) are each visited once, in order.
#[test]
fn a_tailer_reading_in_growing_windows_visits_every_record_once_also_when_appended_later() {
    let d = tempfile::tempdir().unwrap();
    short_log(d.path(), 20);
    let seg = common::segment_files(d.path()).pop().unwrap();
    assert!(fs::metadata(&seg).unwrap().len() >= 1 << 20, "preallocated to 1 MiB");
    let mut t = Tailer::new(d.path(), body_max(), 1);
    let mut seen = vec![];
    assert_eq!(t.poll(|r| seen.push(r.seq)).unwrap(), 20);
    assert!(!t.stopped_at_torn_tail());
    assert_eq!(t.poll(|r| seen.push(r.seq)).unwrap(), 0, "nothing appended");
    // 3,000 records of ~300 bytes: about 1 MiB, past the first preallocation step
    // of the segment (read by this tailer in its small windows for appends).
    let log = Log::open(d.path(), LogOptions::default()).unwrap();
    let payload = vec![7u8; 200];
    for _ in 0..3 {
        log.append_batch((0..1000).map(|_| payload.clone()).collect()).unwrap();
    }
    drop(log);
    assert_eq!(t.poll(|r| seen.push(r.seq)).unwrap(), 3000);
    assert_eq!(seen, (1..=3020).collect::<Vec<u64>>());
    assert!(!t.stopped_at_torn_tail());
}

/// Proves: a byte that is not zero in the unused space of the last segment — just
/// past the end mark, past the first 64 KiB window, in the middle, at the very end —
/// is seen by the tailer as a whole read sees it (the records before it, then a torn
/// tail; `verify` reports it), never taken for the end of the frames.
#[test]
fn a_stray_byte_anywhere_in_the_unused_space_is_seen_past_the_first_window() {
    let base = tempfile::tempdir().unwrap();
    short_log(base.path(), 20);
    let seg_len = fs::metadata(common::segment_files(base.path()).pop().unwrap()).unwrap().len() as usize;
    let frames_end = fencelog::storage::frames_end(&common::segment_files(base.path()).pop().unwrap()).unwrap();
    assert_eq!(tail_once(base.path()), (20, false), "the clean log");
    for at in [frames_end as usize + 40, 70 << 10, 300 << 10, seg_len / 2 + 1, seg_len - 1] {
        let d = common::copy_dir(base.path());
        let seg = common::segment_files(d.path()).pop().unwrap();
        let mut bytes = fs::read(&seg).unwrap();
        assert_eq!(bytes[at], 0, "byte {at} is unused space");
        bytes[at] = 0x5a;
        fs::write(&seg, &bytes).unwrap();
        assert_eq!(tail_once(d.path()), (20, true), "a stray byte at {at}");
        let summary = verify_dir(d.path(), body_max()).unwrap();
        assert!(!summary.is_intact() && !summary.has_corruption(), "byte {at}: {summary:?}");
        assert_eq!(summary.records, 20, "byte {at}");
    }
}

/// Proves: a record larger than the first 64 KiB window is read whole by a fresh
/// tailer, and a record holding a run of zeros where a tailer's small window for
/// appends ends (as if the frames ended there) is read whole too, not taken for a
/// torn tail on every poll.
#[test]
fn records_larger_than_a_window_and_holding_zeros_are_read_whole() {
    let d = tempfile::tempdir().unwrap();
    short_log(d.path(), 3);
    let mut t = Tailer::new(d.path(), body_max(), 1);
    assert_eq!(t.poll(|_| {}).unwrap(), 3);
    // 40 KiB: 8 KiB of 'a', 24 KiB of zeros, 8 KiB of 'b'. The appends window (16
    // KiB) ends inside the zeros.
    let mut zeros_inside = vec![b'a'; 8 << 10];
    zeros_inside.extend(vec![0u8; 24 << 10]);
    zeros_inside.extend(vec![b'b'; 8 << 10]);
    let big = vec![b'c'; 200 << 10];
    let log = Log::open(d.path(), LogOptions::default()).unwrap();
    log.append(&zeros_inside).unwrap();
    log.append(b"after").unwrap();
    log.append(&big).unwrap();
    drop(log);
    let mut got = vec![];
    assert_eq!(t.poll(|r| got.push(r.payload.len())).unwrap(), 3, "the appended records");
    assert_eq!(got, vec![zeros_inside.len(), 5, big.len()]);
    assert!(!t.stopped_at_torn_tail());
    // A fresh tailer: its first window (64 KiB) is smaller than the 200 KiB record.
    let mut fresh = Tailer::new(d.path(), body_max(), 1);
    let mut all = vec![];
    assert_eq!(fresh.poll(|r| all.push(r.seq)).unwrap(), 6);
    assert_eq!(all, (1..=6).collect::<Vec<u64>>());
}
