import os
import sys
import tempfile
from pathlib import Path

import pytest

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
# the user's measured crossover table (`a2ats crossover`) must not change what tests see: point
# it at a file that does not exist (tests of the table monkeypatch their own)
os.environ.setdefault(
    "A2ATS_CROSSOVER_FILE",
    str(Path(tempfile.gettempdir()) / f"a2ats-tests-{os.getpid()}-no-crossover.json"),
)
# the app measures a model's crossover on its first load: not in tests (it would write that table)
os.environ.setdefault("A2ATS_NO_AUTO_CROSSOVER", "1")
sys.path.insert(0, str(Path(__file__).parent))

import a2ats_engine  # noqa: E402,F401  (BLAS preload before anything imports mlx.core)


def _running_engine_threads() -> list:
    if "app.worker" not in sys.modules:
        return []
    from app.worker import EngineThread

    return [e for e in list(EngineThread.live) if e.thread.isRunning()]


@pytest.fixture(autouse=True)
def _no_engine_thread_left_running(request):
    """MLX is not thread-safe: an engine thread still running after its test would race the next
    test's MLX work. Fail the test that left one behind (after giving it time to finish)."""
    yield
    running = _running_engine_threads()
    for engine in running:
        engine.shutdown(timeout_ms=30000)
    assert not running, f"{request.node.nodeid} left {len(running)} engine thread(s) running"
