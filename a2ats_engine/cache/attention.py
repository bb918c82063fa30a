"""Retrieval attention for one decode step: lookup-table scores, top-K, exact attention on the
selection (DESIGN.md section 2). Pure functions of arrays; `cache.py` holds the state.

Shapes: B batch, n_q query heads, n_kv KV heads, G = n_q / n_kv (GQA group), d head dim,
N tokens in the cache, S product-VQ subspaces, C centroids, m distance buckets.
No Python loop over heads or tokens, and no host sync except NumPy top-K on CPU-only MLX
(`host_top_k`).
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass

import mlx.core as mx
import numpy as np

from .rope import RopeSpec

Storage = mx.array | tuple[mx.array, mx.array, mx.array]


@dataclass(frozen=True)
class Layout:
    """Where the current decode step's regions lie. Positions are absolute, ends exclusive.

    sinks:        [0, n_sinks)            always attended
    far:          [n_sinks, window_start) candidates, scored approximately
    window:       [window_start, n)       always attended (exact RoPE), current token included
    """

    n: int
    n_sinks: int
    window_start: int
    k: int

    @property
    def n_far(self) -> int:
        return self.window_start - self.n_sinks

    @property
    def exact(self) -> bool:
        """Nothing to drop: every far token would be retrieved anyway."""
        return self.n_far <= self.k


@functools.lru_cache(maxsize=8)
def _fixed_parts(B: int, n_kv: int, n_sinks: int, window_start: int, n: int):
    """Sink and window positions and their all-False repeat masks for one step's layout.

    The same for every layer of a step, so they are built once (cached) rather than per layer.
    """
    sinks = mx.broadcast_to(mx.arange(n_sinks, dtype=mx.int32), (B, n_kv, n_sinks))
    window = mx.broadcast_to(
        mx.arange(window_start, n, dtype=mx.int32), (B, n_kv, n - window_start)
    )
    no_s = mx.zeros((B, n_kv, n_sinks), dtype=mx.bool_)
    no_w = mx.zeros((B, n_kv, n - window_start), dtype=mx.bool_)
    first = mx.zeros((B, n_kv, 1), dtype=mx.bool_)
    return sinks, window, no_s, no_w, first


@functools.lru_cache(maxsize=8)
def bucket_ids(n: int, n_sinks: int, window_start: int, lower_edges: tuple[int, ...]) -> mx.array:
    """Distance bucket of every far token [n_sinks, window_start) when the current token is n - 1.

    lower_edges: lower distance edge of buckets 1..m-1. Returns int32 [F]. Cached per step.
    """
    dist = (n - 1) - mx.arange(n_sinks, window_start, dtype=mx.int32)
    edges = mx.array(lower_edges, dtype=mx.int32)
    return (dist[:, None] >= edges[None, :]).sum(axis=-1).astype(mx.int32)


@functools.lru_cache(maxsize=8)
def _row_base(B: int, n_kv: int, capacity: int) -> mx.array:
    return (mx.arange(B * n_kv, dtype=mx.int32) * capacity).reshape(B, n_kv, 1)


def layout(n: int, window: int, sinks: int, k: int) -> Layout:
    """Region boundaries for a context of n tokens (the current token is n - 1)."""
    window_start = max(n - window, 0)
    return Layout(n, min(sinks, window_start), window_start, k)


def exact_attention(
    queries: mx.array, keys: mx.array, values: mx.array, scale: float, mask, sinks=None
):
    """Plain attention over the whole cache. queries [B, n_q, L, d] -> [B, n_q, L, d].

    sinks: optional per-query-head logits [n_q] that join every softmax (gpt_oss)."""
    return mx.fast.scaled_dot_product_attention(
        queries, keys, values, scale=scale, mask=mask, sinks=sinks
    )


def retrieval_tables(
    queries: mx.array, rope: RopeSpec, position: int, rotations: mx.array, codebook, layer: int
) -> mx.array:
    """Lookup tables of the windowed-RoPE retrieval queries, one set per far distance.

    queries: post-RoPE [B, n_kv, G, d] at `position` i; rotations: [d, m * d], the distances'
    rotation matrices side by side. The retrieval query for distance D is R_D q_i: un-rotate the
    query once, then one matmul rotates it to all m distances. Returns [B, n_kv, G, m * S * C]
    (for each query head, m bucket tables of S subspaces of C centroids, in that order).
    """
    B, n_kv, G, d = queries.shape
    pre = rope.unrotate(queries.astype(mx.float32)[..., None, :], position)[..., 0, :]
    m = rotations.shape[-1] // d
    rq = (pre @ rotations).reshape(B, n_kv, G * m, d)
    tables = codebook.score_tables(layer, rq)  # [B, n_kv, G * m, S, C]
    return tables.reshape(B, n_kv, G, -1)


def far_scores(
    tables: mx.array, codes: mx.array, bucket_ids: mx.array | None, n_centroids: int
) -> mx.array:
    """Approximate scores of far tokens from lookup tables.

    tables: [B, n_kv, G, m * S * C] (see `retrieval_tables`), codes: [B, n_kv, F, S] of the far
    tokens, bucket_ids: [F] int32 bucket of each far token (None when m = 1).
    Returns [B, n_kv, G, F]: sum over subspaces of table[bucket, s, code_s].
    """
    B, n_kv, G, _ = tables.shape
    F, S = codes.shape[2], codes.shape[3]
    C = n_centroids
    if S == 1 and bucket_ids is None:  # the paper's case: one table lookup per far token
        index = mx.broadcast_to(codes.reshape(B, n_kv, 1, F), (B, n_kv, G, F))
        return mx.take_along_axis(tables, index, axis=-1)
    index = codes.astype(mx.int32)
    if S > 1:
        index = index + mx.arange(S, dtype=mx.int32) * C
    if bucket_ids is not None:
        index = index + (bucket_ids * (S * C))[:, None]
    index = mx.broadcast_to(index.reshape(B, n_kv, 1, F * S), (B, n_kv, G, F * S))
    scores = mx.take_along_axis(tables, index, axis=-1)
    if S > 1:
        scores = scores.reshape(B, n_kv, G, F, S).sum(axis=-1)
    return scores


def host_top_k() -> bool:
    """True when top-K runs in NumPy on the host: on CPU-only MLX, where MLX's argpartition is
    about 7x slower than NumPy's (measured 0.63 vs 0.09 ms for 9 x 8K scores) and the host
    sync costs little. `A2ATS_TOPK=mlx` or `numpy` overrides."""
    choice = os.environ.get("A2ATS_TOPK", "").strip().lower()
    if choice in ("mlx", "numpy"):
        return choice == "numpy"
    return _cpu_only()


@functools.lru_cache(maxsize=1)
def _cpu_only() -> bool:
    return mx.default_device() == mx.cpu or not mx.metal.is_available()


def top_far(scores: mx.array, k: int) -> mx.array:
    """Indices (into the far region) of the k highest scores: [..., F] -> [..., k] int32."""
    return mx.argpartition(-scores, kth=k - 1, axis=-1)[..., :k].astype(mx.int32)


def top_far_host(scores: np.ndarray, k: int) -> np.ndarray:
    """NumPy `top_far`: [..., F] -> [..., k] int32 (unordered)."""
    n = scores.shape[-1]
    return np.argpartition(scores, n - k, axis=-1)[..., n - k :].astype(np.int32)


def select_host(top: np.ndarray, lay: Layout) -> tuple[mx.array, mx.array, int]:
    """`select` for far indices already on the host: top [B, n_kv, G, k] (NumPy).

    Returns (positions, repeat) as in `select` plus the number of distinct far tokens retrieved
    (union over KV heads, summed over the batch, as `count_union` counts them).
    The union bookkeeping is a handful of NumPy calls instead of a dozen small MLX ops.
    """
    B, n_kv, G, k = top.shape
    union = np.sort(top.reshape(B, n_kv, G * k), axis=-1) + lay.n_sinks
    dup = union[..., 1:] == union[..., :-1]
    n_union = sum(int(np.unique(top[b]).size) for b in range(B))
    n_win = lay.n - lay.window_start
    positions = np.empty((B, n_kv, lay.n_sinks + G * k + n_win), dtype=np.int32)
    positions[..., : lay.n_sinks] = np.arange(lay.n_sinks, dtype=np.int32)
    positions[..., lay.n_sinks : lay.n_sinks + G * k] = union
    positions[..., lay.n_sinks + G * k :] = np.arange(lay.window_start, lay.n, dtype=np.int32)
    repeat = np.zeros(positions.shape, dtype=bool)
    repeat[..., lay.n_sinks + 1 : lay.n_sinks + G * k] = dup
    return mx.array(positions), mx.array(repeat), n_union


def rerank(
    queries: mx.array,
    scores: mx.array,
    lay: Layout,
    candidates: int,
    storage: Storage,
    capacity: int,
    group_size: int,
    bits,
    host: bool,
) -> mx.array | np.ndarray:
    """Top-K far tokens per query head by exact score among the top `candidates` approximate ones.

    queries: post-RoPE [B, n_kv, G, d]; scores: approximate [B, n_kv, G, F]; storage: the
    post-RoPE keys. Returns far indices [B, n_kv, G, k] int32 (k = lay.k): with `host` (see
    `host_top_k`) a NumPy array for `select_host`, else an MLX array for `select`.
    """
    B, n_kv, G, d = queries.shape
    if host:
        cand = top_far_host(np.asarray(scores), candidates)  # [B, n_kv, G, c]
        cand_mx = mx.array(cand)
    else:
        cand = cand_mx = top_far(scores, candidates)
    rows = gather_rows(storage, (cand_mx + lay.n_sinks).reshape(B, n_kv, G * candidates),
                       capacity, group_size, bits)  # fmt: skip
    keys = rows.reshape(B, n_kv, G, candidates, d).astype(mx.float32)
    exact = (keys @ queries.astype(mx.float32)[..., None])[..., 0]  # [B, n_kv, G, c]
    if host:
        return np.take_along_axis(cand, top_far_host(np.asarray(exact), lay.k), axis=-1)
    best = mx.argpartition(-exact, kth=lay.k - 1, axis=-1)[..., : lay.k]
    return mx.take_along_axis(cand, best, axis=-1)


def select(
    scores: mx.array | None, lay: Layout, top: mx.array | None = None
) -> tuple[mx.array, mx.array]:
    """Top-K far tokens per query head, unioned over the GQA group, plus sinks and window.

    scores: [B, n_kv, G, F], or `top` [B, n_kv, G, k]: far indices already chosen (`rerank`).
    Returns (positions [B, n_kv, M] int32, repeat [B, n_kv, M] bool),
    M = n_sinks + G * k + window; `repeat` marks duplicates of the union (masked in attention).
    The union part is sorted, so duplicates are adjacent.
    """
    k = lay.k
    if top is None:
        top = top_far(scores, k)
    B, n_kv, G, _ = top.shape
    union = mx.sort(top.reshape(B, n_kv, G * k), axis=-1) + lay.n_sinks
    sinks, window, no_s, no_w, first = _fixed_parts(B, n_kv, lay.n_sinks, lay.window_start, lay.n)
    repeat = mx.concatenate([no_s, first, union[..., 1:] == union[..., :-1], no_w], axis=-1)
    return mx.concatenate([sinks, union, window], axis=-1), repeat


def gather_rows(storage: Storage, positions: mx.array, capacity: int, group_size: int, bits):
    """Rows of [B, n_kv, capacity, d] storage at `positions` [B, n_kv, M] -> [B, n_kv, M, d].

    A flat `mx.take` on [B * n_kv * capacity, ...] (10-20x faster than take_along_axis with a
    broadcast index, DESIGN.md performance notes). Quantized storage is dequantized after.
    """
    B, n_kv, M = positions.shape
    flat = (positions + _row_base(B, n_kv, capacity)).reshape(-1)
    if bits is None:
        d = storage.shape[-1]
        return mx.take(storage.reshape(-1, d), flat, axis=0).reshape(B, n_kv, M, d)
    parts = [mx.take(a.reshape(-1, a.shape[-1]), flat, axis=0) for a in storage]
    rows = mx.dequantize(*parts, group_size=group_size, bits=bits)
    return rows.reshape(B, n_kv, M, -1)


def selected_attention(
    queries: mx.array,
    keys: mx.array,
    values: mx.array,
    repeat: mx.array,
    scale: float,
    sinks: mx.array | None = None,
) -> mx.array:
    """Exact softmax attention of each query head over its group's selection.

    queries [B, n_kv, G, d], keys/values [B, n_kv, M, d], repeat [B, n_kv, M] -> [B, n_kv, G, d].
    sinks: optional per-query-head logits [n_kv * G] that join the softmax with no value (gpt_oss).
    """
    q = queries.astype(mx.float32) * scale
    s = q @ keys.astype(mx.float32).swapaxes(-1, -2)
    s = mx.where(repeat[:, :, None, :], mx.array(-mx.inf, mx.float32), s)
    if sinks is None:
        p = mx.softmax(s, axis=-1)
    else:
        B, n_kv, G, _ = s.shape
        sink = mx.broadcast_to(sinks.astype(mx.float32).reshape(1, n_kv, G, 1), (B, n_kv, G, 1))
        p = mx.softmax(mx.concatenate([s, sink], axis=-1), axis=-1)[..., :-1]
    return (p @ values.astype(mx.float32)).astype(queries.dtype)


def count_union(positions: mx.array, repeat: mx.array, lay: Layout) -> mx.array:
    """Far tokens retrieved at this step, union over KV heads, summed over the batch (scalar)."""
    B = positions.shape[0]
    start = lay.n_sinks
    far = positions[..., start : positions.shape[-1] - (lay.n - lay.window_start)]
    allpos = mx.sort(far.reshape(B, -1), axis=-1)
    distinct = 1 + (allpos[:, 1:] != allpos[:, :-1]).sum(axis=-1)
    return distinct.sum()
