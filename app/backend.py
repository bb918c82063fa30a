"""The one seam between the app and the engine: every engine operation goes through here (the
rest of the app imports only the engine's public names and records: tests/test_boundaries.py;
`ranks_backend.py` is the same seam for a model split over several machines).

`EngineWorker` (worker.py) holds the model, tokenizer, codebook and chat session as opaque
handles and does everything with them through an `EngineBackend`: loading, codebooks,
calibration, and each chat-session operation (make, configure for a request, fit the turn into
the context, stream a reply, stop), each one call into the engine's `ChatSession`.
GUI tests hand the worker a fake with the same methods (`tests/app/fakes.py`). Only the engine
thread calls these methods, except `stop`, which is thread-safe.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from a2ats_engine.cache.config import A2ATSConfig
from a2ats_engine.cache.telemetry import CacheSnapshot, GenerationStats, TokenEvent
from a2ats_engine.chat_turn import ContextFit, OverflowPolicy, ReplyMode
from a2ats_engine.progress import Progress as ProgressFn
from a2ats_engine.records import SamplingSettings

from .events import CalibrationRequest

__all__ = ["ContextFit", "CrossoverCancelled", "EngineBackend", "file_sha256", "is_cpu_only"]

Event = TokenEvent | CacheSnapshot | GenerationStats
Turns = list[tuple[str, str]]  # (role, content), no system message


def file_sha256(path: str | Path) -> str:
    """Hex sha256 of a file (the engine's `files.sha256_file`)."""
    from a2ats_engine.files import sha256_file

    return sha256_file(path)


def is_cpu_only() -> bool:
    """True when MLX has no GPU (Metal) backend (the engine's `_backend.is_cpu_only`)."""
    from a2ats_engine import _backend

    return _backend.is_cpu_only()


def show_note(message, category, filename, lineno, file=None, line=None) -> None:  # noqa: ANN001
    """`warnings.showwarning` for engine warnings: one `note: <message>` line, as the `a2ats`
    command prints them (`a2ats_engine/cli.py`)."""
    from a2ats_engine.cli import show_note as engine_note

    engine_note(message, category, filename, lineno, file, line)


class CrossoverCancelled(Exception):
    """The crossover measurement was cancelled (a message was sent while it ran)."""


class EngineBackend:
    """Real engine calls (MLX). `prefill_step_size`: tokens per prefill chunk of new sessions
    (a stop is honoured between chunks; None = the engine's default)."""

    def __init__(self, prefill_step_size: int | None = None) -> None:
        self.prefill_step_size = prefill_step_size

    # ----- models and the demo ----------------------------------------------------------------

    def load_model(self, source: str, progress: ProgressFn | None = None):
        """-> (model, tokenizer, ModelInfo); ModelLoadError on bad input."""
        from a2ats_engine.loading.models import load_model

        return load_model(source, progress=progress)

    def demo_model_path(self) -> Path | None:
        from a2ats_engine.loading.models import demo_model_path

        return demo_model_path()

    def fetch_demo(self, progress: ProgressFn | None = None) -> Path:
        from a2ats_engine.loading.models import fetch_demo

        return fetch_demo(progress=progress)

    def ensure_demo_codebook(self, folder: Path, progress: ProgressFn | None = None) -> Path:
        """Build the demo's default codebook unless a valid one exists (as `a2ats fetch-demo`)."""
        from a2ats_engine.calibration.calibrate import ensure_demo_codebook

        return ensure_demo_codebook(progress, model_source=folder)

    def demo_codebook_path(self) -> Path:
        from a2ats_engine.calibration.calibrate import demo_codebook_path

        return demo_codebook_path()

    def default_codebook_path(self, source: str) -> Path | None:
        """Where a named model's default codebook lives (the demo's, gemma3-270m's), None for
        any other source."""
        from a2ats_engine.loading.fetched_models import default_codebook_path, is_named

        return default_codebook_path(source) if is_named(source) else None

    def placement(self, model) -> tuple[str, ...]:
        """Which layers each rank serves; () on this computer (ranks_backend.py)."""
        return ()

    def close(self) -> None:
        """End what the backend runs besides this process (nothing here; the ranks there)."""

    # ----- codebooks and calibration ----------------------------------------------------------

    def load_codebook(self, path: str, model) -> tuple[Any, list[str]]:
        """-> (codebook, warnings); CodebookError naming the mismatch when it does not fit."""
        from a2ats_engine.cache.codebook import Codebook

        codebook = Codebook.load(path)
        warnings = codebook.validate_for(model)
        return codebook, list(warnings or [])

    def codebook_sha256(self, codebook, path: str) -> str:
        return codebook.sha256 or file_sha256(path)

    def calibrate(
        self,
        model,
        tokenizer,
        request: CalibrationRequest,
        progress: ProgressFn,
        cancel: threading.Event,
        model_name: str,
    ):
        """Train a codebook as `request` asks, save it, return it. The engine raises its
        CalibrationCancelled when `cancel` is set."""
        from a2ats_engine.cache.codebook_spec import CodebookSpec
        from a2ats_engine.calibration.calibrate import calibrate
        from a2ats_engine.calibration.corpus import load_texts

        texts = load_texts(list(request.files), tokenizer) if request.files else None
        spec = CodebookSpec(request.n_centroids, request.sub_dim, request.beta)
        codebook = calibrate(
            model,
            tokenizer,
            texts,
            request.cache.to_config(),
            spec=spec,
            tokens=request.tokens,
            progress=progress,
            cancel=cancel,
            model_name=model_name,
        )
        Path(request.output).parent.mkdir(parents=True, exist_ok=True)
        codebook.save(request.output)
        return codebook

    def is_cancellation(self, exc: BaseException) -> bool:
        from a2ats_engine.calibration.capture import CalibrationCancelled

        return isinstance(exc, CalibrationCancelled)

    # ----- chat sessions ----------------------------------------------------------------------

    def make_session(self, model, tokenizer):
        """A ChatSession with mlx-lm's KVCache until `configure_session` says otherwise."""
        from a2ats_engine.session import ChatSession

        session = ChatSession(model, tokenizer)
        if self.prefill_step_size is not None:
            session.prefill_step_size = self.prefill_step_size
        return session

    def crossover_measured_here(self, model, config=None, codebook=None) -> bool:
        """Whether this machine has its own measured crossover for the model's geometry with
        these A2ATS settings (None: the defaults) and codebook (`crossover.step_kind`), and,
        where the estimate is left to the measurement (`estimate_missed` None), its cost."""
        from a2ats_engine.cache.config import A2ATSConfig, estimate_would_run
        from a2ats_engine.cache.crossover import lookup_crossover, step_kind
        from a2ats_engine.cache.geometry import model_geometry

        config = config or A2ATSConfig()
        subspaces = getattr(codebook, "num_subspaces", 1)
        geo = model_geometry(model)
        kind = step_kind(config, subspaces)
        row = lookup_crossover(geo.num_layers, geo.num_kv_heads, geo.head_dim, kind)
        if row is None or row.origin in ("built-in", "estimate"):
            return False
        return row.estimate is not None or not estimate_would_run(config, subspaces)

    def measure_crossover(self, model, name: str, codebook, progress, cancel, config=None) -> dict:
        """Measure the model's crossover on this machine (short: one run of a few steps at
        1K-8K tokens within its context) with these A2ATS settings (None: the defaults),
        record it in the user table and return the entry. `cancel.is_set()` is polled between
        contexts: CrossoverCancelled then."""
        from a2ats_engine.bench.crossover_probe import AUTO_CONTEXTS, measure_crossover
        from a2ats_engine.cache import crossover as xo
        from a2ats_engine.cache.config import A2ATSConfig
        from a2ats_engine.cache.geometry import model_geometry

        limit = model_geometry(model).max_context or max(AUTO_CONTEXTS)
        contexts = [c for c in AUTO_CONTEXTS if c <= limit] or [min(AUTO_CONTEXTS)]

        def report(stage: str, done: int, total: int) -> None:
            if cancel.is_set():
                raise CrossoverCancelled("measurement cancelled")
            progress(f"Measuring where retrieval pays off on this machine ({stage})", done, total)

        entry, _ = measure_crossover(
            model, name, contexts, steps=6, repeats=1, config=config or A2ATSConfig(),
            codebook=codebook,
            codebook_desc="the loaded codebook" if codebook is not None else "random",
            measured_on=xo.machine_id(), progress=report,
        )  # fmt: skip
        xo.record_crossover(entry)
        xo.reload_user_table()
        return entry

    def with_crossover(self, model, config: A2ATSConfig, codebook=None) -> A2ATSConfig:
        """`config` with the crossover that applies on this machine to these settings and
        codebook when it sets none: measured here, the built-in row, or the engine's estimate
        from the geometry (never 0)."""
        from a2ats_engine.cache.crossover_model import with_default_crossover

        return with_default_crossover(model, config, codebook)[0]

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
        """Everything the next reply uses, in one call (`ChatSession.configure`: only what
        differs changes; `a2ats` None = mlx-lm's KVCache)."""
        session.configure(
            system_prompt=system_prompt or None,
            sampling=sampling,
            a2ats=a2ats,
            codebook=codebook,
            messages=[{"role": r, "content": c} for r, c in turns],
        )

    def fit(
        self,
        session,
        mode: ReplyMode,
        text: str,
        *,
        context_length: int | None,
        policy: OverflowPolicy,
    ) -> ContextFit:
        """Fit the reply into the context as `policy` says (`ChatSession.fit`)."""
        return session.fit(mode, text, context_length=context_length, policy=policy)

    def session_turns(self, session) -> Turns:
        """The conversation the session holds, as (role, content) pairs without the system."""
        return [(m["role"], m["content"]) for m in session.messages if m["role"] != "system"]

    def reply(
        self, session, mode: ReplyMode, text: str, progress: ProgressFn | None = None
    ) -> Iterator[Event]:
        """Start a reply (the session's stop flag is cleared now) and return its event stream.
        `progress("prefill", done, total)` is called on the engine thread after each prefill
        chunk (and once with done 0), when given."""
        if mode not in list(ReplyMode):
            raise ValueError(f"GenerationRequest.mode={mode!r} must be one of {list(ReplyMode)}")
        if progress is not None:
            session.prefill_progress = progress
        return session.reply(mode, text)

    def stop(self, session) -> None:
        """Thread-safe: the running reply ends before its next token or prefill chunk."""
        session.stop()

    # ---- a chat's cache kept across chat switches and restarts (session_file.py) ----------

    def save_chat_cache(self, session, chat_id: str) -> str | None:
        """Keep the session's cache in the chat's file when the chat is long enough for its
        prefill to cost more than a save (`SAVE_FROM_TOKENS`); least recently used files beyond
        `KEEP_BYTES` go. None when kept or not worth keeping, else why it was not."""
        from a2ats_engine.errors import A2ATSError
        from a2ats_engine.session_file import (
            SAVE_FROM_TOKENS,
            chat_cache_path,
            prune_chat_caches,
            save_cache,
        )

        if session is None or session.context_tokens < SAVE_FROM_TOKENS:
            return None
        try:
            save_cache(session, chat_cache_path(chat_id))
        except (A2ATSError, OSError, ValueError) as exc:
            return f"The chat's cache was not kept ({exc}); it is prefilled again when reopened."
        prune_chat_caches()
        return None

    def restore_chat_cache(self, session, chat_id: str) -> str | None:
        """Adopt the chat's saved cache if it has one that fits the session now (same model,
        weights, settings, codebook and conversation start; a file that does not fit stays for
        the setting it was made with, until pruned). The note to show, or None when the chat
        has no saved cache."""
        from a2ats_engine.session_file import chat_cache_path, restore_cache

        path = chat_cache_path(chat_id)
        if not path.is_file():
            return None
        try:
            reason = restore_cache(session, path)
        except (OSError, ValueError) as exc:  # hostile or half-written: never adopted
            reason = f"{path.name} could not be read ({exc})"
        if reason is not None:  # kept: another model or setting may use it again
            return f"The chat's saved cache was not used: {reason}"
        path.touch()  # recently used: pruned last
        return (
            f"Reopened from the chat's saved cache: {session.context_tokens:,} tokens are not "
            "prefilled again."
        )

    def forget_chat_cache(self, chat_id: str) -> None:
        """Remove the chat's saved cache, if any (the chat was deleted)."""
        from a2ats_engine.session_file import chat_cache_path

        chat_cache_path(chat_id).unlink(missing_ok=True)

    def context_token_ids(self, session, *, streaming: bool) -> list[int]:
        """Token ids of the session's context in position order. While a reply streams the
        session's cache ids are not updated yet, so the rendered prompt (which the stream
        prefilled) stands for them; generated tokens are added by the caller."""
        ids = session.prompt_token_ids() if streaming else session.cached_token_ids
        return [int(t) for t in ids]

    def decode(self, tokenizer, ids: list[int]) -> str:
        return tokenizer.decode(ids, skip_special_tokens=False)

    def text_cache(self, tokenizer):
        """Each context token's text, `.texts(ids)` (decoded with the tokenizer, the tail
        only when a context grows)."""
        from a2ats_engine.token_texts import TokenTextCache

        return TokenTextCache(lambda ids: self.decode(tokenizer, ids))
