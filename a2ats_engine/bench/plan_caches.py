"""Every measured method's caches, built per layer from the model's layer plan and one prefill.

The measurements (`a2ats eval`, its ablations, `bench passkey`, `bench tasks`, `bench
codebooks`) prefill a text once with the model's own caches (mlx-lm's `make_prompt_cache`: a
`KVCache` on global layers, a `RotatingKVCache` on sliding-window layers, an `ArraysCache` on
linear-attention layers...) and give every method a copy of that state, the way `make_cache`
builds the app's caches (`cache/layer_plan.py`):

- a layer the plan marks `a2ats` gets the method's cache (A2ATS or one of its variants, or
  mlx-lm's `KVCache` / `QuantizedKVCache` for full / kv8 / kv4) filled with the prefilled keys
  and values, with the RoPE spec the plan verified for that layer;
- a `native` layer keeps the model's own cache, copied as it is (`clone_native`: a rotating
  cache stays a rotating cache, ring order, offset and write index included). kv8 / kv4 quantize
  a native layer only where its own cache is a plain `KVCache` (NoPE, latent attention), as
  mlx-lm's own kv quantization does; mlx-lm has no quantized rotating cache.

Copying a rotating cache's `keys[..., :offset]` into a `KVCache` instead would hand every method
a scrambled ring (rotated order, the wrong positions) on every sliding layer.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models.cache import KVCache, QuantizedKVCache

from ..cache import hooks
from ..cache.estimate_layers import EstimateLayers
from ..cache.layer_plan import A2ATS, plan_for, rope_spec_of

if TYPE_CHECKING:  # an annotation only: methods.py builds the copies with this module
    from .methods import MethodSpec


def feed_prompt(model: nn.Module, tokens: Sequence[int], caches: list) -> None:
    """Run `tokens` through `model` into `caches` (one prefill chunk), the measurements' shared
    exact prefill, which is most of a long-context task's time on a CPU:

    - only the caches' state is evaluated, as mlx-lm's `generate_step` prefills: the chunk's
      logits are never computed (a small model's vocabulary projection is a large share of
      its prefill: Gemma 3 270M's has 262,144 words), nor the last layer's attention output
      and MLP;
    - on CPU-only MLX the exact attention runs in NumPy (`hooks.exact_on_host`), as an A2ATS
      layer's prefill does, without MLX's slow CPU `exp` (the rest of a chunk stays in MLX, so
      the prefill gains less than its attention does).
    """
    with hooks.exact_on_host(model):
        model(mx.array([list(tokens)]), cache=caches)
        mx.eval([c.state for c in caches])


def clone_native(src: Any) -> Any:
    """An independent copy of one of the model's own caches (KVCache, RotatingKVCache,
    ArraysCache, CacheList, ...): the same class with copies of every array and list, so
    decoding through the copy leaves `src` (and every other copy) as it was."""
    clone = copy.deepcopy(src)
    mx.eval([a for a in _arrays(clone)])
    return clone


def _arrays(obj: Any) -> list[mx.array]:
    if isinstance(obj, mx.array):
        return [obj]
    if isinstance(obj, list | tuple):
        return [a for x in obj for a in _arrays(x)]
    if hasattr(obj, "__dict__"):
        return [a for v in vars(obj).values() for a in _arrays(v)]
    return []


def is_plain(cache: Any) -> bool:
    """A plain growing KVCache (a global-attention layer), not one of the model's special ones."""
    return type(cache) is KVCache


def prefix(src: KVCache) -> tuple[mx.array, mx.array]:
    """The keys and values a plain KVCache holds: `[B, n_kv, offset, d]` each."""
    return src.keys[..., : src.offset, :], src.values[..., : src.offset, :]


def filled(cache: Any, src: KVCache) -> Any:
    """`cache` after taking the prefilled keys and values of the plain cache `src`."""
    cache.update_and_fetch(*prefix(src))
    return cache


def quantized_copy(src: Any, bits: int, group_size: int) -> Any:
    """kv8 / kv4 on one layer: a QuantizedKVCache holding a plain cache's keys and values, or a
    copy of the model's own cache where it is not plain (sliding windows stay rotating)."""
    if not is_plain(src):
        return clone_native(src)
    return filled(QuantizedKVCache(group_size=group_size, bits=bits), src)


def plan_caches(model: nn.Module, base: list, spec: MethodSpec) -> tuple[list, list[bool]]:
    """One cache per cache slot holding a copy of the prefill `base` (the model's own caches,
    `evaluate.prefill`), built from the model's layer plan (see the module docstring).

    The mlx-lm methods (`spec.layer_copy`: full, kv8, kv4) copy every layer with it; the
    A2ATS-shaped ones get `spec.factory(layer, rope_spec)` filled with the prefill on the plan's
    `a2ats` layers and a `clone_native` copy elsewhere. Returns (caches, measured): measured[i]
    is True on the plan's `a2ats` layers, the layers the evaluation measures for every method."""
    plan = plan_for(model).require()
    if len(base) != plan.num_layers:
        raise ValueError(
            f"the prefill has {len(base)} caches, the model's plan {plan.num_layers} slots"
        )
    caches, measured = [], []
    for choice, src in zip(plan.layers, base, strict=True):
        on_a2ats = choice.kind == A2ATS
        if getattr(src, "remote", False):  # a pipeline rank's peer's layer: it counts tokens
            caches.append(copy.copy(src))
            measured.append(False)
            continue
        if spec.layer_copy is not None:
            caches.append(spec.layer_copy(src))
        elif on_a2ats:
            caches.append(filled(spec.factory(choice.layer, rope_spec_of(model, choice)), src))
        else:
            caches.append(clone_native(src))
        measured.append(on_a2ats)
    EstimateLayers.join(caches)  # as `make_cache`: the layers that keep the estimate
    return caches, measured


def native_bytes(model: nn.Module, base: list) -> int:
    """Bytes the plan's native layers hold in the prefill `base` (the model's own caches)."""
    plan = plan_for(model)
    return int(sum(src.nbytes for c, src in zip(plan.layers, base, strict=True) if c.kind != A2ATS))
