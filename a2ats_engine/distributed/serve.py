"""The ranks serving one program that drives them (the app): `python -m
a2ats_engine.distributed.serve --model SOURCE` under mlx.launch (`client.py` starts it).

Rank 0 reads requests, one JSON object a line, from its stdin and answers on its stdout, each
line `@a2ats ` + one ASCII JSON object (other output is not part of the protocol). Every request
is shared with every rank and run by all of them on the same `ChatSession` (`chat.py`'s model
split: each rank serves its layers): `codebook`, `clear_codebook`, `crossover`, `configure`,
`fit`, `reply`, `context`, `decode`, `exit`. Between requests the ranks check for one on a
timer (`_next_request`): a rank waiting inside a collective would spin a core. A `stop` line
during a reply ends it on every rank at the same token: after each token the ranks exchange
rank 0's stop flag (one `all_sum` of one integer), or, when the caches record telemetry, each
rank's snapshot of its own layers (gathered to every rank, so rank 0 answers with one snapshot
of every rank's layers; `wire.join_snapshots`).

Answers: `{"ev": "ready", "info", "ranks"}` once loaded; per request `{"ev": "ok", ...}` or
`{"ev": "error", "message"}`; during a reply `prefill`, `prompt` (with the first token: the
context it continues, ids and each token's text), `token`, `snapshot`, then `stats` (its last
line). A rank lost mid-way ends rank 0 with `error (rank 0): lost a rank ...` on
stderr (`chat.run_ranks`) and mlx.launch ends the others: the client reports it.
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import sys
import threading
import time
import warnings
from pathlib import Path
from typing import Any

from . import wire
from .chat import LOST, Watchdog, _settle, _split, rank_main, run_ranks

PREFIX = "@a2ats "
# seconds between the idle ranks' checks for a request: right after one (the next of a turn
# follows at once), then while the user reads or types
BUSY_POLL, IDLE_POLL, BUSY_FOR = 0.005, 0.1, 2.0


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default="demo", metavar="SOURCE", help="model source (default demo)")
    p.add_argument("--split", metavar="N,N,...", help="layers per rank, rank 0 first")
    p.add_argument(
        "--peer-timeout",
        type=float,
        default=120.0,
        help="seconds without progress after which rank 0 reports the other ranks as lost",
    )


class Answers:
    """Rank 0's protocol lines on stdout (other ranks write none)."""

    def __init__(self, rank0: bool) -> None:
        self.rank0 = rank0
        self.lock = threading.Lock()

    def send(self, event: str, **fields: Any) -> None:
        if not self.rank0:
            return
        line = PREFIX + json.dumps({"ev": event, **fields}, ensure_ascii=True)
        with self.lock:
            sys.stdout.write(line + "\n")
            sys.stdout.flush()


class Requests:
    """Rank 0's requests: a thread reads stdin into a queue, so a `stop` is seen mid-reply."""

    def __init__(self) -> None:
        self.lines: queue.Queue = queue.Queue()
        self.stop_seen = threading.Event()
        threading.Thread(target=self._read, name="requests", daemon=True).start()

    def _read(self) -> None:
        for raw in sys.stdin:
            try:
                request = json.loads(raw)
            except json.JSONDecodeError:
                continue
            if not isinstance(request, dict):
                continue
            if request.get("op") == "stop":
                self.stop_seen.set()
            else:
                self.lines.put(request)
        self.lines.put({"op": "exit"})  # the driver went away

    def next(self) -> dict:
        return self.lines.get()

    def poll(self) -> dict | None:
        """The next request if one came, else None (no wait)."""
        try:
            return self.lines.get_nowait()
        except queue.Empty:
            return None


