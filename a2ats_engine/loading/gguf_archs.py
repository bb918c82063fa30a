"""The GGUF architectures the converter (`gguf.py`) supports, and per architecture its mlx-lm
model type and tensor names (`ARCHS`).

RoPE pairing: for `llama`, llama.cpp's converter permutes the rows of each Q and K head so that
the halves (i, i + d/2) HF rotates together become adjacent rows (2i, 2i + 1). Interleaved
("traditional") RoPE on those rows computes the same attention scores, so the folder sets
`rope_traditional: true` and keeps the weights as they are. qwen2, qwen3, gemma3 and phi3 GGUFs
use NEOX (half-split) pairing with unpermuted rows: `rope_traditional: false` (`gguf_config.py`).
Per architecture: gemma3 stores every norm weight as `w + 1` (llama.cpp folds Gemma's
`x * (1 + w)` into the weight; mlx-lm's Gemma norm adds the 1 itself, so `gguf.convert_weights`
subtracts 1 back), and its `ffn_norm` is the pre-feed-forward norm; phi3 keeps its fused
`attn_qkv` and `ffn_up` (gate and up) tensors, which are mlx-lm's `qkv_proj` and `gate_up_proj`
as they are, and its longrope factors arrive as `rope_factors_long/short` tensors.
"""

from __future__ import annotations

import re

from ..errors import ModelLoadError

SUPPORTED_ARCHITECTURES = ("llama", "qwen2", "qwen3", "gemma3", "phi3")

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
ARCHS: dict[str, tuple[str, dict[str, str]]] = {
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


def architecture(metadata: dict) -> str:
    """`general.architecture`, checked against the supported ones (ModelLoadError otherwise)."""
    arch = metadata.get("general.architecture")
    if not isinstance(arch, str):
        raise ModelLoadError("GGUF metadata has no general.architecture")
    if arch not in SUPPORTED_ARCHITECTURES:
        raise ModelLoadError(f"not supported yet: {arch}")
    return arch


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
    table = {**_LAYER_TENSORS, **ARCHS[arch][1]} if layer is not None else _TOP_TENSORS
    if base not in table:
        raise ModelLoadError(f"unexpected tensor in GGUF: {name}")
    prefix = f"model.layers.{layer}." if layer is not None else ""
    return f"{prefix}{table[base]}.{suffix}"
