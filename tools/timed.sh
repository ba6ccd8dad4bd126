#!/usr/bin/env bash
# Runs a command and then prints how long it took ("time: LABEL took N s"),
# whatever its outcome, so a test run's log says where its minutes went.
#
# usage: timed.sh LABEL COMMAND...
set -uo pipefail
label=$1
shift
start=$SECONDS
"$@"
rc=$?
echo "time: $label took $((SECONDS - start)) s"
exit "$rc"
