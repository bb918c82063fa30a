"""Human-readable sizes for labels."""

from __future__ import annotations


def human_bytes(n: float) -> str:
    """1536 -> "1.5 KB"; bytes below 1 KB are shown whole."""
    value = float(n)
    for unit in ("B", "KB", "MB", "GB"):
        if abs(value) < 1024 or unit == "GB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} GB"
