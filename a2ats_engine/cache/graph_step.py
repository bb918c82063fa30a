"""The C++ host step inside MLX's graph (`graph_step.cpp`): no host sync a layer.

The synced step (`host_step.step`, then `native_step.run`) evaluates each retrieval layer's
query, codes and rows (one `mx.eval` a layer) and runs the C++ step on the main thread; a
decode step of the demo model is then thirty evaluations instead of KVCache's one, and the main
thread's Python after each runs cold (docs/BENCHMARKS.md, "The step inside MLX's graph"). Here
the same C function is an MLX primitive: `run` adds the layer's step to the graph as one node
(lazy outputs: the attention, the selection for the telemetry, the far tokens retrieved), and
MLX runs it on its CPU stream when the token is evaluated.

It runs where the synced C++ step would select (`native_step.selects`), on MLX's CPU device,
and where the module is built for this MLX (`graph_build.py`, which `make venv` runs; it
records MLX's version, and `native_step._load_graph` refuses a build for another version, since
MLX's C++ ABI is not promised stable). Elsewhere the synced step runs, and `native_step.status`
says which and why. `A2ATS_HOST_STEP=native` (or `native_step.forced("native")`) keeps the
synced C++ step everywhere; a cache whose attribute `synced_step` is True (the bench decode
method suffix `_sync`) keeps it for that cache.

With the missed-attention estimate the node is `graph_step.cpp`'s A2ATSGraphEstimate: the same
selection, then the attention with the per-slot sums (the synced step's `attend_estimate`).
Those sums are held in C++ across steps (`SlotSums`, kept as `retrieval.graph_sums` with the
context of the last node made; `Retrieval.forget_estimate` drops them): each node first moves
them by the step's few moves (`retrieval.slot_moves`) where they describe the context one
token before, else rebuilds them from the codes and rows (the first step, after a prefill,
trim or restore, or a node never evaluated). The synced step moves its own in NumPy
(`host_step.missed_sums`); the two hold the same sums to float32 rounding.

What differs from the synced step: a NaN score (a NaN or infinite query) leaves the step
undone (NaN output and estimated share, `retrieved` -1: counted by `NumpyTopK.undone`; the
estimate's sums still move) where the synced step falls back to the NumPy step, whose output
is NaN there too.
"""

from __future__ import annotations

from functools import lru_cache
from typing import TYPE_CHECKING, Any

import mlx.core as mx
import numpy as np

from . import native_step
from .attention import rerank_candidates

if TYPE_CHECKING:
    from .a2ats_cache import A2ATSCache
    from .attention import Layout
    from .retrieval import Retrieval


def built() -> tuple[bool, str]:
    """(whether the graph step is built for this MLX, why not: `native_step._load_graph`)."""
    return native_step._graph_fn is not None, native_step._graph_why


def on() -> bool:
    """Whether the graph step runs where it applies (built, and not turned off)."""
    return built()[0] and native_step.on() and native_step.strategy() == "graph"


def applies(cache: A2ATSCache, lay: Layout) -> bool:
    """Whether this layer's retrieval step runs in the graph (see the module docstring)."""
    return (
        on()
        and not getattr(cache, "synced_step", False)
        and mx.default_device() == mx.cpu
        and native_step.selects(cache, lay, cache.rows.keys.dtype)
    )


_held_bucket: tuple[Any, Any] = (None, None)  # (the step's NumPy buckets, as an mx.array)


def _bucket(bucket: np.ndarray | None) -> mx.array | None:
    """The step's far buckets as an mx.array, made once a step (every layer shares them)."""
    global _held_bucket
    if bucket is None:
        return None
    if _held_bucket[0] is not bucket:
        _held_bucket = (bucket, mx.array(bucket))
    return _held_bucket[1]


def run(cache: A2ATSCache, lay: Layout, queries: mx.array, to_far: mx.array, m: int, bucket,
        sinks: mx.array | None, scale: float, retrieval: Retrieval) -> tuple:  # fmt: skip
    """The layer's step as a node of the graph: queries [B, n_q, 1, d] (any float dtype),
    to_far [d, >= m * d] (`attention.step_rotations`), m the buckets used, bucket int32 [F]
    or None (`host_step._buckets`), sinks [n_q] or None -> lazy (output [B, n_q, 1, d] in the
    queries' dtype, positions int32 [B, n_kv, M], repeat bool [B, n_kv, M], far tokens
    retrieved int32 [1], -1 where the step was left undone, and with the missed-attention
    estimate its share of the softmax mass float32 [B, n_kv, G], else None). The entry checks
    every shape and dtype (ValueError naming the array)."""
    rows = cache.rows
    args = (
        queries.astype(mx.float32), to_far, cache.codes, rows.keys, rows.values,
        cache.codebook.scoring_centroids(cache.layer), _bucket(bucket),
        None if sinks is None else sinks.astype(mx.float32), m, lay.n, lay.n_sinks,
        lay.window_start, lay.k, rerank_candidates(cache, lay), float(scale),
    )  # fmt: skip
    if cache.estimates:
        out, *got = native_step._graph_module.estimate(*args, *_sums(cache, lay, retrieval))
    else:
        out, *got = native_step._graph_fn(*args)
        got.append(None)
    return (out.astype(queries.dtype), *got)


def _sums(cache: A2ATSCache, lay: Layout, retrieval: Retrieval) -> tuple:
    """(the layer's estimate sums, held in C++ (`graph_step.cpp`'s SlotSums: kept as
    `retrieval.graph_sums` with the context of the last node made), the moves from the
    context before as (positions, buckets, weights)): the held sums where the last node was
    one token before, else new ones, which the node builds from the codes and rows."""
    held = retrieval.graph_sums
    moves = None if held is None else retrieval.missed_moves(cache, lay, held[1])
    if moves is None:
        edges = list(cache.estimate_edges or ())
        sums = native_step._graph_module.SlotSums(cache.n_slots, cache.codebook.n_centroids, edges)
        moves = ()
    else:
        sums = held[0]
    retrieval.graph_sums = (sums, lay.n)
    retrieval.host_missed = None  # the synced step's NumPy sums no longer follow
    retrieval.missed_sums, retrieval.missed_n = None, None  # nor the generic step's
    return (sums, *_move_lists(moves))


@lru_cache(maxsize=8)
def _move_lists(moves: tuple) -> tuple[list, list, list]:
    """A step's moves ((position, bucket, weight), ...) as three lists, made once a step."""
    if not moves:
        return [], [], []
    pos, bucket, w = zip(*moves, strict=True)
    return list(pos), list(bucket), list(w)
