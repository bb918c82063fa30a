"""The mlx-lm config.json of a GGUF file, built from its metadata (`gguf.py` converts the rest).

Every size the metadata states is range-checked (`_int_field`, `_float_field`: a ModelLoadError
naming the key, the value and the range) and compared with the tensors the file holds
(`_check_shapes`) before anything is computed from it; RoPE scaling is recovered from the
metadata or from llama.cpp's `rope_freqs` factors; Gemma 3 and Phi-3 get the fields llama.cpp
does not store. The per-architecture model types come from `gguf_archs.ARCHS`.
"""

from __future__ import annotations

import math
import re
from typing import Any

from ..errors import ModelLoadError
from .gguf_archs import ARCHS, GEMMA3_LOCAL_BASE, GEMMA3_SLIDING_PATTERN, architecture

MAX_CONTEXT_LENGTH = 1 << 24
"""Largest `context_length` a GGUF may state (16,777,216 tokens)."""
_MISSING = object()


def scalar(metadata: dict, key: str, default: Any = None) -> Any:
    """A metadata value (`default` when absent); a one-element array as its Python scalar."""
    value = metadata.get(key, default)
    if hasattr(value, "item") and getattr(value, "size", 1) == 1:
        return value.item()
    return value


def _rope_scaling(metadata: dict, arch: str, tensors: dict, head_dim: int, theta: float):
    kind = scalar(metadata, f"{arch}.rope.scaling.type")
    factor = _float_field(metadata, f"{arch}.rope.scaling.factor", None, 0.0, 1e6)
    if "rope_freqs.weight" in tensors:
        freqs = tensors["rope_freqs.weight"]
        if freqs.size != head_dim // 2:
            raise ModelLoadError(
                f"rope_freqs has {freqs.size} factors, the head dim {head_dim} needs "
                f"{head_dim // 2}"
            )
        return _llama3_scaling(freqs, head_dim, theta)
    if kind in (None, "none") or (kind == "linear" and (factor is None or factor == 1.0)):
        return None
    if kind == "linear":
        return {"type": "linear", "factor": float(factor)}
    raise ModelLoadError(f"not supported yet: {arch} RoPE scaling {kind!r}")


def _llama3_scaling(rope_freqs, head_dim: int, theta: float) -> dict:
    """Recover Llama 3's RoPE scaling from llama.cpp's per-pair frequency factors tensor."""
    import mlx.core as mx

    factors = [float(x) for x in rope_freqs.astype(mx.float32).tolist()]
    factor = max(factors)
    for original in (8192, 4096, 16384, 32768, 2048):
        for low, high in ((1.0, 4.0), (1.0, 2.0), (1.0, 8.0)):
            expected = _llama3_factors(head_dim, theta, factor, low, high, original)
            if len(expected) == len(factors) and all(
                abs(a - b) <= 1e-3 * max(1.0, abs(b))
                for a, b in zip(factors, expected, strict=True)
            ):
                return {
                    "rope_type": "llama3",
                    "factor": factor,
                    "low_freq_factor": low,
                    "high_freq_factor": high,
                    "original_max_position_embeddings": original,
                }
    raise ModelLoadError("not supported yet: RoPE frequency factors (rope_freqs) of unknown form")


def _llama3_factors(dims, theta, factor, low, high, original) -> list[float]:
    low_wavelen, high_wavelen = original / low, original / high
    out = []
    for i in range(0, dims, 2):
        wavelen = 2 * math.pi * theta ** (i / dims)
        if wavelen < high_wavelen:
            out.append(1.0)
        elif wavelen > low_wavelen:
            out.append(factor)
        else:
            smooth = (original / wavelen - low) / (high - low)
            out.append(1 / ((1 - smooth) / factor + smooth))
    return out


def _int_field(metadata: dict, key: str, default: Any, lo: int, hi: int) -> int:
    """An integer metadata field in [lo, hi] (`default` when absent or 0, as llama.cpp reads
    it; `_MISSING`: required). ModelLoadError naming the key, the value and the range."""
    value = scalar(metadata, key)
    zero = isinstance(value, int) and not isinstance(value, bool) and value == 0
    if value is None or (zero and default is not _MISSING):
        if default is _MISSING:
            raise ModelLoadError(f"GGUF metadata is missing {key}")
        return default
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise ModelLoadError(
            f"GGUF metadata {key}={_short(value)} is out of range: must be an integer in "
            f"[{lo}, {hi:,}]"
        )
    return value


