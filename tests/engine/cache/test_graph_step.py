"""The C++ step inside MLX's graph (`cache/graph_step.py`, `graph_step.cpp`) gives what the
synced C++ step gives, without a sync, the missed-attention estimate too (its slot sums held in
C++); every input the primitive reads is checked; a build for another MLX is refused, and
`status` says which runs."""

import sys

import mlx.core as mx
import numpy as np
import pytest

from a2ats_engine.cache import graph_step, host_step, native_step, topk
from a2ats_engine.cache.a2ats_cache import A2ATSCache
from a2ats_engine.cache.codebook import Codebook
from a2ats_engine.cache.config import A2ATSConfig
from a2ats_engine.cache.retrieval import PhaseClock

from .test_host_step import BASE, ROPE, D, decode
from .test_native_step import GRAPH

LINUX = sys.platform.startswith("linux")
# Built on Linux only (MLX's CPU device; macOS runs MLX on Metal, where the retrieval step is
# MLX ops with no host sync): elsewhere `test_the_graph_step_is_built_on_linux` checks it is not.
needs_graph = pytest.mark.skipif(not LINUX, reason="the graph step is built on Linux only")


@pytest.fixture(autouse=True)
def graph_on():
    with native_step.forced("graph"):
        yield


def test_the_graph_step_is_built_on_linux():
    """`make venv` builds it (CI has a compiler and nanobind): fail, not skip."""
    if not LINUX:
        assert not graph_step.built()[0]
        return
    assert graph_step.built() == (True, ""), graph_step.built()[1]
    assert graph_step.on() and native_step.status() == GRAPH


def spy(monkeypatch):
    """Calls of the synced step's sync and of the graph step."""
    seen = {"synced": 0, "graph": 0}
    synced, run = host_step._synced, graph_step.run

    def counted_sync(*a):
        seen["synced"] += 1
        return synced(*a)

    def counted_run(*a):
        seen["graph"] += 1
        return run(*a)

    monkeypatch.setattr(host_step, "_synced", counted_sync)
    monkeypatch.setattr(graph_step, "run", counted_run)
    return seen


@needs_graph
@pytest.mark.parametrize("knobs", [{}, {"rerank": 1}, {"far_buckets": 1}, {"rerank": 3}])
@pytest.mark.parametrize("with_sinks", [False, True])
@pytest.mark.parametrize("sub_dim", [None, 8])  # 8: product VQ, 4 subspaces
@pytest.mark.parametrize("n", [700, 2600])  # 2600: the top-K's sampled threshold
def test_the_graph_step_gives_what_the_synced_step_gives(
    monkeypatch, knobs, with_sinks, sub_dim, n
):
    """The same C function inside the graph: the same output, selection and count, bit for bit,
    with no sync a layer."""
    config = A2ATSConfig(**BASE, **knobs)
    sinks = mx.array(np.linspace(-1, 1, 6).astype(np.float32)) if with_sinks else None
    seen = spy(monkeypatch)
    graph = decode(config, host=True, monkeypatch=monkeypatch, sinks=sinks, sub_dim=sub_dim, n=n)
    assert seen == {"synced": 0, "graph": 3}  # decode() undid the spies: they saw its steps
    with native_step.forced("native"):
        seen = spy(monkeypatch)
        synced = decode(
            config, host=True, monkeypatch=monkeypatch, sinks=sinks, sub_dim=sub_dim, n=n
        )
        assert seen == {"synced": 3, "graph": 0}
    for (out_g, sel_g, _, n_g, _), (out_s, sel_s, _, n_s, _) in zip(graph, synced, strict=True):
        assert np.array_equal(out_g, out_s)
        assert all(np.array_equal(a, b) for a, b in zip(sel_g, sel_s, strict=True))
        assert n_g == n_s > 0


ESTIMATES = [
    {"estimate_missed": True},
    {"estimate_missed": True, "estimate_scores": "code_mean"},
    {"estimate_missed": True, "far_buckets": 1, "rerank": 1},
]


