#!/usr/bin/env bash
# The main job, on a fresh machine: installs what building needs when it is missing
# (scripts/deps.sh build: a C compiler, protoc), then runs the daemon
# (`fencelog serve`, arguments passed on), built in release mode. It runs in the
# caller's directory: a relative --dir is the caller's.
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
"$repo/scripts/deps.sh" build
exec cargo run --release --manifest-path "$repo/Cargo.toml" --bin fencelog -- serve "$@"
