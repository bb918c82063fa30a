"""`a2ats bench reopen`: reopening a long chat from its saved cache vs prefilling it again.

Per context: a chat whose first message is `context` tokens of text gets a one-token reply (its
time to first token is the prefill a reopened chat would pay again), its caches are saved
(`session_file.save_cache`), and a new session with the same conversation either restores them
and answers a follow-up, or prefills the whole conversation to answer it. Both answers' first
token must agree. Reported: save seconds and file bytes, restore seconds, the follow-up's time to
first token after restoring vs after a full prefill, and their ratio.
"""

from __future__ import annotations

import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from ..cache.config import A2ATSConfig
from ..cache.telemetry import GenerationStats, TokenEvent
from ..records import SamplingSettings
from ..session import ChatSession
from ..session_file import restore_cache, save_cache
from .speed import filler_tokens

ONE_TOKEN = SamplingSettings(temperature=0.0, max_tokens=1)
FOLLOW_UP = "Summarise that in one sentence."


def _first(events) -> tuple[int, GenerationStats]:
    token, stats = -1, None
    for event in events:
        if isinstance(event, TokenEvent) and token < 0:
            token = event.token_id
        elif isinstance(event, GenerationStats):
            stats = event
    return token, stats


def bench_reopen(
    model, tokenizer, contexts: list[int], config: A2ATSConfig, codebook, cold: bool = False
) -> list[dict[str, Any]]:
    """One row per context (see the module docstring). `cold`: every K/V row in the cold tier."""
    if cold:
        config = replace(config, kv_bits=None, kv_memory=0)
    rows = []
    with tempfile.TemporaryDirectory(prefix="a2ats-reopen-") as folder:
        for n in contexts:
            text = tokenizer.decode(filler_tokens(tokenizer, n))

            def session() -> ChatSession:
                return ChatSession(
                    model, tokenizer, sampling=ONE_TOKEN, a2ats=config, codebook=codebook
                )

            first = session()
            _first(first.send(text))
            path = Path(folder) / f"chat-{n}.safetensors"
            began = time.perf_counter()
            save_cache(first, path)
            save_s = time.perf_counter() - began
            history = first.messages

            reopened = session()
            reopened.load_messages(history)
            began = time.perf_counter()
            refused = restore_cache(reopened, path)
            restore_s = time.perf_counter() - began
            if refused is not None:
                raise RuntimeError(f"the saved cache was refused: {refused}")
            token_r, stats_r = _first(reopened.send(FOLLOW_UP))

            prefilled = session()
            prefilled.load_messages(history)
            token_p, stats_p = _first(prefilled.send(FOLLOW_UP))
            if token_r != token_p:
                raise RuntimeError(f"context {n}: reopened answer {token_r} != prefilled {token_p}")
            reopen_s = restore_s + stats_r.time_to_first_token
            rows.append(
                {
                    "context": stats_p.prompt_tokens,
                    "save_s": round(save_s, 3),
                    "file_bytes": path.stat().st_size,
                    "restore_s": round(restore_s, 3),
                    "reopen_ttft_s": round(stats_r.time_to_first_token, 3),
                    "reopen_total_s": round(reopen_s, 3),
                    "reprefill_ttft_s": round(stats_p.time_to_first_token, 3),
                    "speedup": round(stats_p.time_to_first_token / reopen_s, 1),
                    "reused_tokens": stats_r.extra["reused_tokens"],
                }
            )
            for s in (first, reopened, prefilled):
                s.reset()
    return rows
