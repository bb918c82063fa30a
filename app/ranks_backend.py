"""The engine seam for a model split over several machines ("Run on: hosts file"): the same
methods as `EngineBackend` (backend.py), each one request to the ranks.

The ranks run in a process group the app starts (`a2ats_engine.distributed.client.RanksClient`:
mlx.launch with the hosts file, `serve.py` on every rank, rank 0 answering JSON lines), so the
model, the tokenizer and the chat session the worker holds are all that one client. What the
app shows of the context comes from rank 0: the token ids and each token's text (the app keeps
no tokenizer of its own; the model may exist only on the hosts). What does not run across
machines says so: calibration (`a2ats calibrate --hosts`) and the crossover measurement (each
host measures its own: `a2ats crossover`) raise an error naming the command, and a chat's cache
is not kept on disk (the ranks' caches live on their hosts). A lost rank or host is one
`RanksLost` naming the cause; the ranks have ended then, and loading the model again starts
them. Only the engine thread calls these methods, except `stop`.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from a2ats_engine.cache.config import A2ATSConfig
from a2ats_engine.cache.telemetry import TokenEvent
from a2ats_engine.chat_turn import ContextFit, OverflowPolicy, ReplyMode
from a2ats_engine.distributed.client import RanksClient, RanksLost
from a2ats_engine.distributed.launch import read_hosts
from a2ats_engine.errors import A2ATSError
from a2ats_engine.progress import Progress as ProgressFn
from a2ats_engine.records import SamplingSettings

from .backend import EngineBackend, Event, Turns
from .events import CalibrationRequest

__all__ = ["NotAcrossHosts", "RanksBackend", "RanksLost", "check_hosts_file"]

CLOSE_SECONDS = 5.0  # how long closing waits for the ranks to exit before ending them


class NotAcrossHosts(A2ATSError):
    """An operation the app runs on this computer only (its message names the command that
    does it across hosts)."""


def check_hosts_file(path: str | Path) -> int:
    """The number of hosts in an mlx.launch hosts file; ValueError naming the file and what is
    wrong with it (nothing is started)."""
    return len(read_hosts(Path(path)))


class RanksTexts:
    """Each context token's text, from what rank 0 sent: the last context (or the prompt of
    the running reply) and the tokens of the reply streaming since."""

    def __init__(self, backend: RanksBackend) -> None:
        self._backend = backend

    def texts(self, ids: list[int]) -> list[str]:
        known = self._backend.known_context
        ids = list(ids)
        if known is None or list(known.ids) != ids[: len(known.ids)]:
            base: list[str] = []
        else:
            base = list(known.texts)
        streamed = self._backend.streamed_texts
        tail = [streamed.get(i, "") for i in range(len(base), len(ids))]
        return base + tail


class RanksBackend(EngineBackend):
    """The ranks of the hosts in `hosts` (an mlx.launch hosts file). One client at a time:
    `load_model` ends the ranks of the model loaded before (they hold the hosts' ports)."""

    def __init__(self, hosts: str | Path, *, port: int | None = None, peer_timeout: float = 120.0):
        super().__init__()
        self.hosts = str(hosts)
        self.host_count = check_hosts_file(hosts)  # ValueError before anything starts
        self.port = port
        self.peer_timeout = peer_timeout
        self.client: RanksClient | None = None
        self.known_context = None  # wire.RanksContext: the last context rank 0 sent
        self.streamed_texts: dict[int, str] = {}  # context position -> text, this reply's
        self._lock = threading.Lock()

    # ----- the model ----------------------------------------------------------------------

    def load_model(self, source: str, progress: ProgressFn | None = None):
        """Start the ranks on the hosts with `source` (each host resolves it on its own disk);
        -> (client, client, ModelInfo). RanksLost naming the host or rank when they do not
        start."""
        self.close()

        def said(line: str) -> None:
            if progress is not None:
                progress(f"on {self.host_count} hosts: {line}", 0, 0)

        if progress is not None:
            progress(f"starting the ranks on {self.host_count} hosts", 0, 0)
        client = RanksClient(
            self.hosts, source, port=self.port, peer_timeout=self.peer_timeout, progress=said
        )
        with self._lock:
            self.client = client
        self.known_context, self.streamed_texts = None, {}
        return client, client, client.info

    def placement(self, model) -> tuple[str, ...]:
        """Which layers each rank serves ("rank 0 of 2: layers 15-29 of 30", ...)."""
        return tuple(model.ranks)

    def close(self) -> None:
        """End the ranks (the app closes, or another model is loaded)."""
        with self._lock:
            client, self.client = self.client, None
        if client is not None:
            client.close(timeout=CLOSE_SECONDS)

    # ----- codebooks and calibration ------------------------------------------------------

    def load_codebook(self, path: str, model) -> tuple[Any, list[str]]:
        """Each rank loads its layers' rows of the file at `path` (the same path on every
        host); ValueError with the ranks' message when it does not fit."""
        codebook = model.load_codebook(path)
        return codebook, list(codebook.warnings)

    def codebook_sha256(self, codebook, path: str) -> str:
        return codebook.sha256 or ""

    def calibrate(self, model, tokenizer, request: CalibrationRequest, progress, cancel, name):
        raise NotAcrossHosts(
            "Calibrating runs on this computer only; across the hosts, run "
            f"`a2ats calibrate --hosts {self.hosts} --model SOURCE --out FILE`, then load "
            "the codebook"
        )

    def crossover_measured_here(self, model, config=None, codebook=None) -> bool:
        return True  # each rank applies the crossover measured on its own host

    def measure_crossover(self, model, name: str, codebook, progress, cancel, config=None) -> dict:
        raise NotAcrossHosts(
            "The crossover is measured on each machine: run `a2ats crossover SOURCE` on every "
            "host; each rank then uses its host's"
        )

    def with_crossover(self, model, config: A2ATSConfig, codebook=None) -> A2ATSConfig:
        """`config` with the crossover rank 0's host applies when it sets none."""
        return model.crossover(config) if config.exact_below is None else config

    # ----- the chat -----------------------------------------------------------------------

    def make_session(self, model, tokenizer):
        return model  # the ranks hold the one session

    def configure_session(
        self,
        session,
        *,
        system_prompt: str,
        sampling: SamplingSettings,
        a2ats: A2ATSConfig | None,
        codebook,
        turns: Turns,
    ) -> None:
        if codebook is None and session.codebook is not None:
            session.clear_codebook()  # unloaded in the app: A2ATS runs with a random one
        session.configure(system_prompt=system_prompt, sampling=sampling, a2ats=a2ats, turns=turns)

    def fit(
        self, session, mode: ReplyMode, text: str, *, context_length: int | None,
        policy: OverflowPolicy,
    ) -> ContextFit:  # fmt: skip
        return session.fit(str(mode), text, context_length=context_length, policy=str(policy))

    def session_turns(self, session) -> Turns:
        known = self.known_context
        return [tuple(t) for t in known.turns] if known is not None else []

    def reply(
        self, session, mode: ReplyMode, text: str, progress: ProgressFn | None = None
    ) -> Iterator[Event]:
        if mode not in list(ReplyMode):
            raise ValueError(f"GenerationRequest.mode={mode!r} must be one of {list(ReplyMode)}")
        self.streamed_texts = {}
        return self._reply(session, str(mode), text, progress)

    def _reply(self, session, mode: str, text: str, progress) -> Iterator[Event]:
        for event in session.reply(mode, text, progress):
            if isinstance(event, TokenEvent):
                if session.prompt is not None and self.known_context is not session.prompt:
                    self.known_context = session.prompt  # the context this reply continues
                start = len(session.prompt.ids) if session.prompt is not None else 0
                self.streamed_texts[start + event.index] = event.text
            yield event

    def stop(self, session) -> None:
        session.stop()

    # ---- a chat's cache on disk: not across hosts ----------------------------------------

    def save_chat_cache(self, session, chat_id: str) -> str | None:
        return None  # the ranks' caches live on their hosts

    def restore_chat_cache(self, session, chat_id: str) -> str | None:
        return None

    def context_token_ids(self, session, *, streaming: bool) -> list[int]:
        if streaming:  # rank 0 sent the reply's prompt with its first token
            known = session.prompt
        else:
            known = session.context(streaming=False)
        self.known_context = known
        return list(known.ids) if known is not None else []

    def text_cache(self, tokenizer) -> RanksTexts:
        return RanksTexts(self)

    def decode(self, tokenizer, ids: list[int]) -> str:
        return tokenizer.decode(ids)
