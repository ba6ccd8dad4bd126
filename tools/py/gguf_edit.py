#!/usr/bin/env python3
"""Copies a GGUF with a few facts changed, for test fixtures made from the
models that ship here:

    python tools/py/gguf_edit.py IN.gguf OUT.gguf [--pooling mean|cls|last] [--token ID=TEXT ...]
        [--arch NAME [--rope-sections A,B,C,D]] [--context-length N]

* ``--pooling`` sets ``{arch}.pooling_type``, as decoder embedding models
  (Qwen3-Embedding, gte-Qwen) are marked: the engine's tests run the decoder
  embedding path (a KV cache cleared after every pass, last-token pooling)
  on SmolLM2's weights with it.
* ``--token 4=</think>`` renames a vocabulary entry (an unused special token,
  typed user-defined as Qwen3 types its own), e.g. to give SmolLM2 the
  ``</think>`` token of a model trained to reason, so the server's reasoning
  section (opened, cut at a budget, counted) runs on real weights. The weights never learned the section: such
  a file tests the mechanics, not the model.

* ``--arch qwen2vl --rope-sections 8,12,12,0`` names another architecture of
  the same tensors (its ``{arch}.*`` keys renamed with it): Qwen2.5's weights
  as a Qwen2-VL text model, whose positions are M-RoPE's sections (time,
  height, width) of the rotary dimensions. A text token's sections share one
  position, so text reads as it did; an image's take its 2-D grid.
* ``--context-length 256`` sets the trained window (``{arch}.context_length``),
  so a test can give the model a KV pool larger than its window in positions
  and see which of the two bounds a request meets.

Tensors are copied as stored (quantized or not); every other key is kept.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

POOLING = {"mean": 1, "cls": 2, "last": 3}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("src", type=Path)
    ap.add_argument("out", type=Path)
    ap.add_argument("--pooling", choices=sorted(POOLING))
    ap.add_argument("--token", action="append", default=[], metavar="ID=TEXT")
    ap.add_argument("--arch", help="the architecture to name (its keys renamed with it)")
    ap.add_argument("--rope-sections", help="{arch}.rope.dimension_sections, four numbers")
    ap.add_argument("--context-length", type=int, help="{arch}.context_length, the trained window")
    args = ap.parse_args()
    import gguf

    from gguf_f32 import copy_field, finish, part_writer

    renames = {}
    for t in args.token:
        i, _, text = t.partition("=")
        if not i.isdigit() or not text:
            sys.exit(f"--token {t!r}: expected ID=TEXT")
        renames[int(i)] = text
    reader = gguf.GGUFReader(args.src)
    arch = reader.fields["general.architecture"].contents()
    new_arch = args.arch or arch
    pooling_key = f"{new_arch}.pooling_type"
    writer, tmp = part_writer(gguf, args.out, new_arch)
    for name, field in reader.fields.items():
        if name.startswith("GGUF.") or name == "general.architecture":
            continue
        key = new_arch + name[len(arch):] if name.startswith(f"{arch}.") else name
        if key == pooling_key and args.pooling:
            continue
        value = None
        if name == "tokenizer.ggml.tokens" and renames:
            value = list(field.contents())
            for i, text in renames.items():
                if i >= len(value):
                    sys.exit(f"--token {i}: the vocabulary has {len(value)} tokens")
                value[i] = text
        if name == "tokenizer.ggml.token_type" and renames:
            # User-defined, as Qwen3's <think> / </think> are typed: matched
            # whole in text, written out when generated.
            value = list(field.contents())
            for i in renames:
                value[i] = int(gguf.TokenType.USER_DEFINED)
        if args.rope_sections and key == f"{new_arch}.rope.dimension_sections":
            continue
        if args.context_length and key == f"{new_arch}.context_length":
            continue
        copy_field(writer, field, gguf, value, key)
    if args.rope_sections:
        sections = [int(x) for x in args.rope_sections.split(",")]
        if len(sections) != 4:
            sys.exit("--rope-sections: four numbers")
        writer.add_array(f"{new_arch}.rope.dimension_sections", sections)
    if args.pooling:
        writer.add_uint32(pooling_key, POOLING[args.pooling])
    if args.context_length:
        writer.add_uint32(f"{new_arch}.context_length", args.context_length)
    for t in reader.tensors:
        writer.add_tensor(t.name, t.data, raw_shape=t.data.shape, raw_dtype=t.tensor_type)
    finish(writer, tmp, args.out)
    print(f"gguf_edit: {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
