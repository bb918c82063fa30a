"""Does a codebook fit a model and a cache config: the model fingerprint a codebook (and a session
file) records, and the checks `Codebook.validate_for` (`codebook.py`) runs against it.

Hard mismatches (layers, KV heads, head dim, RoPE) raise a `CodebookError`; soft ones (a
different model with the same shape, a config whose calibrated settings differ) are warnings.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from ..errors import CodebookError
from .codebook_file import CALIBRATED_SETTINGS
from .geometry import model_geometry
from .layer_plan import A2ATS, plan_for, rope_spec_of


def model_fingerprint(model: Any, name: str | None = None) -> dict[str, Any]:
    """What a codebook records about its model: geometry, RoPE spec and a hash of the config."""
    geometry = model_geometry(model)
    args = getattr(model, "args", None)
    config = getattr(model, "config", None) or (vars(args) if args is not None else {})
    blob = json.dumps(config, sort_keys=True, default=str)
    return {
        "name": name,
        "model_type": geometry.model_type,
        "num_layers": geometry.num_layers,
        "num_heads": geometry.num_heads,
        "num_kv_heads": geometry.num_kv_heads,
        "head_dim": geometry.head_dim,
        "rope": geometry.rope,
        "rope_fingerprint": _rope_fingerprint([s.fingerprint() for s in _a2ats_specs(model)]),
        "config_hash": hashlib.sha256(blob.encode()).hexdigest()[:16],
    }


def _a2ats_specs(model: Any) -> list:
    """RopeSpecs of the layers the layer plan serves with A2ATS (what codes depend on)."""
    return [rope_spec_of(model, c) for c in plan_for(model).layers if c.kind == A2ATS]


def _rope_fingerprint(per_layer: list[str]) -> str:
    return hashlib.sha256("|".join(per_layer).encode()).hexdigest()[:16]


def fit_problems(
    shape: tuple[int, int, int],
    metadata: dict[str, Any],
    model: Any,
    config: Any | None = None,
) -> list[str]:
    """Check a codebook of `shape` (layers, KV heads, head dim) and `metadata` against `model`
    (and `config`, an A2ATSConfig).

    Raises CodebookError naming the first hard mismatch (layers, KV heads, head dim, RoPE).
    Returns warnings for soft ones (the config's far_offset, far_buckets or window differs
    from the one the codebook was calibrated with: they set the distances its query moments
    were rotated to; a different model with the same geometry)."""
    geometry = model_fingerprint(model)
    check_geometry(shape, geometry)
    found = []
    recorded = metadata.get("model")
    if not recorded:
        found.append("codebook records no model fingerprint (random or hand-made codebook)")
    else:
        rope_message = _rope_mismatch(recorded, geometry)
        if rope_message:
            raise CodebookError(rope_message)
        if recorded.get("config_hash") != geometry["config_hash"]:
            found.append(
                f"codebook was calibrated on a different model "
                f"({recorded.get('model_type')}, config hash differs) with the same shape; "
                "retrieval may be less accurate"
            )
    if config is not None:
        found.extend(_config_warnings(metadata, config))
    return found


def check_geometry(shape: tuple[int, int, int], geometry: dict[str, Any]) -> None:
    """CodebookError unless a codebook of `shape` (layers, KV heads, head dim) fits the model
    whose `model_fingerprint` is `geometry`."""
    num_layers, num_kv_heads, head_dim = shape
    if geometry["num_layers"] != num_layers:
        raise CodebookError(
            f"codebook is for {num_layers} layers, the model has {geometry['num_layers']}"
        )
    if geometry["num_kv_heads"] != num_kv_heads:
        raise CodebookError(
            f"codebook is for {num_kv_heads} KV heads, the model has {geometry['num_kv_heads']}"
        )
    if geometry["head_dim"] != head_dim:
        raise CodebookError(
            f"codebook does not fit the model: head dim {head_dim} vs {geometry['head_dim']}"
        )


def _rope_mismatch(recorded: dict[str, Any], geometry: dict[str, Any]) -> str | None:
    if recorded.get("rope_fingerprint") == geometry["rope_fingerprint"]:
        return None
    a, b = recorded.get("rope") or {}, geometry["rope"]
    diffs = [
        f"{key} {a.get(key)} vs {b.get(key)}"
        for key in ("kind", "dims", "traditional", "base", "pos_scale", "scale")
        if a.get(key) != b.get(key)
    ]
    if not diffs and a.get("freqs") != b.get("freqs"):
        diffs.append("frequencies differ")
    detail = ", ".join(diffs) if diffs else "per-layer RoPE differs"
    return f"codebook was calibrated for a different RoPE ({detail})"


def _config_warnings(metadata: dict[str, Any], config: Any) -> list[str]:
    """One warning per calibration setting (recorded in the metadata) the config changes."""
    found = []
    for name in CALIBRATED_SETTINGS:
        calibrated = metadata.get(name)
        if calibrated is not None and calibrated != getattr(config, name):
            found.append(
                f"codebook was calibrated with {name} {calibrated}, the cache uses "
                f"{getattr(config, name)}; retrieval may be less accurate"
            )
    return found
