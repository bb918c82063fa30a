"""Evaluation metrics on hand-made cases, the method caches, and `evaluate` on a tiny model."""

import math

import mlx.core as mx
import numpy as np
import pytest
from mlx_lm.models.cache import KVCache, QuantizedKVCache
from tiny import tiny_model

from a2ats_engine.bench.eval_metrics import (
    attention_recall,
    perplexity,
    relative_l2_error,
    token_nll,
)
from a2ats_engine.bench.evaluate import (
    IdentityRope,
    MeasuredCache,
    OracleTopKCache,
    RecentWindowCache,
    evaluate,
)
from a2ats_engine.cache import attention as att
from a2ats_engine.cache.a2ats_cache import A2ATSCache
from a2ats_engine.cache.codebook import Codebook
from a2ats_engine.cache.config import A2ATSConfig
from a2ats_engine.cache.geometry import rope_specs

# -- metric functions -------------------------------------------------------------------------


def test_recall_of_a_known_selection():
    probs = np.array([[0.5, 0.3, 0.2], [0.1, 0.1, 0.8]])
    attended = np.array([True, False, True])
    assert attention_recall(probs, attended) == pytest.approx((0.7 + 0.9) / 2)
    assert attention_recall(probs, np.ones(3, bool)) == pytest.approx(1.0)
    assert attention_recall(probs, np.zeros(3, bool)) == 0.0


def test_recall_with_a_selection_per_row():
    probs = np.full((2, 4), 0.25)
    attended = np.array([[True, True, False, False], [True, False, False, False]])
    assert attention_recall(probs, attended) == pytest.approx((0.5 + 0.25) / 2)


def test_relative_l2_error():
    exact = np.array([3.0, 4.0])
    assert relative_l2_error(exact * 1.1, exact) == pytest.approx(0.1)
    assert relative_l2_error(exact, exact) == 0.0
    assert relative_l2_error(np.zeros(2), np.zeros(2)) == 0.0


def test_perplexity_of_a_uniform_distribution_is_the_vocab_size():
    logits = np.zeros((5, 7))
    assert perplexity(logits, np.arange(5)) == pytest.approx(7.0)


def test_perplexity_of_a_known_distribution():
    # p(target) = 0.5 at one step and 0.25 at the other: ppl = exp(-(ln .5 + ln .25) / 2) = 2^1.5
    logits = np.log(np.array([[0.5, 0.25, 0.25], [0.25, 0.25, 0.5]]))
    targets = np.array([0, 1])
    assert token_nll(logits, targets) == pytest.approx([math.log(2), math.log(4)])
    assert perplexity(logits, targets) == pytest.approx(2**1.5)
    # shifting logits by a constant changes nothing
    assert perplexity(logits + 3.0, targets) == pytest.approx(2**1.5)


# -- method caches ------------------------------------------------------------------------------


def _layer_cache(cls, n: int, keys: mx.array, config: A2ATSConfig, rope=None):
    model = tiny_model("llama")
    spec = rope or rope_specs(model)[0]
    book = Codebook.random(2, 2, 16, 8)
    cache = cls(0, spec, book, config, 4096)
    values = mx.random.normal(keys.shape)
    cache.update_and_fetch(keys, values)
    return cache


def test_oracle_selects_the_tokens_with_the_highest_exact_scores():
    n, d = 200, 16
    mx.random.seed(1)
    keys = mx.random.normal((1, 2, n, d)) * 0.01
    query = mx.ones((1, 4, 1, d))
    hot = [20, 57, 101]
    for p in hot:
        keys[:, :, p, :] = 1.0
    config = A2ATSConfig(budget=3, window=16, sinks=4, telemetry=True)
    cache = _layer_cache(OracleTopKCache, n, keys, config)
    lay = att.layout(n, 16, 4, 3)
    scores = cache.far_token_scores(query, lay)
    top = np.sort(np.argsort(-np.array(scores[0, 0, 0]))[:3] + lay.n_sinks)
    assert top.tolist() == hot


def test_recent_window_selects_the_latest_far_tokens():
    n, d = 120, 16
    keys = mx.random.normal((1, 2, n, d))
    config = A2ATSConfig(budget=10, window=16, sinks=4, telemetry=True)
    cache = _layer_cache(RecentWindowCache, n, keys, config)
    # one decode step through attend: the selection is sinks + [n+1-16-10, n+1)
    q = mx.random.normal((1, 4, 1, d))
    k_new, v_new = mx.random.normal((1, 2, 1, d)), mx.random.normal((1, 2, 1, d))
    k_all, v_all = cache.update_and_fetch(k_new, v_new)
    cache.attend(q, k_all, v_all, scale=d**-0.5)
    selected = cache.last_stats.selected[0]
    expected = list(range(4)) + list(range(n + 1 - 16 - 10, n + 1))
    assert selected.tolist() == expected


