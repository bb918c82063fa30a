"""`python -m a2ats_engine.distributed.launcher ARGS`: mlx.launch with ARGS, its I/O relay calmed.

mlx.launch relays each rank's stdin, stdout and stderr through one thread per rank whose loop
waits in `select(outputs, [stdin], [], 1.0)`. A pipe is writable whenever its buffer has room,
so that `select` returns at once even with nothing to write, and every relay thread spins: with
two local ranks the launcher itself took ~1.5 of this 2-core machine's cores while the ranks
slept (measured: 143-147% CPU). Here the same launcher runs with a `select` that waits for
output first (up to 20 ms) and asks for writability without waiting: stdin reaches a rank
within 20 ms, output as soon as it comes, and an idle relay costs next to nothing
(`tests/engine/distributed/test_launcher.py` measures it).

Nothing else of mlx.launch changes (hostfile, backends, environment); when its module does not
look as expected (another MLX version) it runs unchanged.

The launcher also ends with the program that started it (`watch_parent`): if that program is
killed outright (SIGKILL, a crash), nothing else would stop mlx.launch and its ranks, which would
keep the model in memory and may spin on the cores. When its parent is gone the launcher ends
its ranks (its process group when it leads one, as the app starts it; else its own children,
the local ranks or the ssh to remote ones) and exits.
"""

from __future__ import annotations

import contextlib
import os
import select as _select
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

WAIT = 0.02  # seconds a relay waits for output before it looks at stdin again
PARENT_POLL = 0.5  # seconds between two looks at whether the launcher's parent is alive
GRACE = 3.0  # seconds the ranks get to end on SIGTERM before SIGKILL


def calm_select(rlist: list, wlist: list, xlist: list, timeout: float | None = None) -> tuple:
    """`select.select` that does not return at once just because a pipe in `wlist` has room:
    it waits up to `WAIT` (or `timeout`, if shorter) for `rlist`/`xlist`, then polls `wlist`."""
    if not wlist:
        return _select.select(rlist, wlist, xlist, timeout)
    wait = WAIT if timeout is None else min(timeout, WAIT)
    readable, _, errors = _select.select(rlist, [], xlist, wait)
    _, writable, _ = _select.select([], wlist, [], 0)
    return readable, writable, errors


def patch(module: Any) -> bool:
    """Give mlx.launch's module the calm `select`; False (module unchanged) when it does not
    import `select` the way this was written against (mlx 0.2x-0.3x)."""
    if getattr(module, "select", None) is not _select.select:
        return False
    module.select = calm_select
    return True


def children(pid: int) -> list[int]:
    """The live child processes of `pid` (/proc on Linux, `pgrep -P` elsewhere; [] if neither
    can tell)."""
    proc = Path("/proc")
    if proc.is_dir():
        found = []
        for entry in proc.iterdir():
            if not entry.name.isdigit():
                continue
            try:  # the state line: "pid (comm) state ppid ..."; comm may hold spaces or ")"
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except (OSError, IndexError):
                continue
            if len(fields) > 1 and fields[1] == str(pid) and fields[0] != "Z":  # not a zombie
                found.append(int(entry.name))
        return found
    try:
        out = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.TimeoutExpired):
        return []
    return [int(x) for x in out.stdout.split() if x.isdigit()]


def end_ranks(grace: float = GRACE) -> None:
    """SIGTERM this process's children (the local ranks, or the ssh to remote ones), SIGKILL
    what is left of them after `grace` seconds; when it leads its process group (the app starts
    it in a session of its own) the group is then ended with SIGKILL, this process included."""
    me = os.getpid()
    targets = children(me)
    for pid in targets:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while children(me) and time.monotonic() < deadline:
        time.sleep(0.1)
    for pid in children(me):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
    if os.getpgrp() == me:  # anything else of the group (a rank's own children) goes too
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(me, signal.SIGKILL)


def watch_parent(poll: float = PARENT_POLL) -> threading.Thread:
    """A daemon thread that ends the ranks and this process once its parent is gone (this
    process is then re-parented, so `os.getppid()` changes)."""
    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(poll)
        print("note: the program that started the ranks is gone; ending them", file=sys.stderr)
        end_ranks()
        os._exit(1)

    thread = threading.Thread(target=watch, name="parent-watch", daemon=True)
    thread.start()
    return thread


def main(argv: list[str] | None = None) -> int:
    from mlx._distributed_utils import launch

    watch_parent()

    if not patch(launch):
        print("note: mlx.launch's I/O relay not calmed (unexpected MLX version)", file=sys.stderr)
    sys.argv = ["mlx.launch", *(sys.argv[1:] if argv is None else argv)]
    return launch.main() or 0


if __name__ == "__main__":
    sys.exit(main())

__all__ = ["calm_select", "patch", "main", "watch_parent", "end_ranks", "children", "WAIT"]
