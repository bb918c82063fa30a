"""A2ATSCache: an mlx-lm KV cache that retrieves the top-K far tokens with VQ codes.

Every key that enters the cache is un-rotated to its pre-RoPE frame and coded against the
layer's codebook (uint16 per token per KV head and subspace). Full post-RoPE keys and values are
kept (model dtype, or `mx.quantize`d with kv_bits: `storage.py`) for exact attention on the
selection, chosen by the cache's top-K strategy (`topk.py`, picked once when the cache is made).
Attention reaches `attend` through the hook in `hooks.py` (which gives us the true query).
`state` / `meta_state` / `from_state` follow mlx-lm's cache protocol (see docs/ARCHITECTURE.md).
"""

from __future__ import annotations

import json
import time
import warnings
import weakref
from dataclasses import replace

import mlx.core as mx
import mlx.nn as nn
import numpy as np
from mlx_lm.models.cache import _BaseCache, create_attention_mask

from ..errors import A2ATSError, ModelNotSupportedError
from ..records import planning_context
from . import attention as att
from .config import A2ATSConfig
from .crossover import measured_crossover
from .rope import RopeSpec, distance_buckets, model_geometry, retrieval_distances
from .storage import RowStorage
from .telemetry import CacheSnapshot, LayerStats
from .topk import choose_top_k

_STEP = 256
RANDOM_CENTROIDS = 256  # the stand-in codebook's size when none is given (wiring, timing)
# codebooks of caches whose meta_state was taken, by sha256 (weak: dropped with their caches)
_CODEBOOKS: weakref.WeakValueDictionary = weakref.WeakValueDictionary()


