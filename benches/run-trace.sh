#!/usr/bin/env bash
# Where `fencelog run -- /bin/true` spends its time (issue 28, item 1): a log of
# $WARM_RUNS earlier runs, then $RUNS runs one after another, every system call of
# every process traced with `perf` (kernel tracepoints, all CPUs, perf's own
# excluded). Each run is cut where its processes' system calls mark it:
#
#   start        the CLI's execve                -> its first flock (the log's open begins)
#   open         that flock                      -> the intent's fdatasync begins
#   intent       the intent's fdatasync
#   to_fork      its end                         -> the runner forked
#   runner_open  the fork                        -> the start record's fdatasync begins
#   start_rec    the start record's fdatasync
#   to_command   its end                         -> the command's execve
#   command      that execve                     -> the exit record's fdatasync begins
#   exit_rec     the exit record's fdatasync
#   to_wake      its end                         -> the CLI awake (its poll of the runner returns)
#   answer       awake                           -> the answer written
#   exit         written                         -> the CLI's exit_group
#
# p50 over the runs, in µs, under the trace (which slows system calls: compare
# steps with each other, and totals with the supervise bench's own figures).
#
# Needs root (or perf_event_paranoid <= -1), perf, python3, a release build.
# Usage, from the repository's root: bash benches/run-trace.sh [FENCELOG]
set -euo pipefail
RUNS=${RUNS:-40}
WARM_RUNS=${WARM_RUNS:-300}
exe=${1:-target/release/fencelog}
[ -x "$exe" ] || cargo build --release --bin fencelog
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
# A copy, as an installed binary is (see `copy_of_this_build` in supervise.rs).
cp "$exe" "$out/fencelog"
"$out/fencelog" init --dir "$out/log" >/dev/null
for _ in $(seq "$WARM_RUNS"); do "$out/fencelog" run --dir "$out/log" -- /bin/true >/dev/null; done
perf record -q -a -o "$out/perf.data" -e raw_syscalls:sys_enter -e raw_syscalls:sys_exit --exclude-perf -- \
  bash -c "for _ in \$(seq $RUNS); do '$out/fencelog' run --dir '$out/log' -- /bin/true >/dev/null; done" 2>/dev/null
perf script -i "$out/perf.data" -F comm,pid,tid,time,event,trace 2>/dev/null >"$out/trace.txt"
python3 - "$out/trace.txt" <<'EOF'
import collections, re, statistics, sys
NR = {'write': 1, 'poll': 7, 'clone': 56, 'fork': 57, 'execve': 59, 'flock': 73, 'fdatasync': 75,
      'exit_group': 231, 'ppoll': 271, 'clone3': 435}
ev = collections.defaultdict(list)  # pid -> [(t_us, 'enter'|'exit', nr, comm, rest)]
for line in open(sys.argv[1]):
    m = re.match(r'\s*(.+?)\s+(\d+)/(\d+)\s+([\d.]+):\s+raw_syscalls:(sys_enter|sys_exit):\s*NR (\d+)\s*(.*)', line)
    if m:
        comm, pid, tid, t, what, nr, rest = m.groups()
        ev[int(tid)].append((float(t) * 1e6, what[4:], int(nr), comm, rest))

def first(pid, what, nr, after=0.0, cond=None):
    for e in ev.get(pid, []):
        if e[0] >= after and e[1] == what and e[2] == nr and (cond is None or cond(e)):
            return e
    return None

def ret(e):
    m = re.search(r'= (-?\d+)', e[4])
    return int(m.group(1)) if m else None

def fork_child(pid, after):
    # Children of `pid` (the return of clone, fork or clone3 in the parent),
    # threads included: the caller keeps the first one that calls fdatasync.
    for e in ev.get(pid, []):
        if e[0] >= after and e[1] == 'exit' and e[2] in (NR['clone'], NR['fork'], NR['clone3']):
            c = ret(e)
            if c and c > 0:
                yield e[0], c

runs = []
for pid, es in ev.items():
    ex = [e for e in es if e[1] == 'exit' and e[2] == NR['execve'] and e[3] == 'fencelog']
    if not ex:
        continue
    t_exec = max(e[0] for e in es if e[1] == 'enter' and e[2] == NR['execve'] and e[0] <= ex[0][0])
    lock = first(pid, 'enter', NR['flock'], t_exec)
    intent_in = first(pid, 'enter', NR['fdatasync'], t_exec)
    if not (lock and intent_in):
        continue  # the runner of a run, or a gate
    intent_out = first(pid, 'exit', NR['fdatasync'], intent_in[0])
    runner = None
    for t_fork, c in fork_child(pid, intent_out[0]):
        if first(c, 'enter', NR['fdatasync']):
            runner = (t_fork, c)
            break
    if runner is None:
        continue
    t_fork, r = runner
    start_in = first(r, 'enter', NR['fdatasync'])
    start_out = first(r, 'exit', NR['fdatasync'], start_in[0])
    cmd = None
    for e in (x for es2 in ev.values() for x in es2):
        if e[1] == 'enter' and e[2] == NR['execve'] and e[0] >= start_out[0] and (cmd is None or e[0] < cmd[0]):
            cmd = e
    exit_in = first(r, 'enter', NR['fdatasync'], start_out[0])
    exit_out = first(r, 'exit', NR['fdatasync'], exit_in[0]) if exit_in else None
    wake = None
    if exit_out:
        for e in es:
            if e[0] >= exit_out[0] and e[1] == 'exit' and e[2] in (NR['poll'], NR['ppoll']):
                wake = e
                break
    answer = first(pid, 'enter', NR['write'], wake[0]) if wake else None
    end = first(pid, 'enter', NR['exit_group'], answer[0]) if answer else None
    if not (cmd and exit_out and wake and answer and end) or cmd[0] > exit_in[0]:
        continue
    marks = [t_exec, lock[0], intent_in[0], intent_out[0], t_fork, start_in[0], start_out[0], cmd[0],
             exit_in[0], exit_out[0], wake[0], answer[0], end[0]]
    runs.append([b - a for a, b in zip(marks, marks[1:])] + [end[0] - t_exec])
if not runs:
    sys.exit('no whole run was traced')
names = ['start', 'open', 'intent', 'to_fork', 'runner_open', 'start_rec', 'to_command', 'command',
         'exit_rec', 'to_wake', 'answer', 'exit', 'whole']
print(f'runs traced: {len(runs)}; p50 of each step, µs (under the trace):')
for i, n in enumerate(names):
    print(f'  {n:12s} {statistics.median(r[i] for r in runs):8.0f}')
EOF