@needs_graph
@pytest.mark.parametrize("knobs", ESTIMATES)
@pytest.mark.parametrize("with_sinks", [False, True])
@pytest.mark.parametrize("n", [700, 2600])
def test_the_estimate_runs_in_the_graph_as_the_synced_step_runs_it(
    monkeypatch, knobs, with_sinks, n
):
    """The missed-attention estimate's layers in the graph, their slot sums held in C++: the
    same selection and count as the synced step (NumPy sums, C++ attention), the output and the
    estimated mass to float32 rounding (the sums add the same tokens in another order), and no
    sync in five steps (moves across the window's and buckets' edges)."""
    config = A2ATSConfig(**BASE, **knobs)
    sinks = mx.array(np.linspace(-1, 1, 6).astype(np.float32)) if with_sinks else None
    seen = spy(monkeypatch)
    graph = decode(config, host=True, monkeypatch=monkeypatch, sinks=sinks, n=n, steps=5)
    assert seen == {"synced": 0, "graph": 5}
    with native_step.forced("native"):
        seen = spy(monkeypatch)
        synced = decode(config, host=True, monkeypatch=monkeypatch, sinks=sinks, n=n, steps=5)
        assert seen == {"synced": 5, "graph": 0}
    for (out_g, sel_g, _, n_g, mass_g), (out_s, sel_s, _, n_s, mass_s) in zip(
        graph, synced, strict=True
    ):
        assert all(np.array_equal(a, b) for a, b in zip(sel_g, sel_s, strict=True))
        assert n_g == n_s > 0
        np.testing.assert_allclose(out_g, out_s, rtol=0, atol=1e-6)
        np.testing.assert_allclose(mass_g, mass_s, rtol=1e-5)
        assert min(mass_g) > 0 and max(mass_g) < 1


def dense_reference(cache) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The far region's per-slot counts, value sums and key sums at the cache's context, from
    scratch in NumPy (`host_step.rebuild_rows`): what the C++ sums must hold."""
    from a2ats_engine.cache.slot_rows import SlotRows

    lay = layout(cache)
    codes, keys, values = (np.array(a) for a in (cache.codes, cache.rows.keys, cache.rows.values))
    B, n_kv = codes.shape[:2]
    rows = SlotRows(B, n_kv, cache.n_slots, keys.shape[-1], True)
    host_step.rebuild_rows(rows, cache, lay, codes, values, keys)
    counts, sums = rows.dense()
    d = keys.shape[-1]
    return (
        counts.reshape(B * n_kv, -1),
        sums[..., :d].reshape(B * n_kv, -1),
        sums[..., d:].reshape(B * n_kv, -1),
    )


def held_sums(cache):
    sums, context = cache.retrieval.graph_sums
    counts, values, keys = (np.array(a, np.float32) for a in sums.dense())
    return sums, context, counts.reshape(counts.size // cache.n_slots, -1), values, keys


@needs_graph
@pytest.mark.parametrize("knobs", ESTIMATES)
def test_the_sums_held_in_cpp_follow_steps_trims_and_prefills(knobs):
    """After steps (moved), a trim and a prefill (rebuilt) the C++ sums equal the far region's
    sums made from scratch, and the estimate's bytes count them."""
    rng = np.random.default_rng(5)
    book = Codebook.random(1, 2, D, 64, seed=1)
    with topk.forced("numpy"):
        cache = A2ATSCache(0, ROPE, book, A2ATSConfig(**BASE, **knobs), 8192)
    rows = lambda n: (  # noqa: E731
        mx.array(rng.standard_normal((2, 2, n, D)).astype(np.float32)) for _ in "kv"
    )
    q = lambda: mx.array(rng.standard_normal((2, 6, 1, D)).astype(np.float32))  # noqa: E731
    cache.update_and_fetch(*rows(900))
    held = []
    for what in ["step"] * 6 + ["trim"] + ["step"] * 3 + ["prefill"] + ["step"] * 2:
        if what == "trim":
            cache.trim(40)
            continue
        cache.update_and_fetch(*rows(1 if what == "step" else 30))
        if what == "step":
            mx.eval(cache.attend(q(), None, None, scale=D**-0.5))
            sums, context, counts, values, keys = held_sums(cache)
            assert context == cache.offset and sums.context == cache.offset
            want = dense_reference(cache)
            np.testing.assert_array_equal(counts, want[0].reshape(counts.shape))
            # moved sums (a token in, another out) round as a sum made once does not, a little
            np.testing.assert_allclose(values.reshape(want[1].shape), want[1], 1e-5, 1e-5)
            np.testing.assert_allclose(keys.reshape(want[2].shape), want[2], 1e-5, 1e-5)
            assert cache.retrieval.estimate_bytes == sums.nbytes > 0
            held.append(sums)  # kept alive: ids of freed objects are reused
    # one object while the steps follow each other, built once and then moved; a new one
    # after the trim and after the prefill
    assert len({id(h) for h in held[:6]}) == 1 and len({id(h) for h in held}) == 3
    assert [h.rebuilds for h in (held[0], held[6], held[9])] == [1, 1, 1]


