//! The log in an etcd cluster (Raft, linearizable `Txn`, watch), shared by writers
//! on several hosts: the third [`LogBackend`], beside the segment files and the
//! in-memory log. The records are the same frames as in a segment — length,
//! CRC-32, body with the blake3 chain link — one key per record (`keys.rs`), so the
//! one frame decoder and the one chain serve both, and `export`/`import` move a
//! log between them byte for byte.
//!
//! **Append-if-head** is one `Txn`: compare the head key with the head this writer
//! knows; if it holds, put the group's records and the new head, else read the
//! head (`HeadMoved`: another writer, perhaps on another host, appended first; the
//! ledger catches up and judges again). A commit group is one `Txn`, so it is
//! bounded by etcd's request limits (`--max-txn-ops`, `--max-request-bytes`; see
//! [`GROUP_RECORDS_MAX`], [`GROUP_PAYLOAD_BYTES_MAX`]). Acknowledged means etcd
//! answered the `Txn`: committed by a quorum, durable on its members.
//!
//! **Bounded.** Every request has a deadline ([`ETCD_REQUEST_TIMEOUT_MS`]); a
//! cluster that cannot answer in time (no quorum, no member reachable) is
//! `ETCD_UNAVAILABLE`. An append that timed out may still have landed: its
//! outcome is unknown until a later read (the ledger rebuilds its state from the
//! log before its next turn, and request ids answer from the log).

pub mod keys;
mod repair;

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use etcd_client::{Client, Compare, CompareOp, ConnectOptions, GetOptions, Txn, TxnOp, TxnOpResponse, WatchOptions};
use serde::{Deserialize, Serialize};

use super::backend::{
    AppendOutcome, Appended, Exclusive, Head, LogBackend, OpenReport, RecordReader, SNAPSHOTS_KEPT, SnapshotMeta,
    digest_of,
};
use super::error::{Error, Result};
use super::options::LogOptions;
use super::problem::{ProblemKind, problem};
use crate::format::DamageKind;
use crate::format::{
    BODY_BYTES_HARD_MAX, ChainLink, Cursor, FORMAT_VERSION, GENESIS_LINK, RecordRef, SUPPORTED_VERSIONS, chain_link,
    decode_frame, encode_frame, hex,
};

/// Longest wait for any one request to etcd, in ms, before `ETCD_UNAVAILABLE`.
pub const ETCD_REQUEST_TIMEOUT_MS: u64 = 5_000;
/// Longest wait to connect to a member, in ms.
pub const ETCD_CONNECT_TIMEOUT_MS: u64 = 2_000;
/// How much longer than a request's own deadline its caller waits for the
/// client's runtime to answer before it answers `ETCD_UNAVAILABLE` itself.
pub const ETCD_ANSWER_GRACE_MS: u64 = 1_000;
/// etcd's default `--max-txn-ops`: operations in one `Txn`.
pub const ETCD_TXN_OPS_MAX: usize = 128;
/// etcd's default `--max-request-bytes` (1.5 MiB).
pub const ETCD_REQUEST_BYTES_MAX: usize = 1_572_864;
/// Records of one commit group: one `Txn` puts them and the head (and compares
/// the head), within [`ETCD_TXN_OPS_MAX`].
pub const GROUP_RECORDS_MAX: usize = ETCD_TXN_OPS_MAX - 2;
/// Payload bytes of one commit group: [`ETCD_REQUEST_BYTES_MAX`] less room for the
/// keys, frames and the request's own encoding.
pub const GROUP_PAYLOAD_BYTES_MAX: usize = 1_300_000;
/// Largest record payload on etcd (one record must fit one request).
pub const PAYLOAD_BYTES_MAX: u32 = 1 << 20;
/// Records read per range request.
/// Records asked for in a read's first page; later pages are sized from the
/// largest record of the page before ([`Pager`]).
const READ_PAGE_RECORDS_FIRST: i64 = 64;
/// The most records a read asks for in one page.
const READ_PAGE_RECORDS_MAX: i64 = 4_096;
/// The bytes a read aims to get in one page.
const READ_PAGE_BYTES_TARGET: usize = 4 << 20;
/// Largest answer decoded from etcd: a page of the largest records.
const MESSAGE_BYTES_MAX: usize = 80 << 20;

/// Where the log is: the cluster's endpoints and the prefix of its keys.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EtcdOptions {
    /// `host:port` of each member (or of any subset: the client balances).
    pub endpoints: Vec<String>,
    /// Every key of the log starts with it (default `/fencelog/`).
    pub prefix: String,
}

/// The default key prefix.
pub const DEFAULT_PREFIX: &str = "/fencelog/";

impl EtcdOptions {
    /// `ENDPOINTS` as the CLI takes them: comma-separated `host:port`.
    pub fn parse(endpoints: &str, prefix: &str) -> Result<EtcdOptions> {
        let eps: Vec<String> =
            endpoints.split(',').map(str::trim).filter(|e| !e.is_empty()).map(str::to_owned).collect();
        let bad = |detail: String| Err(Error::InvalidOption { detail });
        if eps.is_empty() {
            return bad("--etcd needs at least one endpoint (host:port, comma-separated)".into());
        }
        for e in &eps {
            let hostport = e.strip_prefix("http://").unwrap_or(e);
            let ok = hostport.rsplit_once(':').is_some_and(|(h, p)| !h.is_empty() && p.parse::<u16>().is_ok());
            if !ok {
                return bad(format!("etcd endpoint {e:?}: expected host:port"));
            }
        }
        if prefix.is_empty() || prefix.len() > 256 || prefix.chars().any(char::is_control) {
            return bad(format!("--etcd-prefix {prefix:?}: 1 to 256 bytes, no control characters"));
        }
        Ok(EtcdOptions { endpoints: eps, prefix: prefix.to_owned() })
    }

    /// For messages: `etcd:HOST:PORT,…/PREFIX`.
    pub fn describe(&self) -> String {
        format!("etcd:{}{}", self.endpoints.join(","), self.prefix)
    }
}

/// How many records a read asks for in its next page: as many as
/// [`READ_PAGE_BYTES_TARGET`] holds at the size of the largest record of the
/// page before, within `1..=`[`READ_PAGE_RECORDS_MAX`].
struct Pager {
    limit: i64,
}

impl Pager {
    fn new() -> Pager {
        Pager { limit: READ_PAGE_RECORDS_FIRST }
    }

    fn observe(&mut self, r: &etcd_client::GetResponse) {
        if let Some(largest) = r.kvs().iter().map(|kv| kv.value().len()).max() {
            let fits = (READ_PAGE_BYTES_TARGET / largest.max(1)) as i64;
            self.limit = fits.clamp(1, READ_PAGE_RECORDS_MAX);
        }
    }
}

/// The first pause before a request is sent again ([`Conn::run`]); it doubles,
/// up to [`RETRY_PAUSE_MS_MAX`], within the request's deadline.
const RETRY_PAUSE_MS_FIRST: u64 = 10;
const RETRY_PAUSE_MS_MAX: u64 = 200;

/// Which failures [`Conn::run`] sends a request again after.
#[derive(Debug, Clone, Copy)]
enum Retry {
    /// Only a request that was never sent (no connection to the member).
    NeverSent,
    /// Any unavailability (the request is idempotent).
    Unavailable,
}

impl Retry {
    fn again(self, e: &etcd_client::Error) -> bool {
        let etcd_client::Error::GRpcStatus(s) = e else {
            // A transport error may have come after the request was sent.
            return matches!((self, e), (Retry::Unavailable, etcd_client::Error::TransportError(_)));
        };
        match self {
            // tonic's words for a connection that could not be made.
            Retry::NeverSent => s.code() == tonic::Code::Unavailable && s.message().contains("tcp connect error"),
            Retry::Unavailable => matches!(s.code(), tonic::Code::Unavailable | tonic::Code::Unknown),
        }
    }
}

/// A connection: the client and the runtime its requests run on. Every request
/// is handed to that runtime and waited for on the caller's thread (any thread:
/// a blocking pool's, a plain one), with its deadline.
struct Conn {
    rt: Option<tokio::runtime::Runtime>,
    client: Client,
    describe: String,
}

impl Drop for Conn {
    fn drop(&mut self) {
        // Never a blocking shutdown (the backend may be dropped on an async thread).
        if let Some(rt) = self.rt.take() {
            rt.shutdown_background();
        }
    }
}

/// `f` until it answers, sent again while `retry` allows it and the deadline
/// (`within` from now) leaves room for the pause; `Err` when the deadline passed
/// first.
async fn with_retries<T, F>(
    client: Client,
    retry: Retry,
    within: Duration,
    f: impl Fn(Client) -> F,
) -> std::result::Result<std::result::Result<T, etcd_client::Error>, tokio::time::error::Elapsed>
where
    F: Future<Output = std::result::Result<T, etcd_client::Error>>,
{
    let deadline = tokio::time::Instant::now() + within;
    let mut pause = Duration::from_millis(RETRY_PAUSE_MS_FIRST);
    loop {
        match tokio::time::timeout_at(deadline, f(client.clone())).await {
            Ok(Err(e)) if retry.again(&e) && tokio::time::Instant::now() + pause < deadline => {
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(Duration::from_millis(RETRY_PAUSE_MS_MAX));
            }
            other => return other,
        }
    }
}

