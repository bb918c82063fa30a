"""Real-size decode figures without downloads: random-weight models with a real model's geometry.

Decode time depends on the shapes (layers, heads, head dim, MLP and vocabulary sizes, which layers
slide), not on what the weights or cached keys mean, so `a2ats bench decode --geometry NAME`
builds the named model's exact architecture from mlx-lm's own ModelArgs with random float32
weights, fills every KV cache synthetically to the context (random keys and values through
`update_and_fetch`: no prefill), and times greedy decode for mlx-lm's caches (`full`) and A2ATS
side by side. `calibration_throughput` times `a2ats calibrate` on the same model (random tokens),
so a user knows what calibrating a model of that size costs.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import replace
from typing import Any

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models.cache import make_prompt_cache

from ..cache.config import A2ATSConfig
from ..cache.model_cache import make_cache
from ..cache.topk import forced
from ..process_memory import growth
from .speed import DecodeResult, _decode_interleaved, cache_bytes

# name -> (what it is, config.json of the real model's text part: public Hugging Face configs)
GEOMETRIES: dict[str, tuple[str, dict[str, Any]]] = {
    "qwen3-0.6b": (
        "Qwen3-0.6B: 28 layers, 16 query / 8 KV heads, head_dim 128",
        {
            "model_type": "qwen3",
            "hidden_size": 1024,
            "intermediate_size": 3072,
            "num_hidden_layers": 28,
            "num_attention_heads": 16,
            "num_key_value_heads": 8,
            "head_dim": 128,
            "max_position_embeddings": 40960,
            "rms_norm_eps": 1e-6,
            "rope_theta": 1000000.0,
            "tie_word_embeddings": True,
            "vocab_size": 151936,
        },
    ),
    "llama-3.2-1b": (
        "Llama-3.2-1B: 16 layers, 32 query / 8 KV heads, head_dim 64, Llama-3 RoPE scaling",
        {
            "model_type": "llama",
            "hidden_size": 2048,
            "intermediate_size": 8192,
            "num_hidden_layers": 16,
            "num_attention_heads": 32,
            "num_key_value_heads": 8,
            "head_dim": 64,
            "max_position_embeddings": 131072,
            "rms_norm_eps": 1e-5,
            "rope_theta": 500000.0,
            "rope_scaling": {
                "factor": 32.0,
                "high_freq_factor": 4.0,
                "low_freq_factor": 1.0,
                "original_max_position_embeddings": 8192,
                "rope_type": "llama3",
            },
            "tie_word_embeddings": True,
            "vocab_size": 128256,
        },
    ),
    "gemma-3-1b": (
        "Gemma-3-1B: 26 layers (5 of 6 sliding, window 512), 4 query / 1 KV heads, head_dim 256",
        {
            "model_type": "gemma3_text",
            "hidden_size": 1152,
            "intermediate_size": 6912,
            "num_hidden_layers": 26,
            "num_attention_heads": 4,
            "num_key_value_heads": 1,
            "head_dim": 256,
            "max_position_embeddings": 32768,
            "query_pre_attn_scalar": 256,
            "rms_norm_eps": 1e-6,
            "rope_theta": 1000000.0,
            "rope_local_base_freq": 10000.0,
            "sliding_window": 512,
            "sliding_window_pattern": 6,
            "vocab_size": 262144,
        },
    ),
    "tiny": (
        "a 2-layer toy with Qwen3's layout (tests and smoke runs)",
        {
            "model_type": "qwen3",
            "hidden_size": 128,
            "intermediate_size": 256,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "head_dim": 64,
            "max_position_embeddings": 8192,
            "rms_norm_eps": 1e-6,
            "rope_theta": 1000000.0,
            "tie_word_embeddings": True,
            "vocab_size": 512,
        },
    ),
}


def geometry_config(name: str) -> dict[str, Any]:
    """The named geometry's config.json. ValueError naming the known ones."""
    if name not in GEOMETRIES:
        raise ValueError(f"geometry={name!r} is unknown: choose one of {', '.join(GEOMETRIES)}")
    return dict(GEOMETRIES[name][1])


