#!/usr/bin/env python3
"""Copies a GGUF with ``{arch}.pooling_type`` set, as decoder embedding models
(Qwen3-Embedding, gte-Qwen) are marked: a causal model whose last hidden
state (or mean) is the embedding.

    python tools/py/gguf_pooled.py IN.gguf OUT.gguf mean|cls|last

Tensors are copied as stored (quantized or not); every other key is kept.
The engine's tests use it to run the decoder embedding path (a KV cache
cleared after every pass, last-token pooling) on a model that ships here.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

POOLING = {"mean": 1, "cls": 2, "last": 3}


def main() -> int:
    if len(sys.argv) != 4 or sys.argv[3] not in POOLING:
        sys.exit(__doc__)
    import gguf

    src, out, pooling = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3]
    reader = gguf.GGUFReader(src)
    arch = reader.fields["general.architecture"].contents()
    key = f"{arch}.pooling_type"
    tmp = out.with_suffix(".part")
    out.parent.mkdir(parents=True, exist_ok=True)
    writer = gguf.GGUFWriter(tmp, arch)
    for name, field in reader.fields.items():
        if name.startswith("GGUF.") or name in ("general.architecture", key):
            continue
        vtype = field.types[0]
        if vtype == gguf.GGUFValueType.ARRAY:
            writer.add_key_value(name, field.contents(), vtype, sub_type=field.types[-1])
        else:
            writer.add_key_value(name, field.contents(), vtype)
    writer.add_uint32(key, POOLING[pooling])
    for t in reader.tensors:
        writer.add_tensor(t.name, t.data, raw_shape=t.data.shape, raw_dtype=t.tensor_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    os.replace(tmp, out)
    print(f"gguf_pooled: {key} = {pooling} -> {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
