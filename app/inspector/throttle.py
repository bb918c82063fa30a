"""Redraw pacing: at most `max_hz`, slower while the GUI thread is busy.

The GUI thread shares the machine with generation (MLX runs on other threads), so drawing must
not eat into tokens/s. After each redraw the throttle looks at how much CPU the GUI thread used
since the previous one (`time.thread_time`, which counts painting, the chat view, everything) and
stretches the interval while that share is above `budget`, shrinking it back when below.
"""

from __future__ import annotations

import time
from collections.abc import Callable


class RedrawThrottle:
    """Interval (ms) to wait before the next redraw.

    max_hz: fastest redraw rate; budget: target share of one core for the GUI thread;
    slowest_ms: the interval never exceeds this (panels stay live even under load).
    """

    def __init__(
        self,
        max_hz: float = 12.0,
        budget: float = 0.12,
        slowest_ms: int = 1000,
        wall_clock: Callable[[], float] = time.perf_counter,
        cpu_clock: Callable[[], float] = time.thread_time,
    ) -> None:
        if not 0.5 <= max_hz <= 60:
            raise ValueError(f"redraw_hz={max_hz!r} is out of range: must be in [0.5, 60]")
        if not 0.0 < budget <= 1.0:
            raise ValueError(f"redraw budget={budget!r} is out of range: must be in (0, 1]")
        self.fastest_ms = max(1, round(1000 / max_hz))
        self.slowest_ms = max(self.fastest_ms, slowest_ms)
        self.budget = budget
        self.interval_ms = self.fastest_ms
        self.last_share: float | None = None
        self._wall = wall_clock
        self._cpu = cpu_clock
        self._mark: tuple[float, float] | None = None

    def reset(self) -> None:
        """Forget the history (e.g. after an idle pause, which would dilute the share)."""
        self._mark = None
        self.interval_ms = self.fastest_ms

    def after_redraw(self) -> int:
        """Call at the end of each redraw; returns the interval to use before the next one."""
        now = (self._wall(), self._cpu())
        if self._mark is not None:
            wall = now[0] - self._mark[0]
            if wall > 0:
                share = (now[1] - self._mark[1]) / wall
                self.last_share = share
                if share > self.budget:
                    self.interval_ms = min(self.slowest_ms, round(self.interval_ms * 1.5) + 1)
                else:
                    self.interval_ms = max(self.fastest_ms, round(self.interval_ms / 1.25))
        self._mark = now
        return self.interval_ms
