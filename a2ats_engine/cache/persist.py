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
import math
import os
from pathlib import Path
from typing import Any

import mlx.core as mx
from mlx.utils import tree_flatten, tree_unflatten
from mlx_lm.models import cache as mlx_cache
from mlx_lm.models.cache import KVCache

from ..errors import A2ATSError
from .a2ats_cache import A2ATSCache
from .codebook_file import MAX_HEADER_BYTES, header_length
from .estimate_layers import EstimateLayers
from .rope import RopeSpec
from .step_sums import StepSums

FORMAT = "a2ats-session"
VERSION = 2
CODEBOOK_PREFIX = "codebook."
NATIVE_CLASSES = ("RotatingKVCache", "ArraysCache")  # model-owned caches a session may hold
MAX_CONTEXT = 1 << 24  # largest max_context / tokens_seen a session may record
MAX_ARRAYS_PER_LAYER = 16
_DTYPE_BYTES = {"BOOL": 1, "U8": 1, "I8": 1, "U16": 2, "I16": 2, "F16": 2, "BF16": 2, "U32": 4,
                "I32": 4, "F32": 4, "U64": 8, "I64": 8, "F64": 8}  # fmt: skip
_DAMAGE = (KeyError, TypeError, ValueError, IndexError, AttributeError, RecursionError,
           OverflowError)  # fmt: skip


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
    _check_safetensors(path)
    try:
        arrays, file_meta = mx.load(str(path), format="safetensors", return_metadata=True)
        meta = json.loads(file_meta[FORMAT])
    except Exception as exc:
        detail = " ".join(str(exc).split())[:200] or type(exc).__name__
        raise A2ATSError(f"{path.name}: not an A2ATS session file ({detail})") from exc
    if not isinstance(meta, dict):
        raise A2ATSError(f"{path.name}: not an A2ATS session file (metadata is not an object)")
    try:
        return _load(path.name, meta, arrays, model, codebook)
    except A2ATSError as exc:
        if str(exc).startswith(path.name):
            raise
        raise A2ATSError(f"{path.name}: {exc}") from exc
    except _DAMAGE as exc:
        detail = " ".join(str(exc).split())[:200] or type(exc).__name__
        raise A2ATSError(f"{path.name}: session file is damaged ({detail})") from exc


def _load(name: str, meta: dict, arrays: dict, model, codebook) -> tuple[list, dict]:
    """`load_session` once the file is read: checks, then the caches."""
    if not isinstance(meta.get("version"), int) or meta["version"] > VERSION:
        raise A2ATSError(
            f"{name}: session format version {meta.get('version')} is newer than this app "
            f"supports ({VERSION}); update A2ATS Chat"
        )
    book = _session_codebook(name, meta, arrays)
    _check_layers(name, meta, arrays, book)
    if codebook is not None and book is not None:
        _check_codebook(name, meta, codebook)
        book = codebook  # the live codebook: caches share it, no second copy in memory
    if model is not None:
        _check_model(name, meta, book, model)
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
    StepSums.join(caches)  # as `make_cache`: the estimate's sums of all layers moved at once
    EstimateLayers.join(caches)  # the layers that keep the estimate, where not all
    return caches, meta["metadata"]


def _session_codebook(name: str, meta: dict, arrays: dict):
    """The codebook stored in the session (None when it has no A2ATS layers)."""
    from .codebook import Codebook

    if "codebook" not in meta:
        return None
    info = meta["codebook"]
    if not isinstance(info, dict) or not isinstance(info.get("metadata"), dict):
        raise A2ATSError(f"{name}: session file is damaged (codebook record is not an object)")
    if meta["version"] == 1:  # `codebook.{l}.name` -> the shared `codebook.layers.{l}.name`
        arrays = {
            CODEBOOK_PREFIX + "layers." + k[len(CODEBOOK_PREFIX) :]: v
            for k, v in arrays.items()
            if k.startswith(CODEBOOK_PREFIX)
        }
    book = Codebook.from_arrays(
        arrays, info["metadata"], info["num_layers"], CODEBOOK_PREFIX, where=name
    )
    saved = info.get("sha256")
    if isinstance(saved, str) and saved:
        book.identify_as(saved)  # the codebook file it was saved from (same arrays)
    return book


