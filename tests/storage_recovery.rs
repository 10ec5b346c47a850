//! Recovery, corruption, limits and injected failures, on real files.

mod common;

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use common::{VERSIONS, copy_dir, hash_tree, offset_of, opts_v, records, segment_files, stop_write_at, written_bytes};
use fencelog::format::{FRAME_HEADER_BYTES, FRAMES_END_MARK, SEGMENT_HEADER_BYTES};
use fencelog::storage::{Error, Log, LogOptions, verify_dir};

fn payload(i: u64) -> Vec<u8> {
    format!("record {i} {}", "p".repeat((i % 7) as usize * 5)).into_bytes()
}

fn write_log(dir: &Path, n: u64, opts: LogOptions) {
    let log = Log::open(dir, opts).unwrap();
    for i in 1..=n {
        assert_eq!(log.append(&payload(i)).unwrap().first_seq, i);
    }
    log.close().unwrap();
}

fn small_segments() -> LogOptions {
    LogOptions { segment_bytes_max: 300, ..LogOptions::default() }
}

/// Proves: a write of the last record stopped at every byte offset (the file cut
/// there in v1; zeros from there on in v2, the end mark included) is recovered as a
/// torn tail: earlier records survive exactly, the cut bytes are kept as evidence,
/// and the next append gets the next sequence with a valid chain.
#[test]
fn truncation_at_every_offset_of_the_last_record_recovers_the_previous_records() {
    for version in VERSIONS {
        let base = tempfile::tempdir().unwrap();
        write_log(base.path(), 5, opts_v(version));
        let seg = &segment_files(base.path())[0];
        let full = fs::read(seg).unwrap();
        let frames_end = fencelog::storage::frames_end(seg).unwrap() as usize;
        let last_len = fencelog::format::frame_bytes(payload(5).len());
        let last_start = frames_end - last_len;
        // The last write: the frame, and in v2 the end mark after it.
        let write_end = if version == 1 { frames_end } else { frames_end + FRAMES_END_MARK.len() };
        for cut in last_start..=write_end {
            let d = copy_dir(base.path());
            let seg = &segment_files(d.path())[0];
            stop_write_at(seg, cut as u64, version);
            let log = Log::open(d.path(), opts_v(version)).unwrap();
            let report = log.open_report().clone();
            let intact = cut >= frames_end;
            assert_eq!(report.last_seq, if intact { 5 } else { 4 }, "v{version} cut at {cut}");
            if intact || cut == last_start {
                assert!(report.repairs.is_empty(), "v{version} cut at {cut}: a clean boundary needs no repair");
            } else {
                assert_eq!(report.repairs.len(), 1);
                let r = &report.repairs[0];
                assert_eq!((r.kind, r.offset, r.seq), ("torn_tail", last_start as u64, 5));
                let mut cut_bytes = full[last_start..cut].to_vec();
                if version == 2 {
                    // The zeros of the preallocated space are not evidence.
                    cut_bytes.truncate(cut_bytes.iter().rposition(|&b| b != 0).map_or(0, |p| p + 1));
                }
                assert_eq!(fs::read(&r.evidence).unwrap(), cut_bytes, "v{version}: evidence keeps the cut bytes");
            }
            let next = log.append(b"after recovery").unwrap();
            assert_eq!(next.first_seq, report.last_seq + 1);
            log.close().unwrap();
            let recs = records(d.path());
            let expect: Vec<_> = (1..=report.last_seq).map(|i| (i, payload(i))).collect();
            assert_eq!(&recs[..recs.len() - 1], &expect[..], "v{version} cut at {cut}");
            assert!(verify_dir(d.path(), LogOptions::default().body_max()).unwrap().is_intact());
        }
    }
}

