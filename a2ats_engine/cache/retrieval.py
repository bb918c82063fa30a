"""One A2ATS decode step's retrieval: score far tokens by their codes, select, attend.

`Retrieval` holds what a step keeps between calls (the step's lookup tables, the reuse anchor,
the missed-attention estimate's per-slot sums) and runs the step over its cache: it reads the
cache's codes, codebook, RoPE and rows (`cache.rows.gather`), and asks the cache for
`far_token_scores` (the hook the evaluation variants in bench/methods.py override). The maths
are the pure functions of `attention.py`; docs/ARCHITECTURE.md ("The method") has the whole.
"""

from __future__ import annotations

import time
import warnings
from collections import defaultdict
from collections.abc import Callable
from functools import lru_cache
from typing import TYPE_CHECKING, Any

import mlx.core as mx

from . import attention as att
from . import host_step
from .config import estimate_runs
from .storage import KEYS, VALUES, RowStorage, gather_rows

if TYPE_CHECKING:
    from .a2ats_cache import A2ATSCache


def estimate_applies(config, codebook) -> bool:
    """Whether `estimate_missed` runs. Slots scored by their own keys ("mean", "code_mean")
    work with any codebook: with product VQ a token's slot is its first subspace's code (and
    distance bucket), and its score is still the exact mean score of the slot's tokens.
    Centroid scores need one code per token and KV head (a full-dimension codebook): with
    product VQ they are off, and a warning says so."""
    if config.estimate_missed and not estimate_runs(config, codebook.num_subspaces):
        warnings.warn(
            f"A2ATS: estimate_missed is off for this codebook: centroid slot scores need a "
            f"full-dimension codebook, this one has {codebook.num_subspaces} subspaces "
            f"(product VQ); estimate_scores='mean' works with it",
            stacklevel=5,
        )
        return False
    return config.estimate_missed


def estimate_slots(config, buckets, codebook) -> tuple[tuple[int, ...] | None, int]:
    """The missed-attention estimate's slots: (the distance-bucket lower edges a slot is split
    by, or None, and the slot count). (bucket, code) pairs, or codes alone with
    `estimate_scores="code_mean"`. `buckets`: the cache's (distances, lower edges)."""
    if config.estimate_scores == "code_mean":
        return None, codebook.n_centroids
    return buckets[1], len(buckets[0]) * codebook.n_centroids


def _bucket_of(lower_edges: tuple[int, ...] | None, n: int, position: int) -> int:
    """The estimate's distance bucket of a far token at `position` when the current token is
    n - 1 (0 when its slots are codes alone)."""
    return sum((n - 1) - position >= lo for lo in lower_edges or ())


@lru_cache(maxsize=8)
def slot_moves(
    n: int, window: int, sinks: int, lower_edges: tuple[int, ...] | None
) -> tuple[tuple[int, int, float], ...]:
    """The moves of the estimate's per-slot sums from context n - 1 to n: (position, bucket,
    +1 / -1) for each far token that changed region or bucket (the one leaving the window, one
    per bucket edge; a token that moves leaves one slot and enters another). The same for every
    layer of a step with these settings (the layer's top-K budget plays no part): computed
    once a step (kept for the last few).

    Anything but one appended token (prefill, trim, restore) rebuilds the sums instead
    (`Retrieval.missed_moves`), so the sums are never saved."""
    old, now_lay = att.layout(n - 1, window, sinks, 0), att.layout(n, window, sinks, 0)
    candidates = {*range(old.window_start, now_lay.window_start)}
    candidates |= {*range(old.n_sinks, now_lay.n_sinks)}
    candidates |= {(n - 1) - lo for lo in lower_edges or ()}
    moves: list[tuple[int, int, float]] = []
    for p in sorted(candidates):
        was = None
        if old.n_sinks <= p < old.window_start:
            was = _bucket_of(lower_edges, n - 1, p)
        now = None
        if now_lay.n_sinks <= p < now_lay.window_start:
            now = _bucket_of(lower_edges, n, p)
        if was != now:
            moves += [(p, b, w) for b, w in ((was, -1.0), (now, 1.0)) if b is not None]
    return tuple(moves)


