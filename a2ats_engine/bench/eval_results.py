"""The records of an evaluation (`evaluate.py`) and their summaries: what a measured layer
recorded per decode step (`StepRecord`), one method's figures (`MethodResult`), all methods at
one budget (`EvalRun`), recall per layer, bytes read per step, what a run rests on, and figures
pooled over several texts."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .accounting import StepCost
from .stats import RESAMPLES, block_bootstrap_ci, default_block


@dataclass
class StepRecord:
    """What a MeasuredCache recorded over the decode steps of one layer."""

    recall: list[float] = field(default_factory=list)
    output_error: list[float] = field(default_factory=list)
    attended: list[float] = field(default_factory=list)  # attended positions per KV head
    retrieved: list[float] = field(default_factory=list)  # far tokens attended per KV head
    retrieval: list[bool] = field(default_factory=list)  # the step selected (was not exact)
    cost: list[StepCost] = field(default_factory=list)  # attended share and bytes read


@dataclass
class MethodResult:
    """One method's figures on the trajectory (see `evaluate.py`'s module docstring)."""

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
    error_per_layer: list[float | None] | None = None  # output rel. error, as recall_per_layer
    estimate_kept: tuple[int, ...] | None = None  # the layers that kept the estimate, if chosen

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
        if self.error_per_layer is not None:
            out["output_error_per_layer"] = _rounded(self.error_per_layer)
        if self.estimate_kept is not None:
            out["estimate_layers"] = list(self.estimate_kept)
        return out


def _rounded(values: Sequence[float | None]) -> list[float | None]:
    return [None if v is None else round(v, 5) for v in values]


def layer_recall(records: Sequence[StepRecord | None]) -> list[float | None] | None:
    """Per layer (one StepRecord each, None for a native layer the plan does not serve with
    A2ATS), the mean recall over its decode steps; None for a native layer and for a layer
    none of whose steps selected (all exact: a dense layer, a context with nothing to drop),
    and None altogether when no layer selected (full, kv8, kv4: recall 1 by construction).

    Every layer records one recall per step, exact steps as 1, so the overall `recall` is the
    mean of this list with None read as the recall that layer recorded (1)."""
    return _per_layer(records, "recall")


def layer_error(records: Sequence[StepRecord | None]) -> list[float | None] | None:
    """Per layer, the mean output rel. error over its decode steps (as `layer_recall`)."""
    return _per_layer(records, "output_error")


def _per_layer(records: Sequence[StepRecord | None], field: str) -> list[float | None] | None:
    if not any(r is not None and any(r.retrieval) for r in records):
        return None
    return [
        float(np.mean(getattr(r, field))) if r is not None and any(r.retrieval) else None
        for r in records
    ]


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
        errors = pooled_layer_recall([r.error_per_layer for r in rows])
        if errors is not None:
            pooled["output_error_per_layer"] = _rounded(errors)
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
