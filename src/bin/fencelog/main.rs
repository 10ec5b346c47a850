//! The `fencelog` command: argument parsing and printing only; every decision is
//! in the library (`fencelog::ops`, `inspect`, `audit`, `storage`).
//!
//! Every command prints one JSON object on stdout (the inspector and the audit
//! print their reports; `completions` and `man` print what they make). Exit codes:
//! 0 success, 1 I/O error or a damaged log, 2 usage error, invalid input or not a
//! log, 3 the state machine refused (`{"error": {"code": ..., "message": ...,
//! evidence}}`), 4 the audit found a violated verdict or undecodable records, 5
//! `serve` only: its home was taken (fenced).

#![forbid(unsafe_code)]

mod cli;
mod client;
mod inspect;
mod man;
mod mutate;
mod process;

use std::process::ExitCode;

use clap::Parser;
use fencelog::ops::{ErrorBody, ErrorDetail, OpError};
use serde_json::Value;

/// What a command prints on success (`Value::Null`: it printed its own report) and
/// its exit code.
type Printed = Result<(Value, u8), OpError>;

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    // A gate (started by a runner, with nothing but this argument and an empty
    // environment) becomes its command as soon as it is sent one: nothing else
    // runs first.
    if std::env::args_os().len() == 2 && std::env::args_os().nth(1).is_some_and(|a| a == "__gate") {
        std::process::exit(fencelog::supervisor::runner::gate_main());
    }
    // Failure injection for tests (compiled in only by `cargo test`; see
    // tests/failpoints.rs), configured from FAILPOINTS when it is set.
    let _failpoints = std::env::var_os("FAILPOINTS").map(|_| fail::FailScenario::setup());
    if let Some((site, process)) = runner_args() {
        init_logging(0, log_format_from_env());
        std::process::exit(match process {
            Some(process) => fencelog::supervisor::runner::runner_main(&site, process),
            None => fencelog::supervisor::runner::spare_main(&site),
        });
    }
    let cli = match cli::Cli::try_parse() {
        Ok(c) => c,
        Err(e) => {
            let _ = e.print();
            if !e.use_stderr() {
                return ExitCode::SUCCESS; // --help, --version
            }
            let body = ErrorBody { error: ErrorDetail::Plain { code: "USAGE", message: usage_message(&e) } };
            println!("{}", serde_json::to_string(&body).expect("error body serializes"));
            return ExitCode::from(2);
        }
    };
    // The daemon says what it does at `info` (boot, cutovers, refusals kept as
    // evidence, recovery, the access log); the other commands only warn.
    let level = cli.verbose + u8::from(matches!(cli.cmd, cli::Cmd::Serve { .. }));
    init_logging(level, cli.log_format);
    let (value, code) = match run(cli.cmd) {
        Ok(ok) => ok,
        Err(e) => {
            eprintln!("fencelog: {e}");
            (serde_json::to_value(e.body()).expect("error body serializes"), e.exit_code())
        }
    };
    if !value.is_null() {
        use std::io::Write;
        let mut stdout = std::io::stdout().lock();
        if let Err(e) = writeln!(stdout, "{value}").and_then(|_| stdout.flush()) {
            if e.kind() == std::io::ErrorKind::BrokenPipe {
                return ExitCode::from(code); // the reader went away: nothing to say
            }
            // The answer is lost, not the operation: say what it was, where it can
            // still be read.
            eprintln!("fencelog: cannot write the answer to stdout ({e}); the answer was: {value}");
            return ExitCode::from(1);
        }
    }
    ExitCode::from(code)
}

/// A failure to write a report to stdout: a reader that went away (`| head`) ends
/// the command quietly; anything else is an I/O error (exit 1).
fn stdout_error(e: std::io::Error) -> OpError {
    if e.kind() == std::io::ErrorKind::BrokenPipe {
        std::process::exit(0);
    }
    OpError::Io { message: format!("writing to stdout: {e}") }
}