def geometry_model(name: str, seed: int = 0, materialize: bool = True) -> nn.Module:
    """Random-weight float32 model with the named geometry (weights evaluated when
    `materialize`; unevaluated, the model costs no memory and still reports its shapes)."""
    from mlx_lm.utils import _get_classes

    config = geometry_config(name)
    model_class, args_class = _get_classes(config)
    mx.random.seed(seed)
    model = model_class(args_class.from_dict(config))
    if hasattr(model, "sanitize"):  # as loading a checkpoint does: ties Gemma 3's output head
        model.sanitize({})
    if materialize:
        mx.eval(model.parameters())
    return model


def parameter_count(model: nn.Module) -> int:
    from mlx.utils import tree_flatten

    return int(sum(v.size for _, v in tree_flatten(model.parameters())))


def fill_synthetic(
    model: nn.Module, caches: list, context: int, *, chunk: int = 1024, seed=0, codebook=None
):
    """Push `context` random keys/values (model dtype) through every KV cache's update_and_fetch.

    The shapes come from the layer plan's probe (per-layer head_dim and KV heads, so sliding
    and global layers may differ); caches of other kinds (conv / SSM state) stay empty.

    codebook: None for standard-normal keys. Given (the codebook the A2ATS caches use; pass it
    for the full caches too, so both hold the same keys), an A2ATS layer's keys are the centroids
    of uniformly random codes plus noise, rotated to their positions with the layer's RoPE: they
    spread over the codebook as a real cache's keys do. Standard-normal keys coded by a trained
    codebook fall on a few dozen codes, and the far scores are then mostly ties, which slow
    NumPy's argpartition several times and MLX's hardly (docs/BENCHMARKS.md, "Where a decode
    step's time goes"): a top-K strategy timed on them is not the one real text would pick."""
    from ..cache.layer_plan import A2ATS, plan_for, rope_spec_of

    dtype = _kv_dtype(model)
    key = mx.random.key(seed)
    plan = plan_for(model)
    shapes = {c.layer: (c.n_kv_heads, c.head_dim) for c in plan.layers if c.head_dim}
    ropes = {}
    if codebook is not None:
        ropes = {c.layer: rope_spec_of(model, c) for c in plan.layers if c.kind == A2ATS}
    for start in range(0, context, chunk):
        size = min(chunk, context - start)
        for i, cache in enumerate(caches):
            if i not in shapes:
                continue
            n_kv, hd = shapes[i]
            key, k1, k2, k3 = mx.random.split(key, 4)
            k = mx.random.normal((1, n_kv, size, hd), key=k1)
            if i in ropes:
                codes = mx.random.randint(
                    0, codebook.n_centroids, (1, n_kv, size, codebook.num_subspaces), key=k3
                )
                pre = codebook.reconstruct(i, codes)
                spread = mx.sqrt(mx.mean(pre * pre))  # noise a quarter of the keys' scale
                k = ropes[i].rotate(pre + 0.25 * spread * k, start)
            v = mx.random.normal((1, n_kv, size, hd), key=k2).astype(dtype)
            cache.update_and_fetch(k.astype(dtype), v)
        mx.eval([c.state for c in caches])


def _kv_dtype(model: nn.Module) -> mx.Dtype:
    """The dtype of the model's first weight (float32 here: what its K/V come out as)."""
    from mlx.utils import tree_flatten

    return tree_flatten(model.parameters())[0][1].dtype


