"""Retrieval attention for one decode step: lookup-table scores, top-K, exact attention on the
selection (docs/ARCHITECTURE.md, "The method"). Pure functions; `cache.py` holds the state.

Shapes: B batch, n_q query heads, n_kv KV heads, G = n_q / n_kv (GQA group), d head dim,
N tokens in the cache, S product-VQ subspaces, C centroids, m distance buckets.
No Python loop over heads or tokens, and no host sync except the NumPy top-K strategy on
CPU-only MLX (`topk.py`). Stored K/V rows come in `storage.py`'s formats.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import mlx.core as mx

from .rope import RopeSpec
from .storage import RowStorage, Stored


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
def fixed_parts(B: int, n_kv: int, n_sinks: int, window_start: int, n: int):
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


def rerank(
    queries: mx.array,
    scores: mx.array,
    lay: Layout,
    candidates: int,
    keys: Stored,
    storage: RowStorage,
    top_k,
):
    """Top-K far tokens per query head by exact score among the top `candidates` approximate ones.

    queries: post-RoPE [B, n_kv, G, d]; scores: approximate [B, n_kv, G, F]; keys: the stored
    post-RoPE keys in `storage`'s format; top_k: the cache's strategy (`topk.py`). Returns far
    indices [B, n_kv, G, k] int32 (k = lay.k) in the strategy's array type, for its `select`.
    """
    B, n_kv, G, d = queries.shape
    cand = top_k.top(scores, candidates)  # [B, n_kv, G, c]
    positions = (top_k.to_mx(cand) + lay.n_sinks).reshape(B, n_kv, G * candidates)
    rows = gather_rows(keys, positions, storage)
    keys_f = rows.reshape(B, n_kv, G, candidates, d).astype(mx.float32)
    exact = (keys_f @ queries.astype(mx.float32)[..., None])[..., 0]  # [B, n_kv, G, c]
    return top_k.pick(cand, exact, lay.k)


def gather_rows(stored: Stored, positions: mx.array, storage: RowStorage) -> mx.array:
    """Rows of [B, n_kv, capacity, d] stored rows at `positions` [B, n_kv, M] -> [B, n_kv, M, d].

    A flat `mx.take` on [B * n_kv * capacity, ...] (10-20x faster than take_along_axis with a
    broadcast index; docs/ARCHITECTURE.md, "The method"). Quantized storage is dequantized after.
    """
    B, n_kv, M = positions.shape
    flat = (positions + _row_base(B, n_kv, storage.capacity(stored))).reshape(-1)
    return storage.take(stored, flat, (B, n_kv, M))


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
