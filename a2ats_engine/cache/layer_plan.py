"""Which layers get an A2ATS cache: a per-layer plan, decided once per model.

A layer gets an A2ATS cache (`a2ats`) only when it is global attention whose keys are rotated by
a RoPE the cache can invert, and whose attention call provably reaches the cache's `attend`
through the hook in `hooks.py`. Every other layer keeps the model's own cache (`native`) with a
reason: a sliding window (the model's `RotatingKVCache`), linear attention / SSM / convolution
state, NoPE (keys carry no rotation), latent attention (MLA). A model is refused, with one line
naming the architecture and the reason, when no layer can use A2ATS or when some attention layer
computes attention by hand (the hook cannot route it: decode would silently run full attention).

The decision is a probe, not a list of model names. The model runs one token twice, at cache
offsets 0 and P, with a probe cache on every KV layer whose `attend` returns zeros (so the
residual stream, hence every layer's pre-RoPE key, is the same in both runs):
- a layer whose cache saw keys but whose `attend` was never called computes attention by hand;
- a layer whose keys are equal at 0 and P carries no rotation (NoPE);
- a layer whose keys at P, un-rotated with the RopeSpec read from its `.rope`, equal its keys at
  0 un-rotated, is RoPE attention A2ATS reproduces exactly (the spec is verified, not assumed).

`LayerPlan` and `LayerChoice` are plain records: the app can show them as they are.
"""

from __future__ import annotations

import weakref
from collections import Counter
from dataclasses import dataclass
from typing import Any

from ..errors import ModelNotSupportedError
from .rope import RopeSpec

A2ATS = "a2ats"
NATIVE = "native"
NOPE = "NoPE (keys carry no rotation)"
LATENT = "latent attention (MLA): keys are a compressed latent"
PROBE_OFFSET = 37  # the second probe position (any offset > 0 with distinct angles works)
_ATTENTION_NAMES = ("self_attn", "attention", "attn")


# native cache class -> why the layer keeps it (KV caches are decided by the probe instead)
_STATE_REASONS = {
    "ArraysCache": "linear attention / SSM / conv state (ArraysCache)",
    "MambaCache": "SSM state (MambaCache)",
    "ChunkedKVCache": "chunked attention (ChunkedKVCache)",
    "CacheList": "several caches in one layer (CacheList)",
}


@dataclass(frozen=True)
class LayerChoice:
    """One cache slot of a model: A2ATS or the model's own cache (with the reason).

    head_dim / n_kv_heads: the layer's key geometry (0 when not attention).
    """

    layer: int
    kind: str
    reason: str = ""
    head_dim: int = 0
    n_kv_heads: int = 0


@dataclass(frozen=True)
class LayerPlan:
    """Every cache slot's choice, and the reason the model is refused (None when it is not).

    shared_layers: decoder layers without a cache slot of their own (Gemma 4 reuses earlier
    layers' K/V in its last layers); they attend with the model's own attention.
    """

    model_type: str
    layers: tuple[LayerChoice, ...]
    refused: str | None = None
    shared_layers: int = 0

    @property
    def a2ats_layers(self) -> tuple[int, ...]:
        return tuple(c.layer for c in self.layers if c.kind == A2ATS)

    @property
    def num_layers(self) -> int:
        return len(self.layers)

    def summary(self) -> str:
        """'A2ATS on 4 of 26 layers' (or the refusal). Every decoder layer counts, the KV-shared
        ones too (they attend exactly over an earlier layer's K/V, never through A2ATS)."""
        if self.refused:
            return f"not supported: {self.refused}"
        total = self.num_layers + self.shared_layers
        return f"A2ATS on {len(self.a2ats_layers)} of {total} layers"

    def native_reasons(self) -> dict[str, int]:
        """Native reason -> number of layers, in first-seen order."""
        return dict(Counter(c.reason for c in self.layers if c.kind == NATIVE))

    def describe(self) -> list[str]:
        """Human lines: the summary, then one line per native reason with its layer count."""
        lines = [f"{self.model_type}: {self.summary()}"]
        if self.a2ats_layers and not self.refused:
            lines.append(f"  a2ats   {len(self.a2ats_layers):3d}  global RoPE attention")
        for reason, count in self.native_reasons().items():
            lines.append(f"  native  {count:3d}  {reason}")
        if self.shared_layers:
            lines.append(
                f"  shared  {self.shared_layers:3d}  reuse an earlier layer's K/V "
                "(exact attention over it)"
            )
        return lines

    def require(self) -> LayerPlan:
        """Self, or ModelNotSupportedError with the one-line reason."""
        if self.refused:
            raise ModelNotSupportedError(f"{self.model_type}: {self.refused}")
        return self


