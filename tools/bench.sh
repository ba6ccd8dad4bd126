#!/usr/bin/env bash
# Shoal on each backend against that backend's own reference, side by side:
# MLX vs mlx-lm on the same weights and BLAS, then llama.cpp vs llama.cpp alone from the same
# source, and vs llama-bench / llama-server built with llama.cpp's default options. Prints the
# figures and the ratios.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
SHOAL="${SHOAL_BIN:-$ROOT/target/release/shoal}"
GGUF="${SHOAL_MODEL:-$("$ROOT/tools/fetch-model.sh")}"
MLX_DIR="${SHOAL_CACHE:-$ROOT/.cache}/models/smollm2-135m-mlx-f32"
VENV="$(bash "$ROOT/tools/setup-pyenv.sh")"
RUNS="${RUNS:-3}"

# Waits (up to 2 minutes) until every server on these loopback ports answers /health.
wait_healthy() {
  for _ in $(seq 1 120); do
    local up=1
    for port in "$@"; do curl -sf "http://127.0.0.1:$port/health" >/dev/null || up=0; done
    [ "$up" = 1 ] && return 0
    sleep 1
  done
}

# Token choice alone, per sequence per step, by vocabulary size (above the seam, both backends).
cargo bench --quiet -p shoal-engine --bench sampler 2>/dev/null

printf '%-22s %-8s %12s %12s %10s\n' "case" "engine" "prefill t/s" "decode t/s" "ttft ms"
for CASE in "100 128" "1000 32"; do
  read -r P G <<<"$CASE"
  S="$(SHOAL_LOG=warn "$SHOAL" bench --backend mlx --model "$GGUF" --prompt-tokens "$P" --gen-tokens "$G" --runs "$RUNS" --json)"
  # mlx-lm gets the same OpenBLAS kernels the engine chose.
  CORE="$(python3 -c 'import json,sys; b=json.loads(sys.argv[1])["blas"]; print(b.split(":",1)[1] if b.startswith("openblas:") else "")' "$S")"
  M="$(OPENBLAS_CORETYPE="${CORE:-${OPENBLAS_CORETYPE:-}}" "$VENV/bin/python" "$ROOT/tools/py/bench_mlx_lm.py" "$MLX_DIR" \
        --prompt-tokens "$P" --gen-tokens "$G" --runs "$RUNS" --json)"
  python3 - "$P" "$G" "$S" "$M" <<'PY'
import json, sys
p, g, s, m = sys.argv[1], sys.argv[2], json.loads(sys.argv[3]), json.loads(sys.argv[4])
case = f"prompt {p} / gen {g}"
for name, r in (("shoal", s), ("mlx-lm", m)):
    print(f"{case:22s} {name:8s} {r['prefill_tok_s']:12.1f} {r['decode_tok_s']:12.1f} {r['ttft_ms']:10.1f}")
print(f"{case:22s} {'ratio':8s} {s['prefill_tok_s']/m['prefill_tok_s']:11.2f}x {s['decode_tok_s']/m['decode_tok_s']:11.2f}x"
      f"   (blas: shoal {s['blas']}, mlx-lm {m.get('blas')})")
PY
done

# Each MLX architecture's tiny model (tools/py/tiny_models.py) beside mlx-lm on the same
# directory: the same code paths at toy size (overheads dominate; the ratios are indicative).
TINY="${SHOAL_CACHE:-$ROOT/.cache}/models/tiny-v1"
printf '%-22s %-8s %12s %12s\n' "tiny model" "engine" "prefill t/s" "decode t/s"
for ARCH in mistral gemma3_text phi3 qwen3_moe gpt_oss; do
  for FMT in f32 q4; do
    DIR="$TINY/$ARCH-$FMT"
    [ -f "$DIR/config.json" ] || { echo "$ARCH-$FMT: missing (make models)"; continue; }
    S="$(SHOAL_LOG=warn "$SHOAL" bench --backend mlx --model "$DIR" --prompt-tokens 200 --gen-tokens 64 --runs "$RUNS" --json)"
    M="$("$VENV/bin/python" "$ROOT/tools/py/bench_mlx_lm.py" "$DIR" --prompt-tokens 200 --gen-tokens 64 --runs "$RUNS" --json)"
    python3 - "$ARCH-$FMT" "$S" "$M" <<'PY'
