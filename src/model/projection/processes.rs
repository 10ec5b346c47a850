//! Supervised processes: judging and applying a spawn, its start, a cancel and
//! its end.

use super::leases::HeldBy;
use super::{GrantedLease, Ids, LeaseState, Outcome, Projection, refuse};
use crate::model::types::{validate_subject, validate_text};
use crate::model::{
    ARGS_BYTES_MAX, ARGS_MAX, CommandSpec, ENV_ENTRIES_MAX, Ended, Event, LeaseWant, OUTPUT_TAIL_BYTES_MAX, OwnerRef,
    PATH_BYTES_MAX, PROCESS_LEASES_MAX, Process, ProcessEnd, Refusal, Started,
};

/// A lease held by a process never expires by time: it ends with the process.
pub const LEASE_HELD_UNTIL_END_MS: u64 = u64::MAX;

/// The holder name of the leases a process holds.
pub fn process_holder(process: u64) -> String {
    format!("process:{process}")
}

impl Projection {
    /// A spawn intent: the next process id, and the leases it holds, all or none.
    pub(super) fn check_spawn(
        &self,
        now_ms: u64,
        command: &CommandSpec,
        owner: Option<&OwnerRef>,
        leases: &[LeaseWant],
        ids: &mut Ids,
    ) -> Result<Outcome, Refusal> {
        validate_command(command)?;
        if let Some(o) = owner {
            validate_subject(&o.subject)?;
            self.owner_at(&o.subject, o.generation)?;
        }
        if leases.len() > PROCESS_LEASES_MAX {
            return refuse(Refusal::InvalidInput {
                detail: format!("a process holds at most {PROCESS_LEASES_MAX} leases"),
            });
        }
        let mut granted = Vec::new();
        let mut displaced = Vec::new();
        for want in leases {
            validate_subject(&want.resource)?;
            let (token, mut gone) = self.lease_grant(&want.resource, want.mode, now_ms)?;
            ids.lease += 1;
            granted.push(GrantedLease { lease: ids.lease, resource: want.resource.clone(), mode: want.mode, token });
            displaced.append(&mut gone);
        }
        ids.process += 1;
        Ok(Outcome::SpawnRecorded { process: ids.process, leases: granted, displaced })
    }

    pub(super) fn check_process_started(&self, process: u64, command_pid: u32) -> Result<Outcome, Refusal> {
        let p = self.live_process(process)?;
        if let Some(s) = &p.started {
            return refuse(Refusal::AlreadyStarted { process, runner_pid: s.runner.pid });
        }
        Ok(Outcome::ProcessStarted { process, command_pid })
    }

    pub(super) fn check_cancel_requested(&self, process: u64, by: Option<&OwnerRef>) -> Result<Outcome, Refusal> {
        let p = self.live_process(process)?;
        self.cancel_allowed(p, by)?;
        if p.started.is_none() {
            return refuse(Refusal::NotRunning { process, status: p.status().as_str().into() });
        }
        Ok(Outcome::CancelRecorded { process })
    }

    pub(super) fn check_process_ended(&self, process: u64, end: &ProcessEnd) -> Result<Outcome, Refusal> {
        let p = self.live_process(process)?;
        let needs_start = matches!(end, ProcessEnd::Exited(_) | ProcessEnd::CompletedUnknown { .. });
        if needs_start && p.started.is_none() {
            return refuse(Refusal::NotRunning { process, status: p.status().as_str().into() });
        }
        // "Never ran" is only true of a process no runner started.
        if let (ProcessEnd::Failed { .. }, Some(s)) = (end, &p.started) {
            return refuse(Refusal::AlreadyStarted { process, runner_pid: s.runner.pid });
        }
        if let ProcessEnd::Exited(x) = end
            && (x.stdout.tail.len() > OUTPUT_TAIL_BYTES_MAX || x.stderr.tail.len() > OUTPUT_TAIL_BYTES_MAX)
        {
            return refuse(Refusal::InvalidInput {
                detail: format!("an output tail is at most {OUTPUT_TAIL_BYTES_MAX} bytes"),
            });
        }
        match end {
            ProcessEnd::Failed { code, detail } => {
                validate_text("code", code)?;
                validate_text("detail", detail)?;
            }
            ProcessEnd::CompletedUnknown { runner, .. } => validate_text("runner", runner)?,
            ProcessEnd::Exited(_) => {}
        }
        let leases_released = p.leases.iter().copied().filter(|id| self.lease_is_live(*id)).collect();
        Ok(Outcome::ProcessEnded { process, status: end.status(), leases_released })
    }

