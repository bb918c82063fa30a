"""Tensor split of a decoder over the ranks of an MLX distributed group (KV heads).

mlx-lm's `shard()` (in the model files that have it: llama, qwen2, qwen3, ...) splits every
layer's attention by heads and its MLP by columns: rank r computes its query and KV heads'
projections, and the output projections end with an `all_sum`, so every rank holds the whole
hidden state after each layer and computes the same logits (and, with one seed, samples the same
token). Every rank serves every layer, each for its own KV heads: its A2ATS caches hold the codes
and K/V of those heads only, and its codebook the rows of those heads
(`codebook.load_rank_codebook(..., heads=...)`). Layer numbers and the layer plan are the
model's; the plan's KV-head counts are this rank's.

Traffic per forward pass: two `all_sum`s of `[B, L, hidden]` per layer (attention output and
MLP output); in a ring of n ranks each rank sends about 2 (n - 1) / n times that many bytes per
all_sum. It does not grow with the context, but it is per layer: much more than the pipeline's
one hidden state per step, so the tensor split wants a fast link (Thunderbolt), and pays
where one rank's compute per layer is the bottleneck.

Not across ranks here: calibration, evaluation and the app's served ranks use the pipeline
split (`pipeline.py`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import mlx.nn as nn

from ..cache.geometry import model_geometry
from ..cache.layer_plan import decoder_layers
from ..errors import ModelNotSupportedError


@dataclass
class TensorStage:
    """This rank's KV heads [head_start, head_end) of `num_kv_heads`, in every layer.

    Answers what a pipeline `Stage` answers where the chat uses it (`owns`, `describe`, the
    traffic counters, `start` / `end` for the stats record)."""

    group: Any
    rank: int
    size: int
    num_layers: int
    head_start: int
    head_end: int
    num_kv_heads: int
    hidden_size: int
    live: bool = True
    sent_bytes: int = 0
    received_bytes: int = 0
    kind: str = "tensor"

    @property
    def owns(self) -> range:
        return range(self.num_layers)

    @property
    def start(self) -> int:
        return 0

    @property
    def end(self) -> int:
        return self.num_layers

    @property
    def heads(self) -> range:
        return range(self.head_start, self.head_end)

    def describe(self) -> str:
        return (
            f"rank {self.rank} of {self.size}: KV heads {self.head_start}-{self.head_end - 1} "
            f"of {self.num_kv_heads} in all {self.num_layers} layers (tensor split)"
        )

    def step_bytes(self, tokens: int = 1, dtype_bytes: int = 4) -> int:
        """Bytes this rank sends in one forward pass of `tokens` tokens (ring all_sums)."""
        per_sum = tokens * self.hidden_size * dtype_bytes * 2 * (self.size - 1) // self.size
        return 2 * self.num_layers * per_sum


def shard_tensor(model: nn.Module, group: Any) -> TensorStage:
    """Split `model` in place by heads over `group` with mlx-lm's `shard()`; this rank's stage.

    ValueError naming the counts when the model's query or KV heads do not divide by the ranks;
    ModelNotSupportedError when its model file has no `shard()`. Call it on a lazily loaded
    model (each rank then evaluates only its slices), then `plan.share_plan` on every rank."""
    geometry = model_geometry(model)
    size, rank = group.size(), group.rank()
    if not callable(getattr(model, "shard", None)):
        raise ModelNotSupportedError(
            f"{geometry.model_type}: mlx-lm's model file has no shard(), so it cannot be split "
            "by heads; use the pipeline split (without --tensor)"
        )
    heads, kv = geometry.num_heads, geometry.num_kv_heads
    if heads % size or kv % size:
        raise ValueError(
            f"{geometry.model_type} has {heads} query and {kv} KV heads: a tensor split over "
            f"{size} ranks needs both to divide by {size}; use the pipeline split (without "
            "--tensor)"
        )
    if size > 1:
        model.shard(group)
    per = kv // size
    hidden = int(getattr(getattr(model, "args", None), "hidden_size", 0) or 0)
    stage = TensorStage(
        group, rank, size, len(decoder_layers(model)), rank * per, (rank + 1) * per, kv, hidden
    )
    model._a2ats_stage = stage  # type: ignore[attr-defined]  (plain attribute: not a weight)
    return stage


__all__ = ["TensorStage", "shard_tensor"]
