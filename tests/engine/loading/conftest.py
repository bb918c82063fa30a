"""Fixtures for the model-loading tests."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture
def isolated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The engine's cache and data folders (converted models, fetched wheels, codebooks) under
    `tmp_path`, which is returned."""
    monkeypatch.setenv("A2ATS_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("A2ATS_DATA_DIR", str(tmp_path / "data"))
    return tmp_path
