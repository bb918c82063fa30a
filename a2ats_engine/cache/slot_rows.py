"""The host step's per-slot sums of the missed-attention estimate, one row per occupied slot.

A slot is a (distance bucket, code) pair: 4 x 512 = 2,048 of them per KV head with the demo's
codebook, each summing its far tokens' values (and, with slots scored by their own keys, their
keys): float32 rows of d (2 d) numbers. Held densely that is 1 MiB per KV head and layer, read
twice a step (the slots' scores, then their values), though only a fifth (2K context) to two
fifths (8K) of the slots hold a token: a bucket holds the codes of its own tokens only. So
`SlotRows` gives a slot a row the first time a token enters it, per (batch, KV head), and the
step reads the rows in use (the most any KV head uses). A slot left empty keeps its row at count
0, which the estimate skips like any empty slot; a rebuild (prefill, trim, restore) starts from
the occupied slots again. Each far position also keeps the row of its slot (`at`), set when its
token enters the row (`place`): the step reads its retrieved tokens' rows from there, one take,
instead of coding their slots again. Plain NumPy arrays, moved in place by the host step
(`host_step.missed_sums`).
"""

from __future__ import annotations

import numpy as np


class SlotRows:
    """Counts [B, n_kv, R], value sums [B, n_kv, R, d] and key sums (or None) of the occupied
    slots, each (batch, KV head)'s map slot -> row (-1: none yet) and row -> slot, and the row
    of each far position's slot (`row_at` [B, n_kv, positions])."""

    FEW = 512  # `add` of up to this many tokens checks for distinct rows (a step's moves)

    def __init__(self, batch: int, n_kv: int, n_slots: int, d: int, with_keys: bool) -> None:
        self.n_slots, self.d, self.with_keys = n_slots, d, with_keys
        self.row_of = np.full((batch, n_kv, n_slots), -1, np.int32)
        self.used = np.zeros((batch, n_kv), np.int64)  # rows given out per (batch, KV head)
        self.row_at = np.zeros((batch, n_kv, 0), np.int32)  # the row of each position's slot
        self._bases: dict[int, np.ndarray] = {}
        self._alloc(16)

    def _base(self, stride: int) -> np.ndarray:
        """Each (batch, KV head)'s start in a flat array of `stride` entries per head
        (int64 [B, n_kv, 1], made once per stride: every step's flat indices start from it)."""
        base = self._bases.get(stride)
        if base is None:
            B, n_kv = self.used.shape
            base = np.arange(0, B * n_kv * stride, stride, dtype=np.int64).reshape(B, n_kv, 1)
            self._bases[stride] = base
        return base

    def _alloc(self, capacity: int) -> None:
        """(Re)size the row arrays to `capacity` rows, keeping the rows in use."""
        B, n_kv = self.used.shape
        old = getattr(self, "counts", None)
        counts = np.zeros((B, n_kv, capacity), np.float32)
        slot_of = np.zeros((B, n_kv, capacity), np.int32)
        values = np.zeros((B, n_kv, capacity, self.d), np.float32)
        keys = np.zeros_like(values) if self.with_keys else None
        if old is not None:
            r = old.shape[-1]
            counts[..., :r], slot_of[..., :r] = old, self.slot_of
            values[..., :r, :] = self.values
            if keys is not None:
                keys[..., :r, :] = self.keys
        self.counts, self.slot_of, self.values, self.keys = counts, slot_of, values, keys

    @property
    def rows_used(self) -> int:
        """The rows a step reads: the most any (batch, KV head) has given out."""
        return int(self.used.max(initial=0))

    @property
    def nbytes(self) -> int:
        held = (self.row_of, self.row_at, self.counts, self.slot_of, self.values, self.keys)
        return sum(a.nbytes for a in held if a is not None)

    def lookup(self, slots: np.ndarray) -> np.ndarray:
        """The rows of `slots` [B, n_kv, m] -> int64 [B, n_kv, m], 0 for a slot without one
        (a sink's or the window's slot, which the estimate masks out)."""
        rows = np.take(self.row_of.reshape(-1), (self._base(self.n_slots) + slots).reshape(-1))
        rows = rows.astype(np.int64)
        return np.maximum(rows, 0).reshape(slots.shape)

    def place(self, positions: np.ndarray, rows: np.ndarray) -> None:
        """Record `rows` [B, n_kv, m] (what `add` returned) as the rows of the tokens at
        `positions` [m] (int), growing `row_at` to hold them; a position placed again (a token
        moving to a farther bucket) takes its new row."""
        if not positions.size:
            return
        top, held = int(positions.max()) + 1, self.row_at.shape[-1]
        if top > held:
            grown = np.zeros((*self.used.shape, max(top, 2 * held)), np.int32)
            grown[..., :held] = self.row_at
            self.row_at = grown
        self.row_at[:, :, positions] = rows

    def at(self, positions: np.ndarray) -> np.ndarray:
        """The rows of the far tokens at `positions` [B, n_kv, m] (placed ones; any strides)
        -> int64 [B, n_kv, m], one flat take."""
        flat = (positions + self._base(self.row_at.shape[-1])).reshape(-1)
        return np.take(self.row_at.reshape(-1), flat).astype(np.int64).reshape(positions.shape)

    def rows(self, slots: np.ndarray) -> np.ndarray:
        """The rows of `slots` [B, n_kv, m] (int), giving a row to each slot that has none
        (in first-seen order per (batch, KV head)) -> int64 [B, n_kv, m]. Every (batch, KV
        head) at once: a step's moves reach a new slot in about a third of the layers."""
        B, n_kv, m = slots.shape
        keys = (self._base(self.n_slots) + slots).reshape(-1)  # (batch, KV head, slot), flat
        held = np.take(self.row_of.reshape(-1), keys)
        new = held < 0
        if not new.any():  # a step's moves: every slot has its row already
            return held.reshape(B, n_kv, m).astype(np.int64)
        fresh, first = np.unique(keys[new], return_index=True)
        fresh = fresh[np.argsort(first, kind="stable")]  # first-seen order, heads in order
        head = fresh // self.n_slots  # the flat (batch, KV head) of each new slot
        per_head = np.bincount(head, minlength=B * n_kv)
        starts = np.cumsum(per_head) - per_head  # where each head's new slots begin in `fresh`
        used = self.used.reshape(-1)
        row = used[head] + (np.arange(fresh.size) - starts[head])
        if int(row.max()) + 1 >= self.counts.shape[-1]:  # one row past the last kept empty
            self._alloc(max(2 * self.counts.shape[-1], int(row.max()) + 2))
        self.row_of.reshape(-1)[fresh] = row
        self.slot_of.reshape(-1)[head * self.counts.shape[-1] + row] = fresh % self.n_slots
        used += per_head
        return self.lookup(slots)

    def add(
        self, slots: np.ndarray, weights, values: np.ndarray, keys: np.ndarray | None
    ) -> np.ndarray:
        """Add `weights` (one per token: [m] or [B, n_kv, m]) times each token's count, value
        [B, n_kv, m, d] and key to the row of its slot [B, n_kv, m]: by one buffered add where
        every token has its own row (a step's few moves, checked), else by one sorted sum per
        row (a rebuild, or two moves into one row), never a scatter per token. Returns the
        tokens' rows (int64 [B, n_kv, m]) for `place`."""
        rows = self.rows(slots)
        B, n_kv, m = slots.shape
        if not m:
            return rows
        w = np.broadcast_to(np.asarray(weights, np.float32), (B, n_kv, m)).reshape(-1)
        flat = (self._base(self.counts.shape[-1]) + rows).reshape(-1)
        held = [
            (h.reshape(-1, self.d), r.astype(np.float32, copy=False).reshape(-1, self.d))
            for h, r in ((self.values, values), (self.keys, keys))
            if h is not None
        ]
        if flat.size <= self.FEW:  # a step's few moves: distinct rows take one buffered add
            ordered = np.sort(flat)  # (several times faster than `np.add.at` on this host)
            if (ordered[1:] != ordered[:-1]).all():
                self.counts.reshape(-1)[flat] += w
                for h, r in held:
                    h[flat] += w[:, None] * r
                return rows
        order = np.argsort(flat, kind="stable")  # a row taking several tokens: sum sorted runs
        target = flat[order]
        starts = np.flatnonzero(np.r_[True, target[1:] != target[:-1]])
        self.counts.reshape(-1)[target[starts]] += np.add.reduceat(w[order], starts)
        for h, r in held:
            h[target[starts]] += np.add.reduceat(r[order] * w[order, None], starts, axis=0)
        return rows

    def view(self) -> tuple[np.ndarray, np.ndarray, np.ndarray | None, np.ndarray]:
        """(counts [B, n_kv, R], value sums [B, n_kv, R, d], key sums or None, slot of each
        row [B, n_kv, R]) of the rows a step reads: R = `rows_used` + 1, the last row given to
        no slot (the host step bins its repeats there); a row beyond a KV head's own is empty:
        count 0, sums 0."""
        r = self.rows_used + 1  # `rows` keeps the capacity past the rows given out
        keys = None if self.keys is None else self.keys[..., :r, :]
        return self.counts[..., :r], self.values[..., :r, :], keys, self.slot_of[..., :r]

    def dense(self) -> tuple[np.ndarray, np.ndarray]:
        """Counts [B, n_kv, slots] and sums [B, n_kv, slots, d (2 d with keys: values, then
        keys)] over every slot: what the generic step holds (tests compare the two)."""
        B, n_kv = self.used.shape
        width = self.d * (2 if self.with_keys else 1)
        counts = np.zeros((B, n_kv, self.n_slots), np.float32)
        sums = np.zeros((B, n_kv, self.n_slots, width), np.float32)
        for b in range(B):
            for h in range(n_kv):
                r = int(self.used[b, h])
                slots = self.slot_of[b, h, :r]
                counts[b, h, slots] = self.counts[b, h, :r]
                sums[b, h, slots, : self.d] = self.values[b, h, :r]
                if self.keys is not None:
                    sums[b, h, slots, self.d :] = self.keys[b, h, :r]
        return counts, sums
