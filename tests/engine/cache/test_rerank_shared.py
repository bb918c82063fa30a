"""rerank_shared: rerank candidates shared by the GQA group (G times fewer key rows)."""

import mlx.core as mx
import numpy as np
import pytest
from mlx_lm.models.rope_utils import initialize_rope

from a2ats_engine.bench.methods import METHODS, decode_variant_knobs
from a2ats_engine.cache import attention as att
from a2ats_engine.cache.a2ats_cache import A2ATSCache
from a2ats_engine.cache.codebook import Codebook
from a2ats_engine.cache.config import A2ATSConfig
from a2ats_engine.cache.rope import RopeSpec

N, WINDOW, SINKS, K, G = 300, 16, 4, 10, 3


@pytest.mark.parametrize("topk", ["numpy", "mlx"])
@pytest.mark.parametrize("rerank", [2, 64])
def test_each_head_keeps_its_exact_best_among_the_groups_candidates(monkeypatch, topk, rerank):
    monkeypatch.setenv("A2ATS_TOPK", topk)
    rng = np.random.default_rng(5)
    pre = rng.standard_normal((1, N, 64)).astype(np.float32)
    rope = RopeSpec.from_module(initialize_rope(64, 10000.0, False, None, 8192), 64)
    book = Codebook([mx.array(pre[:, None, :, :])])  # one centroid per token: no score ties
    config = A2ATSConfig(window=WINDOW, sinks=SINKS, budget=K, rerank=rerank,
                         rerank_shared=True, telemetry=True)  # fmt: skip
    cache = A2ATSCache(0, rope, book, config, max_context=8192)
    cache.update_and_fetch(rope.rotate(mx.array(pre[None]), 0), mx.array(pre[None]))
    q = rope.rotate(mx.array(rng.standard_normal((1, G, 1, 64)).astype(np.float32)), N - 1)
    cache.attend(q, None, None, scale=0.125)
    lay = att.layout(N, WINDOW, SINKS, K)
    approx = np.array(cache.far_token_scores(q, lay))[0, 0]  # [G, F]
    exact = np.array(q)[0, :, 0] @ np.array(cache.keys[0, 0, :N]).T  # [G, N]
    far = np.arange(SINKS, N - WINDOW)
    pool = far[np.argsort(-approx.max(axis=0))[: min(rerank * K, len(far))]]  # group's best
    want = set()
    for h in range(G):
        want |= set(pool[np.argsort(-exact[h, pool])[:K]].tolist())
    assert set(cache.last_stats.retrieved[0].tolist()) == want
    if rerank == 64:  # the pool is every far token: the exact top-K of each head
        best = {int(t) for h in range(G) for t in far[np.argsort(-exact[h, far])[:K]]}
        assert want == best


def test_rerank_shared_is_validated_and_named():
    with pytest.raises(ValueError, match=r"A2ATSConfig\.rerank_shared=1"):
        A2ATSConfig(rerank_shared=1)
    assert decode_variant_knobs("a2ats_rr2g") == {"rerank": 2, "rerank_shared": True}
    cfg = METHODS["a2ats_rr4g"].config(A2ATSConfig())
    assert cfg.rerank == 4 and cfg.rerank_shared
