"""The engine's one-of-each helpers: range checks, dict -> record, file sha256."""

import hashlib
from dataclasses import dataclass

import pytest

from a2ats_engine.files import sha256_file
from a2ats_engine.validation import check_int, check_number, from_known_fields


def test_check_int_names_owner_field_value_and_range():
    check_int("Rec", "n", 3, 1, 3)
    with pytest.raises(ValueError, match=r"Rec\.n=0 is out of range: must be an integer >= 1"):
        check_int("Rec", "n", 0, 1)
    with pytest.raises(ValueError, match=r"in \[1, 3\]"):
        check_int("Rec", "n", 4, 1, 3)
    for bad in (True, 2.0, "2"):
        with pytest.raises(ValueError):
            check_int("Rec", "n", bad, 1)


def test_check_number_open_and_closed_ends():
    check_number("Rec", "p", 1.0, 0.0, 1.0, lo_open=True)
    with pytest.raises(ValueError, match=r"Rec\.p=0\.0 is out of range: must be in \(0\.0, 1\.0\]"):
        check_number("Rec", "p", 0.0, 0.0, 1.0, lo_open=True)
    with pytest.raises(ValueError, match=r"\[0\.0, 1\.0\)"):
        check_number("Rec", "p", 1.0, 0.0, 1.0, hi_open=True)
    for bad in (float("nan"), float("inf"), False, None):
        with pytest.raises(ValueError):
            check_number("Rec", "p", bad, 0.0, 1.0)


def test_from_known_fields_ignores_unknown_keys_and_keeps_defaults():
    @dataclass(frozen=True)
    class Rec:
        a: int = 1
        b: str = "x"

    assert from_known_fields(Rec, {"a": 5, "future": [1]}) == Rec(a=5)
    assert from_known_fields(Rec, {}) == Rec()


def test_sha256_file_matches_hashlib_and_reports_progress(tmp_path):
    path = tmp_path / "blob.bin"
    data = bytes(range(256)) * 1000
    path.write_bytes(data)
    seen = []
    digest = sha256_file(path, lambda stage, done, total: seen.append((stage, done, total)), 4096)
    assert digest == hashlib.sha256(data).hexdigest()
    assert seen[-1] == ("hash", len(data), len(data)) and len(seen) == -(-len(data) // 4096)