fn unavailable(describe: &str, detail: impl std::fmt::Display) -> Error {
    Error::EtcdUnavailable { cluster: describe.to_owned(), detail: detail.to_string() }
}

/// An etcd client error as a storage error: unreachable or without quorum is
/// `ETCD_UNAVAILABLE`; anything else etcd answered is `ETCD_ERROR`.
fn etcd_error(describe: &str, e: etcd_client::Error) -> Error {
    use etcd_client::Error as E;
    match &e {
        E::GRpcStatus(s)
            if !matches!(
                s.code(),
                tonic::Code::Unavailable
                    | tonic::Code::DeadlineExceeded
                    | tonic::Code::Cancelled
                    | tonic::Code::Unknown
            ) =>
        {
            Error::Etcd { cluster: describe.to_owned(), detail: s.message().to_owned() }
        }
        E::InvalidArgs(_) | E::InvalidUri(_) => Error::Etcd { cluster: describe.to_owned(), detail: e.to_string() },
        _ => unavailable(describe, e),
    }
}

impl Conn {
    fn connect(opts: &EtcdOptions) -> Result<Conn> {
        let describe = opts.describe();
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("fencelog-etcd")
            .enable_all()
            .build()
            .map_err(|e| Error::io("start the etcd client's runtime", "etcd")(e))?;
        let options = ConnectOptions::new()
            .with_connect_timeout(Duration::from_millis(ETCD_CONNECT_TIMEOUT_MS))
            .with_timeout(Duration::from_millis(ETCD_REQUEST_TIMEOUT_MS))
            .with_keep_alive(Duration::from_secs(5), Duration::from_secs(5));
        let eps = opts.endpoints.clone();
        let connecting = rt.spawn(async move { Client::connect(eps, Some(options)).await });
        let client = rt
            .block_on(async {
                tokio::time::timeout(Duration::from_millis(ETCD_REQUEST_TIMEOUT_MS), connecting)
                    .await
                    .map_err(|_| format!("no answer within {ETCD_REQUEST_TIMEOUT_MS} ms"))?
                    .map_err(|e| e.to_string())
            })
            .map_err(|e| unavailable(&describe, e))?
            .map_err(|e| etcd_error(&describe, e))?;
        Ok(Conn { rt: Some(rt), client, describe })
    }

    /// Run one request on the connection's runtime, waiting at most
    /// [`ETCD_REQUEST_TIMEOUT_MS`] in all. The client spreads requests over the
    /// endpoints and does not steer around a member that is down: a request that
    /// could not be sent to one (the connection refused: it never reached etcd) is
    /// sent again, to the next, within the same deadline. An idempotent request
    /// (`Retry::Unavailable`: a read, a put of a key of its own) is sent again after
    /// any answer of unavailability (no leader, a leader change, a member cut off);
    /// a `Txn` (`Retry::NeverSent`) only when it was never sent — it may have been
    /// applied otherwise, and only the caller can tell (by the head).
    fn run<T: Send + 'static, F>(&self, retry: Retry, f: impl Fn(Client) -> F + Send + 'static) -> Result<T>
    where
        F: Future<Output = std::result::Result<T, etcd_client::Error>> + Send + 'static,
    {
        self.run_within(retry, Duration::from_millis(ETCD_REQUEST_TIMEOUT_MS), f)
    }

    /// [`run`](Self::run) with a deadline of `within` (at most
    /// [`ETCD_REQUEST_TIMEOUT_MS`]: what is left of a larger operation's).
    fn run_within<T: Send + 'static, F>(
        &self,
        retry: Retry,
        within: Duration,
        f: impl Fn(Client) -> F + Send + 'static,
    ) -> Result<T>
    where
        F: Future<Output = std::result::Result<T, etcd_client::Error>> + Send + 'static,
    {
        let within = within.min(Duration::from_millis(ETCD_REQUEST_TIMEOUT_MS));
        let client = self.client.clone();
        let (tx, rx) = std::sync::mpsc::sync_channel(1);
        let rt = self.rt.as_ref().expect("a live connection");
        rt.spawn(async move {
            // A stalled runtime (its one thread blocked) in tests.
            fail::fail_point!("etcd::request");
            let _ = tx.send(with_retries(client, retry, within, f).await);
        });
        // The deadline is kept on this side too: a runtime whose thread is held
        // (starved, or blocked by a bug) must not hold the caller past its bound.
        let grace = Duration::from_millis(ETCD_ANSWER_GRACE_MS);
        match rx.recv_timeout(within + grace) {
            Ok(Ok(Ok(v))) => Ok(v),
            Ok(Ok(Err(e))) => Err(etcd_error(&self.describe, e)),
            Ok(Err(_)) => Err(unavailable(&self.describe, format!("no answer within {} ms", within.as_millis()))),
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => Err(unavailable(
                &self.describe,
                format!(
                    "no answer within {} ms: the client's runtime did not run the request",
                    (within + grace).as_millis()
                ),
            )),
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
                Err(unavailable(&self.describe, "the client's runtime stopped"))
            }
        }
    }

    fn get(&self, key: Vec<u8>, opts: Option<GetOptions>) -> Result<etcd_client::GetResponse> {
        self.get_within(key, opts, Duration::from_millis(ETCD_REQUEST_TIMEOUT_MS))
    }

    fn get_within(&self, key: Vec<u8>, opts: Option<GetOptions>, within: Duration) -> Result<etcd_client::GetResponse> {
        self.run_within(Retry::Unavailable, within, move |c| {
            let (key, opts) = (key.clone(), opts.clone());
            async move { c.kv_client().max_decoding_message_size(MESSAGE_BYTES_MAX).get(key, opts).await }
        })
    }

    /// A put of a key nothing else writes (a snapshot's, the archive marker):
    /// sent again if etcd was unavailable.
    fn put(&self, key: Vec<u8>, value: Vec<u8>) -> Result<etcd_client::PutResponse> {
        self.run(Retry::Unavailable, move |mut c| {
            let (key, value) = (key.clone(), value.clone());
            async move { c.put(key, value, None).await }
        })
    }

    /// A delete of a range (its keys, or those with its prefix): sent again if
    /// etcd was unavailable.
    fn delete(&self, key: Vec<u8>, opts: etcd_client::DeleteOptions) -> Result<etcd_client::DeleteResponse> {
        self.run(Retry::Unavailable, move |mut c| {
            let (key, opts) = (key.clone(), opts.clone());
            async move { c.delete(key, Some(opts)).await }
        })
    }

    /// One page of the range `start..end`, as many keys as `pager` asks for; a
    /// page too large for [`MESSAGE_BYTES_MAX`] is asked for again with half the
    /// keys (down to one, which always fits: a record is at most
    /// [`PAYLOAD_BYTES_MAX`] and its frame).
    fn get_page(&self, start: Vec<u8>, end: Vec<u8>, pager: &mut Pager) -> Result<etcd_client::GetResponse> {
        let first = pager.limit;
        let (r, limit) = self.run(Retry::Unavailable, move |c| {
            let (start, end) = (start.clone(), end.clone());
            async move {
                let mut limit = first;
                loop {
                    let opts = GetOptions::new().with_range(end.clone()).with_limit(limit);
                    match c
                        .kv_client()
                        .max_decoding_message_size(MESSAGE_BYTES_MAX)
                        .get(start.clone(), Some(opts))
                        .await
                    {
                        Err(etcd_client::Error::GRpcStatus(s))
                            if matches!(s.code(), tonic::Code::OutOfRange | tonic::Code::ResourceExhausted)
                                && limit > 1 =>
                        {
                            limit /= 2
                        }
                        r => return r.map(|r| (r, limit)),
                    }
                }
            }
        })?;
        pager.limit = limit;
        pager.observe(&r);
        Ok(r)
    }

    fn txn(&self, txn: Txn) -> Result<etcd_client::TxnResponse> {
        self.txn_within(txn, Duration::from_millis(ETCD_REQUEST_TIMEOUT_MS))
    }

    /// A `Txn` with a deadline of `within` (at most [`ETCD_REQUEST_TIMEOUT_MS`]).
    fn txn_within(&self, txn: Txn, within: Duration) -> Result<etcd_client::TxnResponse> {
        // A `Txn` lost on its way, its answer with it (tests).
        fail::fail_point!("etcd::txn_not_sent", |_| Err(unavailable(&self.describe, "lost on its way (injected)")));
        let r = self.run_within(Retry::NeverSent, within, move |mut c| {
            let txn = txn.clone();
            async move { c.txn(txn).await }
        });
        // A `Txn` that etcd applied whose answer never came back (tests).
        fail::fail_point!("etcd::txn_answer_lost", r.is_ok(), |_| {
            Err(unavailable(&self.describe, "the answer was lost (injected)"))
        });
        r
    }

    /// Wait at most `timeout` for the key `key` to change after `revision`;
    /// whether it did (a watch, not a poll).
    fn wait_change(&self, key: Vec<u8>, revision: i64, timeout: Duration) -> Result<bool> {
        let (tx, rx) = std::sync::mpsc::sync_channel(1);
        let mut client = self.client.clone();
        let rt = self.rt.as_ref().expect("a live connection");
        rt.spawn(async move {
            let watched = async {
                let opts = WatchOptions::new().with_start_revision(revision + 1);
                let mut stream = client.watch(key, Some(opts)).await?;
                while let Some(resp) = stream.message().await? {
                    if resp.canceled() {
                        return Err(etcd_client::Error::WatchError(resp.cancel_reason().to_owned()));
                    }
                    if !resp.events().is_empty() {
                        return Ok(true);
                    }
                }
                Ok(false)
            };
            let r = match tokio::time::timeout(timeout, watched).await {
                Ok(r) => r,
                Err(_) => Ok(false),
            };
            let _ = tx.send(r);
        });
        match rx.recv_timeout(timeout + Duration::from_millis(ETCD_ANSWER_GRACE_MS)) {
            Ok(r) => r.map_err(|e| etcd_error(&self.describe, e)),
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
                Err(unavailable(&self.describe, "the client's runtime did not run the watch"))
            }
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
                Err(unavailable(&self.describe, "the client's runtime stopped"))
            }
        }
    }
}

