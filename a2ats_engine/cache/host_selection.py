"""A decode step's far-token selection on the host, in NumPy (CPU-only MLX, `topk.NumpyTopK`).

On CPU-only MLX every op costs some tens of microseconds to dispatch whatever its size, and a
step's selection is a few dozen tiny ops per layer (un-rotating the query, the lookup tables,
the far-token scores, top-K, the rerank's gather and exact scores, the pick): measured on a
2-core AMD EPYC host, the retrieval step of one layer at 8K cost as much as exact attention over
the whole layer (docs/BENCHMARKS.md, "Decode speed"). NumPy runs the same maths at a few
microseconds an op, so with the host top-K strategy the whole selection runs here after one sync
per layer (the query, the codes and the key rows evaluated together); the gather of the selected
rows and the attention over them stay in MLX. The maths are `attention.py`'s
(`retrieval_tables`, `far_scores`, `rerank`), and tests check both paths select the same tokens.

Shapes as in attention.py: B batch, n_kv KV heads, G query heads per KV head, d head dim,
F far tokens, S product-VQ subspaces, C centroids, m distance buckets.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING

import mlx.core as mx
import numpy as np

from .attention import Layout
from .storage import KEYS, ResidentRows

if TYPE_CHECKING:
    from .a2ats_cache import A2ATSCache
    from .rope import RopeSpec

_HOST_DTYPES = (mx.float32, mx.float16)  # dtypes NumPy can view without a copy


@functools.lru_cache(maxsize=16)
def _query_matrix(rope: RopeSpec, distances: tuple[int, ...], position: int) -> np.ndarray:
    """W [d, m * d] float32: `q @ W` = each far distance's retrieval query of a post-RoPE query
    at `position` (un-rotated with the model's own RoPE, then `rotations`, as
    `attention.retrieval_tables` does it). Un-rotation is linear, so it is the un-rotation of
    the identity; built with MLX ops once per step and RoPE, shared by every layer."""
    d = rope.head_dim or rope.dims
    eye = mx.eye(d, dtype=mx.float32)[:, None, :]  # d rows, each one token at `position`
    unrotate = rope.unrotate(eye, position)[:, 0, :]  # [d, d]
    rotations = mx.concatenate([rope.rotation_matrix(dist) for dist in distances], axis=-1)
    return np.array(unrotate @ rotations, dtype=np.float32)


@functools.lru_cache(maxsize=8)
def _bucket_ids(n: int, n_sinks: int, window_start: int, lower_edges: tuple[int, ...]):
    """NumPy `attention.bucket_ids`: distance bucket of every far token, int64 [F]."""
    dist = (n - 1) - np.arange(n_sinks, window_start)
    return np.searchsorted(np.asarray(lower_edges), dist, side="right")


def _f32(a: mx.array) -> np.ndarray:
    """An evaluated MLX array as float32 NumPy: a view when NumPy can read its dtype."""
    if a.dtype in _HOST_DTYPES:
        return np.asarray(a).astype(np.float32, copy=False)
    return np.asarray(a.astype(mx.float32))


def host_rows(cache: A2ATSCache) -> bool:
    """Whether the cache's K/V rows can be read on the host in place: resident, unquantized,
    in a dtype NumPy views without a copy (float32 on CPU-only MLX, or float16)."""
    rows = cache.rows
    return (
        isinstance(rows, ResidentRows)
        and not rows.fmt.quantized
        and rows.keys is not None
        and rows.keys.dtype in _HOST_DTYPES
    )


def _take(stored: mx.array, positions: np.ndarray) -> np.ndarray:
    """Rows of a resident [B, n_kv, capacity, d] array at positions [B, n_kv, M], float32."""
    B, n_kv, _ = positions.shape
    b = np.arange(B)[:, None, None]
    h = np.arange(n_kv)[None, :, None]
    return np.asarray(stored)[b, h, positions].astype(np.float32, copy=False)


def host_keys(cache: A2ATSCache, positions: np.ndarray) -> np.ndarray:
    """Post-RoPE key rows at positions [B, n_kv, M] -> float32 [B, n_kv, M, d] on the host: a
    view of resident float rows (no copy of the cache), else the storage kind's own gather."""
    if host_rows(cache):
        return _take(cache.rows.keys, positions)
    taken = cache.rows.gather(KEYS, mx.array(positions.astype(np.int32)))
    return np.asarray(taken.astype(mx.float32))


def sync_inputs(cache: A2ATSCache, queries: mx.array) -> None:
    """Evaluate what the host step reads, in one sync: the query, the codes and, when they are
    read in place (`host_rows`), the resident K/V rows."""
    arrays = [queries, cache.codes]
    if host_rows(cache):
        arrays += [cache.rows.keys, cache.rows.values]
    mx.eval(arrays)


