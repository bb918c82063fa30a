"""Run engine code in a child interpreter whose address space is capped (`RLIMIT_AS`), so a
reader that allocates from a size in a hostile file fails the test with MemoryError (or is
killed) instead of exhausting the machine."""

from __future__ import annotations

import json
import os
import textwrap
from pathlib import Path

from repo_python import run_python

ROOT = Path(__file__).resolve().parents[2]
CAP_BYTES = 3 * 2**30
"""Address space of the child: MLX and numpy imported need about 1.2 GB of it on Linux."""

_PRELUDE = """
import json, resource, sys, traceback
resource.setrlimit(resource.RLIMIT_AS, ({cap}, {cap}))
import a2ats_engine  # the BLAS preload first
from a2ats_engine.errors import A2ATSError
def report(kind, message):
    print("RESULT " + json.dumps({{"kind": kind, "message": message}}))
try:
{body}
    report("ok", "")
except (A2ATSError, ValueError) as exc:
    report(type(exc).__name__ if isinstance(exc, A2ATSError) else "ValueError", str(exc))
except BaseException as exc:
    report("other:" + type(exc).__name__, "".join(traceback.format_exception(exc))[-2000:])
"""


def run_capped(body: str, cap: int = CAP_BYTES, timeout: float = 120) -> dict:
    """Run `body` (Python statements) under an address-space cap of `cap` bytes; returns
    {"kind": "ok" | <A2ATSError subclass> | "ValueError" | "other:<type>" | "killed",
    "message": ...}."""
    code = _PRELUDE.format(cap=cap, body=textwrap.indent(textwrap.dedent(body), "    "))
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{ROOT / 'tests'}"}
    proc = run_python(code, env, timeout)
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT ") :])
    return {"kind": "killed", "message": f"exit {proc.returncode}: {proc.stderr[-2000:]}"}