def _next_request(requests: Requests | None, group: Any, dog: Watchdog) -> Any:
    """The driver's next request, on every rank. The ranks do not wait for it inside a
    collective: MLX's ring spins a core while a collective waits for its peer, so idle ranks
    would burn one core each while the user reads. All ranks ask whether rank 0 has a request
    (one `all_sum` of one integer) and sleep in between: `BUSY_POLL` seconds for `BUSY_FOR`
    seconds after a request, then `IDLE_POLL`."""
    import mlx.core as mx

    from .group import share_json

    if group.size() == 1:
        dog.arm(False)  # the driver may take its time
        request = requests.next() if requests is not None else None
        dog.arm(True)
        return request
    since = time.monotonic()
    while True:
        dog.beat()  # peers answer every round: a hung one trips the watchdog
        request = requests.poll() if requests is not None else None
        flag = mx.distributed.all_sum(
            mx.array(int(request is not None)), group=group, stream=mx.cpu
        )
        if flag.item():
            return share_json(request, group)
        time.sleep(BUSY_POLL if time.monotonic() - since < BUSY_FOR else IDLE_POLL)


def run(args: argparse.Namespace) -> int:
    return run_ranks(args.peer_timeout, lambda group, dog: _serve(args, group, dog))


def _serve(args: argparse.Namespace, group: Any, dog: Watchdog) -> int:
    from ..session import ChatSession, resolve_cache_factory
    from .group import gather_json
    from .load import load_stage
    from .pipeline import pipeline_factory

    rank0 = group.rank() == 0
    answers = Answers(rank0)
    requests = Requests() if rank0 else None
    model, tokenizer, info, stage = load_stage(args.model, group, split=_split(args.split))
    dog.arm(True)
    described = gather_json(stage.describe(), group)
    plain = pipeline_factory(resolve_cache_factory(), stage)  # mlx-lm's caches, this rank's
    session = ChatSession(model, tokenizer, cache_factory=plain)
    session.prefill_progress = lambda *_: dog.beat()
    state = _State(model, info, stage, session, rank0)
    answers.send("ready", info=info.to_dict(), ranks=described)
    while True:
        request = _next_request(requests, group, dog)
        op = request.get("op") if isinstance(request, dict) else None
        if op == "exit":
            _settle(session)
            return 0
        try:
            if op == "reply":
                _reply(state, request, group, dog, answers, requests)
            else:
                answers.send("ok", **_agreed(state, op, request))
        except (ValueError, RuntimeError, OSError) as exc:
            if any(marker in str(exc) for marker in LOST):
                raise  # a lost rank: run_ranks reports it
            answers.send("error", message=str(exc).strip().splitlines()[0] if str(exc) else "")
        except Exception as exc:  # an engine error (CodebookError...): reported, not fatal
            from ..errors import A2ATSError

            if not isinstance(exc, A2ATSError):
                raise
            answers.send("error", message=str(exc))


