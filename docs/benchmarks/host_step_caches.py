# ruff: noqa: I001  (a2ats_engine before mlx: it preloads OpenBLAS)
"""Why the host step runs slower inside a decode than in a loop: the CPU caches.

The demo model prefilled to a context, retrieval forced without the estimate
(`a2ats_eb0_noest`), the C++ host step (`cache/native_step.py`). Timed, per layer call:
- in a decode: the Python of `native_step.run` up to the C++ call, and the C++ call itself;
- the same call of one layer (its arguments caught during the decode) repeated in a loop, warm;
- that loop with 40 MB of memory written between calls (more than the host's L2 and L3 hold
  for one core: what a layer's weights do to the caches between two of the step's calls).
Each: the Python part alone (`run` with the C++ call replaced by a no-op) and the C++ call alone.
Medians in microseconds.

    .venv/bin/python docs/benchmarks/host_step_caches.py [context] > docs/benchmarks/X.json
"""

from __future__ import annotations

import json
import statistics
import sys
import time

import a2ats_engine  # noqa: F401  (BLAS preload before mlx.core)
import mlx.core as mx
import numpy as np

from a2ats_engine.bench.speed import _decode_chunk, _method_cache
from a2ats_engine.cache import native_step, topk
from _demo_prefill import demo_prefilled, turns_record

FLUSH_BYTES = 40 * 2**20
CALLS = 400


def main() -> None:
    context = int(sys.argv[1]) if len(sys.argv) > 1 else 1024
    if not native_step.on():
        raise SystemExit(f"the C++ host step does not run here: {native_step.status()}")
    model, info, codebook, desc, config, ids, base = demo_prefilled(context)
    with topk.forced("numpy"):
        cache = _method_cache(model, base, "a2ats_eb0_noest", config, codebook)
    fn, clock = native_step._fn, time.perf_counter
    seen: dict[str, list[float]] = {"python": [], "call": []}
    caught: dict = {}
    mark = [0.0]

    def call(*args):
        start = clock()
        seen["python"].append(start - mark[0])
        got = fn(*args)
        seen["call"].append(clock() - start)
        return got

    def catch(*args, **kwargs):
        caught[0] = (args, kwargs)
        mark[0] = clock()
        return run(*args, **kwargs)

    run = native_step.run
    native_step._fn, native_step.run = call, catch
    try:
        last = mx.array([ids[-1]])
        _, last = _decode_chunk(model, cache, last, 6)  # warm-up
        for v in seen.values():
            v.clear()
        _, last = _decode_chunk(model, cache, last, 16)
    finally:
        native_step._fn, native_step.run = fn, run
    in_decode = {k: statistics.median(v) * 1e6 for k, v in seen.items()}
    args, kwargs = caught[0]  # the last layer's call of the last step
    big = np.ones(FLUSH_BYTES // 4, np.float32)

    def loop(flush: bool) -> dict[str, float]:
        out = {}
        for part, c_fn in (("python", lambda *a: 0), ("call", fn)):
            native_step._fn = c_fn
            times = []
            try:
                for _ in range(CALLS):
                    if flush:
                        np.add(big, 1.0, out=big)
                    start = clock()
                    run(*args, **kwargs)
                    times.append(clock() - start)
            finally:
                native_step._fn = fn
            out[part] = statistics.median(times) * 1e6
        out["call"] -= out["python"]  # the loop's call time less the Python around it
        return out

    warm, flushed = loop(False), loop(True)
    record = turns_record("host_step_caches.py", info, desc, context, {"x": [0.0]}, 1)
    for key in ("steps_per_round", "rounds_counted", "ms_per_step", "ms_per_step_runs"):
        record.pop(key, None)
    record.update(
        {
            "host_step": native_step.status(),
            "flush_bytes": FLUSH_BYTES,
            "calls_per_loop": CALLS,
            "us_per_layer_call": {
                condition: {k: round(v, 1) for k, v in got.items()}
                for condition, got in (
                    ("in_decode", in_decode),
                    ("warm_loop", warm),
                    ("flushed_loop", flushed),
                )
            },
        }
    )
    print(json.dumps(record, indent=1))


if __name__ == "__main__":
    main()