/// Proves: one bit flipped at every byte of a multi-segment log is detected every
/// time and refused as corruption — in the very last record too: a flipped bit is
/// rot of a record that may have been acknowledged, never a torn write (no sector
/// is zeroed; a length field that grew still leaves a body that checksums; in v2
/// the end mark after the last record shows its write completed) — never accepted
/// silently, never cut, never a panic. In v2, the end mark and bytes of the zeros
/// after it are flipped too: they are no record, so the flip is cut as a torn tail
/// (the mark: too few bytes for a frame; the zeros: bytes after the end mark) and
/// every record is kept.
#[test]
fn bit_flip_at_every_byte_of_a_multi_segment_log_is_always_detected() {
    for version in VERSIONS {
        let small = LogOptions { format_version: version, segment_prealloc_bytes: 4096, ..small_segments() };
        let base = tempfile::tempdir().unwrap();
        write_log(base.path(), 9, small.clone());
        let segs = segment_files(base.path());
        assert!(segs.len() >= 3, "the log must span several segments, has {}", segs.len());
        let original = records(base.path());
        let (mut torn, mut refused, mut unused_space_cut) = (0, 0, 0);
        let mut flipped = 0u64;
        for (si, _) in segs.iter().enumerate() {
            let len = fs::metadata(&segs[si]).unwrap().len() as usize;
            let written = written_bytes(&segs[si]).len();
            // The records' bytes (before the end mark of a v2 last segment).
            let frames = fencelog::storage::frames_end(&segs[si]).unwrap() as usize;
            // Every written byte; of the zeros after them (v2's last segment), the
            // first 64 and then one in 97.
            let bytes_to_flip = (0..len).filter(|&b| b < written + 64 || b % 97 == 0);
            for byte in bytes_to_flip {
                let d = copy_dir(base.path());
                let seg = &segment_files(d.path())[si];
                let mut bytes = fs::read(seg).unwrap();
                bytes[byte] ^= 1 << (byte % 8);
                fs::write(seg, &bytes).unwrap();
                let where_ = format!("v{version} segment {si} byte {byte}");
                let summary = verify_dir(d.path(), LogOptions::default().body_max()).unwrap();
                assert!(!summary.is_intact(), "{where_}: the reader must report the damage");
                match Log::open(d.path(), small.clone()) {
                    Err(Error::Corruption { segment, offset, seq, .. }) => {
                        assert!(byte < frames, "{where_}: a flip outside the records is not corruption");
                        refused += 1;
                        assert!(summary.has_corruption(), "{where_}: reader and writer must agree");
                        assert!(segment.starts_with(d.path()) && seq >= 1 && offset < len as u64, "{where_}");
                    }
                    Err(e) => panic!("{where_}: unexpected error {e}"),
                    Ok(log) if byte >= frames => {
                        unused_space_cut += 1;
                        let r = log.open_report().repairs.clone();
                        let want = if byte < written { "incomplete_frame" } else { "bytes_after_end_mark" };
                        assert_eq!((r.len(), r[0].damage.as_str()), (1, want), "{where_}");
                        assert!(!summary.has_corruption(), "{where_}: reader must call it a torn tail");
                        drop(log);
                        assert_eq!(records(d.path()), original, "{where_}: every record kept");
                    }
                    Ok(log) => {
                        torn += 1;
                        let r = log.open_report().repairs.clone();
                        assert_eq!(r.len(), 1, "{where_}: opened without reporting a repair");
                        assert!(
                            si == segs.len() - 1 && r[0].offset <= byte as u64,
                            "{where_}: cut must cover the flip"
                        );
                        assert!(!summary.has_corruption(), "{where_}: reader must call it a torn tail");
                        drop(log);
                        let survived = records(d.path());
                        assert_eq!(
                            &original[..survived.len()],
                            &survived[..],
                            "{where_}: survivors are an exact prefix"
                        );
                        assert_eq!(survived.len(), original.len() - 1, "{where_}: only the last record is lost");
                    }
                }
                flipped += 1;
            }
        }
        let frames: u64 = segs.iter().map(|s| fencelog::storage::frames_end(s).unwrap()).sum();
        assert_eq!((torn, refused), (0, frames), "v{version}: every flip of a record's byte refused, none cut");
        assert_eq!(unused_space_cut, flipped - frames, "v{version}");
        if version == 2 {
            assert!(unused_space_cut > 0, "v2: the last segment has preallocated space after its end mark");
        }
    }
}

