"""The host step's compiled selection (`cache/host_kernels.py`) keeps what its NumPy calls keep."""

import sys

import numpy as np
import pytest

from a2ats_engine.cache import host_kernels, topk
from a2ats_engine.cache.attention import Layout
from a2ats_engine.cache.config import A2ATSConfig
from tests.engine.cache.test_host_step import BASE, decode


def numpy_selection(tables, codes, buckets, lay, C, k, candidates, q, keys):
    """The NumPy path's picks: far scores, `NumpyTopK.top`, exact scores, `top_indices`."""
    index = codes[:, :, lay.n_sinks : lay.window_start, 0].astype(np.int64) + buckets * C
    approx = np.take_along_axis(tables, index[:, :, None, :], axis=-1)
    cand = topk.NumpyTopK.top(approx, candidates)
    if candidates == k:
        return cand
    B, H = q.shape[:2]
    rows = keys[np.arange(B)[:, None, None, None], np.arange(H)[None, :, None, None],
                cand + lay.n_sinks]  # fmt: skip
    exact = np.einsum("bhgcd,bhgd->bhgc", rows, q)
    return np.take_along_axis(cand, topk.top_indices(exact, k), axis=-1)


@pytest.mark.parametrize("n", [300, 2600])  # 2,600: the sampled threshold of `top_indices`
@pytest.mark.parametrize("rerank", [1, 3])
@pytest.mark.parametrize("n_buckets", [1, 3])
def test_the_compiled_selection_keeps_the_numpy_one(n, rerank, n_buckets):
    """Scores drawn from 6 values (ties across every cut): the same far indices as the NumPy
    calls, tied ones included (both keep the lowest indices of a tie, `topk.lowest_ties`)."""
    fn = host_kernels.selector()
    if sys.platform != "linux" and fn is None:
        pytest.skip(f"no compiled selection here: {host_kernels.status()}")
    assert fn is not None, host_kernels.status()  # a dependency on Linux: never silently off
    rng = np.random.default_rng(n + rerank)
    B, H, G, d, C, sinks, window = 2, 2, 3, 16, 32, 4, 16
    lay = Layout(n=n, n_sinks=sinks, window_start=n - window, k=max(8, n // 40))
    tables = rng.integers(0, 6, (B, H, G, n_buckets * C)).astype(np.float32)
    codes = rng.integers(0, C, (B, H, n + 7, 1)).astype(np.uint16)
    buckets = np.sort(rng.integers(0, n_buckets, lay.n_far)).astype(np.int32)[::-1].copy()
    q = rng.standard_normal((B, H, G, d)).astype(np.float32)
    keys = rng.standard_normal((B, H, n + 7, d)).astype(np.float32)
    candidates = min(rerank * lay.k, lay.n_far)
    got = host_kernels.select_far(fn, tables, codes, buckets, lay, C, lay.k, candidates, q, keys)
    want = numpy_selection(tables, codes, buckets, lay, C, lay.k, candidates, q, keys)
    assert got.dtype == np.int32 and got.shape == (B, H, G, lay.k)
    assert np.array_equal(np.sort(got, axis=-1), np.sort(want, axis=-1))


def test_a_nan_score_leaves_the_selection_to_the_numpy_calls():
    fn = host_kernels.selector()
    if fn is None:
        pytest.skip(host_kernels.status())
    lay = Layout(n=100, n_sinks=2, window_start=90, k=5)
    tables = np.ones((1, 1, 1, 8), np.float32)
    tables[..., 3] = np.nan
    codes = np.full((1, 1, 100, 1), 3, np.uint16)
    args = (np.zeros(88, np.int32), lay, 8, 5, 10, np.ones((1, 1, 1, 4), np.float32),
            np.ones((1, 1, 100, 4), np.float32))  # fmt: skip
    assert host_kernels.select_far(fn, tables, codes, *args) is None


def test_lowest_ties_keeps_the_lowest_indices_of_a_tie_at_the_cut():
    scores = np.array([[5, 1, 3, 3, 0, 3, 3], [9, 8, 7, 6, 5, 4, 3]], np.float32)
    top = np.array([[0, 6, 3], [0, 1, 2]])  # row 0: 5 and two of the four 3s
    got = topk.lowest_ties(scores, top)
    assert sorted(got[0].tolist()) == [0, 2, 3]
    assert sorted(got[1].tolist()) == [0, 1, 2]
    with_nan = np.array([[np.nan, 1, 1, 1]], np.float32)
    assert np.array_equal(topk.lowest_ties(with_nan, np.array([[0, 3]])), [[0, 3]])
    assert np.array_equal(np.sort(topk.top_indices(scores, 3), axis=-1), [[0, 2, 3], [0, 1, 2]])


def test_the_host_kernel_can_be_turned_off_and_says_so(monkeypatch):
    from a2ats_engine.commands.models import host_step_text

    monkeypatch.setattr(host_kernels, "_state", {})
    monkeypatch.setenv(host_kernels.ENV, "numpy")
    assert host_kernels.selector() is None
    assert host_kernels.status() == "in NumPy calls (A2ATS_HOST_KERNEL=numpy)"
    text = host_step_text()  # `a2ats info`'s line
    assert text == "MLX's step on the device" or text == (
        "on the host; far scores, top-K and rerank in NumPy calls (A2ATS_HOST_KERNEL=numpy)"
    )
    monkeypatch.setattr(host_kernels, "_state", {})
    monkeypatch.delenv(host_kernels.ENV)
    monkeypatch.setitem(sys.modules, "numba", None)  # an import that fails
    assert host_kernels.selector() is None
    assert host_kernels.status() == "in NumPy calls (numba not installed)"


@pytest.mark.parametrize("knobs", [{}, {"rerank": 1}, {"estimate_missed": True}])
def test_the_host_step_decodes_alike_compiled_and_in_numpy(monkeypatch, knobs):
    """Random keys coded by a 64-centroid codebook (ties at every cut), a few decode steps: the
    compiled selection runs and the step's selections and outputs are the NumPy calls'."""
    if host_kernels.selector() is None:
        pytest.skip(host_kernels.status())
    config = A2ATSConfig(**BASE, **knobs)
    calls = []
    shipped = host_kernels.select_far

    def counted(*args):
        calls.append(1)
        return shipped(*args)

    def not_called(*args):
        raise AssertionError("the compiled selection ran while turned off")

    monkeypatch.setattr(host_kernels, "select_far", counted)
    compiled = decode(config, host=True, monkeypatch=monkeypatch, steps=3)  # undoes the patches
    assert len(calls) == 3  # one layer, three steps: every one compiled
    monkeypatch.setattr(host_kernels, "_state", {"select": None, "status": "off"})
    monkeypatch.setattr(host_kernels, "select_far", not_called)
    numpy_calls = decode(config, host=True, monkeypatch=monkeypatch, steps=3)
    for (out_c, sel_c, *_), (out_n, sel_n, *_) in zip(compiled, numpy_calls, strict=True):
        assert all(np.array_equal(a, b) for a, b in zip(sel_c, sel_n, strict=True))
        np.testing.assert_allclose(out_c, out_n, rtol=1e-5, atol=1e-5)


def test_a_compile_that_fails_leaves_the_numpy_calls_and_says_why(monkeypatch):
    def broken(fn):
        raise RuntimeError("no LLVM target for this CPU")

    monkeypatch.setattr(host_kernels, "_state", {})
    monkeypatch.delenv(host_kernels.ENV, raising=False)
    monkeypatch.setattr(host_kernels, "_warm", broken)
    assert host_kernels.selector() is None
    assert host_kernels.status() == "in NumPy calls (numba failed: no LLVM target for this CPU)"
