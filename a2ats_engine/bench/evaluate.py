"""Fidelity of A2ATS against exact attention and other caches on one teacher-forced trajectory.

`evaluate` prefills `context` tokens of a text once (exact attention, the model's own caches:
mlx-lm's `make_prompt_cache`), copies that state into every method's caches following the
model's layer plan (`plan_caches.py`: the method's cache on the plan's A2ATS layers, a copy of
the model's own cache, a sliding window's `RotatingKVCache` included, on its native layers),
and decodes the next `decode` tokens of the same text through each method (teacher forcing:
every method reads the same tokens). The cache of each layer the plan serves with A2ATS is
wrapped in a `MeasuredCache` (for every method, full included; native layers run unmeasured):
on every decode step it gets the true post-RoPE query through the attention hook, computes
exact attention over the full K/V, lets the method attend, and records

- recall: exact attention mass on the positions the method attended (per query head; averaged
  over query heads, layers and steps);
- output_rel_error: `||o_method - o_exact|| / ||o_exact||` over all query heads of a layer,
  averaged over layers and steps;
- attended_fraction and bytes_read per decode step (codes scanned, centroids, full keys scored
  or reranked, K/V rows attended; sinks, window and the GQA union included): the cost of the
  step, counted by `accounting.py`, so methods can be compared at equal cost;
then returns the method's own output, so `ppl` (perplexity of the `decode` teacher-forced
tokens) is what that method really produces. With `full` evaluated too, `ppl_vs_full` is the
paired ratio on the same tokens with a 95% block-bootstrap interval (`paired_ppl_ratio`). With
`A2ATSConfig.kv_bits`, the A2ATS-structured methods store K/V quantized and are still measured
against exact attention over the float K/V (a shadow float cache).

Methods: the `METHODS` registry in `methods.py` (full, kv8, kv4, window, oracle_topk, a2ats and
its ablations; the diagnostics a2ats_exact_keys / a2ats_exact_rope, which split A2ATS's loss
against oracle_topk, run only when asked for).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import mlx.core as mx
import mlx.nn as nn
import numpy as np
from mlx_lm.models.base import quantized_scaled_dot_product_attention
from mlx_lm.models.cache import KVCache, QuantizedKVCache

from ..cache.a2ats_cache import A2ATSCache
from ..cache.config import A2ATSConfig
from ..cache.geometry import model_geometry
from ..cache.layer_budgets import CAP, allocate_layer_budgets
from ..cache.layer_plan import plan_for
from ..progress import Progress
from .accounting import StepCost, cache_step_cost
from .methods import (  # noqa: F401  (re-exported: the method caches are part of this API)
    BUDGET,
    DIAGNOSTIC,
    FIXED,
    METHODS,
    CodedExactRopeCache,
    ExactKeyWRopeCache,
    IdentityRope,
    MethodSpec,
    OracleTopKCache,
    RecentWindowCache,
    kv_group_size,
    method_names,
    method_spec,
)
from .plan_caches import native_bytes, plan_caches, prefix
from .stats import RESAMPLES, block_bootstrap_ci, default_block

FIXED_METHODS = method_names(FIXED)  # full, kv8, kv4
BUDGET_METHODS = method_names(BUDGET)  # a2ats, window, oracle_topk and the a2ats ablations
ALL_METHODS = FIXED_METHODS + BUDGET_METHODS
DIAGNOSTIC_METHODS = method_names(DIAGNOSTIC)  # run only when asked for
KNOWN_METHODS = ALL_METHODS + DIAGNOSTIC_METHODS
PREFILL_CHUNK = 256  # fastest on a 2-core CPU (attention cost grows with the chunk)


# -- metric functions ---------------------------------------------------------------------------


def attention_recall(probs: np.ndarray, attended: np.ndarray) -> float:
    """Mean exact-attention mass on the attended positions.

    probs: exact attention probabilities `[..., N]` (rows sum to 1); attended: bool `[..., N]`
    broadcastable to probs. Returns the mass on attended positions averaged over all rows.
    """
    probs = np.asarray(probs, dtype=np.float64)
    mask = np.broadcast_to(np.asarray(attended, dtype=bool), probs.shape)
    return float(np.where(mask, probs, 0.0).sum(axis=-1).mean())


def relative_l2_error(approx: np.ndarray, exact: np.ndarray) -> float:
    """`||approx - exact||_2 / ||exact||_2` over all elements (0 when both are zero)."""
    approx = np.asarray(approx, dtype=np.float64)
    exact = np.asarray(exact, dtype=np.float64)
    norm = float(np.linalg.norm(exact))
    diff = float(np.linalg.norm(approx - exact))
    if norm == 0.0:
        return 0.0 if diff == 0.0 else math.inf
    return diff / norm


def token_nll(logits: np.ndarray, targets: np.ndarray) -> np.ndarray:
    """Negative log-likelihood of each target: logits `[M, V]`, targets int `[M]` -> `[M]`."""
    logits = np.asarray(logits, dtype=np.float64)
    targets = np.asarray(targets, dtype=np.int64)
    top = logits.max(axis=-1, keepdims=True)
    log_z = top[:, 0] + np.log(np.exp(logits - top).sum(axis=-1))
    return log_z - logits[np.arange(len(targets)), targets]


def perplexity(logits: np.ndarray, targets: np.ndarray) -> float:
    """exp(mean NLL) of the targets under the logits (`[M, V]`, `[M]`)."""
    return float(np.exp(token_nll(logits, targets).mean()))


def paired_ppl_ratio(
    nll: np.ndarray, reference_nll: np.ndarray, block: int | None = None
) -> tuple[float, float, float]:
    """ppl(method) / ppl(reference) on the same tokens, with a 95% interval.

    nll, reference_nll: per-token NLL `[M]` of the same consecutive targets. The ratio is
    `exp(mean(nll - reference_nll))`; the interval is exp of the circular block bootstrap
    interval of that mean (`stats.block_bootstrap_ci`, blocks of `block` tokens, default
    floor(M^(1/3))): neighbouring tokens are not independent. Returns (ratio, low, high)."""
    delta = np.asarray(nll, dtype=np.float64) - np.asarray(reference_nll, dtype=np.float64)
    mean, low, high = block_bootstrap_ci(delta, block=block)
    return math.exp(mean), math.exp(low), math.exp(high)


@dataclass
class StepRecord:
    """What a MeasuredCache recorded over the decode steps of one layer."""

    recall: list[float] = field(default_factory=list)
    output_error: list[float] = field(default_factory=list)
    attended: list[float] = field(default_factory=list)  # attended positions per KV head
    retrieved: list[float] = field(default_factory=list)  # far tokens attended per KV head
    retrieval: list[bool] = field(default_factory=list)  # the step selected (was not exact)
    cost: list[StepCost] = field(default_factory=list)  # attended share and bytes read


class MeasuredCache:
    """Wraps one layer's method cache; on each decode step measures the method against exact
    attention (see the module docstring) and returns the method's own output.

    Everything but `attend` and `update_and_fetch` is delegated to the wrapped cache, so the
    model treats it as that cache (offset, masks, state)."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.quantized = isinstance(inner, QuantizedKVCache)
        # quantized storage (kv8/kv4, A2ATS with kv_bits) is measured against exact float K/V
        stores_quantized = self.quantized or getattr(inner, "kv_bits", None) is not None
        self.shadow = KVCache() if stores_quantized else None
        self.record = StepRecord()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.__dict__["inner"], name)

    def update_and_fetch(self, keys: mx.array, values: mx.array):
        if self.shadow is not None:
            self.shadow.update_and_fetch(keys, values)
        return self.inner.update_and_fetch(keys, values)

    def _exact_kv(self, keys, values) -> tuple[mx.array, mx.array]:
        if self.shadow is None:
            return keys, values
        n = self.shadow.offset
        return self.shadow.keys[..., :n, :], self.shadow.values[..., :n, :]

    def _method_output(self, queries, keys, values, scale, mask, sinks=None) -> mx.array:
        inner = self.inner
        if isinstance(inner, A2ATSCache):
            return inner.attend(queries, keys, values, scale=scale, mask=mask, sinks=sinks)
        if self.quantized:  # it scales its queries in place: hand it a copy
            return quantized_scaled_dot_product_attention(
                queries * 1, keys, values, scale=scale, mask=mask,
                group_size=inner.group_size, bits=inner.bits,
            )  # fmt: skip
        if sinks is not None:
            return mx.fast.scaled_dot_product_attention(
                queries, keys, values, scale=scale, mask=mask, sinks=sinks
            )
        return mx.fast.scaled_dot_product_attention(queries, keys, values, scale=scale, mask=mask)

    def attend(
        self, queries: mx.array, keys, values, *, scale: float, mask=None, sinks=None
    ) -> mx.array:
        """queries post-RoPE `[B, n_q, L, d]` -> the method's output `[B, n_q, L, d]`.

        sinks: per-query-head sink logits `[n_q]` (gpt_oss) join the softmax of the method and
        of the exact reference alike."""
        out = self._method_output(queries, keys, values, scale, mask, sinks)
        if queries.shape[2] == 1:
            self._measure(queries, *self._exact_kv(keys, values), out, scale, sinks)
        return out

    def _attended_mask(self, n_kv: int, n: int) -> np.ndarray:
        """bool `[n_kv, N]`: positions the method attended at this step (batch element 0)."""
        stats = getattr(self.inner, "last_stats", None)
        if not isinstance(self.inner, A2ATSCache) or stats is None or stats.exact:
            return np.ones((n_kv, n), dtype=bool)
        mask = np.zeros((n_kv, n), dtype=bool)
        for h, positions in enumerate(stats.selected):
            mask[h, positions] = True
        return mask

    def _measure(self, queries, keys, values, out, scale: float, sinks=None) -> None:
        _, n_q, _, d = queries.shape
        k = keys[0].astype(mx.float32)  # [n_kv, N, d]
        n_kv, n = k.shape[0], k.shape[1]
        q = queries[0, :, 0, :].astype(mx.float32).reshape(n_kv, n_q // n_kv, d)
        logits = (q * scale) @ k.swapaxes(-1, -2)  # [n_kv, G, N]
        if sinks is None:
            probs = mx.softmax(logits, axis=-1)
            exact = probs @ values[0].astype(mx.float32)  # [n_kv, G, d]
        else:  # the sink takes its share of the softmax and contributes no value
            sink = sinks.astype(mx.float32).reshape(n_kv, n_q // n_kv, 1)
            with_sink = mx.softmax(mx.concatenate([sink, logits], axis=-1), axis=-1)[..., 1:]
            exact = with_sink @ values[0].astype(mx.float32)
            probs = with_sink / with_sink.sum(axis=-1, keepdims=True)  # recall over positions
        method = out[0, :, 0, :].astype(mx.float32).reshape(n_kv, n_q // n_kv, d)
        probs_np, exact_np, method_np = (np.array(a) for a in (probs, exact, method))
        mask = self._attended_mask(n_kv, n)
        self.record.recall.append(attention_recall(probs_np, mask[:, None, :]))
        self.record.output_error.append(relative_l2_error(method_np, exact_np))
        self.record.attended.append(float(mask.sum(axis=-1).mean()))
        scoring = getattr(self.inner, "scoring", "codes")
        self.record.cost.append(
            cache_step_cost(self.inner, mask.sum(axis=-1), n, n_q, keys.dtype.size, scoring)
        )
        stats = getattr(self.inner, "last_stats", None)
        selected = isinstance(self.inner, A2ATSCache) and stats is not None and not stats.exact
        self.record.retrieval.append(selected)
        if selected:
            self.record.retrieved.append(float(np.mean([len(r) for r in stats.retrieved])))


# -- building each method's cache from a shared prefill ---------------------------------------


def prefill(model: nn.Module, ids: Sequence[int], progress: Progress | None = None) -> list:
    """Exact prefill of `ids` (chunked) into the model's own fresh caches (mlx-lm's
    `make_prompt_cache`: KVCache on global layers, RotatingKVCache on sliding ones, ...), one
    per cache slot. Every method starts from a copy of it (`plan_caches.plan_caches`)."""
    from mlx_lm.models.cache import make_prompt_cache

    cache = make_prompt_cache(model)
    for start in range(0, len(ids), PREFILL_CHUNK):
        mx.eval(model(mx.array([list(ids[start : start + PREFILL_CHUNK])]), cache=cache))
        if progress is not None:
            progress("prefill", min(start + PREFILL_CHUNK, len(ids)), len(ids))
    return cache


def measured_caches(model: nn.Module, base: list, spec: MethodSpec) -> list:
    """The method's caches from the plan (`plan_caches`), each layer the plan serves with A2ATS
    wrapped in a `MeasuredCache`; the native layers run as the model runs them, unmeasured."""
    caches, measured = plan_caches(model, base, spec)
    out = []
    for cache, src, m in zip(caches, base, measured, strict=True):
        if m:
            cache = MeasuredCache(cache)
            if cache.shadow is not None:  # exact float K/V beside quantized storage
                cache.shadow.update_and_fetch(*prefix(src))
        out.append(cache)
    return out


# -- running one method -------------------------------------------------------------------------


@dataclass
class MethodResult:
    """One method's figures on the trajectory (see the module docstring)."""

    name: str
    recall: float
    output_rel_error: float
    ppl: float
    bytes_per_token: float
    attended_per_head: float
    retrieved_per_head: float | None
    argmax_agreement: float | None = None
    seconds: float = 0.0
    nll: np.ndarray | None = None  # per-token NLL [M] (not serialized)
    ppl_vs_full: float | None = None
    ppl_vs_full_ci95: tuple[float, float] | None = None
    attended_fraction: float | None = None
    bytes_read: dict[str, float] | None = None  # per decode step, all layers (accounting.py)
    # per model layer: mean recall over the decode steps, None for a layer that never selected
    # (every step exact); None altogether when no layer selected (`layer_recall`)
    recall_per_layer: list[float | None] | None = None
    layer_budgets: tuple[float, ...] | None = None  # the multipliers it ran with, if any
    dev_recall_per_layer: list[float | None] | None = None  # a2ats_alloc: what they came from

    def to_dict(self) -> dict[str, Any]:
        out = {
            "recall": round(self.recall, 5),
            "output_rel_error": round(self.output_rel_error, 5),
            "ppl": round(self.ppl, 4),
            "bytes_per_token": round(self.bytes_per_token, 1),
            "attended_per_head": round(self.attended_per_head, 1),
        }
        if self.nll is not None:
            out["tokens"] = len(self.nll)
        if self.retrieved_per_head is not None:
            out["retrieved_per_head"] = round(self.retrieved_per_head, 1)
        if self.attended_fraction is not None:
            out["attended_fraction"] = round(self.attended_fraction, 5)
        if self.bytes_read is not None:
            out["bytes_read_per_step"] = round(self.bytes_read["total"])
            out["bytes_read"] = {k: round(v) for k, v in self.bytes_read.items() if k != "total"}
        if self.argmax_agreement is not None:
            out["argmax_agreement"] = round(self.argmax_agreement, 4)
        if self.ppl_vs_full is not None:
            out["ppl_vs_full"] = round(self.ppl_vs_full, 4)
            out["ppl_vs_full_ci95"] = [round(x, 4) for x in self.ppl_vs_full_ci95]
        if self.recall_per_layer is not None:
            out["recall_per_layer"] = _rounded(self.recall_per_layer)
        if self.layer_budgets is not None:
            out["layer_budgets"] = [round(m, 4) for m in self.layer_budgets]
        if self.dev_recall_per_layer is not None:
            out["dev_recall_per_layer"] = _rounded(self.dev_recall_per_layer)
        return out


def _rounded(values: Sequence[float | None]) -> list[float | None]:
    return [None if v is None else round(v, 5) for v in values]


def run_method(
    model: nn.Module,
    base: list,
    spec: MethodSpec,
    inputs: Sequence[int],
    targets: Sequence[int],
) -> tuple[MethodResult, np.ndarray]:
    """Decode `inputs` (teacher-forced) from a copy of the prefill `base` through one method.

    Returns the result and the per-step argmax token ids `[M]`."""
    import time

    from ..cache import hooks

    hooks.install(model)
    caches = measured_caches(model, base, spec)
    began = time.perf_counter()
    nll, argmax = [], []
    for token, target in zip(inputs, targets, strict=True):
        logits = model(mx.array([[int(token)]]), cache=caches)[0, -1].astype(mx.float32)
        log_z = mx.logsumexp(logits)
        step = mx.stack([log_z - logits[int(target)], mx.argmax(logits).astype(mx.float32)])
        value = np.array(step)
        nll.append(float(value[0]))
        argmax.append(int(value[1]))
    seconds = time.perf_counter() - began
    # one record per cache slot, None on the native layers (not measured)
    per_slot = [c.record if isinstance(c, MeasuredCache) else None for c in caches]
    records = [r for r in per_slot if r is not None]
    tokens = context_length(base) + len(inputs)
    retrieved = [x for r in records for x in r.retrieved]
    result = MethodResult(
        name=spec.name,
        recall=float(np.mean([x for r in records for x in r.recall])),
        output_rel_error=float(np.mean([x for r in records for x in r.output_error])),
        ppl=float(np.exp(np.mean(nll))),
        bytes_per_token=sum(getattr(c, "inner", c).nbytes for c in caches) / tokens,
        attended_per_head=float(np.mean([x for r in records for x in r.attended])),
        retrieved_per_head=float(np.mean(retrieved)) if retrieved else None,
        seconds=seconds,
        nll=np.asarray(nll),
        attended_fraction=float(np.mean([c.attended_fraction for r in records for c in r.cost])),
        bytes_read=bytes_read_per_step(records),
        recall_per_layer=layer_recall(per_slot),
        layer_budgets=None if spec.config is None else spec.config.layer_budgets,
    )
    return result, np.asarray(argmax)


def layer_recall(records: Sequence[StepRecord | None]) -> list[float | None] | None:
    """Per layer (one StepRecord each, None for a native layer the plan does not serve with
    A2ATS), the mean recall over its decode steps; None for a native layer and for a layer
    none of whose steps selected (all exact: a dense layer, a context with nothing to drop),
    and None altogether when no layer selected (full, kv8, kv4: recall 1 by construction).

    Every layer records one recall per step, exact steps as 1, so the overall `recall` is the
    mean of this list with None read as the recall that layer recorded (1)."""
    if not any(r is not None and any(r.retrieval) for r in records):
        return None
    return [
        float(np.mean(r.recall)) if r is not None and any(r.retrieval) else None for r in records
    ]


def context_length(base: list) -> int:
    """Tokens the prefill `base` holds: the offset of its first attention cache (a rotating
    cache's offset counts every token, not the ones its window keeps)."""
    return int(next(c.offset for c in base if hasattr(c, "offset")))


def bytes_read_per_step(records: Sequence[StepRecord]) -> dict[str, float]:
    """Bytes read per decode step summed over layers, averaged over steps: {"codes",
    "centroids", "keys_scored", "rows", "total"} (accounting.py)."""
    parts = ("codes", "centroids", "keys_scored", "rows")
    steps = min(len(r.cost) for r in records)
    out = {
        part: float(np.mean([sum(getattr(r.cost[s], part) for r in records) for s in range(steps)]))
        for part in parts
    }
    out["total"] = sum(out.values())
    return out


def greedy_decode(
    model: nn.Module, caches: list, first_token: int, steps: int
) -> tuple[list[int], float | None]:
    """Greedy tokens after feeding `first_token` through `caches` for `steps` steps.

    Returns (token ids, far tokens attended per KV head per step averaged over layers and steps,
    read from A2ATS telemetry; None when the caches are not telemetry-enabled A2ATS caches)."""
    token, out, retrieved = int(first_token), [], []
    for _ in range(steps):
        logits = model(mx.array([[token]]), cache=caches)[0, -1]
        token = int(mx.argmax(logits).item())
        out.append(token)
        for cache in caches:
            stats = getattr(getattr(cache, "inner", cache), "last_stats", None)
            if isinstance(getattr(cache, "inner", cache), A2ATSCache) and stats is not None:
                retrieved.append(float(np.mean([len(r) for r in stats.retrieved])))
    return out, (float(np.mean(retrieved)) if retrieved else None)


def build_caches(model: nn.Module, base: list, spec: MethodSpec) -> list:
    """One cache per layer for `spec`, holding a copy of the prefill `base`; hooks installed."""
    from ..cache import hooks

    hooks.install(model)
    return plan_caches(model, base, spec)[0]


def evicting_window_bytes(
    model: nn.Module, attended: float, tokens: int, dtype_bytes: int, native: int = 0
) -> float:
    """Bytes per token a sinks + recent-window cache holds when it evicts everything else: on
    the plan's A2ATS layers `attended` tokens' K/V, plus `native` bytes the model's own caches
    hold on the other layers (`plan_caches.native_bytes`)."""
    geo = model_geometry(model)
    layers = len(plan_for(model).a2ats_layers)
    per_token = 2 * layers * geo.num_kv_heads * geo.head_dim * dtype_bytes
    return (min(attended, tokens) * per_token + native) / tokens


# -- the whole evaluation ----------------------------------------------------------------------


@dataclass
class EvalRun:
    """All methods at one budget."""

    context: int
    decode: int
    budget: float | int
    methods: dict[str, MethodResult]

    def to_dict(self) -> dict[str, Any]:
        return {
            "context": self.context,
            "decode": self.decode,
            "budget": self.budget,
            "rests_on": rests_on(self.decode),
            "methods": {name: r.to_dict() for name, r in self.methods.items()},
        }


def rests_on(tokens: int, texts: int = 1) -> dict[str, Any]:
    """What the figures of a run rest on: `tokens` teacher-forced tokens over `texts` texts
    (ppl and ratios over those tokens; recall, output error and cost averaged over as many
    decode steps and every layer) and how the 95% interval is made."""
    return {
        "tokens": tokens,
        "texts": texts,
        "ci95": f"circular block bootstrap over tokens, blocks of {default_block(tokens // texts)}"
        f" tokens, {RESAMPLES} resamples" + (", stratified by text" if texts > 1 else ""),
    }


def pooled_figures(runs: Sequence[EvalRun]) -> dict[str, dict[str, Any]]:
    """Figures of the same methods and budget over several texts (one EvalRun per text):
    {method: {recall, output_rel_error (means over texts, equal decode steps each), ppl_vs_full
    and its interval (tokens pooled, bootstrap stratified by text), tokens}}."""
    out: dict[str, dict[str, Any]] = {}
    for name in runs[0].methods:
        rows = [run.methods[name] for run in runs]
        pooled: dict[str, Any] = {
            "recall": round(float(np.mean([r.recall for r in rows])), 5),
            "output_rel_error": round(float(np.mean([r.output_rel_error for r in rows])), 5),
            "tokens": int(sum(len(r.nll) for r in rows if r.nll is not None)),
        }
        per_layer = pooled_layer_recall([r.recall_per_layer for r in rows])
        if per_layer is not None:
            pooled["recall_per_layer"] = _rounded(per_layer)
        if "full" in runs[0].methods and all(r.nll is not None for r in rows):
            deltas = [r.nll - run.methods["full"].nll for r, run in zip(rows, runs, strict=True)]
            mean, low, high = block_bootstrap_ci(deltas)
            pooled["ppl_vs_full"] = round(math.exp(mean), 4)
            pooled["ppl_vs_full_ci95"] = [round(math.exp(low), 4), round(math.exp(high), 4)]
        out[name] = pooled
    return out


def pooled_layer_recall(
    per_text: Sequence[list[float | None] | None],
) -> list[float | None] | None:
    """Per layer, the mean over texts of `recall_per_layer` (texts where the layer selected);
    None where no text's layer selected, None altogether when no text has the list."""
    lists = [x for x in per_text if x is not None]
    if not lists:
        return None
    out: list[float | None] = []
    for values in zip(*lists, strict=True):
        seen = [v for v in values if v is not None]
        out.append(float(np.mean(seen)) if seen else None)
    return out


def evaluate(
    model: nn.Module,
    ids: Sequence[int],
    *,
    context: int,
    decode: int,
    budgets: Sequence[float | int],
    codebooks: dict[str, Any],
    config: A2ATSConfig | None = None,
    methods: Sequence[str] = ALL_METHODS,
    progress: Progress | None = None,
    dev_ids: Sequence[int] | None = None,
) -> list[EvalRun]:
    """Evaluate `methods` at each budget on one trajectory (see the module docstring).

    ids: token ids, at least `context + decode + 1`. codebooks: {"a2ats": Codebook, and
    "plain_vq" / "paper" / "no_wrope" / "random" for the ablations that are asked for; without
    "paper", a2ats_paper uses the a2ats codebook}. `config` gives the
    A2ATS settings other than the budget. Returns one EvalRun per budget.

    a2ats_alloc: at each budget, plain a2ats's recall per layer is measured on a development
    span (`dev_ids`, default the `context + decode + 1` tokens of `ids` right after the
    evaluated span: a different slice, as `a2ats eval --tune-paper-b` does) and turned into
    layer budgets (`layer_budgets.allocate_layer_budgets`) before the evaluated span is decoded.
    """
    config = config or A2ATSConfig()
    _check_eval_args(ids, context, decode, methods, budgets)
    allocated = {}
    if "a2ats_alloc" in methods:
        allocated = allocate_on_dev(
            model, ids, dev_ids, context=context, decode=decode, budgets=budgets,
            codebooks=codebooks, config=config, progress=progress,
        )  # fmt: skip
    base = prefill(model, ids[:context], progress)
    inputs, targets = ids[context : context + decode], ids[context + 1 : context + decode + 1]
    dtype_bytes = base[plan_for(model).require().a2ats_layers[0]].keys.dtype.size
    fixed: dict[str, MethodResult] = {}
    reference: np.ndarray | None = None
    reference_nll: np.ndarray | None = None
    total = len([m for m in methods if m in FIXED_METHODS]) + len(budgets) * len(
        [m for m in methods if m not in FIXED_METHODS]
    )
    done = 0

    def run(name: str, cfg: A2ATSConfig, window_budget=None) -> MethodResult:
        nonlocal reference, reference_nll, done
        if progress is not None:
            progress(f"decode {name} (budget {cfg.budget})", done, total)
        spec = method_spec(name, model, cfg, codebooks, window_budget)
        result, argmax = run_method(model, base, spec, inputs, targets)
        if name == "full":
            reference, reference_nll = argmax, result.nll
        if reference is not None:
            result.argmax_agreement = float(np.mean(argmax == reference))
            ratio, low, high = paired_ppl_ratio(result.nll, reference_nll)
            result.ppl_vs_full, result.ppl_vs_full_ci95 = ratio, (low, high)
        done += 1
        return result

    ordered = [m for m in KNOWN_METHODS if m in methods]
    for name in ordered:
        if name in FIXED_METHODS:
            fixed[name] = run(name, config)
    runs = []
    for budget in budgets:
        cfg = replace(config, budget=budget)
        results = dict(fixed)
        for name in ordered:
            if name in FIXED_METHODS:
                continue
            if name == "window":
                a2 = results.get("a2ats") or run("a2ats", cfg)
                retrieved = a2.retrieved_per_head or 0.0
                result = run("window", cfg, window_budget=max(1, round(retrieved)))
                result.bytes_per_token = evicting_window_bytes(
                    model, result.attended_per_head, context + decode, dtype_bytes,
                    native_bytes(model, base),
                )  # fmt: skip
                results[name] = result
            elif name == "a2ats_alloc":
                multipliers, dev_recall = allocated[budget]
                result = run(name, replace(cfg, layer_budgets=multipliers))
                result.dev_recall_per_layer = dev_recall
                results[name] = result
            else:
                results[name] = run(name, cfg)
        runs.append(EvalRun(context, decode, budget, {m: results[m] for m in ordered}))
    if progress is not None:
        progress("done", total, total)
    return runs


def development_span(
    ids: Sequence[int], dev_ids: Sequence[int] | None, context: int, decode: int
) -> list[int]:
    """The `context + decode + 1` development tokens: `dev_ids`' first ones, else those of `ids`
    right after the evaluated span. ValueError (one line) when there are too few."""
    span = context + decode + 1
    dev = list(dev_ids) if dev_ids is not None else list(ids[span:])
    if len(dev) < span:
        where = "the development text" if dev_ids is not None else (
            "the text after the evaluated span"
        )  # fmt: skip
        raise ValueError(
            f"a2ats_alloc: {where} has {len(dev)} tokens, needs {span} (context + decode + 1) "
            "to measure recall per layer; give a longer text or a development text"
        )
    return dev[:span]


def allocate_on_dev(
    model: nn.Module,
    ids: Sequence[int],
    dev_ids: Sequence[int] | None,
    *,
    context: int,
    decode: int,
    budgets: Sequence[float | int],
    codebooks: dict[str, Any],
    config: A2ATSConfig,
    progress: Progress | None = None,
) -> dict[float | int, tuple[tuple[float, ...], list[float | None]]]:
    """{budget: (layer multipliers, plain a2ats's recall per layer on the development span)}:
    one evaluation of plain a2ats (its own layer budgets off) on `development_span`, at every
    budget, each turned into multipliers by `allocate_layer_budgets` (cap at most 1 / budget
    for a fraction: past it a layer is dense and more buys nothing)."""
    dev = development_span(ids, dev_ids, context, decode)
    plain = replace(config, layer_budgets=None)
    runs = evaluate(
        model, dev, context=context, decode=decode, budgets=budgets, codebooks=codebooks,
        config=plain, methods=("a2ats",), progress=progress,
    )  # fmt: skip
    out = {}
    for budget, run in zip(budgets, runs, strict=True):
        recall = run.methods["a2ats"].recall_per_layer
        if recall is None:
            raise ValueError(
                f"a2ats_alloc: plain a2ats never selected on the development span at budget "
                f"{budget} (context {context}: nothing to drop); use a longer context"
            )
        cap = CAP if isinstance(budget, int) else min(CAP, 1.0 / budget)
        out[budget] = (allocate_layer_budgets(recall, cap=max(cap, 1.0)), recall)
    return out


def _check_eval_args(ids, context: int, decode: int, methods, budgets) -> None:
    if context < 1:
        raise ValueError(f"context={context} is out of range: must be >= 1")
    if decode < 1:
        raise ValueError(f"decode={decode} is out of range: must be >= 1")
    if len(ids) < context + decode + 1:
        raise ValueError(
            f"the text has {len(ids)} tokens; context {context} + decode {decode} needs "
            f"{context + decode + 1}"
        )
    unknown = [m for m in methods if m not in KNOWN_METHODS]
    if unknown:
        raise ValueError(f"unknown method(s) {unknown}; known: {', '.join(KNOWN_METHODS)}")
    if not budgets:
        raise ValueError("budgets is empty: give at least one budget")
    for b in budgets:
        A2ATSConfig(budget=b)  # validates


TEXTS = Path(__file__).resolve().parents[2] / "resources" / "texts"
ESSAY = TEXTS / "brackmoor_canal_essay.txt"
ESSAY_DESCRIPTION = (
    "resources/texts/brackmoor_canal_essay.txt (original prose written for this repository; "
    "not in the calibration corpus)"
)
DIALOGUE = TEXTS / "keeper_dialogue.txt"
DIALOGUE_DESCRIPTION = (
    "resources/texts/keeper_dialogue.txt (a two-person dialogue written for this repository; "
    "not in the calibration corpus)"
)


def builtin_texts() -> dict[str, tuple[str, str]]:
    """{name: (text, description)} of the evaluation texts shipped or found offline, none in
    the calibration corpus: "code" (`default_text`), "prose" (resources/texts/
    brackmoor_canal_essay.txt, an expository essay written for this repository, about 6.5K
    tokens), "dialogue" (resources/texts/keeper_dialogue.txt, about 5.7K tokens); both are long
    enough for a 4K context. The haystack of `a2ats bench tasks` (`tasks.default_haystack`) is
    separate and unchanged."""
    essay = (ESSAY.read_text(encoding="utf-8"), ESSAY_DESCRIPTION)
    dialogue = (DIALOGUE.read_text(encoding="utf-8"), DIALOGUE_DESCRIPTION)
    return {"code": default_text(), "prose": essay, "dialogue": dialogue}


def default_text() -> tuple[str, str]:
    """(text, description) of the built-in evaluation text: the source of Python's `http.client`
    module (code and docstrings; not part of the calibration corpus)."""
    import http.client
    import inspect

    return inspect.getsource(
        http.client
    ), "Python stdlib http/client.py (held out from calibration)"
