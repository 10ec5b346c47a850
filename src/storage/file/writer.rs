//! The writer: the tail segment of an open log. Appends commit through the one
//! commit engine (`commit/`): the first caller to arrive leads — it takes the
//! cross-process lock, catches up with other processes' records, writes the group
//! with one `pwrite` and syncs once — while callers arriving meanwhile queue their
//! records for its next sync. No thread of its own and no sleep on the path: the
//! group is whatever arrived while the previous sync ran.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use super::dir::{
    check_dir_mode, create_dir_private, open_regular, open_regular_rw, segment_path, stat_file, stat_path,
};
use super::index::IndexWriter;
use super::lock::AppendLock;
use super::recovery::{
    OpenReport, TailState, check_header_continuity, create_segment, cut_torn_tail, header_error, is_torn_creation,
    recover, refusal, set_aside_torn_segment,
};
use crate::format::{
    Action, ChainLink, FRAMES_END_MARK, Layout, SEGMENT_HEADER_BYTES, ScanOutcome, SegmentHeader, classify,
    encode_frame, frame_bytes, scan_segment_frames,
};
use crate::storage::backend::{AppendOutcome, Exclusive, Head};
use crate::storage::commit::{
    Admission, AsyncTurn, CommitError, Core, GroupCommit, GroupLimits, Hooks, LeadFailed, LeadOn, Settled,
    lead_on_blocking_pool, leading_inline,
};
use crate::storage::error::{Error, Result};
use crate::storage::options::LogOptions;

pub use crate::storage::backend::Appended;

struct Shared {
    /// Set once with `poisoned` (read on every request without taking the mutex).
    is_poisoned: AtomicBool,
    poisoned: Mutex<Option<String>>,
    /// Last sequence this writer knows to be durable (its own or caught up).
    last_seq: AtomicU64,
    /// Records other processes appended and found while catching up.
    adopted: AtomicU64,
    /// Records this writer appended, and the data syncs it took to do so.
    appended: AtomicU64,
    syncs: AtomicU64,
}

impl Shared {
    fn poison_check(&self) -> Result<()> {
        if !self.is_poisoned.load(Ordering::Acquire) {
            return Ok(());
        }
        match &*self.poisoned.lock().expect("poison mutex") {
            Some(cause) => Err(Error::Poisoned { cause: cause.clone() }),
            None => Ok(()),
        }
    }
}

/// An open log, for appending. Cheap to share between threads (`&Log` is enough).
pub struct Log {
    inner: Arc<LogInner>,
}

struct LogInner {
    dir: PathBuf,
    opts: LogOptions,
    writer_id: uuid::Uuid,
    report: OpenReport,
    shared: Arc<Shared>,
    /// The tail: held by a commit group's leader (and by `with_lock`).
    writer: Mutex<Writer>,
    /// Raw appends' group commit (the ledger's transactions have their own engine
    /// of the same kind, over its projection, and reach the tail through `with_lock`).
    engine: GroupCommit<()>,
}

impl Log {
    /// Open (creating if allowed) and recover the log in `dir`: torn tails are cut
    /// and kept as evidence, corruption is refused (see `open_report`).
    pub fn open(dir: impl AsRef<Path>, opts: LogOptions) -> Result<Log> {
        opts.validate()?;
        let dir = dir.as_ref().to_path_buf();
        prepare_dir(&dir, opts.create)?;
        let lock = AppendLock::open(&dir)?;
        let (tail, report) = {
            let _held = lock.acquire(opts.lock_wait_ms_max)?;
            let (tail, report) = recover(&dir, &opts)?;
            // Recovered under the lock. Past the durable mark (a writer that died
            // between its write and its sync, one of an earlier build): synced
            // before it is said durable.
            let end = tail.cursor.next_seq - 1;
            if lock.durable_mark_now().is_none_or(|m| m < end) {
                fail::fail_point!("segment::sync_adopted", |_| Err(Error::io(ADOPTED_SYNC_OP, &tail.segment)(
                    std::io::Error::other("injected fdatasync failure")
                )));
                super::lock::sync_last_segment(&dir, ADOPTED_SYNC_OP)?;
            }
            lock.set_durable_mark(end);
            (tail, report)
        };
        let (file, _) = open_regular_rw(&tail.segment, opts.segment_file_bytes_max(), tail.segment_first_seq)?;
        let writer_id = opts.writer_id.unwrap_or_else(uuid::Uuid::new_v4);
        let last_seq = tail.cursor.next_seq - 1;
        let shared = Arc::new(Shared {
            is_poisoned: AtomicBool::new(false),
            poisoned: Mutex::new(None),
            last_seq: AtomicU64::new(last_seq),
            adopted: AtomicU64::new(0),
            appended: AtomicU64::new(0),
            syncs: AtomicU64::new(0),
        });
        let index = IndexWriter::new(&tail.segment, tail.segment_len);
        let writer = Mutex::new(Writer {
            dir: dir.clone(),
            opts: opts.clone(),
            writer_id: *writer_id.as_bytes(),
            lock: Arc::new(lock),
            file,
            tail,
            shared: shared.clone(),
            buf: Vec::new(),
            links: Vec::new(),
            index,
        });
        let engine = GroupCommit::new((), last_seq, GroupLimits::of(&opts));
        Ok(Log { inner: Arc::new(LogInner { dir, opts, writer_id, report, shared, writer, engine }) })
    }