def _check_safetensors(path: Path) -> None:
    """A2ATSError unless the file's safetensors header is sound: its length fits the file, it
    is a JSON object, and every array's dtype, shape and byte range agree and lie in the file
    (MLX's reader is never handed sizes the file cannot back)."""
    name = path.name

    def refuse(why: str) -> A2ATSError:
        return A2ATSError(f"{name}: not an A2ATS session file ({why})")

    size = path.stat().st_size
    with open(path, "rb") as f:
        length = header_length(f, size, refuse)
        if length > min(size - 8, MAX_HEADER_BYTES):
            raise refuse(f"header of {length:,} bytes in a file of {size:,}")
        raw = f.read(length)
    try:
        header = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        raise refuse("header is not JSON") from None
    if not isinstance(header, dict):
        raise refuse("header is not a JSON object")
    data = size - 8 - length
    for key, info in header.items():
        if key == "__metadata__":
            continue
        try:
            dtype, shape, (begin, end) = info["dtype"], info["shape"], info["data_offsets"]
            count = math.prod(shape)
            ok = (
                dtype in _DTYPE_BYTES
                and all(isinstance(n, int) and n >= 0 for n in [*shape, begin, end])
                and begin <= end <= data
                and count * _DTYPE_BYTES[dtype] == end - begin
            )
        except (KeyError, TypeError, ValueError):
            ok = False
        if not ok:
            raise refuse(f"array {key[:60]!r} is damaged or extends past the end of the file")


def _whole(what: str, value: Any, lo: int, hi: int) -> int:
    """An integer (or integer string) in [lo, hi], else ValueError naming `what`."""
    number = int(value) if isinstance(value, str) and value.strip().lstrip("-").isdigit() else value
    if isinstance(number, bool) or not isinstance(number, int) or not lo <= number <= hi:
        raise ValueError(f"{what} {str(value)[:40]!r} is not an integer in [{lo}, {hi}]")
    return number


def _check_layers(name: str, meta: dict, arrays: dict, book) -> None:
    """A2ATSError naming the first layer entry whose record is malformed, before any cache is
    built from it: every size a layer's strings state (RoPE head dim and dims, contexts, layer
    index) is range-checked and the head dim must be the codebook's."""
    layers = meta.get("layers")
    if not isinstance(layers, list) or not layers:
        raise A2ATSError(f"{name}: session file is damaged (no layer list)")
    if not isinstance(meta.get("metadata", {}), dict):
        raise A2ATSError(f"{name}: session file is damaged (metadata is not an object)")
    for i, entry in enumerate(layers):
        try:
            _check_layer(entry, i, len(layers), arrays, book)
        except _DAMAGE as exc:
            detail = " ".join(str(exc).split())[:200] or type(exc).__name__
            raise A2ATSError(f"{name}: session file is damaged (layer {i}: {detail})") from None


def _check_layer(entry: Any, i: int, n_layers: int, arrays: dict, book) -> None:
    if not isinstance(entry, dict):
        raise ValueError("not an object")
    n = _whole("n_arrays", entry.get("n_arrays"), 0, MAX_ARRAYS_PER_LAYER)
    missing = [j for j in range(n) if f"layers.{i}.{j}" not in arrays]
    if missing:
        raise ValueError(f"array layers.{i}.{missing[0]} missing")
    kind = entry.get("kind")
    if kind == "kv":
        _whole("offset", entry.get("offset", 0), 0, MAX_CONTEXT)
    elif kind == "native":
        leaves = entry.get("leaves")
        if not isinstance(leaves, list):
            raise ValueError("native cache without leaves")
        for leaf in leaves:
            if not isinstance(leaf, dict) or not isinstance(leaf.get("key"), str):
                raise ValueError("malformed native cache leaf")
            if "array" in leaf:
                _whole("leaf array", leaf["array"], 0, n - 1)
    elif kind == "a2ats":
        if book is None:
            raise ValueError("an A2ATS layer but no codebook in the file")
        state = _meta_state(entry)
        if not isinstance(state, list | tuple) or len(state) not in (5, 6, 7):
            raise ValueError("meta_state is not 5 to 7 strings")
        if not all(isinstance(x, str) for x in state):
            raise ValueError("meta_state is not 5 to 7 strings")
        if len(state) == 7 and state[6]:
            _whole("kv_share", state[6], 0, 1 << 50)
        _whole("layer", state[0], 0, n_layers - 1)
        if not isinstance(json.loads(state[1]), dict):
            raise ValueError("config is not an object")
        rope = json.loads(state[2])
        if not isinstance(rope, dict):
            raise ValueError("RoPE spec is not an object")
        head_dim = _whole("RoPE head_dim", rope.get("head_dim"), 1, 1 << 16)
        if head_dim != book.head_dim:
            raise ValueError(f"RoPE head_dim {head_dim} is not the codebook's {book.head_dim}")
        dims = _whole("RoPE dims", rope.get("dims"), 0, head_dim)
        freqs = rope.get("freqs")
        if freqs is not None and (not isinstance(freqs, list) or len(freqs) > dims):
            raise ValueError("RoPE freqs do not match its dims")
        _whole("max_context", state[3], 0, MAX_CONTEXT)
        _whole("tokens_seen", state[4], 0, MAX_CONTEXT)
    else:
        raise ValueError(f"unknown layer kind {str(kind)[:40]!r}")


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
    from .codebook_check import check_geometry, model_fingerprint
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
            shape = (book.num_layers, book.num_kv_heads, book.head_dim)
            check_geometry(shape, model_fingerprint(model))
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
