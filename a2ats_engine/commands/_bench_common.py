"""Shared pieces of `a2ats eval`, `a2ats crossover` and `a2ats bench ...`: codebook discovery,
config, progress, the machine, --json output. Their flags are in `_flags.py`, the flags' range
checks in `_limits.py`; what only `bench` subcommands share is in `bench/common.py`."""

from __future__ import annotations

import argparse
import json
import platform
import shlex
import sys
import warnings
from pathlib import Path
from typing import Any


def find_codebook(path: str | None, source: str, model_path: str | None, *, required: bool):
    """(Codebook | None, description). `path` wins; else `codebook.safetensors` in the model
    folder or, for the demo, its default codebook. ValueError when required and none found."""
    from ..cache.codebook import Codebook
    from ..loading.fetched_models import default_codebook

    found = (
        Path(path) if path else default_codebook(source, Path(model_path) if model_path else None)
    )
    if found is None:
        if required:
            raise ValueError(
                "no codebook for this model: pass --codebook FILE "
                "(make one with `a2ats calibrate --model SOURCE --out FILE`)"
            )
        return None, "random (no codebook found)"
    return Codebook.load(found), str(found)


def a2ats_config(codebook, model: Any, **knobs: Any):
    """An A2ATSConfig matching the codebook (the b it was calibrated with) plus `knobs`
    (None values ignored). Codebook/model mismatches raise; warnings go to stderr once."""
    from ..cache.config import A2ATSConfig

    base: dict[str, Any] = {}
    if codebook is not None and codebook.metadata.get("far_offset") is not None:
        base["far_offset"] = int(codebook.metadata["far_offset"])
    base.update({k: v for k, v in knobs.items() if v is not None})
    config = A2ATSConfig(**base)
    if codebook is not None:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            for note in codebook.validate_for(model, config) or []:
                print(f"warning: {note}", file=sys.stderr)
    return config


def parse_list(text: str, kind=int) -> list:
    return [kind(x) for x in text.split(",") if x.strip()]


def command_line(args: argparse.Namespace, *default: str) -> str:
    """The command line as given, quoted with shlex so it runs again: `a2ats` and `args.argv`
    (which `cli.main` sets), or `a2ats` and `default` when a caller built `args` itself."""
    return "a2ats " + shlex.join(getattr(args, "argv", None) or default)


def machine() -> str:
    """One line naming the machine (OS, CPU architecture, cores, CPU name and model numbers,
    MLX device)."""
    import os

    import mlx.core as mx

    from ..cache.crossover import cpu_model, cpu_name

    cpu = ", ".join(part for part in (cpu_name(), cpu_model()) if part)
    return (
        f"{platform.system()} {platform.machine()}, {os.cpu_count()} CPU cores"
        + (f" ({cpu})" if cpu else "")
        + f", MLX {mx.__version__} on {mx.default_device()}"
    )


def stderr_progress(enabled: bool):
    """progress(stage, done, total) printing one updating line to stderr (None if disabled)."""
    if not enabled:
        return None

    def progress(stage: str, done: int, total: int) -> None:
        print(f"\r  {stage}: {done}/{total}\033[K", end="", file=sys.stderr, flush=True)
        if done >= total:
            print(file=sys.stderr)

    return progress


def silence_random_codebook_warning() -> None:
    warnings.filterwarnings("ignore", message="A2ATS: no codebook given")


def print_json(args: argparse.Namespace, out: dict) -> bool:
    """With --json: print `out` as one JSON object and say so (True); else False."""
    if args.json:
        print(json.dumps(out))
    return bool(args.json)
