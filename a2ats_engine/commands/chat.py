"""`a2ats chat`: talk to a model in the terminal (REPL), or ask one question with `--prompt`.

The reply streams to stdout; the stats line (`[12 prompt tokens, 30 generated, TTFT 0.21 s,
11.8 tok/s, peak 0.4 GB, stop]`), notes and warnings go to stderr, so stdout holds only replies.
"""

from __future__ import annotations

import argparse
import re
import signal
import sys
import threading
import warnings
from pathlib import Path
from typing import Any

from ..cache.config import describe_retrieval
from ._flags import add_preset_flags, add_rerank_flag, retrieval_knobs

REPL_HELP = "commands: /reset clears the conversation, /exit (or Ctrl-D) quits"


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "chat",
        help="chat with a model in the terminal (REPL, or one-shot with --prompt)",
        description=(
            "Chat with a model. With --prompt: print the reply, then exit. Without: a REPL "
            f"({REPL_HELP}; Ctrl-C stops a reply). Replies stream to stdout; the stats line "
            "[prompt tokens, generated tokens, TTFT, tok/s, peak memory, stop reason] and notes "
            "go to stderr. Sampling follows the model's recommended settings (its "
            "generation_config.json, a GGUF's sampling keys, greedy for the demo) as the app "
            "does; --temp, --top-p, --min-p, --top-k and --repetition-penalty override them one "
            "by one."
        ),
    )
    p.add_argument(
        "--model",
        default="demo",
        metavar="SOURCE",
        help="mlx-lm folder, .gguf file, Hugging Face repo id (org/name), 'demo' or "
        "'gemma3-270m' (default: demo, SmolLM2-135M-Instruct)",
    )
    p.add_argument("--system", metavar="TEXT", help="system prompt")
    p.add_argument("--prompt", metavar="TEXT", help="one-shot: answer TEXT and exit")
    # Sampling: the model's recommended values (as the app uses them), each flag overriding
    # its own field; the plain defaults in the help apply when the model recommends none.
    p.add_argument("--temp", type=float, help="temperature; 0 = greedy (default 0.7)")
    p.add_argument("--top-p", type=float, help="nucleus sampling mass (default 1.0)")
    p.add_argument("--min-p", type=float, help="min-p filter (default 0 = off)")
    p.add_argument("--top-k", type=int, help="top-k filter (default 0 = off)")
    p.add_argument("--repetition-penalty", type=float, help="> 1 discourages repeats (default 1)")
    p.add_argument("--max-tokens", type=int, default=512, help="reply length limit (default 512)")
    p.add_argument("--seed", type=int, help="random seed (default: unseeded)")
    p.add_argument(
        "--cache",
        choices=("a2ats", "full"),
        help="KV cache: a2ats (retrieval cache, needs a codebook) or full (mlx-lm KVCache). "
        "Default: a2ats when a codebook for the model is found (--codebook, "
        "codebook.safetensors in the model folder, or the demo's default codebook), else full",
    )
    p.add_argument("--codebook", metavar="FILE", help="A2ATS codebook file (.safetensors)")
    p.add_argument(
        "--budget",
        type=_budget,
        help="A2ATS far tokens retrieved per query head: a fraction of the context in (0, 1] "
        "(e.g. 0.03) or a token count (e.g. 256)",
    )
    p.add_argument("--window", type=int, help="A2ATS exact-RoPE window in tokens")
    add_preset_flags(p)
    add_rerank_flag(
        p,
        "A2ATS: score the top N*K far tokens by codebook exactly and keep the best K (1-64; "
        "default 2)",
    )
    p.add_argument(
        "--kv-memory",
        type=memory_size,
        metavar="SIZE",
        help="A2ATS: K/V rows kept in memory at most (e.g. 512M, 2G; 0 = all in the cold tier): "
        "past it the rows go to a memory-mapped file, only the codes stay (default: no limit)",
    )
    p.add_argument(
        "--hosts",
        metavar="FILE",
        help="split the model over the hosts of an mlx.launch hostfile (README 'Several "
        "machines'); runs `mlx.launch --hostfile FILE -m a2ats_engine.distributed`",
    )
    p.add_argument("--port", type=int, help="with --hosts: the ring backend's first port")
    p.add_argument(
        "--tensor",
        action="store_true",
        help="with --hosts: split by KV heads (every host serves every layer, its share of the "
        "heads) instead of by layers",
    )
    p.set_defaults(func=run)


