"""Range checks for command-line flags, run right after parsing and before any model loads.

Every number a flag gives is bounded: a count below 1 or a context of 10^11 tokens fails here
with one line naming the flag, the value and the range (`ValueError`, which the CLI prints and
exits 1 on), not after a model load, a calibration or a prefill. Contexts are checked again
against the model's own context once it is loaded (`check_model_context`), and benchmarks that
fill caches without a model's context in mind against the machine's memory
(`check_cache_memory`). MLX-free.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Iterable
from typing import Any

from ..validation import parse_budget

MAX_CONTEXT = 1 << 22
"""Largest context any flag accepts before a model is loaded (4,194,304 tokens)."""
MAX_STEPS = 100_000
"""Decode steps, answer tokens, teacher-forced tokens."""
MAX_REPEATS = 1000
MAX_LIST = 64
"""Entries in a comma list (contexts, depths, budgets, methods)."""
MAX_CALIBRATION_TOKENS = 1 << 24
"""Calibration tokens (16,777,216; the demo's codebook uses 65,536)."""
MAX_SEED = 2**32 - 1


def count(flag: str, value: Any, lo: int = 1, hi: int = MAX_STEPS) -> int:
    """`value` as an int in [lo, hi], else ValueError naming the flag."""
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise ValueError(f"{flag}={value!r} is out of range: must be an integer in [{lo}, {hi:,}]")
    return value


def optional_count(flag: str, value: Any, lo: int = 1, hi: int = MAX_STEPS) -> int | None:
    return None if value is None else count(flag, value, lo, hi)


def number(flag: str, value: Any, lo: float, hi: float) -> float:
    """A finite number in [lo, hi], else ValueError naming the flag."""
    ok = not isinstance(value, bool) and isinstance(value, int | float) and math.isfinite(value)
    if not ok or not lo <= value <= hi:
        raise ValueError(f"{flag}={value!r} is out of range: must be a number in [{lo:g}, {hi:g}]")
    return float(value)


def _items(flag: str, text: str) -> list[str]:
    items = [x.strip() for x in (text or "").split(",") if x.strip()]
    if not items:
        raise ValueError(f"{flag} is empty: give a comma list")
    if len(items) > MAX_LIST:
        raise ValueError(f"{flag} lists {len(items)} values: at most {MAX_LIST}")
    return items


def _parsed(
    flag: str, text: str, parse: Callable[[str], Any], kind: str, check: Callable[[str, Any], None]
) -> list:
    """Each item of the comma list `parse`d (ValueError "not `kind`" naming the flag and the
    item), then `check`ed (item, value), in the order given."""
    out = []
    for item in _items(flag, text):
        try:
            value = parse(item)
        except ValueError:
            raise ValueError(f"{flag}: {item!r} is not {kind}") from None
        check(item, value)
        out.append(value)
    return out


def int_list(flag: str, text: str, lo: int = 1, hi: int = MAX_CONTEXT) -> list[int]:
    """'1024,4096' -> [1024, 4096] (in the order given), each in [lo, hi]."""

    def check(_item: str, value: int) -> None:
        if not lo <= value <= hi:
            raise ValueError(f"{flag}: {value:,} is out of range: must be in [{lo:,}, {hi:,}]")

    return _parsed(flag, text, int, "a whole number", check)


def contexts(flag: str, text: str, lo: int = 1) -> list[int]:
    """Context lengths in tokens, each in [lo, MAX_CONTEXT]."""
    return int_list(flag, text, lo, MAX_CONTEXT)


def fractions(flag: str, text: str) -> list[float]:
    """'0.1,0.5' -> [0.1, 0.5], each a finite number in [0, 1]."""

    def check(item: str, value: float) -> None:
        if not (math.isfinite(value) and 0.0 <= value <= 1.0):
            raise ValueError(f"{flag}: {item} is out of range: must be in [0, 1]")

    return _parsed(flag, text, float, "a number", check)


def budget(text: str, flag: str = "--budget") -> float | int:
    """A retrieval budget as `A2ATSConfig` takes it ('0.03' a fraction in (0, 1], '128' a
    token count >= 1), checked by `A2ATSConfig` itself; ValueError naming the flag."""
    try:
        value = parse_budget(str(text))
    except ValueError:
        raise ValueError(f"{flag}={text!r} is not a number") from None
    if isinstance(value, int) and value > MAX_CONTEXT:
        raise ValueError(f"{flag}={text} is out of range: a token count must be <= {MAX_CONTEXT:,}")
    config_check(flag, budget=value)
    return value


def budgets(text: str, flag: str = "--budgets") -> list[float | int]:
    return [budget(item, flag) for item in _items(flag, text)]


def config_check(flag: str | None = None, **knobs: Any) -> None:
    """Build an `A2ATSConfig` from the knobs given (None ones skipped) to check them before
    any work; its ValueError names the field, prefixed with the flag when given."""
    from ..cache.config import A2ATSConfig

    try:
        A2ATSConfig(**{k: v for k, v in knobs.items() if v is not None})
    except ValueError as exc:
        raise ValueError(f"{flag}: {exc}" if flag else str(exc)) from None


def names(flag: str, text: str, valid: Callable[[str], bool], known: Iterable[str]) -> list[str]:
    """Comma list of names, each accepted by `valid`; ValueError listing the known ones."""
    out = _items(flag, text)
    bad = [n for n in out if not valid(n)]
    if bad:
        raise ValueError(
            f"{flag}: unknown {', '.join(repr(b) for b in bad)}; valid: {', '.join(known)}"
        )
    return out


def hosts_flags(args: Any) -> None:
    """`add_hosts_flags`' flags: --port in range with --hosts; --port and --split only with it."""
    if args.hosts:
        if args.port is not None:
            count("--port", args.port, 1024, 65535)
    elif args.port is not None or args.split is not None:
        raise ValueError("--port and --split need --hosts")


def check_model_context(flag: str, values: Iterable[int], model_context: int | None) -> None:
    """ValueError when a context exceeds the loaded model's (checked before any prefill)."""
    if not model_context:
        return
    longest = max(values, default=0)
    if longest > model_context:
        raise ValueError(
            f"{flag}: {longest:,} tokens is longer than the model's context "
            f"({model_context:,} tokens)"
        )


def physical_memory() -> int | None:
    """Bytes of RAM on this machine (None where the OS does not say)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, OSError, ValueError):
        return None


def check_cache_memory(flag: str, values: Iterable[int], bytes_per_token: int) -> None:
    """ValueError when a full cache of the longest context would not fit in half the RAM."""
    ram = physical_memory()
    longest = max(values, default=0)
    need = longest * bytes_per_token
    if ram and need > ram // 2:
        raise ValueError(
            f"{flag}: {longest:,} tokens need {need / 2**30:,.1f} GiB for a full cache of this "
            f"model, more than half this machine's {ram / 2**30:.1f} GiB"
        )
