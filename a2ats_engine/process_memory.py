"""Memory measured, not computed: what this process holds, as the OS and MLX count it.

- `anonymous_bytes()`: the process's private (anonymous) resident memory: `RssAnon` of
  /proc/self/status on Linux; on macOS the physical footprint (`proc_pid_rusage`,
  `ri_phys_footprint`, what Activity Monitor shows as Memory). File pages of the cold tier's map
  are not in either: the OS can drop them under pressure.
- `peak_resident_bytes()`: the high-water mark of the whole resident set (`VmHWM` on Linux,
  `ru_maxrss` elsewhere): anonymous and file pages together.
- `PeakSampler`: samples `anonymous_bytes` on a thread while a block runs (the kernel keeps no
  peak of the anonymous part alone).
- `mlx_memory()`: MLX's own active and peak allocation.
"""

from __future__ import annotations

import ctypes
import resource
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import mlx.core as mx


def _status_field(name: str) -> int | None:
    """A `kB` field of /proc/self/status in bytes (None where there is none)."""
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith(name + ":"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def _mac_footprint() -> int | None:
    """macOS: `ri_phys_footprint` of this process (proc_pid_rusage, RUSAGE_INFO_V2)."""
    try:
        libc = ctypes.CDLL("/usr/lib/libSystem.B.dylib")
    except OSError:
        return None
    buf = (ctypes.c_uint64 * 64)()  # rusage_info_v2 is 28 uint64 fields and a 16-byte uuid
    import os

    if libc.proc_pid_rusage(os.getpid(), 2, ctypes.byref(buf)) != 0:
        return None
    return int(buf[2 + 7])  # uuid (2 words), then ri_phys_footprint is the 8th field


def storage_read_bytes() -> int | None:
    """Bytes this process has caused to be read from storage (`read_bytes` of /proc/self/io:
    page-cache hits are not counted). None where there is no such figure (macOS)."""
    try:
        with open("/proc/self/io", encoding="ascii") as f:
            for line in f:
                if line.startswith("read_bytes:"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return None


def anonymous_bytes() -> int | None:
    """Private resident bytes of this process (None where the platform gives no figure)."""
    if sys.platform.startswith("linux"):
        return _status_field("RssAnon")
    if sys.platform == "darwin":
        return _mac_footprint()
    return None


def peak_resident_bytes() -> int:
    """High-water mark of the resident set (anonymous + file pages) of this process."""
    peak = _status_field("VmHWM") if sys.platform.startswith("linux") else None
    if peak is not None:
        return peak
    maxrss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(maxrss if sys.platform == "darwin" else maxrss * 1024)


def mlx_memory() -> dict[str, int]:
    """MLX's active and peak allocation in bytes."""
    return {"mlx_active": int(mx.get_active_memory()), "mlx_peak": int(mx.get_peak_memory())}


@dataclass
class PeakSampler:
    """The largest `anonymous_bytes` seen while the `with` block runs (sampled every
    `interval` seconds, and once at each end)."""

    interval: float = 0.02
    peak: int = 0

    def _sample(self) -> None:
        value = anonymous_bytes()
        if value is not None and value > self.peak:
            self.peak = value

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self._sample()

    def __enter__(self) -> PeakSampler:
        self._stop = threading.Event()
        self._sample()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self._sample()


@contextmanager
def growth() -> Iterator[dict[str, int | None]]:
    """What the `with` block leaves held, measured: MLX's buffer cache is emptied before and at
    the end, then the dict yielded gets `anon_growth` (`anonymous_bytes` after minus before;
    None where the OS gives no figure), `anon_peak_growth` (its sampled peak minus before) and
    `mlx_active_growth` (MLX's active bytes after minus before). In one process only a first
    measurement is clean for the private memory: later ones reuse pages the C allocator kept."""
    out: dict[str, int | None] = {}
    mx.clear_cache()
    before, active = anonymous_bytes(), mx.get_active_memory()
    with PeakSampler() as sampler:
        yield out
        mx.clear_cache()
    after = anonymous_bytes()
    out["anon_growth"] = None if before is None or after is None else after - before
    out["anon_peak_growth"] = None if before is None else sampler.peak - before
    out["mlx_active_growth"] = int(mx.get_active_memory() - active)
