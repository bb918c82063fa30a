"""The host (NumPy) decode step of CPU-only MLX selects and attends exactly as the MLX step."""

import mlx.core as mx
import numpy as np
import pytest
from mlx_lm.models.rope_utils import initialize_rope

from a2ats_engine.cache import attention as att
from a2ats_engine.cache import host_selection as host
from a2ats_engine.cache.a2ats_cache import A2ATSCache
from a2ats_engine.cache.codebook import Codebook
from a2ats_engine.cache.config import A2ATSConfig
from a2ats_engine.cache.rope import RopeSpec
from a2ats_engine.cache.topk import MlxTopK, NumpyTopK

D, N_KV, N_Q, N = 32, 2, 4, 700


def _codebook(pre: np.ndarray, subspaces: int) -> Codebook:
    """One centroid per token in every subspace: distinct, exact approximate scores (no ties,
    so both paths must pick the very same tokens)."""
    n_kv, n, d = pre.shape
    sub = pre.reshape(n_kv, n, subspaces, d // subspaces).transpose(0, 2, 1, 3)
    return Codebook([mx.array(np.ascontiguousarray(sub))])  # [n_kv, S, N, d / S]


def _pair(config: A2ATSConfig, monkeypatch, subspaces=1, dtype=mx.float32, seed=0):
    """Two caches holding the same tokens: one with the host strategy, one with MLX's."""
    rng = np.random.default_rng(seed)
    pre = rng.standard_normal((N_KV, N, D)).astype(np.float32)
    values = mx.array(rng.standard_normal((1, N_KV, N, D)).astype(np.float32)).astype(dtype)
    rope = RopeSpec.from_module(initialize_rope(D, 10000.0, False, None, 8192), D)
    post = rope.rotate(mx.array(pre[None]), 0).astype(dtype)
    caches = []
    for strategy in ("numpy", "mlx"):
        monkeypatch.setenv("A2ATS_TOPK", strategy)
        cache = A2ATSCache(0, rope, _codebook(pre, subspaces), config, max_context=8192)
        cache.update_and_fetch(post, values)
        caches.append(cache)
    q = rng.standard_normal((1, N_Q, 1, D)).astype(np.float32) * 3
    return caches, rope.rotate(mx.array(q), N - 1).astype(dtype)


CONFIGS = {
    "topk": A2ATSConfig(window=32, sinks=4, budget=24, rerank=1, exact_below=0),
    "rerank": A2ATSConfig(window=32, sinks=4, budget=24, rerank=3, exact_below=0),
    "shared": A2ATSConfig(
        window=32, sinks=4, budget=24, rerank=2, rerank_shared=True, exact_below=0
    ),
    "coverage": A2ATSConfig(
        window=32, sinks=4, budget=24, rerank=2, coverage=0.8, coverage_floor=4, exact_below=0
    ),
    "one distance": A2ATSConfig(window=32, sinks=4, budget=24, far_buckets=1, exact_below=0),
    "kv8": A2ATSConfig(window=32, sinks=4, budget=24, kv_bits=8, exact_below=0),
    "cold": A2ATSConfig(window=32, sinks=4, budget=24, kv_memory=0, exact_below=0),
}


@pytest.mark.parametrize("name", list(CONFIGS))
def test_host_step_selects_and_attends_as_the_mlx_step(name, monkeypatch):
    (on_host, on_device), q = _pair(CONFIGS[name], monkeypatch)
    assert isinstance(on_host.top_k, NumpyTopK) and on_host.selects_on_host
    assert isinstance(on_device.top_k, MlxTopK) and not on_device.selects_on_host
    cfg = on_host.config
    lay = att.layout(N, cfg.window, cfg.sinks, cfg.top_k(N))
    out_h, pos_h, rep_h = on_host.retrieval.step(on_host, q, lay, D**-0.5, None)
    out_d, pos_d, rep_d = on_device.retrieval.step(on_device, q, lay, D**-0.5, None)
    for h in range(N_KV):  # the same set of attended positions per KV head
        kept_h = np.array(pos_h[0, h])[~np.array(rep_h[0, h])]
        kept_d = np.array(pos_d[0, h])[~np.array(rep_d[0, h])]
        assert np.array_equal(np.sort(kept_h), np.sort(kept_d))
    np.testing.assert_allclose(np.array(out_h), np.array(out_d), rtol=1e-4, atol=1e-5)
    if cfg.coverage is not None:  # the adaptive budget's kept counts come back too
        assert np.array_equal(
            np.array(on_host.retrieval.budget_used), np.array(on_device.retrieval.budget_used)
        )
    for cache in (on_host, on_device):
        cache.close()


@pytest.mark.parametrize("subspaces", [2, 4])
def test_host_scores_match_mlx_with_product_vq(subspaces, monkeypatch):
    config = CONFIGS["rerank"]
    (on_host, on_device), q = _pair(config, monkeypatch, subspaces=subspaces)
    lay = att.layout(N, config.window, config.sinks, config.top_k(N))
    want = np.array(on_device.far_token_scores(q, lay))
    got = host.far_scores(on_host, q, lay)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-3)
    out_h, _, _ = on_host.retrieval.step(on_host, q, lay, D**-0.5, None)
    out_d, _, _ = on_device.retrieval.step(on_device, q, lay, D**-0.5, None)
    np.testing.assert_allclose(np.array(out_h), np.array(out_d), rtol=1e-4, atol=1e-5)


def test_half_precision_rows_are_read_in_place(monkeypatch):
    (on_host, on_device), q = _pair(CONFIGS["rerank"], monkeypatch, dtype=mx.float16)
    assert host.host_rows(on_host)  # float16 rows: NumPy views them, no copy of the cache
    lay = att.layout(N, 32, 4, 24)
    out_h, _, _ = on_host.retrieval.step(on_host, q, lay, D**-0.5, None)
    out_d, _, _ = on_device.retrieval.step(on_device, q, lay, D**-0.5, None)
    assert out_h.dtype == mx.float16
    np.testing.assert_allclose(np.array(out_h), np.array(out_d), rtol=2e-2, atol=2e-3)


def test_evaluation_variants_and_the_estimate_keep_the_mlx_step(monkeypatch):
    """A subclass with its own far_token_scores (bench/methods.py) and the missed-attention
    estimate read MLX arrays: they never take the host path."""

    class OwnScores(A2ATSCache):
        def far_token_scores(self, queries, lay):
            return super().far_token_scores(queries, lay)

    monkeypatch.setenv("A2ATS_TOPK", "numpy")
    rope = RopeSpec.from_module(initialize_rope(D, 10000.0, False, None, 8192), D)
    pre = np.random.default_rng(0).standard_normal((N_KV, 64, D)).astype(np.float32)
    variant = OwnScores(0, rope, _codebook(pre, 1), CONFIGS["rerank"], max_context=8192)
    assert isinstance(variant.top_k, NumpyTopK) and not variant.selects_on_host
    estimating = A2ATSCache(
        0, rope, _codebook(pre, 1), A2ATSConfig(estimate_missed=True), max_context=8192
    )
    assert not estimating.selects_on_host
