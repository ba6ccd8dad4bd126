#!/usr/bin/env bash
# Runs the web UI's browser tests (tests/ui: node --test, playwright-core driving
# Debian's chromium) against an already built shoal binary serving the UI at /.
# Builds nothing: SHOAL_BIN (default <repo>/target/release/shoal) must exist and
# must have been built after `make ui`. SHOAL_MODEL, if set, is passed through.
# Starts `shoal serve --port 0 --prefix-cache-mb 0 --db <temp dir>/ui.db` (a fresh
# conversation store, never the user's; removed afterwards), saves screenshots to
# target/ui-artifacts/, prints "ui: N passed, M failed" and exits non-zero if a
# test failed or none ran.
set -uo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
SHOAL_BIN="${SHOAL_BIN:-$ROOT/target/release/shoal}"
export CHROMIUM="${CHROMIUM:-/usr/bin/chromium}"
export UI_ARTIFACTS="${UI_ARTIFACTS:-$ROOT/target/ui-artifacts}"
export PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD=1
STARTUP_TIMEOUT=180

fail() {
  echo "run-ui: $*" >&2
  echo "ui: 0 passed, 1 failed"
  exit 1
}

[[ -x "$SHOAL_BIN" ]] || fail "shoal binary not found or not executable: $SHOAL_BIN (cargo build --release -p shoal, or set SHOAL_BIN)"
[[ -x "$CHROMIUM" ]] || fail "chromium not found at $CHROMIUM (apt-get install chromium, or set CHROMIUM)"

LOGDIR="$(mktemp -d "${TMPDIR:-/tmp}/shoal-run-ui.XXXXXX")"
SERVER_PID=""
cleanup() {
  if [[ -n "$SERVER_PID" ]] && kill -0 "$SERVER_PID" 2>/dev/null; then
    kill -TERM "$SERVER_PID" 2>/dev/null
    for _ in $(seq 50); do kill -0 "$SERVER_PID" 2>/dev/null || break; sleep 0.2; done
    kill -KILL "$SERVER_PID" 2>/dev/null
  fi
  rm -rf "$LOGDIR"
}
trap cleanup EXIT

(cd "$ROOT/tests/ui" && npm ci --no-audit --no-fund --loglevel=error) || fail "npm ci failed in tests/ui"

rm -f "$UI_ARTIFACTS"/*.png
mkdir -p "$UI_ARTIFACTS"

start=$SECONDS
"$SHOAL_BIN" serve --port 0 --prefix-cache-mb 0 --db "$LOGDIR/ui.db" >"$LOGDIR/server.out" 2>"$LOGDIR/server.err" &
SERVER_PID=$!
URL=""
while ((SECONDS - start < STARTUP_TIMEOUT)); do
  line="$(grep -m1 -E '^shoal listening on http://[^ ]+ \(model .+\)' "$LOGDIR/server.out" || true)"
  if [[ -n "$line" ]]; then
    URL="$(sed -E 's/^shoal listening on (http:\/\/[^ ]+) .*/\1/' <<<"$line")"
    break
  fi
  kill -0 "$SERVER_PID" 2>/dev/null || break
  sleep 0.2
done
if [[ -z "$URL" ]]; then
  tail -n 40 "$LOGDIR/server.err" >&2
  fail "shoal serve did not report its address within ${STARTUP_TIMEOUT}s"
fi
echo "run-ui: $line"
if ! curl -fsS "$URL/" | grep -q '<div id="root">'; then
  if [[ -f "$ROOT/ui/dist/index.html" ]]; then
    fail "$URL/ does not serve the web UI although ui/dist exists: $SHOAL_BIN was built before ui/dist or without embedding it"
  fi
  fail "$URL/ does not serve the web UI: build it (make ui) before building shoal"
fi

suite_start=$SECONDS
(cd "$ROOT/tests/ui" && SHOAL_URL="$URL" node --test --test-reporter=spec) 2>&1 | tee "$LOGDIR/ui.log"
rc=${PIPESTATUS[0]}
secs=$((SECONDS - suite_start))

# The spec reporter closes with lines like "ℹ pass 12", "ℹ fail 0", "ℹ cancelled 0".
count() { grep -E "^(ℹ|#) $1 [0-9]+\$" "$LOGDIR/ui.log" | tail -n 1 | grep -oE '[0-9]+$' || true; }
pass="$(count pass)"
failed="$(count fail)"
cancelled="$(count cancelled)"
pass=${pass:-0}
failed=$((${failed:-0} + ${cancelled:-0}))

status=0
if ((rc != 0 || failed > 0 || pass == 0)); then status=1; fi
((pass == 0)) && echo "run-ui: the UI suite ran no test" >&2
if ((status != 0)); then
  echo "run-ui: server log tail:" >&2
  tail -n 20 "$LOGDIR/server.err" >&2
fi
echo
echo "ui suite took ${secs}s (node exit $rc); screenshots in ${UI_ARTIFACTS#$ROOT/}/"
echo "ui: $pass passed, $failed failed"
exit "$status"
