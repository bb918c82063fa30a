"""The host decode step in C++ (`native_step.cpp`): one call a layer after the step's sync.

The NumPy step (`host_step._on_host`) makes some forty NumPy calls a layer; right after MLX's
threads ran the layer each runs several times slower than warm (docs/BENCHMARKS.md, "The step
after MLX's layer work"), so the calls, not the arithmetic, were most of a retrieval step's
fixed cost. The compiled step does the same work in one call: the lookup tables, far scores,
top-K (+ rerank), the GQA union and the softmax attention (with the model's attention sinks).

It selects the same scores as the NumPy step: among scores tied at the cut, the lowest far
index (NumPy's argpartition picks an arbitrary one), and its float32 sums may differ in the last
bit. What it does not compute takes the NumPy step (`selects`): the adaptive budget (`coverage`),
shared rerank candidates, the estimate's centroid slot scores (which read the lookup tables),
float16 rows, and a layer whose far region is smaller than its K; a NaN score makes that one
call fall back too. With the missed-attention estimate it selects, the NumPy step moves the
per-slot sums (`SlotRows`), and a second call (`attend_estimate`) attends over the selection and
the sums (with the same expression as `host_step.attention_with_estimate`). A third entry,
`recall`, gives the exact attention mass on a selection (the inspector's shadow selection,
`host_step.shadow`).

The step is the extension's Python entry (`_native_step.step`): it takes the MLX arrays
themselves (their buffers, read in place) and checks every shape in C++, so a layer's call costs
no NumPy views, no ctypes conversion and no checks in Python, which after MLX's layer work ran
several times slower than warm too. The estimate's attention and the recall go through ctypes.

Built by `pip install -e .` (`setup.py`, an optional extension): where there is no compiler the
engine runs the NumPy step and `a2ats info` says why (`status`). `A2ATS_HOST_STEP=numpy` (read
once) or `forced("numpy")` (the benchmarks' A/B runs) turns it off; a cache whose attribute
`numpy_step` is True (the bench decode method suffix `_npstep`) keeps the NumPy step.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import warnings
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import mlx.core as mx
import numpy as np

from .attention import rerank_candidates

if TYPE_CHECKING:
    from .a2ats_cache import A2ATSCache
    from .attention import Layout

ENV = "A2ATS_HOST_STEP"
STRATEGIES = ("native", "numpy")


def _load() -> tuple[Any, Any, Any, str]:
    """(the step, the attention with the estimate, the recall, "") or (None, None, None, why
    they are not there)."""
    try:
        from . import _native_step
    except ImportError as exc:
        why = f"not built ({exc.msg.split(' from ')[0]}: `pip install -e .` builds it)"
        return None, None, None, why
    try:
        fn = _native_step.step  # the step: a Python entry, no ctypes conversion a call
        lib = ctypes.CDLL(_native_step.__file__)
        est, rec = lib.a2ats_native_attend_estimate, lib.a2ats_native_recall
    except (OSError, AttributeError) as exc:
        return None, None, None, f"{_native_step.__file__} cannot be loaded: {exc}"
    P, I, L = ctypes.c_void_p, ctypes.c_int, ctypes.c_long  # noqa: E741, N806
    est.argtypes = [I] * 9 + [P] * 5 + [P, L, L, I, P, L, L, P, P, L, L, P, ctypes.c_float, P, P]
    est.restype = I
    rec.argtypes = [I] * 7 + [P] * 4 + [ctypes.c_float, P]
    rec.restype = I
    return fn, est, rec, ""


_fn, _estimate_fn, _recall_fn, _why = _load()
_env = os.environ.get(ENV, "").strip().lower()
if _env and _env not in STRATEGIES:  # said, not dropped
    warnings.warn(f"{ENV}={_env!r} is not one of {', '.join(STRATEGIES)}: ignored", stacklevel=1)
_forced: str | None = None


@contextlib.contextmanager
def forced(strategy: str) -> Iterator[None]:
    """Inside the block the host step is `strategy` ("native" or "numpy"; "native" where it
    is built)."""
    global _forced
    if strategy not in STRATEGIES:
        raise ValueError(f"host step {strategy!r}: one of {', '.join(STRATEGIES)}")
    before, _forced = _forced, strategy
    try:
        yield
    finally:
        _forced = before


def on() -> bool:
    """Whether the native step runs where it applies (built, and not turned off)."""
    choice = _forced or _env
    return _fn is not None and choice != "numpy"


def status() -> str:
    """One line for `a2ats info` and the benchmarks' records: which host step runs, and why."""
    if _fn is None:
        return f"NumPy (the C++ step is {_why})"
    if _forced == "numpy":
        return "NumPy"
    if not _forced and _env == "numpy":
        return f"NumPy (the C++ step is built; turned off by {ENV}=numpy)"
    return "C++ (native_step.cpp)"


