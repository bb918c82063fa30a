# ruff: noqa: I001  (a2ats_engine before mlx: it preloads OpenBLAS)
"""Why a host step costs twice in a decode what it costs on its own: the NumPy part of one A2ATS
layer's retrieval step (`cache/host_step.py`), timed per piece warm (run again at once), cold
(right after reading as many bytes as one decoder layer's weights, which is what passes through
the caches between two layers' steps in a decode), right after MLX ran real layer work (the
MLPs of MLX_LAYERS decoder layers, evaluated: MLX's threads on both cores), right after NumPy
read the same weights (matrix-vector products on the main thread), and the call after the one
that follows MLX's work; next to the same part measured inside real decode steps
(`host_step.step`'s time less its one `mx.eval`, per layer). Every piece runs under
`numpy_blas.one_thread()`, as in the step.

The demo model, prefilled from filler text, retrieval forced (`a2ats_eb0`); the pieces are the
host step's own functions on the inputs one real step gave layer LAYER.

    .venv/bin/python docs/benchmarks/host_step_cold.py 1024,8000 > docs/benchmarks/host_step_cold.json
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time

import a2ats_engine  # noqa: F401  (BLAS preload before mlx.core)
import mlx.core as mx
import numpy as np
from mlx.utils import tree_flatten

from a2ats_engine.bench.speed import _method_cache
from a2ats_engine.cache import attention as att
from a2ats_engine.cache import host_step, numpy_blas
from a2ats_engine.commands._bench_common import machine
from _demo_prefill import demo_prefilled

LAYER = 15
REPS = 150
STEPS = 12
MLX_LAYERS = 4  # the decoder layers whose MLPs MLX runs before a piece (42 MB of float32 weights)
SECOND = {"cold": "warm", "after_mlx": "after_mlx_second"}  # the call after the first's column


def _median_ms(times: list[float]) -> float:
    return round(statistics.median(times) * 1e3, 3)


def _pieces(step_args) -> dict:
    """The host step's NumPy pieces as closures over one layer's real inputs."""
    retrieval, c, queries, lay, scale, _sinks = step_args
    B, n_q, _, d = queries.shape
    n_kv = c.codes.shape[1]
    to_far = att.step_rotations(c.rope, lay.n - 1, c.rotations, tuple(c.buckets[0]))
    mx.eval(to_far, queries, c.codes, c.rows.keys, c.rows.values)
    q = np.asarray(queries).reshape(B, n_kv, n_q // n_kv, d).astype(np.float32)
    codes, keys, values = (np.asarray(a) for a in (c.codes, c.rows.keys, c.rows.values))
    to_far = np.asarray(to_far)[:, : d * host_step.used_buckets(c, lay)]  # as the step's
    centroids = np.asarray(c.codebook.scoring_centroids(c.layer))
    tables = host_step.host_tables(q, to_far, centroids)
    approx = host_step.far_scores(tables, codes, c, lay)
    cands = min(c.config.rerank * lay.k, lay.n_far)
    top = host_step.rerank(q, approx, lay, cands, keys, c.top_k, None, False)
    pos, rep = c.top_k.select_host(top, lay, count=False)
    k_sel, v_sel = host_step.gather(keys, pos), host_step.gather(values, pos)
    out = host_step.attention(q, k_sel, v_sel, rep, scale, None)
    return {
        "lookup tables": lambda: host_step.host_tables(q, to_far, centroids),
        "code scores": lambda: host_step.far_scores(tables, codes, c, lay),
        "top-K + rerank": lambda: host_step.rerank(
            q, approx, lay, cands, keys, c.top_k, None, False
        ),
        "union": lambda: c.top_k.select_host(top, lay, count=False),
        "gather K/V": lambda: (host_step.gather(keys, pos), host_step.gather(values, pos)),
        "attention": lambda: host_step.attention(q, k_sel, v_sel, rep, scale, None),
        "back to MLX": lambda: mx.eval(mx.array(out), mx.array(pos), mx.array(rep)),
    }


def _layer_work(model):
    """(MLX runs the MLPs of MLX_LAYERS decoder layers on one token and waits for them, NumPy
    multiplies the same weights by a vector on the main thread, their bytes)."""
    weights = [
        v for layer in model.layers[:MLX_LAYERS] for _, v in tree_flatten(layer.mlp.parameters())
    ]
    x = mx.random.normal((1, 1, model.layers[0].mlp.gate_proj.weight.shape[1]))
    mx.eval(x)

    def mlps() -> None:
        y = x
        for layer in model.layers[:MLX_LAYERS]:
            y = layer.mlp(y)
        mx.eval(y)

    copies = [np.array(w.astype(mx.float32)) for w in weights]
    ones = [np.ones(w.shape[1], np.float32) for w in copies]

    def numpy_mlps() -> None:
        for w, v in zip(copies, ones, strict=True):
            w @ v

    return mlps, numpy_mlps, int(sum(w.nbytes for w in weights))


def main(context: int) -> dict:
    model, info, codebook, desc, config, ids, base = demo_prefilled(context)
    caches = _method_cache(model, base, "a2ats_eb0", config, codebook)
    layer_bytes = sum(v.nbytes for _, v in tree_flatten(model.layers[LAYER].parameters()))
    sweep = np.ones(layer_bytes // 4, np.float32)

    shipped, real_eval = host_step.step, mx.eval
    seen, in_step, in_eval = [], [], []

    def eval_timed(*arrays):
        began = time.perf_counter()
        real_eval(*arrays)
        in_eval[-1] += time.perf_counter() - began

    def step(*args):
        if args[1].layer == LAYER:
            seen[:] = [args]
        in_eval.append(0.0)
        began = time.perf_counter()
        result = shipped(*args)
        in_step.append(time.perf_counter() - began)
        return result

    token = mx.array([ids[-1]])
    host_step.step, host_step.mx.eval = step, eval_timed
    try:
        for i in range(STEPS + 2):
            if i == 2:  # the first steps warm up
                in_step.clear(), in_eval.clear()
            token = mx.argmax(model(token[None], cache=caches)[:, -1], axis=-1)
            real_eval(token)
    finally:
        host_step.step, host_step.mx.eval = shipped, real_eval
    in_decode = [s - e for s, e in zip(in_step, in_eval, strict=True)]

    pieces = _pieces(seen[0])
    parts = list(pieces.values())
    pieces["whole NumPy part"] = lambda: [fn() for fn in parts]
    _, c, queries, lay, scale, _ = seen[0]
    keys, values = c.rows.keys[..., : lay.n, :], c.rows.values[..., : lay.n, :]
    mx.eval(keys, values)
    pieces["exact attention (MLX; what the step replaces)"] = lambda: mx.eval(
        mx.fast.scaled_dot_product_attention(queries, keys, values, scale=scale)
    )
    mlps, numpy_mlps, mlp_bytes = _layer_work(model)
    before = {"cold": sweep.sum, "after_mlx": mlps, "after_numpy_weights": numpy_mlps}
    times: dict[str, dict[str, list]] = {k: {} for k in [*before, "warm", "after_mlx_second"]}
    with numpy_blas.one_thread():
        for name, fn in pieces.items():
            for k in times:
                times[k][name] = []
            for _ in range(REPS):
                for kind, work in before.items():
                    work()
                    began = time.perf_counter()
                    fn()
                    times[kind][name].append(time.perf_counter() - began)
                    if kind in SECOND:  # the call right after, timed too
                        began = time.perf_counter()
                        fn()
                        times[SECOND[kind]][name].append(time.perf_counter() - began)
    ms = {k: {n: _median_ms(t) for n, t in v.items()} for k, v in times.items()}
    return {
        "model": info.name,
        "codebook": desc,
        "context": context,
        "layer": LAYER,
        "sweep_bytes": int(sweep.nbytes),
        "machine": machine(),
        "command": "python docs/benchmarks/host_step_cold.py " + " ".join(sys.argv[1:]),
        "reps": REPS,
        "warm_ms": ms["warm"],
        "cold_ms": ms["cold"],
        "after_mlx_ms": ms["after_mlx"],
        "after_mlx_second_call_ms": ms["after_mlx_second"],
        "after_numpy_weights_ms": ms["after_numpy_weights"],
        "mlx_layers": MLX_LAYERS,
        "mlx_layer_bytes": mlp_bytes,
        "blas": "numpy_blas.one_thread() around every piece",
        "in_decode_ms_per_layer": _median_ms(in_decode),
        "decode_steps": STEPS,
        "load_average_at_end": [round(x, 2) for x in os.getloadavg()],
        "date": time.strftime("%Y-%m-%d"),
    }


if __name__ == "__main__":
    contexts = [int(c) for c in (sys.argv[1] if len(sys.argv) > 1 else "1024").split(",")]
    print(json.dumps({"runs": [main(c) for c in contexts]}))