/// Proves: a damaged record followed by intact ones refuses to open for writing,
/// naming the segment, the byte offset and the sequence, and changes no byte.
#[test]
fn mid_log_corruption_is_refused_with_segment_offset_and_sequence() {
    let d = tempfile::tempdir().unwrap();
    write_log(d.path(), 4, LogOptions::default());
    let seg = segment_files(d.path())[0].clone();
    let mut bytes = fs::read(&seg).unwrap();
    let rec2 = SEGMENT_HEADER_BYTES + fencelog::format::frame_bytes(payload(1).len());
    bytes[rec2 + FRAME_HEADER_BYTES + 30] ^= 0x10;
    fs::write(&seg, &bytes).unwrap();
    let before = hash_tree(d.path());
    let err = Log::open(d.path(), LogOptions::default()).err().expect("must refuse");
    match &err {
        Error::Corruption { segment, offset, seq, detail } => {
            assert_eq!((segment, *offset, *seq), (&seg, rec2 as u64, 2));
            assert!(detail.contains("checksum_mismatch") && detail.contains("intact records follow"), "{detail}");
        }
        e => panic!("expected corruption, got {e}"),
    }
    assert_eq!(err.code(), "CORRUPTION");
    let msg = err.to_string();
    assert!(msg.contains(&seg.display().to_string()) && msg.contains("sequence 2"), "{msg}");
    let after: std::collections::BTreeMap<_, _> =
        hash_tree(d.path()).into_iter().filter(|(p, _)| p.file_name().unwrap() != "LOCK").collect();
    let before: std::collections::BTreeMap<_, _> =
        before.into_iter().filter(|(p, _)| p.file_name().unwrap() != "LOCK").collect();
    assert_eq!(before, after, "refusal must not change a byte");
}

/// Proves: an intact record whose chain link was recomputed after an edit (a
/// forged record with a valid checksum) is caught by the next record's link.
#[test]
fn an_edited_record_with_a_recomputed_checksum_breaks_the_chain() {
    let d = tempfile::tempdir().unwrap();
    write_log(d.path(), 3, LogOptions::default());
    let seg = segment_files(d.path())[0].clone();
    let mut bytes = fs::read(&seg).unwrap();
    let r1 = SEGMENT_HEADER_BYTES;
    let body_len = u32::from_le_bytes(bytes[r1..r1 + 4].try_into().unwrap()) as usize;
    let body = r1 + FRAME_HEADER_BYTES;
    bytes[body + body_len - 1] ^= 1; // edit the payload of record 1
    let crc = crc32fast::hash(&bytes[body..body + body_len]);
    bytes[r1 + 4..r1 + 8].copy_from_slice(&crc.to_le_bytes());
    fs::write(&seg, &bytes).unwrap();
    let s = verify_dir(d.path(), LogOptions::default().body_max()).unwrap();
    assert_eq!(s.problems[0].kind, "chain_mismatch");
    assert_eq!((s.problems[0].seq, s.problems[0].offset), (1, r1 as u64));
    assert!(matches!(Log::open(d.path(), LogOptions::default()), Err(Error::Corruption { seq: 1, .. })));
}

/// Proves: a crash between creating a segment and writing its header (a 0-byte, a
/// partial or an all-zero header) is recovered: the file is set aside as evidence and
/// appends continue with the next sequence in a fresh segment.
#[test]
fn crash_between_segment_creation_and_header_write_is_recovered() {
    for (version, torn_header) in
        VERSIONS.into_iter().flat_map(|v| [(v, vec![]), (v, b"FENCE".to_vec()), (v, vec![0u8; SEGMENT_HEADER_BYTES])])
    {
        let d = tempfile::tempdir().unwrap();
        write_log(d.path(), 3, opts_v(version));
        // A writer seals a segment (cut to its last record) before it creates the next.
        let first = &segment_files(d.path())[0];
        let sealed_at = fencelog::storage::frames_end(first).unwrap();
        fs::OpenOptions::new().write(true).open(first).unwrap().set_len(sealed_at).unwrap();
        let torn_path = fencelog::storage::segment_path(d.path(), 4);
        fs::write(&torn_path, &torn_header).unwrap();
        let log = Log::open(d.path(), LogOptions::default()).unwrap();
        let r = &log.open_report().repairs;
        assert_eq!((r.len(), r[0].kind, r[0].seq), (1, "torn_segment_creation", 4));
        assert_eq!(fs::read(&r[0].evidence).unwrap(), torn_header);
        assert_eq!(log.append(b"four").unwrap().first_seq, 4);
        log.close().unwrap();
        assert_eq!(records(d.path()).len(), 4);
    }
}