# -- the decision ---------------------------------------------------------------------------

_plans: dict[int, tuple[weakref.ref, LayerPlan]] = {}


def plan_for(model: Any) -> LayerPlan:
    """The model's plan, decided once per model object (probed on first use)."""
    key = id(model)
    hit = _plans.get(key)
    if hit is not None and hit[0]() is model:
        return hit[1]
    plan = decide(model)
    _plans[key] = (weakref.ref(model), plan)
    return plan


def remember_plan(model: Any, plan: LayerPlan) -> None:
    """Use `plan` for `model` from now on: a plan decided elsewhere (the ranks of a pipeline
    split each probe their own layers; `distributed/plan.py` joins them)."""
    _plans[id(model)] = (weakref.ref(model), plan)


def model_type(model: Any) -> str:
    args = getattr(model, "args", None)
    return str(getattr(args, "model_type", None) or type(model).__module__.rsplit(".", 1)[-1])


def native_caches(model: Any) -> list:
    """The caches the model would use on its own (mlx-lm's `make_prompt_cache`)."""
    from mlx_lm.models.cache import make_prompt_cache

    return make_prompt_cache(model)


def decoder_layers(model: Any) -> list:
    for owner in (model, getattr(model, "model", None), getattr(model, "language_model", None)):
        layers = getattr(owner, "layers", None) if owner is not None else None
        if layers is not None:
            return list(layers)
    inner = getattr(getattr(model, "language_model", None), "model", None)
    return list(getattr(inner, "layers", []) or [])


def attention_of(layer: Any) -> Any | None:
    """The layer's attention module (an object with `.rope` or MLA projections), or None."""
    for name in _ATTENTION_NAMES:
        attn = getattr(layer, name, None)
        if attn is not None:
            return attn
    return None


def rope_spec_of(model: Any, choice: LayerChoice):
    """RopeSpec of a layer the plan marks `a2ats` (read from its `.rope`, verified by the probe)."""
    attn = attention_of(decoder_layers(model)[choice.layer])
    return RopeSpec.from_module(attn.rope, choice.head_dim)


def decide(model: Any) -> LayerPlan:
    """Probe the model and decide every cache slot (see the module docstring)."""
    name = model_type(model)
    natives = native_caches(model)
    kv_slots = [i for i, c in enumerate(natives) if _is_kv_cache(c)]
    try:
        runs = [_probe(model, kv_slots, offset) for offset in (0, PROBE_OFFSET)]
    except Exception as exc:  # an architecture the probe cannot drive: refuse it, by name
        detail = str(exc).strip().splitlines()[0][:160] if str(exc).strip() else ""
        reason = f"the layer-plan probe could not run it ({type(exc).__name__}: {detail})"
        return LayerPlan(name, (), reason)
    layers = decoder_layers(model)
    choices, unrouted = [], []
    for i, native in enumerate(natives):
        first, second = runs[0].get(i), runs[1].get(i)
        if first is not None and first.keys is not None and not first.attended:
            unrouted.append(i)
        attn = attention_of(layers[i]) if i < len(layers) else None
        choices.append(_choose(i, native, attn, first, second))
    refused = None
    if unrouted:
        refused = (
            f"attention is computed by hand in the model file (layers {_span(unrouted)}), not "
            "through mlx-lm's scaled_dot_product_attention, so A2ATS cannot route it"
        )
    elif not any(c.kind == A2ATS for c in choices):
        reasons = "; ".join(f"{r} on {n}" for r, n in Counter(c.reason for c in choices).items())
        refused = f"no layer is global RoPE attention A2ATS can serve ({reasons})"
    shared = max(len(layers) - len(natives), 0)
    return LayerPlan(name, tuple(choices), refused, shared)


