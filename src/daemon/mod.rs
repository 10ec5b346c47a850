//! `daemon`: `fencelog serve` — the ledger over HTTP (axum, tokio).
//!
//! **Boot** = open (recover, verified snapshot, replay) → claim the home subject
//! with the daemon's own identity (a live owner: refused, exit 2, unless
//! `--handover`) → process recovery as the home's owner → one JSON line on stdout
//! when ready. **Serve**: every operation through `ops` / `supervisor` (the CLI's
//! code path, the CLI's bodies), bearer token on everything but `/healthz` and
//! `/readyz`, errors as `application/problem+json`. **Cutover** (SIGTERM, SIGINT,
//! `POST /v1/admin/cutover`, or the home lost): admission stops, admitted requests
//! get `--drain-grace-ms`, then the ledger drains so that every admitted request
//! is settled from the log, a `cutover` record lists how, and the home is released
//! last. See `docs/DAEMON.md`.

mod cutover;
mod http;
mod metrics;
pub mod openapi;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::ledger::{Ledger, LedgerOptions};
use crate::model::{OwnerRef, SettledRequest};
use crate::ops::{self, Caller, ClaimRequest, GenerationOp, GenerationRequest, OpError};

pub use http::{ROUTES, problem_status};

/// The home subject a daemon claims unless told otherwise (on a log shared by
/// hosts, [`home_default`]).
pub const HOME_DEFAULT: &str = "fencelog/serve";

/// The home a daemon claims by default: [`HOME_DEFAULT`] on a log on one host;
/// on a log shared by hosts one home per host, `fencelog/serve/HOST` (the host id,
/// `ledger::identity::host_id`): a daemon on each host, and a successor on the
/// same host takes the home of the one before it.
#[cfg_attr(not(feature = "etcd"), allow(unreachable_patterns))]
pub fn home_default(log: &crate::storage::Location) -> String {
    match log {
        crate::storage::Location::Dir(_) => HOME_DEFAULT.to_owned(),
        _ => format!("{HOME_DEFAULT}/{}", crate::ledger::identity::host_id()),
    }
}
/// The home's staleness: a daemon heartbeats it every quarter of this.
pub const HOME_STALE_AFTER_MS: u64 = 20_000;
/// Largest request body.
pub const BODY_BYTES_MAX: usize = 64 * 1024;
/// Requests being served at once; past it: 503 `OVERLOADED`, never a queue.
pub const CONCURRENT_REQUESTS_MAX: usize = 256;
/// Open connections at once; the next waits in the kernel's backlog until one
/// closes (descriptors are kept for the log).
pub const CONNECTIONS_MAX: usize = 512;
/// Open `/v1/watch` streams at once.
pub const WATCH_STREAMS_MAX: usize = 64;
/// Most process outputs streamed at once (`GET /v1/processes/{id}/logs`): a
/// download holds its slot until its last byte is taken, so it has slots of its
/// own, not the requests' (256 slow readers would otherwise starve every other
/// request, heartbeats included).
pub const LOG_STREAMS_MAX: usize = 32;
/// Longest wait for a client to take the next piece of a process's output before
/// its stream is ended (a reader that stopped reading frees its slot).
pub const LOG_SEND_TIMEOUT_MS: u64 = 30_000;
/// Longest wait a request may ask for over HTTP (`wait_ms`, `timeout_ms`).
pub const HTTP_WAIT_MS_MAX: u64 = 60_000;
/// Longest any request may take (watch streams excepted): above the longest wait
/// a request may ask for.
pub const REQUEST_TIME_MS_MAX: u64 = HTTP_WAIT_MS_MAX + 15_000;
/// Default `--drain-grace-ms`.
pub const DRAIN_GRACE_MS_DEFAULT: u64 = 5_000;
/// How long a cutover waits for the ledger to settle after the grace.
const DRAIN_SETTLE_MS: u64 = 10_000;
/// With `--handover`: how long to wait for the other daemon to release the home.
pub const HANDOVER_WAIT_MS: u64 = 30_000;
/// File (in the log directory) naming the address a live daemon listens on.
pub const ADDR_FILE: &str = "serve.addr";

/// Exit codes of `fencelog serve`.
pub mod exit {
    /// A cutover completed: every admitted request settled, the home released.
    pub const CUT_OVER: u8 = 0;
    /// Could not open the log or bind the address.
    pub const IO: u8 = 1;
    /// The home is held by a live daemon (and no `--handover`), or bad options.
    pub const HOME_HELD: u8 = 2;
    /// The home was taken from this daemon (its heartbeat was fenced): it stopped
    /// admitting at once and cut over without releasing what is no longer its own.
    pub const HOME_LOST: u8 = 5;
}

#[derive(Debug, Clone)]
pub struct ServeOptions {
    /// The daemon's local state (token, address, process output, runners' files):
    /// the log directory itself, or with a log in etcd a directory of this host's.
    pub dir: PathBuf,
    /// Where the log is: `dir`, or a prefix in an etcd cluster.
    pub log: crate::storage::Location,
    pub listen: SocketAddr,
    pub token_file: Option<PathBuf>,
    pub home: String,
    pub drain_grace_ms: u64,
    pub handover: bool,
    /// The fencelog binary runners are started from.
    pub self_exe: PathBuf,
    /// Staleness of the home claim (heartbeats every quarter of it).
    pub home_stale_after_ms: u64,
    /// Also listen on this Unix socket (mode 0600): its peers are callers on this
    /// host, known by the pid the kernel gives (`SO_PEERCRED`).
    pub unix: Option<PathBuf>,
    /// How long a client has to send a request's headers, on a new connection and
    /// between requests on a kept-alive one.
    pub header_read_timeout_ms: u64,
    /// One `info` line per request (target `fencelog::access`).
    pub access_log: bool,
}

