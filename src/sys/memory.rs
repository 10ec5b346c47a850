//! glibc's allocator policy (a no-op on other C libraries).

/// At most `arenas` malloc arenas, and no fastbins (see the daemon's
/// `limit_malloc_arenas` for the measurements). Call before starting threads.
#[cfg_attr(not(feature = "daemon"), allow(dead_code))] // the daemon's
pub fn limit_malloc_arenas(arenas: i32) {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only sets allocator parameters; the caller calls it before
    // any other thread exists.
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, arenas);
        libc::mallopt(libc::M_MXFAST, 0);
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    let _ = arenas;
}

/// Return freed heap pages to the system (glibc keeps them otherwise).
pub fn release_free_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only releases free memory of the allocator.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// This process's resident memory that is its own, in bytes: resident less
/// what is shared with files (`/proc/self/statm`: the program's mapped code is
/// not counted), if it can be read.
pub fn private_resident_bytes() -> Option<u64> {
    let statm = std::fs::read_to_string("/proc/self/statm").ok()?;
    let mut pages = statm.split_whitespace().skip(1).map(|f| f.parse::<u64>().ok());
    let (resident, shared) = (pages.next()??, pages.next()??);
    Some(resident.saturating_sub(shared) * super::page_bytes()?)
}
