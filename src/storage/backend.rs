//! The narrow seam between the ledger and where its log lives. The ledger reaches
//! the log only through [`LogBackend`]: the head, verified records from a
//! sequence, *append-if-head* (compare on the head, the only write a replicated
//! store can offer), and snapshot storage. [`FileBackend`](super::FileBackend) is the segment files of
//! this crate (`storage::file`); [`MemoryBackend`](super::MemoryBackend) (`storage::memory`) is a small in-memory log the ledger's tests also
//! run on (the proof that nothing above this seam relies on files or a lock held
//! across round trips).
//!
//! `HeadMoved` is not a failure: another writer appended first. The ledger catches
//! up, judges its transactions again against the new state, and tries again.
//! [`LogBackend::exclusive`] lets a backend that can hold a lock across a
//! transaction (the file backend's append lock) do so, so that on one machine
//! `HeadMoved` stays rare; nothing above this seam may rely on it.

use std::path::PathBuf;

use serde::Serialize;

use super::error::Result;
use crate::format::{ChainLink, RecordRef};

/// The last durable record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Head {
    pub seq: u64,
    pub link: ChainLink,
}

/// What an append-if-head did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AppendOutcome {
    /// Appended and durable.
    Appended(Appended),
    /// The log's last sequence was `actual`, not the one expected: nothing appended.
    HeadMoved { actual: u64 },
}

/// Verified records, in order, from a sequence on; each `poll` delivers what was
/// appended since the last.
pub trait RecordReader: Send {
    /// Visit every intact record not yet visited; returns how many.
    fn poll(&mut self, visit: &mut dyn FnMut(&RecordRef<'_>)) -> Result<u64>;
    /// The sequence the next record must carry.
    fn next_seq(&self) -> u64;
    /// The last poll stopped before a torn tail (a writer will cut it).
    fn stopped_at_torn_tail(&self) -> bool;
    /// The chain link of the record before `next_seq` (the last one verified).
    fn prev_link(&self) -> ChainLink;
    /// Wait, at most `timeout`, for something to be appended after what was read
    /// (a backend that can be told, as etcd's watch, returns as soon as it is;
    /// the others nap a little and say nothing).
    fn wait_for_more(&mut self, timeout: std::time::Duration) -> Result<()> {
        std::thread::sleep(timeout.min(std::time::Duration::from_millis(50)));
        Ok(())
    }
    /// Records `first_seq..=last_seq` (chain link of the last: `chain_head`) were
    /// appended by the reader's own writer: a reader that is exactly at
    /// `first_seq` may go past them without reading them back (a reader of a
    /// remote log saves the round trip; a local one may ignore this).
    fn skip_own(&mut self, _first_seq: u64, _last_seq: u64, _chain_head: ChainLink) {}
}

/// What the holder of [`LogBackend::exclusive`] may do.
pub trait Exclusive {
    fn append_if_head(&mut self, expect_seq: u64, payloads: Vec<Vec<u8>>) -> Result<AppendOutcome>;
    /// The chain link of each record the last successful `append_if_head`
    /// appended, in order — or nothing, if the backend does not tell.
    fn links(&self) -> &[ChainLink] {
        &[]
    }
    /// The last sequence in the log as the section found it (having caught up
    /// with other writers' records), when the backend tells.
    fn last_seq(&self) -> Option<u64> {
        None
    }
    /// The log's last record (its sequence and chain link) as the section found
    /// it, having caught up with other writers' records — when the backend holds
    /// the log's tail for the whole section (a lock), so that nothing can be
    /// appended before it ends.
    fn head(&self) -> Option<Head> {
        None
    }
    /// Whether another writer waits to append (then the holder lets go after its
    /// turn). Yes unless the backend can tell.
    fn others_waiting(&self) -> bool {
        true
    }
}

/// The exclusive section of a backend that holds no lock across it (memory,
/// etcd): each append compares the head on its own (`HeadMoved` when another
/// writer came first).
pub struct Unlocked<'a, B: LogBackend + ?Sized>(pub &'a B);

impl<B: LogBackend + ?Sized> Exclusive for Unlocked<'_, B> {
    fn append_if_head(&mut self, expect_seq: u64, payloads: Vec<Vec<u8>>) -> Result<AppendOutcome> {
        self.0.append_if_head(expect_seq, payloads)
    }
}

