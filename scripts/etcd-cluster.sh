#!/usr/bin/env bash
# An etcd cluster on loopback, for the tests, the benchmarks and the README's
# "Beyond one machine" (Debian's etcd-server and etcd-client: etcd 3.4).
#
#   scripts/etcd-cluster.sh start DIR [MEMBERS]   # 1 or 3 (default 3) members, free ports
#                                                 # outside the ephemeral range
#   scripts/etcd-cluster.sh restart DIR NAME      # start member NAME again (same data, ports)
#   scripts/etcd-cluster.sh stop DIR              # stop every member started in DIR
#
# Concurrent starts and restarts (tests run in parallel) choose and bind their
# ports one at a time, under a lock on ${TMPDIR:-/tmp}/fencelog-etcd-cluster.lock
# (waited for at most 120 s). A member counts as started only once its own
# process listens on its ports, and as up once it answers.
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

usage() { sed -n '2,19p' "$0" >&2; exit 2; }
cmd=${1:-}; dir=${2:-}
[ -n "$cmd" ] && [ -n "$dir" ] || usage
command -v etcd >/dev/null || { echo "etcd is not installed (apt-get install etcd-server etcd-client)" >&2; exit 2; }
command -v etcdctl >/dev/null || { echo "etcdctl is not installed (apt-get install etcd-client)" >&2; exit 2; }
command -v flock >/dev/null || { echo "flock is not installed (apt-get install util-linux)" >&2; exit 2; }

# Is port $1 free? (No TCP socket, IPv4 or IPv6, of a live process listens or is
# connected on it: LISTEN, ESTABLISHED, SYN_SENT, SYN_RECV or CLOSE_WAIT. The
# closing states a killed member's connections linger in hold no one (etcd binds
# with SO_REUSEADDR). Read from /proc: a connection attempt could wait on a
# listener whose queue is full. A socket only bound is not listed: a member that
# loses its port to one exits, which `wait_bound` sees.)
port_free() {
  local hex
  hex=$(printf '%04X' "$1")
  ! awk -v p=":$hex" '$4 ~ /^(01|02|03|08|0A)$/ && substr($2, length($2) - 4) == p { found = 1 } END { exit !found }' \
    /proc/net/tcp /proc/net/tcp6 2>/dev/null
}

# Does process $1 itself listen on loopback port $2? (/proc/net/tcp's listening
# sockets on that port, matched against the process's descriptors: a port that
# answers may be another process's.)
listens() {
  local pid=$1 hex inode fds
  hex=$(printf '%04X' "$2")
  fds=$(ls -l "/proc/$pid/fd" 2>/dev/null) || return 1
  for inode in $(awk -v p=":$hex" '$4 == "0A" && substr($2, length($2) - 4) == p { print $10 }' /proc/net/tcp); do
    grep -q "socket:\[$inode\]" <<<"$fds" && return 0
  done
  return 1
}

healthy() { ETCDCTL_API=3 etcdctl --endpoints="127.0.0.1:$1" --command-timeout=1s endpoint health >/dev/null 2>&1; }

# The port lock (fd 9), opened read-only so that a lock file another user
# created serves too. Released by `unlock`, or when this script exits.
lock() {
  local f=${TMPDIR:-/tmp}/fencelog-etcd-cluster.lock
  [ -e "$f" ] || : >>"$f"
  # (A FIFO there would block the open below for ever.)
  [ -f "$f" ] || { echo "the port lock $f is not a regular file" >&2; exit 1; }
  exec 9<"$f"
  flock -w 120 9 || { echo "waited 120 s for the port lock ($f) held by another start" >&2; exit 1; }
}
unlock() { exec 9<&-; }

pid_of() { cat "$dir/$1.pid"; }
port_of() { sed -n "s/.*--listen-$2-urls http:\/\/127.0.0.1:\([0-9]*\).*/\1/p" "$dir/$1.args"; }

# Did member $1 exit? (Then say so, with its log.)
exited() {
  kill -0 "$(pid_of "$1")" 2>/dev/null && return 1
  echo "etcd member $1 exited:" >&2; tail -5 "$dir/$1.log" >&2
  return 0
}

# Wait, at most 30 s, until every member named listens on its client and peer
# ports itself; fail at once when one has exited (its port taken under it).
wait_bound() {
  local m deadline=$(( SECONDS + 30 )) all
  while :; do
    all=1
    for m in "$@"; do
      exited "$m" && return 1
      listens "$(pid_of "$m")" "$(port_of "$m" client)" && listens "$(pid_of "$m")" "$(port_of "$m" peer)" || all=0
    done
    [ "$all" = 1 ] && return 0
    [ "$SECONDS" -lt "$deadline" ] || { echo "etcd members $* did not listen within 30 s" >&2; return 1; }
    sleep 0.05
  done
}