    pub fn dir(&self) -> &Path {
        &self.inner.dir
    }

    pub fn options(&self) -> &LogOptions {
        &self.inner.opts
    }

    /// The identity this writer stamps on every record.
    pub fn writer_id(&self) -> uuid::Uuid {
        self.inner.writer_id
    }

    /// What recovery found and did when this log was opened.
    pub fn open_report(&self) -> &OpenReport {
        &self.inner.report
    }

    /// Last sequence this writer knows to be durable.
    pub fn last_seq(&self) -> u64 {
        self.inner.shared.last_seq.load(Ordering::Acquire)
    }

    /// Records other processes appended that this writer has caught up with.
    pub fn adopted_records(&self) -> u64 {
        self.inner.shared.adopted.load(Ordering::Relaxed)
    }

    /// Records appended and data syncs taken by this writer: their ratio is the
    /// mean group-commit size.
    pub fn commit_stats(&self) -> crate::storage::CommitStats {
        let s = &self.inner.shared;
        crate::storage::CommitStats {
            records: s.appended.load(Ordering::Relaxed),
            syncs: s.syncs.load(Ordering::Relaxed),
        }
    }

    /// Append one record; returns once it is synced.
    pub fn append(&self, payload: &[u8]) -> Result<Appended> {
        self.append_batch(vec![payload.to_vec()])
    }

    /// Append records contiguously; returns once all are synced. After a crash, a
    /// prefix of an unacknowledged batch may survive: atomicity across crashes is
    /// per record (the ledger puts one transaction in one record).
    pub fn append_batch(&self, payloads: Vec<Vec<u8>>) -> Result<Appended> {
        self.inner.check(&payloads)?;
        self.inner.commit(None, payloads)
    }

    /// Compare-and-append: append only if the last sequence is `expect_last_seq`
    /// (checked after catching up with every other process), else `HEAD_MOVED`.
    pub fn append_if_head(&self, expect_last_seq: u64, payloads: Vec<Vec<u8>>) -> Result<Appended> {
        self.inner.check(&payloads)?;
        self.inner.commit(Some(expect_last_seq), payloads)
    }

    /// `append` for async callers: joins an open commit group and waits for its
    /// sync without blocking a thread; when no group is open it leads one on a
    /// blocking thread (`spawn_blocking`: a tokio runtime must be running). If the
    /// future is dropped after its record was queued, the record is still appended
    /// (only the answer is lost, as for any caller that stops listening).
    pub async fn append_async(&self, payload: Vec<u8>) -> Result<Appended> {
        let payloads = vec![payload];
        self.inner.check(&payloads)?;
        match self.inner.engine.queue_async(Admission::Callers, payloads).await {
            AsyncTurn::Done(settled) => {
                let s = settled?;
                appended(Settled { answer: Ok(s.answer), link: s.link })
            }
            AsyncTurn::Lead(payloads) => {
                let led = lead_on_blocking_pool(
                    Arc::clone(&self.inner),
                    |inner| &inner.engine,
                    LeadOn::InPlace,
                    move |inner| {
                        let mut payloads = Some(payloads);
                        let settled = inner
                            .engine
                            .commit_async_lead(inner, Admission::Callers, |core| queue_raw(core, None, &mut payloads));
                        appended(settled.map_err(raw_error)?)
                    },
                )
                .await;
                match led {
                    Ok(answer) => answer,
                    Err(LeadFailed::Panicked(_)) => {
                        Err(Error::Poisoned { cause: "the thread committing an async append panicked".into() })
                    }
                    Err(LeadFailed::NotRun) => Err(Error::Closed),
                }
            }
        }
    }

