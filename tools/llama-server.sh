#!/usr/bin/env bash
# Builds llama.cpp's own llama-server and llama-bench (for `make bench`'s side-by-side) from
# the llama.cpp vendored in the llama-cpp-python sdist on PyPI, with the build options Shoal's
# llama.cpp gets (tools/llama-linux/build-options.sh), and prints its path. Cached under
# $SHOAL_CACHE keyed by the sdist version and the option set; ~6 min on 2 cores the first time.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CACHE="${SHOAL_CACHE:-$ROOT/.cache}"
VERSION=0.3.36
OPTS="$(bash "$ROOT/tools/llama-linux/build-options.sh")"
KEY="$(printf '%s' "$OPTS" | sha256sum | cut -c1-12)"
DIR="$CACHE/llama-server-$VERSION-$KEY"
BIN="$DIR/build/bin/llama-server"
if [ -x "$BIN" ] && [ -x "$DIR/build/bin/llama-bench" ]; then echo "$BIN"; exit 0; fi
mkdir -p "$DIR"
VENV="$DIR/venv"
[ -x "$VENV/bin/cmake" ] || { python3 -m venv "$VENV" && "$VENV/bin/pip" -q install cmake >&2; }
if [ ! -d "$DIR/src" ]; then
  "$VENV/bin/pip" -q download --no-deps --no-binary llama-cpp-python "llama-cpp-python==$VERSION" -d "$DIR" >&2
  mkdir -p "$DIR/src"
  tar xzf "$DIR/llama_cpp_python-$VERSION.tar.gz" -C "$DIR/src" --strip-components=1
fi
# The TOML lines `NAME = "VALUE"` become -DNAME=VALUE (the visibility presets do not matter here).
mapfile -t DEFS < <(printf '%s\n' "$OPTS" | sed -n 's/^\(GGML_[A-Z0-9_]*\) = "\(.*\)"$/-D\1=\2/p')
echo "llama-server: building llama.cpp $VERSION (${#DEFS[@]} options)" >&2
"$VENV/bin/cmake" -S "$DIR/src/vendor/llama.cpp" -B "$DIR/build" -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=OFF \
  "${DEFS[@]}" -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=ON >&2
"$VENV/bin/cmake" --build "$DIR/build" --target llama-server llama-bench -j "$(nproc)" >&2
echo "$BIN"
