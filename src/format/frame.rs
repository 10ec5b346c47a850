//! Record frames: `len u32 LE | crc32 u32 LE | body`, and the body layout.
//!
//! The body is the bincode 2 encoding (legacy configuration: fixed-width
//! little-endian integers, u64 length prefixes) of [`RecordBody`]. It is written by
//! hand here so that scanning never allocates, and a test pins that both encodings
//! are identical byte for byte.

use serde::{Deserialize, Serialize};

/// A link of the blake3 hash chain (32 bytes).
pub type ChainLink = [u8; 32];

/// The link that precedes sequence 1.
pub const GENESIS_LINK: ChainLink = [0u8; 32];

/// Frame header: body length (u32 LE) then CRC32 of the body (u32 LE).
pub const FRAME_HEADER_BYTES: usize = 8;

// Body field offsets, each = previous offset + previous width (FORMAT.md §3).
const SEQ_AT: usize = 0; // u64
const WRITER_AT: usize = SEQ_AT + 8; // [u8; 16]
const TIME_AT: usize = WRITER_AT + 16; // u64
const LINK_AT: usize = TIME_AT + 8; // [u8; 32]
const PAYLOAD_LEN_AT: usize = LINK_AT + 32; // u64
const PAYLOAD_AT: usize = PAYLOAD_LEN_AT + 8;

/// Bytes of a body before its payload.
pub const BODY_FIXED_BYTES: usize = PAYLOAD_AT;

/// An owned record body, as serde sees it. Field order is the on-disk order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RecordBody {
    pub seq: u64,
    pub writer: [u8; 16],
    pub time_ms: u64,
    pub link: ChainLink,
    #[serde(with = "serde_bytes_as_seq")]
    pub payload: Vec<u8>,
}

/// `Vec<u8>` already serializes as a length-prefixed sequence of u8 in bincode; this
/// module only exists to make that choice explicit and stable.
mod serde_bytes_as_seq {
    use serde::{Deserialize, Deserializer, Serialize, Serializer};
    pub fn serialize<S: Serializer>(v: &[u8], s: S) -> Result<S::Ok, S::Error> {
        v.serialize(s)
    }
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<u8>, D::Error> {
        Vec::<u8>::deserialize(d)
    }
}

/// A record decoded in place from a byte slice.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecordRef<'a> {
    pub seq: u64,
    pub writer: [u8; 16],
    pub time_ms: u64,
    pub link: ChainLink,
    pub payload: &'a [u8],
    /// The body exactly as stored (used to recompute the chain link).
    pub body: &'a [u8],
}

impl RecordRef<'_> {
    pub fn to_owned_body(&self) -> RecordBody {
        RecordBody {
            seq: self.seq,
            writer: self.writer,
            time_ms: self.time_ms,
            link: self.link,
            payload: self.payload.to_vec(),
        }
    }

    /// Does this record's stored link follow from `prev`?
    pub fn link_follows(&self, prev: &ChainLink) -> bool {
        chain_link_of_body(prev, self.body) == self.link
    }
}

/// Why bytes at an offset are not a valid frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FrameError {
    /// Fewer bytes remain than the frame header or its declared body needs.
    Incomplete { have: u64, need: u64 },
    /// The declared body length is impossible (below the fixed body, above the limit).
    LengthOutOfRange { len: u32, max: u32 },
    /// The CRC32 of the body does not match the frame header.
    Checksum { stored: u32, computed: u32 },
    /// The checksum matches but the body contradicts itself (payload length).
    Malformed,
}

/// Total frame size for a payload of `payload_len` bytes.
pub fn frame_bytes(payload_len: usize) -> usize {
    FRAME_HEADER_BYTES + BODY_FIXED_BYTES + payload_len
}

/// The chain rule: `link_n = blake3(link_{n-1} || body_n without its link field)`.
pub fn chain_link(prev: &ChainLink, seq: u64, writer: &[u8; 16], time_ms: u64, payload: &[u8]) -> ChainLink {
    let mut h = blake3::Hasher::new();
    h.update(prev);
    h.update(&seq.to_le_bytes());
    h.update(writer);
    h.update(&time_ms.to_le_bytes());
    h.update(&(payload.len() as u64).to_le_bytes());
    h.update(payload);
    *h.finalize().as_bytes()
}

pub(super) fn chain_link_of_body(prev: &ChainLink, body: &[u8]) -> ChainLink {
    let mut h = blake3::Hasher::new();
    h.update(prev);
    h.update(&body[..LINK_AT]);
    h.update(&body[PAYLOAD_LEN_AT..]);
    *h.finalize().as_bytes()
}

/// The link a body stores (`body` is at least [`BODY_FIXED_BYTES`] long).
pub(super) fn stored_link(body: &[u8]) -> ChainLink {
    body[LINK_AT..LINK_AT + 32].try_into().expect("32 bytes")
}

