"""Per-layer budgets: A2ATSConfig.layer_budgets, the caches that run them, the allocation rules,
and per-layer recall / a2ats_alloc / a2ats_dense2 in `evaluate`."""

import json
import math

import mlx.core as mx
import numpy as np
import pytest
from tiny import made_for, tiny_model

from a2ats_engine import load_session, save_session
from a2ats_engine.bench.evaluate import development_span, evaluate
from a2ats_engine.bench.methods import method_spec
from a2ats_engine.cache.a2ats_cache import A2ATSCache
from a2ats_engine.cache.codebook import Codebook
from a2ats_engine.cache.config import A2ATSConfig, scaled_budget
from a2ats_engine.cache.geometry import rope_specs
from a2ats_engine.cache.layer_budgets import (
    allocate_layer_budgets,
    dense_first_budgets,
    equal_cost_dense,
)
from a2ats_engine.cache.model_cache import make_cache, snapshot

from .test_cache import D, decode_query, filled_cache, random_codebook

# -- the setting --------------------------------------------------------------------------------


def test_layer_budgets_are_validated_and_kept_as_a_tuple():
    assert A2ATSConfig(layer_budgets=[1, 0.5]).layer_budgets == (1.0, 0.5)
    for bad, where in [
        ((), "layer_budgets="),
        ("12", "layer_budgets="),
        ((1.0, 0.0), r"layer_budgets\[1\]=0.0"),
        ((-1.0,), r"layer_budgets\[0\]=-1.0"),
        ((math.inf,), r"layer_budgets\[0\]=inf"),
        ((math.nan,), r"layer_budgets\[0\]=nan"),
        ((True,), r"layer_budgets\[0\]=True"),
        (("2",), r"layer_budgets\[0\]='2'"),
    ]:
        with pytest.raises(ValueError, match=rf"A2ATSConfig\.{where}.*out of range"):
            A2ATSConfig(layer_budgets=bad)


def test_layer_budgets_survive_json_and_keep_the_config_hashable():
    config = A2ATSConfig(budget=0.05, layer_budgets=(0.5, 2.0))
    back = A2ATSConfig.from_dict(json.loads(json.dumps(config.to_dict())))
    assert back == config and back.layer_budgets == (0.5, 2.0)
    assert hash(back) == hash(config)
    assert A2ATSConfig.from_dict(A2ATSConfig().to_dict()).layer_budgets is None


def test_each_layer_runs_its_scaled_budget():
    config = A2ATSConfig(budget=0.1, layer_budgets=(0.5, 3.0, 20.0))
    assert config.for_layer(0) == A2ATSConfig(budget=0.05)
    assert config.for_layer(1).budget == pytest.approx(0.3)
    assert config.for_layer(2).budget == 1.0  # capped: the layer is dense
    assert A2ATSConfig().for_layer(7) == A2ATSConfig()
    with pytest.raises(ValueError, match="3 entries, no entry for layer 3"):
        config.for_layer(3)
    # an int budget scales to a rounded count, never under 1
    assert scaled_budget(10, 1.26) == 13 and scaled_budget(10, 0.01) == 1
    assert A2ATSConfig(budget=10, layer_budgets=(0.5,)).for_layer(0).budget == 5


def test_make_cache_checks_the_length_against_the_model():
    model = tiny_model("llama")  # 2 layers
    with pytest.raises(ValueError, match="layer_budgets has 3 entries, the model has 2 layers"):
        make_cache(model, A2ATSConfig(layer_budgets=(1.0, 1.0, 1.0)), random_codebook(model))


# -- the caches ---------------------------------------------------------------------------------


def _decode(model, config, n=300):
    cache = make_cache(model, config, random_codebook(model))
    model(mx.array([[3 + i % 390 for i in range(n)]]), cache=cache)
    model(mx.array([[9]]), cache=cache)
    return cache, snapshot(cache)


