#!/usr/bin/env bash
# The main job, on a fresh machine: installs what building needs when it is missing
# (scripts/deps.sh build: a C compiler, protoc), then runs the daemon
# (`fencelog serve`, arguments passed on), built in release mode.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh build
exec cargo run --release --bin fencelog -- serve "$@"
