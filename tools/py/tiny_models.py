#!/usr/bin/env python3
"""Tiny random-weight models of each MLX architecture, made by mlx-lm's own
model classes, as reference models for the engine.

Usage:
    tiny_models.py [OUT_DIR] [--only ARCH]...

OUT_DIR defaults to ${SHOAL_CACHE:-<repo>/.cache}/models/tiny-v1. For each
architecture it writes OUT_DIR/<arch>-f32 (float32 weights) and
OUT_DIR/<arch>-q4 (mlx-lm's 4-bit affine quantization, group 32), each an
MLX-format directory: config.json, model.safetensors, tokenizer.json,
tokenizer_config.json (with the architecture's chat template) and
generation_config.json.

The shapes are small (hidden 64, 4 layers) but keep what makes each
architecture itself: sliding windows of 8 positions (shorter than the test
prompts), gemma's local/global rope bases and 1+w norms, phi3's fused
projections with partial rotary and LongRoPE, experts with top-k routing,
gpt-oss's attention sinks, biases and YaRN rope. Norms, sinks and biases are
randomised too, so a loader that skips one of them changes the logits.

The vocabulary is SmolLM2's tokenizer (from the converted reference model)
plus each chat format's special tokens. Skips a directory that exists.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MODELS = Path(os.environ.get("SHOAL_CACHE") or ROOT / ".cache") / "models"
BASE_TOKENIZER = MODELS / "smollm2-135m-mlx-f32"

COMMON = {
    "hidden_size": 64,
    "num_hidden_layers": 4,
    "intermediate_size": 96,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "rms_norm_eps": 1e-5,
    "max_position_embeddings": 4096,
    "tie_word_embeddings": False,
}

# Chat templates, one per format. Gemma has no system role: a system
# message opens the first user turn.
GEMMA_TEMPLATE = (
    "{{ bos_token }}"
    "{%- set ns = namespace(system='') -%}"
    "{%- for m in messages -%}"
    "{%- if m['role'] == 'system' -%}{%- set ns.system = m['content'] + '\n\n' -%}"
    "{%- else -%}"
    "{%- set role = 'model' if m['role'] == 'assistant' else m['role'] -%}"
    "{{ '<start_of_turn>' + role + '\n' }}"
    "{%- if m['role'] == 'user' and ns.system -%}{{ ns.system }}{%- set ns.system = '' -%}{%- endif -%}"
    "{{ m['content'] | trim }}{{ '<end_of_turn>\n' }}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<start_of_turn>model\n' }}{%- endif -%}"
)

MISTRAL_TEMPLATE = (
    "{{ bos_token }}"
    "{%- set ns = namespace(system='') -%}"
    "{%- for m in messages -%}"
    "{%- if m['role'] == 'system' -%}{%- set ns.system = m['content'] + '\n\n' -%}"
    "{%- elif m['role'] == 'user' -%}{{ '[INST] ' + ns.system + m['content'] + '[/INST]' }}{%- set ns.system = '' -%}"
    "{%- else -%}{{ m['content'] + eos_token }}"
    "{%- endif -%}"
    "{%- endfor -%}"
)

PHI3_TEMPLATE = (
    "{%- for m in messages -%}"
    "{{ '<|' + m['role'] + '|>\n' + m['content'] + '<|end|>\n' }}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<|assistant|>\n' }}{%- endif -%}"
)

CHATML_TEMPLATE = (
    "{%- for m in messages -%}"
    "{{ '<|im_start|>' + m['role'] + '\n' + m['content'] + '<|im_end|>\n' }}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<|im_start|>assistant\n' }}{%- endif -%}"
)

# Harmony: system instructions go to the developer message; earlier
# assistant turns are final-channel messages.
HARMONY_TEMPLATE = (
    "{{ '<|start|>system<|message|>Reasoning: medium\n\n# Valid channels: analysis, commentary, final.<|end|>' }}"
    "{%- for m in messages -%}"
    "{%- if m['role'] == 'system' -%}{{ '<|start|>developer<|message|># Instructions\n\n' + m['content'] + '<|end|>' }}"
    "{%- elif m['role'] == 'assistant' -%}{{ '<|start|>assistant<|channel|>final<|message|>' + m['content'] + '<|end|>' }}"
    "{%- else -%}{{ '<|start|>' + m['role'] + '<|message|>' + m['content'] + '<|end|>' }}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<|start|>assistant' }}{%- endif -%}"
)

HARMONY_TOKENS = ["<|start|>", "<|end|>", "<|message|>", "<|channel|>", "<|return|>", "<|call|>", "<|constrain|>"]

ARCHS = {
    "mistral": {
        "config": {
            "model_type": "mistral",
            "sliding_window": 8,
            "layer_types": ["sliding_attention", "full_attention"] * 2,
            "rope_theta": 1000000.0,
        },
        "template": MISTRAL_TEMPLATE,
        "special": ["<s>", "</s>", "[INST]", "[/INST]"],
        "bos": "<s>",
        "eos": ["</s>"],
    },
    "gemma3_text": {
        "config": {
            "model_type": "gemma3_text",
            "sliding_window": 8,
            "sliding_window_pattern": 3,
            "query_pre_attn_scalar": 16,
            "rope_theta": 1000000.0,
            "rope_local_base_freq": 10000.0,
            "rope_scaling": {"rope_type": "linear", "factor": 2.0},
            "num_key_value_heads": 1,
            "rms_norm_eps": 1e-6,
        },
        "template": GEMMA_TEMPLATE,
        "special": ["<bos>", "<start_of_turn>", "<end_of_turn>"],
        "bos": "<bos>",
        "eos": ["<end_of_turn>"],
        "tied": True,
    },
    "phi3": {
        "config": {
            "model_type": "phi3",
            "num_key_value_heads": 4,
            "partial_rotary_factor": 0.75,
            "original_max_position_embeddings": 256,
            "rope_scaling": {
                "type": "longrope",
                "short_factor": [1.0 + 0.05 * i for i in range(6)],
                "long_factor": [1.0 + 0.5 * i for i in range(6)],
            },
        },
        "template": PHI3_TEMPLATE,
        "special": ["<|system|>", "<|user|>", "<|assistant|>", "<|end|>"],
        "bos": None,
        "eos": ["<|end|>"],
    },
    "qwen3_moe": {
        "config": {
            "model_type": "qwen3_moe",
            "num_experts": 8,
            "num_experts_per_tok": 2,
            "decoder_sparse_step": 1,
            "mlp_only_layers": [2],
            "moe_intermediate_size": 32,
            "norm_topk_prob": True,
            "rope_theta": 1000000.0,
        },
        "template": CHATML_TEMPLATE,
        "special": [],
        "bos": None,
        "eos": ["<|im_end|>"],
    },
    "gpt_oss": {
        "config": {
            "model_type": "gpt_oss",
            "num_local_experts": 8,
            "num_experts_per_tok": 2,
            "intermediate_size": 64,
            "sliding_window": 8,
            "rope_theta": 150000,
            "rope_scaling": {
                "rope_type": "yarn",
                "factor": 4.0,
                "beta_fast": 32.0,
                "beta_slow": 1.0,
                "original_max_position_embeddings": 1024,
            },
        },
        "template": HARMONY_TEMPLATE,
        "special": HARMONY_TOKENS,
        "bos": None,
        "eos": ["<|return|>", "<|call|>"],
    },
}


def tokenizer_files(out: Path, spec: dict) -> int:
    """Writes the tokenizer with the format's special tokens; returns the
    vocabulary size."""
    from tokenizers import AddedToken, Tokenizer

    tok = Tokenizer.from_file(str(BASE_TOKENIZER / "tokenizer.json"))
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in spec["special"]])
    tok.save(str(out / "tokenizer.json"))
    base_cfg = json.loads((BASE_TOKENIZER / "tokenizer_config.json").read_text())
    cfg = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "add_bos_token": False,
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": 4096,
        "bos_token": spec["bos"],
        "eos_token": spec["eos"][0],
        "pad_token": spec["eos"][0],
        "unk_token": base_cfg.get("unk_token"),
        "chat_template": spec["template"],
    }
    (out / "tokenizer_config.json").write_text(json.dumps(cfg, indent=2))
    return tok.get_vocab_size(with_added_tokens=True), [tok.token_to_id(t) for t in spec["eos"]], (
        tok.token_to_id(spec["bos"]) if spec["bos"] else None
    )


def randomise(model, arch: str) -> None:
    """Gives norms, sinks and biases values a loader cannot fake."""
    import mlx.core as mx
    from mlx.utils import tree_flatten, tree_unflatten

    params = []
    for name, p in tree_flatten(model.parameters()):
        if "norm" in name:
            base = 0.0 if arch.startswith("gemma") else 1.0
            p = base + 0.2 * mx.random.normal(p.shape)
        elif name.endswith("sinks"):
            p = mx.random.normal(p.shape)
        elif name.endswith(".bias"):
            p = 0.05 * mx.random.normal(p.shape)
        elif name.endswith("embed_tokens.weight"):
            p = 0.5 * mx.random.normal(p.shape)
        params.append((name, p.astype(mx.float32)))
    model.update(tree_unflatten(params))
    mx.eval(model.parameters())


def build(arch: str, spec: dict, out_dir: Path) -> None:
    import mlx.core as mx
    from mlx_lm.utils import _get_classes, quantize_model, save_config, save_model

    f32 = out_dir / f"{arch}-f32"
    q4 = out_dir / f"{arch}-q4"
    if (f32 / "config.json").is_file() and (q4 / "config.json").is_file():
        return
    for d in (f32, q4):
        shutil.rmtree(d, ignore_errors=True)
        d.mkdir(parents=True)
    vocab, eos_ids, bos_id = tokenizer_files(f32, spec)
    config = dict(COMMON)
    config.update(spec["config"])
    config["vocab_size"] = vocab
    config["eos_token_id"] = eos_ids if len(eos_ids) > 1 else eos_ids[0]
    if bos_id is not None:
        config["bos_token_id"] = bos_id
    if spec.get("tied"):
        config["tie_word_embeddings"] = True
    mx.random.seed(sum(map(ord, arch)))
    model_cls, args_cls = _get_classes(config)
    model = model_cls(args_cls.from_dict(config))
    if spec.get("tied") and hasattr(model, "lm_head"):
        # gemma ties when the weights bring no lm_head.
        model.sanitize({})
    randomise(model, arch)
    save_model(f32, model, donate_model=False)
    save_config(dict(config), f32 / "config.json")
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(f32 / name, q4 / name)
    generation = {"eos_token_id": config["eos_token_id"]}
    for d in (f32, q4):
        (d / "generation_config.json").write_text(json.dumps(generation))
    qmodel, qconfig = quantize_model(model, dict(config), group_size=32, bits=4)
    save_model(q4, qmodel, donate_model=False)
    save_config(qconfig, q4 / "config.json")
    print(f"tiny_models: {arch}: {f32} and {q4}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path, nargs="?", default=MODELS / "tiny-v1")
    ap.add_argument("--only", action="append", choices=sorted(ARCHS), default=[])
    args = ap.parse_args()
    for arch, spec in ARCHS.items():
        if args.only and arch not in args.only:
            continue
        build(arch, spec, args.out)


if __name__ == "__main__":
    main()
