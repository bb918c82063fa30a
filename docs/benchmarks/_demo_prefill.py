# ruff: noqa: I001  (a2ats_engine before mlx: it preloads OpenBLAS)
"""The demo model prefilled from filler text into mlx-lm's KVCache, with its default codebook and
an A2ATS config that retrieves from the first step: the shared start of the decode-step scripts
here (`step_overhead.py`, `host_step_cold.py`, `host_step_ab.py`), and the interleaved timing
and record of the two that compare host steps."""

from __future__ import annotations

import os
import statistics
import sys
from collections.abc import Callable

import a2ats_engine  # noqa: F401  (BLAS preload before mlx.core)
import mlx.core as mx
from mlx_lm.models.cache import KVCache

from a2ats_engine.bench.speed import _decode_chunk, filler_tokens
from a2ats_engine.cache import host_step
from a2ats_engine.commands._bench_common import a2ats_config, find_codebook, machine
from a2ats_engine.loading.models import load_model


def demo_prefilled(context: int, chunk: int = 512):
    """(model, info, codebook, codebook description, config, token ids, prefilled KVCaches)."""
    model, tokenizer, info = load_model("demo")
    codebook, desc = find_codebook(None, "demo", info.path, required=True)
    config = a2ats_config(codebook, model, exact_below=0)
    ids = filler_tokens(tokenizer, context)
    base = [KVCache() for _ in model.layers]
    for i in range(0, context, chunk):
        model(mx.array(ids[i : i + chunk])[None], cache=base)
        mx.eval([c.state for c in base])
    return model, info, codebook, desc, config, ids, base


def take_turns(
    model,
    caches: dict,
    first_token: int,
    rounds: int,
    chunk: int,
    step_of: Callable[[str], Callable],
    rotate: bool = False,
) -> dict[str, list]:
    """Each variant of `caches` decodes `chunk` greedy steps in turn, `rounds` times, with
    `host_step.step` replaced by `step_of(variant)` for its turn (the shipped one after);
    `rotate`: each round starts from the next variant. -> {variant: ms a step per round},
    the first round (warm-up) not counted."""  # fmt: skip
    shipped = host_step.step
    names = list(caches)
    last = {v: mx.array([first_token]) for v in names}
    ms: dict[str, list] = {v: [] for v in names}
    for round_ in range(rounds):
        shift = round_ % len(names) if rotate else 0
        for v in names[shift:] + names[:shift]:
            host_step.step = step_of(v)
            try:
                seconds, last[v] = _decode_chunk(model, caches[v], last[v], chunk)
            finally:
                host_step.step = shipped
            if round_:
                ms[v].append(seconds / chunk * 1e3)
    return ms


def turns_record(script: str, info, desc: str, context: int, ms: dict, chunk: int) -> dict:
    """The fields a record of `take_turns` starts with: model, machine, command, load, and each
    variant's median and per-round ms a step."""
    return {
        "model": info.name,
        "codebook": desc,
        "context": context,
        "machine": machine(),
        "command": f"python docs/benchmarks/{script} " + " ".join(sys.argv[1:]),
        "load_average_at_end": [round(x, 2) for x in os.getloadavg()],
        "steps_per_round": chunk,
        "rounds_counted": len(next(iter(ms.values()))),
        "ms_per_step": {v: round(statistics.median(x), 2) for v, x in ms.items()},
        "ms_per_step_runs": {v: [round(y, 1) for y in x] for v, x in ms.items()},
    }