@needs_graph
def test_a_step_left_undone_keeps_the_sums_moving():
    """A NaN query with the estimate: NaN output and share, the step counted undone, and the
    sums still brought to the step's context (the next step moves them from there)."""
    cache = cache_with_rows(knobs={"estimate_missed": True})
    cache.update_and_fetch(*(mx.zeros((1, 2, 1, D)) for _ in "kv"))
    out = np.array(cache.attend(mx.full((1, 6, 1, D), np.nan), None, None, scale=D**-0.5))
    assert np.isnan(out).all() and np.isnan(np.array(cache.retrieval.missed_share)).all()
    assert cache.tokens_retrieved == 0 and cache.top_k.undone == 1  # read: the counts settle
    assert cache.retrieval.graph_sums[0].context == cache.offset
    cache.update_and_fetch(*(mx.ones((1, 2, 1, D)) for _ in "kv"))
    q = mx.array(np.random.default_rng(4).standard_normal((1, 6, 1, D)).astype(np.float32))
    assert np.isfinite(np.array(cache.attend(q, None, None, scale=D**-0.5))).all()
    counts = held_sums(cache)[2]
    np.testing.assert_array_equal(counts, dense_reference(cache)[0].reshape(counts.shape))


@needs_graph
@pytest.mark.parametrize("knobs", [{"coverage": 0.9}, {"rerank": 3, "rerank_shared": True}])
def test_what_the_graph_step_does_not_compute_keeps_its_sync(monkeypatch, knobs):
    """The adaptive budget and shared rerank candidates are the NumPy step's: each keeps the
    sync."""
    seen = spy(monkeypatch)
    decode(A2ATSConfig(**BASE, **knobs), host=True, monkeypatch=monkeypatch)
    assert seen == {"synced": 3, "graph": 0}


@needs_graph
def test_a_cache_or_the_strategy_can_keep_the_synced_step(monkeypatch):
    cache = cache_with_rows()
    lay = layout(cache)
    assert graph_step.applies(cache, lay)
    cache.synced_step = True  # the bench decode method suffix `_sync`
    assert not graph_step.applies(cache, lay)
    del cache.synced_step
    for strategy in ("native", "numpy"):
        with native_step.forced(strategy):
            assert not graph_step.applies(cache, lay) and not graph_step.on()


def cache_with_rows(n=700, B=1, n_kv=2, seed=0, knobs=None):
    rng = np.random.default_rng(seed)
    book = Codebook.random(1, n_kv, D, 64, seed=1)
    with topk.forced("numpy"):
        cache = A2ATSCache(0, ROPE, book, A2ATSConfig(**BASE, **(knobs or {})), 8192)
    rows = rng.standard_normal((2, B, n_kv, n, D)).astype(np.float32)
    cache.update_and_fetch(mx.array(rows[0]), mx.array(rows[1]))
    return cache


def layout(cache):
    from a2ats_engine.cache import attention as att

    cfg = cache.config
    return att.layout(cache.offset, cfg.window, cfg.sinks, cfg.top_k(cache.offset))


@needs_graph
def test_a_nan_query_leaves_the_step_undone_and_counted():
    """Inside the graph there is no NumPy step to fall back on: a NaN score gives a NaN output
    (as any attention of a NaN query), a selection of valid rows, and an undone step."""
    cache = cache_with_rows()
    q = mx.full((1, 6, 1, D), np.nan)
    cache.update_and_fetch(*(mx.zeros((1, 2, 1, D)) for _ in "kv"))
    out = np.array(cache.attend(q, None, None, scale=D**-0.5))
    assert np.isnan(out).all()
    sel = cache.last_stats.selected
    assert all(((s >= 0) & (s < cache.offset)).all() for s in sel)
    assert cache.tokens_retrieved == 0 and cache.top_k.undone == 1


def test_the_counts_wait_unevaluated_and_settle_when_read():
    cache = cache_with_rows()
    top = cache.top_k
    for c in (3, -1, 4):
        top.add_retrieved(mx.array([c], dtype=mx.int32))
    top.add_retrieved(5)
    assert len(top._pending) == 3
    assert top.retrieved == 12 and top.undone == 1 and not top._pending
    for _ in range(2 * topk.MlxTopK.COUNT_EVERY):  # a long decode never read: half settled
        top.add_retrieved(mx.array([1], dtype=mx.int32))
    assert len(top._pending) == topk.MlxTopK.COUNT_EVERY
    assert top.retrieved == 12 + 2 * topk.MlxTopK.COUNT_EVERY