    /// Run `f` holding the cross-process append lock, after catching up with every
    /// other writer: nobody can append until `f` returns, so a caller that reads the
    /// log, validates and then appends through [`Locked::append_if_head`] is never
    /// overtaken. The ledger's transactions run this way.
    pub fn with_lock<R>(&self, f: impl FnOnce(&mut Locked<'_>) -> R) -> Result<R> {
        self.inner.with_lock(&|| false, f)
    }

    /// [`with_lock`](Self::with_lock), giving up the wait for the lock
    /// (`WITHDRAWN`, `f` not run) once `give_up` says so.
    pub fn with_lock_or_give_up<R>(
        &self,
        give_up: &dyn Fn() -> bool,
        f: impl FnOnce(&mut Locked<'_>) -> R,
    ) -> Result<R> {
        self.inner.with_lock(give_up, f)
    }

    /// Close the log: no append is admitted any more (an async append whose
    /// future was dropped and whose thread has not started yet is refused, never
    /// written); records already queued are committed — waiting at most twice
    /// `lock_wait_ms_max` for them — and it says whether the writer was poisoned.
    pub fn close(self) -> Result<()> {
        self.inner.shared.poison_check()?;
        let wait_ms = self.inner.opts.lock_wait_ms_max.saturating_mul(2);
        let drained = self.inner.engine.drain(wait_ms)?;
        if !drained.settled {
            return Err(Error::Poisoned {
                cause: format!("records were still being committed {wait_ms} ms after close began"),
            });
        }
        self.inner.shared.poison_check()
    }
}

/// A settled raw append: its sequences and the chain link of its last record.
fn appended(s: Settled<Result<(u64, u64)>>) -> Result<Appended> {
    let (first_seq, last_seq) = s.answer?;
    let chain_head = s.link.ok_or_else(|| Error::Poisoned {
        cause: format!("records {first_seq}..={last_seq} became durable without their chain link"),
    })?;
    Ok(Appended { first_seq, last_seq, chain_head })
}

impl LogInner {
    /// Limits of one call, and the poison, checked before anything is queued.
    fn check(&self, payloads: &[Vec<u8>]) -> Result<()> {
        check_payloads(&self.opts, payloads)?;
        self.shared.poison_check()
    }

    fn with_lock<R>(&self, give_up: &dyn Fn() -> bool, f: impl FnOnce(&mut Locked<'_>) -> R) -> Result<R> {
        self.shared.poison_check()?;
        let mut w = match self.writer.lock() {
            Ok(w) => w,
            Err(_) => {
                // A panic while the tail was held (in a commit group, or in a
                // `with_lock` closure): bytes may be half written.
                let cause = "a panic while the log's tail was held".to_string();
                *self.shared.poisoned.lock().expect("poison mutex") = Some(cause.clone());
                self.shared.is_poisoned.store(true, Ordering::Release);
                return Err(Error::Poisoned { cause });
            }
        };
        let lock = Arc::clone(&w.lock);
        let _held = lock.acquire_or_give_up(w.opts.lock_wait_ms_max, give_up)?;
        match w.catch_up() {
            Ok(()) => {}
            // A lead on an async caller's own thread declined to read what others
            // appended: nothing was adopted, nothing is wrong.
            Err(e @ Error::Withdrawn { .. }) => return Err(e),
            Err(e) => {
                w.poison(&e);
                return Err(e);
            }
        }
        w.shared.last_seq.store(w.tail.cursor.next_seq - 1, Ordering::Release);
        // What was caught up past the durable mark (a writer that died between
        // its write and its sync, one of an earlier build) is synced before it
        // is said durable, and before anyone reads it under the lock. In the
        // steady state the last holder's mark is the end: nothing to sync.
        let end = w.tail.cursor.next_seq - 1;
        let mark = lock.durable_mark_now();
        if mark.is_none_or(|m| m < end) {
            let path = w.tail.segment.clone();
            if let Err(e) = sync_adopted(&w.file).map_err(Error::io(ADOPTED_SYNC_OP, &path)) {
                w.poison(&e);
                return Err(e);
            }
        }
        // (Only holders write the mark, and this one holds the lock: one that
        // already says `end` stays so.)
        if mark != Some(end) {
            lock.set_durable_mark(end);
        }
        Ok(f(&mut Locked { opts: &self.opts, lock: &lock, w: &mut w }))
    }

    /// Queue `payloads` in a commit group (after `expect_last_seq`, if given) and
    /// wait for their sync.
    fn commit(&self, expect_last_seq: Option<u64>, payloads: Vec<Vec<u8>>) -> Result<Appended> {
        let mut payloads = Some(payloads);
        let settled =
            self.engine.commit(self, Admission::Callers, |core| queue_raw(core, expect_last_seq, &mut payloads));
        appended(settled.map_err(raw_error)?)
    }
}

/// Queue a raw append's payloads: the answer is their sequences (or `HEAD_MOVED`
/// for a compare-and-append whose expected head is gone). Raw records are never
/// judged again: were the engine to ask (another writer appended inside the
/// exclusive section), the payloads are gone and the answer says so.
fn queue_raw(
    core: &mut Core<()>,
    expect: Option<u64>,
    payloads: &mut Option<Vec<Vec<u8>>>,
) -> (Result<(u64, u64)>, u64) {
    let last = core.last_seq();
    if let Some(expected) = expect.filter(|&e| e != last) {
        // Answered once the head it names is durable (records may be in flight).
        return (Err(Error::HeadMoved { expected, actual: last }), last);
    }
    let Some(payloads) = payloads.take() else {
        let cause = "another writer appended inside the exclusive section".to_string();
        return (Err(Error::Poisoned { cause }), core.durable_seq());
    };
    let first = last + 1;
    for p in payloads {
        core.queue(p);
    }
    (Ok((first, core.last_seq())), core.last_seq())
}

fn raw_error(e: CommitError<Error>) -> Error {
    match e {
        CommitError::Storage(e) | CommitError::Hook(e) => e,
        CommitError::Draining => Error::Closed,
        // A raw append never leads on its caller's own thread.
        CommitError::WouldBlock => Error::Withdrawn { waited_ms: 0 },
        CommitError::HeadMovedTooOften { .. } => {
            Error::Poisoned { cause: "another writer appended inside the exclusive section".into() }
        }
    }
}

impl Hooks<()> for LogInner {
    type Error = Error;

    fn exclusive(&self, give_up: &dyn Fn() -> bool, f: &mut dyn FnMut(&mut dyn Exclusive) -> Result<()>) -> Result<()> {
        self.with_lock(give_up, |l| f(l))?
    }

    /// `with_lock` has caught the tail up and noted its head.
    fn catch_up(&self, core: &mut Core<()>, _x: &mut dyn Exclusive) -> Result<()> {
        core.caught_up_to(self.shared.last_seq.load(Ordering::Acquire));
        Ok(())
    }

    fn rebuild(&self, _core: &mut Core<()>) -> std::result::Result<(), String> {
        // Under the append lock nobody else appends: the lock was broken.
        Err("another writer appended while this one held the append lock".into())
    }
}

/// A lead on an async caller's own thread (a runtime worker, `lead_inline`)
/// reads nothing others appended: what they wrote may be a long read (a backlog,
/// a new segment, a rewritten one, a torn tail to cut), so it declines, with
/// nothing adopted and nothing judged, and the caller leads again on a thread
/// that may take its time.
fn declined_catch_up() -> Error {
    Error::Withdrawn { waited_ms: 0 }
}

/// Refuse an empty call, a record over the limit, a batch over the batch limits.
fn check_payloads(opts: &LogOptions, payloads: &[Vec<u8>]) -> Result<()> {
    if payloads.is_empty() {
        return Err(Error::EmptyBatch);
    }
    let max = opts.payload_bytes_max as usize;
    if let Some(p) = payloads.iter().find(|p| p.len() > max) {
        return Err(Error::RecordTooLarge { bytes: p.len() as u64, max: max as u64 });
    }
    let bytes = payloads.iter().map(Vec::len).sum();
    if payloads.len() > opts.batch_records_max || bytes > opts.batch_bytes_max {
        return Err(Error::BatchTooLarge {
            records: payloads.len(),
            bytes,
            records_max: opts.batch_records_max,
            bytes_max: opts.batch_bytes_max,
        });
    }
    Ok(())
}

/// The log while [`Log::with_lock`] holds the append lock.
pub struct Locked<'a> {
    opts: &'a LogOptions,
    lock: &'a AppendLock,
    w: &'a mut Writer,
}

impl Locked<'_> {
    /// The last sequence in the log (everything up to it is caught up).
    pub fn last_seq(&self) -> u64 {
        self.w.tail.cursor.next_seq - 1
    }

    /// Append and sync, if the head is still `expect_last_seq` (it is, unless this
    /// process appended through another path meanwhile).
    pub fn append_if_head(&mut self, expect_last_seq: u64, payloads: Vec<Vec<u8>>) -> Result<Appended> {
        match Exclusive::append_if_head(self, expect_last_seq, payloads)? {
            AppendOutcome::Appended(a) => Ok(a),
            AppendOutcome::HeadMoved { actual } => Err(Error::HeadMoved { expected: expect_last_seq, actual }),
        }
    }
}

impl Exclusive for Locked<'_> {
    fn append_if_head(&mut self, expect_seq: u64, payloads: Vec<Vec<u8>>) -> Result<AppendOutcome> {
        check_payloads(self.opts, &payloads)?;
        self.w.shared.poison_check()?;
        let last = self.last_seq();
        if last != expect_seq {
            return Ok(AppendOutcome::HeadMoved { actual: last });
        }
        match self.w.write_group(&payloads) {
            Ok(a) => {
                self.w.shared.last_seq.store(a.last_seq, Ordering::Release);
                Ok(AppendOutcome::Appended(a))
            }
            Err(e) => {
                // Bytes may be half on disk: nothing is acknowledged until reopen.
                self.w.poison(&e);
                Err(e)
            }
        }
    }

