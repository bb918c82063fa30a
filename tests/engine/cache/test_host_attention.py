"""Prefill attention in NumPy (CPU-only MLX) equals MLX's scaled_dot_product_attention."""

import mlx.core as mx
import numpy as np
import pytest
from tiny import tiny_model

from a2ats_engine.cache import host_attention
from a2ats_engine.cache.attention import exact_attention
from a2ats_engine.cache.config import A2ATSConfig
from a2ats_engine.cache.model_cache import make_cache


def _inputs(B, n_q, n_kv, L, N, d=32, dtype=mx.float32, seed=0):
    rng = np.random.default_rng(seed)
    q = mx.array(rng.standard_normal((B, n_q, L, d)).astype(np.float32) * 2).astype(dtype)
    k = mx.array(rng.standard_normal((B, n_kv, N, d)).astype(np.float32) * 2).astype(dtype)
    v = mx.array(rng.standard_normal((B, n_kv, N, d)).astype(np.float32)).astype(dtype)
    return q, k, v


@pytest.mark.parametrize(
    "B,n_q,n_kv,L,N,mask",
    [
        (1, 4, 2, 16, 16, "causal"),  # the first chunk: keys are the chunk itself
        (1, 9, 3, 24, 100, "causal"),  # a later chunk over the past and itself (GQA 3)
        (2, 4, 4, 8, 40, "causal"),  # a batch, no GQA
        (1, 4, 1, 12, 50, None),  # no mask: every query sees every key
    ],
)
def test_numpy_prefill_attention_equals_mlx(B, n_q, n_kv, L, N, mask):
    q, k, v = _inputs(B, n_q, n_kv, L, N)
    want = mx.fast.scaled_dot_product_attention(q, k, v, scale=0.3, mask=mask)
    got = host_attention.attention(q, k, v, 0.3, mask)
    assert got.shape == want.shape and got.dtype == mx.float32
    np.testing.assert_allclose(np.array(got), np.array(want), rtol=1e-5, atol=1e-5)


def test_query_blocks_give_the_same_result(monkeypatch):
    """Scores are held a block of query rows at a time: a tiny block changes nothing."""
    q, k, v = _inputs(1, 6, 2, 20, 70)
    whole = host_attention.attention(q, k, v, 0.25, "causal")
    monkeypatch.setattr(host_attention, "_BLOCK_ROWS", 3)  # 3 query rows a block
    blocked = host_attention.attention(q, k, v, 0.25, "causal")
    np.testing.assert_allclose(np.array(blocked), np.array(whole), rtol=1e-5, atol=1e-5)


def test_half_precision_stays_half():
    q, k, v = _inputs(1, 4, 2, 8, 30, dtype=mx.float16)
    got = host_attention.attention(q, k, v, 0.2, "causal")
    want = mx.fast.scaled_dot_product_attention(q, k, v, scale=0.2, mask="causal")
    assert got.dtype == mx.float16
    np.testing.assert_allclose(np.array(got), np.array(want), rtol=1e-2, atol=2e-3)


def test_what_stays_with_mlx(monkeypatch):
    q, k, v = _inputs(1, 4, 2, 8, 30)
    monkeypatch.setattr(host_attention, "enabled", lambda: True)
    assert host_attention.applies(q, k, "causal", None)
    assert not host_attention.applies(q[:, :, :1], k, None, None)  # a decode step
    assert not host_attention.applies(q, k, mx.ones((8, 30), dtype=mx.bool_), None)  # a mask array
    assert not host_attention.applies(q, k, "causal", mx.zeros((4,)))  # attention sinks
    bf = q.astype(mx.bfloat16)
    assert not host_attention.applies(bf, k.astype(mx.bfloat16), "causal", None)  # no NumPy view
    monkeypatch.setattr(host_attention, "enabled", lambda: False)
    assert not host_attention.applies(q, k, "causal", None)


