"""Range checks for settings records, and building a record from a dict written by any version.

MLX-free. Every check raises `ValueError` naming `owner.name`, the value and the allowed range.
"""

from __future__ import annotations

import math
from dataclasses import fields
from typing import Any, TypeVar

T = TypeVar("T")


def check_int(owner: str, name: str, value: Any, lo: int, hi: int | None = None) -> None:
    """ValueError naming `owner.name`, the value and the range unless lo <= value (<= hi)."""
    if (
        isinstance(value, bool)
        or not isinstance(value, int)
        or value < lo
        or (hi is not None and value > hi)
    ):
        allowed = f"an integer >= {lo}" if hi is None else f"an integer in [{lo}, {hi}]"
        raise ValueError(f"{owner}.{name}={value!r} is out of range: must be {allowed}")


def check_number(
    owner: str,
    name: str,
    value: Any,
    lo: float,
    hi: float,
    *,
    lo_open: bool = False,
    hi_open: bool = False,
) -> None:
    """ValueError naming `owner.name`, the value and the interval unless `value` is a finite
    number (not a bool) in [lo, hi], with either end open when `lo_open` / `hi_open`."""
    ok = not isinstance(value, bool) and isinstance(value, int | float) and math.isfinite(value)
    if ok:
        ok = (value > lo if lo_open else value >= lo) and (value < hi if hi_open else value <= hi)
    if not ok:
        left, right = "(" if lo_open else "[", ")" if hi_open else "]"
        raise ValueError(
            f"{owner}.{name}={value!r} is out of range: must be in {left}{lo}, {hi}{right}"
        )


def from_known_fields(cls: type[T], data: dict[str, Any]) -> T:
    """`cls(**data)` for a dataclass, ignoring keys `cls` has no field for (settings and files
    written by a newer version); missing keys take the field defaults."""
    names = {f.name for f in fields(cls)}
    return cls(**{k: v for k, v in data.items() if k in names})


def parse_budget(text: str) -> float | int:
    """'0.03' -> 0.03 (fraction), '128' -> 128 (token count)."""
    value = float(text)
    if value >= 1.0 and value.is_integer() and "." not in text:
        return int(value)
    return value
