"""Route mlx-lm attention calls to caches that attend themselves (A2ATS, calibration capture).

mlx-lm model files call `scaled_dot_product_attention(queries, keys, values, cache=..., scale=...,
mask=...)`, a name imported from `mlx_lm.models.base` into each model module. `install(model)`
rebinds that name in the modules the model's layers come from to `dispatch`: a cache with a
callable `attend` gets `cache.attend(queries, keys, values, scale=..., mask=...)` with the true
(post-RoPE) query (plus `sinks=` for models with attention sinks); every other cache goes to mlx-lm's original function, untouched.
Idempotent and reversible; a no-op for models whose caches are ordinary.

`exact_on_host(model)` also sends, while it is open, the multi-token attention of the model's
ordinary caches to `host_attention` (NumPy, on CPU-only MLX): the measurements' shared exact
prefill (`bench/plan_caches.feed_prompt`), which is most of a long-context task's time there.
Outside it, and always for the `full` baseline that is timed, ordinary caches go to mlx-lm.
"""

from __future__ import annotations

import contextlib
import sys
import weakref
from collections.abc import Iterator
from typing import Any

import mlx.nn as nn
from mlx_lm.models import base as _base

from . import host_attention

_ORIGINAL = _base.scaled_dot_product_attention
_NAME = "scaled_dot_product_attention"
# module name -> the installed models using it (weak: a dropped model stops counting)
_installed: dict[str, dict[int, weakref.ref]] = {}
_on_host = 0  # open `exact_on_host` blocks


def _users(module_name: str) -> dict[int, weakref.ref]:
    users = _installed.setdefault(module_name, {})
    for key in [k for k, ref in users.items() if ref() is None]:
        del users[key]
    return users


def dispatch(queries, keys, values, cache=None, scale: float = 1.0, mask=None, **kwargs: Any):
    """Drop-in for mlx-lm's scaled_dot_product_attention. Shapes: queries [B, n_q, L, d].

    Attention sinks (gpt_oss: one learned logit per query head, `sinks` [n_q]) reach `attend`
    as a keyword; every other extra keyword goes to mlx-lm's function unchanged."""
    attend = getattr(cache, "attend", None)
    if attend is not None:
        sinks = kwargs.get("sinks")
        if sinks is None:
            return attend(queries, keys, values, scale=scale, mask=mask)
        return attend(queries, keys, values, scale=scale, mask=mask, sinks=sinks)
    if (
        _on_host
        and not kwargs
        and not hasattr(cache, "bits")  # mlx-lm's own test for packed (quantized) K/V
        and host_attention.applies(queries, keys, mask, None)
    ):  # as `attention.exact_attention` does (importing it here would close an import cycle)
        return host_attention.attention(queries, keys, values, scale, mask)
    return _ORIGINAL(queries, keys, values, cache=cache, scale=scale, mask=mask, **kwargs)


def _model_modules(model: nn.Module) -> list[Any]:
    names = {type(m).__module__ for _, m in model.named_modules()}
    names.add(type(model).__module__)
    mods = []
    for name in sorted(names):
        mod = sys.modules.get(name)
        if mod is not None and getattr(mod, _NAME, None) in (_ORIGINAL, dispatch):
            mods.append(mod)
    return mods


def install(model: nn.Module) -> int:
    """Route this model's attention through `dispatch`. Returns the number of modules patched."""
    mods = _model_modules(model)
    for mod in mods:
        setattr(mod, _NAME, dispatch)
        _users(mod.__name__)[id(model)] = weakref.ref(model)
    return len(mods)


def uninstall(model: nn.Module) -> None:
    """Undo `install` for this model; a module is restored once no installed model uses it."""
    for mod in _model_modules(model):
        users = _users(mod.__name__)
        users.pop(id(model), None)
        if not users:
            setattr(mod, _NAME, _ORIGINAL)
            _installed.pop(mod.__name__, None)


def is_installed(model: nn.Module) -> bool:
    """True when every attention module of the model routes through `dispatch`."""
    mods = _model_modules(model)
    return bool(mods) and all(getattr(m, _NAME) is dispatch for m in mods)


install_hooks = install
uninstall_hooks = uninstall


@contextlib.contextmanager
def exact_on_host(model: nn.Module) -> Iterator[None]:
    """Within the block, the model's exact multi-token attention over ordinary caches runs in
    NumPy where `host_attention.applies` (CPU-only MLX, a causal or no mask, float K/V): the
    same maths, to float32 rounding, without MLX's slow CPU `exp`. On Metal nothing changes."""
    global _on_host
    was_installed = any(id(model) in _users(m.__name__) for m in _model_modules(model))
    install(model)
    _on_host += 1
    try:
        yield
    finally:
        _on_host -= 1
        if not was_installed:
            uninstall(model)
