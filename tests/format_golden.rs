//! Golden bytes: `log-format/vectors/` (frames and headers with their expected
//! decoding) and `fixtures/` (real log directories written by released format
//! versions). Both are regenerated only deliberately, with
//! `FENCELOG_REGEN_GOLDEN=1`, and only for a new format version.

mod common;

use std::fs;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use fencelog::format::{
    Cursor, FRAMES_END_MARK, GENESIS_LINK, Layout, SEGMENT_HEADER_BYTES, ScanOutcome, SegmentHeader, decode_frame,
    encode_frame, hex, scan_frames, scan_segment_frames,
};
use fencelog::storage::{Log, LogOptions, read_records, verify_dir};
use serde_json::{Value, json};

const WRITER: [u8; 16] = *b"fencelog-vectors";

/// `FENCELOG_REGEN_GOLDEN=V` rewrites the vectors and fixture of format version V
/// only (the others are never touched).
fn regen_version(version: u16) -> bool {
    std::env::var("FENCELOG_REGEN_GOLDEN").is_ok_and(|v| v == version.to_string())
}

fn regen() -> bool {
    regen_version(1)
}

fn root(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(rel)
}

fn unhex(s: &str) -> Vec<u8> {
    (0..s.len()).step_by(2).map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap()).collect()
}