@needs_graph
def test_the_profile_times_the_graph_step_as_one_phase():
    cache = cache_with_rows()
    cache.retrieval.clock = clock = PhaseClock()
    cache.update_and_fetch(*(mx.zeros((1, 2, 1, D)) for _ in "kv"))
    q = mx.array(np.random.default_rng(2).standard_normal((1, 6, 1, D)).astype(np.float32))
    cache.attend(q, None, None, scale=D**-0.5)
    phases = {phase for _, phase in clock.seconds}
    assert "graph step" in phases and "native step" not in phases


def entry_args(**change):
    """Arguments of the primitive's entry for a small layer, with some replaced."""
    rng = np.random.default_rng(0)
    f32 = lambda *s: mx.array(rng.standard_normal(s).astype(np.float32))  # noqa: E731
    args = {
        "q": f32(1, 4, 1, 8),
        "to_far": f32(8, 8),
        "codes": mx.array(rng.integers(0, 4, (1, 2, 40, 2)).astype(np.uint16)),
        "keys": f32(1, 2, 40, 8),
        "values": f32(1, 2, 40, 8),
        "cent": f32(2, 2, 4, 4),
        "bucket": None,
        "sinks": None,
        "m": 1,
        "n": 40,
        "n_sinks": 2,
        "window_start": 30,
        "k": 4,
        "cand": 8,
        "scale": 0.3,
    }
    args.update(change)
    return list(args.values())


@needs_graph
def test_the_entry_runs_lazily_and_matches_the_synced_entry():
    out, positions, repeat, retrieved = native_step._graph_fn(*entry_args())
    assert out.shape == (1, 4, 1, 8) and positions.shape == repeat.shape == (1, 2, 2 + 2 * 4 + 10)
    q, to_far, codes, keys, values, cent = entry_args()[:6]
    want_out = np.empty((1, 2, 2, 8), np.float32)
    want_pos = np.empty(positions.shape, np.int32)
    want_rep = np.empty(positions.shape, np.bool_)
    got = native_step._fn(
        q, to_far, codes, keys, values, np.array(cent), None, None, want_out, want_pos, want_rep,
        1, 40, 2, 30, 4, 8, 0.3,
    )  # fmt: skip
    assert np.array_equal(np.array(out).reshape(want_out.shape), want_out)
    assert np.array_equal(np.array(positions), want_pos)
    assert np.array_equal(np.array(repeat), want_rep)
    assert int(retrieved.item()) == got > 0


@needs_graph
@pytest.mark.parametrize(
    ("change", "says"),
    [
        ({"codes": mx.zeros((1, 2, 40, 2), dtype=mx.int32)}, "codes has the wrong dtype"),
        ({"q": mx.zeros((1, 4, 8))}, "queries has the wrong dtype or rank"),
        ({"keys": mx.zeros((1, 2, 39, 8))}, "do not share"),
        ({"cent": mx.zeros((2, 2, 4, 3))}, "do not share"),
        ({"q": mx.zeros((1, 3, 1, 8))}, "do not share"),
        ({"k": 29}, "out of range"),
        ({"n": 41}, "out of range"),
        ({"m": 2, "to_far": mx.zeros((8, 16))}, "several buckets"),
        ({"m": 2, "bucket": mx.zeros((27,), dtype=mx.int32)}, "rotations do not fit"),
        ({"bucket": mx.zeros((27,), dtype=mx.int32)}, "not one per far token"),
        ({"bucket": mx.zeros((28,), dtype=mx.int64)}, "distance buckets has the wrong dtype"),
        ({"sinks": mx.zeros((3,))}, "sink logits are not one per query head"),
    ],
)
def test_the_entry_refuses_what_does_not_fit(change, says):
    with pytest.raises(ValueError, match=says):
        native_step._graph_fn(*entry_args(**change))


@needs_graph
def test_a_bucket_out_of_range_leaves_the_step_undone():
    """Bucket values are known only when the node runs: checked there, never read past."""
    bad = mx.array(np.full(28, 5, np.int32))
    out, positions, _, retrieved = native_step._graph_fn(*entry_args(bucket=bad))
    assert int(retrieved.item()) == -1 and np.isnan(np.array(out)).all()
    assert ((np.array(positions) >= 0) & (np.array(positions) < 40)).all()


@needs_graph
def test_a_build_for_another_mlx_is_refused(monkeypatch):
    monkeypatch.setattr(mx, "__version__", "0.0.1")
    fn, why = native_step._load_graph()
    assert fn is None
    assert "built for MLX '0.32" in why and "this is MLX 0.0.1" in why and "graph_build" in why


