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
"""

from __future__ import annotations

import select as _select
import sys
from typing import Any

WAIT = 0.02  # seconds a relay waits for output before it looks at stdin again


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


def main(argv: list[str] | None = None) -> int:
    from mlx._distributed_utils import launch

    if not patch(launch):
        print("note: mlx.launch's I/O relay not calmed (unexpected MLX version)", file=sys.stderr)
    sys.argv = ["mlx.launch", *(sys.argv[1:] if argv is None else argv)]
    return launch.main() or 0


if __name__ == "__main__":
    sys.exit(main())

__all__ = ["calm_select", "patch", "main", "WAIT"]
