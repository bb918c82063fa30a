"""Property-based fuzzing of every file the engine and the CLI read (targets in
`fuzz_files.py`), each run in a child interpreter with its address space capped at 3 GiB: a
reader must answer with one `A2ATSError` / `ValueError` line naming the file or succeed, never
another exception type, never an allocation the file cannot back."""

from __future__ import annotations

import pytest

from .bounded import run_capped
from .fuzz_files import TARGETS


@pytest.mark.parametrize("target", list(TARGETS))
def test_readers_answer_hostile_files_with_one_line_naming_the_file(target):
    result = run_capped(
        f"""
        from engine.fuzz_files import TARGETS
        TARGETS[{target!r}]()
        """,
        timeout=300,
    )
    assert result["kind"] == "ok", result["message"]
