"""`a2ats bench decode`: decode tokens/s of A2ATS vs mlx-lm's caches (a model, or a real model's geometry; `--profile` for the phases of a step)."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from .. import _limits as limits
from .._bench_common import a2ats_config, print_json
from .._flags import (
    CODEBOOK_OR_RANDOM,
    RERANK_CONFIG_HELP,
    add_budget_flag,
    add_json_flag,
    add_model_flags,
    add_rerank_flag,
)
from .common import bench_run, check_repeats, load_codebook
from .profile import run_profile

DECODE_METHOD_NAMES = (
    "full, kv8, kv4, window, a2ats, a2ats_kv8, a2ats_kv4, a2ats_telemetry, a2ats_noest, "
    "a2ats_est, a2ats_rr<N>[g], a2ats_cov<NN>, a2ats_eb<N> (suffixes combine in that order: "
    "a2ats_kv4_rr2_eb0; a last _npstep keeps the NumPy host step: a2ats_eb0_npstep, a last _sync "
    "the synced C++ step instead of the graph step: a2ats_eb0_sync)"
)


HELP = "decode tokens/s and cache bytes of A2ATS vs mlx-lm's KVCache at several contexts"
DESCRIPTION = (
    "Prefill each context once, then decode the same tokens through every method from an "
    "identical state. Prints tokens/s, bytes held per token and ratios to `full` "
    "(mlx-lm KVCache)."
)


DEFAULT_METHODS = "full,a2ats,a2ats_kv4"


def register(bench: argparse._SubParsersAction) -> None:
    d = bench.add_parser("decode", help=HELP, description=DESCRIPTION)
    add_model_flags(d, CODEBOOK_OR_RANDOM, "1024,4096,8192", "comma-separated context lengths")
    d.add_argument("--steps", type=int, default=32, help="decode steps timed per method")
    add_budget_flag(d)
    d.add_argument(
        "--methods",
        default=None,
        help="comma list (default full,a2ats,a2ats_kv4; with --profile one A2ATS method, "
        "default a2ats, whose settings the profiled step takes) of: full, kv8, kv4, window (exact attention over sinks + the last "
        "window + K tokens: A2ATS's attended count with nothing scored, the speed ceiling), "
        "a2ats, a2ats_kv8, a2ats_kv4, a2ats_telemetry; "
        "a2ats_rr<N> = a2ats with rerank N, a2ats_eb<N> = exact_below N (a2ats_eb0: retrieval "
        "from the start, the crossover probe), suffix _estm = the missed-attention estimate "
        "(mean slot scores; _estc codes alone, _est centroid scores, _noest off); combines: "
        "a2ats_kv4_rr2_eb0_estm",
    )
    add_rerank_flag(d, RERANK_CONFIG_HELP)
    d.add_argument(
        "--repeats",
        type=int,
        default=3,
        help="measure this many times; tok/s and ratios are the median, with the spread "
        "(min-max of the ratios) and every run's ratio (the machine may be shared and noisy)",
    )
    d.add_argument(
        "--telemetry", action="store_true", help="also time a2ats with telemetry on (overhead)"
    )
    d.add_argument(
        "--profile",
        action="store_true",
        help="time each phase of an A2ATS decode step per layer (retrieval forced), beside a "
        "KVCache step and exact attention, with the thread settings",
    )
    d.add_argument(
        "--geometry",
        help="instead of --model: a random-weight float32 model with a real model's geometry "
        "(qwen3-0.6b, llama-3.2-1b, gemma-3-1b; tiny for smoke runs), caches filled "
        "synthetically (no prefill); times full and a2ats, plus calibration throughput",
    )
    d.add_argument(
        "--calibration-tokens",
        type=int,
        default=4096,
        help="with --geometry: tokens calibrated to time calibration (0: skip)",
    )
    add_json_flag(d, run_decode)


def _is_decode_method(name: str) -> bool:
    from ...bench.methods import decode_variant_knobs, host_step_variant

    name = host_step_variant(name)[0]
    return name in ("full", "kv8", "kv4", "window") or decode_variant_knobs(name) is not None


def check_decode_args(args: argparse.Namespace) -> tuple[list[int], float | int, list[str]]:
    """(contexts, budget, methods) of `bench decode`, every flag range-checked before any
    model is loaded (ValueError naming the flag)."""
    contexts = limits.contexts("--contexts", args.contexts)
    limits.count("--steps", args.steps)
    check_repeats(args.repeats)
    limits.count("--calibration-tokens", args.calibration_tokens, 0, limits.MAX_CALIBRATION_TOKENS)
    budget = limits.budget(args.budget)
    limits.config_check("--rerank", rerank=args.rerank)
    text = args.methods or DEFAULT_METHODS
    methods = limits.names("--methods", text, _is_decode_method, [DECODE_METHOD_NAMES])
    return contexts, budget, methods


def median_results(runs: list[list]) -> list:
    """One result per (context, method) from several runs of the same measurement: the median
    tok/s, and in `extra` the median ratio to `full` of the same run, its spread (min, max) and
    every run's ratio. Ratios are taken within a run (methods are timed interleaved there)."""
    import statistics
    from dataclasses import replace

    def ratios(context: int, method: str) -> list[float]:
        out = []
        for run in runs:
            by = {(r.context, r.method): r for r in run}
            out.append(by[(context, method)].tokens_per_s / by[(context, "full")].tokens_per_s)
        return out

    merged = []
    for first in runs[0]:
        same = [next(r for r in run if (r.context, r.method) == (first.context, first.method))
                for run in runs]  # fmt: skip
        rs = ratios(first.context, first.method)
        extra = {
            **first.extra,
            "runs": len(runs),
            "ratio_median": round(statistics.median(rs), 3),
            "ratio_spread": [round(min(rs), 3), round(max(rs), 3)],
            "ratio_runs": [round(x, 3) for x in rs],
        }
        tok_s = statistics.median(r.tokens_per_s for r in same)
        merged.append(replace(first, tokens_per_s=tok_s, extra=extra))
    return merged


