//! What this build is: `fencelog version --json` and the daemon's `GET /v1/version`
//! answer the same object.

use serde::Serialize;

#[derive(Debug, Clone, Serialize, PartialEq, Eq, utoipa::ToSchema)]
pub struct VersionInfo {
    /// The crate's version (`Cargo.toml`).
    pub version: &'static str,
    /// The segment format version this build writes in a new log.
    pub format_version_written: u16,
    /// Every segment format version this build reads (`log-format/FORMAT.md` §8).
    pub format_versions_read: &'static [u16],
    /// The cargo features built in (`cli`, `daemon`, `etcd`).
    pub features: Vec<&'static str>,
}

pub fn version_info() -> VersionInfo {
    let features =
        [("cli", cfg!(feature = "cli")), ("daemon", cfg!(feature = "daemon")), ("etcd", cfg!(feature = "etcd"))]
            .into_iter()
            .filter_map(|(name, on)| on.then_some(name))
            .collect();
    VersionInfo {
        version: env!("CARGO_PKG_VERSION"),
        format_version_written: crate::format::FORMAT_VERSION,
        format_versions_read: crate::format::SUPPORTED_VERSIONS,
        features,
    }
}