/// Default of [`ServeOptions::header_read_timeout_ms`].
pub const HEADER_READ_TIMEOUT_MS_DEFAULT: u64 = 10_000;
/// Bounds of [`ServeOptions::header_read_timeout_ms`].
pub const HEADER_READ_TIMEOUT_MS_MIN: u64 = 100;
pub const HEADER_READ_TIMEOUT_MS_MAX: u64 = 600_000;

/// Bind the Unix socket at `path`, mode 0600. A socket file left by a daemon that
/// is gone (nothing accepts on it) is replaced; a live one, or a path that is not a
/// socket, is refused — nothing else is ever removed.
fn unix_path_usable(path: &Path) -> Result<(), OpError> {
    use std::os::unix::fs::FileTypeExt;
    match std::fs::symlink_metadata(path) {
        Ok(m) if !m.file_type().is_socket() => Err(OpError::Usage {
            code: "INVALID_OPTION",
            message: format!("--unix {}: exists and is not a socket; not replaced", path.display()),
        }),
        _ => Ok(()),
    }
}

/// The identity of a socket file this daemon bound (device, inode): at exit it
/// removes the path only if it is still that file (a successor may have bound its
/// own there during a handover).
fn file_id(path: &Path) -> Option<(u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    std::fs::symlink_metadata(path).ok().map(|m| (m.dev(), m.ino()))
}

fn bind_unix(path: &Path) -> Result<tokio::net::UnixListener, OpError> {
    use std::os::unix::fs::PermissionsExt;
    let usage = |message: String| OpError::Usage { code: "INVALID_OPTION", message };
    unix_path_usable(path)?;
    match std::fs::symlink_metadata(path) {
        Ok(_) if std::os::unix::net::UnixStream::connect(path).is_ok() => {
            return Err(usage(format!("--unix {}: a live server already listens there", path.display())));
        }
        Ok(_) => {
            std::fs::remove_file(path).map_err(|e| io(&format!("removing the stale socket {}", path.display()), e))?
        }
        Err(_) => {}
    }
    let listener = tokio::net::UnixListener::bind(path).map_err(|e| io(&format!("binding {}", path.display()), e))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))
        .map_err(|e| io(&format!("chmod 600 {}", path.display()), e))?;
    Ok(listener)
}

/// The one line printed when ready.
#[derive(Debug, Serialize)]
pub struct Ready {
    pub listening: String,
    pub home_generation: u64,
    pub replayed: u64,
    pub open_ms: u64,
    pub token_file: String,
    /// The `read` and `admin` tokens (`token_file` is the `write` one).
    pub read_token_file: String,
    pub admin_token_file: String,
    /// Where the log is: the directory, or `etcd:ENDPOINTS/PREFIX`.
    pub log: String,
    /// What the boot check of the service under the log warns about (etcd keeps
    /// every revision, …); none on a directory.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub warnings: Vec<String>,
    /// The Unix socket, when `--unix` was given.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub unix: Option<String>,
}

/// Shared state of a running daemon.
pub(crate) struct App {
    pub ledger: Arc<Ledger>,
    pub dir: PathBuf,
    pub self_exe: PathBuf,
    /// A runner started ahead of the next `/v1/run`.
    pub spares: crate::supervisor::Spares,
    tokens: Tokens,
    pub home: OwnerRef,
    /// Where the daemon is in its life ([`Phase`]; only ever forward).
    phase: std::sync::atomic::AtomicU8,
    /// The log cannot be written (the ledger is poisoned): not ready; exits 1.
    /// (A condition, not a phase: it can arise in any phase.)
    pub broken: AtomicBool,
    /// The service under the log (etcd) did not answer the last heartbeat: not
    /// ready, and why, until a heartbeat lands again.
    pub log_unavailable: Mutex<Option<String>>,
    /// The home was taken from this daemon (a condition: the cutover then does
    /// not release what is no longer its own).
    pub home_lost: AtomicBool,
    /// Set on entering [`Phase::Draining`]: ends the waits of `run` (the
    /// supervisor's API takes a flag).
    pub abort_waits: Arc<AtomicBool>,
    pub inflight: Arc<tokio::sync::Semaphore>,
    pub watchers: Arc<tokio::sync::Semaphore>,
    /// Slots of open connections ([`CONNECTIONS_MAX`], TCP and Unix together).
    pub connections: Arc<tokio::sync::Semaphore>,
    /// When the home's heartbeat last landed (the claim, at boot).
    pub home_heartbeat_landed: Mutex<Instant>,
    /// Slots of process output streams ([`LOG_STREAMS_MAX`]).
    pub log_streams: Arc<tokio::sync::Semaphore>,
    /// Admitted mutations not yet answered: ticket → (request id, operation).
    pub admitted: Mutex<BTreeMap<u64, (String, String)>>,
    pub next_ticket: AtomicU64,
    pub settled: Mutex<Vec<SettledRequest>>,
    pub shutdown: tokio::sync::watch::Sender<bool>,
    /// Starts the cutover.
    pub cutover_tx: tokio::sync::mpsc::Sender<CutoverAsked>,
    /// Tells watch streams to send their final event and close.
    pub watch_close: tokio::sync::watch::Sender<bool>,
    pub metrics: metrics::Metrics,
    /// `--access-log`: one line per request.
    pub access_log: bool,
    pub drain_grace_ms: u64,
}