def test_a_layer_with_a_larger_multiplier_retrieves_more():
    model = tiny_model("llama", num_hidden_layers=3)
    base = A2ATSConfig(window=16, sinks=4, budget=0.1, min_k=1, telemetry=True)
    cache, snap = _decode(model, A2ATSConfig(**{**base.to_dict(), "layer_budgets": (0.5, 1, 2)}))
    n = snap.offset  # 301
    ks = [c.config.top_k(n) for c in cache]
    assert ks == [math.ceil(0.05 * n), math.ceil(0.1 * n), math.ceil(0.2 * n)]
    G = 2  # query heads per KV head of the tiny model
    per_layer = [[len(r) for r in layer.retrieved] for layer in snap.layers]
    for k, counts in zip(ks, per_layer, strict=True):
        assert all(k <= c <= G * k for c in counts)  # the GQA union of K per query head
    assert max(per_layer[0]) < min(per_layer[1]) and max(per_layer[1]) < min(per_layer[2])
    # the mean multiplier sets the total: (0.5, 1, 1.5) retrieves what (1, 1, 1) does
    same = A2ATSConfig(**{**base.to_dict(), "layer_budgets": (0.5, 1, 1.5)})
    total = sum(c.config.top_k(n) for c in make_cache(model, same, random_codebook(model)))
    plain = sum(c.config.top_k(n) for c in make_cache(model, base, random_codebook(model)))
    assert total == pytest.approx(plain, abs=len(ks))  # ceil per layer


def test_a_dense_layer_attends_exactly():
    budget = 0.05
    config = A2ATSConfig(window=16, sinks=4, budget=budget, telemetry=True)
    dense = A2ATSConfig(**{**config.to_dict(), "layer_budgets": (1 / budget,)})
    outputs = {}
    for name, cfg in (("plain", config), ("dense", dense)):
        cache, _, rope = filled_cache(n=300, n_kv=1, config=cfg)
        _, q = decode_query(rope, 2, 299)
        n = cache.offset
        keys, values = cache.keys[..., :n, :], cache.values[..., :n, :]
        out = cache.attend(q, keys, values, scale=D**-0.5)
        exact = mx.fast.scaled_dot_product_attention(q, keys, values, scale=D**-0.5)
        outputs[name] = float(mx.abs(out - exact).max())
        stats = cache.last_stats
        assert stats.exact == (name == "dense")
    assert outputs["dense"] == 0.0  # the exact-attention path itself
    assert outputs["plain"] > 1e-3  # retrieval drops something at this budget


def test_a_restored_session_keeps_each_layers_budget(tmp_path):
    model = tiny_model("llama")
    config = A2ATSConfig(window=16, sinks=4, budget=0.1, layer_budgets=(0.5, 2.0))
    book = made_for(model, Codebook.random(2, 2, 16, 64, seed=3))
    cache = make_cache(model, config, book)
    model(mx.array([list(range(3, 250))]), cache=cache)
    save_session(tmp_path / "s.safetensors", cache)
    a = model(mx.array([[17]]), cache=cache)
    restored, _ = load_session(tmp_path / "s.safetensors", model)
    assert [c.config for c in restored] == [config.for_layer(0), config.for_layer(1)]
    b = model(mx.array([[17]]), cache=restored)
    assert float(mx.abs(a - b).max()) < 1e-6


# -- the allocation rules -----------------------------------------------------------------------


def test_allocation_follows_the_missed_mass_at_mean_one():
    # misses 0.01 and 0.04: weights sqrt -> 0.1 and 0.2, so multipliers 2/3 and 4/3
    got = allocate_layer_budgets([0.99, 0.96, None])
    assert got == pytest.approx((2 / 3, 4 / 3, 1.0))
    got = allocate_layer_budgets([0.99, 0.96], power=1.0)  # misses 1:4
    assert got == pytest.approx((0.4, 1.6))
    assert allocate_layer_budgets([0.9, 0.9, 0.9]) == pytest.approx((1.0, 1.0, 1.0))
    assert allocate_layer_budgets([1.0, 1.0]) == (1.0, 1.0)
    assert allocate_layer_budgets([None, None]) == (1.0, 1.0)


