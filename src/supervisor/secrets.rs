//! What a command is given that must not outlive it in the open: its `--env`
//! values. They never enter the log: a spawn records each one only as a *keyed*
//! blake3 digest (the key a per-log secret file beside the log, never in it), and
//! before a runner writes a process's exit record it replaces every one of them in
//! the kept output and the output tails with `[REDACTED:NAME]` (the seed runtimes'
//! `sanitizeTerminalProcessArtifacts`). See `docs/SUPERVISOR.md`, "Secrets".

use std::io::{Read, Write};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::Path;

/// The key of the environment digests: `DIR/env.key`, 32 random bytes, 0600.
pub const ENV_KEY_FILE: &str = crate::storage::ENV_KEY_FILE;
const ENV_KEY_BYTES: usize = 32;

/// Values shorter than this are not redacted from output: a two-letter value
/// would take every such pair of letters out of ordinary output. (They are still
/// only recorded as keyed digests.)
pub const REDACT_VALUE_BYTES_MIN: usize = 4;

/// The per-log key of the environment digests, made (0600, from the kernel's
/// random source) on first use. A key file that others may read is refused, as
/// ssh refuses such a private key: whoever reads it can test guesses of every
/// secret's digest offline.
pub fn env_key(dir: &Path) -> std::io::Result<[u8; ENV_KEY_BYTES]> {
    let path = dir.join(ENV_KEY_FILE);
    let read = |f: &mut std::fs::File| -> std::io::Result<[u8; ENV_KEY_BYTES]> {
        let mode = f.metadata()?.permissions().mode();
        if mode & 0o077 != 0 || !f.metadata()?.is_file() {
            return Err(std::io::Error::other(format!(
                "{} is readable by others (mode {:04o}) or not a regular file: chmod 600 it",
                path.display(),
                mode & 0o7777
            )));
        }
        let mut key = [0u8; ENV_KEY_BYTES];
        let mut rest = Vec::new();
        f.read_exact(&mut key)?;
        f.take(1).read_to_end(&mut rest)?;
        if !rest.is_empty() {
            return Err(std::io::Error::other(format!("{} holds more than a key", path.display())));
        }
        Ok(key)
    };
    let open = || std::fs::OpenOptions::new().read(true).custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK).open(&path);
    match open() {
        Ok(mut f) => return read(&mut f),
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e),
        Err(_) => {}
    }
    // Made whole and linked into place: a concurrent first caller never sees an
    // empty or half-written key; if another caller won, that one is the key.
    let mut key = [0u8; ENV_KEY_BYTES];
    std::fs::File::open("/dev/urandom")?.read_exact(&mut key)?;
    if crate::storage::create_file_whole(&path, &key)? { Ok(key) } else { read(&mut open()?) }
}

/// The digest a spawn records of an environment value.
pub fn env_digest(key: &[u8; ENV_KEY_BYTES], value: &[u8]) -> [u8; 32] {
    *blake3::keyed_hash(key, value).as_bytes()
}

/// Does `value` match a recorded digest? The keyed digest — or the plain blake3
/// that builds before the key wrote, so that a process requested by one of them
/// still starts.
pub fn env_digest_matches(key: Option<&[u8; ENV_KEY_BYTES]>, value: &[u8], recorded: &[u8; 32]) -> bool {
    key.is_some_and(|k| env_digest(k, value) == *recorded) || *blake3::hash(value).as_bytes() == *recorded
}

/// A secret to take out of output: its variable's name and value.
#[derive(Clone)]
pub struct Secret {
    pub name: String,
    pub value: Vec<u8>,
}

/// A file after [`Redactor::redact_file`]: its new length and digest, and whether
/// it was cut at its bound (markers longer than what they replaced).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Redacted {
    pub bytes: u64,
    pub blake3: [u8; 32],
    pub truncated: bool,
}

