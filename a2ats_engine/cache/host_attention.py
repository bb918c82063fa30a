"""Exact multi-token attention (prefill) in NumPy on CPU-only MLX.

On MLX's CPU backend a prefill's attention is dominated by the softmax's exponentials: MLX's CPU
`exp` is an order of magnitude slower than NumPy's (a vectorised exp), so
`mx.fast.scaled_dot_product_attention` of a prefill chunk takes several times longer than the
same maths in NumPy (its BLAS for the two matmuls, its exp for the softmax): measured by
docs/benchmarks/softmax_cost.py, docs/BENCHMARKS.md, "Time to first token". An A2ATS layer's
exact attention over more than one
query (a prefill chunk) runs here when MLX has no GPU; the result is the same to float32
rounding (tests/engine/cache/test_host_attention.py). On Metal nothing changes.

`A2ATS_PREFILL_ATTENTION=mlx|numpy` overrides the choice (read once per process).
"""

from __future__ import annotations

import functools
import os

import mlx.core as mx
import numpy as np

from .._backend import is_cpu_only

ENV = "A2ATS_PREFILL_ATTENTION"
_VIEWABLE = (mx.float32, mx.float16)  # dtypes NumPy reads in place
_BLOCK_ELEMENTS = 1 << 24  # scores held at a time: at most 64 MiB of float32
_BLOCK_ROWS = 128  # query rows a block (the causal triangle is skipped block by block)


@functools.lru_cache(maxsize=1)
def cpu_only() -> bool:
    """True when MLX computes on the CPU: no Metal device (`_backend.is_cpu_only`), or the CPU
    chosen as the default device. Asked once per process."""
    return mx.default_device() == mx.cpu or is_cpu_only()


@functools.lru_cache(maxsize=1)
def enabled() -> bool:
    """NumPy prefill attention: on CPU-only MLX unless `A2ATS_PREFILL_ATTENTION` says otherwise."""
    choice = os.environ.get(ENV, "").strip().lower()
    return choice == "numpy" if choice in ("mlx", "numpy") else cpu_only()


def applies(queries: mx.array, keys: mx.array, mask, sinks) -> bool:
    """Whether `attention` takes these inputs: more than one query, no attention sinks, a causal
    or no mask (an explicit mask array stays with MLX), dtypes NumPy reads in place."""
    return (
        queries.shape[2] > 1
        and sinks is None
        and (mask is None or (isinstance(mask, str) and mask == "causal"))
        and queries.dtype in _VIEWABLE
        and keys.dtype in _VIEWABLE
        and enabled()
    )


@functools.lru_cache(maxsize=8)
def _above_diagonal(rows: int) -> np.ndarray:
    """[rows, rows] bool: True where a query row's key lies after it (masked, causal)."""
    return np.triu(np.ones((rows, rows), dtype=bool), 1)


def attention(queries: mx.array, keys: mx.array, values: mx.array, scale: float, mask) -> mx.array:
    """softmax(scale q k^T + causal mask) v, as `mx.fast.scaled_dot_product_attention`.

    queries [B, n_q, L, d]; keys / values [B, n_kv, N, d] (N >= L: the chunk's keys are the last
    L); GQA groups of n_q / n_kv query heads share a KV head. Returns [B, n_q, L, d] in the
    queries' dtype. Query rows go in blocks: with the causal mask a block scores only the keys
    it sees (up to its last row), and only its diagonal square is masked.
    """
    mx.eval(queries, keys, values)
    B, n_q, L, d = queries.shape
    n_kv, N = keys.shape[1], keys.shape[2]
    G = n_q // n_kv
    q_all = np.asarray(queries).astype(np.float32, copy=False)
    k_all = np.asarray(keys).astype(np.float32, copy=False)
    v_all = np.asarray(values).astype(np.float32, copy=False)
    causal = mask is not None
    out = np.empty((B, n_kv, G, L, d), np.float32)
    block = max(1, min(L, _BLOCK_ROWS, _BLOCK_ELEMENTS // max(1, G * N)))
    for b in range(B):
        for h in range(n_kv):
            k, v = k_all[b, h], v_all[b, h]
            for first in range(0, L, block):
                rows = min(block, L - first)
                seen = N - L + first + rows if causal else N  # keys the block's last row sees
                q = q_all[b, h * G : (h + 1) * G, first : first + rows] * scale  # [G, rows, d]
                s = q @ k[:seen].T  # [G, rows, seen]
                if causal:
                    np.copyto(s[..., seen - rows :], -np.inf, where=_above_diagonal(rows))
                s -= s.max(axis=-1, keepdims=True)
                np.exp(s, out=s)
                den = s.sum(axis=-1, keepdims=True)
                o = s @ v[:seen]
                o /= den
                out[b, h, :, first : first + rows] = o
    result = mx.array(out.reshape(B, n_q, L, d))
    return result if queries.dtype == mx.float32 else result.astype(queries.dtype)
