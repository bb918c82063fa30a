"""What the app's "Run on: hosts" costs on two local ranks (the demo model, ring backend):

1. CPU while the ranks wait for the user: every process of the ranks' group (launcher and
   ranks, user + system seconds from /proc) over WINDOW seconds, for the served ranks as they
   wait now (`serve._next_request`: a check for a request every 0.1 s) and for two ranks
   waiting inside an MLX collective (how the served ranks waited before: rank 1 in the
   all_sum that shares rank 0's next request). Three runs each, interleaved.
2. The inspector's telemetry across ranks: the same greedy reply of up to TOKENS tokens
   (A2ATS retrieving from the first step) with telemetry off and on (each token every rank's snapshot gathered to rank
   0), tok/s, three runs interleaved.

    .venv/bin/python docs/benchmarks/ranks_app.py > docs/benchmarks/ranks_app.json

Linux only (reads /proc).
"""

from __future__ import annotations

import json
import os
import platform
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import mlx.core as mx

from a2ats_engine.cache.config import A2ATSConfig
from a2ats_engine.cache.telemetry import GenerationStats
from a2ats_engine.distributed.client import RanksClient
from a2ats_engine.distributed.launch import launcher
from a2ats_engine.records import SamplingSettings

WINDOW = 5.0
TOKENS = 32
PROMPT = (
    "Write a long, detailed story about two computers that share one language model, "
    "each serving half of its layers. " * 4
)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def group_cpu(group: int) -> float:
    """CPU seconds of every live process in process group `group`."""
    total = 0.0
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            if os.getpgid(int(proc.name)) != group:
                continue
            fields = (proc / "stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, ProcessLookupError):
            continue
        total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return total


def idle_window(group: int) -> float:
    before = group_cpu(group)
    time.sleep(WINDOW)
    return round(group_cpu(group) - before, 2)


def waiting_in_collective(folder: Path) -> float:
    """Two ranks: rank 0 sleeps, rank 1 waits for it in an all_sum."""
    script = folder / "wait.py"
    script.write_text(
        "import time\nimport mlx.core as mx\n"
        "g = mx.distributed.init(strict=True)\n"
        f"time.sleep({WINDOW + 4} if g.rank() == 0 else 0)\n"
        "mx.distributed.all_sum(mx.array(1.0), group=g).item()\n"
    )
    command = [*launcher(), "--backend", "ring", "--hostfile", str(hosts(folder))]
    command += ["--starting-port", str(free_port()), "--python", sys.executable, str(script)]
    with subprocess.Popen(command, stdin=subprocess.PIPE, start_new_session=True) as proc:
        time.sleep(3.0)  # both ranks started and waiting
        cpu = idle_window(proc.pid)
        proc.stdin.close()
        proc.wait(timeout=60)
    return cpu


def hosts(folder: Path) -> Path:
    path = folder / "hosts.json"
    path.write_text(json.dumps([{"ssh": "127.0.0.1", "ips": ["127.0.0.1"]}] * 2))
    return path


def reply_tps(client: RanksClient, telemetry: bool) -> float:
    config = A2ATSConfig(exact_below=0, telemetry=telemetry)
    sampling = SamplingSettings(temperature=0.0, max_tokens=TOKENS)
    client.configure(system_prompt=None, sampling=sampling, a2ats=config, turns=[])
    events = list(client.reply("send", PROMPT))
    stats = events[-1]
    assert isinstance(stats, GenerationStats) and stats.generation_tokens >= TOKENS // 2
    return round(stats.generation_tps, 3)


def main() -> None:
    idle: dict[str, list[float]] = {"served ranks (now)": [], "a rank waiting in a collective": []}
    tps: dict[str, list[float]] = {"telemetry off": [], "telemetry on": []}
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        client = RanksClient(hosts(folder), "demo", port=free_port())
        try:
            for _ in range(3):
                idle["a rank waiting in a collective"].append(waiting_in_collective(folder))
                time.sleep(3.0)  # past the served ranks' quick checks after a request
                idle["served ranks (now)"].append(idle_window(client._process.pid))
            for _ in range(3):
                for name, on in (("telemetry off", False), ("telemetry on", True)):
                    tps[name].append(reply_tps(client, on))
        finally:
            client.close()
    off, on = statistics.median(tps["telemetry off"]), statistics.median(tps["telemetry on"])
    print(json.dumps({
        "what": "two local ranks of the demo model served to the app: CPU while they wait "
                "for the user, and tok/s with the inspector's telemetry gathered each token",
        "idle_window_seconds": WINDOW,
        "idle_cpu_seconds": idle,
        "idle_median_cpu_percent": {k: round(100 * statistics.median(v) / WINDOW, 1) for k, v in idle.items()},
        "reply_tokens": TOKENS,
        "reply_tps": tps,
        "telemetry_on_over_off": round(on / off, 3),
        "machine": f"{platform.system()} {platform.machine()}, {os.cpu_count()} CPU cores, MLX {mx.__version__}",
        "load_average_at_end": [round(x, 2) for x in os.getloadavg()],
        "command": ".venv/bin/python docs/benchmarks/ranks_app.py > docs/benchmarks/ranks_app.json",
    }, indent=1))  # fmt: skip


if __name__ == "__main__":
    main()
