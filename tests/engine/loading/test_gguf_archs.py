"""GGUF import of qwen2, qwen3, gemma3 and phi3: a tiny GGUF written the way llama.cpp's converter
lays those architectures out gives the logits of the same weights loaded as an mlx-lm folder."""

from __future__ import annotations

import json

import mlx.core as mx
import numpy as np
import pytest
from mlx.utils import tree_flatten, tree_unflatten
from mlx_lm.utils import load as mlx_lm_load
from tiny import save_tiny_model, tiny_model

from a2ats_engine.loading import gguf, gguf_archs, gguf_config
from a2ats_engine.loading.models import load_model

from ..gguf_fixtures import arch_metadata, tiny_gguf_metadata, write_gguf

PROMPT_IDS = mx.array([[1, 5, 17, 42, 99, 150, 230, 301, 7, 64, 3, 2, 256, 128, 9, 33, 11]])
LONGROPE = {
    "type": "longrope",
    "short_factor": [1.0, 1.1, 1.3, 1.7],
    "long_factor": [1.5, 2.0, 3.0, 4.0],
}
# family -> (GGUF architecture, tiny_model overrides)
CASES = {
    "qwen2": ("qwen2", {}),
    "qwen3": ("qwen3", {"head_dim": 16}),
    "gemma3": (
        "gemma3",
        {
            "model_type": "gemma3_text",
            "head_dim": 16,
            "num_hidden_layers": 6,
            "sliding_window": 8,
            "sliding_window_pattern": 6,
            "query_pre_attn_scalar": 16,
            "rope_local_base_freq": 10000.0,
        },
    ),
    "phi3": (
        "phi3",
        {
            "partial_rotary_factor": 0.5,
            "rope_scaling": LONGROPE,
            "original_max_position_embeddings": 1024,
            "max_position_embeddings": 8192,
            "tie_word_embeddings": False,
        },
    ),
}
# llama.cpp tensor names (src/llama-arch.cpp), per mlx-lm module
_COMMON = {
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "self_attn.q_norm": "attn_q_norm",
    "self_attn.k_norm": "attn_k_norm",
    "input_layernorm": "attn_norm",
    "post_attention_layernorm": "ffn_norm",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
}
_NAMES = {
    "qwen2": _COMMON,
    "qwen3": _COMMON,
    "gemma3": {
        **_COMMON,
        "post_attention_layernorm": "post_attention_norm",
        "pre_feedforward_layernorm": "ffn_norm",
        "post_feedforward_layernorm": "post_ffw_norm",
    },
    "phi3": {**_COMMON, "self_attn.qkv_proj": "attn_qkv", "mlp.gate_up_proj": "ffn_up"},
}
_TOP = {"model.embed_tokens": "token_embd", "model.norm": "output_norm", "lm_head": "output"}


def randomized_norms(model, seed: int):
    """Give every norm weight random values (a ones-initialised norm would hide a wrong +-1)."""
    rng = np.random.default_rng(seed)
    updates = [
        (name, mx.array(rng.uniform(0.5, 1.5, size=value.shape).astype(np.float32)))
        for name, value in tree_flatten(model.parameters())
        if "norm" in name
    ]
    model.update(tree_unflatten(updates))
    mx.eval(model.parameters())
    return model


def gguf_tensors(model, arch: str) -> dict[str, np.ndarray]:
    """The model's weights as llama.cpp writes this architecture: GGUF names, no Q/K
    permutation (NEOX RoPE), Gemma norms stored as 1 + w, phi3 longrope factors as tensors."""
    out = {}
    for name, value in tree_flatten(model.parameters()):
        array = np.array(value.astype(mx.float32))
        module, suffix = name.rsplit(".", 1)
        if module in _TOP:
            key = f"{_TOP[module]}.{suffix}"
        else:
            _, _, layer, rest = module.split(".", 3)
            key = f"blk.{layer}.{_NAMES[arch][rest]}.{suffix}"
        if arch == "gemma3" and key.endswith("norm.weight"):
            array = array + 1.0
        out[key] = array
    if arch == "phi3":
        out["rope_factors_long.weight"] = np.array(LONGROPE["long_factor"], np.float32)
        out["rope_factors_short.weight"] = np.array(LONGROPE["short_factor"], np.float32)
    return out