    fn links(&self) -> &[ChainLink] {
        &self.w.links
    }

    fn last_seq(&self) -> Option<u64> {
        Some(Locked::last_seq(self))
    }

    fn head(&self) -> Option<Head> {
        Some(Head { seq: Locked::last_seq(self), link: self.w.tail.cursor.prev_link })
    }

    fn others_waiting(&self) -> bool {
        self.lock.others_waiting()
    }
}

/// The directory exists (created 0700 if allowed) and only its owner can write to
/// it. Whether it holds a log is decided by recovery, under the lock, from one
/// listing.
fn prepare_dir(dir: &Path, create: bool) -> Result<()> {
    if !dir.exists() && std::fs::symlink_metadata(dir).is_ok() {
        return Err(Error::NotALogDirectory {
            path: dir.into(),
            detail: "it is a symbolic link to nothing (a dangling symlink)".into(),
        });
    }
    if !dir.exists() {
        if !create {
            return Err(Error::NotALogDirectory {
                path: dir.into(),
                detail: format!("it does not exist; create a log with `fencelog init --dir {}`", dir.display()),
            });
        }
        create_dir_private(dir)?;
        super::dir::sync_dir(dir.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new(".")))?;
    } else if !dir.is_dir() {
        return Err(Error::NotALogDirectory { path: dir.into(), detail: "it is not a directory".into() });
    }
    check_dir_mode(dir)
}

struct Writer {
    dir: PathBuf,
    opts: LogOptions,
    writer_id: [u8; 16],
    lock: Arc<AppendLock>,
    file: File,
    tail: TailState,
    shared: Arc<Shared>,
    /// Frames of the group being written (reused; bounded by `batch_bytes_max`).
    buf: Vec<u8>,
    /// Chain link of each record of the last group written.
    links: Vec<ChainLink>,
    /// The position index of the segment appended to (a hint: FORMAT.md §3b).
    index: IndexWriter,
}

impl Writer {
    /// A failure (other than a lock timeout, which wrote nothing) poisons the
    /// writer: bytes may be half on disk, so nothing is acknowledged until reopen.
    fn poison(&self, e: &Error) {
        if matches!(e, Error::LockTimeout { .. }) {
            return;
        }
        tracing::error!(error = %e, "writer poisoned");
        self.shared.poisoned.lock().expect("poison mutex").get_or_insert_with(|| e.to_string());
        self.shared.is_poisoned.store(true, Ordering::Release);
    }

