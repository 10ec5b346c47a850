//! Snapshot storage of the file backend: `snapshots/<seq>.snap`, each checksummed
//! and naming the sequence and chain head it covers; the body is opaque bytes here
//! (the ledger's encoded projection). Written with temp + fsync + rename +
//! directory fsync (they are a cache of the log, not the truth). A damaged snapshot
//! is never trusted: the reader warns and the ledger falls back to an older one or
//! full replay.

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};

use super::dir::SNAPSHOT_DIR;
use crate::format::ChainLink;
use crate::storage::error::Error;

pub use crate::storage::backend::{SNAPSHOTS_KEPT, SnapshotMeta, digest_of};

const MAGIC: &[u8; 8] = b"FLSNAP01";
const HEADER_BYTES: usize = 8 + 8 + 32 + 8 + 4;
/// Largest snapshot file read back. A file is decoded (held whole) only after the
/// log's chain vouches for its digest; until then it is only streamed.
const SNAPSHOT_BYTES_MAX: u64 = 1 << 30;
/// A temp file older than this was left by a writer that crashed mid-snapshot.
const TEMP_ABANDONED_AFTER_MS: u64 = 10 * 60 * 1000;

fn io(op: &'static str, p: &Path) -> impl FnOnce(std::io::Error) -> Error {
    let p = p.to_path_buf();
    move |e| Error::from_io(op, p, e)
}

/// Write a snapshot of `body` covering `seq` (whose chain link is `head`).
pub fn write(dir: &Path, seq: u64, chain_head: &ChainLink, body: &[u8]) -> Result<SnapshotMeta, Error> {
    let sdir = dir.join(SNAPSHOT_DIR);
    if !sdir.is_dir() {
        use std::os::unix::fs::DirBuilderExt;
        fs::DirBuilder::new().recursive(true).mode(0o700).create(&sdir).map_err(io("create directory", &sdir))?;
    }
    let digest = digest_of(body);
    let mut bytes = Vec::with_capacity(HEADER_BYTES + body.len());
    bytes.extend_from_slice(MAGIC);
    bytes.extend_from_slice(&seq.to_le_bytes());
    bytes.extend_from_slice(chain_head);
    bytes.extend_from_slice(&(body.len() as u64).to_le_bytes());
    bytes.extend_from_slice(&crc32fast::hash(body).to_le_bytes());
    bytes.extend_from_slice(body);
    let path = sdir.join(file_name(seq));
    // Processes sharing the directory may snapshot the same sequence at once: each
    // writes its own temp file, and the renames replace one identical file by another.
    static TEMP_COUNTER: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = TEMP_COUNTER.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let tmp = sdir.join(format!(".{seq:020}.snap.{}-{n}{TEMP_SUFFIX}", std::process::id()));
    // Any failure removes the temp file: a failed snapshot leaves nothing behind.
    let written = (|| {
        use std::os::unix::fs::OpenOptionsExt;
        let mut f = fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&tmp)
            .map_err(io("create snapshot", &tmp))?;
        fail::fail_point!("snapshot::write", |_| Err(io("write snapshot", &tmp)(std::io::Error::other("injected"))));
        f.write_all(&bytes).map_err(io("write snapshot", &tmp))?;
        fail::fail_point!("snapshot::fsync", |_| Err(io("fsync snapshot", &tmp)(std::io::Error::other("injected"))));
        f.sync_all().map_err(io("fsync snapshot", &tmp))?;
        fail::fail_point!("snapshot::rename", |_| {
            Err(io("rename snapshot", &path)(std::io::Error::other("injected rename failure")))
        });
        fs::rename(&tmp, &path).map_err(io("rename snapshot", &path))
    })();
    if let Err(e) = written {
        let _ = fs::remove_file(&tmp);
        return Err(e);
    }
    super::dir::sync_dir(&sdir)?;
    // Pruning is best effort: another process may have pruned the same files.
    for old in list(&sdir).into_iter().rev().skip(SNAPSHOTS_KEPT) {
        let _ = fs::remove_file(old.1);
    }
    remove_abandoned_temps(&sdir);
    Ok(SnapshotMeta { seq, chain_head: *chain_head, digest, source: path.display().to_string() })
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

