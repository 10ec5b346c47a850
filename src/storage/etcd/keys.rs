//! Where a log lives in etcd: every key under one prefix `P` (`docs/DISTRIBUTED.md`).
//!
//! | key | value |
//! |---|---|
//! | `P` `log` | what marks the prefix as a fencelog log: JSON `{"fencelog_log": 1, "format_version", "created_ms"}` |
//! | `P` `head` | the last record: its sequence (u64 LE) then its chain link (32 bytes) — the key every append compares |
//! | `P` `r/` 20-digit sequence | one record: the same frame as in a segment (length, CRC-32, body with its chain link) |
//! | `P` `archived` | JSON `{"below_seq", "link"}`: records before `below_seq` were moved to archive segments (`fencelog archive`) |
//! | `P` `s/` 20-digit seq `/m` | a snapshot's description: JSON `{"seq", "head", "digest", "bytes", "chunks"}` (written last) |
//! | `P` `s/` 20-digit seq `/c/` 6-digit n | its body, in chunks of at most [`SNAPSHOT_CHUNK_BYTES`] |

use crate::format::ChainLink;
use crate::storage::Head;

pub const META: &str = "log";
pub const HEAD: &str = "head";
pub const RECORDS: &str = "r/";
pub const ARCHIVED: &str = "archived";
pub const SNAPSHOTS: &str = "s/";

/// Largest piece of a snapshot body in one key (etcd's default request limit is
/// 1.5 MiB).
pub const SNAPSHOT_CHUNK_BYTES: usize = 1 << 20;

pub fn key(prefix: &[u8], suffix: &str) -> Vec<u8> {
    let mut k = prefix.to_vec();
    k.extend_from_slice(suffix.as_bytes());
    k
}

/// The key of record `seq`: lexical order is sequence order.
pub fn record(prefix: &[u8], seq: u64) -> Vec<u8> {
    key(prefix, &format!("{RECORDS}{seq:020}"))
}

/// The sequence a record key names, if it is one.
pub fn record_seq(prefix: &[u8], key: &[u8]) -> Option<u64> {
    let rest = key.strip_prefix(prefix)?.strip_prefix(RECORDS.as_bytes())?;
    (rest.len() == 20 && rest.iter().all(u8::is_ascii_digit)).then(|| std::str::from_utf8(rest).ok()?.parse().ok())?
}

/// The end of the range of every key under `prefix` (etcd's "prefix end": the
/// prefix with its last byte incremented).
pub fn prefix_end(prefix: &[u8]) -> Vec<u8> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xFF {
            end.push(last + 1);
            return end;
        }
    }
    vec![0] // every key (the empty prefix)
}

pub fn snapshot_meta(prefix: &[u8], seq: u64) -> Vec<u8> {
    key(prefix, &format!("{SNAPSHOTS}{seq:020}/m"))
}

pub fn snapshot_chunk(prefix: &[u8], seq: u64, n: usize) -> Vec<u8> {
    key(prefix, &format!("{SNAPSHOTS}{seq:020}/c/{n:06}"))
}

pub fn snapshot_dir(prefix: &[u8], seq: u64) -> Vec<u8> {
    key(prefix, &format!("{SNAPSHOTS}{seq:020}/"))
}

/// The head's value: sequence, then chain link.
pub fn head_value(seq: u64, link: &ChainLink) -> Vec<u8> {
    let mut v = Vec::with_capacity(40);
    v.extend_from_slice(&seq.to_le_bytes());
    v.extend_from_slice(link);
    v
}

pub fn parse_head(v: &[u8]) -> Option<Head> {
    if v.len() != 40 {
        return None;
    }
    Some(Head { seq: u64::from_le_bytes(v[..8].try_into().ok()?), link: v[8..].try_into().ok()? })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Proves: record keys sort by sequence and read back; the prefix end bounds
    /// every key under the prefix and nothing else.
    #[test]
    fn record_keys_sort_by_sequence_and_the_prefix_end_bounds_the_prefix() {
        let p = b"/fencelog/";
        assert!(record(p, 9) < record(p, 10) && record(p, 10) < record(p, u64::MAX));
        assert_eq!(record_seq(p, &record(p, 42)), Some(42));
        assert_eq!(record_seq(p, b"/fencelog/r/42"), None);
        let end = prefix_end(p);
        assert_eq!(end, b"/fencelog0".to_vec());
        assert!(record(p, u64::MAX) < end && key(p, "zzz") < end && b"/fencelog0".to_vec() >= end);
        let Head { seq, link } = parse_head(&head_value(7, &[3; 32])).unwrap();
        assert_eq!((seq, link), (7, [3; 32]));
    }
}
