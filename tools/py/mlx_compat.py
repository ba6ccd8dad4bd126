"""Bridges between mlx-lm and the pinned mlx wheel, shared by the scripts
that run mlx-lm as the reference."""

from __future__ import annotations


def compat_gather_qmm() -> None:
    """mlx-lm's quantized experts pass `global_scale` (for nvfp4) even when it
    is None; the pinned mlx wheel's gather_qmm predates that argument. Drop
    it when unset, so affine-quantized MoE models run unchanged."""
    import mlx.core as mx

    if "global_scale" in (mx.gather_qmm.__doc__ or ""):
        return
    original = mx.gather_qmm

    def gather_qmm(*a, global_scale=None, **kw):
        if global_scale is not None:
            raise TypeError("this mlx has no global_scale for gather_qmm")
        return original(*a, **kw)

    mx.gather_qmm = gather_qmm
