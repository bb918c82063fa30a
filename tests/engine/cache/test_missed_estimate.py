"""estimate_missed: the far tokens not retrieved, folded into the softmax through their slots."""

from dataclasses import replace

import mlx.core as mx
import numpy as np
import pytest
from mlx_lm.models.rope_utils import initialize_rope
from tiny import made_for, tiny_model

from a2ats_engine.bench.methods import METHODS, IdentityRope, decode_variant_knobs
from a2ats_engine.cache import native_step, topk
from a2ats_engine.cache.a2ats_cache import A2ATSCache
from a2ats_engine.cache.codebook import Codebook
from a2ats_engine.cache.config import A2ATSConfig
from a2ats_engine.cache.geometry import model_geometry
from a2ats_engine.cache.model_cache import make_cache
from a2ats_engine.cache.rope import RopeSpec

D = 32


def lossless_cache(config: A2ATSConfig, keys: np.ndarray) -> A2ATSCache:
    """A cache whose codebook holds every key as its own centroid and whose RoPE is the identity:
    every far token's slot score is its exact score, at every distance bucket."""
    book = Codebook([mx.array(keys[:, None])])  # [n_kv, 1, N, d]
    return A2ATSCache(0, IdentityRope(D), book, config, max_context=8192)


def exact(q: mx.array, keys: np.ndarray, values: np.ndarray, m: int, sinks=None) -> np.ndarray:
    """Exact attention of q [1, n_q, 1, d] over the first m tokens (GQA heads repeated)."""
    group = q.shape[1] // keys.shape[0]
    k = mx.repeat(mx.array(keys[None, :, :m]), group, axis=1)
    v = mx.repeat(mx.array(values[:, :, :m]), group, axis=1)
    return np.array(mx.fast.scaled_dot_product_attention(q, k, v, scale=D**-0.5, sinks=sinks))


def random_kv(n_kv: int, n: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    keys = rng.standard_normal((n_kv, n, D)).astype(np.float32)
    values = rng.standard_normal((1, n_kv, n, D)).astype(np.float32)
    return rng, keys, values


@pytest.mark.parametrize("far_buckets", [1, 3])
def test_lossless_codebook_makes_the_estimate_exact_attention(far_buckets):
    """With every key its own centroid the estimate is the dropped tokens' exact share, so the
    output equals exact attention over the whole cache, step after step (incremental sums)."""
    n, steps = 300, 6
    rng, keys, values = random_kv(2, n + steps)
    config = A2ATSConfig(
        window=16, sinks=4, budget=6, far_buckets=far_buckets, estimate_missed=True, telemetry=True
    )
    cache = lossless_cache(config, keys)
    off = lossless_cache(replace_estimate(config, False), keys)
    for c in (cache, off):
        c.update_and_fetch(mx.array(keys[None, :, :n]), mx.array(values[:, :, :n]))
    for step in range(steps):
        m = n + step
        if step:
            for c in (cache, off):
                c.update_and_fetch(
                    mx.array(keys[None, :, m - 1 : m]), mx.array(values[:, :, m - 1 : m])
                )
        q = mx.array(rng.standard_normal((1, 4, 1, D)).astype(np.float32))
        want = exact(q, keys, values, m)
        got = np.array(cache.attend(q, None, None, scale=D**-0.5))
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=2e-5)
        dropped = np.array(off.attend(q, None, None, scale=D**-0.5))
        assert np.abs(dropped - want).max() > 1e-3  # without the estimate it is not exact
        mass = cache.last_stats.missed_mass
        assert len(mass) == 2 and all(0.0 < x < 1.0 for x in mass)
        assert off.last_stats.missed_mass is None


def replace_estimate(config: A2ATSConfig, on: bool) -> A2ATSConfig:
    from dataclasses import replace

    return replace(config, estimate_missed=on)


def test_estimate_with_attention_sinks_is_exact_too():
    n = 200
    rng, keys, values = random_kv(1, n, seed=4)
    config = A2ATSConfig(window=8, sinks=2, budget=5, far_buckets=2, estimate_missed=True)
    cache = lossless_cache(config, keys)
    cache.update_and_fetch(mx.array(keys[None]), mx.array(values))
    q = mx.array(rng.standard_normal((1, 2, 1, D)).astype(np.float32))
    sinks = mx.array([0.5, 3.0], dtype=mx.float32)
    got = np.array(cache.attend(q, None, None, scale=D**-0.5, sinks=sinks))
    np.testing.assert_allclose(got, exact(q, keys, values, n, sinks), rtol=1e-4, atol=2e-5)


