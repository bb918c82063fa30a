"""Where to spend the retrieval budget: per-layer multipliers of `A2ATSConfig.budget`.

One budget fraction for every layer spends as much on a layer whose attention the codes find
easily as on one where retrieval misses a lot. These pure functions turn what was measured into
`A2ATSConfig.layer_budgets` (one multiplier per model layer) at the same total cost: the mean
multiplier over the layers that retrieve is 1, so the far tokens retrieved per step, summed over
layers, stay those of the plain budget (min_k and the GQA union aside; `a2ats eval` reports the
attended count each method really paid).

- `allocate_layer_budgets(recall_per_layer)`: more budget where recall is lowest. A layer's
  missed mass is `1 - recall`; its multiplier is proportional to `miss ** power`, clipped to
  [floor, cap] and renormalised (exactly, by bisection on the scale) to mean 1. With
  `power = 1 / (1 + a)` this is the split that minimises the summed missed mass if every
  layer's miss falls as `K ** -a` with its retrieved count K (Lagrange: `K_l ~ miss_l **
  (1 / (1 + a))` from equal budgets); the default 0.5 assumes `a = 1` (miss ~ 1 / K).
- `dense_first_budgets(num_layers, dense, budget)`: the first `dense` layers attend exactly
  (as Quest and Twilight keep their first two layers dense), the others lowered so the mean
  fraction stays `budget`; where that would push them under `floor` they sit at the floor and
  the total cost is above the plain budget's (see the function).

A multiplier whose scaled fraction reaches 1 makes its layer dense (`config.scaled_budget`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

FLOOR = 0.25  # a layer keeps at least a quarter of the plain budget
CAP = 4.0  # and at most four times it
POWER = 0.5  # multiplier ~ missed mass ** POWER (the optimum if miss ~ 1 / K)


def allocate_layer_budgets(
    recall_per_layer: Sequence[float | None],
    *,
    floor: float = FLOOR,
    cap: float = CAP,
    power: float = POWER,
) -> tuple[float, ...]:
    """Per-layer budget multipliers from measured recall (see the module docstring).

    recall_per_layer: one mean recall in [0, 1] per model layer, None for a layer that did not
    retrieve (its multiplier is 1 and it is left out of the mean). Returns one multiplier per
    layer, each in [floor, cap], with mean exactly 1 (to float rounding) over the measured
    layers. Layers that missed nothing all get the same share; when every layer missed nothing
    every multiplier is 1. Raises ValueError naming a bad recall, floor, cap or power.
    """
    if not 0.0 < floor <= 1.0 <= cap or not math.isfinite(cap):
        raise ValueError(
            f"floor={floor!r}, cap={cap!r} are out of range: need 0 < floor <= 1 <= cap (finite)"
        )
    if not (math.isfinite(power) and power > 0):
        raise ValueError(f"power={power!r} is out of range: must be positive and finite")
    for i, r in enumerate(recall_per_layer):
        if r is not None and not (isinstance(r, int | float) and 0.0 <= r <= 1.0):
            raise ValueError(f"recall_per_layer[{i}]={r!r} is out of range: must be in [0, 1]")
    measured = [i for i, r in enumerate(recall_per_layer) if r is not None]
    out = [1.0] * len(recall_per_layer)
    if not measured:
        return tuple(out)
    weights = [(1.0 - float(recall_per_layer[i])) ** power for i in measured]
    for i, m in zip(measured, _mean_one(weights, floor, cap), strict=True):
        out[i] = m
    return tuple(out)


def _mean_one(weights: list[float], floor: float, cap: float) -> list[float]:
    """`clip(s * w, floor, cap)` with the scale s that makes the mean 1 (weights >= 0)."""
    n = len(weights)
    positive = [w for w in weights if w > 0]
    if not positive:
        return [1.0] * n
    # zero weights sit at the floor; if even the positive ones all at the cap cannot reach a
    # mean of 1, the zero-weight layers share what is left (above the floor)
    n_zero = n - len(positive)
    if n_zero and (len(positive) * cap + n_zero * floor) / n < 1.0:
        rest = (n - len(positive) * cap) / n_zero
        return [cap if w > 0 else rest for w in weights]

    def mean(s: float) -> float:
        return sum(min(cap, max(floor, s * w)) if w > 0 else floor for w in weights) / n

    lo, hi = floor / max(positive), cap / min(positive)  # mean(lo) <= 1 <= mean(hi)
    for _ in range(200):
        mid = math.sqrt(lo * hi)
        if mean(mid) < 1.0:
            lo = mid
        else:
            hi = mid
    clipped = [min(cap, max(floor, hi * w)) if w > 0 else floor for w in weights]
    # the free (unclipped) layers absorb the bisection's last rounding
    free = [i for i, m in enumerate(clipped) if floor < m < cap]
    if free:
        excess = sum(clipped) - n
        share = excess / len(free)
        for i in free:
            clipped[i] -= share
    return clipped


def dense_first_budgets(
    num_layers: int, dense: int, budget: float, *, floor: float = FLOOR
) -> tuple[float, ...]:
    """Multipliers keeping the first `dense` layers dense (their fraction reaches 1) and the
    other layers at `(num_layers - dense / budget) / (num_layers - dense)`, the value that keeps
    the mean fraction at `budget` (equal far-token cost), but never under `floor`.

    Equal cost therefore needs `budget >= dense / (num_layers - floor * (num_layers - dense))`
    (about 0.087 for two dense layers of 30); under it the other layers sit at `floor` and the
    total cost is above the plain budget's (`equal_cost_dense` says which). budget: a fraction
    in (0, 1] (a token count has no fixed share of the context)."""
    if isinstance(budget, bool) or not isinstance(budget, float) or not 0.0 < budget <= 1.0:
        raise ValueError(
            f"budget={budget!r} is out of range: dense layers need a fractional budget in (0, 1]"
        )
    if not 0 < dense < num_layers:
        raise ValueError(
            f"dense={dense!r} is out of range: must be in [1, {num_layers - 1}] for "
            f"{num_layers} layers"
        )
    rest = (num_layers - dense / budget) / (num_layers - dense)
    return (1.0 / budget,) * dense + (max(floor, rest),) * (num_layers - dense)


def equal_cost_dense(num_layers: int, dense: int, budget: float, *, floor: float = FLOOR) -> bool:
    """Whether `dense_first_budgets` keeps the plain budget's mean fraction (not floored)."""
    return (num_layers - dense / budget) / (num_layers - dense) >= floor