fn run(cmd: cli::Cmd) -> Printed {
    use cli::Cmd;
    if let Some(d) = client::dir_of(&cmd) {
        if let Some(server) = d.server.clone() {
            return client::run(cmd, &server);
        }
        if d.etcd.is_none() && d.dir.as_ref().is_none_or(|p| p.as_os_str().is_empty()) {
            return Err(OpError::Usage {
                code: "USAGE",
                message: "--dir DIR (or FENCELOG_DIR) is required, or --etcd ENDPOINTS, or --server URL".into(),
            });
        }
    }
    let cmd = match mutate::op_of(cmd) {
        Ok((dir, op)) => return mutate::run_op(&dir, op),
        Err(cmd) => *cmd,
    };
    match cmd {
        Cmd::Inspect { cmd } => inspect::inspect(cmd),
        Cmd::Audit { log, subject, format, out } => inspect::audit(&log, subject.as_deref(), format, out),
        Cmd::Completions { shell } => completions(shell),
        Cmd::Man { out } => {
            let pages =
                man::write_pages(&out).map_err(|e| OpError::Io { message: format!("{}: {e}", out.display()) })?;
            Ok((serde_json::json!({"out": out, "pages": pages}), 0))
        }
        Cmd::Version { json } => version(json),
        cmd @ (Cmd::Process { .. } | Cmd::Recover { .. }) => process::run(cmd),
        Cmd::Export { etcd, archive, to } => {
            let loc = fencelog::storage::Location::Etcd(etcd.options()?);
            let src = fencelog::storage::Source::open(&loc, archive.as_deref())?;
            printed(&fencelog::ops::transfer::export(&src, &to)?)
        }
        Cmd::Import { dir, etcd } => printed(&fencelog::ops::transfer::import(&dir, &etcd.options()?)?),
        Cmd::Archive { etcd, to } => printed(&fencelog::ops::transfer::archive(&etcd.options()?, &to)?),
        cmd @ Cmd::Serve { .. } => serve(cmd),
        Cmd::Runner { dir, process, .. } => {
            let site = fencelog::supervisor::runner::Site { dir: dir.path().to_path_buf(), log: dir.location()? };
            std::process::exit(match process {
                Some(process) => fencelog::supervisor::runner::runner_main(&site, process),
                None => fencelog::supervisor::runner::spare_main(&site),
            })
        }
        other => mutate::run(other),
    }
}

/// `fencelog completions SHELL`: the script on stdout.
fn completions(shell: clap_complete::Shell) -> Printed {
    use clap::CommandFactory;
    use std::io::Write;
    let mut script = Vec::new();
    clap_complete::generate(shell, &mut cli::Cli::command(), "fencelog", &mut script);
    match std::io::stdout().lock().write_all(&script) {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => Err(OpError::Io { message: format!("stdout: {e}") }),
        _ => Ok((serde_json::Value::Null, 0)),
    }
}

/// `fencelog version`: one line, or with `--json` the version's report.
fn version(json: bool) -> Printed {
    let v = fencelog::ops::version::version_info();
    if json {
        printed(&v)
    } else {
        println!(
            "fencelog {} (writes format {}, reads {:?}; features: {})",
            v.version,
            v.format_version_written,
            v.format_versions_read,
            v.features.join(", ")
        );
        Ok((serde_json::Value::Null, 0))
    }
}

/// `fencelog serve`: its options checked, then the daemon run until it cuts over.
fn serve(cmd: cli::Cmd) -> Printed {
    let cli::Cmd::Serve {
        dir,
        listen,
        home,
        drain_grace_ms,
        handover,
        home_stale_after_ms,
        unix,
        header_read_timeout_ms,
        access_log,
    } = cmd
    else {
        unreachable!("dispatched in run")
    };
    let dir = dir.as_dir();
    use fencelog::daemon::{HEADER_READ_TIMEOUT_MS_MAX, HEADER_READ_TIMEOUT_MS_MIN};
    if !(HEADER_READ_TIMEOUT_MS_MIN..=HEADER_READ_TIMEOUT_MS_MAX).contains(&header_read_timeout_ms) {
        return Err(OpError::Usage {
            code: "INVALID_INPUT",
            message: format!("--header-read-timeout-ms is {HEADER_READ_TIMEOUT_MS_MIN}..={HEADER_READ_TIMEOUT_MS_MAX}"),
        });
    }
    let token_file = dir.token_file.clone();
    let log = dir.location()?;
    if dir.etcd.is_some() {
        dir.state_dir("serve")?;
    }
    let home = home.unwrap_or_else(|| fencelog::daemon::home_default(&log));
    fencelog::ops::valid(&home)?;
    let self_exe = std::env::current_exe().map_err(|e| OpError::Io { message: format!("own executable: {e}") })?;
    let o = fencelog::daemon::ServeOptions {
        dir: dir.path().to_path_buf(),
        log,
        listen,
        token_file,
        home,
        drain_grace_ms,
        handover,
        self_exe,
        home_stale_after_ms,
        unix,
        header_read_timeout_ms,
        access_log,
    };
    match fencelog::daemon::serve(o) {
        Ok(code) => Ok((Value::Null, code)),
        Err(fencelog::daemon::ServeFailure { exit, error }) => {
            eprintln!("fencelog: {error}");
            Ok((serde_json::to_value(error.body()).expect("error body serializes"), exit))
        }
    }
}

