"""Convert a llama.cpp GGUF file (llama, qwen2, qwen3, gemma3, phi3) into an mlx-lm model folder.

`mx.load` reads GGUF natively: Q4_0, Q4_1 and Q8_0 tensors come back as MLX quantized triples
(`weight` uint32-packed, `scales`, `biases`, group size 32) and are kept quantized; other types are
dequantized by MLX's reader (to float16). This module renames tensors to mlx-lm's Llama names,
writes config.json (with a per-layer `quantization` map, since bits may differ per tensor),
safetensors weights, and a tokenizer rebuilt from the metadata (`gguf_tokenizer`).

RoPE pairing: for `llama`, llama.cpp's converter permutes the rows of each Q and K head so that
the halves (i, i + d/2) HF rotates together become adjacent rows (2i, 2i + 1). Interleaved
("traditional") RoPE on those rows computes the same attention scores, so the folder sets
`rope_traditional: true` and keeps the weights as they are. qwen2, qwen3, gemma3 and phi3 GGUFs
use NEOX (half-split) pairing with unpermuted rows: `rope_traditional: false`.
Per architecture (`_ARCHS`): gemma3 stores every norm weight as `w + 1` (llama.cpp folds Gemma's
`x * (1 + w)` into the weight; mlx-lm's Gemma norm adds the 1 itself, so 1 is subtracted back),
and its `ffn_norm` is the pre-feed-forward norm; phi3 keeps its fused `attn_qkv` and `ffn_up`
(gate and up) tensors, which are mlx-lm's `qkv_proj` and `gate_up_proj` as they are, and its
longrope factors arrive as `rope_factors_long/short` tensors.
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import tempfile
from collections import Counter
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from ..errors import ModelLoadError
from ..files import sha256_file  # noqa: F401  (models and demo_model hash through here)
from ..progress import Progress

CONVERTER_VERSION = 2
"""Bumped when the converted folder changes, so cached conversions are redone."""

SOURCE_FILE = "a2ats_source.json"
"""Provenance written into each converted folder (source file, hash, GGUF file type)."""

SUPPORTED_ARCHITECTURES = ("llama", "qwen2", "qwen3", "gemma3", "phi3")
GGUF_GROUP_SIZE = 32
GGUF_MAGIC = b"GGUF"

# llama.cpp `enum llama_ftype` (general.file_type) -> name.
FILE_TYPES = {
    0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 7: "Q8_0", 8: "Q5_0", 9: "Q5_1", 10: "Q2_K",
    11: "Q3_K_S", 12: "Q3_K_M", 13: "Q3_K_L", 14: "Q4_K_S", 15: "Q4_K_M", 16: "Q5_K_S",
    17: "Q5_K_M", 18: "Q6_K", 19: "IQ2_XXS", 20: "IQ2_XS", 21: "Q2_K_S", 22: "IQ3_XS",
    23: "IQ3_XXS", 24: "IQ1_S", 25: "IQ4_NL", 26: "IQ3_S", 27: "IQ3_M", 28: "IQ2_S", 29: "IQ2_M",
    30: "IQ4_XS", 31: "IQ1_M", 32: "BF16", 36: "TQ1_0", 37: "TQ2_0",
}  # fmt: skip
UNQUANTIZED_FILE_TYPES = ("F32", "F16", "BF16")

_LAYER_TENSORS = {
    "attn_norm": "input_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_norm": "post_attention_layernorm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_TOP_TENSORS = {
    "token_embd": "model.embed_tokens",
    "output_norm": "model.norm",
    "output": "lm_head",
}
_QK_NORMS = {"attn_q_norm": "self_attn.q_norm", "attn_k_norm": "self_attn.k_norm"}
# GGUF architecture -> (mlx-lm model_type, tensor names that differ from llama's)
_ARCHS: dict[str, tuple[str, dict[str, str]]] = {
    "llama": ("llama", {}),
    "qwen2": ("qwen2", {}),
    "qwen3": ("qwen3", _QK_NORMS),
    "gemma3": (
        "gemma3_text",
        {
            **_QK_NORMS,
            "post_attention_norm": "post_attention_layernorm",
            "ffn_norm": "pre_feedforward_layernorm",
            "post_ffw_norm": "post_feedforward_layernorm",
        },
    ),
    "phi3": ("phi3", {"attn_qkv": "self_attn.qkv_proj", "ffn_up": "mlp.gate_up_proj"}),
}
GEMMA3_SLIDING_PATTERN = 6  # llama.cpp: every 6th Gemma 3 layer is global
GEMMA3_LOCAL_BASE = 10000.0  # llama.cpp: RoPE base of Gemma 3's sliding layers
_IGNORED_TENSORS = ("rope_freqs", "attn_rot_embd", "rope_factors_long", "rope_factors_short")
_TENSOR_NAME = re.compile(r"^(?:blk\.(\d+)\.)?(\w+)\.(weight|bias|scales|biases)$")


# ---------------------------------------------------------------------------------------------
# Reading


def check_gguf_header(path: Path) -> None:
    """Fail with a one-line ModelLoadError unless `path` starts like a GGUF file (magic, version)."""
    try:
        with open(path, "rb") as f:
            head = f.read(8)
    except OSError as exc:
        raise ModelLoadError(f"cannot read {path}: {exc.strerror or exc}") from exc
    if len(head) < 8:
        raise ModelLoadError(f"{path} is not a GGUF file: only {len(head)} bytes long (truncated?)")
    if head[:4] != GGUF_MAGIC:
        raise ModelLoadError(
            f"{path} is not a GGUF file (it starts with {head[:4]!r}, not b'GGUF')"
        )
    version = int.from_bytes(head[4:8], "little")
    if version not in (2, 3):
        raise ModelLoadError(f"{path}: GGUF version {version} is not supported (only 2 and 3)")


def _read_gguf(path: str | Path):
    """`(tensors, header)` of a GGUF file.

    Tensors are MLX arrays named as in the file; packed types come as `<name>.weight/.scales/
    .biases` triples. `mx.load` reads the file when every tensor is of a type it packs natively
    (F32, F16, Q4_0, Q4_1, Q8_0); otherwise `gguf_reader` repacks every block format itself
    (gguflib, behind `mx.load`, decodes Q4_K wrongly and cannot read Q5_K, Q3_K...).
    """
    import mlx.core as mx

    from .gguf_reader import MLX_NATIVE_TYPES, load_tensors, read_header

    path = Path(path)
    check_gguf_header(path)
    header = read_header(path)
    if {t.type_name for t in header.tensors} <= MLX_NATIVE_TYPES:
        try:
            tensors = mx.load(str(path), format="gguf")
        except (RuntimeError, ValueError) as exc:
            reason = str(exc).replace("[load_gguf] ", "").strip()
            raise ModelLoadError(f"cannot read GGUF {path}: {reason}") from exc
    else:
        tensors = load_tensors(path, header)
    return tensors, header


def tensor_types(path: str | Path) -> dict[str, int]:
    """How many tensors of each GGML type ("Q4_K": 120, "Q6_K": 31, "F32": 61...) a file holds."""
    from .gguf_reader import read_header

    return dict(Counter(t.type_name for t in read_header(path).tensors).most_common())


def _scalar(metadata: dict, key: str, default: Any = None) -> Any:
    value = metadata.get(key, default)
    if hasattr(value, "item") and getattr(value, "size", 1) == 1:
        return value.item()
    return value


def architecture(metadata: dict) -> str:
    """`general.architecture`, checked against the supported ones (ModelLoadError otherwise)."""
    arch = metadata.get("general.architecture")
    if not isinstance(arch, str):
        raise ModelLoadError("GGUF metadata has no general.architecture")
    if arch not in SUPPORTED_ARCHITECTURES:
        raise ModelLoadError(f"not supported yet: {arch}")
    return arch


def file_type_name(metadata: dict, tensors: dict | None = None) -> str:
    """The GGUF's quantization as llama.cpp names it ("Q4_1", "Q4_K_M", "F16"...)."""
    code = _scalar(metadata, "general.file_type")
    declared = FILE_TYPES.get(code) if isinstance(code, int) else None
    packed = tensors is not None and any(name.endswith(".scales") for name in tensors)
    if declared is not None and not (packed and declared in UNQUANTIZED_FILE_TYPES):
        return declared
    if packed:
        return "quantized"
    return "F32" if tensors is None else _float_name(tensors)


