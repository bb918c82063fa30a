"""One chat message: a role header, the rendered Markdown, stats/provenance and actions."""

from __future__ import annotations

import json
import time

from PySide6.QtCore import QSize, Qt, Signal
from PySide6.QtWidgets import (
    QFrame,
    QHBoxLayout,
    QLabel,
    QSizePolicy,
    QToolButton,
    QVBoxLayout,
    QWidget,
)

from ..conversations import Message, attention_label, number
from ..elided_label import ElidedLabel
from ..inert_text import plain_labels, rich_from_plain
from ..theme import bind_icon
from .markdown_view import MarkdownView

STREAM_CURSOR = " \u258d"  # shown at the end of a reply while it streams
# Laying out text costs time in proportion to its length (and far more for long unbroken
# lines): a message renders at most this many characters until "Show more" / "Show all".
RENDER_LIMIT = 20_000


def stats_text(provenance: dict | None) -> str:
    """One line under an assistant reply: how it attended (`attention_label`: "A2ATS (exact)"
    below the crossover), tokens, speed, time to first token."""
    if not provenance:
        return ""
    stats = provenance.get("stats")
    stats = stats if isinstance(stats, dict) else {}
    parts = [attention_label(provenance)]
    if stats:
        parts.append(f"{stats.get('generation_tokens', 0)} tokens")
        parts.append(f"{number(stats.get('generation_tps')):.1f} tok/s")
        parts.append(f"TTFT {number(stats.get('time_to_first_token')):.2f} s")
        reason = stats.get("stop_reason")
        if reason == "cancelled":
            parts.append("stopped")
        elif reason == "length":
            parts.append("max tokens reached")
        elif reason == "error":
            parts.append("failed")
    return " \u00b7 ".join(parts)


def provenance_tooltip(provenance: dict | None) -> str:
    if not provenance:
        return ""
    model, codebook, cache = (provenance.get(k) for k in ("model", "codebook", "cache"))
    model, codebook, cache = (x if isinstance(x, dict) else {} for x in (model, codebook, cache))
    lines = [
        f"Model: {model.get('name') or model.get('source', '?')}",
        f"Codebook: {codebook.get('name', 'none')}",
    ]
    sha = codebook.get("sha256")
    if isinstance(sha, str) and sha:
        lines.append(f"Codebook sha256: {sha[:16]}\u2026")
    config = cache.get("config")
    if isinstance(config, dict) and config:
        keys = ("window", "far_offset", "sinks", "budget", "far_buckets", "rerank", "kv_bits")
        keys += ("kv_memory",) if config.get("kv_memory") is not None else ()
        lines.append("Cache: " + ", ".join(f"{k}={config.get(k)}" for k in keys))
    lines.append("Sampling: " + json.dumps(provenance.get("sampling", {}), sort_keys=True))
    return "\n".join(lines)


