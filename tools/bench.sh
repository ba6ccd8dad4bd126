#!/usr/bin/env bash
# Shoal vs mlx-lm on the same weights and the same BLAS, side by side.
# Prints each engine's figures and the ratios Shoal / mlx-lm.
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
  S="$(SHOAL_LOG=warn "$SHOAL" bench --model "$GGUF" --prompt-tokens "$P" --gen-tokens "$G" --runs "$RUNS" --json)"
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

# Continuous batching: 8 streams at once against one.
"$SHOAL" bench --model "$GGUF" --prompt-tokens 100 --gen-tokens 64 --runs "$RUNS" --concurrency 8 2>/dev/null |
  grep -E "concurrent|decode"
