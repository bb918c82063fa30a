# ruff: noqa: I001, B023  (a2ats_engine before mlx: it preloads OpenBLAS; the lambdas run at once)
"""Per-layer cost of one A2ATS decode step vs mlx-lm's attention, at one context (random data of
the demo model's geometry: 3 KV heads, 9 query heads, head dim 64, 512 centroids).

    OPENBLAS_NUM_THREADS=1 .venv/bin/python docs/benchmarks/profile_step.py [context]
    A2ATS_TOPK=mlx ...   # the same with MLX's argpartition instead of NumPy's

Each line is the mean wall time of one piece, evaluated on its own (so the pieces include
MLX's per-evaluation overhead and do not add up exactly to the total).
"""

from __future__ import annotations

import sys
import time

import a2ats_engine  # noqa: F401  (BLAS preload before mlx.core)
import mlx.core as mx
from mlx_lm.models.rope_utils import initialize_rope

from a2ats_engine.cache import attention as att
from a2ats_engine.cache.a2ats_cache import A2ATSCache
from a2ats_engine.cache.codebook import Codebook
from a2ats_engine.cache.config import A2ATSConfig
from a2ats_engine.cache.rope import RopeSpec


def bench(label: str, fn, reps: int = 200) -> None:
    for _ in range(5):
        mx.eval(fn())
    began = time.perf_counter()
    for _ in range(reps):
        mx.eval(fn())
    print(f"{label:28s} {(time.perf_counter() - began) / reps * 1e3:.3f} ms")


def main(n: int) -> None:
    rope = RopeSpec.from_module(initialize_rope(64, 100000.0, True, None, 8192), 64)
    book = Codebook.random(1, 3, 64, 512, seed=0)
    for rerank in (1, 2):
        config = A2ATSConfig(rerank=rerank)
        cache = A2ATSCache(0, rope, book, config, max_context=8192)
        keys, values = mx.random.normal((1, 3, n, 64)), mx.random.normal((1, 3, n, 64))
        cache.update_and_fetch(keys, values)
        mx.eval(cache.keys, cache.codes)
        q = mx.random.normal((1, 9, 1, 64))
        lay = att.layout(n, config.window, config.sinks, config.top_k(n))
        print(f"context {n}, rerank {rerank}, K {lay.k}, top-K on host: {cache.top_k.on_host}")
        bench("mlx-lm attention (full)", lambda: mx.fast.scaled_dot_product_attention(
            q, keys, values, scale=0.125))  # fmt: skip
        bench("A2ATS retrieval step", lambda: cache.retrieval.step(cache, q, lay, 0.125, None))
        bench("  far-token scores", lambda: cache.far_token_scores(q, lay))
        scores = cache.far_token_scores(q, lay)
        mx.eval(scores)
        bench("  top-K", lambda: cache.top_k.to_mx(cache.top_k.top(scores, lay.k)))
        if rerank > 1:
            group = q.reshape(1, 3, 3, 64)
            bench("  rerank (top-2K, exact)", lambda: att.rerank(
                group, scores, lay, rerank * lay.k, cache.keys, cache.storage,
                cache.top_k))  # fmt: skip


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 8192)