/// Proves: the same crash left by another process is handled by a running writer
/// while catching up under the lock.
#[test]
fn writer_catching_up_sets_aside_a_segment_another_process_tore() {
    let d = tempfile::tempdir().unwrap();
    let log = Log::open(d.path(), LogOptions::default()).unwrap();
    log.append(b"one").unwrap();
    fs::write(fencelog::storage::segment_path(d.path(), 2), b"FEN").unwrap();
    assert_eq!(log.append(b"two").unwrap().first_seq, 2);
    log.close().unwrap();
    assert_eq!(records(d.path()).len(), 2);
}

/// Proves: the record size limit refuses an oversized record with a clear error
/// and writes nothing.
#[test]
fn oversized_record_is_refused_and_nothing_is_written() {
    let d = tempfile::tempdir().unwrap();
    let opts = LogOptions { payload_bytes_max: 1024, ..LogOptions::default() };
    let log = Log::open(d.path(), opts).unwrap();
    log.append(&[1u8; 1024]).unwrap();
    let before = hash_tree(d.path());
    let err = log.append(&[1u8; 1025]).unwrap_err();
    assert!(matches!(err, Error::RecordTooLarge { bytes: 1025, max: 1024 }));
    assert_eq!(err.code(), "RECORD_TOO_LARGE");
    assert!(err.to_string().contains("1025") && err.to_string().contains("payload_bytes_max"));
    let err = log.append_batch(vec![vec![0; 10], vec![0; 2000]]).unwrap_err();
    assert_eq!(err.code(), "RECORD_TOO_LARGE", "one oversized record refuses the whole batch");
    assert_eq!(hash_tree(d.path()), before);
    assert_eq!(log.append(b"still fine").unwrap().first_seq, 2, "a refusal does not poison");
    // The default limit is 1 MiB.
    assert_eq!(LogOptions::default().payload_bytes_max, 1 << 20);
}

/// Proves: the batch limits (records and bytes) refuse a batch whole.
#[test]
fn batch_over_the_limits_is_refused_whole() {
    let d = tempfile::tempdir().unwrap();
    let opts =
        LogOptions { batch_records_max: 4, batch_bytes_max: 2048, payload_bytes_max: 1024, ..LogOptions::default() };
    let log = Log::open(d.path(), opts).unwrap();
    let err = log.append_batch(vec![vec![1u8; 8]; 5]).unwrap_err();
    assert!(matches!(err, Error::BatchTooLarge { records: 5, records_max: 4, .. }), "{err}");
    let err = log.append_batch(vec![vec![1u8; 1000]; 3]).unwrap_err();
    assert!(matches!(err, Error::BatchTooLarge { bytes: 3000, bytes_max: 2048, .. }), "{err}");
    assert_eq!(log.append_batch(vec![]).unwrap_err().code(), "EMPTY_BATCH");
    assert_eq!(log.append_batch(vec![vec![1u8; 8]; 4]).unwrap().last_seq, 4);
    log.close().unwrap();
    assert_eq!(records(d.path()).len(), 4);
}

/// Proves: segments rotate before exceeding segment_bytes_max; a record larger
/// than the limit gets a segment of its own; sequences and the chain run across.
#[test]
fn segments_rotate_at_the_size_limit_and_the_chain_spans_them() {
    let parent = tempfile::tempdir().unwrap();
    let dir = parent.path().join("log"); // created by fencelog, so with its modes
    let opts = LogOptions { segment_bytes_max: 1000, ..LogOptions::default() };
    let log = Log::open(&dir, opts).unwrap();
    for i in 0..40u64 {
        log.append(&vec![b'a'; (i % 5 * 40) as usize]).unwrap();
    }
    log.append(&vec![b'z'; 3000]).unwrap();
    log.append(b"after the big one").unwrap();
    log.close().unwrap();
    let segs = segment_files(dir.as_path());
    assert!(segs.len() > 5);
    let mut oversize = 0;
    for s in &segs {
        let len = fs::metadata(s).unwrap().len();
        if len > 1000 {
            oversize += 1;
            assert!(
                fs::read(s).unwrap().windows(3000).any(|w| w.iter().all(|&b| b == b'z')),
                "only the big record may exceed"
            );
        }
        let mode = fs::metadata(s).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600, "segments are private");
    }
    assert_eq!(oversize, 1);
    for private_dir in [dir.clone(), dir.join("snapshots")] {
        assert_eq!(fs::metadata(&private_dir).unwrap().permissions().mode() & 0o777, 0o700);
    }
    let s = verify_dir(dir.as_path(), LogOptions::default().body_max()).unwrap();
    assert!(s.is_intact() && s.records == 42 && s.segments == segs.len());
}