/// Replaces every occurrence of each secret by `[REDACTED:NAME]` (the longest
/// value first where several match at one place).
pub struct Redactor {
    secrets: Vec<Secret>,
    /// Is a byte the first of some secret? (Most bytes of an output are not.)
    starts: [bool; 256],
    longest: usize,
}

impl Redactor {
    /// `None` when nothing is long enough to redact.
    pub fn new(secrets: impl IntoIterator<Item = Secret>) -> Option<Redactor> {
        let mut secrets: Vec<Secret> =
            secrets.into_iter().filter(|s| s.value.len() >= REDACT_VALUE_BYTES_MIN).collect();
        if secrets.is_empty() {
            return None;
        }
        secrets.sort_by_key(|s| std::cmp::Reverse(s.value.len()));
        let mut starts = [false; 256];
        for s in &secrets {
            starts[usize::from(s.value[0])] = true;
        }
        let longest = secrets[0].value.len();
        Some(Redactor { secrets, starts, longest })
    }

    fn marker(s: &Secret) -> Vec<u8> {
        format!("[REDACTED:{}]", s.name).into_bytes()
    }

    /// The secret that starts at `buf[at..]`, if one does (whole).
    fn at(&self, buf: &[u8], at: usize) -> Option<&Secret> {
        if !self.starts[usize::from(buf[at])] {
            return None;
        }
        self.secrets.iter().find(|s| buf[at..].starts_with(&s.value))
    }

    /// `buf` redacted. `cut_before`: the bytes before `buf` were not kept (an
    /// output's tail), so a secret's end at its very start is redacted too;
    /// `cut_after`: the bytes after it were not kept (output cut at its limit), so
    /// a secret's beginning at its very end is. Such a piece is redacted when it is
    /// at least [`REDACT_VALUE_BYTES_MIN`] bytes long (shorter ones are as likely
    /// ordinary text). Returns whether anything changed.
    pub fn redact(&self, buf: &[u8], cut_before: bool, cut_after: bool) -> (Vec<u8>, bool) {
        let mut out = Vec::with_capacity(buf.len());
        let (mut i, mut changed) = (0, false);
        if cut_before && let Some((s, n)) = self.suffix_at_start(buf) {
            out.extend(Self::marker(s));
            (i, changed) = (n, true);
        }
        let end = match cut_after.then(|| self.prefix_at_end(&buf[i..])).flatten() {
            Some((_, n)) => buf.len() - n,
            None => buf.len(),
        };
        while i < end {
            if let Some(s) = self.at(buf, i).filter(|s| i + s.value.len() <= end) {
                out.extend(Self::marker(s));
                i += s.value.len();
                changed = true;
            } else {
                out.push(buf[i]);
                i += 1;
            }
        }
        if end < buf.len() {
            let (s, _) = self.prefix_at_end(&buf[end..]).expect("found above");
            out.extend(Self::marker(s));
            changed = true;
        }
        (out, changed)
    }