def _decode_meta(args: argparse.Namespace, head: dict, **extra: Any) -> dict:
    """What a `bench decode` result records besides its rows: `head`, the steps and repeats,
    `extra`, the machine and the command."""
    from ...cache import native_step

    return {
        **head,
        "steps": args.steps,
        "repeats": args.repeats,
        **extra,
        "host_step": native_step.status(),
        **bench_run("decode", args),
    }


def run_geometry_decode(args: argparse.Namespace) -> int:
    """`a2ats bench decode --geometry NAME`: real-size shapes, random weights, synthetic caches."""
    from ...bench.geometries import (
        GEOMETRIES,
        bench_geometry_decode,
        calibration_throughput,
        geometry_model,
        parameter_count,
    )
    from ...cache.config import A2ATSConfig
    from ...cache.geometry import model_geometry
    from ...cache.layer_plan import plan_for

    contexts, budget, _ = check_decode_args(args)
    if args.methods is not None:  # said, not dropped: a geometry run times its two methods
        raise ValueError("--methods does not apply with --geometry: it times full and a2ats")
    if args.geometry not in GEOMETRIES:
        known = ", ".join(GEOMETRIES)
        raise ValueError(f"--geometry={args.geometry!r} is unknown: choose one of {known}")
    model = geometry_model(args.geometry)
    limits.check_model_context("--contexts", contexts, model_geometry(model).max_context)
    knobs = {"budget": budget}
    if args.rerank is not None:
        knobs["rerank"] = args.rerank
    from ...cache.model_cache import RANDOM_CENTROIDS

    config = A2ATSConfig(**knobs)
    runs = [
        bench_geometry_decode(model, contexts, steps=args.steps, config=config, seed=i)
        for i in range(check_repeats(args.repeats))
    ]
    results = median_results(runs)
    rows = []
    for r in results:
        full = next(x for x in results if x.context == r.context and x.method == "full")
        rows.append(
            {
                "method": r.method,
                "context": r.context,
                "tokens_per_s": round(r.tokens_per_s, 2),
                "speed_vs_full": r.extra["ratio_median"],
                "ratio_spread": r.extra["ratio_spread"],
                "ratio_runs": r.extra["ratio_runs"],
                "bytes_held": r.bytes_held,
                "bytes_vs_full": round(r.bytes_held / max(full.bytes_held, 1), 3),
                "measured_anon_growth": r.extra.get("anon_growth"),  # the first run's fill
            }
        )
    calib = None
    if args.calibration_tokens:
        calib = calibration_throughput(model, config, args.calibration_tokens)
    head = {
        "geometry": args.geometry,
        "description": GEOMETRIES[args.geometry][0],
        "parameters": parameter_count(model),
        "layer_plan": plan_for(model).summary(),
        "codebook": f"random ({RANDOM_CENTROIDS} centroids): timing only",
        "budget": config.budget,
    }
    meta = _decode_meta(args, head, calibration=calib)
    if print_json(args, {**meta, "results": rows}):
        return 0
    print(f"{meta['description']} ({meta['parameters'] / 1e9:.2f}B parameters, float32)")
    print(f"{meta['layer_plan']}, budget {config.budget}, {args.steps} steps")
    print(
        f"{'context':>8} {'method':<8} {'tok/s':>8} {'vs full':>8} {'MB held':>10} {'vs full':>8}"
    )
    for row in rows:
        print(
            f"{row['context']:>8} {row['method']:<8} {row['tokens_per_s']:>8.2f} "
            f"{row['speed_vs_full']:>7.2f}x {row['bytes_held'] / 1e6:>10.1f} "
            f"{row['bytes_vs_full']:>7.3f}x"
        )
    if calib:
        print(
            f"calibration: {calib['tokens']} tokens, collect {calib['collect_tokens_per_s']:.0f} "
            f"tok/s, fit {calib['fit_seconds']:.1f} s, overall {calib['tokens_per_s']:.0f} tok/s"
        )
    return 0


