"""Chat with a model split over the ranks of `mlx.launch` (`python -m a2ats_engine.distributed`).

Every rank runs the same `ChatSession` on its own layers (`load.py`, `pipeline.py`); rank 0
reads the prompts and shares them (`group.py`), prints the reply and the stats, and reports a
rank that died or stopped answering as an error (exit 1) within `--peer-timeout` seconds.
Sampling uses one seed shared by every rank, so all ranks pick the same token.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..cache.config import ESTIMATE_SCORES, PRESETS
from ..cache.model_cache import cache_nbytes
from ..validation import parse_budget

REPL_HELP = "commands: /reset clears the conversation, /exit (or Ctrl-D) quits"
LOST = ("connection to a peer was lost", "[ring]", "[mpi]", "closed by the peer")


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The options `a2ats chat` forwards (same names), plus the split's own."""
    p.add_argument("--model", default="demo", metavar="SOURCE", help="model source (default demo)")
    p.add_argument("--system", metavar="TEXT", help="system prompt")
    p.add_argument("--prompt", metavar="TEXT", help="one-shot: answer TEXT and exit")
    p.add_argument("--temp", type=float, default=0.7, help="temperature; 0 = greedy")
    p.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling mass")
    p.add_argument("--min-p", type=float, default=0.0, help="min-p filter")
    p.add_argument("--top-k", type=int, default=0, help="top-k filter")
    p.add_argument("--repetition-penalty", type=float, default=1.0, help="> 1 discourages repeats")
    p.add_argument("--max-tokens", type=int, default=512, help="reply length limit")
    p.add_argument("--seed", type=int, help="random seed (default: one drawn by rank 0)")
    p.add_argument("--cache", choices=("a2ats", "full"), help="KV cache (as `a2ats chat`)")
    p.add_argument("--codebook", metavar="FILE", help="A2ATS codebook file (on every host)")
    p.add_argument(
        "--budget", type=parse_budget, help="A2ATS budget: fraction (e.g. 0.03) or token count"
    )
    p.add_argument("--window", type=int, help="A2ATS exact-RoPE window in tokens")
    p.add_argument("--preset", choices=tuple(PRESETS), help="A2ATS preset (as `a2ats chat`)")
    p.add_argument("--rerank", type=int, help="A2ATS rerank factor (default 2)")
    p.add_argument(
        "--estimate",
        choices=("off", *ESTIMATE_SCORES),
        help="A2ATS missed-attention estimate, off (the default across machines: each rank's "
        "own measurement does not cover a split model) or its slot scores (as `a2ats chat`)",
    )
    p.add_argument(
        "--exact-below",
        type=int,
        help="A2ATS attends exactly below this context (default: the measured crossover; "
        "0 = retrieve whenever something can be dropped)",
    )
    p.add_argument(
        "--split",
        metavar="N,N,...",
        help="layers per rank, rank 0 (the last layers) first; default even",
    )
    p.add_argument(
        "--tensor",
        action="store_true",
        help="split by KV heads (mlx-lm's shard(): every rank serves every layer, its share "
        "of the heads) instead of by layers",
    )
    p.add_argument(
        "--peer-timeout",
        type=float,
        default=120.0,
        help="seconds without progress after which rank 0 reports the other ranks as lost "
        "(default 120)",
    )
    p.add_argument(
        "--stats-json",
        metavar="PREFIX",
        help="each rank writes PREFIX.rank<r>.json: its layers, tokens, bytes and traffic",
    )


def _split(text: str | None) -> list[int] | None:
    if not text:
        return None
    try:
        return [int(x) for x in text.split(",")]
    except ValueError:
        raise ValueError(f"--split={text!r}: give layer counts like 15,15") from None