/// Where a ledger's log lives.
pub trait LogBackend: Send + Sync {
    /// The last durable record (sequence 0 and the genesis link for an empty log).
    fn head(&self) -> Result<Head>;
    /// A verifying reader that visits records from `from_seq` on.
    fn reader(&self, from_seq: u64) -> Box<dyn RecordReader>;
    /// Append `payloads` as consecutive records if the last sequence is
    /// `expect_seq`; durable when it returns `Appended`.
    fn append_if_head(&self, expect_seq: u64, payloads: Vec<Vec<u8>>) -> Result<AppendOutcome>;
    /// Make everything appended durable (appends already are: a no-op for both
    /// backends here; a replicated backend may batch).
    fn sync(&self) -> Result<()> {
        Ok(())
    }
    /// Run `f` with exclusive appending where the backend offers it (the file
    /// backend holds its cross-process lock, having caught up), else plainly. A
    /// backend that must wait for it asks `give_up` while it waits, and gives up
    /// with [`Error::Withdrawn`] (nothing run) when it says so.
    fn exclusive(&self, give_up: &dyn Fn() -> bool, f: &mut dyn FnMut(&mut dyn Exclusive) -> Result<()>) -> Result<()>;
    /// Store a snapshot body covering `seq` (chain link `head`).
    fn put_snapshot(&self, seq: u64, chain_head: &ChainLink, body: &[u8]) -> Result<SnapshotMeta>;
    /// The newest stored snapshots, newest first (each checked on its own), with a
    /// warning for each one skipped.
    fn newest_snapshots(&self) -> (Vec<SnapshotMeta>, Vec<String>);
    /// The body of a snapshot `newest_snapshots` described (the same bytes, or an
    /// error).
    fn snapshot_body(&self, meta: &SnapshotMeta) -> std::result::Result<Vec<u8>, String>;
    /// How long ago the snapshot `meta` describes was stored, in ms, where the
    /// backend can tell (`None`: it cannot). A snapshot no checkpoint vouches
    /// for yet is normal for a moment after it is stored (its writer appends the
    /// checkpoint next): an open says so quietly while it is young.
    fn snapshot_age_ms(&self, _meta: &SnapshotMeta) -> Option<u64> {
        None
    }
    /// This writer's identity in the records it appends.
    fn writer_id(&self) -> uuid::Uuid;
    /// What opening found and did.
    fn open_report(&self) -> OpenReport;
    /// Records appended and syncs made through this backend.
    fn commit_stats(&self) -> CommitStats {
        CommitStats::default()
    }
    /// Whether writers on several hosts share this log (etcd): then identities
    /// recorded on another host are never judged from this host's `/proc`, and
    /// staleness is judged on the observer's own clock (`ledger::observer`).
    fn shared_by_hosts(&self) -> bool {
        false
    }
    /// Whether an append's compare is all that orders writers (etcd): a writer
    /// may judge on the state it has and learn of another writer's records from
    /// a failed compare (`HeadMoved`), instead of reading before every turn.
    /// `false` for a backend whose exclusive section must be caught up with first
    /// (the file backend's lock, across processes).
    fn optimistic(&self) -> bool {
        false
    }
    /// Whether an append waits only on this host's own storage (a write and a
    /// sync, a few hundred µs), never on a network round trip: then an async
    /// caller that is alone may lead on its own thread (`LeadOn::Inline`). `false`
    /// for etcd, whose `Txn` holds the leader's thread for a round trip to a quorum
    /// (up to its request timeout when there is none): a runtime worker held that
    /// long is one the daemon's other connections lose.
    fn append_is_local(&self) -> bool {
        true
    }
    /// What a long-running writer (the daemon) checks of the service under the
    /// log at boot: an error if it cannot work (etcd refuses a commit group),
    /// else warnings (etcd keeps every revision: no compaction).
    fn check_service(&self) -> Result<Vec<String>> {
        Ok(vec![])
    }
}

/// An acknowledged (synced) append.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Appended {
    pub first_seq: u64,
    pub last_seq: u64,
    /// Chain link of `last_seq`.
    pub chain_head: ChainLink,
}

/// A stored snapshot as it describes itself (its body checked by CRC and digested,
/// streaming): what a checkpoint record must vouch for before it is used.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SnapshotMeta {
    pub seq: u64,
    /// Chain link of `seq`.
    pub chain_head: ChainLink,
    /// blake3 of the body: what a checkpoint record carries.
    pub digest: [u8; 32],
    /// Where it is, for messages (a path for the file backend).
    pub source: String,
}

/// The digest a checkpoint record carries for a snapshot body.
pub fn digest_of(body: &[u8]) -> [u8; 32] {
    *blake3::hash(body).as_bytes()
}

/// Snapshots kept (the newest ones).
pub const SNAPSHOTS_KEPT: usize = 2;

/// One repair made while opening, with the evidence file that keeps what was cut.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Repair {
    /// `torn_tail` or `torn_segment_creation`.
    pub kind: &'static str,
    /// What the damage looked like (`incomplete_frame`, `checksum_mismatch`, ...).
    pub damage: String,
    pub segment: PathBuf,
    pub offset: u64,
    pub bytes: u64,
    /// The sequence the cut record would have carried.
    pub seq: u64,
    pub evidence: PathBuf,
}

/// What `Log::open` found and did.
#[derive(Debug, Clone, Serialize)]
pub struct OpenReport {
    pub segments: usize,
    pub records_verified: u64,
    /// Last durable sequence (0 for an empty log).
    pub last_seq: u64,
    pub chain_head: String,
    pub repairs: Vec<Repair>,
}

/// Records appended and data syncs taken by one writer: their ratio is the mean
/// group-commit size.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct CommitStats {
    pub records: u64,
    pub syncs: u64,
}

impl CommitStats {
    /// Records per sync (0 before the first sync).
    pub fn records_per_sync(&self) -> f64 {
        if self.syncs == 0 { 0.0 } else { self.records as f64 / self.syncs as f64 }
    }
}