def test_identity_rope_cache_codes_post_rope_keys():
    n, d = 50, 16
    keys = mx.random.normal((1, 2, n, d))
    config = A2ATSConfig(budget=4, window=8, sinks=2)
    cache = _layer_cache(A2ATSCache, n, keys, config, rope=IdentityRope(d))
    assert mx.array_equal(cache.codes[..., :n, :], cache.codebook.assign(0, keys))


def test_measured_full_cache_has_recall_one_and_no_output_error():
    d = 16
    inner = KVCache()
    cache = MeasuredCache(inner)
    cache.update_and_fetch(mx.random.normal((1, 2, 30, d)), mx.random.normal((1, 2, 30, d)))
    k, v = cache.update_and_fetch(mx.random.normal((1, 2, 1, d)), mx.random.normal((1, 2, 1, d)))
    out = cache.attend(mx.random.normal((1, 4, 1, d)), k, v, scale=0.25)
    assert out.shape == (1, 4, 1, d)
    assert cache.offset == 31  # delegated to the wrapped cache
    assert cache.record.recall == [pytest.approx(1.0)]
    assert cache.record.output_error[0] < 1e-6
    assert cache.record.attended == [31.0]


# -- evaluate on a tiny model -------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny():
    model = tiny_model("llama", hidden_size=256)  # head_dim 64: kv8/kv4 group size fits
    book = Codebook.random(2, 2, 64, 32, seed=3)
    ids = [int(x) for x in np.random.default_rng(0).integers(0, 400, 400)]
    return model, book, ids


def test_evaluate_metrics_are_consistent(tiny):
    model, book, ids = tiny
    books = {"a2ats": book, "random": Codebook.random(2, 2, 64, 32, seed=9)}
    methods = (
        "full", "kv8", "kv4", "a2ats", "window", "oracle_topk", "a2ats_no_rerank", "a2ats_paper",
        "a2ats_random", "a2ats_exact_keys", "a2ats_exact_rope",
    )  # fmt: skip
    (run,) = evaluate(
        model, ids, context=300, decode=5, budgets=[0.05], codebooks=books,
        config=A2ATSConfig(), methods=methods,
    )  # fmt: skip
    m = run.methods
    assert list(m) == list(methods)
    assert m["full"].recall == pytest.approx(1.0)
    assert m["full"].output_rel_error < 1e-5
    assert m["full"].argmax_agreement == 1.0
    assert m["full"].ppl_vs_full == pytest.approx(1.0)
    assert m["kv4"].ppl_vs_full == pytest.approx(m["kv4"].ppl / m["full"].ppl)
    low, high = m["kv4"].ppl_vs_full_ci95
    assert low <= m["kv4"].ppl_vs_full <= high
    assert m["kv8"].recall == pytest.approx(1.0)
    assert 0 < m["kv8"].output_rel_error < m["kv4"].output_rel_error < 0.5
    assert m["kv4"].bytes_per_token < m["kv8"].bytes_per_token < m["full"].bytes_per_token
    for name in methods[3:]:
        assert 0.0 < m[name].recall < 1.0, name
        assert m[name].attended_per_head < 300
        assert m[name].output_rel_error > 0.0
        assert m[name].ppl > 1.0
    # window attends as many far tokens as a2ats retrieved on average
    assert m["window"].retrieved_per_head == pytest.approx(round(m["a2ats"].retrieved_per_head))
    assert m["window"].bytes_per_token < m["full"].bytes_per_token
    # a2ats holds full K/V plus 2-byte codes per token per KV head and layer
    assert m["a2ats"].bytes_per_token > m["full"].bytes_per_token
    # same codebook and one of the same bucket settings: selection differs only by the buckets
    assert m["a2ats_paper"].attended_per_head == pytest.approx(m["a2ats"].attended_per_head, 0.2)
    # rerank keeps the exact best of twice as many candidates: more of the attention mass
    assert m["a2ats"].recall > m["a2ats_no_rerank"].recall


