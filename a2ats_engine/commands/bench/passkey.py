"""`a2ats bench passkey`: passkey retrieval accuracy per method, context and depth."""

from __future__ import annotations

import argparse
import json

from .. import _limits as limits
from .common import eval_method_names, is_eval_method, retrieval_run


def register(bench) -> None:
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


def run_passkey(args: argparse.Namespace) -> int:
    from ...bench.passkey import accuracy_table, bench_passkey
    from .._bench_common import (
        machine,
        parse_list,
        stderr_progress,
    )

    methods = limits.names("--methods", args.methods, is_eval_method, eval_method_names())
    limits.count("--answer-tokens", args.answer_tokens, 1, 1024)
    limits.count("--seed", args.seed, 0, limits.MAX_SEED)
    model, tokenizer, info, codebook, desc, config = retrieval_run(args)
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
