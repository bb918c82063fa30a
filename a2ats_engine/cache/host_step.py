"""One A2ATS decode step on the host, for the NumPy top-K strategy: one host sync per layer, or
none where the C++ step runs inside MLX's graph (`graph_step.py`).

With `topk.NumpyTopK` the generic step (`retrieval.Retrieval.step`) pulls the far scores to the
host, goes back to MLX to gather and score the rerank's candidate keys, pulls their exact scores,
goes back to MLX for the union, the K/V gather and the attention: two syncs and about sixty
small MLX ops per layer. Here one `mx.eval` brings the layer's query, codes and K/V rows (read
in place: NumPy views of MLX's buffers, no copy) together with the step's rotation matrix
(`attention.step_rotations`, one for every layer of the step), and everything after is NumPy on
arrays of a few hundred rows: the lookup tables (two small products, `host_tables`; in MLX they
were the largest piece of a step's fixed cost on one host, docs/BENCHMARKS.md "Hosts"), far
scores (a table lookup), top-K, rerank, union, gather, softmax attention. The result enters the
model's graph as one `mx.array`.

The selection is the generic step's: the same scores into the same `NumpyTopK` calls (the
tables, the exact candidate scores and the attention are float32 products whose rounding may
differ from MLX's in the last bit). `applies` says when this path runs; anything else (quantized or cold rows, reuse
of a selection, an evaluation variant's own far scores, a model dtype NumPy has no type for)
takes the generic step. A product-VQ codebook's far scores are the sums of its subspaces' table
entries, as in MLX. The missed-attention estimate runs here too, all in NumPy: its per-slot sums
are rows of the occupied slots only (`SlotRows`), moved in place by the few tokens that change
slot a step (`missed_sums`, the generic step's `Retrieval.missed_moves`), and its softmax over
the slots' tokens not retrieved is `attention_with_estimate` (the same sums as
`attention.selected_attention_with_estimate`).

Where the C++ step is also built as an MLX primitive (`graph_step.py`) a layer it selects for
takes no sync at all: the step is a node of the model's graph (`_in_graph`), the estimate's
slot sums held in C++. Where only the C++ step is built (`native_step.py`) one call replaces
everything after the sync (`_native`); with the estimate it selects, this module moves the slot
sums (`missed_sums`), and a second C++ call (`native_step.attend_estimate`) attends, all in
`_native`. The step's selection goes to the telemetry as NumPy copies (no MLX array made of
it). `shadow` is the inspector's shadow selection of an exact step (`Retrieval.shadow`): the
C++ step's selection alone, and its recall in C++ (`native_step.recall`), after one sync.
"""

from __future__ import annotations

from functools import lru_cache
from typing import TYPE_CHECKING

import mlx.core as mx
import numpy as np

from . import attention as att
from . import graph_step, native_step, numpy_blas
from .slot_rows import ALL, SlotRows

if TYPE_CHECKING:
    from .a2ats_cache import A2ATSCache
    from .retrieval import Retrieval

_NUMPY_DTYPES = (mx.float32, mx.float16)


def _own_far_scores(cache: A2ATSCache) -> bool:
    """Whether `far_token_scores` is A2ATSCache's own (the lookup tables), not an evaluation
    variant's: the host step computes those scores itself (no import of the cache class here:
    it imports this module through `retrieval.py`)."""
    return type(cache).far_token_scores.__qualname__ == "A2ATSCache.far_token_scores"


def rows_on_host(cache: A2ATSCache) -> bool:
    """Whether the host can read the cache's K/V rows in place: float rows held in memory, of
    a dtype NumPy has (not quantized, not in the cold tier's file, not bfloat16)."""
    rows = cache.rows
    return rows.kind == "float" and rows.keys is not None and rows.keys.dtype in _NUMPY_DTYPES


def applies(cache: A2ATSCache, queries: mx.array) -> bool:
    """Whether the decode step of `cache` for `queries` runs here (see the module docstring)."""
    return (
        cache.top_k.on_host
        and _own_far_scores(cache)
        and queries.dtype in _NUMPY_DTYPES
        and rows_on_host(cache)
        and cache.config.reuse_selection is None
    )


