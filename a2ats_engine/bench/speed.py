"""Decode speed and cache memory of A2ATS vs mlx-lm's KVCache, measured in one process.

One prefill per context length (with mlx-lm's KVCache); the A2ATS caches are then built from the
same keys and values (codes assigned in one pass), so every method decodes from an identical
state. Each method then decodes greedily the way mlx-lm's `generate_step` does (the next step's
graph is built while the current step computes, every token read back on the host), the methods
taking turns a few steps at a time (so changes in machine load hit all of them alike);
tokens/s is steps / seconds. The first `UNTIMED` steps of each method are not timed: they
cover the estimate's warm-up where it runs on the layers that miss most (every layer runs it
until the choice, `estimate_layers.WARMUP` steps; before 2026-12-06 two steps were untimed).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from typing import Any

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models.cache import QuantizedKVCache, RotatingKVCache, make_prompt_cache

from ..cache import native_step
from ..cache.a2ats_cache import A2ATSCache
from ..cache.config import A2ATSConfig
from ..cache.estimate_layers import WARMUP
from ..cache.model_cache import make_cache, snapshot
from ..process_memory import growth, mlx_memory
from .methods import decode_variant_knobs, host_step_variant
from .plan_caches import clone_native, feed_prompt, is_plain

UNTIMED = WARMUP + 2  # decode steps before the timed ones: the estimate's choice made


@dataclass
class DecodeResult:
    """One method at one context: tokens/s, bytes held and bytes per token."""

    method: str
    context: int
    tokens_per_s: float
    bytes_held: int
    bytes_per_token: float
    extra: dict[str, Any] = field(default_factory=dict)


def filler_tokens(tokenizer, n: int) -> list[int]:
    """n tokens of real English/code text (Python's own stdlib sources), deterministic."""
    import argparse
    import inspect
    import textwrap

    text = textwrap.dedent(inspect.getsource(argparse))
    ids = tokenizer.encode(text)
    while len(ids) < n:
        ids = ids + ids
    return ids[:n]


_is_plain = is_plain
_clone_native = clone_native  # a deep copy: an ArraysCache's list of states is not shared


def _copy_into_a2ats(model: nn.Module, kv: list, config: A2ATSConfig, codebook) -> list:
    """The A2ATS caches of the model's plan, holding what `kv` (the prefilled native caches)
    holds: an A2ATS layer gets the keys and values (codes assigned in one pass), a native layer
    (sliding window, linear attention...) a copy of the model's own cache, as the app runs it."""
    caches = make_cache(model, config, codebook)
    for i, (dst, src) in enumerate(zip(caches, kv, strict=True)):
        if not isinstance(dst, A2ATSCache):
            caches[i] = _clone_native(src)
            continue
        k, v = src.keys[..., : src.offset, :], src.values[..., : src.offset, :]
        dst.update_and_fetch(k, v)
        mx.eval(dst.state)
    return caches


def _copy_into_quantized(kv: list, bits: int) -> list:
    """mlx-lm's QuantizedKVCache for every plain KVCache layer; the model's own special caches
    (sliding windows: mlx-lm has no quantized rotating cache) are copied unchanged."""
    out = []
    for src in kv:
        if not _is_plain(src):
            out.append(_clone_native(src))
            continue
        q = QuantizedKVCache(group_size=64, bits=bits)
        q.update_and_fetch(src.keys[..., : src.offset, :], src.values[..., : src.offset, :])
        mx.eval(q.keys, q.values)
        out.append(q)
    return out


def _clone_kv(kv: list) -> list:
    """`full`: an independent copy of the model's own caches (mlx-lm's `make_prompt_cache`)."""
    return [_clone_native(src) for src in kv]


def _greedy_step(model: nn.Module, cache: list, token: mx.array) -> mx.array:
    """One lazy greedy decode step: token [1] -> next token [1] (nothing evaluated)."""
    logits = model(token[None], cache=cache)
    return mx.argmax(logits[:, -1, :], axis=-1)


def _decode_chunk(model: nn.Module, cache: list, token: mx.array, n: int) -> tuple[float, mx.array]:
    """Seconds for n greedy decode steps from `token`, pipelined like mlx-lm's `generate_step`
    (the next step's graph is built while the current one computes; each token is read back on
    the host, as a chat app does). With telemetry on, each token is followed by the cache's
    snapshot, as the app's session takes one for the inspector (the newest step's stats are
    made then: `layer_stats.py`). Returns (seconds, last token)."""
    watched = any(isinstance(c, A2ATSCache) and c.config.telemetry for c in cache)
    began = time.perf_counter()
    y = _greedy_step(model, cache, token)
    mx.async_eval(y)
    for _ in range(n - 1):
        nxt = _greedy_step(model, cache, y)
        mx.async_eval(nxt)
        token_id = y.item()
        if watched:
            snapshot(cache, token_id)
        y = nxt
    token_id = y.item()
    if watched:
        snapshot(cache, token_id)
    return time.perf_counter() - began, y


def _decode_interleaved(
    model: nn.Module, caches: dict[str, list], tokens: list[int], warmup: int = 2, chunk: int = 4
) -> dict[str, float]:
    """Tokens/s per method: greedy decoding of len(tokens) - warmup steps from tokens[0].

    Methods take turns `chunk` steps at a time, so a change in machine load (other processes on
    a shared CPU) hits every method alike instead of whichever ran at that moment."""
    last = {}
    for name, cache in caches.items():
        _, last[name] = _decode_chunk(model, cache, mx.array([tokens[0]]), warmup)
    seconds = dict.fromkeys(caches, 0.0)
    remaining = len(tokens) - warmup
    while remaining > 0:
        n = min(chunk, remaining)
        for name, cache in caches.items():
            sec, last[name] = _decode_chunk(model, cache, last[name], n)
            seconds[name] += sec
        remaining -= n
    timed = len(tokens) - warmup
    return {name: timed / max(sec, 1e-9) for name, sec in seconds.items()}


def cache_bytes(cache: list) -> int:
    return int(sum(c.nbytes for c in cache))


def bench_decode(
    model: nn.Module,
    tokenizer,
    contexts: list[int],
    *,
    steps: int = 32,
    config: A2ATSConfig | None = None,
    codebook=None,
    methods: tuple[str, ...] = ("full", "a2ats", "a2ats_kv4"),
    progress=None,
) -> list[DecodeResult]:
    """Decode tokens/s and bytes held per method and context (see module docstring).

    Methods: full (mlx-lm KVCache), kv8 / kv4 (mlx-lm QuantizedKVCache), a2ats (A2ATS with
    `config`), a2ats_kv4 / a2ats_kv8 (the same with kv_bits), a2ats_rr<N> (rerank N),
    a2ats_telemetry (telemetry on); suffixes combine in that order (a2ats_kv4_rr2); a last
    `_npstep` keeps the NumPy host step (`cache/native_step.py`) for that method's caches, a
    last `_sync` the synced C++ step instead of the graph step (`cache/graph_step.py`).
    """
    config = config or A2ATSConfig()
    results = []
    for ci, n in enumerate(contexts):
        ids = filler_tokens(tokenizer, n + steps + UNTIMED)
        prompt, follow = ids[:n], ids[n : n + steps + UNTIMED]
        if progress:
            progress(f"prefill {n}", ci, len(contexts))
        base = make_prompt_cache(model)
        for start in range(0, n, 256):  # chunked prefill: fastest on a small CPU, bounded memory
            feed_prompt(model, prompt[start : start + 256], base)
        caches = {
            method: _method_cache(model, base, method, config, codebook) for method in methods
        }
        held = {method: cache_bytes(cache) for method, cache in caches.items()}
        rates = _decode_interleaved(model, caches, follow, warmup=UNTIMED)
        for method, cache in caches.items():
            extra = {}
            own = [c for c in cache if isinstance(c, A2ATSCache)]
            if own:
                extra["retrieved_per_step"] = sum(c.tokens_retrieved for c in own) / (
                    len(own) * len(follow)
                )
                extra["a2ats_layers"] = len(own)
                extra["estimate"] = any(c.estimates for c in own)  # as asked or as measured here
                retrieving = any(c.retrieved_steps for c in own)  # else no step estimated
                extra["estimate_layers"] = sum(c.estimates for c in own) if retrieving else 0
                extra["host_step"] = _host_step(own)
                sums = [c.retrieval.host_missed[1] for c in own if c.retrieval.host_missed]
                sums += [c.retrieval.graph_sums[0] for c in own if c.retrieval.graph_sums]
                if sums:  # the host step's estimate (synced or in the graph): occupied slots
                    shares = [r.rows_used / r.n_slots for r in sums]
                    extra["estimate_rows_share"] = sum(shares) / len(shares)
            results.append(
                DecodeResult(method, n, rates[method], held[method], held[method] / n, extra)
            )
        del caches, base
    return results


def _host_step(own: list[A2ATSCache]) -> str:
    """The host step a method's caches ran (`native_step.status`, or what its suffix kept)."""
    if any(getattr(c, "numpy_step", False) for c in own):
        return "NumPy"
    if any(getattr(c, "synced_step", False) for c in own) and native_step.on():
        return native_step.SYNCED
    return native_step.status()


def _window_copy(kv: list, config: A2ATSConfig) -> list:
    """`window`: every plain layer attends exactly its first `sinks` tokens and the most recent
    `window + K` (K = the retrieval budget at this context) through mlx-lm's RotatingKVCache:
    as many positions as A2ATS attends, contiguous, with nothing scored or selected. The speed
    ceiling of any method that attends that many tokens (its quality is the recency window's)."""
    out = []
    for src in kv:
        if not _is_plain(src):
            out.append(_clone_native(src))
            continue
        n = src.offset
        keep = min(config.sinks, n)
        size = min(n, keep + config.window + config.top_k(n))
        cache = RotatingKVCache(max_size=max(size, keep + 1), keep=keep)
        parts = [(src.keys[..., :keep, :], src.values[..., :keep, :])] if keep else []
        tail = size - keep
        parts.append((src.keys[..., n - tail : n, :], src.values[..., n - tail : n, :]))
        k = mx.concatenate([p[0] for p in parts], axis=2)
        v = mx.concatenate([p[1] for p in parts], axis=2)
        cache.update_and_fetch(k, v)
        cache.offset = n  # positions continue from the context (RoPE offsets match `full`)
        mx.eval(cache.keys, cache.values)
        out.append(cache)
    return out


def _method_cache(model: nn.Module, base: list, method: str, config: A2ATSConfig, codebook):
    if method == "full":
        return _clone_kv(base)
    if method == "window":
        return _window_copy(base, config)
    if method in ("kv8", "kv4"):
        return _copy_into_quantized(base, int(method[-1]))
    method, step_attribute = host_step_variant(method)
    knobs = decode_variant_knobs(method)
    if knobs is not None:
        caches = _copy_into_a2ats(model, base, replace(config, **knobs), codebook)
        for c in caches:
            if step_attribute and isinstance(c, A2ATSCache):  # read by `native_step.selects`
                setattr(c, step_attribute, True)  # or `graph_step.applies`
        return caches
    raise ValueError(f"unknown method {method!r}")


def fp16_bytes_per_token(model: nn.Module) -> int:
    """K+V bytes per token of an fp16 full cache for this model (all layers)."""
    from ..cache.geometry import model_geometry

    geo = model_geometry(model)
    return 2 * geo.num_layers * geo.num_kv_heads * geo.head_dim * 2


# -- memory -------------------------------------------------------------------------------------

MEMORY_METHODS = ("full", "kv8", "kv4", "a2ats", "a2ats_kv8", "a2ats_kv4")


@dataclass
class MemoryResult:
    """Bytes one method's caches hold for `context` tokens (all layers).

    bytes_held: everything held, fixed costs included; bytes_per_token: the per-token storage
    only (K/V, codes), what each further token adds; fixed_bytes: what does not grow with the
    context (A2ATS: the codebook, counted once per model and shared by all its chats, and each
    layer's rotation matrices); codebook_bytes: the codebook's part of fixed_bytes."""

    method: str
    context: int
    bytes_held: int
    bytes_per_token: float
    fixed_bytes: int = 0
    codebook_bytes: int = 0
    measured: dict[str, int | None] = field(default_factory=dict)  # see `bench_memory`


def break_even_context(per_token: float, fixed: float, baseline_per_token: float) -> int | None:
    """Smallest context n at which `per_token * n + fixed` < `baseline_per_token * n`: where a
    cache with a fixed cost starts to hold less than a baseline without one. None when it never
    does (its per-token bytes are not below the baseline's)."""
    gain = baseline_per_token - per_token
    if gain <= 0:
        return None
    return int(fixed // gain) + 1


def kv_dtype(model: nn.Module) -> mx.Dtype:
    """The dtype the model's attention hands its cache (one-token forward into a KVCache)."""
    cache = make_prompt_cache(model)
    mx.eval(model(mx.array([[0]]), cache=cache))
    return cache[0].keys.dtype


def _memory_result(method: str, n: int, caches: list) -> MemoryResult:
    """Split what `caches` hold after `n` tokens into per-token storage and fixed costs."""
    from ..cache.model_cache import model_codebook_bytes

    layers = [c for c in caches if isinstance(c, A2ATSCache)]
    codebook = model_codebook_bytes(caches)
    extras = sum(c.nbytes - c.resident_bytes for c in layers)  # rotations, estimate sums
    fixed = codebook + extras
    storage = cache_bytes(caches) - extras
    return MemoryResult(method, n, storage + fixed, storage / n, fixed, codebook)


def _memory_caches(model: nn.Module, method: str, config: A2ATSConfig, codebook) -> list:
    """The caches a method holds: the model's own (`make_prompt_cache`: sliding layers keep a
    RotatingKVCache) for `full`; kv8/kv4 quantize its plain KVCache layers; A2ATS follows the
    model's layer plan (`make_cache`)."""
    native = make_prompt_cache(model)
    if method == "full":
        return native
    if method in ("kv8", "kv4"):
        bits = int(method[-1])
        return [QuantizedKVCache(group_size=64, bits=bits) if _is_plain(c) else c for c in native]
    if method in ("a2ats", "a2ats_kv8", "a2ats_kv4"):
        bits = None if method == "a2ats" else int(method[-1])
        return make_cache(model, replace(config, kv_bits=bits), codebook)
    raise ValueError(f"unknown memory method {method!r}; known: {', '.join(MEMORY_METHODS)}")


def _fill_random(caches: list, n: int, shape: tuple, dtype, key: mx.array, chunk: int) -> mx.array:
    """Fill `caches` with `n` tokens of random keys/values, `chunk` at a time; the next key."""
    for start in range(0, n, chunk):
        size = min(chunk, n - start)
        k1, k2, key = mx.random.split(key, 3)
        for cache in caches:
            k = mx.random.normal((*shape[:2], size, shape[3]), key=k1).astype(dtype)
            v = mx.random.normal((*shape[:2], size, shape[3]), key=k2).astype(dtype)
            cache.update_and_fetch(k, v)
        mx.eval([c.state for c in caches])
    return key


def bench_memory(
    model: nn.Module,
    contexts: list[int],
    *,
    methods: tuple[str, ...] = MEMORY_METHODS,
    config: A2ATSConfig | None = None,
    codebook=None,
    chunk: int = 4096,
    seed: int = 0,
) -> list[MemoryResult]:
    """Bytes held per token by each method's caches after `context` tokens.

    The caches are filled through `update_and_fetch` with random keys/values of the model's
    geometry and K/V dtype (what a cache holds does not depend on the values; A2ATS codes are
    assigned as usual), so no model forward is needed beyond one token to find the dtype.
    Besides the bytes the arrays hold, each result's `measured` gives what was measured for
    that fill (`process_memory.growth`: MLX's active-memory growth, and the process's private
    memory growth, clean only for the first fill of a process, so `a2ats bench cold` runs a
    process per method where that figure matters) and MLX's `mlx_active` and `mlx_peak` bytes.
    """
    from ..cache.geometry import model_geometry

    config = config or A2ATSConfig()
    geo = model_geometry(model)
    shape = (1, geo.num_kv_heads, 0, geo.head_dim)
    dtype = kv_dtype(model)
    key = mx.random.key(seed)
    results = []
    for n in contexts:
        for method in methods:
            mx.reset_peak_memory()
            with growth() as measured:
                caches = _memory_caches(model, method, config, codebook)
                key = _fill_random(caches, n, shape, dtype, key, chunk)
            result = _memory_result(method, n, caches)
            result.measured = {**measured, **mlx_memory()}
            results.append(result)
            del caches
    return results


# -- prefill / time to first token ------------------------------------------------------------

PREFILL_METHODS = ("full", "a2ats", "a2ats_cold")  # cold: every K/V row in the cold tier


def time_to_first_token(
    model: nn.Module, caches: list, ids: list[int], chunk: int = 2048
) -> tuple[float, int]:
    """(seconds, first token) of a prefill the way the app runs one (mlx-lm's `generate_step`):
    `chunk`-token pieces (`prefill_step_size`, the chat session's 2048) while more than a chunk
    remains, every cache's state evaluated (A2ATS codes and quantized K/V included, not left
    lazy), then the rest in one call whose last logits give the greedy first token, read back
    on the host."""
    began = time.perf_counter()
    rest = list(ids)
    while len(rest) > chunk:
        model(mx.array([rest[:chunk]]), cache=caches)
        mx.eval([c.state for c in caches])
        rest = rest[chunk:]
    logits = model(mx.array([rest]), cache=caches)
    token = int(mx.argmax(logits[0, -1]).item())
    mx.eval([c.state for c in caches])
    return time.perf_counter() - began, token


def bench_prefill(
    model: nn.Module,
    tokenizer,
    contexts: list[int],
    *,
    config: A2ATSConfig | None = None,
    codebook=None,
    repeats: int = 3,
    chunk: int = 2048,
    methods: tuple[str, ...] = ("full", "a2ats"),
) -> list[dict[str, Any]]:
    """Time to first token of `full` (mlx-lm's caches), `a2ats` (the model's layer plan with
    `config`) and `a2ats_cold` (the same with every K/V row in the cold tier: each chunk's exact
    attention reads the past back from the file) for a `context`-token prompt: per context,
    `repeats` rounds in which every method prefills the same tokens, in alternating order (load
    changes hit all alike). Rows carry the median seconds, and for A2ATS methods the median of
    the per-round ratios to `full` with their spread. Every method must produce full's first
    token (exact prefill): a mismatch raises."""
    config = config or A2ATSConfig()
    configs = {"a2ats": config, "a2ats_cold": replace(config, kv_bits=None, kv_memory=0)}
    if "full" not in methods or not set(methods) <= set(PREFILL_METHODS):
        raise ValueError(f"prefill methods {methods}: 'full' and any of {PREFILL_METHODS}")
    rows = []
    for n in contexts:
        ids = filler_tokens(tokenizer, n)
        seconds: dict[str, list[float]] = {m: [] for m in methods}
        for r in range(repeats):
            order = methods if r % 2 == 0 else methods[::-1]
            tokens = {}
            for method in order:
                caches = (
                    make_prompt_cache(model)
                    if method == "full"
                    else make_cache(model, configs[method], codebook)
                )
                seconds[method].append(0.0)
                seconds[method][-1], tokens[method] = time_to_first_token(model, caches, ids, chunk)
                del caches
            for method in methods:
                if tokens[method] != tokens["full"]:
                    raise RuntimeError(
                        f"prefill of {n} tokens: {method}'s first token {tokens[method]} differs "
                        f"from full's {tokens['full']} (prefill attention must be exact)"
                    )
        for method in methods:
            row: dict[str, Any] = {
                "method": method,
                "context": n,
                "seconds": round(sorted(seconds[method])[len(seconds[method]) // 2], 3),
                "seconds_runs": [round(s, 3) for s in seconds[method]],
            }
            if method != "full":
                ratios = sorted(
                    a / f for a, f in zip(seconds[method], seconds["full"], strict=True)
                )
                row["ratio_median"] = round(ratios[len(ratios) // 2], 3)
                row["ratio_spread"] = [round(ratios[0], 3), round(ratios[-1], 3)]
            rows.append(row)
    return rows
