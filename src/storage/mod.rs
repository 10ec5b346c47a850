//! `storage`: where the log lives, behind one seam (`backend`: the `LogBackend`
//! trait and its shared types, alone). Its rooms: `file` (segment files in a
//! directory, the append lock, fsync, recovery of a torn tail, verifying
//! readers), `memory` (a log in memory, for tests), `etcd` (a log in an etcd
//! cluster). Around them: the commit engine (`commit`: group commit over any
//! backend), options, errors, `Location` (where a log is) and `Source` (what the
//! inspector reads). It moves opaque payloads; it does not know what records mean.

mod backend;
pub(crate) mod commit;
mod error;
#[cfg(feature = "etcd")]
pub mod etcd;
// The file backend's rooms (directory, lock, recovery, readers, writer): what an
// embedder needs of them is re-exported below; the rest is the tests' and the
// binary's, through the `internals` feature.
#[cfg(feature = "internals")]
pub mod file;
#[cfg(not(feature = "internals"))]
pub(crate) mod file;
mod location;
mod memory;
mod options;
mod problem;
mod source;

pub use backend::{
    AppendOutcome, Appended, CommitStats, Exclusive, Head, LogBackend, OpenReport, RecordReader, Repair,
    SNAPSHOTS_KEPT, SnapshotMeta, Unlocked, digest_of,
};
pub use commit::{EXTRA_TURNS_MAX, GROUPS_PER_LOCK_MAX, HEAD_MOVED_RETRIES_MAX};
pub use error::{Error, Result};
pub use file::FileBackend;
pub use file::dir::{
    ENV_KEY_FILE, EVIDENCE_INFIX, LOCK_FILE, Listing, PROCESS_DIR, SERVE_ADMIN_TOKEN_FILE, SERVE_READ_TOKEN_FILE,
    SERVE_TOKEN_FILE, SNAPSHOT_DIR, check_dir_mode, create_file_whole, list_segments, listing, segment_path,
};
pub use file::halt::SYNC_FAILED_FILE;
pub use file::history::check_whole_history;
pub use file::reader::{ReadSummary, ScanItem, read_records, scan_dir, verify_dir};
// The tail reader and the frame scanner's entry points.
#[cfg(feature = "internals")]
pub use file::reader::{Tailer, frames_end, segment_fingerprint};
#[cfg(not(feature = "internals"))]
pub(crate) use file::reader::{Tailer, frames_end, segment_fingerprint};
pub use file::repair::{Cut, InitReport, RepairReport, init, repair};
pub use file::writer::{Locked, Log};
pub use file::{export, snapshots};
pub use location::Location;
pub use memory::MemoryBackend;
pub use options::{Clock, LogOptions, VerifyOnOpen};
pub use problem::{Problem, ProblemKind};
pub use source::{Source, StoredSnapshot};