def step(retrieval: Retrieval, cache: A2ATSCache, queries: mx.array, lay: att.Layout, scale, sinks):
    """`Retrieval.step` on the host: queries post-RoPE [B, n_q, 1, d] ->
    (output [B, n_q, 1, d] mx.array, positions int32 [B, n_kv, M], repeat bool [B, n_kv, M]
    NumPy arrays: the telemetry's, never part of the graph)."""
    B, n_q, _, d = queries.shape
    timed, layer = retrieval.timed, cache.layer
    if retrieval.clock is not None:  # the model's work up to here, so no phase is charged for it
        timed(layer, "layer inputs", lambda: [queries, *cache.state])
    retrieval.reused = False
    if graph_step.applies(cache, lay):  # the C++ step as a node of MLX's graph: no sync
        return _in_graph(retrieval, cache, queries, lay, scale, sinks)
    to_far, keys, values = _synced(cache, queries, lay)  # the step's one host sync
    sink_logits = None if sinks is None else np.asarray(sinks.astype(mx.float32))
    got = _native(retrieval, cache, queries, to_far, keys, values, lay, scale, sink_logits)
    if got is None or got[0] is None:  # the NumPy step, or its attention after C++'s selection
        with numpy_blas.one_thread():  # NumPy's BLAS threads would contend with MLX's
            got = _on_host(
                retrieval, cache, queries, to_far, keys, values, lay, scale, sink_logits,
                None if got is None else got[1:],
            )  # fmt: skip
    out, positions, repeat = got
    return mx.array(out.reshape(B, n_q, 1, d)).astype(queries.dtype), positions, repeat


def _in_graph(retrieval: Retrieval, cache: A2ATSCache, queries: mx.array, lay: att.Layout, scale,
              sinks):  # fmt: skip
    """The step inside MLX's graph (`graph_step`) -> (output [B, n_q, 1, d], positions,
    repeat), all lazy mx.arrays; the far tokens retrieved are counted when read, the
    estimate's share (`missed_share`) read by the telemetry."""
    to_far = _to_far(cache, lay)
    m, bucket = _buckets(cache, lay)

    def run():
        return graph_step.run(cache, lay, queries, to_far, m, bucket, sinks, scale, retrieval)

    out, positions, repeat, retrieved, share = retrieval.timed(cache.layer, "graph step", run)
    cache.top_k.add_retrieved(retrieved)
    retrieval.budget_used = None
    if share is not None:  # the missed-attention estimate's share, read by the telemetry
        retrieval.missed_share = share
    return out, positions, repeat


def _to_far(cache: A2ATSCache, lay: att.Layout) -> mx.array:
    """The step's query rotations (`attention.step_rotations`: one matrix, kept for every layer
    of the step)."""
    return att.step_rotations(cache.rope, lay.n - 1, cache.rotations, tuple(cache.buckets[0]))


def _synced(cache: A2ATSCache, queries: mx.array, lay: att.Layout) -> tuple:
    """The step's one host sync: the query rotations (one matrix, shared by every layer of the
    step), the query, codes and K/V rows evaluated -> (to_far, keys, values) mx.arrays."""
    to_far = _to_far(cache, lay)
    keys, values = cache.rows.keys, cache.rows.values
    mx.eval(to_far, queries, cache.codes, keys, values)
    return to_far, keys, values


