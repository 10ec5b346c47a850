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
//! use fencelog::storage::{Log, LogOptions, verify_dir};
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
//! Every `unsafe` block is in `sys` (libc calls and the memory map, each behind a
//! safe function that says what its caller promises); the rest of the library
//! denies `unsafe_code`, so a new block elsewhere needs an `allow` a reviewer sees.

#![deny(unsafe_code)]

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
