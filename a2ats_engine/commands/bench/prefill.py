"""`a2ats bench prefill`: time to first token of A2ATS (in memory or cold) vs KVCache."""

from __future__ import annotations

import argparse
from pathlib import Path

from .. import _limits as limits
from .._bench_common import a2ats_config, print_json, silence_random_codebook_warning
from .._flags import add_json_flag, add_model_flags
from .common import bench_run, check_repeats, load_codebook

HELP = "time to first token of A2ATS vs mlx-lm's KVCache (prefill codes every key)"
DESCRIPTION = (
    "Prefill a prompt of each context length the way the app does (2048-token chunks, "
    "every cache state evaluated) with mlx-lm's caches and with A2ATS, alternating the "
    "order each round, and read the first token back. Prints the median seconds and the "
    "median per-round ratio a2ats / full with its spread."
)


def register(bench: argparse._SubParsersAction) -> None:
    p = bench.add_parser("prefill", help=HELP, description=DESCRIPTION)
    add_model_flags(p, contexts="1024,4096,8192", contexts_help="comma-separated prompt lengths")
    p.add_argument("--repeats", type=int, default=3, help="rounds per context (median)")
    p.add_argument("--kv-bits", type=int, choices=(8, 4), default=None, help="A2ATS K/V storage")
    p.add_argument(
        "--methods",
        default="full,a2ats",
        help="full plus any of a2ats, a2ats_cold (every K/V row in the cold tier; default: "
        "full,a2ats)",
    )
    add_json_flag(p, run_prefill)


def run_prefill(args: argparse.Namespace) -> int:
    from ...bench.speed import PREFILL_METHODS, bench_prefill
    from ...loading.models import load_model

    contexts = limits.contexts("--contexts", args.contexts, lo=2)
    check_repeats(args.repeats)
    methods = tuple(
        limits.names("--methods", args.methods, PREFILL_METHODS.__contains__, PREFILL_METHODS)
    )
    if "full" not in methods:
        raise ValueError(f"--methods={args.methods!r}: full plus any of a2ats, a2ats_cold")
    silence_random_codebook_warning()
    model, tokenizer, info = load_model(args.model)
    limits.check_model_context("--contexts", contexts, info.context_length)
    codebook, codebook_desc = load_codebook(args.codebook, args.model, info.path)
    config = a2ats_config(codebook, model, kv_bits=args.kv_bits)
    rows = bench_prefill(
        model, tokenizer, contexts, config=config, codebook=codebook,
        repeats=check_repeats(args.repeats), methods=methods,
    )  # fmt: skip
    meta = {
        "model": info.name,
        "codebook": Path(codebook_desc).name,
        "kv_bits": config.kv_bits,
        "repeats": args.repeats,
        **bench_run("prefill", args),
    }
    if print_json(args, {**meta, "results": rows}):
        return 0
    print(f"model {info.name}, codebook {meta['codebook']}, kv_bits {config.kv_bits}")
    print(f"{'context':>8} {'method':<10} {'TTFT s':>8} {'vs full':>8}")
    for row in rows:
        ratio = f"{row['ratio_median']:.2f}x" if "ratio_median" in row else "1.00x"
        print(f"{row['context']:>8} {row['method']:<10} {row['seconds']:>8.3f} {ratio:>8}")
    return 0
