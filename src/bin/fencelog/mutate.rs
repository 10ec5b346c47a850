//! Commands on a log's state: mutations (through `fencelog::ops`), the read-only
//! `state` and `request show`, and `init` / `repair`.

use fencelog::ledger::{Ledger, LedgerOptions, identity};
use fencelog::model::LeaseMode;
use fencelog::ops::{self, Caller, GenerationOp, GenerationRequest};
use fencelog::storage::LogOptions;

use crate::cli::{Cmd, Dir, LeaseCmd, Mode, RequestCmd};
use crate::{Printed, printed};

/// The command line never creates a log by accident: only `init` does.
pub(crate) fn ledger_options() -> LedgerOptions {
    let mut opts = LedgerOptions::default();
    opts.log.create = false;
    opts
}

pub(crate) fn open(dir: &Dir) -> Result<Ledger, ops::OpError> {
    Ok(Ledger::open(dir.path(), ledger_options())?)
}

/// A claim or takeover without `--pid` is held for the process that ran us.
fn caller() -> Caller {
    Caller { default_pid: Some(identity::parent_pid()), remote: false }
}

pub(crate) fn run(cmd: Cmd) -> Printed {
    match cmd {
        Cmd::Claim { dir, subject, pid, instance, stale_after_ms, action, req } => {
            let r = ops::ClaimRequest { subject, pid, instance, stale_after_ms, action, request_id: req.request_id };
            ops::valid(&r.subject)?;
            printed(&ops::claim(&open(&dir)?, &r, caller())?)
        }
        Cmd::Heartbeat { dir, subject, generation, req } => generation_op(
            &dir,
            GenerationOp::Heartbeat,
            GenerationRequest { subject, generation, request_id: req.request_id },
        ),
        Cmd::Release { dir, subject, generation, req } => generation_op(
            &dir,
            GenerationOp::Release,
            GenerationRequest { subject, generation, request_id: req.request_id },
        ),
        Cmd::RotateFence { dir, subject, generation, req } => generation_op(
            &dir,
            GenerationOp::RotateFence,
            GenerationRequest { subject, generation, request_id: req.request_id },
        ),
        Cmd::Note { dir, subject, generation, text, req } => {
            let r = ops::NoteRequest { subject, generation, text, request_id: req.request_id };
            ops::valid(&r.subject)?;
            printed(&ops::note(&open(&dir)?, &r)?)
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
        } => {
            let r = ops::TakeoverRequest {
                subject,
                expect_generation,
                expect_heartbeat_ms,
                pid,
                instance,
                stale_after_ms,
                reason,
                request_id: req.request_id,
            };
            ops::valid(&r.subject)?;
            printed(&ops::takeover(&open(&dir)?, &r, caller())?)
        }
        Cmd::Lease { cmd: LeaseCmd::Acquire { dir, resource, mode, holder, owner, generation, ttl_ms, req } } => {
            let mode = match mode {
                Mode::Read => LeaseMode::Read,
                Mode::Write => LeaseMode::Write,
            };
            let r = ops::LeaseAcquireRequest {
                resource,
                mode,
                holder: holder.unwrap_or_default(),
                owner,
                generation,
                ttl_ms,
                request_id: req.request_id,
            };
            printed(&ops::lease_acquire(&open(&dir)?, &r)?)
        }
        Cmd::Lease { cmd: LeaseCmd::Release { dir, lease, token, req } } => {
            let r = ops::LeaseReleaseRequest { lease, token, request_id: req.request_id };
            printed(&ops::lease_release(&open(&dir)?, &r)?)
        }
        Cmd::Request { cmd: RequestCmd::Show { dir, id } } => {
            printed(&ops::request_show(&Ledger::read_only(dir.path(), &ledger_options())?, &id)?)
        }
        Cmd::State { dir, subject } => {
            if let Some(s) = &subject {
                ops::valid(s)?;
            }
            let view = Ledger::read_only(dir.path(), &ledger_options())?;
            printed(&ops::state(&view, subject.as_deref(), LogOptions::default().now_ms())?)
        }
        Cmd::Init { dir } => printed(&fencelog::storage::init(dir.path(), LogOptions::default())?),
        Cmd::Repair { dir, cut_from } => {
            let r = fencelog::storage::repair(dir.path(), cut_from, &LogOptions::default())?;
            Ok((serde_json::to_value(&r).expect("report serializes"), if r.intact { 0 } else { 1 }))
        }
        Cmd::Demo { .. }
        | Cmd::Inspect { .. }
        | Cmd::Audit { .. }
        | Cmd::Run { .. }
        | Cmd::Process { .. }
        | Cmd::Recover { .. }
        | Cmd::Runner { .. }
        | Cmd::Serve { .. } => unreachable!("dispatched in main"),
    }
}

fn generation_op(dir: &Dir, op: GenerationOp, r: GenerationRequest) -> Printed {
    ops::valid(&r.subject)?;
    printed(&ops::generation(&open(dir)?, op, &r)?)
}
