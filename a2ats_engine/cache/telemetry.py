"""Frozen records the engine hands out: per-layer cache stats, snapshots, generation events.

Everything here holds numpy arrays or plain Python values (never mx.array), so a record can be
passed to another thread (the GUI) safely. Arrays are copies owned by the record.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass(frozen=True)
class LayerStats:
    """One layer's cache state after one decode step (batch element 0).

    step:          decode step index within the cache's life (0 = first decode token).
    offset:        tokens in the cache after the step (the current token is at offset - 1).
    window_start:  first position of the exact-RoPE window (positions >= it are exact).
    sinks:         number of leading sink tokens always attended.
    selected:      one int32 array per KV head of every attended position (sinks, retrieved
                   far tokens, window), sorted ascending. Empty-free: exact steps list all.
    code_counts:   a keyframe: one int64 histogram per KV head of code use over all cached
                   tokens (length n_centroids; for product VQ, the first subspace). Sent on the
                   first snapshot after the cache was made, prefilled, trimmed or restored;
                   () on the other steps, which send `new_codes` instead.
    bytes_held:    bytes this layer's cache holds in process memory (resident K/V + codes +
                   its own extras); with the cold tier the far K/V rows are not here.
    bytes_on_disk: bytes of this layer's K/V rows in the cold tier's file (0 when resident).
    would_retrieve: on an exact step that could have dropped tokens (below the crossover), the
                   shadow selection: per KV head the far positions retrieval would keep (sorted
                   int32); `recall` is then that selection's share of the step's exact
                   attention mass and `recall_ms` what computing both cost. None otherwise.
    bytes_fp16:    bytes an fp16 full K/V cache of the same length would hold.
    exact:         True when exact attention was used: nothing could be dropped, or the
                   context was below the cache's `exact_below` crossover.
    budget_used:   with an adaptive budget (`coverage`), per KV head the far tokens each query
                   head of its GQA group kept (int32 [G], batch row 0); None otherwise.
    reused:        with `reuse_selection`, True when the step reused an earlier step's far
                   selection (the query had barely moved) instead of selecting afresh.
    exact_until:   the cache's exact_below: decode steps attend exactly until the context
                   reaches this many tokens (0: retrieval whenever something can be dropped).
    layer:         layer index in the model.
    recall:        optional per-KV-head attention mass recalled vs exact attention (fidelity
                   shadow pass with the layer's own attention scale; mean over the group's
                   query heads and every batch row), else None.
    recall_ms:     wall time of that shadow pass in milliseconds (its cost), else None.
    new_codes:     None for a keyframe (code_counts holds the histograms); else one uint16
                   array per KV head of the codes appended since this layer's previous snapshot
                   (usually one token): histograms = previous histograms + these codes. The
                   inspector's ring (app/inspector/snapshot_ring.py) accumulates them.
    missed_mass:   with estimate_missed, per KV head the share of the softmax mass the step
                   gave to the estimate of the far tokens it did not retrieve (mean over the
                   GQA group's query heads, batch row 0); None on exact steps or when off.
    """

    step: int
    offset: int
    window_start: int
    sinks: int
    selected: tuple[np.ndarray, ...]
    code_counts: tuple[np.ndarray, ...]
    bytes_held: int
    bytes_fp16: int
    exact: bool = False
    layer: int = 0
    recall: tuple[float, ...] | None = None
    recall_ms: float | None = None
    new_codes: tuple[np.ndarray, ...] | None = None
    missed_mass: tuple[float, ...] | None = None
    exact_until: int = 0
    budget_used: tuple[np.ndarray, ...] | None = None
    reused: bool = False
    bytes_on_disk: int = 0
    would_retrieve: tuple[np.ndarray, ...] | None = None

    @property
    def retrieved(self) -> tuple[np.ndarray, ...]:
        """Per KV head: the selected positions that are far tokens (not sinks, not window)."""
        return tuple(s[(s >= self.sinks) & (s < self.window_start)] for s in self.selected)


@dataclass(frozen=True)
class CacheSnapshot:
    """All A2ATS layers' stats after one decode step. `token_id` is the token that step
    consumed. `native_bytes`: bytes held by the layers that keep the model's own cache (the
    layer plan's `native` layers: sliding windows, SSM state...), which have no LayerStats.
    `codebook_bytes`: the model's codebook (centroids, Cholesky factors, assignment matrices),
    held once per model and shared by all chats of that model; a layer's `bytes_held` already
    counts its storage and its own extras (rotation matrices). `process_bytes`: the whole
    process's private resident memory when the snapshot was taken (`process_memory.py`:
    measured, not computed; None where the platform gives no figure)."""

    step: int
    layers: tuple[LayerStats, ...]
    token_id: int | None = None
    native_bytes: int = 0
    codebook_bytes: int = 0
    process_bytes: int | None = None  # measured private memory of the process (RssAnon...)

    @property
    def offset(self) -> int:
        return self.layers[0].offset if self.layers else 0

    @property
    def bytes_held(self) -> int:
        return sum(layer.bytes_held for layer in self.layers)

    @property
    def bytes_fp16(self) -> int:
        return sum(layer.bytes_fp16 for layer in self.layers)

    @property
    def bytes_on_disk(self) -> int:
        """Bytes of K/V rows the A2ATS layers keep in the cold tier's files."""
        return sum(layer.bytes_on_disk for layer in self.layers)

    @property
    def bytes_total(self) -> int:
        """Everything held for this model: A2ATS layers, native layers and the codebook."""
        return self.bytes_held + self.native_bytes + self.codebook_bytes


@dataclass(frozen=True)
class TokenEvent:
    """One streamed piece of a reply. `text` may be empty while a multi-byte char completes."""

    text: str
    token_id: int
    index: int


@dataclass(frozen=True)
class GenerationStats:
    """Final figures of one reply."""

    prompt_tokens: int
    generation_tokens: int
    time_to_first_token: float
    prompt_tps: float
    generation_tps: float
    peak_memory_gb: float
    stop_reason: str  # "stop" (EOS), "length" (max tokens), "cancelled", "error"
    cache_bytes: int = 0  # this chat's caches in memory (A2ATS layers with extras, native)
    cache_disk_bytes: int = 0  # K/V rows of this chat in the A2ATS cold tier's files
    codebook_bytes: int = 0  # the model's codebook, shared by all chats of that model
    context_tokens: int = 0
    extra: dict = field(default_factory=dict)

    def line(self) -> str:
        """`[12 prompt tokens, 30 generated, TTFT 0.21 s, 11.8 tok/s, peak 0.4 GB, stop]` (with
        the K/V bytes in memory and on disk when the cold tier holds some)."""
        disk = self.cache_disk_bytes
        kv = (
            f"K/V {self.cache_bytes / 2**20:.1f} MiB in memory, {disk / 2**20:.1f} MiB on disk, "
            if disk
            else ""
        )
        return (
            f"[{self.prompt_tokens} prompt tokens, {self.generation_tokens} generated, "
            f"TTFT {self.time_to_first_token:.2f} s, {self.generation_tps:.1f} tok/s, "
            f"{kv}peak {self.peak_memory_gb:.2f} GB, {self.stop_reason}]"
        )
