"""Writes the tiny float32 models of tiny_models.py as GGUF files, the way
llama.cpp lays them out, for the MLX GGUF loader's architecture tests.

    python tools/py/tiny_gguf.py TINY_DIR

For each architecture below, TINY_DIR/{arch}-f32 becomes
TINY_DIR/{arch}-f32.gguf. Names come from the `gguf` package's own
Hugging Face -> GGUF tensor map and keys from its writer, so the file says
what llama.cpp's converter would:

* qwen3_moe -> ``qwen3moe``: stacked experts as ``ffn_{gate,up,down}_exps``,
  the router as ``ffn_gate_inp``, ``expert_count``/``expert_used_count``/
  ``expert_feed_forward_length``. The tiny model's one dense layer
  (``mlp_only_layers``) keeps plain ``ffn_{gate,up,down}`` tensors, which a
  loader tells apart by the router's absence.
* phi3 -> ``phi3``: fused ``attn_qkv`` and ``ffn_up`` (gate and up stacked),
  ``rope.dimension_count`` for the partial rotary, LongRoPE's factors as the
  ``rope_factors_long``/``rope_factors_short`` tensors with
  ``rope.scaling.original_context_length`` and ``rope.scaling.attn_factor``.

Neither permutes q/k rows (both run rotate-halves rope in llama.cpp). The
vocabulary is the model's byte-level BPE (``tokenizer.ggml.pre`` = smollm,
the tiny models' tokenizer), with its chat template and special ids; added
tokens are typed as llama.cpp's converter types them (control when special).
"""

from __future__ import annotations

import json
import math
import os
import sys
from pathlib import Path

import numpy as np

ARCHS = {"qwen3_moe": "QWEN3MOE", "phi3": "PHI3"}


def tensors(src: Path) -> dict[str, np.ndarray]:
    from safetensors.numpy import load_file

    out: dict[str, np.ndarray] = {}
    for f in sorted(src.glob("*.safetensors")):
        out.update(load_file(f))
    return out


def gguf_name(tmaps, hf: str) -> str:
    # mlx-lm stacks experts as switch_mlp.*; the map knows them as experts.*
    hf = hf.replace(".mlp.switch_mlp.", ".mlp.experts.")
    base, suffix = hf.rsplit(".", 1)
    name = next((n for n in (m.get_name(base) for m in tmaps) if n), None)
    if name is None:
        raise SystemExit(f"tiny_gguf: no GGUF name for {hf}")
    return f"{name}.{suffix}"


def write(src: Path, out: Path, arch: str, attn_factor: bool = True) -> None:
    import gguf

    cfg = json.loads((src / "config.json").read_text())
    model_arch = getattr(gguf.MODEL_ARCH, ARCHS[arch])
    layers = cfg["num_hidden_layers"]
    # The architecture's own names; the dense layer's MLP by llama's.
    tmap = [gguf.get_tensor_name_map(model_arch, layers), gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, layers)]
    tmp = out.with_suffix(".part")
    w = gguf.GGUFWriter(tmp, gguf.MODEL_ARCH_NAMES[model_arch])
    w.add_name(f"tiny {arch}")
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(cfg["hidden_size"])
    w.add_block_count(layers)
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(cfg["num_attention_heads"])
    w.add_head_count_kv(cfg["num_key_value_heads"])
    w.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    w.add_rope_freq_base(cfg.get("rope_theta", 10000.0))
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    weights = tensors(src)
    if arch == "qwen3_moe":
        w.add_key_length(cfg["head_dim"])
        w.add_value_length(cfg["head_dim"])
        w.add_expert_count(cfg["num_experts"])
        w.add_expert_used_count(cfg["num_experts_per_tok"])
        w.add_expert_feed_forward_length(cfg["moe_intermediate_size"])
    if arch == "phi3":
        head_dim = cfg["hidden_size"] // cfg["num_attention_heads"]
        dims = int(head_dim * cfg.get("partial_rotary_factor", 1.0))
        w.add_rope_dimension_count(dims)
        rs = cfg["rope_scaling"]
        orig = cfg["original_max_position_embeddings"]
        scale = cfg["max_position_embeddings"] / orig
        w.add_rope_scaling_orig_ctx_len(orig)
        if attn_factor:
            w.add_rope_scaling_attn_factors(math.sqrt(1 + math.log(scale) / math.log(orig)) if scale > 1 else 1.0)
        for kind in ("long", "short"):
            tensor = gguf.TENSOR_NAMES[getattr(gguf.MODEL_TENSOR, f"ROPE_FACTORS_{kind.upper()}")]
            w.add_tensor(f"{tensor}.weight", np.asarray(rs[f"{kind}_factor"], dtype=np.float32))

    vocab = gguf.vocab.BpeVocab(src)
    tokens, types = [], []
    for text, _score, kind in list(vocab.bpe_tokens()) + list(vocab.added_tokens()):
        tokens.append(text)
        types.append(kind)
    # As llama.cpp's converter types them: every added token (in the base
    # vocabulary or not) is a control token when special, else user-defined.
    index = {t: i for i, t in enumerate(tokens)}
    added = json.loads((src / "tokenizer.json").read_text()).get("added_tokens", [])
    for a in added:
        i = index.get(a["content"])
        if i is not None:
            types[i] = gguf.TokenType.CONTROL if a.get("special") else gguf.TokenType.USER_DEFINED
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("smollm")
    w.add_token_list(tokens)
    w.add_token_types(types)
    gguf.SpecialVocab(src, load_merges=True, n_vocab=len(tokens)).add_to_gguf(w, quiet=True)

    for name, t in weights.items():
        w.add_tensor(gguf_name(tmap, name), np.ascontiguousarray(t, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    os.replace(tmp, out)


def main() -> int:
    root = Path(sys.argv[1])
    for arch in ARCHS:
        src = root / f"{arch}-f32"
        out = root / f"{arch}-f32.gguf"
        write(src, out, arch)
        print(f"tiny_gguf: {out}", file=sys.stderr)
    # Phi-3 as files that leave out the LongRoPE attention factor: the
    # loader derives it from the context lengths, as llama.cpp does.
    out = root / "phi3-f32-no-attn-factor.gguf"
    write(root / "phi3-f32", out, "phi3", attn_factor=False)
    print(f"tiny_gguf: {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