def _native(retrieval: Retrieval, cache: A2ATSCache, queries, to_far, keys, values, lay, scale,
            sink_logits):  # fmt: skip
    """The step after its sync in C++ (`native_step`) where it selects -> (output
    [B, n_kv, G, d] float32, positions, repeat), the output None where the NumPy step attends
    (rows of other strides with the estimate), else None. The C++ call reads the MLX arrays'
    buffers itself: NumPy views are made only for the estimate's slot sums."""
    if not native_step.selects(cache, lay, keys.dtype):
        return None
    q = _float32(queries)
    attend = native_step.attends(cache)

    def run():
        return _run_native(cache, lay, q, to_far, keys, values, scale, sink_logits, attend)

    timed, layer = retrieval.timed, cache.layer
    got = timed(layer, "native step", run)
    if got is None:  # a NaN score: the NumPy step ranks it as argpartition does
        return None
    out, positions, repeat, retrieved = got
    cache.top_k.add_retrieved(retrieved)
    retrieval.budget_used = None
    if out is None:  # the estimate: NumPy moves the slot sums, C++ attends with them
        codes, k_np, v_np = np.asarray(cache.codes), np.asarray(keys), np.asarray(values)
        missed = timed(
            layer, "estimate", lambda: missed_sums(retrieval, cache, lay, codes, v_np, k_np)
        )

        def with_estimate():
            return native_step.attend_estimate(
                q, keys, values, positions, repeat, lay, missed.view(), missed.row_table(), scale,
                sink_logits,
            )  # fmt: skip

        attended = timed(layer, "attention", with_estimate)
        if attended is not None:  # else other strides: `_on_host` attends after the selection
            out, share = attended
            retrieval.missed_share = mx.array(share)
    return out, positions, repeat


def _run_native(cache: A2ATSCache, lay: att.Layout, q, to_far, keys, values, scale, sink_logits,
                attend: bool):  # fmt: skip
    """`native_step.run` on the layer's arrays after the sync (q: `_float32`'s), with the
    step's distance buckets."""
    m, bucket = _buckets(cache, lay)
    return native_step.run(
        cache, lay, q, to_far, m, bucket, cache.codes, keys, values, scale, sink_logits, attend
    )


def _float32(queries: mx.array):
    """The step's queries as the C++ entries read them: the evaluated array itself where it is
    float32, else a float32 NumPy copy (float16 activations over float32 rows)."""
    return queries if queries.dtype == mx.float32 else np.asarray(queries).astype(np.float32)


def _buckets(cache: A2ATSCache, lay: att.Layout) -> tuple:
    """(the distance buckets a far token is in at this step, the bucket of each far token int32
    [F] or None with a single distance) for `native_step.run`."""
    _, lower_edges = cache.buckets
    if lower_edges is None:
        return 1, None
    bucket = far_buckets(lay.n, lay.n_sinks, lay.window_start, tuple(lower_edges))
    return (int(bucket[0]) + 1 if lay.n_far else 1), bucket


def shadow(cache: A2ATSCache, queries: mx.array, lay: att.Layout, scale: float):
    """`Retrieval.shadow` through the C++ step's selection (no attention, nothing counted)
    where it selects, and its recall in C++ from the same arrays, after one sync ->
    (positions int32, repeat bool [B, n_kv, M] NumPy arrays, recall per KV head), or None
    (the generic step's shadow: the C++ step is not built, does not select here, or met a NaN
    score)."""
    if not native_step.selects(cache, lay, cache.rows.keys.dtype):
        return None
    to_far, keys, values = _synced(cache, queries, lay)
    q = _float32(queries)
    got = _run_native(cache, lay, q, to_far, keys, values, scale, None, attend=False)
    if got is None:
        return None
    _, positions, repeat, _ = got
    mass = native_step.recall(q, keys, lay.n, positions, repeat, scale)
    return positions, repeat, tuple(float(m) for m in mass.mean(axis=0))


