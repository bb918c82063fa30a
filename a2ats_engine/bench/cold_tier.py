"""`a2ats bench cold`: memory measured in a process of its own per method, and decode speed.

Each (method, context) runs in a fresh Python process (`run_one`), so its peak memory is its
own: a real model's geometry with random float32 weights (`geometries.py`), every KV cache filled
synthetically to the context, then greedy decode steps timed. Methods:
  full        mlx-lm's own caches (KVCache)
  a2ats       A2ATS, K/V rows in memory
  a2ats_cold  A2ATS with `kv_memory = 0`: K/V rows in the cold tier's file, codes in memory
Reported per run: anonymous resident bytes after the fill and after decoding, their sampled
peak, the resident-set high-water mark, MLX's active/peak allocation, the cache's resident and
on-disk bytes, an fp16 KVCache's bytes for the same context, decode tokens/s and the greedy
tokens (so the cold tier's answer can be checked against the in-memory one). With
`data_limit`, the child runs under `RLIMIT_DATA` (private memory cap, file maps not counted):
a method that does not fit fails there and is reported as failed with its error.
"""

from __future__ import annotations

import json
import resource
import subprocess
import sys
import time
import warnings
from dataclasses import replace
from typing import Any

import mlx.core as mx
from mlx_lm.models.cache import make_prompt_cache

from ..cache.a2ats_cache import A2ATSCache
from ..cache.cold import ColdRows
from ..cache.config import A2ATSConfig
from ..cache.model_cache import make_cache
from ..process_memory import (
    PeakSampler,
    anonymous_bytes,
    mlx_memory,
    peak_resident_bytes,
    storage_read_bytes,
)
from .geometries import fill_synthetic, geometry_model
from .speed import fp16_bytes_per_token

METHODS = ("full", "a2ats", "a2ats_cold")


def with_candidate_bits(caches: list, bits: int | None) -> list:
    """Cold-tier layers of `caches` (still empty) reading the rerank's candidate keys from a
    resident `bits`-bit copy instead of the map (None: unchanged, the shipped choice)."""
    if bits is not None:
        for c in caches:
            if isinstance(c, A2ATSCache) and c.rows.kind == "cold":
                c.rows = ColdRows(c.kv_share, c.rows.label, candidate_bits=bits)
    return caches


def run_one(
    geometry: str,
    context: int,
    method: str,
    steps: int,
    config_json: str,
    candidate_bits: int | None = None,
) -> dict:
    """One measured run in this process (the child side of `measure`)."""
    config = A2ATSConfig.from_dict(json.loads(config_json))
    if method == "a2ats_cold":
        config = replace(config, kv_memory=0)
    base = anonymous_bytes()
    with PeakSampler() as sampler:
        model = geometry_model(geometry)
        weights = anonymous_bytes()
        if method == "full":
            caches = make_prompt_cache(model)
        else:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                caches = with_candidate_bits(make_cache(model, config, None), candidate_bits)
        start = time.perf_counter()
        fill_synthetic(model, caches, context, chunk=512)
        fill_s = time.perf_counter() - start
        after_fill = anonymous_bytes()
        token = mx.array([1])
        tokens, times = [], []
        read_before = _read_bytes(caches)
        for _ in range(steps):
            t0 = time.perf_counter()
            logits = model(token[None], cache=caches)[:, -1]
            token = mx.argmax(logits, axis=-1)
            mx.eval(token)
            times.append(time.perf_counter() - t0)
            tokens.append(int(token.item()))
    own = [c for c in caches if isinstance(c, A2ATSCache)]
    read_per_step = (_read_bytes(caches) - read_before) / max(steps, 1)
    timed = times[2:] or times
    return {
        "method": method,
        "context": context,
        "steps": steps,
        "tokens": tokens,
        "tokens_per_s": len(timed) / sum(timed),
        "fill_s": fill_s,
        "anon_start": base,
        "anon_weights": weights,
        "anon_after_fill": after_fill,
        "anon_after_decode": anonymous_bytes(),
        "anon_peak_sampled": sampler.peak,
        "rss_peak": peak_resident_bytes(),
        **mlx_memory(),
        "cache_resident_bytes": int(
            sum(c.resident_bytes for c in own)
            + sum(c.nbytes for c in caches if not isinstance(c, A2ATSCache))
        ),
        "cache_disk_bytes": int(sum(c.disk_bytes for c in own)),
        "fp16_kvcache_bytes": fp16_bytes_per_token(model) * context,
        "disk_read_bytes_per_step": int(read_per_step),
    }


