//! What one small durable write costs on this disk, and what makes it dearer: the
//! figures behind format v2 (docs/BENCHMARKS.md, issue 12).
//!
//!   cargo run --release --example fdatasync-costs [N]
//!
//! Each mode writes N (default 5000) records of 208 bytes with `pwrite` +
//! `fdatasync` under `target/bench-tmp`, twice, and prints the mean, p50 and p99:
//! - `append`: the file grows with every write (each sync also flushes its size);
//! - `prealloc`: the file was zero-filled and synced first (writes overwrite);
//! - `prealloc+stat`: the same with a full `stat` of the file before each write
//!   (a ctime query: since Linux 6.13 the next write then takes a fine-grained,
//!   journalled timestamp);
//! - `prealloc+statx-ino-size`: the same with a `statx` asking for inode and size only.

use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;
use std::time::Instant;

fn main() {
    let n: u64 = std::env::args().nth(1).map_or(5000, |a| a.parse().expect("N"));
    let dir = std::path::Path::new("target/bench-tmp/fdatasync-costs");
    let _ = std::fs::remove_dir_all(dir);
    std::fs::create_dir_all(dir).expect("bench dir");
    let record = vec![7u8; 208];
    for round in 0..2 {
        for mode in ["append", "prealloc", "prealloc+stat", "prealloc+statx-ino-size"] {
            let path = dir.join(format!("{mode}-{round}"));
            let f = std::fs::OpenOptions::new()
                .create(true)
                .truncate(true)
                .read(true)
                .write(true)
                .open(&path)
                .expect("open");
            if mode != "append" {
                f.write_all_at(&vec![0u8; (n * 208 + 8192) as usize], 0).expect("zero-fill");
                f.sync_all().expect("sync");
            }
            let mut lat = Vec::with_capacity(n as usize);
            let t = Instant::now();
            for i in 0..n {
                let t0 = Instant::now();
                match mode {
                    "prealloc+stat" => drop(f.metadata().expect("stat")),
                    "prealloc+statx-ino-size" => {
                        // SAFETY: a zeroed statx buffer we own, and an empty C string.
                        let mut st: libc::statx = unsafe { std::mem::zeroed() };
                        let mask = libc::STATX_INO | libc::STATX_SIZE;
                        unsafe { libc::statx(f.as_raw_fd(), c"".as_ptr(), libc::AT_EMPTY_PATH, mask, &mut st) };
                    }
                    _ => {}
                }
                f.write_all_at(&record, i * 208).expect("write");
                f.sync_data().expect("fdatasync");
                lat.push(t0.elapsed().as_secs_f64() * 1e6);
            }
            let mean = t.elapsed().as_secs_f64() * 1e6 / n as f64;
            lat.sort_by(|a, b| a.partial_cmp(b).expect("finite"));
            let (p50, p99) = (lat[lat.len() / 2], lat[lat.len() * 99 / 100]);
            println!("{mode:24} mean {mean:6.1} µs  p50 {p50:6.1} µs  p99 {p99:6.1} µs");
        }
    }
    let _ = std::fs::remove_dir_all(dir);
}
