"""A crossover for every model before anyone measured it: a cost model from the geometry.

Per layer and decode step, exact attention reads every cached K/V row:
    exact(N)     = 2 * N * n_kv * d * b                    (b: bytes per K/V element)
and a retrieval step reads the codes, the rerank candidates' keys and the selected rows:
    retrieval(N) = 2 * N * n_kv                            (uint16 codes)
                 + candidates(N) * n_kv * d * b            (rerank: r*K per query head, or per
                                                            KV head with a shared rerank)
                 + selected(N) * n_kv * d * b * 2          (sinks + window + G*K, keys and values)
                 + FIXED_BYTES                             (the step's fixed cost, as bytes)
                 + slots * row                             (with the missed-attention estimate:
                                                            its per-slot sums, read every step)
with K = max(min_k, ceil(budget * N)) and G query heads per KV head. The estimate is the
smallest context (tokens) from which exact(N) >= retrieval(N). FIXED_BYTES is calibrated on the
one crossover measured on a quiet machine (the demo model's 4,096 tokens on a 2-core x86_64
CPU, `crossover.MEASURED`); docs/BENCHMARKS.md section 4 has the decode speed measured on three
real geometries, which this estimate is not checked against. It is a starting value, never 0: the app measures the real crossover
on each machine (`a2ats crossover`), and a measurement always wins (`crossover.lookup_crossover`).
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

from mlx.utils import tree_flatten

from ..records import ModelGeometry
from .config import A2ATSConfig
from .crossover import Crossover, lookup_crossover, step_kind
from .geometry import model_geometry

DEMO_GEOMETRY = (3, 9, 64, 4)  # KV heads, query heads, head dim, bytes per element (float32)
DEMO_CROSSOVER = 4096  # measured: crossover.MEASURED[("cpu", 30, 3, 64, DEFAULT_KIND)]
MIN_ESTIMATE = 256  # never 0: retrieval's fixed cost always needs some context to pay off
MAX_ESTIMATE = 1 << 20


def _selected(n: int, n_q: int, n_kv: int, config: A2ATSConfig) -> tuple[int, int]:
    """(rerank candidates, selected rows) per KV head at context n."""
    k = config.top_k(n)
    group = max(n_q // max(n_kv, 1), 1)
    per_head = 1 if config.rerank_shared else group
    candidates = config.rerank * k * per_head if config.rerank > 1 else 0
    return candidates, config.sinks + config.window + group * k


def estimate_bytes(n_kv: int, d: int, config: A2ATSConfig, n_centroids: int | None) -> int:
    """What the missed-attention estimate reads a step per layer: its float32 per-slot counts
    and sums (values, and keys unless slots are scored by their centroid); 0 when it is off or
    the codebook's size is not known."""
    if not config.estimate_missed or not n_centroids:
        return 0
    by_code = config.estimate_scores == "code_mean"
    slots = n_centroids * (1 if by_code else config.far_buckets)
    row = 1 + d * (1 if config.estimate_scores == "centroid" else 2)
    return slots * n_kv * row * 4


def step_bytes(
    n: int, n_q: int, n_kv: int, d: int, b: int, config: A2ATSConfig, n_centroids: int | None = None
) -> tuple:
    """(exact attention's bytes, retrieval's bytes without the fixed cost) per layer and step;
    `n_centroids`: the one-VQ codebook's size, for the estimate's sums (`estimate_bytes`)."""
    candidates, selected = _selected(n, n_q, n_kv, config)
    exact = 2 * n * n_kv * d * b
    retrieval = 2 * n * n_kv + candidates * n_kv * d * b + selected * n_kv * d * b * 2
    return exact, retrieval + estimate_bytes(n_kv, d, config, n_centroids)


def _fixed_bytes() -> int:
    """The fixed cost of a retrieval step, in bytes, from the demo's measured crossover."""
    n_kv, n_q, d, b = DEMO_GEOMETRY
    exact, retrieval = step_bytes(DEMO_CROSSOVER, n_q, n_kv, d, b, A2ATSConfig())
    return exact - retrieval


FIXED_BYTES = _fixed_bytes()


def estimate_crossover(
    n_q: int,
    n_kv: int,
    head_dim: int,
    kv_bytes: int,
    config: A2ATSConfig | None = None,
    n_centroids: int | None = None,
) -> int:
    """The estimated crossover (tokens) for one layer geometry and the cache's settings: the
    smallest context on a quarter-octave grid (256, 304, 362, 431, 512, ..., 1.19x apart) from
    which exact attention reads at least as many bytes as retrieval plus its fixed cost; within
    [MIN_ESTIMATE, MAX_ESTIMATE]."""
    config = config or A2ATSConfig()
    for i in range(4 * int(math.log2(MAX_ESTIMATE // MIN_ESTIMATE)) + 1):
        n = round(MIN_ESTIMATE * 2 ** (i / 4))
        exact, retrieval = step_bytes(n, n_q, n_kv, head_dim, kv_bytes, config, n_centroids)
        if exact >= retrieval + FIXED_BYTES:
            return n
    return MAX_ESTIMATE


def estimate_for(
    geometry: ModelGeometry, config: A2ATSConfig, kv_bytes: int, n_centroids: int | None = None
) -> int:
    """`estimate_crossover` for a model's geometry (its reference A2ATS layer)."""
    return estimate_crossover(
        geometry.num_heads, geometry.num_kv_heads, geometry.head_dim, kv_bytes, config, n_centroids
    )


ESTIMATE_SOURCE = "estimated from the geometry (no measurement on this machine yet)"


def default_crossover(model: Any, config: A2ATSConfig, codebook: Any = None) -> Crossover:
    """The crossover that applies to `model` here with these settings and codebook (None: a
    one-VQ one of unknown size): measured on this machine, else the built-in row, else the cost
    model's estimate (`origin` "estimate"; it counts the estimate's sums where the codebook's
    size is known): never 0."""
    geometry = model_geometry(model)
    subspaces = getattr(codebook, "num_subspaces", 1)
    kind = step_kind(config, subspaces)
    row = lookup_crossover(geometry.num_layers, geometry.num_kv_heads, geometry.head_dim, kind)
    if row is not None:
        return row
    kv_bytes = tree_flatten(model.parameters())[0][1].dtype.size
    n_centroids = getattr(codebook, "n_centroids", None) if subspaces == 1 else None
    tokens = estimate_for(geometry, config, kv_bytes, n_centroids)
    return Crossover(tokens, ESTIMATE_SOURCE, origin="estimate")


def with_default_crossover(
    model: Any, config: A2ATSConfig, codebook: Any = None
) -> tuple[A2ATSConfig, Crossover]:
    """`config` with `exact_below` set to the crossover that applies (when it is None), and
    that crossover (what the app and `a2ats chat` run with; `a2ats info` says which applies).
    `codebook`: the one the caches use (its subspace count is part of the step kind). The
    missed-attention estimate left to the measurement (None) stays None, for the caches to
    decide with the top-K strategy measured with it; the crossover's `estimate_on` says what
    they will decide."""
    row = default_crossover(model, config, codebook)
    if config.exact_below is not None:
        set_here = {"source": "set in the settings", "origin": "settings", "never": False}
        return config, replace(row, tokens=config.exact_below, **set_here)
    return replace(config, exact_below=row.tokens), row
