#!/usr/bin/env bash
# Runs a command and then prints how long it took ("time: LABEL took N s"),
# whatever its outcome, so a test run's log says where its minutes went. With
# SHOAL_TIMES set, the line is also added to that file (`make test` prints
# them all again at its end).
#
# usage: timed.sh LABEL COMMAND...
set -uo pipefail
label=$1
shift
start=$SECONDS
"$@"
rc=$?
line="time: $label took $((SECONDS - start)) s"
echo "$line"
if [ -n "${SHOAL_TIMES:-}" ]; then echo "$line" >> "$SHOAL_TIMES"; fi
exit "$rc"