    /// Adopt what other processes appended since our last look: the rest of our
    /// segment, then any segments they created. Holding the lock, an incomplete
    /// frame at the end can only be a dead writer's torn write, so it is cut.
    fn catch_up(&mut self) -> Result<()> {
        // A group another writer could not cut back: its bytes must not be adopted.
        super::halt::check(&self.dir)?;
        let body_max = self.opts.body_max();
        loop {
            let path = self.tail.segment.clone();
            let mut meta = stat_file(&self.file).map_err(Error::io("stat", &path))?;
            let mut at_path = stat_path(&path);
            let rewritten = at_path.as_ref().is_ok_and(|m| m.dev != meta.dev || m.ino != meta.ino);
            if rewritten && leading_inline() {
                return Err(declined_catch_up());
            }
            if rewritten && self.adopt_rewritten(&path)? {
                meta = stat_file(&self.file).map_err(Error::io("stat", &path))?;
                at_path = stat_path(&path);
            }
            let len = meta.len;
            let refuse = |detail: String| Error::Corruption {
                segment: path.clone(),
                offset: len,
                seq: self.tail.cursor.next_seq,
                detail,
            };
            // The file at the path must still be the one this writer appends to: a
            // segment replaced (or removed) under a live writer would take every
            // later append into a file nobody reads.
            // (Under the lock nobody else replaces it: the path's `statx` above
            // still stands, unless this writer just adopted a rewritten file.)
            match at_path {
                Ok(m) if m.dev == meta.dev && m.ino == meta.ino => {}
                _ => return Err(refuse("the segment file was replaced or removed under the writer".into())),
            }
            if len > self.opts.segment_file_bytes_max() {
                return Err(refuse(format!(
                    "the segment grew to {len} bytes, more than any segment may hold ({}); refused unread",
                    self.opts.segment_file_bytes_max()
                )));
            }
            if len < self.tail.segment_len {
                return Err(Error::Corruption {
                    segment: path,
                    offset: len,
                    seq: self.tail.cursor.next_seq,
                    detail: format!("segment shrank from {} to {len} bytes under the writer", self.tail.segment_len),
                });
            }
            self.tail.alloc_len = len;
            if len > self.tail.segment_len && self.adopt_from_tail(&path, len, body_max)? == Tail::AsLeft {
                // Still this writer's end mark, the segment not sealed: nobody
                // rotated (a rotation seals the segment first, cutting it to its
                // last record), so there is no next segment to look for.
                return Ok(());
            }
            // After every catch-up step: the cursor is in this segment or past its
            // first record, and the frames end inside the file.
            assert!(self.tail.cursor.next_seq >= self.tail.segment_first_seq, "the cursor is in its segment");
            assert!(self.tail.segment_len <= len, "the frames end inside the file");
            // Rotation only ever seals a segment holding records, so an empty
            // segment has no successor (and would share its successor's name).
            if self.tail.cursor.next_seq == self.tail.segment_first_seq {
                return Ok(());
            }
            let next = segment_path(&self.dir, self.tail.cursor.next_seq);
            if stat_path(&next).is_err() {
                return Ok(());
            }
            if leading_inline() {
                return Err(declined_catch_up());
            }
            let (f, next_len) = open_regular(&next, self.opts.segment_file_bytes_max(), self.tail.cursor.next_seq)?;
            let mut bytes = vec![0u8; next_len as usize];
            f.read_exact_at(&mut bytes, 0).map_err(Error::io("read", &next))?;
            let header = match SegmentHeader::decode(&bytes) {
                Ok(h) => h,
                Err(e) if is_torn_creation(&bytes, &e, body_max, self.tail.cursor.next_seq) => {
                    set_aside_torn_segment(&self.dir, &next, self.tail.cursor.next_seq)?;
                    return Ok(());
                }
                Err(e) => return Err(header_error(&next, e, self.tail.cursor.next_seq)),
            };
            check_header_continuity(&next, self.tail.cursor.next_seq, &header, Some(&self.tail.cursor), false)?;
            self.switch_to(next, header.layout())?;
        }
    }

    /// The segment at `path` is another file than this writer's: another writer
    /// cut a failed group back across a rotation (`cut_back`), replacing the
    /// segment with a new file holding its prefix (readers may have it mapped).
    /// That file is adopted only if it holds, byte for byte, everything this
    /// writer knew the segment to hold (`segment_len` bytes, compared with its own
    /// handle on the old file): then appends go on in it. Anything else is not
    /// adopted (`false`), and the caller refuses the log as before — a segment
    /// replaced under a live writer would take every later append into a file
    /// nobody reads.
    fn adopt_rewritten(&mut self, path: &Path) -> Result<bool> {
        const PIECE_BYTES: usize = 1 << 20;
        let (new, new_len) =
            match open_regular_rw(path, self.opts.segment_file_bytes_max(), self.tail.segment_first_seq) {
                Ok(f) => f,
                Err(_) => return Ok(false),
            };
        let known = self.tail.segment_len;
        if new_len < known {
            return Ok(false);
        }
        let (mut a, mut b) = (vec![0u8; PIECE_BYTES], vec![0u8; PIECE_BYTES]);
        let mut at = 0u64;
        while at < known {
            let n = PIECE_BYTES.min((known - at) as usize);
            self.file.read_exact_at(&mut a[..n], at).map_err(Error::io("read", path))?;
            new.read_exact_at(&mut b[..n], at).map_err(Error::io("read", path))?;
            if a[..n] != b[..n] {
                return Ok(false);
            }
            at += n as u64;
        }
        tracing::info!(segment = %path.display(), "the segment was rewritten by a cut back; appending to the new file");
        self.file = new;
        self.tail.alloc_len = new_len;
        Ok(true)
    }