def selects(cache: A2ATSCache, lay: Layout, rows_dtype) -> bool:
    """Whether this layer's selection runs here (see the module docstring); the attention too
    where `attends`."""
    cfg = cache.config
    return (
        on()
        and not getattr(cache, "numpy_step", False)
        and cfg.coverage is None
        and not (cfg.rerank_shared and cache.reranks)
        and not (cache.estimates and cfg.estimate_scores == "centroid")  # reads the tables
        and rows_dtype == mx.float32
        and 0 < lay.k <= lay.n_far
    )


def attends(cache: A2ATSCache) -> bool:
    """Whether the C++ step also attends in its one call (else, with the estimate, the NumPy
    step moves the slot sums and `attend_estimate` attends)."""
    return not cache.estimates


def _ptr(a: np.ndarray | None) -> int | None:
    return None if a is None else a.__array_interface__["data"][0]


_F32 = np.dtype(np.float32)


def _centroids(cache: A2ATSCache) -> np.ndarray:
    """The layer's scoring centroids as a C-contiguous NumPy array (a view, or a copy where the
    codebook's array has other strides), made once and kept on the cache (attribute
    `native_centroids`: (the codebook's array, this one)) while the codebook holds the same
    array."""
    cent = cache.codebook.scoring_centroids(cache.layer)
    held = getattr(cache, "native_centroids", None)
    if held is None or held[0] is not cent:
        held = cache.native_centroids = (cent, np.ascontiguousarray(cent))
    return held[1]


def run(cache: A2ATSCache, lay: Layout, queries, to_far, m: int, bucket, codes, keys, values,
        scale, sink_logits, attend: bool = True):  # fmt: skip
    """The step: queries float32 [B, n_q, 1, d] (or [B, n_kv, G, d]), to_far [d, >= m * d]
    (`attention.step_rotations`), m the buckets used, bucket int32 [F] or None, codes uint16
    [B, n_kv, cap, S], keys / values float32 [B, n_kv, cap, d] (MLX arrays, evaluated, or
    NumPy arrays: the C++ call reads their buffers in place and checks every shape),
    sink_logits None or float32 [n_kv * G] -> (out [B, n_kv, G, d] float32 (None without
    `attend`), positions int32 and repeat bool [B, n_kv, M], far tokens retrieved), or None
    where a score was NaN (the caller takes the NumPy step; so too where the queries, rotations,
    codes or rows are not C-contiguous). The arrays returned are new: the caller keeps them."""
    B, heads, per_head, d = queries.shape
    n_kv = codes.shape[1]
    G = heads * per_head // n_kv
    M = lay.n_sinks + G * lay.k + (lay.n - lay.window_start)
    out = np.empty((B, n_kv, G, d), np.float32) if attend else None
    positions = np.empty((B, n_kv, M), np.int32)
    repeat = np.empty((B, n_kv, M), np.bool_)
    got = _fn(
        queries, to_far, codes, keys, values, _centroids(cache), bucket, sink_logits, out,
        positions, repeat, m, lay.n, lay.n_sinks, lay.window_start, lay.k,
        rerank_candidates(cache, lay), scale,
    )  # fmt: skip
    return None if got < 0 else (out, positions, repeat, got)


