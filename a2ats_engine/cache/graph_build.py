"""Build the graph step (`graph_step.cpp`) against the MLX installed here.

    python -m a2ats_engine.cache.graph_build     # `make venv` runs it

The graph step is an MLX primitive, so unlike `native_step.cpp` (a plain CPython extension,
built by `pip install -e .`) it links MLX's C++ library and takes MLX's Python arrays through
nanobind, the binding MLX's own module is built with. MLX promises neither a stable C++ ABI nor
a nanobind ABI across versions, so it is built here, against the `mlx` package of this Python
(its headers in `mlx/include`, `libmlx` in `mlx/lib`), with nanobind 3.1 (the `graph` extra:
MLX 0.32's nanobind ABI), and records MLX's version; `graph_step.py` refuses a build for
another. Linux only: the step runs on MLX's CPU device, and macOS runs MLX on Metal (where the
synced step stays). Where it cannot be built the engine takes the synced C++ step and
`a2ats info` says why.

The module lands beside this file as `_graph_step<EXT_SUFFIX>`, written whole or not at all.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
NANOBIND = "3.1.0"  # MLX 0.32's nanobind ABI (internals v22)


class BuildError(RuntimeError):
    """The graph step could not be built here; the message says why."""


def target() -> Path:
    """Where the built module goes."""
    return HERE / f"_graph_step{sysconfig.get_config_var('EXT_SUFFIX')}"


def _tools() -> tuple[str, Path, Path, str]:
    """(the C++ compiler, MLX's package folder, nanobind's folder, MLX's version)."""
    if not sys.platform.startswith("linux"):
        raise BuildError(f"only on Linux (MLX's CPU device); this is {sys.platform}")
    cxx = os.environ.get("CXX") or shutil.which("c++") or shutil.which("g++")
    if not cxx:
        raise BuildError("no C++ compiler (c++, g++ or $CXX)")
    try:
        import nanobind
    except ImportError:
        raise BuildError(f"nanobind is not installed (pip install nanobind=={NANOBIND})") from None
    if nanobind.__version__ != NANOBIND:
        raise BuildError(f"nanobind {nanobind.__version__}; MLX 0.32 needs {NANOBIND}")
    import mlx
    import mlx.core as mx

    root = Path(mlx.__path__[0])
    if not (root / "include" / "mlx" / "mlx.h").is_file() or not (root / "lib").is_dir():
        raise BuildError(f"{root} has no MLX headers or library (a wheel without include/)")
    return cxx, root, Path(nanobind.__file__).resolve().parent, mx.__version__


def build(quiet: bool = False) -> Path:
    """Compile and link `_graph_step` -> its path (BuildError naming what failed)."""
    cxx, mlx_root, nb, version = _tools()
    py_include = sysconfig.get_paths()["include"]
    common = ["-O3", "-DNDEBUG", "-fPIC", "-fvisibility=hidden", "-fno-strict-aliasing"]
    nb_inc = ["-I", str(nb / "include"), "-isystem", str(nb / "ext" / "robin_map" / "include")]
    with tempfile.TemporaryDirectory(prefix="a2ats-graph-step-") as tmp:
        objects = [Path(tmp) / "nanobind.o", Path(tmp) / "graph_step.o"]
        steps = [
            [cxx, *common, "-std=c++17", "-DNB_BUILD", "-DNB_COMPACT_ASSERTIONS",
             "-I", py_include, *nb_inc, "-c", str(nb / "src" / "nb_combined.cpp"),
             "-o", str(objects[0])],
            [cxx, *common, "-std=c++20", "-fopenmp-simd", "-DNB_DOMAIN=mlx",
             f'-DA2ATS_MLX_VERSION="{version}"', "-I", py_include, *nb_inc,
             "-isystem", str(mlx_root / "include"), "-c", str(HERE / "graph_step.cpp"),
             "-o", str(objects[1])],
            [cxx, "-shared", "-Wl,-s", "-Wl,--gc-sections", *map(str, objects),
             "-L", str(mlx_root / "lib"), "-lmlx", f"-Wl,-rpath,{mlx_root / 'lib'}",
             "-o", str(Path(tmp) / "out.so")],
        ]  # fmt: skip
        for cmd in steps:
            if not quiet:
                print(" ".join(cmd[:2]), "...", Path(cmd[cmd.index("-o") + 1]).name, flush=True)
            done = subprocess.run(cmd, capture_output=True, text=True)
            if done.returncode:
                raise BuildError(f"{' '.join(cmd)}\n{done.stderr[-4000:]}")
        out = target()
        staged = out.with_name(out.name + ".part")
        shutil.copyfile(Path(tmp) / "out.so", staged)
        os.replace(staged, out)
    return out


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    quiet = "--quiet" in args
    try:
        path = build(quiet)
    except BuildError as exc:
        print(f"graph step not built: {exc}", file=sys.stderr)
        return 1
    if not quiet:
        print(f"built {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
