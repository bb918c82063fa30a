"""EngineWorker: the one object that calls MLX, living on the long-lived "engine" QThread.

Requests come in as queued slots (`load_model`, `load_codebook`, `calibrate`, `generate`...),
results go out as past-tense signals carrying frozen records. The worker never touches a
widget; widgets never call MLX. Two methods are called directly from the GUI thread because a
queued call would wait behind the running task: `stop()` (calls the thread-safe
`ChatSession.stop()`) and `cancel_calibration()` (sets an event the progress callback checks).
`EngineThread` owns the thread and the worker and turns method calls into queued requests.
"""

from __future__ import annotations

import threading
import time
import traceback
import weakref
from dataclasses import asdict
from pathlib import Path
from typing import Any, ClassVar

from PySide6.QtCore import QObject, QThread, Signal, Slot

from .backend import EngineBackend
from .context_text import TokenTextCache
from .events import (
    CalibrationFinished,
    CalibrationRequest,
    CodebookLoaded,
    ContextTokens,
    ErrorReport,
    GenerationRequest,
    GenerationStarted,
    ModelLoaded,
    Progress,
)

RANDOM_CODEBOOK_NOTE = (
    "No codebook: A2ATS retrieval uses a random one. Load or calibrate a codebook."
)


class CalibrationCancelled(Exception):
    """Raised from the progress callback to unwind a cancelled calibration."""


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


def _empty_stats(stop_reason: str, context_tokens: int = 0):
    from a2ats_engine.cache.telemetry import GenerationStats

    return GenerationStats(
        prompt_tokens=0,
        generation_tokens=0,
        time_to_first_token=0.0,
        prompt_tps=0.0,
        generation_tps=0.0,
        peak_memory_gb=0.0,
        stop_reason=stop_reason,
        context_tokens=context_tokens,
    )


