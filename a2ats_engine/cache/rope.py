"""RoPE as the model does it: read the spec from the model's own RoPE module, rotate, un-rotate.

mlx-lm rotates queries and keys before the cache sees them (`k^_n = R_n k_n`). A2ATS needs
(a) pre-RoPE keys `k_n = R_(-n) k^_n` to code them position-free, and (b) the windowed-RoPE
retrieval query `R_b q_i = R_(b-i) q^_i`. Both are rotations with the model's own frequencies,
pairing and magnitude scale, so they are exact inverses of what the model applied.

Supported: mlx `nn.RoPE` (default / linear scaling), mlx-lm's Llama3RoPE, YarnRoPE, SuScaledRoPE
(longrope), ProportionalRoPE, DynamicNTKScalingRoPE (exact while the context stays within its
`max_position_embeddings`), partial rotary dims, traditional (interleaved) and half-split pairing.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import asdict, dataclass
from functools import cached_property
from typing import Any

import mlx.core as mx
import mlx.nn as nn

from ..records import ModelGeometry, planning_context


@dataclass(frozen=True)
class RopeSpec:
    """One attention layer's rotary embedding, replayed through the same `mx.fast.rope` call.

    dims:        rotated feature dims (the first `dims` of head_dim; partial rotary if smaller).
    traditional: True = interleaved pairs (x0, x1), (x2, x3)...; False = halves (x_j, x_{j+dims/2}).
    base:        RoPE base when the module passes one to mx.fast.rope (nn.RoPE), else None.
    pos_scale:   position scale passed to mx.fast.rope (linear scaling), 1.0 otherwise.
    freqs:       the module's own frequency array when it passes one (Llama3, Yarn...), else None.
    scale:       magnitude factor the model applies to the rotated dims before rotating.
    head_dim:    full head dim.
    kind:        the module the spec was read from (for messages and fingerprints).
    """

    dims: int
    traditional: bool
    base: float | None = 10000.0
    pos_scale: float = 1.0
    freqs: tuple[float, ...] | None = None
    scale: float = 1.0
    head_dim: int = 0
    kind: str = "RoPE"

    @classmethod
    def from_module(cls, rope: nn.Module, head_dim: int) -> RopeSpec:
        """Read the spec from an mlx / mlx-lm RoPE module. ValueError for unknown variants."""
        kind = type(rope).__name__
        dims = int(getattr(rope, "dims", getattr(rope, "dim", 0)) or 0)
        traditional = bool(getattr(rope, "traditional", False))
        base, pos_scale, freqs, scale = None, 1.0, None, 1.0
        if kind == "RoPE":
            base, pos_scale = float(rope.base), float(rope.scale)
        elif kind == "DynamicNTKScalingRoPE":
            # Its base only changes once the context exceeds max_position_embeddings.
            base = float(rope.base)
        elif kind in ("Llama3RoPE", "YarnRoPE", "ProportionalRoPE", "SuScaledRoPE"):
            freqs = tuple(float(v) for v in rope._freqs.astype(mx.float32).tolist())
            if kind == "YarnRoPE":
                scale = float(rope.mscale)
            elif kind == "SuScaledRoPE":
                scale, traditional = float(rope._scale), False
        else:
            raise ValueError(
                f"unsupported RoPE variant {kind!r}: A2ATS needs to un-rotate keys with the "
                "model's own RoPE (supported: RoPE, Llama3RoPE, YarnRoPE, SuScaledRoPE, "
                "ProportionalRoPE, DynamicNTKScalingRoPE)"
            )
        if dims <= 0 or dims % 2 or dims > head_dim:
            raise ValueError(f"RoPE dims={dims} does not fit head_dim={head_dim}")
        if freqs is not None and len(freqs) != dims // 2:
            raise ValueError(f"RoPE {kind} has {len(freqs)} frequencies for {dims} dims")
        return cls(dims, traditional, base, pos_scale, freqs, scale, head_dim, kind)

    @property
    def inv_freqs(self) -> mx.array:
        """Radians per position for each of the dims/2 pairs, float32 [dims/2]."""
        if self.freqs is not None:
            return 1.0 / mx.array(self.freqs, dtype=mx.float32)
        exps = mx.arange(0, self.dims, 2, dtype=mx.float32) / self.dims
        return self.pos_scale / (mx.array(self.base, mx.float32) ** exps)

    # -- rotation -------------------------------------------------------------------------
    def _raw(self, x: mx.array, offset: int | mx.array) -> mx.array:
        """The model's rotation without magnitude scaling (the very same mx.fast.rope call)."""
        if self.freqs is not None:
            return mx.fast.rope(
                x,
                self.dims,
                traditional=self.traditional,
                base=None,
                scale=1.0,
                offset=offset,
                freqs=self._freqs_array,
            )
        return mx.fast.rope(
            x,
            self.dims,
            traditional=self.traditional,
            base=self.base,
            scale=self.pos_scale,
            offset=offset,
        )

    @cached_property
    def _freqs_array(self) -> mx.array:
        return mx.array(self.freqs, dtype=mx.float32)

    def _conjugator(self, dtype: mx.Dtype) -> mx.array:
        """+1/-1 per feature: -1 on the second component of every rotated pair."""
        cached = self._conj_cache.get(dtype)
        if cached is None:
            cached = self._conj_cache[dtype] = self._make_conjugator(dtype)
        return cached

    @cached_property
    def _conj_cache(self) -> dict:
        return {}

    def _make_conjugator(self, dtype: mx.Dtype) -> mx.array:
        sign = [1.0] * (self.head_dim or self.dims)
        if self.traditional:
            for j in range(1, self.dims, 2):
                sign[j] = -1.0
        else:
            for j in range(self.dims // 2, self.dims):
                sign[j] = -1.0
        return mx.array(sign, dtype=dtype)

    def _scaled(self, x: mx.array, factor: float) -> mx.array:
        if factor == 1.0:
            return x
        if self.dims == x.shape[-1]:
            return x * factor
        return mx.concatenate([x[..., : self.dims] * factor, x[..., self.dims :]], axis=-1)

    def rotate(self, x: mx.array, offset: int | mx.array = 0) -> mx.array:
        """Rotate like the model: row r of the second-to-last axis sits at `offset + r`.

        x: [..., N, head_dim]. `offset` an int or a scalar int array. Same shape and dtype out.
        """
        return self._raw(self._scaled(x, self.scale), offset)

    def unrotate(self, x: mx.array, offset: int | mx.array = 0) -> mx.array:
        """Exact inverse of `rotate` for rows at `offset + r`: post-RoPE back to pre-RoPE.

        A rotation's inverse is the same rotation conjugated by negating each pair's second
        component, so this replays the model's own angles (no re-derived frequencies).
        """
        conj = self._conjugator(x.dtype)
        return self._scaled(conj * self._raw(conj * x, offset), 1.0 / self.scale)

    def shift(self, x: mx.array, delta: int | mx.array) -> mx.array:
        """Rotate every row of already-rotated `x` by the same extra `delta` positions.

        x: [..., N, head_dim] -> same. No magnitude scaling (x is post-RoPE): R_delta x.
        Used for the windowed-RoPE query: shift(q^_i, b - i) = R_b q_i.
        """
        return self._raw(x[..., None, :], delta)[..., 0, :]

    def rotate_at(self, x: mx.array, positions: mx.array) -> mx.array:
        """Rotate row r by `positions[r]` (any ints, negative allowed), scale included.

        x: [..., N, head_dim]; positions: [N] int. Reference cos/sin implementation, used off
        the hot path (calibration, tests).
        """
        x32 = self._scaled(x.astype(mx.float32), self.scale)
        return _rotate_pairs(x32, positions, self).astype(x.dtype)

    def rotation_matrix(self, position: int) -> mx.array:
        """M [head_dim, head_dim] float32 with `q @ M == rotate(q, position)` for pre-RoPE rows q.

        Built once per fixed position (the windowed-RoPE distances): a matmul then replaces a
        RoPE call per distance on the decode hot path. Magnitude scale included.
        """
        eye = mx.eye(self.head_dim or self.dims, dtype=mx.float32)
        positions = mx.full((eye.shape[0],), position, dtype=mx.int32)
        return self.rotate_at(eye, positions)

    # -- description ----------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["freqs"] = list(self.freqs) if self.freqs is not None else None
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RopeSpec:
        data = dict(data)
        if data.get("freqs") is not None:
            data["freqs"] = tuple(data["freqs"])
        return cls(**data)

    def fingerprint(self) -> str:
        """Short stable hash of the spec (floats rounded to 7 significant digits)."""
        inv = [float(f"{v:.6e}") for v in self.inv_freqs.tolist()]
        blob = json.dumps(
            [self.dims, self.traditional, inv, round(self.scale, 6), self.head_dim],
            sort_keys=True,
        )
        return hashlib.sha256(blob.encode()).hexdigest()[:16]


def _rotate_pairs(x: mx.array, positions: mx.array, spec: RopeSpec) -> mx.array:
    """cos/sin rotation of the first spec.dims features; x float32 [..., N, head_dim]."""
    inv = spec.inv_freqs
    angles = positions.astype(mx.float32)[:, None] * inv[None, :]  # [N, dims/2]
    cos, sin = mx.cos(angles), mx.sin(angles)
    rot, rest = x[..., : spec.dims], x[..., spec.dims :]
    if spec.traditional:
        a, b = rot[..., 0::2], rot[..., 1::2]
        ra, rb = a * cos - b * sin, a * sin + b * cos
        rot = mx.stack([ra, rb], axis=-1).reshape(rot.shape)
    else:
        half = spec.dims // 2
        a, b = rot[..., :half], rot[..., half:]
        rot = mx.concatenate([a * cos - b * sin, a * sin + b * cos], axis=-1)
    return mx.concatenate([rot, rest], axis=-1) if rest.shape[-1] else rot


# -- model introspection ----------------------------------------------------------------------


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
    from .layer_plan import A2ATS, plan_for

    try:
        plan = plan_for(model)
    except Exception:  # a model the probe cannot run still reports its first layer
        plan = None
    for choice in plan.layers if plan is not None else ():
        if choice.kind == A2ATS and choice.layer < len(attns) and attns[choice.layer] is not None:
            return attns[choice.layer]
    return next(a for a in attns if a is not None)


def distance_buckets(window: int, context: int, n_buckets: int) -> list[tuple[int, int, float]]:
    """Log-spaced far-distance buckets [(lo, hi, representative distance)], lo inclusive.

    Edges run from `window` to `max(context, 2 * window)`; the representative distance is the
    geometric middle of each bucket. The last bucket is open-ended in use.
    """
    hi_edge = max(context, 2 * window)
    ratio = hi_edge / window
    edges = [round(window * ratio ** (k / n_buckets)) for k in range(n_buckets + 1)]
    out = []
    for k in range(n_buckets):
        lo, hi = edges[k], max(edges[k + 1], edges[k] + 1)
        out.append((lo, hi, math.sqrt(lo * hi)))
    return out


def retrieval_distances(
    window: int, far_offset: int, far_buckets: int, max_context: int | None
) -> list[int]:
    """The far distances retrieval queries are rotated to: [b] for one bucket (the paper),
    else each distance bucket's representative (geometric middle) distance."""
    if far_buckets == 1:
        return [far_offset]
    plan = distance_buckets(window, planning_context(max_context), far_buckets)
    return [round(mid) for _, _, mid in plan]


def bucket_plan(config, max_context: int | None) -> tuple[list[int], tuple[int, ...] | None]:
    """An A2ATSConfig's retrieval distances and the lower edges of its buckets 1..m-1
    (None for the paper's single distance b)."""
    distances = retrieval_distances(
        config.window, config.far_offset, config.far_buckets, max_context
    )
    if config.far_buckets == 1:
        return distances, None
    plan = distance_buckets(config.window, planning_context(max_context), config.far_buckets)
    return distances, tuple(lo for lo, _, _ in plan[1:])
