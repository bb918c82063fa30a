"""Cancelling jobs that run one at a time on the engine thread, from the GUI thread
(`NumberedCancel`: the calibration and crossover jobs of `worker.EngineWorker`)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager


class NumberedCancel:
    """The cancel of jobs that run one at a time, numbered 1, 2, ... by whoever queues them:
    `cancel(up_to)` cancels the running job if its number is up to `up_to`, and each job still
    queued with such a number as it starts (a cancel that lands before its job starts is kept).
    `cancel()` cancels the running job only; a job numbered 0 is never cancelled ahead.
    Thread-safe: `cancel` is called from the GUI thread while the job runs."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._event = threading.Event()  # the running job's: it polls `is_set()`
        self._running: int | None = None  # the number of the running job
        self._cancelled = 0  # every job numbered up to this is cancelled

    @contextmanager
    def running(self, seq: int) -> Iterator[threading.Event]:
        """Run job `seq`: the event it polls, set if it was cancelled while queued."""
        with self._lock:
            self._running = seq
            self._event.clear()
            if seq and seq <= self._cancelled:
                self._event.set()
        try:
            yield self._event
        finally:
            with self._lock:
                self._running = None

    def cancel(self, up_to: int | None = None) -> None:
        with self._lock:
            limit = up_to if up_to is not None else (self._running or 0)
            self._cancelled = max(self._cancelled, limit)
            if self._running is not None and self._running <= limit:
                self._event.set()