class Watchdog:
    """Ends this rank (one line on stderr, then SIGKILL) when no `beat()` came for `timeout`
    seconds while armed: a rank that hangs or was stopped blocks every collective.

    It is a forked process reading a shared heartbeat, not a thread: MLX's `eval` keeps the GIL
    while it waits for a `recv`, so no thread of this process could run then."""

    def __init__(self, timeout: float, rank: int) -> None:
        import mmap
        import struct

        self.timeout, self.rank = timeout, rank
        self._pack = struct.Struct("ddd")  # last beat (monotonic seconds), armed (0 / 1), rank
        self._shared = mmap.mmap(-1, self._pack.size)
        self.beat()
        parent = os.getpid()
        if os.fork() == 0:  # the watcher: plain Python, no MLX, no sockets
            try:
                os.closerange(3, 1024)
                self._watch(parent)
            finally:
                os._exit(0)

    def _write(self, armed: bool) -> None:
        self._shared[:] = self._pack.pack(time.monotonic(), 1.0 if armed else 0.0, self.rank)

    def beat(self) -> None:
        self._write(getattr(self, "armed", False))

    def arm(self, on: bool) -> None:
        self.armed = on
        self._write(on)

    def _watch(self, parent: int) -> None:
        while os.getppid() == parent:
            time.sleep(min(1.0, self.timeout / 4))
            last, armed, rank = self._pack.unpack(self._shared[:])
            if armed and time.monotonic() - last > self.timeout:
                print(
                    f"error (rank {rank:.0f}): no progress from the other ranks for "
                    f"{self.timeout:.0f} s (a rank hung, was stopped or lost its network)",
                    file=sys.stderr,
                    flush=True,
                )
                os.kill(parent, signal.SIGKILL)
                return


def _fail(rank: int, message: str) -> None:
    print(f"error (rank {rank}): {message}", file=sys.stderr, flush=True)
    os._exit(1)


def run_ranks(peer_timeout: float, body: Callable[[Any, Watchdog], int]) -> int:
    """Collective: start this rank's watchdog, join the group, return `body(group, dog)`; a
    peer lost mid-way ends this rank with one `error (rank r): lost a rank ...` line."""
    import mlx.core as mx  # a2ats_engine (imported first by -m) preloaded BLAS

    rank = int(os.environ.get("MLX_RANK", "0") or 0)  # the launcher's; init() agrees
    dog = Watchdog(peer_timeout, rank)  # forked before MLX opens the ring's sockets
    group = mx.distributed.init()
    dog.rank = group.rank()
    try:
        return body(group, dog)
    except RuntimeError as exc:
        text = str(exc)
        if any(marker in text for marker in LOST):
            _fail(rank, f"lost a rank ({text.strip().splitlines()[0]})")
        raise


