"""Fixtures of the cache tests."""

import pytest

from a2ats_engine.cache import crossover as xo


@pytest.fixture
def table(tmp_path, monkeypatch):
    """The user table at a fresh path (nothing read from it yet)."""
    path = tmp_path / "data" / "crossover.json"
    monkeypatch.setenv("A2ATS_CROSSOVER_FILE", str(path))
    xo.reload_user_table()
    yield path
    xo.reload_user_table()