/// Append one frame to `out`; returns the new record's chain link.
pub fn encode_frame(
    out: &mut Vec<u8>,
    prev: &ChainLink,
    seq: u64,
    writer: &[u8; 16],
    time_ms: u64,
    payload: &[u8],
) -> ChainLink {
    let link = chain_link(prev, seq, writer, time_ms, payload);
    let body_len = BODY_FIXED_BYTES + payload.len();
    assert!(body_len <= u32::MAX as usize, "caller enforces the payload limit");
    let start = out.len();
    out.reserve(FRAME_HEADER_BYTES + body_len);
    out.extend_from_slice(&(body_len as u32).to_le_bytes());
    out.extend_from_slice(&[0u8; 4]); // crc, filled below
    out.extend_from_slice(&seq.to_le_bytes());
    out.extend_from_slice(writer);
    out.extend_from_slice(&time_ms.to_le_bytes());
    out.extend_from_slice(&link);
    out.extend_from_slice(&(payload.len() as u64).to_le_bytes());
    out.extend_from_slice(payload);
    let crc = crc32fast::hash(&out[start + FRAME_HEADER_BYTES..]);
    out[start + 4..start + 8].copy_from_slice(&crc.to_le_bytes());
    link
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

/// Decode the frame at the start of `buf`. `body_max` bounds the declared body length.
/// Returns the record and the number of bytes the frame occupies. Never panics on
/// any input.
pub fn decode_frame(buf: &[u8], body_max: u32) -> Result<(RecordRef<'_>, usize), FrameError> {
    if buf.len() < FRAME_HEADER_BYTES {
        return Err(FrameError::Incomplete { have: buf.len() as u64, need: FRAME_HEADER_BYTES as u64 });
    }
    let len = u32::from_le_bytes(buf[0..4].try_into().expect("4 bytes"));
    let stored = u32::from_le_bytes(buf[4..8].try_into().expect("4 bytes"));
    if (len as usize) < BODY_FIXED_BYTES || len > body_max {
        return Err(FrameError::LengthOutOfRange { len, max: body_max });
    }
    let total = FRAME_HEADER_BYTES + len as usize;
    if buf.len() < total {
        return Err(FrameError::Incomplete { have: buf.len() as u64, need: total as u64 });
    }
    let body = &buf[FRAME_HEADER_BYTES..total];
    let computed = crc32fast::hash(body);
    if computed != stored {
        return Err(FrameError::Checksum { stored, computed });
    }
    let payload_len = u64_at(body, PAYLOAD_LEN_AT);
    if payload_len != (body.len() - PAYLOAD_AT) as u64 {
        return Err(FrameError::Malformed);
    }
    let rec = RecordRef {
        seq: u64_at(body, SEQ_AT),
        writer: body[WRITER_AT..WRITER_AT + 16].try_into().expect("16 bytes"),
        time_ms: u64_at(body, TIME_AT),
        link: body[LINK_AT..LINK_AT + 32].try_into().expect("32 bytes"),
        payload: &body[PAYLOAD_AT..],
        body,
    };
    Ok((rec, total))
}

/// Lower-case hex, for printing chain heads out of band.
pub fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        s.push(DIGITS[(b >> 4) as usize] as char);
        s.push(DIGITS[(b & 15) as usize] as char);
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Proves the hand-written body layout is exactly bincode 2's legacy encoding of
    /// `RecordBody`, so the spec's claim "body = bincode via serde" holds.
    #[test]
    fn hand_written_body_equals_bincode_legacy_encoding() {
        let payload = b"hello, ledger".to_vec();
        let writer = [7u8; 16];
        let mut out = Vec::new();
        let link = encode_frame(&mut out, &GENESIS_LINK, 42, &writer, 1_700_000_000_123, &payload);
        let body = RecordBody { seq: 42, writer, time_ms: 1_700_000_000_123, link, payload };
        let via_bincode = bincode::serde::encode_to_vec(&body, bincode::config::legacy()).unwrap();
        assert_eq!(&out[FRAME_HEADER_BYTES..], &via_bincode[..]);
        let (back, _): (RecordBody, usize) =
            bincode::serde::decode_from_slice(&out[FRAME_HEADER_BYTES..], bincode::config::legacy()).unwrap();
        assert_eq!(back, body);
    }

    #[test]
    fn decode_of_encoded_frame_round_trips_and_links() {
        let mut out = Vec::new();
        let l1 = encode_frame(&mut out, &GENESIS_LINK, 1, &[1; 16], 10, b"a");
        let (rec, used) = decode_frame(&out, 1 << 20).unwrap();
        assert_eq!(used, out.len());
        assert_eq!((rec.seq, rec.time_ms, rec.payload, rec.link), (1, 10, &b"a"[..], l1));
        assert!(rec.link_follows(&GENESIS_LINK));
        assert!(!rec.link_follows(&[9; 32]));
    }

    #[test]
    fn decode_rejects_each_kind_of_damage_without_panicking() {
        let mut out = Vec::new();
        encode_frame(&mut out, &GENESIS_LINK, 1, &[1; 16], 10, b"payload");
        for cut in 0..out.len() {
            assert!(matches!(decode_frame(&out[..cut], 1 << 20), Err(FrameError::Incomplete { .. })));
        }
        let mut bad = out.clone();
        bad[20] ^= 1;
        assert!(matches!(decode_frame(&bad, 1 << 20), Err(FrameError::Checksum { .. })));
        assert!(matches!(decode_frame(&out, 10), Err(FrameError::LengthOutOfRange { .. })));
    }
}
