//! The 64-byte segment header (FORMAT.md §2).

use super::frame::ChainLink;

pub const MAGIC: [u8; 8] = *b"FENCELOG";
/// The version new segments are written in (FORMAT.md §2 and §8).
pub const FORMAT_VERSION: u16 = 2;
/// Every version this build reads. A log may mix them: each segment's own header
/// says how its bytes are laid out (an old log's last v1 segment is appended to as
/// v1; the segments after it are v2).
pub const SUPPORTED_VERSIONS: &[u16] = &[1, 2];
pub const SEGMENT_HEADER_BYTES: usize = 64;

// Offsets, each = previous offset + previous width.
const MAGIC_AT: usize = 0; // [u8; 8]
const VERSION_AT: usize = MAGIC_AT + 8; // u16
const HEADER_LEN_AT: usize = VERSION_AT + 2; // u16
const FLAGS_AT: usize = HEADER_LEN_AT + 2; // u32, must be 0
const FIRST_SEQ_AT: usize = FLAGS_AT + 4; // u64
const PREV_LINK_AT: usize = FIRST_SEQ_AT + 8; // [u8; 32]
const RESERVED_AT: usize = PREV_LINK_AT + 32; // u32, must be 0
const CRC_AT: usize = RESERVED_AT + 4; // u32: CRC32 of bytes [0, CRC_AT)
const _: () = assert!(CRC_AT + 4 == SEGMENT_HEADER_BYTES);

/// Written right after the last frame of every commit group in a preallocated
/// segment (and overwritten by the next group's first frame): a length field no
/// frame can have (`0xFFFFFFFF`), then `END2`. A torn write is told from rot by it:
/// a last frame followed by this mark was written whole (so damage in it is rot), a
/// last frame followed only by zeros was not (FORMAT.md §3a).
pub const FRAMES_END_MARK: [u8; 8] = [0xFF, 0xFF, 0xFF, 0xFF, b'E', b'N', b'D', b'2'];

/// How the frames of a segment end (FORMAT.md §3a).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Layout {
    /// Version 1: the file ends where the frames end; appends grow the file.
    Appended,
    /// Version 2: the file is extended ahead of the frames with zeros that were
    /// synced before use, and appends overwrite them in place. The frames end at the
    /// first frame boundary followed only by zeros (a frame's length is never 0).
    Preallocated,
}

impl Layout {
    /// The layout of segments of format `version`.
    pub fn of_version(version: u16) -> Layout {
        if version >= 2 { Layout::Preallocated } else { Layout::Appended }
    }
}

/// What a segment header says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SegmentHeader {
    /// `format_version`: 1 ([`Layout::Appended`]) or 2 ([`Layout::Preallocated`]).
    pub version: u16,
    /// Sequence of the first record this segment holds (or would hold, if empty).
    pub first_seq: u64,
    /// Chain link of record `first_seq - 1` (the genesis link for the first segment).
    pub prev_link: ChainLink,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SegmentHeaderError {
    /// Fewer than 64 bytes.
    Short { have: usize },
    /// The first 8 bytes are not `FENCELOG`.
    BadMagic { found: [u8; 8] },
    /// The header checksum does not match.
    Checksum { stored: u32, computed: u32 },
    /// A well-formed header of a version this build does not read.
    UnsupportedVersion { found: u16 },
    /// Reserved fields are not zero, or the header length is not 64.
    Malformed,
}

impl SegmentHeader {
    /// A header of the version this build writes.
    pub fn new(first_seq: u64, prev_link: ChainLink) -> Self {
        SegmentHeader { version: FORMAT_VERSION, first_seq, prev_link }
    }

    /// How this segment's frames end.
    pub fn layout(&self) -> Layout {
        Layout::of_version(self.version)
    }

    pub fn encode(&self) -> [u8; SEGMENT_HEADER_BYTES] {
        let mut b = [0u8; SEGMENT_HEADER_BYTES];
        b[MAGIC_AT..MAGIC_AT + 8].copy_from_slice(&MAGIC);
        b[VERSION_AT..VERSION_AT + 2].copy_from_slice(&self.version.to_le_bytes());
        b[HEADER_LEN_AT..HEADER_LEN_AT + 2].copy_from_slice(&(SEGMENT_HEADER_BYTES as u16).to_le_bytes());
        b[FIRST_SEQ_AT..FIRST_SEQ_AT + 8].copy_from_slice(&self.first_seq.to_le_bytes());
        b[PREV_LINK_AT..PREV_LINK_AT + 32].copy_from_slice(&self.prev_link);
        let crc = crc32fast::hash(&b[..CRC_AT]);
        b[CRC_AT..].copy_from_slice(&crc.to_le_bytes());
        b
    }