def attend(
    cache: A2ATSCache, queries: mx.array, positions: np.ndarray, repeat: np.ndarray, scale: float
) -> mx.array:
    """`attention.selected_attention` on the host, for rows read in place (`host_rows`):
    queries [B, n_q, 1, d], positions / repeat [B, n_kv, M] -> [B, n_q, 1, d] (MLX, the
    queries' dtype)."""
    B, n_q, _, d = queries.shape
    n_kv = positions.shape[1]
    q = _f32(queries).reshape(B, n_kv, n_q // n_kv, d) * scale
    keys = _take(cache.rows.keys, positions)  # [B, n_kv, M, d]
    values = _take(cache.rows.values, positions)
    s = q @ keys.swapaxes(-1, -2)  # [B, n_kv, G, M]
    s[np.broadcast_to(repeat[:, :, None, :], s.shape)] = -np.inf
    s -= s.max(axis=-1, keepdims=True)
    p = np.exp(s)
    p /= p.sum(axis=-1, keepdims=True)
    out = (p @ values).reshape(B, n_q, 1, d)
    if queries.dtype == mx.float16:
        return mx.array(out.astype(np.float16))
    out = mx.array(out)
    return out if queries.dtype == mx.float32 else out.astype(queries.dtype)


def far_scores(cache: A2ATSCache, queries: mx.array, lay: Layout) -> np.ndarray:
    """`Retrieval.far_token_scores` on the host: post-RoPE queries [B, n_q, 1, d] at position
    lay.n - 1 -> float32 [B, n_kv, G, F]."""
    codebook = cache.codebook
    B, n_q, _, d = queries.shape
    n_kv = cache.codes.shape[1]
    G = n_q // n_kv
    distances, lower_edges = cache.buckets
    q = _f32(queries).reshape(B, n_kv, G, d)
    m = len(distances)
    rq = (q @ _query_matrix(cache.rope, tuple(distances), lay.n - 1)).reshape(B, n_kv, G * m, d)
    S, sd, C = codebook.num_subspaces, codebook.sub_dim, codebook.n_centroids
    centroids = codebook.host_centroids(cache.layer)  # [n_kv, S, C, sd]
    qs = rq.reshape(B, n_kv, G * m, S, sd).transpose(0, 1, 3, 2, 4)  # [B, n_kv, S, G*m, sd]
    tables = (qs @ centroids.swapaxes(-1, -2)[None]).transpose(0, 1, 3, 2, 4)
    tables = np.ascontiguousarray(tables).reshape(B, n_kv, G, m * S * C)
    codes = np.asarray(cache.codes)[:, :, lay.n_sinks : lay.window_start, :]  # [B, n_kv, F, S]
    F = codes.shape[2]
    index = codes.astype(np.intp)
    if S > 1:
        index = index + np.arange(S) * C
    if lower_edges is not None:
        index = (
            index
            + (_bucket_ids(lay.n, lay.n_sinks, lay.window_start, lower_edges) * (S * C))[:, None]
        )
    index = index.reshape(B, n_kv, 1, F * S)
    scores = np.take_along_axis(tables, index, axis=-1)  # [B, n_kv, G, F * S]
    if S > 1:
        scores = scores.reshape(B, n_kv, G, F, S).sum(axis=-1)
    return scores


def select(cache: A2ATSCache, queries: mx.array, lay: Layout, scale: float):
    """The step's far indices [B, n_kv, G, k] (NumPy, for `NumpyTopK.select`): top-K of the
    approximate scores, reranked by exact scores when the cache reranks (`attention.rerank`).
    With `coverage`: (top, used [B, n_kv, G]) as `rerank` returns it."""
    cfg, top_k = cache.config, cache.top_k
    sync_inputs(cache, queries)
    scores = far_scores(cache, queries, lay)
    candidates = min(cfg.rerank * lay.k, lay.n_far) if cache.reranks else lay.k
    if candidates <= lay.k:
        return top_k.top(scores, lay.k)
    B, n_kv, G, _ = scores.shape
    q = _f32(queries).reshape(B, n_kv, G, -1)
    if cfg.rerank_shared:
        cand = top_k.top(scores.max(axis=2, keepdims=True), candidates)  # [B, n_kv, 1, c]
        rows = host_keys(cache, (cand + lay.n_sinks).reshape(B, n_kv, candidates))
        exact = q @ rows.swapaxes(-1, -2)  # [B, n_kv, G, c]
    else:
        cand = top_k.top(scores, candidates)  # [B, n_kv, G, c]
        rows = host_keys(cache, (cand + lay.n_sinks).reshape(B, n_kv, G * candidates))
        rows = rows.reshape(B, n_kv, G, candidates, -1)
        exact = (rows @ q[..., None])[..., 0]  # [B, n_kv, G, c]
    if cfg.coverage is None:
        return top_k.pick(cand, exact, lay.k)
    floor = min(cfg.coverage_floor, lay.k)
    return top_k.pick_covering(cand, exact, lay.k, scale, cfg.coverage, floor)
