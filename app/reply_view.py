"""ReplyView: shows the controller's reply in progress in the chat view, the status bar and the
inspector's token strip, and the loaded model's layer plan in both (bindings only; the reply's
state lives in `ChatController.reply`)."""

from __future__ import annotations

import time

from PySide6.QtCore import QObject, Signal

from a2ats_engine.cache.telemetry import CacheSnapshot, GenerationStats
from a2ats_engine.progress import prefill_text

from .chat.chat_view import ChatView
from .controller import ChatController, ReplyEnded, ReplyInProgress
from .events import ContextTokens, GenerationStarted, PrefillProgress, ReplyMode, StopReason
from .inspector.data import attention_mode_text
from .status_bar import StatusBar


class ReplyView(QObject):
    """Binds the controller's reply signals to the widgets that show a reply."""

    changed = Signal()  # a reply started or ended: the window refreshes its chrome
    restore_requested = Signal(object)  # Conversation to show again (the old reply is back)
    finished = Signal(object)  # GenerationStats, after the reply is shown

    def __init__(
        self, controller: ChatController, chat_view: ChatView, status: StatusBar, inspector
    ) -> None:
        super().__init__(chat_view)
        self.controller, self.chat_view, self.status, self.inspector = (
            controller,
            chat_view,
            status,
            inspector,
        )
        controller.reply_started.connect(self._on_reply_started)
        controller.reply_text_added.connect(self._on_reply_text)
        controller.prefill_progressed.connect(self._on_prefill)
        controller.context_updated.connect(self._on_context)
        controller.reply_ended.connect(self._on_reply_ended)
        controller.model_loaded.connect(self.show_plan)
        controller.settings_changed.connect(self._on_settings_changed)
        controller.snapshot_ready.connect(self._on_snapshot)
        if inspector is not None:
            controller.snapshot_ready.connect(inspector.on_snapshot)
            controller.snapshot_ready.connect(self._on_fidelity_cost)
            controller.generation_started.connect(self._on_inspector_started)
            controller.generation_finished.connect(self._on_inspector_finished)
            self.update_fidelity_info()

    def _on_settings_changed(self, changed: frozenset[str]) -> None:
        if "cache" in changed:  # A2ATS on or off, the fidelity pass's interval
            self.update_fidelity_info()
            self.show_plan()

    def show_plan(self, _loaded: object = None) -> None:
        """The loaded model's layer plan in the status bar ("A2ATS on 5 of 26 layers", or "A2ATS
        off") and the inspector (its native layers as grey rows)."""
        model = self.controller.model
        plan = model.info.layer_plan if model is not None else None
        self.status.set_plan(plan, self.controller.settings.cache.a2ats_enabled)
        if self.inspector is not None:
            self.inspector.set_layer_plan(plan)

    def update_fidelity_info(self, cost_ms: float | None = None) -> None:
        """Tell the inspector whether the fidelity shadow pass runs (settings) and its cost."""
        if self.inspector is None:
            return
        every = self.controller.settings.cache.config.fidelity_every
        self.inspector.set_fidelity_info(every > 0, every=every or None, cost_ms=cost_ms)

    def _on_fidelity_cost(self, snapshot: CacheSnapshot) -> None:
        """Show what the last shadow pass cost (summed over layers), when a step ran one."""
        costs = [layer.recall_ms for layer in snapshot.layers if layer.recall_ms is not None]
        if costs:
            self.update_fidelity_info(sum(costs))

    def _on_inspector_started(self, _started: GenerationStarted) -> None:
        self.inspector.on_generation_started()

    def _on_inspector_finished(self, _stats: GenerationStats) -> None:
        self.inspector.on_generation_finished()

    def _context_limit(self) -> int | None:
        model = self.controller.model
        return model.info.context_length if model is not None else None

    def _on_reply_started(self, reply: ReplyInProgress) -> None:
        if reply.conversation is self.controller.current:
            messages = reply.conversation.messages
            if reply.replaces is not None:
                self.chat_view.remove_last()
            elif reply.request.mode == ReplyMode.SEND and reply.before == messages[:-1]:
                self.chat_view.add_message(messages[-1])
            else:
                self.chat_view.set_conversation(reply.conversation)
            self.chat_view.begin_stream(reply.message)
        self.chat_view.set_busy(True)
        self.changed.emit()

    def _on_prefill(self, progress: PrefillProgress) -> None:
        """A long prompt's prefill: tokens done / total and the time left, under the reply."""
        self.chat_view.set_stream_note(
            prefill_text(progress.done, progress.total, progress.seconds)
        )

    def _on_reply_text(self, text: str) -> None:
        reply = self.controller.reply
        if reply.tokens == 1:
            self.status.set_stats(reply.first_token_at - reply.started_at, None, None)
        self.chat_view.append_stream_text(text)
        self.chat_view.append_context_token(text)
        elapsed = time.perf_counter() - reply.first_token_at
        if reply.tokens > 1 and elapsed > 0 and reply.tokens % 4 == 0:
            self.status.speed.setText(f"{(reply.tokens - 1) / elapsed:.1f} tok/s")
            self.status.set_context(len(self.chat_view.context_texts()), self._context_limit())
            if self.inspector is not None:
                self.inspector.set_context_tokens(self.chat_view.context_texts())

    def _on_snapshot(self, snapshot: CacheSnapshot) -> None:
        if self.controller.reply is not None:
            native = snapshot.native_bytes  # native layers hold the same either way
            held, fp16 = snapshot.bytes_held + native, snapshot.bytes_fp16 + native
            self.status.set_cache(held, fp16, True, snapshot.codebook_bytes, snapshot.bytes_on_disk)
            self.status.set_attention(attention_mode_text(snapshot))

    def _on_context(self, context: ContextTokens) -> None:
        self.chat_view.set_context(context)
        if self.inspector is not None:
            self.inspector.set_context_tokens(list(context.texts))

    def _on_reply_ended(self, ended: ReplyEnded) -> None:
        stats, message = ended.stats, ended.message
        if ended.conversation is self.controller.current:
            if message is not None:
                self.chat_view.end_stream(message.content, message.provenance, ended.note)
            else:
                self.chat_view.end_stream("", None)
                self.chat_view.remove_last()
                if ended.restored:
                    self.restore_requested.emit(ended.conversation)
                elif ended.note and self.chat_view.last_widget() is not None:
                    self.chat_view.last_widget().set_note(ended.note, error=True)
        self.chat_view.set_busy(False)
        self.changed.emit()
        self.status.set_context(stats.context_tokens, self._context_limit())
        if stats.stop_reason != StopReason.ERROR and message is not None:
            self.status.set_stats(
                stats.time_to_first_token, stats.generation_tps, stats.peak_memory_gb
            )
            cache = (message.provenance or {}).get("cache") or {}
            a2ats = bool(cache.get("a2ats_enabled"))
            self.status.set_cache(
                stats.cache_bytes, None, a2ats, stats.codebook_bytes, stats.cache_disk_bytes
            )
        self.finished.emit(stats)
