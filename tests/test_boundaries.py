"""The engine stays a pure library: `a2ats_engine` never imports Qt, pyqtgraph or the `app` package.

Checked two ways: statically (an AST scan of every file of the package, including imports inside
functions and `importlib.import_module("...")` calls with a literal name) and dynamically
(importing the package and every submodule in a fresh interpreter leaves no GUI module in
`sys.modules`).
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
ENGINE = ROOT / "a2ats_engine"
FORBIDDEN = frozenset(
    {"PySide6", "PySide2", "PyQt5", "PyQt6", "shiboken6", "shiboken2", "qtpy", "pyqtgraph", "app"}
)
_DYNAMIC_IMPORTERS = {"import_module", "__import__"}


def _top(name: str) -> str:
    return name.split(".", 1)[0]


def forbidden_imports(source: str, filename: str = "<source>") -> list[tuple[int, str]]:
    """(line, module) of every absolute import of a forbidden top-level package in `source`."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(source, filename=filename)):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names if _top(a.name) in FORBIDDEN]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if _top(node.module) in FORBIDDEN:
                found.append((node.lineno, node.module))
        elif isinstance(node, ast.Call) and node.args:
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
            arg = node.args[0]
            if (
                name in _DYNAMIC_IMPORTERS
                and isinstance(arg, ast.Constant)
                and isinstance(arg.value, str)
                and _top(arg.value) in FORBIDDEN
            ):
                found.append((node.lineno, arg.value))
    return found


def engine_files() -> list[Path]:
    return sorted(ENGINE.rglob("*.py"))


def test_scanner_flags_every_import_form():
    source = (
        "import os\n"
        "import PySide6.QtCore\n"
        "from pyqtgraph import PlotWidget\n"
        "def f():\n"
        "    from app.worker import EngineWorker\n"
        "    import importlib\n"
        "    importlib.import_module('PySide6.QtWidgets')\n"
        "    __import__('shiboken6')\n"
        "from . import app\n"  # relative: a2ats_engine.app, not the GUI package
        "from application import x\n"
    )
    assert forbidden_imports(source) == [
        (2, "PySide6.QtCore"),
        (3, "pyqtgraph"),
        (5, "app.worker"),
        (7, "PySide6.QtWidgets"),
        (8, "shiboken6"),
    ]


def test_engine_sources_import_no_gui_statically():
    files = engine_files()
    assert len(files) >= 10, f"expected the engine's modules under {ENGINE}, found {len(files)}"
    offenders = [
        f"{path.relative_to(ROOT)}:{line}: imports {module}"
        for path in files
        for line, module in forbidden_imports(path.read_text(encoding="utf-8"), str(path))
    ]
    assert offenders == []


_PROBE = r"""
import importlib, json, pkgutil, sys
import a2ats_engine
names = sorted(
    m.name
    for m in pkgutil.walk_packages(a2ats_engine.__path__, "a2ats_engine.")
    if not m.name.endswith(".__main__")  # importing it would run the CLI
)
for name in names:
    importlib.import_module(name)
for name in a2ats_engine.__all__:  # the lazy exports resolve too
    getattr(a2ats_engine, name)
print(json.dumps({"imported": names, "modules": sorted(sys.modules)}))
"""


@pytest.fixture(scope="module")
def engine_import_probe() -> dict:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONSTARTUP"}
    result = subprocess.run(
        [sys.executable, "-c", _PROBE],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_engine_imports_load_no_gui_dynamically(engine_import_probe):
    imported = engine_import_probe["imported"]
    expected = {
        p.relative_to(ROOT).with_suffix("").as_posix().replace("/", ".") for p in engine_files()
    }
    expected = {name.removesuffix(".__init__") for name in expected}
    expected = {n for n in expected if not n.endswith(".__main__")}  # not imported: they run
    expected -= {"a2ats_engine"}
    assert set(imported) == expected, "walk_packages must reach every engine module"
    gui = [m for m in engine_import_probe["modules"] if _top(m) in FORBIDDEN]
    assert gui == []