/// Why `serve` could not start or go on: the exit code it ends with (`exit`) and
/// the error, as the CLI prints it.
#[derive(Debug)]
pub struct ServeFailure {
    pub exit: u8,
    pub error: OpError,
}

impl ServeFailure {
    pub fn new(exit: u8, error: OpError) -> ServeFailure {
        ServeFailure { exit, error }
    }

    /// With the exit code the error's class gives (`OpError::exit_code`).
    pub fn of(error: OpError) -> ServeFailure {
        ServeFailure { exit: error.exit_code(), error }
    }
}

/// A cutover asked for: why (the cutover record's `reason`), and whether the home
/// was lost (then it is not released: it is no longer this daemon's).
#[derive(Debug, Clone)]
pub(crate) struct CutoverAsked {
    pub reason: String,
    pub home_lost: bool,
}

impl CutoverAsked {
    pub fn because(reason: impl Into<String>) -> CutoverAsked {
        CutoverAsked { reason: reason.into(), home_lost: false }
    }
}

/// The daemon's life, in order; it only moves forward.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
#[repr(u8)]
pub(crate) enum Phase {
    /// New requests are admitted (readiness).
    Admitting = 0,
    /// A cutover began (or the home was lost, or the log became unwritable): no
    /// new request is admitted; those admitted are settled, each recording how
    /// it ended.
    Settling = 1,
    /// The waits of admitted runs end, and the ledger drains: every admitted
    /// request's answer is known.
    Draining = 2,
    /// The home is released (or was lost): the heartbeat stops; requests still
    /// arriving are refused.
    Released = 3,
}

impl App {
    pub fn phase(&self) -> Phase {
        match self.phase.load(Ordering::SeqCst) {
            0 => Phase::Admitting,
            1 => Phase::Settling,
            2 => Phase::Draining,
            _ => Phase::Released,
        }
    }

    /// Move on to `to` (a phase already passed stays passed: never backwards).
    pub fn advance(&self, to: Phase) {
        self.phase.fetch_max(to as u8, Ordering::SeqCst);
        if to >= Phase::Draining {
            self.abort_waits.store(true, Ordering::SeqCst);
        }
    }

    /// New requests are admitted.
    pub fn admitting(&self) -> bool {
        self.phase() == Phase::Admitting
    }

    /// Ready to admit requests (`/readyz` 200, `fencelog_ready` 1): admitting, the
    /// log writable, its service (etcd) answering the heartbeat.
    pub fn is_ready(&self) -> bool {
        self.admitting()
            && !self.broken.load(Ordering::SeqCst)
            && self.log_unavailable.lock().expect("log_unavailable").is_none()
    }

    /// Constant-time comparison of a presented bearer token.
    /// The scope of a presented token, if it is one of this daemon's (compared in
    /// constant time with each).
    pub fn scope_of(&self, presented: &[u8]) -> Option<Scope> {
        let same = |t: &[u8]| {
            presented.len() == t.len() && presented.iter().zip(t).fold(0u8, |acc, (a, b)| acc | (a ^ b)) == 0
        };
        let (admin, write, read) = (same(&self.tokens.admin), same(&self.tokens.write), same(&self.tokens.read));
        if admin {
            Some(Scope::Admin)
        } else if write {
            Some(Scope::Write)
        } else if read {
            Some(Scope::Read)
        } else {
            None
        }
    }
}

fn io(what: &str, e: impl std::fmt::Display) -> OpError {
    OpError::Io { message: format!("{what}: {e}") }
}

/// What a bearer token may do. Each scope includes the one before it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Scope {
    /// Every GET, `/v1/watch`, `/metrics`: what a dashboard or Prometheus holds.
    Read,
    /// And the mutations and runs.
    Write,
    /// And `/v1/admin/*` (a cutover).
    Admin,
}

impl Scope {
    pub fn name(self) -> &'static str {
        match self {
            Scope::Read => "read",
            Scope::Write => "write",
            Scope::Admin => "admin",
        }
    }
}

/// The daemon's three tokens, one per [`Scope`].
pub(crate) struct Tokens {
    pub read: Vec<u8>,
    pub write: Vec<u8>,
    pub admin: Vec<u8>,
}

