"""Progress of long tasks (model load, demo fetch, calibration): stage, bar, ETA, Cancel."""

from __future__ import annotations

import time

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import (
    QDialog,
    QDialogButtonBox,
    QLabel,
    QProgressBar,
    QVBoxLayout,
    QWidget,
)

from ..events import Progress
from ..inert_text import plain_labels


class EtaTracker:
    """Estimates the time left in the current stage from its rate so far."""

    def __init__(self, clock=time.monotonic) -> None:
        self._clock = clock
        self._stage: str | None = None
        self._start = 0.0
        self._start_done = 0

    def update(self, stage: str, done: int, total: int) -> float | None:
        """Seconds left in `stage`, or None when not yet measurable."""
        now = self._clock()
        if stage != self._stage or done < self._start_done:
            self._stage, self._start, self._start_done = stage, now, done
            return None
        elapsed, progressed = now - self._start, done - self._start_done
        if total <= 0 or progressed <= 0 or elapsed <= 0:
            return None
        return max(0.0, (total - done) * elapsed / progressed)


def format_eta(seconds: float | None) -> str:
    if seconds is None:
        return "estimating\u2026"
    seconds = int(round(seconds))
    if seconds < 60:
        return f"about {seconds} s left"
    minutes, seconds = divmod(seconds, 60)
    if minutes < 60:
        return f"about {minutes} min {seconds:02d} s left"
    hours, minutes = divmod(minutes, 60)
    return f"about {hours} h {minutes:02d} min left"


class ProgressPanel(QWidget):
    """Stage label, bar and ETA for one task; feed it `Progress` records."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.stage = QLabel("Starting\u2026")
        self.stage.setAccessibleName("Progress stage")
        plain_labels(self.stage)  # stages can name files
        self.bar = QProgressBar()
        self.bar.setAccessibleName("Progress")
        self.bar.setRange(0, 0)
        self.eta = QLabel("")
        self.eta.setObjectName("HintLabel")
        self._eta = EtaTracker()
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addWidget(self.stage)
        layout.addWidget(self.bar)
        layout.addWidget(self.eta)

    def reset(self) -> None:
        self._eta = EtaTracker()
        self.stage.setText("Starting\u2026")
        self.bar.setRange(0, 0)
        self.eta.setText("")

    def update_progress(self, progress: Progress) -> None:
        total = max(0, progress.total)
        self.stage.setText(progress.stage[:1].upper() + progress.stage[1:])
        if total > 0:
            self.bar.setRange(0, 1000)
            self.bar.setValue(int(1000 * min(progress.done, total) / total))
        else:
            self.bar.setRange(0, 0)
        eta = self._eta.update(progress.stage, progress.done, total)
        self.eta.setText(format_eta(eta) if total > 0 else "")


class TaskProgressDialog(QDialog):
    """A small non-blocking dialog for a long engine task; Cancel emits `cancel_requested`."""

    cancel_requested = Signal()

    def __init__(self, title: str, parent: QWidget | None = None, cancellable: bool = False):
        super().__init__(parent)
        self.setWindowTitle(title)
        self.setModal(False)
        self.setMinimumWidth(420)
        self.panel = ProgressPanel()
        layout = QVBoxLayout(self)
        heading = QLabel(title)
        heading.setStyleSheet("font-weight: 600; font-size: 14px;")
        layout.addWidget(heading)
        layout.addWidget(self.panel)
        self.buttons = QDialogButtonBox()
        if cancellable:
            button = self.buttons.addButton(QDialogButtonBox.StandardButton.Cancel)
            button.clicked.connect(self.cancel_requested)
        layout.addWidget(self.buttons)
        self.setWindowFlag(Qt.WindowType.WindowContextHelpButtonHint, False)

    def update_progress(self, progress: Progress) -> None:
        self.panel.update_progress(progress)
