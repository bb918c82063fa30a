"""`a2ats bench tasks`: RULER-style tasks scored against full attention."""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path

from ...loading.fetched_models import is_named
from .. import _limits as limits
from .._bench_common import machine, parse_list, print_json, stderr_progress
from .._flags import (
    CODEBOOK_REQUIRED,
    add_depths_flag,
    add_json_flag,
    add_model_flags,
    add_retrieval_flags,
)
from .common import METHODS_HELP, retrieval_run

HELP = "RULER-style long-context tasks (needles, multi-hop, aggregation) per method"
DESCRIPTION = (
    "Generate needle-in-a-haystack (number, word, UUID, multi-key, multi-value), "
    "variable-tracking and common-word tasks offline at each context, depth and seed; "
    "answer greedily with each method from one exact prefill (the last prompt token and "
    "every answer token go through the method's decode attention). Score: share of the "
    "reference answers found, in [0, 1], per task, context and method, and relative to "
    "`full` on the same prompts."
)


def register(bench: argparse._SubParsersAction) -> None:
    t = bench.add_parser("tasks", help=HELP, description=DESCRIPTION)
    add_model_flags(t, CODEBOOK_REQUIRED, "4096", "comma-separated contexts (default 4096)")
    t.add_argument("--methods", default="full,a2ats,window,oracle_topk", help=METHODS_HELP)
    t.add_argument("--tasks", default=None, help="comma list of tasks (default: all)")
    add_depths_flag(t, "0.1,0.5,0.9")
    t.add_argument(
        "--seeds",
        type=int,
        default=1,
        help="prompts per task, context and depth (common words, which has no depth: "
        "seeds x depths lists)",
    )
    t.add_argument("--haystack", help="filler text file (default: built-in public-domain prose)")
    add_retrieval_flags(t)
    t.add_argument("--trials", action="store_true", help="also list every answer in the JSON")
    t.add_argument(
        "--journal",
        help="JSON-lines file of finished answers: appended as each prompt is scored; a prompt "
        "runs only the methods not already in it (resume a long run, or add a method to it)",
    )
    add_json_flag(t, run_tasks)


def run_tasks(args: argparse.Namespace) -> int:
    from ...bench import tasks as tk

    names = tuple(x for x in (args.tasks or ",".join(tk.TASKS)).split(",") if x)
    unknown = [x for x in names if x not in tk.TASKS]
    if unknown:
        raise ValueError(f"--tasks {unknown} unknown: must be among {', '.join(tk.TASKS)}")
    known = tk.TASK_METHODS
    methods = tuple(limits.names("--methods", args.methods, known.__contains__, known))
    limits.count("--seeds", args.seeds, 1, limits.MAX_REPEATS)
    if args.haystack:
        haystack, haystack_desc = Path(args.haystack).read_text(encoding="utf-8"), args.haystack
    else:
        haystack, haystack_desc = tk.default_haystack()
    recorded_haystack = haystack_desc if args.haystack is None else Path(args.haystack).name
    model, tokenizer, info, codebook, desc, config = retrieval_run(args)
    prompts = tk.task_prompts(
        tokenizer, names, parse_list(args.contexts), parse_list(args.depths, float), args.seeds,
        haystack,
    )  # fmt: skip
    trials = tk.bench_tasks(
        model, tokenizer, prompts, codebook=codebook, config=config, methods=methods,
        progress=stderr_progress(True), journal=Path(args.journal) if args.journal else None,
        setup=_journal_setup(info.name, codebook, desc, config, recorded_haystack),
    )  # fmt: skip
    out = {
        "model": info.name,
        "codebook": Path(desc).name,  # the file name only: paths are machine-specific
        "budget": config.budget,
        "rerank": config.rerank,
        "haystack": recorded_haystack,
        "depths": parse_list(args.depths, float),
        "seeds": args.seeds,
        "machine": machine(),
        "command": _tasks_command(args),
        "results": tk.summarize(trials),
        "relative_to_full": tk.relative_to_full(trials),
    }
    if args.trials:
        out["trials"] = [vars(t) for t in trials]
    if print_json(args, out):
        return 0
    print(f"model {info.name}; codebook {desc}; budget {config.budget}; haystack {haystack_desc}")
    print(f"{'task':<18} {'context':>7} " + "".join(f"{m:>13}" for m in methods))
    scores = {(r["task"], r["context"], r["method"]): r["score"] for r in out["results"]}
    for task in names:
        for context in parse_list(args.contexts):
            cells = "".join(f"{scores[(task, context, m)]:>13.2f}" for m in methods)
            print(f"{task:<18} {context:>7} {cells}")
    return 0


def _journal_setup(model: str, codebook, desc: str, config, haystack: str) -> dict:
    """What a journal's answers depend on besides the prompt: a journal written with anything
    else is refused (`bench.tasks.open_journal`). The codebook by name and recipe (its centroids,
    subspaces and calibration tokens), not its bytes: a default codebook rebuilt on another
    machine is the same book."""
    setup = {
        "model": model,
        "codebook": Path(desc).name,
        "codebook_recipe": [
            codebook.n_centroids, codebook.num_subspaces, codebook.sub_dim,
            str(codebook.metadata.get("tokens", "")),
        ],
        "config": dataclasses.asdict(config),
        "haystack": haystack,
    }  # fmt: skip
    return json.loads(json.dumps(setup))  # as it reads back from the file (lists, not tuples)


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
    if args.model != "demo":  # a model fetched by name as given; a folder or file by its name
        model = args.model if is_named(args.model) else Path(args.model).name
        parts.append(f"--model {model}")
    if args.trials:
        parts.append("--trials")
    return " ".join(parts + ["--json"])
