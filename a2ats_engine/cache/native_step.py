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
call fall back too. With the missed-attention estimate it selects and the NumPy step attends
(`attends`: its per-slot sums are NumPy's `SlotRows`).

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
from typing import TYPE_CHECKING

import mlx.core as mx
import numpy as np

from .attention import rerank_candidates

if TYPE_CHECKING:
    from .a2ats_cache import A2ATSCache
    from .attention import Layout

ENV = "A2ATS_HOST_STEP"
STRATEGIES = ("native", "numpy")


def _load() -> tuple[ctypes._CFuncPtr | None, str]:
    """(the C function, "") or (None, why it is not there)."""
    try:
        from . import _native_step
    except ImportError as exc:
        return None, f"not built ({exc.msg.split(' from ')[0]}: `pip install -e .` builds it)"
    try:
        fn = ctypes.CDLL(_native_step.__file__).a2ats_native_step
    except (OSError, AttributeError) as exc:
        return None, f"{_native_step.__file__} cannot be loaded: {exc}"
    P, I = ctypes.c_void_p, ctypes.c_int  # noqa: E741, N806
    fn.argtypes = [I] * 7 + [P] * 2 + [I] + [P] * 6 + [I] * 6 + [ctypes.c_float] + [P] * 3
    fn.restype = ctypes.c_long
    return fn, ""


_fn, _why = _load()
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
    """Whether the C++ step also attends (else the NumPy step's attention with the estimate
    takes its selection)."""
    return not cache.estimates


def _ptr(a: np.ndarray | None) -> int | None:
    return None if a is None else a.__array_interface__["data"][0]


def run(cache: A2ATSCache, lay: Layout, q, to_far, m: int, bucket, codes, keys, values, scale,
        sink_logits, attend: bool = True):  # fmt: skip
    """The step: q [B, n_kv, G, d] float32, to_far [d, >= m * d] (`attention.step_rotations`),
    m the buckets used, bucket int32 [F] or None, codes [B, n_kv, cap, S] uint16, keys / values
    [B, n_kv, cap, d] float32 (the NumPy views the step read), sink_logits None or [n_kv * G]
    -> (out [B, n_kv, G, d] float32 (None without `attend`), positions int32 and repeat bool
    [B, n_kv, M], far tokens retrieved), or None where a score was NaN (the caller takes the
    NumPy step; so too where an array is not C-contiguous)."""
    B, n_kv, G, d = q.shape
    cap, S = codes.shape[2], codes.shape[3]
    cent = np.asarray(cache.codebook.scoring_centroids(cache.layer, q))  # [n_kv, S, C, sd]
    C = cent.shape[2]
    cand = rerank_candidates(cache, lay)
    F = lay.window_start - lay.n_sinks
    arrays = (q, to_far, cent, keys, values)
    if not all(a.dtype == np.float32 for a in arrays) or d % S:
        raise ValueError("native step: float32 arrays, subspaces dividing the head dim")
    if codes.dtype != np.uint16:
        raise ValueError(f"native step: codes {codes.dtype}")
    if not all(a.flags.c_contiguous for a in (*arrays, codes)):
        return None  # rows read in place with other strides (a trimmed cache): NumPy's gather
    if keys.shape != (B, n_kv, cap, d) or values.shape != keys.shape or cent.shape != (
        n_kv, S, C, d // S
    ):  # fmt: skip
        raise ValueError(f"native step: shapes {keys.shape}, {values.shape}, {cent.shape}")
    if to_far.shape[0] != d or to_far.shape[1] < m * d or lay.n > cap or lay.k > F:
        raise ValueError(f"native step: rotations {to_far.shape}, context {lay.n} of {cap}")
    if bucket is not None and (bucket.shape != (F,) or bucket.dtype != np.int32 or bucket[0] >= m):
        raise ValueError("native step: distance buckets do not fit the tables")
    if sink_logits is not None:
        sink_logits = np.ascontiguousarray(sink_logits, dtype=np.float32).reshape(n_kv * G)
    M = lay.n_sinks + G * lay.k + (lay.n - lay.window_start)
    out = np.empty((B, n_kv, G, d), np.float32) if attend else None
    positions = np.empty((B, n_kv, M), np.int32)
    repeat = np.empty((B, n_kv, M), np.bool_)
    got = _fn(
        B, n_kv, G, d, m, S, C, _ptr(q), _ptr(to_far), to_far.shape[1], _ptr(cent), _ptr(codes),
        _ptr(bucket), _ptr(keys), _ptr(values), _ptr(sink_logits), cap, lay.n, lay.n_sinks,
        lay.window_start, lay.k, cand, float(scale), _ptr(out), _ptr(positions), _ptr(repeat),
    )  # fmt: skip
    return None if got < 0 else (out, positions, repeat, int(got))
