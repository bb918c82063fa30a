# ruff: noqa: I001  (a2ats_engine before mlx: it preloads OpenBLAS)
"""The retrieval step inside MLX's graph, a prototype: what the per-layer host sync costs.

The shipped retrieval step (`cache/host_step.py`) evaluates each layer's query, codes and rows
(one `mx.eval` a layer) and then runs the C++ step (`cache/native_step.cpp`) on them. Here the
same C++ step is an MLX primitive (`graph_step.cpp`, built first, against the MLX wheel of the
venv): the layer's step is a node of the model's graph, run on MLX's CPU stream, and a decode
step has one evaluation, as with KVCache. The demo model decodes greedily from one prefill per
context with three cache lists taking turns, 8 steps at a time, as `bench/speed.py` decodes:

- `kvcache`: mlx-lm's KVCache (the baseline);
- `sync`: A2ATS, retrieval forced (exact below 0), the shipped step with its sync;
- `graph`: the same caches' settings, each retrieval step the primitive instead.

The missed-attention estimate is off (its slot sums are moved in NumPy: it needs the sync), so
are sink logits (the demo has none). Per round the median step time of each list; per context
the median over the rounds of each ratio to KVCache's time, its spread, and whether `sync` and
`graph` decoded the same tokens.

    .venv/bin/pip install nanobind==3.1.0   # MLX 0.32's nanobind ABI
    .venv/bin/python docs/benchmarks/graph_step/run.py 1024,8192 > docs/benchmarks/graph_step.json
"""

from __future__ import annotations

import importlib.util
import json
import pathlib
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import replace

import a2ats_engine  # noqa: F401
import mlx
import mlx.core as mx

from a2ats_engine.bench import speed
from a2ats_engine.bench.plan_caches import feed_prompt
from a2ats_engine.cache import attention as att
from a2ats_engine.cache import host_step
from a2ats_engine.cache.a2ats_cache import A2ATSCache
from a2ats_engine.commands._bench_common import a2ats_config, machine
from a2ats_engine.commands.bench.common import load_codebook
from a2ats_engine.loading.models import load_model
from mlx_lm.models.cache import make_prompt_cache

HERE = pathlib.Path(__file__).resolve().parent
ROUNDS, CHUNK, UNTIMED = 6, 8, 12


def build():
    """Build graph_step.cpp into a temporary folder and import it."""
    out = pathlib.Path(tempfile.mkdtemp(prefix="a2ats-graph-step-"))
    import nanobind

    mlx_cmake = pathlib.Path(mlx.__path__[0]) / "share" / "cmake" / "MLX"
    subprocess.run(
        ["cmake", "-S", str(HERE), "-B", str(out), "-DCMAKE_BUILD_TYPE=Release",
         f"-DPython_EXECUTABLE={sys.executable}", f"-DMLX_DIR={mlx_cmake}",
         f"-Dnanobind_DIR={nanobind.cmake_dir()}"],
        check=True, stdout=sys.stderr,
    )  # fmt: skip
    subprocess.run(["cmake", "--build", str(out), "-j2"], check=True, stdout=sys.stderr)
    path = next(out.glob("_graph_step*.so"))
    spec = importlib.util.spec_from_file_location("_graph_step", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def patch(ext) -> dict:
    """host_step.step, for caches marked `graph_step`: the primitive in the graph."""
    shipped = host_step.step
    calls = {"graph": 0}

    def step(retrieval, cache, queries, lay, scale, sinks):
        if not getattr(cache, "graph_step", False):
            return shipped(retrieval, cache, queries, lay, scale, sinks)
        assert sinks is None and not cache.estimates and cache.config.reuse_selection is None
        to_far = att.step_rotations(cache.rope, lay.n - 1, cache.rotations, tuple(cache.buckets[0]))
        m, bucket = host_step._buckets(cache, lay)
        out, positions, repeat = ext.graph_step(
            queries.astype(mx.float32), to_far, cache.codes, cache.rows.keys, cache.rows.values,
            cache.codebook.scoring_centroids(cache.layer),
            None if bucket is None else mx.array(bucket), m, lay.n, lay.n_sinks,
            lay.window_start, lay.k, att.rerank_candidates(cache, lay), float(scale),
        )  # fmt: skip
        calls["graph"] += 1
        return out.astype(queries.dtype), positions, repeat

    host_step.step = step
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
    ext = build()
    calls = patch(ext)
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
        for c in lists["graph"]:
            if isinstance(c, A2ATSCache):
                c.graph_step = True
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
