#!/usr/bin/env python3
"""Makes an MLX-community-style quantized model directory from the converted
float32 one, split into two weight shards, plus its dequantized twin.

Usage:
    quantize_mlx.py [SRC_DIR] [QUANT_DIR] [DEQUANT_DIR] [--bits 4] [--group-size 64]

Defaults: SRC_DIR ${SHOAL_CACHE:-<repo>/.cache}/models/smollm2-135m-mlx-f32,
QUANT_DIR .../smollm2-135m-mlx-q4-sharded, DEQUANT_DIR .../smollm2-135m-mlx-q4-dequant.

QUANT_DIR is what the engine's Hugging Face loader must read (MLX
`quantization` config, `model.safetensors.index.json` naming two shards,
`chat_template.jinja`). DEQUANT_DIR holds the same quantized weights expanded
to float32 by mlx-lm itself, so mlx-lm can serve as the reference without its
(very slow on CPU) quantized kernels. Skips work when both exist.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MODELS = Path(os.environ.get("SHOAL_CACHE", ROOT / ".cache")) / "models"


def reshard(d: Path) -> None:
    """Splits the directory's weights into two files named by a fresh index."""
    import mlx.core as mx

    files = sorted(d.glob("*.safetensors"))
    weights: dict = {}
    for f in files:
        weights.update(mx.load(str(f)))
    names = sorted(weights)
    half = len(names) // 2
    shards = {
        "model-00001-of-00002.safetensors": names[:half],
        "model-00002-of-00002.safetensors": names[half:],
    }
    for f in files:
        f.unlink()
    weight_map = {}
    for fname, keys in shards.items():
        mx.save_safetensors(str(d / fname), {k: weights[k] for k in keys}, metadata={"format": "mlx"})
        weight_map.update({k: fname for k in keys})
    (d / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}, indent=2))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("src", type=Path, nargs="?", default=MODELS / "smollm2-135m-mlx-f32")
    ap.add_argument("quant", type=Path, nargs="?", default=MODELS / "smollm2-135m-mlx-q4-sharded")
    ap.add_argument("dequant", type=Path, nargs="?", default=MODELS / "smollm2-135m-mlx-q4-dequant")
    ap.add_argument("--bits", type=int, default=4)
    ap.add_argument("--group-size", type=int, default=64)
    a = ap.parse_args()
    if (a.quant / "config.json").is_file() and (a.dequant / "config.json").is_file():
        print(f"quantize_mlx: up to date: {a.quant}", file=sys.stderr)
        return
    if not (a.src / "config.json").is_file():
        sys.exit(f"quantize_mlx: {a.src} is not a model directory (run convert_gguf.py first)")
    from mlx_lm import convert

    for d in (a.quant, a.dequant):
        shutil.rmtree(d, ignore_errors=True)
    tmp_q = a.quant.with_name(a.quant.name + ".tmp")
    tmp_d = a.dequant.with_name(a.dequant.name + ".tmp")
    for d in (tmp_q, tmp_d):
        shutil.rmtree(d, ignore_errors=True)
    convert(str(a.src), mlx_path=str(tmp_q), quantize=True, q_group_size=a.group_size, q_bits=a.bits)
    convert(str(tmp_q), mlx_path=str(tmp_d), dequantize=True)
    reshard(tmp_q)
    tmp_d.rename(a.dequant)
    tmp_q.rename(a.quant)
    print(f"quantize_mlx: wrote {a.quant} and {a.dequant}", file=sys.stderr)


if __name__ == "__main__":
    main()
