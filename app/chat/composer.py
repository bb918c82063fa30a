"""The message composer: an auto-growing text box (Enter sends, Shift+Enter adds a line) and
a round Send button that turns into Stop while a reply streams."""

from __future__ import annotations

from PySide6.QtCore import QSize, Qt, Signal
from PySide6.QtGui import QKeyEvent, QTextOption
from PySide6.QtWidgets import (
    QFrame,
    QHBoxLayout,
    QLabel,
    QPlainTextEdit,
    QToolButton,
    QVBoxLayout,
    QWidget,
)

from ..theme import theme

MIN_LINES, MAX_LINES = 1, 8


class PromptEdit(QPlainTextEdit):
    """Plain-text prompt box: Enter submits, Shift+Enter inserts a newline, Esc escapes."""

    submitted = Signal()
    escaped = Signal()
    focus_changed = Signal(bool)

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("PromptEdit")
        self.setPlaceholderText("Message the model\u2026")
        self.setAccessibleName("Message input")
        self.setTabChangesFocus(True)
        self.setWordWrapMode(QTextOption.WrapMode.WrapAtWordBoundaryOrAnywhere)
        self.setVerticalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAsNeeded)
        self.setFrameShape(QFrame.Shape.NoFrame)
        self.document().documentLayout().documentSizeChanged.connect(self._fit)
        self._fit()

    def keyPressEvent(self, event: QKeyEvent) -> None:  # noqa: N802
        key, mods = event.key(), event.modifiers()
        if key in (Qt.Key.Key_Return, Qt.Key.Key_Enter):
            if mods & Qt.KeyboardModifier.ShiftModifier:
                self.insertPlainText("\n")
            else:
                self.submitted.emit()
            event.accept()
            return
        if key == Qt.Key.Key_Escape:
            self.escaped.emit()
            event.accept()
            return
        super().keyPressEvent(event)

    def focusInEvent(self, event) -> None:  # noqa: N802
        super().focusInEvent(event)
        self.focus_changed.emit(True)

    def focusOutEvent(self, event) -> None:  # noqa: N802
        super().focusOutEvent(event)
        self.focus_changed.emit(False)

    def _fit(self, *_args) -> None:
        """Grow with the text from MIN_LINES to MAX_LINES, then scroll."""
        line = self.fontMetrics().lineSpacing()
        # QPlainTextDocumentLayout reports its height in (wrapped) lines.
        lines = max(MIN_LINES, min(MAX_LINES, int(self.document().size().height())))
        margins = self.contentsMargins()
        extra = 2 * self.document().documentMargin() + margins.top() + margins.bottom() + 4
        self.setFixedHeight(int(lines * line + extra))

    def changeEvent(self, event) -> None:  # noqa: N802
        super().changeEvent(event)
        if event.type() in (event.Type.FontChange, event.Type.StyleChange):
            self._fit()


class Composer(QWidget):
    """Prompt box + Send/Stop + an "editing last message" banner."""

    send_requested = Signal(str)
    stop_requested = Signal()
    edit_cancelled = Signal()

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("Composer")
        self.generating = False
        self.editing = False
        self._ready = True

        self.banner = QFrame()
        self.banner.setObjectName("EditBanner")
        banner_layout = QHBoxLayout(self.banner)
        banner_layout.setContentsMargins(10, 4, 4, 4)
        banner_layout.addWidget(
            QLabel("Editing your last message \u2014 Enter resends, Esc cancels")
        )
        banner_layout.addStretch(1)
        cancel = QToolButton()
        cancel.setText("Cancel")
        cancel.setAccessibleName("Cancel editing")
        cancel.clicked.connect(self.cancel_edit)
        banner_layout.addWidget(cancel)
        self.banner.hide()

        self.edit = PromptEdit()
        self.edit.submitted.connect(self._on_submit)
        self.edit.escaped.connect(self._on_escape)
        self.edit.focus_changed.connect(self._on_focus)
        self.button = QToolButton()
        self.button.setObjectName("SendButton")
        self.button.setFixedSize(QSize(32, 32))
        self.button.setIconSize(QSize(16, 16))
        self.button.clicked.connect(self._on_button)
        self.edit.textChanged.connect(self._update_button)

        self.frame = QFrame()
        self.frame.setObjectName("ComposerFrame")
        frame_layout = QHBoxLayout(self.frame)
        frame_layout.setContentsMargins(14, 8, 8, 8)
        frame_layout.addWidget(self.edit, 1)
        frame_layout.addWidget(self.button, 0, Qt.AlignmentFlag.AlignBottom)

        self.hint = QLabel("Enter to send \u00b7 Shift+Enter for a new line \u00b7 Esc stops")
        self.hint.setObjectName("HintLabel")
        self.hint.setAlignment(Qt.AlignmentFlag.AlignCenter)

        layout = QVBoxLayout(self)
        layout.setContentsMargins(24, 6, 24, 10)
        layout.setSpacing(6)
        layout.addWidget(self.banner)
        layout.addWidget(self.frame)
        layout.addWidget(self.hint)
        theme().changed.connect(self._update_button)
        self._update_button()

    def text(self) -> str:
        return self.edit.toPlainText()

    def draft(self) -> str:
        """The unsent text kept per chat ("" while editing the last message: that text is
        the message, not a draft)."""
        return "" if self.editing else self.text()

    def set_text(self, text: str) -> None:
        self.edit.setPlainText(text)
        cursor = self.edit.textCursor()
        cursor.movePosition(cursor.MoveOperation.End)
        self.edit.setTextCursor(cursor)

    def set_generating(self, generating: bool) -> None:
        self.generating = generating
        self._update_button()

    def set_ready(self, ready: bool, reason: str = "") -> None:
        """Enable sending (False while no model is loaded; `reason` shows as placeholder)."""
        self.edit.setPlaceholderText("Message the model\u2026" if ready else reason)
        self._ready = ready
        self._update_button()

    def begin_edit(self, text: str) -> None:
        self.editing = True
        self.banner.show()
        self.set_text(text)
        self.edit.setFocus()

    def cancel_edit(self) -> None:
        if self.editing:
            self.editing = False
            self.banner.hide()
            self.edit.clear()
            self.edit_cancelled.emit()

    def finish_edit(self) -> None:
        self.editing = False
        self.banner.hide()

    def _on_submit(self) -> None:
        if self.generating or not self._ready:
            return
        text = self.text().strip()
        if text:
            self.send_requested.emit(text)

    def _on_escape(self) -> None:
        if self.generating:
            self.stop_requested.emit()
        else:
            self.cancel_edit()

    def _on_button(self) -> None:
        if self.generating:
            self.stop_requested.emit()
        else:
            self._on_submit()

    def _on_focus(self, focused: bool) -> None:
        self.frame.setProperty("focused", "true" if focused else "false")
        self.frame.style().unpolish(self.frame)
        self.frame.style().polish(self.frame)

    def _update_button(self) -> None:
        ready = self._ready
        if self.generating:
            self.button.setIcon(theme().icon("stop", "surface"))
            self.button.setToolTip("Stop (Esc)")
            self.button.setAccessibleName("Stop generating")
            self.button.setEnabled(True)
        else:
            self.button.setIcon(theme().icon("send", "accent_text"))
            self.button.setToolTip("Send (Enter)")
            self.button.setAccessibleName("Send message")
            self.button.setEnabled(ready and bool(self.text().strip()))
        self.button.setProperty("stopping", "true" if self.generating else "false")
        self.button.style().unpolish(self.button)
        self.button.style().polish(self.button)