import json, sys
name, s, m = sys.argv[1], json.loads(sys.argv[2]), json.loads(sys.argv[3])
for eng, r in (("shoal", s), ("mlx-lm", m)):
    print(f"{name:22s} {eng:8s} {r['prefill_tok_s']:12.1f} {r['decode_tok_s']:12.1f}")
print(f"{name:22s} {'ratio':8s} {s['prefill_tok_s']/m['prefill_tok_s']:11.2f}x {s['decode_tok_s']/m['decode_tok_s']:11.2f}x")
PY
  done
done

# Continuous batching: 8 streams at once against one, on each backend.
for B in mlx llama; do
  echo "backend $B:"
  "$SHOAL" bench --backend "$B" --model "$GGUF" --prompt-tokens 100 --gen-tokens 64 --runs "$RUNS" --concurrency 8 2>/dev/null |
    grep -E "concurrent|decode"
done

# llama.cpp backend vs llama.cpp alone (pp512 / tg128, llama-bench's method, the same
# llama.cpp build: examples/llama_reference.rs), interleaved pairs per model.
cargo build --release --quiet -p shoal-engine --example llama_reference
REF="$ROOT/target/release/examples/llama_reference"
mapfile -t REAL < <(bash "$ROOT/tools/fetch-real-models.sh")
python3 - "$SHOAL" "$REF" "$RUNS" "$GGUF" "${REAL[@]}" <<'PY'
import json, os, statistics, subprocess, sys
shoal, ref, runs, models = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4:]
def ours(m, p, g):
    out = subprocess.run([shoal, "bench", "--backend", "llama", "--model", m, "--prompt-tokens", str(p),
                          "--gen-tokens", str(g), "--runs", "1", "--json"], capture_output=True, text=True,
                         check=True, env={**os.environ, "SHOAL_LOG": "warn"}).stdout
    return json.loads(out)
def theirs(m, p, g, t, par=1):
    r = json.loads(subprocess.run([ref, m, str(p), str(g), str(t), str(par)], capture_output=True,
                                  text=True, check=True).stdout)
    return r["pp_tok_s"], r["tg_tok_s"]
def ours8(m):
    out = subprocess.run([shoal, "bench", "--backend", "llama", "--model", m, "--prompt-tokens", "100",
                          "--gen-tokens", "64", "--runs", "1", "--concurrency", "8", "--json"],
                         capture_output=True, text=True, check=True,
                         env={**os.environ, "SHOAL_LOG": "warn"}).stdout
    return json.loads(out)
# pp512: prefill of 512 tokens; tg128: 128 tokens after an 8-token prompt (llama-bench's
# tg128 starts on an empty context); tg128@512: 128 tokens after the 512-token prompt;
# 8 streams: aggregate decode of 8 concurrent 100-token prompts, Shoal's scheduler against
# llama.cpp alone decoding 8 sequences per step in one unified cache (the ceiling of
# llama-server --parallel 8 on the same build).
# Memory: resident after loading (before any request), Shoal against llama.cpp alone with the
# same context (8192 KV positions, 16 sequences), and (RSS - reserved KV) / file size, which the
# target puts at 1.2x at most; and "reported", the memory Shoal says the model holds
# (/v1/models memory_bytes, what the pool counts), to set beside Shoal's loaded RSS (which
# also holds the process's own code and runtime). Under the table, per model: what loading
# the model allocated in llama.cpp alone (heap, beside the mapped weights) against Shoal's
# estimate of its vocabulary tables (vocab_table_bytes), which the reported figure includes.
def resident(m):
    return json.loads(subprocess.run([ref, m, "--resident", "8192", "16"], capture_output=True,
                                     text=True, check=True).stdout)