class PhaseClock:
    """Opt-in timing of a decode step's phases (`a2ats bench decode --profile`): each phase is
    evaluated on its own (`mx.eval`), so the time it took is its own and not spread over the
    next lazy evaluation. Totals in seconds per (layer, phase); off (None) on the hot path."""

    def __init__(self) -> None:
        self.seconds: dict[tuple[int, str], float] = defaultdict(float)
        self.calls: dict[tuple[int, str], int] = defaultdict(int)

    def run(self, layer: int, phase: str, fn: Callable[[], Any]) -> Any:
        began = time.perf_counter()
        out = fn()
        mx.eval([a for a in _arrays(out)])
        self.seconds[(layer, phase)] += time.perf_counter() - began
        self.calls[(layer, phase)] += 1
        return out


def _arrays(value: Any) -> list:
    if isinstance(value, mx.array):
        return [value]
    if isinstance(value, tuple | list):
        return [a for v in value for a in _arrays(v)]
    return []


class Retrieval:
    """The retrieval state of one cache (cleared by `forget` on prefill, trim and restore)."""

    clock: PhaseClock | None = None  # set to time the phases of each step (profiling only)

    def __init__(self) -> None:
        self.forget()

    def timed(self, layer: int, phase: str, fn: Callable[[], Any]) -> Any:
        """fn(), timed as `phase` of `layer` when a PhaseClock is set."""
        return fn() if self.clock is None else self.clock.run(layer, phase, fn)

    def forget(self) -> None:
        """Drop the per-slot sums: the next decode step rebuilds them from codes and values."""
        self.forget_estimate()
        self.budget_used = None  # the last step's kept far tokens per query head [B, n_kv, G]
        # reuse_selection: (k, context, pre-RoPE query [B, n_kv, G, d], far indices) of the
        # selection last computed, and whether the last step reused it
        self.anchor: tuple | None = None
        self.reused = False
        self.step_tables = None  # (queries, context, tables) of the step being attended

    def forget_estimate(self) -> None:
        """Drop the missed-attention estimate's sums and last share (`forget`; a layer the
        estimate leaves, `estimate_layers.EstimateLayers`)."""
        self.missed_sums = None  # (counts [B, n_kv, slots], value sums [B, n_kv, slots, d])
        self.missed_n: int | None = None  # the context length the sums describe
        # the host step's own sums, in NumPy: (context, slot_rows.SlotRows), or None
        self.host_missed: tuple | None = None
        # the graph step's, in C++: (graph_step.cpp's SlotSums, context of its last node)
        self.graph_sums: tuple | None = None
        self.missed_share = None  # the last step's estimated mass [B, n_kv, G]

    @property
    def estimate_bytes(self) -> int:
        """Bytes of the per-slot count and value sums (0 when estimate_missed is off)."""
        held = self.host_missed[1].nbytes if self.host_missed is not None else 0
        held += self.graph_sums[0].nbytes if self.graph_sums is not None else 0
        return held + sum(a.nbytes for a in self.missed_sums or ())

    # -- scores -------------------------------------------------------------------------------
    def far_token_scores(self, cache: A2ATSCache, queries: mx.array, lay: att.Layout) -> mx.array:
        """Approximate windowed-RoPE scores of the far tokens for a decode query.

        queries: post-RoPE [B, n_q, 1, d] at position lay.n - 1 -> [B, n_kv, G, F] float32,
        F = far tokens [n_sinks, window_start). Each far token is scored with the query rotated
        to its distance bucket's representative distance (the single distance b when
        far_buckets = 1): table lookups `(R_D q) . C[code]`, never the keys themselves.
        """
        tables = self.slot_scores(cache, queries, lay)
        _, lower_edges = cache.buckets
        far_codes = cache.codes[..., lay.n_sinks : lay.window_start, :]
        bucket_ids = None
        if lower_edges is not None:
            bucket_ids = att.bucket_ids(lay.n, lay.n_sinks, lay.window_start, lower_edges)
        return att.far_scores(tables, far_codes, bucket_ids, cache.codebook.n_centroids)

    def slot_scores(self, cache: A2ATSCache, queries: mx.array, lay: att.Layout) -> mx.array:
        """The step's lookup tables: post-RoPE queries [B, n_q, 1, d] -> [B, n_kv, G, m * S * C]
        (`attention.retrieval_tables`); with S = 1, the score of every (bucket, code) slot.
        Built once per step: the far scores and the missed-attention estimate share them."""
        memo = self.step_tables
        if memo is not None and memo[0] is queries and memo[1] == lay.n:
            return memo[2]
        B, n_q, _, d = queries.shape
        n_kv = cache.codes.shape[1]
        group = queries.reshape(B, n_kv, n_q // n_kv, d)
        distances = tuple(cache.buckets[0])
        tables = att.retrieval_tables(
            group, cache.rope, lay.n - 1, cache.rotations, cache.codebook, cache.layer, distances
        )
        self.step_tables = (queries, lay.n, tables)
        return tables

    # -- the step -----------------------------------------------------------------------------
    def step(self, cache: A2ATSCache, queries: mx.array, lay: att.Layout, scale: float, sinks):
        """Attention of one decode query over the selection: queries post-RoPE [B, n_q, 1, d]
        -> ([B, n_q, 1, d], positions [B, n_kv, M], repeat [B, n_kv, M]: mx arrays, or NumPy
        arrays from the host step; the telemetry's, never the graph's). A layer whose
        estimate is still being weighed reports its missed share (`EstimateLayers`)."""
        out = self._step(cache, queries, lay, scale, sinks)
        choice = getattr(cache, "estimate_choice", None)
        if choice is not None and cache.estimates:
            choice.report(cache, self.missed_share)
        return out

    def _step(self, cache: A2ATSCache, queries: mx.array, lay: att.Layout, scale: float, sinks):
        if host_step.applies(cache, queries):
            return host_step.step(self, cache, queries, lay, scale, sinks)
        B, n_q, _, d = queries.shape
        n_kv = cache.codes.shape[1]
        group = queries.reshape(B, n_kv, n_q // n_kv, d)
        timed, layer = self.timed, cache.layer
        if self.clock is not None:  # the model's work up to here, so no phase is charged for it
            timed(layer, "layer inputs", lambda: [queries, *cache.state])
        top = self._reusable_selection(cache, group, lay)
        if top is None:
            top = self._far_selection(cache, queries, group, lay, scale)
        positions, repeat = timed(layer, "union", lambda: cache.top_k.select(top, lay))
        k_sel, v_sel = timed(
            layer,
            "gather K/V",
            lambda: (cache.rows.gather(KEYS, positions), cache.rows.gather(VALUES, positions)),
        )
        if cache.estimates:
            missed = timed(
                layer,
                "estimate",
                lambda: self._missed_estimate(cache, queries, lay, positions, repeat, k_sel, v_sel),
            )
            out, self.missed_share = timed(
                layer,
                "attention",
                lambda: att.selected_attention_with_estimate(
                    group, k_sel, v_sel, repeat, scale, missed, sinks
                ),
            )
        else:
            out = timed(
                layer,
                "attention",
                lambda: att.selected_attention(group, k_sel, v_sel, repeat, scale, sinks),
            )
        self.step_tables = None  # the step's tables are not kept past it
        return out.reshape(B, n_q, 1, d), positions, repeat

    def _reusable_selection(self, cache: A2ATSCache, group: mx.array, lay: att.Layout):
        """With `reuse_selection`: the far indices chosen at an earlier step, if this is the next
        step and every query head's pre-RoPE query is still within the threshold's cosine of the
        query they were chosen for; else None (and the step selects afresh).

        group: post-RoPE queries [B, n_kv, G, d]. One host sync per layer and step (opt-in).
        """
        threshold, anchor = cache.config.reuse_selection, self.anchor
        self.reused = False
        if threshold is None:
            return None
        pre = cache.rope.unrotate(group.astype(mx.float32)[..., None, :], lay.n - 1)[..., 0, :]
        fresh = anchor is None or anchor[0] != lay.k or anchor[1] != lay.n - 1
        if not fresh:
            q0 = anchor[2]
            cos = (pre * q0).sum(axis=-1) / (
                mx.linalg.norm(pre, axis=-1) * mx.linalg.norm(q0, axis=-1) + 1e-12
            )
            if float(cos.min()) >= threshold:
                self.reused = True
                self.anchor = (lay.k, lay.n, q0, anchor[3])
                return anchor[3]
        self.anchor = (lay.k, lay.n, pre, None)  # the selection is filled in by the caller
        return None

    def shadow(self, cache: A2ATSCache, queries: mx.array, lay: att.Layout, scale: float):
        """What retrieval would select at a step that attends exactly (the inspector's shadow
        selection): (positions, repeat) [B, n_kv, M] as a retrieval step would attend them, and
        their recall where the host step computed it with them (`host_step.shadow`), else None.
        Nothing of the step's state is kept (no reuse anchor, no retrieved count)."""
        if host_step.applies(cache, queries):
            got = host_step.shadow(cache, queries, lay, scale)
            if got is not None:
                return got
        B, n_q, _, d = queries.shape
        group = queries.reshape(B, cache.codes.shape[1], n_q // cache.codes.shape[1], d)
        anchor = self.anchor
        top = self._far_selection(cache, queries, group, lay, scale)
        self.anchor, self.step_tables = anchor, None
        return (*cache.top_k.select(top, lay, count=False), None)

    def _far_selection(
        self, cache: A2ATSCache, queries: mx.array, group: mx.array, lay: att.Layout, scale: float
    ):
        """This step's far indices [B, n_kv, G, k] (the top-K strategy's array type): top-K of
        the approximate scores, reranked by exact scores when rerank > 1."""
        cfg, timed = cache.config, self.timed
        scores = timed(cache.layer, "code scores", lambda: cache.far_token_scores(queries, lay))
        candidates = att.rerank_candidates(cache, lay)
        self.budget_used = None
        if candidates > lay.k:
            cover = None
            if cfg.coverage is not None:
                cover = (scale, cfg.coverage, min(cfg.coverage_floor, lay.k))

            def gather_keys(positions: mx.array) -> mx.array:
                return cache.rows.candidate_keys(positions)

            top = timed(
                cache.layer,
                "top-K + rerank",
                lambda: att.rerank(
                    group,
                    scores,
                    lay,
                    candidates,
                    gather_keys,
                    cache.top_k,
                    cover,
                    cfg.rerank_shared,
                ),
            )
            if cover is not None:
                top, self.budget_used = top
        else:
            top = timed(cache.layer, "top-K", lambda: cache.top_k.top(scores, lay.k))
        if self.anchor is not None and self.anchor[3] is None:
            self.anchor = (*self.anchor[:3], top)
        return top

    # -- estimated missed attention -----------------------------------------------------------
    def _slot_rows(self, cache: A2ATSCache, positions: mx.array, buckets, weights: mx.array):
        """Signed per-slot sums of the tokens at `positions` [r] in distance buckets `buckets`."""
        B, n_kv = cache.codes.shape[:2]
        pos = mx.broadcast_to(positions.astype(mx.int32), (B, n_kv, positions.shape[0]))
        codes = mx.take(cache.codes[..., 0], positions.astype(mx.int32), axis=2)  # [B, n_kv, r]
        rows = cache.rows.gather(VALUES, pos)  # [B, n_kv, r, d]
        if cache.config.estimate_scores != "centroid":  # a slot sums its keys too: [.., 2 d]
            keys = cache.rows.gather(KEYS, pos).astype(mx.float32)
            rows = mx.concatenate([rows.astype(mx.float32), keys], axis=-1)
        slots = att.slots_of(codes, buckets, cache.codebook.n_centroids)
        return att.slot_sums(slots, rows, weights, cache.n_slots)

    def missed_moves(self, cache: A2ATSCache, lay: att.Layout, n_done: int | None):
        """How the per-slot sums of the far region [n_sinks, window_start) change from the step
        they last described (context `n_done`) to this one: ((position, bucket, +1 / -1), ...),
        or None when they must be rebuilt from the stored codes and values (`slot_moves`)."""
        if n_done is None or n_done != lay.n - 1:
            return None
        cfg, edges = cache.config, cache.estimate_edges
        return slot_moves(lay.n, cfg.window, cfg.sinks, None if edges is None else tuple(edges))

    def _sync_missed(self, cache: A2ATSCache, lay: att.Layout) -> None:
        """Per-slot count and value sum of the far region at this step, in MLX
        (`missed_moves`)."""
        n = lay.n
        moves = self.missed_moves(cache, lay, self.missed_n)
        if moves is None:
            lower_edges = cache.estimate_edges
            pos = mx.arange(lay.n_sinks, lay.window_start, dtype=mx.int32)
            buckets = 0
            if lower_edges is not None and lay.n_far:
                buckets = att.bucket_ids(n, lay.n_sinks, lay.window_start, lower_edges)
            weights = mx.ones((lay.n_far,), mx.float32)
            self.missed_sums = self._slot_rows(cache, pos, buckets, weights)
        elif moves:
            pos, buckets, weights = (mx.array(list(col)) for col in zip(*moves, strict=True))
            counts, sums = self._slot_rows(cache, pos, buckets, weights)
            self.missed_sums = (self.missed_sums[0] + counts, self.missed_sums[1] + sums)
        self.missed_n = n
        self.host_missed = None  # the host step's NumPy sums no longer follow

    def _missed_estimate(
        self,
        cache: A2ATSCache,
        queries: mx.array,
        lay: att.Layout,
        positions: mx.array,
        repeat: mx.array,
        k_sel: mx.array,
        v_sel: mx.array,
    ) -> att.MissedEstimate:
        """What `attention.selected_attention_with_estimate` needs for this step: the per-slot
        counts and sums of the far tokens not retrieved (the far region's, less the retrieved
        ones'), and each slot's score over those tokens.

        positions / repeat: [B, n_kv, M] as the top-K strategy's `select` returns them;
        k_sel / v_sel: the rows at `positions` [B, n_kv, M, d].
        """
        self._sync_missed(cache, lay)
        counts, sums = self.missed_sums
        B, n_q, _, d = queries.shape
        codes = gather_rows(cache.codes[..., :1], positions, RowStorage())[..., 0]
        lower_edges = cache.estimate_edges
        slots = codes.astype(mx.int32)
        if lower_edges is not None:
            dist = (lay.n - 1) - positions
            edges = mx.array(lower_edges, dtype=mx.int32)
            bucket = (dist[..., None] >= edges).sum(axis=-1).astype(mx.int32)
            slots = slots + bucket * cache.codebook.n_centroids
        far = (positions >= lay.n_sinks) & (positions < lay.window_start) & ~repeat
        rows = v_sel.astype(mx.float32)
        mean = cache.config.estimate_scores != "centroid"
        if mean:  # a slot sums its keys too
            rows = mx.concatenate([rows, k_sel.astype(mx.float32)], axis=-1)
        got_counts, got_sums = att.slot_sums(slots, rows, far, cache.n_slots)
        counts, sums = counts - got_counts, sums - got_sums  # the far tokens not retrieved
        if mean:  # the mean key of those tokens: their exact mean score
            group = queries.reshape(B, counts.shape[1], n_q // counts.shape[1], d)
            key_sums = sums[..., d:].swapaxes(-1, -2)  # [B, n_kv, d, slots]
            tables = group.astype(mx.float32) @ key_sums / mx.maximum(counts, 1.0)[:, :, None, :]
            sums = sums[..., :d]
        else:
            tables = self.slot_scores(cache, queries, lay)  # [B, n_kv, G, slots]
        return att.MissedEstimate(tables, counts, sums)