/// The token files: `--token-file` (or `DIR/serve.token`) for `write`,
/// `DIR/serve.read.token` and `DIR/serve.admin.token`; each made 0600 on first
/// start, each refused when others may read or write it.
fn load_tokens(dir: &Path, token_file: Option<&Path>) -> Result<(Tokens, PathBuf), OpError> {
    let (write, write_path) = load_token(dir, token_file)?;
    let (read, _) = load_token(dir, Some(&dir.join(crate::storage::SERVE_READ_TOKEN_FILE))).or_else(|e| match e {
        OpError::Io { .. } if !dir.join(crate::storage::SERVE_READ_TOKEN_FILE).exists() => {
            create_token(&dir.join(crate::storage::SERVE_READ_TOKEN_FILE))
        }
        e => Err(e),
    })?;
    let admin_path = dir.join(crate::storage::SERVE_ADMIN_TOKEN_FILE);
    let (admin, _) = load_token(dir, Some(&admin_path)).or_else(|e| match e {
        OpError::Io { .. } if !admin_path.exists() => create_token(&admin_path),
        e => Err(e),
    })?;
    if read == write || admin == write || read == admin {
        return Err(OpError::Usage {
            code: "INVALID_TOKEN_FILE",
            message: "the read, write and admin tokens must differ".into(),
        });
    }
    Ok((Tokens { read, write, admin }, write_path))
}

/// A token file: `token_file`, or `DIR/serve.token` (created 0600 on first start).
fn load_token(dir: &Path, token_file: Option<&Path>) -> Result<(Vec<u8>, PathBuf), OpError> {
    use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
    let path = token_file.map_or_else(|| dir.join(crate::storage::SERVE_TOKEN_FILE), Path::to_path_buf);
    // A symlink is followed (a secret mounted by an orchestrator is one); the mode
    // checked is the file's own.
    let opened = std::fs::OpenOptions::new().read(true).custom_flags(libc::O_NONBLOCK).open(&path);
    let read = opened.and_then(|mut f| {
        let meta = f.metadata()?;
        let mut text = String::new();
        std::io::Read::read_to_string(&mut std::io::Read::take(&mut f, 4096), &mut text)?;
        Ok((meta, text))
    });
    match read {
        // As ssh refuses a private key others can read: whoever reads the token
        // can act with it.
        Ok((meta, _)) if meta.mode() & 0o077 != 0 || !meta.is_file() => {
            return Err(OpError::Usage {
                code: "INVALID_TOKEN_FILE",
                message: format!(
                    "{} may be read or written by others (mode {:04o}), or is not a regular file: chmod 600 it",
                    path.display(),
                    meta.mode() & 0o7777
                ),
            });
        }
        Ok((_, t)) if t.trim().len() >= 16 && t.trim().bytes().all(|b| b.is_ascii_graphic()) => {
            return Ok((t.trim().as_bytes().to_vec(), path));
        }
        Ok(_) => {
            return Err(OpError::Usage {
                code: "INVALID_TOKEN_FILE",
                message: format!(
                    "{} holds no token: one line of at least 16 printable ASCII characters",
                    path.display()
                ),
            });
        }
        Err(e) if e.kind() != std::io::ErrorKind::NotFound || token_file.is_some() => {
            return Err(io(&format!("reading {}", path.display()), e));
        }
        Err(_) => {}
    }
    create_token(&path)
}

/// A new random token in `path` (0600; never over an existing file).
fn create_token(path: &Path) -> Result<(Vec<u8>, PathBuf), OpError> {
    let path = path.to_path_buf();
    let token = format!("{}{}", uuid::Uuid::new_v4().simple(), uuid::Uuid::new_v4().simple());
    // Whole or not at all: a crash never leaves an empty token file that the next
    // start would refuse.
    match crate::storage::create_file_whole(&path, token.as_bytes()) {
        Ok(true) => {}
        Ok(false) => return load_token(path.parent().unwrap_or(Path::new(".")), Some(&path)),
        Err(e) => return Err(io(&format!("creating {}", path.display()), e)),
    }
    Ok((token.into_bytes(), path))
}

/// Ask the daemon named in `DIR/serve.addr` to cut over.
fn ask_cutover(dir: &Path, token: &[u8]) -> Result<(), String> {
    use std::io::{Read, Write};
    let addr = std::fs::read_to_string(dir.join(ADDR_FILE)).map_err(|e| format!("{ADDR_FILE}: {e}"))?;
    let mut s = std::net::TcpStream::connect_timeout(
        &addr.trim().parse().map_err(|e| format!("{ADDR_FILE}: {e}"))?,
        Duration::from_secs(2),
    )
    .map_err(|e| format!("connecting to {}: {e}", addr.trim()))?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok();
    let token = String::from_utf8_lossy(token);
    // Void after 5 s: if this daemon gives up waiting for the answer, a request
    // still queued in the socket must not cut the other over later.
    let not_after_ms = crate::storage::LogOptions::default().now_ms() + 5_000;
    write!(
        s,
        "POST /v1/admin/cutover?not_after_ms={not_after_ms} HTTP/1.1\r\nHost: {}\r\nAuthorization: Bearer {token}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
        addr.trim()
    )
    .map_err(|e| e.to_string())?;
    let mut head = [0u8; 12];
    s.read_exact(&mut head).map_err(|e| e.to_string())?;
    if &head[9..12] != b"202" && &head[9..12] != b"200" {
        return Err(format!("the daemon answered {}", String::from_utf8_lossy(&head)));
    }
    Ok(())
}

