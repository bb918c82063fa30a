"""One gate for the tests that need the real demo model.

Without the demo they skip, except under `A2ATS_REQUIRE_DEMO=1` (set by `.ci/run`), where a
missing demo fails the test: CI must never pass by skipping them.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest


def require_demo() -> Path:
    """The demo model's folder; skip (or fail under A2ATS_REQUIRE_DEMO=1) when it is absent."""
    from a2ats_engine.loading.models import demo_model_path

    folder = demo_model_path()
    if folder is not None:
        return folder
    message = "the demo model is not fetched (run `a2ats fetch-demo` or `make demo`)"
    if os.environ.get("A2ATS_REQUIRE_DEMO") == "1":
        pytest.fail(f"A2ATS_REQUIRE_DEMO=1: {message}")
    pytest.skip(message)
