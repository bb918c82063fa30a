"""Evaluate with the model split over ranks: `a2ats eval --hosts FILE ...`, or
`mlx.launch ... -m a2ats_engine.distributed.evaluate --model SOURCE --codebook FILE`.

Every rank runs `bench.evaluate.evaluate` on its own layers, with `Ranks` in place of one
process: the prefill's cache slots of its peers' layers are `RemoteCache`s, each method's layer
records (recall, output error, attended and retrieved counts, bytes read, per decode step) are
joined over the ranks after every method, and byte counts are summed over them. So every rank
computes the figures one process computes (recall and output error are averaged over all
layers, perplexity comes from the shared logits) and takes the same decisions (the window
method's budget is A2ATS's retrieved count). Rank 0 prints them (`--json`: one JSON object).
Methods: full, kv8, kv4, a2ats, window, oracle_topk (the ablations need codebooks trained on
the fly, and a2ats_alloc a development pass: not across ranks yet).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import asdict
from typing import Any

from ..bench.evaluate import OneProcess
from ..validation import parse_budget

METHODS = ("full", "kv8", "kv4", "a2ats", "window", "oracle_topk")
DEFAULT_METHODS = "full,a2ats,window,oracle_topk"


class Ranks(OneProcess):
    """`evaluate`'s view of a pipeline split (see the module docstring). Every call is a
    collective: all ranks make it, in the same order (they run the same evaluation)."""

    def __init__(self, stage: Any) -> None:
        self.stage = stage

    def caches(self, caches: list) -> list:
        from .pipeline import pipeline_caches

        return pipeline_caches(caches, self.stage)

    def feed(self, model: Any, tokens: Any, caches: list) -> None:
        """One prefill chunk, its output evaluated: the hidden state a rank sends on is part of
        the output, not of its caches' state, and a peer waits for it."""
        import mlx.core as mx

        mx.eval(model(mx.array([list(tokens)]), cache=caches))

    def records(self, per_slot: list) -> list:
        from .group import gather_json

        mine = {str(i): asdict(r) for i, r in enumerate(per_slot) if r is not None}
        joined: dict[int, dict] = {}
        for part in gather_json(mine, self.stage.group):
            joined.update({int(k): v for k, v in part.items()})
        return [_record(joined[i]) if i in joined else None for i in range(len(per_slot))]

    def total(self, value: float) -> float:
        from .group import gather_json

        return float(sum(gather_json(float(value), self.stage.group)))


def _record(data: dict) -> Any:
    from ..bench.accounting import StepCost
    from ..bench.eval_results import StepRecord

    return StepRecord(**{**data, "cost": [StepCost(**c) for c in data["cost"]]})


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default="demo", metavar="SOURCE", help="model source (default demo)")
    p.add_argument("--codebook", required=True, metavar="FILE", help="codebook (on every host)")
    p.add_argument(
        "--texts", help="built-in texts: code, prose, dialogue (default code, unless --text)"
    )
    p.add_argument("--text", action="append", metavar="FILE", help="text file; repeatable")
    p.add_argument("--context", type=int, default=4096, help="prefill tokens (default 4096)")
    p.add_argument("--decode", type=int, default=64, help="teacher-forced tokens (default 64)")
    p.add_argument(
        "--budget", type=parse_budget, default=0.03, help="A2ATS budget: fraction or token count"
    )
    p.add_argument("--methods", default=DEFAULT_METHODS, help=f"of {', '.join(METHODS)}")
    p.add_argument("--split", metavar="N,N,...", help="layers per rank, rank 0 first")
    p.add_argument("--peer-timeout", type=float, default=300.0, help="seconds (default 300)")
    p.add_argument("--json", action="store_true", help="rank 0 prints one JSON object")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m a2ats_engine.distributed.evaluate",
        description="a2ats eval with the model split over the ranks of mlx.launch.",
    )
    add_arguments(p)
    from .chat import rank_main

    return rank_main(p, argv, run)


def run(args: argparse.Namespace) -> int:
    """Collective: every rank runs it with the same arguments."""
    from .chat import run_ranks

    return run_ranks(args.peer_timeout, lambda group, dog: _run(args, group, dog))


def _texts(args: argparse.Namespace) -> list[tuple[str, str]]:
    """[(name, text)]: the built-in texts named by --texts, then the --text files."""
    from pathlib import Path

    from ..bench.eval_texts import builtin_texts

    known = builtin_texts()
    out = []
    names = args.texts or ("" if args.text else "code")  # as `a2ats eval`
    for name in [n.strip() for n in names.split(",") if n.strip()]:
        if name not in known:
            raise ValueError(f"--texts: unknown {name!r}; valid: {', '.join(known)}")
        out.append((name, known[name][0]))
    for path in args.text or []:
        out.append((Path(path).name, Path(path).read_text(encoding="utf-8")))
    if not out:
        raise ValueError("no text: give --texts or --text")
    return out


def _run(args: argparse.Namespace, group: Any, dog: Any) -> int:
    import warnings

    from ..bench.evaluate import evaluate
    from ..cache.config import A2ATSConfig
    from .chat import _split
    from .codebook import load_rank_codebook
    from .group import gather_json
    from .load import load_stage

    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    unknown = [m for m in methods if m not in METHODS]
    if unknown:
        raise ValueError(f"--methods: {', '.join(unknown)} not across ranks; valid: {METHODS}")
    texts = _texts(args)
    rank0 = group.rank() == 0
    model, tokenizer, info, stage = load_stage(args.model, group, split=_split(args.split))
    dog.arm(True)
    described = gather_json(stage.describe(), group)
    book = load_rank_codebook(args.codebook, stage.owns)
    far = book.metadata.get("far_offset")
    config = A2ATSConfig(budget=args.budget, exact_below=0, far_offset=int(far or 2048))
    warnings.filterwarnings("ignore", module="a2ats_engine")
    results = []
    for name, text in texts:
        runs = evaluate(
            model, tokenizer.encode(text), context=args.context, decode=args.decode,
            budgets=[args.budget], codebooks={"a2ats": book}, config=config, methods=methods,
            progress=lambda *_: dog.beat(), ranks=Ranks(stage),
        )  # fmt: skip
        results.append({"text": name, "runs": [r.to_dict() for r in runs]})
    if not rank0:
        return 0
    for line in described:
        print(f"distributed: {line}", file=sys.stderr)
    out = {
        "model": info.name,
        "ranks": group.size(),
        "codebook": os.path.basename(args.codebook),
        "context": args.context,
        "decode": args.decode,
        "budget": args.budget,
        "results": results,
    }
    if args.json:
        print(json.dumps(out))
        return 0
    for r in results:
        for run in r["runs"]:
            for method, m in run["methods"].items():
                print(
                    f"{r['text']:<10} {method:<12} recall {m['recall']:.4f}  output error "
                    f"{m['output_rel_error']:.4f}  ppl {m['ppl']:.3f}  bytes/token "
                    f"{m['bytes_per_token']:.0f}"
                )
    return 0


if __name__ == "__main__":
    sys.exit(main())