/// Claim the home subject for this process; with `handover`, ask the live owner
/// to cut over and claim it the moment it is released.
fn claim_home(ledger: &Ledger, o: &ServeOptions, tokens: &Tokens) -> Result<u64, ServeFailure> {
    let me = std::process::id();
    let req = ClaimRequest {
        subject: o.home.clone(),
        pid: Some(me),
        instance: Some(ledger.writer_id()),
        stale_after_ms: o.home_stale_after_ms,
        action: None,
        request_id: None,
    };
    let caller = Caller { default_pid: Some(me), remote: false };
    let deadline = Instant::now() + Duration::from_millis(HANDOVER_WAIT_MS);
    let mut asked = false;
    loop {
        match ops::claim(ledger, &req, caller) {
            Ok(r) => {
                let generation = r.outcome.0.to_json()["generation"].as_u64().unwrap_or(0);
                return Ok(generation);
            }
            Err(e @ OpError::Refused(crate::model::Refusal::AlreadyActive { .. }))
            | Err(e @ OpError::Refused(crate::model::Refusal::StaleRequiresTakeover { .. })) => {
                if !o.handover || Instant::now() >= deadline {
                    return Err(ServeFailure::new(exit::HOME_HELD, e));
                }
                if !asked {
                    // The admin token; a daemon of a build before token scopes knows
                    // only `serve.token` (401 to the admin one): then that one.
                    let asked_admin = ask_cutover(&o.dir, &tokens.admin);
                    let answer = match asked_admin {
                        Err(why) if why.contains(" 401") => ask_cutover(&o.dir, &tokens.write),
                        other => other,
                    };
                    answer.map_err(|why| {
                        ServeFailure::new(
                            exit::HOME_HELD,
                            OpError::Io { message: format!("--handover: cannot ask for a cutover: {why}") },
                        )
                    })?;
                    asked = true;
                }
                std::thread::sleep(Duration::from_millis(2));
            }
            Err(e) => return Err(ServeFailure::new(exit::IO, e)),
        }
    }
}

/// Run the daemon until it has cut over; returns the exit code. Boot failures are
/// printed as the CLI prints errors (by the caller) with their exit code.
pub fn serve(o: ServeOptions) -> Result<u8, ServeFailure> {
    let t0 = Instant::now();
    limit_malloc_arenas();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .max_blocking_threads(CONCURRENT_REQUESTS_MAX + WATCH_STREAMS_MAX + 16)
        .enable_all()
        .build()
        .map_err(|e| ServeFailure::new(exit::IO, io("starting the runtime", e)))?;
    // The signal handlers first, before anything is claimed or announced: a
    // SIGTERM from the moment the ready line (or READY=1) is out — or earlier,
    // during boot — is a cutover, never the default action that kills the daemon
    // with its home held.
    let stop_signals = install_stop_signals(&runtime)?;
    let Booted { dir, log, ledger, warnings, replayed, tokens, token_path, generation, home } = boot(&o)?;

    runtime.block_on(async move {
        let Bound { listener, addr, unix, unix_id } = bind(&o, &dir).await?;
        let (shutdown, _) = tokio::sync::watch::channel(false);
        let (cut_tx, mut cut_rx) = tokio::sync::mpsc::channel::<CutoverAsked>(4);
        let app = Arc::new(App::new(&o, Arc::clone(&ledger), dir.clone(), tokens, home, shutdown, cut_tx.clone()));
        let ready = Ready {
            listening: addr.to_string(),
            home_generation: generation,
            replayed,
            open_ms: t0.elapsed().as_millis() as u64,
            token_file: token_path.display().to_string(),
            read_token_file: dir.join(crate::storage::SERVE_READ_TOKEN_FILE).display().to_string(),
            admin_token_file: dir.join(crate::storage::SERVE_ADMIN_TOKEN_FILE).display().to_string(),
            log: log.describe(),
            warnings,
            unix: o.unix.as_ref().map(|p| p.display().to_string()),
        };
        announce(&app, &ready);
        let code = serve_until_cutover(&app, &o, (listener, unix), stop_signals, cut_tx, &mut cut_rx).await;
        remove_own_files(&dir, addr, o.unix.as_deref(), unix_id);
        Ok(code)
    })
}

/// SIGTERM and SIGINT, caught from now on (in `runtime`); see [`signals`].
fn install_stop_signals(
    runtime: &tokio::runtime::Runtime,
) -> Result<(tokio::signal::unix::Signal, tokio::signal::unix::Signal), ServeFailure> {
    use tokio::signal::unix::{SignalKind, signal};
    let _in_runtime = runtime.enter();
    match (signal(SignalKind::terminate()), signal(SignalKind::interrupt())) {
        (Ok(term), Ok(int)) => Ok((term, int)),
        (Err(e), _) | (_, Err(e)) => Err(ServeFailure::new(exit::IO, io("installing the signal handlers", e))),
    }
}

/// What the boot opened, claimed and recovered: what the daemon then serves.
struct Booted {
    /// The daemon's directory, canonical.
    dir: PathBuf,
    log: crate::storage::Location,
    ledger: Arc<Ledger>,
    /// The boot check's warnings about the service under the log.
    warnings: Vec<String>,
    replayed: u64,
    tokens: Tokens,
    /// The `write` token's file.
    token_path: PathBuf,
    /// The generation of the home claimed.
    generation: u64,
    home: OwnerRef,
}

