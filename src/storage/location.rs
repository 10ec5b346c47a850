//! Where a log lives: a directory of segment files on this host, or a prefix in an
//! etcd cluster shared by several hosts. Every front end (the CLI, the daemon, a
//! runner) names its log this way and opens it through the same backends.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::FileBackend;
use super::backend::LogBackend;
use super::error::Result;
use super::options::LogOptions;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Location {
    /// A log directory.
    Dir(PathBuf),
    /// A prefix in an etcd cluster.
    #[cfg(feature = "etcd")]
    Etcd(super::etcd::EtcdOptions),
}

impl Location {
    /// For messages: the directory, or `etcd:ENDPOINTS/PREFIX`.
    pub fn describe(&self) -> String {
        match self {
            Location::Dir(d) => d.display().to_string(),
            #[cfg(feature = "etcd")]
            Location::Etcd(e) => e.describe(),
        }
    }

    /// The directory, when the log is one.
    pub fn dir(&self) -> Option<&Path> {
        match self {
            Location::Dir(d) => Some(d),
            #[cfg(feature = "etcd")]
            Location::Etcd(_) => None,
        }
    }

    /// `opts` as a writer of this location may use them: on etcd, a commit group
    /// must fit one `Txn` (etcd's request limits), so its limits are those.
    #[cfg_attr(not(feature = "etcd"), allow(unused_mut, unused_variables))]
    pub fn log_options(&self, mut opts: LogOptions) -> LogOptions {
        #[cfg(feature = "etcd")]
        if let Location::Etcd(_) = self {
            use super::etcd::{GROUP_PAYLOAD_BYTES_MAX, GROUP_RECORDS_MAX, PAYLOAD_BYTES_MAX};
            opts.payload_bytes_max = opts.payload_bytes_max.min(PAYLOAD_BYTES_MAX);
            opts.batch_records_max = opts.batch_records_max.min(GROUP_RECORDS_MAX);
            opts.batch_bytes_max = opts.batch_bytes_max.min(GROUP_PAYLOAD_BYTES_MAX);
        }
        opts
    }

    /// Open for appending (a log directory is recovered; a missing one is created
    /// only if `opts.create`).
    pub fn open(&self, opts: LogOptions) -> Result<Arc<dyn LogBackend>> {
        match self {
            Location::Dir(d) => Ok(Arc::new(FileBackend::open(d, opts)?)),
            #[cfg(feature = "etcd")]
            Location::Etcd(e) => Ok(Arc::new(super::etcd::EtcdBackend::open(e, &self.log_options(opts))?)),
        }
    }

    /// Open for reading only: nothing is written, locked or created; the whole
    /// history is checked first.
    pub fn open_read_only(&self, opts: &LogOptions) -> Result<Arc<dyn LogBackend>> {
        match self {
            Location::Dir(d) => Ok(Arc::new(FileBackend::open_read_only(d, opts.body_max())?)),
            #[cfg(feature = "etcd")]
            Location::Etcd(e) => Ok(Arc::new(super::etcd::EtcdBackend::open(e, &self.log_options(opts.clone()))?)),
        }
    }
}
