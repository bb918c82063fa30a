"""`a2ats crossover SOURCE`: measure where A2ATS retrieval starts to pay off for a model on this
machine, and record it as the model's default `exact_below` (`cache/crossover.py`)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from . import _limits as limits
from ._bench_common import command_line
from ._flags import add_json_flag, add_preset_flags, add_retrieval_flags, retrieval_knobs
from .models import SOURCE_HELP

DEFAULT_CONTEXTS = "512,1024,2048,4096,8192,16384"


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "crossover",
        help="measure the context from which A2ATS retrieval decodes faster than full "
        "attention on this machine, and record it as the model's default exact_below",
        description=(
            f"SOURCE is {SOURCE_HELP}. At each context, fill mlx-lm's own caches (full) and A2ATS "
            "caches retrieving from the first step with the same random keys and values (no "
            "prefill), time greedy decode of both interleaved, and take the median ratio "
            "a2ats / full over the repeats. The crossover is the first context from which the "
            "ratio is >= 1 at every larger context measured; when retrieval is slower even at "
            "the largest context, the model attends exactly through it and retrieves beyond. "
            "The result goes into crossover.json in the user data dir ($A2ATS_CROSSOVER_FILE "
            "overrides the path), keyed by backend, machine, attention geometry and the "
            "settings a retrieval step's cost depends on (codebook subspaces, --budget, "
            "--rerank or --preset, distance buckets, K/V precision, --estimate): every A2ATS "
            "cache with those settings and exact_below unset uses it (A2ATSConfig.exact_below "
            "overrides it). With the missed-attention estimate at its default (no --estimate, "
            "or --estimate auto) a retrieval step is also timed with it on every layer at the "
            "largest context (every method there over twice --steps): where it keeps at least 0.95x the speed, the estimate is on by "
            "default on every layer for this model on this machine, else on as many of the "
            "layers that miss most as keep that speed (none: off). "
            "On CPU-only MLX both top-K strategies (MLX's, NumPy's) are timed and the faster "
            "one at the largest context is recorded for the caches to use. "
            "Measure on a quiet machine: other work makes the ratios noisy."
        ),
    )
    p.add_argument("source", metavar="SOURCE", help=SOURCE_HELP)
    p.add_argument(
        "--codebook",
        metavar="FILE",
        help="codebook file (default: the model's own, else a random one of 256 centroids, "
        "which times the same if the model's codebook has that size)",
    )
    p.add_argument(
        "--contexts",
        default=DEFAULT_CONTEXTS,
        help=f"comma-separated context lengths in tokens (default {DEFAULT_CONTEXTS})",
    )
    p.add_argument(
        "--steps", type=int, default=12, help="decode steps timed per method (default 12)"
    )
    p.add_argument(
        "--repeats", type=int, default=3, help="measurements per context; the median ratio counts"
    )
    add_retrieval_flags(p)
    add_preset_flags(p)
    add_json_flag(p, run)
    p.add_argument("--dry-run", action="store_true", help="measure and decide, record nothing")


def parse_contexts(text: str) -> list[int]:
    """'512,2048' -> [512, 2048] (sorted, distinct), each in [1, MAX_CONTEXT]. ValueError
    naming the bad entry."""
    if not any(part.strip() for part in text.split(",")):
        raise ValueError("--contexts is empty: give at least one context length")
    return sorted(set(limits.contexts("--contexts", text)))


def run(args: argparse.Namespace) -> int:
    contexts = parse_contexts(args.contexts)
    steps = limits.count("--steps", args.steps)
    repeats = limits.count("--repeats", args.repeats, 1, limits.MAX_REPEATS)
    budget = limits.budget(args.budget)
    limits.config_check("--rerank", rerank=args.rerank)
    knobs = retrieval_knobs(args)

    from ..bench.crossover_probe import measure_crossover
    from ..cache import crossover as xo
    from ..cache.geometry import model_geometry
    from ..cache.layer_plan import plan_for
    from ..loading.models import load_model
    from ._bench_common import (
        a2ats_config,
        find_codebook,
        machine,
        silence_random_codebook_warning,
        stderr_progress,
    )

    model, _, info = load_model(args.source)
    limits.check_cache_memory("--contexts", contexts, _fp16_bytes_per_token(model))
    plan = plan_for(model).require()
    codebook, codebook_desc = find_codebook(args.codebook, args.source, info.path, required=False)
    if codebook is None:
        from ..cache.model_cache import RANDOM_CENTROIDS

        silence_random_codebook_warning()
        codebook_desc = f"random ({RANDOM_CENTROIDS} centroids; none found for this model)"
    config = a2ats_config(codebook, model, exact_below=0, budget=budget, **knobs)
    geo = model_geometry(model)
    entry, timings = measure_crossover(
        model, info.name, contexts, steps=steps, repeats=repeats, config=config,
        codebook=codebook, measured_on=machine(),
        codebook_desc=codebook_desc if codebook is None else Path(codebook_desc).name,
        progress=stderr_progress(not args.json),
    )  # fmt: skip
    decision = xo.Decision(entry["exact_below"], entry["never"])
    path = None if args.dry_run else xo.record_crossover(entry)
    results = [
        {
            "context": t.context,
            "full_tokens_per_s": round(t.full_tokens_per_s, 2),
            "a2ats_tokens_per_s": round(t.a2ats_tokens_per_s, 2),
            "ratio": round(t.ratio, 3),
            "ratio_runs": [round(r, 3) for r in t.ratios],
        }
        for t in timings
    ]
    if args.json:
        out = {**entry, "results": results, "recorded": str(path) if path else None}
        out["command"] = command_line(args, "crossover")  # to run it again
        print(json.dumps(out))
        return 0
    print(
        f"model {info.name}: {plan.summary()}; {geo.num_layers} attention layers, "
        f"{geo.num_kv_heads} KV heads, head_dim {geo.head_dim}"
    )
    print(
        f"codebook {codebook_desc}; budget {config.budget}, rerank {config.rerank}; "
        f"{steps} steps, median of {repeats} run(s)"
    )
    print(f"machine: {entry['backend']}, {entry['machine']}")
    print(f"settings: {entry['step']}; host step: {entry['host_step']}")
    print(f"{'context':>8} {'full tok/s':>11} {'a2ats tok/s':>12} {'a2ats/full':>11}  every run")
    for r in results:
        runs = ", ".join(f"{x:.2f}" for x in r["ratio_runs"])
        print(
            f"{r['context']:>8} {r['full_tokens_per_s']:>11.2f} {r['a2ats_tokens_per_s']:>12.2f} "
            f"{r['ratio']:>10.2f}x  {runs}"
        )
    if entry.get("top_k"):
        names = xo.STRATEGY_NAMES
        each = "; ".join(
            f"{n}: " + ", ".join(f"{names[s]} {r:.2f}x" for s, r in per.items())
            for n, per in entry["top_k_ratios"].items()
        )
        print(f"top-K: {names[entry['top_k']]} measured faster at {contexts[-1]:,} ({each})")
    print(f"crossover: {decision.describe(contexts[-1])} (exact_below = {decision.exact_below})")
    if entry.get("estimate"):
        est = entry["estimate"]
        runs = ", ".join(f"{x:.2f}" for x in est["ratio_runs"])
        print(
            f"missed-attention estimate: a retrieval step with it {est['ratio']:.2f}x the speed "
            f"of one without at {est['context']:,} ({runs}): {_estimate_state(est, entry)} by "
            f"default (on every layer from {xo.ESTIMATE_FREE:.2f}x)"
        )
    if path is None:
        print(f"--dry-run: nothing recorded (would update {xo.user_table_path()})")
    else:
        print(f"recorded in {path}: A2ATS caches of this geometry on this machine use it")
    return 0


def _estimate_state(est: dict, entry: dict) -> str:
    """'on', 'on the 12 layers that miss most' or 'off': what the measurement turned on."""
    if not est["on"]:
        return "off"
    layers = est.get("layers")
    if layers is None or layers >= entry["a2ats_layers"]:
        return "on every layer"
    return (
        "on the 1 layer that misses most"
        if layers == 1
        else f"on the {layers} layers that miss most"
    )


def _fp16_bytes_per_token(model) -> int:
    from ..bench.speed import fp16_bytes_per_token

    return fp16_bytes_per_token(model)
