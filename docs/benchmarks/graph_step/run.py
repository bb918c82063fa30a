# ruff: noqa: I001  (a2ats_engine before mlx: it preloads OpenBLAS)
"""The retrieval step inside MLX's graph against the synced step: what the per-layer sync costs.

The synced retrieval step (`cache/host_step.py`, `native_step.forced("native")` or a cache's
`synced_step`) evaluates each layer's query, codes and rows (one `mx.eval` a layer) and then
runs the C++ step (`cache/native_step.cpp`) on them. The graph step (`cache/graph_step.py`,
`graph_step.cpp`, built by `make venv`) is the same C++ step as an MLX primitive: the layer's
step is a node of the model's graph, run on MLX's CPU stream, and a decode step has one
evaluation, as with KVCache. The demo model decodes greedily from one prefill per context with
three cache lists taking turns, 8 steps at a time, as `bench/speed.py` decodes:

- `kvcache`: mlx-lm's KVCache (the baseline);
- `sync`: A2ATS, retrieval forced (exact below 0), the synced step;
- `graph`: the same caches' settings, the graph step.

The missed-attention estimate is off (its layers kept the sync when `graph_step_engine.json`
was recorded; they run in the graph since). Per round the median step
time of each list; per context the median over the rounds of each ratio to KVCache's time, its
spread, and whether `sync` and `graph` decoded the same tokens. The runs recorded before the
graph step was the engine's (`graph_step.json`, `_rerun`, `_third`) built a prototype of the
primitive here (commit 65e97c5); the same harness now times the engine's.

    .venv/bin/python docs/benchmarks/graph_step/run.py 1024,8192 > docs/benchmarks/graph_step.json
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from dataclasses import replace

import a2ats_engine  # noqa: F401
import mlx.core as mx

from a2ats_engine.bench import speed
from a2ats_engine.bench.plan_caches import feed_prompt
from a2ats_engine.cache import graph_step
from a2ats_engine.cache.a2ats_cache import A2ATSCache
from a2ats_engine.commands._bench_common import a2ats_config, machine
from a2ats_engine.commands.bench.common import load_codebook
from a2ats_engine.loading.models import load_model
from mlx_lm.models.cache import make_prompt_cache

ROUNDS, CHUNK, UNTIMED = 6, 8, 12


def counted() -> dict:
    """Count the graph step's calls (`graph_step.run`)."""
    run = graph_step.run
    calls = {"graph": 0}

    def counting(*args):
        calls["graph"] += 1
        return run(*args)

    graph_step.run = counting
    return calls


def decode(state: tuple, name: str, steps: int) -> list[float]:
    """`steps` greedy decode steps of cache list `name` (as `bench/speed.py` decodes) -> the
    seconds of each."""
    model, lists, last, tokens = state
    times = []
    for _ in range(steps):
        began = time.perf_counter()
        last[name] = speed._greedy_step(model, lists[name], last[name])
        mx.async_eval(last[name])
        tokens[name].append(last[name].item())
        times.append(time.perf_counter() - began)
    return times


def main() -> None:
    contexts = [int(c) for c in (sys.argv[1] if len(sys.argv) > 1 else "1024").split(",")]
    if not graph_step.on():
        sys.exit(f"the graph step does not run here: {graph_step.built()[1]}")
    calls = counted()
    model, tokenizer, info = load_model("demo")
    codebook, _ = load_codebook(None, "demo", info.path)
    config = replace(a2ats_config(codebook, model, budget=None, rerank=None), estimate_missed=False)
    results = []
    for n in contexts:
        ids = speed.filler_tokens(tokenizer, n + UNTIMED + ROUNDS * CHUNK + 8)
        base = make_prompt_cache(model)
        for s in range(0, n, 256):
            feed_prompt(model, ids[s : min(s + 256, n)], base)
        lists = {
            "kvcache": speed._method_cache(model, base, "full", config, codebook),
            "sync": speed._method_cache(model, base, "a2ats_eb0", config, codebook),
            "graph": speed._method_cache(model, base, "a2ats_eb0", config, codebook),
        }
        for c in lists["sync"]:
            if isinstance(c, A2ATSCache):
                c.synced_step = True
        last = {name: mx.array([ids[n]]) for name in lists}
        tokens: dict[str, list[int]] = {name: [] for name in lists}
        per_round: dict[str, list[float]] = {name: [] for name in lists}

        state = (model, lists, last, tokens)
        for name in lists:
            decode(state, name, UNTIMED)
        before = calls["graph"]
        for _ in range(ROUNDS):
            for name in lists:
                per_round[name].append(statistics.median(decode(state, name, CHUNK)) * 1e3)
        ratios = {
            name: [t / k for t, k in zip(per_round[name], per_round["kvcache"], strict=True)]
            for name in ("sync", "graph")
        }
        results.append({
            "context": n,
            "step_ms": {name: round(statistics.median(v), 2) for name, v in per_round.items()},
            "time_vs_kvcache": {name: round(statistics.median(r), 3) for name, r in ratios.items()},
            "spread": {name: [round(min(r), 3), round(max(r), 3)] for name, r in ratios.items()},
            "graph_steps_per_layer_step": (calls["graph"] - before) / (ROUNDS * CHUNK),
            "same_tokens": tokens["sync"] == tokens["graph"],
            "tokens_compared": len(tokens["sync"]),
        })  # fmt: skip
    print(json.dumps({
        "command": "python docs/benchmarks/graph_step/run.py " + ",".join(map(str, contexts)),
        "machine": machine(),
        "model": info.name,
        "rounds": ROUNDS, "steps_per_round": CHUNK, "untimed_steps": UNTIMED,
        "estimate": False,
        "results": results,
    }, indent=1))  # fmt: skip


if __name__ == "__main__":
    main()
