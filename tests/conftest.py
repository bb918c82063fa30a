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

# pyproject.toml turns every warning into an error. These are warnings that tests meet on purpose
# where they are beside the point, filtered for those tests only: (node id prefix, filter, why).
# The tests that raise them sit in files being edited elsewhere; a marker in the file itself
# (`@pytest.mark.filterwarnings`), or `tiny.made_for` for a random codebook, can replace an entry.
EXPECTED_WARNINGS = (
    (
        "tests/app/",
        "ignore:.*no codebook given, using a RANDOM codebook",
        "the app runs A2ATS without a codebook on purpose and says so itself (worker.py's "
        "RANDOM_CODEBOOK_NOTE); its crossover measurement (speed only) runs on a random one",
    ),
    (
        "tests/app/test_layer_plan_view.py::test_real_tiny_gemma3_snapshot_reports_native_bytes",
        "ignore:codebook records no model fingerprint",
        "a random codebook for a toy model: the snapshot's bytes and rows do not depend on it",
    ),
    (
        "tests/engine/test_session.py::test_reply_stats_say_how_the_a2ats_layers_attended",
        "ignore:codebook records no model fingerprint",
        "a random codebook for the tiny model: the stats count steps, not what was retrieved",
    ),
    (
        "tests/app/test_atomic_write.py::test_sigkill_at_random_points_leaves_only_old_or_new",
        "ignore:unclosed file:ResourceWarning",
        "the test leaves each killed writer's stdout pipe to the garbage collector",
    ),
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Apply EXPECTED_WARNINGS to the tests they name."""
    for item in items:
        for prefix, spec, _why in EXPECTED_WARNINGS:
            if item.nodeid.startswith(prefix):
                item.add_marker(pytest.mark.filterwarnings(spec))


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
