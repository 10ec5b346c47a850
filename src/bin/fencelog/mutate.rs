//! Commands on a log's state: mutations (through `fencelog::ops`), the read-only
//! `state` and `request show`, and `init` / `repair`.

use fencelog::ledger::{Ledger, LedgerOptions, identity};
use fencelog::model::LeaseMode;
use fencelog::ops::{self, Caller, GenerationOp, GenerationRequest};
use fencelog::storage::LogOptions;

use crate::cli::{Cmd, Dir, LeaseCmd, Mode, RequestCmd};
use crate::{Printed, printed};

/// The command line never creates a log by accident: only `init` does. Nor
/// does it snapshot in the background: a command ends before the checkpoint
/// that would vouch for such a snapshot is appended, so the snapshot would be
/// ignored by every open (and, two in a row, prune the last vouched one: every
/// open would then replay from the first record). A mutation writes one at its
/// end instead, when its open replayed a long tail ([`snapshot_after`]).
pub(crate) fn ledger_options() -> LedgerOptions {
    let mut opts = LedgerOptions::default();
    opts.log.create = false;
    opts.snapshot_every_records = u64::MAX;
    opts.snapshot_every_bytes = u64::MAX;
    opts
}

/// Records replayed at open (after the newest snapshot) from which a mutation
/// writes a snapshot at its end, with the checkpoint that vouches for it (see
/// `Ledger::snapshot_if_tail_exceeds`: not if the state has more than four
/// entries per record of the tail, nor if a newer snapshot was written
/// meanwhile): the runner's bound, so that an open of a log written only by
/// commands replays about this many records.
const TAIL_RECORDS_SNAPSHOT_MIN: u64 = fencelog::supervisor::runner::TAIL_RECORDS_SNAPSHOT_MIN;

/// `op` on the log of `dir`, then a snapshot if its open replayed a long tail
/// (once the answer is durable; a snapshot that cannot be written is a warning).
fn snapshot_after<T>(dir: &Dir, op: impl FnOnce(&Ledger) -> Result<T, ops::OpError>) -> Result<T, ops::OpError> {
    let ledger = open(dir)?;
    let r = op(&ledger);
    if let Err(e) = ledger.snapshot_if_tail_exceeds(TAIL_RECORDS_SNAPSHOT_MIN) {
        tracing::warn!(error = %e, "no snapshot written");
    }
    r
}

pub(crate) fn open(dir: &Dir) -> Result<Ledger, ops::OpError> {
    Ok(Ledger::open_at(&dir.location()?, ledger_options())?)
}

/// The log read-only (nothing written, locked or created).
pub(crate) fn read_only(dir: &Dir) -> Result<fencelog::ledger::ReadView, ops::OpError> {
    Ok(Ledger::read_only_at(&dir.location()?, &ledger_options())?)
}

/// A claim or takeover without `--pid` is held for the process that ran us.
fn caller() -> Caller {
    Caller { default_pid: Some(identity::parent_pid()), remote: false }
}

/// A mutation as its typed request: what the command line asks for, whichever
/// way it then goes (the directory, or a daemon with `--server`).
pub(crate) enum Op {
    Claim(ops::ClaimRequest),
    Generation(GenerationOp, GenerationRequest),
    Note(ops::NoteRequest),
    Takeover(ops::TakeoverRequest),
    LeaseAcquire(ops::LeaseAcquireRequest),
    LeaseRelease(ops::LeaseReleaseRequest),
    Run(fencelog::supervisor::RunRequest),
}

// Long on purpose: a flat dispatcher, one arm per mutation, each arm a field-for-
// field move of the command's arguments into its typed request (rustfmt gives each
// field its own line). Cut up, the mapping from commands to requests would only be
// scattered over functions that each hold one arm.
/// The mutation a command is, with its directory arguments; any other command
/// is given back.
pub(crate) fn op_of(cmd: Cmd) -> Result<(Dir, Op), Box<Cmd>> {
    let g = |op, subject, generation, instance, req: crate::cli::Req| {
        Op::Generation(op, GenerationRequest { subject, generation, request_id: req.request_id, instance })
    };
    Ok(match cmd {
        Cmd::Claim { dir, subject, pid, instance, stale_after_ms, action, req } => (
            dir,
            Op::Claim(ops::ClaimRequest { subject, pid, instance, stale_after_ms, action, request_id: req.request_id }),
        ),
        Cmd::Heartbeat { dir, subject, generation, instance, req } => {
            (dir, g(GenerationOp::Heartbeat, subject, generation, instance, req))
        }
        Cmd::Release { dir, subject, generation, instance, req } => {
            (dir, g(GenerationOp::Release, subject, generation, instance, req))
        }
        Cmd::RotateFence { dir, subject, generation, instance, req } => {
            (dir, g(GenerationOp::RotateFence, subject, generation, instance, req))
        }
        Cmd::Note { dir, subject, generation, text, instance, req } => {
            (dir, Op::Note(ops::NoteRequest { subject, generation, text, request_id: req.request_id, instance }))
        }
        Cmd::Takeover {
            dir,
            subject,
            expect_generation,
            expect_heartbeat_ms,
            pid,
            instance,
            stale_after_ms,
            reason,
            req,
        } => (
            dir,
            Op::Takeover(ops::TakeoverRequest {
                subject,
                expect_generation,
                expect_heartbeat_ms,
                pid,
                instance,
                stale_after_ms,
                reason,
                request_id: req.request_id,
            }),
        ),
        Cmd::Lease { cmd: LeaseCmd::Acquire { dir, resource, mode, holder, owner, generation, ttl_ms, req } } => (
            dir,
            Op::LeaseAcquire(ops::LeaseAcquireRequest {
                resource,
                mode: match mode {
                    Mode::Read => LeaseMode::Read,
                    Mode::Write => LeaseMode::Write,
                },
                holder: holder.unwrap_or_default(),
                owner,
                generation,
                ttl_ms,
                request_id: req.request_id,
            }),
        ),
        Cmd::Lease { cmd: LeaseCmd::Release { dir, lease, token, req } } => {
            (dir, Op::LeaseRelease(ops::LeaseReleaseRequest { lease, token, request_id: req.request_id }))
        }
        Cmd::Run {
            dir,
            req,
            leases,
            lease_wait_ms,
            timeout_ms,
            wait_ms,
            cwd,
            env,
            output_bytes_max,
            owner,
            generation,
            command,
        } => (
            dir,
            Op::Run(fencelog::supervisor::RunRequest {
                command,
                request_id: req.request_id,
                leases,
                lease_wait_ms,
                timeout_ms,
                wait_ms,
                cwd,
                env,
                output_bytes_max,
                owner,
                generation,
            }),
        ),
        other => return Err(Box::new(other)),
    })
}

