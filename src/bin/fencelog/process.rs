//! `run`, `process …` and `recover`: parsing and printing; the decisions are in
//! `fencelog::supervisor`.

use std::io::Write;
use std::time::Duration;

use fencelog::ledger::Ledger;
use fencelog::ops::OpError;
use fencelog::storage::LogOptions;
use fencelog::supervisor::{self as sup, Stream};

use crate::cli::{Cmd, ProcessCmd, StreamArg};
use crate::mutate::{ledger_options, open, read_only};
use crate::{Printed, printed};

pub(crate) fn run(cmd: Cmd) -> Printed {
    match cmd {
        Cmd::Recover { dir, prespawn_grace_ms, owner, generation } => {
            let ledger = open(&dir)?;
            let me =
                owner.zip(generation).map(|(subject, generation)| fencelog::model::OwnerRef { subject, generation });
            printed(&sup::recover(&ledger, prespawn_grace_ms, LogOptions::default().now_ms(), me.as_ref())?)
        }
        Cmd::Process { cmd } => match cmd {
            ProcessCmd::Show { dir, id } => {
                // A read, unless it finds the process over without its record
                // (runner and command gone): then settled as `wait` would.
                // If the log cannot be opened for writing (a read-only copy, a
                // log halted by SYNC_FAILED), the read's answer stands.
                let view = read_only(&dir)?;
                let settled = sup::needs_settling(&view.here, &view.projection, id)
                    .then(|| open(&dir).and_then(|l| sup::show_settled(&l, id)))
                    .and_then(Result::ok);
                match settled {
                    Some(shown) => printed(&shown),
                    None => printed(&sup::show(&view.projection, id)?),
                }
            }
            ProcessCmd::List { dir, status, owner } => {
                printed(&sup::list(&read_only(&dir)?.projection, status.as_deref(), owner.as_deref())?)
            }
            ProcessCmd::Wait { dir, id, timeout_ms } => printed(&sup::wait(&open(&dir)?, id, timeout_ms)?),
            ProcessCmd::Cancel { dir, id, owner, generation, grace_ms } => {
                let by = match (owner, generation) {
                    (Some(subject), Some(generation)) => Some(fencelog::model::OwnerRef { subject, generation }),
                    _ => None,
                };
                printed(&sup::cancel(&open(&dir)?, id, by, grace_ms)?)
            }
            ProcessCmd::Logs { dir, id, stream, follow } => {
                let stream = match stream {
                    StreamArg::Stdout => Stream::Stdout,
                    StreamArg::Stderr => Stream::Stderr,
                };
                logs(&dir, id, stream, follow)
            }
        },
        _ => unreachable!("dispatched in main"),
    }
}

/// Raw bytes of the kept output; with `follow`, until the process has ended and
/// everything it kept is printed.
fn logs(at: &crate::cli::Dir, id: u64, stream: Stream, follow: bool) -> Printed {
    let dir = at.state_dir("process logs")?;
    let view = read_only(at)?;
    let first = view.projection.processes().get(&id).cloned();
    sup::show(&view.projection, id)?; // an unknown process is UNKNOWN_PROCESS, not an empty output
    let ledger = if follow { Some(Ledger::open_at(&at.location()?, ledger_options())?) } else { None };
    let mut out = std::io::stdout().lock();
    let mut pos = 0u64;
    // Everything printed, to hold against the exit record's digest at the end (a
    // single read from the start is checked by `read_output` itself).
    let mut hasher = blake3::Hasher::new();
    let deadline = std::time::Instant::now() + Duration::from_millis(sup::WAIT_MS_MAX);
    loop {
        let p = match &ledger {
            Some(l) => l.refresh_with(|p| p.processes().get(&id).cloned())?,
            None => first.clone(),
        };
        let Some(p) = p else { return Ok((serde_json::Value::Null, 0)) };
        // Read before judging the end: what was written up to it is printed.
        let ended = ledger.is_none() || p.ended.is_some();
        loop {
            let buf = sup::read_output(dir, &p, stream, pos)?;
            if buf.is_empty() {
                break;
            }
            pos += buf.len() as u64;
            hasher.update(&buf);
            out.write_all(&buf).and_then(|_| out.flush()).map_err(crate::stdout_error)?;
        }
        if ended && !p.command.env.is_empty() && pos > 0 && sup::recorded_output(&p, stream).is_some() {
            // Its `--env` values were redacted from the kept output once it ended:
            // what was printed while it ran is not what was kept (and the kept
            // file's offsets are not those printed). The kept file is checked
            // against its record on its own; nothing more is printed from it.
            sup::stream_output(dir, &p, stream, 0, |_| Ok(()))?;
            eprintln!(
                "fencelog: process {id}'s kept output was redacted when it ended (its --env values); what was printed \
                 while it ran was not redacted. `process logs {id}` prints what was kept"
            );
            return Ok((serde_json::Value::Null, 0));
        }
        if ended {
            // (Bytes printed while the file under the name was not yet this
            // process's own show here as a count or a digest that differs.)
            if let Some((kept, digest)) = sup::recorded_output(&p, stream)
                && kept > 0
                && (pos != kept || *hasher.finalize().as_bytes() != digest)
            {
                return Err(OpError::Io {
                    message: format!(
                        "process {id}: the {pos} bytes printed are not the {kept} its exit record kept (count or \
                         blake3 differs)"
                    ),
                });
            }
            return Ok((serde_json::Value::Null, 0));
        }
        if std::time::Instant::now() >= deadline {
            eprintln!("fencelog: process {id} has not ended after {} ms; stopped following", sup::WAIT_MS_MAX);
            return Ok((serde_json::Value::Null, 0));
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}
