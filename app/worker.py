"""EngineWorker: the one object that calls the engine, living on the long-lived "engine" QThread.

Requests come in as records (`events.EngineRequest`: `LoadModel`, `CalibrationRequest`,
`GenerationRequest`...) on one queued slot, `handle`, connected to the controller's request
signal; results go out as past-tense signals carrying frozen records. The worker never touches
a widget; widgets never call the engine. Every engine call goes through the worker's backend
(`backend.py`). Two methods are called directly from the GUI thread because a queued call
would wait behind the running task: `stop()` (the engine's thread-safe session stop, honoured
between prefill chunks and tokens) and `cancel_calibration()` (sets the cancel event the
engine's calibration checks); `cancel_crossover()` is direct too. Calibrations and crossover
measurements are numbered, so a cancel also reaches one still queued (`NumberedCancel`).
`EngineThread` owns the thread and the worker on it: it starts them and shuts them down.
"""

from __future__ import annotations

import sys
import threading
import time
import traceback
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar

from PySide6.QtCore import QMetaObject, QObject, Qt, QThread, Signal, Slot

from a2ats_engine.cache.config import A2ATSConfig
from a2ats_engine.cache.telemetry import CacheSnapshot, GenerationStats, TokenEvent
from a2ats_engine.records import ModelInfo

from .backend import CrossoverCancelled, EngineBackend
from .cancel import NumberedCancel
from .events import (
    CalibrationFinished,
    CalibrationRequest,
    ClearCodebook,
    CodebookLoaded,
    ContextOverflow,
    ContextTokens,
    CrossoverMeasured,
    DemoStatus,
    EngineRequest,
    ErrorReport,
    FetchDemo,
    FindDemo,
    ForgetChatCache,
    GenerationRequest,
    GenerationStarted,
    Job,
    JsonDict,
    LoadCodebook,
    LoadModel,
    MeasureCrossover,
    ModelLoaded,
    PrefillProgress,
    Progress,
    StopReason,
)
from .replies import RANDOM_CODEBOOK_NOTE, empty_stats, fit_notes, request_provenance

DEMO = "demo"
# cancel_calibration(ALL) / cancel_crossover(ALL): the running one and every one still queued
ALL = sys.maxsize


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


