#!/usr/bin/env bash
# Installs Claude Code (npm `@anthropic-ai/claude-code`, pinned) for `make bench`'s real-agent
# run and prints the path of its `claude` command. Cached under $SHOAL_CACHE keyed by version.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CACHE="${SHOAL_CACHE:-$ROOT/.cache}"
VERSION=2.1.332
DIR="$CACHE/claude-code-$VERSION"
BIN="$DIR/node_modules/.bin/claude"
if [ ! -x "$BIN" ]; then
  mkdir -p "$DIR"
  npm install --prefix "$DIR" --no-audit --no-fund --silent "@anthropic-ai/claude-code@$VERSION" >&2
fi
echo "$BIN"