def _on_host(retrieval: Retrieval, cache: A2ATSCache, queries, to_far, keys, values, lay, scale,
             sink_logits, selected=None):  # fmt: skip
    """The step after its sync, all NumPy: lookup tables and far scores, top-K (+ rerank),
    union, gather and the attention (with the estimate where it runs) -> (output
    [B, n_kv, G, d] float32, positions [B, n_kv, M], repeat [B, n_kv, M]). `selected`:
    (positions, repeat) the C++ step chose (`_native`): only the gather and attention here."""
    B, n_q, _, d = queries.shape
    n_kv = cache.codes.shape[1]
    G = n_q // n_kv
    timed, layer, cfg, top_k = retrieval.timed, cache.layer, cache.config, cache.top_k
    q = np.asarray(queries).reshape(B, n_kv, G, d).astype(np.float32, copy=False)
    codes = np.asarray(cache.codes)

    def scores() -> tuple[np.ndarray, np.ndarray]:
        centroids = np.asarray(cache.codebook.scoring_centroids(layer, q))
        rotations = np.asarray(to_far)
        if not (cache.estimates and cache.config.estimate_scores == "centroid"):
            # the buckets a far token is in (the farthest is the last): a short context
            # leaves the farthest buckets empty, and their tables are not made (the
            # centroid-scored estimate reads every held slot's table: all of them)
            rotations = rotations[:, : d * used_buckets(cache, lay)]
        tables = host_tables(q, rotations, centroids)
        return tables, far_scores(tables, codes, cache, lay)

    tables_np = None  # C++'s selection: never with the estimate's centroid scores (the tables)
    if selected is None:
        tables_np, approx = timed(layer, "code scores", scores)  # tables; [B, n_kv, G, F]
    k_np, v_np = np.asarray(keys), np.asarray(values)
    missed = None
    if cache.estimates:  # the occupied slots' counts and sums (a SlotRows)
        missed = timed(
            layer,
            "estimate",
            lambda: missed_sums(retrieval, cache, lay, codes, v_np, k_np),
        )
    candidates = att.rerank_candidates(cache, lay)
    retrieval.budget_used = None
    if selected is not None:
        positions, repeat = selected
    elif candidates > lay.k:
        cover = None
        if cfg.coverage is not None:
            cover = (scale, cfg.coverage, min(cfg.coverage_floor, lay.k))

        def pick() -> np.ndarray:
            return rerank(q, approx, lay, candidates, k_np, top_k, cover, cfg.rerank_shared)

        top = timed(layer, "top-K + rerank", pick)
        if cover is not None:
            top, retrieval.budget_used = top
    else:
        top = timed(layer, "top-K", lambda: top_k.top(approx, lay.k))
    if selected is None:
        positions, repeat = timed(layer, "union", lambda: top_k.select_host(top, lay))
    k_sel, v_sel = timed(
        layer, "gather K/V", lambda: (gather(k_np, positions), gather(v_np, positions))
    )

    def attend() -> np.ndarray:
        if missed is None:
            return attention(q, k_sel, v_sel, repeat, scale, sink_logits)
        counts, sums, key_sums, slot_of = missed.view()  # the occupied slots' rows
        slot_table = None
        if key_sums is None:  # centroid scores: the step's tables at each row's slot
            slot_table = np.take_along_axis(tables_np, slot_of[:, :, None, :], axis=-1)
        # the retrieved far union's columns (`TopK.select_host`: sinks, union, window)
        union = slice(lay.n_sinks, positions.shape[-1] - (lay.n - lay.window_start))
        rows = missed.at(positions[..., union])  # the row of each one's slot
        out, share = attention_with_estimate(
            q, k_sel, v_sel, repeat, scale, sink_logits, slot_table, counts, sums, rows, union,
            key_sums,
        )  # fmt: skip
        retrieval.missed_share = mx.array(share)
        return out

    return timed(layer, "attention", attend), positions, repeat


