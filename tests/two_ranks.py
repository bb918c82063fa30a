"""Shared by the two-rank tests (tests/engine/distributed, tests/app/test_ranks_backend.py):
whether mlx.launch can start two ranks on this machine, a free port, a loopback hosts file."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from a2ats_engine.distributed.launch import launcher


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def local_hosts(folder: Path, n: int = 2) -> Path:
    """An mlx.launch hostfile of `n` ranks on the loopback address."""
    path = folder / "hosts.json"
    path.write_text(json.dumps([{"ssh": "127.0.0.1", "ips": ["127.0.0.1"]}] * n))
    return path


def local_launch(folder: Path, script: Path, *args: str) -> list[str]:
    """The launcher's command line running `script ARGS` on two ranks on the loopback address
    (ring backend; the hosts file written into `folder`)."""
    command = [*launcher(), "--backend", "ring", "--hostfile", str(local_hosts(folder))]
    return [*command, "--starting-port", str(free_port()), "--python", sys.executable,
            str(script), *args]  # fmt: skip


@pytest.fixture(scope="session")
def two_ranks(tmp_path_factory):
    """Skip (with mlx.launch's words) only where mlx.launch cannot start two ranks here."""
    folder = tmp_path_factory.mktemp("ring")
    script = folder / "ring_ok.py"
    script.write_text(  # each rank writes a file: mlx.launch may interleave the ranks' stdout
        "import sys\n"
        "import mlx.core as mx\n"
        "g = mx.distributed.init(strict=True)\n"
        "s = mx.distributed.all_sum(mx.array(1.0), group=g).item()\n"
        "open(f'{sys.argv[1]}/rank{g.rank()}', 'w').write(f'{s} {g.size()}')\n"
    )
    command = local_launch(folder, script, str(folder))
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired) as exc:
        pytest.skip(f"mlx.launch cannot start two ranks here: {exc}")
    answers = [folder / f"rank{r}" for r in range(2)]
    if not all(a.is_file() and a.read_text() == "2.0 2" for a in answers):
        said = (done.stderr.strip() or done.stdout.strip() or f"exit {done.returncode}")[-300:]
        pytest.skip(f"mlx.launch cannot start two ranks here: {said}")


def rank_pid(group: int, rank: int) -> int:
    """The Python process of `rank` among the launcher's process group (its MLX_RANK)."""
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            if os.getpgid(int(proc.name)) != group:
                continue
            env = (proc / "environ").read_bytes().split(b"\0")
            exe = os.readlink(proc / "exe")
        except OSError:
            continue
        if f"MLX_RANK={rank}".encode() in env and "python" in Path(exe).name:
            return int(proc.name)
    raise AssertionError(f"no process of rank {rank} in group {group}")


def group_cpu(group: int) -> float:
    """CPU seconds (user + system) of every live process in process group `group`."""
    total = 0.0
    for proc in Path("/proc").iterdir():
        try:
            if not proc.name.isdigit() or os.getpgid(int(proc.name)) != group:
                continue
            fields = (proc / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return total