def memory_size(text: str) -> int:
    """'512M' / '2G' / '1.5GiB' / '1000000' -> bytes (binary units), within [0, 1 PiB]."""
    units = {"": 1, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}
    raw = text.strip().upper().removesuffix("IB").removesuffix("B")
    unit = raw[-1:] if raw[-1:] in units and raw[-1:] else ""
    try:
        value = float(raw[: len(raw) - len(unit)]) * units[unit]
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (e.g. 512M, 2G, 0)") from None
    if not 0 <= value <= 2**50:
        raise argparse.ArgumentTypeError(f"size {text!r} is out of range: 0 to 1P")
    return int(value)


def _budget(text: str) -> float | int:
    """'0.03' -> 0.03 (fraction), '256' -> 256 (token count)."""
    try:
        return int(text)
    except ValueError:
        try:
            return float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None


SAMPLING_FLAGS = {
    "temperature": "temp",
    "top_p": "top_p",
    "min_p": "min_p",
    "top_k": "top_k",
    "repetition_penalty": "repetition_penalty",
}
"""SamplingSettings field -> the `a2ats chat` flag (argparse dest) that sets it."""


def sampling_for(args: argparse.Namespace, recommended: Any) -> Any:
    """The reply's SamplingSettings: the model's `recommended` ones (or the defaults when it
    recommends none), each sampling flag given overriding its field; max_tokens and seed
    always from the flags."""
    from ..records import SamplingSettings

    base = recommended if recommended is not None else SamplingSettings()
    fields = {f: getattr(base, f) for f in SAMPLING_FLAGS}
    given = {f: getattr(args, dest) for f, dest in SAMPLING_FLAGS.items()}
    fields.update({f: v for f, v in given.items() if v is not None})
    return SamplingSettings(**fields, seed=args.seed, max_tokens=args.max_tokens)


def run(args: argparse.Namespace) -> int:
    from . import _limits as limits

    if getattr(args, "tensor", False) and not getattr(args, "hosts", None):
        raise ValueError("--tensor splits the model over hosts: give --hosts FILE")
    if getattr(args, "hosts", None):
        if args.port is not None:
            limits.count("--port", args.port, 1024, 65535)
        limits.config_check(budget=args.budget, window=args.window, rerank=args.rerank)
        from ..distributed.launch import run_on_hosts

        return run_on_hosts(args)
    from ..session import ChatSession

    limits.count("--max-tokens", args.max_tokens, 1, limits.MAX_CONTEXT)
    if args.top_k is not None:
        limits.count("--top-k", args.top_k, 0, 1 << 24)
    limits.config_check(
        budget=args.budget, window=args.window, kv_memory=args.kv_memory, rerank=args.rerank
    )
    sampling_for(args, None)  # a bad flag fails before the model loads
    model, tokenizer, model_path, recommended = _load(args.model)
    sampling = sampling_for(args, recommended)
    if recommended is not None:
        print(f"sampling: the model's recommended, {_sampling_text(sampling)}", file=sys.stderr)
    a2ats, codebook = _cache_choice(args, model, model_path)
    session = ChatSession(
        model,
        tokenizer,
        system_prompt=args.system,
        sampling=sampling,
        a2ats=a2ats,
        codebook=codebook,
    )
    if args.prompt is not None:
        return _one_shot(session, args.prompt)
    return _repl(session)


# --------------------------------------------------------------------------- model loading
def load(source: str) -> tuple[Any, Any, Path | None]:
    """(model, tokenizer, model folder or None) through `a2ats_engine.models.load_model`."""
    return _load(source)[:3]


def _load(source: str) -> tuple[Any, Any, Path | None, Any]:
    """`load` plus the model's recommended SamplingSettings (None when it names none)."""
    from ..loading.models import load_model

    model, tokenizer, info = load_model(source, progress=_progress if _tty() else None)
    if _tty():
        print(file=sys.stderr)
    folder = Path(info.path) if info.path else None
    return model, tokenizer, folder, info.recommended_sampling


def _sampling_text(sampling: Any) -> str:
    """`temperature 0 (greedy), top p 1, min p 0, top k 0, repetition penalty 1`."""
    parts = []
    for field in SAMPLING_FLAGS:
        value = getattr(sampling, field)
        text = f"{field.replace('_', ' ')} {value:g}"
        parts.append(text + " (greedy)" if field == "temperature" and value == 0 else text)
    return ", ".join(parts)


def _tty() -> bool:
    return sys.stderr.isatty()


def _progress(stage: str, done: int, total: int) -> None:
    amount = f"{done}/{total}" if total else str(done)
    print(f"\r{stage}: {amount}\033[K", end="", file=sys.stderr, flush=True)