def held_sums(c: A2ATSCache) -> tuple[int, np.ndarray, np.ndarray]:
    """(context, counts, value sums) of the per-slot sums a cache holds: the host step's NumPy
    ones (the occupied slots' rows, spread over every slot) or the generic step's MLX ones."""
    r = c.retrieval
    if r.host_missed is not None:
        assert r.missed_sums is None  # one copy at a time
        n, rows = r.host_missed
        return n, *rows.dense()
    return r.missed_n, *(np.array(a) for a in r.missed_sums)


@pytest.mark.parametrize("strategy", ["numpy", "mlx"])  # the host step, the generic step
def test_mean_scores_make_the_estimate_exact_with_one_token_a_slot(strategy):
    """estimate_scores="mean" scores a slot by its own keys' mean: with one far token a slot it
    is that token's exact score, through real RoPE, four distance buckets and a random
    codebook, so the output is exact attention; so is "code_mean" with one far token a code
    (its slots are codes alone); the centroid scores of the same slots are not."""
    n, n_kv = 300, 2
    rng, keys, values = random_kv(n_kv, n, seed=5)
    rope = RopeSpec.from_module(initialize_rope(D, 10000.0, False, None, 8192), D)
    book = Codebook.random(1, n_kv, D, 512, seed=3)
    outputs = {}
    for scores in ("mean", "code_mean", "centroid"):
        config = A2ATSConfig(
            window=16, sinks=4, budget=6, far_buckets=4, estimate_missed=True,
            estimate_scores=scores,
        )  # fmt: skip
        with topk.forced(strategy):
            cache = A2ATSCache(0, rope, book, config, max_context=8192)
        cache.update_and_fetch(mx.array(keys[None]), mx.array(values))
        distinct = np.stack([rng.permutation(512)[:n] for _ in range(n_kv)]).astype(np.uint16)
        cache.codes[:, :, :n, 0] = mx.array(distinct[None])  # one token a code (so a slot)
        q = mx.array(np.random.default_rng(6).standard_normal((1, 4, 1, D)).astype(np.float32))
        outputs[scores] = np.array(cache.attend(q, None, None, scale=D**-0.5))
        assert cache.retrieved_steps == 1  # a retrieval step, not an exact one
    want = exact(q, keys, values, n)
    np.testing.assert_allclose(outputs["mean"], want, rtol=1e-4, atol=2e-5)
    np.testing.assert_allclose(outputs["code_mean"], want, rtol=1e-4, atol=2e-5)
    assert np.abs(outputs["centroid"] - want).max() > 1e-3


@pytest.fixture
def synced_step():
    """The synced host step, whose sums are NumPy's (`host_missed`; the graph step's, held in
    C++, are tests/engine/cache/test_graph_step.py's)."""
    with native_step.forced("native"):
        yield


