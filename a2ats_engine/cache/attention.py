"""Retrieval attention for one decode step: lookup-table scores, top-K, exact attention on the
selection (docs/ARCHITECTURE.md, "The method"). Pure functions; `retrieval.py` holds a step's
state and `a2ats_cache.py` the rows.

Shapes: B batch, n_q query heads, n_kv KV heads, G = n_q / n_kv (GQA group), d head dim,
N tokens in the cache, S product-VQ subspaces, C centroids, m distance buckets.
No Python loop over heads or tokens, and no host sync except the NumPy top-K strategy on
CPU-only MLX (`topk.py`). Stored K/V rows come in `storage.py`'s formats.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from dataclasses import dataclass

import mlx.core as mx

from . import host_attention
from .codebook import table_scores
from .rope import RopeSpec


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


def rerank_candidates(cache, lay: Layout) -> int:
    """Far tokens per query head a retrieval step scores exactly before its top-K: the best
    `rerank * K` by approximate score (at most the far region), or K without a rerank (rerank 1,
    or a cache whose `reranks` is False: an evaluation variant's own selection). Every step
    (MLX, NumPy, C++) and the cost accounting take the count from here."""
    return min(cache.config.rerank * lay.k, lay.n_far) if cache.reranks else lay.k


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


def layout(n: int, window: int, sinks: int, k: int) -> Layout:
    """Region boundaries for a context of n tokens (the current token is n - 1)."""
    window_start = max(n - window, 0)
    return Layout(n, min(sinks, window_start), window_start, k)


def exact_attention(
    queries: mx.array, keys: mx.array, values: mx.array, scale: float, mask, sinks=None
):
    """Plain attention over the whole cache. queries [B, n_q, L, d] -> [B, n_q, L, d].

    sinks: optional per-query-head logits [n_q] that join every softmax (gpt_oss).
    A prefill chunk on CPU-only MLX is computed in NumPy (`host_attention.py`: MLX's CPU exp
    makes its softmax the bulk of a prefill)."""
    if host_attention.applies(queries, keys, mask, sinks):
        return host_attention.attention(queries, keys, values, scale, mask)
    return mx.fast.scaled_dot_product_attention(
        queries, keys, values, scale=scale, mask=mask, sinks=sinks
    )


def retrieval_tables(
    queries: mx.array,
    rope: RopeSpec,
    position: int,
    rotations: mx.array,
    codebook,
    layer: int,
    distances: tuple[int, ...] | None = None,
) -> mx.array:
    """Lookup tables of the windowed-RoPE retrieval queries, one set per far distance.

    queries: post-RoPE [B, n_kv, G, d] at `position` i; rotations: [d, m * d], the distances'
    rotation matrices side by side. The retrieval query for distance D is R_D q_i: un-rotate the
    query, then rotate it to all m distances. Returns [B, n_kv, G, m * S * C] (for each query
    head, m bucket tables of S subspaces of C centroids, in that order).

    Both rotations are one matrix of the step (`step_rotations`: the model's own un-rotation at
    i times `rotations`), so a layer's tables are two small matmuls in one `mx.compile`d
    function (`_compiled_tables`: the same shapes at every step and layer, traced once).
    `distances` (the buckets' distances `rotations` was built from) lets every layer of a step
    share that matrix; without it each call builds its own.
    """
    centroids = codebook.scoring_centroids(layer, queries)
    to_far = step_rotations(rope, position, rotations, distances)
    return _compiled_tables(queries, to_far, centroids)


_STEP_ROTATIONS: dict[tuple, mx.array] = {}  # a step's un-rotation and rotations
_STEP_ROTATIONS_LOCK = threading.Lock()
_STEP_ROTATIONS_KEPT = 8  # each RoPE of a model at a step's position, and a few spare


def step_rotations(
    rope: RopeSpec, position: int, rotations: mx.array, distances: tuple[int, ...] | None = None
) -> mx.array:
    """[d, m * d]: a post-RoPE query row at `position` times this is its m retrieval queries
    (`step_unrotation` times `rotations`). With `distances` the matrix is kept for the step:
    every layer of that RoPE and those distances shares it."""
    key = None if distances is None else ("to far", rope, tuple(distances), int(position))
    return _kept(key, lambda: step_unrotation(rope, position) @ rotations)


def step_unrotation(rope: RopeSpec, position: int) -> mx.array:
    """[d, d]: a post-RoPE row at `position` times this is its pre-RoPE row.

    The model's own un-rotation (`RopeSpec.unrotate` of the identity's rows, all at `position`:
    the same mx.fast.rope call), so no angle is derived again; kept for the step (every layer
    of a decode step shares it)."""

    def made() -> mx.array:
        eye = mx.eye(rope.head_dim or rope.dims, dtype=mx.float32)[:, None, :]
        return rope.unrotate(eye, position)[:, 0, :]

    return _kept(("unrotation", rope, int(position)), made)


def _kept(key: tuple | None, make: Callable[[], mx.array]) -> mx.array:
    """make(), kept under `key` among the last few (None: not kept)."""
    if key is not None:
        with _STEP_ROTATIONS_LOCK:
            hit = _STEP_ROTATIONS.get(key)
        if hit is not None:
            return hit
    made = make()
    if key is not None:
        with _STEP_ROTATIONS_LOCK:
            while len(_STEP_ROTATIONS) >= _STEP_ROTATIONS_KEPT:
                _STEP_ROTATIONS.pop(next(iter(_STEP_ROTATIONS)))
            _STEP_ROTATIONS[key] = made
    return made


def tables_uncompiled(
    rope: RopeSpec, queries: mx.array, offset, rotations: mx.array, centroids: mx.array
) -> mx.array:
    """The tables op by op (the reference of `retrieval_tables`; centroids
    [n_kv, S, C, sub_dim]): the query un-rotated by RoPE, then rotated to each distance."""
    B, n_kv, G, d = queries.shape
    pre = rope.unrotate(queries.astype(mx.float32)[..., None, :], offset)[..., 0, :]
    m = rotations.shape[-1] // d
    rq = (pre @ rotations).reshape(B, n_kv, G * m, d)
    tables = table_scores(rq, centroids)  # [B, n_kv, G * m, S, C]
    return tables.reshape(B, n_kv, G, -1)


def _tables(queries: mx.array, to_far: mx.array, centroids: mx.array) -> mx.array:
    B, n_kv, G, d = queries.shape
    m = to_far.shape[-1] // d
    rq = (queries.astype(mx.float32) @ to_far).reshape(B, n_kv, G * m, d)
    return table_scores(rq, centroids).reshape(B, n_kv, G, -1)


_compiled_tables = mx.compile(_tables)


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
    gather_keys: Callable[[mx.array], mx.array],
    top_k,
    coverage: tuple[float, float, int] | None = None,
    shared: bool = False,
):
    """Top-K far tokens per query head by exact score among the top `candidates` approximate ones.

    shared: the candidates are the top `candidates` of the GQA group's best approximate score
    (max over its query heads), gathered once per KV head and scored exactly by every head of
    the group: G times fewer key rows than per-head candidates.

    coverage: None, or (scale, share, floor) for an adaptive per-head budget (`topk.covering`):
    then returns (top, used [B, n_kv, G] kept counts) instead of top alone.

    queries: post-RoPE [B, n_kv, G, d]; scores: approximate [B, n_kv, G, F]; gather_keys: the
    cache's post-RoPE key rows at positions [B, n_kv, M] -> [B, n_kv, M, d]; top_k: the cache's strategy (`topk.py`). Returns far
    indices [B, n_kv, G, k] int32 (k = lay.k) in the strategy's array type, for its `select`.
    """
    B, n_kv, G, d = queries.shape
    q = queries.astype(mx.float32)
    if shared:
        cand = top_k.top(scores.max(axis=2, keepdims=True), candidates)  # [B, n_kv, 1, c]
        positions = (top_k.to_mx(cand) + lay.n_sinks).reshape(B, n_kv, candidates)
        rows = gather_keys(positions).astype(mx.float32)  # [B, n_kv, c, d]
        exact = q @ rows.swapaxes(-1, -2)  # [B, n_kv, G, c]
    else:
        cand = top_k.top(scores, candidates)  # [B, n_kv, G, c]
        positions = (top_k.to_mx(cand) + lay.n_sinks).reshape(B, n_kv, G * candidates)
        rows = gather_keys(positions)
        keys_f = rows.reshape(B, n_kv, G, candidates, d).astype(mx.float32)
        exact = (keys_f @ q[..., None])[..., 0]  # [B, n_kv, G, c]
    if coverage is None:
        return top_k.pick(cand, exact, lay.k)
    return top_k.pick_covering(cand, exact, lay.k, *coverage)


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


# -- estimated missed attention (docs/ARCHITECTURE.md, "The method") ----------------------------


@dataclass(frozen=True)
class MissedEstimate:
    """What one decode step knows about the far tokens it did not retrieve.

    A slot is one (distance bucket, code) pair: slot = bucket * C + code (C centroids), or a
    code alone (`estimate_scores="code_mean"`). Every field is over the far tokens of the slot
    that were not retrieved (the retrieved ones are attended exactly):
    slot_scores:  approximate scores of every slot, unscaled [B, n_kv, G, slots]: the step's
                  lookup tables ("centroid"), or q . (the slot's mean key) (the mean scorings).
    counts:       those tokens per slot [B, n_kv, slots] float32.
    value_sums:   the sum of their values per slot [B, n_kv, slots, d] float32.
    """

    slot_scores: mx.array
    counts: mx.array
    value_sums: mx.array


def slot_sums(slots: mx.array, rows: mx.array, weights: mx.array, n_slots: int):
    """Per-slot token count and value sum of some rows, signed.

    slots: int32 [B, n_kv, r] slot of each row; rows: float [B, n_kv, r, d] values;
    weights: float32 [r] or [B, n_kv, r] (+1 adds a row, -1 removes it).
    Returns (counts [B, n_kv, n_slots], value_sums [B, n_kv, n_slots, d]), both float32: a
    scatter-add on flat `[B * n_kv * n_slots]` rows (no loop over heads or tokens).
    """
    B, n_kv, r = slots.shape
    d = rows.shape[-1]
    base = (mx.arange(B * n_kv, dtype=mx.int32) * n_slots).reshape(B, n_kv, 1)
    flat = (slots.astype(mx.int32) + base).reshape(-1)
    w = mx.broadcast_to(weights.astype(mx.float32), (B, n_kv, r)).reshape(-1)
    counts = mx.zeros((B * n_kv * n_slots,), mx.float32).at[flat].add(w)
    vals = rows.astype(mx.float32).reshape(-1, d) * w[:, None]
    sums = mx.zeros((B * n_kv * n_slots, d), mx.float32).at[flat].add(vals)
    return counts.reshape(B, n_kv, n_slots), sums.reshape(B, n_kv, n_slots, d)


def slots_of(codes: mx.array, buckets: mx.array | int, n_centroids: int) -> mx.array:
    """Slot of tokens: codes [B, n_kv, r] (full-dimension VQ), buckets [r] int32 or an int
    -> int32 [B, n_kv, r] = bucket * C + code."""
    return codes.astype(mx.int32) + mx.array(buckets, dtype=mx.int32) * n_centroids


# exp(x) = 2^(x log2 e): a degree-7 polynomial for 2^f on [0, 1) times 2^n built from the
# float32 exponent bits. MLX's CPU `exp` costs about 10 ns an element here (NumPy's 0.4 ns), and
# the estimate takes one per (bucket, code) slot and query head every step (2,048 x 9 x 30 layers
# on the demo model); fused by `mx.compile`, this is 3-4x faster. Relative error < 4e-6.
_LOG2E = 1.4426950408889634
_EXP2_COEFFS = (
    1.0, 0.6931471805599453, 0.2402265069591007, 0.05550410866482158, 0.009618129107628477,
    0.0013333558146428443, 0.00015403530393381606, 1.525273380405984e-05,
)  # fmt: skip


def _exp_by_exponent_bits(x: mx.array) -> mx.array:
    """exp(x) for float32 x <= 88 (0 below float32's normal range, as for x = -inf)."""
    y = mx.maximum(x.astype(mx.float32) * _LOG2E, -127.0)
    n = mx.floor(y)
    f = y - n
    poly = mx.array(_EXP2_COEFFS[-1], mx.float32)
    for c in reversed(_EXP2_COEFFS[:-1]):
        poly = poly * f + c
    scale = mx.view((n.astype(mx.int32) + 127) << 23, mx.float32)
    return mx.where(y <= -127.0, mx.array(0.0, mx.float32), poly * scale)


fast_exp = mx.compile(_exp_by_exponent_bits)


def selected_attention_with_estimate(
    queries: mx.array,
    keys: mx.array,
    values: mx.array,
    repeat: mx.array,
    scale: float,
    missed: MissedEstimate,
    sinks: mx.array | None = None,
) -> tuple[mx.array, mx.array]:
    """`selected_attention` with the far tokens that were not retrieved folded into the softmax.

    Each slot c adds `n_c exp(s_c)` to the denominator and `exp(s_c) V_c` to the numerator
    (n_c, V_c: the count and value sum of its far tokens that were not retrieved, s_c its
    scaled score over them; the retrieved ones are attended exactly). With a lossless codebook
    (every key its own centroid, exact distances) this is exact attention over the whole cache;
    with mean scores it never counts a slot above its exact mass (exp of a mean score is at most
    the mean of the exps: Jensen).
    queries [B, n_kv, G, d], keys/values [B, n_kv, M, d], repeat [B, n_kv, M] ->
    (output [B, n_kv, G, d], estimated share of the softmax mass [B, n_kv, G] float32).
    """
    q = queries.astype(mx.float32) * scale
    neg = mx.array(-mx.inf, mx.float32)
    s = q @ keys.astype(mx.float32).swapaxes(-1, -2)  # [B, n_kv, G, M]
    s = mx.where(repeat[:, :, None, :], neg, s)
    t = missed.slot_scores.astype(mx.float32) * scale  # [B, n_kv, G, slots]
    t = mx.where((missed.counts > 0)[:, :, None, :], t, neg)
    top = mx.maximum(s.max(axis=-1, keepdims=True), t.max(axis=-1, keepdims=True))
    if sinks is not None:
        B, n_kv, G, _ = s.shape
        sink = mx.broadcast_to(sinks.astype(mx.float32).reshape(1, n_kv, G, 1), (B, n_kv, G, 1))
        top = mx.maximum(top, sink)
    p = mx.exp(s - top)  # [B, n_kv, G, M]
    e = fast_exp(t - top)  # [B, n_kv, G, slots]: the bulk of the step's exponentials
    v = values.astype(mx.float32)
    est_den = (e @ missed.counts[..., None])[..., 0]
    est_num = e @ missed.value_sums  # [B, n_kv, G, d]
    den = p.sum(axis=-1) + est_den
    if sinks is not None:
        den = den + mx.exp(sink - top)[..., 0]
    out = (p @ v + est_num) / den[..., None]
    return out.astype(queries.dtype), est_den / den