def _agreed(state: _State, op: str | None, request: dict) -> dict:
    """`_run_op` on every rank, then the ranks agree on its outcome: a request can fail on one
    rank alone (its host lacks the codebook file, say), and a rank that went on while another
    did not would meet it in the wrong exchange. The first failing rank's message is raised on
    every rank; `nbytes` in the answer is summed over the ranks (each counts its own)."""
    from ..errors import A2ATSError
    from .group import gather_json

    try:
        fields, failed = _run_op(state, op, request), None
    except (ValueError, RuntimeError, OSError, A2ATSError) as exc:
        if any(marker in str(exc) for marker in LOST):
            raise
        fields, failed = {}, (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    if state.stage.size == 1:
        if failed is not None:
            raise ValueError(failed)
        return fields
    parts = gather_json({"error": failed, "nbytes": fields.get("nbytes")}, state.stage.group)
    for rank, part in enumerate(parts):
        if part["error"] is not None:
            raise ValueError(part["error"] if rank == 0 else f"rank {rank}: {part['error']}")
    if fields.get("nbytes") is not None:
        fields["nbytes"] = sum(int(p["nbytes"]) for p in parts)
    return fields


class _State:
    def __init__(self, model: Any, info: Any, stage: Any, session: Any, rank0: bool) -> None:
        from ..token_texts import TokenTextCache

        self.model, self.info, self.stage, self.session = model, info, stage, session
        self.book = None
        self.book_path: str | None = None
        self.rank0 = rank0
        tokenizer = session.tokenizer
        # rank 0 answers with each context token's text (the app keeps no tokenizer)
        self.texts = TokenTextCache(lambda ids: tokenizer.decode(ids, skip_special_tokens=False))

    def context(self, ids: list[int]) -> dict:
        """The answer fields for a context: ids, each token's text (rank 0 only: the others
        answer nothing) and the conversation's turns."""
        session = self.session
        ids = [int(t) for t in ids]
        turns = [[m["role"], m["content"]] for m in session.messages if m["role"] != "system"]
        texts = self.texts.texts(ids) if self.rank0 else []
        return {"ids": ids, "texts": texts, "turns": turns}


def _run_op(state: _State, op: str | None, request: dict) -> dict:
    """Every rank runs the request; rank 0's answer fields."""
    session = state.session
    if op == "codebook":
        return _load_codebook(state, request.get("path"))
    if op == "clear_codebook":
        state.book, state.book_path = None, None
        return {}
    if op == "configure":
        config = wire.config_from(request.get("a2ats"))
        turns = request.get("turns") or []
        if not isinstance(turns, list):
            raise ValueError("configure: turns must be a list")
        _configure(
            state,
            system=request.get("system") or None,
            sampling=wire.sampling_from(request.get("sampling") or {}),
            config=config,
            messages=[{"role": str(r), "content": str(c)} for r, c in turns],
        )
        return {}
    if op == "fit":
        limit = request.get("context_length")
        fit = session.fit(
            str(request.get("mode")),
            str(request.get("text", "")),
            context_length=None if limit is None else int(limit),
            policy=str(request.get("policy")),
        )
        return {"fit": wire.fit_json(fit)}
    if op == "context":
        streaming = bool(request.get("streaming"))
        return state.context(session.prompt_token_ids() if streaming else session.cached_token_ids)
    if op == "crossover":
        from ..cache.crossover_model import with_default_crossover

        config = wire.config_from(request.get("a2ats"))
        if config is None:
            raise ValueError("crossover: give an A2ATS config")
        config, row = with_default_crossover(state.model, config, state.book)
        return {"a2ats": config.to_dict(), "origin": str(getattr(row, "origin", ""))}
    if op == "decode":
        ids = request.get("ids")
        if not isinstance(ids, list) or not all(isinstance(i, int) for i in ids):
            raise ValueError("decode: ids must be a list of integers")
        return {"text": session.tokenizer.decode(ids, skip_special_tokens=False)}
    raise ValueError(f"unknown request {op!r}")


def _configure(state: _State, *, system, sampling, config, messages: list[dict]) -> None:
    """`ChatSession.configure` with this rank's cache factory (`pipeline_factory`: RemoteCache
    slots for the layers other ranks serve): the cache is rebuilt only when the A2ATS config
    or the codebook changed, the conversation replaced only when it differs."""
    from ..session import resolve_cache_factory
    from .pipeline import pipeline_factory

    session = state.session
    book = state.book if config is not None else None
    held = session.cache_factory
    if getattr(held, "a2ats_config", None) != config or getattr(held, "codebook", None) is not book:
        if config is None:
            factory = resolve_cache_factory()
        else:
            factory = resolve_cache_factory(a2ats=config, codebook=book)
        session.set_cache_factory(pipeline_factory(factory, state.stage))
    session.set_sampling(sampling)
    session.set_system_prompt(system)
    if messages != [m for m in session.messages if m["role"] != "system"]:
        session.load_messages(messages)


def _load_codebook(state: _State, path: Any) -> dict:
    """Each rank loads its layers' rows (no exchange here: `_agreed` sums `nbytes` once every
    rank has loaded)."""
    from .codebook import load_rank_codebook

    if not isinstance(path, str) or not path:
        raise ValueError("codebook: give the file's path")
    book = load_rank_codebook(Path(path), state.stage.owns)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        notes = list(book.validate_for(state.model) or [])
    notes += [str(w.message) for w in caught]
    state.book, state.book_path = book, path
    return {
        "n_centroids": int(book.n_centroids),
        "sub_dim": int(book.sub_dim),
        "num_layers": int(book.num_layers),
        "nbytes": int(book.nbytes),  # this rank's rows (RankCodebook counts its own layers)
        "metadata": dict(book.metadata or {}),
        "warnings": notes,
        "sha256": book.sha256 or "",
    }


def _reply(
    state: _State,
    request: dict,
    group: Any,
    dog: Watchdog,
    answers: Answers,
    requests: Requests | None,
) -> None:
    """Every rank runs the reply; after each token the ranks agree on a stop (and gather
    telemetry when the caches record it); rank 0 streams the events."""
    import mlx.core as mx
    from mlx_lm.generate import generation_stream

    from ..cache.model_cache import snapshot
    from ..cache.telemetry import GenerationStats, TokenEvent
    from .group import gather_json, shared_seed

    session = state.session
    if requests is not None:
        requests.stop_seen.clear()
    if state.stage.size > 1 and session.sampling.seed is None:
        # no seed asked (the app's default): a fresh one per reply, the same on every rank;
        # ranks that sampled with their own seeds would feed different tokens to their layers
        mx.random.seed(shared_seed(None, group))

    def progress(_stage: str, done: int, total: int) -> None:
        dog.beat()
        answers.send("prefill", done=int(done), total=int(total))

    session.prefill_progress = progress
    telemetry = bool(getattr(getattr(session.cache_factory, "a2ats_config", None), "telemetry", 0))
    stats, first, tokens = None, True, []
    for event in session.reply(str(request.get("mode")), str(request.get("text", ""))):
        dog.beat()
        if isinstance(event, TokenEvent):
            tokens.append(int(event.token_id))
            if first and state.rank0:  # the context the reply continues, for the app's view
                answers.send("prompt", **state.context(session.prompt_token_ids()))
            first = False
            answers.send("token", text=event.text, token_id=event.token_id, index=event.index)
            stop = bool(requests is not None and requests.stop_seen.is_set())
            if state.stage.size > 1:
                # mlx-lm has the next step (its sends and receives) queued on its own stream:
                # let it finish, so this exchange is not interleaved with it on the ring
                mx.synchronize(generation_stream)
            if telemetry:
                own = snapshot(session.caches or [], event.token_id)
                parts = gather_json(
                    {"stop": stop, "snap": None if own is None else wire.snapshot_json(own)},
                    group,
                )
                stop = any(p["stop"] for p in parts)
                joined = wire.join_snapshots([p["snap"] for p in parts])
                if joined is not None:
                    answers.send("snapshot", snapshot=joined)
            elif state.stage.size > 1:
                flag = mx.distributed.all_sum(mx.array(int(stop)), group=group, stream=mx.cpu)
                stop = bool(flag.item())
            if stop:
                session.stop()
        elif isinstance(event, GenerationStats):
            stats = event
    _settle(session)
    if stats is not None:
        answers.send("stats", stats=wire.stats_json(_whole(stats, state, group, tokens)))


def _whole(stats: Any, state: _State, group: Any, tokens: list[int]) -> Any:
    """The reply's stats with the bytes of every rank's caches and codebook rows. ValueError
    on every rank when a rank's tokens differ from rank 0's (they would serve different
    conversations from then on: never silent)."""
    from dataclasses import replace

    from .group import gather_json

    if state.stage.size == 1:
        return stats
    own = [stats.cache_bytes, stats.cache_disk_bytes, stats.codebook_bytes, tokens]
    parts = gather_json(own, group)
    for rank, part in enumerate(parts[1:], start=1):
        if part[3] != parts[0][3]:
            at = next(
                (i for i, (a, b) in enumerate(zip(part[3], parts[0][3], strict=False)) if a != b),
                None,
            )
            at = min(len(part[3]), len(parts[0][3])) if at is None else at
            raise ValueError(
                f"the ranks sampled different tokens (rank {rank} from token {at} on); load "
                "the model again"
            )
    cache, disk, book = (sum(p[i] for p in parts) for i in range(3))
    return replace(stats, cache_bytes=cache, cache_disk_bytes=disk, codebook_bytes=book)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m a2ats_engine.distributed.serve",
        description="Serve a model split over the ranks of mlx.launch to the program driving "
        "rank 0 (the app), one JSON request a line on stdin.",
    )
    add_arguments(parser)
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    return rank_main(parser, argv, run)


if __name__ == "__main__":
    sys.exit(main())

__all__ = ["main", "run", "PREFIX"]