def _float_field(metadata: dict, key: str, default: Any, lo: float, hi: float) -> Any:
    """A number in (lo, hi] from the metadata (`default` when absent), else ModelLoadError."""
    value = scalar(metadata, key)
    if value is None:
        return default
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not math.isfinite(value)
        or not lo < value <= hi
    ):
        raise ModelLoadError(
            f"GGUF metadata {key}={_short(value)} is out of range: must be a number in "
            f"({lo:g}, {hi:g}]"
        )
    return float(value)


def _short(value: Any, limit: int = 40) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _rows(tensors: dict, name: str) -> int | None:
    """Rows (output features) of a tensor, packed or not; None when the file lacks it."""
    tensor = tensors.get(name)
    return int(tensor.shape[0]) if tensor is not None and tensor.ndim >= 1 else None


def _check_shapes(arch: str, sizes: dict[str, int], tensors: dict) -> None:
    """ModelLoadError unless the sizes the metadata states match the tensors the file holds,
    so nothing is ever sized from the metadata alone (a hostile file can state any number)."""
    a = arch
    layers = {int(m[1]) for name in tensors if (m := re.match(r"blk\.(\d+)\.", name))}
    if layers != set(range(sizes["layers"])):
        raise ModelLoadError(
            f"GGUF metadata {a}.block_count={sizes['layers']:,} does not match the tensors "
            f"(layers {min(layers, default=0)}..{max(layers, default=-1)} present)"
        )
    heads, kv, head_dim = sizes["heads"], sizes["kv_heads"], sizes["head_dim"]
    if heads % kv:
        raise ModelLoadError(
            f"GGUF metadata {a}.attention.head_count_kv={kv} does not divide "
            f"{a}.attention.head_count={heads}"
        )
    norm = tensors.get("blk.0.attn_norm.weight")
    expected = [(f"{a}.embedding_length", sizes["hidden"], norm, "blk.0.attn_norm.weight")]
    if arch == "phi3":
        qkv = (heads + 2 * kv) * head_dim
        checks = [
            ("attn_qkv", qkv, f"({a}.attention.head_count + 2 x head_count_kv) x key_length"),
            ("ffn_up", 2 * sizes["ff"], f"2 x {a}.feed_forward_length"),
        ]
    else:
        checks = [
            ("attn_q", heads * head_dim, f"{a}.attention.head_count x key_length"),
            ("attn_k", kv * head_dim, f"{a}.attention.head_count_kv x key_length"),
            ("ffn_up", sizes["ff"], f"{a}.feed_forward_length"),
        ]
    for base, want, what in checks:
        got = _rows(tensors, f"blk.0.{base}.weight")
        if got is None:
            raise ModelLoadError(f"GGUF has no blk.0.{base}.weight tensor")
        if got != want:
            raise ModelLoadError(
                f"GGUF metadata does not match the tensors: {what} = {want:,}, but "
                f"blk.0.{base}.weight has {got:,} rows (key_length {head_dim:,}, "
                f"head_count {heads:,}, head_count_kv {kv:,})"
            )
    for key, want, tensor, name in expected:
        if tensor is None or tensor.shape[-1] != want:
            got = "no such tensor" if tensor is None else f"{tensor.shape[-1]:,} values"
            raise ModelLoadError(
                f"GGUF metadata {key}={want:,} does not match the tensors ({name}: {got})"
            )


