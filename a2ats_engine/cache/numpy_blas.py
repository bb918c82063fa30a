"""NumPy's BLAS held to one thread while the host decode step runs (`host_step.step`).

The host step's products are small (a few hundred rows of d numbers against a GQA group's
queries), but OpenBLAS splits a product across its threads past a size (Gemma 3's 256-dim heads
cross it; the demo's 64-dim ones mostly do not). Those threads then contend with MLX's own
between the step's NumPy calls and the model's next layers: measured on a 2-core host
(docs/BENCHMARKS.md, "Where a decode step's time goes"), Gemma 3 270M's host attention took
21.6 ms a layer with two threads and 0.32 ms with one, and its whole 8K retrieval step went
from 0.34x to 1.01x KVCache's speed (docs/benchmarks/profile_gemma3_270m_8k*.json). One thread
loses nothing measurable on the demo model.

`one_thread()` sets NumPy's BLAS to one thread for the block and back after it; the library is
found once, in the process's mapped libraries (Linux), by the OpenBLAS thread calls it exports.
Where there is none to set (macOS's Accelerate, another BLAS) it does nothing, and
`A2ATS_HOST_STEP_BLAS=keep` leaves NumPy's threads as they are (to measure the difference).
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Iterator
from contextlib import contextmanager

# (get, set) thread calls of the OpenBLAS builds NumPy ships with or links (scipy-openblas's
# symbols are suffixed; Debian's numpy links the system libopenblas)
_CALLS = (
    ("scipy_openblas_get_num_threads64_", "scipy_openblas_set_num_threads64_"),
    ("scipy_openblas_get_num_threads", "scipy_openblas_set_num_threads"),
    ("openblas_get_num_threads64_", "openblas_set_num_threads64_"),
    ("openblas_get_num_threads", "openblas_set_num_threads"),
)
_found: tuple | None = None


def loaded_blas() -> list[str]:
    """Paths of the BLAS libraries mapped into this process (Linux; [] elsewhere)."""
    try:
        with open("/proc/self/maps", encoding="ascii", errors="replace") as f:
            paths = {line.split()[-1] for line in f if "blas" in line.lower() and "/" in line}
    except OSError:
        return []
    return sorted(p for p in paths if p.startswith("/"))


def thread_calls(path: str) -> tuple | None:
    """(get, set) of the OpenBLAS thread count the library at `path` exports, or None."""
    try:
        lib = ctypes.CDLL(path)
    except OSError:
        return None
    for get, set_ in _CALLS:
        if hasattr(lib, get) and hasattr(lib, set_):
            getter, setter = getattr(lib, get), getattr(lib, set_)
            getter.restype, setter.argtypes = ctypes.c_int, [ctypes.c_int]
            return getter, setter
    return None


def numpy_blas_path() -> str | None:
    """Path of the BLAS library NumPy's products call (Linux), or None where unknown."""
    import numpy as np

    np.ones((2, 2)) @ np.ones((2, 2))  # a product maps NumPy's BLAS, wherever it lives
    root = os.path.dirname(os.path.dirname(np.__file__))  # site-packages
    paths = loaded_blas()
    bundled = [p for p in paths if p.startswith(os.path.join(root, "numpy"))]
    if bundled:  # a wheel's own OpenBLAS (numpy.libs or numpy/.libs)
        return bundled[0]
    system = [p for p in paths if "openblas" in os.path.basename(p)]
    return system[0] if system else None


def kept() -> bool:
    """Whether `A2ATS_HOST_STEP_BLAS=keep` leaves NumPy's BLAS threads as they are."""
    return os.environ.get("A2ATS_HOST_STEP_BLAS", "").strip().lower() == "keep"


def _calls() -> tuple | None:
    """(get, set) of NumPy's BLAS thread count, or None where there is none to set."""
    global _found
    if _found is None:
        path = numpy_blas_path()
        _found = (path and thread_calls(path)) or ()
    return _found or None


def threads() -> int | None:
    """NumPy's BLAS thread count now, or None where it cannot be read."""
    calls = _calls()
    return None if calls is None else int(calls[0]())


@contextmanager
def one_thread() -> Iterator[None]:
    """NumPy's BLAS on one thread inside the block (no-op where it cannot be set, or kept)."""
    calls = None if kept() else _calls()
    held = 1 if calls is None else int(calls[0]())
    if held > 1:
        calls[1](1)
    try:
        yield
    finally:
        if held > 1:
            calls[1](held)
