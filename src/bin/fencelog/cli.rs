//! Command-line arguments (clap): what each command accepts, nothing else.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand, ValueEnum};

#[derive(Parser)]
#[command(name = "fencelog", version, about = "A durable, hash-chained ownership ledger")]
pub(crate) struct Cli {
    #[command(subcommand)]
    pub(crate) cmd: Cmd,
    /// More diagnostics on stderr (-v: what opening the log found and did; -vv:
    /// debug). `RUST_LOG` overrides. Warnings (repairs, ignored snapshots) always show.
    #[arg(short, long, action = clap::ArgAction::Count, global = true)]
    pub(crate) verbose: u8,
    /// Diagnostics on stderr as text, or as JSON (one object per line).
    #[arg(long, env = "FENCELOG_LOG_FORMAT", value_enum, default_value = "text", global = true)]
    pub(crate) log_format: LogFormat,
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum LogFormat {
    Text,
    Json,
}

#[derive(Args, Clone)]
pub(crate) struct Dir {
    /// Log directory (required unless --server or --etcd). With --etcd: this host's
    /// local state instead (process output, runners' logs, keys, the daemon's
    /// token), needed by `run`, `process logs` and `serve`.
    #[arg(long, env = "FENCELOG_DIR", required_unless_present_any = ["server", "etcd"])]
    pub(crate) dir: Option<PathBuf>,
    /// The log in an etcd cluster instead of a directory: its members' HOST:PORT,
    /// comma-separated (requests time out after 5 s: ETCD_UNAVAILABLE).
    #[arg(long, env = "FENCELOG_ETCD", conflicts_with = "server")]
    pub(crate) etcd: Option<String>,
    /// The key prefix of the log in etcd.
    #[arg(long, env = "FENCELOG_ETCD_PREFIX", default_value = fencelog::storage::etcd::DEFAULT_PREFIX)]
    pub(crate) etcd_prefix: String,
    /// Send the operation to a daemon (`fencelog serve`) at URL instead of opening
    /// the directory: the same JSON, the same exit codes.
    #[arg(long, env = "FENCELOG_SERVER")]
    pub(crate) server: Option<String>,
    /// The daemon's bearer token (with `serve`: the token it uses; default
    /// DIR/serve.token, created 0600 on first start).
    #[arg(long, env = "FENCELOG_TOKEN_FILE")]
    pub(crate) token_file: Option<PathBuf>,
}

impl Dir {
    /// The log directory — or, with `--etcd`, the local state directory (present:
    /// clap requires one of `--dir`, `--server`, `--etcd`; see `state_dir`).
    pub(crate) fn path(&self) -> &std::path::Path {
        self.dir.as_deref().unwrap_or(std::path::Path::new(""))
    }

    /// Where the log is: the directory, or the etcd cluster and prefix.
    pub(crate) fn location(&self) -> Result<fencelog::storage::Location, fencelog::ops::OpError> {
        use fencelog::storage::{Location, etcd::EtcdOptions};
        match &self.etcd {
            Some(endpoints) => Ok(Location::Etcd(EtcdOptions::parse(endpoints, &self.etcd_prefix)?)),
            None => Ok(Location::Dir(self.path().to_path_buf())),
        }
    }

