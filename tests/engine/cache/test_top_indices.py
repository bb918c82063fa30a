"""`topk.top_indices`: the host top-K keeps the scores a full argpartition keeps, on every kind of
row (ties, sorted, periodic, NaN), through the sampled threshold and its fallback."""

from __future__ import annotations

import numpy as np
import pytest

from a2ats_engine.cache import topk
from a2ats_engine.cache.topk import NumpyTopK, top_indices


def _kept_scores(scores: np.ndarray, indices: np.ndarray) -> np.ndarray:
    return np.sort(np.take_along_axis(scores, indices, axis=-1), axis=-1)


def _assert_like_argpartition(scores: np.ndarray, k: int) -> np.ndarray:
    n = scores.shape[-1]
    got = top_indices(scores, k)
    assert got.shape == (*scores.shape[:-1], k)
    want = np.argpartition(scores, n - k, axis=-1)[..., n - k :]
    assert np.array_equal(_kept_scores(scores, got), _kept_scores(scores, want), equal_nan=True)
    for row in got.reshape(-1, k):  # k distinct positions of the row
        assert np.unique(row).size == k and row.min() >= 0 and row.max() < n
    return got


def _rows(kind: str, rng: np.random.Generator, n: int) -> np.ndarray:
    if kind == "normal":
        return rng.standard_normal((2, 3, 3, n)).astype(np.float32)
    if kind == "table lookups":  # the far scores: many exact ties (one value per slot)
        table = rng.standard_normal((9, 2048)).astype(np.float32)
        codes = rng.integers(0, 2048, (9, n))
        return np.take_along_axis(table, codes, axis=-1).reshape(1, 3, 3, n)
    if kind == "ascending":
        return np.sort(rng.standard_normal((1, 2, n)), axis=-1).astype(np.float32)
    if kind == "descending":
        return np.ascontiguousarray(np.sort(rng.standard_normal((1, 2, n)))[..., ::-1])
    if kind == "constant":
        return np.zeros((1, 2, n), np.float32)
    if kind == "three values":
        return rng.integers(0, 3, (2, n)).astype(np.float32)
    if kind == "off the sample":  # the best scores all where the strided sample never looks
        row = rng.standard_normal((2, n)).astype(np.float32)
        row[:, 1 :: topk.SAMPLE_STRIDE] += 100.0
        return row
    if kind == "on the sample":  # the sample sees only the best scores: its threshold too high
        row = rng.standard_normal((2, n)).astype(np.float32)
        row[:, :: topk.SAMPLE_STRIDE] += 100.0
        return row
    if kind == "nan":
        row = rng.standard_normal((2, n)).astype(np.float32)
        row[0, ::7] = np.nan
        return row
    raise AssertionError(kind)


KINDS = (
    "normal", "table lookups", "ascending", "descending", "constant", "three values",
    "off the sample", "on the sample", "nan",
)  # fmt: skip


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("n", [200, topk.THRESHOLD_FROM, 5000, 8000])
def test_top_indices_keeps_what_argpartition_keeps(kind, n):
    rng = np.random.default_rng(n)
    scores = _rows(kind, rng, n)
    for k in (1, 7, n // 16, n // 8, n // 4, n // 2):
        _assert_like_argpartition(scores, max(k, 1))


def test_the_sampled_threshold_is_what_runs_on_long_rows(monkeypatch):
    """On long rows with a small k the argpartition runs over the kept scores only: the full
    argpartition is never called on the whole row (and is, where the sample misleads)."""
    rng = np.random.default_rng(0)
    scores = _rows("table lookups", rng, 8000)
    real = np.argpartition
    sizes: list[int] = []

    def counting(a, kth, axis=-1):
        sizes.append(np.shape(a)[-1])
        return real(a, kth, axis=axis)

    monkeypatch.setattr(topk.np, "argpartition", counting)
    got = top_indices(scores, 480)
    assert sizes and max(sizes) < 8000 // 4  # each row's kept scores only
    monkeypatch.setattr(topk.np, "argpartition", real)
    _assert_like_argpartition(scores, 480)
    assert np.array_equal(np.sort(got, axis=-1), np.sort(top_indices(scores, 480), axis=-1))
    monkeypatch.setattr(topk.np, "argpartition", counting)
    sizes.clear()
    top_indices(_rows("on the sample", rng, 8000), 480)  # too few kept: the fallback
    assert max(sizes) == 8000
    sizes.clear()
    top_indices(_rows("off the sample", rng, 8000), 480)  # enough kept, if more than needed
    assert max(sizes) < 8000


def test_numpy_top_k_uses_it():
    rng = np.random.default_rng(1)
    scores = _rows("table lookups", rng, 6000)
    got = NumpyTopK.top(scores, 300)
    assert got.dtype == np.int32
    assert np.array_equal(np.sort(got, axis=-1), np.sort(top_indices(scores, 300), axis=-1))
