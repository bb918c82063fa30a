"""Top-K selection of far tokens: one strategy per cache, chosen once when the cache is made.

`MlxTopK` keeps everything on the device (`mx.argpartition`, the union built with MLX ops, the
retrieved-token counter an MLX scalar): no host sync. `NumpyTopK` pulls the step's scores to the
host once and does top-K and the union bookkeeping in NumPy. Which is faster depends on the
machine, not only the backend: on one CPU-only host NumPy's argpartition was 7x faster than
MLX's (0.09 vs 0.63 ms for 9 x 8K scores); on another a whole decode step at 8K was faster with
MLX's (no host syncs; docs/BENCHMARKS.md, "Where a decode step's time goes"). So the crossover
measurement (`a2ats crossover`, the app's first-load measurement) times both on CPU-only MLX
and records the faster per machine and geometry (`crossover.measured_top_k`); `choose_top_k()`
takes it, else NumPy on CPU-only MLX and MLX otherwise; `A2ATS_TOPK=mlx|numpy` overrides (read
when the cache is made, never per step).

Both strategies have the same operations and agree exactly:
    top(scores [..., F], k)       -> far indices [..., k] int32 (unordered)
    pick(cand, exact, k)          -> the k of `cand` [..., c] with the highest `exact` [..., c]
    pick_covering(cand, exact, k, scale, share, floor)
                                  -> (the fewest of those k covering `share` of the candidates'
                                      softmax, cut entries repeating the best; used count [...])
    to_mx(indices)                -> the indices as an mx.array (for gathers)
    select(top [B, n_kv, G, k], lay) -> (positions, repeat) mx.arrays (see `select`), and
                                    adds the step's distinct far tokens to `retrieved`
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

import mlx.core as mx
import numpy as np

from .attention import Layout, fixed_parts
from .crossover import DEFAULT_KIND, TOP_K_STRATEGIES, measured_top_k
from .host_attention import cpu_only

ENV = "A2ATS_TOPK"


_forced: str | None = None


@contextlib.contextmanager
def forced(strategy: str) -> Iterator[None]:
    """Caches made inside the block use `strategy` ("mlx" or "numpy"): the crossover probe
    times both (`bench/crossover_probe.py`)."""
    global _forced
    before, _forced = _forced, strategy
    try:
        yield
    finally:
        _forced = before


def choose_top_k(
    geometry: tuple[int, int, int] | None = None,
    kind: str = DEFAULT_KIND,
    with_estimate: bool = False,
) -> MlxTopK | NumpyTopK:
    """A fresh strategy for one cache. In order: a `forced` one, `A2ATS_TOPK`, the one the
    crossover measurement found faster on this machine for this geometry (attention layers, KV
    heads, head dim) and step kind (`crossover.measured_top_k`; with the estimate turned on by
    the measurement, the one faster with it), else NumPy on CPU-only MLX and MLX otherwise.
    """
    choice = (_forced or os.environ.get(ENV, "")).strip().lower()
    if choice not in TOP_K_STRATEGIES and geometry is not None:
        choice = measured_top_k(*geometry, kind, with_estimate) or ""
    host = choice == "numpy" if choice in TOP_K_STRATEGIES else cpu_only()
    return NumpyTopK() if host else MlxTopK()


class MlxTopK:
    """Top-K on the device (Metal): MLX ops only, no host sync."""

    on_host = False

    # steps whose count may wait unevaluated: each holds its step's positions until evaluated
    COUNT_EVERY = 32

    def __init__(self) -> None:
        self._retrieved = mx.array(0, dtype=mx.int32)
        self._uncounted = 0

    @staticmethod
    def top(scores: mx.array, k: int) -> mx.array:
        """Indices (into the far region) of the k highest scores: [..., F] -> [..., k] int32."""
        return mx.argpartition(-scores, kth=k - 1, axis=-1)[..., :k].astype(mx.int32)

    def pick(self, cand: mx.array, exact: mx.array, k: int) -> mx.array:
        """cand [..., c] far indices, exact [..., c] their scores -> the best k [..., k]."""
        return mx.take_along_axis(cand, self.top(exact, k), axis=-1)

    def pick_covering(self, cand, exact, k: int, scale: float, share: float, floor: int):
        """`pick` with an adaptive per-head budget (`covering`, on the device)."""
        return covering(mx, cand, exact, k, scale, share, floor)

    @staticmethod
    def to_mx(indices: mx.array) -> mx.array:
        return indices

    def select(self, top: mx.array, lay: Layout, count: bool = True) -> tuple[mx.array, mx.array]:
        """Far indices top [B, n_kv, G, k], unioned over the GQA group, plus sinks and window.

        Returns (positions [B, n_kv, M] int32, repeat [B, n_kv, M] bool),
        M = n_sinks + G * k + window; `repeat` marks duplicates of the union (masked in
        attention). The union part is sorted, so duplicates are adjacent. `count=False` for a
        selection nothing attends (the shadow selection): `retrieved` is left as it is.
        """
        B, n_kv, G, k = top.shape
        union = mx.sort(top.reshape(B, n_kv, G * k), axis=-1) + lay.n_sinks
        sinks, window, no_s, no_w, first = fixed_parts(
            B, n_kv, lay.n_sinks, lay.window_start, lay.n
        )
        repeat = mx.concatenate([no_s, first, union[..., 1:] == union[..., :-1], no_w], axis=-1)
        positions = mx.concatenate([sinks, union, window], axis=-1)
        if count:
            self._retrieved = self._retrieved + count_union(positions, lay)
            self._uncounted += 1
            if self._uncounted >= self.COUNT_EVERY:  # nothing reads it on the hot path: without
                mx.async_eval(self._retrieved)  # this its graph kept every step's positions
                self._uncounted = 0
        return positions, repeat

    @property
    def retrieved(self) -> int:
        """Far tokens selected (union over KV heads), summed over steps and the batch."""
        return int(self._retrieved.item())


class NumpyTopK:
    """Top-K on the host (CPU-only MLX): one pull of the scores per step, then NumPy."""

    on_host = True

    def __init__(self) -> None:
        self._retrieved = 0
        self._pending: list[mx.array] = []  # the graph step's counts, read when `retrieved` is
        self.undone = 0  # graph steps left undone (a NaN score: `graph_step.py`)

    @staticmethod
    def top(scores: mx.array | np.ndarray, k: int) -> np.ndarray:
        """NumPy `MlxTopK.top`: [..., F] -> [..., k] int32 (unordered; `top_indices`)."""
        return top_indices(np.asarray(scores), k).astype(np.int32)

    def pick(self, cand: np.ndarray, exact: mx.array, k: int) -> np.ndarray:
        return np.take_along_axis(cand, self.top(exact, k), axis=-1)

    def pick_covering(self, cand, exact, k: int, scale: float, share: float, floor: int):
        """`pick` with an adaptive per-head budget (`covering`, on the host: the same one pull
        of the exact scores as `pick`)."""
        return covering(np, cand, np.asarray(exact), k, scale, share, floor)

    @staticmethod
    def to_mx(indices: np.ndarray) -> mx.array:
        return mx.array(indices)

    def select(self, top: np.ndarray, lay: Layout, count: bool = True) -> tuple[mx.array, mx.array]:
        """`MlxTopK.select` for far indices on the host: top [B, n_kv, G, k] (NumPy).

        The union bookkeeping is a handful of NumPy calls instead of a dozen small MLX ops.
        """
        positions, repeat = self.select_host(top, lay, count)
        return mx.array(positions), mx.array(repeat)

    def select_host(
        self, top: np.ndarray, lay: Layout, count: bool = True
    ) -> tuple[np.ndarray, np.ndarray]:
        """`select` with NumPy results (positions int32, repeat bool), for the host step."""
        B, n_kv, G, k = top.shape
        union = np.sort(top.reshape(B, n_kv, G * k), axis=-1) + lay.n_sinks
        dup = union[..., 1:] == union[..., :-1]
        if count:
            self._retrieved += sum(_distinct(top[b]) for b in range(B))
        n_win = lay.n - lay.window_start
        positions = np.empty((B, n_kv, lay.n_sinks + G * k + n_win), dtype=np.int32)
        positions[..., : lay.n_sinks] = np.arange(lay.n_sinks, dtype=np.int32)
        positions[..., lay.n_sinks : lay.n_sinks + G * k] = union
        positions[..., lay.n_sinks + G * k :] = np.arange(lay.window_start, lay.n, dtype=np.int32)
        repeat = np.zeros(positions.shape, dtype=bool)
        repeat[..., lay.n_sinks + 1 : lay.n_sinks + G * k] = dup
        return positions, repeat

    def add_retrieved(self, count: int | mx.array) -> None:
        """Count far tokens a step selected outside `select_host` (the C++ host step): an int,
        or the graph step's lazy int32 [1] (-1: the step left undone), read later."""
        if not isinstance(count, mx.array):
            self._retrieved += count
            return
        self._pending.append(count)
        if len(self._pending) >= 2 * MlxTopK.COUNT_EVERY:  # the older half evaluated long since
            self._settle(MlxTopK.COUNT_EVERY)

    def _settle(self, count: int) -> None:
        got = [int(c.item()) for c in self._pending[:count]]
        del self._pending[:count]
        self._retrieved += sum(g for g in got if g > 0)
        self.undone += sum(g < 0 for g in got)

    @property
    def retrieved(self) -> int:
        self._settle(len(self._pending))
        return self._retrieved


