"""`a2ats chat --hosts FILE` (and `calibrate`, `eval`): start `mlx.launch` (calmed, `launcher.py`) with
`python -m a2ats_engine.distributed` (or `.distributed.calibrate`, `.distributed.evaluate`).

The hosts file is mlx.launch's own (`--hostfile`): a JSON list of hosts, or an object with
`hosts` (and optionally `backend`, `envs`), each host `{"ssh": NAME, "ips": [IP, ...]}`. A host
whose `ssh` is 127.0.0.1 runs locally; any other is reached with ssh, where the same Python
(`sys.executable`), package, model and codebook paths must exist. We add nothing to MLX's
runtime: this module only builds the command line.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

# `a2ats chat` options forwarded as they are: (attribute, flag)
FORWARDED = (
    ("model", "--model"),
    ("system", "--system"),
    ("prompt", "--prompt"),
    ("temp", "--temp"),
    ("top_p", "--top-p"),
    ("min_p", "--min-p"),
    ("top_k", "--top-k"),
    ("repetition_penalty", "--repetition-penalty"),
    ("max_tokens", "--max-tokens"),
    ("seed", "--seed"),
    ("cache", "--cache"),
    ("codebook", "--codebook"),
    ("budget", "--budget"),
    ("window", "--window"),
    ("preset", "--preset"),
    ("rerank", "--rerank"),
    ("estimate", "--estimate"),
    ("tensor", "--tensor"),
)


MAX_HOSTS_BYTES = 1 << 20  # a hosts file is a few lines of JSON
MAX_HOSTS = 1024


def read_hosts(path: str | Path) -> list[dict]:
    """The hosts of an mlx.launch hostfile. ValueError (one line) for a file mlx.launch would
    refuse: missing, not JSON, no hosts, a host without `ssh`."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"hosts file {path}: no such file")
    try:
        if path.stat().st_size > MAX_HOSTS_BYTES:
            raise ValueError(f"hosts file {path}: over {MAX_HOSTS_BYTES:,} bytes, not a hosts file")
        data = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as exc:
        raise ValueError(f"hosts file {path}: not JSON ({str(exc)[:120]})") from None
    except OSError as exc:
        raise ValueError(f"hosts file {path}: cannot be read ({exc.strerror or exc})") from None
    hosts = data.get("hosts") if isinstance(data, dict) else data
    if not isinstance(hosts, list) or not hosts:
        raise ValueError(f"hosts file {path}: needs a list of hosts (mlx.launch's hostfile format)")
    if len(hosts) > MAX_HOSTS:
        raise ValueError(f"hosts file {path}: {len(hosts):,} hosts, at most {MAX_HOSTS} are used")
    for i, host in enumerate(hosts):
        if not isinstance(host, dict) or not isinstance(host.get("ssh"), str):
            raise ValueError(f'hosts file {path}: host {i} needs an "ssh" name (and "ips")')
    return hosts


def launcher() -> list[str]:
    """The command that starts mlx.launch: this Python running it with its I/O relay calmed
    (`launcher.py`: mlx.launch's own relay spins a core per rank). ValueError when this
    Python's MLX has no mlx.launch."""
    import importlib.util

    if importlib.util.find_spec("mlx._distributed_utils.launch") is None:
        raise ValueError("mlx.launch not found (it comes with the mlx package)")
    return [sys.executable, "-m", "a2ats_engine.distributed.launcher"]


# `a2ats calibrate` options forwarded to `a2ats_engine.distributed.calibrate`
CALIBRATE_FORWARDED = (
    ("model", "--model"),
    ("out", "--out"),
    ("tokens", "--tokens"),
    ("centroids", "--centroids"),
    ("beta", "--beta"),
    ("sub_dim", "--sub-dim"),
    ("far_offset", "--far-offset"),
    ("keys_per_head", "--keys-per-head"),
    ("iters", "--iters"),
    ("seed", "--seed"),
    ("split", "--split"),
)


def launch_command(
    args: argparse.Namespace,
    hosts: str | Path,
    port: int | None = None,
    module: str = "a2ats_engine.distributed",
    forwarded: tuple[tuple[str, str], ...] = FORWARDED,
) -> list:
    """The mlx.launch command line running `module` with `args`' `forwarded` options (a list
    value, like repeated --text files, gives the flag once per item; True gives the bare flag)."""
    read_hosts(hosts)
    command = [*launcher(), "--hostfile", str(hosts), "--python", sys.executable]
    if port is not None:
        command += ["--starting-port", str(port)]
    command += ["-m", module]
    for name, flag in forwarded:
        value = getattr(args, name, None)
        if value is True:
            command.append(flag)
        elif isinstance(value, list):
            for item in value:
                command += [flag, str(item)]
        elif value is not None and value is not False:
            command += [flag, str(value)]
    return command


EVAL_FORWARDED = (
    ("model", "--model"),
    ("codebook", "--codebook"),
    ("texts", "--texts"),
    ("text", "--text"),
    ("context", "--context"),
    ("decode", "--decode"),
    ("budget", "--budget"),
    ("methods", "--methods"),
    ("split", "--split"),
    ("json", "--json"),
)


def eval_command(args: argparse.Namespace, hosts: str | Path, port: int | None = None) -> list:
    """The mlx.launch command line of `a2ats eval --hosts FILE`."""
    return launch_command(args, hosts, port, "a2ats_engine.distributed.evaluate", EVAL_FORWARDED)


def calibrate_command(args: argparse.Namespace, hosts: str | Path, port: int | None = None):
    """The mlx.launch command line of `a2ats calibrate --hosts FILE`."""
    forwarded = (*CALIBRATE_FORWARDED, ("text", "--text"), ("force", "--force"))
    return launch_command(args, hosts, port, "a2ats_engine.distributed.calibrate", forwarded)


def run_on_hosts(args: argparse.Namespace) -> int:
    """`a2ats chat --hosts FILE`: run the chat over the hosts; the exit code of mlx.launch."""
    command = launch_command(args, args.hosts, getattr(args, "port", None))
    if args.prompt is None:
        return subprocess.call(command)
    # one-shot: stdin stays an open pipe (mlx.launch's own loop spins on a stdin at its end)
    with subprocess.Popen(command, stdin=subprocess.PIPE) as process:
        return process.wait()


__all__ = [
    "read_hosts",
    "launch_command",
    "calibrate_command",
    "eval_command",
    "run_on_hosts",
    "FORWARDED",
]
