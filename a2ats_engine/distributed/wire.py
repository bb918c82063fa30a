"""The engine's records as JSON, for the ranks' rank 0 talking to the app (`serve.py`,
`client.py`), and for the ranks' telemetry gathered to rank 0.

Writing is plain; reading is defensive: what comes back from another process (another machine)
is untrusted until parsed, so every field is type-checked and every array bounded, and a bad
record is a `WireError` naming the field, never a crash further in.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

import numpy as np

from ..cache.config import A2ATSConfig
from ..cache.geometry import ModelGeometry
from ..cache.layer_plan import LayerChoice, LayerPlan
from ..cache.telemetry import CacheSnapshot, GenerationStats, LayerStats, TokenEvent
from ..chat_turn import ContextFit
from ..records import ModelInfo, SamplingSettings

MAX_ARRAY = 1 << 24  # elements in one array of a record (a 16M-token context's positions)
_DTYPES = {"int32": np.int32, "int64": np.int64, "uint16": np.uint16, "float32": np.float32}


class WireError(ValueError):
    """A record from another process that does not parse."""


def _int(value: Any, name: str, lo: int = 0) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < lo:
        raise WireError(f"{name}: expected an integer >= {lo}, got {value!r:.60}")
    return value


def _num(value: Any, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise WireError(f"{name}: expected a number, got {value!r:.60}")
    return float(value)


def _str(value: Any, name: str) -> str:
    if not isinstance(value, str):
        raise WireError(f"{name}: expected text, got {type(value).__name__}")
    return value


def _dict(value: Any, name: str) -> dict:
    if not isinstance(value, dict):
        raise WireError(f"{name}: expected an object, got {type(value).__name__}")
    return value


def _list(value: Any, name: str, limit: int = MAX_ARRAY) -> list:
    if not isinstance(value, list) or len(value) > limit:
        raise WireError(f"{name}: expected a list of at most {limit} items")
    return value


# -- arrays ------------------------------------------------------------------------------------


def array_json(a: np.ndarray) -> list:
    """`[dtype, values]` of a 1-D array."""
    a = np.asarray(a)
    return [a.dtype.name, a.reshape(-1).tolist()]


def array_from(value: Any, name: str) -> np.ndarray:
    pair = _list(value, name, 2)
    if len(pair) != 2 or pair[0] not in _DTYPES:
        raise WireError(f"{name}: expected [dtype, values] with dtype one of {sorted(_DTYPES)}")
    values = _list(pair[1], name)
    try:
        return np.asarray(values, dtype=_DTYPES[pair[0]])
    except (TypeError, ValueError, OverflowError) as exc:
        raise WireError(f"{name}: {exc}") from None


def _arrays(value: tuple | None) -> list | None:
    return None if value is None else [array_json(a) for a in value]


def _arrays_from(value: Any, name: str) -> tuple | None:
    if value is None:
        return None
    return tuple(array_from(v, f"{name}[{i}]") for i, v in enumerate(_list(value, name, 4096)))


def _floats(value: Any, name: str) -> tuple | None:
    if value is None:
        return None
    return tuple(_num(v, name) for v in _list(value, name, 4096))


# -- telemetry ---------------------------------------------------------------------------------

_ARRAY_FIELDS = ("selected", "code_counts", "new_codes", "budget_used", "would_retrieve")
_FLOAT_FIELDS = ("recall", "missed_mass")


def layer_json(stats: LayerStats) -> dict:
    out: dict[str, Any] = {}
    for f in fields(LayerStats):
        value = getattr(stats, f.name)
        if f.name in _ARRAY_FIELDS:
            out[f.name] = _arrays(value)
        elif f.name in _FLOAT_FIELDS:
            out[f.name] = None if value is None else [float(v) for v in value]
        else:
            out[f.name] = value.item() if isinstance(value, np.generic) else value
    return out


def layer_from(value: Any, name: str = "layer") -> LayerStats:
    d = _dict(value, name)
    kw: dict[str, Any] = {}
    for f in fields(LayerStats):
        if f.name not in d:
            continue
        v, where = d[f.name], f"{name}.{f.name}"
        if f.name in _ARRAY_FIELDS:
            kw[f.name] = _arrays_from(v, where)
        elif f.name in _FLOAT_FIELDS:
            kw[f.name] = _floats(v, where)
        elif f.name in ("exact", "reused"):
            kw[f.name] = bool(v)
        elif f.name == "recall_ms":
            kw[f.name] = None if v is None else _num(v, where)
        else:
            kw[f.name] = _int(v, where, lo=-1)
    for needed in ("selected", "code_counts"):
        kw.setdefault(needed, ())
    try:
        return LayerStats(**kw)
    except TypeError as exc:
        raise WireError(f"{name}: {exc}") from None


def snapshot_json(snap: CacheSnapshot) -> dict:
    return {
        "step": snap.step,
        "layers": [layer_json(layer) for layer in snap.layers],
        "token_id": snap.token_id,
        "native_bytes": snap.native_bytes,
        "codebook_bytes": snap.codebook_bytes,
        "process_bytes": snap.process_bytes,
    }


def snapshot_from(value: Any) -> CacheSnapshot:
    d = _dict(value, "snapshot")
    layers = _list(d.get("layers"), "snapshot.layers", 4096)
    token = d.get("token_id")
    process = d.get("process_bytes")
    return CacheSnapshot(
        step=_int(d.get("step"), "snapshot.step"),
        layers=tuple(layer_from(v, f"snapshot.layers[{i}]") for i, v in enumerate(layers)),
        token_id=None if token is None else _int(token, "snapshot.token_id"),
        native_bytes=_int(d.get("native_bytes", 0), "snapshot.native_bytes"),
        codebook_bytes=_int(d.get("codebook_bytes", 0), "snapshot.codebook_bytes"),
        process_bytes=None if process is None else _int(process, "snapshot.process_bytes"),
    )


def join_snapshots(parts: list[dict | None]) -> dict | None:
    """One snapshot of every rank's layers from each rank's `snapshot_json` (None: a rank with
    no A2ATS layer at this step). Bytes add up over the ranks; `process_bytes` is the sum of
    the ranks' processes (None when any rank has no figure)."""
    present = [p for p in parts if p is not None]
    if not present:
        return None
    layers = sorted((layer for p in present for layer in p["layers"]), key=lambda x: x["layer"])
    processes = [p.get("process_bytes") for p in present]
    return {
        "step": present[0]["step"],
        "layers": layers,
        "token_id": present[0]["token_id"],
        "native_bytes": sum(int(p["native_bytes"]) for p in present),
        "codebook_bytes": sum(int(p["codebook_bytes"]) for p in present),
        "process_bytes": None if None in processes else sum(processes),
    }


