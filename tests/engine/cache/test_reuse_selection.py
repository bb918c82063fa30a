"""reuse_selection: keep the previous step's far selection while the query barely moves."""

import mlx.core as mx
import numpy as np
import pytest

from a2ats_engine.bench.methods import METHODS
from a2ats_engine.cache.config import A2ATSConfig

from .test_cache import D, filled_cache


def step(cache, q_pre: np.ndarray, rng: np.random.Generator):
    """Append one random token, attend with the pre-RoPE query q_pre [n_q, d] at its position."""
    kv = [mx.array(rng.standard_normal((1, 1, 1, D)).astype(np.float32)) for _ in range(2)]
    cache.update_and_fetch(*kv)
    q = cache.rope.rotate(mx.array(q_pre[None, :, None, :]), cache.offset - 1)
    cache.attend(q, None, None, scale=D**-0.5)
    return cache.last_stats


@pytest.mark.parametrize("topk", ["numpy", "mlx"])
def test_selection_is_reused_while_the_query_stays_and_redone_when_it_moves(monkeypatch, topk):
    monkeypatch.setenv("A2ATS_TOPK", topk)
    config = A2ATSConfig(window=16, sinks=4, budget=8, reuse_selection=0.95, telemetry=True)
    cache, _, _ = filled_cache(n=300, config=config)
    fresh, _, _ = filled_cache(n=300, config=A2ATSConfig(window=16, sinks=4, budget=8,
                                                         telemetry=True))  # fmt: skip
    rng, rng_fresh = np.random.default_rng(0), np.random.default_rng(0)
    q = np.random.default_rng(1).standard_normal((2, D)).astype(np.float32)
    first = step(cache, q, rng)
    assert not first.reused
    step(fresh, q, rng_fresh)
    near = q + 0.01 * np.random.default_rng(2).standard_normal(q.shape).astype(np.float32)
    second = step(cache, near, rng)
    assert second.reused
    assert np.array_equal(second.retrieved[0], first.retrieved[0])  # the same far tokens
    moved = np.random.default_rng(3).standard_normal((2, D)).astype(np.float32)
    third = step(cache, moved, rng)
    assert not third.reused
    step(fresh, near, rng_fresh)
    want = step(fresh, moved, rng_fresh)  # a fresh selection equals a cache that never reuses
    assert np.array_equal(third.retrieved[0], want.retrieved[0])
    cache.trim(1)  # a trim forgets the anchor
    assert not step(cache, moved, rng).reused


def test_reuse_selection_validated_and_named():
    for bad in (0.0, 1.5, True):
        with pytest.raises(ValueError, match=r"A2ATSConfig\.reuse_selection=.*out of range"):
            A2ATSConfig(reuse_selection=bad)
    assert METHODS["a2ats_reuse95"].config(A2ATSConfig()).reuse_selection == 0.95