print(f"{'model':34s} {'pp512 shoal/llama':>22s} {'tg128 shoal/llama':>22s} {'tg128@512 shoal/llama':>24s}"
      f" {'8 streams shoal/llama':>24s} {'peak RSS':>9s} {'file+KV':>8s} {'loaded shoal/llama':>19s}"
      f" {'(RSS-KV)/file shoal/llama':>26s} {'reported':>9s}")
vocab_lines = []
for m in models:
    rows = {"pp": [], "tg": [], "tgd": [], "par": []}
    rss, loaded, kv_mb, reported = [], [], 0.0, 0.0
    tables = []
    for _ in range(runs):
        deep = ours(m, 512, 128)
        t = deep["threads"]  # llama.cpp alone gets the same thread count
        pp, tgd = theirs(m, 512, 128, t)
        shallow = ours(m, 8, 128)
        _, tg = theirs(m, 8, 128, t)
        rows["pp"].append((deep["prefill_tok_s"], pp))
        rows["tgd"].append((deep["decode_tok_s"], tgd))
        rows["tg"].append((shallow["decode_tok_s"], tg))
        eight = ours8(m)
        _, tg8 = theirs(m, 100, 64, t, 8)
        rows["par"].append((eight["concurrent_aggregate_decode_tok_s"], tg8))
        rss.append(deep.get("peak_rss_mb") or 0.0); kv_mb = deep.get("kv_mb") or 0.0
        reported = deep.get("memory_mb") or 0.0
        alone = resident(m)
        loaded.append((deep.get("rss_after_load_mb") or 0.0, alone["rss_after_load_mb"]))
        tables.append((alone["vocab_table_mb"], alone["heap_growth_on_load_mb"]))
    def cell(xs):
        return (f"{statistics.median(a for a, _ in xs):6.1f}/{statistics.median(b for _, b in xs):6.1f}"
                f" {statistics.median(a / b for a, b in xs):4.2f}x")
    file_mb = os.path.getsize(m) / 2**20
    ours_mb = statistics.median(a for a, _ in loaded)
    theirs_mb = statistics.median(b for _, b in loaded)
    print(f"{os.path.basename(m)[:34]:34s} {cell(rows['pp']):>22s} {cell(rows['tg']):>22s} {cell(rows['tgd']):>24s}"
          f" {cell(rows['par']):>24s} {statistics.median(rss):6.0f}MiB {file_mb + kv_mb:5.0f}MiB"
          f" {ours_mb:7.0f}/{theirs_mb:5.0f}MiB {(ours_mb - kv_mb) / file_mb:13.2f}x/{(theirs_mb - kv_mb) / file_mb:4.2f}x"
          f" {reported:6.0f}MiB")
    est = statistics.median(a for a, _ in tables)
    grew = statistics.median(b for _, b in tables)
    vocab_lines.append(f"  {os.path.basename(m)}: vocabulary tables estimated {est:.1f} MiB,"
                       f" llama.cpp's heap grew {grew:.1f} MiB while loading ({est / grew:.2f}x)")
print("\n".join(vocab_lines))
PY

# llama.cpp's own tools built with its default options (tools/llama-server.sh): pp512 / tg128
# against llama-bench, time to first token of a 4k-token prompt through /v1/messages against
# llama-server, and speculative decoding against both (tools/py/bench_vs_llama.py).
LLAMA_SERVER="$(bash "$ROOT/tools/llama-server.sh")"
THREADS="$(SHOAL_LOG=warn "$SHOAL" bench --backend llama --model "$GGUF" --prompt-tokens 8 --gen-tokens 2 --runs 1 --json \
  | python3 -c 'import json,sys; print(json.load(sys.stdin)["threads"])')"