class EngineWorker(QObject):
    """Owns the model, tokenizer, codebook and chat session; runs on the engine thread."""

    model_loaded = Signal(object)  # ModelLoaded
    codebook_loaded = Signal(object)  # CodebookLoaded
    codebook_cleared = Signal()
    demo_found = Signal(object)  # DemoStatus
    demo_fetched = Signal(str)  # folder of the converted demo model (its codebook built)
    progress = Signal(object)  # Progress
    failed = Signal(object)  # ErrorReport
    generation_started = Signal(object)  # GenerationStarted
    token_generated = Signal(object)  # TokenEvent
    snapshot_ready = Signal(object)  # CacheSnapshot
    prefill_progressed = Signal(object)  # PrefillProgress, after each prompt chunk
    context_updated = Signal(object)  # ContextTokens
    context_overflowed = Signal(object)  # ContextOverflow (then generation_finished)
    generation_finished = Signal(object)  # GenerationStats
    calibration_finished = Signal(object)  # CalibrationFinished
    calibration_cancelled = Signal()
    crossover_measured = Signal(object)  # CrossoverMeasured

    def __init__(
        self,
        backend: EngineBackend | None = None,
        ranks_backend: Callable[[str], EngineBackend] | None = None,
    ) -> None:
        super().__init__()
        # this computer's backend, and the one in use (the ranks' while a model runs on hosts)
        self.local_backend = backend if backend is not None else EngineBackend()
        self.backend = self.local_backend
        self._ranks_backend = ranks_backend if ranks_backend is not None else _ranks_backend
        self._lock = threading.Lock()
        self._closing = threading.Event()
        self._cancelled: set[int] = set()
        self._active_request: int | None = None
        self._calibration = NumberedCancel()
        self._crossover = NumberedCancel()
        self._model = None
        self._tokenizer = None
        self._info: ModelInfo | None = None
        self._source = ""
        self._codebook = None
        self._codebook_info: CodebookLoaded | None = None
        self._session = None
        self._session_chat: str | None = None  # the chat whose turns the session's cache holds
        self._session_keeps = False  # whether that chat's cache may be kept on disk
        self._texts = None  # each context token's text (the backend's text_cache)

    # ----- requests (queued from the controller) -----------------------------------------------

    @Slot(object)
    def handle(self, request: EngineRequest) -> None:
        """Run one request; the controller's request signal is queued to this slot, so requests
        run one at a time, in the order they were sent, on the engine thread."""
        if self._closing.is_set():
            return  # the app is closing: what is still queued is not started
        match request:
            case LoadModel(source, codebook, demo_codebook, hosts):
                self.load_model(source, codebook, demo_codebook, hosts)
            case FindDemo():
                self.find_demo()
            case FetchDemo():
                self.fetch_demo()
            case LoadCodebook(path, automatic):
                self.load_codebook(path, automatic)
            case ClearCodebook():
                self.clear_codebook()
            case MeasureCrossover(name, automatic, seq, config):
                self.measure_crossover(name, automatic, seq, config)
            case CalibrationRequest():
                self.calibrate(request)
            case GenerationRequest():
                self.generate(request)
            case ForgetChatCache(conversation_id):
                self.forget_chat_cache(conversation_id)
            case _:
                raise TypeError(f"not an engine request: {request!r}")

    # ----- thread-safe controls (called directly from the GUI thread) -----------------------

    def close(self) -> None:
        """The app is closing: requests still queued are skipped (`finish` ends the thread)."""
        self._closing.set()

    def stop(self, request_id: int | None = None) -> None:
        """Stop the running reply (or, with `request_id`, that request even if still queued)."""
        with self._lock:
            target = self._active_request if request_id is None else request_id
            if target is not None:
                self._cancelled.add(target)
            session = self._session if target == self._active_request else None
        if session is not None:
            self.backend.stop(session)

    def cancel_calibration(self, up_to: int | None = None) -> None:
        """Cancel the running calibration and every queued one numbered up to `up_to`."""
        self._calibration.cancel(up_to)

    def cancel_crossover(self, up_to: int | None = None) -> None:
        """End the running crossover measurement at its next context, and every queued one
        numbered up to `up_to`."""
        self._crossover.cancel(up_to)

    # ----- models -----------------------------------------------------------------------------

    def load_model(
        self, source: str, codebook: str = "", demo_codebook: bool = True, hosts: str = ""
    ) -> None:
        """Load a model, on this computer or (`hosts`, an mlx.launch hosts file) split over the
        hosts' ranks; the previous one stays in use if this fails, except a model on hosts
        when the new one goes to hosts too (its ranks hold the ports: they end first). Then
        load `codebook` (the one last used with this model), or for the demo its default."""
        start = time.perf_counter()

        def report(stage: str, done: int, total: int) -> None:
            self.progress.emit(Progress(Job.LOAD_MODEL, stage, int(done), int(total)))

        try:
            backend = self._ranks_backend(hosts) if hosts else self.local_backend
        except Exception as exc:  # noqa: BLE001  (a bad hosts file: named, nothing started)
            self._report(Job.LOAD_MODEL, exc, hosts)
            return
        if hosts and self.backend is not self.local_backend:
            self._unload()  # the ranks of the model loaded on hosts before
        try:
            model, tokenizer, info = backend.load_model(source, report)
        except Exception as exc:  # noqa: BLE001  (any failure is reported, the app stays up)
            if backend is not self.local_backend:
                backend.close()
            self._report(Job.LOAD_MODEL, exc, source)
            return
        self._keep_chat_cache()  # the last model's cache, for when it is loaded again
        if self.backend is not backend and self.backend is not self.local_backend:
            self.backend.close()  # the ranks of the model loaded on hosts before
        self.backend = backend
        self._model, self._tokenizer, self._info, self._source = model, tokenizer, info, source
        self._codebook, self._codebook_info = None, None
        self._session, self._session_chat = None, None
        self._texts = backend.text_cache(tokenizer)
        placement = tuple(backend.placement(model))
        seconds = time.perf_counter() - start
        self.model_loaded.emit(ModelLoaded(source, info, seconds, hosts, placement))
        automatic = self._automatic_codebook(source, codebook, demo_codebook)
        if automatic:
            self.load_codebook(automatic, True)

    def _automatic_codebook(self, source: str, remembered: str, demo_codebook: bool) -> str:
        if remembered and Path(remembered).is_file():
            return remembered
        if demo_codebook:  # the demo's, or another named model's default codebook
            default = self.backend.default_codebook_path(source)
            return str(default) if default is not None and default.is_file() else ""
        return ""

    def _unload(self) -> None:
        """End the model on hosts (its ranks); the worker holds no model afterwards."""
        self._keep_chat_cache()
        self.backend.close()
        self.backend = self.local_backend
        self._model = self._tokenizer = self._info = self._session = self._texts = None
        self._codebook, self._codebook_info, self._session_chat = None, None, None

    def find_demo(self) -> None:
        folder = self.backend.demo_model_path()
        self.demo_found.emit(DemoStatus(str(folder) if folder is not None else ""))

    def fetch_demo(self) -> None:
        """Fetch the demo model, then build its default codebook (as `a2ats fetch-demo`)."""

        def report(stage: str, done: int, total: int) -> None:
            self.progress.emit(Progress(Job.FETCH_DEMO, stage, int(done), int(total)))

        try:
            folder = self.backend.fetch_demo(report)
            report("building the default codebook", 0, 0)
            self.backend.ensure_demo_codebook(Path(folder), report)
        except Exception as exc:  # noqa: BLE001
            self._report(Job.FETCH_DEMO, exc, DEMO)
            return
        self.demo_fetched.emit(str(folder))

    # ----- codebooks --------------------------------------------------------------------------

    def load_codebook(self, path: str, automatic: bool = False) -> None:
        """Load and validate a codebook for the current model; nothing changes on failure."""
        if self._model is None:
            self.failed.emit(ErrorReport(Job.LOAD_CODEBOOK, "Load a model first.", source=path))
            return
        try:
            codebook, warnings = self.backend.load_codebook(path, self._model)
            info = self._codebook_record(codebook, path, warnings, automatic)
        except Exception as exc:  # noqa: BLE001
            self._report(Job.LOAD_CODEBOOK, exc, path, automatic=automatic)
            return
        self._codebook, self._codebook_info = codebook, info
        self.codebook_loaded.emit(info)

    def clear_codebook(self) -> None:
        self._codebook, self._codebook_info = None, None
        self.codebook_cleared.emit()

    def _codebook_record(self, codebook, path: str, warnings, automatic: bool) -> CodebookLoaded:
        metadata = dict(codebook.metadata or {})
        beta = metadata.get("beta")
        return CodebookLoaded(
            path=str(path),
            name=Path(path).name,
            sha256=self.backend.codebook_sha256(codebook, path),
            n_centroids=int(codebook.n_centroids),
            sub_dim=int(codebook.sub_dim),
            beta=float(beta) if isinstance(beta, int | float) else None,
            num_layers=int(codebook.num_layers),
            nbytes=int(codebook.nbytes),
            metadata=metadata,
            warnings=tuple(str(w) for w in warnings),
            automatic=automatic,
        )

    # ----- calibration ------------------------------------------------------------------------

    def measure_crossover(self, name: str, automatic: bool, seq: int = 0, config=None) -> None:
        """Measure the loaded model's crossover here with the A2ATS settings `config` (None:
        the defaults) and the loaded codebook, and record it; `automatic` (a first load, new
        settings): only where none is measured for them. A cancel queued before it cancels it."""
        if self._model is None:
            return
        with self._crossover.running(seq) as cancel:
            self._measure_crossover(name, automatic, cancel, config)

    def _measure_crossover(
        self, name: str, automatic: bool, cancel: threading.Event, config: A2ATSConfig | None
    ) -> None:
        try:
            if cancel.is_set():
                raise CrossoverCancelled("cancelled before it started")
            here = self.backend.crossover_measured_here
            if automatic and here(self._model, config, self._codebook):
                self.crossover_measured.emit(CrossoverMeasured(skipped=True))
                return

            def report(stage: str, done: int, total: int) -> None:
                self.progress.emit(Progress(Job.CROSSOVER, stage, done, total))

            entry = self.backend.measure_crossover(
                self._model, name, self._codebook, report, cancel, config
            )
        except CrossoverCancelled:
            self.crossover_measured.emit(CrossoverMeasured(cancelled=True))
            return
        except Exception as exc:  # noqa: BLE001  (reported, the app carries on)
            self._report(Job.CROSSOVER, exc, name, automatic=automatic)
            return
        self.crossover_measured.emit(CrossoverMeasured.of(entry))

    def calibrate(self, request: CalibrationRequest) -> None:
        """Train a codebook on the current model, save it, then load it. A cancel that came
        while this request was still queued cancels it before it starts."""
        with self._calibration.running(request.seq) as cancel:
            self._calibrate(request, cancel)

    def _calibrate(self, request: CalibrationRequest, cancel: threading.Event) -> None:
        if cancel.is_set():
            self.calibration_cancelled.emit()
            return
        if self._model is None:
            self.failed.emit(ErrorReport(Job.CALIBRATE, "Load a model first."))
            return
        start = time.perf_counter()

        def report(stage: str, done: int, total: int) -> None:
            self.progress.emit(Progress(Job.CALIBRATE, stage, int(done), int(total)))

        try:
            self.backend.calibrate(
                self._model,
                self._tokenizer,
                request,
                report,
                cancel,
                self._info.name if self._info is not None else "",
            )
        except Exception as exc:  # noqa: BLE001
            if self.backend.is_cancellation(exc):
                self.calibration_cancelled.emit()
            else:
                self._report(Job.CALIBRATE, exc, request.output)
            return
        self.calibration_finished.emit(
            CalibrationFinished(request.output, time.perf_counter() - start)
        )
        self.load_codebook(request.output, False)

    # ----- generation -------------------------------------------------------------------------

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
        if cancelled:
            self._emit_started(request, None, ())
            self.generation_finished.emit(empty_stats(StopReason.CANCELLED))
            return
        if self._model is None:
            self.failed.emit(ErrorReport(Job.GENERATE, "No model is loaded."))
            self.generation_finished.emit(empty_stats(StopReason.ERROR))
            return
        stats = None
        try:
            config = self._cache_config(request)  # built once: for the session and provenance
            session, reopened = self._prepare_session(request, config)
            limit = self._info.context_length if self._info is not None else None
            fit = self.backend.fit(
                session, request.mode, request.text, context_length=limit, policy=request.overflow
            )
            if fit.overflow:
                overflow = ContextOverflow(
                    request.request_id, fit.prompt_tokens or 0, fit.requested, limit or 0
                )
                self.context_overflowed.emit(overflow)
                self.generation_finished.emit(empty_stats(StopReason.CONTEXT_FULL))
                return
            self._emit_started(request, config, reopened + fit_notes(fit))
            stats = self._stream(session, request)
        except Exception as exc:  # noqa: BLE001
            self._report(Job.GENERATE, exc)
            stats = None
        if stats is None:
            stats = empty_stats(StopReason.ERROR)
        elif self._session is not None:
            self._emit_context(request.request_id, [], streaming=False)
        self.generation_finished.emit(stats)

    def _emit_started(
        self, request: GenerationRequest, config: A2ATSConfig | None, notes: tuple[str, ...]
    ) -> None:
        self.generation_started.emit(
            GenerationStarted(
                request.request_id,
                request.conversation_id,
                request.mode,
                self._provenance(request, config),
                self._notes(request) + notes,
            )
        )

    def _stream(self, session, request: GenerationRequest):
        events = self.backend.reply(
            session, request.mode, request.text, self._prefill_progress(request.request_id)
        )
        with self._lock:
            stopped_early = request.request_id in self._cancelled
        if stopped_early:  # a stop between the start of the request and the reply's start
            self.backend.stop(session)
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
        return stats

    def _prefill_progress(self, request_id: int):
        """The prefill callback of one request: emits PrefillProgress, timed from its first
        call (done 0, before the first chunk)."""
        started = time.perf_counter()

        def progress(_stage: str, done: int, total: int) -> None:
            nonlocal started
            if done == 0:
                started = time.perf_counter()
            seconds = time.perf_counter() - started
            self.prefill_progressed.emit(
                PrefillProgress(request_id, int(done), int(total), seconds)
            )

        return progress

    def _emit_context(self, request_id: int, generated: list[int], *, streaming: bool) -> None:
        session = self._session
        ids = self.backend.context_token_ids(session, streaming=streaming)
        ids = ids + list(generated)  # streaming: the prompt ids do not hold the reply yet
        texts = self._texts.texts(ids) if self._texts is not None else [""] * len(ids)
        messages = tuple(self.backend.session_turns(session))
        self.context_updated.emit(ContextTokens(request_id, tuple(ids), tuple(texts), messages))

    def _cache_config(self, request: GenerationRequest) -> A2ATSConfig | None:
        """The A2ATSConfig for the request (None = plain mlx-lm KVCache)."""
        if not request.cache.a2ats_enabled:
            return None
        config = request.cache.to_config(telemetry=request.telemetry)
        return self.backend.with_crossover(self._model, config, self._codebook)

    def _prepare_session(
        self, request: GenerationRequest, config: A2ATSConfig | None
    ) -> tuple[Any, tuple[str, ...]]:
        """The session, configured for `request` (history, system prompt, sampling, cache);
        the engine keeps its prompt cache where they match (`ChatSession.configure`). Another
        chat than the last one: the last one's cache is kept on disk first, and this one's
        saved cache adopted if it fits. Returns the session and notes for the reply."""
        if self._session is None:
            self._session = self.backend.make_session(self._model, self._tokenizer)
        switching = request.conversation_id != self._session_chat
        notes = self._keep_chat_cache() if switching else ()
        self.backend.configure_session(
            self._session,
            system_prompt=request.system_prompt,
            sampling=request.sampling,
            a2ats=config,
            codebook=self._codebook,
            turns=list(request.history),
        )
        if switching:
            self._session_chat, self._session_keeps = request.conversation_id, request.keep_cache
            if request.keep_cache and request.history:
                note = self.backend.restore_chat_cache(self._session, request.conversation_id)
                notes += (note,) if note else ()
        return self._session, notes

    def _keep_chat_cache(self) -> tuple[str, ...]:
        """Save the session's cache for the chat it holds (when that chat keeps one)."""
        if self._session is None or self._session_chat is None or not self._session_keeps:
            return ()
        note = self.backend.save_chat_cache(self._session, self._session_chat)
        return (note,) if note else ()

    def forget_chat_cache(self, conversation_id: str) -> None:
        """A deleted chat: its saved cache goes, and the session's is not kept for it."""
        if conversation_id == self._session_chat:
            self._session_keeps = False
        try:
            self.backend.forget_chat_cache(conversation_id)
        except OSError as exc:
            self._report(Job.GENERATE, exc)

    @Slot()
    def finish(self) -> None:
        """The last request before the thread ends: keep the chat's cache, then quit."""
        for note in self._keep_chat_cache():  # the window is gone: a line on stderr
            print(f"a2ats-chat: {note}", file=sys.stderr)
        if self.backend is not self.local_backend:
            self.backend.close()  # the ranks on the hosts end with the app
        thread = self.thread()
        if thread is not None:
            thread.quit()

    def _notes(self, request: GenerationRequest) -> tuple[str, ...]:
        if request.cache.a2ats_enabled and self._codebook is None and self._model is not None:
            return (RANDOM_CODEBOOK_NOTE,)
        return ()

    def _provenance(self, request: GenerationRequest, config: A2ATSConfig | None) -> JsonDict:
        return request_provenance(
            request, config, source=self._source, info=self._info, codebook=self._codebook_info
        )

    # ----- errors -----------------------------------------------------------------------------

    def _report(self, task: Job, exc: BaseException, source: str = "", **extra: bool) -> None:
        detail = "".join(traceback.format_exception(exc))
        self.failed.emit(ErrorReport(task, _one_line(exc), detail, source, **extra))


