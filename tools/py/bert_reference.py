#!/usr/bin/env python3
"""Sentence embeddings of a sentence-transformers BERT directory, in numpy.

Usage:
    bert_reference.py HF_DIR --inputs-json FILE --out FILE [--batched]

An independent reference for the engine's embeddings: no torch, no
transformers model classes, no llama.cpp. It reads ``config.json`` and
``model.safetensors`` (``safetensors.numpy``), tokenizes with the
``tokenizers`` package from ``tokenizer.json`` (the file's own truncation and
padding switched off, special tokens added as the post-processor says) and
runs, in float64:

* embeddings: word + absolute position + token type 0, then LayerNorm;
* each encoder layer: multi-head self-attention over the attended tokens
  (padding masked out of the keys), output projection, residual, LayerNorm;
  then the MLP (GELU with the exact erf), residual, LayerNorm;
* the pooling that ``modules.json`` and its Pooling module's ``config.json``
  name (mean over the attended tokens, CLS, max or last token);
* L2 normalization when ``modules.json`` has a Normalize module.

``--inputs-json`` holds a JSON list; a string item is tokenized, a list of
integers is taken as token ids as they stand. By default every input runs
alone; ``--batched`` runs them all in one padded batch, so both ways can be
checked against each other. The output JSON:

    {"token_counts": [n, ...], "token_ids": [[id, ...], ...],
     "vectors": [[x, ...], ...], "dimensions": d}

Importable too: ``Reference(hf_dir)`` then ``.tokenize(texts)`` and
``.embed(id_lists, batched=False)``.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Sequence

import numpy as np
from safetensors.numpy import load_file
from tokenizers import Tokenizer

# sentence-transformers' pooling flags this reference knows, by the name used here.
POOLING_FLAGS = {
    "pooling_mode_mean_tokens": "mean",
    "pooling_mode_cls_token": "cls",
    "pooling_mode_max_tokens": "max",
    "pooling_mode_lasttoken": "last",
}

_erf = np.frompyfunc(math.erf, 1, 1)


def gelu(x: np.ndarray) -> np.ndarray:
    """GELU with the exact Gaussian CDF (libm's erf, element by element)."""
    return 0.5 * x * (1.0 + _erf(x / math.sqrt(2.0)).astype(np.float64))


def layer_norm(x: np.ndarray, w: np.ndarray, b: np.ndarray, eps: float) -> np.ndarray:
    mu = x.mean(axis=-1, keepdims=True)
    var = ((x - mu) ** 2).mean(axis=-1, keepdims=True)
    return (x - mu) / np.sqrt(var + eps) * w + b


def pipeline(hf_dir: Path) -> tuple[str, bool]:
    """(pooling, normalize) from modules.json and the Pooling module's config."""
    modules_file = hf_dir / "modules.json"
    if not modules_file.is_file():
        sys.exit(f"{hf_dir}: no modules.json (not a sentence-transformers directory)")
    modules = json.loads(modules_file.read_text())
    pools = [m for m in modules if m["type"].endswith(".Pooling")]
    if len(pools) != 1:
        sys.exit(f"{hf_dir}: modules.json names {len(pools)} pooling modules, not one")
    cfg = json.loads((hf_dir / pools[0]["path"] / "config.json").read_text())
    on = [key for key, value in cfg.items() if key.startswith("pooling_mode") and value]
    if len(on) != 1 or on[0] not in POOLING_FLAGS:
        sys.exit(f"{hf_dir}: pooling {on} is not exactly one of {sorted(POOLING_FLAGS)}")
    normalize = any(m["type"].endswith(".Normalize") for m in modules)
    return POOLING_FLAGS[on[0]], normalize


class Reference:
    def __init__(self, hf_dir: str | Path) -> None:
        self.dir = Path(hf_dir)
        cfg = json.loads((self.dir / "config.json").read_text())
        if cfg.get("model_type") != "bert":
            sys.exit(f"{self.dir}: model_type {cfg.get('model_type')!r} is not bert")
        if cfg.get("position_embedding_type", "absolute") != "absolute":
            sys.exit(f"{self.dir}: only absolute position embeddings are handled")
        if cfg.get("hidden_act", "gelu") != "gelu":
            sys.exit(f"{self.dir}: hidden_act {cfg.get('hidden_act')!r} is not gelu")
        self.layers = int(cfg["num_hidden_layers"])
        self.heads = int(cfg["num_attention_heads"])
        self.hidden = int(cfg["hidden_size"])
        self.eps = float(cfg.get("layer_norm_eps", 1e-12))
        self.max_positions = int(cfg["max_position_embeddings"])
        self.pad_id = int(cfg.get("pad_token_id", 0) or 0)
        self.pooling, self.normalize = pipeline(self.dir)

        raw = load_file(str(self.dir / "model.safetensors"))
        self.w: dict[str, np.ndarray] = {}
        for name, array in raw.items():
            name = name.removeprefix("bert.")
            # Old checkpoints name LayerNorm parameters gamma/beta.
            name = name.replace("LayerNorm.gamma", "LayerNorm.weight").replace(
                "LayerNorm.beta", "LayerNorm.bias"
            )
            self.w[name] = np.asarray(array, dtype=np.float64)
        self.vocab = self.w["embeddings.word_embeddings.weight"].shape[0]

        self.tok = Tokenizer.from_file(str(self.dir / "tokenizer.json"))
        self.tok.no_truncation()
        self.tok.no_padding()

    # ------------------------------------------------------------ tokenizing

    def tokenize(self, texts: Sequence[str]) -> list[list[int]]:
        """Token ids of each text, with the special tokens the tokenizer adds."""
        return [self.tok.encode(t, add_special_tokens=True).ids for t in texts]

    def ids_of(self, items: Sequence[str | Sequence[int]]) -> list[list[int]]:
        """A string is tokenized; a list of integers is kept as it is."""
        out = []
        for item in items:
            if isinstance(item, str):
                out.append(self.tokenize([item])[0])
            else:
                out.append([int(i) for i in item])
        return out

    # ------------------------------------------------------------ the model

    def _p(self, name: str) -> np.ndarray:
        return self.w[name]

    def _dense(self, x: np.ndarray, name: str) -> np.ndarray:
        return x @ self._p(name + ".weight").T + self._p(name + ".bias")

    def _ln(self, x: np.ndarray, name: str) -> np.ndarray:
        return layer_norm(x, self._p(name + ".weight"), self._p(name + ".bias"), self.eps)

    def hidden_states(self, ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
        """Last hidden states, shape (batch, length, hidden), of padded ids."""
        batch, length = ids.shape
        x = (
            self._p("embeddings.word_embeddings.weight")[ids]
            + self._p("embeddings.position_embeddings.weight")[np.arange(length)][None, :, :]
            + self._p("embeddings.token_type_embeddings.weight")[0][None, None, :]
        )
        x = self._ln(x, "embeddings.LayerNorm")
        head_dim = self.hidden // self.heads
        # Padded keys get -inf-like scores; exp() makes their weight exactly 0.
        key_bias = np.where(mask[:, None, None, :] > 0, 0.0, -1e30)

        def split(t: np.ndarray) -> np.ndarray:
            return t.reshape(batch, length, self.heads, head_dim).transpose(0, 2, 1, 3)

        for i in range(self.layers):
            p = f"encoder.layer.{i}."
            q = split(self._dense(x, p + "attention.self.query"))
            k = split(self._dense(x, p + "attention.self.key"))
            v = split(self._dense(x, p + "attention.self.value"))
            scores = q @ k.transpose(0, 1, 3, 2) / math.sqrt(head_dim) + key_bias
            scores -= scores.max(axis=-1, keepdims=True)
            weights = np.exp(scores)
            weights /= weights.sum(axis=-1, keepdims=True)
            ctx = (weights @ v).transpose(0, 2, 1, 3).reshape(batch, length, self.hidden)
            attn = self._dense(ctx, p + "attention.output.dense")
            x = self._ln(x + attn, p + "attention.output.LayerNorm")
            mlp = self._dense(gelu(self._dense(x, p + "intermediate.dense")), p + "output.dense")
            x = self._ln(x + mlp, p + "output.LayerNorm")
        return x

    def _pool(self, h: np.ndarray, mask: np.ndarray) -> np.ndarray:
        m = mask[:, :, None].astype(np.float64)
        if self.pooling == "mean":
            return (h * m).sum(axis=1) / m.sum(axis=1)
        if self.pooling == "cls":
            return h[:, 0, :]
        if self.pooling == "max":
            return np.where(m > 0, h, -np.inf).max(axis=1)
        last = mask.sum(axis=1).astype(np.int64) - 1
        return h[np.arange(h.shape[0]), last, :]

    def _check(self, ids: list[int], at: int) -> None:
        if not ids:
            raise ValueError(f"input {at} has no tokens")
        if len(ids) > self.max_positions:
            raise ValueError(
                f"input {at} has {len(ids)} tokens; the model has {self.max_positions} positions"
            )
        bad = [t for t in ids if not 0 <= t < self.vocab]
        if bad:
            raise ValueError(f"input {at} holds ids outside the vocabulary: {bad[:5]}")

    def _run(self, id_lists: list[list[int]]) -> np.ndarray:
        length = max(len(ids) for ids in id_lists)
        ids = np.full((len(id_lists), length), self.pad_id, dtype=np.int64)
        mask = np.zeros((len(id_lists), length), dtype=np.int64)
        for row, seq in enumerate(id_lists):
            ids[row, : len(seq)] = seq
            mask[row, : len(seq)] = 1
        pooled = self._pool(self.hidden_states(ids, mask), mask)
        if self.normalize:
            pooled = pooled / np.maximum(np.linalg.norm(pooled, axis=-1, keepdims=True), 1e-12)
        return pooled

    def embed(self, id_lists: Sequence[Sequence[int]], batched: bool = False) -> np.ndarray:
        """One vector per token-id list, shape (inputs, hidden), float64."""
        lists = [list(map(int, ids)) for ids in id_lists]
        for at, ids in enumerate(lists):
            self._check(ids, at)
        if not lists:
            return np.zeros((0, self.hidden))
        if batched:
            return self._run(lists)
        return np.concatenate([self._run([ids]) for ids in lists], axis=0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("hf_dir", type=Path)
    ap.add_argument("--inputs-json", type=Path, required=True,
                    help="JSON list of strings (or of token-id lists)")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--batched", action="store_true",
                    help="run every input in one padded batch instead of one at a time")
    args = ap.parse_args()

    items = json.loads(args.inputs_json.read_text())
    if not isinstance(items, list):
        sys.exit(f"{args.inputs_json}: not a JSON list")
    ref = Reference(args.hf_dir)
    id_lists = ref.ids_of(items)
    try:
        vectors = ref.embed(id_lists, batched=args.batched)
    except ValueError as e:
        sys.exit(f"bert_reference: {e}")
    out = {
        "token_counts": [len(ids) for ids in id_lists],
        "token_ids": id_lists,
        "vectors": [[float(x) for x in v] for v in vectors],
        "dimensions": int(vectors.shape[1]),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out))
    print(
        f"bert_reference: {len(id_lists)} inputs, {sum(out['token_counts'])} tokens, "
        f"{out['dimensions']} dimensions ({ref.pooling} pooling"
        f"{', normalized' if ref.normalize else ''}{', batched' if args.batched else ''})",
        file=sys.stderr,
    )


if __name__ == "__main__":
    main()
