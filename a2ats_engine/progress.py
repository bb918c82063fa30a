"""The progress callback every long engine call takes."""

from __future__ import annotations

from collections.abc import Callable

Progress = Callable[[str, int, int], None]
"""`progress(stage, done, total)`: a stage name ("prefill", "collecting", "hash", ...) and how
far it is (`done` of `total` units: tokens, bytes, steps). Called on the calling thread."""
