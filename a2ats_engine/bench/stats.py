"""Intervals for figures that average over consecutive tokens.

Per-token quantities of one text (a method's NLL minus the reference's, say) are autocorrelated:
a hard passage makes several neighbouring tokens hard for every method. An interval that treats
them as independent draws is too narrow. `block_bootstrap_ci` resamples blocks of consecutive
tokens instead (the circular block bootstrap of Politis & Romano, 1992), which keeps the
dependence within a block; several texts are resampled each within itself (stratified), so a
block never joins the end of one text to the start of another.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

RESAMPLES = 2000
LEVEL = 0.95


def default_block(tokens: int) -> int:
    """Block length for `tokens` consecutive values: floor(tokens ** (1/3)), at least 1 (the
    rate that balances the bias and variance of the bootstrap variance estimate)."""
    return max(1, int(math.floor(tokens ** (1.0 / 3.0) + 1e-9)))


def block_bootstrap_ci(
    segments: Sequence[np.ndarray] | np.ndarray,
    *,
    block: int | None = None,
    resamples: int = RESAMPLES,
    level: float = LEVEL,
    seed: int = 0,
) -> tuple[float, float, float]:
    """(mean, low, high): the mean of all values and its `level` percentile interval.

    segments: one array `[M]` or several (one per text), each a run of consecutive values.
    Every resample draws ceil(M_s / block) circular blocks of `block` consecutive values from
    each segment s (trimmed to M_s values) and takes the mean of all drawn values. Deterministic
    for a seed. block: default `default_block` of the longest segment."""
    if isinstance(segments, np.ndarray):
        parts = [segments.astype(np.float64).reshape(-1)]
    else:
        parts = [np.asarray(s, dtype=np.float64).reshape(-1) for s in segments]
    parts = [p for p in parts if p.size]
    if not parts:
        raise ValueError("segments hold no values: need at least one value")
    if not 0.0 < level < 1.0:
        raise ValueError(f"level={level} is out of range: must be in (0, 1)")
    mean = float(np.concatenate(parts).mean())
    if sum(p.size for p in parts) < 2:
        return mean, mean, mean
    b = block or default_block(max(p.size for p in parts))
    if b < 1:
        raise ValueError(f"block={b} is out of range: must be >= 1")
    rng = np.random.default_rng(seed)
    total = np.zeros(resamples)
    for p in parts:
        m = p.size
        n_blocks = -(-m // b)
        starts = rng.integers(0, m, size=(resamples, n_blocks))
        index = ((starts[:, :, None] + np.arange(b)) % m).reshape(resamples, -1)[:, :m]
        total += p[index].sum(axis=1)
    means = total / sum(p.size for p in parts)
    tail = (1.0 - level) / 2.0
    low, high = np.quantile(means, [tail, 1.0 - tail])
    return mean, float(low), float(high)
