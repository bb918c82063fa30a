"""The one compiled part: the host decode step in C++ (`a2ats_engine/cache/native_step.cpp`).

Everything else is in pyproject.toml. The extension is optional: where it cannot be built (no
C++ compiler) the install goes on and the engine takes its NumPy step, saying so
(`a2ats info`; `a2ats_engine/cache/native_step.py`).
"""

import sys

from setuptools import Extension, setup

ARGS = ["/O2"] if sys.platform == "win32" else ["-O3", "-std=c++17", "-fopenmp-simd"]

setup(
    ext_modules=[
        Extension(
            "a2ats_engine.cache._native_step",
            sources=["a2ats_engine/cache/native_step.cpp"],
            extra_compile_args=ARGS,
            language="c++",
            optional=True,
        )
    ]
)