    /// May the presenter of `by` cancel `p`? A process run for an owner is
    /// cancelled only by that subject's *current* generation (a fenced or absent
    /// one is `FENCED`, presented 0 when none); an unowned one by anyone (a
    /// presented generation must still be current).
    pub fn cancel_allowed(&self, p: &Process, by: Option<&OwnerRef>) -> Result<(), Refusal> {
        match (&p.owner, by) {
            (Some(owner), None) => refuse(self.fenced(&owner.subject, 0)),
            (Some(owner), Some(b)) if b.subject != owner.subject => refuse(Refusal::InvalidInput {
                detail: format!("process {} runs for {}, not {}", p.id, owner.subject, b.subject),
            }),
            (_, Some(b)) => self.owner_at(&b.subject, b.generation).map(|_| ()),
            (None, None) => Ok(()),
        }
    }

    /// A process that has not ended, or why not.
    fn live_process(&self, process: u64) -> Result<&Process, Refusal> {
        let Some(p) = self.processes.get(&process) else {
            return refuse(Refusal::UnknownProcess { process });
        };
        if let Some(e) = &p.ended {
            return refuse(Refusal::AlreadyTerminal { process, status: e.end.status().as_str().into(), seq: e.seq });
        }
        Ok(p)
    }

    /// A spawn records its process, holding its leases (the expired ones they
    /// displace end).
    pub(super) fn mutate_spawn(&mut self, seq: u64, now_ms: u64, request: Option<&str>, e: &Event, o: &Outcome) {
        let (
            Event::SpawnRequested { fingerprint, command, owner, timeout_ms, output_bytes_max, .. },
            Outcome::SpawnRecorded { process, leases, displaced },
        ) = (e, o)
        else {
            return;
        };
        for id in displaced {
            if self.lease_is_live(*id) {
                self.end_lease(*id, LeaseState::Displaced { seq }, seq);
            }
        }
        for g in leases {
            self.install_lease(
                seq,
                g.lease,
                &g.resource,
                g.mode,
                process_holder(*process),
                g.token,
                LEASE_HELD_UNTIL_END_MS,
                HeldBy::Process(*process),
            );
        }
        self.last_process_id = *process;
        self.processes.insert(
            *process,
            Process {
                id: *process,
                request: request.map(str::to_owned),
                fingerprint: *fingerprint,
                command: command.clone(),
                owner: owner.clone(),
                leases: leases.iter().map(|g| g.lease).collect(),
                timeout_ms: *timeout_ms,
                output_bytes_max: *output_bytes_max,
                requested_seq: seq,
                requested_ms: now_ms,
                host: None,
                started: None,
                cancel_requested_seq: None,
                ended: None,
            },
        );
    }

    pub(super) fn mutate_process_started(&mut self, seq: u64, now_ms: u64, e: &Event) {
        let Event::ProcessStarted { process, runner, command_pid, command_start_ticks } = e else {
            return;
        };
        let p = self.processes.get_mut(process).expect("checked");
        p.started = Some(Started {
            runner: runner.clone(),
            command_pid: *command_pid,
            command_start_ticks: *command_start_ticks,
            seq,
            time_ms: now_ms,
        });
    }

    pub(super) fn mutate_cancel_requested(&mut self, seq: u64, e: &Event) {
        let Event::ProcessCancelRequested { process, .. } = e else {
            return;
        };
        self.processes.get_mut(process).expect("checked").cancel_requested_seq = Some(seq);
    }

    /// A process's end releases the leases it held.
    pub(super) fn mutate_process_ended(&mut self, seq: u64, now_ms: u64, e: &Event, o: &Outcome) {
        let (Event::ProcessEnded { process, end }, Outcome::ProcessEnded { leases_released, .. }) = (e, o) else {
            return;
        };
        for id in leases_released {
            self.end_lease(*id, LeaseState::Released { seq }, seq);
        }
        let p = self.processes.get_mut(process).expect("checked");
        p.ended = Some(Ended { seq, time_ms: now_ms, end: end.clone(), leases_released: leases_released.clone() });
        self.remember_terminal_process(seq, *process);
    }
}

fn validate_command(c: &CommandSpec) -> Result<(), Refusal> {
    let bad = |detail: String| refuse(Refusal::InvalidInput { detail });
    if c.argv.is_empty() || c.argv.len() > ARGS_MAX {
        return bad(format!("a command has 1..={ARGS_MAX} arguments (argv[0] included)"));
    }
    if c.argv.iter().map(String::len).sum::<usize>() > ARGS_BYTES_MAX {
        return bad(format!("a command's arguments total at most {ARGS_BYTES_MAX} bytes"));
    }
    if c.exe.len() > PATH_BYTES_MAX || c.cwd.len() > PATH_BYTES_MAX || c.exe_fingerprint.len() > PATH_BYTES_MAX {
        return bad(format!("a path is at most {PATH_BYTES_MAX} bytes"));
    }
    if c.env.len() > ENV_ENTRIES_MAX || c.env.iter().any(|e| e.name.is_empty() || e.name.len() > PATH_BYTES_MAX) {
        return bad(format!("at most {ENV_ENTRIES_MAX} environment entries, each with a name"));
    }
    Ok(())
}
