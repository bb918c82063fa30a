"""Pipeline split of a decoder over the ranks of an MLX distributed group.

mlx-lm's convention (`mlx_lm.models.pipeline.PipelineMixin`): the layers are split into
contiguous runs, rank 0 serving the LAST layers and rank n-1 the first. Rank r runs its own layers
on the hidden state it receives from rank r+1, sends the result to rank r-1, and every rank takes
rank 0's final hidden state with one `all_gather`, so all ranks compute the same logits and sample
the same token (with the same seed), keeping their caches in step.

Not every mlx-lm model file has `pipeline()` (llama, which the demo model uses, has only
`shard()`), and those that do index their caches by their own layers only. So the split is done
here, the same way for every model whose decoder loops `for layer, c in zip(self.layers, cache)`:
the model keeps one slot per layer, each layer another rank serves becomes a `RemoteLayer`
(no weights; it passes the hidden state through, and does the receive / send / gather at the
edges of this rank's run), and its cache slot becomes a `RemoteCache` (no K/V: it only counts the
tokens, so masks and `trim` behave as on one process). Layer numbers stay the model's, so the
layer plan, the codebook (indexed by model layer) and `make_cache` are used as they are: each
rank's A2ATS caches cover its own layers and nothing else.

Traffic per forward pass, counted when the graph is built (shapes only, no host sync):
rank r < n-1 receives one hidden state [B, L, hidden], rank r > 0 sends one, and every rank
sends its [B, L, hidden] part (n-1) times in the ring all_gather. `Stage.sent_bytes` /
`Stage.received_bytes` add them up.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models.cache import _BaseCache, create_attention_mask

from ..cache.layer_plan import decoder_layers
from ..errors import ModelNotSupportedError


@dataclass
class Stage:
    """This rank's run of layers [start, end) of `num_layers`, and its traffic counters.

    live: communication on (False while the layer plan probes the rank's layers locally).
    """

    group: Any
    rank: int
    size: int
    start: int
    end: int
    num_layers: int
    live: bool = True
    sent_bytes: int = 0
    received_bytes: int = 0
    hidden_bytes: list[int] = field(default_factory=list)

    @property
    def owns(self) -> range:
        return range(self.start, self.end)

    def describe(self) -> str:
        return (
            f"rank {self.rank} of {self.size}: layers {self.start}-{self.end - 1} "
            f"of {self.num_layers}"
        )


def split_layers(num_layers: int, size: int, split: list[int] | None = None) -> list[int]:
    """Layers per rank (rank 0 first): the given split, or even with the extra ones on low ranks.

    Raises ValueError naming the split when it does not cover the layers with positive runs."""
    if size < 1:
        raise ValueError(f"group size must be >= 1, got {size}")
    if split is None:
        base, extra = divmod(num_layers, size)
        split = [base + (1 if r < extra else 0) for r in range(size)]
    split = [int(s) for s in split]
    if len(split) != size or any(s <= 0 for s in split) or sum(split) != num_layers:
        raise ValueError(
            f"split={split}: needs {size} positive layer counts (one per rank, rank 0 first) "
            f"summing to the model's {num_layers} layers"
        )
    return split


def stage_for(group: Any, num_layers: int, split: list[int] | None = None) -> Stage:
    """This rank's Stage: rank r serves the layers after those of ranks r+1 ... n-1."""
    rank, size = group.rank(), group.size()
    counts = split_layers(num_layers, size, split)
    start = sum(counts[rank + 1 :])
    return Stage(group, rank, size, start, start + counts[rank], num_layers)


def _layer_owner(model: nn.Module) -> Any:
    """The module whose `layers` list the decoder loops over."""
    for owner in (getattr(model, "model", None), getattr(model, "language_model", None), model):
        if owner is not None and isinstance(getattr(owner, "layers", None), list):
            return owner
    raise ModelNotSupportedError(f"{type(model).__module__}: no decoder `layers` list to split")


def shard_pipeline(model: nn.Module, group: Any, split: list[int] | None = None) -> Stage:
    """Split `model` in place over `group`; return this rank's Stage.

    Layers other ranks serve become `RemoteLayer`s (their weights are dropped: call this before
    the weights are evaluated, i.e. on a lazily loaded model, and each rank reads only its own);
    rank 0's last layer gathers the final hidden state. Then call `plan.share_plan` (every rank)
    before making caches. With a group of one the model is left as it is."""
    owner = _layer_owner(model)
    layers = owner.layers
    if any(isinstance(layer, RemoteLayer) for layer in layers):
        raise ValueError("the model is already split over ranks")
    stage = stage_for(group, len(layers), split)
    if stage.size == 1:
        return stage
    for i, layer in enumerate(layers):
        if i in stage.owns:
            if i == stage.num_layers - 1:
                _make_gathering(layer, stage)
        else:
            layers[i] = RemoteLayer(layer, i, stage)
    model._a2ats_stage = stage  # type: ignore[attr-defined]  (plain attribute: not a weight)
    return stage


def stage_of(model: nn.Module) -> Stage | None:
    """The Stage `shard_pipeline` gave the model, None for a model on one process."""
    return getattr(model, "_a2ats_stage", None)


# -- communication --------------------------------------------------------------------------


def _nbytes(h: mx.array) -> int:
    return int(h.size) * h.dtype.size


def _receive(h: mx.array, stage: Stage) -> mx.array:
    """The hidden state from rank+1 (shaped like `h`)."""
    stage.received_bytes += _nbytes(h)
    return mx.distributed.recv_like(h, stage.rank + 1, group=stage.group)


def _send(h: mx.array, stage: Stage) -> mx.array:
    stage.sent_bytes += _nbytes(h)
    return mx.distributed.send(h, stage.rank - 1, group=stage.group)


def _gather(h: mx.array, stage: Stage) -> mx.array:
    """Rank 0's final hidden state on every rank (ring all_gather: (n-1) parts out and in)."""
    stage.sent_bytes += (stage.size - 1) * _nbytes(h)
    stage.received_bytes += (stage.size - 1) * _nbytes(h)
    return mx.distributed.all_gather(h, group=stage.group)[: h.shape[0]]


class RemoteLayer(nn.Module):
    """Stands in for a decoder layer another rank serves: no weights, passes `x` through.

    Keeps the replaced layer's plain attributes (`use_sliding`, ...), which model files read.
    At the edges of this rank's run it receives (the layer just before `start`), sends (the layer
    at `end`) and gathers (the model's last layer)."""

    def __init__(self, layer: nn.Module, index: int, stage: Stage) -> None:
        super().__init__()
        for key, value in vars(layer).items():
            if not key.startswith("_"):
                object.__setattr__(self, key, value)
        object.__setattr__(self, "_stage", stage)
        self.index = index
        name, attn = _attention(layer)
        if attn is not None:  # the layer plan and the codebook read geometry and RoPE from it
            setattr(self, name, RemoteAttention(attn))

    def __call__(self, x: mx.array, *args, **kwargs) -> mx.array:
        stage = self._stage
        # model files pass the cache by keyword (llama) or by position (qwen3: layer(h, mask, c))
        cache = kwargs.get("cache")
        if cache is None:
            cache = next((a for a in args if isinstance(a, RemoteCache)), None)
        if isinstance(cache, RemoteCache):
            cache.offset += x.shape[1]
        if not stage.live:
            return x
        if self.index == stage.start - 1:
            x = _receive(x, stage)
        if self.index == stage.end and stage.rank > 0:
            x = _send(x, stage)
        if isinstance(cache, RemoteCache):
            cache.pending = x  # evaluated with the caches' state (prefill chunks)
        if self.index == stage.num_layers - 1:
            x = _gather(x, stage)
        return x


class RemoteAttention(nn.Module):
    """What is left of another rank's attention module: its head counts, head_dim and RoPE
    module (no projection weights). `rope_spec_of` and `model_geometry` read these."""

    def __init__(self, attn: nn.Module) -> None:
        super().__init__()
        for key, value in vars(attn).items():
            if not key.startswith("_") and isinstance(value, int | float | bool | str):
                object.__setattr__(self, key, value)
        if hasattr(attn, "rope"):
            from ..cache.geometry import _head_dim

            self.head_dim = _head_dim(attn)
            self.rope = attn.rope


def _attention(layer: nn.Module) -> tuple[str, nn.Module | None]:
    for name in ("self_attn", "attention", "attn"):
        attn = getattr(layer, name, None)
        if attn is not None:
            return name, attn
    return "", None


def _make_gathering(layer: nn.Module, stage: Stage) -> None:
    """Rank 0's last layer: its output is gathered to every rank (class swapped in place, so the
    layer keeps its weights, attributes and place in the parameter tree)."""
    base = type(layer)

    def __call__(self, x, *args, **kwargs):
        out = base.__call__(self, x, *args, **kwargs)
        if not isinstance(out, mx.array):
            raise ModelNotSupportedError(
                f"{base.__name__} returns {type(out).__name__}, not the hidden state: "
                "the pipeline split needs layers that return one array"
            )
        return _gather(out, stage) if stage.live else out

    layer.__class__ = type(f"Gathering{base.__name__}", (base,), {"__call__": __call__})


# -- caches ---------------------------------------------------------------------------------


class RemoteCache(_BaseCache):
    """The cache slot of a layer another rank serves: holds no K/V, only the token count.

    `state` hands out the hidden state the layer last passed on (once), so mlx-lm's prefill,
    which evaluates only the caches' state, also runs this rank's send / receive. `remote`
    tells the evaluation's `plan_caches` to pass it through (a peer measures that layer)."""

    remote = True

    def __init__(self) -> None:
        self.offset = 0
        self.pending: mx.array | None = None

    def make_mask(self, *args, **kwargs):
        return create_attention_mask(*args, offset=self.offset, **kwargs)

    def size(self) -> int:
        return self.offset

    def empty(self) -> bool:
        return self.offset == 0

    def is_trimmable(self) -> bool:
        return True

    def trim(self, n: int) -> int:
        n = min(self.offset, n)
        self.offset -= n
        return n

    @property
    def state(self):
        pending, self.pending = self.pending, None
        return [] if pending is None else [pending]

    @state.setter
    def state(self, arrays) -> None:
        self.pending = None

    @property
    def nbytes(self) -> int:
        return 0


def pipeline_caches(caches: list, stage: Stage | None) -> list:
    """`caches` (one per model layer) with a `RemoteCache` in every slot this rank does not serve
    (the caches built there hold nothing yet and are dropped)."""
    if stage is None or stage.size == 1:
        return caches
    if len(caches) != stage.num_layers:
        raise ModelNotSupportedError(
            f"{len(caches)} cache slots for {stage.num_layers} layers: the pipeline split needs "
            "one cache per decoder layer"
        )
    return [c if i in stage.owns else RemoteCache() for i, c in enumerate(caches)]


def pipeline_factory(factory, stage: Stage | None):
    """A cache factory (model -> cache list) whose lists hold `RemoteCache`s for other ranks
    (a tensor split's rank serves every layer: the factory as it is)."""
    if stage is None or stage.size == 1 or getattr(stage, "kind", "") == "tensor":
        return factory

    def make(model: nn.Module) -> list:
        return pipeline_caches(factory(model), stage)

    for name in ("a2ats_config", "codebook"):
        if hasattr(factory, name):
            setattr(make, name, getattr(factory, name))
    return make


def owned_layers(model: nn.Module) -> list[int]:
    """Model layer numbers this process serves (all of them on one process)."""
    stage = stage_of(model)
    if stage is None:
        return list(range(len(decoder_layers(model))))
    return list(stage.owns)


__all__ = [
    "Stage",
    "RemoteLayer",
    "RemoteCache",
    "split_layers",
    "stage_for",
    "shard_pipeline",
    "stage_of",
    "pipeline_caches",
    "pipeline_factory",
    "owned_layers",
]
