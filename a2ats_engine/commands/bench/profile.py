"""`a2ats bench decode --profile`: per-phase time of an A2ATS decode step (bench/profile.py)."""

from __future__ import annotations

import argparse
from typing import Any

from .. import _limits
from .._bench_common import a2ats_config, print_json
from .common import bench_run, load_codebook


def profiled_method(methods: str | None) -> tuple[str, dict[str, Any]]:
    """(name, A2ATSConfig knobs) of the one A2ATS method `--methods` names for `--profile`
    (default a2ats; `full` may be listed: its KVCache step is always timed beside it);
    ValueError naming the flag for anything else, so no setting is dropped unseen."""
    from ...bench.methods import decode_variant_knobs

    names = [
        m.strip() for m in (methods or "a2ats").split(",") if m.strip() and m.strip() != "full"
    ]
    if len(names) != 1 or decode_variant_knobs(names[0]) is None:
        raise ValueError(
            f"--methods={methods!r}: --profile times one A2ATS method (a2ats or a variant such "
            "as a2ats_rr4 or a2ats_estm) beside KVCache; name exactly one"
        )
    return names[0], decode_variant_knobs(names[0])


def run_profile(args: argparse.Namespace) -> int:
    """The profile of `--model` at `--contexts` over `--steps` steps, with the settings of the
    one A2ATS method `--methods` names and `--budget` / `--rerank`."""
    from ...bench.profile import profile_decode, threads
    from ...cache.config import describe_retrieval
    from ...loading.models import load_model

    contexts = _limits.contexts("--contexts", args.contexts, 64)
    steps = _limits.count("--steps", args.steps, 2, 1024)
    method, knobs = profiled_method(args.methods)
    budget = _limits.budget(args.budget)
    if args.rerank is not None and "rerank" in knobs and knobs["rerank"] != args.rerank:
        raise ValueError(f"--rerank={args.rerank} disagrees with --methods {method}")
    knobs = {"budget": budget, "rerank": args.rerank, **knobs}
    _limits.config_check("--methods", **knobs)
    model, tokenizer, info = load_model(args.model)
    _limits.check_model_context("--contexts", [c + steps for c in contexts], info.context_length)
    codebook, codebook_desc = load_codebook(args.codebook, args.model, info.path)
    config = a2ats_config(codebook, model, **knobs)
    subspaces = 1 if codebook is None else codebook.num_subspaces
    retrieval = describe_retrieval(config, subspaces)  # the estimate named only where it runs
    rows = profile_decode(model, tokenizer, contexts, steps=steps, config=config, codebook=codebook)
    out = {
        "model": info.name,
        "codebook": str(codebook_desc),
        "steps": steps,
        "method": method,
        "budget": config.budget,
        "retrieval": retrieval,
        **bench_run("decode", args),
        "threads": threads(),
        "results": rows,
    }
    if print_json(args, out):
        return 0
    print(f"{info.name}; {out['machine']}; threads {out['threads']}")
    print(f"{method}, budget {config.budget}, retrieval forced: {retrieval}")
    for r in rows:
        print(
            f"context {r['context']}: KVCache step {r['kvcache_step_ms']:.1f} ms, A2ATS step "
            f"{r['a2ats_step_ms']:.1f} ms ({r['a2ats_vs_kvcache']:.2f}x KVCache's speed), "
            f"exact attention {r['exact_attention_ms_per_layer']:.2f} ms per layer"
        )
        for phase, ms in r["phases_ms_per_layer"].items():
            print(
                f"  {phase:<16} {ms:8.3f} ms per layer ({r['phase_layers'][phase]:>3} layers) "
                f"{r['phases_ms_per_step'][phase]:8.2f} ms/step"
            )
    return 0