def model_config(metadata: dict, tensors: dict) -> dict:
    """config.json for the mlx-lm model of the GGUF's architecture (without the quantization
    map). Every size the metadata states is range-checked and compared with the tensors
    (`_check_shapes`) before anything is computed from it."""
    arch = architecture(metadata)
    experts = _int_field(metadata, f"{arch}.expert_count", 0, 0, 1 << 16)
    if experts > 0:
        raise ModelLoadError(f"not supported yet: {arch} mixture of experts ({experts} experts)")
    if "token_embd.weight" not in tensors:
        raise ModelLoadError("GGUF has no token_embd.weight tensor")
    big = 1 << 20  # every size is then compared with the tensors' own
    hidden = _int_field(metadata, f"{arch}.embedding_length", _MISSING, 1, big)
    heads = _int_field(metadata, f"{arch}.attention.head_count", _MISSING, 1, big)
    head_dim = _int_field(metadata, f"{arch}.attention.key_length", hidden // heads, 1, big)
    rope_dims = _int_field(metadata, f"{arch}.rope.dimension_count", head_dim, 1, big)
    sizes = {
        "hidden": hidden,
        "heads": heads,
        "head_dim": head_dim,
        "kv_heads": _int_field(metadata, f"{arch}.attention.head_count_kv", heads, 1, big),
        "layers": _int_field(metadata, f"{arch}.block_count", _MISSING, 1, 1 << 16),
        "ff": _int_field(metadata, f"{arch}.feed_forward_length", _MISSING, 1, big),
    }
    _check_shapes(arch, sizes, tensors)
    if rope_dims > head_dim or rope_dims % 2:
        raise ModelLoadError(
            f"GGUF metadata {arch}.rope.dimension_count={rope_dims:,} must be even and at most "
            f"the head dim {head_dim:,}"
        )
    if rope_dims != head_dim and arch != "phi3":
        raise ModelLoadError(f"not supported yet: partial rotary ({rope_dims} of {head_dim} dims)")
    theta = _float_field(metadata, f"{arch}.rope.freq_base", 10000.0, 0.0, 1e12)
    eps_key = f"{arch}.attention.layer_norm_rms_epsilon"
    context_key = f"{arch}.context_length"
    config: dict[str, Any] = {
        "model_type": ARCHS[arch][0],
        "hidden_size": hidden,
        "num_hidden_layers": sizes["layers"],
        "intermediate_size": sizes["ff"],
        "num_attention_heads": heads,
        "num_key_value_heads": sizes["kv_heads"],
        "head_dim": head_dim,
        "rms_norm_eps": _float_field(metadata, eps_key, 1e-5, 0.0, 1.0) or 1e-5,
        "vocab_size": int(tensors["token_embd.weight"].shape[0]),
        "max_position_embeddings": _int_field(metadata, context_key, 4096, 1, MAX_CONTEXT_LENGTH),
        "rope_theta": theta,
        "rope_traditional": arch == "llama",
        "tie_word_embeddings": "output.weight" not in tensors,
        "attention_bias": "blk.0.attn_q.bias" in tensors,
        "mlp_bias": "blk.0.ffn_up.bias" in tensors,
    }
    if arch == "phi3":
        config.update(_phi3_config(metadata, tensors, rope_dims, head_dim))
    else:
        scaling = _rope_scaling(metadata, arch, tensors, head_dim, theta)
        if scaling is not None:
            config["rope_scaling"] = scaling
    if arch == "gemma3":
        config.update(_gemma3_config(metadata, config))
    from .gguf_tokenizer import stop_token_ids

    if "tokenizer.ggml.tokens" in metadata:
        stops = stop_token_ids(metadata)
        if stops:
            config["eos_token_id"] = stops[0] if len(stops) == 1 else stops
        bos = scalar(metadata, "tokenizer.ggml.bos_token_id")
        if bos is not None:
            vocab = config["vocab_size"]
            config["bos_token_id"] = _int_field(
                metadata, "tokenizer.ggml.bos_token_id", 0, 0, max(vocab - 1, 0)
            )
    return config


def _gemma3_config(metadata: dict, config: dict) -> dict:
    """Gemma 3 fields llama.cpp does not store (it hard-codes them): the sliding pattern, the
    local RoPE base and the query scale (head dim; hidden / heads for the 62-layer 27B)."""
    context = config["max_position_embeddings"]
    window = _int_field(metadata, "gemma3.attention.sliding_window", 512, 1, context)
    scalar = config["head_dim"]
    if config["num_hidden_layers"] == 62:
        scalar = config["hidden_size"] // config["num_attention_heads"]
    return {
        "sliding_window": window,
        "sliding_window_pattern": GEMMA3_SLIDING_PATTERN,
        "rope_local_base_freq": GEMMA3_LOCAL_BASE,
        "query_pre_attn_scalar": scalar,
    }


def _phi3_config(metadata: dict, tensors: dict, rope_dims: int, head_dim: int) -> dict:
    """Phi-3 partial rotary and longrope (factors stored as tensors)."""
    import mlx.core as mx

    out: dict[str, Any] = {"partial_rotary_factor": rope_dims / head_dim}
    key = "phi3.rope.scaling.original_context_length"
    original = _int_field(metadata, key, None, 1, MAX_CONTEXT_LENGTH)
    if original is not None:
        out["original_max_position_embeddings"] = original
    if "rope_factors_long.weight" in tensors:

        def factors(name: str) -> list[float]:
            return [float(x) for x in tensors[name].astype(mx.float32).tolist()]

        out["rope_scaling"] = {
            "type": "longrope",
            "long_factor": factors("rope_factors_long.weight"),
            "short_factor": factors(
                "rope_factors_short.weight"
                if "rope_factors_short.weight" in tensors
                else "rope_factors_long.weight"
            ),
        }
    return out