/// A frame vector: (name, prev link, seq, time, payload).
type FrameCase = (&'static str, [u8; 32], u64, u64, Vec<u8>);

/// The frame vectors this format version defines.
fn frame_cases() -> Vec<FrameCase> {
    vec![
        ("frame-empty-payload", GENESIS_LINK, 1, 0, vec![]),
        ("frame-first-record", GENESIS_LINK, 1, 1_767_225_600_000, b"{\"claim\":\"home/a\"}".to_vec()),
        ("frame-chained", [0xab; 32], 4_294_967_296, u64::MAX, (0u8..=255).collect()),
    ]
}

fn expected_frame_json(prev: &[u8; 32], seq: u64, time_ms: u64, payload: &[u8], link: &[u8]) -> Value {
    json!({
        "prev_link": hex(prev), "seq": seq, "writer": hex(&WRITER), "time_ms": time_ms,
        "link": hex(link), "payload": hex(payload),
    })
}

/// Proves: each frame vector decodes to its JSON description, its link follows
/// from the stated previous link, and re-encoding reproduces the bytes exactly.
#[test]
fn frame_vectors_decode_and_reencode_byte_for_byte() {
    let dir = root("log-format/vectors");
    for (name, prev, seq, time_ms, payload) in frame_cases() {
        let (bin, js) = (dir.join(format!("{name}.bin")), dir.join(format!("{name}.json")));
        if regen() {
            let mut out = Vec::new();
            let link = encode_frame(&mut out, &prev, seq, &WRITER, time_ms, &payload);
            fs::write(&bin, &out).unwrap();
            let v = expected_frame_json(&prev, seq, time_ms, &payload, &link);
            fs::write(&js, serde_json::to_string_pretty(&v).unwrap() + "\n").unwrap();
        }
        let bytes = fs::read(&bin).unwrap_or_else(|e| panic!("{}: {e}", bin.display()));
        let want: Value = serde_json::from_str(&fs::read_to_string(&js).unwrap()).unwrap();
        let (rec, used) = decode_frame(&bytes, u32::MAX).unwrap();
        assert_eq!(used, bytes.len(), "{name}");
        let prev: [u8; 32] = unhex(want["prev_link"].as_str().unwrap()).try_into().unwrap();
        assert!(rec.link_follows(&prev), "{name}: link");
        assert_eq!(expected_frame_json(&prev, rec.seq, rec.time_ms, rec.payload, &rec.link), want, "{name}");
        let mut again = Vec::new();
        encode_frame(&mut again, &prev, rec.seq, &rec.writer, rec.time_ms, rec.payload);
        assert_eq!(again, bytes, "{name}: re-encoding");
    }
}

/// Proves: the segment header vector decodes to its description and re-encodes
/// exactly; a whole-segment vector scans to its listed records.
#[test]
fn segment_vectors_decode_and_reencode_byte_for_byte() {
    let dir = root("log-format/vectors");
    let (hbin, hjs) = (dir.join("segment-header.bin"), dir.join("segment-header.json"));
    let (sbin, sjs) = (dir.join("segment-three-records.seg"), dir.join("segment-three-records.json"));
    if regen() {
        write_header_vector(&hbin, &hjs, 1);
        let (seg, listed) = three_record_segment(1, b"gamma");
        fs::write(&sbin, &seg).unwrap();
        fs::write(&sjs, serde_json::to_string_pretty(&Value::Array(listed)).unwrap() + "\n").unwrap();
    }
    let hb = fs::read(&hbin).unwrap();
    let want: Value = serde_json::from_str(&fs::read_to_string(&hjs).unwrap()).unwrap();
    let h = SegmentHeader::decode(&hb).unwrap();
    assert_eq!(&hb[..8], want["magic"].as_str().unwrap().as_bytes());
    assert_eq!(u16::from_le_bytes([hb[8], hb[9]]) as u64, want["format_version"].as_u64().unwrap());
    assert_eq!(
        (h.first_seq, hex(&h.prev_link)),
        (want["first_seq"].as_u64().unwrap(), want["prev_link"].as_str().unwrap().into())
    );
    assert_eq!(h.encode().to_vec(), hb);

    let seg = fs::read(&sbin).unwrap();
    let want: Value = serde_json::from_str(&fs::read_to_string(&sjs).unwrap()).unwrap();
    let h = SegmentHeader::decode(&seg).unwrap();
    let mut c = Cursor { next_seq: h.first_seq, prev_link: h.prev_link };
    let mut got = vec![];
    let mut prev = h.prev_link;
    let out = scan_frames(&seg, SEGMENT_HEADER_BYTES, &mut c, u32::MAX, |_, r| {
        got.push(expected_frame_json(&prev, r.seq, r.time_ms, r.payload, &r.link));
        prev = r.link;
    });
    assert_eq!(out, ScanOutcome::Clean);
    assert_eq!(Value::Array(got), want);
}

/// Write the header vector of `version` (first_seq 1 000 001) and its description.
fn write_header_vector(bin: &Path, js: &Path, version: u16) {
    let h = SegmentHeader { version, first_seq: 1_000_001, prev_link: [0x5a; 32] };
    fs::write(bin, h.encode()).unwrap();
    let v =
        json!({"magic": "FENCELOG", "format_version": version, "first_seq": 1_000_001, "prev_link": hex(&[0x5a; 32])});
    fs::write(js, serde_json::to_string_pretty(&v).unwrap() + "\n").unwrap();
}

/// A first segment of `version` holding records alpha, beta and `third`, and the
/// description of each record.
fn three_record_segment(version: u16, third: &[u8]) -> (Vec<u8>, Vec<Value>) {
    let mut seg = SegmentHeader { version, first_seq: 1, prev_link: GENESIS_LINK }.encode().to_vec();
    let mut link = GENESIS_LINK;
    let mut listed = vec![];
    for (seq, p) in [(1u64, &b"alpha"[..]), (2, b"beta"), (3, third)] {
        let prev = link;
        link = encode_frame(&mut seg, &prev, seq, &WRITER, 1_767_225_600_000 + seq, p);
        listed.push(expected_frame_json(&prev, seq, 1_767_225_600_000 + seq, p, &link));
    }
    (seg, listed)
}

/// Every record of a fixture log, one line each (for its insta snapshot).
fn records_listing(dir: &Path, body_max: u32) -> String {
    let mut listing = String::new();
    read_records(dir, 1, body_max, |r| {
        let w = uuid::Uuid::from_bytes(r.writer);
        listing += &format!(
            "{} {} {w} {} {}\n",
            r.seq,
            r.time_ms,
            hex(&r.link)[..16].to_owned(),
            String::from_utf8_lossy(r.payload)
        );
        true
    })
    .unwrap();
    listing
}

/// Write the fixture log of `version` anew: 12 records in segments of 512 bytes.
fn write_fixture(dir: &Path, version: u16) {
    let _ = fs::remove_dir_all(dir);
    let log = Log::open(dir, fixture_options(version)).unwrap();
    for i in 1..=12u32 {
        let note = format!("v{version}").repeat(i as usize * 3);
        let p = format!("{{\"event\":\"fixture\",\"n\":{i},\"note\":\"{note}\"}}");
        log.append(p.as_bytes()).unwrap();
    }
    log.close().unwrap();
    let _ = fs::remove_file(dir.join("LOCK"));
    let _ = fs::remove_dir(dir.join("snapshots"));
}

fn fixture_options(format_version: u16) -> LogOptions {
    let t = Arc::new(AtomicU64::new(1_767_225_600_000));
    LogOptions {
        segment_bytes_max: 512,
        format_version,
        segment_prealloc_bytes: 4096,
        writer_id: Some(uuid::Uuid::from_bytes(WRITER)),
        clock: Some(Arc::new(move || t.fetch_add(250, Ordering::SeqCst))),
        ..LogOptions::default()
    }
}

/// Proves: the v1 fixture — a real multi-segment log written by this format
/// version — still reads and verifies, its content is unchanged (insta), and it can
/// be opened for writing and appended to.
#[test]
fn v1_fixture_log_reads_verifies_and_accepts_appends() {
    let dir = root("fixtures/v1-multi-segment");
    if regen() {
        write_fixture(&dir, 1);
    }
    let body_max = LogOptions::default().body_max();
    let s = verify_dir(&dir, body_max).unwrap();
    assert!(s.is_intact(), "{:?}", s.problems);
    let mut listing = format!(
        "segments {} bytes {} records {} seq {:?}..{:?} time {:?}..{:?}\nchain head {}\n",
        s.segments, s.bytes, s.records, s.first_seq, s.last_seq, s.first_time_ms, s.last_time_ms, s.chain_head
    );
    listing += &records_listing(&dir, body_max);
    insta::assert_snapshot!("v1_multi_segment_listing", listing);

    let copy = common::copy_dir(&dir);
    let log = Log::open(copy.path(), LogOptions::default()).unwrap();
    assert!(log.open_report().repairs.is_empty());
    assert_eq!(log.append(b"appended by a later build").unwrap().first_seq, 13);
    log.close().unwrap();
    assert!(verify_dir(copy.path(), body_max).unwrap().is_intact());
}

/// Proves: the v2 vectors pin the preallocated layout: a version 2 header, and a
/// segment whose three frames are followed by the end mark and zeros to the end of
/// the file — which a scan reports as the end of the frames (not damage), at the
/// offset listed.
#[test]
fn v2_vectors_decode_and_reencode_byte_for_byte() {
    let dir = root("log-format/vectors");
    let (hbin, hjs) = (dir.join("segment-header-v2.bin"), dir.join("segment-header-v2.json"));
    let (sbin, sjs) = (dir.join("segment-v2-preallocated.seg"), dir.join("segment-v2-preallocated.json"));
    if regen_version(2) {
        write_header_vector(&hbin, &hjs, 2);
        // The last payload ends in zero bytes of its own: the end of the frames is
        // found by frames, not by the last non-zero byte.
        let (mut seg, listed) = three_record_segment(2, b"gamma\0\0\0\0");
        let frames_end = seg.len();
        seg.extend_from_slice(&FRAMES_END_MARK);
        seg.resize(1024, 0);
        fs::write(&sbin, &seg).unwrap();
        let v = json!({"frames_end": frames_end, "file_bytes": 1024, "records": listed});
        fs::write(&sjs, serde_json::to_string_pretty(&v).unwrap() + "\n").unwrap();
    }
    let hb = fs::read(&hbin).unwrap();
    let want: Value = serde_json::from_str(&fs::read_to_string(&hjs).unwrap()).unwrap();
    let h = SegmentHeader::decode(&hb).unwrap();
    assert_eq!(u16::from_le_bytes([hb[8], hb[9]]) as u64, want["format_version"].as_u64().unwrap());
    assert_eq!((h.version, h.layout()), (2, Layout::Preallocated));
    assert_eq!(
        (h.first_seq, hex(&h.prev_link)),
        (want["first_seq"].as_u64().unwrap(), want["prev_link"].as_str().unwrap().into())
    );
    assert_eq!(h.encode().to_vec(), hb);

    let seg = fs::read(&sbin).unwrap();
    let want: Value = serde_json::from_str(&fs::read_to_string(&sjs).unwrap()).unwrap();
    assert_eq!(seg.len() as u64, want["file_bytes"].as_u64().unwrap());
    let h = SegmentHeader::decode(&seg).unwrap();
    let mut c = Cursor { next_seq: h.first_seq, prev_link: h.prev_link };
    let mut got = vec![];
    let mut prev = h.prev_link;
    let out = scan_segment_frames(&seg, SEGMENT_HEADER_BYTES, 0, &mut c, u32::MAX, h.layout(), |_, r| {
        got.push(expected_frame_json(&prev, r.seq, r.time_ms, r.payload, &r.link));
        prev = r.link;
    });
    assert_eq!(out, ScanOutcome::ZeroTail { offset: want["frames_end"].as_u64().unwrap() });
    assert_eq!(Value::Array(got), want["records"]);
    // Read as version 1 (the file ends where the frames end), the same zeros are damage.
    let mut c = Cursor { next_seq: h.first_seq, prev_link: h.prev_link };
    assert!(matches!(scan_frames(&seg, SEGMENT_HEADER_BYTES, &mut c, u32::MAX, |_, _| {}), ScanOutcome::Damaged(_)));
}

/// Proves: the v2 fixture — a real multi-segment log of preallocated segments
/// written by this build (sealed segments cut to their last record, the last one
/// followed by zeros) — reads and verifies, its content is unchanged (insta), and it
/// can be opened for writing and appended to, overwriting its zeros in place.
#[test]
fn v2_fixture_log_reads_verifies_and_accepts_appends() {
    let dir = root("fixtures/v2-preallocated");
    if regen_version(2) {
        write_fixture(&dir, 2);
    }
    let segments = fencelog::storage::list_segments(&dir).unwrap();
    let last = &segments.last().unwrap().1;
    let last_bytes = fs::read(last).unwrap();
    assert_eq!(SegmentHeader::decode(&last_bytes).unwrap().version, 2);
    assert_eq!(*last_bytes.last().unwrap(), 0, "the last segment ends in preallocated zeros");
    let body_max = LogOptions::default().body_max();
    let s = verify_dir(&dir, body_max).unwrap();
    assert!(s.is_intact(), "{:?}", s.problems);
    let mut listing = format!(
        "segments {} records {} seq {:?}..{:?} time {:?}..{:?}\nchain head {}\n",
        s.segments, s.records, s.first_seq, s.last_seq, s.first_time_ms, s.last_time_ms, s.chain_head
    );
    listing += &records_listing(&dir, body_max);
    insta::assert_snapshot!("v2_preallocated_listing", listing);

    let h = SegmentHeader::decode(&last_bytes).unwrap();
    let mut c = Cursor { next_seq: h.first_seq, prev_link: h.prev_link };
    let ScanOutcome::ZeroTail { offset: frames_end } =
        scan_segment_frames(&last_bytes, SEGMENT_HEADER_BYTES, 0, &mut c, body_max, h.layout(), |_, _| {})
    else {
        panic!("the fixture's last segment ends in zeros")
    };
    let copy = common::copy_dir(&dir);
    let copied_last = copy.path().join(last.file_name().unwrap());
    let log = Log::open(copy.path(), LogOptions::default()).unwrap();
    assert!(log.open_report().repairs.is_empty());
    assert_eq!(log.append(b"appended by a later build").unwrap().first_seq, 13);
    log.close().unwrap();
    let after = fs::read(&copied_last).unwrap();
    assert_eq!(&after[..frames_end as usize], &last_bytes[..frames_end as usize], "nothing before the end moved");
    let (rec, _) = decode_frame(&after[frames_end as usize..], body_max).unwrap();
    assert_eq!((rec.seq, rec.payload), (13, &b"appended by a later build"[..]), "written where the zeros began");
    assert!(verify_dir(copy.path(), body_max).unwrap().is_intact());
}

/// The position index's vector (FORMAT.md §3b): three slots — an entry, a slot
/// never written (zeros), an entry — with their decoding. Regenerated only with
/// `FENCELOG_REGEN_GOLDEN=index`.
fn index_vector() -> (Vec<u8>, Value) {
    use fencelog::storage::file::index::{Position, encode};
    let entries = [
        Position { offset: 262_150, cursor: Cursor { next_seq: 1_917, prev_link: [0x11; 32] } },
        Position { offset: 786_440, cursor: Cursor { next_seq: 5_760, prev_link: [0xc3; 32] } },
    ];
    let mut bytes = encode(&entries[0]).to_vec();
    bytes.extend([0u8; 52]);
    bytes.extend(encode(&entries[1]));
    let json = json!({
        "entry_bytes": 52,
        "stride_bytes": 262_144,
        "slots": [
            {"slot": 1, "seq": 1_917, "offset": 262_150, "prev_link": hex(&[0x11; 32])},
            {"slot": 2, "never_written": true},
            {"slot": 3, "seq": 5_760, "offset": 786_440, "prev_link": hex(&[0xc3; 32])},
        ],
    });
    (bytes, json)
}

/// Proves: the index vector decodes slot by slot to its JSON (the zero slot to
/// nothing), and re-encoding each entry gives its bytes exactly.
#[test]
fn index_vector_decodes_and_reencodes_byte_for_byte() {
    use fencelog::storage::file::index::{decode, encode};
    let (bytes, json) = index_vector();
    let (bin, js) = (root("log-format/vectors/index-entries.idx"), root("log-format/vectors/index-entries.json"));
    if std::env::var("FENCELOG_REGEN_GOLDEN").is_ok_and(|v| v == "index") {
        fs::write(&bin, &bytes).unwrap();
        fs::write(&js, serde_json::to_string_pretty(&json).unwrap() + "\n").unwrap();
    }
    let golden = fs::read(&bin).unwrap();
    assert_eq!(golden, bytes, "the vector's bytes");
    let expect: Value = serde_json::from_str(&fs::read_to_string(&js).unwrap()).unwrap();
    assert_eq!(expect, json);
    for (slot, e) in expect["slots"].as_array().unwrap().iter().zip(golden.chunks_exact(52)) {
        match decode(e) {
            None => assert_eq!(slot["never_written"], true, "{slot}"),
            Some(p) => {
                assert_eq!(
                    (p.cursor.next_seq, p.offset, hex(&p.cursor.prev_link)),
                    (
                        slot["seq"].as_u64().unwrap(),
                        slot["offset"].as_u64().unwrap(),
                        slot["prev_link"].as_str().unwrap().to_owned()
                    )
                );
                assert_eq!(&encode(&p)[..], e, "re-encoded byte for byte");
            }
        }
    }
}
