#!/usr/bin/env bash
# The whole test suite, on a fresh machine: installs what the tests need when it is
# missing (scripts/deps.sh test: a C compiler, protoc to build the etcd client,
# etcd for the etcd backend's tests), then runs `cargo test` (arguments passed on).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh test
# A whole-suite build from scratch gains nothing from incremental caches, which cost
# some 640 MB of disk beside the ~1.5 GB of test binaries (a CI runner ran out of disk).
export CARGO_INCREMENTAL="${CARGO_INCREMENTAL:-0}"
exec cargo test "$@"