def test_allocation_is_clipped_and_renormalised():
    recall = [0.999, 0.99, 0.97, 0.95, 0.9, 0.6]
    got = allocate_layer_budgets(recall, floor=0.5, cap=2.0, power=1.0)
    assert np.mean(got) == pytest.approx(1.0, abs=1e-9)
    assert min(got) >= 0.5 - 1e-12 and max(got) <= 2.0 + 1e-12
    assert got[0] == pytest.approx(0.5) and got[-1] == pytest.approx(2.0)  # both clipped
    assert list(got) == sorted(got)  # lower recall, more budget
    # the unclipped layers keep the proportion of their missed mass
    free = [i for i, m in enumerate(got) if 0.5 < m < 2.0]
    ratios = [got[i] / (1 - recall[i]) for i in free]
    assert len(free) >= 2 and max(ratios) == pytest.approx(min(ratios))


def test_allocation_when_some_layers_missed_nothing():
    # one layer missed something: it takes the cap; the others share the rest equally
    got = allocate_layer_budgets([1.0, 1.0, 0.9], floor=0.25, cap=2.0)
    assert got == pytest.approx((0.5, 0.5, 2.0))
    got = allocate_layer_budgets([1.0, 0.8, 0.9], floor=0.25, cap=4.0)
    assert got[0] == pytest.approx(0.25) and np.mean(got) == pytest.approx(1.0)


def test_allocation_rejects_bad_input():
    with pytest.raises(ValueError, match=r"recall_per_layer\[1\]=1.5"):
        allocate_layer_budgets([0.9, 1.5])
    with pytest.raises(ValueError, match="floor"):
        allocate_layer_budgets([0.9], floor=1.5)
    with pytest.raises(ValueError, match="cap"):
        allocate_layer_budgets([0.9], cap=0.5)
    with pytest.raises(ValueError, match="power"):
        allocate_layer_budgets([0.9], power=0.0)


def test_dense_first_keeps_the_mean_fraction_when_it_can():
    got = dense_first_budgets(30, 2, 0.1)
    fractions = [min(1.0, 0.1 * m) for m in got]
    assert fractions[:2] == pytest.approx([1.0, 1.0]) and np.mean(fractions) == pytest.approx(0.1)
    assert equal_cost_dense(30, 2, 0.1)
    # at 0.03 two dense layers cost more than the whole budget: the rest sit at the floor
    got = dense_first_budgets(30, 2, 0.03)
    assert got[2:] == (0.25,) * 28 and not equal_cost_dense(30, 2, 0.03)
    assert np.mean([min(1.0, 0.03 * m) for m in got]) > 0.03
    with pytest.raises(ValueError, match="fractional budget"):
        dense_first_budgets(30, 2, 64)
    with pytest.raises(ValueError, match="dense=30"):
        dense_first_budgets(30, 30, 0.1)


# -- the evaluation -----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny():
    model = tiny_model("llama", hidden_size=256)  # 2 layers, head_dim 64
    book = Codebook.random(2, 2, 64, 32, seed=3)
    ids = [int(x) for x in np.random.default_rng(0).integers(0, 400, 700)]
    return model, book, ids


def test_recall_per_layer_averages_to_the_recall(tiny):
    model, book, ids = tiny
    (run,) = evaluate(
        model, ids, context=300, decode=5, budgets=[0.05], codebooks={"a2ats": book},
        config=A2ATSConfig(), methods=("full", "a2ats", "oracle_topk"),
    )  # fmt: skip
    for name in ("a2ats", "oracle_topk"):
        result = run.methods[name]
        per_layer = result.recall_per_layer
        assert len(per_layer) == 2 and all(0.0 < r < 1.0 for r in per_layer)
        assert np.mean(per_layer) == pytest.approx(result.recall, rel=1e-12)
        assert result.to_dict()["recall_per_layer"] == [round(r, 5) for r in per_layer]
    assert run.methods["full"].recall_per_layer is None  # attends everything: nothing per layer
    assert "recall_per_layer" not in run.methods["full"].to_dict()