    /// Adopt the frames other processes appended after `segment_len` (the file is
    /// now `len` bytes). In a preallocated segment most of that is zeros: only a
    /// window is read first. Zeros at the end of the frames there are the end —
    /// without reading the rest of the zeros to the file's end: a live writer only
    /// follows other live writers, which write contiguously from the end of the
    /// frames (a dead writer's write is a prefix of its bytes; sectors lost to a
    /// power loss are found by recovery, which every writer runs when it starts
    /// and which checks the zeros to the end). [`Tail::AsLeft`] when that first
    /// look found nothing appended.
    fn adopt_from_tail(&mut self, path: &Path, len: u64, body_max: u32) -> Result<Tail> {
        let base = self.tail.segment_len;
        if self.tail.layout == Layout::Preallocated {
            // A page tells whether anything was appended: the end mark this or
            // another writer left, and only zeros after it, still where the frames
            // end. Anything else — frames, or zeros where the mark was (which
            // could lie over records) — is read.
            let mut probe = [0u8; super::reader::PROBE_BYTES];
            let n = (len - base).min(probe.len() as u64) as usize;
            self.file.read_exact_at(&mut probe[..n], base).map_err(Error::io("read", path))?;
            if crate::format::ends_at_mark(&probe[..n]) {
                return Ok(Tail::AsLeft);
            }
        }
        if leading_inline() {
            // Others appended (or the end is not where this writer left it): read
            // by a lead that may take its time.
            return Err(declined_catch_up());
        }
        let mut window = match self.tail.layout {
            Layout::Appended => len - base,
            Layout::Preallocated => (len - base).min(CATCH_UP_WINDOW_BYTES),
        };
        loop {
            let mut bytes = vec![0u8; window as usize];
            self.file.read_exact_at(&mut bytes, base).map_err(Error::io("read", path))?;
            let mut cursor = self.tail.cursor;
            let mut adopted = 0u64;
            let outcome =
                scan_segment_frames(&bytes, 0, base, &mut cursor, body_max, self.tail.layout, |_, _| adopted += 1);
            let whole = base + window == len;
            let end = match outcome {
                // Zeros without the end mark before them, in a window: they could lie
                // over records another writer appended; only zeros to the end of the
                // file end the frames there.
                ScanOutcome::ZeroTail { offset }
                    if !whole && !bytes[offset as usize..].starts_with(&FRAMES_END_MARK) =>
                {
                    window = len - base;
                    continue;
                }
                ScanOutcome::ZeroTail { offset } => base + offset,
                ScanOutcome::Clean if whole => len,
                // The window cut a frame (or ended on one): read twice as much, up
                // to the rest of the file (not all the zeros after a large record).
                ScanOutcome::Clean | ScanOutcome::Damaged(_) if !whole => {
                    window = (window * 2).min(len - base);
                    continue;
                }
                ScanOutcome::Damaged(d) if classify(d.evidence(false)) == Action::CutTornTail => {
                    cut_torn_tail(path, &bytes[d.offset as usize..], base + d.offset, &d, self.tail.layout)?;
                    self.tail.alloc_len = base + d.offset;
                    base + d.offset
                }
                ScanOutcome::Damaged(d) => return Err(refusal(path, base, &d, false)),
                ScanOutcome::Clean => unreachable!("handled above"),
            };
            self.tail.cursor = cursor;
            self.tail.segment_len = end;
            self.index.passed(end);
            self.shared.adopted.fetch_add(adopted, Ordering::Relaxed);
            return Ok(Tail::Read);
        }
    }

    fn switch_to(&mut self, path: PathBuf, layout: Layout) -> Result<()> {
        let (file, len) = open_regular_rw(&path, self.opts.segment_file_bytes_max(), self.tail.cursor.next_seq)?;
        self.file = file;
        self.tail.segment_first_seq = self.tail.cursor.next_seq;
        self.index = IndexWriter::new(&path, SEGMENT_HEADER_BYTES as u64);
        self.tail.segment = path;
        self.tail.segment_len = SEGMENT_HEADER_BYTES as u64;
        self.tail.layout = layout;
        self.tail.alloc_len = len;
        Ok(())
    }

    /// Encode `payloads` as the next records, write them (rotating segments as
    /// needed) and sync; `links` gets the chain link of each record.
    ///
    /// If any step fails, the group is cut back before anyone else can append
    /// (this writer holds the append lock): `NOT_COMMITTED`, and the log is as it
    /// was before the group. Its bytes may be in the page cache, where another
    /// writer's catch-up would adopt them (a takeover in force that a power cut can
    /// still erase), so "outcome unknown" would not do. If the cut fails too, the
    /// log is halted until `repair` (`halt.rs`).
    fn write_group(&mut self, payloads: &[Vec<u8>]) -> Result<Appended> {
        let start = self.tail.clone();
        match self.write_group_at(payloads) {
            Ok(a) => Ok(a),
            Err(e) => Err(self.cut_back(start, payloads.len() as u64, e)),
        }
    }

