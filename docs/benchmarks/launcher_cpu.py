"""CPU the launcher itself uses while two local ranks sleep: mlx.launch as shipped against
`python -m a2ats_engine.distributed.launcher` (its stdio relay calmed).

    .venv/bin/python docs/benchmarks/launcher_cpu.py > docs/benchmarks/launcher_cpu.json

Each run: two ranks on 127.0.0.1 that sleep SECONDS; the launcher's own CPU seconds (user +
system, all its threads, from /proc) read just before the ranks end; stdin an open pipe.
Three runs each, interleaved; Linux only.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import mlx.core as mx

SECONDS = 5.0


def launcher_cpu(prefix: list[str], folder: Path, port: int) -> float:
    script = folder / "sleep.py"
    script.write_text(f"import time\ntime.sleep({SECONDS})\n")
    hosts = folder / "hosts.json"
    hosts.write_text(json.dumps([{"ssh": "127.0.0.1", "ips": ["127.0.0.1"]}] * 2))
    command = [*prefix, "--hostfile", str(hosts), "--starting-port", str(port)]
    command += ["--python", sys.executable, str(script)]
    with subprocess.Popen(command, stdin=subprocess.PIPE) as proc:
        time.sleep(SECONDS - 0.5)
        fields = Path(f"/proc/{proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        cpu = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        proc.stdin.close()
        proc.wait(timeout=60)
    return cpu


def main() -> None:
    kinds = {
        "mlx.launch": [str(Path(sys.executable).with_name("mlx.launch"))],
        "a2ats_engine.distributed.launcher": [
            sys.executable, "-m", "a2ats_engine.distributed.launcher"
        ],
    }  # fmt: skip
    runs: dict[str, list[float]] = {k: [] for k in kinds}
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(3):
            for j, (name, prefix) in enumerate(kinds.items()):
                runs[name].append(
                    round(launcher_cpu(prefix, Path(tmp), 47600 + 10 * (2 * i + j)), 2)
                )
    window = SECONDS - 0.5
    print(json.dumps({
        "what": "CPU seconds of the launcher process (all threads) while two local ranks sleep",
        "window_seconds": window,
        "runs": runs,
        "median_cpu_percent": {k: round(100 * statistics.median(v) / window, 1) for k, v in runs.items()},
        "machine": f"{platform.system()} {platform.machine()}, {os.cpu_count()} CPU cores, MLX {mx.__version__}",
        "command": ".venv/bin/python docs/benchmarks/launcher_cpu.py > docs/benchmarks/launcher_cpu.json",
    }, indent=1))  # fmt: skip


if __name__ == "__main__":
    main()
