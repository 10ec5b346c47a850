//! Property tests of the pure format layer.

use fencelog::format::{Cursor, GENESIS_LINK, ScanOutcome, decode_frame, encode_frame, scan_frames};
use proptest::prelude::*;

fn encode_all(payloads: &[Vec<u8>]) -> Vec<u8> {
    let mut out = Vec::new();
    let mut link = GENESIS_LINK;
    for (i, p) in payloads.iter().enumerate() {
        link = encode_frame(&mut out, &link, i as u64 + 1, &[9; 16], i as u64 * 3, p);
    }
    out
}

proptest! {
    /// Proves: any sequence of payloads scans back exactly, in order, as a clean run.
    #[test]
    fn any_payload_sequence_scans_back_exactly(payloads in prop::collection::vec(prop::collection::vec(any::<u8>(), 0..300), 0..20)) {
        let buf = encode_all(&payloads);
        let mut c = Cursor { next_seq: 1, prev_link: GENESIS_LINK };
        let mut got = vec![];
        let out = scan_frames(&buf, 0, &mut c, 1 << 20, |_, r| got.push(r.payload.to_vec()));
        prop_assert_eq!(out, ScanOutcome::Clean);
        prop_assert_eq!(got, payloads);
    }

    /// Proves: any single-bit flip anywhere in a run of frames is detected (the scan
    /// reports damage at or before the flipped byte's frame), and never panics.
    #[test]
    fn any_single_bit_flip_is_detected(
        payloads in prop::collection::vec(prop::collection::vec(any::<u8>(), 0..120), 1..8),
        pick in any::<prop::sample::Index>(), bit in 0u8..8,
    ) {
        let mut buf = encode_all(&payloads);
        let at = pick.index(buf.len());
        buf[at] ^= 1 << bit;
        let mut c = Cursor { next_seq: 1, prev_link: GENESIS_LINK };
        let mut visited_end = 0u64;
        let out = scan_frames(&buf, 0, &mut c, 1 << 20, |o, r| visited_end = o + 8 + r.body.len() as u64);
        let ScanOutcome::Damaged(d) = out else { return Err(TestCaseError::fail("flip accepted")) };
        prop_assert!(d.offset <= at as u64 && visited_end <= at as u64);
    }

    /// Proves: decoding arbitrary bytes never panics.
    #[test]
    fn decoding_arbitrary_bytes_never_panics(bytes in prop::collection::vec(any::<u8>(), 0..512)) {
        let _ = decode_frame(&bytes, 1 << 20);
        let _ = fencelog::format::SegmentHeader::decode(&bytes);
        let mut c = Cursor { next_seq: 1, prev_link: GENESIS_LINK };
        let _ = scan_frames(&bytes, 0, &mut c, 1 << 20, |_, _| {});
    }
}