def attend_estimate(q, keys, values, positions, repeat, lay: Layout, view: tuple, row_at, scale,
                    sink_logits):  # fmt: skip
    """`host_step.attention_with_estimate` with key sums (mean slot scores) over the rows the
    cache holds: q [B, n_kv, G, d] float32, keys / values [B, n_kv, cap, d] float32 (the
    NumPy views the step read), positions int32 / repeat bool [B, n_kv, M] (`run`'s), view
    the step's `SlotRows.view()` (counts, sums, key sums, slots), row_at int32 [B, n_kv, P] the
    row of each far position's slot (`SlotRows.row_table`) -> (output [B, n_kv, G, d],
    estimated share [B, n_kv, G]) float32, or None where an array has other strides (the
    NumPy attention takes it)."""
    counts, sums, key_sums, _ = view
    B, n_kv, G, d = q.shape
    cap, M, R = keys.shape[2], positions.shape[-1], counts.shape[-1]
    U = M - lay.n_sinks - (lay.n - lay.window_start)
    if key_sums is None or not (
        q.dtype == keys.dtype == values.dtype == counts.dtype == sums.dtype == key_sums.dtype
        == _F32
    ):  # fmt: skip
        raise ValueError("native estimate: float32 arrays and key sums")
    if (
        keys.shape != (B, n_kv, cap, d) or values.shape != keys.shape
        or positions.shape != (B, n_kv, M) or repeat.shape != positions.shape
        or positions.dtype != np.int32 or repeat.dtype != np.bool_
        or row_at.shape[:2] != (B, n_kv) or row_at.dtype != np.int32
        or counts.shape != (B, n_kv, R) or sums.shape != (B, n_kv, R, d)
        or key_sums.shape != sums.shape or key_sums.strides != sums.strides
    ):  # fmt: skip
        raise ValueError(f"native estimate: shapes {keys.shape}, {positions.shape}, {sums.shape}")
    if not (
        q.flags.c_contiguous and keys.flags.c_contiguous and values.flags.c_contiguous
        and positions.flags.c_contiguous and repeat.flags.c_contiguous
        and row_at.strides[-1] == 4 and counts.strides[-1] == 4 and sums.strides[-2:] == (4 * d, 4)
    ):  # fmt: skip
        return None
    if sink_logits is not None:
        sink_logits = np.ascontiguousarray(sink_logits, dtype=np.float32).reshape(n_kv * G)
    out = np.empty((B, n_kv, G, d), np.float32)
    share = np.empty((B, n_kv, G), np.float32)
    bad = _estimate_fn(
        B, n_kv, G, d, cap, M, lay.n_sinks, U, R, _ptr(q), _ptr(keys), _ptr(values),
        _ptr(positions), _ptr(repeat), _ptr(row_at), row_at.strides[0] // 4,
        row_at.strides[1] // 4, row_at.shape[2], _ptr(counts), counts.strides[0] // 4,
        counts.strides[1] // 4, _ptr(sums), _ptr(key_sums), sums.strides[0] // 4,
        sums.strides[1] // 4, _ptr(sink_logits), float(scale), _ptr(out), _ptr(share),
    )  # fmt: skip
    if bad:
        raise ValueError(
            "native estimate: a retrieved column's position or slot row is out of range"
        )
    return out, share


def recall(q, keys, n: int, positions, repeat, scale) -> np.ndarray:
    """The exact attention mass on a selection (`layer_stats.attention_recall`): q
    [B, n_kv, G, d] float32, keys [B, n_kv, cap, d] float32 (the NumPy view the step read, the
    first n rows held), positions int32 / repeat bool [B, n_kv, M] (`run`'s) -> float32
    [B, n_kv], each averaged over the group's query heads."""
    B, n_kv, G, d = q.shape
    cap, M = keys.shape[2], positions.shape[-1]
    if (
        not (q.dtype == keys.dtype == _F32)
        or positions.dtype != np.int32
        or repeat.dtype != np.bool_
    ):
        raise ValueError("native recall: float32 queries and rows, int32 positions")
    if keys.shape != (B, n_kv, cap, d) or positions.shape != (B, n_kv, M) or (
        repeat.shape != positions.shape or not 0 < n <= cap
    ):  # fmt: skip
        raise ValueError(f"native recall: shapes {q.shape}, {keys.shape}, {positions.shape}")
    if not (
        q.flags.c_contiguous and keys.flags.c_contiguous and positions.flags.c_contiguous
        and repeat.flags.c_contiguous
    ):  # fmt: skip
        raise ValueError("native recall: C-contiguous arrays")
    mass = np.empty((B, n_kv), np.float32)
    bad = _recall_fn(
        B, n_kv, G, d, cap, n, M, _ptr(q), _ptr(keys), _ptr(positions), _ptr(repeat),
        float(scale), _ptr(mass),
    )  # fmt: skip
    if bad:
        raise ValueError(f"native recall: a selected position is outside the {n} rows held")
    return mass
