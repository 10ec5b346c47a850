//! `storage`: segment files in a directory, the append lock, fsync and group commit,
//! recovery of a torn tail, and verifying readers. It moves opaque payloads; it does
//! not know what records mean.

mod ahead;
mod backend;
pub(crate) mod commit;
mod dir;
mod error;
#[cfg(feature = "etcd")]
pub mod etcd;
pub mod export;
mod halt;
mod history;
mod location;
mod lock;
mod options;
mod reader;
mod recovery;
mod repair;
pub mod snapshots;
mod source;
mod writer;

pub use backend::{AppendOutcome, Exclusive, FileBackend, Head, LogBackend, MemoryBackend, RecordReader};
pub use commit::{EXTRA_TURNS_MAX, GROUPS_PER_LOCK_MAX, HEAD_MOVED_RETRIES_MAX};
pub use dir::{
    ENV_KEY_FILE, EVIDENCE_INFIX, LOCK_FILE, Listing, PROCESS_DIR, SERVE_TOKEN_FILE, SNAPSHOT_DIR, check_dir_mode,
    list_segments, listing, segment_path,
};
pub use error::{Error, Result};
pub use halt::SYNC_FAILED_FILE;
pub use history::check_whole_history;
pub use location::Location;
pub use options::{Clock, LogOptions, VerifyOnOpen};
pub use reader::{
    Problem, ReadSummary, ScanItem, Tailer, frames_end, read_records, reader_problem, scan_dir, segment_fingerprint,
    verify_dir,
};
pub use recovery::{OpenReport, Repair};
pub use repair::{Cut, InitReport, RepairReport, init, repair};
pub use source::{Source, StoredSnapshot};
pub use writer::{Appended, Locked, Log};
