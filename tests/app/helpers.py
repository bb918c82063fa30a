"""Helpers for the desktop-app tests."""

from __future__ import annotations

import itertools

from PySide6.QtCore import QObject, Qt, Signal


class Spy:
    """Records a controller's signals as (name, payload): `make_controller` (conftest.py)
    attaches one to every controller it makes as `controller.spy`."""

    NAMES = (
        "task_changed", "model_loaded", "codebook_loaded", "demo_missing", "error_reported",
        "reply_started", "reply_ended", "context_overflowed", "calibration_cancelled",
        "calibration_finished", "current_changed",
    )  # fmt: skip

    def __init__(self, controller) -> None:
        self.events: list[tuple[str, object]] = []
        for name in self.NAMES:
            getattr(controller, name).connect(
                lambda *args, _n=name: self.events.append((_n, args[0] if args else None))
            )

    def of(self, name: str) -> list:
        return [p for n, p in self.events if n == name]


class Requests(QObject):
    """Sends engine requests to a worker without a controller, the way the controller does (one
    signal queued to `EngineWorker.handle`): `send(LoadModel("fake"))`. Numbers requests too."""

    sent = Signal(object)

    def __init__(self, worker) -> None:
        super().__init__()
        self.sent.connect(worker.handle, Qt.ConnectionType.QueuedConnection)
        self._ids = itertools.count(1)

    def __call__(self, request) -> None:
        self.sent.emit(request)

    def next_request_id(self) -> int:
        return next(self._ids)


def load(qtbot, window, source: str = "fake", timeout: int = 60000):
    """Load a model and wait until the window adopted it."""
    with qtbot.waitSignal(window.model_ready, timeout=timeout):
        window.controller.load_model(source)


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


def cut_labels(root) -> list[str]:
    """Visible labels under `root` whose text does not fit them: a one-line label's text wider
    than its contents, a word-wrapped one taller than its height. ("" when every label fits.)
    Rich-text labels are left out (their width is the layout engine's)."""
    from PySide6.QtCore import Qt
    from PySide6.QtGui import Qt as GuiQt
    from PySide6.QtWidgets import QLabel

    cut = []
    for label in root.findChildren(QLabel):
        shown = QLabel.text(label)  # what is drawn (an ElidedLabel's text() is the whole text)
        if not shown or not label.isVisibleTo(root) or label.width() <= 0:
            continue
        if label.textFormat() == Qt.TextFormat.RichText or (
            label.textFormat() == Qt.TextFormat.AutoText and GuiQt.mightBeRichText(shown)
        ):
            continue
        room = label.contentsRect().width() - 2 * label.margin()
        if label.wordWrap():
            if label.heightForWidth(label.width()) > label.height() + 1:
                cut.append(f"{label.objectName() or type(label).__name__} {shown!r}: wraps "
                           f"taller than {label.height()} px")  # fmt: skip
            continue
        widest = max(label.fontMetrics().horizontalAdvance(line) for line in shown.split("\n"))
        if widest > room + 1:
            cut.append(f"{label.objectName() or type(label).__name__} {shown!r}: {widest} px "
                       f"in {room} px")  # fmt: skip
    return cut
