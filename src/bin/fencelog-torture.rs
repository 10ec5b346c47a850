//! A helper for crash and concurrency tests, run as a real child process: it appends
//! in a loop and prints `ACK <seq> <payload>` on stdout after each acknowledged
//! (synced) append, so a parent that `kill -9`s it knows exactly what was promised.
//!
//! usage: fencelog-torture DIR TAG COUNT [THREADS] [SEGMENT_BYTES_MAX]
//! COUNT 0 means forever.

use std::io::Write;
use std::sync::Mutex;

use fencelog::storage::{Log, LogOptions};

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.len() < 4 {
        eprintln!("usage: fencelog-torture DIR TAG COUNT [THREADS] [SEGMENT_BYTES_MAX]");
        std::process::exit(2);
    }
    let (dir, tag) = (&args[1], &args[2]);
    let count: u64 = args[3].parse().expect("COUNT");
    let threads: u64 = args.get(4).map_or(1, |t| t.parse().expect("THREADS"));
    let mut opts = LogOptions::default();
    if let Some(s) = args.get(5) {
        opts.segment_bytes_max = s.parse().expect("SEGMENT_BYTES_MAX");
    }
    let log = match Log::open(dir, opts) {
        Ok(l) => l,
        Err(e) => {
            eprintln!("open failed: {e}");
            std::process::exit(1);
        }
    };
    let out = Mutex::new(std::io::stdout());
    std::thread::scope(|s| {
        for t in 0..threads {
            let (log, out) = (&log, &out);
            s.spawn(move || {
                let mut i = 0u64;
                while count == 0 || i < count {
                    let payload = format!("{tag}-{t}-{i}-{}", "x".repeat(150));
                    match log.append(payload.as_bytes()) {
                        Ok(a) => {
                            let mut o = out.lock().unwrap();
                            writeln!(o, "ACK {} {payload}", a.first_seq).unwrap();
                            o.flush().unwrap();
                        }
                        Err(e) => {
                            eprintln!("append failed: {e}");
                            std::process::exit(1);
                        }
                    }
                    i += 1;
                }
            });
        }
    });
}