def _span(indices: list[int]) -> str:
    return ", ".join(str(i) for i in indices[:6]) + (", ..." if len(indices) > 6 else "")


def _is_kv_cache(cache: Any) -> bool:
    return type(cache).__name__ in ("KVCache", "RotatingKVCache", "QuantizedKVCache")


def _choose(i: int, native, attn, first, second) -> LayerChoice:
    """One cache slot's choice from its native cache, attention module and two probes."""
    import mlx.core as mx

    kind = type(native).__name__
    if kind == "RotatingKVCache":
        hd, n_kv = _key_shape(first)
        return LayerChoice(i, NATIVE, f"sliding window {native.max_size}", hd, n_kv)
    if not _is_kv_cache(native):
        return LayerChoice(i, NATIVE, _STATE_REASONS.get(kind, f"the model's own {kind}"))
    if attn is not None and hasattr(attn, "kv_lora_rank"):
        return LayerChoice(i, NATIVE, LATENT)
    if first is None or first.keys is None:
        return LayerChoice(i, NATIVE, "does not store keys in its cache")
    k0, kp = first.keys.astype(mx.float32), second.keys.astype(mx.float32)
    hd, n_kv = int(k0.shape[-1]), int(k0.shape[1])
    if bool(mx.array_equal(k0, kp)):
        return LayerChoice(i, NATIVE, NOPE, hd, n_kv)
    rope = getattr(attn, "rope", None) if attn is not None else None
    if rope is None:
        return LayerChoice(i, NATIVE, "keys are rotated by no RoPE module A2ATS can read", hd, n_kv)
    try:
        spec = RopeSpec.from_module(rope, hd)
    except ValueError:
        return LayerChoice(i, NATIVE, f"RoPE variant {type(rope).__name__} is not supported")
    pre0, pre_p = spec.unrotate(k0, 0), spec.unrotate(kp, PROBE_OFFSET)
    err = float(mx.abs(pre0 - pre_p).max()) / max(float(mx.abs(pre0).max()), 1e-6)
    if err > 0.05:
        return LayerChoice(
            i, NATIVE, "keys are not rotated the way its .rope says (not invertible)", hd, n_kv
        )
    return LayerChoice(i, A2ATS, "", hd, n_kv)


def _key_shape(probe) -> tuple[int, int]:
    """(head_dim, n_kv_heads) of the keys a probe saw, (0, 0) when it saw none."""
    if probe is None or probe.keys is None:
        return 0, 0
    return int(probe.keys.shape[-1]), int(probe.keys.shape[1])


class _ProbeCache:
    """Stands in for a KV cache for one token: records the keys, answers attention with zeros."""

    def __init__(self, offset: int) -> None:
        self.offset = offset
        self.keys = None
        self.attended = False

    def update_and_fetch(self, keys, values):
        self.keys = keys
        return keys, values

    def attend(self, queries, keys, values, *, scale: float, mask=None, **kwargs):
        """Zeros shaped like the attention output [B, n_q, L, d_v]: position-free residuals."""
        import mlx.core as mx

        self.attended = True
        return mx.zeros((*queries.shape[:-1], values.shape[-1]), dtype=queries.dtype)

    def make_mask(self, N: int, return_array: bool = False, window_size=None):
        return None

    def empty(self) -> bool:
        return self.keys is None

    def is_trimmable(self) -> bool:
        return False

    @property
    def state(self):
        return []


def _probe(model: Any, kv_slots: list[int], offset: int) -> dict[int, _ProbeCache]:
    """Run one token at `offset` with probe caches on `kv_slots`; fresh native caches elsewhere."""
    import mlx.core as mx

    from . import hooks

    caches = native_caches(model)
    probes = {i: _ProbeCache(offset) for i in kv_slots}
    for i, probe in probes.items():
        caches[i] = probe
    was_installed = hooks.is_installed(model)
    hooks.install(model)
    try:
        mx.eval(model(mx.array([[1]], dtype=mx.int32), cache=caches))
    finally:
        if not was_installed:
            hooks.uninstall(model)
    mx.eval([p.keys for p in probes.values() if p.keys is not None])
    return probes