def _float_name(tensors: dict) -> str:
    import mlx.core as mx

    dtypes = Counter(t.dtype for name, t in tensors.items() if name.endswith(".weight"))
    common = dtypes.most_common(1)[0][0] if dtypes else mx.float32
    return {mx.float16: "F16", mx.bfloat16: "BF16"}.get(common, "F32")


# ---------------------------------------------------------------------------------------------
# config.json


def _rope_scaling(metadata: dict, arch: str, tensors: dict, head_dim: int, theta: float):
    kind = _scalar(metadata, f"{arch}.rope.scaling.type")
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


MAX_CONTEXT_LENGTH = 1 << 24
"""Largest `context_length` a GGUF may state (16,777,216 tokens)."""
_MISSING = object()


def _int_field(metadata: dict, key: str, default: Any, lo: int, hi: int) -> int:
    """An integer metadata field in [lo, hi] (`default` when absent or 0, as llama.cpp reads
    it; `_MISSING`: required). ModelLoadError naming the key, the value and the range."""
    value = _scalar(metadata, key)
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
    value = _scalar(metadata, key)
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
        "model_type": _ARCHS[arch][0],
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
        bos = _scalar(metadata, "tokenizer.ggml.bos_token_id")
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


# ---------------------------------------------------------------------------------------------
# Weights


