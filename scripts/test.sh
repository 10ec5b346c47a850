#!/usr/bin/env bash
# The whole test suite, on a fresh machine: installs what the tests need when it is
# missing (scripts/deps.sh test: a C compiler, protoc to build the etcd client,
# etcd for the etcd backend's tests, Node.js for the TypeScript client), then runs
# `cargo test` (arguments passed on) and the TypeScript client's tests.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh test
# The TypeScript client needs Node.js 20.11 or later (Debian 12's own is 18): said
# before the long Rust run, not after it.
if ! node -e 'const [a, b] = process.versions.node.split(".").map(Number); process.exit(a > 20 || (a === 20 && b >= 11) ? 0 : 1)'; then
  echo "scripts/test.sh: the TypeScript client's tests need Node.js 20.11 or later (found $(node --version))" >&2
  exit 1
fi
# A whole-suite build from scratch gains nothing from incremental caches, which cost
# some 640 MB of disk beside the ~1.5 GB of test binaries (a CI runner ran out of disk).
export CARGO_INCREMENTAL="${CARGO_INCREMENTAL:-0}"
cargo test "$@"
# The TypeScript client (clients/typescript): its types against docs/openapi.json,
# the OpenAPI lint, and its tests against the daemon cargo just built.
cd clients/typescript
npm ci --no-audit --no-fund
npm test
