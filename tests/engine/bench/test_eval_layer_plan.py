"""The measurements follow the layer plan: every method's caches are built per layer from one
prefill with the model's own caches, native layers (sliding windows above all) copied as they are.

Reference everywhere: the model's own caches (mlx-lm's `make_prompt_cache`), prefilled and then
teacher-forced token by token, computed here independently of `evaluate`.
"""

import mlx.core as mx
import numpy as np
import pytest
from mlx_lm.models.cache import ArraysCache, KVCache, RotatingKVCache, make_prompt_cache

from a2ats_engine.bench.evaluate import build_caches, evaluate, method_spec, prefill
from a2ats_engine.bench.plan_caches import clone_native, plan_caches
from a2ats_engine.cache.a2ats_cache import A2ATSCache
from a2ats_engine.cache.codebook import Codebook
from a2ats_engine.cache.config import A2ATSConfig
from a2ats_engine.cache.layer_plan import A2ATS, plan_for
from a2ats_engine.cache.model_matrix import FAMILIES, tiny_family_model

REFUSED = {"gemma2", "cohere2", "exaone4", "deepseek_v3"}  # as in test_model_matrix.py
SUPPORTED = [f for f in FAMILIES if f not in REFUSED]
SLIDING = ["gemma3_text", "llama_sliding"]
CONTEXT, DECODE = 300, 8  # more than one prefill chunk (256): a sliding layer's ring has wrapped
IDS = [int(t) for t in np.random.default_rng(3).integers(3, 120, size=CONTEXT + DECODE + 1)]
KEEP_ALL = A2ATSConfig(window=4, sinks=2, budget=CONTEXT + DECODE + 8)


def codebook_for(model) -> Codebook:
    from a2ats_engine.cache.geometry import model_geometry

    first = next(c for c in plan_for(model).layers if c.kind == A2ATS)
    layers = model_geometry(model).num_layers
    return Codebook.random(layers, first.n_kv_heads, first.head_dim, 16, seed=1)


def own_cache_nll(model, ids, context: int, decode: int) -> np.ndarray:
    """Per-token NLL of ids[context + 1 : context + decode + 1] with the model's own caches."""
    cache = make_prompt_cache(model)
    mx.eval(model(mx.array([ids[:context]]), cache=cache))
    out = []
    for t in range(context, context + decode):
        logits = model(mx.array([[ids[t]]]), cache=cache)[0, -1].astype(mx.float32)
        out.append(float(mx.logsumexp(logits) - logits[ids[t + 1]]))
    return np.array(out)


@pytest.fixture(scope="module", params=SUPPORTED)
def family(request):
    return request.param, tiny_family_model(request.param)


def test_eval_full_equals_the_models_own_caches_on_every_family(family):
    name, model = family
    reference = own_cache_nll(model, IDS, CONTEXT, DECODE)
    (run,) = evaluate(
        model, IDS, context=CONTEXT, decode=DECODE, budgets=[0.5], codebooks={},
        methods=("full",),
    )  # fmt: skip
    full = run.methods["full"]
    np.testing.assert_allclose(full.nll, reference, rtol=1e-4, atol=1e-4, err_msg=name)
    assert full.ppl == pytest.approx(float(np.exp(reference.mean())), rel=1e-4), name


@pytest.mark.parametrize("name", SLIDING)
def test_eval_a2ats_keeping_every_token_equals_full_on_sliding_models(name):
    model = tiny_family_model(name)
    reference = own_cache_nll(model, IDS, CONTEXT, DECODE)
    (run,) = evaluate(
        model, IDS, context=CONTEXT, decode=DECODE, budgets=[KEEP_ALL.budget],
        codebooks={"a2ats": codebook_for(model)}, config=KEEP_ALL,
        methods=("full", "a2ats", "oracle_topk", "window"),
    )  # fmt: skip
    for method in ("a2ats", "oracle_topk"):
        np.testing.assert_allclose(run.methods[method].nll, reference, rtol=1e-4, atol=1e-4)
    # measured on the plan's A2ATS layers only: the native sliding layers are not in the figures
    per_layer_layers = len(plan_for(model).layers)
    small = evaluate(
        model, IDS, context=CONTEXT, decode=DECODE, budgets=[2],
        codebooks={"a2ats": codebook_for(model)}, config=A2ATSConfig(window=4, sinks=2),
        methods=("a2ats",),
    )[0].methods["a2ats"]  # fmt: skip
    assert len(small.recall_per_layer) == per_layer_layers
    for choice, recall in zip(plan_for(model).layers, small.recall_per_layer, strict=True):
        assert (recall is None) == (choice.kind != A2ATS), (name, choice)


@pytest.mark.parametrize("name", SLIDING)
def test_every_method_keeps_a_rotating_cache_on_sliding_layers(name):
    model = tiny_family_model(name)
    base = prefill(model, IDS[:CONTEXT])
    plan = plan_for(model)
    books = {"a2ats": codebook_for(model)}
    for method in ("full", "a2ats", "oracle_topk"):
        caches = build_caches(model, base, method_spec(method, model, KEEP_ALL, books))
        for choice, cache, src in zip(plan.layers, caches, base, strict=True):
            if choice.kind == A2ATS:
                if method in ("a2ats", "oracle_topk"):
                    assert isinstance(cache, A2ATSCache), (method, choice.layer)
                continue
            assert type(cache) is RotatingKVCache, (method, choice.layer)
            assert cache is not src
            assert (cache.offset, cache._idx, cache.max_size) == (
                src.offset,
                src._idx,
                src.max_size,
            )
            assert bool(mx.array_equal(cache.keys, src.keys))


def test_clone_native_is_independent_of_its_source():
    rotating = RotatingKVCache(max_size=4)
    for i in range(6):
        x = mx.full((1, 1, 1, 2), float(i))
        rotating.update_and_fetch(x, x)
    clone = clone_native(rotating)
    clone.update_and_fetch(mx.full((1, 1, 1, 2), 99.0), mx.full((1, 1, 1, 2), 99.0))
    assert rotating.keys[0, 0, :, 0].tolist() == [4.0, 5.0, 2.0, 3.0]
    assert clone.keys[0, 0, :, 0].tolist() == [4.0, 5.0, 99.0, 3.0]
    assert (rotating.offset, rotating._idx) == (6, 2)
    state = ArraysCache(2)
    state[0] = mx.zeros((1, 2))
    copied = clone_native(state)
    copied[0] = mx.ones((1, 2))  # a linear-attention layer's state moving on in one copy
    assert state[0].tolist() == [[0.0, 0.0]]


def test_plan_caches_fills_a2ats_layers_and_copies_the_rest():
    model = tiny_family_model("gemma3_text")
    base = prefill(model, IDS[:CONTEXT])
    spec = method_spec("a2ats", model, KEEP_ALL, {"a2ats": codebook_for(model)})
    caches, measured = plan_caches(model, base, spec)
    plan = plan_for(model)
    assert measured == [c.kind == A2ATS for c in plan.layers]
    for cache, src, m in zip(caches, base, measured, strict=True):
        if m:
            assert type(src) is KVCache and cache.offset == CONTEXT
            assert bool(mx.array_equal(cache.keys[..., :CONTEXT, :], src.keys[..., :CONTEXT, :]))
