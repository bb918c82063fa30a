"""The crossover probe behind `a2ats crossover`: decode speed of full attention vs A2ATS
retrieving from the first step, per context, on caches filled synthetically.

Each repeat runs the geometry bench's path (`geometries.bench_geometry_decode`): at every
context it fills mlx-lm's own caches (`full`) and A2ATS caches with `exact_below = 0` with the
same random keys and values (`fill_synthetic`: no prefill; with a codebook the keys are drawn
around its centroids, so they use its codes as a real cache's keys do and the far scores tie no
more than real text's, which NumPy's argpartition is sensitive to) and times greedy decode of
both interleaved (`speed._decode_interleaved`). The ratio
a2ats / full is taken within a repeat; `cache/crossover.py`'s `decide_crossover` turns the
median ratio per context into the crossover.

With the missed-attention estimate left at its default (`A2ATSConfig.estimate_missed` None) the
A2ATS caches are timed without it, and at the largest context also with it (`_est` methods,
interleaved with the rest; every method there decodes `ESTIMATE_STEPS` times as many steps, as
this ratio is the noisiest the probe takes): the median ratio with / without is the row's
`estimate.ratio`,
which decides whether None turns it on (`crossover.ESTIMATE_FREE`), and on how many of the
model's A2ATS layers where not on all (`estimate.layers`, `crossover.affordable_layers`). The
crossover is then decided on the ratios the default decodes at, that estimate's cost taken off
(`as_default_decodes`): the row's `ratios` stay the timed ones.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, replace

import mlx.nn as nn

from ..cache import crossover as xo
from ..cache import native_step
from ..cache.config import A2ATSConfig, estimate_would_run
from ..cache.crossover import TOP_K_STRATEGIES
from ..cache.geometry import model_geometry
from ..cache.layer_plan import plan_for
from ..progress import Progress
from .geometries import bench_geometry_decode

ESTIMATE_STEPS = 2  # times `steps` at the largest context, where the estimate is timed too


@dataclass(frozen=True)
class ContextTiming:
    """One context's decode speeds: medians over repeats, and each repeat's ratio a2ats / full
    (the two were timed interleaved within a repeat)."""

    context: int
    full_tokens_per_s: float
    a2ats_tokens_per_s: float
    ratios: tuple[float, ...]
    top_k: str | None = None  # the top-K strategy timed faster (None: only the default timed)
    top_k_ratios: dict[str, float] | None = None  # median a2ats / full per strategy
    estimate_ratios: tuple[float, ...] = ()  # each repeat's a2ats with the estimate / without
    estimate_top_k: str | None = None  # the top-K strategy faster with the estimate

    @property
    def estimate_ratio(self) -> float | None:
        """Median of the repeats' ratios with the missed-attention estimate / without (None:
        not timed at this context)."""
        return float(statistics.median(self.estimate_ratios)) if self.estimate_ratios else None

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
    (ascending), `repeats` times over all contexts; `steps` timed decode steps per method. With
    `config.estimate_missed` None, A2ATS without the estimate, and at the largest context also
    with it (module docstring)."""
    config = replace(config or A2ATSConfig(), exact_below=0)
    contexts = sorted(set(contexts))
    subspaces = codebook.num_subspaces if codebook is not None else 1
    # the estimate left to the measurement: timed without, and with at the largest context
    estimate_at = contexts[-1] if estimate_would_run(config, subspaces) else None
    if config.estimate_missed is None:
        config = replace(config, estimate_missed=False)
    total = repeats * len(contexts)
    top_ks = TOP_K_STRATEGIES if xo.backend() == "cpu" else ()
    runs = []
    for i in range(repeats):

        def report(stage: str, done: int, _total: int, i: int = i) -> None:
            if progress:
                progress(f"run {i + 1}/{repeats}, {stage}", i * len(contexts) + done, total)

        runs.append(
            bench_geometry_decode(
                model, contexts, steps=steps, config=config, codebook=codebook, seed=i,
                progress=report, top_ks=top_ks, estimate_at=estimate_at,
                estimate_steps=ESTIMATE_STEPS * steps,
            )
        )  # fmt: skip
    if progress:
        progress("measured", total, total)
    return timings_of(runs, contexts)


