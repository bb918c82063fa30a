"""`a2ats bench ...`: benchmarks that compare methods as ratios within one run."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from . import _limits as limits
from . import bench_cold, bench_profile

DECODE_METHOD_NAMES = (
    "full, kv8, kv4, window, a2ats, a2ats_kv8, a2ats_kv4, a2ats_telemetry, a2ats_noest, "
    "a2ats_est, a2ats_rr<N>[g], a2ats_cov<NN>, a2ats_eb<N> (suffixes combine in that order: "
    "a2ats_kv4_rr2_eb0)"
)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("bench", help="benchmarks (decode speed, memory, ...)")
    bench = p.add_subparsers(dest="bench", metavar="BENCH")
    bench.required = True
    d = bench.add_parser(
        "decode",
        help="decode tokens/s and cache bytes of A2ATS vs mlx-lm's KVCache at several contexts",
        description=(
            "Prefill each context once, then decode the same tokens through every method from an "
            "identical state. Prints tokens/s, bytes held per token and ratios to `full` "
            "(mlx-lm KVCache)."
        ),
    )
    d.add_argument("--model", default="demo", help="model source (default: demo)")
    d.add_argument("--codebook", help="codebook file (default: the model's default, else random)")
    d.add_argument("--contexts", default="1024,4096,8192", help="comma-separated context lengths")
    d.add_argument("--steps", type=int, default=32, help="decode steps timed per method")
    d.add_argument("--budget", default="0.03", help="retrieval budget: fraction or token count")
    d.add_argument(
        "--methods",
        default="full,a2ats,a2ats_kv4",
        help="comma list of: full, kv8, kv4, window (exact attention over sinks + the last "
        "window + K tokens: A2ATS's attended count with nothing scored, the speed ceiling), "
        "a2ats, a2ats_kv8, a2ats_kv4, a2ats_telemetry; "
        "a2ats_rr<N> = a2ats with rerank N, a2ats_eb<N> = exact_below N (a2ats_eb0: retrieval "
        "from the start, the crossover probe; combines: a2ats_kv4_rr2_eb0)",
    )
    d.add_argument(
        "--rerank", type=int, default=None, help="A2ATS rerank factor (default: the config's)"
    )
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
    d.add_argument("--json", action="store_true", help="print one JSON object")
    d.set_defaults(func=run_decode)
    _register_memory(bench)
    bench_cold.register(bench)
    _register_prefill(bench)
    _register_passkey(bench)
    _register_tasks(bench)
    _register_seed_synthetic(bench)
    _register_codebooks(bench)


def _check_repeats(repeats: int) -> int:
    return limits.count("--repeats", repeats, 1, limits.MAX_REPEATS)


def _is_decode_method(name: str) -> bool:
    from ..bench.methods import decode_variant_knobs

    return name in ("full", "kv8", "kv4", "window") or decode_variant_knobs(name) is not None


def check_decode_args(args: argparse.Namespace) -> tuple[list[int], float | int, list[str]]:
    """(contexts, budget, methods) of `bench decode`, every flag range-checked before any
    model is loaded (ValueError naming the flag)."""
    contexts = limits.contexts("--contexts", args.contexts)
    limits.count("--steps", args.steps)
    _check_repeats(args.repeats)
    limits.count("--calibration-tokens", args.calibration_tokens, 0, limits.MAX_CALIBRATION_TOKENS)
    budget = limits.budget(args.budget)
    limits.config_check("--rerank", rerank=args.rerank)
    methods = limits.names("--methods", args.methods, _is_decode_method, [DECODE_METHOD_NAMES])
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


def _load_codebook(path: str | None, model_source: str, model_path: str | None = None):
    """(Codebook or None, description: its path or "random (no codebook found)")."""
    from ._bench_common import find_codebook

    return find_codebook(path, model_source, model_path, required=False)


def run_geometry_decode(args: argparse.Namespace) -> int:
    """`a2ats bench decode --geometry NAME`: real-size shapes, random weights, synthetic caches."""
    from ..bench.geometries import (
        GEOMETRIES,
        bench_geometry_decode,
        calibration_throughput,
        geometry_model,
        parameter_count,
    )
    from ..cache.config import A2ATSConfig
    from ..cache.geometry import model_geometry
    from ..cache.layer_plan import plan_for
    from ._bench_common import machine

    contexts, budget, _ = check_decode_args(args)
    if args.geometry not in GEOMETRIES:
        known = ", ".join(GEOMETRIES)
        raise ValueError(f"--geometry={args.geometry!r} is unknown: choose one of {known}")
    model = geometry_model(args.geometry)
    limits.check_model_context("--contexts", contexts, model_geometry(model).max_context)
    knobs = {"budget": budget}
    if args.rerank is not None:
        knobs["rerank"] = args.rerank
    from ..cache.model_cache import RANDOM_CENTROIDS

    config = A2ATSConfig(**knobs)
    runs = [
        bench_geometry_decode(model, contexts, steps=args.steps, config=config, seed=i)
        for i in range(_check_repeats(args.repeats))
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
            }
        )
    calib = None
    if args.calibration_tokens:
        calib = calibration_throughput(model, config, args.calibration_tokens)
    meta = {
        "geometry": args.geometry,
        "description": GEOMETRIES[args.geometry][0],
        "parameters": parameter_count(model),
        "layer_plan": plan_for(model).summary(),
        "codebook": f"random ({RANDOM_CENTROIDS} centroids): timing only",
        "budget": config.budget,
        "steps": args.steps,
        "repeats": args.repeats,
        "calibration": calib,
        "machine": machine(),
        "command": "a2ats bench decode " + " ".join(sys.argv[3:]),
    }
    if args.json:
        print(json.dumps({**meta, "results": rows}))
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
        return bench_profile.run_profile(args)
    if args.geometry:
        return run_geometry_decode(args)
    from ..bench.speed import bench_decode, fp16_bytes_per_token
    from ..loading.models import load_model
    from ._bench_common import a2ats_config, machine

    contexts, budget, methods = check_decode_args(args)
    model, tokenizer, info = load_model(args.model)
    limits.check_model_context("--contexts", contexts, info.context_length)
    codebook, codebook_desc = _load_codebook(args.codebook, args.model, info.path)
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
        for _ in range(_check_repeats(args.repeats))
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
    meta = {
        "model": info.name,
        "codebook": codebook_desc,
        "n_centroids": codebook.n_centroids if codebook else None,
        "budget": config.budget,
        "rerank": config.rerank,
        "steps": args.steps,
        "repeats": args.repeats,
        "fp16_bytes_per_token": fp16,
        "machine": machine(),
        "command": "a2ats bench decode " + " ".join(sys.argv[3:]),
    }
    if args.json:
        print(json.dumps({**meta, "results": rows}))
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


# -- memory -------------------------------------------------------------------------------------


def _register_prefill(bench) -> None:
    p = bench.add_parser(
        "prefill",
        help="time to first token of A2ATS vs mlx-lm's KVCache (prefill codes every key)",
        description=(
            "Prefill a prompt of each context length the way the app does (2048-token chunks, "
            "every cache state evaluated) with mlx-lm's caches and with A2ATS, alternating the "
            "order each round, and read the first token back. Prints the median seconds and the "
            "median per-round ratio a2ats / full with its spread."
        ),
    )
    p.add_argument("--model", default="demo", help="model source (default: demo)")
    p.add_argument("--codebook", help="codebook file (default: the model's default, else random)")
    p.add_argument("--contexts", default="1024,4096,8192", help="comma-separated prompt lengths")
    p.add_argument("--repeats", type=int, default=3, help="rounds per context (median)")
    p.add_argument("--kv-bits", type=int, choices=(8, 4), default=None, help="A2ATS K/V storage")
    p.add_argument(
        "--methods",
        default="full,a2ats",
        help="full plus any of a2ats, a2ats_cold (every K/V row in the cold tier; default: "
        "full,a2ats)",
    )
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=run_prefill)


def run_prefill(args: argparse.Namespace) -> int:
    from ..bench.speed import PREFILL_METHODS, bench_prefill
    from ..loading.models import load_model
    from ._bench_common import a2ats_config, machine, silence_random_codebook_warning

    contexts = limits.contexts("--contexts", args.contexts, lo=2)
    _check_repeats(args.repeats)
    methods = tuple(
        limits.names("--methods", args.methods, PREFILL_METHODS.__contains__, PREFILL_METHODS)
    )
    if "full" not in methods:
        raise ValueError(f"--methods={args.methods!r}: full plus any of a2ats, a2ats_cold")
    silence_random_codebook_warning()
    model, tokenizer, info = load_model(args.model)
    limits.check_model_context("--contexts", contexts, info.context_length)
    codebook, codebook_desc = _load_codebook(args.codebook, args.model, info.path)
    config = a2ats_config(codebook, model, kv_bits=args.kv_bits)
    rows = bench_prefill(
        model, tokenizer, contexts, config=config, codebook=codebook,
        repeats=_check_repeats(args.repeats), methods=methods,
    )  # fmt: skip
    meta = {
        "model": info.name,
        "codebook": Path(codebook_desc).name,
        "kv_bits": config.kv_bits,
        "repeats": args.repeats,
        "machine": machine(),
        "command": "a2ats bench prefill " + " ".join(sys.argv[3:]),
    }
    if args.json:
        print(json.dumps({**meta, "results": rows}))
        return 0
    print(f"model {info.name}, codebook {meta['codebook']}, kv_bits {config.kv_bits}")
    print(f"{'context':>8} {'method':<10} {'TTFT s':>8} {'vs full':>8}")
    for row in rows:
        ratio = f"{row['ratio_median']:.2f}x" if "ratio_median" in row else "1.00x"
        print(f"{row['context']:>8} {row['method']:<10} {row['seconds']:>8.3f} {ratio:>8}")
    return 0


def _register_memory(bench) -> None:
    m = bench.add_parser(
        "memory",
        help="cache bytes per token vs context for each method (ratios to full and fp16)",
        description=(
            "Fill each method's caches with `context` tokens of random keys/values of the model's "
            "geometry and K/V dtype (what a cache holds does not depend on the values) and report "
            "the bytes held per token, with ratios to `full` (mlx-lm KVCache) and to an fp16 "
            "full cache. A2ATS's fixed costs (the codebook, once per model and shared by all its "
            "chats, and each layer's rotation matrices) are counted in bytes_held, and the "
            "context from which each A2ATS storage holds less than an fp16 cache and mlx-lm's "
            "kv8/kv4 caches is solved from bytes/token and those fixed bytes."
        ),
    )
    m.add_argument("--model", default="demo", help="model source (default: demo)")
    m.add_argument("--codebook", help="codebook file (default: the model's default, else random)")
    m.add_argument("--contexts", default="1024,4096,8192,16384", help="comma-separated contexts")
    m.add_argument(
        "--methods",
        default="full,kv8,kv4,a2ats,a2ats_kv8,a2ats_kv4",
        help="comma list of: full, kv8, kv4, a2ats, a2ats_kv8, a2ats_kv4",
    )
    m.add_argument("--json", action="store_true", help="print one JSON object")
    m.set_defaults(func=run_memory)


def run_memory(args: argparse.Namespace) -> int:
    from ..bench.speed import MEMORY_METHODS, bench_memory, fp16_bytes_per_token, kv_dtype
    from ..loading.models import load_model
    from ._bench_common import a2ats_config, machine, silence_random_codebook_warning

    contexts = limits.contexts("--contexts", args.contexts)
    methods = tuple(
        limits.names("--methods", args.methods, MEMORY_METHODS.__contains__, MEMORY_METHODS)
    )
    silence_random_codebook_warning()
    model, _, info = load_model(args.model)
    limits.check_cache_memory("--contexts", contexts, fp16_bytes_per_token(model))
    codebook, codebook_desc = _load_codebook(args.codebook, args.model, info.path)
    config = a2ats_config(codebook, model)
    results = bench_memory(model, contexts, methods=methods, config=config, codebook=codebook)
    fp16 = fp16_bytes_per_token(model)
    rows = []
    for r in results:
        full = next((x for x in results if x.context == r.context and x.method == "full"), None)
        rows.append(
            {
                "method": r.method,
                "context": r.context,
                "bytes_held": r.bytes_held,
                "bytes_per_token": round(r.bytes_per_token, 1),
                "fixed_bytes": r.fixed_bytes,
                "codebook_bytes": r.codebook_bytes,
                "held_vs_fp16_full": round(r.bytes_held / (fp16 * r.context), 4),
                "vs_full": round(r.bytes_per_token / full.bytes_per_token, 4) if full else None,
                "vs_fp16_full": round(r.bytes_per_token / fp16, 4),
            }
        )
    out = {
        "model": info.name,
        "kv_dtype": str(kv_dtype(model)).rsplit(".", 1)[-1],
        "fp16_bytes_per_token": fp16,
        "codebook": codebook_desc,
        "codebook_bytes": max((r.codebook_bytes for r in results), default=0) or None,
        "machine": machine(),
        "results": rows,
        "break_even": break_even_rows(results, fp16),
    }
    if args.json:
        print(json.dumps(out))
        return 0
    print(f"model {info.name}; K/V dtype {out['kv_dtype']}; fp16 full = {fp16} B/token")
    if out["codebook_bytes"]:
        print(
            f"codebook held once per model, shared by all its chats: "
            f"{out['codebook_bytes'] / 2**20:.2f} MiB (counted in bytes held, not per token)"
        )
    print(
        f"{'context':>8} {'method':<10} {'B/token':>10} {'vs full':>8} {'vs fp16':>8} "
        f"{'fixed MiB':>9} {'held MiB':>9} {'held/fp16':>9}"
    )
    for row in rows:
        vs_full = "" if row["vs_full"] is None else f"{row['vs_full']:.3f}x"
        print(
            f"{row['context']:>8} {row['method']:<10} {row['bytes_per_token']:>10.0f} "
            f"{vs_full:>8} {row['vs_fp16_full']:>7.3f}x {row['fixed_bytes'] / 2**20:>9.2f} "
            f"{row['bytes_held'] / 2**20:>9.2f} {row['held_vs_fp16_full']:>8.3f}x"
        )
    if out["break_even"]:
        print("context from which A2ATS holds less (codebook and rotations counted):")
        for b in out["break_even"]:
            at = "never" if b["context"] is None else f"{b['context']:,} tokens"
            print(f"  {b['method']:<10} vs {b['baseline']:<5} {at}")
    return 0


def break_even_rows(results: list, fp16_per_token: int) -> list[dict]:
    """Per A2ATS method (float, kv8, kv4 storage): the context from which it holds less than an
    fp16 full cache and than mlx-lm's kv8 / kv4 caches (those measured), solved from its
    bytes/token and fixed bytes at the largest context (`break_even_context`)."""
    from ..bench.speed import break_even_context

    last = max((r.context for r in results), default=0)
    at_last = {r.method: r for r in results if r.context == last}
    baselines = {"fp16": float(fp16_per_token)}
    baselines.update({m: at_last[m].bytes_per_token for m in ("kv8", "kv4") if m in at_last})
    rows = []
    for method, r in at_last.items():
        if not method.startswith("a2ats"):
            continue
        for name, per_token in baselines.items():
            n = break_even_context(r.bytes_per_token, r.fixed_bytes, per_token)
            rows.append({"method": method, "baseline": name, "context": n})
    return rows


# -- passkey ------------------------------------------------------------------------------------


def _register_passkey(bench) -> None:
    p = bench.add_parser(
        "passkey",
        help="passkey retrieval accuracy per method at several contexts and depths",
        description=(
            "Hide a 5-digit passkey at several depths in filler text, ask for it at the end and "
            "answer greedily with each method's cache (the last prompt token and every answer "
            "token go through the method's decode attention). Accuracy per method and context."
        ),
    )
    p.add_argument("--model", default="demo", help="model source (default: demo)")
    p.add_argument("--codebook", help="codebook file (default: the model's default codebook)")
    p.add_argument("--contexts", default="1024,2048,4096,8192", help="comma-separated contexts")
    p.add_argument("--depths", default="0.1,0.3,0.5,0.7,0.9", help="needle depths in [0, 1]")
    p.add_argument("--methods", default="full,window,a2ats", help="full, window, a2ats, ...")
    p.add_argument("--budget", default="0.03", help="retrieval budget: fraction or token count")
    p.add_argument(
        "--rerank", type=int, default=None, help="A2ATS rerank factor (default: the config's)"
    )
    p.add_argument("--answer-tokens", type=int, default=8, help="greedy answer length")
    p.add_argument("--seed", type=int, default=0, help="passkey random seed")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=run_passkey)


def _retrieval_run(args: argparse.Namespace):
    """(model, tokenizer, info, codebook, codebook description, config) for a benchmark that
    measures retrieval itself: `exact_below=0`, so no step attends exactly below the crossover."""
    from ..loading.models import load_model
    from ._bench_common import a2ats_config, find_codebook

    contexts = limits.contexts("--contexts", args.contexts)
    limits.fractions("--depths", args.depths)
    budget = limits.budget(args.budget)
    limits.config_check("--rerank", rerank=args.rerank)
    model, tokenizer, info = load_model(args.model)
    limits.check_model_context("--contexts", contexts, info.context_length)
    codebook, desc = find_codebook(args.codebook, args.model, info.path, required=True)
    config = a2ats_config(codebook, model, budget=budget, rerank=args.rerank, exact_below=0)
    return model, tokenizer, info, codebook, desc, config


def _is_eval_method(name: str) -> bool:
    from ..bench.methods import METHODS

    return name in METHODS


def _eval_method_names() -> list[str]:
    from ..bench.methods import METHODS

    return list(METHODS)


def run_passkey(args: argparse.Namespace) -> int:
    from ..bench.passkey import accuracy_table, bench_passkey
    from ._bench_common import (
        machine,
        parse_list,
        stderr_progress,
    )

    methods = limits.names("--methods", args.methods, _is_eval_method, _eval_method_names())
    limits.count("--answer-tokens", args.answer_tokens, 1, 1024)
    limits.count("--seed", args.seed, 0, limits.MAX_SEED)
    model, tokenizer, info, codebook, desc, config = _retrieval_run(args)
    trials = bench_passkey(
        model, tokenizer, parse_list(args.contexts), parse_list(args.depths, float),
        codebook=codebook, config=config, methods=tuple(methods),
        answer_tokens=args.answer_tokens, seed=args.seed,
        progress=stderr_progress(True),
    )  # fmt: skip
    table = accuracy_table(trials)
    out = {
        "model": info.name,
        "codebook": desc,
        "budget": config.budget,
        "rerank": config.rerank,
        "machine": machine(),
        "accuracy": table,
        "trials": [t.to_dict() for t in trials],
    }
    if args.json:
        print(json.dumps(out))
        return 0
    contexts = sorted({t.context for t in trials})
    print(f"model {info.name}; codebook {desc}; budget {config.budget}")
    print(f"{'method':<14}" + "".join(f"{c:>8}" for c in contexts))
    for method, row in table.items():
        print(f"{method:<14}" + "".join(f"{row[str(c)]:>8.2f}" for c in contexts))
    return 0


# -- tasks --------------------------------------------------------------------------------------


def _register_tasks(bench) -> None:
    t = bench.add_parser(
        "tasks",
        help="RULER-style long-context tasks (needles, multi-hop, aggregation) per method",
        description=(
            "Generate needle-in-a-haystack (number, word, UUID, multi-key, multi-value), "
            "variable-tracking and common-word tasks offline at each context, depth and seed; "
            "answer greedily with each method from one exact prefill (the last prompt token and "
            "every answer token go through the method's decode attention). Score: share of the "
            "reference answers found, in [0, 1], per task, context and method, and relative to "
            "`full` on the same prompts."
        ),
    )
    t.add_argument("--model", default="demo", help="model source (default: demo)")
    t.add_argument("--codebook", help="codebook file (default: the model's default codebook)")
    t.add_argument("--contexts", default="4096", help="comma-separated contexts (default 4096)")
    t.add_argument("--methods", default="full,a2ats,window,oracle_topk", help="comma list")
    t.add_argument("--tasks", default=None, help="comma list of tasks (default: all)")
    t.add_argument("--depths", default="0.1,0.5,0.9", help="needle depths in [0, 1]")
    t.add_argument("--seeds", type=int, default=1, help="prompts per task, context and depth")
    t.add_argument("--haystack", help="filler text file (default: built-in public-domain prose)")
    t.add_argument("--budget", default="0.03", help="retrieval budget: fraction or token count")
    t.add_argument("--rerank", type=int, default=None, help="A2ATS rerank factor")
    t.add_argument("--trials", action="store_true", help="also list every answer in the JSON")
    t.add_argument("--json", action="store_true", help="print one JSON object")
    t.set_defaults(func=run_tasks)


def run_tasks(args: argparse.Namespace) -> int:
    from ..bench import tasks as tk
    from ._bench_common import (
        machine,
        parse_list,
        stderr_progress,
    )

    names = tuple(x for x in (args.tasks or ",".join(tk.TASKS)).split(",") if x)
    unknown = [x for x in names if x not in tk.TASKS]
    if unknown:
        raise ValueError(f"--tasks {unknown} unknown: must be among {', '.join(tk.TASKS)}")
    methods = tuple(limits.names("--methods", args.methods, _is_eval_method, _eval_method_names()))
    limits.count("--seeds", args.seeds, 1, limits.MAX_REPEATS)
    if args.haystack:
        haystack, haystack_desc = Path(args.haystack).read_text(encoding="utf-8"), args.haystack
    else:
        haystack, haystack_desc = tk.default_haystack()
    model, tokenizer, info, codebook, desc, config = _retrieval_run(args)
    prompts = tk.task_prompts(
        tokenizer, names, parse_list(args.contexts), parse_list(args.depths, float), args.seeds,
        haystack,
    )  # fmt: skip
    trials = tk.bench_tasks(
        model, tokenizer, prompts, codebook=codebook, config=config, methods=methods,
        progress=stderr_progress(True),
    )  # fmt: skip
    out = {
        "model": info.name,
        "codebook": Path(desc).name,  # the file name only: paths are machine-specific
        "budget": config.budget,
        "rerank": config.rerank,
        "haystack": haystack_desc if args.haystack is None else Path(args.haystack).name,
        "depths": parse_list(args.depths, float),
        "seeds": args.seeds,
        "machine": machine(),
        "command": _tasks_command(args),
        "results": tk.summarize(trials),
        "relative_to_full": tk.relative_to_full(trials),
    }
    if args.trials:
        out["trials"] = [vars(t) for t in trials]
    if args.json:
        print(json.dumps(out))
        return 0
    print(f"model {info.name}; codebook {desc}; budget {config.budget}; haystack {haystack_desc}")
    print(f"{'task':<18} {'context':>7} " + "".join(f"{m:>13}" for m in methods))
    scores = {(r["task"], r["context"], r["method"]): r["score"] for r in out["results"]}
    for task in names:
        for context in parse_list(args.contexts):
            cells = "".join(f"{scores[(task, context, m)]:>13.2f}" for m in methods)
            print(f"{task:<18} {context:>7} {cells}")
    return 0


def _tasks_command(args: argparse.Namespace) -> str:
    """The command line that reproduces a tasks run (file arguments by name only)."""
    parts = ["a2ats bench tasks", f"--contexts {args.contexts}", f"--methods {args.methods}"]
    if args.tasks:
        parts.append(f"--tasks {args.tasks}")
    parts += [f"--depths {args.depths}", f"--seeds {args.seeds}", f"--budget {args.budget}"]
    if args.rerank is not None:
        parts.append(f"--rerank {args.rerank}")
    for flag, value in (("--haystack", args.haystack), ("--codebook", args.codebook)):
        if value:
            parts.append(f"{flag} {Path(value).name}")
    if args.model != "demo":
        parts.append("--model MODEL")
    if args.trials:
        parts.append("--trials")
    return " ".join(parts + ["--json"])


# -- seed synthetic -----------------------------------------------------------------------------


def _register_seed_synthetic(bench) -> None:
    s = bench.add_parser(
        "seed-synthetic",
        help="the seed document's offline benchmark (windowed RoPE, query-aware VQ), deterministic",
        description=(
            "Synthetic sequences of 200 and 400 tokens, geometries local_recency and "
            "long_range_dependent: windowed vs always-exact RoPE score error and query-aware vs "
            "plain VQ (key MSE, score MSE, top-K attention recall). No model needed."
        ),
    )
    s.add_argument("--sequences", default="200,400", help="comma-separated sequence lengths")
    s.add_argument("--centroids", type=int, default=64, help="codebook size (default 64)")
    s.add_argument("--seed", type=int, default=0, help="random seed")
    s.add_argument("--json", action="store_true", help="print one JSON object")
    s.set_defaults(func=run_seed_synthetic)


def run_seed_synthetic(args: argparse.Namespace) -> int:
    from ..bench.seed_synthetic import SyntheticSettings, run

    sequences = limits.int_list("--sequences", args.sequences, 2, 1 << 16)
    limits.count("--centroids", args.centroids, 2, 1 << 16)
    limits.count("--seed", args.seed, 0, limits.MAX_SEED)
    settings = SyntheticSettings(n_centroids=args.centroids, seed=args.seed)
    out = run(settings, sequences=tuple(sequences))
    if args.json:
        print(json.dumps(out))
        return 0
    claims = out["seed_claims"]["windowed_vs_exact_rope_mse_ratio"]
    print(
        "seed claims: windowed/exact RoPE MSE ratio "
        + ", ".join(f"{g} {v}x" for g, v in claims.items())
        + "; query-aware key MSE above plain VQ in every row"
    )
    head = (
        f"{'spectrum':<14} {'seq':>4} {'geometry':<21} {'key w/e':>8} {'score w/e':>9} "
        f"{'QA/plain key':>12} {'QA score':>9} {'plain score':>11} {'QA recall':>9} "
        f"{'plain recall':>12}"
    )
    print(head)
    for row in out["rows"]:
        rope, vq = row["rope"], row["vq"]
        print(
            f"{row['spectrum']:<14} {row['sequence']:>4} {row['geometry']:<21} "
            f"{rope['seed_key_windowed_over_exact']:>7.2f}x {rope['windowed_over_exact']:>8.2f}x "
            f"{vq['query_aware_key_mse_over_plain']['ratio']:>11.2f}x "
            f"{vq['query_aware']['score_mse_far']:>9.3f} {vq['plain']['score_mse_far']:>11.3f} "
            f"{vq['query_aware']['recall_top_k']:>9.3f} {vq['plain']['recall_top_k']:>12.3f}"
        )
    return 0


# -- codebooks ----------------------------------------------------------------------------------


def _register_codebooks(bench) -> None:
    from ..calibration.defaults import DEMO_TOKENS

    c = bench.add_parser(
        "codebooks",
        help="codebook size and calibration tokens vs recall, ppl and calibration time",
        description=(
            "Calibrate one codebook per (centroids, calibration tokens) pair with the demo "
            "default's recipe (built-in corpus, default config, keys per head as calibrate "
            "chooses them; only the size and the tokens differ), then teacher-force the same "
            "text through `full` and `a2ats` with each codebook. The calibration forward pass is "
            "shared: every distinct chunk of the corpus runs once and serves every size and every "
            "shorter token count, each codebook fit on exactly the data a calibration of its own "
            "would collect; calib_seconds = collect_seconds (corpus, tokenization and the "
            "forward time of that token count's chunks, as a calibration of its own would spend "
            "them) + fit_seconds (k-means and the held-out score error). One exact prefill and "
            "one `full` decode per text serve every codebook. Rows: recall, output_rel_error, "
            "ppl_vs_full with its 95% block-bootstrap interval (ppl_ci), codebook_bytes held."
        ),
    )
    c.add_argument("--model", default="demo", help="model source (default: demo)")
    c.add_argument(
        "--centroids",
        default="256,512,1024,2048,4096",
        help="comma list of codebook sizes, each in [2, 65536] (default 256,512,1024,2048,4096)",
    )
    c.add_argument(
        "--calib-tokens",
        default=str(DEMO_TOKENS),
        help=f"comma list of calibration token counts, each >= 2 (default {DEMO_TOKENS}, the "
        "demo default's)",
    )
    c.add_argument(
        "--texts",
        default="code",
        help="comma list of built-in evaluation texts: code (http/client.py, default), prose "
        "(about 3K tokens), dialogue (about 5.7K tokens); figures pooled over them",
    )
    c.add_argument("--context", type=int, default=4096, help="prefill tokens (default 4096)")
    c.add_argument("--decode", type=int, default=64, help="teacher-forced tokens (default 64)")
    c.add_argument("--budget", default="0.03", help="retrieval budget: fraction or token count")
    c.add_argument("--seed", type=int, default=0, help="calibration seed (default 0, the demo's)")
    c.add_argument("--save-dir", help="save every codebook here (codebook-c{N}-t{T}.safetensors)")
    c.add_argument("--json", action="store_true", help="print one JSON object")
    c.set_defaults(func=run_codebooks)


def _int_list(flag: str, text: str) -> list[int]:
    """'256,512' -> [256, 512]; ValueError naming the flag for an empty list or a non-integer."""
    items = [x.strip() for x in text.split(",") if x.strip()]
    if not items:
        raise ValueError(f"{flag} is empty: give a comma list such as 256,512")
    out = []
    for x in items:
        try:
            out.append(int(x))
        except ValueError:
            raise ValueError(f"{flag} {x!r} is not an integer (comma list of integers)") from None
    return out


def _check_codebook_args(args: argparse.Namespace) -> tuple[list[int], list[int], list]:
    """(centroids, calibration token counts, [(text, description)]) or a one-line ValueError
    naming the flag (checked before the model loads: calibration is long)."""
    from ..bench.eval_texts import builtin_texts

    centroids = _int_list("--centroids", args.centroids)
    tokens = _int_list("--calib-tokens", args.calib_tokens)
    for flag, values, lo, hi in (("--centroids", centroids, 2, 65536),
                                 ("--calib-tokens", tokens, 2, None)):  # fmt: skip
        for v in values:
            if v < lo or (hi is not None and v > hi):
                allowed = f"in [{lo}, {hi}]" if hi is not None else f">= {lo}"
                raise ValueError(f"{flag} {v} is out of range: must be {allowed}")
        repeated = sorted({v for v in values if values.count(v) > 1})
        if repeated:
            raise ValueError(f"{flag} lists {', '.join(map(str, repeated))} more than once")
    limits.count("--context", args.context, 1, limits.MAX_CONTEXT)
    limits.count("--decode", args.decode)
    limits.budget(args.budget)
    limits.count("--seed", args.seed, 0, limits.MAX_SEED)
    for v in tokens:
        limits.count("--calib-tokens", v, 2, limits.MAX_CALIBRATION_TOKENS)
    known = builtin_texts()
    names = [n.strip() for n in args.texts.split(",") if n.strip()]
    if not names:
        raise ValueError(f"--texts is empty: choose from {', '.join(known)}")
    for name in names:
        if name not in known:
            raise ValueError(f"--texts {name!r} is unknown: must be among {', '.join(known)}")
    if len(set(names)) < len(names):
        raise ValueError("--texts lists a text more than once")
    return centroids, tokens, [known[n] for n in names]


def run_codebooks(args: argparse.Namespace) -> int:
    from ..bench.codebook_sweep import sweep_codebooks
    from ..bench.eval_results import rests_on
    from ..cache.config import A2ATSConfig
    from ..loading.models import load_model
    from ._bench_common import machine, stderr_progress

    centroids, tokens, texts = _check_codebook_args(args)
    config = A2ATSConfig(budget=limits.parse_budget(args.budget))
    model, tokenizer, info = load_model(args.model)
    limits.check_model_context("--context", [args.context + args.decode], info.context_length)
    ids = [tokenizer.encode(text) for text, _ in texts]
    run = sweep_codebooks(
        model, tokenizer, ids, centroids=centroids, calib_tokens=tokens, context=args.context,
        decode=args.decode, config=config, seed=args.seed, model_name=info.name,
        save_dir=args.save_dir, progress=stderr_progress(True),
    )  # fmt: skip
    out = {
        "model": info.name,
        "corpus": run.corpus,
        "texts": [desc for _, desc in texts],
        "context": args.context,
        "decode": args.decode,
        "budget": config.budget,
        "rerank": config.rerank,
        "seed": args.seed,
        "rests_on": rests_on(args.decode * len(texts), len(texts)),
        "calibration_shared": run.shared(),
        "notes": [
            "calib_seconds = collect_seconds + fit_seconds: what a calibration of that pair "
            "alone costs; the forward pass ran once for all pairs (calibration_shared: its "
            "real seconds and tokens)",
            "a2ats evaluated with exact_below 0 (every decode step retrieves), against one "
            "shared exact prefill and full decode per text",
            "codebook_bytes: centroids, Cholesky factors and assignment matrices held in memory",
        ],
        "machine": machine(),
        "command": _codebooks_command(args),
        "results": [r.to_dict() for r in run.rows],
    }
    if args.json:
        print(json.dumps(out))
        return 0
    print(f"model {info.name}; texts {', '.join(out['texts'])}; context {args.context}, "
          f"decode {args.decode}, budget {config.budget}")  # fmt: skip
    shared = out["calibration_shared"]
    print(f"shared calibration pass: {shared['forward_tokens']} tokens forward in "
          f"{shared['forward_seconds']:.1f} s, corpus {shared['corpus_seconds']:.1f} s")  # fmt: skip
    print(f"{'centroids':>9} {'tokens':>7} {'calib s':>8} {'collect':>8} {'fit':>7} {'MiB':>7} "
          f"{'recall':>7} {'out err':>7} {'ppl/full (95% CI)':>24}")  # fmt: skip
    for r in out["results"]:
        low, high = r["ppl_ci"]
        print(f"{r['centroids']:>9} {r['calib_tokens']:>7} {r['calib_seconds']:>8.1f} "
              f"{r['collect_seconds']:>8.1f} {r['fit_seconds']:>7.1f} "
              f"{r['codebook_bytes'] / 2**20:>7.2f} {r['recall']:>7.4f} "
              f"{r['output_rel_error']:>7.4f} "
              f"{r['ppl_vs_full']:>9.4f} ({low:.4f}-{high:.4f})")  # fmt: skip
    return 0


def _codebooks_command(args: argparse.Namespace) -> str:
    """The command line that reproduces a codebook sweep (the model by name only when not
    the demo; --save-dir left out: it changes no figure)."""
    parts = ["a2ats bench codebooks"]
    if args.model != "demo":
        parts.append("--model MODEL")
    parts += [f"--centroids {args.centroids}", f"--calib-tokens {args.calib_tokens}",
              f"--texts {args.texts}", f"--context {args.context}", f"--decode {args.decode}",
              f"--budget {args.budget}"]  # fmt: skip
    if args.seed:
        parts.append(f"--seed {args.seed}")
    return " ".join(parts + ["--json"])