# -- replies, fits, settings ---------------------------------------------------------------------


def stats_json(stats: GenerationStats) -> dict:
    return {f.name: getattr(stats, f.name) for f in fields(GenerationStats)}


def stats_from(value: Any) -> GenerationStats:
    d = _dict(value, "stats")
    extra = _dict(d.get("extra", {}), "stats.extra")
    return GenerationStats(
        prompt_tokens=_int(d.get("prompt_tokens"), "stats.prompt_tokens"),
        generation_tokens=_int(d.get("generation_tokens"), "stats.generation_tokens"),
        time_to_first_token=_num(d.get("time_to_first_token"), "stats.time_to_first_token"),
        prompt_tps=_num(d.get("prompt_tps"), "stats.prompt_tps"),
        generation_tps=_num(d.get("generation_tps"), "stats.generation_tps"),
        peak_memory_gb=_num(d.get("peak_memory_gb"), "stats.peak_memory_gb"),
        stop_reason=_str(d.get("stop_reason"), "stats.stop_reason"),
        cache_bytes=_int(d.get("cache_bytes", 0), "stats.cache_bytes"),
        cache_disk_bytes=_int(d.get("cache_disk_bytes", 0), "stats.cache_disk_bytes"),
        codebook_bytes=_int(d.get("codebook_bytes", 0), "stats.codebook_bytes"),
        context_tokens=_int(d.get("context_tokens", 0), "stats.context_tokens"),
        extra=extra,
    )


def fit_json(fit: ContextFit) -> dict:
    return {f.name: getattr(fit, f.name) for f in fields(ContextFit)}


def fit_from(value: Any) -> ContextFit:
    d = _dict(value, "fit")
    prompt, limit = d.get("prompt_tokens"), d.get("context_length")
    return ContextFit(
        prompt_tokens=None if prompt is None else _int(prompt, "fit.prompt_tokens"),
        max_tokens=_int(d.get("max_tokens"), "fit.max_tokens"),
        requested=_int(d.get("requested"), "fit.requested"),
        context_length=None if limit is None else _int(limit, "fit.context_length"),
        dropped=_int(d.get("dropped", 0), "fit.dropped"),
        overflow=bool(d.get("overflow", False)),
    )


def config_from(value: Any) -> A2ATSConfig | None:
    """An A2ATSConfig from `A2ATSConfig.to_dict()` (None stays None); its own checks apply."""
    if value is None:
        return None
    try:
        return A2ATSConfig.from_dict(_dict(value, "a2ats"))
    except (TypeError, ValueError) as exc:
        raise WireError(f"a2ats: {exc}") from None


def sampling_from(value: Any) -> SamplingSettings:
    try:
        return SamplingSettings.from_dict(_dict(value, "sampling"))
    except (TypeError, ValueError) as exc:
        raise WireError(f"sampling: {exc}") from None