/// Proves: compare-and-append lands only when the head is where the caller expects.
#[test]
fn append_if_head_refuses_when_the_head_moved() {
    let d = tempfile::tempdir().unwrap();
    let a = Log::open(d.path(), LogOptions::default()).unwrap();
    let b = Log::open(d.path(), LogOptions::default()).unwrap();
    a.append(b"1").unwrap();
    assert_eq!(b.append_if_head(1, vec![b"2".to_vec()]).unwrap().first_seq, 2);
    let err = a.append_if_head(1, vec![b"stale".to_vec()]).unwrap_err();
    assert!(matches!(err, Error::HeadMoved { expected: 1, actual: 2 }), "{err}");
    assert_eq!(a.append_if_head(2, vec![b"3".to_vec()]).unwrap().first_seq, 3);
    assert_eq!(a.adopted_records(), 1, "a caught up with b's record");
}

/// Proves: a segment of a newer format version is named, not mistaken for damage.
#[test]
fn unknown_format_version_is_a_clear_error_naming_it() {
    let d = tempfile::tempdir().unwrap();
    write_log(d.path(), 1, LogOptions::default());
    let seg = segment_files(d.path())[0].clone();
    let mut b = fs::read(&seg).unwrap();
    b[8..10].copy_from_slice(&3u16.to_le_bytes());
    let crc = crc32fast::hash(&b[..60]);
    b[60..64].copy_from_slice(&crc.to_le_bytes());
    fs::write(&seg, &b).unwrap();
    let err = Log::open(d.path(), LogOptions::default()).err().unwrap();
    assert_eq!(err.code(), "UNSUPPORTED_FORMAT");
    assert!(err.to_string().contains("version 3") && err.to_string().contains("[1, 2]"), "{err}");
    assert_eq!(verify_dir(d.path(), 1 << 20).unwrap_err().code(), "UNSUPPORTED_FORMAT");
}

/// Proves: fencelog refuses to start a log inside a directory of unrelated files.
#[test]
fn a_directory_of_other_files_is_not_turned_into_a_log() {
    let d = tempfile::tempdir().unwrap();
    fs::write(d.path().join("notes.txt"), b"mine").unwrap();
    let err = Log::open(d.path(), LogOptions::default()).err().unwrap();
    assert_eq!(err.code(), "NOT_A_LOG");
    assert!(err.to_string().contains("notes.txt"));
    let err = Log::open(d.path().join("missing"), LogOptions { create: false, ..LogOptions::default() }).err().unwrap();
    assert_eq!(err.code(), "NOT_A_LOG");
}

/// Proves: the wait for the cross-process append lock is bounded: a holder that
/// never lets go yields LOCK_TIMEOUT, writes nothing, and does not poison the writer.
#[test]
fn a_stuck_lock_holder_yields_lock_timeout_without_poisoning() {
    let d = tempfile::tempdir().unwrap();
    let log = Log::open(d.path(), LogOptions { lock_wait_ms_max: 50, ..LogOptions::default() }).unwrap();
    log.append(b"before").unwrap();
    // The append lock is on the directory itself (a lock file could be unlinked).
    let other = fs::File::open(d.path()).unwrap();
    fs4::FileExt::lock(&other).unwrap();
    let err = log.append(b"blocked").unwrap_err();
    assert!(matches!(err, Error::LockTimeout { waited_ms, .. } if waited_ms >= 50), "{err}");
    let Error::LockTimeout { holder_pid, .. } = &err else { unreachable!() };
    assert_eq!(*holder_pid, Some(std::process::id()), "the holder is named from /proc/locks: {err}");
    assert_eq!(err.code(), "LOCK_TIMEOUT");
    fs4::FileExt::unlock(&other).unwrap();
    assert_eq!(log.append(b"after").unwrap().first_seq, 2);
    log.close().unwrap();
    assert_eq!(records(d.path()).len(), 2);
}

