"""What several `a2ats bench` subcommands share: repeats, the codebook, the retrieval run, what a
result records of its run. The flags they share are in `../_flags.py`."""

from __future__ import annotations

import argparse

from .. import _limits as limits
from .._bench_common import a2ats_config, command_line, find_codebook, machine


def check_repeats(repeats: int) -> int:
    return limits.count("--repeats", repeats, 1, limits.MAX_REPEATS)


def load_codebook(path: str | None, model_source: str, model_path: str | None = None):
    """(Codebook or None, description: its path or "random (no codebook found)")."""
    return find_codebook(path, model_source, model_path, required=False)


def retrieval_run(args: argparse.Namespace):
    """(model, tokenizer, info, codebook, codebook description, config) for a benchmark that
    measures retrieval itself: `exact_below=0`, so no step attends exactly below the crossover,
    and the estimate off unless a method names it (not left to this machine's measurement)."""
    from ...loading.models import load_model

    contexts = limits.contexts("--contexts", args.contexts)
    limits.fractions("--depths", args.depths)
    budget = limits.budget(args.budget)
    limits.config_check("--rerank", rerank=args.rerank)
    model, tokenizer, info = load_model(args.model)
    limits.check_model_context("--contexts", contexts, info.context_length)
    codebook, desc = find_codebook(args.codebook, args.model, info.path, required=True)
    config = a2ats_config(
        codebook, model, budget=budget, rerank=args.rerank, exact_below=0, estimate_missed=False
    )
    return model, tokenizer, info, codebook, desc, config


METHODS_HELP = (
    "comma list of `a2ats eval` methods that need only the run's codebook (all but "
    "a2ats_plain_vq, a2ats_random, a2ats_no_wrope and a2ats_alloc)"
)


def is_eval_method(name: str) -> bool:
    from ...bench.methods import METHODS

    return name in METHODS


def eval_method_names() -> list[str]:
    from ...bench.methods import METHODS

    return list(METHODS)


def bench_run(name: str, args: argparse.Namespace) -> dict[str, str]:
    """What a `bench NAME` result records of its run: the machine, and the command line as
    given (`a2ats bench NAME` and its flags, from `args.argv`, which `cli.main` sets, quoted so
    it runs again; `a2ats bench NAME` alone when a caller built `args` itself)."""
    return {"machine": machine(), "command": command_line(args, "bench", name)}
