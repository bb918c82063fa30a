"""NumPy's BLAS runs on one thread inside the host decode step (`cache/numpy_blas.py`)."""

import sys

import mlx.core as mx
import numpy as np
import pytest
from mlx_lm.models.rope_utils import initialize_rope

from a2ats_engine.cache import host_step, native_step, numpy_blas, topk
from a2ats_engine.cache.a2ats_cache import A2ATSCache
from a2ats_engine.cache.codebook import Codebook
from a2ats_engine.cache.config import A2ATSConfig
from a2ats_engine.cache.rope import RopeSpec


@pytest.fixture
def two_threads():
    """NumPy's BLAS at two threads for the test (as on a 2-core host), then as it was."""
    held = numpy_blas.threads()
    if held is None:
        assert not sys.platform.startswith("linux"), "NumPy's OpenBLAS not found on Linux"
        yield None
        return
    numpy_blas._calls()[1](2)
    yield 2
    numpy_blas._calls()[1](held)


def test_one_thread_holds_numpy_blas_to_one_thread_and_gives_it_back(two_threads, monkeypatch):
    if two_threads is None:  # no OpenBLAS to set (macOS's Accelerate): nothing to hold
        with numpy_blas.one_thread():
            pass
        return
    assert numpy_blas.numpy_blas_path() is not None
    with numpy_blas.one_thread():
        assert numpy_blas.threads() == 1
        a = np.ones((300, 300), np.float32)
        assert (a @ a)[0, 0] == 300  # products still right on one thread
    assert numpy_blas.threads() == 2
    with pytest.raises(RuntimeError), numpy_blas.one_thread():
        raise RuntimeError("a step that fails")
    assert numpy_blas.threads() == 2  # given back whatever happens in the block
    monkeypatch.setenv("A2ATS_HOST_STEP_BLAS", "keep")  # left as it is, to measure the difference
    with numpy_blas.one_thread():
        assert numpy_blas.threads() == 2


def test_the_host_step_runs_its_numpy_on_one_thread(two_threads, monkeypatch):
    """Inside the host step NumPy's BLAS has one thread; before and after, what it had."""
    d = 32
    rope = RopeSpec.from_module(initialize_rope(d, 10000.0, False, None, 8192), d)
    with topk.forced("numpy"):
        cache = A2ATSCache(0, rope, Codebook.random(1, 1, d, 16, seed=1),
                           A2ATSConfig(window=16, sinks=4, budget=12), 8192)  # fmt: skip
    rng = np.random.default_rng(0)
    rows = mx.array(rng.standard_normal((1, 1, 300, d)).astype(np.float32))
    cache.update_and_fetch(rows, rows)
    seen = []
    on_host = host_step._on_host

    def spy(*args):
        seen.append(numpy_blas.threads())
        return on_host(*args)

    monkeypatch.setattr(host_step, "_on_host", spy)
    k = mx.array(rng.standard_normal((1, 1, 1, d)).astype(np.float32))
    cache.update_and_fetch(k, k)
    q = mx.array(rng.standard_normal((1, 2, 1, d)).astype(np.float32))
    assert host_step.applies(cache, q)
    with native_step.forced("numpy"):  # the C++ step has no BLAS call
        mx.eval(cache.attend(q, None, None, scale=d**-0.5))
    assert len(seen) == 1
    if two_threads is not None:
        assert seen == [1] and numpy_blas.threads() == 2