def gguf_metadata(config: dict, arch: str) -> dict:
    """llama.cpp metadata keys of `arch` for the tiny config, plus the tiny tokenizer."""
    base = tiny_gguf_metadata(config)
    out = {k: v for k, v in base.items() if not k.startswith("llama.")}
    head_dim = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
    rope_dims = int(head_dim * config.get("partial_rotary_factor", 1.0))
    out.update(arch_metadata(config, arch, head_dim=head_dim, rope_dims=rope_dims))
    if arch == "gemma3":
        out["gemma3.attention.sliding_window"] = ("u32", config["sliding_window"])
    if arch == "phi3":
        out["phi3.rope.scaling.original_context_length"] = (
            "u32",
            config["original_max_position_embeddings"],
        )
    return out


@pytest.mark.parametrize("family", sorted(CASES))
def test_gguf_gives_the_logits_of_the_mlx_lm_folder(family, tmp_path):
    arch, case = CASES[family]
    model_type = case.get("model_type", family)
    overrides = {k: v for k, v in case.items() if k != "model_type"}
    folder = save_tiny_model(tmp_path / "mlx", model_type, seed=4, **overrides)
    reference, _ = mlx_lm_load(str(folder))
    randomized_norms(reference, seed=5)
    model_config = json.loads((folder / "config.json").read_text())
    path = write_gguf(
        tmp_path / f"{family}.gguf",
        gguf_tensors(reference, arch),
        gguf_metadata(model_config, arch),
    )
    converted = gguf.convert_gguf(path, tmp_path / "converted")
    config = json.loads((converted / "config.json").read_text())
    assert config["model_type"] == model_type
    assert config["rope_traditional"] is False  # NEOX pairing, rows not permuted
    model, _, info = load_model(str(converted), dequantize=False)
    assert info.architecture == model_type
    ours = np.array(model(PROMPT_IDS).astype(mx.float32))
    theirs = np.array(reference(PROMPT_IDS).astype(mx.float32))
    np.testing.assert_allclose(ours, theirs, atol=2e-4, rtol=1e-4)


def test_gemma3_config_fills_what_llama_cpp_hard_codes(tmp_path):
    overrides = {k: v for k, v in CASES["gemma3"][1].items() if k != "model_type"}
    model = tiny_model("gemma3_text", seed=1, **overrides)
    metadata = gguf_metadata(model.config, "gemma3")
    tensors = {k: mx.array(v) for k, v in gguf_tensors(model, "gemma3").items()}
    config = gguf_config.model_config(gguf_metadata_plain(metadata), tensors)
    assert config["sliding_window_pattern"] == gguf_archs.GEMMA3_SLIDING_PATTERN
    assert config["rope_local_base_freq"] == 10000.0
    assert config["query_pre_attn_scalar"] == 16 and config["sliding_window"] == 8


def gguf_metadata_plain(metadata: dict) -> dict:
    from ..gguf_fixtures import plain_metadata

    return plain_metadata(metadata)


def test_gguf_tensor_names_per_architecture():
    assert gguf_archs.mlx_tensor_name("blk.2.attn_qkv.weight", "phi3") == (
        "model.layers.2.self_attn.qkv_proj.weight"
    )
    assert (
        gguf_archs.mlx_tensor_name("blk.0.ffn_up.weight", "phi3")
        == "model.layers.0.mlp.gate_up_proj.weight"
    )
    assert gguf_archs.mlx_tensor_name("blk.1.ffn_norm.weight", "gemma3") == (
        "model.layers.1.pre_feedforward_layernorm.weight"
    )
    assert gguf_archs.mlx_tensor_name("blk.1.ffn_norm.weight", "llama") == (
        "model.layers.1.post_attention_layernorm.weight"
    )
    assert gguf_archs.mlx_tensor_name("blk.3.attn_k_norm.weight", "qwen3") == (
        "model.layers.3.self_attn.k_norm.weight"
    )
    assert gguf_archs.mlx_tensor_name("rope_factors_long.weight", "phi3") is None
