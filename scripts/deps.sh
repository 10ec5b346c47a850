#!/usr/bin/env bash
# Install the Debian packages that are missing, of those asked for by name of the
# command they provide: `scripts/deps.sh build` (what building fencelog needs:
# a C compiler, protoc), `scripts/deps.sh test` (that, and what the tests start
# or check with: etcd, systemd's analyzers for the unit file, promtool for the
# metrics, Node.js and npm for the TypeScript client). Sourced or run; uses sudo when not root.
set -euo pipefail

want=("$@")
need=()
for w in "${want[@]}"; do
  case "$w" in
    build)
      command -v cc >/dev/null 2>&1 || need+=(build-essential)
      command -v protoc >/dev/null 2>&1 || need+=(protobuf-compiler)
      ;;
    test)
      command -v cc >/dev/null 2>&1 || need+=(build-essential)
      command -v protoc >/dev/null 2>&1 || need+=(protobuf-compiler)
      command -v etcd >/dev/null 2>&1 || need+=(etcd-server)
      command -v etcdctl >/dev/null 2>&1 || need+=(etcd-client)
      command -v systemd-analyze >/dev/null 2>&1 || need+=(systemd)
      command -v promtool >/dev/null 2>&1 || need+=(prometheus)
      # The TypeScript client's tests (clients/typescript: Node.js 20 or later).
      command -v node >/dev/null 2>&1 || need+=(nodejs)
      command -v npm >/dev/null 2>&1 || need+=(npm)
      ;;
    *) echo "scripts/deps.sh: unknown set $w (build, test)" >&2; exit 2 ;;
  esac
done
if [ ${#need[@]} -gt 0 ]; then
  echo "installing ${need[*]} (apt)" >&2
  sudo=""
  [ "$(id -u)" = 0 ] || sudo="sudo"
  $sudo apt-get update
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y --no-install-recommends "${need[@]}"
fi