    /// The longest proper suffix of a secret (≥ the minimum) that `buf` starts with.
    fn suffix_at_start<'a>(&'a self, buf: &[u8]) -> Option<(&'a Secret, usize)> {
        self.secrets
            .iter()
            .flat_map(|s| (REDACT_VALUE_BYTES_MIN..s.value.len()).rev().map(move |n| (s, n)))
            .filter(|(s, n)| buf.starts_with(&s.value[s.value.len() - n..]))
            .max_by_key(|(_, n)| *n)
    }

    /// The longest proper prefix of a secret (≥ the minimum) that `buf` ends with.
    fn prefix_at_end<'a>(&'a self, buf: &[u8]) -> Option<(&'a Secret, usize)> {
        self.secrets
            .iter()
            .flat_map(|s| (REDACT_VALUE_BYTES_MIN..s.value.len()).rev().map(move |n| (s, n)))
            .filter(|(s, n)| buf.ends_with(&s.value[..*n]))
            .max_by_key(|(_, n)| *n)
    }

    /// Redact the file at `path` (a process's kept output, `cut_after` if its
    /// stream was cut at the limit), streaming it in pieces: a new file beside it
    /// (0600), synced, renamed over it, the directory synced. Returns the new
    /// length and blake3, or `None` when no secret was in it (the file is then
    /// left as it was).
    pub fn redact_file(&self, path: &Path, cut_after: bool, bytes_max: u64) -> std::io::Result<Option<Redacted>> {
        fail::fail_point!("redact::file", |_| Err(std::io::Error::other("injected")));
        let dir = path.parent().unwrap_or(Path::new("."));
        let mut src = std::fs::OpenOptions::new().read(true).custom_flags(libc::O_NOFOLLOW).open(path)?;
        let tmp = dir.join(format!(
            ".{}.redacting",
            path.file_name().map_or_else(String::new, |n| n.to_string_lossy().into_owned())
        ));
        let _ = std::fs::remove_file(&tmp);
        let mut dst = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&tmp)?;
        let redacted = match self.redact_stream(&mut src, &mut dst, cut_after, bytes_max) {
            Ok(Some(redacted)) => redacted,
            result => {
                let _ = std::fs::remove_file(&tmp);
                return result;
            }
        };
        dst.sync_all()?;
        std::fs::rename(&tmp, path)?;
        // Renamed: the redacted file is the one to name in the record from here on,
        // whether or not the directory's sync below succeeds.
        if let Err(e) = std::fs::File::open(dir).and_then(|d| d.sync_all()) {
            eprintln!("fencelog runner: syncing {} after redacting: {e}", dir.display());
        }
        Ok(Some(redacted))
    }

    /// Copy `src` into `dst` redacted, in pieces (of [`redact_file`](Self::redact_file),
    /// which see), and within `bytes_max`. Returns the copy's length and blake3, or
    /// `None` when no secret was in it.
    fn redact_stream(
        &self,
        src: &mut impl Read,
        dst: &mut impl Write,
        cut_after: bool,
        bytes_max: u64,
    ) -> std::io::Result<Option<Redacted>> {
        const PIECE_BYTES: usize = 64 << 10;
        let (mut pending, mut piece) = (Vec::new(), vec![0u8; PIECE_BYTES]);
        let (mut hasher, mut len, mut changed, mut cut_at_bound) = (blake3::Hasher::new(), 0u64, false, false);
        loop {
            let n = src.read(&mut piece)?;
            let eof = n == 0;
            pending.extend_from_slice(&piece[..n]);
            // Only up to where a secret could still run on into the next piece.
            let safe = if eof { pending.len() } else { pending.len().saturating_sub(self.longest - 1) };
            let (mut i, mut out) = (0, Vec::with_capacity(safe + 64));
            while i < safe {
                if let Some(s) = self.at(&pending, i) {
                    out.extend(Self::marker(s));
                    i += s.value.len();
                    changed = true;
                } else {
                    out.push(pending[i]);
                    i += 1;
                }
            }
            pending.drain(..i.min(pending.len()));
            if eof
                && cut_after
                && let Some((s, n)) = self.prefix_at_end(&out)
            {
                // The kept bytes end where the stream was cut: a secret begun there.
                out.truncate(out.len() - n);
                out.extend(Self::marker(s));
                changed = true;
            }
            // Markers can be longer than what they replace: what is kept stays
            // within the stream's bound (cut there, marked truncated).
            let room = bytes_max.saturating_sub(len) as usize;
            if out.len() > room {
                out.truncate(room);
                cut_at_bound = true;
            }
            hasher.update(&out);
            len += out.len() as u64;
            dst.write_all(&out)?;
            if eof || cut_at_bound {
                break;
            }
        }
        Ok(changed.then(|| Redacted { bytes: len, blake3: *hasher.finalize().as_bytes(), truncated: cut_at_bound }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn r() -> Redactor {
        Redactor::new([
            Secret { name: "ApiKey".into(), value: b"sk-12345678".to_vec() },
            Secret { name: "Short".into(), value: b"ab".to_vec() },
            Secret { name: "Token".into(), value: b"tok-xyz".to_vec() },
        ])
        .unwrap()
    }

    /// Proves: callers racing to make a log's first env key all get one and the
    /// same key, and none sees it empty or half-written (16 threads, 40 fresh
    /// directories); nothing but the key is left in the directory.
    #[test]
    fn concurrent_first_callers_all_get_the_same_whole_env_key() {
        for _ in 0..40 {
            let d = tempfile::tempdir().unwrap();
            let start = std::sync::Barrier::new(16);
            let keys: Vec<_> = std::thread::scope(|s| {
                let hs: Vec<_> = (0..16)
                    .map(|_| {
                        s.spawn(|| {
                            start.wait();
                            env_key(d.path())
                        })
                    })
                    .collect();
                hs.into_iter().map(|h| h.join().unwrap()).collect()
            });
            let first = keys[0].as_ref().expect("a key").to_owned();
            for k in &keys {
                assert_eq!(k.as_ref().map_err(ToString::to_string), Ok(&first));
            }
            let names: Vec<_> = std::fs::read_dir(d.path()).unwrap().map(|e| e.unwrap().file_name()).collect();
            assert_eq!(names, vec![std::ffi::OsString::from(ENV_KEY_FILE)]);
        }
    }

    /// Proves: every whole occurrence is replaced, values below the minimum are
    /// left, and a secret cut at either edge of kept bytes is redacted too.
    #[test]
    fn secrets_are_replaced_whole_and_at_the_edges_of_what_was_kept() {
        let (out, changed) = r().redact(b"key=sk-12345678 and tok-xyz, ab stays", false, false);
        assert!(changed);
        assert_eq!(out, b"key=[REDACTED:ApiKey] and [REDACTED:Token], ab stays");
        let (out, _) = r().redact(b"345678 then", true, false);
        assert_eq!(out, b"[REDACTED:ApiKey] then", "a tail that begins inside a secret");
        let (out, _) = r().redact(b"cut at sk-1234", false, true);
        assert_eq!(out, b"cut at [REDACTED:ApiKey]", "kept bytes that end inside a secret");
        let (out, changed) = r().redact(b"nothing here", true, true);
        assert_eq!((out.as_slice(), changed), (&b"nothing here"[..], false));
    }

    /// Proves: a file redacted in pieces finds secrets across piece boundaries, and
    /// its new length and digest are those of the bytes written.
    #[test]
    fn a_file_is_redacted_across_piece_boundaries() {
        let d = tempfile::tempdir().unwrap();
        let path = d.path().join("stdout");
        let mut content = vec![b'.'; (64 << 10) - 5];
        content.extend_from_slice(b"sk-12345678");
        content.extend(std::iter::repeat_n(b'x', 100));
        std::fs::write(&path, &content).unwrap();
        let red = r().redact_file(&path, false, 1 << 30).unwrap().expect("a secret was there");
        let after = std::fs::read(&path).unwrap();
        assert_eq!(
            (after.len() as u64, *blake3::hash(&after).as_bytes(), red.truncated),
            (red.bytes, red.blake3, false)
        );
        assert!(!after.windows(11).any(|w| w == b"sk-12345678"));
        assert!(after.windows(17).any(|w| w == b"[REDACTED:ApiKey]"));
        std::fs::write(&path, b"clean").unwrap();
        assert_eq!(r().redact_file(&path, false, 1 << 30).unwrap(), None, "no secret: left as it was");
        // Markers longer than the values: the kept bytes stay within the bound.
        std::fs::write(&path, b"tok-xyz tok-xyz tok-xyz").unwrap();
        let red = r().redact_file(&path, false, 20).unwrap().unwrap();
        assert_eq!((red.bytes, red.truncated), (20, true));
        assert_eq!(std::fs::read(&path).unwrap(), b"[REDACTED:Token] [RE");
    }
}
