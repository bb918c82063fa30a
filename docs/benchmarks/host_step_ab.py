# ruff: noqa: I001  (a2ats_engine before mlx: it preloads OpenBLAS)
"""This tree's host retrieval step against a past commit's, interleaved in one decode.

A change to the host step's speed, measured on a shared machine whose separate runs drift more
than the change (docs/BENCHMARKS.md, "Hosts": KVCache's own speed moved 13.7-16.9 tok/s at 1K
over one day). Here both versions decode the demo model greedily from one prefilled state,
retrieval forced (exact_below 0), each with and without the missed-attention estimate (mean
slot scores), the four taking turns CHUNK steps at a time (`bench/speed.py`'s pipelined loop),
each round starting from the next variant (no variant always runs after the same one).
The past version is that commit's `cache/host_step.py` and `cache/slot_rows.py` (read with
`git show`, loaded beside this tree's); everything else is this tree's, so the commit's host
step must take the same call (`host_step.step(retrieval, cache, queries, lay, scale, sinks)`);
its turns also take the commit's `topk.top_indices`.

Reported: each variant's median ms a step and every round's, and the per-round medians of
"with the estimate / without" (speed) for each version, and "this tree / the commit" (speed).

    .venv/bin/python docs/benchmarks/host_step_ab.py COMMIT [context] > docs/benchmarks/X.json
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import time
import types

import a2ats_engine  # noqa: F401  (BLAS preload before mlx.core)

from a2ats_engine.bench.speed import _method_cache
from a2ats_engine.cache import host_step, topk
from _demo_prefill import demo_prefilled, take_turns, turns_record

CHUNK = 6
ROUNDS = 21  # the first round warms up and is not counted
PACKAGE = "a2ats_engine.cache"


def _module_at(commit: str, name: str, source_of=lambda s: s) -> types.ModuleType:
    """`a2ats_engine/cache/<name>.py` as it was at `commit`, loaded as `<name>_at_commit`."""
    path = f"a2ats_engine/cache/{name}.py"
    source = subprocess.run(
        ["git", "show", f"{commit}:{path}"], capture_output=True, text=True, check=True
    ).stdout
    module = types.ModuleType(f"{PACKAGE}.{name}_at_commit")
    module.__package__, module.__file__ = PACKAGE, f"{commit}:{path}"
    sys.modules[module.__name__] = module
    exec(compile(source_of(source), module.__file__, "exec"), module.__dict__)
    return module


def past_step(commit: str):
    """The host step (`host_step.step`) of `commit`, with that commit's SlotRows, and during its
    calls that commit's `topk.top_indices` (the caches' `NumpyTopK` is this tree's class, whose
    `top` calls the module's function: without the swap a change to the top-K would be timed
    in both versions)."""
    _module_at(commit, "slot_rows")
    old = _module_at(
        commit,
        "host_step",
        lambda s: s.replace("from .slot_rows import", "from .slot_rows_at_commit import"),
    )
    then_top = _module_at(commit, "topk").top_indices

    def step(*args):
        now_top, topk.top_indices = topk.top_indices, then_top
        try:
            return old.step(*args)
        finally:
            topk.top_indices = now_top

    return step


def main(commit: str, context: int) -> dict:
    model, info, codebook, desc, config, ids, base = demo_prefilled(context)
    shipped = host_step.step
    steps = {"now": shipped, "then": past_step(commit)}
    variants = {
        f"{version}_{est}": (version, f"a2ats_eb0_{est}")
        for version in steps
        for est in ("noest", "estm")
    }
    with topk.forced("numpy"):  # the host step is NumPy's top-K strategy's
        caches = {
            v: _method_cache(model, base, m, config, codebook) for v, (_, m) in variants.items()
        }
    ms = take_turns(
        model, caches, ids[-1], ROUNDS, CHUNK, lambda v: steps[variants[v][0]], rotate=True
    )

    def ratio(a: str, b: str) -> float:  # the speed of `a` over `b`: the rounds' median
        return round(statistics.median(y / x for x, y in zip(ms[a], ms[b], strict=True)), 3)

    return {
        **turns_record("host_step_ab.py", info, desc, context, ms, CHUNK),
        "commit": commit,
        "estimate_speed_ratio": {
            version: ratio(f"{version}_estm", f"{version}_noest") for version in steps
        },  # fmt: skip
        "now_vs_then_speed": {est: ratio(f"now_{est}", f"then_{est}") for est in ("noest", "estm")},
        "date": time.strftime("%Y-%m-%d"),
    }


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit("usage: host_step_ab.py COMMIT [context]")
    print(json.dumps(main(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 8192)))
