"""The flags several commands share, each group added by one function here: the same names,
defaults and help wherever they appear. Their range checks (`_limits.py`) run in the commands'
run functions before any model loads. MLX-free: `a2ats COMMAND --help` imports it."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

CODEBOOK_OR_RANDOM = "codebook file (default: the model's default, else random)"
"""--codebook of a benchmark that runs with a random codebook when the model has none."""
CODEBOOK_REQUIRED = "codebook file (default: the model's default codebook)"
"""--codebook of a command that needs one (retrieval is measured)."""
RERANK_HELP = "A2ATS rerank factor"
RERANK_CONFIG_HELP = "A2ATS rerank factor (default: the config's)"


def add_model_flags(
    p: argparse.ArgumentParser,
    codebook_help: str | None = CODEBOOK_OR_RANDOM,
    contexts: str | None = None,
    contexts_help: str = "comma-separated contexts",
) -> None:
    """--model (a model source, default demo), then --codebook unless `codebook_help` is None,
    then --contexts (a comma list) when `contexts` gives its default."""
    p.add_argument("--model", default="demo", help="model source (default: demo)")
    if codebook_help is not None:
        p.add_argument("--codebook", help=codebook_help)
    if contexts is not None:
        p.add_argument("--contexts", default=contexts, help=contexts_help)


def add_budget_flag(p: argparse.ArgumentParser) -> None:
    """--budget: the retrieval budget as a string, checked by `_limits.budget`."""
    p.add_argument("--budget", default="0.03", help="retrieval budget: fraction or token count")


def add_rerank_flag(p: argparse.ArgumentParser, help_text: str = RERANK_HELP) -> None:
    """--rerank: an int, None (the config's) unless given, checked by `_limits.config_check`."""
    p.add_argument("--rerank", type=int, default=None, help=help_text)


def add_retrieval_flags(p: argparse.ArgumentParser, rerank_help: str = RERANK_HELP) -> None:
    """--budget then --rerank."""
    add_budget_flag(p)
    add_rerank_flag(p, rerank_help)


def add_preset_flags(p: argparse.ArgumentParser) -> None:
    """--preset (`config.PRESETS`) and --estimate (off, auto or `config.ESTIMATE_SCORES`), None
    unless given; `retrieval_knobs` turns them and --rerank into config fields."""
    from ..cache.config import ESTIMATE_SCORES, PRESETS

    p.add_argument(
        "--preset",
        choices=tuple(PRESETS),
        help="A2ATS retrieval preset: speed (the default: rerank 2, the estimate only where "
        "measured to cost nothing on this machine) or quality "
        "(rerank 4: twice the candidates scored exactly, and the estimate with mean slot "
        "scores; closer to full attention, less of the decode speed-up); --rerank and "
        "--estimate override its fields",
    )
    p.add_argument(
        "--estimate",
        choices=("off", "auto", *ESTIMATE_SCORES),
        help="A2ATS: fold the far tokens not retrieved into the softmax through per-slot sums, "
        "with these slot scores (mean: what the app's On turns on); auto: with mean slot "
        "scores where `a2ats crossover` measured it to cost nothing on this machine for this "
        "model, else off; default: the preset's (speed: auto, quality: mean)",
    )


def retrieval_knobs(args: argparse.Namespace) -> dict[str, Any]:
    """The A2ATSConfig fields of --preset, --rerank and --estimate
    (`config.retrieval_fields`: the preset's, speed when none is given, then each of the other
    two given over its own fields; --estimate off: no estimate)."""
    from ..cache.config import retrieval_fields

    return retrieval_fields(
        getattr(args, "preset", None),
        getattr(args, "rerank", None),
        getattr(args, "estimate", None),
    )


def add_depths_flag(p: argparse.ArgumentParser, default: str) -> None:
    """--depths: where needles go, a comma list of fractions (`_limits.fractions`)."""
    p.add_argument("--depths", default=default, help="needle depths in [0, 1]")


def add_context_decode_flags(
    p: argparse.ArgumentParser, context_help: str, decode_help: str
) -> None:
    """--context (prefill tokens, default 4096) and --decode (teacher-forced tokens, default 64);
    the help texts name the defaults."""
    p.add_argument("--context", type=int, default=4096, help=context_help)
    p.add_argument("--decode", type=int, default=64, help=decode_help)


def add_hosts_flags(p: argparse.ArgumentParser, doing: str) -> None:
    """--hosts FILE (run `doing` with the model split over an mlx.launch hostfile's machines),
    with --port and --split for it (checked by `_limits.hosts_flags`)."""
    p.add_argument(
        "--hosts",
        metavar="FILE",
        help=f"{doing} with the model split over the machines of an mlx.launch hostfile "
        "(README 'Several machines')",
    )
    p.add_argument("--port", type=int, default=None, help="with --hosts: the ring's first port")
    p.add_argument("--split", metavar="N,N,...", help="with --hosts: layers per rank, rank 0 first")


def add_json_flag(
    p: argparse.ArgumentParser,
    run: Callable[[argparse.Namespace], int],
    help_text: str = "print one JSON object",
) -> None:
    """--json, and `run` as the command's function."""
    p.add_argument("--json", action="store_true", help=help_text)
    p.set_defaults(func=run)