/// A mutation on the directory.
pub(crate) fn run_op(dir: &Dir, op: Op) -> Printed {
    match op {
        Op::Claim(r) => {
            ops::valid(&r.subject)?;
            printed(&snapshot_after(dir, |l| ops::claim(l, &r, caller()))?)
        }
        Op::Generation(op, r) => {
            ops::valid(&r.subject)?;
            printed(&snapshot_after(dir, |l| ops::generation(l, op, &r, caller()))?)
        }
        Op::Note(r) => {
            ops::valid(&r.subject)?;
            printed(&snapshot_after(dir, |l| ops::note(l, &r, caller()))?)
        }
        Op::Takeover(r) => {
            ops::valid(&r.subject)?;
            printed(&snapshot_after(dir, |l| ops::takeover(l, &r, caller()))?)
        }
        Op::LeaseAcquire(r) => printed(&snapshot_after(dir, |l| ops::lease_acquire(l, &r))?),
        Op::LeaseRelease(r) => printed(&snapshot_after(dir, |l| ops::lease_release(l, &r))?),
        // Its runner writes the snapshot (after its exit is on record).
        Op::Run(r) => {
            let ledger = open(dir)?;
            let exe =
                std::env::current_exe().map_err(|e| ops::OpError::Io { message: format!("own executable: {e}") })?;
            let state = dir.state_dir("run")?;
            if dir.etcd.is_some() {
                // This host's local state of a log in etcd: made 0700 on first use.
                use std::os::unix::fs::DirBuilderExt;
                std::fs::DirBuilder::new()
                    .recursive(true)
                    .mode(0o700)
                    .create(state)
                    .map_err(|e| ops::OpError::Io { message: format!("creating {}: {e}", state.display()) })?;
            }
            let abs = std::path::absolute(state)
                .map_err(|e| ops::OpError::Io { message: format!("{}: {e}", state.display()) })?;
            // This process starts one runner and has one thread: a fork of it
            // spares the runner an exec of this binary.
            fencelog::supervisor::fork_fresh_runners();
            printed(&fencelog::supervisor::run(&ledger, &abs, &r, &exe)?)
        }
    }
}

/// The commands on a log's state that are not mutations.
pub(crate) fn run(cmd: Cmd) -> Printed {
    match cmd {
        Cmd::Request { cmd: RequestCmd::Show { dir, id } } => printed(&ops::request_show(&read_only(&dir)?, &id)?),
        Cmd::State { dir, subject } => {
            if let Some(s) = &subject {
                ops::valid(s)?;
            }
            let view = read_only(&dir)?;
            printed(&ops::state(&view, subject.as_deref(), LogOptions::default().now_ms())?)
        }
        Cmd::Init { dir } => match dir.location()? {
            fencelog::storage::Location::Etcd(e) => printed(&fencelog::storage::etcd::EtcdBackend::init(&e)?),
            _ => printed(&fencelog::storage::init(dir.path(), LogOptions::default())?),
        },
        Cmd::Repair { dir, cut_from } => {
            let r = match dir.location()? {
                #[cfg(feature = "etcd")]
                fencelog::storage::Location::Etcd(e) => {
                    let log = fencelog::storage::etcd::EtcdBackend::open_unchecked(&e, &LogOptions::default())?;
                    log.repair(cut_from, LogOptions::default().now_ms())?
                }
                _ => fencelog::storage::repair(dir.path(), cut_from, &LogOptions::default())?,
            };
            Ok((serde_json::to_value(&r).expect("report serializes"), if r.intact { 0 } else { 1 }))
        }
        Cmd::Claim { .. }
        | Cmd::Heartbeat { .. }
        | Cmd::Release { .. }
        | Cmd::RotateFence { .. }
        | Cmd::Note { .. }
        | Cmd::Takeover { .. }
        | Cmd::Lease { .. }
        | Cmd::Inspect { .. }
        | Cmd::Audit { .. }
        | Cmd::Run { .. }
        | Cmd::Process { .. }
        | Cmd::Recover { .. }
        | Cmd::Runner { .. }
        | Cmd::Export { .. }
        | Cmd::Import { .. }
        | Cmd::Archive { .. }
        | Cmd::Completions { .. }
        | Cmd::Man { .. }
        | Cmd::Version { .. }
        | Cmd::Serve { .. } => unreachable!("dispatched in main"),
    }
}
