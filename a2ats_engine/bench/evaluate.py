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
against oracle_topk, run only when asked for). The metric functions live in `eval_metrics.py`,
the records and their summaries (`MethodResult`, `EvalRun`, `pooled_figures`) in
`eval_results.py`, the built-in texts in `eval_texts.py`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
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
from .accounting import cache_step_cost
from .eval_metrics import attention_recall, paired_ppl_ratio, relative_l2_error
from .eval_results import (
    EvalRun,
    MethodResult,
    StepRecord,
    bytes_read_per_step,
    layer_error,
    layer_recall,
)
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
from .plan_caches import feed_prompt, native_bytes, plan_caches, prefix

FIXED_METHODS = method_names(FIXED)  # full, kv8, kv4
BUDGET_METHODS = method_names(BUDGET)  # a2ats, window, oracle_topk and the a2ats ablations
ALL_METHODS = FIXED_METHODS + BUDGET_METHODS
DIAGNOSTIC_METHODS = method_names(DIAGNOSTIC)  # run only when asked for
KNOWN_METHODS = ALL_METHODS + DIAGNOSTIC_METHODS
PREFILL_CHUNK = 256  # fastest on a 2-core CPU (attention cost grows with the chunk)


class OneProcess:
    """Where an evaluation's layers live: here, all of them. A pipeline rank passes its own
    (`distributed/evaluate.py`): its cache slots (peers' layers as `RemoteCache`s), every
    rank's per-layer records joined, and sums over the ranks, so each rank computes the same
    figures as one process."""

    def caches(self, caches: list) -> list:
        return caches

    def feed(self, model: nn.Module, tokens: Sequence[int], caches: list) -> None:
        """One prefill chunk into `caches`: only their state is evaluated (`feed_prompt`)."""
        feed_prompt(model, tokens, caches)

    def records(self, per_slot: list[StepRecord | None]) -> list[StepRecord | None]:
        return per_slot

    def total(self, value: float) -> float:
        return value


ONE_PROCESS = OneProcess()


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


def prefill(
    model: nn.Module,
    ids: Sequence[int],
    progress: Progress | None = None,
    ranks: OneProcess = ONE_PROCESS,
) -> list:
    """Exact prefill of `ids` (chunked) into the model's own fresh caches (mlx-lm's
    `make_prompt_cache`: KVCache on global layers, RotatingKVCache on sliding ones, ...), one
    per cache slot. Every method starts from a copy of it (`plan_caches.plan_caches`)."""
    from mlx_lm.models.cache import make_prompt_cache

    cache = ranks.caches(make_prompt_cache(model))
    for start in range(0, len(ids), PREFILL_CHUNK):
        ranks.feed(model, ids[start : start + PREFILL_CHUNK], cache)
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


def run_method(
    model: nn.Module,
    base: list,
    spec: MethodSpec,
    inputs: Sequence[int],
    targets: Sequence[int],
    ranks: OneProcess = ONE_PROCESS,
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
    per_slot = ranks.records([c.record if isinstance(c, MeasuredCache) else None for c in caches])
    records = [r for r in per_slot if r is not None]
    tokens = context_length(base) + len(inputs)
    retrieved = [x for r in records for x in r.retrieved]
    result = MethodResult(
        name=spec.name,
        recall=float(np.mean([x for r in records for x in r.recall])),
        output_rel_error=float(np.mean([x for r in records for x in r.output_error])),
        ppl=float(np.exp(np.mean(nll))),
        bytes_per_token=ranks.total(sum(getattr(c, "inner", c).nbytes for c in caches)) / tokens,
        attended_per_head=float(np.mean([x for r in records for x in r.attended])),
        retrieved_per_head=float(np.mean(retrieved)) if retrieved else None,
        seconds=seconds,
        nll=np.asarray(nll),
        attended_fraction=float(np.mean([c.attended_fraction for r in records for c in r.cost])),
        bytes_read=bytes_read_per_step(records),
        recall_per_layer=layer_recall(per_slot),
        error_per_layer=layer_error(per_slot),
        estimate_kept=_estimate_kept(caches),
        layer_budgets=None if spec.config is None else spec.config.layer_budgets,
    )
    return result, np.asarray(argmax)


def _estimate_kept(caches: list) -> tuple[int, ...] | None:
    """The layers that kept the missed-attention estimate where it ran on the layers that miss
    most (`estimate_layers.EstimateLayers`), None elsewhere."""
    for c in caches:
        choice = getattr(getattr(c, "inner", c), "estimate_choice", None)
        if choice is not None:
            return choice.chosen
    return None


def context_length(base: list) -> int:
    """Tokens the prefill `base` holds: the offset of its first attention cache (a rotating
    cache's offset counts every token, not the ones its window keeps)."""
    return int(next(c.offset for c in base if hasattr(c, "offset")))


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
    ranks: OneProcess = ONE_PROCESS,
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
    base = prefill(model, ids[:context], progress, ranks)
    inputs, targets = ids[context : context + decode], ids[context + 1 : context + decode + 1]
    held = [base[i] for i in plan_for(model).require().a2ats_layers if hasattr(base[i], "keys")]
    found = ranks.total(1 if held else 0)  # ranks holding an A2ATS layer (here: 1)
    dtype_bytes = int(ranks.total(held[0].keys.dtype.size if held else 0) // max(found, 1))
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
        result, argmax = run_method(model, base, spec, inputs, targets, ranks)
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
                    ranks.total(native_bytes(model, base)),
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