/// Read a snapshot's header and stream its body through CRC-32 and blake3
/// (bounded memory, whatever the file's size); with `keep`, also return the body
/// (for one the chain vouched for).
fn read(path: &Path, keep: bool) -> Result<(SnapshotMeta, Option<Vec<u8>>), String> {
    use std::os::unix::fs::FileExt;
    let (f, len) = super::dir::open_regular(path, SNAPSHOT_BYTES_MAX, 0).map_err(|e| e.to_string())?;
    // The header first: a file that is not a snapshot, or whose length disagrees
    // with its header, is refused before anything in proportion to it is read.
    let mut h = [0u8; HEADER_BYTES];
    if len < HEADER_BYTES as u64 || f.read_exact_at(&mut h, 0).is_err() || &h[..8] != MAGIC {
        return Err("not a snapshot (bad magic or short)".into());
    }
    let seq = u64::from_le_bytes(h[8..16].try_into().expect("8"));
    let head: ChainLink = h[16..48].try_into().expect("32");
    let body_len = u64::from_le_bytes(h[48..56].try_into().expect("8"));
    let crc = u32::from_le_bytes(h[56..60].try_into().expect("4"));
    if body_len != len - HEADER_BYTES as u64 {
        return Err(format!("the header says {body_len} body bytes but the file holds {}", len - HEADER_BYTES as u64));
    }
    let (mut crc_state, mut digest) = (crc32fast::Hasher::new(), blake3::Hasher::new());
    let kept = if keep {
        // Kept: read straight into the body's own buffer, not through a zeroed
        // chunk copied over: each is memory a short-lived runner touches for the
        // first time, a page fault per 4 KiB.
        use std::io::{Read, Seek, SeekFrom};
        let mut body = Vec::with_capacity(body_len as usize);
        let mut r = &f;
        r.seek(SeekFrom::Start(HEADER_BYTES as u64)).map_err(|e| e.to_string())?;
        r.take(body_len).read_to_end(&mut body).map_err(|e| e.to_string())?;
        if body.len() as u64 != body_len {
            return Err(format!("{} body bytes read of the {body_len} its header says", body.len()));
        }
        crc_state.update(&body);
        digest.update(&body);
        Some(body)
    } else {
        let mut chunk = vec![0u8; (1 << 20).min(body_len as usize)];
        let mut at = HEADER_BYTES as u64;
        while at < len {
            let n = chunk.len().min((len - at) as usize);
            f.read_exact_at(&mut chunk[..n], at).map_err(|e| e.to_string())?;
            crc_state.update(&chunk[..n]);
            digest.update(&chunk[..n]);
            at += n as u64;
        }
        None
    };
    if crc_state.finalize() != crc {
        return Err("checksum mismatch".into());
    }
    let meta = SnapshotMeta {
        seq,
        chain_head: head,
        digest: *digest.finalize().as_bytes(),
        source: path.display().to_string(),
    };
    Ok((meta, kept))
}

/// The first `n` bytes of a snapshot file's body (what its owner's schema tag is
/// in), without reading the rest.
pub fn body_prefix(path: &Path, n: usize) -> Result<Vec<u8>, String> {
    use std::os::unix::fs::FileExt;
    let (f, len) = super::dir::open_regular(path, SNAPSHOT_BYTES_MAX, 0).map_err(|e| e.to_string())?;
    let n = n.min(len.saturating_sub(HEADER_BYTES as u64) as usize);
    let mut prefix = vec![0u8; n];
    f.read_exact_at(&mut prefix, HEADER_BYTES as u64).map_err(|e| e.to_string())?;
    Ok(prefix)
}

/// A snapshot file's own account of itself (streamed; the body is not held).
pub fn peek(path: &Path) -> Result<SnapshotMeta, String> {
    read(path, false).map(|(m, _)| m)
}