def host_tables(q: np.ndarray, to_far: np.ndarray, centroids: np.ndarray) -> np.ndarray:
    """`attention.retrieval_tables` in NumPy: post-RoPE queries q [B, n_kv, G, d] float32, the
    step's rotations to_far [d, m * d] (`attention.step_rotations`), the layer's centroids
    [n_kv, S, C, sub_dim] -> [B, n_kv, G, m * S * C] float32 (per query head, m bucket tables
    of S subspaces of C centroids). The centroids are the left operand of the product (rows
    already contiguous: BLAS's path, no transposed copy of them a step); the same sums as MLX's
    up to float32 rounding in the last bit."""
    B, n_kv, G, d = q.shape
    m = to_far.shape[-1] // d
    S, C, sd = centroids.shape[1:]
    rq = (q.reshape(B * n_kv * G, d) @ to_far).reshape(B, n_kv, G * m, S, sd)
    rq_t = np.ascontiguousarray(rq.transpose(0, 1, 3, 4, 2))  # [B, n_kv, S, sd, G * m]
    t = centroids[None].astype(np.float32, copy=False) @ rq_t  # [B, n_kv, S, C, G * m]
    return np.ascontiguousarray(t.transpose(0, 1, 4, 2, 3)).reshape(B, n_kv, G, m * S * C)


def used_buckets(cache: A2ATSCache, lay: att.Layout) -> int:
    """How many of the cache's distance buckets hold a far token at this step: the bucket of
    the farthest (position n_sinks; the step's `far_buckets`, which its far scores use too)
    and every nearer one (1 with the single distance)."""
    return _buckets(cache, lay)[0]


def far_scores(tables: np.ndarray, codes: np.ndarray, cache: A2ATSCache, lay: att.Layout):
    """`attention.far_scores` in NumPy: tables [B, n_kv, G, m * S * C], codes
    [B, n_kv, capacity, S] (the cache's) -> [B, n_kv, G, F] float32: each far token's table
    entry (one VQ), or the sum of its S subspaces' entries (product VQ, summed in the same order
    as MLX's)."""
    B, n_kv, _, S = codes.shape
    C = cache.codebook.n_centroids
    index = codes[:, :, lay.n_sinks : lay.window_start, :].astype(np.int32)  # [B, n_kv, F, S]
    if S > 1:
        index += np.arange(S, dtype=np.int32) * np.int32(C)
    _, lower_edges = cache.buckets
    if lower_edges is not None:
        buckets = far_buckets(lay.n, lay.n_sinks, lay.window_start, tuple(lower_edges))
        index += (buckets * np.int32(S * C))[:, None]
    G, F = tables.shape[2], index.shape[2]
    out = np.empty((B, n_kv, G, F), tables.dtype)
    for b in range(B):  # one np.take per KV head: 4x faster than take_along_axis's broadcast
        for h in range(n_kv):
            if S == 1:
                np.take(tables[b, h], index[b, h, :, 0], axis=-1, out=out[b, h])
            else:
                picked = np.take(tables[b, h], index[b, h].reshape(-1), axis=-1)
                picked.reshape(G, F, S).sum(axis=-1, out=out[b, h])
    return out


def gather(rows: np.ndarray, positions: np.ndarray) -> np.ndarray:
    """rows [B, n_kv, capacity, d] (any strides) at positions [B, n_kv, M] -> [B, n_kv, M, d].

    One flat `np.take` when the rows are contiguous (about 2x faster than fancy indexing)."""
    B, n_kv, M = positions.shape
    if not rows.flags.c_contiguous:
        return rows[np.arange(B)[:, None, None], np.arange(n_kv)[None, :, None], positions]
    cap, d = rows.shape[2:]
    base = (np.arange(B * n_kv, dtype=np.int64) * cap).reshape(B, n_kv, 1)
    flat = (positions + base).reshape(-1)
    return np.take(rows.reshape(-1, d), flat, axis=0).reshape(B, n_kv, M, d)


