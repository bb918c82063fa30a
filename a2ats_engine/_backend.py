"""Pick the fastest MLX backend available before `mlx.core` is first imported.

MLX's Linux CPU wheel links the reference BLAS (about 5-8 GFLOP/s for an fp32 matmul here).
Loading OpenBLAS into the global symbol namespace first makes MLX resolve its BLAS calls there
(about 115-230 GFLOP/s measured on a 2-core x86_64 machine). On macOS nothing is needed: MLX uses
Metal and Accelerate.
"""

from __future__ import annotations

import ctypes
import os
import sys

_OPENBLAS_CANDIDATES = (
    "/usr/lib/x86_64-linux-gnu/libopenblas.so.0",
    "/usr/lib/aarch64-linux-gnu/libopenblas.so.0",
    "/usr/lib/x86_64-linux-gnu/openblas-pthread/libopenblas.so.0",
    "/usr/lib/aarch64-linux-gnu/openblas-pthread/libopenblas.so.0",
    "/usr/lib64/libopenblas.so.0",
    "/usr/lib/libopenblas.so.0",
)

blas_library: str | None = None
"""Path of the BLAS library preloaded for MLX, or None when MLX uses its own."""


def preload_blas() -> str | None:
    """Load an optimized BLAS globally on Linux, if one is installed. Silent when none is.

    Set `A2ATS_NO_BLAS_PRELOAD=1` to skip. Returns the library path, or None.
    """
    global blas_library
    if blas_library is not None or not sys.platform.startswith("linux"):
        return blas_library
    if os.environ.get("A2ATS_NO_BLAS_PRELOAD"):
        return None
    if "mlx.core" in sys.modules:
        # Too late: MLX already bound its BLAS symbols.
        return None
    for path in _OPENBLAS_CANDIDATES:
        if os.path.exists(path):
            try:
                ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
            except OSError:
                continue
            blas_library = path
            return path
    return None


def is_cpu_only() -> bool:
    """True when MLX has no GPU (Metal) backend, so quantized matmuls run on the CPU."""
    import mlx.core as mx

    try:
        return not mx.metal.is_available()
    except Exception:  # pragma: no cover - very old MLX builds without mx.metal
        return True


preload_blas()
