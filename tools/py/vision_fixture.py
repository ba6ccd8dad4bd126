#!/usr/bin/env python3
"""Make a vision fixture: the default model beside a small projector file.

Usage:
    vision_fixture.py MODEL.gguf OUT_DIR [--qwen2vl]

OUT_DIR gets a hard link (or copy) of MODEL.gguf and, beside it,
``mmproj-<stem>-f32.gguf``: a LLaVA-style projector (``clip.projector_type``
``mlp``) as llama.cpp's multimodal library loads it. Its vision encoder is a
two-layer ViT over a 64x64 image in 16x16 patches, so every image costs 16
prompt tokens; the two-layer MLP maps the encoder's width to the text model's
embedding width, read from MODEL.gguf.

With ``--qwen2vl`` the projector is instead Qwen2-VL's patch merger
(``qwen2vl_merger``): a ViT over 14x14 patches with M-RoPE in its attention,
whose 2x2 neighbouring patches are merged into one token. MODEL.gguf must then
be a ``qwen2vl`` text model (``gguf_edit.py --arch qwen2vl``), whose prompt
positions an image lays out in 2-D: it takes fewer positions than tokens.

The weights are random (seeded, so the file is the same on every machine). No
vision model small enough ships in a package this project can install, and a
random projector exercises everything the server does with an image: decoding,
preprocessing, the encoder, the image's place and length in the prompt, its
prefix-cache key and usage. What the model then says about the picture is
noise, but it is the same noise for the same picture, and another picture
changes it.

The file is written beside its final name and renamed into place.
"""
from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import gguf
import numpy as np

IMAGE = 64
PATCH = 16
WIDTH = 64
HEADS = 4
FF = 128
LAYERS = 2


def text_width(model: Path) -> int:
    reader = gguf.GGUFReader(str(model))
    arch = bytes(reader.fields["general.architecture"].parts[-1]).decode()
    field = reader.fields[f"{arch}.embedding_length"]
    return int(field.parts[-1][0])


class Weights:
    """Seeded random tensors, drawn in the order they are asked for."""

    def __init__(self, seed: int) -> None:
        self.rng = np.random.default_rng(seed)

    def w(self, *shape: int, scale: float = 0.02) -> np.ndarray:
        return (self.rng.standard_normal(shape) * scale).astype(np.float32)

    @staticmethod
    def zeros(*shape: int) -> np.ndarray:
        return np.zeros(shape, dtype=np.float32)

    @staticmethod
    def ones(*shape: int) -> np.ndarray:
        return np.ones(shape, dtype=np.float32)


def start(tmp: Path, name: str, style: str, projector_type: str, image: int, patch: int, n_embd_text: int):
    """A projector file's writer with the encoder's shape written."""
    out = gguf.GGUFWriter(str(tmp), "clip")
    out.add_string("general.name", name)
    out.add_string("general.description", f"random-weight {style} projector for tests")
    out.add_uint32("general.file_type", 0)
    out.add_bool("clip.has_vision_encoder", True)
    out.add_string("clip.projector_type", projector_type)
    out.add_bool("clip.use_gelu", True)
    out.add_uint32("clip.vision.image_size", image)
    out.add_uint32("clip.vision.patch_size", patch)
    out.add_uint32("clip.vision.embedding_length", WIDTH)
    out.add_uint32("clip.vision.feed_forward_length", FF)
    out.add_uint32("clip.vision.block_count", LAYERS)
    out.add_uint32("clip.vision.projection_dim", n_embd_text)
    out.add_uint32("clip.vision.attention.head_count", HEADS)
    out.add_float32("clip.vision.attention.layer_norm_epsilon", 1e-6)
    out.add_array("clip.vision.image_mean", [0.5, 0.5, 0.5])
    out.add_array("clip.vision.image_std", [0.5, 0.5, 0.5])
    return out


