"""Helpers for the desktop-app tests."""

from __future__ import annotations


def load(qtbot, window, source: str = "fake", timeout: int = 60000):
    """Load a model and wait until the window adopted it."""
    with qtbot.waitSignal(window.model_ready, timeout=timeout):
        window.load_model(source)


def reply(qtbot, window, text: str | None = None, timeout: int = 60000):
    """Send `text` (or, with None, nothing: wait for a reply already started) and wait."""
    with qtbot.waitSignal(window.reply_finished, timeout=timeout) as blocker:
        if text is not None:
            window.send(text)
    return blocker.args[0]


def streamed(window) -> int:
    """Tokens of the reply in progress (0 when none)."""
    reply = window.controller.reply
    return reply.tokens if reply is not None else 0
