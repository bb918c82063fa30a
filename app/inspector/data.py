"""Qt-free numbers behind the inspector panels: category maps, code-use statistics, memory.

Everything here is plain numpy over `CacheSnapshot` / `LayerStats` records, so it can be tested
without a display and reused by scripts. Shapes: L = layers in the snapshot, W = positions
(the snapshot's offset), H = KV heads.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from a2ats_engine.cache.layer_plan import A2ATS, LayerPlan
from a2ats_engine.cache.telemetry import CacheSnapshot, LayerStats

# Category codes of the retrieval map, ordered by drawing priority: when several positions share
# one screen column, the highest code wins, so a lone retrieved token stays visible.
EMPTY = 0  # beyond the layer's offset
FAR = 1  # far token not retrieved at this step
WINDOW = 2  # exact-RoPE window (or every token of an exact step)
SINK = 3  # leading sink tokens
RETRIEVED = 4  # far token retrieved by the selected head(s)
CURRENT = 5  # the token this step consumed
WOULD = 6  # on an exact step: a far token retrieval would keep there (the shadow selection)
CATEGORY_NAMES = {
    FAR: "far (not retrieved)",
    WINDOW: "exact window",
    SINK: "sinks",
    RETRIEVED: "retrieved",
    CURRENT: "current token",
    WOULD: "would retrieve (exact step)",
}

ALL_HEADS = None  # head selector value meaning "union over the KV heads"


def num_kv_heads(snapshot: CacheSnapshot) -> int:
    """Largest KV head count over the snapshot's layers (0 for an empty snapshot)."""
    return max((len(layer.selected) for layer in snapshot.layers), default=0)


def retrieved_positions(layer: LayerStats, head: int | None = ALL_HEADS) -> np.ndarray:
    """Far positions one KV head retrieved, or the union over heads (head None).

    Returns int64 [n], sorted, unique. A head index beyond the layer's heads gives [0], and so
    does an exact step (nothing was dropped, so nothing was retrieved); `would_positions` gives
    what retrieval would have kept there.
    """
    if layer.exact:
        return np.zeros(0, dtype=np.int64)
    return _per_head(layer.retrieved, len(layer.selected), head)


def would_positions(layer: LayerStats, head: int | None = ALL_HEADS) -> np.ndarray:
    """On an exact step with a shadow selection: the far positions retrieval would keep (one KV
    head, or the union); int64 [n] sorted unique, [0] otherwise."""
    if not layer.exact or not layer.would_retrieve:
        return np.zeros(0, dtype=np.int64)
    return _per_head(layer.would_retrieve, len(layer.would_retrieve), head)


def _per_head(parts: tuple, n_heads: int, head: int | None) -> np.ndarray:
    if head is None:
        if not parts:
            return np.zeros(0, dtype=np.int64)
        return np.unique(np.concatenate(parts).astype(np.int64, copy=False))
    if head >= n_heads:
        return np.zeros(0, dtype=np.int64)
    return np.asarray(parts[head], dtype=np.int64)


def category_row(layer: LayerStats, width: int, head: int | None = ALL_HEADS) -> np.ndarray:
    """One map row: uint8 [width] of category codes for positions 0..width-1 of this layer."""
    row = np.full(width, EMPTY, dtype=np.uint8)
    end = min(layer.offset, width)
    if end <= 0:
        return row
    row[:end] = FAR
    window_start = max(0, min(layer.window_start, end))
    if layer.exact:
        row[:end] = WINDOW  # nothing was dropped: every token took part exactly
        would = would_positions(layer, head)
        row[would[would < end]] = WOULD
    else:
        row[window_start:end] = WINDOW
        picked = retrieved_positions(layer, head)
        row[picked[picked < end]] = RETRIEVED
    row[: min(layer.sinks, end)] = SINK
    row[end - 1] = CURRENT
    return row


def category_image(snapshot: CacheSnapshot, head: int | None = ALL_HEADS) -> np.ndarray:
    """The retrieval map of one step: uint8 [L, W] (W = the largest layer offset)."""
    width = max((layer.offset for layer in snapshot.layers), default=0)
    image = np.zeros((len(snapshot.layers), width), dtype=np.uint8)
    for i, layer in enumerate(snapshot.layers):
        image[i] = category_row(layer, width, head)
    return image


