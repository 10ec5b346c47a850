//! Every `unsafe` block of the crate: the libc calls and the memory map, each behind
//! a safe function whose SAFETY comment says why the call is sound. Two of them
//! are sound only under a promise of their caller, stated in their docs
//! ([`fd::inherited`]: a descriptor the process was started with;
//! [`fs::map_never_cut`]: a file never cut while mapped); they are crate-private.
//! The rest of the crate denies `unsafe_code` (`lib.rs`).
//!
//! - [`fd`]: descriptors (poll, dup2, pipes, sends without SIGPIPE, `/dev/null`).
//! - [`process`]: signals, waiting, `posix_spawn`, a gate's exec.
//! - [`fs`]: `statx`, OFD byte locks, read-only maps.
//! - [`memory`]: glibc's allocator policy.

pub mod fd;
pub mod fs;
pub mod memory;
pub mod process;

/// Clock ticks per second (`sysconf(_SC_CLK_TCK)`), the unit of `/proc/*/stat`'s
/// times.
#[cfg_attr(not(feature = "daemon"), allow(dead_code))] // the daemon's
pub fn clock_ticks_per_second() -> Option<u64> {
    // SAFETY: sysconf reads a constant of the running system; no memory is shared.
    let n = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    u64::try_from(n).ok().filter(|&n| n > 0)
}

/// Bytes of a memory page (`sysconf(_SC_PAGESIZE)`), the unit of `/proc/*/stat`'s
/// resident set size.
#[cfg_attr(not(feature = "daemon"), allow(dead_code))] // the daemon's
pub fn page_bytes() -> Option<u64> {
    // SAFETY: as above.
    let n = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    u64::try_from(n).ok().filter(|&n| n > 0)
}