/// The body of the snapshot `meta` describes, read again and checked to be the
/// same bytes (by digest).
pub fn body(dir: &Path, meta: &SnapshotMeta) -> Result<Vec<u8>, String> {
    let path = dir.join(SNAPSHOT_DIR).join(file_name(meta.seq));
    match read(&path, true)? {
        (m, Some(body)) if m.digest == meta.digest => Ok(body),
        _ => Err("it changed since it was checked".into()),
    }
}

/// How long ago the snapshot `meta` describes was renamed into place (its
/// file's modification time, which the rename keeps from its last write), in ms.
pub fn age_ms(dir: &Path, meta: &SnapshotMeta) -> Option<u64> {
    let path = dir.join(SNAPSHOT_DIR).join(file_name(meta.seq));
    let modified = fs::symlink_metadata(path).ok()?.modified().ok()?;
    Some(u64::try_from(modified.elapsed().ok()?.as_millis()).unwrap_or(u64::MAX))
}

fn file_name(seq: u64) -> String {
    format!("{seq:020}.snap")
}

/// The newest snapshot files (at most [`SNAPSHOTS_KEPT`]) that pass their own
/// checks, newest first, with a warning for each one skipped. Older files are not
/// read at all (they are pruned on every write). A file listed and gone when it
/// is read was pruned meanwhile by a writer that wrote a newer one: not damaged,
/// and no warning.
pub fn newest(dir: &Path) -> (Vec<SnapshotMeta>, Vec<String>) {
    newest_of(list(&dir.join(SNAPSHOT_DIR)))
}

/// [`newest`] of the files `listed` (oldest first), read one by one after.
fn newest_of(listed: Vec<(u64, PathBuf)>) -> (Vec<SnapshotMeta>, Vec<String>) {
    let mut warnings = Vec::new();
    let mut metas = Vec::new();
    for (_, path) in listed.into_iter().rev().take(SNAPSHOTS_KEPT) {
        match peek(&path) {
            Ok(m) => metas.push(m),
            Err(_) if fs::symlink_metadata(&path).is_err_and(|e| e.kind() == std::io::ErrorKind::NotFound) => {
                tracing::debug!(snapshot = %path.display(), "snapshot pruned by another writer as it was read");
            }
            Err(e) => {
                tracing::warn!(snapshot = %path.display(), error = %e, "damaged snapshot ignored");
                warnings.push(format!("{}: {e}; ignored", path.display()));
            }
        }
    }
    (metas, warnings)
}

/// Snapshot files in `dir`, oldest first (for the inspector).
pub fn list_files(dir: &Path) -> Vec<PathBuf> {
    list(&dir.join(SNAPSHOT_DIR)).into_iter().map(|(_, p)| p).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A file listed and gone when read (pruned by a writer of a newer one) is
    /// skipped without a warning; a damaged one still warns.
    #[test]
    fn a_snapshot_pruned_between_its_listing_and_its_read_is_no_warning() {
        let d = tempfile::tempdir().unwrap();
        let good = write(d.path(), 7, &[1; 32], b"state").unwrap();
        let sdir = d.path().join(SNAPSHOT_DIR);
        let damaged = sdir.join(file_name(5));
        fs::write(&damaged, b"not a snapshot").unwrap();
        let gone = sdir.join(file_name(6));
        let (metas, warnings) = newest_of(vec![(6, gone), (7, sdir.join(file_name(7)))]);
        assert_eq!(metas.iter().map(|m| m.seq).collect::<Vec<_>>(), vec![good.seq]);
        assert!(warnings.is_empty(), "{warnings:?}");
        let (metas, warnings) = newest_of(vec![(5, damaged), (7, sdir.join(file_name(7)))]);
        assert_eq!(metas.len(), 1);
        assert_eq!(warnings.len(), 1, "{warnings:?}");
        assert!(warnings[0].contains("not a snapshot"), "{warnings:?}");
    }
}
