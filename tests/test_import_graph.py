"""The shape of the code, kept: no import cycles, no import from a lower room of the engine into a
higher one, no engine module over 600 lines, and the cache class a few hundred lines.

Imports are read from the sources (module level and inside functions alike; `if TYPE_CHECKING:`
blocks, which never run, are left out), so a cycle hidden by a function-level import counts.
"""

from __future__ import annotations

import ast
from pathlib import Path

from repo_python import module_imports

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("a2ats_engine", "app")
# the engine's rooms, lowest first: a module may import its own room and the ones below it
ROOMS = ("base", "cache", "loading", "calibration", "session", "bench", "distributed", "commands")
BASE = {"errors", "validation", "files", "progress", "data_dirs", "_backend", "records",
        "terminal", "process_memory", "__init__", "__main__"}  # fmt: skip
MAX_ENGINE_LINES = 600
MAX_CACHE_CLASS_LINES = 300


def modules() -> dict[str, Path]:
    out = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out[".".join(parts)] = path
    return out


def imports(path: Path) -> list[tuple[int, str]]:
    """(line, imported module or name) of every import that runs (TYPE_CHECKING blocks left
    out); `from m import x` gives m and m.x."""
    found = []
    for line, target, names in module_imports(path, type_checking=False):
        found.append((line, target))
        found += [(line, f"{target}.{name}") for name in names]
    return found


def graph() -> dict[str, set[str]]:
    mods = modules()
    edges: dict[str, set[str]] = {m: set() for m in mods}
    for name, path in mods.items():
        for _, target in imports(path):
            parts = target.split(".")
            while parts and ".".join(parts) not in mods:
                parts.pop()
            known = ".".join(parts)
            # a module importing its own package's __init__ (or an ancestor) is not a cycle
            if known and known != name and not name.startswith(known + "."):
                edges[name].add(known)
    return edges


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def room(module: str) -> str | None:
    parts = module.split(".")
    if parts[0] != "a2ats_engine":
        return None
    if len(parts) == 1 or parts[1] in BASE:
        return "base"
    if parts[1] in ("session", "session_file", "chat_turn"):
        return "session"
    if parts[1] == "cli":
        return "commands"
    return parts[1] if parts[1] in ROOMS else None


def test_the_cycle_finder_sees_function_level_imports_and_skips_type_checking():
    edges = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(edges) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycles_in_the_engine_or_the_app():
    assert cycles(graph()) == []


def test_no_engine_room_imports_a_higher_one():
    offenders = []
    for name, path in modules().items():
        source = room(name)
        if source is None:
            continue
        for line, target in imports(path):
            target_room = room(target)
            if target_room and ROOMS.index(target_room) > ROOMS.index(source):
                offenders.append(f"{name}:{line} imports {target}")
    assert offenders == []


def test_engine_modules_and_the_cache_class_stay_small():
    long = {
        str(path.relative_to(ROOT)): n
        for path in (ROOT / "a2ats_engine").rglob("*.py")
        if (n := len(path.read_text(encoding="utf-8").splitlines())) > MAX_ENGINE_LINES
    }
    assert long == {}
    tree = ast.parse((ROOT / "a2ats_engine/cache/a2ats_cache.py").read_text(encoding="utf-8"))
    (cls,) = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "A2ATSCache"]
    assert cls.end_lineno - cls.lineno + 1 < MAX_CACHE_CLASS_LINES
