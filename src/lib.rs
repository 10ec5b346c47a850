//! fencelog: a durable ownership ledger on an append-only, checksummed, hash-chained
//! log. Layers, each a module, depending only downwards:
//!
//! - [`format`](mod@format): the bytes (pure);
//! - [`storage`]: the `LogBackend` seam and its backends (segment files with their
//!   lock, recovery and readers; memory; etcd), the group commit;
//! - [`model`]: the ownership state machine and its projection (pure);
//! - [`ledger`]: the embedded API (open = recover + snapshot + replay; submit);
//! - [`ops`]: every operation as a typed request → transaction → response, shared
//!   by every front end (the CLI, the daemon, the supervisor);
//! - services: [`inspect`] (offline inspector) and [`audit`] (forensic audit), both
//!   read-only, [`supervisor`] (process supervision: every spawn and exit a
//!   record) and `daemon` (`fencelog serve`, feature `daemon`); the `fencelog`
//!   binary wires them to the command line.
//!
//! ```
//! use fencelog::{Log, LogOptions, verify_dir};
//! let dir = tempfile::tempdir().unwrap();
//! let log = Log::open(dir.path(), LogOptions::default()).unwrap();
//! let a = log.append(b"first").unwrap();
//! let b = log.append_batch(vec![b"second".to_vec(), b"third".to_vec()]).unwrap();
//! assert_eq!((a.first_seq, b.first_seq, b.last_seq), (1, 2, 3));
//! log.close().unwrap();
//! let summary = verify_dir(dir.path(), LogOptions::default().body_max()).unwrap();
//! assert!(summary.is_intact() && summary.records == 3);
//! ```
//!
//! The front, below, is what an embedder uses — the ledger with its options and
//! errors, the operations every front end runs, the model's types, the storage
//! `Log` and `verify_dir` — re-exported here as raft-engine's `lib.rs` does; the
//! layers' modules hold the rest. The scanner's internals, the runner's process
//! entry points and the test helpers are behind the `internals` feature, which
//! the binary (`cli`), the tests and the benches turn on.
//!
//! Every `unsafe` block is in `sys` (libc calls and the memory map, each behind a
//! safe function that says what its caller promises); the rest of the library
//! denies `unsafe_code`, so a new block elsewhere needs an `allow` a reviewer sees.

#![deny(unsafe_code)]
// Without `internals` the scanner's entry points, the runner's process entry
// points and the test helpers are crate-private, and some are used only by the
// binary and the tests: not dead. (With it, the build CI lints, nothing is hidden.)
#![cfg_attr(not(feature = "internals"), allow(dead_code, unused_imports))]

pub mod audit;
#[cfg(feature = "daemon")]
pub mod daemon;
pub mod format;
pub mod inspect;
pub mod ledger;
pub mod model;
pub mod ops;
pub mod storage;
pub mod supervisor;
#[allow(unsafe_code)]
pub(crate) mod sys;
pub mod view;

// The embedder's front.
pub use ledger::{Ledger, LedgerError, LedgerOptions, ReadView};
pub use model::{
    CallerId, Checked, Event, Identity, Outcome, Projection, Refusal, RequestTag, Txn, decode_txn, encode_txn,
};
pub use ops::{
    Caller, ClaimRequest, GenerationOp, GenerationRequest, LeaseAcquireRequest, LeaseReleaseRequest, NoteRequest,
    OpError, OpResponse, TakeoverRequest, claim, generation, lease_acquire, lease_release, note, request_show, state,
    takeover,
};
pub use storage::{Location, Log, LogOptions, ReadSummary, verify_dir};