/// The prefix's marker: what makes it a fencelog log.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Meta {
    fencelog_log: u32,
    format_version: u16,
    created_ms: u64,
}

/// An append in flight, as the log would hold it once it landed.
struct Ours {
    first_seq: u64,
    first_frame: Vec<u8>,
    head: Head,
}

/// Records before `below_seq` were archived (`fencelog archive`): `link` is the
/// chain link of record `below_seq - 1`, where the records in etcd continue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Archived {
    pub below_seq: u64,
    pub link: ChainLink,
}

#[derive(Serialize, Deserialize)]
struct ArchivedJson {
    below_seq: u64,
    link: String,
}

#[derive(Serialize, Deserialize)]
struct SnapJson {
    seq: u64,
    /// Chain link of `seq`, in hex (stored as `head`).
    #[serde(rename = "head")]
    chain_head: String,
    digest: String,
    bytes: u64,
    chunks: usize,
}

fn unhex32(s: &str) -> Option<[u8; 32]> {
    if s.len() != 64 {
        return None;
    }
    let mut out = [0u8; 32];
    for (i, b) in out.iter_mut().enumerate() {
        *b = u8::from_str_radix(s.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(out)
}

/// What `init` found or made.
#[derive(Debug, Clone, Serialize)]
pub struct EtcdInitReport {
    pub etcd: String,
    pub created: bool,
    pub last_seq: u64,
    pub chain_head: String,
}

/// A fencelog log in etcd, opened: for appending (the ledger, the CLI) or reading
/// (the inspector, the audit) — there is no lock, so the two are the same.
pub struct EtcdBackend {
    conn: Arc<Conn>,
    opts: EtcdOptions,
    prefix: Vec<u8>,
    writer_id: uuid::Uuid,
    clock: super::options::Clock,
    payload_bytes_max: u32,
    /// The head this writer last knew: what its next append compares.
    cursor: Mutex<Cursor>,
    appended: AtomicU64,
    txns: AtomicU64,
    report: OpenReport,
    archived: Option<Archived>,
}

impl EtcdBackend {
    /// Create the log under the prefix: only where no key is (never among
    /// another program's keys). On a prefix that already holds a fencelog log,
    /// open it and report what it holds (as `init` on a log directory does).
    pub fn init(opts: &EtcdOptions) -> Result<EtcdInitReport> {
        let conn = Conn::connect(opts)?;
        let prefix = opts.prefix.as_bytes().to_vec();
        let meta_key = keys::key(&prefix, keys::META);
        let created = if conn.get(meta_key.clone(), None)?.kvs().is_empty() {
            let any = conn.get(prefix.clone(), Some(GetOptions::new().with_prefix().with_count_only()))?;
            if any.count() > 0 {
                return Err(Error::NotALogDirectory {
                    path: opts.describe().into(),
                    detail: format!(
                        "the prefix holds {} keys that are not a fencelog log; refusing to create a log among them",
                        any.count()
                    ),
                });
            }
            let meta =
                Meta { fencelog_log: 1, format_version: FORMAT_VERSION, created_ms: LogOptions::default().now_ms() };
            let head_key = keys::key(&prefix, keys::HEAD);
            let txn = Txn::new()
                .when([
                    Compare::create_revision(meta_key.clone(), CompareOp::Equal, 0),
                    Compare::create_revision(head_key.clone(), CompareOp::Equal, 0),
                ])
                .and_then([
                    TxnOp::put(head_key, keys::head_value(0, &GENESIS_LINK), None),
                    TxnOp::put(meta_key, serde_json::to_vec(&meta).expect("meta serializes"), None),
                ]);
            conn.txn(txn)?.succeeded()
        } else {
            false
        };
        drop(conn);
        let b = EtcdBackend::open(opts, &LogOptions::default())?;
        let h = b.head()?;
        Ok(EtcdInitReport { etcd: opts.describe(), created, last_seq: h.seq, chain_head: hex(&h.link) })
    }

    /// Open the log under the prefix, after checking that it is one and that its
    /// history is whole (the marker, the head, the archive marker, the count of
    /// record keys against the head, the last record against the head): a prefix
    /// holding no log is `NOT_A_LOG` and nothing is written.
    pub fn open(opts: &EtcdOptions, log: &LogOptions) -> Result<EtcdBackend> {
        Self::open_checked(opts, log, true)
    }

    /// [`EtcdBackend::open`] without the check of the history's ends, for the
    /// tools that read a damaged log to report or cut its damage (the inspector,
    /// `repair`): the marker is still required. Its writer must not append.
    pub fn open_unchecked(opts: &EtcdOptions, log: &LogOptions) -> Result<EtcdBackend> {
        Self::open_checked(opts, log, false)
    }

    fn open_checked(opts: &EtcdOptions, log: &LogOptions, check: bool) -> Result<EtcdBackend> {
        let conn = Arc::new(Conn::connect(opts)?);
        let prefix = opts.prefix.as_bytes().to_vec();
        let meta = conn.get(keys::key(&prefix, keys::META), None)?;
        let Some(meta) = meta.kvs().first() else {
            let any = conn.get(prefix.clone(), Some(GetOptions::new().with_prefix().with_count_only()))?;
            let detail = if any.count() == 0 {
                format!(
                    "the prefix is empty; create a log with `fencelog init --etcd {} --etcd-prefix {}`",
                    opts.endpoints.join(","),
                    opts.prefix
                )
            } else {
                format!("the prefix holds {} keys, none of them a fencelog log's marker", any.count())
            };
            return Err(Error::NotALogDirectory { path: opts.describe().into(), detail });
        };
        let meta: Meta = serde_json::from_slice(meta.value()).map_err(|e| Error::NotALogDirectory {
            path: opts.describe().into(),
            detail: format!("its `log` key is not a fencelog log's marker: {e}"),
        })?;
        if meta.fencelog_log != 1 || !SUPPORTED_VERSIONS.contains(&meta.format_version) {
            return Err(Error::UnsupportedFormat {
                segment: opts.describe().into(),
                detail: format!(
                    "a log of format {} (marker version {}); this build reads formats {SUPPORTED_VERSIONS:?}",
                    meta.format_version, meta.fencelog_log
                ),
            });
        }
        let mut b = EtcdBackend {
            conn,
            opts: opts.clone(),
            prefix,
            writer_id: log.writer_id.unwrap_or_else(uuid::Uuid::new_v4),
            clock: log.clock.clone().unwrap_or_else(|| Arc::new(|| LogOptions::default().now_ms())),
            payload_bytes_max: log.payload_bytes_max.min(PAYLOAD_BYTES_MAX),
            cursor: Mutex::new(Cursor { next_seq: 1, prev_link: GENESIS_LINK }),
            appended: AtomicU64::new(0),
            txns: AtomicU64::new(0),
            report: OpenReport {
                segments: 0,
                records_verified: 0,
                last_seq: 0,
                chain_head: hex(&GENESIS_LINK),
                repairs: vec![],
            },
            archived: None,
        };
        // The head, the archive marker and the records are read at one revision:
        // an append that lands between two reads (another host's, a runner's)
        // would otherwise look like records after the head.
        let (head, revision) = b.read_head_at()?;
        b.archived = b.read_archived_at(revision)?;
        if check {
            b.check_history(&head, revision)?;
        }
        *b.cursor.lock().expect("cursor") = Cursor { next_seq: head.seq + 1, prev_link: head.link };
        b.report.last_seq = head.seq;
        b.report.chain_head = hex(&head.link);
        Ok(b)
    }

    pub fn options(&self) -> &EtcdOptions {
        &self.opts
    }

    /// Where the records before the oldest one in etcd went, if they were archived.
    pub fn archived(&self) -> Option<Archived> {
        self.archived
    }

    fn corruption(&self, seq: u64, detail: String) -> Error {
        Error::Corruption { segment: self.key_path(seq), offset: 0, seq, detail }
    }

    /// A record's key, for messages (where a segment path would be).
    pub fn key_path(&self, seq: u64) -> std::path::PathBuf {
        format!("{}{}{seq:020}", self.opts.describe(), keys::RECORDS).into()
    }

    fn read_head(&self) -> Result<Head> {
        self.read_head_at().map(|(h, _)| h)
    }

    /// Whether the log holds `ours`' first frame at its sequence: that append
    /// landed (its `Txn` wrote its frames and the head together).
    fn holds(&self, ours: &Ours, within: Duration) -> Result<bool> {
        let r = self.conn.get_within(keys::record(&self.prefix, ours.first_seq), None, within)?;
        Ok(r.kvs().first().is_some_and(|kv| kv.value() == ours.first_frame.as_slice()))
    }

    /// The head, and the revision of the store it was read at.
    fn read_head_at(&self) -> Result<(Head, i64)> {
        self.read_head_at_within(Duration::from_millis(ETCD_REQUEST_TIMEOUT_MS))
    }

    fn read_head_within(&self, within: Duration) -> Result<Head> {
        self.read_head_at_within(within).map(|(h, _)| h)
    }

    fn read_head_at_within(&self, within: Duration) -> Result<(Head, i64)> {
        let r = self.conn.get_within(keys::key(&self.prefix, keys::HEAD), None, within)?;
        let revision = r.header().map_or(0, |h| h.revision());
        let Some(kv) = r.kvs().first() else {
            return Err(self.corruption(0, "the log's marker is there but its head key is missing".into()));
        };
        let head = keys::parse_head(kv.value())
            .ok_or_else(|| self.corruption(0, "the head key does not hold a head".into()))?;
        Ok((head, revision))
    }

    /// Read options at `revision` (0: the newest).
    fn at(revision: i64) -> GetOptions {
        if revision > 0 { GetOptions::new().with_revision(revision) } else { GetOptions::new() }
    }

    fn read_archived_at(&self, revision: i64) -> Result<Option<Archived>> {
        let r = self.conn.get(keys::key(&self.prefix, keys::ARCHIVED), Some(Self::at(revision)))?;
        let Some(kv) = r.kvs().first() else { return Ok(None) };
        let j: ArchivedJson = serde_json::from_slice(kv.value())
            .map_err(|e| self.corruption(0, format!("the archive marker does not parse: {e}")))?;
        let link = unhex32(&j.link)
            .ok_or_else(|| self.corruption(0, "the archive marker's link is not 64 hex digits".into()))?;
        Ok(Some(Archived { below_seq: j.below_seq, link }))
    }

    /// The first sequence held in etcd.
    fn first_seq(&self) -> u64 {
        self.archived.map_or(1, |a| a.below_seq)
    }

    /// The whole history the prefix claims, or nothing: the record keys from the
    /// first held sequence are exactly the ones up to the head (a count: one
    /// request), and the last of them is the head.
    fn check_history(&self, head: &Head, revision: i64) -> Result<()> {
        let first = self.first_seq();
        let expected = (head.seq + 1).saturating_sub(first);
        let end = keys::prefix_end(&keys::key(&self.prefix, keys::RECORDS));
        let counted = self
            .conn
            .get(keys::record(&self.prefix, first), Some(Self::at(revision).with_range(end).with_count_only()))?
            .count() as u64;
        if counted != expected {
            let detail = if counted > expected {
                format!(
                    "{} record keys lie after the head (sequence {}): records that no append acknowledged, or another \
                     log's; refusing to answer from them",
                    counted - expected,
                    head.seq
                )
            } else {
                format!(
                    "{} of the records {first}..={} are missing: refusing to answer from a partial history",
                    expected - counted,
                    head.seq
                )
            };
            return Err(self.corruption(head.seq, detail));
        }
        if head.seq >= first {
            let r = self.conn.get(keys::record(&self.prefix, head.seq), Some(Self::at(revision)))?;
            let kv = r.kvs().first().ok_or_else(|| self.corruption(head.seq, "the head's record is missing".into()))?;
            let (rec, used) = decode_frame(kv.value(), BODY_BYTES_HARD_MAX)
                .map_err(|e| self.corruption(head.seq, format!("the head's record is damaged: {e:?}")))?;
            if used != kv.value().len() || rec.seq != head.seq || rec.link != head.link {
                return Err(
                    self.corruption(head.seq, "the head key does not name its record's sequence and link".into())
                );
            }
        } else if first > 1 && head.seq + 1 != first {
            return Err(self.corruption(first, "the head lies before the archived history's end".into()));
        }
        Ok(())
    }

    /// Records appended (by this writer) and `Txn`s that appended them.
    pub fn stats(&self) -> (u64, u64) {
        (self.appended.load(Ordering::Relaxed), self.txns.load(Ordering::Relaxed))
    }

    /// Raw frames (as stored) of records `from..=to`, in order, verified.
    pub fn frames(&self, from: u64, to: u64, mut visit: impl FnMut(u64, &[u8]) -> Result<()>) -> Result<()> {
        let mut next = from;
        let mut pager = Pager::new();
        while next <= to {
            let end = keys::record(&self.prefix, to.saturating_add(1));
            let r = self.conn.get_page(keys::record(&self.prefix, next), end, &mut pager)?;
            if r.kvs().is_empty() {
                return Err(self.corruption(next, format!("record {next} is missing")));
            }
            for kv in r.kvs() {
                if keys::record_seq(&self.prefix, kv.key()) != Some(next) {
                    return Err(self.corruption(next, format!("record {next} is missing")));
                }
                visit(next, kv.value())?;
                next += 1;
            }
        }
        Ok(())
    }

    /// Put frames written elsewhere (`import`): records `first..` with their
    /// bytes as they are, `Txn` by `Txn`, each comparing the head.
    pub fn put_frames(&self, frames: &[(u64, Vec<u8>, ChainLink)]) -> Result<()> {
        let head_key = keys::key(&self.prefix, keys::HEAD);
        let mut cur = *self.cursor.lock().expect("cursor");
        for chunk in frames.chunks(GROUP_RECORDS_MAX) {
            let mut ops = Vec::with_capacity(chunk.len() + 1);
            for (seq, frame, _) in chunk {
                assert_eq!(*seq, cur.next_seq, "frames are put in order");
                ops.push(TxnOp::put(keys::record(&self.prefix, *seq), frame.clone(), None));
                cur.next_seq += 1;
            }
            let (last, _, link) = chunk.last().expect("a chunk");
            ops.push(TxnOp::put(head_key.clone(), keys::head_value(*last, link), None));
            let before = keys::head_value(chunk[0].0 - 1, &cur.prev_link);
            let txn = Txn::new().when([Compare::value(head_key.clone(), CompareOp::Equal, before)]).and_then(ops);
            if !self.conn.txn(txn)?.succeeded() {
                return Err(Error::HeadMoved { expected: chunk[0].0 - 1, actual: self.read_head()?.seq });
            }
            cur.prev_link = *link;
        }
        *self.cursor.lock().expect("cursor") = cur;
        Ok(())
    }

    /// Mark records before `below_seq` as archived (their link `link`: the one of
    /// record `below_seq - 1`), then delete their keys. The marker goes first: a
    /// crash between leaves keys below it, which nothing reads — and the delete
    /// runs from the first record key there can be (sequence 1), so the next
    /// `archive` deletes what a crashed one left.
    pub fn set_archived(&mut self, below_seq: u64, link: &ChainLink) -> Result<u64> {
        let key = keys::key(&self.prefix, keys::ARCHIVED);
        let value = serde_json::to_vec(&ArchivedJson { below_seq, link: hex(link) }).expect("serializes");
        self.conn.put(key, value)?;
        self.archived = Some(Archived { below_seq, link: *link });
        let (start, end) = (keys::record(&self.prefix, 1), keys::record(&self.prefix, below_seq));
        let deleted = self.conn.delete(start, etcd_client::DeleteOptions::new().with_range(end))?;
        Ok(deleted.deleted() as u64)
    }

    /// The etcd settings fencelog needs, checked as far as a client can: the
    /// cluster answers, no alarm (a full quota: every write refused) is raised.
    /// Returns what to warn about.
    pub fn check_cluster(&self) -> Result<Vec<String>> {
        let mut warnings = vec![];
        self.probe_group_limits()?;
        let alarms = self.conn.run(Retry::Unavailable, |mut c| async move {
            c.alarm(etcd_client::AlarmAction::Get, etcd_client::AlarmType::None, None).await
        })?;
        for a in alarms.alarms() {
            warnings.push(format!("etcd member {:x} raises alarm {:?}", a.member_id(), a.alarm()));
        }
        // Compaction: every append rewrites the head key, so etcd's history grows
        // by a revision per commit group; without auto-compaction it reaches the
        // quota. A revision old enough and still readable says none runs.
        let status = self.conn.run(Retry::Unavailable, |mut c| async move { c.status().await })?;
        let revision = status.header().map_or(0, |h| h.revision());
        if revision > COMPACTION_EXPECTED_BY_REVISION {
            let old = self.conn.get(keys::key(&self.prefix, keys::META), Some(GetOptions::new().with_revision(1)));
            if old.is_ok() {
                warnings.push(format!(
                    "etcd keeps every revision (at {revision}, revision 1 is still readable): run it with \
                     --auto-compaction-mode and --auto-compaction-retention (docs/DISTRIBUTED.md), or its quota fills"
                ));
            }
        }
        Ok(warnings)
    }
}

impl EtcdBackend {
    /// Does etcd take a commit group as large as fencelog makes them? A `Txn` of
    /// [`ETCD_TXN_OPS_MAX`] puts and [`GROUP_PAYLOAD_BYTES_MAX`] bytes whose
    /// compare never holds (etcd checks a request's size and operations before it
    /// evaluates it; nothing is written): refused, the cluster runs with a lower
    /// `--max-txn-ops` or `--max-request-bytes` than its defaults, and every large
    /// group would be refused — an error, before the daemon admits anything.
    fn probe_group_limits(&self) -> Result<()> {
        let probe = keys::key(&self.prefix, "probe");
        let value = vec![0u8; GROUP_PAYLOAD_BYTES_MAX / ETCD_TXN_OPS_MAX];
        // Distinct keys (etcd refuses a key twice in one request).
        let ops: Vec<TxnOp> = (0..ETCD_TXN_OPS_MAX)
            .map(|i| TxnOp::put(keys::key(&self.prefix, &format!("probe/{i:03}")), value.clone(), None))
            .collect();
        // A version is never below 0: the compare never holds.
        let txn = Txn::new().when([Compare::version(probe.clone(), CompareOp::Less, 0)]).and_then(ops);
        match self.conn.txn(txn) {
            Ok(r) if !r.succeeded() => Ok(()),
            Ok(_) => Err(self.etcd_refusal("a probe whose compare cannot hold was applied".into())),
            Err(Error::Etcd { detail, .. }) => Err(self.etcd_refusal(format!(
                "etcd refuses a commit group of {ETCD_TXN_OPS_MAX} operations and {GROUP_PAYLOAD_BYTES_MAX} \
                 bytes ({detail}): run it with --max-txn-ops >= {ETCD_TXN_OPS_MAX} and --max-request-bytes >= \
                 {ETCD_REQUEST_BYTES_MAX} (its defaults; docs/DISTRIBUTED.md)"
            ))),
            Err(e) => Err(e),
        }
    }

    fn etcd_refusal(&self, detail: String) -> Error {
        Error::Etcd { cluster: self.opts.describe(), detail }
    }
}

/// Past this revision, a cluster with auto-compaction has compacted revision 1.
const COMPACTION_EXPECTED_BY_REVISION: i64 = 1_000_000;

impl LogBackend for EtcdBackend {
    fn shared_by_hosts(&self) -> bool {
        true
    }

    fn append_is_local(&self) -> bool {
        false
    }
    fn optimistic(&self) -> bool {
        true
    }

    fn check_service(&self) -> Result<Vec<String>> {
        self.check_cluster()
    }

    fn head(&self) -> Result<Head> {
        let h = self.read_head()?;
        Ok(h)
    }

    fn reader(&self, from_seq: u64) -> Box<dyn RecordReader> {
        Box::new(EtcdReader {
            conn: Arc::clone(&self.conn),
            prefix: self.prefix.clone(),
            describe: self.opts.describe(),
            first: self.first_seq(),
            archived_link: self.archived.map(|a| a.link),
            visit_from: from_seq.max(1),
            cursor: None,
            revision: 0,
        })
    }

    fn append_if_head(&self, expect_seq: u64, payloads: Vec<Vec<u8>>) -> Result<AppendOutcome> {
        if payloads.is_empty() {
            return Err(Error::EmptyBatch);
        }
        let max = self.payload_bytes_max as usize;
        if let Some(p) = payloads.iter().find(|p| p.len() > max) {
            return Err(Error::RecordTooLarge { bytes: p.len() as u64, max: max as u64 });
        }
        let bytes: usize = payloads.iter().map(Vec::len).sum();
        if payloads.len() > GROUP_RECORDS_MAX || bytes > GROUP_PAYLOAD_BYTES_MAX {
            return Err(Error::BatchTooLarge {
                records: payloads.len(),
                bytes,
                records_max: GROUP_RECORDS_MAX,
                bytes_max: GROUP_PAYLOAD_BYTES_MAX,
            });
        }
        let mut cursor = self.cursor.lock().expect("cursor");
        if cursor.next_seq - 1 != expect_seq {
            // This writer's view is behind (or ahead): what etcd holds decides.
            let h = self.read_head()?;
            *cursor = Cursor { next_seq: h.seq + 1, prev_link: h.link };
            if h.seq != expect_seq {
                return Ok(AppendOutcome::HeadMoved { actual: h.seq });
            }
        }
        let (now_ms, writer) = ((self.clock)(), *self.writer_id.as_bytes());
        let head_key = keys::key(&self.prefix, keys::HEAD);
        let before = keys::head_value(expect_seq, &cursor.prev_link);
        let mut c = *cursor;
        let mut ops = Vec::with_capacity(payloads.len() + 1);
        let mut first_frame = None;
        for p in &payloads {
            let mut frame = Vec::with_capacity(p.len() + 80);
            c.prev_link = encode_frame(&mut frame, &c.prev_link, c.next_seq, &writer, now_ms, p);
            first_frame.get_or_insert_with(|| frame.clone());
            ops.push(TxnOp::put(keys::record(&self.prefix, c.next_seq), frame, None));
            c.next_seq += 1;
        }
        let last_seq = c.next_seq - 1;
        ops.push(TxnOp::put(head_key.clone(), keys::head_value(last_seq, &c.prev_link), None));
        let txn = Txn::new()
            .when([Compare::value(head_key.clone(), CompareOp::Equal, before)])
            .and_then(ops)
            .or_else([TxnOp::get(head_key, None)]);
        let ours = Ours {
            first_seq: expect_seq + 1,
            first_frame: first_frame.expect("a record at least"),
            head: Head { seq: last_seq, link: c.prev_link },
        };
        let appended = |cursor: &mut Cursor| {
            *cursor = c;
            self.appended.fetch_add(payloads.len() as u64, Ordering::Relaxed);
            self.txns.fetch_add(1, Ordering::Relaxed);
            Ok(AppendOutcome::Appended(Appended { first_seq: expect_seq + 1, last_seq, chain_head: c.prev_link }))
        };
        // An answer of unavailability while time is left (the connection reset
        // under the request — a member killed —, a leader change) leaves the
        // outcome open: the head tells it. Still the one compared against: not applied
        // (or not yet: the request is sent again, and the compare lets at most one
        // of the two apply); ours: applied; another writer's: applied if our first
        // frame is at its sequence, else never (its compare cannot hold again).
        // One deadline for the whole append, the telling included.
        let deadline = std::time::Instant::now() + Duration::from_millis(ETCD_REQUEST_TIMEOUT_MS);
        let left = || deadline.saturating_duration_since(std::time::Instant::now());
        let mut lost = false;
        let mut pause = Duration::from_millis(RETRY_PAUSE_MS_FIRST);
        let resp = loop {
            match self.conn.txn_within(txn.clone(), left()) {
                Ok(resp) => break resp,
                Err(e @ Error::EtcdUnavailable { .. }) => {
                    lost = true;
                    // Nothing left of the deadline (the answer did not come in
                    // time): not told, the error stands.
                    if left().is_zero() {
                        return Err(e);
                    }
                    // Another writer appending meanwhile (tests).
                    fail::fail_point!("etcd::before_telling");
                    let Ok(head) = self.read_head_within(left()) else { return Err(e) };
                    let landed = head == ours.head
                        || (head.seq != expect_seq
                            && match self.holds(&ours, left()) {
                                Ok(held) => held,
                                Err(_) => return Err(e),
                            });
                    if landed {
                        return appended(&mut cursor);
                    }
                    if head.seq != expect_seq || head.link != cursor.prev_link {
                        *cursor = Cursor { next_seq: head.seq + 1, prev_link: head.link };
                        return Ok(AppendOutcome::HeadMoved { actual: head.seq });
                    }
                    if left() <= pause {
                        return Err(e);
                    }
                    tracing::debug!(cluster = %self.opts.describe(), error = %e, "an append's answer was lost and it did not land: sent again");
                    // (Not at once: a connection that fails fast is not hammered.)
                    std::thread::sleep(pause);
                    pause = (pause * 2).min(Duration::from_millis(RETRY_PAUSE_MS_MAX));
                }
                Err(e) => return Err(e),
            }
        };
        // A resent `Txn` whose compare failed: the lost attempt may have landed
        // after the head was read.
        if !resp.succeeded() && lost {
            let held = self.holds(&ours, left()).map_err(|e| {
                unavailable(
                    &self.opts.describe(),
                    format!("an append whose answer was lost was sent again; whether the first landed could not be told: {e}"),
                )
            })?;
            if held {
                return appended(&mut cursor);
            }
        }
        if !resp.succeeded() {
            let actual = resp.op_responses().into_iter().find_map(|r| match r {
                TxnOpResponse::Get(g) => g.kvs().first().and_then(|kv| keys::parse_head(kv.value())),
                _ => None,
            });
            let Head { seq, link } = actual.ok_or_else(|| self.corruption(0, "the head key vanished".into()))?;
            *cursor = Cursor { next_seq: seq + 1, prev_link: link };
            return Ok(AppendOutcome::HeadMoved { actual: seq });
        }
        appended(&mut cursor)
    }

    fn exclusive(
        &self,
        _give_up: &dyn Fn() -> bool,
        f: &mut dyn FnMut(&mut dyn Exclusive) -> Result<()>,
    ) -> Result<()> {
        // No lock to hold: every append compares the head instead.
        f(&mut super::backend::Unlocked(self))
    }

    fn put_snapshot(&self, seq: u64, chain_head: &ChainLink, body: &[u8]) -> Result<SnapshotMeta> {
        let digest = digest_of(body);
        let chunks: Vec<&[u8]> = body.chunks(keys::SNAPSHOT_CHUNK_BYTES).collect();
        for (n, chunk) in chunks.iter().enumerate() {
            let (k, v) = (keys::snapshot_chunk(&self.prefix, seq, n), chunk.to_vec());
            self.conn.put(k, v)?;
        }
        let meta = SnapJson {
            seq,
            chain_head: hex(chain_head),
            digest: hex(&digest),
            bytes: body.len() as u64,
            chunks: chunks.len(),
        };
        let (k, v) = (keys::snapshot_meta(&self.prefix, seq), serde_json::to_vec(&meta).expect("serializes"));
        self.conn.put(k, v)?;
        // Only the newest few are kept.
        let (kept, _) = self.newest_snapshots_all();
        for old in kept.iter().skip(SNAPSHOTS_KEPT) {
            let dir = keys::snapshot_dir(&self.prefix, old.seq);
            let _ = self.conn.delete(dir, etcd_client::DeleteOptions::new().with_prefix());
        }
        Ok(SnapshotMeta {
            seq,
            chain_head: *chain_head,
            digest,
            source: format!("{}s/{seq:020}", self.opts.describe()),
        })
    }

    fn newest_snapshots(&self) -> (Vec<SnapshotMeta>, Vec<String>) {
        let (mut all, warnings) = self.newest_snapshots_all();
        all.truncate(SNAPSHOTS_KEPT);
        (all, warnings)
    }

    fn snapshot_body(&self, meta: &SnapshotMeta) -> std::result::Result<Vec<u8>, String> {
        let k = keys::snapshot_meta(&self.prefix, meta.seq);
        let r = self.conn.get(k, None).map_err(|e| e.to_string())?;
        let kv = r.kvs().first().ok_or("the snapshot is gone")?;
        let j: SnapJson = serde_json::from_slice(kv.value()).map_err(|e| e.to_string())?;
        let mut body = Vec::with_capacity(j.bytes.min(1 << 30) as usize);
        for n in 0..j.chunks {
            let r = self.conn.get(keys::snapshot_chunk(&self.prefix, meta.seq, n), None).map_err(|e| e.to_string())?;
            let kv = r.kvs().first().ok_or_else(|| format!("chunk {n} of the snapshot at {} is missing", meta.seq))?;
            body.extend_from_slice(kv.value());
        }
        if body.len() as u64 != j.bytes || digest_of(&body) != meta.digest {
            return Err(format!("the snapshot at {} does not match its description (length or blake3)", meta.seq));
        }
        Ok(body)
    }

    fn writer_id(&self) -> uuid::Uuid {
        self.writer_id
    }

    fn open_report(&self) -> OpenReport {
        self.report.clone()
    }

    fn commit_stats(&self) -> crate::storage::CommitStats {
        let (records, syncs) = self.stats();
        crate::storage::CommitStats { records, syncs }
    }
}

impl EtcdBackend {
    /// Every snapshot description, newest first, with a warning for each one that
    /// does not parse.
    fn newest_snapshots_all(&self) -> (Vec<SnapshotMeta>, Vec<String>) {
        let start = keys::key(&self.prefix, keys::SNAPSHOTS);
        let end = keys::prefix_end(&start);
        let r = match self.conn.get(start, Some(GetOptions::new().with_range(end).with_keys_only())) {
            Ok(r) => r,
            Err(e) => return (vec![], vec![format!("snapshots not listed: {e}")]),
        };
        let mut seqs: Vec<u64> = r
            .kvs()
            .iter()
            .filter_map(|kv| {
                let k = kv.key().strip_prefix(self.prefix.as_slice())?.strip_prefix(keys::SNAPSHOTS.as_bytes())?;
                let k = std::str::from_utf8(k).ok()?;
                k.strip_suffix("/m")?.parse().ok()
            })
            .collect();
        seqs.sort_unstable_by(|a, b| b.cmp(a));
        let (mut out, mut warnings) = (vec![], vec![]);
        for seq in seqs {
            let r = self.conn.get(keys::snapshot_meta(&self.prefix, seq), None);
            let parsed = r.ok().and_then(|r| r.kvs().first().map(|kv| kv.value().to_vec())).and_then(|v| {
                let j: SnapJson = serde_json::from_slice(&v).ok()?;
                Some(SnapshotMeta {
                    seq: j.seq,
                    chain_head: unhex32(&j.chain_head)?,
                    digest: unhex32(&j.digest)?,
                    source: format!("{}s/{seq:020}", self.opts.describe()),
                })
            });
            match parsed {
                Some(m) if m.seq == seq => out.push(m),
                _ => warnings.push(format!("the snapshot description at {seq} does not parse; ignored")),
            }
        }
        (out, warnings)
    }
}

/// Verified records from etcd, in order: the same checks as a segment reader —
/// each frame's length and CRC, the dense sequence, each record's chain link
/// against the one before.
struct EtcdReader {
    conn: Arc<Conn>,
    prefix: Vec<u8>,
    describe: String,
    /// The first sequence held in etcd (records before it were archived).
    first: u64,
    archived_link: Option<ChainLink>,
    visit_from: u64,
    /// Where the next record must continue: set on the first poll.
    cursor: Option<Cursor>,
    /// The etcd revision of the last read (for the watch).
    revision: i64,
}

impl EtcdReader {
    fn corruption(&self, seq: u64, detail: String) -> Error {
        Error::Corruption {
            segment: format!("{}{}{seq:020}", self.describe, keys::RECORDS).into(),
            offset: 0,
            seq,
            detail,
        }
    }

    /// Where to start: the record before `visit_from` (its stored link, checked by
    /// its CRC) or the start of the history held.
    fn start(&mut self) -> Result<Cursor> {
        if self.visit_from < self.first {
            return Err(Error::Archived { below_seq: self.first, asked: self.visit_from });
        }
        if self.visit_from == self.first {
            let prev_link = if self.first == 1 { GENESIS_LINK } else { self.archived_link.unwrap_or(GENESIS_LINK) };
            return Ok(Cursor { next_seq: self.first, prev_link });
        }
        let before = self.visit_from - 1;
        let r = self.conn.get(keys::record(&self.prefix, before), None)?;
        self.revision = r.header().map_or(0, |h| h.revision());
        let Some(kv) = r.kvs().first() else {
            // Beyond the end (a reader from "now on", or from a sequence not yet
            // appended): it starts after the head, and visits from `visit_from`.
            // The head at the revision the record was found missing at: an append
            // in between is not taken for a record missing below the head.
            let at = (self.revision > 0).then(|| GetOptions::new().with_revision(self.revision));
            let h = self.conn.get(keys::key(&self.prefix, keys::HEAD), at)?;
            let Head { seq, link } = h
                .kvs()
                .first()
                .and_then(|kv| keys::parse_head(kv.value()))
                .ok_or_else(|| self.corruption(0, "the head key is missing".into()))?;
            if seq >= before {
                return Err(self.corruption(before, format!("record {before} is missing below the head {seq}")));
            }
            return Ok(Cursor { next_seq: seq + 1, prev_link: link });
        };
        let (rec, used) = decode_frame(kv.value(), BODY_BYTES_HARD_MAX)
            .map_err(|e| self.corruption(before, format!("record {before} is damaged: {e:?}")))?;
        if used != kv.value().len() || rec.seq != before {
            return Err(self.corruption(before, format!("the key of record {before} holds another record")));
        }
        Ok(Cursor { next_seq: self.visit_from, prev_link: rec.link })
    }
}

impl RecordReader for EtcdReader {
    fn poll(&mut self, visit: &mut dyn FnMut(&RecordRef<'_>)) -> Result<u64> {
        let mut c = match self.cursor {
            Some(c) => c,
            None => {
                let c = self.start()?;
                self.cursor = Some(c);
                c
            }
        };
        let end = keys::prefix_end(&keys::key(&self.prefix, keys::RECORDS));
        let mut visited = 0;
        let mut pager = Pager::new();
        loop {
            let r = self.conn.get_page(keys::record(&self.prefix, c.next_seq), end.clone(), &mut pager)?;
            self.revision = r.header().map_or(self.revision, |h| h.revision());
            for kv in r.kvs() {
                let seq = c.next_seq;
                if keys::record_seq(&self.prefix, kv.key()) != Some(seq) {
                    return Err(self.corruption(seq, format!("record {seq} is missing: the next key is another")));
                }
                let (rec, used) = decode_frame(kv.value(), BODY_BYTES_HARD_MAX)
                    .map_err(|e| self.corruption(seq, format!("record {seq} is damaged: {e:?}")))?;
                if used != kv.value().len() || rec.seq != seq {
                    return Err(self.corruption(seq, format!("the key of record {seq} holds record {}", rec.seq)));
                }
                if chain_link(&c.prev_link, rec.seq, &rec.writer, rec.time_ms, rec.payload) != rec.link {
                    return Err(
                        self.corruption(seq, format!("record {seq}'s chain link does not follow record {}", seq - 1))
                    );
                }
                if seq >= self.visit_from {
                    visit(&rec);
                    visited += 1;
                }
                c = Cursor { next_seq: seq + 1, prev_link: rec.link };
                self.cursor = Some(c);
            }
            if !r.more() {
                return Ok(visited);
            }
        }
    }

    fn next_seq(&self) -> u64 {
        self.cursor.map_or(self.visit_from, |c| c.next_seq)
    }

    fn stopped_at_torn_tail(&self) -> bool {
        false // a Txn lands whole or not at all
    }

    fn prev_link(&self) -> ChainLink {
        self.cursor.map_or(GENESIS_LINK, |c| c.prev_link)
    }

    fn wait_for_more(&mut self, timeout: Duration) -> Result<()> {
        let head = keys::key(&self.prefix, keys::HEAD);
        self.conn.wait_change(head, self.revision, timeout).map(drop)
    }

    fn skip_own(&mut self, first_seq: u64, last_seq: u64, chain_head: ChainLink) {
        if self.cursor.map_or(self.visit_from, |c| c.next_seq) == first_seq && first_seq >= self.first {
            self.cursor = Some(Cursor { next_seq: last_seq + 1, prev_link: chain_head });
        }
    }
}

/// What a damaged frame read from a record key is called (the segment readers'
/// codes, `DamageKind::code`).
fn frame_damage(e: &crate::format::FrameError) -> ProblemKind {
    use crate::format::FrameError as F;
    ProblemKind::Frame(match e {
        F::Incomplete { .. } => DamageKind::Incomplete,
        F::LengthOutOfRange { .. } => DamageKind::LengthOutOfRange,
        F::Checksum { .. } => DamageKind::Checksum,
        F::Malformed => DamageKind::Malformed,
    })
}

impl EtcdBackend {
    /// Every record from `from_seq` on, as the inspector reads a log: each frame's
    /// length and CRC, its key against its sequence, the dense sequence, each
    /// chain link against the one before — damage reported (a [`super::Problem`],
    /// naming the record's key, offset 0) and the scan going on past it, so it
    /// decodes as much as it can; it never writes. A history archived before
    /// `from_seq` is a problem (`history_archived`): what is not there is never
    /// called intact. `on` returns `false` to stop.
    pub fn scan(&self, from_seq: u64, on: impl FnMut(super::ScanItem<'_>) -> bool) -> Result<super::ReadSummary> {
        let mut sum = super::ReadSummary::default();
        sum.chain_head = hex(&GENESIS_LINK);
        let mut scan = KeyScan { on, sum, stopped: false, next: 0, prev: None };
        // The head and the archive marker at one revision, and at that revision
        // whether any record key lies after the head. The pages are then read at
        // the newest revision, up to the head only: a record key never changes
        // once written (an archive deletes, and is seen by its marker), and a long
        // walk pinned to one revision would fail once etcd compacted it.
        let (head, revision) = self.read_head_at()?;
        let archived = self.read_archived_at(revision)?;
        let first = archived.map_or(1, |a| a.below_seq);
        let records_end = keys::prefix_end(&keys::key(&self.prefix, keys::RECORDS));
        let after_head = self
            .conn
            .get(
                keys::record(&self.prefix, head.seq + 1),
                Some(Self::at(revision).with_range(records_end).with_count_only()),
            )?
            .count() as u64;
        let from_seq = from_seq.max(1);
        if from_seq < first {
            let detail = format!(
                "the history before sequence {first} is archived (fencelog archive): it is not here, and is not \
                 verified; give the archive (--archive DIR) to read the whole history"
            );
            let p = problem(ProblemKind::HistoryArchived, &self.key_path(from_seq), 0, from_seq, false, 0, detail);
            scan.report(p);
        }
        let next = from_seq.max(first);
        // The link the next record must follow, when it is known.
        let prev: Option<ChainLink> = if next == first {
            Some(if first == 1 { GENESIS_LINK } else { archived.map_or(GENESIS_LINK, |a| a.link) })
        } else {
            let r = self.conn.get(keys::record(&self.prefix, next - 1), Some(Self::at(revision)))?;
            r.kvs()
                .first()
                .and_then(|kv| decode_frame(kv.value(), BODY_BYTES_HARD_MAX).ok())
                .filter(|(rec, _)| rec.seq == next - 1)
                .map(|(rec, _)| rec.link)
        };
        (scan.next, scan.prev) = (next, prev);
        self.scan_pages(&head, &mut scan)?;
        self.scan_head_end(&head, first, after_head, &mut scan);
        scan.sum.finish();
        Ok(scan.sum)
    }

    /// The page walk of [`EtcdBackend::scan`]: the record keys from `scan.next`
    /// up to the head's, page by page, each checked by [`EtcdBackend::scan_key`].
    fn scan_pages<F: FnMut(super::ScanItem<'_>) -> bool>(&self, head: &Head, scan: &mut KeyScan<F>) -> Result<()> {
        let end = keys::record(&self.prefix, head.seq + 1);
        let mut pager = Pager::new();
        'pages: while !scan.stopped && scan.next <= head.seq {
            let r = self.conn.get_page(keys::record(&self.prefix, scan.next), end.clone(), &mut pager)?;
            for kv in r.kvs() {
                if self.scan_key(kv, scan) {
                    break 'pages;
                }
            }
            if !r.more() {
                break;
            }
        }
        Ok(())
    }

    /// One record key of the walk: its name against the sequence expected, then
    /// its frame ([`KeyScan::intact_frame`]) and its chain link. Damage is reported
    /// and the walk goes on past it; an intact record is noted and visited.
    /// `true`: the walk stops here (`on` said so, at or before this record).
    fn scan_key<F: FnMut(super::ScanItem<'_>) -> bool>(
        &self,
        kv: &etcd_client::KeyValue,
        scan: &mut KeyScan<F>,
    ) -> bool {
        let next = scan.next;
        let path = std::path::PathBuf::from(format!(
            "{}{}",
            self.opts.describe(),
            String::from_utf8_lossy(kv.key().strip_prefix(self.prefix.as_slice()).unwrap_or(kv.key()))
        ));
        let bytes = kv.value().len() as u64;
        scan.sum.bytes += bytes;
        let Some(seq) = keys::record_seq(&self.prefix, kv.key()) else {
            let detail = "a key among the records that names no record (20 decimal digits)".into();
            scan.report(problem(ProblemKind::OddRecordKey, &path, 0, next, false, bytes, detail));
            return false;
        };
        if seq > next {
            let detail = format!("records {next}..={} are missing", seq - 1);
            scan.report(problem(ProblemKind::RecordsMissing, &path, 0, next, false, 0, detail));
            scan.prev = None;
        }
        let Some(rec) = scan.intact_frame(kv.value(), seq, &path, bytes) else { return false };
        if let Some(p) = scan.prev
            && chain_link(&p, rec.seq, &rec.writer, rec.time_ms, rec.payload) != rec.link
        {
            let detail = format!("record {seq}'s chain link does not follow record {}", seq - 1);
            let kind = ProblemKind::Frame(DamageKind::ChainMismatch);
            scan.report(problem(kind, &path, 0, seq, false, bytes, detail));
            (scan.next, scan.prev) = (seq + 1, Some(rec.link));
            return false;
        }
        scan.sum.note_record(&rec);
        (scan.next, scan.prev) = (seq + 1, Some(rec.link));
        if !(scan.on)(super::ScanItem::Record { rec: &rec, segment: &path, offset: 0 }) {
            scan.stopped = true;
        }
        scan.stopped
    }

    /// The head checks of [`EtcdBackend::scan`], once its walk has ended: the
    /// records end at the head, whose link is the last record's, and no record key
    /// lies after it (`after_head` of them were counted).
    fn scan_head_end<F: FnMut(super::ScanItem<'_>) -> bool>(
        &self,
        head: &Head,
        first: u64,
        after_head: u64,
        scan: &mut KeyScan<F>,
    ) {
        let next = scan.next;
        if !scan.stopped
            && next.saturating_sub(1) == head.seq
            && head.seq >= first
            && scan.prev.is_some_and(|l| l != head.link)
        {
            let detail = format!("the head names record {}'s chain link as another than the record's", head.seq);
            scan.report(problem(ProblemKind::HeadMismatch, &self.key_path(head.seq), 0, head.seq, false, 0, detail));
        }
        if !scan.stopped && next.saturating_sub(1) < head.seq && head.seq >= first {
            let detail = format!("the head names sequence {} but the records end at {}", head.seq, next - 1);
            scan.report(problem(ProblemKind::RecordsMissing, &self.key_path(next), 0, next, false, 0, detail));
        }
        if !scan.stopped && after_head > 0 {
            let detail = format!("{after_head} record keys lie after the head (sequence {})", head.seq);
            let p =
                problem(ProblemKind::RecordsAfterHead, &self.key_path(head.seq + 1), 0, head.seq + 1, false, 0, detail);
            scan.report(p);
        }
    }
}

/// A scan of the record keys under way ([`EtcdBackend::scan`]): what it reports
/// to, what it has found, and where it stands.
struct KeyScan<F> {
    on: F,
    sum: super::ReadSummary,
    /// `on` said to stop.
    stopped: bool,
    /// The sequence the next record key should name.
    next: u64,
    /// The link the next record must follow, when it is known.
    prev: Option<ChainLink>,
}

impl<F: FnMut(super::ScanItem<'_>) -> bool> KeyScan<F> {
    fn report(&mut self, p: super::Problem) {
        self.sum.problems.push(p);
        if !(self.on)(super::ScanItem::Damage(self.sum.problems.last().expect("pushed"))) {
            self.stopped = true;
        }
    }

    /// The record in the bytes of the key of record `seq`, if they are one whole
    /// frame carrying `seq`; else the damage is reported, and the walk goes on
    /// after it with no link to follow.
    fn intact_frame<'v>(
        &mut self,
        value: &'v [u8],
        seq: u64,
        path: &std::path::Path,
        bytes: u64,
    ) -> Option<RecordRef<'v>> {
        let rec = match decode_frame(value, BODY_BYTES_HARD_MAX) {
            Ok((rec, used)) if used == value.len() => rec,
            Ok(_) => {
                let detail = format!("record {seq}'s key holds bytes after its frame");
                let kind = ProblemKind::Frame(DamageKind::LengthMismatch);
                self.report(problem(kind, path, 0, seq, false, bytes, detail));
                (self.next, self.prev) = (seq + 1, None);
                return None;
            }
            Err(e) => {
                let detail = format!("damaged frame where sequence {seq} was expected: {e:?}");
                self.report(problem(frame_damage(&e), path, 0, seq, false, bytes, detail));
                (self.next, self.prev) = (seq + 1, None);
                return None;
            }
        };
        if rec.seq != seq {
            let detail = format!("expected sequence {seq} but found {}", rec.seq);
            let kind = ProblemKind::Frame(DamageKind::SequenceMismatch { found: rec.seq });
            self.report(problem(kind, path, 0, seq, false, bytes, detail));
            (self.next, self.prev) = (seq + 1, None);
            return None;
        }
        Some(rec)
    }
}

/// A log being moved into an empty prefix (`fencelog import`): records pushed in
/// order, byte for byte, in `Txn`s within etcd's limits, each comparing the head;
/// the prefix's marker goes in last, so that until the import is whole the prefix
/// is no log to anyone (`NOT_A_LOG`: nobody boots on part of a history).
pub struct Import {
    conn: Conn,
    opts: EtcdOptions,
    prefix: Vec<u8>,
    batch: Vec<(u64, Vec<u8>)>,
    batch_bytes: usize,
    /// The head as the last `Txn` left it.
    head: Head,
    last_link: ChainLink,
}

impl Import {
    /// Begin an import under `opts`' prefix, which must hold no key at all.
    pub fn begin(opts: &EtcdOptions) -> Result<Import> {
        let conn = Conn::connect(opts)?;
        let prefix = opts.prefix.as_bytes().to_vec();
        let any = conn.get(prefix.clone(), Some(GetOptions::new().with_prefix().with_count_only()))?;
        if any.count() > 0 {
            return Err(Error::InvalidOption {
                detail: format!(
                    "{} holds {} keys: a log is imported only into an empty prefix (delete them with `etcdctl del \
                     --prefix {}` if they are an interrupted import)",
                    opts.describe(),
                    any.count(),
                    opts.prefix
                ),
            });
        }
        let head_key = keys::key(&prefix, keys::HEAD);
        let txn = Txn::new()
            .when([Compare::create_revision(head_key.clone(), CompareOp::Equal, 0)])
            .and_then([TxnOp::put(head_key, keys::head_value(0, &GENESIS_LINK), None)]);
        if !conn.txn(txn)?.succeeded() {
            return Err(Error::InvalidOption { detail: format!("{} was written to meanwhile", opts.describe()) });
        }
        Ok(Import {
            conn,
            opts: opts.clone(),
            prefix,
            batch: vec![],
            batch_bytes: 0,
            head: Head { seq: 0, link: GENESIS_LINK },
            last_link: GENESIS_LINK,
        })
    }

    /// The next record: its frame as stored (it must fit one etcd request).
    pub fn push(&mut self, seq: u64, frame: Vec<u8>, link: &ChainLink) -> Result<()> {
        if frame.len() > GROUP_PAYLOAD_BYTES_MAX {
            return Err(Error::RecordTooLarge { bytes: frame.len() as u64, max: GROUP_PAYLOAD_BYTES_MAX as u64 });
        }
        if self.batch.len() == GROUP_RECORDS_MAX || self.batch_bytes + frame.len() > GROUP_PAYLOAD_BYTES_MAX {
            self.flush()?;
        }
        self.batch_bytes += frame.len();
        self.batch.push((seq, frame));
        self.last_link = *link;
        Ok(())
    }

    fn flush(&mut self) -> Result<()> {
        let Some(&(last, _)) = self.batch.last() else { return Ok(()) };
        let head_key = keys::key(&self.prefix, keys::HEAD);
        let mut ops: Vec<TxnOp> = std::mem::take(&mut self.batch)
            .into_iter()
            .map(|(seq, frame)| TxnOp::put(keys::record(&self.prefix, seq), frame, None))
            .collect();
        ops.push(TxnOp::put(head_key.clone(), keys::head_value(last, &self.last_link), None));
        let before = keys::head_value(self.head.seq, &self.head.link);
        let txn = Txn::new().when([Compare::value(head_key, CompareOp::Equal, before)]).and_then(ops);
        if !self.conn.txn(txn)?.succeeded() {
            return Err(Error::InvalidOption {
                detail: format!("{} was written to during the import", self.opts.describe()),
            });
        }
        self.head = Head { seq: last, link: self.last_link };
        self.batch_bytes = 0;
        Ok(())
    }

    /// Write what is left and the marker: the prefix is a log from now on.
    pub fn finish(mut self) -> Result<Head> {
        self.flush()?;
        let meta = Meta { fencelog_log: 1, format_version: FORMAT_VERSION, created_ms: LogOptions::default().now_ms() };
        let meta_key = keys::key(&self.prefix, keys::META);
        let txn = Txn::new()
            .when([Compare::create_revision(meta_key.clone(), CompareOp::Equal, 0)])
            .and_then([TxnOp::put(meta_key, serde_json::to_vec(&meta).expect("meta serializes"), None)]);
        if !self.conn.txn(txn)?.succeeded() {
            return Err(Error::InvalidOption { detail: format!("{} became a log meanwhile", self.opts.describe()) });
        }
        Ok(self.head)
    }
}
