"""ChatView: the scrolling transcript of one conversation, with streaming and the transcript
link to the cache inspector (context positions <-> message text).

Position mapping: the worker sends `ContextTokens` (every token id in the session's context,
its decoded text, and the chat messages it encodes) when a reply starts and when it ends;
while it streams, each generated token's text is appended. `ContextMap` concatenates the token
texts and finds each message's content in it, so a context position maps to (message index,
character range in that message's source), which `MarkdownView` maps to rendered text.
Template tokens (role markers, special tokens) map to nothing.
"""

from __future__ import annotations

import contextlib

from PySide6.QtCore import Qt, QTimer, Signal
from PySide6.QtWidgets import (
    QFrame,
    QHBoxLayout,
    QLabel,
    QScrollArea,
    QSizePolicy,
    QVBoxLayout,
    QWidget,
)

from ..context_text import ContextMap
from ..conversations import Conversation, Message
from ..events import ContextTokens
from .message_widget import MessageWidget

MAX_COLUMN_WIDTH = 860
RENDER_INTERVAL_MS = 40


class _EmptyState(QWidget):
    def __init__(self) -> None:
        super().__init__()
        self.setObjectName("EmptyState")
        layout = QVBoxLayout(self)
        layout.addStretch(2)
        title = QLabel("What shall we talk about?")
        title.setObjectName("EmptyTitle")
        title.setAlignment(Qt.AlignmentFlag.AlignCenter)
        text = QLabel(
            "Replies stream from a local model whose KV cache is A2ATS: exact attention over "
            "a recent window, quantized retrieval for everything older.\nOpen the cache "
            "inspector to watch it work. Enter sends, Shift+Enter adds a line."
        )
        text.setObjectName("EmptyText")
        text.setWordWrap(True)
        text.setAlignment(Qt.AlignmentFlag.AlignCenter)
        layout.addWidget(title)
        layout.addSpacing(8)
        layout.addWidget(text)
        layout.addStretch(3)