"$VENV/bin/python" "$ROOT/tools/py/bench_vs_llama.py" --shoal "$SHOAL" --threads "$THREADS" --runs "$RUNS" \
  --llama-bench "$(dirname "$LLAMA_SERVER")/llama-bench" --llama-server "$LLAMA_SERVER" \
  --edit-file "$ROOT/crates/shoal/bench/sync_inventory.py" "$GGUF" "${REAL[@]}" || echo "  (llama.cpp comparison failed)"

# The prompt cache as agents meet it: an ~8k-token agent prompt (system, tools, a file) on
# Qwen2.5-Coder, cold, after a restart, after an unload and reload, after Gemma-3-270m and back,
# two agents taking turns, bytes per cached token (f16, q8_0), the disk tier's cost to a cold
# request, and llama-server given the same sequence (tools/py/bench_agent_cache.py).
"$VENV/bin/python" "$ROOT/tools/py/bench_agent_cache.py" --shoal "$SHOAL" --threads "$THREADS" \
  --model "${REAL[0]}" --switch "${REAL[1]}" --llama-server "$LLAMA_SERVER" || echo "  (prompt cache bench failed)"

# A real agent: Claude Code run twice on Qwen2.5-Coder, the server restarted between; the
# ledger's cached share of each request (tools/py/bench_claude_code.py).
CLAUDE="$(bash "$ROOT/tools/claude-code.sh")" &&
  "$VENV/bin/python" "$ROOT/tools/py/bench_claude_code.py" --shoal "$SHOAL" --threads "$THREADS" \
    --claude "$CLAUDE" --model "${REAL[0]}" || echo "  (Claude Code bench failed)"

# Speculative decoding in the engine alone (plain and drafted, each engine loaded on its own;
# by prompt lookup, then by a draft model),
# and each KV cache type's bytes per position and greedy agreement with f16.
SHOAL_LOG=warn "$SHOAL" bench --drafting --model "${REAL[0]}" --runs "$RUNS"
# A draft model: Qwen-Coder's Q4_K_M drafting for its Q8_0 copy (`make bench` makes it).
QWEN_Q8="${SHOAL_QWEN_Q8_GGUF:-${SHOAL_CACHE:-$ROOT/.cache}/models/qwen-coder-q8-v1/qwen2.5-coder-0.5b-instruct-q8_0.gguf}"
SHOAL_LOG=warn "$SHOAL" bench --drafting --model "$QWEN_Q8" --draft-model "${REAL[0]}" --runs "$RUNS"
for M in "$GGUF" "${REAL[@]}"; do
  SHOAL_LOG=warn "$SHOAL" bench --kv-types --model "$M"
done

# The same 8-stream load over HTTP: `shoal serve` against llama.cpp's own llama-server
# --parallel 8 (llama.cpp from the llama-cpp-python sdist, built with the same options:
# tools/llama-server.sh), both with the same file, threads and 8192 KV positions, prefix
# cache on. Shoal runs twice: as configured by default (one shared KV pool, so a step attends
# over every running request's positions) and with llama-server's layout (--split-kv-cache
# --max-batch 8: 1024 positions per request, each attending over its own).
# The two llama.cpp builds are not the same source: the llama-cpp-2 crate vendors no server,
# and the newest llama-cpp-python sdist is an older llama.cpp (ggml 0.25.3 against the crate's
# 0.26); the in-process columns above compare Shoal with llama.cpp from its own source.
for M in "$GGUF" "${REAL[@]}"; do
  for LAYOUT in shared split; do
    echo "$(basename "$M"), Shoal's KV $LAYOUT:"
    EXTRA=()
    [ "$LAYOUT" = split ] && EXTRA=(--split-kv-cache --max-batch 8)
    "$LLAMA_SERVER" -m "$M" -t "$THREADS" -c 8192 --parallel 8 --host 127.0.0.1 --port 18931 >/dev/null 2>&1 &
    LS=$!
    SHOAL_LOG=warn "$SHOAL" serve --backend llama --threads "$THREADS" --kv-cache-tokens 8192 "${EXTRA[@]}" \
      --model "$M" --port 18932 >/dev/null 2>&1 &
    SS=$!
    wait_healthy 18931 18932
    "$VENV/bin/python" "$ROOT/tools/py/serve_load.py" --shoal http://127.0.0.1:18932 --llama http://127.0.0.1:18931 \
      --model "$M" --rounds "$RUNS" || echo "  (load failed)"
    kill "$LS" "$SS" 2>/dev/null || true
    wait "$LS" "$SS" 2>/dev/null || true
  done
