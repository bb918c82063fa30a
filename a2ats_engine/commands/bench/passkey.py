"""`a2ats bench passkey`: passkey retrieval accuracy per method, context and depth."""

from __future__ import annotations

import argparse

from .. import _limits as limits
from .._bench_common import machine, parse_list, print_json, stderr_progress
from .._flags import (
    CODEBOOK_REQUIRED,
    RERANK_CONFIG_HELP,
    add_depths_flag,
    add_json_flag,
    add_model_flags,
    add_retrieval_flags,
)
from .common import METHODS_HELP, retrieval_run

HELP = "passkey retrieval accuracy per method at several contexts and depths"
DESCRIPTION = (
    "Hide a 5-digit passkey at several depths in filler text, ask for it at the end and "
    "answer greedily with each method's cache (the last prompt token and every answer "
    "token go through the method's decode attention). Accuracy per method and context."
)


def register(bench: argparse._SubParsersAction) -> None:
    p = bench.add_parser("passkey", help=HELP, description=DESCRIPTION)
    add_model_flags(p, CODEBOOK_REQUIRED, "1024,2048,4096,8192")
    add_depths_flag(p, "0.1,0.3,0.5,0.7,0.9")
    p.add_argument("--methods", default="full,window,a2ats", help=METHODS_HELP)
    add_retrieval_flags(p, RERANK_CONFIG_HELP)
    p.add_argument("--answer-tokens", type=int, default=8, help="greedy answer length")
    p.add_argument("--seed", type=int, default=0, help="passkey random seed")
    add_json_flag(p, run_passkey)


def run_passkey(args: argparse.Namespace) -> int:
    from ...bench.passkey import PASSKEY_METHODS, accuracy_table, bench_passkey

    known = PASSKEY_METHODS
    methods = limits.names("--methods", args.methods, known.__contains__, known)
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
    if print_json(args, out):
        return 0
    contexts = sorted({t.context for t in trials})
    print(f"model {info.name}; codebook {desc}; budget {config.budget}")
    print(f"{'method':<14}" + "".join(f"{c:>8}" for c in contexts))
    for method, row in table.items():
        print(f"{method:<14}" + "".join(f"{row[str(c)]:>8.2f}" for c in contexts))
    return 0
