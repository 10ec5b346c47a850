#!/usr/bin/env bash
# An etcd cluster on loopback, for the tests, the benchmarks and the README's
# "Beyond one machine" (Debian's etcd-server and etcd-client: etcd 3.4).
#
#   scripts/etcd-cluster.sh start DIR [MEMBERS]   # 1 or 3 (default 3) members, free ports
#                                                 # below the ephemeral range
#   scripts/etcd-cluster.sh restart DIR NAME      # start member NAME again (same data, ports)
#   scripts/etcd-cluster.sh stop DIR              # stop every member started in DIR
#
# `start` prints one JSON line once every member answers:
#   {"endpoints": "127.0.0.1:P1,127.0.0.1:P2,...",
#    "members": [{"name": "m1", "pid": PID, "client": P1, "peer": Q1}, ...]}
# (`restart` prints that member's object.) Each member keeps its data in
# DIR/NAME/ (0700), its log in DIR/NAME.log, its command line in DIR/NAME.args.
#
# The settings fencelog needs (docs/DISTRIBUTED.md): auto-compaction on (every
# commit group rewrites the head key: without compaction the MVCC history grows
# until the quota), a request size and ops-per-transaction that fit a commit group
# (fencelog keeps its groups within etcd's defaults: 1.5 MiB, 128 operations).
set -euo pipefail

usage() { sed -n '2,15p' "$0" >&2; exit 2; }
cmd=${1:-}; dir=${2:-}
[ -n "$cmd" ] && [ -n "$dir" ] || usage
command -v etcd >/dev/null || { echo "etcd is not installed (apt-get install etcd-server etcd-client)" >&2; exit 2; }
command -v etcdctl >/dev/null || { echo "etcdctl is not installed (apt-get install etcd-client)" >&2; exit 2; }