/// The boot, before anything is bound: the directory, the log opened (recovered,
/// replayed) and its service checked, the tokens, the home claimed, the processes
/// recovered as the home's owner.
fn boot(o: &ServeOptions) -> Result<Booted, ServeFailure> {
    let fail = |code: u8| move |e: OpError| ServeFailure::new(code, e);
    // A --unix path that is not a socket is refused before anything is claimed.
    if let Some(path) = &o.unix {
        unix_path_usable(path).map_err(|e| ServeFailure::new(exit::HOME_HELD, e))?;
    }
    // Created 0700, as `init` creates a log (the directory is refused when group-
    // or world-writable: under umask 002 a plain create_dir_all made one).
    {
        use std::os::unix::fs::DirBuilderExt;
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&o.dir)
            .map_err(|e| ServeFailure::new(exit::IO, io(&format!("creating {}", o.dir.display()), e)))?;
    }
    let dir = std::fs::canonicalize(&o.dir).map_err(|e| ServeFailure::new(exit::IO, io("log directory", e)))?;
    #[cfg_attr(not(feature = "etcd"), allow(unreachable_patterns))]
    let log = match &o.log {
        crate::storage::Location::Dir(_) => crate::storage::Location::Dir(dir.clone()),
        other => other.clone(),
    };
    // The daemon's allocator policy: glibc keeps freed heap pages unless asked,
    // and a snapshot frees a copy of the whole state (about twice its size).
    let opts =
        LedgerOptions { after_snapshot: Some(crate::sys::memory::release_free_memory), ..LedgerOptions::default() };
    let ledger = Arc::new(Ledger::open_at(&log, opts).map_err(|e| ServeFailure::of(OpError::from(e)))?);
    let warnings = ledger.backend().check_service().map_err(|e| {
        let e = OpError::from(crate::ledger::LedgerError::Storage(e));
        ServeFailure::new(exit::IO, e)
    })?;
    for w in &warnings {
        tracing::warn!("{w}");
    }
    let replayed = ledger.open_report().replayed_records;
    let (tokens, token_path) = load_tokens(&dir, o.token_file.as_deref()).map_err(ServeFailure::of)?;
    // A handover asks the daemon before with the admin token (a cutover is admin).
    let generation = claim_home(&ledger, o, &tokens)?;
    let home = OwnerRef { subject: o.home.clone(), generation };
    let now_ms = crate::storage::LogOptions::default().now_ms();
    let recovered =
        crate::supervisor::recover(&ledger, crate::supervisor::PRESPAWN_GRACE_MS_DEFAULT, now_ms, Some(&home))
            .map_err(fail(exit::IO))?;
    for (decision, processes) in recovered.decisions() {
        for process in processes {
            tracing::info!(decision, process, "process recovery");
        }
    }
    Ok(Booted { dir, log, ledger, warnings, replayed, tokens, token_path, generation, home })
}

/// The listeners bound: TCP (its address written to `DIR/serve.addr`), and the
/// Unix socket with its file's identity when `--unix` was given.
struct Bound {
    listener: tokio::net::TcpListener,
    addr: SocketAddr,
    unix: Option<tokio::net::UnixListener>,
    unix_id: Option<(u64, u64)>,
}

/// Bind the listeners, then name the TCP address in `DIR/serve.addr`.
async fn bind(o: &ServeOptions, dir: &Path) -> Result<Bound, ServeFailure> {
    let listener = tokio::net::TcpListener::bind(o.listen)
        .await
        .map_err(|e| ServeFailure::new(exit::IO, io(&format!("binding {}", o.listen), e)))?;
    let addr = listener.local_addr().map_err(|e| ServeFailure::new(exit::IO, io("local address", e)))?;
    let unix = match &o.unix {
        Some(path) => Some(
            bind_unix(path)
                .map_err(|e| ServeFailure::new(if e.exit_code() == 2 { exit::HOME_HELD } else { exit::IO }, e))?,
        ),
        None => None,
    };
    let unix_id = o.unix.as_deref().and_then(file_id);
    std::fs::write(dir.join(ADDR_FILE), addr.to_string()).map_err(|e| ServeFailure::new(exit::IO, io(ADDR_FILE, e)))?;
    Ok(Bound { listener, addr, unix, unix_id })
}

impl App {
    /// A daemon's state as it starts serving: admitting, nothing admitted yet.
    fn new(
        o: &ServeOptions,
        ledger: Arc<Ledger>,
        dir: PathBuf,
        tokens: Tokens,
        home: OwnerRef,
        shutdown: tokio::sync::watch::Sender<bool>,
        cutover_tx: tokio::sync::mpsc::Sender<CutoverAsked>,
    ) -> App {
        App {
            ledger,
            dir,
            self_exe: o.self_exe.clone(),
            spares: crate::supervisor::Spares::new(),
            tokens,
            home,
            phase: std::sync::atomic::AtomicU8::new(Phase::Admitting as u8),
            broken: AtomicBool::new(false),
            log_unavailable: Mutex::new(None),
            home_lost: AtomicBool::new(false),
            abort_waits: Arc::new(AtomicBool::new(false)),
            inflight: Arc::new(tokio::sync::Semaphore::new(CONCURRENT_REQUESTS_MAX)),
            watchers: Arc::new(tokio::sync::Semaphore::new(WATCH_STREAMS_MAX)),
            connections: Arc::new(tokio::sync::Semaphore::new(CONNECTIONS_MAX)),
            home_heartbeat_landed: Mutex::new(Instant::now()),
            log_streams: Arc::new(tokio::sync::Semaphore::new(LOG_STREAMS_MAX)),
            admitted: Mutex::new(BTreeMap::new()),
            next_ticket: AtomicU64::new(1),
            settled: Mutex::new(Vec::new()),
            shutdown,
            cutover_tx,
            watch_close: tokio::sync::watch::channel(false).0,
            metrics: metrics::Metrics::new(),
            access_log: o.access_log,
            drain_grace_ms: o.drain_grace_ms,
        }
    }
}

