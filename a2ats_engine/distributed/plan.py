"""One layer plan for a model split over ranks: each rank probes its own layers, ranks join.

The probe (`cache/layer_plan.py`) runs the model; on a rank of a pipeline split the other ranks'
layers are `RemoteLayer`s that store no keys, so a rank can decide only its own layers. Each
choice is taken from the rank that serves the layer, and the joined plan is what every rank's
`make_cache` and codebook check see: the same plan as on one process.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from ..cache.layer_plan import A2ATS, LayerChoice, LayerPlan, plan_for, remember_plan
from .group import gather_json
from .pipeline import Stage


def join_plans(stage_rows: list[dict], num_layers: int) -> LayerPlan:
    """The joined plan from every rank's record (`local_record`), indexed by rank."""
    first = stage_rows[0]
    choices: dict[int, LayerChoice] = {}
    refusals = []
    for row in stage_rows:
        for c in row["choices"]:
            choices[int(c["layer"])] = LayerChoice(**c)
        if row["unrouted"]:
            refusals.append(row["refused"])
    missing = [r["refused"] for r in stage_rows if r["refused"] and not r["choices"]]
    if missing or len(choices) != num_layers:  # a rank's probe could not run its layers
        reason = missing[0] if missing else "a rank did not report its layers"
        return LayerPlan(first["model_type"], (), reason)
    layers = tuple(choices[i] for i in sorted(choices))
    refused = refusals[0] if refusals else None
    if refused is None and not any(c.kind == A2ATS for c in layers):
        refused = next((r["refused"] for r in stage_rows if r["refused"]), None) or (
            "no layer is global RoPE attention A2ATS can serve"
        )
    return LayerPlan(first["model_type"], layers, refused, int(first["shared_layers"]))


def local_record(plan: LayerPlan, stage: Stage) -> dict:
    """This rank's part of the plan: the choices of the layers it serves."""
    refused = plan.refused or ""
    return {
        "model_type": plan.model_type,
        "choices": [asdict(c) for c in plan.layers if c.layer in stage.owns],
        "refused": refused,
        "unrouted": refused.startswith("attention is computed by hand"),
        "shared_layers": plan.shared_layers,
    }


def share_plan(model: Any, stage: Stage) -> LayerPlan:
    """Probe this rank's layers, join every rank's choices, and make the joined plan the model's
    (collective: every rank calls it once, after `shard_pipeline`)."""
    if stage.size == 1 or getattr(stage, "kind", "") == "tensor":
        return plan_for(model)  # tensor split: every rank runs every layer (its own heads)
    stage.live = False
    try:
        local = plan_for(model)
    finally:
        stage.live = True
    rows = gather_json(local_record(local, stage), stage.group)
    plan = join_plans(rows, stage.num_layers)
    remember_plan(model, plan)
    return plan


__all__ = ["share_plan", "join_plans", "local_record"]