def _scores(q: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """q [..., G, d] against rows [..., M, d] -> [..., G, M] float32, as `rows @ q^T` (NumPy's
    matmul takes a transposed right operand off its BLAS path: 5x slower at these sizes)."""
    qt = np.ascontiguousarray(q.swapaxes(-1, -2))
    return np.ascontiguousarray((rows.astype(np.float32, copy=False) @ qt).swapaxes(-1, -2))


def rerank(q, approx, lay: att.Layout, candidates: int, keys, top_k, cover, shared: bool):
    """`attention.rerank` on the host: q [B, n_kv, G, d] float32, approx [B, n_kv, G, F],
    keys the stored rows [B, n_kv, capacity, d] -> far indices [B, n_kv, G, k] (or, with
    `cover`, (indices, kept count per head))."""
    B, n_kv, G, d = q.shape
    if shared:
        cand = top_k.top(approx.max(axis=2, keepdims=True), candidates)  # [B, n_kv, 1, c]
        rows = gather(keys, cand.reshape(B, n_kv, candidates) + lay.n_sinks)
        exact = _scores(q, rows)  # [B, n_kv, G, c]
    else:
        cand = top_k.top(approx, candidates)  # [B, n_kv, G, c]
        rows = gather(keys, cand.reshape(B, n_kv, G * candidates) + lay.n_sinks)
        rows = rows.reshape(B, n_kv, G, candidates, d).astype(np.float32, copy=False)
        exact = (rows @ q[..., None])[..., 0]  # [B, n_kv, G, c]
    if cover is None:
        return top_k.pick(cand, exact, lay.k)
    return top_k.pick_covering(cand, exact, lay.k, *cover)


def _logits(q, keys, repeat, scale: float) -> np.ndarray:
    """Scaled scores of the attended rows, a GQA union's repeats at -inf: q [B, n_kv, G, d]
    float32, keys [B, n_kv, M, d], repeat [B, n_kv, M] -> [B, n_kv, G, M]."""
    s = _scores(q * np.float32(scale), keys)
    s[np.broadcast_to(repeat[:, :, None, :], s.shape)] = -np.inf
    return s


def attention(q, keys, values, repeat, scale: float, sinks=None) -> np.ndarray:
    """`attention.selected_attention` in NumPy: q [B, n_kv, G, d] float32, keys / values
    [B, n_kv, M, d], repeat [B, n_kv, M] bool, sinks None or logits [n_kv * G]
    -> [B, n_kv, G, d] float32."""
    B, n_kv, G, _ = q.shape
    s = _logits(q, keys, repeat, scale)  # [B, n_kv, G, M]
    top = s.max(axis=-1, keepdims=True)
    if sinks is not None:
        sink = sinks.reshape(1, n_kv, G, 1)
        top = np.maximum(top, sink)
    p = np.exp(s - top)
    den = p.sum(axis=-1, keepdims=True)
    if sinks is not None:
        den = den + np.exp(sink - top)
    return (p @ values.astype(np.float32, copy=False)) / den


@lru_cache(maxsize=4)
def far_buckets(n: int, n_sinks: int, window_start: int, lower_edges: tuple[int, ...]):
    """`attention.bucket_ids` in NumPy, kept for the step (every layer of a step shares it):
    the distance bucket of every far token [n_sinks, window_start) when the current token is
    n - 1 -> int32 [F], read-only."""
    dist = (n - 1) - np.arange(n_sinks, window_start, dtype=np.int64)
    out = buckets_of(dist, lower_edges).astype(np.int32)
    out.flags.writeable = False
    return out


def buckets_of(distances: np.ndarray, lower_edges) -> np.ndarray:
    """The distance bucket of each distance: how many of the buckets' lower edges are at or
    below it (`attention.bucket_ids`' count, in any order of the edges) -> int64, same shape."""
    edges = np.sort(np.asarray(lower_edges, dtype=np.int64))
    return np.searchsorted(edges, distances, side="right")


def attention_with_estimate(
    q, keys, values, repeat, scale: float, sinks, tables, counts, sums, rows, union, key_sums=None
) -> tuple[np.ndarray, np.ndarray]:
    """`attention.selected_attention_with_estimate` in NumPy, over the far tokens not
    retrieved: q [B, n_kv, G, d] float32, keys / values [B, n_kv, M, d], repeat [B, n_kv, M],
    sinks None or logits [n_kv * G], counts [B, n_kv, R] and sums [B, n_kv, R, d] of the whole
    far region per slot (the occupied slots' rows, `SlotRows.view`, whose last row is always
    empty: the bin of the union's repeats; or dense with an empty last slot), union the slice
    of the attended columns that holds the retrieved far tokens (`TopK.select_host`: a token
    retrieved by several query heads once, its repeats marked in `repeat`), rows [B, n_kv, U]
    the row in counts / sums of each union column -> (output [B, n_kv, G, d] float32,
    estimated share of the softmax mass [B, n_kv, G]).

    tables: the step's slot scores [B, n_kv, G, R] (centroid scoring), or None with `key_sums`
    [B, n_kv, R, d] (the far region's post-RoPE key sums): each slot is then scored by the mean
    key of its tokens not retrieved, `(q . K_c - sum of the retrieved tokens' scores) /
    (n_c - r_c)` (their scores are the step's exact logits, summed per slot by one
    `np.bincount`). The retrieved tokens' counts and values leave their slots as `own` below.
    Column slices throughout: a boolean mask over the attended columns cost as much as the
    sums it selected."""
    B, n_kv, G, _ = q.shape
    s = _logits(q, keys, repeat, scale)  # [B, n_kv, G, M], scaled
    R = counts.shape[-1]  # the last row is empty (`SlotRows.view`): the union's repeats go there
    binned = np.where(repeat[..., union], R - 1, rows)  # [B, n_kv, U]
    heads = np.arange(0, B * n_kv * R, R, dtype=np.int64).reshape(B, n_kv, 1)
    got = np.bincount((heads + binned).reshape(-1), minlength=B * n_kv * R)
    left = counts - got.reshape(B, n_kv, R)  # the far tokens not retrieved, per row
    left = left.astype(np.float32, copy=False)[:, :, None, :]  # [B, n_kv, 1, R]: every head's
    # each union column's row, per query head, in the flat [B, n_kv, G, R] arrays
    per_q = np.arange(0, B * n_kv * G * R, R, dtype=np.int64).reshape(B, n_kv, G, 1)
    index = (per_q + binned[:, :, None, :]).reshape(-1)
    if tables is None:  # the retrieved tokens' scores summed per (query head, row)
        got_scores = np.bincount(index, s[..., union].reshape(-1), minlength=B * n_kv * G * R)
        got_scores = got_scores.reshape(B, n_kv, G, R).astype(np.float32)
        t = _scores(q * np.float32(scale), key_sums) - got_scores  # scaled sums of the left
        t = t / np.maximum(left, 1.0)
    else:
        t = tables * np.float32(scale)
    t = np.where(left > 0, t, np.float32(-np.inf))  # the empty rows (the last one too) at -inf
    top = np.maximum(s.max(axis=-1, keepdims=True), t.max(axis=-1, keepdims=True))
    if sinks is not None:
        sink = sinks.reshape(1, n_kv, G, 1)
        top = np.maximum(top, sink)
    p = np.exp(s - top)
    e = np.exp(t - top)  # [B, n_kv, G, R]; an empty row adds 0 below
    den = p.sum(axis=-1)
    # each union column's row term (a repeat's column takes the empty row's 0: not a token)
    own = np.take(e.reshape(-1), index).reshape(p.shape[:-1] + rows.shape[-1:])
    est_den = np.maximum((e @ counts[..., None])[..., 0] - own.sum(axis=-1), 0.0)
    den += est_den
    if sinks is not None:
        den = den + np.exp(sink - top)[..., 0]
    p[..., union] -= own  # p @ v + (e @ sums - own @ v), with one product over the attended rows
    v = values.astype(np.float32, copy=False)
    return (p @ v + e @ sums) / den[..., None], est_den / den


def missed_sums(retrieval: Retrieval, cache: A2ATSCache, lay: att.Layout, codes, values, keys):
    """The far region's per-slot token counts and value sums (and key sums with
    `estimate_scores` "mean" / "code_mean": keys post-RoPE) at this step, as a `SlotRows` (rows
    of the occupied slots only): the held ones moved in place by the few tokens that changed
    slot since the last step (`Retrieval.missed_moves`), else rebuilt from the codes
    [B, n_kv, capacity, 1+] and the values / keys [B, n_kv, capacity, d] the step read."""
    step_sums = getattr(cache, "step_sums", None)  # given by make_cache (`step_sums.py`)
    if step_sums is not None:  # every layer's sums moved at once
        shared = step_sums.rows_for(cache, lay)
        if shared is not None:
            return shared
    held = retrieval.host_missed
    if held is not None and not isinstance(held[1], SlotRows):
        held = None  # a StepSums' part, not moved here: rebuilt as this layer's own
    moves = retrieval.missed_moves(cache, lay, None if held is None else held[0])
    if moves is None:
        B, n_kv = codes.shape[:2]
        with_keys = cache.config.estimate_scores != "centroid"
        rows = SlotRows(B, n_kv, cache.n_slots, values.shape[-1], with_keys)
        rebuild_rows(rows, cache, lay, codes, values, keys)
    else:
        rows = held[1]
        if moves:
            move_rows(rows, cache, moves, [(codes, values, keys)])
    retrieval.host_missed = (lay.n, rows)
    retrieval.missed_sums, retrieval.missed_n = None, None  # the MLX sums no longer follow
    retrieval.graph_sums = None  # nor the graph step's
    return rows


def rebuild_rows(rows: SlotRows, cache: A2ATSCache, lay: att.Layout, codes, values, keys,
                 part: slice = ALL) -> None:  # fmt: skip
    """Add the far region [n_sinks, window_start) of one cache's codes / values / keys (the
    NumPy views the step read) to the batch entries `part` of fresh `rows`: each token to its
    slot (first subspace's code, distance bucket at context lay.n), and its row placed."""
    if not lay.n_far:
        return
    slots = codes[:, :, lay.n_sinks : lay.window_start, 0].astype(np.int64)
    if cache.estimate_edges is not None:
        ends = (lay.n, lay.n_sinks, lay.window_start)
        slots += cache.codebook.n_centroids * far_buckets(*ends, tuple(cache.estimate_edges))
    far = np.s_[:, :, lay.n_sinks : lay.window_start]
    placed = rows.add(slots, 1.0, values[far], keys[far] if rows.with_keys else None, part)
    rows.place(np.arange(lay.n_sinks, lay.window_start), placed, part)


def move_rows(rows: SlotRows, cache: A2ATSCache, moves: tuple, arrays: list) -> None:
    """A step's moves (`Retrieval.missed_moves`) added to `rows`, whose batch stacks the
    (codes, values, keys) of `arrays` in order (one cache's, or every `StepSums` member's):
    every move of every KV head with one add (a slot may take several), each entering token's
    new row placed."""
    pos, first_slot, w, entering = _move_columns(moves, cache.codebook.n_centroids)

    def stacked(column: int, index) -> np.ndarray:
        taken = [a[column][index] for a in arrays]
        return taken[0] if len(taken) == 1 else np.concatenate(taken)

    slots = stacked(0, np.s_[:, :, pos, 0]) + first_slot  # [B, n_kv, moves] int64
    values = stacked(1, np.s_[:, :, pos])
    keys = stacked(2, np.s_[:, :, pos]) if rows.with_keys else None
    placed = rows.add(slots, w, values, keys)
    rows.place(pos[entering], placed[..., entering])  # a token's new slot's row


@lru_cache(maxsize=8)
def _move_columns(moves: tuple, n_centroids: int) -> tuple[np.ndarray, ...]:
    """A step's moves ((position, bucket, weight), ...) as arrays, made once for the step's
    layers: positions int64, the first slot of each one's bucket (bucket * n_centroids, int64),
    weights float32, and which moves enter a slot (weight > 0: a token's one slot after the
    step) (read-only)."""
    pos, bucket, w = zip(*moves, strict=True)
    first_slot = np.array(bucket, np.int64) * n_centroids
    out = (np.array(pos, np.int64), first_slot, np.array(w, np.float32))
    out += (np.flatnonzero(out[2] > 0),)
    for a in out:
        a.flags.writeable = False
    return out
