"""Save and restore a conversation's caches (A2ATS or mlx-lm KVCache) in one safetensors file.

mlx-lm's `load_prompt_cache` can only rebuild classes from its own module, and an A2ATSCache
also needs its RoPE spec and codebook, so sessions get their own format: per-layer state arrays,
the codebook's arrays (once), and JSON metadata (config, RoPE specs, offsets, user metadata).
Layers the layer plan leaves to the model's own cache (RotatingKVCache for sliding windows,
ArraysCache for linear attention / conv state) are saved as their mlx-lm state: arrays plus the
scalar leaves in the JSON, rebuilt by class name from an allow-list.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import mlx.core as mx
from mlx.utils import tree_flatten, tree_unflatten
from mlx_lm.models import cache as mlx_cache
from mlx_lm.models.cache import KVCache

from ..errors import A2ATSError
from .a2ats_cache import A2ATSCache
from .config import A2ATSConfig
from .rope import RopeSpec

FORMAT = "a2ats-session"
VERSION = 1
NATIVE_CLASSES = ("RotatingKVCache", "ArraysCache")  # model-owned caches a session may hold


def _native_state(cache) -> tuple[list[mx.array], list[dict[str, Any]]]:
    """A native cache's state leaves: its arrays, and per leaf {key, array index | value}."""
    arrays, leaves = [], []
    for key, leaf in tree_flatten(cache.state):
        if isinstance(leaf, mx.array):
            leaves.append({"key": key, "array": len(arrays)})
            arrays.append(leaf)
        elif leaf is None or isinstance(leaf, bool | int | float | str):
            leaves.append({"key": key, "value": leaf})
        else:
            raise ValueError(f"save_session: {type(cache).__name__} state holds a {type(leaf)}")
    return arrays, leaves


def _native_cache(entry: dict[str, Any], state: list[mx.array]):
    name = entry.get("class")
    if name not in NATIVE_CLASSES:
        raise A2ATSError(f"session file names an unknown cache class {name!r}")
    leaves = [
        (leaf["key"], state[leaf["array"]] if "array" in leaf else leaf.get("value"))
        for leaf in entry["leaves"]
    ]
    return getattr(mlx_cache, name).from_state(tree_unflatten(leaves))


def save_session(path: str | os.PathLike, caches: list, metadata: dict | None = None) -> None:
    """Write `caches` (a model's cache list) and `metadata` (any JSON-able dict) to `path`."""
    path = Path(path)
    arrays: dict[str, mx.array] = {}
    layers: list[dict[str, Any]] = []
    codebook = None
    for i, cache in enumerate(caches):
        native = type(cache).__name__ in NATIVE_CLASSES
        if native:
            state, leaves = _native_state(cache)
        elif cache.empty():
            state = []
        elif isinstance(cache, KVCache):
            state = [a[..., : cache.offset, :] for a in (cache.keys, cache.values)]
        else:
            state = list(cache.state)
        for j, arr in enumerate(state):
            arrays[f"layers.{i}.{j}"] = arr
        entry: dict[str, Any] = {"n_arrays": len(state), "offset": int(getattr(cache, "offset", 0))}
        if native:
            entry.update(kind="native", leaves=leaves, **{"class": type(cache).__name__})
        elif isinstance(cache, A2ATSCache):
            codebook = codebook or cache.codebook
            if cache.codebook is not codebook:
                raise ValueError("save_session: all A2ATS layers must share one codebook")
            entry.update(
                kind="a2ats",
                layer=cache.layer,
                config=cache.config.to_dict(),
                rope=cache.rope.to_dict(),
                max_context=cache.max_context,
                tokens_seen=cache.tokens_seen,
            )
        elif isinstance(cache, KVCache):
            entry["kind"] = "kv"
        else:
            raise ValueError(f"save_session: cannot save a {type(cache).__name__}")
        layers.append(entry)
    meta: dict[str, Any] = {"format": FORMAT, "version": VERSION, "layers": layers}
    meta["metadata"] = metadata or {}
    if codebook is not None:
        for i in range(codebook.num_layers):
            arrays[f"codebook.{i}.centroids"] = codebook.centroids[i]
            arrays[f"codebook.{i}.assign_centroids"] = codebook.assign_centroids[i]
            arrays[f"codebook.{i}.chol"] = codebook.chol[i]
        meta["codebook"] = {"num_layers": codebook.num_layers, "metadata": codebook.metadata}
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp.safetensors")
    mx.save_safetensors(str(tmp), arrays, metadata={FORMAT: json.dumps(meta)})
    os.replace(tmp, path)


def load_session(path: str | os.PathLike, model=None) -> tuple[list, dict]:
    """Rebuild the caches saved by `save_session`. Returns (caches, metadata).

    With `model`, the attention hook is installed on it (needed for A2ATS caches to retrieve).
    """
    from .codebook import Codebook

    path = Path(path)
    if not path.is_file():
        raise A2ATSError(f"session file not found: {path}")
    try:
        arrays, file_meta = mx.load(str(path), format="safetensors", return_metadata=True)
        meta = json.loads(file_meta[FORMAT])
    except Exception as exc:
        raise A2ATSError(f"{path.name}: not an A2ATS session file ({exc})") from exc
    codebook = None
    if "codebook" in meta:
        n = meta["codebook"]["num_layers"]
        parts = [
            [arrays[f"codebook.{i}.{name}"] for i in range(n)]
            for name in ("centroids", "chol", "assign_centroids")
        ]
        codebook = Codebook(
            parts[0], parts[1], meta["codebook"]["metadata"], assign_centroids=parts[2]
        )
    caches = []
    for i, entry in enumerate(meta["layers"]):
        state = [arrays[f"layers.{i}.{j}"] for j in range(entry["n_arrays"])]
        if entry["kind"] == "a2ats":
            cache = A2ATSCache(
                entry["layer"],
                RopeSpec.from_dict(entry["rope"]),
                codebook,
                A2ATSConfig.from_dict(entry["config"]),
                entry["max_context"],
            )
            cache.tokens_seen = entry["tokens_seen"]
        elif entry["kind"] == "native":
            caches.append(_native_cache(entry, state))
            continue
        else:
            cache = KVCache()
        if state:
            cache.state = state if entry["kind"] == "a2ats" else (*state, entry["offset"])
        caches.append(cache)
    if model is not None and codebook is not None:
        from . import hooks

        hooks.install(model)
    return caches, meta["metadata"]