def mlx_tensor_name(name: str, arch: str = "llama") -> str | None:
    """mlx-lm name of a GGUF tensor (`blk.3.attn_q.weight` -> `model.layers.3.self_attn.q_proj.weight`)
    for the GGUF architecture `arch`; None for tensors that are not weights (`rope_freqs`).
    ModelLoadError for unknown names."""
    match = _TENSOR_NAME.match(name)
    if match is None:
        raise ModelLoadError(f"unexpected tensor name in GGUF: {name}")
    layer, base, suffix = match.groups()
    if base in _IGNORED_TENSORS:
        return None
    table = {**_LAYER_TENSORS, **_ARCHS[arch][1]} if layer is not None else _TOP_TENSORS
    if base not in table:
        raise ModelLoadError(f"unexpected tensor in GGUF: {name}")
    prefix = f"model.layers.{layer}." if layer is not None else ""
    return f"{prefix}{table[base]}.{suffix}"


def convert_weights(
    tensors: dict, types: dict[str, str] | None = None, arch: str = "llama"
) -> tuple[dict, dict | None]:
    """Rename GGUF tensors to mlx-lm names (for the GGUF architecture `arch`) and build the
    quantization map. Gemma 3 norm weights get their folded-in 1 subtracted.

    types: GGML type name of each GGUF tensor ("blk.0.attn_q.weight" -> "Q4_K"), which gives
    the MLX bits and group size of packed tensors; without it, group size 32 is assumed (all
    `mx.load` packs). Returns `(weights, quantization)`; quantization is None when nothing is
    packed, else `{"group_size": 32, "bits": <most common>, "mode": "affine",
    "<module path>": {"group_size": g, "bits": b, "mode": "affine"}, ...}` with one entry per
    packed module (GGUF bits and groups differ per tensor: Q4_K next to Q6_K).
    """
    from .gguf_reader import DECODERS, mlx_layout

    weights, per_module = {}, {}
    for name, value in tensors.items():
        new = mlx_tensor_name(name, arch)
        if new is None:
            continue
        if arch == "gemma3" and name.endswith("norm.weight"):
            value = value - 1.0  # llama.cpp stores Gemma's 1 + w
        weights[new] = value
        if name.endswith(".scales"):
            base = name[: -len(".scales")]
            packed = tensors[f"{base}.weight"]
            kind = (types or {}).get(f"{base}.weight")
            group = mlx_layout(kind)[1] if kind in DECODERS else GGUF_GROUP_SIZE
            # packed words per scale = group * bits / 32
            bits = packed.shape[-1] * 32 // (value.shape[-1] * group)
            per_module[new[: -len(".scales")]] = {
                "group_size": group,
                "bits": bits,
                "mode": "affine",
            }
    weights = _uniform_float_dtype(weights)
    if not per_module:
        return weights, None
    bits = Counter(q["bits"] for q in per_module.values()).most_common(1)[0][0]
    return weights, {"group_size": GGUF_GROUP_SIZE, "bits": bits, "mode": "affine", **per_module}


def _uniform_float_dtype(weights: dict) -> dict:
    """Store float32 tensors (llama.cpp keeps norms in F32) in the model's compute dtype.

    In a quantized or F16 file the scales / matrices are float16; float32 norm weights would
    promote every activation, and so the KV cache, to float32 (twice the memory on Metal).
    F32 files stay float32.
    """
    import mlx.core as mx

    floats = (mx.float16, mx.bfloat16, mx.float32)
    scales = [v.dtype for k, v in weights.items() if k.endswith(".scales")]
    matrices = [v.dtype for v in weights.values() if v.ndim == 2 and v.dtype in floats]
    candidates = scales or matrices
    if not candidates:
        return weights
    target = Counter(candidates).most_common(1)[0][0]
    if target == mx.float32:
        return weights
    return {k: v.astype(target) if v.dtype == mx.float32 else v for k, v in weights.items()}


# ---------------------------------------------------------------------------------------------
# Writing the folder