def test_the_estimate_on_the_layer_that_misses_most_is_measured_per_layer(tiny):
    """`a2ats_estimate_top1`: the estimate on all layers for the first retrieval steps, then on
    the one that misses most: the run records which one, and the per-layer output error shows
    it (that layer as with the estimate everywhere's first steps, the other as without)."""
    model, book, ids = tiny
    methods = ("full", "a2ats", "a2ats_estimate_mean", "a2ats_estimate_top1")
    (run,) = evaluate(
        model, ids, context=300, decode=12, budgets=[0.05], codebooks={"a2ats": book},
        config=A2ATSConfig(), methods=methods,
    )  # fmt: skip
    m = run.methods
    (kept,) = m["a2ats_estimate_top1"].estimate_kept
    assert m["a2ats_estimate_mean"].estimate_kept is None and m["a2ats"].estimate_kept is None
    errors = {name: m[name].error_per_layer for name in methods[1:]}
    assert all(len(e) == 2 and None not in e for e in errors.values())
    assert m["a2ats_estimate_top1"].to_dict()["estimate_layers"] == [kept]
    assert m["a2ats"].output_rel_error == pytest.approx(np.mean(errors["a2ats"]))
    # with the estimate kept on one layer only, its error lies between none and everywhere
    other = 1 - kept
    top1, every, none = (
        errors["a2ats_estimate_top1"],
        errors["a2ats_estimate_mean"],
        errors["a2ats"],
    )
    assert every[kept] < none[kept] and top1[kept] < none[kept]
    assert top1[other] > every[other]


def test_evaluate_with_nothing_to_drop_equals_full(tiny):
    model, book, ids = tiny
    (run,) = evaluate(
        model, ids, context=60, decode=4, budgets=[1.0], codebooks={"a2ats": book},
        config=A2ATSConfig(), methods=("full", "a2ats", "oracle_topk"),
    )  # fmt: skip
    full, a2 = run.methods["full"], run.methods["a2ats"]
    assert a2.recall == pytest.approx(1.0)
    assert a2.output_rel_error < 1e-4
    assert a2.ppl == pytest.approx(full.ppl, rel=1e-4)
    assert a2.argmax_agreement == 1.0


