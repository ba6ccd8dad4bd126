#!/usr/bin/env python3
"""Convert a sentence-transformers BERT directory into a GGUF llama.cpp runs.

Usage:
    bert_gguf.py MODEL_DIR OUT.gguf

MODEL_DIR is a Hugging Face layout (``config.json``, ``model.safetensors``,
``tokenizer.json``, ``modules.json`` and ``1_Pooling/config.json``), such as
all-MiniLM-L6-v2. llama.cpp's own converter imports torch, whose PyPI wheel
brings gigabytes of CUDA packages; this one needs only numpy, safetensors and
the ``gguf`` package (its tensor-name map and writer), all in the test venv.

What goes in, as llama.cpp's ``bert`` architecture reads it:

* hyperparameters from ``config.json``; attention is not causal;
* ``bert.pooling_type`` from the sentence-transformers pooling config (mean,
  CLS or last token); a model without one is refused rather than guessed;
* the WordPiece vocabulary in llama.cpp's "phantom space" form (a word-start
  piece gets U+2581 in front, a ``##`` continuation loses its marks,
  ``[BRACKETED]`` specials stay), with the BERT normaliser's lowercase and
  accent stripping switched on when the tokenizer lowercases;
* weights: matrices as float16 (what llama.cpp's converter writes by
  default), vectors and the token-type table as float32.

The file is written beside OUT.gguf and renamed into place, so a reader never
sees half of it.
"""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import gguf
import numpy as np
from safetensors.numpy import load_file

POOLING = {
    "pooling_mode_mean_tokens": gguf.PoolingType.MEAN,
    "pooling_mode_cls_token": gguf.PoolingType.CLS,
    "pooling_mode_lasttoken": gguf.PoolingType.LAST,
}


def pooling(model_dir: Path) -> gguf.PoolingType:
    modules = json.loads((model_dir / "modules.json").read_text())
    pool = [m for m in modules if m["type"].endswith(".Pooling")]
    if not pool:
        sys.exit(f"{model_dir}: modules.json names no pooling module")
    cfg = json.loads((model_dir / pool[0]["path"] / "config.json").read_text())
    chosen = [kind for key, kind in POOLING.items() if cfg.get(key)]
    if len(chosen) != 1:
        sys.exit(f"{model_dir}: pooling {cfg} is not exactly one of {sorted(POOLING)}")
    return chosen[0]


def phantom(token: str) -> str:
    if token.startswith("[") and token.endswith("]"):
        return token
    if token.startswith("##"):
        return token[2:]
    return "\u2581" + token


def vocabulary(model_dir: Path) -> tuple[list[str], list[int], dict[str, int], bool]:
    tok = json.loads((model_dir / "tokenizer.json").read_text())
    model = tok["model"]
    if model.get("type") != "WordPiece":
        sys.exit(f"{model_dir}: tokenizer model {model.get('type')!r} is not WordPiece")
    by_id = sorted(model["vocab"].items(), key=lambda kv: kv[1])
    if [i for _, i in by_id] != list(range(len(by_id))):
        sys.exit(f"{model_dir}: vocabulary ids are not 0..n-1")
    special = {t["content"] for t in tok.get("added_tokens", []) if t.get("special")}
    tokens = [phantom(t) for t, _ in by_id]
    types = [
        gguf.TokenType.CONTROL if t in special else gguf.TokenType.NORMAL for t, _ in by_id
    ]
    ids = dict(model["vocab"])
    norm = tok.get("normalizer") or {}
    lowercase = bool(norm.get("lowercase", False)) if norm.get("type") == "BertNormalizer" else False
    return tokens, [int(t) for t in types], ids, lowercase


def main() -> None:
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    model_dir, out = Path(sys.argv[1]), Path(sys.argv[2])
    cfg = json.loads((model_dir / "config.json").read_text())
    if cfg.get("model_type") != "bert":
        sys.exit(f"{model_dir}: model_type {cfg.get('model_type')!r} is not bert")
    n_layer = int(cfg["num_hidden_layers"])
    tokens, types, ids, lowercase = vocabulary(model_dir)
    if len(tokens) != int(cfg["vocab_size"]):
        sys.exit(f"{model_dir}: {len(tokens)} tokens, config says {cfg['vocab_size']}")

    tmp = out.with_name(out.name + ".tmp")
    out.parent.mkdir(parents=True, exist_ok=True)
    w = gguf.GGUFWriter(str(tmp), "bert")
    w.add_name(model_dir.name)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    w.add_context_length(int(cfg["max_position_embeddings"]))
    w.add_embedding_length(int(cfg["hidden_size"]))
    w.add_feed_forward_length(int(cfg["intermediate_size"]))
    w.add_block_count(n_layer)
    w.add_head_count(int(cfg["num_attention_heads"]))
    w.add_layer_norm_eps(float(cfg["layer_norm_eps"]))
    w.add_causal_attention(False)
    w.add_pooling_type(pooling(model_dir))

    w.add_tokenizer_model("bert")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_type_count(int(cfg.get("type_vocab_size", 2)))
    w.add_bool("tokenizer.ggml.normalizer.lowercase", lowercase)
    w.add_bool("tokenizer.ggml.normalizer.strip_accents", lowercase)
    for name, add in [
        ("[CLS]", w.add_bos_token_id),
        ("[SEP]", w.add_sep_token_id),
        ("[UNK]", w.add_unk_token_id),
        ("[PAD]", w.add_pad_token_id),
        ("[MASK]", w.add_mask_token_id),
    ]:
        if name in ids:
            add(ids[name])
    w.add_add_bos_token(True)
    w.add_add_sep_token(True)

    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.BERT, n_layer)
    weights = load_file(str(model_dir / "model.safetensors"))
    written = 0
    for hf_name, array in sorted(weights.items()):
        stem, _, kind = hf_name.removeprefix("bert.").rpartition(".")
        if hf_name.endswith("position_ids") or stem.startswith("pooler"):
            continue  # a buffer, and the unused next-sentence pooler
        name = names.get_name(stem)
        if name is None:
            sys.exit(f"{hf_name}: no llama.cpp name for this tensor")
        array = np.asarray(array, dtype=np.float32)
        if array.ndim == 2 and name != "token_types":
            array = array.astype(np.float16)
        w.add_tensor(f"{name}.{kind}", array)
        written += 1

    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    os.replace(tmp, out)
    print(f"bert_gguf: {out} ({written} tensors, {len(tokens)} tokens)", file=sys.stderr)


if __name__ == "__main__":
    main()
