//! The offline inspector and the audit: read-only, printing their reports.

use std::io::Write;
use std::path::{Path, PathBuf};

use fencelog::ops::OpError;
use serde_json::Value;

use crate::Printed;
use crate::cli::{Format, InspectCmd};

pub(crate) fn inspect(cmd: InspectCmd) -> Printed {
    use fencelog::inspect as ins;
    let stdout = std::io::stdout();
    let mut out = std::io::BufWriter::new(stdout.lock());
    let io = crate::stdout_error;
    let code = match cmd {
        InspectCmd::Verify { log, json, expect_head } => {
            let src = log.source().map_err(unreadable)?;
            if let Some(dir) = src.dir() {
                warn_if_unsafe(dir);
            }
            let (s, code) = ins::verify_pinned(&src, &expect_head).map_err(unreadable)?;
            if json {
                writeln!(out, "{}", ins::verify_json(&s)).map_err(io)?;
            } else {
                ins::verify_text(&s, &mut out).map_err(io)?;
            }
            code
        }
        InspectCmd::Dump { log, json, from, to, subject, kind, since, until, raw } => {
            let f = ins::Filter { from, to, subject, kind, since_ms: since, until_ms: until };
            let s = ins::dump(&log.source().map_err(unreadable)?, &f, json, raw, &mut out).map_err(unreadable)?;
            if s.is_intact() { 0 } else { 1 }
        }
        InspectCmd::State { log, at, json } => {
            let (p, s) = ins::state_at(&log.source().map_err(unreadable)?, at).map_err(unreadable)?;
            if json {
                writeln!(out, "{}", serde_json::to_string_pretty(&p).expect("projection serializes")).map_err(io)?;
            } else {
                ins::state_text(&p, &mut out).map_err(io)?;
            }
            if s.is_intact() { 0 } else { 1 }
        }
        InspectCmd::Head { log, at, json } => {
            let h = ins::head(&log.source().map_err(unreadable)?, at).map_err(unreadable)?;
            if json {
                writeln!(out, "{}", serde_json::to_string(&h).expect("head serializes")).map_err(io)?;
            } else {
                writeln!(out, "{}:{}", h.seq, h.chain_head).map_err(io)?;
            }
            0
        }
        InspectCmd::Stat { log, top } => {
            let v = ins::stat(&log.source().map_err(unreadable)?, top).map_err(unreadable)?;
            writeln!(out, "{}", serde_json::to_string_pretty(&v).expect("stat serializes")).map_err(io)?;
            if v["problems"].as_array().is_some_and(|p| p.is_empty()) { 0 } else { 1 }
        }
        InspectCmd::Follow { log, json, from, poll_ms, max_records, timeout_ms } => {
            let src = log.source().map_err(unreadable)?;
            ins::follow(&src, from, json, poll_ms.max(1), max_records, timeout_ms, &mut out).map_err(unreadable)?;
            0
        }
    };
    out.flush().map_err(io)?;
    Ok((Value::Null, code))
}

/// For the inspector, a directory that is not a log it can read (not a log, a
/// format it does not know, a bad option) is a usage error (2); damage it finds,
/// and I/O failures, are 1.
fn unreadable(e: fencelog::storage::Error) -> OpError {
    use fencelog::storage::Error as E;
    match e {
        e @ (E::NotALogDirectory { .. }
        | E::UnsupportedFormat { .. }
        | E::InvalidOption { .. }
        | E::NotFound { .. }
        | E::ReadOnly) => OpError::Usage { code: e.code(), message: e.to_string() },
        e => e.into(),
    }
}

/// The inspector reads a log whatever its permissions, but says when others could
/// have rewritten it.
fn warn_if_unsafe(dir: &Path) {
    if let Err(e @ fencelog::storage::Error::UnsafePermissions { .. }) = fencelog::storage::check_dir_mode(dir) {
        eprintln!("fencelog: warning: {e}");
    }
}

pub(crate) fn audit(log: &crate::cli::LogArg, subject: Option<&str>, format: Format, out: Option<PathBuf>) -> Printed {
    let src = log.source().map_err(unreadable)?;
    if let (Some(path), Some(dir)) = (&out, src.dir()) {
        fencelog::audit::check_report_path(dir, path)
            .map_err(|message| OpError::Usage { code: "INVALID_INPUT", message })?;
    }
    let report = fencelog::audit::audit(&src, subject)?;
    let body = match format {
        Format::Text => fencelog::audit::text(&report),
        Format::Json => serde_json::to_string_pretty(&report).expect("report serializes") + "\n",
        Format::Html => {
            // The pin command names the log by its absolute path (it is pasted elsewhere).
            let name = match src.dir() {
                Some(dir) => std::fs::canonicalize(dir).unwrap_or_else(|_| dir.to_path_buf()).display().to_string(),
                None => src.label().display().to_string(),
            };
            fencelog::audit::html(&report, &name)
        }
    };
    match out {
        Some(path) => {
            std::fs::write(&path, body).map_err(|e| OpError::Io { message: format!("{}: {e}", path.display()) })?
        }
        None => {
            let mut stdout = std::io::stdout().lock();
            stdout.write_all(body.as_bytes()).and_then(|_| stdout.flush()).map_err(crate::stdout_error)?
        }
    }
    Ok((Value::Null, report.exit_code()))
}
