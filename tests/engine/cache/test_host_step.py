"""The host decode step (`cache/host_step.py`) selects and attends as the generic step does.

These pin the NumPy step (`native_step.forced("numpy")`); tests/engine/cache/test_native_step.py
holds the C++ step to it."""

import mlx.core as mx
import numpy as np
import pytest
from mlx_lm.models.rope_utils import initialize_rope

from a2ats_engine.bench.methods import OracleTopKCache
from a2ats_engine.cache import attention as att
from a2ats_engine.cache import host_step, native_step, topk
from a2ats_engine.cache.a2ats_cache import A2ATSCache
from a2ats_engine.cache.codebook import Codebook
from a2ats_engine.cache.config import A2ATSConfig
from a2ats_engine.cache.retrieval import PhaseClock
from a2ats_engine.cache.rope import RopeSpec

D = 32
ROPE = RopeSpec.from_module(initialize_rope(D, 10000.0, False, None, 8192), D)
BASE = {"window": 16, "sinks": 4, "budget": 12, "telemetry": True}


@pytest.fixture(autouse=True)
def numpy_step():
    with native_step.forced("numpy"):
        yield


def decode(
    config, *, host: bool, monkeypatch, sinks=None, steps=3, B=2, n_kv=2, G=3, seed=0, sub_dim=None,
    n=700, centroids=64,
):  # fmt: skip
    """Per decode step (output, selected rows per KV head, kept counts, tokens retrieved) of a
    NumPy-top-K cache over random keys coded by a 64-centroid codebook (score ties included;
    `sub_dim`: product VQ; `centroids` another count)."""
    rng = np.random.default_rng(seed)
    book = Codebook.random(1, n_kv, D, centroids, sub_dim=sub_dim, seed=1)
    with topk.forced("numpy"):
        cache = A2ATSCache(0, ROPE, book, config, 8192)
    rows = rng.standard_normal((2, B, n_kv, n, D)).astype(np.float32)
    cache.update_and_fetch(mx.array(rows[0]), mx.array(rows[1]))
    if not host:
        monkeypatch.setattr(host_step, "applies", lambda cache, queries: False)
    steps_seen = []
    for _ in range(steps):
        k, v = (mx.array(rng.standard_normal((B, n_kv, 1, D)).astype(np.float32)) for _ in "kv")
        cache.update_and_fetch(k, v)
        q = mx.array(rng.standard_normal((B, n_kv * G, 1, D)).astype(np.float32))
        if host:
            assert host_step.applies(cache, q)
        out = np.array(cache.attend(q, None, None, scale=D**-0.5, sinks=sinks))
        stats = cache.last_stats
        steps_seen.append(
            (out, stats.selected, stats.budget_used, cache.tokens_retrieved, stats.missed_mass)
        )
    monkeypatch.undo()
    return steps_seen