def info_from(value: Any) -> ModelInfo:
    """ModelInfo from `ModelInfo.to_dict()`."""
    d = _dict(value, "info")
    context = d.get("context_length")
    rope = _dict(d.get("rope") or {}, "info.rope")
    geometry = ModelGeometry(
        model_type=_str(d.get("architecture"), "info.architecture"),
        num_layers=_int(d.get("num_layers"), "info.num_layers"),
        num_heads=_int(d.get("num_heads"), "info.num_heads"),
        num_kv_heads=_int(d.get("num_kv_heads"), "info.num_kv_heads"),
        head_dim=_int(d.get("head_dim"), "info.head_dim"),
        rope=rope,
        max_context=None if context is None else _int(context, "info.context_length"),
    )
    plan = None
    if d.get("layer_plan") is not None:
        p = _dict(d["layer_plan"], "info.layer_plan")
        rows = _list(p.get("layers"), "info.layer_plan.layers", 4096)
        try:
            choices = tuple(LayerChoice(**_dict(r, "info.layer_plan.layers[]")) for r in rows)
        except TypeError as exc:
            raise WireError(f"info.layer_plan: {exc}") from None
        refused = p.get("refused")
        plan = LayerPlan(
            _str(p.get("model_type"), "info.layer_plan.model_type"),
            choices,
            None if refused is None else _str(refused, "info.layer_plan.refused"),
            _int(p.get("shared_layers", 0), "info.layer_plan.shared_layers"),
        )
    recommended = d.get("recommended_sampling")
    quantization = d.get("quantization")
    return ModelInfo(
        name=_str(d.get("name"), "info.name"),
        geometry=geometry,
        quantization=None if quantization is None else _str(quantization, "info.quantization"),
        disk_bytes=_int(d.get("disk_bytes", 0), "info.disk_bytes"),
        path=_str(d.get("path", ""), "info.path"),
        recommended_sampling=None if recommended is None else sampling_from(recommended),
        layer_plan=plan,
    )


def token_from(value: Any) -> TokenEvent:
    """TokenEvent from rank 0's `token` line."""
    d = _dict(value, "token")
    return TokenEvent(
        _str(d.get("text", ""), "token.text")[:MAX_TEXT],
        _int(d.get("token_id"), "token.token_id"),
        _int(d.get("index"), "token.index"),
    )


MAX_TEXT = 1 << 20  # characters of one token's text or one turn (a turn is one chat message)


@dataclass(frozen=True)
class RanksContext:
    """A context as rank 0 sends it: token ids in position order, each token's text (as
    `token_texts.token_texts` finds it) and the conversation's (role, content) turns."""

    ids: tuple[int, ...]
    texts: tuple[str, ...]
    turns: tuple[tuple[str, str], ...]


def context_from(value: Any, name: str = "context") -> RanksContext:
    """RanksContext from rank 0's answer fields (`ids`, `texts`, `turns`); texts must match
    the ids one to one."""
    d = _dict(value, name)
    ids = tuple(_int(i, f"{name}.ids[]") for i in _list(d.get("ids"), f"{name}.ids"))
    texts = tuple(_str(t, f"{name}.texts[]") for t in _list(d.get("texts"), f"{name}.texts"))
    if len(texts) != len(ids) or any(len(t) > MAX_TEXT for t in texts):
        raise WireError(f"{name}.texts: expected one text of at most {MAX_TEXT} characters an id")
    turns = []
    for turn in _list(d.get("turns"), f"{name}.turns", 1 << 16):
        pair = _list(turn, f"{name}.turns[]", 2)
        if len(pair) != 2:
            raise WireError(f"{name}.turns[]: expected [role, content]")
        role, content = (_str(x, f"{name}.turns[]") for x in pair)
        turns.append((role[:64], content[:MAX_TEXT]))
    return RanksContext(ids, texts, tuple(turns))


@dataclass(frozen=True)
class RanksCodebook:
    """What the ranks loaded of a codebook file (each rank holds its layers' rows; `nbytes`
    sums them)."""

    path: str
    n_centroids: int
    sub_dim: int
    num_layers: int
    nbytes: int
    metadata: dict
    warnings: tuple[str, ...]
    sha256: str


def codebook_from(value: Any, path: str) -> RanksCodebook:
    """RanksCodebook from rank 0's answer to `codebook`."""
    d = _dict(value, "codebook")
    metadata = d.get("metadata")
    notes = d.get("warnings")
    return RanksCodebook(
        path=str(path),
        n_centroids=_int(d.get("n_centroids"), "codebook.n_centroids", 1),
        sub_dim=_int(d.get("sub_dim"), "codebook.sub_dim", 1),
        num_layers=_int(d.get("num_layers"), "codebook.num_layers", 1),
        nbytes=_int(d.get("nbytes"), "codebook.nbytes"),
        metadata=metadata if isinstance(metadata, dict) else {},
        warnings=tuple(str(n)[:2000] for n in notes[:64]) if isinstance(notes, list) else (),
        sha256=_str(d.get("sha256") or "", "codebook.sha256")[:128],
    )


__all__ = [
    "WireError",
    "token_from",
    "RanksContext",
    "context_from",
    "RanksCodebook",
    "codebook_from",
    "array_json",
    "array_from",
    "layer_json",
    "layer_from",
    "snapshot_json",
    "snapshot_from",
    "join_snapshots",
    "stats_json",
    "stats_from",
    "fit_json",
    "fit_from",
    "config_from",
    "sampling_from",
    "info_from",
]