def rank_main(
    parser: argparse.ArgumentParser,
    argv: list[str] | None,
    run: Callable[[argparse.Namespace], int],
) -> int:
    """A rank's entry point: `run(parsed argv)`; a bad argument, file or model is one
    `error: ...` line and exit status 1."""
    args = parser.parse_args(argv)
    try:
        return run(args)
    except (ValueError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except Exception as exc:
        from ..errors import A2ATSError

        if isinstance(exc, A2ATSError):
            print(f"error: {exc}", file=sys.stderr)
            return 1
        raise


def run(args: argparse.Namespace) -> int:
    """Collective: every rank runs it with the same arguments."""
    return run_ranks(args.peer_timeout, lambda group, dog: _run(args, group, dog))


def _run(args: argparse.Namespace, group: Any, dog: Watchdog) -> int:
    from ..session import ChatSession, SamplingSettings, resolve_cache_factory
    from .group import gather_json, share_json, shared_seed
    from .load import load_stage
    from .pipeline import pipeline_factory

    rank0 = group.rank() == 0
    # not watched while loading (a rank reads its weights at its own pace; a rank that dies
    # there ends the others through mlx.launch or a ring error); watched from then on, except
    # while waiting for the user's next line
    model, tokenizer, info, stage = load_stage(
        args.model, group, split=_split(args.split), tensor=bool(getattr(args, "tensor", False))
    )
    dog.arm(True)
    described = gather_json(stage.describe(), group)
    if rank0:
        for line in described:
            print(f"distributed: {line}", file=sys.stderr)
    config, book = _cache_choice(args, model, info, stage, rank0)
    sampling = SamplingSettings(
        temperature=args.temp,
        top_p=args.top_p,
        min_p=args.min_p,
        top_k=args.top_k,
        repetition_penalty=args.repetition_penalty,
        seed=shared_seed(args.seed, group),
        max_tokens=args.max_tokens,
    )
    factory = resolve_cache_factory(a2ats=config, codebook=book)
    session = ChatSession(
        model,
        tokenizer,
        system_prompt=args.system,
        sampling=sampling,
        cache_factory=pipeline_factory(factory, stage),
    )
    session.prefill_progress = lambda *_: dog.beat()  # a long prompt is progress too
    recorder = _Recorder(args.stats_json, model, stage, session)
    if args.prompt is not None:
        _reply(session, args.prompt, rank0, dog, recorder)
        recorder.write()
        return 0
    if rank0:
        print(REPL_HELP, file=sys.stderr)
    while True:
        dog.arm(False)  # the user may take their time
        line = _read_line() if rank0 else None
        dog.arm(rank0)  # rank 0 has its line: the others must take it now; they wait for it
        line = share_json(line, group)
        dog.arm(True)
        if line is None or line.strip() in ("/exit", "/quit"):
            recorder.write()
            return 0
        if line.strip() == "/reset":
            session.reset()
            if rank0:
                print("(conversation cleared)", file=sys.stderr)
            continue
        if line.strip():
            _reply(session, line, rank0, dog, recorder)


def _read_line() -> str | None:
    try:
        return input(">>> ")
    except (EOFError, KeyboardInterrupt):
        print()
        return None


def _reply(session: Any, text: str, rank0: bool, dog: Watchdog, recorder: _Recorder) -> None:
    from ..cache.telemetry import GenerationStats, TokenEvent

    dog.beat()
    stats = None
    tokens: list[int] = []
    for event in session.send(text):
        dog.beat()
        if isinstance(event, TokenEvent):
            tokens.append(event.token_id)
            recorder.on_token()
            if rank0:
                print(event.text, end="", flush=True)
        elif isinstance(event, GenerationStats):
            stats = event
    _settle(session)
    dog.beat()
    recorder.on_reply(tokens, stats)
    if rank0:
        print(flush=True)
        if stats is not None:
            print(stats.line(), file=sys.stderr, flush=True)


def _settle(session: Any) -> None:
    """Wait for the step mlx-lm evaluates ahead (it includes collectives) and for every rank:
    a rank must not leave (or start the next turn) while another still runs that step. That
    step is on mlx-lm's own stream (a reply that ended on an end-of-sequence token has the next
    step queued there): waiting only for the default stream let the all_sum below meet a
    peer's pipeline send, and the ranks' next exchange read garbage."""
    import mlx.core as mx
    from mlx_lm.generate import generation_stream

    mx.synchronize(generation_stream)
    mx.synchronize()
    stage = getattr(session.model, "_a2ats_stage", None)
    if stage is not None and stage.size > 1:
        mx.eval(mx.distributed.all_sum(mx.array(1), group=stage.group, stream=mx.cpu))


def _cache_choice(args, model, info, stage, rank0: bool) -> tuple:
    """(A2ATSConfig, RankCodebook) as `a2ats chat` chooses them, or (None, None) for full."""
    from ..cache.config import A2ATSConfig, describe_retrieval, retrieval_fields
    from ..loading.fetched_models import default_codebook
    from .codebook import load_rank_codebook

    if args.cache == "full" and args.codebook:
        raise ValueError("--codebook needs --cache a2ats (or no --cache)")
    model_path = Path(info.path) if info.path else None
    path = Path(args.codebook) if args.codebook else None
    if path is None and args.cache != "full":
        path = default_codebook(args.model, model_path)
    if args.cache == "a2ats" and path is None:
        raise ValueError("--cache a2ats needs a codebook: pass --codebook FILE")
    if path is None or args.cache == "full":
        return None, None
    book = load_rank_codebook(path, stage.owns, getattr(stage, "heads", None))
    knobs = {"budget": args.budget, "window": args.window, "exact_below": args.exact_below}
    knobs.update(retrieval_fields(args.preset, args.rerank, args.estimate))
    if knobs["estimate_missed"] is None:  # measured per machine and whole model: not for ranks
        knobs["estimate_missed"] = False
    if book.metadata.get("far_offset") is not None:
        knobs["far_offset"] = int(book.metadata["far_offset"])
    config = A2ATSConfig(**{k: v for k, v in knobs.items() if v is not None})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        notes = list(book.validate_for(model, config) or [])
    if rank0:
        for note in notes:
            print(f"warning: {note}", file=sys.stderr)
        share = "heads'" if getattr(stage, "kind", "") == "tensor" else "layers'"
        retrieval = describe_retrieval(config, book.num_subspaces)
        print(
            f"cache: a2ats, codebook {path} (each rank holds its {share} rows); {retrieval}",
            file=sys.stderr,
        )
    warnings.filterwarnings("ignore", module="a2ats_engine")
    return config, book


class _Recorder:
    """Per-rank figures for `--stats-json`: tokens, bytes held, traffic per decode step."""

    def __init__(self, prefix: str | None, model: Any, stage: Any, session: Any) -> None:
        self.prefix, self.model, self.stage, self.session = prefix, model, stage, session
        self.replies: list[dict] = []
        self._first: tuple[int, int] | None = None
        self._last: tuple[int, int] | None = None
        self._count = 0

    def on_token(self) -> None:
        now = (self.stage.sent_bytes, self.stage.received_bytes)
        if self._count == 0:
            self._first = now
        self._last = now
        self._count += 1

    def on_reply(self, tokens: list[int], stats: Any) -> None:
        from ..cache.model_cache import model_codebook_bytes

        caches = self.session.caches or []
        steps = max(self._count - 1, 1)
        first, last = self._first or (0, 0), self._last or (0, 0)
        if getattr(self.stage, "kind", "") == "tensor":  # ring all_sums, from the shapes
            step = self.stage.step_bytes(1, _hidden_dtype_bytes(self.model))
            first, last = (0, 0), (step * steps, step * steps)
        self.replies.append(
            {
                "tokens": tokens,
                "generation_tps": getattr(stats, "generation_tps", None),
                "prompt_tokens": getattr(stats, "prompt_tokens", None),
                "cache_bytes": int(sum(cache_nbytes(c) for c in caches)),
                "codebook_bytes": model_codebook_bytes(caches),
                "peak_memory_bytes": int(_peak()),
                "sent_bytes_per_decode_step": (last[0] - first[0]) / steps,
                "received_bytes_per_decode_step": (last[1] - first[1]) / steps,
                "sent_bytes_total": self.stage.sent_bytes,
            }
        )
        self._count = 0

    def write(self) -> None:
        if not self.prefix:
            return
        from .load import weight_bytes

        record = {
            "rank": self.stage.rank,
            "ranks": self.stage.size,
            "layers": [self.stage.start, self.stage.end],
            "weight_bytes": weight_bytes(self.model),
            "replies": self.replies,
        }
        Path(f"{self.prefix}.rank{self.stage.rank}.json").write_text(json.dumps(record, indent=1))


def _hidden_dtype_bytes(model: Any) -> int:
    """Bytes per element of the hidden state (the embeddings' dtype after loading)."""
    from mlx.utils import tree_flatten

    for name, value in tree_flatten(model.parameters()):
        if "embed" in name and name.endswith("weight") and value.dtype.size > 1:
            return int(value.dtype.size)
    return 4


def _peak() -> int:
    import mlx.core as mx

    return mx.get_peak_memory()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m a2ats_engine.distributed",
        description="Chat with a model split over the ranks of mlx.launch (pipeline, or by "
        "heads with --tensor).",
    )
    add_arguments(parser)
    return rank_main(parser, argv, run)


__all__ = ["main", "run", "run_ranks", "rank_main", "add_arguments", "Watchdog"]