done

# Embeddings: all-MiniLM-L6-v2 (the GGUF `make models` converts) through Shoal's
# /v1/embeddings against llama-server --embeddings on the same file and threads, requests
# of 1, 16 and 256 short inputs in turn, as ratios (`shoal bench --embeddings --against`).
EMBED_GGUF="$(bash "$ROOT/tools/fetch-embedding-model.sh")"
"$LLAMA_SERVER" -m "$EMBED_GGUF" --embeddings -t "$THREADS" --host 127.0.0.1 --port 18933 >/dev/null 2>&1 &
LS=$!
wait_healthy 18933
SHOAL_LOG=warn "$SHOAL" bench --embeddings --model "$EMBED_GGUF" --threads "$THREADS" --runs "$((RUNS * 3))" \
  --against http://127.0.0.1:18933 || echo "  (embeddings bench failed)"
kill "$LS" 2>/dev/null || true
wait "$LS" 2>/dev/null || true

# Vision: the vision fixture (the default model beside a random-weight LLaVA-style projector,
# `make models`) through Shoal and llama-server --mmproj on the same files and threads: each
# dialect's prompt tokens and greedy reply against llama-server's, then time to first token
# with a new picture, without one, and a second question about the same picture (a cache hit),
# in interleaved pairs (tools/py/vision_vs_llama.py).
#
# vision_pair GGUF PAIRS: llama-server --mmproj and Shoal on GGUF and the projector beside it,
# then tools/py/vision_vs_llama.py with PAIRS timed pairs (0: agreement only).
vision_pair() {
  local projector
  projector="$(find "$(dirname "$1")" -maxdepth 1 -name 'mmproj*.gguf' | head -n 1)"
  "$LLAMA_SERVER" -m "$1" --mmproj "$projector" -t "$THREADS" -c 4096 --host 127.0.0.1 --port 18935 >/dev/null 2>&1 &
  local theirs=$!
  SHOAL_LOG=warn "$SHOAL" serve --backend llama --threads "$THREADS" --kv-cache-tokens 4096 --model "$1" \
    --model-id vision --port 18936 >/dev/null 2>&1 &
  local ours=$!
  wait_healthy 18935 18936
  "$VENV/bin/python" "$ROOT/tools/py/vision_vs_llama.py" --shoal http://127.0.0.1:18936 --llama http://127.0.0.1:18935 \
    --model vision --pairs "$2" || echo "  (vision bench failed)"
  kill "$theirs" "$ours" 2>/dev/null || true
  wait "$theirs" "$ours" 2>/dev/null || true
}
vision_pair "${SHOAL_TEST_VISION_GGUF:-${SHOAL_CACHE:-$ROOT/.cache}/models/smollm2-vision-v1/SmolLM2-135M-Instruct.Q4_1.gguf}" \
  "$((RUNS * 3))"

# The same agreement on an M-RoPE vision model (Qwen2.5-Coder's weights as a Qwen2-VL text
# model beside a Qwen2-VL patch merger, `make models`), whose images take fewer positions
# than tokens: prompt tokens and greedy replies in every dialect against llama-server's.
echo "M-RoPE (Qwen2-VL layout):"
vision_pair "${SHOAL_TEST_MROPE_GGUF:-${SHOAL_CACHE:-$ROOT/.cache}/models/qwen2vl-mrope-v2/qwen2vl-coder-0.5b-q4_k_m.gguf}" 0
