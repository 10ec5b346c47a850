#![allow(dead_code)]
//! Helpers shared by the integration tests.

pub mod daemon;
pub mod etcd;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use fencelog::storage::{LogOptions, read_records};

/// The `fencelog-torture` test helper (an example: `cargo test` builds it beside
/// the test binaries, in `target/<profile>/examples/`).
pub fn torture_bin() -> PathBuf {
    example_bin("fencelog-torture")
}

/// The load generator `examples/demo.rs` (`demo --dir DIR [--records N]
/// [--appenders K] [--payload-bytes B]`), built as `torture_bin`'s helper is.
pub fn demo_bin() -> PathBuf {
    example_bin("demo")
}

/// The example `name`, as `cargo test` builds it (`target/<profile>/examples/`).
fn example_bin(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("test binary path");
    let profile_dir = exe.parent().and_then(Path::parent).expect("target/<profile>/deps/<test>");
    let p = profile_dir.join("examples").join(name);
    assert!(
        p.exists(),
        "{} is missing: `cargo test` builds it; a filtered run needs `cargo test --examples --test ...`",
        p.display()
    );
    p
}

/// Copy every regular file of `from` into a fresh temp directory.
pub fn copy_dir(from: &Path) -> tempfile::TempDir {
    let to = tempfile::tempdir().unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        if e.file_type().unwrap().is_file() {
            std::fs::copy(e.path(), to.path().join(e.file_name())).unwrap();
        }
    }
    to
}

/// blake3 of every file under `dir` (recursively), by relative path.
pub fn hash_tree(dir: &Path) -> BTreeMap<PathBuf, String> {
    let mut out = BTreeMap::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                stack.push(p);
            } else {
                let h = blake3::hash(&std::fs::read(&p).unwrap()).to_hex().to_string();
                out.insert(p.strip_prefix(dir).unwrap().to_path_buf(), h);
            }
        }
    }
    out
}

/// All intact records as (seq, payload), verifying as it reads.
pub fn records(dir: &Path) -> Vec<(u64, Vec<u8>)> {
    let mut v = Vec::new();
    read_records(dir, 1, LogOptions::default().body_max(), |r| {
        v.push((r.seq, r.payload.to_vec()));
        true
    })
    .unwrap();
    v
}

pub fn segment_files(dir: &Path) -> Vec<PathBuf> {
    fencelog::storage::list_segments(dir).unwrap().into_iter().map(|(_, p)| p).collect()
}

/// A tiny deterministic PRNG (xorshift64*), so failures are reproducible from a seed.
pub struct Rng(pub u64);
impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

pub fn seed() -> u64 {
    std::env::var("FENCELOG_TEST_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or_else(|| {
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos() as u64 | 1
    })
}

/// This process's identity evidence (a live owner).
pub fn me() -> fencelog::model::Identity {
    fencelog::ledger::identity::probe(std::process::id(), uuid::Uuid::new_v4()).unwrap()
}

/// A transaction builder claiming `subject` for `owner` (re-runnable: the ledger
/// may judge it again).
pub fn claim(
    subject: &str,
    owner: &fencelog::model::Identity,
) -> impl FnMut(&fencelog::model::Projection, u64, uuid::Uuid) -> Result<fencelog::model::Txn, fencelog::model::Refusal>
+ use<> {
    let (subject, owner) = (subject.to_owned(), owner.clone());
    move |_p, now_ms, writer| {
        let event = fencelog::model::Event::Claim {
            subject: subject.clone(),
            owner: owner.clone(),
            stale_after_ms: 60_000,
            lock: None,
            previous: None,
        };
        Ok(fencelog::model::Txn::new(now_ms, writer, vec![event]))
    }
}

/// The format versions every crash, truncation and bit-flip test runs on.
pub const VERSIONS: [u16; 2] = [1, 2];

/// Default options writing segments of format `version`.
pub fn opts_v(version: u16) -> LogOptions {
    LogOptions { format_version: version, ..LogOptions::default() }
}

/// Leave segment `seg` as a write that stopped at byte `at` leaves it: in v1 the
/// file ends there; in v2 (preallocated) everything from there on is zeros — the
/// rest of the group and its end mark never reached the file.
pub fn stop_write_at(seg: &Path, at: u64, version: u16) {
    let f = std::fs::OpenOptions::new().write(true).open(seg).unwrap();
    if version == 1 {
        f.set_len(at).unwrap();
    } else {
        let len = f.metadata().unwrap().len();
        std::os::unix::fs::FileExt::write_all_at(&f, &vec![0u8; (len - at) as usize], at).unwrap();
    }
}

