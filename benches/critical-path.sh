#!/usr/bin/env bash
# Where one heartbeat's time goes, at one client (issue 28, item 3): the serve
# bench's daemon at one client, its syscalls and its client's traced for
# $SECONDS_TRACED seconds with `perf` (kernel tracepoints, all CPUs), then each
# request cut at the moments the syscalls mark:
#
#   in            the client's send      -> the daemon's read of the request
#   pre_lock      that read              -> the daemon's first flock (the append lock)
#   lock_to_sync  that flock             -> its fdatasync begins
#   sync          the fdatasync
#   post          the fdatasync's end    -> the daemon's send of the answer
#   out           that send              -> the client's read of it
#   client        the client's read      -> its next send
#
# Needs root (or perf_event_paranoid <= -1), perf, python3. Usage, from the
# repository's root: bash benches/critical-path.sh
set -euo pipefail
SECONDS_TRACED=${SECONDS_TRACED:-0.6}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
# (Builds the bench if needed, and names its executable.)
. "$(dirname "$0")/bench-exe.sh"
bench=$(bench_exe serve)
"$bench" --bench --quick --json --clients 1 --no-etcd >"$out/bench.json" 2>/dev/null &
bench_pid=$!
daemon=""
for _ in $(seq 200); do
  daemon=$(pgrep -P "$bench_pid" -f "serve --dir" | head -1 || true)
  [ -n "$daemon" ] && break
  sleep 0.05
done
[ -n "$daemon" ] || { echo "the bench's daemon did not start" >&2; exit 1; }
# The first round's heartbeats begin after the raw syncs: wait for them.
sleep 0.4
events=recvfrom,fdatasync,sendto
perf record -q -a -o "$out/perf.data" \
  $(for e in ${events//,/ }; do printf -- '-e syscalls:sys_enter_%s -e syscalls:sys_exit_%s ' "$e" "$e"; done) \
  -e syscalls:sys_enter_flock -- sleep "$SECONDS_TRACED" 2>/dev/null
wait "$bench_pid" || true
perf script -i "$out/perf.data" -F comm,pid,tid,time,event,trace 2>/dev/null >"$out/trace.txt"
python3 - "$daemon" "$bench_pid" "$out/trace.txt" <<'EOF'
import re, statistics, sys
daemon, client, path = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
marks = []
for line in open(path):
    m = re.match(r'\s*(\S+)\s+(\d+)/(\d+)\s+([\d.]+):\s+syscalls:(\S+):\s*(.*)', line)
    if not m:
        continue
    _, pid, _, t, event, rest = m.groups()
    pid, t = int(pid), float(t) * 1e6
    failed = event.startswith('sys_exit') and rest.startswith('0xfffff')
    name = {
        (client, 'sys_enter_sendto'): 'c_send', (client, 'sys_exit_recvfrom'): 'c_recv',
        (daemon, 'sys_exit_recvfrom'): 'd_recv', (daemon, 'sys_enter_flock'): 'd_flock',
        (daemon, 'sys_enter_fdatasync'): 'd_s0', (daemon, 'sys_exit_fdatasync'): 'd_s1',
        (daemon, 'sys_enter_sendto'): 'd_send',
    }.get((pid, event))
    if name and not failed:
        marks.append((name, t))
order = ['d_recv', 'd_flock', 'd_s0', 'd_s1', 'd_send', 'c_recv']
cuts = {k: [] for k in ['in', 'pre_lock', 'lock_to_sync', 'sync', 'post', 'out', 'client', 'total']}
i, last_recv = 0, None
while i < len(marks):
    if marks[i][0] != 'c_send':
        i += 1
        continue
    at, k, ok = {'c_send': marks[i][1]}, i + 1, True
    for w in order:
        while k < len(marks) and marks[k][0] != w and marks[k][0] != 'c_send':
            k += 1
        if k >= len(marks) or marks[k][0] != w:
            ok = False
            break
        at[w] = marks[k][1]
        k += 1
    if not ok:
        i += 1
        last_recv = None
        continue
    for name, (a, b) in {'in': ('c_send', 'd_recv'), 'pre_lock': ('d_recv', 'd_flock'),
                         'lock_to_sync': ('d_flock', 'd_s0'), 'sync': ('d_s0', 'd_s1'),
                         'post': ('d_s1', 'd_send'), 'out': ('d_send', 'c_recv'),
                         'total': ('c_send', 'c_recv')}.items():
        cuts[name].append(at[b] - at[a])
    if last_recv is not None:
        cuts['client'].append(at['c_send'] - last_recv)
    last_recv, i = at['c_recv'], k
if not cuts['total']:
    sys.exit('no whole request was traced')
for name, v in cuts.items():
    if v:
        print(f'{name:13s} p50 {statistics.median(v):7.1f} us   mean {statistics.mean(v):7.1f} us   (n={len(v)})')
EOF
