"""Route mlx-lm attention calls to caches that attend themselves (A2ATS, calibration capture).

mlx-lm model files call `scaled_dot_product_attention(queries, keys, values, cache=..., scale=...,
mask=...)`, a name imported from `mlx_lm.models.base` into each model module. `install(model)`
rebinds that name in the modules the model's layers come from to `dispatch`: a cache with a
callable `attend` gets `cache.attend(queries, keys, values, scale=..., mask=...)` with the true
(post-RoPE) query (plus `sinks=` for models with attention sinks); every other cache goes to mlx-lm's original function, untouched.
Idempotent and reversible; a no-op for models whose caches are ordinary.
"""

from __future__ import annotations

import sys
import weakref
from typing import Any

import mlx.nn as nn
from mlx_lm.models import base as _base

_ORIGINAL = _base.scaled_dot_product_attention
_NAME = "scaled_dot_product_attention"
# module name -> the installed models using it (weak: a dropped model stops counting)
_installed: dict[str, dict[int, weakref.ref]] = {}


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
