//! `format`: the bytes of a fencelog log. Pure functions on slices: no files, no
//! clocks, no processes. `log-format/FORMAT.md` is the normative description; the
//! offsets below mirror its tables (each offset = previous offset + previous width).

mod ahead;
mod classify;
mod frame;
mod scan;
mod segment;

// The scanner's internals (how a reader walks frames, classifies damage at the
// tail and reads chain links ahead): the storage layer's, and the tests' through
// the `internals` feature; an embedder reads a log through `storage`.
#[cfg(feature = "internals")]
pub use ahead::LinksAhead;
#[cfg(not(feature = "internals"))]
pub(crate) use ahead::LinksAhead;
#[cfg(feature = "internals")]
pub use classify::{Action, Evidence, SECTOR_BYTES, ZERO_RUN_BYTES_MIN, classify, has_zeroed_sector};
#[cfg(not(feature = "internals"))]
pub(crate) use classify::{Action, Evidence, SECTOR_BYTES, ZERO_RUN_BYTES_MIN, classify, has_zeroed_sector};
pub use frame::{
    BODY_FIXED_BYTES, ChainLink, FRAME_HEADER_BYTES, FrameError, GENESIS_LINK, RecordBody, RecordRef, chain_link,
    decode_frame, encode_frame, frame_bytes, hex,
};
pub use scan::DamageKind;
#[cfg(feature = "internals")]
pub use scan::{
    Cursor, Damage, ScanOutcome, all_zero, ends_at_mark, ends_frames, find_next_frame, scan_frames, scan_frames_in,
    scan_segment_frames, scan_segment_frames_ahead, scan_segment_frames_from,
};
#[cfg(not(feature = "internals"))]
pub(crate) use scan::{
    Cursor, Damage, ScanOutcome, all_zero, ends_at_mark, ends_frames, find_next_frame, scan_frames, scan_frames_in,
    scan_segment_frames, scan_segment_frames_ahead, scan_segment_frames_from,
};
pub use segment::{
    FORMAT_VERSION, FRAMES_END_MARK, Layout, MAGIC, SEGMENT_HEADER_BYTES, SUPPORTED_VERSIONS, SegmentHeader,
    SegmentHeaderError,
};

/// Hard upper bound on a record payload, whatever the configuration says. The frame
/// length is a u32, and a bound this size keeps a corrupt length field from asking a
/// reader to allocate or checksum gigabytes.
pub const PAYLOAD_BYTES_HARD_MAX: u32 = 64 * 1024 * 1024;

/// Hard upper bound on a frame body (the payload's hard bound and the body's fixed
/// fields): what a reader that does not know the writer's `payload_bytes_max` is
/// given, so that it reads every log any writer may write and still never
/// checksums or allocates more than this for one length field.
pub const BODY_BYTES_HARD_MAX: u32 = PAYLOAD_BYTES_HARD_MAX + BODY_FIXED_BYTES as u32;

/// Hard upper bound on `segment_bytes_max`. With it, no segment file can be longer
/// than [`segment_file_bytes_max`], and a longer one is refused unread.
pub const SEGMENT_BYTES_HARD_MAX: u64 = 64 * 1024 * 1024;

/// Longest segment file a reader accepts for a log whose frame bodies are at most
/// `body_max` bytes: a full segment, or one record too large for a segment of its own.
pub fn segment_file_bytes_max(body_max: u32) -> u64 {
    SEGMENT_BYTES_HARD_MAX + FRAME_HEADER_BYTES as u64 + u64::from(body_max)
}
