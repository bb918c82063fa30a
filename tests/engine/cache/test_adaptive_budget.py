"""coverage: an adaptive budget per query head from the reranked candidates' exact scores."""

import mlx.core as mx
import numpy as np
import pytest

from a2ats_engine.bench.methods import METHODS
from a2ats_engine.cache import attention as att
from a2ats_engine.cache.config import A2ATSConfig
from a2ats_engine.cache.topk import MlxTopK, NumpyTopK, covering

from .test_cache import decode_query, filled_cache


def fewest_covering(scores: np.ndarray, k: int, share: float, floor: int) -> list[int]:
    """Brute force: indices of the fewest best-first scores (<= k, >= floor) whose softmax mass
    reaches `share` of the whole row's."""
    p = np.exp(scores - scores.max())
    p /= p.sum()
    order = np.argsort(-scores)
    kept, mass = [], 0.0
    for j in order[:k]:
        if len(kept) >= floor and mass >= share:
            break
        kept.append(int(j))
        mass += p[j]
    return kept


def test_covering_keeps_the_fewest_best_candidates_on_both_strategies():
    rng = np.random.default_rng(0)
    exact = (rng.standard_normal((2, 3, 40)) * 3).astype(np.float32)
    cand = rng.permuted(np.tile(np.arange(100, 140, dtype=np.int32), (2, 3, 1)), axis=-1)
    k, share, floor = 12, 0.7, 2
    top_np, used_np = covering(np, cand, exact, k, 1.0, share, floor)
    top_mx, used_mx = covering(mx, mx.array(cand), mx.array(exact), k, 1.0, share, floor)
    assert np.array_equal(top_np, np.array(top_mx))
    assert np.array_equal(used_np, np.array(used_mx))
    for b in range(2):
        for g in range(3):
            want = fewest_covering(exact[b, g], k, share, floor)
            assert used_np[b, g] == len(want)
            assert set(top_np[b, g].tolist()) == {int(cand[b, g, j]) for j in want}
    assert used_np.min() >= 2 and used_np.max() <= k and used_np.min() < k  # it adapts
    # the strategies' own entry point agrees with the function
    top_h, used_h = NumpyTopK().pick_covering(cand, mx.array(exact), k, 1.0, share, floor)
    top_d, used_d = MlxTopK().pick_covering(mx.array(cand), mx.array(exact), k, 1.0, share, floor)
    assert np.array_equal(top_h, np.array(top_d)) and np.array_equal(used_h, np.array(used_d))


@pytest.mark.parametrize("topk", ["numpy", "mlx"])
def test_cache_attends_each_heads_covering_set_and_reports_the_budget(monkeypatch, topk):
    monkeypatch.setenv("A2ATS_TOPK", topk)
    window, sinks, k, share, floor = 16, 4, 20, 0.6, 3
    config = A2ATSConfig(
        window=window, sinks=sinks, budget=k, rerank=64, far_buckets=1, coverage=share,
        coverage_floor=floor, telemetry=True, estimate_missed=False,
    )  # fmt: skip
    cache, _, rope = filled_cache(n=300, config=config)
    n = cache.offset
    _, q = decode_query(rope, 2, n - 1)
    scale = 0.6  # peaked attention: a few tokens cover most of it
    out = np.array(cache.attend(q, None, None, scale=scale))
    stats = cache.last_stats
    keys, values = np.array(cache.keys[0, 0, :n]), np.array(cache.values[0, 0, :n])
    far = np.arange(sinks, n - window)
    kept = set()
    for h in range(2):  # rerank over every far token: the candidates are all of them
        scores = keys[far] @ np.array(q)[0, h, 0] * scale
        want = fewest_covering(scores, k, share, floor)
        assert stats.budget_used[0][h] == len(want)
        kept |= {int(far[j]) for j in want}
    assert set(stats.retrieved[0].tolist()) == kept
    assert min(stats.budget_used[0]) < k
    sel = stats.selected[0]
    for h in range(2):  # exact attention over sinks + the union of kept tokens + window
        s = keys[sel] @ np.array(q)[0, h, 0] * scale
        p = np.exp(s - s.max())
        np.testing.assert_allclose(out[0, h, 0], (p / p.sum()) @ values[sel], atol=1e-5)


def test_coverage_validated_named_and_off_by_default():
    assert A2ATSConfig().coverage is None
    for bad in (0.0, 1.0, 1.5, True, "0.9"):
        with pytest.raises(ValueError, match=r"A2ATSConfig\.coverage=.*out of range"):
            A2ATSConfig(coverage=bad)
    with pytest.raises(ValueError, match=r"A2ATSConfig\.coverage_floor=0.*out of range"):
        A2ATSConfig(coverage_floor=0)
    assert "coverage" in A2ATSConfig(coverage=0.9, rerank=1).unused_settings()
    assert METHODS["a2ats_cov90"].config(A2ATSConfig()).coverage == 0.9
    lay = att.layout(300, 16, 4, 20)
    cache, _, rope = filled_cache(n=300, config=A2ATSConfig(window=16, sinks=4, budget=20))
    cache.attend(decode_query(rope, 1, 299)[1], None, None, scale=0.1)
    assert lay.k == 20 and cache.retrieval.budget_used is None  # off: every head keeps K