def test_env_chooses_the_implementation(monkeypatch):
    for value, want in (("numpy", True), ("mlx", False), ("MLX ", False)):
        monkeypatch.setenv(host_attention.ENV, value)
        host_attention.enabled.cache_clear()
        assert host_attention.enabled() is want
    monkeypatch.delenv(host_attention.ENV)
    host_attention.enabled.cache_clear()
    assert host_attention.enabled() is host_attention.cpu_only()
    host_attention.enabled.cache_clear()


def test_exact_attention_routes_a_prefill_through_numpy(monkeypatch):
    calls = []
    real = host_attention.attention
    monkeypatch.setattr(host_attention, "enabled", lambda: True)
    monkeypatch.setattr(
        host_attention, "attention", lambda *a: calls.append(a[0].shape) or real(*a)
    )
    q, k, v = _inputs(1, 4, 2, 8, 30)
    exact_attention(q, k, v, 0.2, "causal")
    exact_attention(q[:, :, :1], k, v, 0.2, None)  # a decode step: MLX's
    assert calls == [(1, 4, 8, 32)]


@pytest.mark.filterwarnings("ignore:A2ATS. no codebook given")  # the random codebook is the point
def test_a_model_prefilled_through_numpy_decodes_as_through_mlx(monkeypatch):
    """The tiny model's logits after a chunked prefill, A2ATS caches, both implementations."""
    model = tiny_model()
    ids = mx.array(np.random.default_rng(3).integers(0, 200, (1, 40)))
    config = A2ATSConfig(exact_below=10**6)
    logits = []
    for use_numpy in (True, False):
        monkeypatch.setattr(host_attention, "enabled", lambda u=use_numpy: u)
        cache = make_cache(model, config)
        for start in range(0, 40, 16):
            out = model(ids[:, start : start + 16], cache=cache)
        logits.append(np.array(out[:, -1]))
    np.testing.assert_allclose(logits[0], logits[1], rtol=1e-4, atol=1e-4)


def test_a_measured_prefill_runs_its_plain_caches_on_the_host_and_only_there(monkeypatch):
    """`feed_prompt`, the measurements' shared prefill into mlx-lm's own caches: inside
    `hooks.exact_on_host` a prefill chunk's attention runs in NumPy (the caches equal MLX's to
    float32 rounding), a quantized cache's stays with MLX, and afterwards the model is as it was
    (its ordinary caches go to mlx-lm again)."""
    from mlx_lm.models.cache import QuantizedKVCache, make_prompt_cache

    from a2ats_engine.bench.plan_caches import feed_prompt
    from a2ats_engine.cache import hooks

    model = tiny_model()
    ids = [int(x) for x in np.random.default_rng(4).integers(0, 200, 40)]
    calls = []
    real = host_attention.attention
    monkeypatch.setattr(host_attention, "enabled", lambda: True)
    monkeypatch.setattr(
        host_attention, "attention", lambda *a: calls.append(a[0].shape[2]) or real(*a)
    )
    host, ref = make_prompt_cache(model), make_prompt_cache(model)
    for start in range(0, 40, 16):
        feed_prompt(model, ids[start : start + 16], host)
        mx.eval(model(mx.array([ids[start : start + 16]]), cache=ref))
    assert calls == [n for n in (16, 16, 8) for _ in model.layers]  # every layer and chunk
    for h, r in zip(host, ref, strict=True):
        assert h.offset == r.offset == 40
        for a, b in zip(h.state, r.state, strict=True):
            np.testing.assert_allclose(np.array(a), np.array(b), rtol=1e-4, atol=1e-4)
    # the model was hooked for the prefill only (its module may stay hooked for other models)
    assert id(model) not in hooks._users(type(model).__module__)

    calls.clear()
    q, k, v = _inputs(1, 4, 2, 8, 8)
    quantized = QuantizedKVCache(group_size=32, bits=8)
    with hooks.exact_on_host(model):  # packed K/V (a tuple): MLX's quantized attention
        keys, values = quantized.update_and_fetch(k, v)
        out = hooks.dispatch(q, keys, values, cache=quantized, scale=0.2, mask="causal")
    assert calls == [] and out.shape == q.shape
