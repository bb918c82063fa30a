"""The launcher ends its ranks when the program that started it dies (launcher.watch_parent)."""

import contextlib
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from a2ats_engine.distributed import launcher

from .conftest import local_launch


def _gone(pid: int) -> bool:
    """No such process, or only its zombie (the launcher's orphans are reaped by init)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return True
    return state in ("Z", "X")


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="reads /proc (Linux)")
@pytest.mark.parametrize("own_session", [True, False], ids=["app", "command-line"])
def test_the_ranks_end_when_the_program_that_started_them_is_killed(
    two_ranks, tmp_path, own_session
):
    """The app starts the launcher in a session of its own, `a2ats chat --hosts` in its own
    group; either way a SIGKILL of that program ends the launcher and both ranks."""
    rank = tmp_path / "rank.py"
    rank.write_text(  # a rank that would outlive everything: it only sleeps
        "import os, sys, time\n"
        "open(f\"{sys.argv[1]}/rank{os.environ['MLX_RANK']}.pid\", 'w').write(str(os.getpid()))\n"
        "time.sleep(300)\n"
    )
    command = local_launch(tmp_path, rank, str(tmp_path))
    parent = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(f"""
            import subprocess, sys, time
            p = subprocess.Popen({command!r}, stdin=subprocess.PIPE,
                                 start_new_session={own_session!r})
            print(p.pid, flush=True)
            time.sleep(300)
        """)],
        stdout=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    pids: list[int] = []
    try:
        launcher_pid = int(parent.stdout.readline())
        files = [tmp_path / f"rank{r}.pid" for r in range(2)]
        deadline = time.monotonic() + 60
        while not all(f.is_file() and f.read_text() for f in files):
            assert time.monotonic() < deadline, "the ranks did not start"
            time.sleep(0.1)
        pids = [launcher_pid, *(int(f.read_text()) for f in files)]
        assert not any(_gone(p) for p in pids)
        parent.send_signal(signal.SIGKILL)
        parent.wait(timeout=10)
        deadline = time.monotonic() + launcher.PARENT_POLL + launcher.GRACE + 10
        while not all(_gone(p) for p in pids) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert [p for p in pids if not _gone(p)] == [], "launcher or ranks outlived the program"
    finally:
        parent.kill()
        parent.wait()
        parent.stdout.close()
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)


def test_children_lists_live_children_only(tmp_path):
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        assert child.pid in launcher.children(os.getpid())
    finally:
        child.kill()
    time.sleep(0.2)  # a zombie until waited for: not a live child
    assert child.pid not in launcher.children(os.getpid())
    child.wait()
