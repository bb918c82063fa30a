"""The repository's Python as tests see it: the imports a source file makes (read from the
source, so imports inside functions count) and what a snippet does in a fresh interpreter at the
repository root."""

from __future__ import annotations

import ast
import importlib.util
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def bench_script(name: str):
    """`docs/benchmarks/<name>.py` loaded as a module (the scripts there are not a package)."""
    spec = importlib.util.spec_from_file_location(name, ROOT / "docs" / "benchmarks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def module_imports(
    path: Path, *, type_checking: bool = True
) -> list[tuple[int, str, tuple[str, ...]]]:
    """(line, absolute module, names imported from it) of every import in `path`, functions
    included; `import x` imports no names. Relative imports resolve against the file's package
    under ROOT. type_checking=False leaves out `if TYPE_CHECKING:` blocks (they never run)."""
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    skipped = set()
    if not type_checking:
        for node in ast.walk(tree):
            if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
                skipped.update(id(sub) for sub in ast.walk(node))
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    package = parts if parts[-1] == "__init__" else parts[:-1]
    package = [p for p in package if p != "__init__"]
    found = []
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name, ()) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module != "__future__":
            if node.level:
                base = package[: len(package) - (node.level - 1)]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            found.append((node.lineno, module, tuple(a.name for a in node.names)))
    return found


def run_python(code: str, env: Mapping[str, str], timeout: float) -> subprocess.CompletedProcess:
    """Run `code` with this interpreter in a fresh process at ROOT; stdout and stderr as text."""
    command = [sys.executable, "-c", code]
    return subprocess.run(
        command, capture_output=True, text=True, timeout=timeout, cwd=ROOT, env=env
    )
