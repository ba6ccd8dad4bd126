"""Rewrites a GGUF with every tensor dequantized to F32 and the metadata kept.

    python tools/py/gguf_f32.py IN.gguf OUT.gguf

MLX's GGUF loader reads F32/F16/Q4_0/Q4_1/Q8_0 only, so a Q4_K_M file from
the Hub cannot run on MLX as it is. The F32 copy holds exactly the weights the
quantized file encodes (the `gguf` package's own dequantizer, as
convert_gguf.py uses for the Hugging Face layout), with the file's own
vocabulary, special tokens and hyperparameters, so the MLX GGUF path can be
checked against the same weights in a model directory and against llama.cpp
on the same file. Only `general.file_type` changes (to ALL_F32).

    python tools/py/gguf_f32.py --type q8_0 IN.gguf OUT.gguf

requantizes instead: every weight matrix to Q8_0 from its dequantized
values (the `gguf` package's Q8_0, the same block format llama.cpp's quantize
tool writes), vectors in F32. A Q8_0 copy of a Q4_K_M file is a second model
of the same vocabulary and nearly the same behaviour, larger and slower: the
target that the Q4_K_M file drafts for in the speculative-decoding tests and
bench.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import numpy as np


def copy_field(writer, field, gguf, value=None, name=None) -> None:
    """Writes one metadata field of a reader into a writer, keeping its types
    (with `value` instead of the field's own, and `name` instead of its key,
    when given)."""
    vtype = field.types[0]
    if value is None:
        value = field.contents()
    key = name or field.name
    if vtype == gguf.GGUFValueType.ARRAY:
        writer.add_key_value(key, value, vtype, sub_type=field.types[-1])
    else:
        writer.add_key_value(key, value, vtype)


def part_writer(gguf, out: Path, arch: str):
    """A writer for `out`, writing first to a `.part` file beside it (see
    `finish`), with the folder made; returns it and the part file's path."""
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".part")
    return gguf.GGUFWriter(tmp, arch), tmp


def finish(writer, tmp: Path, out: Path) -> None:
    """Writes everything given to a `part_writer` and only then moves the
    file to `out`, so a run cut short never leaves half a GGUF there."""
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    os.replace(tmp, out)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("src", type=Path)
    ap.add_argument("out", type=Path)
    ap.add_argument("--type", choices=["f32", "q8_0"], default="f32")
    args = ap.parse_args()

    import gguf

    q8 = gguf.GGMLQuantizationType.Q8_0
    block = gguf.GGML_QUANT_SIZES[q8][0]

    reader = gguf.GGUFReader(args.src)
    arch = reader.fields["general.architecture"].contents()
    writer, tmp = part_writer(gguf, args.out, arch)
    for name, field in reader.fields.items():
        if name.startswith("GGUF.") or name in ("general.architecture", "general.file_type"):
            continue
        copy_field(writer, field, gguf)
    to_q8 = args.type == "q8_0"
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_Q8_0 if to_q8 else gguf.LlamaFileType.ALL_F32)
    for t in reader.tensors:
        data = gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float32)
        shape = tuple(int(d) for d in reversed(t.shape.tolist()))
        data = data.reshape(shape)
        if to_q8 and len(shape) >= 2 and shape[-1] % block == 0:
            writer.add_tensor(t.name, gguf.quants.quantize(data, q8), raw_dtype=q8)
        else:
            writer.add_tensor(t.name, data)
    finish(writer, tmp, args.out)
    print(f"gguf_f32: {len(reader.tensors)} tensors ({args.type}) -> {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
