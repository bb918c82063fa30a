"""Above the transcript: the chat's title and message count, the System prompt and Export
buttons, and the (hidden by default) system-prompt editor panel."""

from __future__ import annotations

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import (
    QHBoxLayout,
    QLabel,
    QMenu,
    QPlainTextEdit,
    QSizePolicy,
    QToolButton,
    QVBoxLayout,
    QWidget,
)

from ..conversations import Conversation
from ..elided_label import ElidedLabel
from ..theme import bind_icon

ICONS_ONLY_BELOW = 560  # header width under which its buttons drop their text


class ChatHeader(QWidget):
    """Title, subtitle, System prompt toggle and Export menu of the shown chat."""

    export_requested = Signal(str)  # "markdown" | "json"

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("ChatHeader")
        self.setAttribute(Qt.WidgetAttribute.WA_StyledBackground, True)
        layout = QHBoxLayout(self)
        layout.setContentsMargins(24, 10, 16, 10)
        titles = QVBoxLayout()
        titles.setSpacing(0)
        # Plain text (chat titles are untrusted), elided with the whole title as tooltip.
        self.chat_title = ElidedLabel("New chat")
        self.chat_title.setObjectName("ChatTitle")
        self.chat_subtitle = ElidedLabel("")
        self.chat_subtitle.setObjectName("ChatSubtitle")
        for label in (self.chat_title, self.chat_subtitle):  # a long title must not squeeze
            label.setSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Preferred)
        titles.addWidget(self.chat_title)
        titles.addWidget(self.chat_subtitle)
        layout.addLayout(titles, 1)
        self.system_button = QToolButton()
        self.system_button.setText("System prompt")
        self.system_button.setCheckable(True)
        self.system_button.setAccessibleName("Show the system prompt")
        self.system_button.setToolButtonStyle(Qt.ToolButtonStyle.ToolButtonTextBesideIcon)
        bind_icon(self.system_button, "system-prompt", "muted")
        self.export_button = QToolButton()
        self.export_button.setText("Export")
        self.export_button.setAccessibleName("Export this chat")
        self.export_button.setToolButtonStyle(Qt.ToolButtonStyle.ToolButtonTextBesideIcon)
        self.export_button.setPopupMode(QToolButton.ToolButtonPopupMode.InstantPopup)
        bind_icon(self.export_button, "export", "muted")
        export_menu = QMenu(self.export_button)
        export_menu.addAction("Markdown\u2026", lambda: self.export_requested.emit("markdown"))
        export_menu.addAction("JSON\u2026", lambda: self.export_requested.emit("json"))
        self.export_button.setMenu(export_menu)
        layout.addWidget(self.system_button)
        layout.addWidget(self.export_button)
        for button in (self.system_button, self.export_button):
            button.setToolTip(button.text())

    def resizeEvent(self, event) -> None:  # noqa: N802 (Qt override)
        """Narrow (a small window with the inspector open): the buttons show only their icons,
        so the title keeps room."""
        super().resizeEvent(event)
        style = (
            Qt.ToolButtonStyle.ToolButtonIconOnly
            if self.width() < ICONS_ONLY_BELOW
            else Qt.ToolButtonStyle.ToolButtonTextBesideIcon
        )
        for button in (self.system_button, self.export_button):
            if button.toolButtonStyle() != style:
                button.setToolButtonStyle(style)

    def show_conversation(self, conversation: Conversation) -> None:
        self.chat_title.setText(conversation.title)
        count = len(conversation.messages)
        parts = [f"{count} message{'s' if count != 1 else ''}"]
        if conversation.system_prompt:
            parts.append("system prompt set")
        self.chat_subtitle.setText(" \u00b7 ".join(parts))
        self.system_button.setText(
            "System prompt \u2022" if conversation.system_prompt else "System prompt"
        )
        self.system_button.setToolTip(self.system_button.text())


class SystemPromptPanel(QWidget):
    """The editor of the shown chat's system prompt."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("SystemPromptPanel")
        self.setAttribute(Qt.WidgetAttribute.WA_StyledBackground, True)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(24, 8, 24, 10)
        self.edit = QPlainTextEdit()
        self.edit.setObjectName("SystemPromptEdit")
        self.edit.setAccessibleName("System prompt of this chat")
        self.edit.setPlaceholderText("Instructions the model sees before this chat.")
        self.edit.setFixedHeight(72)
        note = QLabel("Applies to the next message of this chat.")
        note.setObjectName("HintLabel")
        layout.addWidget(self.edit)
        layout.addWidget(note)
        self.hide()
