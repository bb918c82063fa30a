"""`a2ats bench cold`: process memory and decode speed of KVCache, A2ATS and A2ATS's cold tier."""

from __future__ import annotations

import argparse
import json


def register(bench) -> None:
    p = bench.add_parser(
        "cold",
        help="measured process memory and decode speed: KVCache vs A2ATS vs A2ATS cold tier",
        description=(
            "Each method and context runs in a process of its own on a real model's geometry "
            "(random float32 weights, caches filled synthetically): anonymous resident memory "
            "(RssAnon / phys_footprint) after the fill and its sampled peak, the resident-set "
            "high-water mark, MLX's peak, the cache's bytes in memory and on disk beside an fp16 "
            "KVCache's, decode tokens/s and the greedy tokens. --data-limit runs every method "
            "under a private-memory cap (RLIMIT_DATA; file maps are not counted) and reports "
            "which ones fail."
        ),
    )
    p.add_argument("--geometry", default="qwen3-0.6b", help="model geometry (default: qwen3-0.6b)")
    p.add_argument("--contexts", default="16384,32768", help="comma-separated contexts")
    p.add_argument("--methods", default="full,a2ats,a2ats_cold", help="full, a2ats, a2ats_cold")
    p.add_argument("--steps", type=int, default=8, help="decode steps per run (default: 8)")
    p.add_argument("--repeats", type=int, default=1, help="runs per method and context")
    p.add_argument(
        "--data-limit", type=float, default=None, help="private-memory cap per run, in GiB"
    )
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=run)


def _check(args: argparse.Namespace) -> tuple[list[int], list[str]]:
    from ..bench.cold_tier import METHODS
    from ..bench.geometries import GEOMETRIES

    if args.geometry not in GEOMETRIES:
        raise ValueError(f"--geometry={args.geometry!r} is unknown: one of {', '.join(GEOMETRIES)}")
    try:
        contexts = [int(c) for c in args.contexts.split(",") if c]
    except ValueError:
        raise ValueError(f"--contexts={args.contexts!r}: comma-separated integers") from None
    if not contexts or any(not 64 <= c <= 262144 for c in contexts):
        raise ValueError(f"--contexts={args.contexts!r}: each in [64, 262144]")
    methods = [m for m in args.methods.split(",") if m]
    unknown = [m for m in methods if m not in METHODS]
    if unknown or not methods:
        raise ValueError(f"--methods: unknown {unknown}; choose from {', '.join(METHODS)}")
    if not 3 <= args.steps <= 1024:
        raise ValueError(f"--steps={args.steps}: must be in [3, 1024]")
    if not 1 <= args.repeats <= 20:
        raise ValueError(f"--repeats={args.repeats}: must be in [1, 20]")
    if args.data_limit is not None and not 0.1 <= args.data_limit <= 4096:
        raise ValueError(f"--data-limit={args.data_limit}: GiB in [0.1, 4096]")
    return contexts, methods


def run(args: argparse.Namespace) -> int:
    contexts, methods = _check(args)
    from ..bench.cold_tier import measure
    from ..cache.config import A2ATSConfig
    from ._bench_common import machine

    limit = None if args.data_limit is None else int(args.data_limit * 2**30)
    config = A2ATSConfig()
    runs = []
    for context in contexts:
        for _ in range(args.repeats):
            for method in methods:
                r = measure(args.geometry, context, method, args.steps, config, limit)
                runs.append(r)
                if not args.json:
                    _print_run(r)
    out = {
        "geometry": args.geometry,
        "steps": args.steps,
        "data_limit_bytes": limit,
        "config": config.to_dict(),
        "machine": machine(),
        "runs": runs,
    }
    if args.json:
        print(json.dumps(out))
    return 0


def _print_run(r: dict) -> None:
    if "failed" in r:
        print(f"{r['context']:>7} {r['method']:<11} FAILED {r['failed']}")
        return
    mib = 2**20
    print(
        f"{r['context']:>7} {r['method']:<11} peak anon {r['anon_peak_sampled'] / mib:8.0f} MiB  "
        f"cache in memory {r['cache_resident_bytes'] / mib:8.1f} MiB  on disk "
        f"{r['cache_disk_bytes'] / mib:8.1f} MiB  fp16 KVCache {r['fp16_kvcache_bytes'] / mib:8.1f}"
        f" MiB  {r['tokens_per_s']:.2f} tok/s"
    )
