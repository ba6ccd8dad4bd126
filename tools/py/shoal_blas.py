"""Give the Python MLX process the same BLAS as the engine.

The mlx-cpu wheel bundles netlib's reference BLAS, which is one to two orders
of magnitude slower than OpenBLAS for the float32 matmuls a dense model runs.
The engine links Debian's OpenBLAS ahead of the wheel's library, so for fair
numbers the Python tools preload the same library. `ensure_openblas()` must run
before anything imports mlx: it re-executes the interpreter once with
LD_PRELOAD set (the dynamic loader only reads LD_PRELOAD at process start).

Control:
  SHOAL_PY_OPENBLAS=0     keep the wheel's bundled BLAS (no re-exec)
  SHOAL_OPENBLAS=PATH     library to preload (default: the first of
                          OPENBLAS_CANDIDATES that exists)
"""

from __future__ import annotations

import os
import sys

OPENBLAS_CANDIDATES = (
    "/usr/lib/x86_64-linux-gnu/libopenblas.so.0",
    "/usr/lib/aarch64-linux-gnu/libopenblas.so.0",
    "/usr/lib64/libopenblas.so.0",
)
_GUARD = "SHOAL_OPENBLAS_REEXEC"


def openblas_path() -> str | None:
    env = os.environ.get("SHOAL_OPENBLAS")
    if env:
        return env if os.path.exists(env) else None
    return next((p for p in OPENBLAS_CANDIDATES if os.path.exists(p)), None)


def ensure_openblas(enabled: bool = True) -> None:
    """Re-exec with OpenBLAS preloaded, unless disabled, absent or already done."""
    if not enabled or os.environ.get("SHOAL_PY_OPENBLAS", "1") == "0":
        return
    if not sys.platform.startswith("linux") or os.environ.get(_GUARD):
        return
    lib = openblas_path()
    if lib is None:
        return
    preload = [p for p in os.environ.get("LD_PRELOAD", "").replace(":", " ").split() if p]
    if lib in preload:
        return
    env = dict(os.environ)
    env["LD_PRELOAD"] = " ".join([lib] + preload)
    env[_GUARD] = "1"
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, [sys.executable] + sys.orig_argv[1:], env)


def blas_in_use() -> str:
    """'openblas' when an OpenBLAS library is mapped into this process, else 'bundled'."""
    try:
        with open("/proc/self/maps") as f:
            maps = f.read()
    except OSError:
        return "unknown"
    return "openblas" if "libopenblas" in maps else "bundled"
