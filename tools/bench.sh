#!/usr/bin/env bash
# Shoal on each backend against that backend's own reference, side by side:
# MLX vs mlx-lm on the same weights and BLAS, then llama.cpp vs llama-bench built
# from the same source with the same options. Prints the figures and the ratios.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
SHOAL="${SHOAL_BIN:-$ROOT/target/release/shoal}"
GGUF="${SHOAL_MODEL:-$("$ROOT/tools/fetch-model.sh")}"
MLX_DIR="${SHOAL_CACHE:-$ROOT/.cache}/models/smollm2-135m-mlx-f32"
VENV="$(bash "$ROOT/tools/setup-pyenv.sh")"
RUNS="${RUNS:-3}"

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

# Continuous batching: 8 streams at once against one, on each backend.
for B in mlx llama; do
  echo "backend $B:"
  "$SHOAL" bench --backend "$B" --model "$GGUF" --prompt-tokens 100 --gen-tokens 64 --runs "$RUNS" --concurrency 8 2>/dev/null |
    grep -E "concurrent|decode"
done

# llama.cpp backend vs llama-bench (pp512 / tg128), interleaved pairs per model.
LLAMA_BENCH="$(bash "$ROOT/tools/llama-linux/reference.sh")"
mapfile -t REAL < <(bash "$ROOT/tools/fetch-real-models.sh")
python3 - "$SHOAL" "$LLAMA_BENCH" "$RUNS" "$GGUF" "${REAL[@]}" <<'PY'
import json, os, statistics, subprocess, sys
shoal, bench, runs, models = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4:]
def ours(m):
    out = subprocess.run([shoal, "bench", "--backend", "llama", "--model", m, "--prompt-tokens", "512",
                          "--gen-tokens", "128", "--runs", "1", "--json"], capture_output=True, text=True,
                         check=True, env={**os.environ, "SHOAL_LOG": "warn"}).stdout
    return json.loads(out)
def theirs(m, t):
    out = subprocess.run([bench, "-m", m, "-p", "512", "-n", "128", "-r", "1", "-t", str(t), "-o", "json"],
                         capture_output=True, text=True, check=True).stdout
    rows = json.loads(out)
    pp = next(r["avg_ts"] for r in rows if r["n_prompt"] == 512 and r["n_gen"] == 0)
    tg = next(r["avg_ts"] for r in rows if r["n_gen"] == 128 and r["n_prompt"] == 0)
    return pp, tg
print(f"{'model':40s} {'shoal pp512':>11s} {'llama pp512':>11s} {'ratio':>6s} {'shoal tg128':>11s} {'llama tg128':>11s} {'ratio':>6s} {'peak RSS MiB':>12s} {'file+KV MiB':>11s}")
for m in models:
    pre, dec, rss, kv_mb = [], [], [], 0.0
    for _ in range(runs):
        s = ours(m)
        pp, tg = theirs(m, s["threads"])  # the same thread count as Shoal used
        pre.append((s["prefill_tok_s"], pp)); dec.append((s["decode_tok_s"], tg))
        rss.append(s.get("peak_rss_mb") or 0.0); kv_mb = s.get("kv_mb") or 0.0
    med = lambda xs, i: statistics.median(x[i] for x in xs)
    ratio = lambda xs: statistics.median(a / b for a, b in xs)
    file_mb = os.path.getsize(m) / 2**20
    print(f"{os.path.basename(m)[:40]:40s} {med(pre,0):11.1f} {med(pre,1):11.1f} {ratio(pre):5.2f}x "
          f"{med(dec,0):11.1f} {med(dec,1):11.1f} {ratio(dec):5.2f}x {statistics.median(rss):12.0f} {file_mb + kv_mb:11.0f}")
PY