class MessageWidget(QFrame):
    """A user bubble (right, shrink-to-fit) or an assistant reply (full width, avatar)."""

    regenerate_clicked = Signal()
    edit_clicked = Signal()
    copied = Signal(str)
    version_requested = Signal(int)  # -1: the earlier version of this reply, +1: the later

    def __init__(self, message: Message, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.message = message
        self.is_user = message.role == "user"
        self.setObjectName("MessageUser" if self.is_user else "MessageAssistant")
        self.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Maximum)
        self.streaming = False
        self._ideal_width: int | None = None
        self._limit: int | None = RENDER_LIMIT  # None: everything is shown

        self.view = MarkdownView()
        self.view.copied.connect(self.copied)
        self.view.setAccessibleName("User message" if self.is_user else "Assistant message")
        self.bubble = QFrame()
        self.bubble.setObjectName("Bubble")
        bubble_layout = QVBoxLayout(self.bubble)
        pad = (14, 9, 14, 9) if self.is_user else (0, 0, 0, 0)
        bubble_layout.setContentsMargins(*pad)
        bubble_layout.addWidget(self.view)

        self._build_more()
        # Elided (…) rather than widen the transcript; the tooltip has the whole provenance.
        self.stats = ElidedLabel()
        self.stats.setObjectName("StatsLabel")
        self.note = QLabel()
        self.note.setObjectName("NoteLabel")
        self.note.setWordWrap(True)
        plain_labels(self.note)  # provenance and error notes are untrusted
        self.stats.hide()
        self.note.hide()

        self.copy_button = self._action("copy", "Copy message")
        self.copy_button.clicked.connect(self._copy)
        self.edit_button = self._action("edit", "Edit and resend")
        self.edit_button.clicked.connect(self.edit_clicked)
        self.regenerate_button = self._action("regenerate", "Regenerate reply")
        self.regenerate_button.clicked.connect(self.regenerate_clicked)
        self._build_versions()
        self.actions = QWidget()
        self.actions.setObjectName("MessageActions")
        actions_layout = QHBoxLayout(self.actions)
        actions_layout.setContentsMargins(0, 0, 0, 0)
        actions_layout.setSpacing(2)
        if self.is_user:
            actions_layout.addStretch(1)
        for button in (self.copy_button, self.edit_button, self.regenerate_button):
            actions_layout.addWidget(button)
        if not self.is_user:
            actions_layout.addWidget(self.versions)
            actions_layout.addSpacing(8)
            actions_layout.addWidget(self.stats)
            actions_layout.addStretch(1)
        policy = self.actions.sizePolicy()
        policy.setRetainSizeWhenHidden(True)
        self.actions.setSizePolicy(policy)

        self._build_layout()
        self.set_actions(can_edit=False, can_regenerate=False)
        self.set_content(message.content)
        self.set_provenance(message.provenance)

    def _build_versions(self) -> None:
        """ "< 2 / 3 >": the versions a regenerate kept of this reply (`Message.alternatives`)."""
        self.versions = QWidget()
        row = QHBoxLayout(self.versions)
        row.setContentsMargins(0, 0, 0, 0)
        row.setSpacing(0)
        self.previous_version_button = QToolButton()
        self.previous_version_button.setText("\u2039")
        self.previous_version_button.setToolTip("Earlier version of this reply")
        self.previous_version_button.clicked.connect(lambda: self.version_requested.emit(-1))
        self.next_version_button = QToolButton()
        self.next_version_button.setText("\u203a")
        self.next_version_button.setToolTip("Later version of this reply")
        self.next_version_button.clicked.connect(lambda: self.version_requested.emit(1))
        self.version_label = QLabel()
        self.version_label.setObjectName("StatsLabel")
        row.addWidget(self.previous_version_button)
        row.addWidget(self.version_label)
        row.addWidget(self.next_version_button)
        self.versions.hide()

    def set_versions(self, number: int, count: int, can_switch: bool) -> None:
        """Show "number / count" (hidden for a single version); buttons only when `can_switch`."""
        self.versions.setVisible(count > 1)
        self.version_label.setText(f"{number} / {count}")
        self.previous_version_button.setEnabled(can_switch and number > 1)
        self.next_version_button.setEnabled(can_switch and number < count)

    def _build_more(self) -> None:
        """The row under a message cut at the render limit: how much shows, more, all."""
        self.more = QWidget()
        self.more.setObjectName("MoreRow")
        row = QHBoxLayout(self.more)
        row.setContentsMargins(0, 0, 0, 0)
        self.more_label = QLabel()
        self.more_label.setObjectName("NoteLabel")
        plain_labels(self.more_label)
        self.show_more_button = QToolButton()
        self.show_more_button.setText("Show more")
        self.show_more_button.clicked.connect(self.show_more)
        self.show_all_button = QToolButton()
        self.show_all_button.setText("Show all")
        self.show_all_button.setToolTip("Long text without spaces can take a while to lay out")
        self.show_all_button.clicked.connect(self.show_all)
        row.addWidget(self.more_label)
        row.addWidget(self.show_more_button)
        row.addWidget(self.show_all_button)
        row.addStretch(1)
        self.more.hide()

    def show_more(self) -> None:
        """Render twice as much of the message (plus the limit)."""
        if self._limit is not None:
            self._limit = 2 * self._limit + RENDER_LIMIT
            self.set_content(self.message.content, self.streaming)

    def show_all(self) -> None:
        self._limit = None
        self.set_content(self.message.content, self.streaming)

    def _action(self, icon: str, tip: str) -> QToolButton:
        button = QToolButton()
        button.setIconSize(QSize(15, 15))
        button.setToolTip(tip)
        button.setAccessibleName(tip)
        button.setCursor(Qt.CursorShape.PointingHandCursor)
        bind_icon(button, icon, "muted")
        return button

    def _build_layout(self) -> None:
        outer = QHBoxLayout(self)
        outer.setContentsMargins(0, 6, 0, 6)
        column = QVBoxLayout()
        column.setSpacing(4)
        if self.is_user:
            outer.addStretch(1)
            column.addWidget(self.bubble, 0, Qt.AlignmentFlag.AlignRight)
            column.addWidget(self.more, 0, Qt.AlignmentFlag.AlignRight)
            column.addWidget(self.note, 0, Qt.AlignmentFlag.AlignRight)
            column.addWidget(self.actions)
            outer.addLayout(column)
            return
        avatar = QToolButton()
        avatar.setObjectName("Avatar")
        avatar.setIconSize(QSize(18, 18))
        avatar.setAutoRaise(True)
        avatar.setEnabled(False)
        avatar.setAccessibleName("Assistant")
        bind_icon(avatar, "assistant", "accent")
        avatar_column = QVBoxLayout()
        avatar_column.addWidget(avatar)
        avatar_column.addStretch(1)
        outer.addLayout(avatar_column)
        header = QLabel("Assistant")
        header.setObjectName("RoleLabel")
        column.addWidget(header)
        column.addWidget(self.bubble)
        column.addWidget(self.more)
        column.addWidget(self.note)
        column.addWidget(self.actions)
        outer.addLayout(column, 1)

    # ----- state -----------------------------------------------------------------------------

    def set_content(self, text: str, streaming: bool = False) -> None:
        """Render `text` (at most the render limit of it, see `show_more`); a streaming reply
        shows a cursor at its end."""
        self.message.content = text
        self.streaming = streaming
        cut = self._limit is not None and len(text) > self._limit
        shown = text[: self._limit] + "\u2026" if cut else text
        shown = shown + STREAM_CURSOR if streaming else shown
        self.view.set_markdown(shown, plain=self.is_user, full=text)
        self.more.setVisible(cut and not streaming)
        if cut:
            self.more_label.setText(f"Showing {self._limit:,} of {len(text):,} characters")
        self._ideal_width = None
        self._fit_bubble()

    def set_provenance(self, provenance: dict | None) -> None:
        self.message.provenance = provenance
        text = stats_text(provenance)
        self.stats.setText(text)
        self.stats.setVisible(bool(text))
        created = time.strftime("%Y-%m-%d %H:%M", time.localtime(self.message.created))
        details = provenance_tooltip(provenance)
        self.stats.setToolTip(rich_from_plain(f"{created}\n{details}" if details else created))

    def set_note(self, text: str, error: bool = False) -> None:
        self.note.setObjectName("ErrorLabel" if error else "NoteLabel")
        self.note.setStyleSheet("")  # re-polish for the new object name
        self.note.setText(text)
        self.note.setVisible(bool(text))

    def set_actions(self, *, can_edit: bool, can_regenerate: bool) -> None:
        self.edit_button.setVisible(self.is_user and can_edit)
        self.regenerate_button.setVisible((not self.is_user) and can_regenerate)
        self.actions.setVisible(not self.streaming)

    def set_streaming(self, streaming: bool) -> None:
        self.streaming = streaming
        self.actions.setVisible(not streaming)

    def _copy(self) -> None:
        from PySide6.QtWidgets import QApplication

        QApplication.clipboard().setText(self.message.content)
        self.copied.emit("Message copied")

    # ----- layout ----------------------------------------------------------------------------

    def _fit_bubble(self) -> None:
        if not self.is_user:
            return
        if self._ideal_width is None:
            self._ideal_width = self.view.ideal_width() + 28 + 2
        available = max(120, int(self.width() * 0.8))
        self.bubble.setFixedWidth(min(self._ideal_width, available))

    def resizeEvent(self, event) -> None:  # noqa: N802
        super().resizeEvent(event)
        self._fit_bubble()
