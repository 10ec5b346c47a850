//! Snapshots of the projection: `snapshots/<seq>.snap`, each checksummed and naming
//! the sequence and chain head it covers. Written with temp + fsync + rename +
//! directory fsync (they are a cache of the log, not the truth). A damaged snapshot
//! is never trusted: the loader warns and falls back to an older one or full replay.

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};

use crate::format::{ChainLink, hex};
use crate::model::Projection;
use crate::storage::{Error, SNAPSHOT_DIR};

const MAGIC: &[u8; 8] = b"FLSNAP01";
const HEADER_BYTES: usize = 8 + 8 + 32 + 8 + 4;
/// Snapshots kept on disk (the newest ones).
pub const SNAPSHOTS_KEPT: usize = 2;
/// Largest snapshot body read back (bounds memory on a corrupt length).
const SNAPSHOT_BYTES_MAX: u64 = 4 << 30;
/// A temp file older than this was left by a writer that crashed mid-snapshot.
const TEMP_ABANDONED_AFTER_MS: u64 = 10 * 60 * 1000;

pub struct Loaded {
    pub seq: u64,
    pub head: ChainLink,
    pub projection: Projection,
    pub path: PathBuf,
}

fn io(op: &'static str, p: &Path) -> impl FnOnce(std::io::Error) -> Error {
    let p = p.to_path_buf();
    move |e| Error::Io { op, path: p, source: std::sync::Arc::new(e) }
}

pub fn write(dir: &Path, seq: u64, head: &ChainLink, p: &Projection) -> Result<PathBuf, Error> {
    let sdir = dir.join(SNAPSHOT_DIR);
    let body = bincode::serde::encode_to_vec(p, bincode::config::standard()).expect("projection encodes");
    let mut bytes = Vec::with_capacity(HEADER_BYTES + body.len());
    bytes.extend_from_slice(MAGIC);
    bytes.extend_from_slice(&seq.to_le_bytes());
    bytes.extend_from_slice(head);
    bytes.extend_from_slice(&(body.len() as u64).to_le_bytes());
    bytes.extend_from_slice(&crc32fast::hash(&body).to_le_bytes());
    bytes.extend_from_slice(&body);
    let path = sdir.join(format!("{seq:020}.snap"));
    // Processes sharing the directory may snapshot the same sequence at once: each
    // writes its own temp file, and the renames replace one identical file by another.
    static TEMP_COUNTER: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = TEMP_COUNTER.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let tmp = sdir.join(format!(".{seq:020}.snap.{}-{n}{TEMP_SUFFIX}", std::process::id()));
    {
        use std::os::unix::fs::OpenOptionsExt;
        let mut f = fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&tmp)
            .map_err(io("create snapshot", &tmp))?;
        f.write_all(&bytes).map_err(io("write snapshot", &tmp))?;
        f.sync_all().map_err(io("fsync snapshot", &tmp))?;
    }
    fs::rename(&tmp, &path).map_err(io("rename snapshot", &path))?;
    fs::File::open(&sdir).and_then(|d| d.sync_all()).map_err(io("fsync directory", &sdir))?;
    // Pruning is best effort: another process may have pruned the same files.
    for old in list(&sdir).into_iter().rev().skip(SNAPSHOTS_KEPT) {
        let _ = fs::remove_file(old.1);
    }
    remove_abandoned_temps(&sdir);
    Ok(path)
}

const TEMP_SUFFIX: &str = ".tmp";

/// Remove temp files left by crashed snapshot writers (old enough that no live
/// writer can still be filling them).
fn remove_abandoned_temps(sdir: &Path) {
    let abandoned = std::time::Duration::from_millis(TEMP_ABANDONED_AFTER_MS);
    for e in fs::read_dir(sdir).into_iter().flatten().filter_map(|e| e.ok()) {
        let name = e.file_name().to_string_lossy().into_owned();
        let old = e.metadata().ok().and_then(|m| m.modified().ok()).and_then(|t| t.elapsed().ok());
        if name.starts_with('.') && name.ends_with(TEMP_SUFFIX) && old.is_some_and(|age| age > abandoned) {
            let _ = fs::remove_file(e.path());
        }
    }
}

fn list(sdir: &Path) -> Vec<(u64, PathBuf)> {
    let mut v: Vec<(u64, PathBuf)> = fs::read_dir(sdir)
        .into_iter()
        .flatten()
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            let seq = name.strip_suffix(".snap")?.parse().ok()?;
            Some((seq, e.path()))
        })
        .collect();
    v.sort();
    v
}

fn read_one(path: &Path) -> Result<(u64, ChainLink, Projection), String> {
    let len = fs::metadata(path).map_err(|e| e.to_string())?.len();
    if len > SNAPSHOT_BYTES_MAX {
        return Err(format!("{len} bytes exceeds the snapshot limit"));
    }
    let b = fs::read(path).map_err(|e| e.to_string())?;
    if b.len() < HEADER_BYTES || &b[..8] != MAGIC {
        return Err("not a snapshot (bad magic or short)".into());
    }
    let seq = u64::from_le_bytes(b[8..16].try_into().expect("8"));
    let head: ChainLink = b[16..48].try_into().expect("32");
    let body_len = u64::from_le_bytes(b[48..56].try_into().expect("8")) as usize;
    let crc = u32::from_le_bytes(b[56..60].try_into().expect("4"));
    let body = &b[HEADER_BYTES..];
    if body.len() != body_len || crc32fast::hash(body) != crc {
        return Err("checksum or length mismatch".into());
    }
    let (p, _): (Projection, usize) =
        bincode::serde::decode_from_slice(body, bincode::config::standard()).map_err(|e| e.to_string())?;
    if p.last_seq != seq {
        return Err(format!("covers sequence {} but says {seq}", p.last_seq));
    }
    Ok((seq, head, p))
}

/// Newest snapshot that passes its checks, with a warning for each one skipped.
pub fn load_newest(dir: &Path) -> (Option<Loaded>, Vec<String>) {
    let mut warnings = Vec::new();
    for (_, path) in list(&dir.join(SNAPSHOT_DIR)).into_iter().rev() {
        match read_one(&path) {
            Ok((seq, head, projection)) => return (Some(Loaded { seq, head, projection, path }), warnings),
            Err(e) => {
                tracing::warn!(snapshot = %path.display(), error = %e, "damaged snapshot ignored");
                warnings.push(format!("{}: {e}; ignored", path.display()));
            }
        }
    }
    (None, warnings)
}

pub fn describe(seq: u64, head: &ChainLink) -> String {
    format!("sequence {seq}, chain head {}", hex(head))
}