    /// Decode and validate. Order of checks: length, magic, checksum, version,
    /// reserved fields — so a damaged header is reported as damage, and only an
    /// intact header of another version is reported as a version problem.
    pub fn decode(b: &[u8]) -> Result<Self, SegmentHeaderError> {
        if b.len() < SEGMENT_HEADER_BYTES {
            return Err(SegmentHeaderError::Short { have: b.len() });
        }
        let found: [u8; 8] = b[MAGIC_AT..MAGIC_AT + 8].try_into().expect("8");
        if found != MAGIC {
            return Err(SegmentHeaderError::BadMagic { found });
        }
        let stored = u32::from_le_bytes(b[CRC_AT..CRC_AT + 4].try_into().expect("4"));
        let computed = crc32fast::hash(&b[..CRC_AT]);
        if stored != computed {
            return Err(SegmentHeaderError::Checksum { stored, computed });
        }
        let version = u16::from_le_bytes(b[VERSION_AT..VERSION_AT + 2].try_into().expect("2"));
        if !SUPPORTED_VERSIONS.contains(&version) {
            return Err(SegmentHeaderError::UnsupportedVersion { found: version });
        }
        let header_len = u16::from_le_bytes(b[HEADER_LEN_AT..HEADER_LEN_AT + 2].try_into().expect("2"));
        let flags = u32::from_le_bytes(b[FLAGS_AT..FLAGS_AT + 4].try_into().expect("4"));
        let reserved = u32::from_le_bytes(b[RESERVED_AT..RESERVED_AT + 4].try_into().expect("4"));
        if header_len as usize != SEGMENT_HEADER_BYTES || flags != 0 || reserved != 0 {
            return Err(SegmentHeaderError::Malformed);
        }
        Ok(SegmentHeader {
            version,
            first_seq: u64::from_le_bytes(b[FIRST_SEQ_AT..FIRST_SEQ_AT + 8].try_into().expect("8")),
            prev_link: b[PREV_LINK_AT..PREV_LINK_AT + 32].try_into().expect("32"),
        })
    }
}

impl std::fmt::Display for SegmentHeaderError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Short { have } => write!(f, "segment header is {have} bytes, expected {SEGMENT_HEADER_BYTES}"),
            Self::BadMagic { found } => write!(
                f,
                "not a fencelog segment: magic {:?} (expected {:?})",
                String::from_utf8_lossy(found),
                String::from_utf8_lossy(&MAGIC)
            ),
            Self::Checksum { stored, computed } => {
                write!(f, "segment header checksum mismatch (stored {stored:#010x}, computed {computed:#010x})")
            }
            Self::UnsupportedVersion { found } => {
                write!(f, "segment format version {found} is not supported (this build reads {SUPPORTED_VERSIONS:?})")
            }
            Self::Malformed => write!(f, "segment header has non-zero reserved fields or a wrong length"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_round_trips() {
        for version in [1, 2] {
            let h = SegmentHeader { version, first_seq: 1234, prev_link: [5; 32] };
            assert_eq!(SegmentHeader::decode(&h.encode()), Ok(h));
        }
    }

    #[test]
    fn newer_version_with_valid_checksum_is_named_not_called_damage() {
        let mut b = SegmentHeader::new(1, [0; 32]).encode();
        b[VERSION_AT..VERSION_AT + 2].copy_from_slice(&9u16.to_le_bytes());
        let crc = crc32fast::hash(&b[..CRC_AT]);
        b[CRC_AT..].copy_from_slice(&crc.to_le_bytes());
        let err = SegmentHeader::decode(&b).unwrap_err();
        assert_eq!(err, SegmentHeaderError::UnsupportedVersion { found: 9 });
        assert!(err.to_string().contains("version 9") && err.to_string().contains("[1, 2]"));
    }

    #[test]
    fn every_single_bit_flip_in_a_header_is_rejected() {
        let b = SegmentHeader::new(77, [3; 32]).encode();
        for i in 0..b.len() * 8 {
            let mut c = b;
            c[i / 8] ^= 1 << (i % 8);
            assert!(SegmentHeader::decode(&c).is_err(), "bit {i}");
        }
    }
}