def add_blocks(out, r: Weights) -> None:
    """The encoder's transformer blocks (numpy shapes are the reverse of ggml's: a weight is
    [out, in])."""
    for i in range(LAYERS):
        p = f"v.blk.{i}"
        for n in ("ln1", "ln2"):
            out.add_tensor(f"{p}.{n}.weight", r.ones(WIDTH))
            out.add_tensor(f"{p}.{n}.bias", r.zeros(WIDTH))
        for n in ("attn_q", "attn_k", "attn_v", "attn_out"):
            out.add_tensor(f"{p}.{n}.weight", r.w(WIDTH, WIDTH))
            out.add_tensor(f"{p}.{n}.bias", r.zeros(WIDTH))
        out.add_tensor(f"{p}.ffn_up.weight", r.w(FF, WIDTH))
        out.add_tensor(f"{p}.ffn_up.bias", r.zeros(FF))
        out.add_tensor(f"{p}.ffn_down.weight", r.w(WIDTH, FF))
        out.add_tensor(f"{p}.ffn_down.bias", r.zeros(WIDTH))


def finish(out, tmp: Path, path: Path) -> None:
    out.write_header_to_file()
    out.write_kv_data_to_file()
    out.write_tensors_to_file()
    out.close()
    os.replace(tmp, path)


def write_projector(path: Path, n_embd_text: int) -> None:
    r = Weights(20261207)
    tmp = path.with_name(path.name + ".tmp")
    out = start(tmp, "shoal test projector", "LLaVA-style", "mlp", IMAGE, PATCH, n_embd_text)
    patches = (IMAGE // PATCH) ** 2
    out.add_tensor("v.patch_embd.weight", r.w(WIDTH, 3, PATCH, PATCH))
    out.add_tensor("v.patch_embd.bias", r.zeros(WIDTH))
    out.add_tensor("v.position_embd.weight", r.w(patches, WIDTH))
    out.add_tensor("v.pre_ln.weight", r.ones(WIDTH))
    out.add_tensor("v.pre_ln.bias", r.zeros(WIDTH))
    add_blocks(out, r)
    out.add_tensor("mm.0.weight", r.w(n_embd_text, WIDTH, scale=0.5))
    out.add_tensor("mm.0.bias", r.zeros(n_embd_text))
    out.add_tensor("mm.2.weight", r.w(n_embd_text, n_embd_text, scale=0.2))
    out.add_tensor("mm.2.bias", r.zeros(n_embd_text))
    finish(out, tmp, path)


QWEN_PATCH = 14


def write_qwen2vl_projector(path: Path, n_embd_text: int) -> None:
    r = Weights(20261208)
    tmp = path.with_name(path.name + ".tmp")
    out = start(tmp, "shoal test projector (Qwen2-VL merger)", "Qwen2-VL-style", "qwen2vl_merger", 56,
                QWEN_PATCH, n_embd_text)
    # Two patch convolutions (a video's two frames; a still image uses both
    # on the same frame), no bias, no position table: positions are M-RoPE's.
    out.add_tensor("v.patch_embd.weight", r.w(WIDTH, 3, QWEN_PATCH, QWEN_PATCH))
    out.add_tensor("v.patch_embd.weight.1", r.w(WIDTH, 3, QWEN_PATCH, QWEN_PATCH))
    add_blocks(out, r)
    # The merger: four neighbouring patches side by side, then a two-layer MLP.
    out.add_tensor("mm.0.weight", r.w(WIDTH * 4, WIDTH * 4, scale=0.2))
    out.add_tensor("mm.0.bias", r.zeros(WIDTH * 4))
    out.add_tensor("mm.2.weight", r.w(n_embd_text, WIDTH * 4, scale=0.5))
    out.add_tensor("mm.2.bias", r.zeros(n_embd_text))
    finish(out, tmp, path)


def main() -> int:
    args = [a for a in sys.argv[1:] if a != "--qwen2vl"]
    qwen2vl = len(args) != len(sys.argv) - 1
    if len(args) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    model = Path(args[0])
    out_dir = Path(args[1])
    out_dir.mkdir(parents=True, exist_ok=True)
    linked = out_dir / model.name
    if not linked.exists():
        try:
            os.link(model, linked)
        except OSError:
            shutil.copyfile(model, linked)
    write = write_qwen2vl_projector if qwen2vl else write_projector
    write(out_dir / f"mmproj-{model.stem}-f32.gguf", text_width(model))
    return 0


if __name__ == "__main__":
    sys.exit(main())
