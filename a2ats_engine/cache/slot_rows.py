"""The synced host step's per-slot sums of the missed-attention estimate, one row per occupied
slot (the graph step holds the same rows in C++: `graph_step.cpp`'s `SlotSums`).

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
(`host_step.missed_sums`); every call takes a `part` (a leading slice of the batch), so one
`SlotRows` can hold every layer's rows, stacked over (layer, batch) (`step_sums.StepSums`).
"""

from __future__ import annotations

import numpy as np

ALL = slice(None)  # every batch entry (a `part` is a leading slice of them: one layer's)


class SlotRows:
    """Counts [B, n_kv, R], value sums [B, n_kv, R, d] and key sums (or None) of the occupied
    slots, each (batch, KV head)'s map slot -> row (-1: none yet) and row -> slot, and the row
    of each far position's slot (`row_at` [B, n_kv, positions])."""

    FEW = 4096  # `add` of up to this many tokens takes buffered adds (moves, every layer's)

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

    def lookup(self, slots: np.ndarray, part: slice = ALL) -> np.ndarray:
        """The rows of `slots` [B, n_kv, m] -> int64 [B, n_kv, m], 0 for a slot without one
        (a sink's or the window's slot, which the estimate masks out). `part`: the batch entries
        `slots` covers (a leading slice; all of them by default)."""
        index = self._base(self.n_slots)[part] + slots
        rows = np.take(self.row_of.reshape(-1), index.reshape(-1))
        rows = rows.astype(np.int64)
        return np.maximum(rows, 0).reshape(slots.shape)

    def place(self, positions: np.ndarray, rows: np.ndarray, part: slice = ALL) -> None:
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
        self.row_at[part][:, :, positions] = rows

    def at(self, positions: np.ndarray, part: slice = ALL) -> np.ndarray:
        """The rows of the far tokens at `positions` [B, n_kv, m] (placed ones; any strides)
        -> int64 [B, n_kv, m], one flat take."""
        held = self.row_at[part]  # a leading slice: still one flat array
        flat = (positions + self._base(held.shape[-1])[: held.shape[0]]).reshape(-1)
        return np.take(held.reshape(-1), flat).astype(np.int64).reshape(positions.shape)

    def row_table(self, part: slice = ALL) -> np.ndarray:
        """The row of each placed far position's slot, int32 [B, n_kv, positions] (a view: what
        `at` reads; the C++ step's estimate looks its columns up in it)."""
        return self.row_at[part]

    def rows(self, slots: np.ndarray, part: slice = ALL) -> np.ndarray:
        """The rows of `slots` [B, n_kv, m] (int), giving a row to each slot that has none
        (in first-seen order per (batch, KV head)) -> int64 [B, n_kv, m]. Every (batch, KV
        head) at once: a step's moves reach a new slot in about a third of the layers."""
        B, n_kv, m = slots.shape
        keys = (self._base(self.n_slots)[part] + slots).reshape(-1)  # (batch, head, slot), flat
        held = np.take(self.row_of.reshape(-1), keys)
        new = held < 0
        if not new.any():  # a step's moves: every slot has its row already
            return held.reshape(B, n_kv, m).astype(np.int64)
        fresh, first = np.unique(keys[new], return_index=True)
        fresh = fresh[np.argsort(first, kind="stable")]  # first-seen order, heads in order
        head = fresh // self.n_slots  # the flat (batch, KV head) of each new slot
        per_head = np.bincount(head, minlength=self.used.size)
        starts = np.cumsum(per_head) - per_head  # where each head's new slots begin in `fresh`
        used = self.used.reshape(-1)
        row = used[head] + (np.arange(fresh.size) - starts[head])
        if int(row.max()) + 1 >= self.counts.shape[-1]:  # one row past the last kept empty
            self._alloc(max(2 * self.counts.shape[-1], int(row.max()) + 2))
        self.row_of.reshape(-1)[fresh] = row
        self.slot_of.reshape(-1)[head * self.counts.shape[-1] + row] = fresh % self.n_slots
        used += per_head
        return self.lookup(slots, part)

    def add(
        self, slots: np.ndarray, weights, values: np.ndarray, keys: np.ndarray | None,
        part: slice = ALL,
    ) -> np.ndarray:  # fmt: skip
        """Add `weights` (one per token: [m] or [B, n_kv, m]) times each token's count, value
        [B, n_kv, m, d] and key to the row of its slot [B, n_kv, m]: a step's moves (up to
        `FEW` tokens, nearly all in rows of their own) by buffered adds over distinct rows (one,
        or one more per extra token a row takes), a rebuild by one sorted sum per row; never a
        scatter per token.
        Returns the tokens' rows (int64 [B, n_kv, m]) for `place`."""
        rows = self.rows(slots, part)
        B, n_kv, m = slots.shape
        if not m:
            return rows
        w = np.broadcast_to(np.asarray(weights, np.float32), (B, n_kv, m)).reshape(-1)
        flat = (self._base(self.counts.shape[-1])[part] + rows).reshape(-1)
        held = [
            (h.reshape(-1, self.d), r.astype(np.float32, copy=False).reshape(-1, self.d))
            for h, r in ((self.values, values), (self.keys, keys))
            if h is not None
        ]
        order = np.argsort(flat, kind="stable")
        target = flat[order]
        starts = np.flatnonzero(np.r_[True, target[1:] != target[:-1]])  # each row's first
        if flat.size <= self.FEW and 8 * starts.size >= 7 * flat.size:  # moves: few repeats
            if starts.size == flat.size:  # every token its own row: one buffered add
                self._add_distinct(flat, w, held, None)
                return rows
            # a row's k-th token in round k, each round one buffered add over distinct rows
            # (several times faster than `np.add.at` on this host)
            rank = np.arange(flat.size) - np.repeat(starts, np.diff(np.r_[starts, flat.size]))
            for k in range(int(rank.max()) + 1):
                self._add_distinct(flat, w, held, order[rank == k])
            return rows
        # a rebuild: rows taking many tokens, one sorted sum per row
        self.counts.reshape(-1)[target[starts]] += np.add.reduceat(w[order], starts)
        for h, r in held:
            h[target[starts]] += np.add.reduceat(r[order] * w[order, None], starts, axis=0)
        return rows

    def _add_distinct(self, flat, w, held, index: np.ndarray | None) -> None:
        """One buffered add of the tokens at `index` (all where None), whose rows `flat` are
        distinct: counts += w, sums += w * row."""
        if index is not None:
            flat, w = flat[index], w[index]
            held = [(h, r[index]) for h, r in held]
        self.counts.reshape(-1)[flat] += w
        for h, r in held:
            h[flat] += w[:, None] * r

    def view(
        self, part: slice = ALL
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray | None, np.ndarray]:
        """(counts [B, n_kv, R], value sums [B, n_kv, R, d], key sums or None, slot of each
        row [B, n_kv, R]) of the rows a step reads for the batch entries `part`: R = the most
        rows any of them uses + 1, the last row given to no slot (the host step bins its
        repeats there); a row beyond a KV head's own is empty: count 0, sums 0."""
        used = self.used if part == ALL else self.used[part]
        r = int(used.max(initial=0)) + 1  # `rows` keeps the capacity past every row given out
        keys = None if self.keys is None else self.keys[part, :, :r, :]
        return (
            self.counts[part, :, :r], self.values[part, :, :r, :], keys, self.slot_of[part, :, :r]
        )  # fmt: skip

    def dense(self, part: slice = ALL) -> tuple[np.ndarray, np.ndarray]:
        """Counts [B, n_kv, slots] and sums [B, n_kv, slots, d (2 d with keys: values, then
        keys)] over every slot: what the generic step holds (tests compare the two)."""
        batch = range(*part.indices(self.used.shape[0]))
        B, n_kv = len(batch), self.used.shape[1]
        width = self.d * (2 if self.with_keys else 1)
        counts = np.zeros((B, n_kv, self.n_slots), np.float32)
        sums = np.zeros((B, n_kv, self.n_slots, width), np.float32)
        for b, src in enumerate(batch):
            for h in range(n_kv):
                r = int(self.used[src, h])
                slots = self.slot_of[src, h, :r]
                counts[b, h, slots] = self.counts[src, h, :r]
                sums[b, h, slots, : self.d] = self.values[src, h, :r]
                if self.keys is not None:
                    sums[b, h, slots, self.d :] = self.keys[src, h, :r]
        return counts, sums
