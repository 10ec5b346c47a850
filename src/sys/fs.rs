//! Files: `statx` without the times, OFD byte locks, read-only maps.

use std::fs::File;
use std::os::fd::AsRawFd;

/// What `statx` says of a file's type, size and identity (see [`statx_lite`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Statx {
    pub size: u64,
    pub dev_major: u32,
    pub dev_minor: u32,
    pub ino: u64,
    pub is_regular: bool,
}

/// `statx(dirfd, path, flags)` asking only for type, size and inode — never for the
/// times (a query of the ctime makes the next write of the file take a
/// fine-grained timestamp on Linux ≥ 6.13: see `storage/file/dir.rs`).
pub fn statx_lite(dirfd: i32, path: &std::ffi::CStr, flags: i32) -> std::io::Result<Statx> {
    // SAFETY: an all-zero statx is a valid value of the plain-data struct.
    let mut st: libc::statx = unsafe { std::mem::zeroed() };
    let mask = libc::STATX_TYPE | libc::STATX_SIZE | libc::STATX_INO;
    // SAFETY: `path` is NUL-terminated and `st` is a valid, writable statx buffer.
    if unsafe { libc::statx(dirfd, path.as_ptr(), flags, mask, &mut st) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(Statx {
        size: st.stx_size,
        dev_major: st.stx_dev_major,
        dev_minor: st.stx_dev_minor,
        ino: st.stx_ino,
        is_regular: u32::from(st.stx_mode) & libc::S_IFMT == libc::S_IFREG,
    })
}

/// An OFD lock request (`F_OFD_SETLK`, `F_OFD_GETLK`, …: `cmd`) of type `l_type` on
/// the one byte at `byte` of `file`; the lock type the kernel answers with.
pub fn ofd_byte_lock(file: &File, cmd: libc::c_int, l_type: libc::c_int, byte: i64) -> std::io::Result<libc::c_int> {
    // SAFETY: a zeroed `flock` is a valid value; the fields set below are the ones
    // the call reads, and `l_pid` must be 0 for OFD locks.
    let mut fl: libc::flock = unsafe { std::mem::zeroed() };
    fl.l_type = l_type as libc::c_short;
    fl.l_whence = libc::SEEK_SET as libc::c_short;
    fl.l_start = byte;
    fl.l_len = 1;
    // SAFETY: `fl` outlives the call and the descriptor is open.
    match unsafe { libc::fcntl(file.as_raw_fd(), cmd, &mut fl) } {
        -1 => Err(std::io::Error::last_os_error()),
        _ => Ok(libc::c_int::from(fl.l_type)),
    }
}

/// A read-only map of the whole of `file`, for a file that is never truncated in
/// place while mapped.
///
/// The caller's promise (a mapping of a file cut underneath faults with SIGBUS on
/// the cut pages): it maps only sealed segments, which `repair` never truncates in
/// place (it writes a new file and renames it, so a mapping keeps the old inode
/// whole), or the last segment while it holds the append lock, under which alone
/// that segment is cut (`log-format/FORMAT.md` §7).
pub fn map_never_cut(file: &File) -> std::io::Result<memmap2::Mmap> {
    // SAFETY: the file is not cut while mapped (the caller's promise above), and
    // the map is read-only: our own writes go through `write`/`pwrite`, which the
    // kernel keeps coherent with the page cache the map shows.
    unsafe { memmap2::Mmap::map(file) }
}

/// `renameat2(dir, from, dir, to, RENAME_NOREPLACE)`: `from` becomes `to`, both
/// names relative to the directory `dir`, unless `to` exists (then `EEXIST`, and
/// nothing moved). Neither name's last component is followed if it is a link.
pub fn rename_noreplace_in(dir: &File, from: &std::ffi::CStr, to: &std::ffi::CStr) -> std::io::Result<()> {
    let fd = dir.as_raw_fd();
    // SAFETY: both names are NUL-terminated and the descriptor is open.
    match unsafe { libc::renameat2(fd, from.as_ptr(), fd, to.as_ptr(), libc::RENAME_NOREPLACE) } {
        0 => Ok(()),
        _ => Err(std::io::Error::last_os_error()),
    }
}
