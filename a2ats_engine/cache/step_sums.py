"""The host step's estimate sums of a model's A2ATS layers, moved for all of them at once.

A decode step moves the same few far tokens between slots in every layer (the token that leaves
the window, one a bucket edge: `retrieval.slot_moves`), and moving them in one layer's
`SlotRows` is some fifty small NumPy calls however few the tokens: about 0.2 ms a layer inside
a decode on a 2-core host, a third of what the estimate adds to a retrieval step. `StepSums`
holds every member layer's rows in one `SlotRows` over (layer, batch): the first member to
reach a step reads the moved tokens' codes, values and keys from every member's rows (a take
each) and moves them with one add; each member then reads its own part (`LayerRows`). A
rebuild (the first step, after a prefill, trim or restore of any member) fills each member's
part from its own rows, as the per-layer path does.

`join` (called by `model_cache.make_cache`) gives one to the A2ATS layers of a cache list that
share the estimate's geometry (window, sinks, distance edges, slots, scores); a cache built on
its own keeps per-layer `SlotRows` (`host_step.missed_sums`). Members whose rows the host step
cannot read (`readable`) send every member back to its own rows for that step.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from . import attention as att
from .host_step import move_rows, rebuild_rows, rows_on_host
from .slot_rows import SlotRows

if TYPE_CHECKING:
    from .a2ats_cache import A2ATSCache


class LayerRows:
    """One member's part of a `StepSums`' rows: what the host step reads of a `SlotRows`."""

    def __init__(self, rows: SlotRows, part: slice, members: int) -> None:
        self.rows, self.part, self.members = rows, part, members
        self.n_slots = rows.n_slots

    @property
    def rows_used(self) -> int:
        """The most rows one of this member's KV heads uses."""
        return int(self.rows.used[self.part].max(initial=0))

    @property
    def nbytes(self) -> int:
        """This member's share of the rows (the members' shares sum to the whole)."""
        return self.rows.nbytes // self.members

    def view(self):
        return self.rows.view(self.part)

    def at(self, positions: np.ndarray) -> np.ndarray:
        return self.rows.at(positions, self.part)

    def row_table(self) -> np.ndarray:
        return self.rows.row_table(self.part)

    def dense(self):
        return self.rows.dense(self.part)


class StepSums:
    """The estimate sums of `members` (A2ATS caches with one estimate geometry), stacked."""

    def __init__(self, members: list[A2ATSCache]) -> None:
        self.members = members
        self.part = {id(c): i for i, c in enumerate(members)}
        self.n: int | None = None  # the context the rows describe
        self.rows: SlotRows | None = None
        self.parts: list[LayerRows] = []
        self.rebuilds = self.moved_steps = 0  # how each step's update went (tests, profiling)

    @staticmethod
    def join(caches: list) -> None:
        """Give the A2ATS caches of a cache list that run the estimate with the same geometry
        one StepSums each group of two or more, as their `step_sums` (a cache without one
        keeps its own sums)."""
        groups: dict[tuple, list] = {}
        for c in caches:
            if getattr(c, "estimates", False):  # A2ATS caches running the estimate
                groups.setdefault(geometry_key(c), []).append(c)
        for members in groups.values():
            if len(members) > 1:
                shared = StepSums(members)
                for c in members:
                    c.step_sums = shared

    def rows_for(self, cache: A2ATSCache, lay: att.Layout) -> LayerRows | None:
        """`cache`'s part of the sums at this step (context lay.n), every member's moved or
        rebuilt the first time a member asks at this context; None where a member's rows
        cannot be read here, or differ in batch, KV heads or head dim (the caller keeps its own
        `SlotRows` then)."""
        retrieval = cache.retrieval
        held = retrieval.host_missed
        if self.n == lay.n and held is not None and held[0] == lay.n:
            return held[1] if isinstance(held[1], LayerRows) else None
        arrays = [readable(c, lay) for c in self.members]
        if (
            any(a is None for a in arrays)
            or len({a[1].shape[:2] + a[1].shape[3:] for a in arrays}) > 1
        ):
            self.n = None
            return None
        moves = None
        if (
            self.rows is not None
            and self.n == lay.n - 1
            and all(
                isinstance(h, tuple) and h[0] == self.n and h[1] is self.parts[i]
                for i, h in enumerate(c.retrieval.host_missed for c in self.members)
            )
        ):
            moves = retrieval.missed_moves(cache, lay, self.n)
        if moves is None:
            self._rebuild(cache, lay, arrays)
            self.rebuilds += 1
        else:
            if moves:
                move_rows(self.rows, cache, moves, arrays)
            self.moved_steps += 1
        del arrays  # no view of a member's MLX buffers outlives the update
        self.n = lay.n
        for c, part in zip(self.members, self.parts, strict=True):
            c.retrieval.host_missed = (lay.n, part)
            c.retrieval.missed_sums, c.retrieval.missed_n = None, None
            c.retrieval.graph_sums = None
        return self.parts[self.part[id(cache)]]

    def _rebuild(self, cache: A2ATSCache, lay: att.Layout, arrays: list) -> None:
        """Every member's part from its own far region (`host_step.rebuild_rows` each)."""
        B, n_kv = arrays[0][0].shape[:2]
        d = arrays[0][1].shape[-1]
        with_keys = cache.config.estimate_scores != "centroid"
        rows = SlotRows(len(self.members) * B, n_kv, cache.n_slots, d, with_keys)
        self.rows = rows
        self.parts = [
            LayerRows(rows, slice(i * B, (i + 1) * B), len(self.members))
            for i in range(len(self.members))
        ]
        for part, (codes, values, keys) in zip(self.parts, arrays, strict=True):
            rebuild_rows(rows, cache, lay, codes, values, keys, part.part)


def geometry_key(cache: A2ATSCache) -> tuple:
    """What the estimate's sums of two caches must share to be stacked and moved together."""
    cfg = cache.config
    edges = None if cache.estimate_edges is None else tuple(cache.estimate_edges)
    codebook = cache.codebook
    return (
        cfg.window, cfg.sinks, edges, cache.n_slots, cfg.estimate_scores,
        codebook.n_centroids, cache.rope.head_dim,
    )  # fmt: skip


def readable(cache: A2ATSCache, lay: att.Layout) -> tuple | None:
    """(codes, values, keys) of a member as NumPy views of its MLX arrays (evaluated here where
    they are not yet), or None where the host step cannot read them: rows not held as plain
    float arrays in memory, or fewer tokens than the far region of this step."""
    if (
        not cache.estimates
        or not rows_on_host(cache)
        or cache.codes is None
        or cache.offset < lay.window_start
    ):
        return None
    return np.asarray(cache.codes), np.asarray(cache.rows.values), np.asarray(cache.rows.keys)
