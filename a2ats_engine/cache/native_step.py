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

Each is an entry of the extension (`_native_step.step`, `.estimate`, `.recall`): it takes the
MLX arrays themselves (their buffers, read in place) and checks every shape in C++, so a
layer's call costs no NumPy views, no ctypes conversion and no checks in Python, which after
MLX's layer work ran several times slower than warm too.

Built by `pip install -e .` (`setup.py`, an optional extension): where there is no compiler the
engine runs the NumPy step and `a2ats info` says why (`status`). Where the same C functions are
also built as MLX primitives (`graph_step.py`) a layer they select for runs them inside MLX's
graph, without the sync (with the estimate, its slot sums held in C++). `A2ATS_HOST_STEP`
(read once) or `forced` (the benchmarks' A/B runs) picks one of `STRATEGIES`: `graph` (the
default: in the graph where it applies, synced elsewhere), `native` (the synced C++ step
everywhere), `numpy` (the NumPy step); a cache whose attribute `numpy_step` is True (the bench
decode method suffix `_npstep`) keeps the NumPy step.
"""

from __future__ import annotations

import contextlib
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
STRATEGIES = ("graph", "native", "numpy")
SYNCED = "C++ (native_step.cpp), one sync a layer"  # `status` of the synced C++ step
GRAPH = "C++ in MLX's graph (graph_step.cpp)"  # `status` of the graph step


def _load() -> tuple[Any, Any, Any, str]:
    """(the step, the attention with the estimate, the recall, "") or (None, None, None, why
    they are not there)."""
    try:
        from . import _native_step
    except ImportError as exc:
        why = f"not built ({exc.msg.split(' from ')[0]}: `pip install -e .` builds it)"
        return None, None, None, why
    try:
        return _native_step.step, _native_step.estimate, _native_step.recall, ""
    except AttributeError as exc:  # a build of an older native_step.cpp
        return None, None, None, f"{_native_step.__file__} is an older build: {exc}"


_fn, _estimate_fn, _recall_fn, _why = _load()
GRAPH_BUILD = "python -m a2ats_engine.cache.graph_build"


def _load_graph() -> tuple[Any, str]:
    """(the graph step's entry, "") or (None, why it is not there): `graph_step.cpp`, built by
    `graph_build.py` for one MLX version (a build for another is refused: MLX's C++ ABI is not
    promised stable)."""
    try:
        from . import _graph_step
    except ImportError as exc:
        return None, f"not built ({exc.msg.split(' from ')[0]}; `{GRAPH_BUILD}` builds it)"
    built = getattr(_graph_step, "mlx_version", None)
    if built != mx.__version__:
        why = f"built for MLX {built!r}, this is MLX {mx.__version__}"
        return None, f"{why} (`{GRAPH_BUILD}` rebuilds it)"
    if not hasattr(_graph_step, "estimate"):  # a build of an older graph_step.cpp
        return None, f"an older build, without the estimate (`{GRAPH_BUILD}` rebuilds it)"
    return _graph_step, ""


_graph_module, _graph_why = _load_graph()
_graph_fn = None if _graph_module is None else _graph_module.step
_env = os.environ.get(ENV, "").strip().lower()
if _env and _env not in STRATEGIES:  # said, not dropped
    warnings.warn(f"{ENV}={_env!r} is not one of {', '.join(STRATEGIES)}: ignored", stacklevel=1)
_forced: str | None = None


@contextlib.contextmanager
def forced(strategy: str) -> Iterator[None]:
    """Inside the block the host step is `strategy` (one of `STRATEGIES`; the C++ ones where
    they are built)."""
    global _forced
    if strategy not in STRATEGIES:
        raise ValueError(f"host step {strategy!r}: one of {', '.join(STRATEGIES)}")
    before, _forced = _forced, strategy
    try:
        yield
    finally:
        _forced = before


def strategy() -> str:
    """The host step chosen (`forced`, else `A2ATS_HOST_STEP`, else "graph")."""
    choice = _forced or _env
    return choice if choice in STRATEGIES else "graph"


def on() -> bool:
    """Whether the native step runs where it applies (built, and not turned off)."""
    return _fn is not None and strategy() != "numpy"


def kind() -> str:
    """Which host step runs, in one word (one of `STRATEGIES`, as `status` says it): "numpy"
    where the C++ step is not built or is turned off, "native" where the graph step is forced
    off, not loaded or not on the CPU device, else "graph". A crossover row is measured for one
    (`crossover.host_step`)."""
    if _fn is None or strategy() == "numpy":
        return "numpy"
    if strategy() == "native" or _graph_fn is None or mx.default_device() != mx.cpu:
        return "native"
    return "graph"


def status() -> str:
    """One line for `a2ats info` and the benchmarks' records: which host step runs (`kind`), and
    why."""
    step = kind()
    if step == "graph":
        return GRAPH
    if step == "numpy":
        if _fn is None:
            return f"NumPy (the C++ step is {_why})"
        return "NumPy" if _forced else f"NumPy (the C++ step is built; turned off by {ENV}=numpy)"
    if strategy() == "native":
        return SYNCED if _forced else f"{SYNCED} ({ENV}=native)"
    if _graph_fn is None:
        return f"{SYNCED} (the graph step is {_graph_why})"
    return f"{SYNCED} (the graph step runs on the CPU device; this is {mx.default_device()})"


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
    cache holds: q float32 [B, n_q, 1, d] or [B, n_kv, G, d], keys / values float32
    [B, n_kv, cap, d] (MLX arrays, evaluated, or NumPy arrays: read in place), positions int32 /
    repeat bool [B, n_kv, M] (`run`'s), view the step's `SlotRows.view()` (counts, sums, key
    sums, slots), row_at int32 [B, n_kv, P] the row of each far position's slot
    (`SlotRows.row_table`) -> (output [B, n_kv, G, d], estimated share [B, n_kv, G]) float32,
    or None where an array has other strides (the NumPy attention takes it). The C++ entry
    checks every shape (ValueError)."""
    counts, sums, key_sums, _ = view
    B, n_kv, _ = positions.shape
    G = q.shape[1] * q.shape[2] // n_kv
    out = np.empty((B, n_kv, G, keys.shape[-1]), np.float32)
    share = np.empty((B, n_kv, G), np.float32)
    got = _estimate_fn(
        q, keys, values, positions, repeat, counts, sums, key_sums, row_at, sink_logits, out,
        share, lay.n_sinks, lay.n - lay.window_start, scale,
    )  # fmt: skip
    return None if got < 0 else (out, share)


def recall(q, keys, n: int, positions, repeat, scale) -> np.ndarray:
    """The exact attention mass on a selection (`layer_stats.attention_recall`): q float32
    [B, n_q, 1, d] or [B, n_kv, G, d], keys float32 [B, n_kv, cap, d] (MLX arrays, evaluated,
    or NumPy arrays: read in place; the first n rows held), positions int32 / repeat bool
    [B, n_kv, M] (`run`'s) -> float32 [B, n_kv], each averaged over the group's query heads.
    The C++ entry checks every shape (ValueError)."""
    mass = np.empty(positions.shape[:2], np.float32)
    _recall_fn(q, keys, n, positions, repeat, scale, mass)
    return mass