def max_pool_columns(image: np.ndarray, factor: int) -> np.ndarray:
    """Max over groups of `factor` adjacent columns: [L, W] -> [L, ceil(W / factor)].

    Used to draw wide maps at screen resolution without losing sparse columns.
    """
    if factor <= 1 or image.shape[1] == 0:
        return image
    rows, width = image.shape
    padded_width = -(-width // factor) * factor
    if padded_width != width:
        pad = np.zeros((rows, padded_width - width), dtype=image.dtype)
        image = np.concatenate([image, pad], axis=1)
    return image.reshape(rows, padded_width // factor, factor).max(axis=2)


def highlight_positions(
    snapshot: CacheSnapshot, layer_index: int | None, head: int | None = ALL_HEADS
) -> list[int]:
    """Retrieved positions for the transcript: one layer (row index) or all layers (None)."""
    if layer_index is not None:
        if not 0 <= layer_index < len(snapshot.layers):
            return []
        return retrieved_positions(snapshot.layers[layer_index], head).tolist()
    parts = [retrieved_positions(layer, head) for layer in snapshot.layers]
    if not parts:
        return []
    return np.unique(np.concatenate(parts)).tolist()


def heads_retrieving(layer: LayerStats, position: int) -> list[int]:
    """KV heads of a layer whose retrieved set contains `position`."""
    heads = []
    for h, positions in enumerate(layer.retrieved):
        i = np.searchsorted(positions, position)
        if i < len(positions) and positions[i] == position:
            heads.append(h)
    return heads


def category_at(layer: LayerStats, position: int, head: int | None = ALL_HEADS) -> int:
    """Category code of one position of one layer (same rules as `category_row`)."""
    if position < 0 or position >= layer.offset:
        return EMPTY
    if position == layer.offset - 1:
        return CURRENT
    if position < layer.sinks:
        return SINK
    if position >= layer.window_start:
        return WINDOW
    if layer.exact:
        would = would_positions(layer, head)
        return WOULD if np.isin(position, would) else WINDOW
    heads = heads_retrieving(layer, position)
    hit = bool(heads) if head is None else head in heads
    return RETRIEVED if hit else FAR


@dataclass(frozen=True)
class CodeStats:
    """Summary of one code histogram.

    entropy_bits: Shannon entropy of code use; max_bits: log2(n_codes); dead: codes never used;
    top_share: fraction of tokens on the most used code; tokens: histogram total.
    """

    entropy_bits: float
    max_bits: float
    dead: int
    n_codes: int
    top_share: float
    tokens: int

    @property
    def used(self) -> int:
        return self.n_codes - self.dead


def code_stats(counts: np.ndarray) -> CodeStats:
    """Entropy, dead codes and top-code share of one histogram int [n_codes]."""
    counts = np.asarray(counts, dtype=np.float64)
    total = float(counts.sum())
    n_codes = int(counts.size)
    dead = int(np.count_nonzero(counts == 0))
    max_bits = float(np.log2(n_codes)) if n_codes > 0 else 0.0
    if total <= 0:
        return CodeStats(0.0, max_bits, dead, n_codes, 0.0, 0)
    p = counts[counts > 0] / total
    entropy = float(-(p * np.log2(p)).sum())
    return CodeStats(entropy, max_bits, dead, n_codes, float(counts.max() / total), int(total))


def mean_code_stats(stats: list[CodeStats]) -> CodeStats:
    """Mean of per-head statistics (heads have their own codebooks, so counts are not pooled)."""
    if not stats:
        return CodeStats(0.0, 0.0, 0, 0, 0.0, 0)
    return CodeStats(
        entropy_bits=float(np.mean([s.entropy_bits for s in stats])),
        max_bits=float(np.mean([s.max_bits for s in stats])),
        dead=round(float(np.mean([s.dead for s in stats]))),
        n_codes=round(float(np.mean([s.n_codes for s in stats]))),
        top_share=float(np.mean([s.top_share for s in stats])),
        tokens=round(float(np.mean([s.tokens for s in stats]))),
    )


def layer_code_stats(layer: LayerStats, head: int | None = ALL_HEADS) -> CodeStats:
    """One layer's code statistics for one KV head, or the mean over heads (head None)."""
    if head is not None:
        if head >= len(layer.code_counts):
            return CodeStats(0.0, 0.0, 0, 0, 0.0, 0)
        return code_stats(layer.code_counts[head])
    return mean_code_stats([code_stats(c) for c in layer.code_counts])


def snapshot_code_stats(snapshot: CacheSnapshot, head: int | None = ALL_HEADS) -> list[CodeStats]:
    """`layer_code_stats` of every layer in one vectorised pass (same results)."""
    layers = snapshot.layers
    shapes = {c.size for layer in layers for c in layer.code_counts}
    heads = {len(layer.code_counts) for layer in layers}
    if len(shapes) != 1 or len(heads) != 1 or (head is not None and head >= heads.pop()):
        return [layer_code_stats(layer, head) for layer in layers]
    if head is None:
        counts = np.stack([np.stack(layer.code_counts) for layer in layers]).astype(np.float64)
    else:
        counts = np.stack([layer.code_counts[head] for layer in layers])[:, None].astype(np.float64)
    n_codes = counts.shape[-1]
    total = counts.sum(axis=-1)  # [L, H]
    safe = np.where(total > 0, total, 1.0)
    # H = log2(T) - sum(c log2 c) / T; zero counts contribute 0 (0 * log2(1))
    c_log_c = (counts * np.log2(np.maximum(counts, 1.0))).sum(axis=-1)
    entropy = np.where(total > 0, np.log2(safe) - c_log_c / safe, 0.0)
    dead = (counts == 0).sum(axis=-1).astype(np.float64)
    top = np.where(total > 0, counts.max(axis=-1) / safe, 0.0)
    max_bits = float(np.log2(n_codes)) if n_codes > 0 else 0.0
    # heads have their own codebooks: average the per-head figures, never pool the counts
    entropy, dead, top, total = (a.mean(axis=1) for a in (entropy, dead, top, total))
    return [
        CodeStats(float(e), max_bits, round(float(d)), n_codes, float(t), round(float(n)))
        for e, d, t, n in zip(entropy, dead, top, total, strict=True)
    ]


def sorted_counts(counts: np.ndarray) -> np.ndarray:
    """Histogram sorted by use, most used code first: int64 [n_codes]."""
    return np.sort(np.asarray(counts, dtype=np.int64))[::-1]


@dataclass(frozen=True)
class MemorySummary:
    """Bytes of one step: per A2ATS layer held / fp16 [L], totals, ratio and bytes saved.

    native: bytes the native layers (the model's own caches) hold; the totals count them on both
    sides, since those layers hold the same with or without A2ATS.
    codebook: the model's codebook, held once per model and shared by all chats of that model;
    counted in the held total only (an fp16 cache needs none)."""

    held: np.ndarray
    fp16: np.ndarray
    native: int = 0
    codebook: int = 0
    on_disk: int = 0  # K/V rows in the A2ATS cold tier's files (not in memory)
    process: int | None = None  # the process's measured private memory, if the OS gives it

    @property
    def total_held(self) -> int:
        return int(self.held.sum()) + self.native + self.codebook

    @property
    def total_fp16(self) -> int:
        return int(self.fp16.sum()) + self.native

    @property
    def ratio(self) -> float:
        """fp16 bytes / held bytes (how many times smaller the cache is); 0 when empty."""
        return self.total_fp16 / self.total_held if self.total_held > 0 else 0.0

    @property
    def saved(self) -> int:
        return self.total_fp16 - self.total_held


def memory_summary(snapshot: CacheSnapshot) -> MemorySummary:
    """Per-layer bytes held and fp16 bytes of one snapshot."""
    held = np.array([layer.bytes_held for layer in snapshot.layers], dtype=np.int64)
    fp16 = np.array([layer.bytes_fp16 for layer in snapshot.layers], dtype=np.int64)
    return MemorySummary(
        held,
        fp16,
        int(snapshot.native_bytes),
        int(snapshot.codebook_bytes),
        int(snapshot.bytes_on_disk),
        snapshot.process_bytes,
    )


# ----- the layer plan in the map ------------------------------------------------------------


@dataclass(frozen=True)
class MapRow:
    """One row of the retrieval map: a cache slot of the model.

    layer: the model's layer (cache slot) index. stats: index into `snapshot.layers` for an
    A2ATS layer with stats this step, else None. native: why the layer keeps the model's own
    cache ("" for an A2ATS layer); such a row is never drawn with A2ATS categories.
    """

    layer: int
    stats: int | None
    native: str = ""


def map_rows(snapshot: CacheSnapshot, plan: LayerPlan | None) -> list[MapRow]:
    """The map's rows: every slot of `plan` in layer order (native ones included), or one row
    per snapshot layer when there is no plan or the snapshot reports a layer the plan does not
    mark A2ATS (then nothing is known about the other layers, and nothing is drawn for them)."""
    stats = {layer.layer: i for i, layer in enumerate(snapshot.layers)}
    identity = [MapRow(layer.layer, i) for i, layer in enumerate(snapshot.layers)]
    if plan is None or plan.refused:
        return identity
    a2ats = {choice.layer for choice in plan.layers if choice.kind == A2ATS}
    if not set(stats) <= a2ats:
        return identity
    return [
        MapRow(c.layer, stats.get(c.layer)) if c.kind == A2ATS else MapRow(c.layer, None, c.reason)
        for c in plan.layers
    ]


def expand_rows(image: np.ndarray, rows: list[MapRow]) -> np.ndarray:
    """[L, W] image over the snapshot's layers -> [R, W] over `rows`; native rows and A2ATS
    layers without stats are 0 (drawn as "not A2ATS" by the map's overlay, never as far)."""
    out = np.zeros((len(rows), image.shape[1]), dtype=image.dtype)
    for r, row in enumerate(rows):
        if row.stats is not None and row.stats < image.shape[0]:
            out[r] = image[row.stats]
    return out


def sliding_window(reason: str) -> int | None:
    """The window of a "sliding window N" native layer, else None."""
    match = re.fullmatch(r"sliding window (\d+)", reason)
    return int(match.group(1)) if match else None


def native_runs(rows: list[MapRow]) -> list[tuple[int, int, str]]:
    """(first row, row count, reason) of each run of adjacent native rows sharing a reason."""
    runs: list[tuple[int, int, str]] = []
    for r, row in enumerate(rows):
        if not row.native:
            continue
        if runs and runs[-1][2] == row.native and runs[-1][0] + runs[-1][1] == r:
            first, count, reason = runs[-1]
            runs[-1] = (first, count + 1, reason)
        else:
            runs.append((r, 1, row.native))
    return runs


def recall_value(layer: LayerStats, head: int | None = ALL_HEADS) -> float:
    """Recall of one layer: one head's, or the mean over heads; NaN when not measured."""
    if not layer.recall:
        return float("nan")
    if head is None:
        return float(np.mean(layer.recall))
    return float(layer.recall[head]) if head < len(layer.recall) else float("nan")


def recall_column(snapshot: CacheSnapshot, head: int | None = ALL_HEADS) -> np.ndarray:
    """One step of the fidelity strip: float32 [L], NaN for layers without a measurement."""
    return np.array([recall_value(layer, head) for layer in snapshot.layers], dtype=np.float32)


def recall_matrix(snapshots: list[CacheSnapshot], head: int | None = ALL_HEADS) -> np.ndarray:
    """Fidelity strip: float32 [L, n_steps], NaN where a step has no recall measurement."""
    rows = max((len(s.layers) for s in snapshots), default=0)
    out = np.full((rows, len(snapshots)), np.nan, dtype=np.float32)
    for j, snap in enumerate(snapshots):
        column = recall_column(snap, head)
        out[: column.size, j] = column
    return out


def has_recall(snapshot: CacheSnapshot) -> bool:
    return any(layer.recall for layer in snapshot.layers)


# ---- estimated missed mass, adaptive budget, exact crossover ------------------------------------
def missed_value(layer: LayerStats, head: int | None = ALL_HEADS) -> float:
    """Estimated missed mass of one layer (`estimate_missed`): one KV head's share of the
    softmax given to the not-retrieved far tokens, or the mean over heads; NaN when absent
    (exact step, or the estimate is off)."""
    if not layer.missed_mass:
        return float("nan")
    if head is None:
        return float(np.mean(layer.missed_mass))
    return float(layer.missed_mass[head]) if head < len(layer.missed_mass) else float("nan")


def missed_column(snapshot: CacheSnapshot, head: int | None = ALL_HEADS) -> np.ndarray:
    """Estimated missed mass per layer of one step: float32 [L], NaN where absent."""
    return np.array([missed_value(layer, head) for layer in snapshot.layers], dtype=np.float32)


def measured_missed_column(snapshot: CacheSnapshot, head: int | None = ALL_HEADS) -> np.ndarray:
    """Measured missed mass per layer (1 - recall of the fidelity pass): float32 [L], NaN
    where the step was not measured. Same scale as `missed_column`, so the two compare."""
    return (1.0 - recall_column(snapshot, head)).astype(np.float32)


def has_missed(snapshot: CacheSnapshot) -> bool:
    return any(layer.missed_mass for layer in snapshot.layers)


@dataclass(frozen=True)
class MissedHistory:
    """Missed mass over steps, mean over the layers that report it.

    steps:     int64 [n] decode step numbers.
    estimate:  float32 [n] estimated missed mass (NaN: no estimate at that step).
    measured:  float32 [n] 1 - recall of the fidelity pass (NaN: not measured).
    """

    steps: np.ndarray
    estimate: np.ndarray
    measured: np.ndarray


def _nanmean(values: np.ndarray) -> float:
    finite = values[np.isfinite(values)]
    return float(finite.mean()) if finite.size else float("nan")


def missed_history(snapshots: list[CacheSnapshot], head: int | None = ALL_HEADS) -> MissedHistory:
    """Estimated and measured missed mass of each snapshot (mean over layers; where some layers
    run the estimate and others not, the measured mean is over the same layers as the
    estimate's, so the two compare)."""
    return MissedHistory(
        steps=np.array([s.step for s in snapshots], dtype=np.int64),
        estimate=np.array([_nanmean(missed_column(s, head)) for s in snapshots], np.float32),
        measured=np.array([_measured_mean(s, head) for s in snapshots], np.float32),
    )


def _measured_mean(snapshot: CacheSnapshot, head: int | None) -> float:
    measured, estimate = measured_missed_column(snapshot, head), missed_column(snapshot, head)
    if np.isfinite(estimate).any():  # the layers that run the estimate (`estimate_layers`)
        measured = np.where(np.isfinite(estimate), measured, np.nan)
    return _nanmean(measured)


def budget_matrix(snapshot: CacheSnapshot) -> np.ndarray:
    """Adaptive budget used: float32 [L, H], per layer and KV head the far tokens kept, mean
    over the GQA group's query heads; NaN where a layer has no record (fixed budget, exact)."""
    heads = num_kv_heads(snapshot)
    out = np.full((len(snapshot.layers), heads), np.nan, dtype=np.float32)
    for i, layer in enumerate(snapshot.layers):
        for h, kept in enumerate(layer.budget_used or ()):
            out[i, h] = float(np.mean(kept)) if np.size(kept) else np.nan
    return out


def has_adaptive_budget(snapshot: CacheSnapshot) -> bool:
    return any(layer.budget_used for layer in snapshot.layers)


def exact_until(snapshot: CacheSnapshot) -> int | None:
    """N when every layer attended exactly because the context is below the cache's
    `exact_below` crossover (the step's offset < N); None otherwise."""
    layers = snapshot.layers
    if not layers or not all(layer.exact for layer in layers):
        return None
    until = max(layer.exact_until for layer in layers)
    return until if snapshot.offset < until else None


def would_keep_share(snapshot: CacheSnapshot) -> float | None:
    """Mean over layers (and KV heads) of the attention mass the shadow selection would keep
    on an exact step; None when the step has no shadow selection."""
    values = [np.mean(layer.recall) for layer in snapshot.layers if layer.would_retrieve]
    return float(np.mean(values)) if values else None


def attention_mode_text(snapshot: CacheSnapshot | None) -> str:
    """How the step attended, plainly: "exact until N tokens" below the crossover, "exact
    attention (nothing to drop yet)" on other exact steps, "A2ATS retrieving" otherwise, ""
    without A2ATS layers. Never names A2ATS over exact attention without saying it is exact."""
    if snapshot is None or not snapshot.layers:
        return ""
    until = exact_until(snapshot)
    if until is not None:
        keep = would_keep_share(snapshot)
        if keep is not None:
            return f"exact until {until:,} tokens \u00b7 retrieval now would keep {100 * keep:.0f}% of attention"
        return f"exact until {until:,} tokens"
    if all(layer.exact for layer in snapshot.layers):
        return "exact attention (nothing to drop yet)"
    return "A2ATS retrieving"
