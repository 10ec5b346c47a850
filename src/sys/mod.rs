//! Facts of the operating system that only a libc call gives, each behind a safe
//! function.

/// Clock ticks per second (`sysconf(_SC_CLK_TCK)`), the unit of `/proc/*/stat`'s
/// times.
pub fn clock_ticks_per_second() -> Option<u64> {
    // SAFETY: sysconf reads a constant of the running system; no memory is shared.
    let n = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    u64::try_from(n).ok().filter(|&n| n > 0)
}

/// Bytes of a memory page (`sysconf(_SC_PAGESIZE)`), the unit of `/proc/*/stat`'s
/// resident set size.
pub fn page_bytes() -> Option<u64> {
    // SAFETY: as above.
    let n = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    u64::try_from(n).ok().filter(|&n| n > 0)
}
