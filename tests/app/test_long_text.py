"""Text too long to lay out at once (a pasted base64 blob, a runaway reply): a message renders
at most RENDER_LIMIT characters, with "Show more" / "Show all"; copying gives the whole text."""

from __future__ import annotations

import base64
import random

from PySide6.QtWidgets import QApplication

from app.chat.message_widget import RENDER_LIMIT, MessageWidget
from app.conversations import Conversation, HistoryStore, Message

from .fakes import FakeBackend


def blob(chars: int) -> str:
    """One line of base64, no spaces anywhere."""
    return base64.b64encode(random.Random(7).randbytes(chars * 3 // 4 + 3)).decode()[:chars]


def rendered_chars(widget: MessageWidget) -> int:
    return widget.view.document().characterCount()


def test_a_long_unbroken_line_renders_a_bounded_part_with_show_more(qtbot):
    text = blob(600_000)
    widget = MessageWidget(Message("user", text))
    qtbot.addWidget(widget)
    assert rendered_chars(widget) <= RENDER_LIMIT + 16
    assert not widget.more.isHidden() and "600,000" in widget.more_label.text()
    widget.show_more_button.click()
    assert RENDER_LIMIT < rendered_chars(widget) <= 3 * RENDER_LIMIT + 16
    widget._copy()
    assert QApplication.clipboard().text() == text  # the whole message, not what is shown
    assert widget.message.content == text


def test_show_all_renders_everything(qtbot):
    text = blob(3 * RENDER_LIMIT)
    widget = MessageWidget(Message("assistant", text))
    qtbot.addWidget(widget)
    widget.show_all_button.click()
    assert rendered_chars(widget) >= len(text) and widget.more.isHidden()


def test_a_short_message_has_no_show_more(qtbot):
    widget = MessageWidget(Message("assistant", "short **reply**"))
    qtbot.addWidget(widget)
    assert widget.more.isHidden() and widget.view.toPlainText() == "short reply"


def test_a_streaming_reply_past_the_limit_stays_bounded(qtbot):
    widget = MessageWidget(Message("assistant", ""))
    qtbot.addWidget(widget)
    widget.set_content(blob(2 * RENDER_LIMIT), streaming=True)
    assert rendered_chars(widget) <= RENDER_LIMIT + 16


def test_the_window_starts_on_a_chat_with_a_2_mb_line(make_window, app_dirs):
    chat = Conversation(id="blob", title="blob")
    chat.messages += [Message("user", blob(2_000_000)), Message("assistant", "ok")]
    HistoryStore().save(chat)
    window = make_window(FakeBackend())
    (first, _) = window.chat_view.widgets
    assert rendered_chars(first) <= RENDER_LIMIT + 16