def test_alloc_measures_on_the_development_span_and_keeps_the_mean(tiny):
    model, book, ids = tiny
    kw = {"context": 300, "decode": 5, "codebooks": {"a2ats": book}, "config": A2ATSConfig()}
    (run,) = evaluate(model, ids, budgets=[0.2], methods=("a2ats", "a2ats_alloc"), **kw)
    alloc = run.methods["a2ats_alloc"]
    assert len(alloc.layer_budgets) == 2 and np.mean(alloc.layer_budgets) == pytest.approx(1.0)
    # equal cost: as many positions attended as plain a2ats (up to the GQA unions)
    assert alloc.attended_per_head == pytest.approx(run.methods["a2ats"].attended_per_head, 0.05)
    # the multipliers are the rule applied to plain a2ats's recall on tokens 306-612
    (dev,) = evaluate(model, ids[306:612], budgets=[0.2], methods=("a2ats",), **kw)
    dev_recall = dev.methods["a2ats"].recall_per_layer
    assert alloc.dev_recall_per_layer == pytest.approx(dev_recall)
    assert alloc.layer_budgets == pytest.approx(allocate_layer_budgets(dev_recall))
    lower = int(np.argmin(dev_recall))
    assert alloc.layer_budgets[lower] > 1.0 > alloc.layer_budgets[1 - lower]
    out = alloc.to_dict()
    assert len(out["layer_budgets"]) == 2 and len(out["recall_per_layer"]) == 2
    assert "layer_budgets" not in run.methods["a2ats"].to_dict()
    # another development text gives its own allocation
    other = [int(x) for x in np.random.default_rng(7).integers(0, 400, 306)]
    (run2,) = evaluate(
        model, ids, budgets=[0.2], methods=("a2ats_alloc",), dev_ids=other, **kw
    )  # fmt: skip
    (dev2,) = evaluate(model, other, budgets=[0.2], methods=("a2ats",), **kw)
    assert run2.methods["a2ats_alloc"].dev_recall_per_layer == pytest.approx(
        dev2.methods["a2ats"].recall_per_layer
    )


def test_alloc_needs_a_development_span(tiny):
    model, book, ids = tiny
    with pytest.raises(ValueError, match="after the evaluated span has 94 tokens, needs 306"):
        evaluate(
            model, ids[:400], context=300, decode=5, budgets=[0.05], codebooks={"a2ats": book},
            methods=("a2ats_alloc",),
        )  # fmt: skip
    assert development_span(ids, None, 300, 5) == ids[306:612]
    with pytest.raises(ValueError, match="development text has 10 tokens"):
        development_span(ids, ids[:10], 300, 5)
    model_spec = tiny_model("llama", hidden_size=256)
    with pytest.raises(ValueError, match="a2ats_alloc needs layer_budgets"):
        method_spec("a2ats_alloc", model_spec, A2ATSConfig(), {"a2ats": book})


def test_dense2_layers_attend_exactly(tiny):
    _, _, ids = tiny
    model3 = tiny_model("llama", hidden_size=256, num_hidden_layers=3)
    book3 = Codebook.random(3, 2, 64, 32, seed=3)
    (run,) = evaluate(
        model3, ids, context=300, decode=4, budgets=[0.5], codebooks={"a2ats": book3},
        config=A2ATSConfig(), methods=("a2ats", "a2ats_dense2"),
    )  # fmt: skip
    dense = run.methods["a2ats_dense2"]
    assert dense.layer_budgets == pytest.approx((2.0, 2.0, 0.25))  # (3 - 2/0.5) / 1 < floor
    per_layer = dense.recall_per_layer
    assert per_layer[:2] == [None, None] and 0.0 < per_layer[2] < 1.0  # dense: never selected
    assert dense.recall == pytest.approx((2 * 1.0 + per_layer[2]) / 3, abs=1e-6)
    spec = method_spec("a2ats_dense2", model3, A2ATSConfig(budget=0.5), {"a2ats": book3})
    caches = [spec.factory(i, s) for i, s in enumerate(rope_specs(model3))]
    assert [c.config.budget for c in caches] == [1.0, 1.0, 0.125]
    assert all(isinstance(c, A2ATSCache) for c in caches)
