"""ChatController: the app's model. Owns the engine thread, the settings, the conversations and
the current one, the reply in progress and the task the engine is busy with; emits past-tense
signals, and is the views' only event source (it re-emits the engine's snapshots and the start
and end of every request). Settings change through `change_settings` (`settings_changed`).

No widgets: `MainWindow` (main_window.py) binds widgets to these signals and methods, and tests
drive the controller alone (tests/app/test_controller.py). Every engine request is a record
(`events.EngineRequest`) the controller sends straight to the worker on the "engine" thread (its
request signal, queued to `EngineWorker.handle`); only stop and the cancels are direct calls, and
they end in the engine's own cancel (`ChatSession.stop`, the calibration's cancel event).
Saving never stops the app: a failed write is reported as an ErrorReport with task "save", and
the reply, the composer and shutdown carry on.

Its parts: the model, codebook, demo, calibration and crossover jobs are `ModelJobs`
(model_jobs.py), a reply's own bookkeeping is `ReplyInProgress` (replies.py).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import fields, replace
from typing import Any

from PySide6.QtCore import QObject, Qt, Signal

from a2ats_engine.cache.telemetry import GenerationStats, TokenEvent

from . import replies
from .conversations import Conversation, HistoryStore, Message, title_from_text
from .events import (
    CodebookLoaded,
    ContextOverflow,
    ContextTokens,
    EngineRequest,
    ErrorReport,
    ForgetChatCache,
    GenerationRequest,
    GenerationStarted,
    ModelLoaded,
    OverflowPolicy,
    PrefillProgress,
    ReplyMode,
    StopReason,
)
from .instance_lock import InstanceLock
from .model_jobs import ModelJobs, Task
from .replies import ReplyEnded, ReplyInProgress
from .settings import FIELD_TYPES, AppSettings, save_settings
from .worker import EngineThread

__all__ = ["READ_ONLY", "SAVE", "ChatController", "ReplyEnded", "ReplyInProgress", "Task"]

SAVE = "save"  # ErrorReport.task of a failed write of a chat or the settings
READ_ONLY = (
    "Another A2ATS Chat has this data folder open: this window is read-only "
    "(nothing is sent or saved here)"
)


class ChatController(ModelJobs, QObject):
    """The chat app without its widgets (see the module docstring)."""

    task_changed = Signal(object)  # Task
    model_loaded = Signal(object)  # ModelLoaded, after the controller adopted it
    codebook_loaded = Signal(object)  # CodebookLoaded
    codebook_cleared = Signal()
    demo_missing = Signal()  # the demo model is not fetched: ask before fetching it
    progress = Signal(object)  # Progress
    error_reported = Signal(object)  # ErrorReport
    notice = Signal(str, int)  # a status line and how long to show it (ms)
    current_changed = Signal(object)  # Conversation: now shown (or re-shown after an undo)
    conversations_changed = Signal()  # the list, a title or an order changed
    reply_started = Signal(object)  # ReplyInProgress
    reply_text_added = Signal(str)  # text streamed into the current chat's reply
    prefill_progressed = Signal(object)  # PrefillProgress of the current chat's reply
    context_updated = Signal(object)  # ContextTokens of the current chat's reply
    context_overflowed = Signal(object)  # ContextOverflow: call resolve_overflow()
    reply_ended = Signal(object)  # ReplyEnded, after the conversation was saved
    calibration_finished = Signal(object)  # CalibrationFinished
    calibration_cancelled = Signal()
    crossover_measured = Signal(object)  # CrossoverMeasured
    settings_changed = Signal(object)  # frozenset[str]: the AppSettings fields that changed
    # The engine's own events the views show, re-emitted here so no view reaches the worker:
    generation_started = Signal(object)  # GenerationStarted (every request, any chat)
    snapshot_ready = Signal(object)  # CacheSnapshot, after each decode step with telemetry on
    generation_finished = Signal(object)  # GenerationStats (every request, also a refused one)
    # Requests to the engine: an EngineRequest, queued to the worker's `handle` slot.
    _request_sent = Signal(object)

    def __init__(
        self,
        settings: AppSettings,
        *,
        engine: EngineThread | None = None,
        store: HistoryStore | None = None,
        settings_path=None,
    ) -> None:
        super().__init__()
        self.settings = settings
        self.settings_path = settings_path
        self.store = store if store is not None else HistoryStore()
        self.engine = engine if engine is not None else EngineThread()
        self.telemetry = False  # per-step telemetry for the next request (set_telemetry)
        self.conversations: list[Conversation] = []
        self.current: Conversation | None = None
        self.model: ModelLoaded | None = None
        self.codebook: CodebookLoaded | None = None
        self.reply: ReplyInProgress | None = None
        self._job = Task.IDLE  # the engine job other than a reply
        self._overflow_choice: dict[str, OverflowPolicy] = {}
        self._failed: dict[str, str] = {}  # file key (chat id, "settings") -> its failure
        self._requests = 0  # the id of the last GenerationRequest sent
        self._calibrations = 0  # the number of the last calibration sent (model_jobs.py)
        self._crossovers = 0  # the number of the last crossover measurement sent (model_jobs.py)
        self.lock = InstanceLock(self.store.folder)
        self.read_only = False  # another instance holds the data folder (see load_history)
        # Writes nothing (no chat, no settings): a scripted run's temporary chat leaves no trace.
        self.ephemeral = False
        self._connect()

    def _connect(self) -> None:
        worker = self.engine.worker
        self._request_sent.connect(worker.handle, Qt.ConnectionType.QueuedConnection)
        worker.model_loaded.connect(self._on_model_loaded)
        worker.crossover_measured.connect(self.crossover_measured)
        worker.codebook_loaded.connect(self._on_codebook_loaded)
        worker.codebook_cleared.connect(self._on_codebook_cleared)
        worker.demo_found.connect(self._on_demo_found)
        worker.demo_fetched.connect(self._on_demo_fetched)
        worker.progress.connect(self.progress)
        worker.failed.connect(self._on_failed)
        worker.generation_started.connect(self._on_generation_started)
        worker.token_generated.connect(self._on_token)
        worker.prefill_progressed.connect(self._on_prefill_progress)
        worker.context_updated.connect(self._on_context)
        worker.context_overflowed.connect(self._on_context_overflowed)
        worker.generation_finished.connect(self._on_generation_finished)
        worker.calibration_finished.connect(self._on_calibration_finished)
        worker.calibration_cancelled.connect(self._on_calibration_cancelled)
        # Relayed after the controller's own handlers (signal to signal: queued to this thread).
        worker.generation_started.connect(self.generation_started)
        worker.snapshot_ready.connect(self.snapshot_ready)
        worker.generation_finished.connect(self.generation_finished)

    def _send(self, request: EngineRequest) -> None:
        """Queue `request` to the worker (it runs on the engine thread, after those before it)."""
        self._request_sent.emit(request)

    # ----- state ------------------------------------------------------------------------------

    @property
    def task(self) -> Task:
        return Task.GENERATING if self.reply is not None else self._job

    def _set_job(self, job: Task) -> None:
        self._job = job
        self.task_changed.emit(self.task)

    def ready_reason(self) -> str:
        """Why a message cannot be sent now ("" = it can)."""
        reasons = {
            Task.LOADING: "Loading the model\u2026",
            Task.FETCHING: "Fetching the demo model\u2026",
            Task.CALIBRATING: "Calibrating a codebook\u2026",
        }
        if self._job in reasons:
            return reasons[self._job]
        if self.read_only:
            return READ_ONLY
        return "Choose a model to start chatting" if self.model is None else ""

    def reply_is_current(self) -> bool:
        return self.reply is not None and self.reply.conversation is self.current

    def find(self, conversation_id: str) -> Conversation | None:
        return next((c for c in self.conversations if c.id == conversation_id), None)

    # ----- settings ---------------------------------------------------------------------------

    def change_settings(self, *, save: bool = True, **values: Any) -> frozenset[str]:
        """Set `AppSettings` fields (by name) and, with `save`, write the settings file (also
        when nothing changed: the file then holds what is in memory). Emits `settings_changed`
        with the names whose value changed, and returns them."""
        known = {f.name for f in fields(self.settings)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ValueError(f"AppSettings has no field {', '.join(unknown)}")
        for name, value in values.items():
            check, expected = FIELD_TYPES[name]
            if not check(value):  # the same checks as a settings file's (settings.py)
                raise ValueError(f"AppSettings.{name}={value!r} must be {expected}")
        changed = frozenset(k for k, v in values.items() if getattr(self.settings, k) != v)
        for name in changed:
            setattr(self.settings, name, values[name])
        if save:
            self.save_settings()
        if changed:
            self.settings_changed.emit(changed)
        if "cache" in changed:
            self._measure_new_settings()
        return changed

    def _measure_new_settings(self) -> None:
        """New A2ATS settings can change what a retrieval step costs (the estimate, the budget,
        the rerank, the K/V precision): the crossover measured for the old ones does not apply
        (`crossover.step_kind`), so measure it for the new ones as on a first load (only where
        none is recorded for them; never in a scripted run, nor across hosts)."""
        loaded = self.model
        if loaded is None or loaded.hosts or not self.settings.cache.a2ats_enabled:
            return
        if self.auto_measure_crossover():
            self._measure(loaded.source, automatic=True)

    def set_telemetry(self, enabled: bool) -> None:
        """Per-step telemetry for the requests that follow (it costs a host sync per decode
        step: the window turns it on while the inspector can show it)."""
        self.telemetry = bool(enabled)

    # ----- saving -----------------------------------------------------------------------------

    def save(self, conversation: Conversation) -> bool:
        """Write a chat (an empty new chat only once it has a message or a draft). A failed
        write is reported once per run of failures and never raised."""
        if self.read_only or not self.store.changed(conversation):
            return True
        if (
            not conversation.messages
            and not conversation.draft
            and not self.store.path_for(conversation.id).exists()
        ):
            return True
        conversation.touch()
        return self._write(
            lambda: self.store.save(conversation),
            f"chat \u201c{conversation.title}\u201d",
            conversation.id,
        )

    def save_settings(self) -> bool:
        if self.read_only:
            return True
        return self._write(
            lambda: save_settings(self.settings, self.settings_path), "settings", "settings"
        )

    def _write(self, write: Callable[[], None], what: str, key: str) -> bool:
        """Run `write`; a failure is reported once per run of failures of the same file
        (`key`), so a failing settings file never hides a failing chat, and is remembered
        until that file is written again (`unsaved`)."""
        if self.ephemeral:
            return True
        try:
            write()
        except (OSError, ValueError) as exc:  # ValueError: text UTF-8 cannot encode
            reason = exc.strerror if isinstance(exc, OSError) else None
            message = f"Could not save {what}: {reason or exc}"
            if key not in self._failed:
                self.error_reported.emit(ErrorReport(SAVE, message, source=what))
            self._failed[key] = message
            return False
        self._failed.pop(key, None)
        return True

    def unsaved(self) -> list[str]:
        """One line per file whose last write failed (what would be lost on quit)."""
        return list(self._failed.values())

    # ----- conversations ----------------------------------------------------------------------

    def load_history(self) -> None:
        """Take the data folder's lock (read-only without it: another instance writes there),
        read every chat and show the last one used (or a new one)."""
        self.read_only = not self.lock.acquire()
        if self.read_only:
            self.notice.emit(READ_ONLY, 0)
        self.conversations = self.store.load_all()
        if self.store.skipped:
            skipped = self.store.skipped
            first = skipped[0]
            named = f"{first} ({self.store.reasons.get(first, 'unreadable')[:120]})"
            more = f" and {len(skipped) - 1} more" if len(skipped) > 1 else ""
            self.notice.emit(
                f"Skipped {len(skipped)} unreadable conversation file(s): {named}{more}", 10000
            )
        wanted = self.settings.last_conversation_id
        current = self.find(wanted) if wanted else None
        if current is None and self.conversations:
            current = self.conversations[0]
        self._show(current if current is not None else self._new_conversation())

    def _new_conversation(self) -> Conversation:
        conversation = Conversation(system_prompt=self.settings.default_system_prompt)
        self.conversations.insert(0, conversation)
        return conversation

    def _show(self, conversation: Conversation) -> None:
        self.current = conversation
        self.settings.last_conversation_id = conversation.id
        self.current_changed.emit(conversation)
        self.conversations_changed.emit()

    def keep_draft(self, text: str) -> None:
        """Remember the composer's unsent text for the current chat (written when it changed)."""
        current = self.current
        if current is not None and current.draft != text:
            current.draft = text
            self.save(current)

    def new_chat(self) -> None:
        if self.current is not None and not self.current.messages:
            self._show(self.current)  # reuse the empty chat
        else:
            self._show(self._new_conversation())

    def select(self, conversation_id: str) -> None:
        conversation = self.find(conversation_id)
        if conversation is not None and conversation is not self.current:
            self._show(conversation)

    def rename(self, conversation_id: str, title: str) -> None:
        conversation = self.find(conversation_id)
        if conversation is None or conversation.title == title:
            return
        conversation.title = title
        self.save(conversation)
        self.conversations_changed.emit()

    def delete(self, conversation_id: str) -> None:
        """Delete a chat (stopping its reply if it is streaming)."""
        conversation = self.find(conversation_id)
        if conversation is None:
            return
        if self.read_only:
            self.notice.emit(READ_ONLY, 10000)
            return
        if self.reply is not None and self.reply.conversation is conversation:
            self.stop()
        try:
            self.store.delete(conversation.id)
        except OSError as exc:
            self.error_reported.emit(ErrorReport(SAVE, f"Could not delete the chat: {exc}"))
            return
        self.conversations.remove(conversation)
        self._send(ForgetChatCache(conversation.id))  # its saved cache goes with it
        if conversation is self.current:
            self._show(self.conversations[0] if self.conversations else self._new_conversation())
        else:
            self.conversations_changed.emit()

    def versions(self) -> tuple[int, int]:
        """(number of the shown version, how many there are) of the current chat's last
        reply (`replies.versions`)."""
        return replies.versions(self.current)

    def show_version(self, step: int) -> bool:
        """Make the version `step` away (-1 earlier, +1 later) the current chat's last reply;
        the one shown becomes an alternative. Saved; False when there is no such version or
        a reply is in flight."""
        conversation = self.current
        if conversation is None or self.reply is not None:
            return False
        if not replies.show_version(conversation, step):
            return False
        self.save(conversation)
        self.current_changed.emit(conversation)
        return True

    def set_system_prompt(self, text: str) -> None:
        if self.current is not None:
            self.current.system_prompt = text

    def save_current(self) -> None:
        if self.current is not None:
            self.save(self.current)

    # ----- replies ----------------------------------------------------------------------------

    def send(self, text: str) -> bool:
        """Send a new user message in the current chat; False when it cannot be sent now."""
        conversation = self.current
        if conversation is None or self.model is None or self.task != Task.IDLE or self.read_only:
            return False
        history = conversation.chat_messages()
        before = list(conversation.messages)
        conversation.messages.append(Message("user", text))
        if len(conversation.messages) == 1 and conversation.title == "New chat":
            conversation.title = title_from_text(text)
        conversation.draft = ""
        self.save(conversation)
        self._start_reply(conversation, ReplyMode.SEND, text, history, before=before)
        return True

    def regenerate(self) -> bool:
        """Answer the last user message again; the old reply stays until the new one has text."""
        conversation = self.current
        if conversation is None or self.model is None or self.task != Task.IDLE or self.read_only:
            return False
        last_user = conversation.last_index("user")
        if last_user is None:
            return False
        if conversation.messages[-1].role == "assistant":
            history = conversation.chat_messages()
            replaces = conversation.messages[-1]
            self._start_reply(conversation, ReplyMode.REGENERATE, "", history, replaces)
        else:  # the last reply failed or was removed: answer the dangling user message
            text = conversation.messages[last_user].content
            history = [m.as_chat() for m in conversation.messages[:last_user]]
            before = list(conversation.messages)
            del conversation.messages[last_user + 1 :]
            self._start_reply(conversation, ReplyMode.SEND, text, history, before=before)
        return True

    def resend_edited(self, text: str) -> bool:
        """Replace the last user message with `text` (dropping what followed) and answer it."""
        conversation = self.current
        if conversation is None or self.model is None or self.task != Task.IDLE or self.read_only:
            return False
        index = conversation.last_index("user")
        if index is None:
            return self.send(text)
        history = conversation.chat_messages()
        before = list(conversation.messages)
        edited = replace(conversation.messages[index], content=text, created=time.time())
        conversation.messages[index:] = [edited]
        conversation.draft = ""
        self.save(conversation)
        self._start_reply(conversation, ReplyMode.EDIT, text, history, before=before)
        return True

    def _start_reply(
        self,
        conversation: Conversation,
        mode: ReplyMode,
        text: str,
        history: list[dict[str, str]],
        replaces: Message | None = None,
        before: list[Message] | None = None,
    ) -> None:
        # A reply comes first: a measurement running or still queued ends now.
        self.engine.worker.cancel_crossover(self._crossovers)
        request = GenerationRequest(
            request_id=self._next_request_id(),
            conversation_id=conversation.id,
            mode=mode,
            text=text,
            history=tuple((m["role"], m["content"]) for m in history),
            system_prompt=conversation.system_prompt,
            sampling=self.settings.sampling_for(self.model.info if self.model else None),
            cache=self.settings.cache,
            telemetry=self.telemetry,
            overflow=self._overflow_choice.get(conversation.id, OverflowPolicy.ASK),
            keep_cache=not self.ephemeral,
        )
        self.reply = ReplyInProgress(
            request, conversation, Message("assistant", ""), replaces, before
        )
        if before is not None and before[-1:] != conversation.messages[-1:]:
            self.reply.draft_back = text  # a new or edited message, not a dangling one
        self.reply_started.emit(self.reply)
        self.task_changed.emit(self.task)
        self._send(request)

    def _next_request_id(self) -> int:
        self._requests += 1
        return self._requests

    def stop(self) -> None:
        """Stop the reply in flight (the engine's stop, a direct call into the worker)."""
        if self.reply is not None:
            self.engine.worker.stop(self.reply.request.request_id)
            self.notice.emit("Stopping\u2026", 2000)

    def resolve_overflow(self, policy: OverflowPolicy | None) -> None:
        """The user's answer to `context_overflowed`: generate with `policy` (remembered for
        this chat), or with None give up: the message goes back into the composer."""
        reply = self.reply
        if reply is None or reply.overflow is None:
            return
        reply.overflow = None
        if policy is not None and policy != OverflowPolicy.ASK:
            self._overflow_choice[reply.conversation.id] = policy
            reply.request = replace(
                reply.request, request_id=self._next_request_id(), overflow=policy
            )
            self._send(reply.request)
            return
        self.reply = None
        conversation = reply.conversation
        reply.give_up()
        self.save(conversation)
        self.task_changed.emit(self.task)
        stats = GenerationStats(0, 0, 0.0, 0.0, 0.0, 0.0, str(StopReason.CANCELLED))
        self.reply_ended.emit(ReplyEnded(conversation, None, stats, restored=True))

    def _on_generation_started(self, started: GenerationStarted) -> None:
        if self.reply is None or started.request_id != self.reply.request.request_id:
            return
        self.reply.started = started
        for note in started.notes:
            self.notice.emit(note, 10000)

    def _on_prefill_progress(self, progress: PrefillProgress) -> None:
        reply = self.reply
        if reply is None or progress.request_id != reply.request.request_id:
            return
        reply.prefill = progress
        if self.reply_is_current():
            self.prefill_progressed.emit(progress)

    def _on_token(self, event: TokenEvent) -> None:
        reply = self.reply
        if reply is None:
            return
        due = reply.add_token(event.text, time.perf_counter())
        if self.reply_is_current():
            self.reply_text_added.emit(event.text)
        if due:
            self._checkpoint(reply)

    def _checkpoint(self, reply: ReplyInProgress) -> None:
        """Write the chat with the partial reply marked interrupted, so a kill loses nothing."""
        snapshot = reply.checkpoint(time.perf_counter())
        if reply.conversation not in self.conversations:
            return
        self._write(
            lambda: self.store.save(snapshot),
            f"chat \u201c{reply.conversation.title}\u201d",
            reply.conversation.id,
        )

    def _on_context(self, context: ContextTokens) -> None:
        reply = self.reply
        if reply is None or context.request_id != reply.request.request_id:
            return
        if context.messages and context.messages[-1][0] == "assistant":
            reply.text = context.messages[-1][1]  # the session's own copy is authoritative
        if self.reply_is_current():
            self.context_updated.emit(context)

    def _on_context_overflowed(self, overflow: ContextOverflow) -> None:
        if self.reply is not None and overflow.request_id == self.reply.request.request_id:
            self.reply.overflow = overflow

    def _on_generation_finished(self, stats: GenerationStats) -> None:
        reply = self.reply
        if reply is None:
            return
        if stats.stop_reason == StopReason.CONTEXT_FULL and reply.overflow is not None:
            self.context_overflowed.emit(reply.overflow)  # the reply waits for the answer
            return
        self.reply = None
        conversation = reply.conversation
        message = reply.finish(stats)
        restored = message is None and reply.replaces is not None
        note = f"Reply failed: {reply.error}" if stats.stop_reason == StopReason.ERROR else ""
        if conversation in self.conversations:  # not deleted while the reply streamed
            self.save(conversation)
        self.task_changed.emit(self.task)
        if stats.stop_reason == StopReason.CANCELLED:
            self.notice.emit("Stopped", 3000)
        self.reply_ended.emit(ReplyEnded(conversation, message, stats, note, restored))

    # ----- shutdown ---------------------------------------------------------------------------

    def save_before_quit(self, draft: str = "") -> list[str]:
        """Save the current chat (with its draft), a reply still streaming (marked interrupted)
        and the settings. Returns `unsaved()`: what a quit now would lose."""
        if self.current is not None:
            self.current.draft = draft
            self.settings.last_conversation_id = self.current.id
            self.save(self.current)
        if self.reply is not None and self.reply.text:  # closed mid-reply: keep the part
            self._checkpoint(self.reply)
        self.save_settings()
        return self.unsaved()

    def shutdown(self, draft: str = "", timeout_ms: int = 10000, *, saved: bool = False) -> bool:
        """Save as `save_before_quit` does (unless `saved`: the caller just did), release the
        data folder and end the engine thread whatever the saves did. False when the thread
        did not end in time."""
        try:
            if not saved:
                self.save_before_quit(draft)
        finally:
            self.lock.release()
            ended = self.engine.shutdown(timeout_ms)
        return ended