    /// The directory of this host's files of the log (the log directory itself,
    /// or with `--etcd` the one `--dir` names), for commands that need it.
    pub(crate) fn state_dir(&self, what: &str) -> Result<&std::path::Path, fencelog::ops::OpError> {
        match &self.dir {
            Some(d) if !d.as_os_str().is_empty() => Ok(d),
            _ => Err(fencelog::ops::OpError::Usage {
                code: "USAGE",
                message: format!(
                    "{what} needs --dir DIR: with --etcd, the directory of this host's local state (process \
                     output, runners' logs, keys)"
                ),
            }),
        }
    }
}

/// A log in etcd (required).
/// Where `serve` keeps its state and its log: no `--server` (it is the server).
#[derive(Args, Clone)]
pub(crate) struct ServeDir {
    /// The daemon's directory: the log itself (created 0700 on first start if
    /// missing or empty), its token and process output. With --etcd: this host's
    /// local state only (token, process output, runners), the log in etcd.
    #[arg(long, env = "FENCELOG_DIR")]
    pub(crate) dir: PathBuf,
    /// The log in an etcd cluster instead of the directory: its members'
    /// HOST:PORT, comma-separated (requests time out after 5 s: ETCD_UNAVAILABLE).
    #[arg(long, env = "FENCELOG_ETCD")]
    pub(crate) etcd: Option<String>,
    /// The key prefix of the log in etcd.
    #[arg(long, env = "FENCELOG_ETCD_PREFIX", default_value = fencelog::storage::etcd::DEFAULT_PREFIX)]
    pub(crate) etcd_prefix: String,
    /// The bearer token file (default: DIR/serve.token, generated 0600 on first
    /// start).
    #[arg(long, env = "FENCELOG_TOKEN_FILE")]
    pub(crate) token_file: Option<PathBuf>,
}

impl ServeDir {
    /// As the other commands' [`Dir`] (no server).
    pub(crate) fn as_dir(&self) -> Dir {
        Dir {
            dir: Some(self.dir.clone()),
            etcd: self.etcd.clone(),
            etcd_prefix: self.etcd_prefix.clone(),
            server: None,
            token_file: self.token_file.clone(),
        }
    }
}

#[derive(Args, Clone)]
pub(crate) struct EtcdArg {
    /// The cluster's members: HOST:PORT, comma-separated.
    #[arg(long, env = "FENCELOG_ETCD")]
    pub(crate) etcd: String,
    /// The key prefix of the log in etcd.
    #[arg(long, env = "FENCELOG_ETCD_PREFIX", default_value = fencelog::storage::etcd::DEFAULT_PREFIX)]
    pub(crate) etcd_prefix: String,
}

impl EtcdArg {
    pub(crate) fn options(&self) -> Result<fencelog::storage::etcd::EtcdOptions, fencelog::storage::Error> {
        fencelog::storage::etcd::EtcdOptions::parse(&self.etcd, &self.etcd_prefix)
    }
}

/// The log a read-only tool reads: a directory (positional), or a log in etcd.
#[derive(Args, Clone)]
pub(crate) struct LogArg {
    /// The log directory (or --etcd instead).
    #[arg(required_unless_present = "etcd")]
    pub(crate) dir: Option<PathBuf>,
    /// The log in an etcd cluster: its members' HOST:PORT, comma-separated.
    #[arg(long, env = "FENCELOG_ETCD", conflicts_with = "dir")]
    pub(crate) etcd: Option<String>,
    /// The key prefix of the log in etcd.
    #[arg(long, env = "FENCELOG_ETCD_PREFIX", default_value = fencelog::storage::etcd::DEFAULT_PREFIX)]
    pub(crate) etcd_prefix: String,
    /// With --etcd: the archive directory (`fencelog archive --to DIR`) holding the
    /// records moved out of etcd, read with it as one history.
    #[arg(long, requires = "etcd")]
    pub(crate) archive: Option<PathBuf>,
}

impl LogArg {
    pub(crate) fn source(&self) -> Result<fencelog::inspect::Source, fencelog::storage::Error> {
        use fencelog::storage::{Location, etcd::EtcdOptions};
        let loc = match &self.etcd {
            Some(e) => Location::Etcd(EtcdOptions::parse(e, &self.etcd_prefix)?),
            None => Location::Dir(self.dir.clone().unwrap_or_default()),
        };
        fencelog::inspect::Source::open(&loc, self.archive.as_deref())
    }
}

#[derive(Args, Clone)]
pub(crate) struct Req {
    /// Makes the mutation idempotent: the same id and content returns the original result.
    #[arg(long)]
    pub(crate) request_id: Option<String>,
}

#[derive(Subcommand)]
pub(crate) enum Cmd {
    /// Create a log in DIR (missing or empty; never among other files). The only way,
    /// with the daemon's first start, that a log comes to exist: every other command
    /// on a directory that is not a log exits 2 with NOT_A_LOG.
    Init {
        #[command(flatten)]
        dir: Dir,
    },
    /// Cut a damaged log from record SEQ on, on purpose: the cut bytes (and any later
    /// segments, whole) are kept as evidence files. Only from the first damaged record
    /// or earlier; an intact log is not touched.
    Repair {
        #[command(flatten)]
        dir: Dir,
        /// Cut from this sequence on (the first damaged record, or earlier); the records cut are kept as evidence.
        #[arg(long)]
        cut_from: u64,
    },
    /// Claim a subject for a process (default: the caller's parent).
    Claim {
        #[command(flatten)]
        dir: Dir,
        /// The subject to claim (1 to 256 bytes, no control characters).
        #[arg(long)]
        subject: String,
        /// The owner process (default: the caller's parent); its identity evidence (start time, boot id, executable) is recorded.
        #[arg(long)]
        pid: Option<u32>,
        /// The owner's instance id (default: a new UUID), named in the evidence of a refusal.
        #[arg(long)]
        instance: Option<uuid::Uuid>,
        /// The owner is stale once it has not heartbeated for this long (ms).
        #[arg(long, default_value_t = fencelog::ops::STALE_AFTER_MS_DEFAULT)]
        stale_after_ms: u64,
        /// Claim as a mutation lock doing ACTION (requires --request-id).
        #[arg(long, requires = "request_id")]
        action: Option<String>,
        #[command(flatten)]
        req: Req,
    },
    /// Record a heartbeat of the owner at GENERATION.
    Heartbeat {
        #[command(flatten)]
        dir: Dir,
        /// The subject you own.
        #[arg(long)]
        subject: String,
        /// The generation you hold (your fencing token); another is refused FENCED.
        #[arg(long)]
        generation: u64,
        /// Your instance: named with your process in the evidence a refusal keeps.
        #[arg(long)]
        instance: Option<uuid::Uuid>,
        #[command(flatten)]
        req: Req,
    },
    /// Release the subject held at GENERATION.
    Release {
        #[command(flatten)]
        dir: Dir,
        /// The subject you own.
        #[arg(long)]
        subject: String,
        /// The generation you hold; another is refused FENCED.
        #[arg(long)]
        generation: u64,
        /// Your instance: named with your process in the evidence a refusal keeps.
        #[arg(long)]
        instance: Option<uuid::Uuid>,
        #[command(flatten)]
        req: Req,
    },
    /// Take over a stale owner, naming the generation and heartbeat you saw.
    Takeover {
        #[command(flatten)]
        dir: Dir,
        /// The subject held by a stale owner.
        #[arg(long)]
        subject: String,
        /// The generation you saw (refused TAKEOVER_RACE if it changed).
        #[arg(long)]
        expect_generation: u64,
        /// The heartbeat time you saw (refused TAKEOVER_RACE if it changed).
        #[arg(long)]
        expect_heartbeat_ms: u64,
        /// The new owner process (default: the caller's parent).
        #[arg(long)]
        pid: Option<u32>,
        /// The new owner's instance id (default: a new UUID).
        #[arg(long)]
        instance: Option<uuid::Uuid>,
        /// The new owner is stale once it has not heartbeated for this long (ms).
        #[arg(long, default_value_t = fencelog::ops::STALE_AFTER_MS_DEFAULT)]
        stale_after_ms: u64,
        /// Why, kept in the record for the audit.
        #[arg(long, default_value = "")]
        reason: String,
        #[command(flatten)]
        req: Req,
    },
    /// Bump the generation without changing owner (fences old tokens).
    RotateFence {
        #[command(flatten)]
        dir: Dir,
        /// The subject you own.
        #[arg(long)]
        subject: String,
        /// The generation you hold; the next one fences every holder of it.
        #[arg(long)]
        generation: u64,
        /// Your instance: named with your process in the evidence a refusal keeps.
        #[arg(long)]
        instance: Option<uuid::Uuid>,
        #[command(flatten)]
        req: Req,
    },
    /// Append a note under GENERATION (kept always; authoritative only while current).
    Note {
        #[command(flatten)]
        dir: Dir,
        /// The subject you own.
        #[arg(long)]
        subject: String,
        /// The generation you hold (a note under an old one is kept, marked late).
        #[arg(long)]
        generation: u64,
        /// The note (at most 1,024 bytes).
        #[arg(long)]
        text: String,
        /// Your instance: named with your process in the evidence a refusal keeps.
        #[arg(long)]
        instance: Option<uuid::Uuid>,
        #[command(flatten)]
        req: Req,
    },
    /// Resource leases.
    Lease {
        #[command(subcommand)]
        cmd: LeaseCmd,
    },
    /// What became of a request id.
    Request {
        #[command(subcommand)]
        cmd: RequestCmd,
    },
    /// Current state of subjects, with status judged now.
    State {
        #[command(flatten)]
        dir: Dir,
        /// Only this subject (default: every subject).
        #[arg(long)]
        subject: Option<String>,
    },
    /// The daemon: open (creating the log in a missing or empty directory), claim
    /// the home subject, recover processes, serve HTTP; print one JSON line when
    /// ready. SIGTERM/SIGINT cut over (every admitted request settled from the log).
    Serve {
        #[command(flatten)]
        dir: ServeDir,
        /// Address to listen on (HOST:PORT; port 0 picks a free one). Loopback by default.
        #[arg(long, env = "FENCELOG_LISTEN", default_value = "127.0.0.1:7411")]
        listen: std::net::SocketAddr,
        /// The daemon's home subject (default: fencelog/serve; with --etcd, one per
        /// host: fencelog/serve/HOST).
        #[arg(long, env = "FENCELOG_HOME")]
        home: Option<String>,
        /// At a cutover, how long admitted requests get to finish before each is settled from the log.
        #[arg(long, env = "FENCELOG_DRAIN_GRACE_MS", default_value_t = fencelog::daemon::DRAIN_GRACE_MS_DEFAULT)]
        drain_grace_ms: u64,
        /// If a live daemon holds the home: ask it to cut over, and take the home the
        /// moment it is released.
        #[arg(long, env = "FENCELOG_HANDOVER", value_parser = clap::builder::BoolishValueParser::new(), action = clap::ArgAction::SetTrue)]
        handover: bool,
        /// Staleness of the home claim; heartbeats every quarter of it.
        #[arg(long, default_value_t = fencelog::daemon::HOME_STALE_AFTER_MS, hide = true)]
        home_stale_after_ms: u64,
        /// Also listen on this Unix socket (mode 0600). Its callers are processes on
        /// this host, known by the pid the kernel gives: a claim without --pid is held
        /// for the calling process.
        #[arg(long, env = "FENCELOG_UNIX")]
        unix: Option<PathBuf>,
        /// How long a client has to send a request's headers (on a new connection, and
        /// between requests on a kept-alive one) before the connection is closed.
        #[arg(long, env = "FENCELOG_HEADER_READ_TIMEOUT_MS", default_value_t = fencelog::daemon::HEADER_READ_TIMEOUT_MS_DEFAULT)]
        header_read_timeout_ms: u64,
        /// One line per request on stderr (method, route, status, latency, request
        /// id, caller, trace id of a `traceparent`).
        #[arg(long, env = "FENCELOG_ACCESS_LOG", value_parser = clap::builder::BoolishValueParser::new(), action = clap::ArgAction::SetTrue)]
        access_log: bool,
    },
    /// Run a command under supervision: its intent, start and exit are records, its
    /// leases are held until it ends, and with a request id it runs at most once.
    /// Prints the result within --wait-ms, else a handle (status `running`). Exit 0
    /// when it answered (the command's own exit code is in the JSON).
    Run {
        #[command(flatten)]
        dir: Dir,
        #[command(flatten)]
        req: Req,
        /// RESOURCE:read or RESOURCE:write (repeatable): all or none, held until the end.
        #[arg(long = "lease")]
        leases: Vec<String>,
        /// On a lease conflict, retry until this long (at most 30000).
        #[arg(long, default_value_t = 0)]
        lease_wait_ms: u64,
        /// Stop the command's process group after this long (0: never).
        #[arg(long, default_value_t = 0)]
        timeout_ms: u64,
        /// Answer with the result within this long, else with a handle (0: at once).
        #[arg(long, default_value_t = fencelog::supervisor::WAIT_MS_DEFAULT)]
        wait_ms: u64,
        /// Working directory of the command (default: the current one).
        #[arg(long)]
        cwd: Option<PathBuf>,
        /// NAME=VALUE (repeatable); the value never enters the log, only its blake3.
        #[arg(long = "env")]
        env: Vec<String>,
        /// Bytes of each output stream kept on disk (at most 64 MiB).
        #[arg(long, default_value_t = fencelog::supervisor::OUTPUT_BYTES_MAX_DEFAULT)]
        output_bytes_max: u64,
        /// The owner the command runs for (refused if GENERATION is not current).
        #[arg(long, requires = "generation")]
        owner: Option<String>,
        /// The generation of --owner the command runs under.
        #[arg(long, requires = "owner")]
        generation: Option<u64>,
        /// The command and its arguments.
        #[arg(last = true, required = true)]
        command: Vec<String>,
    },
    /// Supervised processes: show, wait, cancel, logs, list.
    Process {
        #[command(subcommand)]
        cmd: ProcessCmd,
    },
    /// Settle every process that has not ended: runner alive → left running; runner
    /// gone without an exit → completed_unknown; never started within the grace →
    /// failed PRESPAWN_ABANDONED. Nothing is ever run again.
    Recover {
        #[command(flatten)]
        dir: Dir,
        /// A process requested this long ago and never started is abandoned (PRESPAWN_ABANDONED).
        #[arg(long, default_value_t = fencelog::supervisor::PRESPAWN_GRACE_MS_DEFAULT)]
        prespawn_grace_ms: u64,
        /// As the current owner of SUBJECT (at GENERATION): also settle the processes
        /// run for its earlier generations.
        #[arg(long, requires = "generation")]
        owner: Option<String>,
        /// The current generation of --owner.
        #[arg(long, requires = "owner")]
        generation: Option<u64>,
    },
    /// Write a log in etcd (its whole history: with --archive, the records archived
    /// before it too) as segment files in a new directory TO; `inspect verify TO`
    /// gives the same chain head.
    Export {
        #[command(flatten)]
        etcd: EtcdArg,
        /// The archive directory of the log's archived records (`fencelog archive`).
        #[arg(long)]
        archive: Option<PathBuf>,
        /// A missing or empty directory.
        #[arg(long)]
        to: PathBuf,
    },
    /// Move the log in --dir into an empty prefix of an etcd cluster, record for
    /// record (the same chain head); the prefix is a log once every record is in.
    Import {
        /// The log directory to move (it must verify intact).
        #[arg(long, env = "FENCELOG_DIR")]
        dir: PathBuf,
        #[command(flatten)]
        etcd: EtcdArg,
    },
    /// Keep etcd's keyspace bounded: move the records below the newest snapshot the
    /// chain vouches for into archive segments in TO (the same frames and chain;
    /// the same directory every time), then delete their keys.
    Archive {
        #[command(flatten)]
        etcd: EtcdArg,
        /// The archive directory (created if missing; the same one every time).
        #[arg(long)]
        to: PathBuf,
    },
    /// Shell completions on stdout: `fencelog completions bash >
    /// /etc/bash_completion.d/fencelog` (zsh: a `_fencelog` file on $fpath; fish:
    /// ~/.config/fish/completions/fencelog.fish).
    Completions {
        /// The shell to complete for.
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
    /// Man pages (roff) for fencelog and each of its commands, written to --out
    /// (the repository's docs/man/ is made so: `man -l docs/man/fencelog.1`).
    Man {
        /// The directory to write the pages to (created if missing).
        #[arg(long)]
        out: PathBuf,
    },
    /// This build: its version, the log format versions it writes and reads, its
    /// features (the daemon answers the same at GET /v1/version).
    Version {
        /// Print one JSON object instead of a line of text.
        #[arg(long)]
        json: bool,
    },
    /// The runner of a supervised process (started by `run`).
    #[command(name = "__runner", hide = true)]
    Runner {
        #[command(flatten)]
        dir: Dir,
        #[arg(long, required_unless_present = "spare")]
        process: Option<u64>,
        /// A spare runner: open the log, then wait on stdin for the process to run.
        #[arg(long, conflicts_with = "process")]
        spare: bool,
    },
    /// The offline inspector: reads a live log or a copy, never writes.
    Inspect {
        #[command(subcommand)]
        cmd: InspectCmd,
    },
    /// The forensic story of every change of owner, from the log alone (read-only).
    Audit {
        #[command(flatten)]
        log: LogArg,
        /// Only this subject's story.
        #[arg(long)]
        subject: Option<String>,
        /// Report format: text, json or html.
        #[arg(long, value_enum, default_value = "text")]
        format: Format,
        /// Write the report to FILE instead of stdout.
        #[arg(long)]
        out: Option<PathBuf>,
    },
}

#[derive(Clone, Copy, ValueEnum)]
pub(crate) enum Format {
    Text,
    Json,
    Html,
}

#[derive(Subcommand)]
pub(crate) enum InspectCmd {
    /// Check every checksum, the hash chain, sequence continuity and segment headers.
    /// Exit 0 intact, 1 damaged (torn tail or corruption, told apart), 2 not a log.
    Verify {
        #[command(flatten)]
        log: LogArg,
        /// Print one JSON object instead of text.
        #[arg(long)]
        json: bool,
        /// SEQ:HEX, a chain head kept elsewhere (repeatable): exit 1 with
        /// head_mismatch or log_shorter_than_pinned if the log does not hold it.
        #[arg(long, value_parser = fencelog::inspect::parse_pin)]
        expect_head: Vec<fencelog::inspect::Pin>,
    },
    /// The chain head at SEQ (default: the last record), to keep elsewhere and check
    /// later with `verify --expect-head SEQ:HEX`.
    Head {
        #[command(flatten)]
        log: LogArg,
        /// The sequence whose chain head to print (default: the last record).
        #[arg(long)]
        at: Option<u64>,
        /// Print one JSON object instead of text.
        #[arg(long)]
        json: bool,
    },
    /// One line per record (`--json`: NDJSON). `--raw` reads past damage.
    Dump {
        #[command(flatten)]
        log: LogArg,
        /// One JSON object per line (NDJSON) instead of text.
        #[arg(long)]
        json: bool,
        /// First sequence to print.
        #[arg(long)]
        from: Option<u64>,
        /// Last sequence to print.
        #[arg(long)]
        to: Option<u64>,
        /// Only records naming this subject.
        #[arg(long)]
        subject: Option<String>,
        /// Only records with an event of this kind (claim, heartbeat, takeover, ...).
        #[arg(long)]
        kind: Option<String>,
        /// Unix ms, YYYY-MM-DD or YYYY-MM-DDTHH:MM:SS[.fff]Z (UTC).
        #[arg(long, value_parser = fencelog::inspect::parse_time)]
        since: Option<u64>,
        /// Only records written at or before this time (as --since).
        #[arg(long, value_parser = fencelog::inspect::parse_time)]
        until: Option<u64>,
        /// Read past damage: print every frame that decodes, and each damaged place.
        #[arg(long)]
        raw: bool,
    },
    /// The state as of sequence SEQ (default: the end).
    State {
        #[command(flatten)]
        log: LogArg,
        /// The sequence to replay up to (default: the end).
        #[arg(long)]
        at: Option<u64>,
        /// Print one JSON object instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Counts and bytes by record kind, subject (top N), segment and writer (JSON).
    Stat {
        #[command(flatten)]
        log: LogArg,
        /// How many subjects to list, the largest first.
        #[arg(long, default_value_t = 10)]
        top: usize,
    },
    /// Print records as other processes append them, until interrupted.
    Follow {
        #[command(flatten)]
        log: LogArg,
        /// One JSON object per line (NDJSON) instead of text.
        #[arg(long)]
        json: bool,
        /// Start at this sequence (default: records appended from now on).
        #[arg(long)]
        from: Option<u64>,
        /// How often to look for new records in a directory (ms).
        #[arg(long, default_value_t = 100)]
        poll_ms: u64,
        /// Stop after this many records.
        #[arg(long)]
        max_records: Option<u64>,
        /// Stop after this long.
        #[arg(long)]
        timeout_ms: Option<u64>,
    },
}

#[derive(Subcommand)]
pub(crate) enum LeaseCmd {
    /// Acquire a lease on a resource, for a free-text holder or an owner's tenure; all or nothing.
    Acquire {
        #[command(flatten)]
        dir: Dir,
        /// The resource to lease (a name).
        #[arg(long)]
        resource: String,
        /// read (shared) or write (exclusive).
        #[arg(long, value_enum)]
        mode: Mode,
        /// A free-text holder (or --owner/--generation instead).
        #[arg(long, required_unless_present = "owner", conflicts_with = "owner")]
        holder: Option<String>,
        /// Held by this owner's tenure (GENERATION must be current); the lease ends
        /// in the record that ends the tenure (release, takeover, dead-owner claim).
        #[arg(long, requires = "generation")]
        owner: Option<String>,
        /// The current generation of --owner.
        #[arg(long, requires = "owner")]
        generation: Option<u64>,
        /// A free-text holder's lease expires after this long (ms).
        #[arg(long, default_value_t = fencelog::ops::LEASE_TTL_MS_DEFAULT)]
        ttl_ms: u64,
        #[command(flatten)]
        req: Req,
    },
    /// Release a lease with its token (once; a second release is refused).
    Release {
        #[command(flatten)]
        dir: Dir,
        /// The lease id (from acquire).
        #[arg(long)]
        lease: u64,
        /// The lease's token (from acquire); a wrong one is refused and kept as evidence.
        #[arg(long)]
        token: u64,
        #[command(flatten)]
        req: Req,
    },
}

#[derive(Subcommand)]
pub(crate) enum ProcessCmd {
    /// A supervised process: its command, status, pid, leases, outcome and output tails.
    Show {
        #[command(flatten)]
        dir: Dir,
        /// The process id (from run).
        id: u64,
    },
    /// Wait until the process is terminal (or TIMEOUT_MS passed: then as it is).
    Wait {
        #[command(flatten)]
        dir: Dir,
        /// The process id (from run).
        id: u64,
        /// Wait at most this long (ms), then answer with the process as it is.
        #[arg(long, default_value_t = fencelog::supervisor::WAIT_MS_DEFAULT)]
        timeout_ms: u64,
    },
    /// TERM the command's process group (after checking its pid and start time),
    /// KILL it after --grace-ms. With --owner/--generation, refused FENCED (before
    /// any signal) unless that generation is current.
    Cancel {
        #[command(flatten)]
        dir: Dir,
        /// The process id (from run).
        id: u64,
        /// Cancel as the current owner of this subject (fenced if not).
        #[arg(long, requires = "generation")]
        owner: Option<String>,
        /// The current generation of --owner.
        #[arg(long, requires = "owner")]
        generation: Option<u64>,
        /// Between TERM and KILL (ms).
        #[arg(long, default_value_t = 2_000)]
        grace_ms: u64,
    },
    /// The kept output, raw bytes (--follow: until the process ends).
    Logs {
        #[command(flatten)]
        dir: Dir,
        /// The process id (from run).
        id: u64,
        /// Which output: stdout or stderr.
        #[arg(long, value_enum, default_value = "stdout")]
        stream: StreamArg,
        /// Keep printing as the process writes, until it ends.
        #[arg(long)]
        follow: bool,
    },
    /// Supervised processes, filtered by status or owner.
    List {
        #[command(flatten)]
        dir: Dir,
        /// Only processes in this status (requested, running, succeeded, failed, ...).
        #[arg(long)]
        status: Option<String>,
        /// Only processes run for this owner subject.
        #[arg(long)]
        owner: Option<String>,
    },
}

#[derive(Clone, Copy, ValueEnum)]
pub(crate) enum StreamArg {
    Stdout,
    Stderr,
}

#[derive(Subcommand)]
pub(crate) enum RequestCmd {
    /// What became of a request id: committed at a sequence (with its answer), or never committed.
    Show {
        #[command(flatten)]
        dir: Dir,
        /// The request id (as given with --request-id or Idempotency-Key).
        id: String,
    },
}

#[derive(Clone, Copy, ValueEnum)]
pub(crate) enum Mode {
    Read,
    Write,
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    /// Every argument of every command, as `fencelog CMD SUB --flag`, that has no
    /// help text (hidden ones and clap's own `--help`/`--version` aside).
    fn undocumented(cmd: &clap::Command, path: &str, out: &mut Vec<String>) {
        for a in cmd.get_arguments() {
            let own = matches!(a.get_id().as_str(), "help" | "version");
            if !own && !a.is_hide_set() && a.get_help().is_none() && a.get_long_help().is_none() {
                out.push(format!(
                    "{path} {}",
                    a.get_long().map_or_else(|| a.get_id().to_string(), |l| format!("--{l}"))
                ));
            }
        }
        for sub in cmd.get_subcommands().filter(|s| !s.is_hide_set()) {
            if sub.get_about().is_none() && sub.get_long_about().is_none() {
                out.push(format!("{path} {} (no about)", sub.get_name()));
            }
            undocumented(sub, &format!("{path} {}", sub.get_name()), out);
        }
    }

    /// Proves: every flag and argument of every command says what it is for in
    /// `--help` (and so in the man pages and completions made from the same
    /// definitions).
    #[test]
    fn every_flag_of_every_command_has_help() {
        let mut out = vec![];
        undocumented(&super::Cli::command(), "fencelog", &mut out);
        assert!(out.is_empty(), "{} without help:\n{}", out.len(), out.join("\n"));
    }
}
