# ruff: noqa: I001  (a2ats_engine before mlx: it preloads OpenBLAS)
"""Where the fixed cost of a retrieval step goes: the demo model decoding greedily from a real
prefill at one context, with A2ATS's host step (NumPy's top-K) replaced piece by piece.

Every variant decodes the same way (`bench/speed.py`'s pipelined greedy loop, the variants
taking turns CHUNK steps at a time), from the same prefilled state:

- `kvcache`: mlx-lm's KVCache (the baseline).
- `exact`: A2ATS caches (each key coded and stored) attending exactly, no host sync.
- `sync`: as `exact`, plus the host step's one `mx.eval` a layer (queries, codes, rows, the
  step's rotation matrix).
- `sync_tables`: as `sync`, plus the layer's lookup tables computed after it, as the host step
  computes them (`host_step.host_tables`, in NumPy since 2026-12-06; before, in MLX inside the
  eval), for the distance buckets that hold a far token.
- `host_step`: the shipped retrieval step (`cache/host_step.py`), retrieval forced.

Each difference is one piece's cost per step: `exact - kvcache` the coding and storing of keys,
`sync - exact` the per-layer sync (its own cost and the overlap it loses: a KVCache step's
graph is built while the previous step computes), `sync_tables - sync` the tables, and
`host_step - sync_tables` the NumPy part of the step.

    .venv/bin/python docs/benchmarks/step_overhead.py [context] > docs/benchmarks/step_overhead.json
"""

from __future__ import annotations

import json
import statistics
import sys
import time

import a2ats_engine  # noqa: F401  (BLAS preload before mlx.core)
import mlx.core as mx
import numpy as np

from a2ats_engine.bench.speed import _method_cache
from a2ats_engine.cache import attention as att
from a2ats_engine.cache import host_step, numpy_blas
from _demo_prefill import demo_prefilled, take_turns, turns_record

VARIANTS = ("kvcache", "exact", "sync", "sync_tables", "host_step")
CHUNK = 6
ROUNDS = 7  # the first round warms up and is not counted


def _variant_step(variant: str, shipped):
    """A replacement for `host_step.step` that does only what `variant` names."""
    if variant == "host_step":
        return shipped

    def step(retrieval, cache, queries, lay, scale, sinks):
        if variant != "exact":
            distances = tuple(cache.buckets[0])
            to_far = att.step_rotations(cache.rope, lay.n - 1, cache.rotations, distances)
            mx.eval(queries, cache.codes, cache.rows.keys, cache.rows.values, to_far)
            if variant == "sync_tables":
                B, n_q, _, d = queries.shape
                n_kv = cache.codes.shape[1]
                q = np.asarray(queries).reshape(B, n_kv, n_q // n_kv, d).astype(np.float32)
                centroids = np.asarray(cache.codebook.scoring_centroids(cache.layer))
                used = d * host_step.used_buckets(cache, lay)  # the buckets holding a far token
                with numpy_blas.one_thread():
                    host_step.host_tables(q, np.asarray(to_far)[:, :used], centroids)
        keys = cache.rows.keys[..., : lay.n, :].astype(queries.dtype)
        values = cache.rows.values[..., : lay.n, :].astype(queries.dtype)
        out = mx.fast.scaled_dot_product_attention(queries, keys, values, scale=scale)
        empty = mx.zeros((queries.shape[0], cache.codes.shape[1], 1), mx.int32)
        return out, empty, empty.astype(mx.bool_)

    return step


def main(context: int) -> dict:
    model, info, codebook, desc, config, ids, base = demo_prefilled(context)
    caches = {
        v: _method_cache(model, base, "full" if v == "kvcache" else "a2ats_eb0", config, codebook)
        for v in VARIANTS
    }
    shipped = host_step.step
    ms = take_turns(model, caches, ids[-1], ROUNDS, CHUNK, lambda v: _variant_step(v, shipped))
    median = {v: statistics.median(ms[v]) for v in VARIANTS}
    layers = sum(1 for c in caches["exact"] if hasattr(c, "codes"))
    pieces = {
        "code and store each key": median["exact"] - median["kvcache"],
        "one sync a layer": median["sync"] - median["exact"],
        "lookup tables": median["sync_tables"] - median["sync"],
        "NumPy step": median["host_step"] - median["sync_tables"],
    }
    return {
        **turns_record("step_overhead.py", info, desc, context, ms, CHUNK),
        "a2ats_layers": layers,
        "pieces_ms_per_step": {k: round(x, 2) for k, x in pieces.items()},
        "pieces_ms_per_layer": {k: round(x / layers, 3) for k, x in pieces.items()},
        "date": time.strftime("%Y-%m-%d"),
    }


if __name__ == "__main__":
    contexts = [int(c) for c in (sys.argv[1] if len(sys.argv) > 1 else "1024").split(",")]
    print(json.dumps({"runs": [main(c) for c in contexts]}))