def _save_weights(folder: Path, weights: dict) -> None:
    import mlx.core as mx
    from mlx_lm.utils import make_shards

    shards = make_shards(weights)
    if len(shards) == 1:
        mx.save_safetensors(str(folder / "model.safetensors"), shards[0], {"format": "mlx"})
        return
    index: dict[str, Any] = {"metadata": {"total_size": 0}, "weight_map": {}}
    for i, shard in enumerate(shards, start=1):
        name = f"model-{i:05d}-of-{len(shards):05d}.safetensors"
        mx.save_safetensors(str(folder / name), shard, {"format": "mlx"})
        for key, value in shard.items():
            index["weight_map"][key] = name
            index["metadata"]["total_size"] += value.nbytes
    (folder / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))


def _write_folder(folder: Path, tensors: dict, header, source: dict) -> None:
    from .gguf_tokenizer import build_tokenizer, generation_config, tokenizer_config

    metadata = header.metadata
    config = model_config(metadata, tensors)
    types = {t.name: t.type_name for t in header.tensors}
    weights, quantization = convert_weights(tensors, types, architecture(metadata))
    if quantization is not None:
        config["quantization"] = quantization
    tokenizer = build_tokenizer(metadata)
    tok_config = tokenizer_config(metadata, config["max_position_embeddings"])
    _save_weights(folder, weights)
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    tokenizer.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps(tok_config, indent=2))
    sampling = generation_config(metadata)
    if sampling:
        (folder / "generation_config.json").write_text(json.dumps(sampling, indent=2))
    (folder / SOURCE_FILE).write_text(json.dumps(source, indent=2))


def convert_gguf(
    path: str | Path,
    out_dir: str | Path,
    *,
    name: str | None = None,
    sha256: str | None = None,
    origin: str | None = None,
    progress: Progress | None = None,
) -> Path:
    """Convert the GGUF at `path` into an mlx-lm folder `out_dir` (written to a temporary sibling
    folder, then renamed, so a crash never leaves a half-written folder behind).

    `out_dir` must not exist yet, or be empty. `name` and `origin` (where the file came from,
    default its path) are recorded in the folder's a2ats_source.json. Returns `out_dir`.
    ModelLoadError on a bad file.
    """
    path, out_dir = Path(path).expanduser(), Path(out_dir).expanduser()
    if out_dir.exists() and (not out_dir.is_dir() or any(out_dir.iterdir())):
        raise ModelLoadError(f"{out_dir} already exists and is not empty; choose a new folder")
    if not path.is_file():
        raise ModelLoadError(f"no such GGUF file: {path}")
    check_gguf_header(path)
    if progress is not None:
        progress("read gguf", 0, 1)
    with _naming_the_file(path):
        return _convert(path, out_dir, name, sha256, origin, progress)


@contextmanager
def _naming_the_file(path: Path):
    """Every failure while converting `path` as one ModelLoadError line that names the file
    (metadata problems are found far from where the file is known)."""
    try:
        yield
    except ModelLoadError as exc:
        text = str(exc)
        if str(path) in text or path.name in text:
            raise
        raise ModelLoadError(f"cannot convert GGUF {path}: {text}") from exc
    except (ValueError, TypeError, KeyError, IndexError, OverflowError, RecursionError) as exc:
        detail = " ".join(str(exc).split())[:300] or type(exc).__name__
        raise ModelLoadError(f"cannot convert GGUF {path}: damaged metadata ({detail})") from exc


def _text_field(metadata: dict, key: str) -> str | None:
    """A string metadata field (None when absent, empty or not a string)."""
    value = metadata.get(key)
    return value if isinstance(value, str) and value.strip() else None


def _convert(path, out_dir, name, sha256, origin, progress) -> Path:
    tensors, header = _read_gguf(path)
    metadata = header.metadata
    architecture(metadata)  # fail fast on unsupported architectures
    if progress is not None:
        progress("read gguf", 1, 1)
        progress("convert", 0, 1)
    source = {
        "converter_version": CONVERTER_VERSION,
        "source": origin or str(path.resolve()),
        "sha256": sha256 or sha256_file(path),
        "name": name or _text_field(metadata, "general.name") or path.stem,
        "gguf_file_type": file_type_name(metadata, tensors),
        "tensor_types": dict(Counter(t.type_name for t in header.tensors).most_common()),
        "disk_bytes": path.stat().st_size,
    }
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", suffix=".tmp", dir=out_dir.parent))
    try:
        _write_folder(tmp, tensors, header, source)
        tmp.chmod(0o755)  # mkdtemp makes it private
        if out_dir.exists():
            out_dir.rmdir()  # empty, checked above
        os.replace(tmp, out_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if progress is not None:
        progress("convert", 1, 1)
    return out_dir


def read_source_info(folder: str | Path) -> dict | None:
    """The provenance a converted folder records (None for folders not made from a GGUF)."""
    file = Path(folder) / SOURCE_FILE
    try:
        return json.loads(file.read_text())
    except (OSError, ValueError):
        return None