/// Proves: the tailer reads a segment larger than its 4 MiB read window in bounded
/// chunks, visiting every record once and in order, picks up later appends, and
/// reports (does not wait on) corruption that lies past the first chunk.
#[test]
fn tailer_reads_big_segments_in_chunks_and_reports_corruption_past_the_first() {
    let d = tempfile::tempdir().unwrap();
    let log = Log::open(d.path(), LogOptions::default()).unwrap();
    let n = 10_000u64; // ~10 MiB in one segment
    for chunk in (1..=n).collect::<Vec<_>>().chunks(1000) {
        log.append_batch(chunk.iter().map(|i| format!("{i:>8}").repeat(125).into_bytes()).collect()).unwrap();
    }
    let mut t = fencelog::storage::Tailer::new(d.path(), LogOptions::default().body_max(), 1);
    let mut seen = vec![];
    assert_eq!(t.poll(|r| seen.push(r.seq)).unwrap(), n);
    assert_eq!(seen, (1..=n).collect::<Vec<_>>());
    log.append(b"one more").unwrap();
    assert_eq!(t.poll(|r| assert_eq!(r.seq, n + 1)).unwrap(), 1);
    log.close().unwrap();

    let seg = segment_files(d.path())[0].clone();
    let mut b = fs::read(&seg).unwrap();
    let at = 6 << 20; // inside the second chunk
    b[at] ^= 0x20;
    fs::write(&seg, &b).unwrap();
    let mut t = fencelog::storage::Tailer::new(d.path(), LogOptions::default().body_max(), 1);
    let mut count = 0;
    let err = t.poll(|_| count += 1).unwrap_err();
    assert_eq!(err.code(), "CORRUPTION", "{err}");
    assert!(count > 4_000 && count < 7_000, "records before the damage were delivered: {count}");
}

/// Proves: a request queue of depth 1 applies back-pressure (callers wait) without
/// losing or reordering anything; a depth of 0 is refused as an invalid option.
#[test]
fn a_tiny_request_queue_applies_back_pressure_without_loss() {
    let d = tempfile::tempdir().unwrap();
    let bad = Log::open(d.path(), LogOptions { queue_depth_max: 0, ..LogOptions::default() }).err().unwrap();
    assert_eq!(bad.code(), "INVALID_OPTION");
    let log = Log::open(d.path(), LogOptions { queue_depth_max: 1, ..LogOptions::default() }).unwrap();
    std::thread::scope(|s| {
        for t in 0..16 {
            let log = &log;
            s.spawn(move || {
                for i in 0..20 {
                    log.append(format!("{t}-{i}").as_bytes()).unwrap();
                }
            });
        }
    });
    log.close().unwrap();
    assert_eq!(records(d.path()).len(), 16 * 20);
}

/// Proves (review of v2): a write stopped in the first bytes of the next group —
/// 1 to 3 bytes over the old end mark (`B[..k] ‖ mark[k..]`, then zeros), or 1 to 3
/// bytes into a frame after an intact one — is a torn tail that recovery cuts, not
/// rot that refuses to open: a page boundary can fall anywhere in a frame.
#[test]
fn a_write_stopped_within_the_first_bytes_of_a_frame_is_torn_in_v2() {
    for (k, after_intact_frame) in [(1, false), (2, false), (3, false), (1, true), (3, true)] {
        let d = tempfile::tempdir().unwrap();
        write_log(d.path(), 5, opts_v(2));
        let seg = &segment_files(d.path())[0];
        let end = fencelog::storage::frames_end(seg).unwrap();
        // The frames the next group would have written.
        let mut group = Vec::new();
        let c = {
            let mut last = [0u8; 32];
            fencelog::storage::read_records(d.path(), 1, 1 << 20, |r| {
                last = r.link;
                true
            })
            .unwrap();
            last
        };
        let link = fencelog::format::encode_frame(&mut group, &c, 6, &[9; 16], 1, b"sixth record");
        let first_len = group.len();
        fencelog::format::encode_frame(&mut group, &link, 7, &[9; 16], 2, b"seventh record");
        let written = if after_intact_frame { first_len + k } else { k };
        let f = fs::OpenOptions::new().write(true).open(seg).unwrap();
        std::os::unix::fs::FileExt::write_all_at(&f, &group[..written], end).unwrap();
        if after_intact_frame {
            // The old end mark was overwritten whole by the first frame.
            let zeros = vec![0u8; FRAMES_END_MARK.len()];
            std::os::unix::fs::FileExt::write_all_at(&f, &zeros, end + written as u64).unwrap();
        }
        let log = Log::open(d.path(), opts_v(2)).unwrap_or_else(|e| panic!("k {k} after {after_intact_frame}: {e}"));
        let r = log.open_report().clone();
        let last = if after_intact_frame { 6 } else { 5 };
        assert_eq!((r.last_seq, r.repairs.len()), (last, 1), "k {k} after {after_intact_frame}: {r:?}");
        assert_eq!(r.repairs[0].kind, "torn_tail");
        assert_eq!(log.append(b"next").unwrap().first_seq, last + 1);
        drop(log);
        assert!(verify_dir(d.path(), 1 << 20).unwrap().is_intact());
    }
}

