"""Equal-cost accounting checked against hand computations on tiny caches."""

import mlx.core as mx
import numpy as np
import pytest
from mlx_lm.models.cache import KVCache, QuantizedKVCache
from tiny import tiny_model

from a2ats_engine.bench.accounting import (
    exact_step_cost,
    retrieval_step_cost,
    row_bytes,
)
from a2ats_engine.bench.evaluate import MeasuredCache, OracleTopKCache, RecentWindowCache
from a2ats_engine.cache import attention as att
from a2ats_engine.cache.a2ats_cache import A2ATSCache
from a2ats_engine.cache.codebook import Codebook
from a2ats_engine.cache.config import A2ATSConfig
from a2ats_engine.cache.geometry import rope_specs


def test_row_bytes_by_hand():
    assert row_bytes(64, 2) == 128  # bf16
    assert row_bytes(64, 2, bits=8, group_size=64) == 64 + 2 * 1 * 2
    assert row_bytes(64, 2, bits=4, group_size=32) == 32 + 2 * 2 * 2
    with pytest.raises(ValueError, match="group_size"):
        row_bytes(48, 2, bits=4, group_size=32)


def test_retrieval_cost_by_hand():
    # 1000 tokens, 4 sinks, window 64, K = 30, 2 KV heads of 2 query heads, 1-subspace uint16 codes
    lay = att.layout(1000, 64, 4, 30)
    assert lay.n_far == 1000 - 64 - 4
    attended = np.array([4 + 64 + 45, 4 + 64 + 52])  # union of 2 x 30 per head, some shared
    cost = retrieval_step_cost(
        attended, lay, n_q=4, key_row=128, scoring="codes", candidates=60,
        code_bytes_per_token=2, centroid_bytes=2 * 512 * 64 * 4,
    )  # fmt: skip
    assert cost.attended_fraction == pytest.approx((113 + 120) / 2 / 1000)
    assert cost.codes == 932 * 2 * 2
    assert cost.centroids == 262144
    assert cost.keys_scored == 4 * 60 * 128  # rerank 2: 2K full keys per query head
    assert cost.rows == 2 * (113 + 120) * 128  # K and V of every attended row
    assert cost.total == 3728 + 262144 + 30720 + 59648
    no_rerank = retrieval_step_cost(attended, lay, n_q=4, key_row=128, scoring="none",
                                    candidates=30)  # fmt: skip
    assert (no_rerank.codes, no_rerank.centroids, no_rerank.keys_scored) == (0, 0, 0)
    oracle = retrieval_step_cost(attended, lay, n_q=4, key_row=128, scoring="keys", candidates=30)
    assert oracle.keys_scored == 932 * 2 * 128
    assert exact_step_cost(1000, 2, 128).rows == 2 * 1000 * 2 * 128


def _measured_step(inner, n=199, d=16, n_kv=2, n_q=4):
    """Fill `n` tokens, run one decode step through a MeasuredCache; return its StepCost."""
    mx.random.seed(2)
    cache = MeasuredCache(inner)
    cache.update_and_fetch(mx.random.normal((1, n_kv, n, d)), mx.random.normal((1, n_kv, n, d)))
    k, v = cache.update_and_fetch(
        mx.random.normal((1, n_kv, 1, d)), mx.random.normal((1, n_kv, 1, d))
    )
    cache.attend(mx.random.normal((1, n_q, 1, d)), k, v, scale=d**-0.5)
    return cache.record.cost[0], cache


def test_full_and_quantized_caches_read_every_row():
    cost, _ = _measured_step(KVCache())
    assert cost.attended_fraction == 1.0
    assert cost.total == cost.rows == 2 * 200 * 2 * 16 * 4  # float32 K and V, 2 KV heads
    cost, _ = _measured_step(QuantizedKVCache(group_size=32, bits=4), d=64)
    assert cost.rows == 2 * 200 * 2 * (32 + 2 * 2 * 4)  # 4-bit rows + fp32 scale/bias per group


def _a2ats(cls, **knobs):
    spec = rope_specs(tiny_model("llama"))[0]
    book = Codebook.random(1, 2, 16, 32, seed=4)
    config = A2ATSConfig(window=16, sinks=4, budget=8, telemetry=True, **knobs)
    return cls(0, spec, book, config, 4096)


def test_a2ats_step_cost_by_hand():
    cost, cache = _measured_step(_a2ats(A2ATSCache, rerank=2))
    # n = 200: far tokens [4, 184), K = 8, rerank 2 reads 16 keys per query head
    attended = np.array([len(s) for s in cache.inner.last_stats.selected])
    assert all(4 + 16 + 8 <= a <= 4 + 16 + 16 for a in attended)  # sinks + window + union
    assert cost.attended_fraction == pytest.approx(attended.mean() / 200)
    assert cost.codes == 180 * 2 * 2
    assert cost.centroids == 2 * 32 * 16 * 4
    assert cost.keys_scored == 4 * 16 * 16 * 4
    assert cost.rows == 2 * attended.sum() * 16 * 4
    no_rerank, _ = _measured_step(_a2ats(A2ATSCache, rerank=1))
    assert no_rerank.keys_scored == 0  # rerank 1 reads no full keys
    assert no_rerank.codes == cost.codes and no_rerank.centroids == cost.centroids


def test_oracle_and_window_costs():
    oracle, _ = _measured_step(_a2ats(OracleTopKCache))
    assert oracle.codes == oracle.centroids == 0
    assert oracle.keys_scored == 180 * 2 * 16 * 4  # exact scores read every far key
    window, cache = _measured_step(_a2ats(RecentWindowCache))
    assert window.codes == window.centroids == window.keys_scored == 0
    assert window.rows == 2 * 2 * (4 + 8 + 16) * 16 * 4  # contiguous: no union overlap to win
