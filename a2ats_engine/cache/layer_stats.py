"""Telemetry of one A2ATS layer: what a decode step did, as a `LayerStats` (opt-in).

`record_step` runs after every decode step when `A2ATSConfig.telemetry` is on, and keeps only
what the step's stats are made from (no host sync, nothing computed: the step's graph stays
one piece that MLX evaluates while the next is built, as without telemetry). The LayerStats is
made when it is first read (`A2ATSCache.last_stats`, `take_stats` at a snapshot): the attended
positions, the byte counts, and on an exact step that could have dropped tokens the shadow
selection and its recall (through the host step where it runs, `host_step.shadow`). The app
takes its snapshot after each token, when the next step's graph is already queued: on a GPU that
work overlaps the next step; on the CPU (MLX's `async_eval` returns there only when most of a
step is done) it adds to it. `take_stats` adds the codes when a snapshot is taken.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import mlx.core as mx
import numpy as np

from . import attention as att
from .telemetry import LayerStats

if TYPE_CHECKING:
    from .a2ats_cache import A2ATSCache


@dataclass(frozen=True)
class _Step:
    """What `record_step` kept of a decode step: its own arrays and values (the retrieval's
    per-step attributes change at the next step)."""

    step: int
    lay: att.Layout
    positions: Any  # [B, n_kv, M] of a retrieval step, None for an exact step
    repeat: Any
    queries: mx.array
    scale: float
    exact_until: int
    missed_share: Any
    budget_used: Any
    reused: bool
    fidelity: bool  # a retrieval step whose recall is measured (`fidelity_every`)


class StepRecord:
    """A layer's last decode step for its LayerStats: the step kept (`pending`) until the
    stats are first read, then the stats made from it (`stats`); `final`: they carry their
    codes (`take_stats`)."""

    __slots__ = ("pending", "stats", "final")

    def __init__(self) -> None:
        self.pending: _Step | None = None
        self.stats: LayerStats | None = None
        self.final = False


def record_step(
    cache: A2ATSCache, lay: att.Layout, positions, repeat, queries: mx.array, scale: float
) -> None:
    """Count the step and, with telemetry, keep what its LayerStats is made from.

    positions / repeat: [B, n_kv, M] of a retrieval step, None for an exact step."""
    step = cache.steps
    cache.steps += 1
    if not cache.config.telemetry:
        return
    every, retrieval = cache.config.fidelity_every, cache.retrieval
    record = cache.step_record
    record.pending = _Step(
        step=step,
        lay=lay,
        positions=positions,
        repeat=repeat,
        queries=queries,
        scale=scale,
        exact_until=cache.exact_below,
        missed_share=retrieval.missed_share,
        budget_used=retrieval.budget_used,
        reused=retrieval.reused and positions is not None,
        fidelity=bool(every) and positions is not None and step % every == 0,
    )
    record.final = False


def last_stats(cache: A2ATSCache) -> LayerStats | None:
    """The last decode step's LayerStats (None before any, or without telemetry), made from
    the step `record_step` kept the first time it is read."""
    record = cache.step_record
    pending = record.pending
    if pending is not None:
        record.pending = None
        record.stats = _make(cache, pending)
    return record.stats


def _make(cache: A2ATSCache, kept: _Step) -> LayerStats:
    """The LayerStats of the step `kept` (the cache still holds its keys: `trim` makes the
    stats before it drops any)."""
    lay, positions, repeat = kept.lay, kept.positions, kept.repeat
    n_kv = cache.codes.shape[1]
    if positions is None:
        selected = tuple(np.arange(lay.n, dtype=np.int32) for _ in range(n_kv))
    else:
        pos, rep = np.array(positions[0]), np.array(repeat[0])
        selected = tuple(np.unique(pos[h][~rep[h]]).astype(np.int32) for h in range(n_kv))
    recall = recall_ms = would = None
    shadowed = positions is None and not lay.exact  # an exact step that could have dropped some
    if kept.fidelity or shadowed:  # the step's layer computed first: its cost is not recall_ms's
        mx.eval(kept.queries)
    if kept.fidelity:
        start = time.perf_counter()
        recall = attention_recall(cache, kept.queries, positions, repeat, kept.scale, lay.n)
        recall_ms = (time.perf_counter() - start) * 1e3
    elif shadowed:  # what retrieval would keep there, and its recall
        start = time.perf_counter()
        shadow, shadow_repeat, recall = cache.retrieval.shadow(cache, kept.queries, lay, kept.scale)
        if recall is None:
            recall = attention_recall(cache, kept.queries, shadow, shadow_repeat, kept.scale, lay.n)
        would = _far_per_head(shadow, shadow_repeat, lay)
        recall_ms = (time.perf_counter() - start) * 1e3
    return LayerStats(
        step=kept.step,
        offset=lay.n,
        window_start=lay.window_start,
        sinks=lay.n_sinks,
        selected=selected,
        code_counts=(),
        bytes_held=cache.nbytes,
        bytes_fp16=2 * fp16_bytes(cache),
        exact=positions is None,
        exact_until=kept.exact_until,
        layer=cache.layer,
        recall=recall,
        recall_ms=recall_ms,
        missed_mass=_missed_mass(kept.missed_share, positions),
        budget_used=_budget_per_head(kept.budget_used, positions),
        reused=kept.reused,
        bytes_on_disk=cache.disk_bytes,
        would_retrieve=would,
    )


def _far_per_head(positions, repeat, lay: att.Layout) -> tuple:
    """Per KV head (batch row 0), the far positions of a selection (mx or NumPy arrays):
    sorted unique int32."""
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
    stats, record = last_stats(cache), cache.step_record
    if stats is None or record.final:
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
    record.final, record.stats = True, stats
    return stats


def attention_recall(
    cache: A2ATSCache, queries: mx.array, positions, repeat, scale: float, n: int | None = None
) -> tuple[float, ...]:
    """Shadow exact attention: per KV head, the attention mass on the selection.

    queries post-RoPE [B, n_q, 1, d]; positions / repeat [B, n_kv, M] as `select` (mx) or
    the host step (NumPy) returns them; scale: the layer's own attention scale (what `attend`
    received); n: the tokens the step attended over (the cache's offset where None). The mass
    is averaged over the GQA group's query heads and every batch row.
    """
    n, (B, n_q, _, d) = cache.offset if n is None else n, queries.shape
    if isinstance(positions, np.ndarray):  # the host step's
        positions, repeat = mx.array(positions), mx.array(repeat)
    keys = cache.rows.fetch(n)[0].astype(mx.float32)
    n_kv, M = keys.shape[1], positions.shape[-1]
    G = n_q // n_kv
    q = queries[:, :, 0, :].astype(mx.float32).reshape(B, n_kv, G, d)
    probs = mx.softmax((q @ keys.swapaxes(-1, -2)) * scale, axis=-1)  # [B, n_kv, G, n]
    index = mx.broadcast_to(positions[:, :, None, :], (B, n_kv, G, M))
    picked = mx.take_along_axis(probs, index, axis=-1) * (~repeat)[:, :, None, :]
    mass = np.array(picked.sum(axis=-1).mean(axis=(0, 2)))  # [n_kv]
    return tuple(float(m) for m in mass)