# Wait, at most 30 s, until every member named answers, on a port its own
# process listens on (not another cluster's member on a port it lost); fail at
# once when one has exited.
wait_healthy() {
  local m deadline=$(( SECONDS + 30 ))
  for m in "$@"; do
    until healthy "$(port_of "$m" client)" && listens "$(pid_of "$m")" "$(port_of "$m" client)"; do
      exited "$m" && return 1
      [ "$SECONDS" -lt "$deadline" ] || { echo "etcd member $m did not answer within 30 s" >&2; return 1; }
      sleep 0.1
    done
  done
}

member_json() {
  printf '{"name": "%s", "pid": %s, "client": %s, "peer": %s}' "$1" "$(pid_of "$1")" "$(port_of "$1" client)" "$(port_of "$1" peer)"
}

launch() {
  local name=$1
  # (Without the port lock's descriptor: the lock ends with this script.)
  # shellcheck disable=SC2046
  setsid etcd $(cat "$dir/$name.args") >>"$dir/$name.log" 2>&1 < /dev/null 9<&- &
  echo $! >"$dir/$name.pid"
}

case "$cmd" in
  start)
    n=${3:-3}
    [ "$n" = 1 ] || [ "$n" = 3 ] || usage
    mkdir -p "$dir"; chmod 700 "$dir"
    # Ports outside the kernel's ephemeral range (below it, or above it when it
    # starts too low): a port in it can be taken between the check and etcd's
    # bind by any outgoing connection's local end (or by a daemon listening on
    # port 0), and a client reconnecting to a killed member's port could connect
    # to itself.
    read -r ephemeral_low ephemeral_high < /proc/sys/net/ipv4/ip_local_port_range || { ephemeral_low=32768; ephemeral_high=60999; }
    first=10000; span=$(( ephemeral_low - first - 2 * n ))
    if [ "$span" -lt 1000 ]; then
      first=$(( ephemeral_high + 1 )); span=$(( 65536 - first - 2 * n ))
      [ "$span" -ge 1000 ] || { echo "no room outside the ephemeral port range ($ephemeral_low-$ephemeral_high)" >&2; exit 1; }
    fi
    names=(); for i in $(seq 1 "$n"); do names+=("m$i"); done
    lock
    for attempt in 1 2 3 4 5; do
      base=$(( first + (RANDOM * 2 + $$) % span ))
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
      if ! wait_bound "${names[@]}"; then
        for m in "${names[@]}"; do kill -9 "$(pid_of "$m")" 2>/dev/null || true; done
        taken=0
        for m in "${names[@]}"; do grep -q "address already in use" "$dir/$m.log" && taken=1; done
        [ "$taken" = 1 ] && continue
        exit 1
      fi
      # Every port is bound by its own member: the next start may choose.
      unlock
      if ! wait_healthy "${names[@]}"; then
        for m in "${names[@]}"; do kill -9 "$(pid_of "$m")" 2>/dev/null || true; done
        exit 1
      fi
      endpoints=""; members=""
      for m in "${names[@]}"; do
        endpoints+="${endpoints:+,}127.0.0.1:$(port_of "$m" client)"
        members+="${members:+, }$(member_json "$m")"
      done
      echo "{\"endpoints\": \"$endpoints\", \"members\": [$members]}"
      exit 0
    done
    echo "5 tries found no free loopback ports for $n etcd members, or lost them to other processes before etcd bound them" >&2
    exit 1
    ;;
  restart)
    name=${3:?member name}
    [ -f "$dir/$name.args" ] || { echo "no member $name in $dir" >&2; exit 2; }
    # Its peers may be down (a quorum being restored): wait for the process to
    # listen on its own ports, not for the cluster to answer.
    sed -i 's/--initial-cluster-state new/--initial-cluster-state existing/' "$dir/$name.args"
    lock
    for port in "$(port_of "$name" client)" "$(port_of "$name" peer)"; do
      port_free "$port" || { echo "member $name's port $port was taken by another process while it was down" >&2; exit 1; }
    done
    launch "$name"
    wait_bound "$name" || { kill -9 "$(pid_of "$name")" 2>/dev/null || true; exit 1; }
    unlock
    member_json "$name"; echo
    ;;
  stop)
    # Only a member of this cluster: a pid file outliving its process (a reboot)
    # may name another process by now.
    for f in "$dir"/m*.pid; do
      [ -f "$f" ] || continue
      pid=$(cat "$f")
      tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -qF -- "$dir/" && kill -9 "$pid" 2>/dev/null || true
    done
    ;;
  *) usage ;;
esac