@pytest.mark.parametrize("scores", ["centroid", "mean", "code_mean"])
@pytest.mark.parametrize("strategy", ["numpy", "mlx"])  # the host step's sums, the generic's
def test_incremental_sums_equal_a_rebuild_across_bucket_edges_trim_and_restore(
    strategy, scores, synced_step
):
    """The per-slot sums kept step by step equal the sums rebuilt from codes and values (and
    keys, with mean scores), also after tokens crossed bucket edges, after a trim and after
    `from_state` (never saved)."""
    n = 150
    rng, keys, values = random_kv(2, n + 80, seed=2)
    config = A2ATSConfig(
        window=8, sinks=3, budget=4, far_buckets=4, estimate_missed=True, estimate_scores=scores
    )
    rope = RopeSpec.from_module(initialize_rope(D, 10000.0, False, None, 8192), D)
    book = Codebook([mx.array(keys[:, None, :64])])  # 64 centroids: slots hold many tokens
    with topk.forced(strategy):
        cache = A2ATSCache(0, rope, book, config, max_context=8192)
    cache.update_and_fetch(mx.array(keys[None, :, :n]), mx.array(values[:, :, :n]))

    def step(c: A2ATSCache) -> None:
        m = c.offset
        c.update_and_fetch(mx.array(keys[None, :, m : m + 1]), mx.array(values[:, :, m : m + 1]))
        c.attend(mx.array(rng.standard_normal((1, 2, 1, D)), mx.float32), None, None, scale=0.2)

    def rebuilt(c: A2ATSCache):
        with topk.forced(strategy):
            fresh = A2ATSCache.from_state(c.state, c.meta_state, codebook=c.codebook)
        fresh.attend(mx.zeros((1, 2, 1, D)), None, None, scale=0.2)  # first step: a rebuild
        return held_sums(fresh)

    def placed_slots(c: A2ATSCache) -> np.ndarray:
        """The host step's slot of each far position, read through its placed row."""
        n, rows = c.retrieval.host_missed
        far = np.arange(config.sinks, n - config.window)
        return np.take_along_axis(rows.slot_of, rows.at(np.broadcast_to(far, (1, 2, far.size))), -1)

    def assert_same(c: A2ATSCache) -> None:
        if strategy == "numpy":  # each far token's row, kept step by step, is a rebuild's
            kept_rows = placed_slots(c)
            with topk.forced(strategy):
                fresh = A2ATSCache.from_state(c.state, c.meta_state, codebook=c.codebook)
            fresh.attend(mx.zeros((1, 2, 1, D)), None, None, scale=0.2)
            np.testing.assert_array_equal(kept_rows, placed_slots(fresh))
        kept, fresh = held_sums(c), rebuilt(c)
        assert kept[0] == fresh[0] == c.offset
        assert kept[1].sum() > 100  # the far region's tokens, all counted
        assert kept[2].shape[-1] == (D if scores == "centroid" else 2 * D)  # values (, keys)
        assert kept[1].shape[-1] == c.n_slots == (64 if scores == "code_mean" else 4 * 64)
        for a, b in zip(kept[1:], fresh[1:], strict=True):
            np.testing.assert_allclose(a, b, atol=1e-4)

    for _ in range(70):  # crosses several bucket edges (lower edges grow log-spaced)
        step(cache)
    assert (cache.retrieval.host_missed is not None) == (strategy == "numpy")
    assert_same(cache)
    cache.trim(5)
    step(cache)
    assert_same(cache)
    assert cache.retrieval.estimate_bytes > 0
    assert cache.nbytes > cache.resident_bytes + cache.retrieval.estimate_bytes


def test_estimate_runs_on_a_model_and_reports_its_mass():
    model = tiny_model("llama")
    geo = model_geometry(model)
    book = made_for(model, Codebook.random(geo.num_layers, geo.num_kv_heads, geo.head_dim, 64))
    config = A2ATSConfig(window=16, sinks=4, budget=8, estimate_missed=True, telemetry=True)
    cache = make_cache(model, config, book)
    model(mx.array([list(range(3, 203))]), cache=cache)
    logits = model(mx.array([[21]]), cache=cache)
    assert bool(mx.isfinite(logits).all())
    stats = cache[0].last_stats
    assert not stats.exact and all(0.0 < x < 1.0 for x in stats.missed_mass)
    assert not A2ATSConfig().estimate_missed  # the default: off (it slows decode on the CPU)
    assert not METHODS["a2ats_no_estimate"].config(A2ATSConfig()).estimate_missed
    assert METHODS["a2ats_estimate"].config(A2ATSConfig()).estimate_missed