/// The runner's arguments, when this process is a runner started one of the two
/// ways `run` starts one (`__runner --dir D --process N`, or a spare runner's
/// `__runner --dir D --spare`: process `None`; for a log in etcd, `--etcd E
/// --etcd-prefix P` after `--dir D`), nothing else. A runner is started for every
/// supervised command, and its start is on the path of every answer: building the
/// whole command line's parser cost it about 0.4 ms. Any other form goes through
/// the parser as usual.
fn runner_args() -> Option<(fencelog::supervisor::runner::Site, Option<u64>)> {
    let mut args = std::env::args_os().skip(1);
    let mut next = || args.next();
    let (sub, dir_flag, dir, mut what) = (next()?, next()?, next()?, next()?);
    if sub != "__runner" || dir_flag != "--dir" || dir.is_empty() {
        return None;
    }
    let dir = std::path::PathBuf::from(dir);
    let mut log = fencelog::storage::Location::Dir(dir.clone());
    if what == "--etcd" {
        let (endpoints, prefix_flag, prefix) = (next()?, next()?, next()?);
        if prefix_flag != "--etcd-prefix" {
            return None;
        }
        let e = fencelog::storage::etcd::EtcdOptions::parse(endpoints.to_str()?, prefix.to_str()?).ok()?;
        log = fencelog::storage::Location::Etcd(e);
        what = next()?;
    }
    let process = match what.to_str()? {
        "--spare" => None,
        "--process" => Some(next()?.to_str()?.parse().ok()?),
        _ => return None,
    };
    if next().is_some() {
        return None;
    }
    Some((fencelog::supervisor::runner::Site { dir, log }, process))
}

/// clap's error as one line: its text up to the usage lines, so that a missing
/// argument is named ("the following required arguments were not provided:
/// --dir <DIR>"), not cut at the colon.
fn usage_message(e: &clap::Error) -> String {
    let text = e.render().to_string();
    let said: Vec<&str> = text
        .lines()
        .map(str::trim)
        .take_while(|l| !l.starts_with("Usage:") && !l.starts_with("For more information"))
        .filter(|l| !l.is_empty())
        .collect();
    let joined = said.join(" ");
    let joined = joined.trim_start_matches("error: ").trim();
    if joined.is_empty() { "usage error".into() } else { joined.chars().take(1000).collect() }
}

/// Diagnostics go to stderr (stdout carries the one JSON answer): warnings by
/// default, more with `-v`, or whatever `RUST_LOG` says.
fn init_logging(verbose: u8, format: cli::LogFormat) {
    use std::io::IsTerminal;
    let level = match verbose {
        0 => "warn",
        1 => "info",
        _ => "debug",
    };
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(format!("fencelog={level}")));
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr);
    let _ = match format {
        // One JSON object per line: time, level, target, message and the fields
        // at the top level (no nested span dumps).
        cli::LogFormat::Json => builder.json().flatten_event(true).with_current_span(false).try_init(),
        cli::LogFormat::Text => builder.with_ansi(std::io::stderr().is_terminal()).with_target(false).try_init(),
    };
}

/// The runner's log format (it parses no flags): `FENCELOG_LOG_FORMAT`.
fn log_format_from_env() -> cli::LogFormat {
    match std::env::var("FENCELOG_LOG_FORMAT").as_deref() {
        Ok("json") => cli::LogFormat::Json,
        _ => cli::LogFormat::Text,
    }
}

/// A typed response as the JSON line to print.
fn printed<T: serde::Serialize>(response: &T) -> Printed {
    Ok((serde_json::to_value(response).expect("responses serialize"), 0))
}
