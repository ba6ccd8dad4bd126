#!/usr/bin/env bash
# Runs a `cargo test` command (with --no-fail-fast, so every suite runs),
# keeps its output in LOG, and prints one tally line of passed and failed
# tests whatever the outcome. Fails if a test failed or none ran.
#
# usage: cargo-tally.sh LABEL LOG CARGO_TEST_COMMAND...
set -uo pipefail
label=$1
log=$2
shift 2
"$@" 2>&1 | tee "$log"
rc=$?
grep -E "^test result:" "$log" | awk -v label="$label" \
  '{p+=$4; f+=$6} END {print label ": " p " passed, " f " failed"; if (p == 0 || f > 0) exit 1}'
tally=$?
[ "$rc" = 0 ] && [ "$tally" = 0 ]
