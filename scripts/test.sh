#!/usr/bin/env bash
# The whole test suite, on a fresh machine: installs what the tests need when it is
# missing (scripts/deps.sh test: a C compiler, protoc to build the etcd client,
# etcd for the etcd backend's tests), then runs `cargo test` (arguments passed on).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh test
exec cargo test "$@"
