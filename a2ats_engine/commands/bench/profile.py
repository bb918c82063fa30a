"""`a2ats bench decode --profile`: per-phase time of an A2ATS decode step (bench/profile.py)."""

from __future__ import annotations

import argparse

from .. import _limits
from .._bench_common import a2ats_config, print_json
from .common import bench_run, load_codebook


def run_profile(args: argparse.Namespace) -> int:
    """The profile of `--model` at `--contexts` over `--steps` steps (flags already checked)."""
    from ...bench.profile import profile_decode, threads
    from ...loading.models import load_model

    contexts = _limits.contexts("--contexts", args.contexts, 64)
    steps = _limits.count("--steps", args.steps, 2, 1024)
    model, tokenizer, info = load_model(args.model)
    _limits.check_model_context("--contexts", [c + steps for c in contexts], info.context_length)
    codebook, codebook_desc = load_codebook(args.codebook, args.model, info.path)
    config = a2ats_config(codebook, model)
    rows = profile_decode(model, tokenizer, contexts, steps=steps, config=config, codebook=codebook)
    out = {
        "model": info.name,
        "codebook": str(codebook_desc),
        "steps": steps,
        **bench_run("decode", args),
        "threads": threads(),
        "results": rows,
    }
    if print_json(args, out):
        return 0
    print(f"{info.name}; {out['machine']}; threads {out['threads']}")
    for r in rows:
        print(
            f"context {r['context']}: KVCache step {r['kvcache_step_ms']:.1f} ms, A2ATS step "
            f"{r['a2ats_step_ms']:.1f} ms ({r['a2ats_vs_kvcache']:.2f}x KVCache's speed), "
            f"exact attention {r['exact_attention_ms_per_layer']:.2f} ms per layer"
        )
        for phase, ms in r["phases_ms_per_layer"].items():
            print(
                f"  {phase:<16} {ms:8.3f} ms per layer  {r['phases_ms_per_step'][phase]:8.2f} ms/step"
            )
    return 0