/// The segment's bytes without the zeros of its preallocated space (the frames, and
/// in v2 the end mark after them).
pub fn written_bytes(seg: &Path) -> Vec<u8> {
    let b = std::fs::read(seg).unwrap();
    let end = b.iter().rposition(|&x| x != 0).map_or(0, |p| p + 1);
    b[..end].to_vec()
}

/// Where record `seq` is: its segment and the byte offset of its frame.
pub fn record_at(dir: &Path, seq: u64) -> (PathBuf, usize) {
    let mut at = None;
    fencelog::storage::scan_dir(dir, 1, fencelog::format::BODY_BYTES_HARD_MAX, |item| {
        if let fencelog::storage::ScanItem::Record { rec, segment, offset } = item
            && rec.seq == seq
        {
            at = Some((segment.to_path_buf(), offset as usize));
        }
        true
    })
    .unwrap();
    at.expect("record present")
}

/// Recompute the checksum of record `seq` after editing the last byte of its
/// payload (a forger's edit: the frame checks out, the chain does not).
pub fn forge_record(dir: &Path, seq: u64) {
    let (seg, r) = record_at(dir, seq);
    let mut bytes = std::fs::read(&seg).unwrap();
    let body_len = u32::from_le_bytes(bytes[r..r + 4].try_into().unwrap()) as usize;
    let body = r + fencelog::format::FRAME_HEADER_BYTES;
    bytes[body + body_len - 1] ^= 1;
    let crc = crc32fast::hash(&bytes[body..body + body_len]);
    bytes[r + 4..r + 8].copy_from_slice(&crc.to_le_bytes());
    std::fs::write(&seg, &bytes).unwrap();
}

/// Offset of record `seq` in its segment.
pub fn offset_of(dir: &Path, seq: u64) -> usize {
    record_at(dir, seq).1
}

/// `fencelog ARGS` with `FENCELOG_DIR=dir`: (exit code, stdout as JSON, or Null).
pub fn fl(dir: &Path, args: &[&str]) -> (i32, serde_json::Value) {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_fencelog"))
        .args(args)
        .env("FENCELOG_DIR", dir)
        .output()
        .unwrap();
    let v = serde_json::from_slice(&out.stdout).unwrap_or(serde_json::Value::Null);
    (out.status.code().unwrap_or(-1), v)
}

/// The error code of a CLI error body (`""` if there is none).
pub fn code_of(v: &serde_json::Value) -> &str {
    v["error"]["code"].as_str().unwrap_or("")
}

/// A log made by `fencelog init` in a fresh temporary directory.
pub fn new_cli_log() -> (tempfile::TempDir, PathBuf) {
    let t = tempfile::tempdir().unwrap();
    let dir = t.path().join("log");
    let (code, v) = fl(&dir, &["init"]);
    assert_eq!(code, 0, "{v}");
    (t, dir)
}

/// Run `cmd` to completion or spawn it, retrying while the kernel says "text file
/// busy": a binary this test just copied may still be open for writing in a child
/// that another test's thread forked at that moment (it closes at that child's exec).
pub fn retry_busy<T>(mut f: impl FnMut() -> std::io::Result<T>) -> T {
    for _ in 0..50 {
        match f() {
            Err(e) if e.raw_os_error() == Some(libc::ETXTBSY) => {
                std::thread::sleep(std::time::Duration::from_millis(20))
            }
            r => return r.unwrap(),
        }
    }
    f().unwrap()
}

/// Wait until `inspect follow -v` (the child) says where it starts following
/// (its stderr line with "following"): a condition, not a pause. The reader is
/// returned to be kept alive while the child runs (its stderr stays open).
pub fn follower_started(child: &mut std::process::Child) -> std::io::BufReader<std::process::ChildStderr> {
    use std::io::BufRead;
    let mut stderr = std::io::BufReader::new(child.stderr.take().expect("the follower's stderr is piped"));
    let mut line = String::new();
    while !line.contains("following") {
        line.clear();
        assert!(stderr.read_line(&mut line).unwrap() > 0, "the follower never started");
    }
    stderr
}