/// Proves (review of v2): rot in an acknowledged last record whose own payload
/// holds a whole zero sector is refused, not taken for a torn write: the end mark
/// after the record shows it was written whole.
#[test]
fn rot_in_a_last_record_with_a_zero_sector_of_its_own_is_refused_in_v2() {
    let d = tempfile::tempdir().unwrap();
    let log = Log::open(d.path(), opts_v(2)).unwrap();
    log.append(b"first").unwrap();
    let mut payload = b"HEADER-".to_vec();
    payload.extend_from_slice(&[0u8; 1200]);
    payload.extend_from_slice(b"-TRAILER");
    assert_eq!(log.append(&payload).unwrap().first_seq, 2);
    drop(log);
    let seg = &segment_files(d.path())[0];
    let end = fencelog::storage::frames_end(seg).unwrap() as usize;
    let mut bytes = fs::read(seg).unwrap();
    bytes[end - 3] ^= 0x08; // inside "-TRAILER"
    fs::write(seg, &bytes).unwrap();
    let err = Log::open(d.path(), opts_v(2)).err().expect("refused");
    assert_eq!(err.code(), "CORRUPTION", "{err}");
    assert!(err.to_string().contains("--cut-from 2"), "{err}");
    assert_eq!(fs::read(seg).unwrap(), bytes, "nothing was cut");
}

/// Proves (second review of v2): a complete, acknowledged last record is never
/// taken for a write stopped in a length field — an empty payload and no end mark
/// after it (the state right after a torn tail was cut) with a rotted length is
/// refused — and a rotted length before a whole body and a real end mark is refused
/// even when the body holds a zero sector of its own.
#[test]
fn a_rotted_length_of_a_complete_last_record_is_refused_in_v2() {
    for (payload, cut_mark) in [(Vec::new(), true), (vec![0u8; 100], true), (sector_payload(), false)] {
        let d = tempfile::tempdir().unwrap();
        let log = Log::open(d.path(), opts_v(2)).unwrap();
        log.append(b"first").unwrap();
        assert_eq!(log.append(&payload).unwrap().first_seq, 2);
        drop(log);
        let seg = &segment_files(d.path())[0];
        let end = fencelog::storage::frames_end(seg).unwrap();
        if cut_mark {
            // As recovery leaves a segment after cutting a torn tail: no end mark.
            fs::OpenOptions::new().write(true).open(seg).unwrap().set_len(end).unwrap();
        }
        let at = offset_of(d.path(), 2);
        let mut bytes = fs::read(seg).unwrap();
        bytes[at + 3] ^= 0x80; // an impossible length
        fs::write(seg, &bytes).unwrap();
        let what = format!("payload of {} bytes, end mark cut {cut_mark}", payload.len());
        let err = Log::open(d.path(), opts_v(2)).err().unwrap_or_else(|| panic!("{what}: opened"));
        assert_eq!(err.code(), "CORRUPTION", "{what}: {err}");
        assert_eq!(fs::read(seg).unwrap(), bytes, "{what}: nothing was cut");
    }
}

fn sector_payload() -> Vec<u8> {
    let mut p = b"HEADER-".to_vec();
    p.extend_from_slice(&[0u8; 1200]);
    p.extend_from_slice(b"-TRAILER");
    p
}