    /// Put the log back where the group that failed with `cause` began (`start`):
    /// remove the segments it created, cut the segment it began in to where it
    /// began, and make that durable.
    fn cut_back(&mut self, start: TailState, records: u64, cause: Error) -> Error {
        let first_seq = start.cursor.next_seq;
        let last_seq = first_seq + records.saturating_sub(1);
        // A rotation inside the group synced its first part and said so: no
        // longer (the sequences after the cut will be written again).
        self.lock.set_durable_mark(first_seq - 1);
        let cut = (|| -> Result<()> {
            fail::fail_point!("segment::cut_back", |_| {
                Err(Error::io("cut back", &start.segment)(std::io::Error::other("injected cut-back failure")))
            });
            // Under the lock, caught up: a segment after the one the group began in
            // is one this group created.
            let created: Vec<PathBuf> = super::dir::listing(&self.dir)?
                .segments
                .into_iter()
                .filter(|(seq, _)| *seq > start.segment_first_seq)
                .map(|(_, p)| p)
                .collect();
            for p in &created {
                std::fs::remove_file(p).map_err(Error::io("remove", p))?;
                // Its index, if one was begun, names nothing now.
                let _ = std::fs::remove_file(super::index::index_path(p));
            }
            if !created.is_empty() {
                super::dir::sync_dir(&self.dir)?;
            }
            if created.is_empty() && self.tail.segment == start.segment {
                // The last segment all along: readers read it into memory, never
                // map it, so it is cut in place.
                self.file.set_len(start.segment_len).map_err(Error::io("truncate", &start.segment))?;
                self.file.sync_all().map_err(Error::io("fsync", &start.segment))?;
            } else {
                // Sealed meanwhile (a rotation in the group): a reader may have it
                // mapped; a new file replaces it.
                super::dir::rewrite_prefix(&start.segment, start.segment_len)?;
                let max = self.opts.segment_file_bytes_max();
                self.file = open_regular_rw(&start.segment, max, start.segment_first_seq)?.0;
            }
            let len = stat_file(&self.file).map_err(Error::io("stat", &start.segment))?.len;
            assert_eq!(len, start.segment_len, "the segment ends where the failed group began");
            Ok(())
        })();
        match cut {
            Ok(()) => {
                tracing::error!(error = %cause, first_seq, last_seq, segment = %start.segment.display(),
                    "a commit group failed; it was cut back, nothing of it is in the log");
                self.index = IndexWriter::new(&start.segment, start.segment_len);
                self.tail = TailState { alloc_len: start.segment_len, ..start };
                Error::NotCommitted { first_seq, last_seq, cause: cause.to_string() }
            }
            Err(cut) => super::halt::halt(
                &self.dir,
                &start.segment,
                start.segment_len,
                first_seq,
                format!("{cause}; cutting the group back failed: {cut}"),
            ),
        }
    }

    fn write_group_at(&mut self, payloads: &[Vec<u8>]) -> Result<Appended> {
        let now_ms = self.opts.now_ms();
        self.buf.clear();
        self.links.clear();
        let first_seq = self.tail.cursor.next_seq;
        for p in payloads {
            let used = self.tail.segment_len + self.buf.len() as u64;
            if used > SEGMENT_HEADER_BYTES as u64 && used + frame_bytes(p.len()) as u64 > self.opts.segment_bytes_max {
                self.flush()?;
                self.seal()?;
                let path = create_segment(&self.dir, &self.tail.cursor, self.opts.format_version)?;
                self.switch_to(path, Layout::of_version(self.opts.format_version))?;
            }
            self.index.note(self.tail.segment_len + self.buf.len() as u64, &self.tail.cursor);
            let c = &mut self.tail.cursor;
            c.prev_link = encode_frame(&mut self.buf, &c.prev_link, c.next_seq, &self.writer_id, now_ms, p);
            c.next_seq += 1;
            self.links.push(c.prev_link);
        }
        self.flush()?;
        self.shared.appended.fetch_add(payloads.len() as u64, Ordering::Relaxed);
        let c = &self.tail.cursor;
        // The sequence arithmetic after every group: one sequence and one link per
        // record, the group's last link the cursor's.
        assert_eq!(c.next_seq - first_seq, payloads.len() as u64, "one sequence per record");
        assert_eq!(self.links.len(), payloads.len(), "one chain link per record");
        assert_eq!(self.links.last(), Some(&c.prev_link), "the group's last link is the cursor's");
        Ok(Appended { first_seq, last_seq: c.next_seq - 1, chain_head: c.prev_link })
    }

