"""Which layers run the missed-attention estimate where it cannot run on all of them.

The estimate costs each layer that runs it a share of its retrieval step. Where running it on
every layer costs more than `crossover.ESTIMATE_FREE` allows, the measured cost still affords it
on some (`crossover.affordable_layers`), and `A2ATSConfig.estimate_layers` asks for a number
outright. Which layers: those whose retrieval misses the most attention mass, which the
estimate itself measures (its estimated missed share of the softmax, `Retrieval.missed_share`).
Every member runs it for the cache list's first `WARMUP` retrieval steps; then `EstimateLayers`
keeps it on the `count` members with the highest mean share and turns it off on the others for
the life of the caches (their sums are dropped; the members kept share one `StepSums` again).
Where the estimate's gain goes, per layer, and what the default keeps of it: docs/BENCHMARKS.md
section 1, "The estimate on the layers that miss most".
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import mlx.core as mx
import numpy as np

from .crossover import measured_estimate_layers, step_kind
from .step_sums import StepSums

if TYPE_CHECKING:
    from .a2ats_cache import A2ATSCache

WARMUP = 8  # retrieval steps every member runs the estimate before the choice


class EstimateLayers:
    """The members (A2ATS caches running the estimate) of one cache list, `count` of which keep
    it after the warm-up (`chosen`: their layers, None until made)."""

    def __init__(self, members: list[A2ATSCache], count: int) -> None:
        self.members, self.count = members, count
        self.shares: dict[int, list[mx.array]] = {id(c): [] for c in members}
        self.chosen: tuple[int, ...] | None = None

    @staticmethod
    def join(caches: list) -> None:
        """Give the A2ATS caches of a cache list that run the estimate an `EstimateLayers` where
        fewer of them than all should keep it (`layer_count`), as their `estimate_choice`."""
        members = [c for c in caches if getattr(c, "estimates", False)]
        counts = {layer_count(c) for c in members}
        count = min((n for n in counts if n is not None), default=None)
        if count is None or count >= len(members):
            return
        choice = EstimateLayers(members, count)
        for c in members:
            c.estimate_choice = choice

    def report(self, cache: A2ATSCache, share: mx.array | None) -> None:
        """A member's estimated missed share at a retrieval step ([B, n_kv, G]); the choice is
        made when every member has reported `WARMUP` steps."""
        held = self.shares.get(id(cache))
        if self.chosen is not None or held is None or share is None:
            return
        held.append(share.astype(mx.float32).mean())
        # a member that never retrieves (a dense layer) never reports: it does not hold it up
        if min(len(s) for s in self.shares.values() if s) >= WARMUP:
            self._choose()

    def _choose(self) -> None:
        means = [self.shares[id(c)] for c in self.members]
        mx.eval(means)
        score = np.array([float(np.mean([float(m) for m in s])) if s else -np.inf for s in means])
        keep = sorted(np.argsort(-score, kind="stable")[: self.count].tolist())
        kept = [self.members[i] for i in keep]
        self.chosen = tuple(c.layer for c in kept)
        for i, c in enumerate(self.members):
            c.step_sums = None  # a kept layer's held part is not a new StepSums': rebuilt
            if i not in keep:
                c.estimates = False
                c.retrieval.forget_estimate()  # its sums and share go
        StepSums.join(kept)  # the kept layers' sums moved at once again
        self.shares = {}


def layer_count(cache: A2ATSCache) -> int | None:
    """On how many layers the estimate of `cache`'s settings runs: `estimate_layers` where
    given, else (the estimate left to the measurement) what the measured cost affords here
    (`crossover.measured_estimate_layers`), None for every layer."""
    config = cache.config
    if config.estimate_layers is not None:
        return config.estimate_layers
    if config.estimate_missed is not None:
        return None
    codebook = cache.codebook
    geometry = (codebook.num_layers, codebook.num_kv_heads, cache.rope.head_dim)
    return measured_estimate_layers(*geometry, step_kind(config, codebook.num_subspaces))
