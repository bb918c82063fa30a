"""Window layout at common screen sizes: the inspector dock keeps a usable width and so does the
chat. Each size is also grabbed to a PNG (in the test's temporary folder) to look at."""

from __future__ import annotations

import pytest
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QApplication

from .fakes import FakeBackend
from .helpers import load, reply

USABLE_DOCK = 360  # the inspector panels' own minimum width (InspectorPanel)
USABLE_CHAT = 340

CODE_REPLY = "Here:\n\n```python\n" + "value = compute(x) + 1  # note\n" * 8 + "```\n\nDone."


def _settle() -> None:
    for _ in range(5):
        QApplication.processEvents()


def _chat_column(window):
    return window.chat_view.parentWidget()


@pytest.mark.parametrize("size", [(1024, 768), (1440, 900), (1920, 1080)], ids=str)
def test_the_dock_and_the_chat_stay_usable(make_window, qtbot, tmp_path, size):
    window = make_window(FakeBackend(reply_fn=lambda _m: CODE_REPLY), inspector=True)
    load(qtbot, window)
    reply(qtbot, window, "Show me some code, with a title as long as titles get " * 2)
    window.resize(*size)
    _settle()
    shot = tmp_path / f"layout-{size[0]}x{size[1]}.png"
    assert window.grab().save(str(shot))
    assert window.size().toTuple() == size
    assert window.dock.isVisible() and window.dock.width() >= USABLE_DOCK
    scroll = window.dock.widget()
    assert scroll.viewport().width() >= window.inspector.minimumWidth()  # no panel cut off
    assert _chat_column(window).width() >= USABLE_CHAT


def test_the_dock_cannot_be_squeezed_to_a_strip(make_window, qtbot):
    window = make_window(FakeBackend(), inspector=True)
    window.resize(1024, 768)
    _settle()
    window.resizeDocks([window.dock], [70], Qt.Orientation.Horizontal)  # a user's drag, say
    _settle()
    assert window.dock.width() >= USABLE_DOCK
    assert window.dock.widget().minimumWidth() >= USABLE_DOCK
    assert _chat_column(window).width() >= USABLE_CHAT