    /// Write the buffered frames at the tail and sync them (data, not metadata that
    /// is not needed to read them back: `fdatasync`).
    fn flush(&mut self) -> Result<()> {
        if self.buf.is_empty() {
            return Ok(());
        }
        let path = &self.tail.segment.clone();
        fail::fail_point!("segment::write", |torn: Option<String>| {
            // A failing write may leave any prefix of its bytes (a torn write).
            let n = torn.and_then(|t| t.parse::<usize>().ok()).unwrap_or(0).min(self.buf.len());
            let _ = self.file.write_all_at(&self.buf[..n], self.tail.segment_len);
            Err(Error::io("write", path)(std::io::Error::other("injected write failure")))
        });
        let frames = self.buf.len();
        self.assert_tail_before_write(path);
        if self.tail.layout == Layout::Preallocated {
            // The end mark goes with the group, in the same write and sync.
            self.buf.extend_from_slice(&FRAMES_END_MARK);
        }
        self.file.write_all_at(&self.buf, self.tail.segment_len).map_err(Error::io("write", path))?;
        self.buf.truncate(frames);
        let end = self.tail.segment_len + frames as u64 + FRAMES_END_MARK.len() as u64;
        if self.tail.layout == Layout::Preallocated && end > self.tail.alloc_len {
            self.extend(end)?;
        }
        fail::fail_point!("segment::fdatasync", |_| {
            Err(Error::io("fdatasync", path)(std::io::Error::other("injected fdatasync failure")))
        });
        self.file.sync_data().map_err(Error::io("fdatasync", path))?;
        self.shared.syncs.fetch_add(1, Ordering::Relaxed);
        // Readers, which take no lock, may now visit these records without a
        // sync of their own (`lock.rs`).
        self.lock.set_durable_mark(self.tail.cursor.next_seq - 1);
        // The frames are durable: the index may name them now.
        self.index.write_pending();
        let before = self.tail.segment_len;
        self.tail.segment_len += self.buf.len() as u64;
        assert!(self.tail.segment_len > before, "a flush moves the tail forward");
        assert!(
            self.tail.layout != Layout::Preallocated || self.tail.segment_len <= self.tail.alloc_len,
            "the frames end inside the allocated file: {} > {}",
            self.tail.segment_len,
            self.tail.alloc_len
        );
        self.buf.clear();
        Ok(())
    }

    /// Before a positional write at the tail (TigerBeetle's habit: assert before
    /// writing): the tail is past the header, inside the bound, and — checked
    /// against the file itself in debug builds, where the suite runs — an
    /// appending segment ends exactly where the write goes (nothing after it that
    /// the write would leave behind), a preallocated one holds at least as much.
    fn assert_tail_before_write(&self, path: &Path) {
        let at = self.tail.segment_len;
        assert!(at >= SEGMENT_HEADER_BYTES as u64, "{}: a write at {at}, inside the header", path.display());
        assert!(
            at + self.buf.len() as u64 <= self.opts.segment_file_bytes_max(),
            "{}: a write of {} bytes at {at} past the segment bound",
            path.display(),
            self.buf.len()
        );
        if cfg!(debug_assertions)
            && let Ok(meta) = stat_file(&self.file)
        {
            match self.tail.layout {
                Layout::Appended => {
                    debug_assert_eq!(meta.len, at, "{}: the file ends where the write goes", path.display())
                }
                Layout::Preallocated => {
                    debug_assert!(meta.len >= at, "{}: the file holds the frames before the write", path.display())
                }
            }
        }
    }

    /// Extend a preallocated segment past `end` (the end of the frames and end mark
    /// just written) by writing zeros, so that the next appends overwrite in place. The
    /// caller's `fdatasync` makes the zeros and the new length durable together with
    /// its frames: the length changes once per step, not once per append.
    fn extend(&mut self, end: u64) -> Result<()> {
        let step = self.opts.segment_prealloc_bytes;
        let cap = self.opts.segment_bytes_max.max(end);
        let new_len = (self.tail.alloc_len + step).max(end + step / 2).min(cap);
        let path = &self.tail.segment;
        let zeros = vec![0u8; ZERO_FILL_BYTES.min((new_len - end) as usize)];
        let mut at = end;
        while at < new_len {
            let n = zeros.len().min((new_len - at) as usize);
            self.file.write_all_at(&zeros[..n], at).map_err(Error::io("preallocate", path))?;
            at += n as u64;
        }
        self.tail.alloc_len = new_len.max(end);
        Ok(())
    }

    /// Before the next segment is created, cut a preallocated segment to its last
    /// record and make that durable: a sealed segment ends exactly with its last
    /// record (FORMAT.md §1), and once the next segment exists no reader looks for
    /// the end of this one's frames.
    fn seal(&mut self) -> Result<()> {
        if self.tail.layout == Layout::Preallocated && self.tail.alloc_len != self.tail.segment_len {
            let path = &self.tail.segment;
            self.file.set_len(self.tail.segment_len).map_err(Error::io("truncate", path))?;
            self.file.sync_all().map_err(Error::io("fsync", path))?;
            self.tail.alloc_len = self.tail.segment_len;
        }
        Ok(())
    }
}

/// What a catch-up found after the frames this writer knew of, in its segment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Tail {
    /// A preallocated segment, still unsealed, with the end mark where the frames
    /// end and zeros after it: nothing was appended, nothing rotated.
    AsLeft,
    /// The rest was read (whatever it held).
    Read,
}

/// What a holder's sync of records another writer left past the durable mark is
/// called (in `IO_ERROR`'s message).
const ADOPTED_SYNC_OP: &str = "fdatasync what another writer left past the durable mark";

/// In a preallocated segment, how much a catch-up reads first after the end of the
/// frames it knows (more only if other processes appended more than this).
const CATCH_UP_WINDOW_BYTES: u64 = 8 * 1024;

/// Largest buffer of zeros written at once when extending a segment.
const ZERO_FILL_BYTES: usize = 256 * 1024;

/// `fdatasync` of records a holder adopted past the durable mark (failpoint
/// `segment::sync_adopted`).
fn sync_adopted(file: &std::fs::File) -> std::io::Result<()> {
    fail::fail_point!("segment::sync_adopted", |_| Err(std::io::Error::other("injected fdatasync failure")));
    file.sync_data()
}