def bench_geometry_decode(
    model: nn.Module,
    contexts: list[int],
    *,
    steps: int = 16,
    config: A2ATSConfig | None = None,
    codebook=None,
    seed: int = 0,
    progress=None,
    top_ks: tuple[str, ...] = (),
    estimate_at: int | None = None,
    estimate_steps: int | None = None,
) -> list[DecodeResult]:
    """Decode tokens/s and bytes held of `full` (mlx-lm's own caches) and `a2ats` (the layer
    plan's caches) at each context, both filled synthetically, timed interleaved; each result's
    `extra["anon_growth"]` is the process's measured private-memory growth over its fill. With `top_ks`
    ("mlx", "numpy"), one A2ATS method per top-K strategy instead (`a2ats_mlx`, ...). At context
    `estimate_at` each A2ATS method also runs with the missed-attention estimate on (`<name>_est`,
    `config`'s slot scores): what its default is measured by (`cache/crossover.py`); every
    method there decodes `estimate_steps` steps (`steps` where None)."""
    import random

    config = config or A2ATSConfig()
    vocab = int(model.args.vocab_size)
    rng = random.Random(seed)
    results = []
    for ci, n in enumerate(contexts):
        if progress:
            progress(f"fill {n}", ci, len(contexts))
        caches = {"full": make_prompt_cache(model)}
        for strategy in top_ks or (None,):
            with forced(strategy) if strategy else contextlib.nullcontext():
                name = f"a2ats_{strategy}" if strategy else "a2ats"
                caches[name] = make_cache(model, config, codebook)
                if n == estimate_at:
                    with_estimate = replace(config, estimate_missed=True)
                    caches[f"{name}_est"] = make_cache(model, with_estimate, codebook)
        grew = {
            method: _measured_fill(model, cache, n, seed, codebook)
            for method, cache in caches.items()
        }
        held = {method: cache_bytes(cache) for method, cache in caches.items()}
        timed = estimate_steps if n == estimate_at and estimate_steps else steps
        tokens = [rng.randrange(vocab) for _ in range(timed + 2)]
        rates = _decode_interleaved(model, caches, tokens)
        for method in caches:
            extra = {"anon_growth": grew[method]}
            results.append(
                DecodeResult(method, n, rates[method], held[method], held[method] / n, extra)
            )
        del caches
    return results


def _measured_fill(model: nn.Module, cache: list, n: int, seed: int, codebook) -> int | None:
    """Fill `cache` to `n` tokens (`fill_synthetic`) and return by how much the process's
    private resident memory grew (`process_memory.growth`): the measured side of the bytes the
    arrays hold."""
    with growth() as measured:
        fill_synthetic(model, cache, n, seed=seed, codebook=codebook)
    return measured["anon_growth"]


class _ByteTokenizer:
    """Bytes modulo the vocabulary: enough to feed a random-weight model a token stream."""

    eos_token_id = None

    def __init__(self, vocab: int) -> None:
        self.vocab = vocab

    def encode(self, text: str) -> list[int]:
        return [b % self.vocab for b in text.encode("utf-8")]


def calibration_throughput(
    model: nn.Module, config: A2ATSConfig, tokens: int = 4096, *, seed: int = 0
) -> dict[str, float]:
    """Seconds and tokens/s of `calibrate` on `tokens` random tokens: the forward pass that
    collects keys and query moments, then the codebook fit (k-means)."""
    import random

    from ..calibration.calibrate import calibrate

    rng = random.Random(seed)
    text = "".join(chr(rng.randrange(32, 127)) for _ in range(tokens))
    last: dict[str, float] = {}  # stage -> time of its latest progress report

    def progress(stage: str, done: int, total: int) -> None:
        last[stage] = time.perf_counter()

    began = time.perf_counter()
    calibrate(
        model,
        _ByteTokenizer(int(model.args.vocab_size)),
        [text],
        config,
        tokens=tokens,
        chunk_len=min(1024, tokens),
        heldout=0.0,
        seed=seed,
        progress=progress,
    )
    done = time.perf_counter()
    # the forward pass ends with its last "collecting" report (after the last chunk); the
    # k-means fit and the rest of calibrate follow
    fit_began = last.get("collecting", done)
    collect_s = fit_began - began
    return {
        "tokens": tokens,
        "collect_seconds": round(collect_s, 3),
        "fit_seconds": round(done - fit_began, 3),
        "collect_tokens_per_s": round(tokens / max(collect_s, 1e-9), 1),
        "tokens_per_s": round(tokens / max(done - began, 1e-9), 1),
    }