# Is a loopback port free? (Nothing listens: a connection is refused.)
port_free() { ! (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

healthy() { ETCDCTL_API=3 etcdctl --endpoints="127.0.0.1:$1" --command-timeout=1s endpoint health >/dev/null 2>&1; }

# Every member of this start still running? (Else say which, with its log.)
all_alive() {
  local m
  for m in "${names[@]}"; do
    kill -0 "$(cat "$dir/$m.pid")" 2>/dev/null || { echo "etcd member $m exited:" >&2; tail -5 "$dir/$m.log" >&2; return 1; }
  done
}

# Wait for member NAME (client port $2) to answer, at most 30 s; fail at once if
# any member of this start has exited (a port taken under it: the caller retries).
wait_healthy() {
  local name=$1 cport=$2 m
  for _ in $(seq 1 300); do
    # Alive first: a port that answers may be another cluster's member.
    all_alive || return 1
    healthy "$cport" && all_alive && return 0
    sleep 0.1
  done
  echo "etcd member $name did not answer within 30 s" >&2
  return 1
}

member_json() {
  local name=$1
  local cport peer pid
  cport=$(sed -n 's/.*--listen-client-urls http:\/\/127.0.0.1:\([0-9]*\).*/\1/p' "$dir/$name.args")
  peer=$(sed -n 's/.*--listen-peer-urls http:\/\/127.0.0.1:\([0-9]*\).*/\1/p' "$dir/$name.args")
  pid=$(cat "$dir/$name.pid")
  printf '{"name": "%s", "pid": %s, "client": %s, "peer": %s}' "$name" "$pid" "$cport" "$peer"
}

launch() {
  local name=$1
  # shellcheck disable=SC2046
  # (Not holding the port lock's descriptor: the lock ends with this script.)
  setsid etcd $(cat "$dir/$name.args") >>"$dir/$name.log" 2>&1 < /dev/null 9>&- &
  echo $! >"$dir/$name.pid"
}

case "$cmd" in
  start)
    n=${3:-3}
    [ "$n" = 1 ] || [ "$n" = 3 ] || usage
    mkdir -p "$dir"; chmod 700 "$dir"
    # Ports below the kernel's ephemeral range: a port in it can be taken between
    # the check and etcd's bind by any outgoing connection's local end (or by a
    # daemon listening on port 0), and a client reconnecting to a killed member's
    # port could connect to itself.
    ephemeral_low=$(cut -f1 /proc/sys/net/ipv4/ip_local_port_range 2>/dev/null || echo 32768)
    span=$(( ephemeral_low - 10000 - 2 * n ))
    [ "$span" -ge 1000 ] || { echo "the ephemeral port range starts at $ephemeral_low: no room below it" >&2; exit 1; }
    # Concurrent starts (tests run in parallel) choose and bind their ports one
    # at a time: the lock is held until this start's members answer.
    exec 9>>"${TMPDIR:-/tmp}/fencelog-etcd-cluster.lock"
    flock -w 120 9 || { echo "another etcd-cluster.sh start held the port lock for 120 s" >&2; exit 1; }
    names=(); for i in $(seq 1 "$n"); do names+=("m$i"); done
    for attempt in 1 2 3 4 5; do
      base=$(( 10000 + (RANDOM * 2 + $$) % span ))
      ports=(); ok=1
      for i in $(seq 0 $(( 2 * n - 1 ))); do
        p=$(( base + i )); port_free "$p" || { ok=0; break; }; ports+=("$p")
      done
      [ "$ok" = 1 ] || continue
      cluster=""
      for i in $(seq 1 "$n"); do
        cluster+="${cluster:+,}m$i=http://127.0.0.1:${ports[$(( n + i - 1 ))]}"
      done
      token="fencelog-$$-$attempt-$RANDOM"
      for i in $(seq 1 "$n"); do
        name=m$i; c=${ports[$(( i - 1 ))]}; p=${ports[$(( n + i - 1 ))]}
        rm -rf "${dir:?}/$name"; mkdir -p "$dir/$name"; chmod 700 "$dir/$name"
        echo "--name $name --data-dir $dir/$name" \
          "--listen-client-urls http://127.0.0.1:$c --advertise-client-urls http://127.0.0.1:$c" \
          "--listen-peer-urls http://127.0.0.1:$p --initial-advertise-peer-urls http://127.0.0.1:$p" \
          "--initial-cluster $cluster --initial-cluster-token $token --initial-cluster-state new" \
          "--auto-compaction-mode revision --auto-compaction-retention 10000" \
          "--heartbeat-interval 100 --election-timeout 1000" >"$dir/$name.args"
        : >"$dir/$name.log"
        launch "$name"
      done
      failed=0
      for i in $(seq 1 "$n"); do
        name=m$i; wait_healthy "$name" "${ports[$(( i - 1 ))]}" || { failed=1; break; }
      done
      if [ "$failed" = 1 ]; then
        for i in $(seq 1 "$n"); do kill -9 "$(cat "$dir/m$i.pid")" 2>/dev/null || true; done
        grep -q "address already in use" "$dir"/m*.log && continue
        exit 1
      fi
      endpoints=""; members=""
      for i in $(seq 1 "$n"); do
        endpoints+="${endpoints:+,}127.0.0.1:${ports[$(( i - 1 ))]}"
        members+="${members:+, }$(member_json "m$i")"
      done
      echo "{\"endpoints\": \"$endpoints\", \"members\": [$members]}"
      exit 0
    done
    echo "no free loopback ports found for $n etcd members" >&2
    exit 1
    ;;
  restart)
    name=${3:?member name}
    [ -f "$dir/$name.args" ] || { echo "no member $name in $dir" >&2; exit 2; }
    # Its peers may be down (a quorum being restored): wait for the process to
    # serve, not for the cluster.
    sed -i 's/--initial-cluster-state new/--initial-cluster-state existing/' "$dir/$name.args"
    exec 9>>"${TMPDIR:-/tmp}/fencelog-etcd-cluster.lock"
    flock -w 120 9 || { echo "another etcd-cluster.sh start held the port lock for 120 s" >&2; exit 1; }
    launch "$name"
    pid=$(cat "$dir/$name.pid"); cport=$(member_json "$name" | sed 's/.*"client": \([0-9]*\).*/\1/')
    for _ in $(seq 1 300); do
      (exec 3<>"/dev/tcp/127.0.0.1/$cport") 2>/dev/null && kill -0 "$pid" 2>/dev/null && { member_json "$name"; echo; exit 0; }
      kill -0 "$pid" 2>/dev/null || { tail -5 "$dir/$name.log" >&2; exit 1; }
      sleep 0.1
    done
    echo "etcd member $name did not listen within 30 s" >&2; exit 1
    ;;
  stop)
    for f in "$dir"/m*.pid; do [ -f "$f" ] && kill -9 "$(cat "$f")" 2>/dev/null || true; done
    ;;
  *) usage ;;
esac
