"""Why a prefill's attention runs in NumPy on CPU-only MLX: the cost of the softmax's exp.

Times, median of 7 calls each: MLX's and NumPy's `exp` per element (9 x 512 x 2,048 float32
values), and one prefill chunk's causal attention (9 query heads, 3 KV heads, head dim 64, 512
queries over N keys) through `mx.fast.scaled_dot_product_attention` and through
`a2ats_engine/cache/host_attention.py`, with the largest difference between the two outputs.

    python docs/benchmarks/softmax_cost.py > docs/benchmarks/softmax_cost.json
"""

# ruff: noqa: I001  (a2ats_engine first: it preloads OpenBLAS before mlx.core)
from __future__ import annotations

import json
import statistics
import sys
import time

import a2ats_engine  # noqa: F401  (BLAS preload before mlx.core)
import mlx.core as mx
import numpy as np
from a2ats_engine.cache import host_attention
from a2ats_engine.commands._bench_common import machine


def _median_ms(fn, reps: int = 7) -> float:
    times = []
    for _ in range(reps):
        began = time.perf_counter()
        out = fn()
        if isinstance(out, mx.array):
            mx.eval(out)
        times.append(time.perf_counter() - began)
    return statistics.median(times) * 1e3


def main() -> int:
    x = mx.random.normal((9, 512, 2048)) * 3
    mx.eval(x)
    xn = np.array(x)
    n = x.size
    out = {
        "machine": machine(),
        "command": "python docs/benchmarks/softmax_cost.py > docs/benchmarks/softmax_cost.json",
        "exp_ns_per_element": {
            "mlx": round(_median_ms(lambda: mx.exp(x)) * 1e6 / n, 2),
            "numpy": round(_median_ms(lambda: np.exp(xn)) * 1e6 / n, 2),
        },
        "chunk_attention": [],
    }
    for keys in (2048, 8192):
        q = mx.random.normal((1, 9, 512, 64))
        k = mx.random.normal((1, 3, keys, 64))
        v = mx.random.normal((1, 3, keys, 64))
        mx.eval(q, k, v)
        args = (q, k, v)
        mlx_ms = _median_ms(
            lambda a=args: mx.fast.scaled_dot_product_attention(*a, scale=0.125, mask="causal")
        )
        np_ms = _median_ms(lambda a=args: host_attention.attention(*a, 0.125, "causal"))
        want = mx.fast.scaled_dot_product_attention(q, k, v, scale=0.125, mask="causal")
        diff = float(mx.abs(host_attention.attention(q, k, v, 0.125, "causal") - want).max())
        out["chunk_attention"].append(
            {
                "queries": 512,
                "keys": keys,
                "mlx_ms": round(mlx_ms, 1),
                "numpy_ms": round(np_ms, 1),
                "max_abs_difference": diff,
            }
        )
    json.dump(out, sys.stdout, indent=1)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
