"""`a2ats bench cold`: process memory and decode speed of KVCache, A2ATS and A2ATS's cold tier."""

from __future__ import annotations

import argparse

from .._bench_common import a2ats_config, print_json, silence_random_codebook_warning
from .._flags import add_json_flag, add_model_flags
from .common import bench_run, load_codebook

MAX_COLD_CONTEXT = 1 << 18  # 262,144 tokens: each method runs in a process of its own

COLD_HELP = "measured process memory and decode speed: KVCache vs A2ATS vs A2ATS cold tier"
COLD_DESCRIPTION = (
    "Each method and context runs in a process of its own on a real model's geometry "
    "(random float32 weights, caches filled synthetically): anonymous resident memory "
    "(RssAnon / phys_footprint) after the fill and its sampled peak, the resident-set "
    "high-water mark, MLX's peak, the cache's bytes in memory and on disk beside an fp16 "
    "KVCache's, decode tokens/s and the greedy tokens. --data-limit runs every method "
    "under a private-memory cap (RLIMIT_DATA; file maps are not counted) and reports "
    "which ones fail."
)


def register(bench: argparse._SubParsersAction) -> None:
    _register_reopen(bench)
    p = bench.add_parser("cold", help=COLD_HELP, description=COLD_DESCRIPTION)
    p.add_argument("--geometry", default="qwen3-0.6b", help="model geometry (default: qwen3-0.6b)")
    p.add_argument("--contexts", default="16384,32768", help="comma-separated contexts")
    p.add_argument("--methods", default="full,a2ats,a2ats_cold", help="full, a2ats, a2ats_cold")
    p.add_argument("--steps", type=int, default=8, help="decode steps per run (default: 8)")
    p.add_argument("--repeats", type=int, default=1, help="runs per method and context")
    p.add_argument(
        "--data-limit", type=float, default=None, help="private-memory cap per run, in GiB"
    )
    p.add_argument(
        "--candidate-bits",
        type=int,
        choices=(2, 4, 8),
        default=None,
        help="cold tier: the rerank reads its candidates' keys from a resident copy of every "
        "key at this many bits instead of the file (measures the alternative; default: file)",
    )
    p.add_argument(
        "--page-cache",
        choices=("warm", "cold"),
        default="warm",
        help="with --speed, cold: also time steps with the cold tier's file pages dropped from "
        "the page cache before each (Linux), so its rows come from the disk",
    )
    p.add_argument(
        "--speed",
        action="store_true",
        help="instead: decode speed of the cold tier vs in-memory A2ATS in one process, "
        "interleaved, --repeats times (the median ratio and every run's)",
    )
    add_json_flag(p, run)


def _check(args: argparse.Namespace) -> tuple[list[int], list[str]]:
    """Every flag range-checked before any work (`_limits.py`)."""
    from ...bench.cold_tier import METHODS
    from ...bench.geometries import GEOMETRIES
    from .. import _limits

    _limits.names("--geometry", args.geometry, GEOMETRIES.__contains__, GEOMETRIES)
    contexts = _limits.int_list("--contexts", args.contexts, 64, MAX_COLD_CONTEXT)
    methods = _limits.names("--methods", args.methods, METHODS.__contains__, METHODS)
    _limits.count("--steps", args.steps, 3, 1024)
    _limits.count("--repeats", args.repeats, 1, 20)
    if args.data_limit is not None:
        _limits.number("--data-limit", args.data_limit, 0.1, 4096)
    if args.page_cache == "cold" and not args.speed:
        raise ValueError("--page-cache cold needs --speed (it times decode steps)")
    return contexts, methods


def run(args: argparse.Namespace) -> int:
    contexts, methods = _check(args)
    from ...bench.cold_tier import measure
    from ...cache.config import A2ATSConfig

    limit = None if args.data_limit is None else int(args.data_limit * 2**30)
    config = A2ATSConfig()
    if args.speed:
        rows = [
            measure(
                args.geometry,
                n,
                "speed",
                args.steps,
                config,
                limit,
                repeats=args.repeats,
                candidate_bits=args.candidate_bits,
                page_cache=args.page_cache,
            )
            for n in contexts
        ]
        out = {"geometry": args.geometry, **bench_run("cold", args), "config": config.to_dict(),
               "speed": rows}  # fmt: skip
        if not print_json(args, out):
            print("\n".join(str(r) for r in rows))
        return 0
    runs = []
    for context in contexts:
        for _ in range(args.repeats):
            for method in methods:
                r = measure(
                    args.geometry,
                    context,
                    method,
                    args.steps,
                    config,
                    limit,
                    candidate_bits=args.candidate_bits,
                )
                runs.append(r)
                if not args.json:
                    _print_run(r)
    out = {
        "geometry": args.geometry,
        "steps": args.steps,
        "data_limit_bytes": limit,
        "candidate_bits": args.candidate_bits,
        "config": config.to_dict(),
        **bench_run("cold", args),
        "runs": runs,
    }
    print_json(args, out)
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


REOPEN_HELP = "reopening a long chat from its saved cache vs prefilling it again"
REOPEN_DESCRIPTION = (
    "Per context: a chat of that many tokens is answered, its caches saved, then a new "
    "session answers a follow-up after restoring them and after prefilling the whole "
    "conversation (the first tokens must agree). Prints save/restore seconds, file bytes "
    "and both times to first token."
)


def _register_reopen(bench: argparse._SubParsersAction) -> None:
    p = bench.add_parser("reopen", help=REOPEN_HELP, description=REOPEN_DESCRIPTION)
    add_model_flags(p, contexts="2048,4096")
    p.add_argument("--cold", action="store_true", help="every K/V row in the cold tier")
    add_json_flag(p, run_reopen)


def run_reopen(args: argparse.Namespace) -> int:
    from ...bench.reopen import bench_reopen
    from ...loading.models import load_model
    from .. import _limits

    contexts = _limits.int_list("--contexts", args.contexts, 16, _limits.MAX_CONTEXT)
    silence_random_codebook_warning()
    model, tokenizer, info = load_model(args.model)
    limit = getattr(getattr(model, "args", None), "max_position_embeddings", None)
    _limits.check_model_context("--contexts", [c + 64 for c in contexts], limit)
    codebook, _ = load_codebook(args.codebook, args.model, info.path)
    config = a2ats_config(codebook, model)
    rows = bench_reopen(model, tokenizer, contexts, config, codebook, cold=args.cold)
    out = {
        "model": info.name,
        "cold": args.cold,
        **bench_run("reopen", args),
        "results": rows,
    }
    if print_json(args, out):
        return 0
    for r in rows:
        print(
            f"{r['context']:>7} tokens: reopen {r['reopen_total_s']:.2f} s (restore "
            f"{r['restore_s']:.2f} s, file {r['file_bytes'] / 2**20:.1f} MiB) vs prefill again "
            f"{r['reprefill_ttft_s']:.2f} s: {r['speedup']}x"
        )
    return 0
