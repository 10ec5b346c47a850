#!/bin/sh
# Makes the example behind docs/audit-report.png: a real log with a stale takeover
# (a paused owner's heartbeats and note refused afterwards, from two callers), a
# claim over a killed owner, contested lock claims and a lease across the cutover;
# then `fencelog audit --format html`, and a picture of it in headless Chromium
# (Debian's `chromium` package) when one is installed.
#   usage: docs/audit-example.sh [FENCELOG_BINARY] [OUT_DIR]
set -eu
FL=${1:-target/release/fencelog}
OUT=${2:-docs}
LOG=$(mktemp -d)/log
export FENCELOG_DIR="$LOG"
"$FL" init >/dev/null
A=00000000-0000-4000-8000-0000000000a1
B=00000000-0000-4000-8000-0000000000b2
sleep 600 & OWNER=$!
"$FL" claim --subject billing/primary --pid "$OWNER" --stale-after-ms 300 --instance "$A" >/dev/null
"$FL" heartbeat --subject billing/primary --generation 1 >/dev/null
"$FL" lease acquire --resource db/ledger --mode write --owner billing/primary --generation 1 --ttl-ms 60000 >/dev/null
"$FL" note --subject billing/primary --generation 1 --text "invoice 1041 posted" >/dev/null
sleep 0.5
HB=$("$FL" state --subject billing/primary | sed 's/.*"heartbeat_ms":\([0-9]*\).*/\1/')
"$FL" takeover --subject billing/primary --expect-generation 1 --expect-heartbeat-ms "$HB" --pid $$ --instance "$B" --reason "heartbeat stale 500 ms" >/dev/null
# The paused owner wakes up: its heartbeats and its note are refused, and kept.
for i in 1 2 3; do "$FL" heartbeat --subject billing/primary --generation 1 --instance "$A" >/dev/null 2>&1 || true; done
"$FL" note --subject billing/primary --generation 1 --instance "$A" --text "invoice 1042 posted (zombie)" >/dev/null 2>&1 || true
sleep 1.1
"$FL" heartbeat --subject billing/primary --generation 1 --instance "$A" >/dev/null 2>&1 || true
"$FL" takeover --subject billing/primary --expect-generation 1 --expect-heartbeat-ms "$HB" --instance "$B" >/dev/null 2>&1 || true
# A worker killed outright, and claimed over with evidence.
sleep 600 & W=$!
"$FL" claim --subject jobs/nightly --pid "$W" --action rebuild --request-id nightly-1 >/dev/null
"$FL" claim --subject jobs/nightly --action compact --request-id compact-7 --instance "$A" >/dev/null 2>&1 || true
kill -9 "$W"; wait "$W" 2>/dev/null || true
"$FL" claim --subject jobs/nightly --pid $$ --action rebuild --request-id nightly-2 >/dev/null
kill "$OWNER"
"$FL" audit "$LOG" --format html --out "$OUT/audit-report.html" || test $? -eq 4
echo "report: $OUT/audit-report.html (log: $LOG)"
if command -v chromium >/dev/null; then
  chromium --headless --no-sandbox --disable-gpu --hide-scrollbars --window-size=1100,3300 \
    --screenshot="$OUT/audit-report.png" "file://$(cd "$OUT" && pwd)/audit-report.html" 2>/dev/null
  echo "picture: $OUT/audit-report.png"
fi
