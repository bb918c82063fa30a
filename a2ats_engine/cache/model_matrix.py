"""The model compatibility matrix: one tiny random-weight model per mlx-lm family, and its plan.

Each family is built from mlx-lm's own `ModelArgs` with tiny dims (4 layers, hidden 64, head dim
16), so its layer plan (`layer_plan.py`) is decided by the very code a real checkpoint of that
family runs. `tests/engine/cache/test_model_matrix.py` checks every supported family end to end
(equal greedy tokens and logits against the model's own cache, retrieval on every A2ATS layer,
save / load, trim) and every refused one's error; `docs/MODELS.md` is generated from the same rows:

    python -m a2ats_engine.cache.model_matrix --markdown > docs/MODELS.md
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from typing import Any

_BASE: dict[str, Any] = {
    "hidden_size": 64,
    "num_hidden_layers": 4,
    "intermediate_size": 128,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "rms_norm_eps": 1e-5,
    "vocab_size": 128,
    "max_position_embeddings": 4096,
    "rope_theta": 10000.0,
    "tie_word_embeddings": True,
}
_ALTERNATING = ["sliding_attention", "full_attention"] * 2
_MOE = {"num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32}

# family label -> (mlx-lm model_type, config overrides, what the case exercises)
FAMILIES: dict[str, tuple[str, dict[str, Any], str]] = {
    "llama": ("llama", {}, "default RoPE (Llama 2, Mistral, SmolLM2)"),
    "llama3": (
        "llama",
        {
            "rope_scaling": {
                "rope_type": "llama3",
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 512,
            }
        },
        "Llama 3.x RoPE scaling",
    ),
    "llama_sliding": (
        "llama",
        {"layer_types": _ALTERNATING, "sliding_window": 8},
        "Llama file with sliding layers (`layer_types`)",
    ),
    "ministral3": (
        "ministral3",
        {
            "rope_parameters": {
                "rope_theta": 10000.0,
                "rope_type": "default",
                "llama_4_scaling_beta": 0.1,
                "original_max_position_embeddings": 512,
            },
            "layer_types": _ALTERNATING,
            "sliding_window": 8,
        },
        "sliding + global layers, query scaling",
    ),
    "qwen2": ("qwen2", {}, "Qwen2 / Qwen2.5 (q/k/v bias)"),
    "qwen3": ("qwen3", {}, "Qwen3 (q/k norm)"),
    "qwen3_moe": (
        "qwen3_moe",
        {**_MOE, "decoder_sparse_step": 1, "mlp_only_layers": [], "norm_topk_prob": True},
        "Qwen3 MoE",
    ),
    "qwen3_next": (
        "qwen3_next",
        {
            **_MOE,
            "linear_num_value_heads": 2,
            "linear_num_key_heads": 2,
            "linear_key_head_dim": 16,
            "linear_value_head_dim": 16,
            "linear_conv_kernel_dim": 4,
            "decoder_sparse_step": 1,
            "shared_expert_intermediate_size": 32,
            "mlp_only_layers": [],
            "partial_rotary_factor": 0.5,
            "full_attention_interval": 2,
        },
        "hybrid: gated delta-net linear attention + partial-rotary attention",
    ),
    "gemma": ("gemma", {}, "Gemma (norm +1)"),
    "gemma2": (
        "gemma2",
        {"query_pre_attn_scalar": 16, "attn_logit_softcapping": 50.0},
        "logit soft-capping, attention written out in the model file",
    ),
    "gemma3_text": (
        "gemma3_text",
        {"sliding_window": 8, "sliding_window_pattern": 2, "query_pre_attn_scalar": 16},
        "sliding + global layers (two RoPE bases)",
    ),
    "gemma4_text": (
        "gemma4_text",
        {
            "global_head_dim": 32,
            "num_kv_shared_layers": 0,
            "hidden_size_per_layer_input": 0,
            "vocab_size_per_layer_input": 128,
            "sliding_window": 8,
            "sliding_window_pattern": 2,
            "layer_types": _ALTERNATING,
        },
        "sliding + global layers, wider partial-rotary global heads",
    ),
    "phi3": (
        "phi3",
        {
            "rope_scaling": {
                "type": "longrope",
                "short_factor": [1.0] * 8,
                "long_factor": [2.0] * 8,
            },
            "original_max_position_embeddings": 1024,
            "max_position_embeddings": 8192,
        },
        "Phi-3 / Phi-4 longrope, fused qkv",
    ),
    "phi": (
        "phi",
        {"partial_rotary_factor": 0.5, "layer_norm_eps": 1e-5, "num_key_value_heads": 4},
        "partial rotary",
    ),
    "starcoder2": ("starcoder2", {}, "StarCoder2"),
    "olmo2": ("olmo2", {}, "OLMo 2"),
    "olmo3": (
        "olmo3",
        {"sliding_window": 8, "layer_types": ["sliding_attention"] * 3 + ["full_attention"]},
        "3 sliding : 1 global",
    ),
    "granite": (
        "granite",
        {
            "logits_scaling": 1.0,
            "attention_multiplier": 0.25,
            "embedding_multiplier": 1.0,
            "residual_multiplier": 1.0,
            "attention_bias": False,
            "mlp_bias": False,
        },
        "Granite (attention multiplier)",
    ),
    "glm4": (
        "glm4",
        {"attention_bias": False, "partial_rotary_factor": 0.5},
        "interleaved partial rotary",
    ),
    "internlm3": ("internlm3", {}, "InternLM3"),
    "cohere2": (
        "cohere2",
        {"sliding_window": 8, "sliding_window_pattern": 2, "layer_norm_eps": 1e-5},
        "sliding RoPE layers + global layers without RoPE",
    ),
    "gpt_oss": (
        "gpt_oss",
        {
            "num_local_experts": 4,
            "num_experts_per_tok": 2,
            "sliding_window": 8,
            "layer_types": _ALTERNATING,
        },
        "sliding + global layers, attention sinks",
    ),
    "smollm3": ("smollm3", {"no_rope_layer_interval": 2}, "NoPE every 2nd layer"),
    "exaone4": (
        "exaone4",
        {"sliding_window": 8, "sliding_window_pattern": "LLLG", "rope_scaling": None},
        "sliding RoPE layers + global layers without RoPE",
    ),
    "lfm2": (
        "lfm2",
        {
            "norm_eps": 1e-5,
            "conv_bias": False,
            "conv_L_cache": 3,
            "block_dim": 64,
            "block_multiple_of": 16,
            "block_ffn_dim_multiplier": 1.0,
            "block_auto_adjust_ff_dim": False,
            "block_ff_dim": 128,
            "full_attn_idxs": [1, 3],
        },
        "hybrid: short convolutions + attention",
    ),
    "deepseek_v3": (
        "deepseek_v3",
        {
            "kv_lora_rank": 16,
            "q_lora_rank": 32,
            "qk_rope_head_dim": 8,
            "v_head_dim": 16,
            "qk_nope_head_dim": 16,
            "n_routed_experts": 4,
            "n_shared_experts": 1,
            "moe_intermediate_size": 32,
            "num_experts_per_tok": 2,
            "first_k_dense_replace": 1,
        },
        "multi-head latent attention (MLA)",
    ),
}


@dataclass(frozen=True)
class MatrixRow:
    """One family's line of the matrix (what docs/MODELS.md shows)."""

    family: str
    model_type: str
    status: str  # "supported" | "refused"
    a2ats_layers: int
    native_layers: int
    total_layers: int
    reason: str
    exercises: str


