#!/usr/bin/env bash
# Creates (or reuses) the Python test/bench venv from the hash-pinned
# tools/requirements-test.txt and prints the venv directory on stdout.
# Progress goes to stderr, so callers can do: VENV="$(tools/setup-pyenv.sh)".
#
# Location: ${SHOAL_CACHE:-<repo>/.cache}/pytest-<first 12 hex of the
# requirements file's sha256>/venv. A changed lock file gets a new directory;
# an unchanged one is reused at once (a stamp is written only after a
# complete install, so an interrupted install is redone next time).
#
# Environment: PYTHON picks the interpreter (default python3.11, then python3;
# must be >= 3.11, which mlx-lm requires).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
REQ="$ROOT/tools/requirements-test.txt"
HASH="$(sha256sum "$REQ" | cut -c1-12)"
BASE="${SHOAL_CACHE:-$ROOT/.cache}/pytest-$HASH"
VENV="$BASE/venv"
STAMP="$VENV/.shoal-requirements-sha256"
WANT="$(sha256sum "$REQ" | cut -d' ' -f1)"

ready() {
  [[ -f "$STAMP" && "$(cat "$STAMP")" == "$WANT" && -x "$VENV/bin/python" ]]
}

if ready; then
  echo "$VENV"
  exit 0
fi

mkdir -p "$BASE"
# One installer at a time; a second caller waits and then reuses the result.
exec 9>"$BASE/.lock"
flock 9
if ready; then
  echo "$VENV"
  exit 0
fi

pick_python() {
  local cands=()
  if [[ -n "${PYTHON:-}" ]]; then cands=("$PYTHON"); else cands=(python3.11 python3); fi
  local p
  for p in "${cands[@]}"; do
    if command -v "$p" >/dev/null 2>&1 &&
      "$p" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else 1)' 2>/dev/null; then
      command -v "$p"
      return 0
    fi
  done
  echo "setup-pyenv: need Python >= 3.11 (tried: ${cands[*]})" >&2
  return 1
}

PY="$(pick_python)"
echo "setup-pyenv: creating $VENV with $("$PY" --version 2>&1)" >&2
rm -rf "$VENV"
"$PY" -m venv "$VENV" >&2
"$VENV/bin/python" -m pip install --quiet --disable-pip-version-check \
  --require-hashes --no-deps --only-binary=:all: -r "$REQ" >&2
"$VENV/bin/python" -c 'import mlx.core, mlx_lm, tokenizers, numpy' >&2
echo "$WANT" >"$STAMP"
echo "setup-pyenv: ready" >&2
echo "$VENV"
