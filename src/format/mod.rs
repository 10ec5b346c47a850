//! `format`: the bytes of a fencelog log. Pure functions on slices: no files, no
//! clocks, no processes. `log-format/FORMAT.md` is the normative description; the
//! offsets below mirror its tables (each offset = previous offset + previous width).

mod frame;
mod scan;
mod segment;

pub use frame::{
    BODY_FIXED_BYTES, ChainLink, FRAME_HEADER_BYTES, FrameError, GENESIS_LINK, RecordBody, RecordRef, chain_link,
    decode_frame, encode_frame, frame_bytes, hex,
};
pub use scan::{Cursor, Damage, DamageKind, ScanOutcome, find_next_frame, scan_frames};
pub use segment::{FORMAT_VERSION, MAGIC, SEGMENT_HEADER_BYTES, SUPPORTED_VERSIONS, SegmentHeader, SegmentHeaderError};

/// Hard upper bound on a record payload, whatever the configuration says. The frame
/// length is a u32, and a bound this size keeps a corrupt length field from asking a
/// reader to allocate or checksum gigabytes.
pub const PAYLOAD_BYTES_HARD_MAX: u32 = 64 * 1024 * 1024;