class EngineWorker(QObject):
    """Owns the model, tokenizer, codebook and chat session; runs on the engine thread."""

    model_loaded = Signal(object)  # ModelLoaded
    codebook_loaded = Signal(object)  # CodebookLoaded
    codebook_cleared = Signal()
    demo_fetched = Signal(str)  # folder of the converted demo model
    progress = Signal(object)  # Progress
    failed = Signal(object)  # ErrorReport
    generation_started = Signal(object)  # GenerationStarted
    token_generated = Signal(object)  # TokenEvent
    snapshot_ready = Signal(object)  # CacheSnapshot
    context_updated = Signal(object)  # ContextTokens
    generation_finished = Signal(object)  # GenerationStats
    calibration_finished = Signal(object)  # CalibrationFinished
    calibration_cancelled = Signal()

    def __init__(self, backend: Any | None = None) -> None:
        super().__init__()
        self.backend = backend if backend is not None else EngineBackend()
        self._lock = threading.Lock()
        self._cancelled: set[int] = set()
        self._active_request: int | None = None
        self._calibration_cancel = threading.Event()
        self._model = None
        self._tokenizer = None
        self._info = None
        self._source = ""
        self._codebook = None
        self._codebook_info: CodebookLoaded | None = None
        self._session = None
        self._session_state: dict[str, Any] = {}
        self._texts: TokenTextCache | None = None

    # ----- thread-safe controls (called directly from the GUI thread) -----------------------

    def stop(self, request_id: int | None = None) -> None:
        """Stop the running reply (or, with `request_id`, that request even if still queued)."""
        with self._lock:
            target = self._active_request if request_id is None else request_id
            if target is not None:
                self._cancelled.add(target)
            session = self._session if target == self._active_request else None
        if session is not None:
            session.stop()

    def cancel_calibration(self) -> None:
        self._calibration_cancel.set()

    # ----- models -----------------------------------------------------------------------------

    @Slot(str)
    def load_model(self, source: str) -> None:
        """Load a model; the previous one stays in use if this fails."""
        start = time.perf_counter()

        def report(stage: str, done: int, total: int) -> None:
            self.progress.emit(Progress("load_model", stage, int(done), int(total)))

        try:
            model, tokenizer, info = self.backend.load_model(source, report)
        except Exception as exc:  # noqa: BLE001  (any failure is reported, the app stays up)
            self._report("load_model", exc, source)
            return
        self._model, self._tokenizer, self._info, self._source = model, tokenizer, info, source
        self._codebook, self._codebook_info = None, None
        self._session, self._session_state = None, {}
        backend, tok = self.backend, tokenizer
        self._texts = TokenTextCache(lambda ids: backend.decode(tok, ids))
        self.model_loaded.emit(ModelLoaded(source, info, time.perf_counter() - start))

    @Slot()
    def fetch_demo(self) -> None:
        def report(stage: str, done: int, total: int) -> None:
            self.progress.emit(Progress("fetch_demo", stage, int(done), int(total)))

        try:
            path = self.backend.fetch_demo(report)
        except Exception as exc:  # noqa: BLE001
            self._report("fetch_demo", exc, "demo")
            return
        self.demo_fetched.emit(str(path))

    # ----- codebooks --------------------------------------------------------------------------

    @Slot(str, bool)
    def load_codebook(self, path: str, automatic: bool = False) -> None:
        """Load and validate a codebook for the current model; nothing changes on failure."""
        if self._model is None:
            self.failed.emit(ErrorReport("load_codebook", "Load a model first.", source=path))
            return
        try:
            codebook, warnings = self.backend.load_codebook(path, self._model)
            info = self._codebook_record(codebook, path, warnings, automatic)
        except Exception as exc:  # noqa: BLE001
            self._report("load_codebook", exc, path)
            return
        self._codebook, self._codebook_info = codebook, info
        self.codebook_loaded.emit(info)

    @Slot()
    def clear_codebook(self) -> None:
        self._codebook, self._codebook_info = None, None
        self.codebook_cleared.emit()

    def _codebook_record(self, codebook, path: str, warnings, automatic: bool) -> CodebookLoaded:
        metadata = dict(getattr(codebook, "metadata", {}) or {})
        beta = metadata.get("beta")
        return CodebookLoaded(
            path=str(path),
            name=Path(path).name,
            sha256=self.backend.codebook_sha256(codebook, path),
            n_centroids=int(codebook.n_centroids),
            sub_dim=int(codebook.sub_dim),
            beta=float(beta) if isinstance(beta, int | float) else None,
            num_layers=int(codebook.num_layers),
            nbytes=int(getattr(codebook, "nbytes", 0)),
            metadata=metadata,
            warnings=tuple(str(w) for w in warnings),
            automatic=automatic,
        )

    # ----- calibration ------------------------------------------------------------------------

    @Slot(object)
    def calibrate(self, request: CalibrationRequest) -> None:
        """Train a codebook on the current model, save it, then load it."""
        if self._model is None:
            self.failed.emit(ErrorReport("calibrate", "Load a model first."))
            return
        self._calibration_cancel.clear()
        start = time.perf_counter()

        def report(stage: str, done: int, total: int) -> None:
            if self._calibration_cancel.is_set():
                raise CalibrationCancelled
            self.progress.emit(Progress("calibrate", stage, int(done), int(total)))

        try:
            self.backend.calibrate(
                self._model,
                self._tokenizer,
                request,
                report,
                self._calibration_cancel,
                getattr(self._info, "name", None),
            )
        except Exception as exc:  # noqa: BLE001
            if isinstance(exc, CalibrationCancelled) or self.backend.is_cancellation(exc):
                self.calibration_cancelled.emit()
            else:
                self._report("calibrate", exc, request.output)
            return
        self.calibration_finished.emit(
            CalibrationFinished(request.output, time.perf_counter() - start)
        )
        self.load_codebook(request.output, False)

    # ----- generation -------------------------------------------------------------------------

    @Slot(object)
    def generate(self, request: GenerationRequest) -> None:
        """Produce one reply, streaming token_generated / snapshot_ready, then
        context_updated and generation_finished (always, also after stop or failure)."""
        with self._lock:
            self._active_request = request.request_id
            cancelled = request.request_id in self._cancelled
        try:
            self._generate(request, cancelled)
        finally:
            with self._lock:
                self._active_request = None
                self._cancelled.discard(request.request_id)

    def _generate(self, request: GenerationRequest, cancelled: bool) -> None:
        notes = self._notes(request)
        self.generation_started.emit(
            GenerationStarted(
                request.request_id,
                request.conversation_id,
                request.mode,
                self._provenance(request),
                notes,
            )
        )
        if cancelled:
            self.generation_finished.emit(_empty_stats("cancelled"))
            return
        if self._model is None:
            self.failed.emit(ErrorReport("generate", "No model is loaded."))
            self.generation_finished.emit(_empty_stats("error"))
            return
        stats = None
        try:
            session = self._prepare_session(request)
            stats = self._stream(session, request)
        except Exception as exc:  # noqa: BLE001
            self._report("generate", exc)
            stats = None
        if stats is None:
            stats = _empty_stats("error")
        elif self._session is not None:
            self._emit_context(request.request_id, [], streaming=False)
        self.generation_finished.emit(stats)

    def _stream(self, session, request: GenerationRequest):
        from a2ats_engine.cache.telemetry import CacheSnapshot, GenerationStats, TokenEvent

        if request.mode == "send":
            events = session.send(request.text)
        elif request.mode == "regenerate":
            events = session.regenerate()
        elif request.mode == "edit":
            events = session.edit_last_user_message(request.text)
        else:
            raise ValueError(
                f"GenerationRequest.mode={request.mode!r} must be send/regenerate/edit"
            )
        generated: list[int] = []
        stats = None
        for event in events:
            if isinstance(event, TokenEvent):
                generated.append(event.token_id)
                if len(generated) == 1:
                    self._emit_context(request.request_id, generated, streaming=True)
                self.token_generated.emit(event)
            elif isinstance(event, CacheSnapshot):
                self.snapshot_ready.emit(event)
            elif isinstance(event, GenerationStats):
                stats = event
            with self._lock:
                stop_now = request.request_id in self._cancelled
            if stop_now:
                session.stop()  # idempotent; catches a stop that raced the start of send()
        return stats

    def _emit_context(self, request_id: int, generated: list[int], *, streaming: bool) -> None:
        session = self._session
        ids = self.backend.context_token_ids(session, streaming=streaming)
        ids = ids + list(generated)  # streaming: the prompt ids do not hold the reply yet
        texts = self._texts.texts(ids) if self._texts is not None else [""] * len(ids)
        messages = tuple(
            (m["role"], m["content"]) for m in session.messages if m["role"] != "system"
        )
        self.context_updated.emit(ContextTokens(request_id, tuple(ids), tuple(texts), messages))

    def _cache_config(self, request: GenerationRequest):
        """The A2ATSConfig for the request (None = plain mlx-lm KVCache)."""
        if not request.cache.a2ats_enabled:
            return None
        return request.cache.to_config(telemetry=request.telemetry)

    def _prepare_session(self, request: GenerationRequest):
        """Create or adjust the session so it holds `request.history` with the requested
        system prompt, sampling and cache; the engine keeps its prompt cache when they match."""
        a2ats = self._cache_config(request)
        state = {
            "cache": (a2ats, id(self._codebook)),
            "sampling": request.sampling,
            "system": request.system_prompt,
        }
        if self._session is None:
            self._session = self.backend.make_session(
                self._model,
                self._tokenizer,
                system_prompt=request.system_prompt,
                sampling=request.sampling,
                a2ats=a2ats,
                codebook=self._codebook,
            )
        else:
            old = self._session_state
            if old.get("cache") != state["cache"]:
                self.backend.configure_session(self._session, a2ats=a2ats, codebook=self._codebook)
            if old.get("sampling") != state["sampling"]:
                self.backend.set_sampling(self._session, request.sampling)
            if old.get("system") != state["system"]:
                self._session.set_system_prompt(request.system_prompt or None)
        self._session_state = state
        held = [(m["role"], m["content"]) for m in self._session.messages if m["role"] != "system"]
        if held != list(request.history):
            self._session.load_messages([{"role": r, "content": c} for r, c in request.history])
        return self._session

    def _notes(self, request: GenerationRequest) -> tuple[str, ...]:
        if request.cache.a2ats_enabled and self._codebook is None and self._model is not None:
            return (RANDOM_CODEBOOK_NOTE,)
        return ()

    def _provenance(self, request: GenerationRequest) -> dict[str, Any]:
        info = self._info
        model = {
            "source": self._source,
            "name": getattr(info, "name", ""),
            "path": getattr(info, "path", ""),
            "architecture": getattr(info, "architecture", ""),
            "quantization": getattr(info, "quantization", None),
        }
        cache: dict[str, Any] = {"a2ats_enabled": bool(request.cache.a2ats_enabled)}
        if request.cache.a2ats_enabled:
            try:
                cache["config"] = self._cache_config(request).to_dict()
            except ValueError as exc:
                cache["config_error"] = str(exc)
        if self._codebook_info is not None:
            codebook = self._codebook_info.provenance()
        elif request.cache.a2ats_enabled:
            codebook = {"name": "random (uncalibrated)", "sha256": None}
        else:
            codebook = None
        return {
            "model": model,
            "cache": cache,
            "codebook": codebook,
            "sampling": asdict(request.sampling),
            "system_prompt": request.system_prompt,
        }

    # ----- errors -----------------------------------------------------------------------------

    def _report(self, task: str, exc: BaseException, source: str = "") -> None:
        self.failed.emit(
            ErrorReport(task, _one_line(exc), "".join(traceback.format_exception(exc)), source)
        )


