#!/usr/bin/env bash
# The serve benchmark's set-up: Debian's etcd-server (one member is started by the
# bench itself through ../shared/tools/etcd-single.sh). Not needed by the tests.
set -euo pipefail
if ! command -v etcd >/dev/null 2>&1; then
  apt-get update
  apt-get install -y --no-install-recommends etcd-server
fi
etcd --version | head -1
