//! A helper for crash and concurrency tests, run as a real child process: it appends
//! in a loop and prints `ACK <seq> <payload>` on stdout after each acknowledged
//! (synced) append, so a parent that `kill -9`s it knows exactly what was promised.
//!
//! usage: `fencelog-torture DIR TAG COUNT [THREADS] [SEGMENT_BYTES_MAX]`
//! COUNT 0 means forever.
//!
//! usage: `fencelog-torture lock DIR WAIT_MS HOLD_MS`
//! Takes the append lock of an existing log (waiting at most WAIT_MS), prints `HELD`
//! and holds it for HOLD_MS (printing `WAITING` once another writer says it waits); exits 3 printing `TIMEOUT <holder pid or ?>` if the lock
//! could not be had in time.
//!
//! usage: `fencelog-torture ledger DIR TAG THREADS OPS SUBJECTS`
//! THREADS threads share one ledger (its group commit) and run OPS transactions each
//! (0: forever) on SUBJECTS shared subjects: claim (over a dead owner with its
//! evidence), heartbeat, fence rotation, release, and writes with a stale generation
//! (refused FENCED). Each is tagged with the request id `TAG-thread-op`; the helper
//! prints `ACK <seq> <request id>` once it is committed (durable) and
//! `REFUSED <code> <request id>` when refused.

//!
//! usage: `fencelog-torture eio SYSCALLS PROGRAM ARGS...`
//! Makes the kernel fail every call of the named system calls (comma-separated:
//! `fdatasync`, `fsync`) with EIO for this process and what it `exec`s (a seccomp
//! filter, kept across `exec`), then `exec`s PROGRAM: a real I/O error where a
//! disk would give one, for the real binary.

use std::io::Write;
use std::sync::Mutex;

use fencelog::storage::{Log, LogOptions};

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some("ledger") {
        return ledger(&args[2..]);
    }
    if args.get(1).map(String::as_str) == Some("lock") {
        return hold_lock(&args[2..]);
    }
    if args.get(1).map(String::as_str) == Some("eio") {
        return eio_then_exec(&args[2..]);
    }
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
    let log = opened(Log::open(dir, opts));
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

fn hold_lock(args: &[String]) {
    let [dir, wait_ms, hold_ms] = args else {
        eprintln!("usage: fencelog-torture lock DIR WAIT_MS HOLD_MS");
        std::process::exit(2);
    };
    let opts = LogOptions { create: false, lock_wait_ms_max: wait_ms.parse().expect("WAIT_MS"), ..Default::default() };
    let hold = std::time::Duration::from_millis(hold_ms.parse().expect("HOLD_MS"));
    let timeout = |e: fencelog::storage::Error| -> ! {
        if let fencelog::storage::Error::LockTimeout { holder_pid, .. } = e {
            println!("TIMEOUT {}", holder_pid.map_or("?".into(), |p| p.to_string()));
            std::process::exit(3);
        }
        eprintln!("failed: {e}");
        std::process::exit(1);
    };
    let log = Log::open(dir, opts).unwrap_or_else(|e| timeout(e));
    log.with_lock(|l| {
        println!("HELD");
        std::io::stdout().flush().unwrap();
        // Says once when another writer says it waits (a condition a test can wait on).
        let (start, mut said) = (std::time::Instant::now(), false);
        while start.elapsed() < hold {
            if !said && fencelog::storage::Exclusive::others_waiting(l) {
                println!("WAITING");
                std::io::stdout().flush().unwrap();
                said = true;
            }
            std::thread::sleep(std::time::Duration::from_millis(1).min(hold.saturating_sub(start.elapsed())));
        }
    })
    .unwrap_or_else(|e| timeout(e));
}

/// The opened log or ledger, or exit 1 saying why.
fn opened<T, E: std::fmt::Display>(r: Result<T, E>) -> T {
    r.unwrap_or_else(|e| {
        eprintln!("open failed: {e}");
        std::process::exit(1)
    })
}

