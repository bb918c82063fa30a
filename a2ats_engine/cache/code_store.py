"""A cache's VQ codes: uint16 [B, n_kv, capacity, S], grown by STEP rows, coded in batches.

Every key that enters an A2ATS cache is coded against the layer's codebook (its pre-RoPE frame).
A prefill's keys are coded at once. A decode step's one key is kept as it came and coded with
the next ones, up to CHUNK of them in one batch, or as soon as anything reads the codes
(`CodeStore.codes`: retrieval, telemetry, the state, the byte counts), so every reader sees
every key coded: coding one key a step was a compiled MLX call a layer, most of what an exact
decode step adds to KVCache's in Python (docs/BENCHMARKS.md, "The exact default's Python").
"""

from __future__ import annotations

import mlx.core as mx

from . import attention as att
from .rope import RopeSpec
from .storage import STEP

CHUNK = 32  # decode keys coded together at most (a window holds more: retrieval never waits)


class CodeStore:
    """The codes of one layer's cache (`A2ATSCache.codes` reads them through `codes`)."""

    def __init__(self, codebook, layer: int, rope: RopeSpec) -> None:
        self.codebook, self.layer, self.rope = codebook, layer, rope
        self.array: mx.array | None = None  # the codes coded so far (rows past them: stale)
        self.pending: list[mx.array] = []  # post-RoPE keys [B, n_kv, 1, d] at start, start + 1..
        self.start = 0

    @property
    def empty(self) -> bool:
        return self.array is None and not self.pending

    def add(self, keys: mx.array, start: int) -> None:
        """Keys [B, n_kv, L, d] post-RoPE at positions [start, start + L): a decode step's one
        key waits for the next ones (CHUNK at most), a prefill's are coded now."""
        if keys.shape[2] == 1:
            if not self.pending:
                self.start = start
            self.pending.append(keys)  # (the next position: the cache's offset; trim flushes)
            if len(self.pending) >= CHUNK:
                self.flush()
            return
        self.flush()
        self._store(key_codes(self.codebook, self.layer, self.rope, keys, start), start)

    def codes(self) -> mx.array | None:
        """Every key's codes (the keys waiting coded first): [B, n_kv, capacity, S] or None."""
        self.flush()
        return self.array

    def set(self, codes: mx.array | None) -> None:
        """Codes given whole (a restored state; None: none)."""
        self.array, self.pending = codes, []

    def flush(self) -> None:
        """Code the keys waiting: one key as a decode step did, several in one batch."""
        if not self.pending:
            return
        waiting, self.pending = self.pending, []
        keys = waiting[0] if len(waiting) == 1 else mx.concatenate(waiting, axis=2)
        self._store(key_codes(self.codebook, self.layer, self.rope, keys, self.start), self.start)

    def _store(self, codes: mx.array, start: int) -> None:
        """codes [B, n_kv, L, S] at [start, start + L), growing by STEP rows."""
        end = start + codes.shape[2]
        if self.array is None or end > self.array.shape[2]:
            B, n_kv, _, S = codes.shape
            size = ((codes.shape[2] + STEP - 1) // STEP) * STEP
            new = mx.zeros((B, n_kv, size, S), mx.uint16)
            self.array = (
                new
                if self.array is None
                else mx.concatenate([self.array[..., :start, :], new], axis=2)
            )
        self.array[..., start:end, :] = codes


def key_codes(codebook, layer: int, rope: RopeSpec, keys: mx.array, offset: int) -> mx.array:
    """Codes [B, n_kv, L, S] of post-RoPE keys [B, n_kv, L, d] at positions offset.. : one key
    through its step's un-rotation matrix (shared by every layer of the step), several
    un-rotated by RoPE."""
    if keys.shape[2] == 1:
        return codebook.assign_rotated(layer, keys, att.step_unrotation(rope, offset))
    return codebook.assign(layer, rope.unrotate(keys.astype(mx.float32), offset))


def checked_codes(codes: mx.array, codebook) -> mx.array:
    """Codes given as a cache's state (a saved session's, or `from_state`'s) -> uint16, each
    checked in [0, the codebook's centroid count): a code past it would pick another subspace's
    or bucket's lookup-table entry, or read past the tables (the C++ step reads them unchecked).
    ValueError names the lowest or highest code out of range (only integer codes are checked
    where the cache has no codebook: `from_state` without one)."""
    if not mx.issubdtype(codes.dtype, mx.integer):
        raise ValueError(f"A2ATSCache state: codes of dtype {codes.dtype}, not integers")
    if codebook is not None and codes.size:
        low, high = (int(x.item()) for x in (codes.min(), codes.max()))
        if low < 0 or high >= codebook.n_centroids:
            bad = low if low < 0 else high
            raise ValueError(
                f"A2ATSCache state: code {bad} outside the codebook's {codebook.n_centroids} "
                "centroids"
            )
    return codes.astype(mx.uint16)
