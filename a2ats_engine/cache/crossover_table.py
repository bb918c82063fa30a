"""The user's crossover table: `crossover.json` in the engine's data dir (`$A2ATS_CROSSOVER_FILE`
overrides the path), written by `a2ats crossover SOURCE` and the app's measurement, read by
`crossover.lookup_crossover`. A hostile file like any other: bounded in size, decoded and parsed
defensively, malformed rows dropped and counted, never raising on read.

A row's key (`entry_key`): backend, machine, attention geometry, the step kind (the settings a
retrieval step's cost depends on, `crossover.step_kind`) and the host step it was measured with
(`host_step_of`), so rows measured with other settings or another host step sit beside each
other and one does not stand in for another.
"""

from __future__ import annotations

import json
import os
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

FORMAT = "a2ats-crossover"
VERSION = 1
MAX_TABLE_BYTES = 4 * 1024 * 1024
"""A user table larger than this is not read (a real one holds a few hundred bytes per row)."""


# (backend, machine, attention layers, KV heads, head dim, step kind or None: the defaults,
# host step or None: any)
UserKey = tuple[str, str, int, int, int, str | None, str | None]
HOST_STEPS = {
    "graph": "the C++ step in MLX's graph",
    "native": "the synced C++ step",
    "numpy": "the NumPy step",
}
"""The host steps a retrieval step can run (`native_step.kind`), as `a2ats info` names them."""
_REQUIRED = {"backend": str, "machine": str, "layers": int, "kv_heads": int, "head_dim": int}


def user_table_path() -> Path:
    """`$A2ATS_CROSSOVER_FILE`, else `crossover.json` in the engine's data dir."""
    from ..data_dirs import crossover_table_path

    return crossover_table_path()


def entry_key(entry: Mapping[str, Any]) -> UserKey:
    return (
        entry["backend"],
        entry["machine"],
        entry["layers"],
        entry["kv_heads"],
        entry["head_dim"],
        entry.get("step"),
        host_step_of(entry),
    )


def host_step_of(entry: Mapping[str, Any]) -> str | None:
    """The host step a row was measured with (a `HOST_STEPS` key, or "other" for one this
    version does not know): its `host_step_kind`, else read from its `host_step` line (recorded
    since the C++ step: "NumPy ...", "C++ in MLX's graph ...", "C++ (native_step.cpp) ..."),
    else None: a row from before the C++ step, measured with the NumPy step, the slowest, so it
    stands for any host step (it keeps decode exact where a faster step might already pay)."""
    kind = entry.get("host_step_kind")
    if kind is not None:
        return kind if isinstance(kind, str) and kind in HOST_STEPS else "other"
    line = entry.get("host_step")
    if line is None:
        return None
    if not isinstance(line, str):
        return "other"
    for prefix, kind in (("NumPy", "numpy"), ("C++ in MLX's graph", "graph"), ("C++", "native")):
        if line.startswith(prefix):
            return kind
    return "other"


def _valid_entry(entry: Any) -> bool:
    if not isinstance(entry, dict):
        return False
    for name, kind in _REQUIRED.items():
        value = entry.get(name)
        if isinstance(value, bool) or not isinstance(value, kind):
            return False
    if "step" in entry and not isinstance(entry["step"], str):
        return False
    eb = entry.get("exact_below")
    return isinstance(eb, int) and not isinstance(eb, bool) and eb >= 0


def parse_table(text: str, where: str) -> tuple[dict[UserKey, dict], str | None]:
    """(entries by key, problem or None) from a table file's text. Never raises: an unreadable
    file gives no entries and says why; malformed rows are dropped and counted."""
    try:
        data = json.loads(text)
    except RecursionError:
        return {}, f"{where} is not valid JSON (nested too deep)"
    except ValueError as exc:
        return {}, f"{where} is not valid JSON ({_one_line(exc)})"
    if not isinstance(data, dict) or not isinstance(data.get("entries"), list):
        return {}, f"{where} has no 'entries' list"
    entries: dict[UserKey, dict] = {}
    bad = 0
    for entry in data["entries"]:
        if _valid_entry(entry):
            entries[entry_key(entry)] = entry
        else:
            bad += 1
    problem = f"{where}: {bad} malformed row(s) ignored" if bad else None
    return entries, problem


_loaded: dict[str, dict[UserKey, dict]] = {}  # path -> entries, read once per process


def user_table(path: Path | None = None) -> dict[UserKey, dict]:
    """The user table's rows by key, read once per process and path (`reload_user_table`
    forgets it). A missing file is an empty table; an unreadable one warns once and is empty."""
    path = Path(path) if path is not None else user_table_path()
    key = str(path)
    if key not in _loaded:
        entries: dict[UserKey, dict] = {}
        text, problem = _read_table_text(path)
        if problem:
            warnings.warn(f"A2ATS: crossover table {problem}: ignored", stacklevel=2)
        if text is not None:
            entries, problem = parse_table(text, str(path))
            if problem:
                warnings.warn(f"A2ATS: crossover table {problem}: ignored", stacklevel=2)
        _loaded[key] = entries
    return _loaded[key]


def _read_table_text(path: Path) -> tuple[str | None, str | None]:
    """(text, problem): the table file's text, or None and why it cannot be used (None, None
    for a missing file). Never raises: too large, unreadable and non-UTF-8 files are problems."""
    try:
        with open(path, "rb") as f:
            raw = f.read(MAX_TABLE_BYTES + 1)
    except FileNotFoundError:
        return None, None
    except OSError as exc:
        return None, f"{path} is unreadable ({exc.strerror or exc})"
    if len(raw) > MAX_TABLE_BYTES:
        return None, f"{path} is larger than {MAX_TABLE_BYTES:,} bytes"
    try:
        return raw.decode("utf-8"), None
    except UnicodeDecodeError as exc:
        return None, f"{path} is not UTF-8 text (byte {exc.start})"


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split())


def reload_user_table() -> None:
    """Forget every table read so far: the next lookup reads the file again (tests, and after
    `record_crossover`)."""
    _loaded.clear()


def record_crossover(entry: dict[str, Any], path: Path | None = None) -> Path:
    """Write `entry` (a row with the `_REQUIRED` key fields and `exact_below`) into the user
    table, replacing the row with the same key; atomic (temporary file renamed into place). An
    unreadable table is moved aside to `<name>.corrupt` (with a warning) and started afresh."""
    if not _valid_entry(entry):
        raise ValueError(f"crossover row {entry!r} lacks a key field or exact_below")
    path = Path(path) if path is not None else user_table_path()
    entries: dict[UserKey, dict] = {}
    if path.exists():
        text, problem = _read_table_text(path)
        if text is not None:
            entries, problem = parse_table(text, str(path))
        if problem and not entries:
            aside = path.with_name(path.name + ".corrupt")
            os.replace(path, aside)
            warnings.warn(f"A2ATS: crossover table {problem}; moved to {aside}", stacklevel=2)
    entries[entry_key(entry)] = entry
    data = {"format": FORMAT, "version": VERSION, "entries": list(entries.values())}
    from ..files import atomic_write_text

    atomic_write_text(path, json.dumps(data, indent=2) + "\n")
    reload_user_table()
    return path
