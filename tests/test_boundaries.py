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
from pathlib import Path

import pytest
from repo_python import module_imports, run_python

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


def _fresh_interpreter(code: str):
    """What `code` prints last, as JSON, run in a fresh interpreter at the repo root."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONSTARTUP"}
    result = run_python(code, env, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def engine_import_probe() -> dict:
    return _fresh_interpreter(_PROBE)


def test_engine_imports_load_no_gui_dynamically(engine_import_probe):
    imported = engine_import_probe["imported"]
    expected = {
        p.relative_to(ROOT).with_suffix("").as_posix().replace("/", ".") for p in engine_files()
    }
    expected = {name.removesuffix(".__init__") for name in expected}
    expected = {n for n in expected if not n.endswith(".__main__")}  # not imported: they run
    expected -= {"a2ats_engine"}
    expected |= {"a2ats_engine.cache._native_step"}  # the C++ host step (setup.py builds it)
    expected |= {"a2ats_engine.cache._graph_step"}  # the graph step (`make venv` builds it)
    assert set(imported) == expected, "walk_packages must reach every engine module"
    gui = [m for m in engine_import_probe["modules"] if _top(m) in FORBIDDEN]
    assert gui == []


# ----- the app side: its model modules draw nothing, and it uses the engine's public API -------

APP = ROOT / "app"
# The app's model: no widget, no drawing (QtCore's signals only). Tested without a display and
# imported by scripts; a widget import here would put the view back into the model.
WIDGET_FREE = (
    "app.controller",
    "app.model_jobs",
    "app.replies",
    "app.settings",
    "app.conversations",
    "app.events",
    "app.backend",
    "app.worker",
    "app.inspector.data",
    "app.inspector.snapshot_ring",
)
WIDGET_MODULES = ("PySide6.QtWidgets", "PySide6.QtGui", "pyqtgraph")
# What app code may import from the engine: the package's public names (`a2ats_engine.__all__`,
# lazily loaded) and the MLX-free records that cross the engine thread.
ENGINE_API = frozenset(
    {
        "a2ats_engine",
        "a2ats_engine.records",
        "a2ats_engine.progress",
        "a2ats_engine.errors",
        "a2ats_engine.files",
        "a2ats_engine.cache.config",
        "a2ats_engine.cache.telemetry",
        "a2ats_engine.cache.layer_plan",
        "a2ats_engine.token_texts",
    }
)
# Where app code may reach past that API, and why.
ENGINE_SEAMS = {
    "app/backend.py": "the one seam: every engine operation the app runs goes through it",
    "app/ranks_backend.py": "the same seam for a model split over several machines' ranks",
    "app/selftest.py": "the frozen build's self-test checks the engine's own pieces (hooks, BLAS)",
}


def _app_path(module: str) -> Path | None:
    """The file of an app module (or of the app package a name is imported from)."""
    for candidate in (
        (ROOT / module.replace(".", "/")).with_suffix(".py"),
        (ROOT / module.replace(".", "/") / "__init__.py"),
    ):
        if candidate.is_file():
            return candidate
    return None


def widget_imports(module: str) -> list[str]:
    """Every import of a widget module reachable from `module` through app modules (imports
    inside functions count: they run when the function does)."""
    seen: set[str] = set()
    todo, found = [module], []
    while todo:
        name = todo.pop()
        path = _app_path(name)
        if name in seen or path is None:
            continue
        seen.add(name)
        for line, target, names in module_imports(path):
            targets = [target] + [f"{target}.{n}" for n in names]
            hits = [t for t in targets if t.startswith(WIDGET_MODULES)]
            if hits:
                found.append(f"{path.relative_to(ROOT)}:{line}: {hits[0]}")
            todo += [t for t in targets if _top(t) == "app"]
    return sorted(set(found))


def test_widget_scan_follows_app_imports_into_functions():
    assert widget_imports("app.main_window"), "the window imports widgets: the scan must see it"
    assert any("pyqtgraph" in hit for hit in widget_imports("app.inspector.widgets"))


@pytest.mark.parametrize("module", WIDGET_FREE)
def test_app_model_modules_import_no_widgets(module):
    assert _app_path(module) is not None, f"{module} is gone: update WIDGET_FREE"
    assert widget_imports(module) == []


def test_app_model_modules_load_no_widgets_dynamically():
    probe = (
        "import json, sys\n"
        f"for name in {list(WIDGET_FREE)!r}:\n"
        "    __import__(name)\n"
        "print(json.dumps(sorted(sys.modules)))\n"
    )
    loaded = _fresh_interpreter(probe)
    assert [m for m in loaded if m.startswith(WIDGET_MODULES)] == []


def engine_imports_outside_api() -> list[str]:
    import a2ats_engine

    public = set(a2ats_engine.__all__) | {"__version__"}
    offenders = []
    for path in sorted(APP.rglob("*.py")):
        where = path.relative_to(ROOT).as_posix()
        if where in ENGINE_SEAMS:
            continue
        for line, module, names in module_imports(path):
            if _top(module) != "a2ats_engine":
                continue
            if module not in ENGINE_API:
                offenders.append(f"{where}:{line}: {module}")
            elif module == "a2ats_engine":
                offenders += [f"{where}:{line}: a2ats_engine.{n}" for n in names if n not in public]
    return offenders


def test_app_uses_the_engines_public_api():
    """App code imports the engine's public names and its records; anything else goes through
    `app/backend.py` (the seam), so the engine's internals can move without touching the app."""
    assert set(ENGINE_SEAMS) <= {p.relative_to(ROOT).as_posix() for p in APP.rglob("*.py")}
    assert engine_imports_outside_api() == []
