"""The host step's far scores, top-K and rerank as one compiled loop (numba), where it can run.

In a decode the host step (`host_step.py`) runs right after MLX's threads have run the layer's
weights through both cores' caches, and there its NumPy part took about twice its warm time: the
pieces' code and data are fetched again, and the step is some sixty NumPy calls (measured piece
by piece in docs/benchmarks/host_step_cold.py: a piece that takes 0.01 ms warm takes 0.1 ms right
after MLX's layer work). `select` does the step's far scores (a table lookup per far token),
top-K of the candidates (a sampled threshold as `topk.top_indices`, then a three-way
quickselect: VQ scores tie often), their exact scores and the pick of the best K per query head
in one call over a few preallocated buffers, with no NumPy call inside.

It selects what the NumPy path selects up to ties: the candidates' approximate scores are the
same multiset as `NumpyTopK.top`'s, and the picks are the best K of the candidates by exact
score (a float32 dot whose summation order differs from BLAS's in the last bit); which of tied
scores it keeps is arbitrary, as in `np.argpartition`, but not the same ones.

`selector()` gives the compiled function, or None where it cannot run: numba not installed (it
is a dependency off macOS, where Metal takes MLX's step), `A2ATS_HOST_KERNEL=numpy`, or a
compile that failed (`status()` says which). The host step then keeps its NumPy calls.
"""

from __future__ import annotations

import os

import numpy as np

ENV = "A2ATS_HOST_KERNEL"

_state: dict = {}


def selector():
    """The compiled `select`, or None where it cannot run (`status` says why)."""
    if "select" not in _state:
        choice = os.environ.get(ENV, "").strip().lower()
        if choice == "numpy":
            _state.update(select=None, status=f"in NumPy calls ({ENV}=numpy)")
        else:
            try:
                import numba
            except ImportError:
                _state.update(select=None, status="in NumPy calls (numba not installed)")
            else:
                try:
                    from ._select_jit import select as fn

                    _warm(fn)
                except Exception as e:  # a compile that fails on this machine: NumPy's calls
                    _state.update(select=None, status=f"in NumPy calls (numba failed: {e!s:.120})")
                else:
                    _state.update(select=fn, status=f"compiled (numba {numba.__version__})")
    return _state["select"]


def status() -> str:
    """Which far scores and top-K the host step runs on this machine, for `a2ats info`."""
    selector()
    return _state["status"]


def _warm(fn) -> None:
    """Compile (or load from numba's cache) for the arrays the host step passes."""
    tables = np.zeros((1, 1, 1, 4), np.float32)
    codes = np.zeros((1, 1, 8, 1), np.uint16)
    keys = np.zeros((1, 1, 8, 2), np.float32)
    out = np.empty((1, 1, 1, 2), np.int32)
    buckets = np.zeros(6, np.int32)
    q = np.zeros((1, 1, 1, 2), np.float32)
    fn(tables, codes, buckets, 1, 6, 4, 2, 4, q, keys, out)


def usable(codes: np.ndarray, keys: np.ndarray, n_subspaces: int, cover, shared: bool) -> bool:
    """Whether `select` computes this step's selection: one-codebook VQ (codes uint16), float32
    contiguous rows, no adaptive budget (`coverage`) and per-query-head candidates."""
    return (
        n_subspaces == 1
        and cover is None
        and not shared
        and codes.dtype == np.uint16
        and keys.dtype == np.float32
        and keys.flags.c_contiguous
        and codes.flags.c_contiguous
    )


def select_far(fn, tables, codes, buckets, lay, n_centroids: int, k: int, candidates: int, q, keys):
    """Far indices [B, n_kv, G, k] int32 of each query head's picks, or None (a NaN score:
    the NumPy path ranks it as `np.argpartition` does)."""
    B, n_kv, G, _ = tables.shape
    out = np.empty((B, n_kv, G, k), np.int32)
    ok = fn(
        tables, codes, buckets, lay.n_sinks, lay.n_far, n_centroids, k, candidates, q, keys, out
    )
    return out if ok else None