def speed_one(
    geometry: str,
    context: int,
    steps: int,
    repeats: int,
    config_json: str,
    candidate_bits: int | None = None,
    page_cache: str = "warm",
) -> dict:
    """Decode speed of in-memory A2ATS and the cold tier in ONE process, interleaved a few
    steps at a time (load changes hit both alike): per repeat, the ratio cold / in memory.

    page_cache "cold": then, per repeat, `steps` more steps taking turns one at a time, the
    cold tier's file pages dropped from the page cache before each of its steps (Linux), so it
    reads its rows from the disk (`cold_page_cache` in the result)."""
    from .speed import _decode_interleaved

    config = A2ATSConfig.from_dict(json.loads(config_json))
    model = geometry_model(geometry)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        caches = {
            "a2ats": make_cache(model, config, None),
            "a2ats_cold": with_candidate_bits(
                make_cache(model, replace(config, kv_memory=0), None), candidate_bits
            ),
        }
    for cache in caches.values():
        fill_synthetic(model, cache, context, chunk=512)
    vocab = int(model.args.vocab_size)
    ratios, rates = [], []
    for r in range(repeats):
        tokens = [(7919 * (r * steps + i)) % vocab for i in range(steps + 2)]
        rate = _decode_interleaved(model, caches, tokens)
        rates.append(rate)
        ratios.append(rate["a2ats_cold"] / rate["a2ats"])
    dropped = _dropped_page_cache(model, caches, steps, repeats) if page_cache == "cold" else None
    return {
        "context": context,
        "steps": steps,
        "candidate_bits": candidate_bits,
        "cold_page_cache": dropped,
        "cold_resident_bytes": int(
            sum(c.resident_bytes for c in caches["a2ats_cold"] if isinstance(c, A2ATSCache))
        ),
        "ratio_runs": [round(x, 3) for x in ratios],
        "ratio_median": round(sorted(ratios)[len(ratios) // 2], 3),
        "tokens_per_s": [{k: round(v, 3) for k, v in rate.items()} for rate in rates],
        "disk_read_bytes_per_step": int(
            _read_bytes(caches["a2ats_cold"]) / max(repeats * (steps + 2), 1)
        ),
    }


def _dropped_page_cache(model, caches: dict[str, list], steps: int, repeats: int) -> dict:
    """In-memory and cold-tier steps one at a time, the cold tier's pages dropped before each
    of its steps: tok/s per repeat, their ratio and the bytes really read from storage."""
    from .speed import _decode_chunk

    last = {name: mx.array([11]) for name in caches}
    ratios, rates, storage, dropped = [], [], 0, True
    for _ in range(repeats):
        seconds = dict.fromkeys(caches, 0.0)
        for _ in range(steps):
            sec, last["a2ats"] = _decode_chunk(model, caches["a2ats"], last["a2ats"], 1)
            seconds["a2ats"] += sec
            rows = [c.rows for c in caches["a2ats_cold"] if isinstance(c, A2ATSCache)]
            dropped &= all([r.drop_page_cache() for r in rows if r.kind == "cold"])
            before = storage_read_bytes() or 0
            sec, last["a2ats_cold"] = _decode_chunk(
                model, caches["a2ats_cold"], last["a2ats_cold"], 1
            )
            seconds["a2ats_cold"] += sec
            storage += (storage_read_bytes() or 0) - before
        rate = {name: steps / max(sec, 1e-9) for name, sec in seconds.items()}
        rates.append({k: round(v, 3) for k, v in rate.items()})
        ratios.append(rate["a2ats_cold"] / rate["a2ats"])
    return {
        "dropped": dropped,
        "ratio_runs": [round(x, 3) for x in ratios],
        "ratio_median": round(sorted(ratios)[len(ratios) // 2], 3),
        "tokens_per_s": rates,
        "storage_read_bytes_per_step": int(storage / max(repeats * steps, 1)),
    }


def _read_bytes(caches: list) -> int:
    """Bytes the caches' cold tiers read back from their files so far (0 without one)."""
    return int(sum(getattr(getattr(c, "rows", None), "read_bytes", 0) for c in caches))


def _limit(data_limit: int | None):
    if data_limit is None:
        return None

    def apply() -> None:
        resource.setrlimit(resource.RLIMIT_DATA, (data_limit, data_limit))

    return apply


def measure(
    geometry: str,
    context: int,
    method: str,
    steps: int,
    config: Any,
    data_limit: int | None = None,
    timeout: float = 3600,
    repeats: int = 1,
    candidate_bits: int | None = None,
    page_cache: str = "warm",
) -> dict:
    """Run `run_one` (or `speed_one` for method "speed", `steps` then per repeat) in a child
    process; a failed child gives {"failed": reason}."""
    fn = "speed_one" if method == "speed" else "run_one"
    code = (
        "import json, sys; import a2ats_engine; "
        f"from a2ats_engine.bench.cold_tier import {fn}; "
        f"print('RESULT ' + json.dumps({fn}(*json.loads(sys.argv[1]))))"
    )
    if method == "speed":
        args = [geometry, context, steps, repeats, json.dumps(config.to_dict()), candidate_bits]
        args.append(page_cache)
    else:
        args = [geometry, context, method, steps, json.dumps(config.to_dict()), candidate_bits]
    proc = subprocess.run(
        [sys.executable, "-c", code, json.dumps(args)],
        capture_output=True,
        text=True,
        timeout=timeout,
        preexec_fn=_limit(data_limit),
    )
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[7:])
    tail = (proc.stderr.strip().splitlines() or ["no output"])[-1][:300]
    return {"method": method, "context": context, "failed": f"exit {proc.returncode}: {tail}"}