def timings_of(runs: list[list], contexts: list[int]) -> list[ContextTiming]:
    """ContextTiming per context from the repeats' DecodeResults. Where both top-K strategies
    were timed (`a2ats_mlx`, `a2ats_numpy`), A2ATS is the one faster at the largest context
    (median over repeats) at every context: the strategy the caches will use. Where the
    estimate was timed too (`<method>_est`), its ratio is the faster method with it over the
    faster without (each repeat), and `estimate_top_k` that method's strategy: the two
    strategies' estimates are different code (NumPy's in the host step, MLX's dense sums)."""
    rates = {n: [{r.method: r.tokens_per_s for r in run if r.context == n} for run in runs]
             for n in contexts}  # fmt: skip
    methods = [m for m in rates[contexts[-1]][0] if m.startswith("a2ats") and m[-4:] != "_est"]
    best = max(methods, key=lambda m: statistics.median(r[m] for r in rates[contexts[-1]]))
    top_k = best.removeprefix("a2ats_") if best != "a2ats" else None
    with_est = [m for m in methods if f"{m}_est" in rates[contexts[-1]][0]]
    est_best = max(
        with_est,
        key=lambda m: statistics.median(r[f"{m}_est"] for r in rates[contexts[-1]]),
        default=None,
    )
    est_top_k = None
    if est_best is not None and est_best != "a2ats":
        est_top_k = est_best.removeprefix("a2ats_")
    return [
        ContextTiming(
            n,
            float(statistics.median(r["full"] for r in rates[n])),
            float(statistics.median(r[best] for r in rates[n])),
            tuple(r[best] / r["full"] for r in rates[n]),
            top_k,
            {m.removeprefix("a2ats_"): round(statistics.median(r[m] / r["full"] for r in rates[n]), 3)
             for m in methods if m != "a2ats"},
            tuple(r[f"{est_best}_est"] / r[best] for r in rates[n] if f"{est_best}_est" in r),
            est_top_k if n == contexts[-1] else None,
        )
        for n in contexts
    ]  # fmt: skip


def as_default_decodes(
    ratios: dict[int, float], est_ratio: float | None, est_layers: int, layers: int
) -> dict[int, float]:
    """The speed ratios (a2ats / full per context) a step decodes at as the default runs it:
    the probe times retrieval without the estimate, and where the estimate goes on by default
    (on `est_layers` of `layers`, its cost on all of them measured as `est_ratio`) its share
    comes off every context's ratio, each layer taken to cost the same (`affordable_layers`'
    rule). The crossover is decided on these, so the default attends exactly wherever it would
    decode slower than KVCache with its estimate (the demo on a 2-core host: retrieval timed
    1.00x KVCache at 2K, the estimate 0.86x on all 30 layers, so on 10 of them, 0.95x: exact at
    2K; docs/BENCHMARKS.md section 2, "The host step in C++")."""
    if est_ratio is None or not est_layers or not layers:
        return dict(ratios)
    factor = 1.0 - min(est_layers, layers) / layers * (1.0 - est_ratio)
    return {n: r * factor for n, r in ratios.items()}


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
    a2ats_layers = len(plan.a2ats_layers)
    est_ratio = timings[-1].estimate_ratio if timings else None
    if est_ratio is not None:  # as recorded: the layers follow from the ratio the entry holds
        est_ratio = round(est_ratio, 3)
    est_layers = None if est_ratio is None else xo.affordable_layers(est_ratio, a2ats_layers)
    ratios = {t.context: t.ratio for t in timings}
    decision = xo.decide_crossover(
        as_default_decodes(ratios, est_ratio, est_layers or 0, a2ats_layers)
    )
    entry = {
        "backend": xo.backend(),
        "machine": xo.machine_id(),
        "layers": geo.num_layers,
        "kv_heads": geo.num_kv_heads,
        "head_dim": geo.head_dim,
        "step": xo.step_kind(config, codebook.num_subspaces if codebook is not None else 1),
        "exact_below": decision.exact_below,
        "never": decision.never,
        "model": model_name,
        "a2ats_layers": a2ats_layers,
        "date": xo.today(),
        "host_step": native_step.status(),  # what the retrieval step ran (cache/native_step.py)
        "host_step_kind": native_step.kind(),  # the row applies where the same step runs
        "ratios": {str(t.context): round(t.ratio, 3) for t in timings},
        **(
            {
                "estimate": {
                    "ratio": est_ratio,
                    "ratio_runs": [round(r, 3) for r in timings[-1].estimate_ratios],
                    "context": timings[-1].context,
                    "steps": ESTIMATE_STEPS * steps,
                    "scores": config.estimate_scores,
                    "on": est_layers > 0,
                    "layers": est_layers,
                    **({"top_k": timings[-1].estimate_top_k} if timings[-1].estimate_top_k else {}),
                }
            }
            if timings and timings[-1].estimate_ratio is not None
            else {}
        ),
        **(
            {
                "top_k": timings[-1].top_k,
                "top_k_ratios": {str(t.context): t.top_k_ratios for t in timings},
            }
            if timings and timings[-1].top_k
            else {}
        ),
        "steps": steps,
        "repeats": repeats,
        "budget": config.budget,
        "rerank": config.rerank,
        "codebook": codebook_desc,
        "measured_on": measured_on,
    }
    return entry, timings
