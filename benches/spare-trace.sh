#!/usr/bin/env bash
# Where a spare runner's run spends its time (issue 28, item 1): the supervise
# bench's quick run, every system call of every process traced with `perf` for
# $SECONDS_TRACED seconds (kernel tracepoints, all CPUs, perf's own excluded),
# then each spare run cut from the caller's send of the assignment to its wake
# with the answer. For each kind of system call, the time spent in it by all
# processes during a run (its median over the runs traced), and how long the
# runs took under the trace (the trace slows them: compare kinds, not totals,
# with the bench's own figures).
#
# Needs root (or perf_event_paranoid <= -1), perf, python3. Usage, from the
# repository's root: bash benches/spare-trace.sh
set -euo pipefail
SECONDS_TRACED=${SECONDS_TRACED:-1.0}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
# (Builds the bench if needed, and names its executable.)
. "$(dirname "$0")/bench-exe.sh"
bench=$(bench_exe supervise)
"$bench" --bench --quick --json >"$out/bench.json" 2>/dev/null &
bench_pid=$!
# Past the raw syncs and the direct spawns of the first round.
sleep 4
perf record -q -a -o "$out/perf.data" \
  -e raw_syscalls:sys_enter -e raw_syscalls:sys_exit --exclude-perf -- sleep "$SECONDS_TRACED" 2>/dev/null
wait "$bench_pid" || true
perf script -i "$out/perf.data" -F comm,pid,tid,time,event,trace 2>/dev/null >"$out/trace.txt"
python3 - "$bench_pid" "$out/trace.txt" <<'EOF'
import collections, re, statistics, sys
caller, path = int(sys.argv[1]), sys.argv[2]
names = {0: 'read', 1: 'write', 3: 'close', 7: 'poll', 17: 'pread64', 18: 'pwrite64', 44: 'sendto',
         45: 'recvfrom', 56: 'clone', 59: 'execve', 61: 'wait4', 73: 'flock', 75: 'fdatasync', 83: 'mkdir',
         9: 'mmap', 10: 'mprotect', 11: 'munmap', 90: 'chmod', 91: 'fchmod', 202: 'futex', 257: 'openat', 271: 'ppoll', 332: 'statx', 435: 'clone3',
         316: 'renameat2', 84: 'rmdir', 87: 'unlink', 263: 'unlinkat'}
runs, run, pending = [], None, {}
for line in open(path):
    m = re.match(r'\s*(.+?)\s+(\d+)/(\d+)\s+([\d.]+):\s+raw_syscalls:(sys_enter|sys_exit):\s*NR (\d+)\s*(.*)', line)
    if not m:
        continue
    _, pid, tid, t, what, nr, rest = m.groups()
    pid, tid, t, nr = int(pid), int(tid), float(t) * 1e6, int(nr)
    if what == 'sys_enter':
        pending[tid] = t
        # The caller's send of an assignment (the process id, the environment:
        # more than the 16 bytes of its header) begins a run.
        if tid == caller and nr == 44 and int(rest.strip('()').split(', ')[2], 16) > 16:
            run = {'t0': t, 'in': collections.Counter()}
        continue
    began = pending.pop(tid, None)
    if began is None or run is None or began < run['t0']:
        continue
    run['in'][names.get(nr, f'NR {nr}')] += t - began
    # The caller's wake with the answer (its poll of the runner's pipe) ends it.
    if tid == caller and nr in (7, 271):
        run['total'] = t - run['t0']
        runs.append(run)
        run = None
if not runs:
    sys.exit('no whole spare run was traced')
kinds = collections.Counter()
for r in runs:
    kinds.update(r['in'])
print(f'spare runs traced: {len(runs)}; each, from the assignment sent to the caller awake: '
      f'p50 {statistics.median(r["total"] for r in runs):.0f} us (under the trace)')
print('time in each kind of system call during a run, all processes (median over the runs, us):')
for name, _ in kinds.most_common(14):
    print(f'  {name:10s} {statistics.median(r["in"].get(name, 0.0) for r in runs):8.1f}')
EOF
