"""1 rank vs 2 ranks on this machine: tok/s, bytes each rank holds, bytes sent per decode step.

`python -m a2ats_engine.distributed.bench --model demo --out docs/benchmarks/distributed_demo.json`
runs the same greedy chat on one process and on two ranks (mlx.launch, ring backend, loopback),
reads every rank's `--stats-json` record and writes one JSON with the command. With
`--geometry NAME` (bench/geometries.py) it first writes a random-weight model folder of that
real geometry and a random codebook of its shape (speed and bytes depend on shapes only).

Two ranks on one machine share its cores and memory bandwidth, and traffic goes through the
loopback: tok/s is indicative only. The point is per-rank bytes and traffic, which are the
same on two Macs.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from .launch import launcher

NOTE = (
    "Measured on a shared 2-core Linux development machine (CPU MLX) that was running other "
    "work at the same time; both ranks share its cores and the ring goes through the loopback "
    "address, so tok/s is indicative only. Per-rank bytes and bytes sent per decode step are "
    "the point: they are what two machines would hold and send."
)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _launch_prefix(ranks: int, folder: Path) -> list[str]:
    if ranks == 1:
        return [sys.executable, "-m", "a2ats_engine.distributed"]
    hosts = folder / "hosts.json"
    hosts.write_text(json.dumps([{"ssh": "127.0.0.1", "ips": ["127.0.0.1"]}] * ranks))
    return [
        *launcher(), "--backend", "ring", "--hostfile", str(hosts), "--starting-port",
        str(_free_port()), "--python", sys.executable, "-m", "a2ats_engine.distributed",
    ]  # fmt: skip


def run_ranks(ranks: int, options: list[str], folder: Path) -> dict:
    """One chat on `ranks` ranks; every rank's record, and the wall time."""
    prefix = folder / f"n{ranks}"
    command = [*_launch_prefix(ranks, folder), *options, "--stats-json", str(prefix)]
    t0 = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if done.returncode != 0:
        raise RuntimeError(f"{ranks} rank(s) failed: {done.stderr.strip()[-800:]}")
    records = [json.loads(Path(f"{prefix}.rank{r}.json").read_text()) for r in range(ranks)]
    return {"wall_s": round(wall, 1), "ranks": [_summary(r) for r in records], "raw": records}


def _summary(record: dict) -> dict:
    reply = record["replies"][0]
    return {
        "rank": record["rank"],
        "layers": record["layers"],
        "weight_bytes": record["weight_bytes"],
        "cache_bytes": reply["cache_bytes"],
        "codebook_bytes": reply["codebook_bytes"],
        "peak_memory_bytes": reply["peak_memory_bytes"],
        "sent_bytes_per_decode_step": reply["sent_bytes_per_decode_step"],
        "received_bytes_per_decode_step": reply["received_bytes_per_decode_step"],
        "generation_tps": reply["generation_tps"],
        "prompt_tokens": reply["prompt_tokens"],
        "generated_tokens": len(reply["tokens"]),
    }


def geometry_folder(name: str, folder: Path) -> tuple[Path, Path]:
    """A random-weight model folder of geometry `name` and a random codebook of its shape."""
    import mlx.core as mx
    from mlx.utils import tree_flatten

    from ..bench.geometries import geometry_config, geometry_model
    from ..cache.codebook import Codebook
    from ..loading.tiny_model import save_tiny_tokenizer

    model = geometry_model(name)
    out = folder / name
    out.mkdir(parents=True, exist_ok=True)
    mx.save_safetensors(str(out / "model.safetensors"), dict(tree_flatten(model.parameters())))
    config = geometry_config(name)
    (out / "config.json").write_text(json.dumps(config))
    save_tiny_tokenizer(out)
    head_dim = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
    book = Codebook.random(
        config["num_hidden_layers"], config["num_key_value_heads"], head_dim, 1024, seed=0
    )
    book.save(out / "codebook.safetensors")
    del model
    return out, out / "codebook.safetensors"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m a2ats_engine.distributed.bench")
    p.add_argument("--model", default="demo", help="model source (ignored with --geometry)")
    p.add_argument("--geometry", help="a bench/geometries.py name: random weights, that shape")
    p.add_argument("--prompt-file", help="prompt text (default: the README's first 1,800 chars)")
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--tensor", action="store_true", help="the 2 ranks split by heads (--tensor)")
    p.add_argument("--out", required=True, help="JSON file to write")
    args = p.parse_args(argv)
    root = Path(__file__).resolve().parents[2]
    if args.prompt_file:
        prompt = Path(args.prompt_file).read_text()
    else:
        text = (root / "README.md").read_text()[:1800]
        prompt = "Summarise this text in two sentences.\n\n" + text
    with tempfile.TemporaryDirectory(prefix="a2ats-dist-bench") as tmp:
        folder = Path(tmp)
        options = ["--temp", "0", "--max-tokens", str(args.max_tokens), "--exact-below", "0"]
        options += ["--peer-timeout", "1800"]  # a slow step on a shared machine is not a loss
        model = args.model
        if args.geometry:
            model_dir, book = geometry_folder(args.geometry, folder)
            model = str(model_dir)
            options += ["--codebook", str(book)]
        options = ["--model", model, *options, "--prompt", prompt]
        runs = {
            str(n): run_ranks(n, options + (["--tensor"] if args.tensor and n > 1 else []), folder)
            for n in (1, 2)
        }
    one = runs["1"]["raw"][0]["replies"][0]["tokens"]
    for run in runs.values():
        run["tokens_equal_to_one_process"] = all(
            r["replies"][0]["tokens"] == one for r in run.pop("raw")
        )
    record = {
        "what": "one chat (greedy, A2ATS retrieving from the first step) on 1 vs 2 ranks"
        + (" split by heads (tensor)" if args.tensor else ""),
        "split": "tensor" if args.tensor else "pipeline",
        "model": args.geometry or args.model,
        "command": "python -m a2ats_engine.distributed.bench " + shlex.join(argv or sys.argv[1:]),
        "machine": f"{platform.system()} {platform.machine()}, {os.cpu_count()} cores (shared)",
        "note": NOTE,
        "runs": runs,
    }
    Path(args.out).write_text(json.dumps(record, indent=1) + "\n")
    print(json.dumps(record, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