def family_config(family: str) -> dict[str, Any]:
    """config.json contents of the family's tiny model."""
    model_type, overrides, _ = FAMILIES[family]
    return {**_BASE, **overrides, "model_type": model_type}


def tiny_family_model(family: str, seed: int = 0):
    """The family's tiny random-weight mlx-lm model (float32)."""
    import mlx.core as mx
    from mlx_lm.utils import _get_classes

    config = family_config(family)
    model_class, args_class = _get_classes(config)
    mx.random.seed(seed)
    model = model_class(args_class.from_dict(config))
    mx.eval(model.parameters())
    return model


def family_row(family: str, model=None) -> MatrixRow:
    """Decide the family's plan and summarise it as a MatrixRow."""
    from .layer_plan import NATIVE, plan_for

    plan = plan_for(model if model is not None else tiny_family_model(family))
    native = [c for c in plan.layers if c.kind == NATIVE]
    if plan.refused:
        status, reason = "refused", plan.refused
    else:
        status = "supported"
        reason = "; ".join(f"{r} ({n})" for r, n in plan.native_reasons().items()) or "-"
    return MatrixRow(
        family,
        plan.model_type,
        status,
        len(plan.a2ats_layers) if not plan.refused else 0,
        len(native) if not plan.refused else plan.num_layers,
        plan.num_layers,
        reason,
        FAMILIES[family][2],
    )


def markdown(rows: list[MatrixRow]) -> str:
    """docs/MODELS.md: the table and how it is made."""
    lines = [
        "# Models A2ATS Chat runs",
        "",
        "Generated by `python -m a2ats_engine.cache.model_matrix --markdown > docs/MODELS.md`;",
        "`tests/engine/cache/test_model_matrix.py` fails when this file differs from what the code",
        "decides. Each row is a tiny random-weight model (4 layers) built from the installed",
        "mlx-lm's own model file, so the layer plan is the one a real checkpoint of that family",
        "gets. *A2ATS* layers are global RoPE attention served by the A2ATS cache; *native*",
        "layers keep the model's own cache (sliding windows keep their `RotatingKVCache`, linear",
        "attention / convolution layers their state, NoPE and latent-attention layers a plain",
        "cache). A refused model is refused when its cache is made, with the reason below.",
        "Supported families are checked end to end: with a budget that keeps every token, greedy",
        "tokens and logits equal the model's own cache; with a small budget every A2ATS layer",
        "retrieves; save / load and trim round-trip. `a2ats info SOURCE` prints the plan of any",
        "model.",
        "",
        "| family | model_type | status | A2ATS layers | native layers | native / refusal reason "
        "| exercises |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r.family} | `{r.model_type}` | {r.status} | {r.a2ats_layers} of "
            f"{r.total_layers} | {r.native_layers} | {r.reason} "
            f"| {r.exercises} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m a2ats_engine.cache.model_matrix")
    parser.add_argument("--markdown", action="store_true", help="print docs/MODELS.md")
    args = parser.parse_args(argv)
    rows = [family_row(f) for f in FAMILIES]
    if args.markdown:
        sys.stdout.write(markdown(rows))
    else:
        for r in rows:
            print(f"{r.family:12s} {r.status:9s} a2ats {r.a2ats_layers} native {r.native_layers}")
    return 0


if __name__ == "__main__":
    import a2ats_engine  # noqa: F401  (BLAS preload before mlx.core)

    raise SystemExit(main())
