"""Save and restore a conversation's caches (A2ATS or mlx-lm KVCache) in one safetensors file.

mlx-lm's `load_prompt_cache` can only rebuild classes from its own module, and an A2ATSCache
also needs its codebook, so sessions get their own format: per-layer `state` arrays, each A2ATS
layer's `meta_state` strings (rebuilt with `A2ATSCache.from_state`), the codebook's arrays once
(`codebook.` + the codebook file's own layout, `Codebook.to_arrays`), and JSON metadata.
Version 1 files (codebook arrays under `codebook.{l}.*`, per-layer fields spelled out) still load.
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
from .rope import RopeSpec

FORMAT = "a2ats-session"
VERSION = 2
CODEBOOK_PREFIX = "codebook."
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
        elif isinstance(cache, A2ATSCache):
            state = cache.export_state()  # a cold tier's rows read back into the file
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
            entry.update(kind="a2ats", meta_state=list(cache.meta_state))
        elif isinstance(cache, KVCache):
            entry["kind"] = "kv"
        else:
            raise ValueError(f"save_session: cannot save a {type(cache).__name__}")
        layers.append(entry)
    meta: dict[str, Any] = {"format": FORMAT, "version": VERSION, "layers": layers}
    meta["metadata"] = metadata or {}
    if codebook is not None:
        arrays.update(codebook.to_arrays(CODEBOOK_PREFIX))
        meta["codebook"] = {
            "num_layers": codebook.num_layers,
            "metadata": codebook.metadata,
            "sha256": codebook.sha256,
        }
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp.safetensors")
    mx.save_safetensors(str(tmp), arrays, metadata={FORMAT: json.dumps(meta)})
    os.replace(tmp, path)


def load_session(path: str | os.PathLike, model=None, codebook=None) -> tuple[list, dict]:
    """Rebuild the caches saved by `save_session`. Returns (caches, metadata).

    With `model`, the session must fit it (layer count, each layer's RoPE, the codebook's
    geometry and RoPE) and the attention hook is installed on it (A2ATS caches need it). With
    `codebook`, the session must have been saved with that codebook (same sha256). A mismatch
    raises A2ATSError naming it.
    """
    path = Path(path)
    if not path.is_file():
        raise A2ATSError(f"session file not found: {path}")
    try:
        arrays, file_meta = mx.load(str(path), format="safetensors", return_metadata=True)
        meta = json.loads(file_meta[FORMAT])
    except Exception as exc:
        raise A2ATSError(f"{path.name}: not an A2ATS session file ({exc})") from exc
    if not isinstance(meta.get("version"), int) or meta["version"] > VERSION:
        raise A2ATSError(
            f"{path.name}: session format version {meta.get('version')} is newer than this app "
            f"supports ({VERSION}); update A2ATS Chat"
        )
    book = _session_codebook(path.name, meta, arrays)
    if codebook is not None and book is not None:
        _check_codebook(path.name, meta, codebook)
    if model is not None:
        _check_model(path.name, meta, book, model)
    caches = []
    for i, entry in enumerate(meta["layers"]):
        state = [arrays[f"layers.{i}.{j}"] for j in range(entry["n_arrays"])]
        if entry["kind"] == "a2ats":
            cache = A2ATSCache.from_state(state, _meta_state(entry), codebook=book)
        elif entry["kind"] == "native":
            caches.append(_native_cache(entry, state))
            continue
        else:
            cache = KVCache()
            if state:
                cache.state = (*state, entry["offset"])
        caches.append(cache)
    if model is not None and book is not None:
        from . import hooks

        hooks.install(model)
    return caches, meta["metadata"]


def _session_codebook(name: str, meta: dict, arrays: dict):
    """The codebook stored in the session (None when it has no A2ATS layers)."""
    from .codebook import Codebook

    if "codebook" not in meta:
        return None
    info = meta["codebook"]
    if meta["version"] == 1:  # `codebook.{l}.name` -> the shared `codebook.layers.{l}.name`
        arrays = {
            CODEBOOK_PREFIX + "layers." + k[len(CODEBOOK_PREFIX) :]: v
            for k, v in arrays.items()
            if k.startswith(CODEBOOK_PREFIX)
        }
    return Codebook.from_arrays(
        arrays, info["metadata"], info["num_layers"], CODEBOOK_PREFIX, where=name
    )


def _meta_state(entry: dict) -> list[str]:
    """A layer's `meta_state`; version 1 files spelled its fields out."""
    if "meta_state" in entry:
        return entry["meta_state"]
    return [
        str(entry["layer"]),
        json.dumps(entry["config"]),
        json.dumps(entry["rope"]),
        str(entry["max_context"]),
        str(entry["tokens_seen"]),
    ]


def _check_codebook(name: str, meta: dict, codebook) -> None:
    saved = meta["codebook"].get("sha256")
    if saved is not None and saved != codebook.sha256:
        raise A2ATSError(
            f"{name}: session was saved with another codebook (sha256 {saved[:16]}, "
            f"the loaded one is {codebook.sha256[:16]})"
        )


def _check_model(name: str, meta: dict, book, model) -> None:
    """A2ATSError when the session does not fit `model` (layers, RoPE, codebook)."""
    from .codebook import model_fingerprint
    from .layer_plan import attention_of, decoder_layers

    decoders = decoder_layers(model)
    layers = meta["layers"]
    if len(layers) != len(decoders):
        raise A2ATSError(
            f"{name}: session was saved for a model with {len(layers)} layers, "
            f"this one has {len(decoders)}"
        )
    if book is not None:
        try:
            book._check_geometry(model_fingerprint(model))
        except A2ATSError as exc:
            raise A2ATSError(f"{name}: the session's {exc}") from None
    for entry in layers:
        if entry["kind"] != "a2ats":
            continue
        state = _meta_state(entry)
        layer, saved = int(state[0]), RopeSpec.from_dict(json.loads(state[2]))
        current = _layer_rope(attention_of(decoders[layer]), saved.head_dim or saved.dims)
        if current is None or saved.fingerprint() != current.fingerprint():
            difference = "no RoPE" if current is None else _rope_difference(saved, current)
            raise A2ATSError(
                f"{name}: session was saved for another RoPE (layer {layer}: "
                f"{difference}); start a new conversation"
            )


def _layer_rope(attn, head_dim: int) -> RopeSpec | None:
    """The RoPE of a layer's attention module now, None when it has none A2ATS can replay."""
    try:
        return RopeSpec.from_module(attn.rope, head_dim)
    except (AttributeError, ValueError):
        return None


def _rope_difference(saved: RopeSpec, current: RopeSpec) -> str:
    a, b = saved.to_dict(), current.to_dict()
    diffs = [f"{k} {a[k]} vs {b[k]}" for k in a if k != "freqs" and a[k] != b[k]]
    return ", ".join(diffs) if diffs else "frequencies differ"