fn ledger(args: &[String]) {
    use fencelog::ledger::{Ledger, LedgerError, LedgerOptions, identity, intent_digest};
    use fencelog::model::{Event, Txn};
    if args.len() != 5 {
        eprintln!("usage: fencelog-torture ledger DIR TAG THREADS OPS SUBJECTS");
        std::process::exit(2);
    }
    let (dir, tag) = (&args[0], &args[1]);
    let [threads, ops, subjects]: [u64; 3] = std::array::from_fn(|i| args[i + 2].parse().expect("a number"));
    let ledger = opened(Ledger::open(dir, LedgerOptions::default()));
    let out = Mutex::new(std::io::stdout());
    std::thread::scope(|s| {
        for t in 0..threads {
            let (ledger, out) = (&ledger, &out);
            s.spawn(move || {
                let me = identity::probe(std::process::id(), uuid::Uuid::new_v4()).expect("own identity");
                // xorshift, seeded per process and thread
                let mut x = (u64::from(std::process::id()) << 20) ^ (t + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15);
                let mut rand = move || {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    x
                };
                let (mut i, mut mine) = (0u64, None::<String>);
                while ops == 0 || i < ops {
                    // Mostly work on the subject this thread holds; else pick any.
                    let roll = rand() % 100;
                    let subject = match &mine {
                        Some(m) if roll < 70 => m.clone(),
                        _ => format!("s/{}", rand() % subjects),
                    };
                    let roll = rand() % 100;
                    let (mut kind, mut chosen, holds_one) = ("", subject.clone(), mine.is_some());
                    let id = format!("{tag}-{t}-{i}");
                    let tag = fencelog::model::RequestTag { id: id.clone(), digest: intent_digest(&id) };
                    let result = ledger.submit(Some(tag), |p, now_ms, writer| {
                        let current = p.subject(&subject);
                        let generation = current.map_or(0, |c| c.generation);
                        let owner = current.and_then(|c| c.owner.as_ref());
                        let event = match owner {
                            None => Event::Claim {
                                subject: subject.clone(),
                                owner: me.clone(),
                                stale_after_ms: 60_000,
                                lock: None,
                                previous: None,
                            },
                            Some(o) if o.identity.instance == me.instance => match roll {
                                0..60 => Event::Heartbeat { subject: subject.clone(), generation },
                                60..75 => Event::RotateFence { subject: subject.clone(), generation },
                                _ => Event::Release { subject: subject.clone(), generation },
                            },
                            Some(o) => {
                                match fencelog::ops::liveness::death_of(&identity::Here::local(), &o.identity, None) {
                                    Some(reason) => Event::Claim {
                                        subject: subject.clone(),
                                        owner: me.clone(),
                                        stale_after_ms: 60_000,
                                        lock: None,
                                        previous: p.dead_owner(&subject, reason),
                                    },
                                    // Held by a live owner: now and then write as a zombie would,
                                    // with a generation that is no longer current; else, holding
                                    // none, claim a free subject if there is one.
                                    None => {
                                        let free = (0..subjects)
                                            .map(|k| format!("s/{k}"))
                                            .find(|k| p.subject(k).is_none_or(|c| c.owner.is_none()));
                                        match free {
                                            Some(free) if roll >= 20 && !holds_one => {
                                                chosen = free.clone();
                                                Event::Claim {
                                                    subject: free,
                                                    owner: me.clone(),
                                                    stale_after_ms: 60_000,
                                                    lock: None,
                                                    previous: None,
                                                }
                                            }
                                            _ => Event::Heartbeat {
                                                subject: subject.clone(),
                                                generation: generation - 1,
                                            },
                                        }
                                    }
                                }
                            }
                        };
                        kind = event.kind();
                        Ok(Txn::new(now_ms, writer, vec![event]))
                    });
                    let line = match result {
                        Ok(c) => {
                            match kind {
                                "claim" => mine = Some(chosen),
                                "release" => mine = None,
                                _ => {}
                            }
                            format!("ACK {} {id}", c.seq.unwrap_or(0))
                        }
                        Err(LedgerError::Refused(r)) => format!("REFUSED {} {id}", r.code()),
                        Err(e) => {
                            eprintln!("submit failed: {e}");
                            std::process::exit(1);
                        }
                    };
                    let mut o = out.lock().unwrap();
                    writeln!(o, "{line}").unwrap();
                    o.flush().unwrap();
                    i += 1;
                }
            });
        }
    });
}

/// `eio SYSCALLS PROGRAM ARGS...`: a seccomp filter that answers the named system
/// calls with EIO (everything else passes), then `exec` PROGRAM under it.
fn eio_then_exec(args: &[String]) {
    use std::os::unix::process::CommandExt;
    let [syscalls, program, rest @ ..] = args else {
        eprintln!("usage: fencelog-torture eio SYSCALLS PROGRAM ARGS...");
        std::process::exit(2);
    };
    let numbers: Vec<u32> = syscalls
        .split(',')
        .map(|name| match name {
            "fdatasync" => libc::SYS_fdatasync as u32,
            "fsync" => libc::SYS_fsync as u32,
            other => {
                eprintln!("eio: unknown system call {other:?} (fdatasync, fsync)");
                std::process::exit(2)
            }
        })
        .collect();
    #[cfg(target_arch = "x86_64")]
    const AUDIT_ARCH: u32 = 0xC000_003E;
    #[cfg(target_arch = "aarch64")]
    const AUDIT_ARCH: u32 = 0xC000_00B7;
    let stmt = |code: u32, k: u32| libc::sock_filter { code: code as u16, jt: 0, jf: 0, k };
    let jeq = |k: u32, jt: u8, jf: u8| libc::sock_filter {
        code: (libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K) as u16,
        jt,
        jf,
        k,
    };
    let ret_allow = stmt(libc::BPF_RET | libc::BPF_K, libc::SECCOMP_RET_ALLOW);
    let ret_eio = stmt(libc::BPF_RET | libc::BPF_K, libc::SECCOMP_RET_ERRNO | libc::EIO as u32);
    // seccomp_data: nr at offset 0, arch at offset 4.
    let mut prog = vec![stmt(libc::BPF_LD | libc::BPF_W | libc::BPF_ABS, 4), jeq(AUDIT_ARCH, 1, 0), ret_allow];
    prog.push(stmt(libc::BPF_LD | libc::BPF_W | libc::BPF_ABS, 0));
    for (i, nr) in numbers.iter().enumerate() {
        // Equal: jump to the EIO return after the remaining tests and the allow.
        let to_eio = (numbers.len() - i) as u8;
        prog.push(jeq(*nr, to_eio, 0));
    }
    prog.push(ret_allow);
    prog.push(ret_eio);
    let fprog = libc::sock_fprog { len: prog.len() as u16, filter: prog.as_mut_ptr() };
    // SAFETY: plain prctl calls; `fprog` points at `prog`, alive across the call.
    unsafe {
        if libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0
            || libc::prctl(libc::PR_SET_SECCOMP, libc::SECCOMP_MODE_FILTER, &fprog as *const libc::sock_fprog) != 0
        {
            eprintln!("eio: installing the seccomp filter: {}", std::io::Error::last_os_error());
            std::process::exit(1);
        }
    }
    let e = std::process::Command::new(program).args(rest).exec();
    eprintln!("eio: exec {program}: {e}");
    std::process::exit(1);
}