class ChatView(QWidget):
    """Shows messages; streams a reply; highlights and scrolls to context positions."""

    regenerate_requested = Signal()
    edit_requested = Signal()
    copied = Signal(str)
    version_requested = Signal(int)  # the last reply's earlier (-1) or later (+1) version

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.widgets: list[MessageWidget] = []
        self._busy = False
        self._stream_widget: MessageWidget | None = None
        self._stream_text = ""
        self._render_timer = QTimer(self)
        self._render_timer.setSingleShot(True)
        self._render_timer.setInterval(RENDER_INTERVAL_MS)
        self._render_timer.timeout.connect(self._render_stream)
        self._context_texts: list[str] = []
        self._context_messages: list[tuple[str, str]] = []
        self._context_map: ContextMap | None = None
        self._follow_bottom = True

        self.scroll = QScrollArea()
        self.scroll.setObjectName("ChatScroll")
        self.scroll.setWidgetResizable(True)
        self.scroll.setFrameShape(QFrame.Shape.NoFrame)
        self.scroll.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.scroll.setAccessibleName("Conversation transcript")
        container = QWidget()
        container.setObjectName("ChatContainer")
        row = QHBoxLayout(container)
        row.setContentsMargins(24, 16, 24, 16)
        self.column = QWidget()
        self.column.setMaximumWidth(MAX_COLUMN_WIDTH)
        self.column.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Preferred)
        self.column_layout = QVBoxLayout(self.column)
        self.column_layout.setContentsMargins(0, 0, 0, 0)
        self.column_layout.setSpacing(6)
        self.empty = _EmptyState()
        self.column_layout.addWidget(self.empty)
        self.column_layout.addStretch(1)
        row.addStretch(1)
        row.addWidget(self.column, 100)
        row.addStretch(1)
        self.scroll.setWidget(container)
        bar = self.scroll.verticalScrollBar()
        bar.rangeChanged.connect(self._on_range_changed)
        bar.valueChanged.connect(self._on_scrolled)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addWidget(self.scroll)

    # ----- messages --------------------------------------------------------------------------

    def set_conversation(self, conversation: Conversation | None) -> None:
        """Show `conversation` (None = empty)."""
        self._render_timer.stop()
        self._stream_widget = None
        for widget in self.widgets:
            widget.setParent(None)
            widget.deleteLater()
        self.widgets = []
        self.clear_context()
        for message in conversation.messages if conversation else []:
            self._add_widget(message)
        self._update_actions()
        self._follow_bottom = True
        QTimer.singleShot(0, self, self.scroll_to_bottom)

    def _add_widget(self, message: Message) -> MessageWidget:
        widget = MessageWidget(message)
        widget.regenerate_clicked.connect(self.regenerate_requested)
        widget.edit_clicked.connect(self.edit_requested)
        widget.copied.connect(self.copied)
        widget.version_requested.connect(self.version_requested)
        self.column_layout.insertWidget(self.column_layout.count() - 1, widget)
        self.widgets.append(widget)
        self.empty.setVisible(False)
        return widget

    def add_message(self, message: Message) -> MessageWidget:
        widget = self._add_widget(message)
        self._follow_bottom = True
        self._update_actions()
        return widget

    def remove_last(self) -> None:
        if self.widgets:
            widget = self.widgets.pop()
            widget.setParent(None)
            widget.deleteLater()
        self.empty.setVisible(not self.widgets)
        self._update_actions()

    def set_busy(self, busy: bool) -> None:
        """While busy (a reply in flight) regenerate/edit are hidden."""
        self._busy = busy
        self._update_actions()

    def _update_actions(self) -> None:
        last_user = max((i for i, w in enumerate(self.widgets) if w.is_user), default=None)
        last = len(self.widgets) - 1
        for i, widget in enumerate(self.widgets):
            can_regenerate = not self._busy and i == last and not widget.is_user
            widget.set_actions(
                can_edit=not self._busy and i == last_user, can_regenerate=can_regenerate
            )
            if not widget.is_user:
                versions = [*widget.message.alternatives, widget.message]
                ordered = sorted(versions, key=lambda m: m.created)
                number = next(n for n, m in enumerate(ordered, 1) if m is widget.message)
                widget.set_versions(number, len(ordered), can_regenerate)
        self.empty.setVisible(not self.widgets)

    # ----- streaming -------------------------------------------------------------------------

    def begin_stream(self, message: Message) -> MessageWidget:
        """Add the assistant message that is about to stream."""
        widget = self.add_message(message)
        self._stream_widget = widget
        self._stream_text = message.content
        widget.set_content(self._stream_text, streaming=True)
        widget.set_streaming(True)
        return widget

    def set_stream_note(self, text: str) -> None:
        """A line under the streaming reply (the prompt prefill's progress); "" hides it."""
        if self._stream_widget is not None and self._stream_widget.note.text() != text:
            self._stream_widget.set_note(text)

    def append_stream_text(self, text: str) -> None:
        """Add streamed text; the render is throttled so long replies stay cheap."""
        if self._stream_widget is None:
            return
        if not self._stream_text:
            self.set_stream_note("")  # the prefill is over
        self._stream_text += text
        if not self._render_timer.isActive():
            self._render_timer.start()

    def stream_text(self) -> str:
        return self._stream_text

    def _render_stream(self) -> None:
        if self._stream_widget is not None:
            self._stream_widget.set_content(self._stream_text, streaming=True)

    def end_stream(self, content: str, provenance: dict | None, note: str = "") -> None:
        """Finish the streamed reply with its final text and provenance."""
        self._render_timer.stop()
        widget = self._stream_widget
        self._stream_widget = None
        if widget is None:
            return
        widget.set_streaming(False)
        widget.set_content(content)
        widget.set_provenance(provenance)
        widget.set_note("")  # the prefill's progress, if the reply ended during it
        if note:
            widget.set_note(note, error=True)
        self._update_actions()

    def last_widget(self) -> MessageWidget | None:
        return self.widgets[-1] if self.widgets else None

    # ----- scrolling -------------------------------------------------------------------------

    def scroll_to_bottom(self) -> None:
        bar = self.scroll.verticalScrollBar()
        bar.setValue(bar.maximum())

    def _on_scrolled(self, value: int) -> None:
        bar = self.scroll.verticalScrollBar()
        self._follow_bottom = value >= bar.maximum() - 48

    def _on_range_changed(self, _min: int, maximum: int) -> None:
        if self._follow_bottom:
            self.scroll.verticalScrollBar().setValue(maximum)

    # ----- context positions (transcript link) ----------------------------------------------

    def clear_context(self) -> None:
        self._context_texts, self._context_messages, self._context_map = [], [], None
        for widget in self.widgets:
            widget.view.highlight_source_ranges([])

    def set_context(self, context: ContextTokens) -> None:
        """Adopt the worker's view of the context (positions = indices of `context.texts`)."""
        self._context_texts = list(context.texts)
        self._context_messages = list(context.messages)
        self._context_map = None

    def append_context_token(self, text: str) -> None:
        """A generated token entered the context (streaming); its text extends the reply."""
        if not self._context_messages:
            return
        self._context_texts.append(text)
        role, content = self._context_messages[-1]
        if role == "assistant":
            self._context_messages[-1] = (role, content + text)
        else:
            self._context_messages.append(("assistant", text))
        self._context_map = None

    def context_texts(self) -> list[str]:
        return list(self._context_texts)

    def context_map(self) -> ContextMap:
        if self._context_map is None:
            self._context_map = ContextMap(self._context_texts, self._context_messages)
        return self._context_map

    def _message_offset(self) -> int:
        """Index of the first displayed widget that context message 0 corresponds to (the
        context may encode fewer messages than are shown, e.g. after a failed reply)."""
        return max(0, len(self.widgets) - len(self._context_messages))

    def highlight_positions(self, positions) -> None:
        """Highlight the text of the given context positions (empty = clear)."""
        by_message: dict[int, list[tuple[int, int]]] = {}
        if len(positions) and self._context_texts:
            for span in self.context_map().spans([int(p) for p in positions]):
                by_message.setdefault(span.message, []).append((span.start, span.end))
        offset = self._message_offset()
        for i, widget in enumerate(self.widgets):
            widget.view.highlight_source_ranges(by_message.get(i - offset, []))

    def scroll_to_position(self, position: int) -> bool:
        """Scroll so the token at context `position` is visible and flash it. False if the
        position is a template token or outside the context."""
        if not self._context_texts:
            return False
        span = self.context_map().locate(int(position))
        index = None if span is None else span.message + self._message_offset()
        if span is None or not 0 <= index < len(self.widgets):
            return False
        widget = self.widgets[index]
        doc_position = widget.view.flash_source_range(span.start, span.end)
        if doc_position is None:
            return False
        cursor = widget.view.textCursor()
        cursor.setPosition(doc_position)
        rect = widget.view.cursorRect(cursor)
        point = widget.view.viewport().mapTo(self.scroll.widget(), rect.center())
        self._follow_bottom = False
        self.scroll.ensureVisible(point.x(), point.y(), 0, self.scroll.viewport().height() // 3)
        QTimer.singleShot(1500, widget, lambda w=widget: _clear_flash(w))
        return True


def _clear_flash(widget: MessageWidget) -> None:
    with contextlib.suppress(RuntimeError):  # the widget is gone (conversation switched)
        widget.view.clear_flash()
