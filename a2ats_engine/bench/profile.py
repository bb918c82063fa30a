"""`a2ats bench decode --profile`: where the time of one A2ATS decode step goes, per phase.

Per context: the same prompt is prefilled into mlx-lm's caches and A2ATS's; then
- `UNTIMED` steps of each (the missed-attention estimate's warm-up, after which its layers are
  chosen), then `steps` decode steps of each, timed whole (no instrumentation): the step times
  to compare;
- `steps` more A2ATS steps with a `PhaseClock` on every A2ATS layer: first the layer's inputs
  (`layer inputs`: the model's work up to the attention call, i.e. the previous layer's MLP,
  this layer's projections and the new key's code), then each phase (code scores, top-K or
  top-K + rerank, union, gather K/V, estimate, attention over the selection, telemetry; with
  the C++ host step its one call, `native step`)
  evaluated and timed on its own, summed over layers, as ms per step and per layer that ran
  it (`phase_times`: a phase only some layers run is divided by those);
- exact attention (mlx-lm's `scaled_dot_product_attention`) over one layer's whole cache, the
  cost each layer's retrieval replaces.
Evaluating phase by phase adds MLX's per-evaluation overhead, so the phases add up to more than
an uninstrumented step; the gap is reported. The thread settings of MLX's BLAS (OpenBLAS) and
NumPy's own BLAS are reported beside the figures (`threads`).
"""

from __future__ import annotations

import os
import time
from dataclasses import replace
from typing import Any

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models.cache import make_prompt_cache

from .._backend import blas_library
from ..cache import native_step, numpy_blas
from ..cache.a2ats_cache import A2ATSCache
from ..cache.config import A2ATSConfig
from ..cache.model_cache import make_cache
from ..cache.retrieval import PhaseClock
from .speed import UNTIMED, filler_tokens, time_to_first_token


def _blas_threads(path: str) -> int | None:
    calls = numpy_blas.thread_calls(path)
    return None if calls is None else int(calls[0]())


def threads() -> dict[str, Any]:
    """The thread settings the figures depend on."""
    libs = {os.path.basename(p): _blas_threads(p) for p in numpy_blas.loaded_blas()}
    env = (
        "OMP_NUM_THREADS",
        "OPENBLAS_NUM_THREADS",
        "MKL_NUM_THREADS",
        "OPENBLAS_CORETYPE",
        "A2ATS_HOST_STEP",
    )
    return {
        "cpus": os.cpu_count(),
        "affinity": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "mlx_blas": os.path.basename(blas_library) if blas_library else "MLX's own",
        "blas_threads": libs,
        # NumPy's BLAS inside the host decode step (cache/numpy_blas.py): one thread, where set
        "host_step_numpy_blas": (
            "kept" if numpy_blas.kept() else 1 if numpy_blas.threads() is not None else "not set"
        ),
        "host_step": native_step.status(),  # C++ or NumPy, and why (cache/native_step.py)
        "env": {k: os.environ[k] for k in env if k in os.environ},
    }


def _decode(model: nn.Module, caches: list, token: mx.array, steps: int) -> tuple[float, mx.array]:
    """Mean seconds of `steps` greedy decode steps (the token read back each step, as
    mlx-lm's generate does) and the last token."""
    began = time.perf_counter()
    for _ in range(steps):
        logits = model(token[None], cache=caches)[:, -1]
        token = mx.argmax(logits, axis=-1)
        mx.eval(token)
    return (time.perf_counter() - began) / steps, token


def _exact_layer_ms(cache: A2ATSCache, n_q: int, reps: int = 5) -> float:
    """Exact attention over one layer's whole cache: ms per call (what retrieval replaces)."""
    keys, values = cache.rows.fetch(cache.offset)
    q = mx.random.normal((1, n_q, 1, keys.shape[-1])).astype(keys.dtype)
    scale = keys.shape[-1] ** -0.5
    mx.eval(keys, values, q)
    mx.eval(mx.fast.scaled_dot_product_attention(q, keys, values, scale=scale))
    began = time.perf_counter()
    for _ in range(reps):
        mx.eval(mx.fast.scaled_dot_product_attention(q, keys, values, scale=scale))
    return (time.perf_counter() - began) / reps * 1e3


def phase_times(
    clock: PhaseClock, steps: int
) -> tuple[dict[str, float], dict[str, float], dict[str, int]]:
    """(ms per step, ms per layer that ran it, how many layers ran it) of each phase the clock
    timed over `steps` steps, the costliest first. A phase some layers skip (the synced step's
    estimate on the layers that miss most, a layer the C++ step does not select for) is
    divided by the layers that ran it, not by every layer."""
    seconds: dict[str, float] = {}
    layers: dict[str, set[int]] = {}
    for (layer, phase), s in clock.seconds.items():
        seconds[phase] = seconds.get(phase, 0.0) + s
        layers.setdefault(phase, set()).add(layer)
    order = sorted(seconds, key=lambda p: -seconds[p])
    per_step = {p: seconds[p] / max(steps, 1) * 1e3 for p in order}
    per_layer = {p: per_step[p] / len(layers[p]) for p in order}
    return per_step, per_layer, {p: len(layers[p]) for p in order}


def profile_decode(
    model: nn.Module,
    tokenizer,
    contexts: list[int],
    *,
    steps: int = 8,
    config: A2ATSConfig | None = None,
    codebook=None,
) -> list[dict[str, Any]]:
    """One row per context (see the module docstring). Retrieval is forced at every context
    (`exact_below=0`), so a short context shows the fixed cost of a retrieval step."""
    config = replace(config or A2ATSConfig(), exact_below=0)
    n_q = int(getattr(model.args, "num_attention_heads", 1))
    rows = []
    for n in contexts:
        ids = filler_tokens(tokenizer, n)
        full, a2ats = make_prompt_cache(model), make_cache(model, config, codebook)
        _, first = time_to_first_token(model, full, ids)
        time_to_first_token(model, a2ats, ids)
        token = mx.array([first])
        for cache in (full, a2ats):  # untimed, as `bench decode`: the estimate's layers chosen
            _decode(model, cache, token, UNTIMED)
        full_s, _ = _decode(model, full, token, steps)
        a2ats_s, last = _decode(model, a2ats, token, steps)
        layers = [c for c in a2ats if isinstance(c, A2ATSCache)]
        clock = PhaseClock()
        for c in layers:
            c.retrieval.clock = clock
        timed_s, _ = _decode(model, a2ats, last, steps)
        for c in layers:
            c.retrieval.clock = None
        per_step, per_layer, phase_layers = phase_times(clock, steps)
        rows.append(
            {
                "context": n,
                "a2ats_layers": len(layers),
                "top_k": "numpy" if layers and layers[0].top_k.on_host else "mlx",
                "retrieved_steps": max((c.retrieved_steps for c in layers), default=0),
                "kvcache_step_ms": round(full_s * 1e3, 2),
                "a2ats_step_ms": round(a2ats_s * 1e3, 2),
                "a2ats_vs_kvcache": round(full_s / a2ats_s, 3),
                "instrumented_step_ms": round(timed_s * 1e3, 2),
                "phases_ms_per_step": {p: round(ms, 3) for p, ms in per_step.items()},
                "phases_ms_per_layer": {p: round(ms, 3) for p, ms in per_layer.items()},
                "phase_layers": phase_layers,
                "exact_attention_ms_per_layer": round(_exact_layer_ms(layers[0], n_q), 3)
                if layers
                else None,
            }
        )
        for cache in (full, a2ats):
            del cache
    return rows
