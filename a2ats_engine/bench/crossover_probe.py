"""The crossover probe behind `a2ats crossover`: decode speed of full attention vs A2ATS
retrieving from the first step, per context, on caches filled synthetically.

Each repeat runs the geometry bench's path (`geometries.bench_geometry_decode`): at every
context it fills mlx-lm's own caches (`full`) and A2ATS caches with `exact_below = 0` with the
same random keys and values (`fill_synthetic`: no prefill, timing does not depend on what the
keys mean) and times greedy decode of both interleaved (`speed._decode_interleaved`). The ratio
a2ats / full is taken within a repeat; `cache/crossover.py`'s `decide_crossover` turns the
median ratio per context into the crossover.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, replace

import mlx.nn as nn

from ..cache import crossover as xo
from ..cache.config import A2ATSConfig
from ..cache.geometry import model_geometry
from ..cache.layer_plan import plan_for
from ..progress import Progress
from .geometries import bench_geometry_decode


@dataclass(frozen=True)
class ContextTiming:
    """One context's decode speeds: medians over repeats, and each repeat's ratio a2ats / full
    (the two were timed interleaved within a repeat)."""

    context: int
    full_tokens_per_s: float
    a2ats_tokens_per_s: float
    ratios: tuple[float, ...]

    @property
    def ratio(self) -> float:
        """Median of the repeats' ratios a2ats / full."""
        return float(statistics.median(self.ratios))


def probe_crossover(
    model: nn.Module,
    contexts: list[int],
    *,
    steps: int = 12,
    repeats: int = 3,
    config: A2ATSConfig | None = None,
    codebook=None,
    progress: Progress | None = None,
) -> list[ContextTiming]:
    """Decode timings of `full` and A2ATS (`config` with exact_below 0) at each context
    (ascending), `repeats` times over all contexts; `steps` timed decode steps per method."""
    config = replace(config or A2ATSConfig(), exact_below=0)
    contexts = sorted(set(contexts))
    total = repeats * len(contexts)
    runs = []
    for i in range(repeats):

        def report(stage: str, done: int, _total: int, i: int = i) -> None:
            if progress:
                progress(f"run {i + 1}/{repeats}, {stage}", i * len(contexts) + done, total)

        runs.append(
            bench_geometry_decode(
                model, contexts, steps=steps, config=config, codebook=codebook, seed=i,
                progress=report,
            )
        )  # fmt: skip
    if progress:
        progress("measured", total, total)
    out = []
    for n in contexts:
        rates = [{r.method: r.tokens_per_s for r in run if r.context == n} for run in runs]
        out.append(
            ContextTiming(
                n,
                float(statistics.median(r["full"] for r in rates)),
                float(statistics.median(r["a2ats"] for r in rates)),
                tuple(r["a2ats"] / r["full"] for r in rates),
            )
        )
    return out


AUTO_CONTEXTS = (1024, 2048, 4096, 8192)  # what the app measures the first time (short)


def measure_crossover(
    model: nn.Module,
    model_name: str,
    contexts: list[int],
    *,
    steps: int = 12,
    repeats: int = 3,
    config: A2ATSConfig | None = None,
    codebook=None,
    codebook_desc: str = "",
    measured_on: str = "",
    progress: Progress | None = None,
) -> tuple[dict, list[ContextTiming]]:
    """Probe the crossover of `model` on this machine and decide it: (the user-table entry to
    record, the timings). `a2ats crossover` and the app's first-load measurement share it."""

    plan = plan_for(model).require()
    config = replace(config or A2ATSConfig(), exact_below=0)
    geo = model_geometry(model)
    timings = probe_crossover(
        model, contexts, steps=steps, repeats=repeats, config=config, codebook=codebook,
        progress=progress,
    )  # fmt: skip
    decision = xo.decide_crossover({t.context: t.ratio for t in timings})
    entry = {
        "backend": xo.backend(),
        "machine": xo.machine_id(),
        "layers": geo.num_layers,
        "kv_heads": geo.num_kv_heads,
        "head_dim": geo.head_dim,
        "exact_below": decision.exact_below,
        "never": decision.never,
        "model": model_name,
        "a2ats_layers": len(plan.a2ats_layers),
        "date": xo.today(),
        "ratios": {str(t.context): round(t.ratio, 3) for t in timings},
        "steps": steps,
        "repeats": repeats,
        "budget": config.budget,
        "rerank": config.rerank,
        "codebook": codebook_desc,
        "measured_on": measured_on,
    }
    return entry, timings
