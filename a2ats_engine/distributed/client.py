"""Drive a model split over several machines from one program (the app): start the ranks with
mlx.launch (`serve.py` on each, rank 0 answering on its stdout) and talk to rank 0.

Why a child process and not the app itself as rank 0: MLX's group cannot be closed or formed
again inside one process (a rank lost once would need the app restarted), and while MLX waits
for a peer it holds Python's GIL, which would freeze the window. Here the app's process only
reads and writes lines; a rank that dies ends the ranks' process group, which the client reports
as one `RanksLost` error naming what the ranks printed, and the app carries on.

`RanksClient` is thread-safe where it says so: `stop()` may be called from any thread while
another one runs `reply()`.
"""

from __future__ import annotations

import collections
import contextlib
import json
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from ..errors import A2ATSError
from . import wire
from .launch import launcher, read_hosts
from .serve import PREFIX
from .wire import RanksCodebook, RanksContext

STDERR_LINES = 40  # the ranks' last stderr lines kept for error messages
ANSI = re.compile(r"\x1b\[[0-9;]*m")
EXITED = re.compile(r"Node with rank (\d+) exited with code (-?\d+)")


class RanksLost(A2ATSError):
    """The ranks ended or could not start (a host unreachable, a rank died or hung)."""


class RanksClient:
    """The ranks of one model on the hosts of `hosts` (an mlx.launch hostfile)."""

    def __init__(
        self,
        hosts: str | Path,
        source: str,
        *,
        split: str | None = None,
        port: int | None = None,
        peer_timeout: float = 120.0,
        start_timeout: float = 1800.0,
        progress: Callable[[str], None] | None = None,
    ) -> None:
        self.hosts = Path(hosts)
        self._hosts = read_hosts(self.hosts)  # ValueError for a bad file, before anything starts
        self.host_count = len(self._hosts)
        command = [*launcher(), "--hostfile", str(self.hosts), "--python", sys.executable]
        if port is not None:
            command += ["--starting-port", str(port)]
        command += ["-m", "a2ats_engine.distributed.serve", "--model", source]
        command += ["--peer-timeout", str(peer_timeout)]
        if split:
            command += ["--split", split]
        self.command = command
        self._events: queue.Queue = queue.Queue()
        self._stderr: collections.deque[str] = collections.deque(maxlen=STDERR_LINES)
        self._errors: list[str] = []  # the ranks' `error ...` lines, first first (the cause)
        self._write_lock = threading.Lock()
        self._closed = False
        self.prompt: RanksContext | None = None  # the context the last reply continued
        self.codebook: RanksCodebook | None = None  # the codebook the ranks hold
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        self._process = subprocess.Popen(
            command,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env,
            start_new_session=True,  # the launcher and local ranks: one group to end
        )
        threading.Thread(target=self._read_stdout, name="ranks-out", daemon=True).start()
        threading.Thread(target=self._read_stderr, name="ranks-err", daemon=True).start()
        self._progress = progress
        ready = self._next(timeout=start_timeout, waiting="the ranks to load the model")
        if ready.get("ev") != "ready":
            self.close()
            raise RanksLost(f"the ranks did not start: {ready.get('message', ready)}")
        self.info = wire.info_from(ready.get("info"))
        ranks = ready.get("ranks")
        self.ranks = [str(r) for r in ranks] if isinstance(ranks, list) else []

    # -- lines -----------------------------------------------------------------------------

    def _read_stdout(self) -> None:
        for raw in self._process.stdout:
            line = raw.decode("ascii", errors="replace").strip()
            if not line.startswith(PREFIX):
                continue  # not the protocol (a library's print on rank 0)
            try:
                event = json.loads(line[len(PREFIX) :])
            except json.JSONDecodeError:
                continue
            if isinstance(event, dict):
                self._events.put(event)
        self._process.stdout.close()
        self._events.put(None)  # the ranks' output ended

    def _read_stderr(self) -> None:
        for raw in self._process.stderr:
            line = ANSI.sub("", raw.decode("utf-8", errors="replace")).rstrip()
            if line:
                self._stderr.append(line)
                if line.lower().startswith("error") and len(self._errors) < 8:
                    self._errors.append(line)
                if self._progress is not None and line.startswith("distributed:"):
                    self._progress(line.removeprefix("distributed:").strip())
        self._process.stderr.close()

    def _unreachable(self) -> str | None:
        """`host H could not be reached ...` when mlx.launch says a remote rank's ssh ended
        with 255 (ssh's own failure; mlx.launch runs it quietly), or 127 (a command not
        found)."""
        for line in self._stderr:
            found = EXITED.search(line)
            if not found or found.group(2) == "0":
                continue
            rank, code = int(found.group(1)), found.group(2)
            host = self._hosts[rank].get("ssh") if rank < len(self._hosts) else "?"
            if host == "127.0.0.1":
                continue
            if code == "255":
                return (
                    f"host {host!r} (rank {rank}) could not be reached with ssh "
                    "(passwordless ssh to every host is needed; README 'Several machines')"
                )
            if code == "127":
                return f"host {host!r} (rank {rank}): ssh, or Python on that host, was not found"
        return None

    def _lost(self, waiting: str) -> RanksLost:
        with contextlib.suppress(subprocess.TimeoutExpired):
            self._process.wait(timeout=10)
        time.sleep(0.2)  # the stderr reader's last lines
        other = [line for line in self._stderr if not line.startswith(("[ring]", "[mpi]"))]
        said = self._unreachable() or (self._errors[:1] or other[-1:] or ["(nothing)"])[0]
        self._closed = True
        self._kill()
        return RanksLost(
            f"the ranks ended while waiting for {waiting}: {said.strip()[:400]} (load the model "
            "again to start them)"
        )

    def _next(self, timeout: float | None = None, waiting: str = "an answer") -> dict:
        try:
            event = self._events.get(timeout=timeout)
        except queue.Empty:
            self._kill()
            raise RanksLost(f"no answer from the ranks in {timeout:.0f} s ({waiting})") from None
        if event is None:
            self._events.put(None)  # every later read fails the same way
            raise self._lost(waiting)
        return event

    def _send(self, request: dict) -> None:
        if self._closed:
            raise RanksLost("the ranks have ended; load the model again to start them")
        data = (json.dumps(request, ensure_ascii=True) + "\n").encode()
        with self._write_lock:
            try:
                self._process.stdin.write(data)
                self._process.stdin.flush()
            except (BrokenPipeError, ValueError, OSError):
                raise self._lost("a request to be read") from None

    def request(self, op: str, **fields: Any) -> dict:
        """Run one request on every rank; rank 0's answer. ValueError with the ranks' message
        when they refused it; RanksLost when they ended."""
        self._send({"op": op, **fields})
        while True:
            event = self._next(waiting=op)
            if event.get("ev") == "ok":
                return event
            if event.get("ev") == "error":
                raise ValueError(str(event.get("message", "")) or f"{op} failed on the ranks")

    # -- the chat ------------------------------------------------------------------------------

    def load_codebook(self, path: str | Path) -> RanksCodebook:
        """Each rank loads its layers' rows of the codebook at `path` (on every host)."""
        self.codebook = wire.codebook_from(self.request("codebook", path=str(path)), str(path))
        return self.codebook

    def clear_codebook(self) -> None:
        """The ranks forget their codebook (A2ATS then runs with a random one)."""
        self.request("clear_codebook")
        self.codebook = None

    def crossover(self, a2ats: Any) -> Any:
        """`a2ats` with the crossover that applies on rank 0's machine when it sets none (the
        measured crossover there, the built-in row or the estimate)."""
        return wire.config_from(self.request("crossover", a2ats=a2ats.to_dict()).get("a2ats"))

    def configure(
        self,
        *,
        system_prompt: str | None,
        sampling: Any,
        a2ats: Any,
        turns: list[tuple[str, str]],
    ) -> None:
        """`ChatSession.configure` on every rank (`a2ats` None: mlx-lm's caches; an A2ATS
        config uses the codebook last loaded, or a random one)."""
        self.request(
            "configure",
            system=system_prompt,
            sampling=sampling.to_dict(),
            a2ats=None if a2ats is None else a2ats.to_dict(),
            turns=[[str(r), str(c)] for r, c in turns],
        )

    def fit(self, mode: str, text: str, *, context_length: int | None, policy: str) -> Any:
        """`ChatSession.fit` on every rank; its ContextFit."""
        answer = self.request(
            "fit", mode=str(mode), text=text, context_length=context_length, policy=str(policy)
        )
        return wire.fit_from(answer.get("fit"))

    def context(self, *, streaming: bool) -> RanksContext:
        """The session's context: token ids, each token's text, the conversation's turns
        (`streaming`: the prompt the running reply prefilled; not while a reply streams:
        its `prompt` is that)."""
        return wire.context_from(self.request("context", streaming=bool(streaming)))

    def decode(self, ids: list[int]) -> str:
        return str(self.request("decode", ids=[int(i) for i in ids]).get("text", ""))

    def reply(
        self, mode: str, text: str, progress: Callable[[str, int, int], None] | None = None
    ) -> Iterator[Any]:
        """The reply's events (TokenEvent, CacheSnapshot, then GenerationStats); `prompt` is
        the context it continues from its first token on."""
        self.prompt = None
        self._send({"op": "reply", "mode": str(mode), "text": text})
        while True:
            event = self._next(waiting="the reply")
            kind = event.get("ev")
            if kind == "token":
                yield wire.token_from(event)
            elif kind == "prompt":
                self.prompt = wire.context_from(event, "prompt")
            elif kind == "snapshot":
                yield wire.snapshot_from(event.get("snapshot"))
            elif kind == "prefill" and progress is not None:
                progress("prefill", int(event.get("done", 0)), int(event.get("total", 0)))
            elif kind == "stats":
                yield wire.stats_from(event.get("stats"))
                return
            elif kind == "error":
                raise ValueError(str(event.get("message", "")) or "the reply failed on the ranks")

    def stop(self) -> None:
        """Thread-safe: the running reply ends on every rank at the same token."""
        with contextlib.suppress(RanksLost):
            self._send({"op": "stop"})

    @property
    def alive(self) -> bool:
        return not self._closed and self._process.poll() is None

    def close(self, timeout: float = 20.0) -> None:
        """End the ranks: ask them to exit, then end their process group."""
        if self._process.poll() is None and not self._closed:
            try:
                self._send({"op": "exit"})
                self._process.wait(timeout=timeout)
            except (RanksLost, subprocess.TimeoutExpired):
                pass
        self._closed = True
        self._kill()

    def _kill(self) -> None:
        if self._process.poll() is None:
            try:
                os.killpg(self._process.pid, signal.SIGTERM)
                self._process.wait(timeout=5)
            except (ProcessLookupError, subprocess.TimeoutExpired, PermissionError):
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(self._process.pid, signal.SIGKILL)
        with contextlib.suppress(OSError):
            self._process.stdin.close()


__all__ = ["RanksClient", "RanksCodebook", "RanksLost"]
