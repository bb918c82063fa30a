"""Telemetry of one A2ATS layer: what a decode step did, as a `LayerStats` (opt-in).

`record_step` runs after every decode step when `A2ATSConfig.telemetry` is on (host syncs are
allowed here, not on the plain hot path); `take_stats` adds the codes when a snapshot is taken.
"""

from __future__ import annotations

import time
from dataclasses import replace
from typing import TYPE_CHECKING

import mlx.core as mx
import numpy as np

from . import attention as att
from .telemetry import LayerStats

if TYPE_CHECKING:
    from .a2ats_cache import A2ATSCache


def record_step(
    cache: A2ATSCache, lay: att.Layout, positions, repeat, queries: mx.array, scale: float
) -> None:
    """Count the step and, with telemetry, keep its LayerStats in `cache.last_stats`.

    positions / repeat: [B, n_kv, M] of a retrieval step, None for an exact step."""
    step = cache.steps
    cache.steps += 1
    if not cache.config.telemetry:
        return
    n_kv = cache.codes.shape[1]
    if positions is None:
        selected = tuple(np.arange(lay.n, dtype=np.int32) for _ in range(n_kv))
    else:
        pos, rep = np.array(positions[0]), np.array(repeat[0])
        selected = tuple(np.unique(pos[h][~rep[h]]).astype(np.int32) for h in range(n_kv))
    recall = recall_ms = would = None
    every = cache.config.fidelity_every
    if every and positions is not None and step % every == 0:
        start = time.perf_counter()
        recall = attention_recall(cache, queries, positions, repeat, scale)
        recall_ms = (time.perf_counter() - start) * 1e3
    elif positions is None and not lay.exact:
        # an exact step that could have dropped tokens: what retrieval would keep, and its recall
        start = time.perf_counter()
        shadow, shadow_repeat = cache.retrieval.shadow(cache, queries, lay, scale)
        recall = attention_recall(cache, queries, shadow, shadow_repeat, scale)
        would = _far_per_head(shadow, shadow_repeat, lay)
        recall_ms = (time.perf_counter() - start) * 1e3
    retrieval = cache.retrieval
    cache.stats_final = False
    cache.last_stats = LayerStats(
        step=step,
        offset=lay.n,
        window_start=lay.window_start,
        sinks=lay.n_sinks,
        selected=selected,
        code_counts=(),
        bytes_held=cache.nbytes,
        bytes_fp16=2 * fp16_bytes(cache),
        exact=positions is None,
        exact_until=cache.exact_below,
        layer=cache.layer,
        recall=recall,
        recall_ms=recall_ms,
        missed_mass=_missed_mass(retrieval.missed_share, positions),
        budget_used=_budget_per_head(retrieval.budget_used, positions),
        reused=retrieval.reused and positions is not None,
        bytes_on_disk=cache.disk_bytes,
        would_retrieve=would,
    )


def _far_per_head(positions: mx.array, repeat: mx.array, lay: att.Layout) -> tuple:
    """Per KV head (batch row 0), the far positions of a selection: sorted unique int32."""
    pos, rep = np.array(positions[0]), np.array(repeat[0])
    far = (pos >= lay.n_sinks) & (pos < lay.window_start) & ~rep
    return tuple(np.unique(pos[h][far[h]]).astype(np.int32) for h in range(pos.shape[0]))


def fp16_bytes(cache: A2ATSCache) -> int:
    """Bytes an fp16 KVCache would need for the same tokens' keys (the same for values)."""
    if cache.codes is None:
        return 0
    B, n_kv = cache.codes.shape[:2]
    return B * n_kv * cache.offset * cache.rope.head_dim * 2


def _budget_per_head(used, positions) -> tuple[np.ndarray, ...] | None:
    """Per KV head, the far tokens each query head kept (int32 [G], batch row 0) with an
    adaptive budget (`coverage`); None on exact steps or without it."""
    if positions is None or used is None:
        return None
    return tuple(np.asarray(used[0]).astype(np.int32))


def _missed_mass(share, positions) -> tuple[float, ...] | None:
    """Per KV head, the estimated share of the softmax mass (mean over the GQA group,
    batch row 0), None on exact steps or with estimate_missed off."""
    if positions is None or share is None:
        return None
    return tuple(float(m) for m in np.array(share[0].mean(axis=-1)))


def take_stats(cache: A2ATSCache) -> LayerStats | None:
    """The last step's LayerStats with its codes, for a snapshot (telemetry only).

    A keyframe (full per-head histograms of the tokens cached at that step) when nothing was
    reported since the cache was made, prefilled, trimmed or restored; else the codes
    appended since the previous snapshot (`new_codes`). Computed here, when the snapshot is
    taken, so a step whose stats nobody took (mlx-lm runs one step ahead) loses nothing.
    """
    stats = cache.last_stats
    if stats is None or cache.stats_final:
        return stats
    first = cache.codes[0, :, :, 0]  # [n_kv, capacity]: first subspace, batch 0
    end, since = stats.offset, cache.reported
    if since is None or since > end:
        codes = np.array(first[:, :end]).astype(np.int64)  # [n_kv, end]
        n_kv, C = codes.shape[0], cache.codebook.n_centroids
        flat = (codes + (np.arange(n_kv) * C)[:, None]).reshape(-1)
        counts = np.bincount(flat, minlength=n_kv * C).reshape(n_kv, C)
        stats = replace(stats, code_counts=tuple(counts))
    else:
        new = np.array(first[:, since:end]).astype(np.uint16)  # [n_kv, end - since]
        stats = replace(stats, new_codes=tuple(new))
    cache.reported = end
    cache.stats_final = True
    cache.last_stats = stats
    return stats


def attention_recall(
    cache: A2ATSCache, queries: mx.array, positions: mx.array, repeat: mx.array, scale: float
) -> tuple[float, ...]:
    """Shadow exact attention: per KV head, the attention mass on the selection.

    queries post-RoPE [B, n_q, 1, d]; positions / repeat [B, n_kv, M] as `select` returns
    them; scale: the layer's own attention scale (what `attend` received). The mass is
    averaged over the GQA group's query heads and every batch row.
    """
    n, (B, n_q, _, d) = cache.offset, queries.shape
    keys = cache.rows.fetch(n)[0].astype(mx.float32)
    n_kv, M = keys.shape[1], positions.shape[-1]
    G = n_q // n_kv
    q = queries[:, :, 0, :].astype(mx.float32).reshape(B, n_kv, G, d)
    probs = mx.softmax((q @ keys.swapaxes(-1, -2)) * scale, axis=-1)  # [B, n_kv, G, n]
    index = mx.broadcast_to(positions[:, :, None, :], (B, n_kv, G, M))
    picked = mx.take_along_axis(probs, index, axis=-1) * (~repeat)[:, :, None, :]
    mass = np.array(picked.sum(axis=-1).mean(axis=(0, 2)))  # [n_kv]
    return tuple(float(m) for m in mass)