/// Say the daemon is ready: the ready line on stdout, the `ready` log line, and
/// `READY=1` to systemd.
fn announce(app: &App, ready: &Ready) {
    {
        use std::io::Write;
        let mut out = std::io::stdout().lock();
        let _ = writeln!(out, "{}", serde_json::to_string(ready).expect("ready line")).and_then(|_| out.flush());
    }
    let report = ledger_report(&app.ledger);
    tracing::info!(
        log = %ready.log,
        replayed = ready.replayed,
        snapshot_seq = report.0,
        head_seq = report.1,
        home = %app.home.subject,
        generation = app.home.generation,
        listening = %ready.listening,
        open_ms = ready.open_ms,
        "ready"
    );
    sd_notify("READY=1");
}

/// Serve on the listeners until a cutover is asked for, cut over, and stop the
/// server (waiting up to 5 s for it); returns the exit code.
async fn serve_until_cutover(
    app: &Arc<App>,
    o: &ServeOptions,
    (listener, unix): (tokio::net::TcpListener, Option<tokio::net::UnixListener>),
    stop_signals: (tokio::signal::unix::Signal, tokio::signal::unix::Signal),
    cut_tx: tokio::sync::mpsc::Sender<CutoverAsked>,
    cut_rx: &mut tokio::sync::mpsc::Receiver<CutoverAsked>,
) -> u8 {
    // Signals and a lost home start the cutover; so does POST /v1/admin/cutover.
    tokio::spawn(signals(stop_signals, cut_tx.clone()));
    tokio::spawn(heartbeat(Arc::clone(app), cut_tx, o.home_stale_after_ms));
    let router = http::router(Arc::clone(app));
    let slots = Arc::clone(&app.connections);
    let tcp = http::CappedListener { inner: listener, slots: Arc::clone(&slots) };
    let unix = unix.map(|inner| http::UnixCapped { inner, slots });
    let header_read = Duration::from_millis(o.header_read_timeout_ms);
    let done = app.shutdown.subscribe();
    let server = tokio::spawn(http::serve(tcp, unix, router, header_read, done, o.access_log));
    let CutoverAsked { reason, home_lost } =
        cut_rx.recv().await.unwrap_or_else(|| CutoverAsked::because("channel closed"));
    let code = cutover::cutover(app, &reason, home_lost).await;
    let _ = app.shutdown.send(true);
    let _ = tokio::time::timeout(Duration::from_secs(5), server).await;
    code
}

/// At exit: `DIR/serve.addr` and the Unix socket are removed, each only if it is
/// still this daemon's.
fn remove_own_files(dir: &Path, addr: SocketAddr, unix: Option<&Path>, unix_id: Option<(u64, u64)>) {
    // Only if it still names this daemon (a successor may have written its own).
    if std::fs::read_to_string(dir.join(ADDR_FILE)).is_ok_and(|a| a.trim() == addr.to_string()) {
        let _ = std::fs::remove_file(dir.join(ADDR_FILE));
    }
    if let Some(path) = unix
        && unix_id.is_some()
        && file_id(path) == unix_id
    {
        let _ = std::fs::remove_file(path);
    }
}

/// For a daemon embedded in a program that allocates with glibc's malloc (the
/// `fencelog` binary itself allocates with mimalloc, where these settings are
/// inert). glibc gives each thread that allocates an arena of its own, up to eight per
/// core; the daemon's request threads (a blocking pool of a few hundred) then keep
/// hundreds of MiB of freed memory between them (measured: 506 MiB resident with
/// 100,000 subjects, 224 MiB with one arena). Two arenas keep the memory; the
/// allocations that matter are the ledger's, under its own lock anyway.
///
/// Fast bins are off: every request's 8 KiB read buffer (hyper's) is a "large"
/// allocation, and each one first merged every freed small chunk of the arena
/// (`malloc_consolidate`: 2–3% of the daemon's time at 64 clients, with malloc
/// and free 18% in all); small allocations still come from the per-thread cache.
fn limit_malloc_arenas() {
    // Called before any thread of the daemon is started.
    crate::sys::memory::limit_malloc_arenas(MALLOC_ARENAS_MAX);
}

/// Most glibc malloc arenas in the daemon (see [`limit_malloc_arenas`]).
pub const MALLOC_ARENAS_MAX: i32 = 2;

/// systemd's watchdog period for this process, in ms (`$WATCHDOG_USEC`, when
/// `$WATCHDOG_PID` is unset or names this process), if one is asked for.
fn watchdog_ms() -> Option<u64> {
    let usec: u64 = std::env::var("WATCHDOG_USEC").ok()?.trim().parse().ok()?;
    if let Ok(pid) = std::env::var("WATCHDOG_PID")
        && pid.trim().parse::<u32>().ok() != Some(std::process::id())
    {
        return None;
    }
    (usec > 0).then(|| (usec / 1000).max(1))
}

