"""A model's attention geometry: its attention modules, heads, head dim and RoPE per layer.

`model_geometry` reads the shape the codebook follows from the first layer the layer plan
serves with A2ATS (`layer_plan.py`), so this module sits above both `rope.py` and the plan.
"""

from __future__ import annotations

import mlx.nn as nn

from ..records import ModelGeometry
from .layer_plan import A2ATS, plan_for
from .rope import RopeSpec


def _layers(model: nn.Module) -> list[nn.Module]:
    layers = getattr(model, "layers", None)
    if layers is None and hasattr(model, "model"):
        layers = getattr(model.model, "layers", None)
    if layers is None:
        raise ValueError(f"model {type(model).__module__} has no `layers`: not a decoder LM")
    return list(layers)


def attention_modules(model: nn.Module) -> list[nn.Module | None]:
    """The attention module of every layer (an object with `.rope`, `n_heads`, `n_kv_heads`).

    None for a layer without one (linear attention / SSM / conv layers of a hybrid model);
    ValueError when no layer has one."""
    out = []
    for layer in _layers(model):
        attn = None
        for name in ("self_attn", "attention", "attn"):
            attn = getattr(layer, name, None)
            if attn is not None:
                break
        out.append(attn if attn is not None and hasattr(attn, "rope") else None)
    if all(a is None for a in out):
        raise ValueError(
            f"{type(model).__module__} has no RoPE attention module; "
            "A2ATS supports RoPE attention models only"
        )
    return out


def _count(attn: nn.Module, *names: str) -> int:
    """The first of `names` the attention module has (mlx-lm files name head counts variously)."""
    for name in names:
        value = getattr(attn, name, None)
        if value:
            return int(value)
    raise ValueError(f"{type(attn).__name__} has none of {names}")


def _head_dim(attn: nn.Module) -> int:
    hd = getattr(attn, "head_dim", None)
    if hd:
        return int(hd)
    if not hasattr(attn, "k_proj"):
        return 0
    n_kv = _count(attn, "n_kv_heads", "num_key_value_heads", "num_kv_heads")
    return int(attn.k_proj.weight.shape[0] // n_kv)


def rope_specs(model: nn.Module) -> list[RopeSpec | None]:
    """One RopeSpec per layer (None for a layer without RoPE attention)."""
    return [
        RopeSpec.from_module(a.rope, _head_dim(a)) if a is not None else None
        for a in attention_modules(model)
    ]


def model_geometry(model: nn.Module) -> ModelGeometry:
    """The model's attention shape: layers, heads, head_dim, layer 0's RoPE, max context.

    ValueError when layer 0's RoPE is a variant A2ATS cannot replay."""
    attns = attention_modules(model)
    a0 = _reference_attention(model, attns)
    args = getattr(model, "args", None)
    max_ctx = getattr(args, "max_position_embeddings", None) if args is not None else None
    return ModelGeometry(
        model_type=str(getattr(args, "model_type", type(model).__module__.rsplit(".", 1)[-1])),
        num_layers=len(attns),
        num_heads=_count(a0, "n_heads", "num_attention_heads", "num_heads"),
        num_kv_heads=_count(a0, "n_kv_heads", "num_key_value_heads", "num_kv_heads"),
        head_dim=_head_dim(a0),
        rope=RopeSpec.from_module(a0.rope, _head_dim(a0)).to_dict(),
        max_context=int(max_ctx) if max_ctx else None,
    )


def _reference_attention(model: nn.Module, attns: list[nn.Module | None]) -> nn.Module:
    """The attention module whose geometry the codebook follows: the first layer the layer plan
    serves with A2ATS (sliding or NoPE layers may differ), else the first attention module."""
    try:
        plan = plan_for(model)
    except Exception:  # a model the probe cannot run still reports its first layer
        plan = None
    for choice in plan.layers if plan is not None else ():
        if choice.kind == A2ATS and choice.layer < len(attns) and attns[choice.layer] is not None:
            return attns[choice.layer]
    return next(a for a in attns if a is not None)
