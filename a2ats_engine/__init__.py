"""A2ATS engine: a retrieval KV cache for mlx-lm (windowed RoPE + query-aware VQ + top-K).

Pure engine: MLX, mlx-lm and numpy only. Never imports Qt or the `app` package.
Names are imported lazily so `import a2ats_engine` stays cheap and the BLAS preload in
`_backend` runs before anything imports `mlx.core`.
"""

from __future__ import annotations

import importlib
from typing import Any

from . import _backend  # noqa: F401  (must run before mlx.core is imported)

__version__ = "0.1.0"

_EXPORTS = {
    "A2ATSConfig": "cache.config",
    "LayerStats": "cache.telemetry",
    "CacheSnapshot": "cache.telemetry",
    "GenerationStats": "cache.telemetry",
    "TokenEvent": "cache.telemetry",
    "SamplingSettings": "records",
    "RopeSpec": "cache.rope",
    "Codebook": "cache.codebook",
    "A2ATSCache": "cache.a2ats_cache",
    "make_cache": "cache.model_cache",
    "snapshot": "cache.model_cache",
    "sweep_stale": "cache.cold",
    "save_session": "cache.persist",
    "load_session": "cache.persist",
    "install_hooks": "cache.hooks",
    "uninstall_hooks": "cache.hooks",
    "KVCacheConfig": "cache.compat",
    "KVCacheBuilder": "cache.compat",
    "load_model": "loading.models",
    "ModelInfo": "records",
    "ModelGeometry": "records",
    "ModelLoadError": "errors",
    "CodebookError": "errors",
    "A2ATSError": "errors",
    "ChatSession": "session",
    "ContextFit": "chat_turn",
    "OverflowPolicy": "chat_turn",
    "ReplyMode": "chat_turn",
    "calibrate": "calibration.calibrate",
    "CodebookSpec": "cache.codebook_spec",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'a2ats_engine' has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value