# --------------------------------------------------------------------------- cache choice
def _cache_choice(args: argparse.Namespace, model: Any, model_path: Path | None) -> tuple:
    """(A2ATSConfig, Codebook) for --cache a2ats, (None, None) for the full cache."""
    from ..loading.fetched_models import default_codebook

    if args.cache == "full" and args.codebook:
        raise ValueError("--codebook needs --cache a2ats (or no --cache)")
    path = Path(args.codebook) if args.codebook else None
    if path is None and args.cache != "full":
        path = default_codebook(args.model, model_path)
    if args.cache == "a2ats" and path is None:
        raise ValueError(
            "--cache a2ats needs a codebook: pass --codebook FILE "
            "(make one with `a2ats calibrate --model SOURCE --out FILE`)"
        )
    if path is None or args.cache == "full":
        knobs = (args.budget, args.window, args.kv_memory, args.rerank, args.preset)
        if any(k is not None for k in knobs) or args.estimate not in (None, "off"):
            print(
                "note: --budget/--window/--kv-memory/--preset/--rerank/--estimate apply to the "
                "A2ATS cache only; using the full cache",
                file=sys.stderr,
            )
        return None, None
    return _a2ats(args, model, path)


def _a2ats(args: argparse.Namespace, model: Any, path: Path) -> tuple:
    from ..cache.codebook import Codebook
    from ..cache.config import A2ATSConfig
    from ..cache.crossover_model import with_default_crossover
    from ..terminal import printable

    codebook = Codebook.load(path)
    knobs = {"budget": args.budget, "window": args.window, "kv_memory": args.kv_memory}
    knobs.update(retrieval_knobs(args))
    if codebook.metadata.get("far_offset") is not None:  # use the b it was calibrated with
        knobs["far_offset"] = int(codebook.metadata["far_offset"])
    config = A2ATSConfig(**{k: v for k, v in knobs.items() if v is not None})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # printed once below, not as Python warnings
        notes = list(codebook.validate_for(model, config) or [])
    for note in notes:
        print(f"warning: {printable(note, newlines=False)}", file=sys.stderr)
        # make_cache validates again when the session builds its caches: say it only once
        warnings.filterwarnings("ignore", message=re.escape(note))
    config, crossover = with_default_crossover(model, config, codebook)
    retrieval = describe_retrieval(
        config, codebook.num_subspaces, crossover.estimate_on, crossover.estimate_layers
    )
    print(
        f"cache: a2ats, codebook {path}; {retrieval}; exact until {config.exact_below:,} tokens "
        f"({crossover_origin(crossover)})",
        file=sys.stderr,
    )
    return config, codebook


def crossover_origin(crossover: Any) -> str:
    """Where the chat's crossover comes from, in a few words."""
    if crossover.origin == "estimate":
        return "estimated from the geometry; `a2ats crossover` measures it"
    if crossover.origin == "built-in":
        return "measured on another machine"
    return "measured on this machine"


# --------------------------------------------------------------------------- chatting
def stats_line(stats: Any) -> str:
    """`[12 prompt tokens, 30 generated, TTFT 0.21 s, 11.8 tok/s, peak 0.4 GB, stop]`."""
    return stats.line()


def _print_reply(events: Any) -> Any:
    """Stream token text to stdout; print the stats line to stderr; return the stats."""
    from ..cache.telemetry import GenerationStats, TokenEvent
    from ..terminal import for_stream

    stats = None
    for event in events:
        if isinstance(event, TokenEvent):
            print(for_stream(event.text, sys.stdout), end="", flush=True)
        elif isinstance(event, GenerationStats):
            stats = event
    print(flush=True)
    if stats is not None:
        print(stats_line(stats), file=sys.stderr, flush=True)
    return stats


def _one_shot(session: Any, prompt: str) -> int:
    _print_reply(session.send(prompt))
    return 0


def _repl(session: Any) -> int:
    print(REPL_HELP, file=sys.stderr)
    while True:
        try:
            line = input(">>> ")
        except (EOFError, KeyboardInterrupt):
            print()
            return 0
        text = line.strip()
        if text in ("/exit", "/quit"):
            return 0
        if text == "/reset":
            session.reset()
            print("(conversation cleared)", file=sys.stderr)
            continue
        if not text:
            continue
        _reply_interruptibly(session, line)


def _reply_interruptibly(session: Any, text: str) -> None:
    """Ctrl-C ends the reply (the partial answer stays in the conversation), not the REPL."""
    stop_on_sigint = threading.current_thread() is threading.main_thread()
    if stop_on_sigint:
        previous = signal.signal(signal.SIGINT, lambda *_: session.stop())
    try:
        _print_reply(session.send(text))
    finally:
        if stop_on_sigint:
            signal.signal(signal.SIGINT, previous)


__all__ = ["register", "run", "load", "stats_line"]