def run_decode(args: argparse.Namespace) -> int:
    if args.profile:
        return run_profile(args)
    if args.geometry:
        return run_geometry_decode(args)
    from ...bench.speed import bench_decode, fp16_bytes_per_token
    from ...loading.models import load_model

    contexts, budget, methods = check_decode_args(args)
    model, tokenizer, info = load_model(args.model)
    limits.check_model_context("--contexts", contexts, info.context_length)
    codebook, codebook_desc = load_codebook(args.codebook, args.model, info.path)
    if "full" not in methods:  # every figure is a ratio to mlx-lm's KVCache in the same run
        methods.insert(0, "full")
    if args.telemetry and "a2ats_telemetry" not in methods:
        methods.append("a2ats_telemetry")
    config = a2ats_config(codebook, model, budget=budget, rerank=args.rerank)

    def progress(stage, done, total):
        if not args.json:
            print(f"  {stage} ({done + 1}/{total})", file=sys.stderr)

    runs = [
        bench_decode(
            model,
            tokenizer,
            contexts,
            steps=args.steps,
            config=config,
            codebook=codebook,
            methods=tuple(methods),
            progress=progress,
        )
        for _ in range(check_repeats(args.repeats))
    ]
    results = median_results(runs)
    fp16 = fp16_bytes_per_token(model)
    rows = []
    for r in results:
        rows.append(
            {
                "method": r.method,
                "context": r.context,
                "tokens_per_s": round(r.tokens_per_s, 2),
                "speed_vs_full": r.extra["ratio_median"],
                "bytes_per_token": round(r.bytes_per_token, 1),
                "bytes_vs_fp16_full": round(r.bytes_per_token / fp16, 3),
                **r.extra,
            }
        )
    head = {
        "model": info.name,
        "codebook": codebook_desc,
        "n_centroids": codebook.n_centroids if codebook else None,
        "budget": config.budget,
        "rerank": config.rerank,
    }
    meta = _decode_meta(args, head, fp16_bytes_per_token=fp16)
    if print_json(args, {**meta, "results": rows}):
        return 0
    print(
        f"model {info.name}, codebook {meta['codebook']}, budget {config.budget}, "
        f"{args.steps} steps"
    )
    print(
        f"{'context':>8} {'method':<16} {'tok/s':>8} {'vs full':>8} {'B/token':>10} {'vs fp16':>8}"
    )
    for row in rows:
        print(
            f"{row['context']:>8} {row['method']:<16} {row['tokens_per_s']:>8.2f} "
            f"{row['speed_vs_full']:>7.2f}x {row['bytes_per_token']:>10.0f} "
            f"{row['bytes_vs_fp16_full']:>7.3f}x"
        )
    return 0
