"""Where retrieval starts to pay off: the measured default of `A2ATSConfig.exact_below`.

Below the crossover context a decode step of exact attention is faster than A2ATS's retrieval
(lookup tables, top-K, gathers), so the cache attends exactly there (keys are still coded, so
switching retrieval on later costs nothing). The crossover depends on the backend and the
model's attention geometry, so the default is a table of measurements keyed by both; a model or
backend nobody measured gets 0 (retrieve as soon as anything can be dropped, the behaviour
before this setting). `A2ATSConfig.exact_below` overrides the table.

Add a row from `a2ats bench decode --contexts 512,1024,2048,4096,8192 --methods
full,a2ats_eb0` on a quiet machine: the crossover is the first context where `a2ats_eb0`
(retrieval from the start) decodes at least as fast as `full` (docs/BENCHMARKS.md).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Crossover:
    """One measured crossover: the context (tokens) from which retrieval is faster."""

    tokens: int
    source: str


# (backend, attention layers, KV heads, head dim) -> crossover
MEASURED: dict[tuple[str, int, int, int], Crossover] = {
    ("cpu", 30, 3, 64): Crossover(
        4096,
        "SmolLM2-135M (the demo model), 2-core x86_64, rerank 2, no estimate: retrieval from "
        "the start (a2ats_eb0_noest) 0.90x full at 2K, 1.02x at 4K, 1.24x at 8K, median of 3 "
        "runs (docs/benchmarks/decode_v2.json)",
    ),
}


def backend() -> str:
    """ "cpu" on CPU-only MLX, else "metal" (the same test as the top-K strategy's)."""
    from .topk import _cpu_only

    return "cpu" if _cpu_only() else "metal"


def measured_crossover(num_layers: int, num_kv_heads: int, head_dim: int) -> int:
    """The measured crossover for this backend and geometry, 0 where none was measured."""
    row = MEASURED.get((backend(), num_layers, num_kv_heads, head_dim))
    return row.tokens if row is not None else 0
