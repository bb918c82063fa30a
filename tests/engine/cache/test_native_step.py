"""The C++ host step (`cache/native_step.py`, `native_step.cpp`) selects and attends as the
NumPy host step does, takes the NumPy step for what it does not compute, and says which runs."""

import os

import mlx.core as mx
import numpy as np
import pytest
from repo_python import run_python

from a2ats_engine.cache import attention as att
from a2ats_engine.cache import host_step, native_step, topk
from a2ats_engine.cache.a2ats_cache import A2ATSCache
from a2ats_engine.cache.codebook import Codebook
from a2ats_engine.cache.config import A2ATSConfig
from a2ats_engine.cache.retrieval import PhaseClock

from .test_host_step import BASE, ROPE, D, decode

GRAPH = "C++ in MLX's graph (graph_step.cpp)"


@pytest.fixture(autouse=True)
def synced_step():
    """These hold the synced C++ step (one sync a layer, then `native_step.run`) to the NumPy
    step; tests/engine/cache/test_graph_step.py holds the graph step to it."""
    with native_step.forced("native"):
        yield


def stable_top(scores, k):
    """The C++ step's rule among tied scores (the lowest far index), for the NumPy step."""
    return np.argsort(-np.asarray(scores), axis=-1, kind="stable")[..., :k]


def test_the_native_step_is_built():
    """`pip install -e .` builds it where there is a C++ compiler (CI has one): fail, not skip."""
    assert native_step.on(), native_step.status()
    assert native_step.status() == "C++ (native_step.cpp), one sync a layer"