class EngineThread(QObject):
    """Starts the "engine" QThread with an EngineWorker on it and forwards requests as queued
    signals. `worker`'s signals are what the GUI connects to."""

    _load_model = Signal(str)
    _fetch_demo = Signal()
    _load_codebook = Signal(str, bool)
    _clear_codebook = Signal()
    _calibrate = Signal(object)
    _generate = Signal(object)

    # every EngineThread not yet garbage-collected (tests check none is left running)
    live: ClassVar[weakref.WeakSet[EngineThread]] = weakref.WeakSet()

    def __init__(self, backend: Any | None = None, parent: QObject | None = None) -> None:
        super().__init__(parent)
        EngineThread.live.add(self)
        self.thread = QThread()
        self.thread.setObjectName("engine")
        self.worker = EngineWorker(backend)
        self.worker.moveToThread(self.thread)
        self._load_model.connect(self.worker.load_model)
        self._fetch_demo.connect(self.worker.fetch_demo)
        self._load_codebook.connect(self.worker.load_codebook)
        self._clear_codebook.connect(self.worker.clear_codebook)
        self._calibrate.connect(self.worker.calibrate)
        self._generate.connect(self.worker.generate)
        self._next_request = 0
        self.thread.start()

    def load_model(self, source: str) -> None:
        self._load_model.emit(source)

    def fetch_demo(self) -> None:
        self._fetch_demo.emit()

    def load_codebook(self, path: str, automatic: bool = False) -> None:
        self._load_codebook.emit(path, automatic)

    def clear_codebook(self) -> None:
        self._clear_codebook.emit()

    def calibrate(self, request: CalibrationRequest) -> None:
        self._calibrate.emit(request)

    def next_request_id(self) -> int:
        self._next_request += 1
        return self._next_request

    def generate(self, request: GenerationRequest) -> None:
        self._generate.emit(request)

    def stop(self, request_id: int | None = None) -> None:
        """Direct call: must not wait behind the generation it stops."""
        self.worker.stop(request_id)

    def cancel_calibration(self) -> None:
        self.worker.cancel_calibration()

    def shutdown(self, timeout_ms: int = 10000) -> None:
        """Stop any reply and calibration, then end the thread."""
        self.worker.stop()
        self.worker.cancel_calibration()
        self.thread.quit()
        self.thread.wait(timeout_ms)