class A2ATSCache(_BaseCache):
    """One attention layer's A2ATS cache (mlx-lm cache protocol + `attend`)."""

    # whether `config.rerank` applies (False for evaluation caches whose ranking is not a score)
    reranks: bool = True

    step = _STEP

    def __init__(
        self,
        layer: int,
        rope: RopeSpec,
        codebook,
        config: A2ATSConfig | None = None,
        max_context: int | None = None,
    ) -> None:
        self._configure(layer, rope, codebook, config or A2ATSConfig(), max_context)
        self._clear()

    # -- configuration ----------------------------------------------------------------------
    def _configure(
        self, layer: int, rope: RopeSpec, codebook, config: A2ATSConfig, max_context: int | None
    ) -> None:
        """Everything fixed for the cache's life (what `meta_state` records), and what follows.

        With `config.layer_budgets` the cache keeps its own layer's settings
        (`A2ATSConfig.for_layer`: the scaled budget, no per-layer list)."""
        self.layer = layer
        self.rope = rope
        self.codebook = codebook
        config = config.for_layer(layer)
        self.config = config
        self.max_context = planning_context(max_context)
        self.top_k = choose_top_k()  # NumPy or MLX top-K, decided once (topk.py)
        self._buckets = self._bucket_plan()
        # [d, m * d]: rotation to each far distance (the retrieval queries' frames), built once
        self._rotations = mx.concatenate(
            [rope.rotation_matrix(dist) for dist in self._buckets[0]], axis=-1
        )
        hd = rope.head_dim
        if self.config.kv_bits is not None and (hd % self.group_size or self.group_size < 32):
            raise ValueError(
                f"A2ATSConfig.kv_bits={self.config.kv_bits} needs head_dim ({hd}) divisible by "
                f"a quantization group of 32, 64 or 128"
            )
        self.storage = RowStorage(self.config.kv_bits, self.group_size)
        # the estimate needs one code per token and KV head (a full-dimension codebook)
        self.estimates = self.config.estimate_missed and codebook.num_subspaces == 1
        if self.config.estimate_missed and not self.estimates:
            warnings.warn(
                f"A2ATS: estimate_missed is off for this codebook: it needs a full-dimension "
                f"codebook, this one has {codebook.num_subspaces} subspaces (product VQ)",
                stacklevel=3,
            )
        self.n_slots = len(self._buckets[0]) * codebook.n_centroids  # (bucket, code) pairs
        # decode steps of this cache's life that attended exactly / retrieved (`attention_steps`)
        self.exact_steps = 0
        self.retrieved_steps = 0
        self.exact_below = config.exact_below
        if self.exact_below is None:  # the measured crossover (crossover.py)
            book = codebook
            self.exact_below = measured_crossover(book.num_layers, book.num_kv_heads, hd)

    def _clear(self) -> None:
        """No tokens held: the state of a fresh cache."""
        self.keys = None
        self.values = None
        self.codes = None
        self.offset = 0
        self.tokens_seen = 0
        self._step = 0
        self._reported: int | None = None  # tokens the last snapshot covered; None: keyframe
        self.last_stats: LayerStats | None = None
        self._stats_final = False  # last_stats already carries its codes (`take_stats`)
        self._unattended = False  # a decode step stored keys and `attend` has not run yet
        self._forget_missed()

    def _bucket_plan(self) -> tuple[list[int], tuple[int, ...] | None]:
        """Retrieval distances and the lower edges of buckets 1..m-1 (None for one b)."""
        cfg = self.config
        distances = retrieval_distances(
            cfg.window, cfg.far_offset, cfg.far_buckets, self.max_context
        )
        if cfg.far_buckets == 1:
            return distances, None
        plan = distance_buckets(cfg.window, self.max_context, cfg.far_buckets)
        return distances, tuple(lo for lo, _, _ in plan[1:])

    @property
    def kv_bits(self) -> int | None:
        return self.config.kv_bits

    @property
    def group_size(self) -> int:
        """kv_bits group size: the configured one, capped at head_dim (it must divide it)."""
        return min(self.config.kv_group_size, self.rope.head_dim)

    # -- storage ----------------------------------------------------------------------------
    @property
    def capacity(self) -> int:
        return 0 if self.codes is None else self.codes.shape[2]

    def _grow(self, keys, values, codes, L: int) -> None:
        prev = self.offset
        if self.codes is not None and prev + L <= self.capacity:
            return
        B, n_kv = codes.shape[:2]
        size = ((L + self.step - 1) // self.step) * self.step
        new_k = self.storage.zeros_like(keys, B, n_kv, size)
        new_v = self.storage.zeros_like(values, B, n_kv, size)
        new_c = mx.zeros((B, n_kv, size, codes.shape[-1]), mx.uint16)
        if self.codes is None:
            self.keys, self.values, self.codes = new_k, new_v, new_c
            return
        if prev % self.step:
            rows = self.storage.rows
            self.keys, self.values = rows(self.keys, prev), rows(self.values, prev)
            self.codes = self.codes[..., :prev, :]
        self.keys = self.storage.concat(self.keys, new_k)
        self.values = self.storage.concat(self.values, new_v)
        self.codes = mx.concatenate([self.codes, new_c], axis=2)

    def update_and_fetch(self, keys: mx.array, values: mx.array):
        """Store post-RoPE keys/values [B, n_kv, L, d] and their codes; return the whole cache.

        The returned K/V are float arrays in the model dtype. With kv_bits the stored past is
        dequantized and the incoming tokens are returned as they came, so prefill attention stays
        a plain (fast) attention; MLX evaluates them only if exact attention uses them.
        """
        L = keys.shape[2]
        if self._unattended:
            raise ModelNotSupportedError(
                f"layer {self.layer}: the last decode step did not attend through A2ATS (the "
                "model computed attention itself); refusing to run full attention as A2ATS"
            )
        self._unattended = L == 1
        pre_rope = self.rope.unrotate(keys.astype(mx.float32), self.offset)
        codes = self.codebook.assign(self.layer, pre_rope)  # [B, n_kv, L, S]
        k_store, v_store = self.storage.encode(keys), self.storage.encode(values)
        self._grow(k_store, v_store, codes, L)
        prev = self.offset
        self.offset += L
        self.storage.write(self.keys, k_store, prev, self.offset)
        self.storage.write(self.values, v_store, prev, self.offset)
        self.codes[..., prev : self.offset, :] = codes
        self.tokens_seen += L
        if L > 1:
            self._reported = None  # a prefill: the next snapshot sends full histograms
            self._forget_missed()
        if self.kv_bits is None:
            rows = self.storage.rows
            return rows(self.keys, self.offset), rows(self.values, self.offset)
        return self._float_with(self.keys, keys, prev), self._float_with(self.values, values, prev)

    def _float_with(self, stored, fresh: mx.array, prev: int) -> mx.array:
        """Dequantized stored rows [0, prev) followed by the fresh rows: [B, n_kv, prev + L, d]."""
        if prev == 0:
            return fresh
        past = self.storage.dequantize(self.storage.rows(stored, prev)).astype(fresh.dtype)
        return mx.concatenate([past, fresh], axis=2)

    # -- attention --------------------------------------------------------------------------
    def attend(
        self, queries: mx.array, keys, values, *, scale: float, mask=None, sinks=None
    ) -> mx.array:
        """Attention for this layer. queries: post-RoPE [B, n_q, L, d] -> [B, n_q, L, d].

        Prefill (L > 1), short contexts and contexts below `exact_below` use exact attention;
        a decode step retrieves.
        sinks: optional per-query-head sink logits [n_q] (gpt_oss), honoured on both paths.
        """
        self._unattended = False
        cfg = self.config
        L = queries.shape[2]
        lay = att.layout(self.offset, cfg.window, cfg.sinks, cfg.top_k(self.offset))
        if L > 1 or lay.exact or lay.n < self.exact_below:
            out = att.exact_attention(queries, keys, values, scale, mask, sinks)
            if L == 1:
                self.exact_steps += 1
                self._after_step(lay, None, None, queries, scale)
            return out
        self.retrieved_steps += 1
        return self._retrieve(queries, lay, scale, sinks)

    def far_token_scores(self, queries: mx.array, lay: att.Layout) -> mx.array:
        """Approximate windowed-RoPE scores of the far tokens for a decode query.

        queries: post-RoPE [B, n_q, 1, d] at position lay.n - 1 -> [B, n_kv, G, F] float32,
        F = far tokens [n_sinks, window_start). Each far token is scored with the query rotated
        to its distance bucket's representative distance (the single distance b when
        far_buckets = 1): table lookups `(R_D q) . C[code]`, never the keys themselves.
        """
        tables = self.slot_scores(queries, lay)
        _, lower_edges = self._buckets
        far_codes = self.codes[..., lay.n_sinks : lay.window_start, :]
        bucket_ids = None
        if lower_edges is not None:
            bucket_ids = att.bucket_ids(lay.n, lay.n_sinks, lay.window_start, lower_edges)
        return att.far_scores(tables, far_codes, bucket_ids, self.codebook.n_centroids)

    def slot_scores(self, queries: mx.array, lay: att.Layout) -> mx.array:
        """The step's lookup tables: post-RoPE queries [B, n_q, 1, d] -> [B, n_kv, G, m * S * C]
        (`attention.retrieval_tables`); with S = 1, the score of every (bucket, code) slot.
        Built once per step: the far scores and the missed-attention estimate share them."""
        memo = self._step_tables
        if memo is not None and memo[0] is queries and memo[1] == lay.n:
            return memo[2]
        B, n_q, _, d = queries.shape
        n_kv = self.codes.shape[1]
        group = queries.reshape(B, n_kv, n_q // n_kv, d)
        tables = att.retrieval_tables(
            group, self.rope, lay.n - 1, self._rotations, self.codebook, self.layer
        )
        self._step_tables = (queries, lay.n, tables)
        return tables

    def _retrieve(self, queries: mx.array, lay: att.Layout, scale: float, sinks=None) -> mx.array:
        B, n_q, _, d = queries.shape
        n_kv = self.codes.shape[1]
        group = queries.reshape(B, n_kv, n_q // n_kv, d)
        top = self._reusable_selection(group, lay)
        if top is None:
            top = self._far_selection(queries, group, lay, scale)
        positions, repeat = self.top_k.select(top, lay)
        k_sel = att.gather_rows(self.keys, positions, self.storage)
        v_sel = att.gather_rows(self.values, positions, self.storage)
        if self.estimates:
            missed = self._missed_estimate(queries, lay, positions, repeat)
            out, self._missed_share = att.selected_attention_with_estimate(
                group, k_sel, v_sel, repeat, scale, missed, sinks
            )
        else:
            out = att.selected_attention(group, k_sel, v_sel, repeat, scale, sinks)
        self._step_tables = None  # the step's tables are not kept past it
        self._after_step(lay, positions, repeat, queries, scale)
        return out.reshape(B, n_q, 1, d)

    def _reusable_selection(self, group: mx.array, lay: att.Layout):
        """With `reuse_selection`: the far indices chosen at an earlier step, if this is the next
        step and every query head's pre-RoPE query is still within the threshold's cosine of the
        query they were chosen for; else None (and the step selects afresh).

        group: post-RoPE queries [B, n_kv, G, d]. One host sync per layer and step (opt-in).
        """
        threshold, anchor = self.config.reuse_selection, self._anchor
        self._reused = False
        if threshold is None:
            return None
        pre = self.rope.unrotate(group.astype(mx.float32)[..., None, :], lay.n - 1)[..., 0, :]
        fresh = anchor is None or anchor[0] != lay.k or anchor[1] != lay.n - 1
        if not fresh:
            q0 = anchor[2]
            cos = (pre * q0).sum(axis=-1) / (
                mx.linalg.norm(pre, axis=-1) * mx.linalg.norm(q0, axis=-1) + 1e-12
            )
            if float(cos.min()) >= threshold:
                self._reused = True
                self._anchor = (lay.k, lay.n, q0, anchor[3])
                return anchor[3]
        self._anchor = (lay.k, lay.n, pre, None)  # the selection is filled in by the caller
        return None

    def _far_selection(self, queries: mx.array, group: mx.array, lay: att.Layout, scale: float):
        """This step's far indices [B, n_kv, G, k] (the top-K strategy's array type): top-K of
        the approximate scores, reranked by exact scores when rerank > 1."""
        scores = self.far_token_scores(queries, lay)
        candidates = min(self.config.rerank * lay.k, lay.n_far) if self.reranks else lay.k
        self._budget_used = None
        shared = self.config.rerank_shared
        if candidates > lay.k and self.config.coverage is not None:
            cover = (scale, self.config.coverage, min(self.config.coverage_floor, lay.k))
            top, self._budget_used = att.rerank(
                group, scores, lay, candidates, self.keys, self.storage, self.top_k, cover, shared
            )
        elif candidates > lay.k:
            top = att.rerank(
                group, scores, lay, candidates, self.keys, self.storage, self.top_k, None, shared
            )
        else:
            top = self.top_k.top(scores, lay.k)
        if self._anchor is not None and self._anchor[3] is None:
            self._anchor = (*self._anchor[:3], top)
        return top

    # -- estimated missed attention ---------------------------------------------------------
    def _forget_missed(self) -> None:
        """Drop the per-slot sums: the next decode step rebuilds them from codes and values."""
        self._missed_sums = None  # (counts [B, n_kv, slots], value sums [B, n_kv, slots, d])
        self._missed_n: int | None = None  # the context length the sums describe
        self._missed_share = None  # the last step's estimated mass [B, n_kv, G]
        self._budget_used = None  # the last step's kept far tokens per query head [B, n_kv, G]
        # reuse_selection: (k, context, pre-RoPE query [B, n_kv, G, d], far indices) of the
        # selection last computed, and whether the last step reused it
        self._anchor: tuple | None = None
        self._reused = False
        self._step_tables = None  # (queries, context, tables) of the step being attended

    def _bucket_of(self, n: int, position: int) -> int:
        """Distance bucket of a far token at `position` when the current token is n - 1."""
        _, lower_edges = self._buckets
        return sum((n - 1) - position >= lo for lo in lower_edges or ())

    def _slot_rows(self, positions: mx.array, buckets, weights: mx.array):
        """Signed per-slot sums of the tokens at `positions` [r] in distance buckets `buckets`."""
        B, n_kv = self.codes.shape[:2]
        pos = mx.broadcast_to(positions.astype(mx.int32), (B, n_kv, positions.shape[0]))
        codes = mx.take(self.codes[..., 0], positions.astype(mx.int32), axis=2)  # [B, n_kv, r]
        rows = att.gather_rows(self.values, pos, self.storage)  # [B, n_kv, r, d]
        slots = att.slots_of(codes, buckets, self.codebook.n_centroids)
        return att.slot_sums(slots, rows, weights, self.n_slots)

    def _sync_missed(self, lay: att.Layout) -> None:
        """Per-slot count and value sum of the far region [n_sinks, window_start) at this step.

        After one appended token only the tokens that changed region or bucket move (the one
        leaving the window, one per bucket edge); anything else (prefill, trim, restore)
        rebuilds the sums from the stored codes and values, so they are never saved.
        """
        n, cfg = lay.n, self.config
        if self._missed_n is not None and self._missed_n == n - 1:
            old = att.layout(n - 1, cfg.window, cfg.sinks, lay.k)
            _, lower_edges = self._buckets
            candidates = {*range(old.window_start, lay.window_start)}
            candidates |= {*range(old.n_sinks, lay.n_sinks)}
            candidates |= {(n - 1) - lo for lo in lower_edges or ()}
            moves: list[tuple[int, int, float]] = []
            for p in sorted(candidates):
                was = self._bucket_of(n - 1, p) if old.n_sinks <= p < old.window_start else None
                now = self._bucket_of(n, p) if lay.n_sinks <= p < lay.window_start else None
                if was != now:
                    moves += [(p, b, w) for b, w in ((was, -1.0), (now, 1.0)) if b is not None]
            if moves:
                pos, buckets, weights = (mx.array(list(col)) for col in zip(*moves, strict=True))
                counts, sums = self._slot_rows(pos, buckets, weights)
                self._missed_sums = (self._missed_sums[0] + counts, self._missed_sums[1] + sums)
        else:
            pos = mx.arange(lay.n_sinks, lay.window_start, dtype=mx.int32)
            _, lower_edges = self._buckets
            buckets = 0
            if lower_edges is not None and lay.n_far:
                buckets = att.bucket_ids(n, lay.n_sinks, lay.window_start, lower_edges)
            self._missed_sums = self._slot_rows(pos, buckets, mx.ones((lay.n_far,), mx.float32))
        self._missed_n = n

    def _missed_estimate(
        self, queries: mx.array, lay: att.Layout, positions: mx.array, repeat: mx.array
    ) -> att.MissedEstimate:
        """What `attention.selected_attention_with_estimate` needs for this step.

        positions / repeat: [B, n_kv, M] as the top-K strategy's `select` returns them.
        """
        self._sync_missed(lay)
        tables = self.slot_scores(queries, lay)  # [B, n_kv, G, slots]
        B, n_kv, G, _ = tables.shape
        M = positions.shape[-1]
        codes = att.gather_rows(self.codes[..., :1], positions, RowStorage())[..., 0]
        _, lower_edges = self._buckets
        slots = codes.astype(mx.int32)
        if lower_edges is not None:
            dist = (lay.n - 1) - positions
            edges = mx.array(lower_edges, dtype=mx.int32)
            bucket = (dist[..., None] >= edges).sum(axis=-1).astype(mx.int32)
            slots = slots + bucket * self.codebook.n_centroids
        index = mx.broadcast_to(slots[:, :, None, :], (B, n_kv, G, M))
        far = (positions >= lay.n_sinks) & (positions < lay.window_start) & ~repeat
        counts, sums = self._missed_sums
        return att.MissedEstimate(
            tables, counts, sums, mx.take_along_axis(tables, index, axis=-1), far
        )

    @property
    def estimate_bytes(self) -> int:
        """Bytes of the per-slot count and value sums (0 when estimate_missed is off)."""
        return sum(a.nbytes for a in self._missed_sums or ())

    # -- telemetry --------------------------------------------------------------------------
    def _after_step(self, lay: att.Layout, positions, repeat, queries, scale: float) -> None:
        step = self._step
        self._step += 1
        if not self.config.telemetry:
            return
        n_kv = self.codes.shape[1]
        if positions is None:
            selected = tuple(np.arange(lay.n, dtype=np.int32) for _ in range(n_kv))
        else:
            pos, rep = np.array(positions[0]), np.array(repeat[0])
            selected = tuple(np.unique(pos[h][~rep[h]]).astype(np.int32) for h in range(n_kv))
        recall = recall_ms = None
        every = self.config.fidelity_every
        if every and positions is not None and step % every == 0:
            start = time.perf_counter()
            recall = self._recall(queries, positions, repeat, scale)
            recall_ms = (time.perf_counter() - start) * 1e3
        self._stats_final = False
        self.last_stats = LayerStats(
            step=step,
            offset=lay.n,
            window_start=lay.window_start,
            sinks=lay.n_sinks,
            selected=selected,
            code_counts=(),
            bytes_held=self.nbytes,
            bytes_fp16=self.fp16_key_bytes + self.fp16_value_bytes,
            exact=positions is None,
            exact_until=self.exact_below,
            layer=self.layer,
            recall=recall,
            recall_ms=recall_ms,
            missed_mass=self._missed_mass(positions),
            budget_used=self._budget_per_head(positions),
            reused=self._reused and positions is not None,
        )

    def _budget_per_head(self, positions) -> tuple[np.ndarray, ...] | None:
        """Per KV head, the far tokens each query head kept (int32 [G], batch row 0) with an
        adaptive budget (`coverage`); None on exact steps or without it."""
        if positions is None or self._budget_used is None:
            return None
        return tuple(np.asarray(self._budget_used[0]).astype(np.int32))

    def _missed_mass(self, positions) -> tuple[float, ...] | None:
        """Per KV head, the estimated share of the softmax mass (mean over the GQA group,
        batch row 0), None on exact steps or with estimate_missed off."""
        if positions is None or self._missed_share is None:
            return None
        return tuple(float(m) for m in np.array(self._missed_share[0].mean(axis=-1)))

    def take_stats(self) -> LayerStats | None:
        """The last step's LayerStats with its codes, for a snapshot (telemetry only).

        A keyframe (full per-head histograms of the tokens cached at that step) when nothing was
        reported since the cache was made, prefilled, trimmed or restored; else the codes
        appended since the previous snapshot (`new_codes`). Computed here, when the snapshot is
        taken, so a step whose stats nobody took (mlx-lm runs one step ahead) loses nothing.
        """
        stats = self.last_stats
        if stats is None or self._stats_final:
            return stats
        first = self.codes[0, :, :, 0]  # [n_kv, capacity]: first subspace, batch 0
        end, since = stats.offset, self._reported
        if since is None or since > end:
            codes = np.array(first[:, :end]).astype(np.int64)  # [n_kv, end]
            n_kv, C = codes.shape[0], self.codebook.n_centroids
            flat = (codes + (np.arange(n_kv) * C)[:, None]).reshape(-1)
            counts = np.bincount(flat, minlength=n_kv * C).reshape(n_kv, C)
            stats = replace(stats, code_counts=tuple(counts))
        else:
            new = np.array(first[:, since:end]).astype(np.uint16)  # [n_kv, end - since]
            stats = replace(stats, new_codes=tuple(new))
        self._reported = end
        self._stats_final = True
        self.last_stats = stats
        return stats

    def _recall(
        self, queries: mx.array, positions: mx.array, repeat: mx.array, scale: float
    ) -> tuple[float, ...]:
        """Shadow exact attention: per KV head, the attention mass on the selection.

        queries post-RoPE [B, n_q, 1, d]; positions / repeat [B, n_kv, M] as `select` returns
        them; scale: the layer's own attention scale (what `attend` received). The mass is
        averaged over the GQA group's query heads and every batch row.
        """
        n, (B, n_q, _, d) = self.offset, queries.shape
        keys = self.storage.dequantize(self.storage.rows(self.keys, n)).astype(mx.float32)
        n_kv, M = keys.shape[1], positions.shape[-1]
        G = n_q // n_kv
        q = queries[:, :, 0, :].astype(mx.float32).reshape(B, n_kv, G, d)
        probs = mx.softmax((q @ keys.swapaxes(-1, -2)) * scale, axis=-1)  # [B, n_kv, G, n]
        index = mx.broadcast_to(positions[:, :, None, :], (B, n_kv, G, M))
        picked = mx.take_along_axis(probs, index, axis=-1) * (~repeat)[:, :, None, :]
        mass = np.array(picked.sum(axis=-1).mean(axis=(0, 2)))  # [n_kv]
        return tuple(float(m) for m in mass)

    def _dequantized(self, stored):
        """Float rows of a stored value (for the evaluation caches in bench/)."""
        return self.storage.dequantize(stored)

    # -- protocol ---------------------------------------------------------------------------
    def size(self) -> int:
        return self.offset

    def empty(self) -> bool:
        return self.codes is None

    def is_trimmable(self) -> bool:
        return True

    def trim(self, n: int) -> int:
        self._unattended = False
        n = min(self.offset, n)
        self.offset -= n
        self._reported = None  # the next snapshot sends full histograms
        self._forget_missed()
        return n

    def make_mask(self, *args, **kwargs):
        return create_attention_mask(*args, offset=self.offset, **kwargs)

    @property
    def state(self):
        if self.codes is None:
            return []
        rows, arrays = self.storage.rows, self.storage.arrays
        k, v = arrays(rows(self.keys, self.offset)), arrays(rows(self.values, self.offset))
        return [*k, *v, self.codes[..., : self.offset, :]]

    @state.setter
    def state(self, arrays) -> None:
        arrays = list(arrays)
        if not hasattr(self, "config"):  # `from_state` of an mlx-lm that sets state first
            self._pending_state = arrays
            return
        if not arrays:
            self.keys = self.values = self.codes = None
            self.offset = 0
            self._reported = None
            self._forget_missed()
            return
        per = self.storage.n_arrays
        if len(arrays) != 2 * per + 1:
            raise ValueError(f"A2ATSCache state has {len(arrays)} arrays, expected {2 * per + 1}")
        self.keys = self.storage.from_arrays(arrays[:per])
        self.values = self.storage.from_arrays(arrays[per : 2 * per])
        self.codes = arrays[-1].astype(mx.uint16)
        self.offset = self.codes.shape[2]
        self._reported = None
        self._forget_missed()

    @property
    def meta_state(self) -> tuple[str, ...]:
        """What rebuilds this cache around `state`, as strings (mlx-lm's convention):
        (layer, config JSON, RoPE spec JSON, max_context, tokens_seen, codebook sha256)."""
        _CODEBOOKS[self.codebook.sha256] = self.codebook  # so `from_state` can find it again
        return (
            str(self.layer),
            json.dumps(self.config.to_dict()),
            json.dumps(self.rope.to_dict()),
            str(self.max_context),
            str(self.tokens_seen),
            self.codebook.sha256,
        )

    @meta_state.setter
    def meta_state(self, values) -> None:
        """Configure the cache from `meta_state` strings; the codebook is the one already set
        (`from_state(..., codebook=)`) or the loaded codebook with the recorded sha256."""
        values = tuple(values)
        if len(values) not in (5, 6):
            raise ValueError(f"A2ATSCache meta_state has {len(values)} entries, expected 6")
        layer, config, rope, max_context, tokens_seen = values[:5]
        codebook = getattr(self, "codebook", None)
        if codebook is None:
            sha = values[5] if len(values) == 6 else None
            codebook = _CODEBOOKS.get(sha) if sha else None
            if codebook is None:
                raise A2ATSError(
                    f"the codebook of this A2ATS cache (sha256 {str(sha)[:16]}) is not loaded; "
                    "load it first or pass it to from_state"
                )
        spec = RopeSpec.from_dict(json.loads(rope))
        cfg = A2ATSConfig.from_dict(json.loads(config))
        self._configure(int(layer), spec, codebook, cfg, int(max_context))
        if not hasattr(self, "codes"):
            self._clear()
        pending = self.__dict__.pop("_pending_state", None)
        if pending is not None:
            self.state = pending
        self.tokens_seen = int(tokens_seen)

    @classmethod
    def from_state(cls, state, meta_state, codebook=None) -> A2ATSCache:
        """Rebuild a cache from `state` and `meta_state` (mlx-lm's `from_state`, plus the
        codebook, which is not a string: given here, or found among loaded codebooks)."""
        obj = cls.__new__(cls)
        obj.codebook = codebook
        obj.meta_state = meta_state
        obj.state = state
        return obj

    # -- byte accounting (what is actually held) --------------------------------------------
    @property
    def compressed_key_bytes(self) -> int:
        """Key storage (full keys for exact attention on the selection) plus the codes."""
        return RowStorage.nbytes(self.keys) + RowStorage.nbytes(self.codes)

    @property
    def compressed_value_bytes(self) -> int:
        return RowStorage.nbytes(self.values)

    def _fp16_bytes(self) -> int:
        if self.codes is None:
            return 0
        B, n_kv = self.codes.shape[:2]
        return B * n_kv * self.offset * self.rope.head_dim * 2

    @property
    def fp16_key_bytes(self) -> int:
        """Bytes an fp16 KVCache would need for the same tokens' keys."""
        return self._fp16_bytes()

    @property
    def fp16_value_bytes(self) -> int:
        return self._fp16_bytes()

    @property
    def storage_bytes(self) -> int:
        """Per-token storage: keys, values (float or kv_bits) and codes."""
        return self.compressed_key_bytes + self.compressed_value_bytes

    @property
    def overhead_bytes(self) -> int:
        """This layer's own fixed extras: the rotation matrices to the retrieval distances
        (`[d, m * d]`, built once) and the missed-attention estimate's per-slot sums
        (`estimate_bytes`). The shared codebook is not here (`model_codebook_bytes`,
        counted once per model). Telemetry keeps no device buffer: only the last step's
        LayerStats on the host (a few KB, handed to the snapshot), which is not counted."""
        return int(self._rotations.nbytes) + self.estimate_bytes

    @property
    def nbytes(self) -> int:
        """Everything this layer holds: storage plus its own extras (codebook excluded)."""
        return self.storage_bytes + self.overhead_bytes

    @property
    def compression_ratio(self) -> float:
        """fp16 full-cache bytes / bytes held (> 1 means savings)."""
        held = self.nbytes
        return (self.fp16_key_bytes + self.fp16_value_bytes) / held if held else 0.0

    @property
    def codebook_bytes(self) -> int:
        """This layer's share of the codebook held in memory (static overhead)."""
        return self.codebook.nbytes // max(self.codebook.num_layers, 1)

    @property
    def assigned_avg_bits(self) -> float:
        """Bits held per cached K/V element (storage + codes), codebook and extras excluded."""
        if self.codes is None or not self.offset:
            return 0.0
        B, n_kv = self.codes.shape[:2]
        elements = 2 * B * n_kv * self.offset * self.rope.head_dim
        return 8.0 * self.storage_bytes * self.offset / (elements * max(self.capacity, 1))

    @property
    def tokens_retrieved(self) -> int:
        """Far tokens selected (union over KV heads), summed over decode steps."""
        return self.top_k.retrieved


# -- model-level helpers ----------------------------------------------------------------------


def make_cache(model: nn.Module, config: A2ATSConfig | None = None, codebook=None) -> list:
    """The model's cache list built from its layer plan, with the attention hook installed.

    An A2ATSCache for every layer the plan (`layer_plan.py`) marks `a2ats`; the model's own
    cache (mlx-lm's `make_prompt_cache` entry: RotatingKVCache, ArraysCache...) everywhere else.
    With `config.layer_budgets` (one multiplier per layer) each A2ATS layer runs its own scaled
    budget (`A2ATSConfig.for_layer`); a length that does not match the model raises ValueError.
    Raises ModelNotSupportedError (one line) for a model the plan refuses.

    `codebook=None` falls back to a random codebook with a loud warning: retrieval is then
    near random (wiring and tests only; calibrate one with `a2ats calibrate`).
    """
    from . import hooks
    from .layer_plan import A2ATS, native_caches, plan_for, rope_spec_of

    plan = plan_for(model).require()
    config = config or A2ATSConfig()
    check_layer_budgets(config, len(plan.layers))
    geo = model_geometry(model)
    if codebook is None:
        from .codebook import Codebook

        warnings.warn(
            "A2ATS: no codebook given, using a RANDOM codebook: retrieval will be near random. "
            "Calibrate one (`a2ats calibrate`) for real use.",
            stacklevel=2,
        )
        codebook = Codebook.random(geo.num_layers, geo.num_kv_heads, geo.head_dim, RANDOM_CENTROIDS)
    else:
        codebook.validate_for(model, config)
    if not hooks.install(model):
        raise ModelNotSupportedError(f"{plan.model_type}: the attention hook patched no module")
    ctx = geo.max_context
    caches = native_caches(model)
    for choice in plan.layers:
        if choice.kind == A2ATS:
            spec = rope_spec_of(model, choice)
            caches[choice.layer] = A2ATSCache(choice.layer, spec, codebook, config, ctx)
    return caches


def check_layer_budgets(config: A2ATSConfig, num_layers: int) -> None:
    """ValueError (one line) when `config.layer_budgets` has not one entry per model layer."""
    budgets = config.layer_budgets
    if budgets is not None and len(budgets) != num_layers:
        raise ValueError(
            f"A2ATSConfig.layer_budgets has {len(budgets)} entries, the model has "
            f"{num_layers} layers: give one multiplier per layer"
        )


def snapshot(caches: list, token_id: int | None = None) -> CacheSnapshot | None:
    """Gather the last step's LayerStats of every A2ATS cache (None when there are none), and
    the bytes the other (native) caches hold (array sizes only: no evaluation, no host sync)."""
    layers = tuple(
        c.take_stats() for c in caches if isinstance(c, A2ATSCache) and c.last_stats is not None
    )
    if not layers:
        return None
    native = sum(_native_nbytes(c) for c in caches if not isinstance(c, A2ATSCache))
    return CacheSnapshot(
        step=layers[0].step,
        layers=layers,
        token_id=token_id,
        native_bytes=native,
        codebook_bytes=model_codebook_bytes(caches),
    )


def attention_steps(caches: list) -> tuple[int, int]:
    """(retrieved, exact): decode steps the A2ATS layers of `caches` have run so far that
    retrieved (top-K over the codes) and that attended exactly (below the crossover, or a context
    too short to retrieve from). Steps are shared by the layers, so each count is the largest any
    layer reports; (0, 0) when there is no A2ATS layer. Plain integers: no sync."""
    own = [c for c in caches if isinstance(c, A2ATSCache)]
    if not own:
        return 0, 0
    return max(c.retrieved_steps for c in own), max(c.exact_steps for c in own)


def model_codebook_bytes(caches: list) -> int:
    """Bytes of the codebook(s) the A2ATS layers use, each counted once: one codebook per
    model, shared by every chat (cache list) of that model (array sizes only, no sync)."""
    books = {id(c.codebook): c.codebook for c in caches if isinstance(c, A2ATSCache)}
    return int(sum(book.nbytes for book in books.values()))


def _native_nbytes(cache: _BaseCache) -> int:
    """Bytes a model's own cache holds (0 for a cache kind that does not report them)."""
    try:
        return int(cache.nbytes)
    except (AttributeError, NotImplementedError):
        return 0
