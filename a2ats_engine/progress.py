"""The progress callback every long engine call takes."""

from __future__ import annotations

from collections.abc import Callable

Progress = Callable[[str, int, int], None]
"""`progress(stage, done, total)`: a stage name ("prefill", "collecting", "hash", ...) and how
far it is (`done` of `total` units: tokens, bytes, steps). Called on the calling thread."""

LONG_PREFILL_TOKENS = 1024
"""A prefill of at least this many new tokens is worth showing before its first chunk ends."""


def prefill_eta(done: int, total: int, seconds: float) -> float | None:
    """Seconds left of a prefill that did `done` of `total` tokens in `seconds`, at the rate so
    far (None before the first chunk ends). Attention's cost grows with the position, so the
    later chunks are a little slower and this is a lower bound."""
    if done <= 0 or seconds <= 0 or done >= total:
        return None
    return seconds / done * (total - done)


def prefill_text(done: int, total: int, seconds: float) -> str:
    """`Reading the prompt: 4,096 / 12,000 tokens (34%), about 20 s left`; "" for a prefill too
    short to show (under `LONG_PREFILL_TOKENS`) or a finished one."""
    if total < LONG_PREFILL_TOKENS or done >= total:
        return ""
    text = f"Reading the prompt: {done:,} / {total:,} tokens ({100 * done // total}%)"
    eta = prefill_eta(done, total, seconds)
    if eta is not None:
        text += f", about {_duration(eta)} left"
    return text


def _duration(seconds: float) -> str:
    """`8 s`, `2 min 5 s`, `1 h 3 min`."""
    whole = max(1, round(seconds))
    if whole < 60:
        return f"{whole} s"
    minutes, secs = divmod(whole, 60)
    if minutes < 60:
        return f"{minutes} min {secs} s" if secs else f"{minutes} min"
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes} min" if minutes else f"{hours} h"