def _ranks_backend(hosts: str) -> EngineBackend:
    """The backend of a model split over the hosts of `hosts` (imported only then: it loads
    the engine's distributed runtime)."""
    from .ranks_backend import RanksBackend

    return RanksBackend(hosts)


class EngineThread(QObject):
    """The "engine" QThread and the EngineWorker on it: starts both, and ends them
    (`shutdown`). Requests do not pass through here: the controller sends them to `worker`
    (its request signal, queued to `EngineWorker.handle`) and connects to the worker's
    signals."""

    # every EngineThread not yet garbage-collected (tests check none is left running)
    live: ClassVar[weakref.WeakSet[EngineThread]] = weakref.WeakSet()
    # threads whose shutdown timed out: kept referenced so Qt never destroys a running QThread
    stuck: ClassVar[list[EngineThread]] = []

    def __init__(
        self,
        backend: EngineBackend | None = None,
        parent: QObject | None = None,
        ranks_backend: Callable[[str], EngineBackend] | None = None,
    ) -> None:
        super().__init__(parent)
        EngineThread.live.add(self)
        self.thread = QThread()
        self.thread.setObjectName("engine")
        self.worker = EngineWorker(backend, ranks_backend)
        self.worker.moveToThread(self.thread)
        self.thread.start()

    def shutdown(self, timeout_ms: int = 10000) -> bool:
        """Stop any reply and every calibration, then end the thread. False when it did not end
        in time: the thread is then kept referenced (`stuck`) instead of destroyed while
        running, which would abort the process."""
        self.worker.close()
        self.worker.stop()
        self.worker.cancel_calibration(ALL)
        self.worker.cancel_crossover(ALL)
        # queued after every request already sent: the chat's cache is kept, then it quits
        QMetaObject.invokeMethod(self.worker, "finish", Qt.ConnectionType.QueuedConnection)
        if self.thread.wait(timeout_ms):
            return True
        if self not in EngineThread.stuck:
            EngineThread.stuck.append(self)
        return False