/// Proves (second review of v2): a long-lived tailer that meets real damage in
/// records appended after it last looked reports it — it never takes zeros over a
/// record's first bytes for the end of the frames and stops there silently.
#[test]
fn a_long_lived_tailer_reports_damage_in_records_appended_after_it_looked() {
    // The first 8 bytes of the second new record; and (third review) the first 5000
    // bytes of the first new record, more than the page a tailer probes.
    'case: for (damaged_seq, zeroed, delivered_before) in [(3u64, 8usize, vec![2u64]), (2, 5000, vec![])] {
        let d = tempfile::tempdir().unwrap();
        let log = Log::open(d.path(), opts_v(2)).unwrap();
        log.append(b"first").unwrap();
        let mut follower = fencelog::storage::Tailer::new(d.path(), 1 << 20, 1);
        assert_eq!(follower.poll(|_| {}).unwrap(), 1);
        assert_eq!(follower.poll(|_| {}).unwrap(), 0, "nothing new: the zeros were checked");
        log.append_batch(vec![vec![b'2'; 20_000], b"third".to_vec(), b"fourth".to_vec()]).unwrap();
        drop(log);
        let seg = &segment_files(d.path())[0];
        let at = offset_of(d.path(), damaged_seq);
        let f = fs::OpenOptions::new().write(true).open(seg).unwrap();
        std::os::unix::fs::FileExt::write_all_at(&f, &vec![0u8; zeroed], at as u64).unwrap();
        let mut seen = vec![];
        for round in 0..3 {
            match follower.poll(|r| seen.push(r.seq)) {
                Err(e) => {
                    assert_eq!(e.code(), "CORRUPTION", "{e}");
                    assert_eq!(seen, delivered_before, "records before the damage are delivered once");
                    continue 'case;
                }
                Ok(n) => assert!(
                    round == 0 && n as usize == delivered_before.len(),
                    "{zeroed} bytes of record {damaged_seq}, round {round}: the damage must be reported, got {n} records"
                ),
            }
        }
        panic!("{zeroed} bytes of record {damaged_seq}: the follower never reported the damage (saw {seen:?})");
    }
}

/// Proves (second review of v2): a writer never takes records another writer
/// appended for free space — not even when their first bytes were zeroed since: it
/// refuses (CORRUPTION) instead of writing over them.
#[test]
fn a_writer_never_overwrites_records_another_writer_appended_whose_first_bytes_were_zeroed() {
    // 8 bytes, and more than the page a writer probes (third review).
    for zeroed in [8usize, 5000] {
        let d = tempfile::tempdir().unwrap();
        let a = Log::open(d.path(), opts_v(2)).unwrap();
        let b = Log::open(d.path(), opts_v(2)).unwrap();
        a.append(b"one").unwrap();
        b.append_batch(vec![vec![b'2'; 20_000], b"three".to_vec(), b"four".to_vec()]).unwrap();
        let seg = &segment_files(d.path())[0];
        let at = offset_of(d.path(), 2);
        let f = fs::OpenOptions::new().write(true).open(seg).unwrap();
        std::os::unix::fs::FileExt::write_all_at(&f, &vec![0u8; zeroed], at as u64).unwrap();
        let before = fs::read(seg).unwrap();
        let err = a.append(b"five").unwrap_err();
        assert_eq!(err.code(), "CORRUPTION", "{zeroed} bytes zeroed: {err}");
        assert_eq!(fs::read(seg).unwrap(), before, "{zeroed} bytes zeroed: nothing was written over the records");
    }
}

/// Proves: the options of format v2 have their limits — a format version this build
/// does not write, or a preallocation step under one page, is refused as an invalid
/// option and creates no log.
#[test]
fn format_version_and_preallocation_step_are_bounded() {
    for opts in [
        LogOptions { format_version: 3, ..LogOptions::default() },
        LogOptions { format_version: 0, ..LogOptions::default() },
        LogOptions { segment_prealloc_bytes: 4095, ..LogOptions::default() },
    ] {
        let d = tempfile::tempdir().unwrap();
        let err = Log::open(d.path(), opts.clone()).err().unwrap_or_else(|| panic!("{opts:?} accepted"));
        assert_eq!(err.code(), "INVALID_OPTION", "{opts:?}: {err}");
        assert_eq!(fs::read_dir(d.path()).unwrap().count(), 0, "{opts:?}: nothing created");
    }
}