def test_status_says_why_the_graph_step_does_not_run(monkeypatch):
    monkeypatch.setattr(native_step, "_graph_fn", None)
    monkeypatch.setattr(native_step, "_graph_why", "not built (no nanobind)")
    assert native_step.status() == (
        "C++ (native_step.cpp), one sync a layer (the graph step is not built (no nanobind))"
    )
    assert not graph_step.on()


@needs_graph
def test_float16_queries_over_float32_rows_run_in_the_graph(monkeypatch):
    """Float16 activations over float32 rows: cast in the graph, attended as the float32 query
    is, and the output back in float16."""
    seen = spy(monkeypatch)
    cache = cache_with_rows()
    cache.update_and_fetch(*(mx.zeros((1, 2, 1, D)) for _ in "kv"))
    q = mx.array(np.random.default_rng(3).standard_normal((1, 6, 1, D)).astype(np.float16))
    want = cache.attend(q.astype(mx.float32), None, None, scale=D**-0.5)
    cache.trim(1)
    cache.update_and_fetch(*(mx.zeros((1, 2, 1, D)) for _ in "kv"))
    got = cache.attend(q, None, None, scale=D**-0.5)
    assert seen == {"synced": 0, "graph": 2} and got.dtype == mx.float16
    np.testing.assert_allclose(np.asarray(got.astype(mx.float32)), np.asarray(want), atol=2e-3)


def estimate_args(sums, moves=((), (), ()), **change):
    """The estimate entry's arguments: the step's, the sums, the moves."""
    return [*entry_args(**change), sums, *(list(m) for m in moves)]


@needs_graph
@pytest.mark.parametrize(
    ("moves", "says"),
    [
        (([3], [0], []), "moves of unequal lengths"),
        (([30], [0], [1.0]), "outside the far region"),
        (([-1], [0], [1.0]), "outside the far region"),
        (([5], [-1], [1.0]), "outside the far region"),
        (([5], [0], [0.5]), "weight other than"),
    ],
)
def test_the_estimate_entry_refuses_moves_that_do_not_fit(moves, says):
    sums = native_step._graph_module.SlotSums(4, 4, [])
    for bad in ((3, 4), (-1, 4), (4, 0), (1 << 25, 4)):
        with pytest.raises(ValueError, match="slot sums of an impossible size"):
            native_step._graph_module.SlotSums(*bad, [])
    with pytest.raises(ValueError, match=says):
        native_step._graph_module.estimate(*estimate_args(sums, moves))
    with pytest.raises(ValueError, match="not one per far token"):  # the step's checks too
        native_step._graph_module.estimate(
            *estimate_args(sums, bucket=mx.zeros((27,), dtype=mx.int32))
        )


@needs_graph
def test_a_code_past_the_slots_leaves_the_step_undone_and_the_sums_unheld():
    """Codes are read only when the node runs: one past the slots is never summed."""
    sums = native_step._graph_module.SlotSums(3, 3, [])  # codes 0-3 in entry_args: 3 is past
    out, _, _, retrieved, share = native_step._graph_module.estimate(*estimate_args(sums))
    assert int(retrieved.item()) == -1 and np.isnan(np.array(out)).all()
    assert np.isnan(np.array(share)).all() and sums.context == -1
    sums = native_step._graph_module.SlotSums(4, 4, [])
    out, _, _, retrieved, share = native_step._graph_module.estimate(*estimate_args(sums))
    assert int(retrieved.item()) > 0 and np.isfinite(np.array(out)).all() and sums.context == 40
    counts = np.array(sums.dense()[0]).reshape(2, 4)
    assert counts.sum() == 2 * 28  # every far token of both KV heads, once


@needs_graph
def test_one_copy_of_the_sums_at_a_time_when_the_step_changes():
    """A cache that moves from the synced step to the graph step and back holds one set of
    sums, the step's own: the bytes count them once."""
    cache = cache_with_rows(knobs={"estimate_missed": True})
    q = mx.array(np.random.default_rng(6).standard_normal((1, 6, 1, D)).astype(np.float32))
    held = []
    for strategy in ("native", "graph", "native"):
        with native_step.forced(strategy):
            cache.update_and_fetch(*(mx.zeros((1, 2, 1, D)) for _ in "kv"))
            mx.eval(cache.attend(q, None, None, scale=D**-0.5))
        r = cache.retrieval
        held.append((r.host_missed is not None, r.graph_sums is not None))
        mine = r.graph_sums[0].nbytes if r.graph_sums else r.host_missed[1].nbytes
        assert r.estimate_bytes == mine > 0
    assert held == [(True, False), (False, True), (True, False)]