/// systemd's readiness protocol: a datagram to `$NOTIFY_SOCKET` (a path, or `@`
/// for the abstract namespace), if it is set; otherwise nothing.
pub fn sd_notify(state: &str) {
    use std::os::unix::net::UnixDatagram;
    let Some(path) = std::env::var_os("NOTIFY_SOCKET") else { return };
    let Ok(sock) = UnixDatagram::unbound() else { return };
    let bytes = std::os::unix::ffi::OsStrExt::as_bytes(path.as_os_str()).to_vec();
    let sent = if let Some(name) = bytes.strip_prefix(b"@") {
        use std::os::linux::net::SocketAddrExt;
        std::os::unix::net::SocketAddr::from_abstract_name(name).and_then(|a| sock.send_to_addr(state.as_bytes(), &a))
    } else {
        sock.send_to(state.as_bytes(), &path)
    };
    if let Err(e) = sent {
        tracing::warn!("sd_notify {state}: {e}");
    }
}

/// SIGTERM or SIGINT (handlers installed at the start of `serve`) starts the cutover.
async fn signals(
    (mut term, mut int): (tokio::signal::unix::Signal, tokio::signal::unix::Signal),
    cut: tokio::sync::mpsc::Sender<CutoverAsked>,
) {
    let why = tokio::select! {
        _ = term.recv() => "SIGTERM",
        _ = int.recv() => "SIGINT",
    };
    let _ = cut.send(CutoverAsked::because(why)).await;
}

/// Heartbeat the home every quarter of its staleness; a fenced heartbeat means the
/// home was taken: stop admitting at once and cut over.
///
/// Under systemd's watchdog (`WatchdogSec=`: `$WATCHDOG_USEC`) each turn of this
/// loop that got an answer — the heartbeat landed, or the log's service said it
/// is unavailable — also sends `WATCHDOG=1`, and the loop turns at least twice
/// per watchdog period: a daemon whose heartbeat hangs (a stuck disk, a deadlock)
/// stops the pings and systemd restarts it.
async fn heartbeat(app: Arc<App>, cut: tokio::sync::mpsc::Sender<CutoverAsked>, stale_after_ms: u64) {
    let watchdog_ms = watchdog_ms();
    let mut period_ms = (stale_after_ms / 4).max(10);
    if let Some(w) = watchdog_ms {
        period_ms = period_ms.min((w / 2).max(10));
    }
    let mut tick = tokio::time::interval(Duration::from_millis(period_ms));
    // After a heartbeat that took long (etcd unreachable: up to its request
    // deadline), the next comes a period later — not a burst of the ticks missed
    // meanwhile, back to back, each taking the commit engine's turn from the
    // requests waiting for one.
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tick.tick().await;
    loop {
        tick.tick().await;
        if app.phase() == Phase::Released {
            return;
        }
        let (ledger, home) = (Arc::clone(&app.ledger), app.home.clone());
        let r = tokio::task::spawn_blocking(move || {
            let req = GenerationRequest {
                subject: home.subject,
                generation: home.generation,
                request_id: None,
                instance: None,
            };
            ops::generation(&ledger, GenerationOp::Heartbeat, &req, Caller::default())
        })
        .await;
        let unavailable = match &r {
            Ok(Err(OpError::Ledger(crate::ledger::LedgerError::Storage(s)))) if s.is_transient() => Some(s.to_string()),
            _ => None,
        };
        *app.log_unavailable.lock().expect("log_unavailable") = unavailable.clone();
        if matches!(r, Ok(Ok(_))) {
            *app.home_heartbeat_landed.lock().expect("heartbeat") = Instant::now();
        }
        if watchdog_ms.is_some() && (unavailable.is_some() || matches!(r, Ok(Ok(_)))) {
            sd_notify("WATCHDOG=1");
        }
        match r {
            // etcd unreachable or without quorum: the heartbeat goes on trying (a
            // home taken meanwhile is found by the first heartbeat that lands:
            // FENCED, and the cutover below).
            _ if unavailable.is_some() => {
                tracing::warn!("the home's heartbeat did not land: {}", unavailable.unwrap_or_default());
            }
            Ok(Err(OpError::Refused(r))) => {
                tracing::error!("the home was taken: {r}; cutting over");
                app.home_lost.store(true, Ordering::SeqCst);
                app.advance(Phase::Settling);
                let _ = cut.send(CutoverAsked { reason: format!("home lost: {r}"), home_lost: true }).await;
                return;
            }
            // A storage failure (the ledger is poisoned); not a transient refusal
            // or contention, which the next heartbeat retries.
            Ok(Err(e @ OpError::Ledger(crate::ledger::LedgerError::Storage(_)))) => {
                tracing::error!("the home's heartbeat cannot be written: {e}; cutting over");
                app.broken.store(true, Ordering::SeqCst);
                app.advance(Phase::Settling);
                let _ = cut.send(CutoverAsked::because(format!("log unwritable: {e}"))).await;
                return;
            }
            _ => {}
        }
    }
}

/// (snapshot the boot started from, last sequence) for the boot line.
fn ledger_report(ledger: &Ledger) -> (u64, u64) {
    let r = ledger.open_report();
    (r.snapshot_seq.unwrap_or(0), ledger.head().map(|h| h.seq).unwrap_or(0))
}
