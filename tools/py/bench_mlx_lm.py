#!/usr/bin/env python3
"""mlx-lm's own prefill/decode speed on a converted model, for comparing with
`shoal bench`.

Usage:
    bench_mlx_lm.py [MODEL_DIR] [--prompt-tokens 100] [--gen-tokens 64]
                    [--runs 3] [--warmup 1] [--json] [--no-openblas]

MODEL_DIR defaults to ${SHOAL_CACHE:-<repo>/.cache}/models/smollm2-135m-mlx-f32
(made by convert_gguf.py). Typical invocation:

    VENV="$(tools/setup-pyenv.sh)"
    "$VENV/bin/python" tools/py/bench_mlx_lm.py --prompt-tokens 100 --gen-tokens 64 --runs 3 --json

BLAS: the script re-executes itself once with LD_PRELOAD=<Debian OpenBLAS>
(/usr/lib/x86_64-linux-gnu/libopenblas.so.0 when present), the BLAS the engine
links, instead of the reference BLAS bundled in the mlx-cpu wheel. The same as
running it by hand with
    LD_PRELOAD=/usr/lib/x86_64-linux-gnu/libopenblas.so.0 "$VENV/bin/python" ...
--no-openblas (or SHOAL_PY_OPENBLAS=0) measures the bundled BLAS instead.
The "blas" field of the output says which one was mapped.

Method (one run):
  * prompt: PROMPT_TEXT repeated, tokenized without template or special tokens,
    cut to exactly --prompt-tokens ids (the content does not change the cost);
  * a fresh KV cache; mlx-lm's generate_step with its default argmax sampler
    and no EOS check, so exactly --gen-tokens tokens come out;
  * t0 just before asking the generator for its first token;
    TTFT = t(first token) - t0 (prefill of all prompt tokens + first sample);
    prefill tok/s = prompt_tokens / TTFT;
    decode tok/s = (gen_tokens - 1) / (t(last token) - t(first token)).
Each figure is the median over --runs runs, after --warmup unmeasured runs.
The weights are loaded and evaluated before any timing.

Output (--json): one JSON object
  {"model_dir", "mlx", "mlx_lm", "device", "blas", "dtype",
   "prompt_tokens", "gen_tokens", "runs", "warmup",
   "prefill_tok_s", "decode_tok_s", "ttft_ms",            (medians)
   "cpu_utilization",      (process CPU time / wall time, median; ~1 = one core)
   "other_cpu_load",       (cores kept busy by other processes during the timed
                            runs, from /proc/stat; well above 0 = noisy numbers)
   "per_run": [{"ttft_ms", "prefill_tok_s", "decode_tok_s", "decode_ms", "cpu_utilization"}]}
Without --json a short human-readable summary is printed instead. The device
(mx.default_device()) is also logged to stderr.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import shoal_blas  # noqa: E402

shoal_blas.ensure_openblas("--no-openblas" not in sys.argv)

import argparse  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_MODEL = Path(os.environ.get("SHOAL_CACHE") or ROOT / ".cache") / "models" / "smollm2-135m-mlx-f32"

PROMPT_TEXT = (
    "The tide came in slowly over the flat grey sand, filling the channels one by one. "
    "A fisherman counted his nets, mended two of them, and wrote the numbers in a small notebook. "
)


def prompt_ids(tokenizer, n: int) -> list[int]:
    ids: list[int] = []
    chunk = tokenizer.encode(PROMPT_TEXT, add_special_tokens=False)
    while len(ids) < n:
        ids.extend(chunk)
    return ids[:n]


def one_run(model, ids: list[int], gen: int) -> dict:
    import mlx.core as mx
    from mlx_lm.generate import generate_step

    prompt = mx.array(ids)
    steps = generate_step(prompt, model, max_tokens=gen)
    count = 0
    c0 = time.process_time()
    t0 = time.perf_counter()
    t_first = t_last = t0
    for _tok, _lp in steps:
        t_last = time.perf_counter()
        if count == 0:
            t_first = t_last
        count += 1
    c1 = time.process_time()
    if count != gen:
        raise SystemExit(f"bench: expected {gen} tokens, got {count}")
    ttft = t_first - t0
    decode = t_last - t_first
    return {
        "ttft_ms": ttft * 1e3,
        "prefill_tok_s": len(ids) / ttft,
        "decode_tok_s": (gen - 1) / decode if gen > 1 and decode > 0 else None,
        "decode_ms": decode * 1e3,
        "cpu_utilization": (c1 - c0) / (t_last - t0) if t_last > t0 else None,
    }


def busy_seconds() -> float | None:
    """CPU seconds spent by the whole machine (all cores, non-idle), from /proc/stat."""
    try:
        with open("/proc/stat") as f:
            fields = [int(x) for x in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
    return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")


def median(runs: list[dict], key: str):
    vals = [r[key] for r in runs if r[key] is not None]
    return statistics.median(vals) if vals else None


def main() -> None:
    ap = argparse.ArgumentParser(description="mlx-lm prefill/decode benchmark (see module docstring)")
    ap.add_argument("model_dir", type=Path, nargs="?", default=DEFAULT_MODEL)
    ap.add_argument("--prompt-tokens", type=int, default=100)
    ap.add_argument("--gen-tokens", type=int, default=64)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--no-openblas", action="store_true", help="keep the wheel's bundled BLAS")
    args = ap.parse_args()
    if args.prompt_tokens < 1 or args.gen_tokens < 1 or args.runs < 1 or args.warmup < 0:
        ap.error("--prompt-tokens, --gen-tokens and --runs must be >= 1, --warmup >= 0")

    import mlx.core as mx
    import mlx_lm
    from mlx.utils import tree_flatten
    from mlx_lm import load
    from mlx_compat import compat_gather_qmm

    compat_gather_qmm()
    device = str(mx.default_device())
    blas = shoal_blas.blas_in_use()
    print(f"bench: device {device}, blas {blas}", file=sys.stderr)
    model, tokenizer = load(str(args.model_dir))
    mx.eval(model.parameters())
    ids = prompt_ids(tokenizer, args.prompt_tokens)

    for _ in range(args.warmup):
        one_run(model, ids, args.gen_tokens)
    b0, c0, t0 = busy_seconds(), time.process_time(), time.perf_counter()
    runs = [one_run(model, ids, args.gen_tokens) for _ in range(args.runs)]
    b1, c1, t1 = busy_seconds(), time.process_time(), time.perf_counter()
    other = None if b0 is None or b1 is None else max(0.0, ((b1 - b0) - (c1 - c0)) / (t1 - t0))
    if other is not None and other > 0.2:
        print(f"bench: warning: other processes kept {other:.2f} cores busy during the runs", file=sys.stderr)

    result = {
        "model_dir": str(args.model_dir.resolve()),
        "mlx": mx.__version__,
        "mlx_lm": mlx_lm.__version__,
        "device": device,
        "blas": blas,
        "dtype": str(tree_flatten(model.parameters())[0][1].dtype).replace("mlx.core.", ""),
        "prompt_tokens": args.prompt_tokens,
        "gen_tokens": args.gen_tokens,
        "runs": args.runs,
        "warmup": args.warmup,
        "prefill_tok_s": median(runs, "prefill_tok_s"),
        "decode_tok_s": median(runs, "decode_tok_s"),
        "ttft_ms": median(runs, "ttft_ms"),
        "cpu_utilization": median(runs, "cpu_utilization"),
        "other_cpu_load": other,
        "per_run": runs,
    }
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print(
            f"mlx-lm {result['mlx_lm']} on {device} ({blas} BLAS, {result['dtype']}): "
            f"prompt {args.prompt_tokens} tok, gen {args.gen_tokens} tok, median of {args.runs}\n"
            f"  TTFT    {result['ttft_ms']:.1f} ms\n"
            f"  prefill {result['prefill_tok_s']:.1f} tok/s\n"
            f"  decode  {result['decode_tok_s'] or float('nan'):.1f} tok/s\n"
            f"  cpu     {result['cpu_utilization'] or float('nan'):.2f} cores"
        )


if __name__ == "__main__":
    main()