@pytest.mark.parametrize("bits", [8, 4])
def test_kv_bits_are_measured_against_the_exact_float_reference(tiny, bits):
    model, book, ids = tiny
    config = A2ATSConfig(kv_bits=bits)
    (run,) = evaluate(
        model, ids, context=60, decode=4, budgets=[1.0], codebooks={"a2ats": book},
        config=config, methods=("full", "a2ats"),
    )  # fmt: skip
    full, a2 = run.methods["full"], run.methods["a2ats"]
    # nothing is dropped, so every attention position is kept: recall 1 ...
    assert a2.recall == pytest.approx(1.0)
    # ... but the output differs from exact float attention by the quantization alone
    assert (1e-4 if bits == 8 else 2e-3) < a2.output_rel_error < (0.02 if bits == 8 else 0.3)
    assert a2.bytes_per_token < full.bytes_per_token
    assert a2.ppl_vs_full is not None
    # the same rows are read, in the stored format: bits/8 per element + fp32 scale, bias
    assert a2.attended_fraction == full.attended_fraction == 1.0
    ratio = (64 * bits // 8 + 2 * 4) / (64 * 4)
    assert a2.bytes_read["rows"] / full.bytes_read["rows"] == pytest.approx(ratio)


def test_evaluate_kv_bits_4_is_worse_than_8(tiny):
    model, book, ids = tiny
    errors = {}
    for bits in (8, 4):
        (run,) = evaluate(
            model, ids, context=300, decode=3, budgets=[0.05], codebooks={"a2ats": book},
            config=A2ATSConfig(kv_bits=bits), methods=("a2ats",),
        )  # fmt: skip
        errors[bits] = run.methods["a2ats"].output_rel_error
    assert errors[8] < errors[4]


def test_evaluate_rejects_bad_arguments(tiny):
    model, book, ids = tiny
    with pytest.raises(ValueError, match="tokens"):
        evaluate(model, ids[:50], context=48, decode=4, budgets=[0.03], codebooks={"a2ats": book})
    with pytest.raises(ValueError, match="unknown method"):
        evaluate(model, ids, context=48, decode=4, budgets=[0.03], codebooks={"a2ats": book},
                 methods=("full", "h2o"))  # fmt: skip
    with pytest.raises(ValueError, match="budget"):
        evaluate(model, ids, context=48, decode=4, budgets=[1.5], codebooks={"a2ats": book})


def test_paired_ppl_ratio():
    from a2ats_engine.bench.eval_metrics import paired_ppl_ratio

    ref = np.array([1.0, 2.0, 3.0, 4.0])
    ratio, low, high = paired_ppl_ratio(ref + 0.1, ref)
    assert ratio == pytest.approx(math.exp(0.1))
    assert low == pytest.approx(ratio) and high == pytest.approx(ratio)  # constant shift: no spread
    ratio, low, high = paired_ppl_ratio(ref + np.array([0.0, 0.2, 0.0, 0.2]), ref)
    assert ratio == pytest.approx(math.exp(0.1))
    assert low < ratio < high


def _lossless_setup(n=300, far_buckets=4):
    """A one-layer cache whose codebook holds every pre-RoPE key as its own centroid."""
    model = tiny_model("llama")
    spec = rope_specs(model)[0]
    mx.random.seed(5)
    post = spec.rotate(mx.random.normal((1, 2, n, 16)), 0)
    pre = spec.unrotate(post, 0)
    book = Codebook([pre[0][:, None]])  # [n_kv, S=1, K=n, d]: centroid j = key j
    config = A2ATSConfig(budget=8, window=16, sinks=4, far_buckets=far_buckets)
    query = mx.random.normal((1, 4, 1, 16))
    lay = att.layout(n, 16, 4, 8)

    def scores(cls):
        cache = cls(0, spec, book, config, 4096)
        cache.update_and_fetch(post, mx.zeros_like(post))
        return np.array(cache.far_token_scores(query, lay))

    return scores


def test_exact_keys_diagnostic_equals_a2ats_with_a_lossless_codebook():
    from a2ats_engine.bench.evaluate import ExactKeyWRopeCache

    for buckets in (1, 4):
        scores = _lossless_setup(far_buckets=buckets)
        np.testing.assert_allclose(scores(ExactKeyWRopeCache), scores(A2ATSCache), atol=2e-4)


def test_exact_rope_diagnostic_equals_oracle_with_a_lossless_codebook():
    from a2ats_engine.bench.evaluate import CodedExactRopeCache

    scores = _lossless_setup()
    exact, coded = scores(OracleTopKCache), scores(CodedExactRopeCache)
    np.testing.assert_allclose(coded, exact, atol=2e-4)
    assert not np.allclose(scores(A2ATSCache), exact, atol=1e-2)  # buckets do approximate


def test_method_registry_builds_each_variant_from_the_run_config():
    from a2ats_engine.bench.methods import METHODS, method_spec

    model = tiny_model("llama", hidden_size=256)
    spec = rope_specs(model)[0]
    base = A2ATSConfig(window=32, sinks=4, budget=0.1, far_buckets=3, rerank=3)
    books = {name: Codebook.random(2, 2, 64, 16, seed=1) for name in ("a2ats", "plain_vq")}
    books["no_wrope"] = Codebook.random(2, 2, 64, 16, seed=2)

    def built(name, **kw):
        return method_spec(name, model, base, books, **kw).factory(0, spec)

    paper = built("a2ats_paper")
    assert (paper.config.far_buckets, paper.config.far_offset, paper.config.rerank) == (1, 2048, 1)
    assert paper.codebook is books["a2ats"]  # no "paper" codebook given: falls back
    assert (paper.config.window, paper.config.sinks, paper.config.budget) == (32, 4, 0.1)
    assert built("a2ats").config == A2ATSConfig(  # the estimate as named: not as measured here
        window=32, sinks=4, budget=0.1, far_buckets=3, rerank=3, telemetry=True,
        estimate_missed=False,
    )  # fmt: skip
    assert built("a2ats_no_rerank").config.rerank == 1
    assert built("a2ats_plain_vq").codebook is books["plain_vq"]
    no_wrope = built("a2ats_no_wrope")
    assert isinstance(no_wrope.rope, IdentityRope) and no_wrope.config.far_buckets == 1
    window = built("window", window_budget=7)
    assert isinstance(window, RecentWindowCache) and window.config.budget == 7
    assert isinstance(built("oracle_topk"), OracleTopKCache)
    assert isinstance(built("kv4"), QuantizedKVCache)
    with pytest.raises(ValueError, match="window"):
        built("window")
    with pytest.raises(ValueError, match="'random' codebook"):
        built("a2ats_random")
    with pytest.raises(ValueError, match="unknown method 'h2o'"):
        built("h2o")
    assert list(METHODS)[:4] == ["full", "kv8", "kv4", "a2ats"]