SAMPLE_STRIDE = 16  # every 16th score of a row estimates its top-K threshold
THRESHOLD_FROM = 1536  # rows shorter than this: one argpartition (as fast or faster)


def top_indices(scores: np.ndarray, k: int) -> np.ndarray:
    """Indices of the k highest scores of each row: [..., F] -> [..., k] int64, unordered (the
    same scores as `np.argpartition`'s; which of tied scores at the k-th is arbitrary in both).

    A full argpartition of every row was most of a host retrieval step's top-K + rerank at 8K
    (docs/BENCHMARKS.md, "Where a decode step's time goes"). Here a strided sample of each row
    gives a threshold a little below its k-th score, one comparison keeps the scores at or
    above it (about 1.25 k of them) and the argpartition runs over those only. Where the
    threshold keeps fewer than k in some row (a sample that misleads) or a score is NaN (which
    argpartition ranks highest) every row takes the full argpartition, so the result never
    depends on the sample.
    """
    n = scores.shape[-1]

    def full() -> np.ndarray:
        return np.argpartition(scores, n - k, axis=-1)[..., n - k :]

    if n < THRESHOLD_FROM or 4 * k > n:
        return full()
    lead = scores.shape[:-1]
    rows = scores.reshape(-1, n)
    sample = rows[:, ::SAMPLE_STRIDE]
    m = sample.shape[1]
    j = min(m - 1, (5 * k * m) // (4 * n) + 8)  # the j-th highest of the sample: ~1.25 k kept
    threshold = np.partition(sample, m - 1 - j, axis=-1)[:, m - 1 - j]
    keep = rows >= threshold[:, None]
    counts = np.count_nonzero(keep, axis=-1)
    if (counts < k).any() or np.isnan(rows.max()):
        return full()
    flat = np.flatnonzero(keep)  # row r's kept scores: flat[ends[r-1]:ends[r]], row-major
    kept = rows.reshape(-1)[flat]
    out = np.empty((rows.shape[0], k), np.int64)
    start = 0
    for r, end in enumerate(np.cumsum(counts).tolist()):
        part = kept[start:end]
        out[r] = flat[start:end][np.argpartition(part, part.size - k)[part.size - k :]]
        start = end
    out -= (np.arange(rows.shape[0], dtype=np.int64) * n)[:, None]
    return out.reshape(*lead, k)


def _distinct(indices: np.ndarray) -> int:
    """Distinct values of an int array (a sort: several times faster than `np.unique` here)."""
    flat = np.sort(indices, axis=None)
    return int(1 + np.count_nonzero(flat[1:] != flat[:-1])) if flat.size else 0


def count_union(positions: mx.array, lay: Layout) -> mx.array:
    """Far tokens retrieved at this step, union over KV heads, summed over the batch (scalar).

    positions: [B, n_kv, M] as `select` returns them.
    """
    B = positions.shape[0]
    far = positions[..., lay.n_sinks : positions.shape[-1] - (lay.n - lay.window_start)]
    allpos = mx.sort(far.reshape(B, -1), axis=-1)
    distinct = 1 + (allpos[:, 1:] != allpos[:, :-1]).sum(axis=-1)
    return distinct.sum()


def covering(xp, cand, exact, k: int, scale: float, share: float, floor: int):
    """Adaptive budget per query head: the fewest of the best k candidates whose softmax mass
    covers `share` of all candidates' mass, at least `floor` of them (fixed shapes).

    xp: the array library (`numpy` or `mlx.core`: the same code for both strategies).
    cand [..., c] far indices; exact [..., c] their exact scores (unscaled q . k); the softmax is
    over `scale * exact` of the c candidates. Returns (top [..., k] int32, used [...] int32):
    the best k in descending score, the entries past each head's cut replaced by that head's
    best index (so `select` masks them as repeats of the GQA union), and the kept count.
    """
    s = exact.astype(xp.float32) * scale
    order = xp.argsort(-s, axis=-1)[..., :k]
    top_s = s.max(axis=-1, keepdims=True)
    total = xp.exp(s - top_s).sum(axis=-1, keepdims=True)
    best = xp.exp(xp.take_along_axis(s, order, axis=-1) - top_s)  # [..., k] descending
    before = xp.cumsum(best, axis=-1) - best  # mass of the better ones
    keep = (before < share * total) | (xp.arange(k) < floor)
    idx = xp.take_along_axis(cand, order.astype(xp.int32), axis=-1).astype(xp.int32)
    top = xp.where(keep, idx, idx[..., :1])
    return top, keep.astype(xp.int32).sum(axis=-1)