def test_estimate_setting_is_validated_and_centroid_scores_off_with_product_vq():
    with pytest.raises(ValueError, match=r"A2ATSConfig\.estimate_missed=1"):
        A2ATSConfig(estimate_missed=1)
    assert decode_variant_knobs("a2ats_noest") == {"estimate_missed": False}
    with pytest.raises(ValueError, match=r"estimate_scores='median' must be one of centroid"):
        A2ATSConfig(estimate_scores="median")
    mean = {"estimate_missed": True, "estimate_scores": "mean"}
    assert decode_variant_knobs("a2ats_eb0_estm") == {"exact_below": 0, **mean}
    by_code = {"estimate_missed": True, "estimate_scores": "code_mean"}
    assert decode_variant_knobs("a2ats_eb0_estc") == {"exact_below": 0, **by_code}
    assert METHODS["a2ats_estimate_code"].config(A2ATSConfig()).estimate_scores == "code_mean"
    centroid = {"estimate_missed": True, "estimate_scores": "centroid"}  # as recorded
    assert decode_variant_knobs("a2ats_est") == centroid
    assert METHODS["a2ats_estimate"].config(A2ATSConfig()).estimate_scores == "centroid"
    assert A2ATSConfig().estimate_scores == "mean"  # what turning the estimate on gives
    assert METHODS["a2ats_estimate_mean"].config(A2ATSConfig()).estimate_scores == "mean"
    book = Codebook([mx.zeros((1, 2, 4, D // 2))])  # product VQ: 2 subspaces
    by_centroid = A2ATSConfig(estimate_missed=True, estimate_scores="centroid")
    with pytest.warns(UserWarning, match="centroid slot scores need a full-dimension codebook"):
        cache = A2ATSCache(0, IdentityRope(D), book, by_centroid, max_context=512)
    assert not cache.estimates
    for scores in ("mean", "code_mean"):  # their own keys score the slots: any codebook
        by_keys = A2ATSConfig(estimate_missed=True, estimate_scores=scores)
        assert A2ATSCache(0, IdentityRope(D), book, by_keys, max_context=512).estimates
    on = A2ATSConfig(estimate_missed=True)
    assert lossless_cache(on, np.zeros((1, 4, D), np.float32)).estimates


def test_the_reference_methods_stay_plain_top_k():
    """oracle_topk (the ceiling of plain top-K) and window keep dropping what they miss."""
    for name in ("oracle_topk", "window"):
        assert not METHODS[name].config(A2ATSConfig(), window_budget=9).estimate_missed
    on = A2ATSConfig(estimate_missed=True)
    assert METHODS["a2ats_plain_vq"].config(on).estimate_missed  # ablations inherit the run's


def test_fast_exp_matches_exp_and_sends_minus_infinity_to_zero():
    import numpy as np

    from a2ats_engine.cache.attention import fast_exp

    x = np.concatenate([np.linspace(-100.0, 80.0, 4001), [-np.inf, 0.0]]).astype(np.float32)
    got = np.array(fast_exp(mx.array(x)))
    want = np.exp(x.astype(np.float64))
    normal = want > 1.2e-38
    assert np.all(np.abs(got[normal] - want[normal]) <= 5e-6 * want[normal])
    assert np.all(got[~normal] <= 1.2e-38) and got[-2] == 0.0 and got[-1] == 1.0


def test_presets_name_the_default_and_the_quality_settings():
    """ "speed" is A2ATSConfig()'s rerank with the estimate left to the machine's measurement
    (None; tests/engine/cache/test_estimate_default.py), "quality" rerank 4 with the
    estimate scored by mean keys (the settings of the recorded 8K runs,
    docs/benchmarks/eval_8k_texts_rr4.json and tasks_8k_rr4.json); a preset leaves every other
    field as it is; a config with another rerank, or rerank 4 without the estimate, is no
    preset; an unknown name is refused by name; the flags' fields override the preset's."""
    import json
    from pathlib import Path

    from a2ats_engine.cache.config import PRESETS, preset_of, retrieval_fields, with_preset

    assert preset_of(A2ATSConfig()) == "speed"
    assert preset_of(A2ATSConfig(estimate_scores="centroid")) == "speed"  # the estimate is off
    held = A2ATSConfig(budget=0.05, estimate_scores="code_mean")
    quality = with_preset(held, "quality")
    assert preset_of(quality) == "quality" and quality.budget == 0.05
    assert (quality.rerank, quality.estimate_missed, quality.estimate_scores) == (4, True, "mean")
    assert preset_of(with_preset(quality, "speed")) == "speed"
    assert with_preset(quality, "speed").estimate_missed is None
    assert preset_of(A2ATSConfig(rerank=3)) is None
    assert preset_of(A2ATSConfig(rerank=4)) is None  # rerank 4 alone: custom
    assert preset_of(replace(quality, estimate_scores="code_mean")) is None
    with pytest.raises(ValueError, match="preset 'fast' is unknown: must be one of speed, quality"):
        with_preset(A2ATSConfig(), "fast")
    assert set(PRESETS) == {"speed", "quality"}
    assert retrieval_fields("quality", None, "code_mean") == {
        "rerank": 4,
        "estimate_missed": True,
        "estimate_scores": "code_mean",
    }
    assert retrieval_fields("quality", 3, "off") == {
        "rerank": 3,
        "estimate_missed": False,
        "estimate_scores": "mean",
    }
    assert retrieval_fields(None) == {"rerank": A2ATSConfig().rerank, "estimate_missed": None}
    assert replace(A2ATSConfig(), **retrieval_fields(None)) == A2ATSConfig()
    bench = Path(__file__).resolve().parents[3] / "docs/benchmarks"
    recorded = json.loads((bench / "eval_8k_texts_rr4.json").read_text())
    assert f"--rerank {PRESETS['quality']['rerank']}" in recorded["command"]
    assert "a2ats_estimate_mean" in recorded["command"]  # the estimate's scoring, measured
    recorded = json.loads((bench / "tasks_8k_rr4.json").read_text())
    assert f"--rerank {PRESETS['quality']['rerank']}" in recorded["command"]
    assert "a2ats_estimate_mean" in recorded["command"]


@pytest.mark.parametrize("subspaces", [1, 2])  # 2: product VQ
@pytest.mark.parametrize("scores", ["mean", "code_mean"])
@pytest.mark.parametrize("strategy", ["numpy", "mlx"])  # the host step, the generic step
def test_the_estimate_scores_only_the_tokens_left_in_a_slot(strategy, scores, subspaces):
    """A retrieved token leaves its slot: the slot's mean score is over the far tokens that
    were not retrieved. Here every slot's tokens share one key except three high-scoring
    "needles", each sharing its slot with three low-scoring tokens; the needles are retrieved,
    so what is left of every slot shares one key and the estimate is exact (exp of the mean
    score is the mean of the exps): the output is exact attention. Scored over the whole slot,
    a needle's score would lift its slot's mean and count its three neighbours far above
    their mass. With product VQ a slot is the first subspace's code: the same slots here (every
    subspace codes a token alike), and the same exact output."""
    n, C = 240, 10
    rng = np.random.default_rng(11)
    q_np = rng.standard_normal(D).astype(np.float32)
    q_np *= 3.0 / np.linalg.norm(q_np)
    base = rng.standard_normal((C, D)).astype(np.float32) * 0.3
    keys = rng.standard_normal((1, n, D)).astype(np.float32) * 0.3  # sinks and window: any
    values = rng.standard_normal((1, 1, n, D)).astype(np.float32)
    config = A2ATSConfig(
        window=16,
        sinks=4,
        budget=6,
        far_buckets=3,
        estimate_missed=True,
        estimate_scores=scores,
        telemetry=True,
    )
    far = np.arange(4, n - 16)
    codes = 3 + far % (C - 3)  # the filler slots
    needles = far[[20, 90, 160]]
    neighbours = far[[21, 22, 23, 91, 92, 93, 161, 162, 163]]
    codes[np.searchsorted(far, needles)] = [0, 1, 2]
    codes[np.searchsorted(far, neighbours)] = np.repeat([0, 1, 2], 3)
    keys[0, far] = base[codes]
    keys[0, needles] = 2.0 * q_np + base[[0, 1, 2]]
    centroids = base.copy()
    centroids[:3] = keys[0, needles]  # the needles' slots score highest: they are candidates
    split = centroids.reshape(C, subspaces, D // subspaces).swapaxes(0, 1)
    book = Codebook([mx.array(split[None])])  # [n_kv, S, C, d / S]
    with topk.forced(strategy):
        cache = A2ATSCache(0, IdentityRope(D), book, config, max_context=8192)
    assert cache.estimates
    cache.update_and_fetch(mx.array(keys[None]), mx.array(values))
    full_codes = np.zeros((1, 1, n, subspaces), np.uint16)
    full_codes[0, 0, far] = codes[:, None]
    cache.codes[:, :, :n] = mx.array(full_codes)
    q = mx.array(q_np.reshape(1, 1, 1, D))
    got = np.array(cache.attend(q, None, None, scale=D**-0.5))
    assert cache.retrieved_steps == 1
    np.testing.assert_allclose(got, exact(q, keys, values, n), rtol=1e-4, atol=2e-5)
    est = cache.last_stats.missed_mass[0]
    assert 0.0 < est < 1.0
