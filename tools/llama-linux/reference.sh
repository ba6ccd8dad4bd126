#!/usr/bin/env bash
# Builds llama.cpp's own llama-bench from the very source the llama-cpp-sys-2 crate vendors,
# with the options Shoal's build uses (build-options.sh), into a cache folder keyed by the
# crate's version and those options; prints the binary's path. Benchmarks only.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
SYS_VERSION="$(sed -n 's/^llama-cpp-sys-2 = { version = "=\([^"]*\)".*/\1/p' "$ROOT/crates/shoal-engine/Cargo.toml")"
OPTS="$(bash "$ROOT/tools/llama-linux/build-options.sh" | grep -v '^#')"
KEY="llama-ref-${SYS_VERSION}-$(printf '%s' "$OPTS" | sha256sum | cut -c1-12)"
OUT="${SHOAL_CACHE:-$ROOT/.cache}/$KEY"
BIN="$OUT/build/bin/llama-bench"
if [[ ! -x "$BIN" ]]; then
  cargo fetch --manifest-path "$ROOT/Cargo.toml" --quiet
  SRC="$(cargo metadata --manifest-path "$ROOT/Cargo.toml" --format-version 1 \
    | python3 -c 'import json,sys,os
d=json.load(sys.stdin)
p=[p for p in d["packages"] if p["name"]=="llama-cpp-sys-2"]
print(os.path.dirname(p[0]["manifest_path"]) + "/llama.cpp" if p else "")')"
  [[ -d "$SRC" ]] || { echo "llama-cpp-sys-2 source not found" >&2; exit 1; }
  CMAKE="$(sed -n 's/^CMAKE = "\(.*\)"$/\1/p' "$ROOT/.cargo/config.toml" 2>/dev/null || true)"
  CMAKE="${CMAKE:-cmake}"
  DEFS=()
  while IFS= read -r line; do
    [[ "$line" =~ ^([A-Z0-9_]+)\ =\ \"(.*)\"$ ]] && DEFS+=("-D${BASH_REMATCH[1]}=${BASH_REMATCH[2]}")
  done <<<"$OPTS"
  "$CMAKE" -S "$SRC" -B "$OUT/build" -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=OFF \
    -DBUILD_SHARED_LIBS=OFF -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
    -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_SERVER=OFF "${DEFS[@]}" >"$OUT.configure.log" 2>&1
  "$CMAKE" --build "$OUT/build" --target llama-bench -j"$(nproc)" >"$OUT.build.log" 2>&1
fi
echo "$BIN"