@pytest.mark.parametrize(
    "knobs",
    [
        {},
        {"rerank": 1},
        {"rerank": 3, "rerank_shared": True},
        {"far_buckets": 1},
        {"coverage": 0.9},
        {"estimate_missed": True},
        {"estimate_missed": True, "far_buckets": 1, "rerank": 1},
        {"estimate_missed": True, "estimate_scores": "mean"},
        {"estimate_missed": True, "estimate_scores": "code_mean"},
    ],
)
@pytest.mark.parametrize("with_sinks", [False, True])
@pytest.mark.parametrize("sub_dim", [None, 8])  # 8: product VQ, 4 subspaces
def test_the_host_step_selects_and_attends_as_the_generic_step(
    monkeypatch, knobs, with_sinks, sub_dim
):
    config = A2ATSConfig(**BASE, **knobs)
    sinks = mx.array(np.linspace(-1, 1, 6).astype(np.float32)) if with_sinks else None
    host = decode(config, host=True, monkeypatch=monkeypatch, sinks=sinks, sub_dim=sub_dim)
    generic = decode(config, host=False, monkeypatch=monkeypatch, sinks=sinks, sub_dim=sub_dim)
    for (out_h, sel_h, used_h, n_h, mass_h), (out_g, sel_g, used_g, n_g, mass_g) in zip(
        host, generic, strict=True
    ):
        assert all(np.array_equal(a, b) for a, b in zip(sel_h, sel_g, strict=True))
        assert n_h == n_g
        assert (used_h is None) == (used_g is None)
        if used_h is not None:
            assert np.array_equal(np.asarray(used_h), np.asarray(used_g))
        np.testing.assert_allclose(out_h, out_g, rtol=1e-5, atol=1e-5)
        assert (mass_h is None) == (not config.estimate_missed) == (mass_g is None)
        if mass_h is not None:  # the estimate's share of the softmax mass, per KV head
            assert min(mass_g) > 0.01  # far from nothing: the estimate is really in the output
            np.testing.assert_allclose(mass_h, mass_g, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("knobs", [{}, {"estimate_missed": True, "estimate_scores": "mean"}])
def test_the_host_step_matches_at_a_context_where_top_k_samples_a_threshold(monkeypatch, knobs):
    """2,600 far tokens: `topk.top_indices` takes its sampled threshold (and the estimate's
    slot rows move through more distance buckets); the host and generic steps still agree."""
    config = A2ATSConfig(**BASE, **knobs)
    n = 2600
    assert n - BASE["window"] >= topk.THRESHOLD_FROM
    host = decode(config, host=True, monkeypatch=monkeypatch, n=n, steps=2)
    generic = decode(config, host=False, monkeypatch=monkeypatch, n=n, steps=2)
    for (out_h, sel_h, *_), (out_g, sel_g, *_) in zip(host, generic, strict=True):
        assert all(np.array_equal(a, b) for a, b in zip(sel_h, sel_g, strict=True))
        np.testing.assert_allclose(out_h, out_g, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("edges", [(64, 512, 2048), (2048, 64, 512), (100,)])
def test_the_host_steps_distance_buckets_are_the_mlx_ones(edges):
    for n, sinks, start in ((700, 4, 684), (5000, 8, 4936), (20, 4, 4)):
        want = np.asarray(att.bucket_ids(n, sinks, start, edges))
        got = host_step.far_buckets(n, sinks, start, edges)
        assert got.dtype == np.int32 and np.array_equal(got, want)
        assert not got.flags.writeable  # shared by every layer of the step


def test_the_host_step_makes_tables_for_the_buckets_that_hold_a_far_token():
    """The farthest far token's bucket and every nearer one: at a short context the farthest
    buckets are empty (no table made for them), from some context on every bucket holds one."""
    config = A2ATSConfig(**BASE)
    with topk.forced("numpy"):
        cache = A2ATSCache(0, ROPE, Codebook.random(1, 2, D, 64, seed=1), config, 8192)
    _, edges = cache.buckets
    seen = []
    for n in (21, 60, 200, 700, 1500, 3000, 8000):
        lay = att.layout(n, config.window, config.sinks, 12)
        held = np.asarray(att.bucket_ids(n, lay.n_sinks, lay.window_start, edges))
        assert host_step.used_buckets(cache, lay) == int(held.max()) + 1
        seen.append(int(held.max()) + 1)
    assert seen[0] < config.far_buckets and seen[-1] == config.far_buckets
    one = A2ATSCache(
        0, ROPE, Codebook.random(1, 2, D, 64, seed=1), A2ATSConfig(**BASE, far_buckets=1), 8192
    )
    assert host_step.used_buckets(one, att.layout(8000, 16, 4, 12)) == 1


def test_the_host_step_is_only_for_what_it_computes():
    rng = np.random.default_rng(0)
    book = Codebook.random(1, 1, D, 16, seed=1)
    q = mx.array(rng.standard_normal((1, 2, 1, D)).astype(np.float32))
    rows = mx.array(rng.standard_normal((1, 1, 200, D)).astype(np.float32))

    def cache(strategy="numpy", cls=A2ATSCache, **knobs):
        with topk.forced(strategy):
            made = cls(0, ROPE, book, A2ATSConfig(**{**BASE, **knobs}), 8192)
        made.update_and_fetch(rows, rows)
        return made

    assert host_step.applies(cache(), q)
    assert not host_step.applies(cache("mlx"), q)  # MLX's top-K never syncs
    assert not host_step.applies(cache(kv_bits=8), q)
    assert host_step.applies(cache(estimate_missed=True, far_buckets=1), q)  # the estimate too
    assert not host_step.applies(cache(reuse_selection=0.9), q)
    assert not host_step.applies(cache(cls=OracleTopKCache), q)  # a variant's own scores
    assert not host_step.applies(cache(), q.astype(mx.bfloat16))
    product = Codebook.random(1, 1, D, 16, sub_dim=8, seed=1)
    with topk.forced("numpy"):
        pq = A2ATSCache(0, ROPE, product, A2ATSConfig(**BASE), 8192)
    pq.update_and_fetch(rows, rows)
    assert host_step.applies(pq, q)  # product VQ: its far scores summed over subspaces


def test_the_host_step_times_its_phases():
    rng = np.random.default_rng(0)
    with topk.forced("numpy"):
        cache = A2ATSCache(0, ROPE, Codebook.random(1, 1, D, 16, seed=1), A2ATSConfig(**BASE), 8192)
    rows = mx.array(rng.standard_normal((1, 1, 300, D)).astype(np.float32))
    cache.update_and_fetch(rows, rows)
    clock = cache.retrieval.clock = PhaseClock()
    cache.attend(mx.array(rng.standard_normal((1, 2, 1, D)).astype(np.float32)), None, None,
                 scale=D**-0.5)  # fmt: skip
    phases = {phase for _, phase in clock.seconds}
    assert {"code scores", "top-K + rerank", "union", "gather K/V", "attention"} <= phases


@pytest.mark.parametrize(
    "rope",
    [
        ROPE,
        RopeSpec(dims=D, traditional=True, base=10000.0, head_dim=D),
        RopeSpec(dims=16, traditional=False, base=500000.0, scale=1.25, head_dim=D),
        RopeSpec(
            dims=D,
            traditional=False,
            base=None,
            freqs=tuple(float(2**i) for i in range(16)),
            head_dim=D,
        ),  # fmt: skip
    ],
)
@pytest.mark.parametrize("sub_dim", [None, 8])
def test_the_compiled_lookup_tables_equal_the_ops_one_by_one(rope, sub_dim):
    rng = np.random.default_rng(2)
    book = Codebook.random(2, 2, D, 32, sub_dim=sub_dim, seed=3)
    rotations = mx.concatenate([rope.rotation_matrix(dist) for dist in (64, 300, 2048)], axis=-1)
    q = mx.array(rng.standard_normal((2, 2, 3, D)).astype(np.float32))
    for position in (70, 4000, 4001):  # the position is an input: one trace serves every step
        got = att.retrieval_tables(q, rope, position, rotations, book, 1)
        kept = att.retrieval_tables(q, rope, position, rotations, book, 1, (64, 300, 2048))
        np.testing.assert_array_equal(np.array(kept), np.array(got))
        want = att.tables_uncompiled(rope, q, position, rotations, book.scoring_centroids(1))
        assert got.shape == (2, 2, 3, 3 * book.num_subspaces * 32)
        np.testing.assert_allclose(np.array(got), np.array(want), rtol=1e-6, atol=1e-5)
    one_by_one = book.score_tables(1, (rope.unrotate(q[..., None, :], 70)[..., 0, :] @ rotations)
                                   .reshape(2, 2, 9, D))  # fmt: skip
    np.testing.assert_allclose(
        np.array(att.retrieval_tables(q, rope, 70, rotations, book, 1)),
        np.array(one_by_one).reshape(2, 2, 3, -1), rtol=1e-6, atol=1e-5,
    )  # fmt: skip
    with pytest.raises(ValueError, match="do not fit the codebook"):
        att.retrieval_tables(q[:, :1], rope, 70, rotations, book, 1)
    for position in (70, 4001):  # the host step's tables: NumPy, the same to float32 rounding
        to_far = np.array(att.step_rotations(rope, position, rotations))
        host = host_step.host_tables(np.array(q), to_far, np.array(book.scoring_centroids(1)))
        mlx_tables = np.array(att.retrieval_tables(q, rope, position, rotations, book, 1))
        assert host.shape == mlx_tables.shape and host.dtype == np.float32
        np.testing.assert_allclose(host, mlx_tables, rtol=1e-5, atol=1e-5)
        nearest_two = host_step.host_tables(  # a short context's: its nearer buckets only
            np.array(q), to_far[:, : 2 * D], np.array(book.scoring_centroids(1))
        )
        want = host[..., : 2 * book.num_subspaces * 32]
        np.testing.assert_allclose(nearest_two, want, rtol=1e-5, atol=1e-5)


def test_every_layer_of_a_step_shares_its_rotation_matrix():
    distances = (64, 300, 2048)
    rotations = mx.concatenate([ROPE.rotation_matrix(dist) for dist in distances], axis=-1)
    first = att.step_rotations(ROPE, 5000, rotations, distances)
    assert att.step_rotations(ROPE, 5000, rotations, distances) is first  # the next layer
    later = att.step_rotations(ROPE, 5001, rotations, distances)
    assert later is not first  # the next step rotates from its own position
    assert att.step_rotations(ROPE, 5000, rotations) is not first  # no distances: not kept
    for position in range(20):  # only the last few steps are kept
        att.step_rotations(ROPE, position, rotations, distances)
    assert len(att._STEP_ROTATIONS) <= att._STEP_ROTATIONS_KEPT
    q = mx.array(np.random.default_rng(0).standard_normal((4, D)).astype(np.float32))
    want = ROPE.unrotate(q[:, None, :], 5001)[:, 0, :] @ rotations
    np.testing.assert_allclose(np.array(q @ later), np.array(want), rtol=1e-5, atol=1e-5)