@pytest.mark.parametrize(
    "knobs",
    [
        {},
        {"rerank": 1},
        {"far_buckets": 1},
        {"rerank": 3},
        {"estimate_missed": True},  # C++ selects, NumPy moves the slot sums, C++ attends
        {"estimate_missed": True, "estimate_scores": "code_mean", "rerank": 1},
    ],
)
@pytest.mark.parametrize("with_sinks", [False, True])
@pytest.mark.parametrize("sub_dim", [None, 8])  # 8: product VQ, 4 subspaces
@pytest.mark.parametrize("n", [700, 2600])  # 2600: the top-K's sampled threshold
def test_the_native_step_selects_and_attends_as_the_numpy_step(
    monkeypatch, knobs, with_sinks, sub_dim, n
):
    config = A2ATSConfig(**BASE, **knobs)
    sinks = mx.array(np.linspace(-1, 1, 6).astype(np.float32)) if with_sinks else None
    calls, estimates = [], []
    run, attend_estimate = native_step.run, native_step.attend_estimate
    monkeypatch.setattr(native_step, "run", lambda *a: calls.append(1) or run(*a))
    monkeypatch.setattr(
        native_step, "attend_estimate", lambda *a: estimates.append(1) or attend_estimate(*a)
    )
    native = decode(config, host=True, monkeypatch=monkeypatch, sinks=sinks, sub_dim=sub_dim, n=n)
    assert len(calls) == 3  # one step a layer, three steps: the C++ step ran each time
    # with the estimate C++ attends too (its own call, over the selection and the slot sums)
    assert len(estimates) == (3 if config.estimate_missed else 0)
    monkeypatch.setattr(topk, "top_indices", stable_top)
    with native_step.forced("numpy"):
        numpy = decode(
            config, host=True, monkeypatch=monkeypatch, sinks=sinks, sub_dim=sub_dim, n=n
        )
    for (out_c, sel_c, used_c, n_c, mass_c), (out_n, sel_n, used_n, n_n, mass_n) in zip(
        native, numpy, strict=True
    ):
        assert all(np.array_equal(a, b) for a, b in zip(sel_c, sel_n, strict=True))
        assert n_c == n_n > 0
        assert used_c is None and used_n is None
        np.testing.assert_allclose(out_c, out_n, rtol=1e-5, atol=1e-5)
        assert (mass_c is None) == (not config.estimate_missed) == (mass_n is None)
        if mass_c is not None:
            np.testing.assert_allclose(mass_c, mass_n, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(
    "sub_dim, centroids",
    [(4, 64), (None, 60), (8, 61)],  # a subspace width and centroid counts not multiples of 8
)
def test_tables_of_any_width_and_centroid_count(monkeypatch, sub_dim, centroids):
    """The x86 table kernel takes 8 centroids of a multiple of 8 numbers at once; the rest (the
    last centroids of a count not a multiple of 8, narrower subspaces) the plain loop: each
    selects what the NumPy step selects."""
    config = A2ATSConfig(**BASE)
    args = {"host": True, "monkeypatch": monkeypatch, "sub_dim": sub_dim, "centroids": centroids}
    native = decode(config, **args)
    monkeypatch.setattr(topk, "top_indices", stable_top)
    with native_step.forced("numpy"):
        numpy = decode(config, **args)
    for (out_c, sel_c, *_), (out_n, sel_n, *_) in zip(native, numpy, strict=True):
        assert all(np.array_equal(a, b) for a, b in zip(sel_c, sel_n, strict=True))
        np.testing.assert_allclose(out_c, out_n, rtol=1e-5, atol=1e-5)


def _cache(**knobs):
    rng = np.random.default_rng(0)
    with topk.forced("numpy"):
        cache = A2ATSCache(0, ROPE, Codebook.random(1, 1, D, 16, seed=1),
                           A2ATSConfig(**{**BASE, **knobs}), 8192)  # fmt: skip
    rows = mx.array(rng.standard_normal((1, 1, 300, D)).astype(np.float32))
    cache.update_and_fetch(rows, rows)
    return cache, mx.array(rng.standard_normal((1, 2, 1, D)).astype(np.float32))


@pytest.mark.parametrize(
    ("knobs", "steps"),
    [
        ({}, ["native"]),
        ({"estimate_missed": True}, ["native"]),  # NumPy moves only the slot sums
        ({"estimate_missed": True, "estimate_scores": "centroid"}, ["numpy"]),  # reads tables
        ({"coverage": 0.9}, ["numpy"]),
        ({"rerank": 3, "rerank_shared": True}, ["numpy"]),
    ],
)
def test_what_the_native_step_does_not_compute_takes_the_numpy_step(monkeypatch, knobs, steps):
    cache, q = _cache(**knobs)
    seen = []
    on_host = host_step._on_host
    monkeypatch.setattr(host_step, "_on_host", lambda *a: seen.append("numpy") or on_host(*a))
    run = native_step.run
    monkeypatch.setattr(native_step, "run", lambda *a: seen.append("native") or run(*a))
    mx.eval(cache.attend(q, None, None, scale=D**-0.5))
    assert seen == steps
    cache.numpy_step = True  # the benchmarks' `_npstep` methods
    seen.clear()
    mx.eval(cache.attend(q, None, None, scale=D**-0.5))
    assert seen == ["numpy"]


def test_float16_rows_take_the_numpy_step(monkeypatch):
    rng = np.random.default_rng(0)
    with topk.forced("numpy"):
        cache = A2ATSCache(0, ROPE, Codebook.random(1, 1, D, 16, seed=1), A2ATSConfig(**BASE), 8192)
    rows = mx.array(rng.standard_normal((1, 1, 300, D)).astype(np.float16))
    cache.update_and_fetch(rows, rows)
    q = mx.array(rng.standard_normal((1, 2, 1, D)).astype(np.float16))
    assert host_step.applies(cache, q)
    monkeypatch.setattr(native_step, "run", lambda *a: pytest.fail("the C++ step takes float32"))
    assert cache.attend(q, None, None, scale=D**-0.5).shape == (1, 2, 1, D)


@pytest.mark.parametrize("knobs", [{}, {"estimate_missed": True}])
def test_float16_queries_over_float32_rows_run_the_native_step(monkeypatch, knobs):
    """The C++ entries read float32: float16 activations over float32 rows are converted, not
    refused, and attend as the float32 query does (its shadow selection too)."""
    cache, q = _cache(**knobs)
    q = q.astype(mx.float16).astype(mx.float32)  # a query float16 can hold exactly
    calls = []
    run = native_step.run
    monkeypatch.setattr(native_step, "run", lambda *a, **k: calls.append(1) or run(*a, **k))
    want = cache.attend(q, None, None, scale=D**-0.5)
    cache.trim(1)
    cache.update_and_fetch(*(mx.array(np.asarray(cache.rows.keys)[:, :, 299:300]),) * 2)
    got = cache.attend(q.astype(mx.float16), None, None, scale=D**-0.5)
    assert len(calls) == 2 and got.dtype == mx.float16
    np.testing.assert_allclose(np.asarray(got.astype(mx.float32)), np.asarray(want), atol=2e-3)
    cfg = cache.config
    lay = att.layout(cache.offset, cfg.window, cfg.sinks, cfg.top_k(cache.offset))
    by16, by32 = (host_step.shadow(cache, x, lay, D**-0.5) for x in (q.astype(mx.float16), q))
    assert np.array_equal(by16[0], by32[0]) and by16[2] == pytest.approx(by32[2], abs=1e-5)


def test_a_nan_score_takes_the_numpy_step(monkeypatch):
    """NaN ranks highest in argpartition; the C++ step declines the call instead of guessing."""
    cache, q = _cache()
    q = mx.full(q.shape, float("nan"))
    seen = []
    on_host = host_step._on_host
    monkeypatch.setattr(host_step, "_on_host", lambda *a: seen.append("numpy") or on_host(*a))
    out = cache.attend(q, None, None, scale=D**-0.5)
    mx.eval(out)
    assert seen == ["numpy"]


def test_the_native_step_is_timed_as_one_phase():
    cache, q = _cache()
    clock = cache.retrieval.clock = PhaseClock()
    cache.attend(q, None, None, scale=D**-0.5)
    phases = {phase for _, phase in clock.seconds}
    assert "native step" in phases and "top-K + rerank" not in phases


def test_the_native_step_refuses_arrays_it_cannot_read():
    cache, _ = _cache()
    lay = att.layout(300, 16, 4, 12)
    k = np.zeros((1, 1, 300, D), np.float32)
    codes = np.zeros((1, 1, 300, 1), np.uint16)
    qn = np.zeros((1, 1, 2, D), np.float32)
    to_far = np.zeros((D, D), np.float32)
    with pytest.raises(ValueError, match="float32"):
        native_step.run(cache, lay, qn, to_far, 1, None, codes, k.astype(np.float16), k, 1.0, None)
    # other strides: declined (the NumPy step gathers them)
    assert (
        native_step.run(cache, lay, qn, to_far, 1, None, codes, k[..., ::2, :], k, 1.0, None)
        is None
    )
    strided_far = np.zeros((D, 2 * D), np.float32)[:, ::2]  # rotations too: declined
    assert native_step.run(cache, lay, qn, strided_far, 1, None, codes, k, k, 1.0, None) is None
    with pytest.raises(ValueError, match="codes"):
        native_step.run(cache, lay, qn, to_far, 1, None, codes.astype(np.int32), k, k, 1.0, None)
    with pytest.raises(ValueError, match="rotations"):
        native_step.run(cache, lay, qn, to_far, 2, None, codes, k, k, 1.0, None)


def _step_args(cache, n=300, k=12):
    """`native_step.run`'s arguments for `_cache()`'s cache at context n, as NumPy arrays."""
    lay = att.layout(n, 16, 4, k)
    rng = np.random.default_rng(1)
    rows = np.asarray(cache.rows.keys)
    q = rng.standard_normal((1, 2, 1, D)).astype(np.float32)
    to_far = rng.standard_normal((D, D)).astype(np.float32)
    return lay, [q, to_far, 1, None, np.asarray(cache.codes), rows, rows, D**-0.5, None]


def test_the_step_reads_mlx_arrays_in_place_as_numpy_arrays():
    """The C++ entry takes the MLX arrays themselves (their buffers) and the query in either
    layout ([B, n_q, 1, d] or [B, n_kv, G, d]): the same selection and output each way."""
    cache, _ = _cache()
    lay, args = _step_args(cache)
    got = native_step.run(cache, lay, *args)
    as_mlx = [mx.array(a) if isinstance(a, np.ndarray) else a for a in args]
    by_mlx = native_step.run(cache, lay, *as_mlx)
    grouped = [args[0].reshape(1, 1, 2, D), *args[1:]]
    by_groups = native_step.run(cache, lay, *grouped)
    assert got[3] > 0 and got[1].shape == (1, 1, 4 + 2 * 12 + (300 - lay.window_start))
    for other in (by_mlx, by_groups):
        assert all(np.array_equal(a, b) for a, b in zip(got[:3], other[:3], strict=True))
        assert other[3] == got[3]
    again = native_step.run(cache, lay, *args)
    assert again[1] is not got[1]  # new arrays each call: the telemetry keeps the last step's


@pytest.mark.parametrize(
    ("change", "says"),
    [
        (lambda a: a.__setitem__(0, a[0][..., :-1].copy()), "do not share"),  # head dim
        (lambda a: a.__setitem__(4, a[4][:, :, :200]), "do not share"),  # capacity
        (lambda a: a.__setitem__(0, a[0].astype(np.float64)), "queries are not float32"),
        (
            lambda a: a.__setitem__(2, 2) or a.__setitem__(1, np.zeros((D, 2 * D), np.float32)),
            "several buckets used but no distance buckets",
        ),
        (lambda a: a.__setitem__(3, np.full(280, 5, np.int32)), "do not fit"),  # bucket >= m
        (lambda a: a.__setitem__(3, np.zeros(284, np.int32)), "do not fit"),  # not F (280) buckets
        (lambda a: a.__setitem__(8, np.zeros(3, np.float32)), "one per query head"),
        (lambda a: a.__setitem__(8, np.zeros(4, np.float32)[::2]), "C-contiguous"),
    ],
)
def test_the_step_names_the_array_that_does_not_fit(change, says):
    """Every shape is checked in C++ before a row is read: a ValueError names the misfit."""
    cache, _ = _cache()
    lay, args = _step_args(cache)
    change(args)
    with pytest.raises(ValueError, match=says):
        native_step.run(cache, lay, *args)


def test_the_step_checks_the_context_and_its_outputs():
    cache, _ = _cache()
    lay, args = _step_args(cache)
    with pytest.raises(ValueError, match="context, sinks, window or budget"):
        cap = args[5].shape[2]  # the rows' capacity (grown ahead of the 300 held)
        native_step.run(cache, att.layout(cap + 1, 16, 4, 12), *args)  # more rows than held
    with pytest.raises(ValueError, match="context, sinks, window or budget"):
        native_step.run(cache, att.layout(300, 16, 4, 290), *args)  # K above the far region
    q, to_far, m, bucket, codes, keys, values, scale, _ = args
    fn = native_step._fn
    M = 4 + 2 * 12 + (300 - lay.window_start)
    out = np.empty((1, 1, 2, D), np.float32)
    pos, rep = np.empty((1, 1, M), np.int32), np.empty((1, 1, M), np.bool_)
    common = (q, to_far, codes, keys, values, native_step._centroids(cache), bucket, None)
    tail = (m, lay.n, lay.n_sinks, lay.window_start, lay.k, 0, scale)
    assert fn(*common, out, pos, rep, *tail) > 0
    with pytest.raises(ValueError, match="outputs of the wrong shape"):
        fn(*common, out, pos[..., :-1], rep[..., :-1], *tail)
    read_only = pos.copy()
    read_only.flags.writeable = False
    with pytest.raises(ValueError, match="positions are not a writable buffer"):
        fn(*common, out, read_only, rep, *tail)
    with pytest.raises(TypeError, match="18 arguments"):
        fn(*common, out, pos, rep, *tail[:-1])


def test_status_names_the_step_that_runs(monkeypatch):
    with native_step.forced("numpy"):
        assert native_step.status() == "NumPy" and not native_step.on()
    monkeypatch.setattr(native_step, "_fn", None)
    monkeypatch.setattr(native_step, "_why", "not built (no compiler)")
    assert not native_step.on()
    assert native_step.status() == "NumPy (the C++ step is not built (no compiler))"
    with pytest.raises(ValueError, match="one of graph, native, numpy"):
        native_step.forced("fast").__enter__()


@pytest.mark.parametrize(
    ("value", "says"),
    [
        ("numpy", "NumPy (the C++ step is built; turned off by A2ATS_HOST_STEP=numpy)"),
        ("native", "C++ (native_step.cpp), one sync a layer (A2ATS_HOST_STEP=native)"),
        ("fast", GRAPH),  # not a step: a warning, and ignored
    ],
)
def test_the_environment_turns_it_off_and_a_typo_is_said(value, says):
    code = (
        "import warnings; warnings.simplefilter('always')\n"
        "import a2ats_engine\n"
        "from a2ats_engine.cache import native_step\n"
        "print(native_step.status())\n"
    )
    env = {**os.environ, "A2ATS_HOST_STEP": value}
    result = run_python(code, env, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip().splitlines()[-1] == says
    assert ("is not one of graph, native, numpy: ignored" in result.stderr) == (value == "fast")


def test_the_estimate_attention_checks_rows_and_declines_other_strides():
    """Its slot rows index the sums it reads: a position past the row table or a row out of
    range is refused, not read; rows read with other strides are left to NumPy's attention
    (None)."""
    rng = np.random.default_rng(0)
    lay = att.layout(10, 4, 1, 2)  # 1 sink, far [1, 6), window [6, 10)
    M, R, d = lay.n_sinks + lay.k + (lay.n - lay.window_start), 3, 8
    f32 = lambda *shape: rng.standard_normal(shape).astype(np.float32)  # noqa: E731
    q, keys, values = f32(1, 1, 1, d), f32(1, 1, 10, d), f32(1, 1, 10, d)
    positions = np.array([[[0, 2, 4, 6, 7, 8, 9]]], np.int32)  # the union: positions 2 and 4
    repeat = np.zeros((1, 1, M), np.bool_)
    view = (np.array([[[2, 1, 0]]], np.float32), f32(1, 1, R, d), f32(1, 1, R, d), None)
    row_at = np.zeros((1, 1, 10), np.int32)
    row_at[0, 0, 4] = 1
    args = (positions, repeat, lay, view)
    out, share = native_step.attend_estimate(q, keys, values, *args, row_at, 0.3, None)
    assert out.shape == (1, 1, 1, d) and 0 < share[0, 0, 0] < 1
    with pytest.raises(ValueError, match="out of range"):
        native_step.attend_estimate(q, keys, values, *args, row_at + R, 0.3, None)
    with pytest.raises(ValueError, match="out of range"):  # position 4 past a table of 3
        native_step.attend_estimate(q, keys, values, *args, row_at[..., :3], 0.3, None)
    wide = np.zeros((1, 1, 10, 2 * d), np.float32)
    wide[..., :d] = keys
    assert native_step.attend_estimate(q, wide[..., :d], values, *args, row_at, 0.3, None) is None
    short = (view[0][..., :2], *view[1:])  # counts of 2 rows, sums of 3
    with pytest.raises(ValueError, match="do not share"):
        native_step.attend_estimate(q, keys, values, positions, repeat, lay, short, row_at, 0.3,
                                    None)  # fmt: skip
    with pytest.raises(ValueError, match="key sums"):
        native_step.attend_estimate(q, keys, values, *args[:3], view[:2] + (None, None), row_at,
                                    0.3, None)  # fmt: skip
    with pytest.raises(ValueError, match="sink logits or outputs"):
        native_step.attend_estimate(q, keys, values, *args, row_at, 0.3, np.zeros(2, np.float32))
