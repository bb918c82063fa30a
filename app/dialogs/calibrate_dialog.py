"""Calibrate codebook: corpus, tokens, centroids, beta, save location; progress with stage and
ETA; Cancel. The main window runs the request on the engine worker and loads the result."""

from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import Signal
from PySide6.QtWidgets import (
    QButtonGroup,
    QComboBox,
    QDialog,
    QDialogButtonBox,
    QDoubleSpinBox,
    QFileDialog,
    QFormLayout,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QListWidget,
    QPushButton,
    QRadioButton,
    QSpinBox,
    QVBoxLayout,
    QWidget,
)

from ..events import CalibrationRequest, Progress
from ..inert_text import plain_labels
from .progress import ProgressPanel

CENTROID_CHOICES = (256, 512, 1024, 2048, 4096)


def default_codebook_path(folder: Path, model_name: str, n_centroids: int) -> Path:
    safe = "".join(c if c.isalnum() or c in "-_." else "-" for c in model_name) or "model"
    return folder / f"{safe}-{n_centroids}c.safetensors"


class CalibrateDialog(QDialog):
    start_requested = Signal(object)  # CalibrationRequest
    cancel_requested = Signal()

    def __init__(self, model_name: str, codebook_folder: Path, parent: QWidget | None = None):
        super().__init__(parent)
        self.setWindowTitle("Calibrate codebook")
        self.setMinimumWidth(540)
        self.model_name = model_name
        self.folder = codebook_folder
        self.running = False
        self._path_edited = False

        intro = QLabel(
            f"Train a query-aware codebook for <b>{model_name}</b>: the model reads the corpus, "
            "its keys and queries are collected per layer, and k-means runs on them."
        )
        intro.setWordWrap(True)
        self.builtin = QRadioButton("Built-in corpus")
        self.builtin.setChecked(True)
        self.from_files = QRadioButton("Text files")
        group = QButtonGroup(self)
        group.addButton(self.builtin)
        group.addButton(self.from_files)
        self.files = QListWidget()
        self.files.setAccessibleName("Corpus files")
        self.files.setFixedHeight(64)
        self.files.setEnabled(False)
        choose = QPushButton("Choose files\u2026")
        choose.setAutoDefault(False)
        choose.clicked.connect(self._choose_files)
        self.from_files.toggled.connect(self.files.setEnabled)
        corpus_box = QVBoxLayout()
        corpus_box.addWidget(self.builtin)
        row = QHBoxLayout()
        row.addWidget(self.from_files)
        row.addStretch(1)
        row.addWidget(choose)
        corpus_box.addLayout(row)
        corpus_box.addWidget(self.files)

        self.tokens = QSpinBox()
        self.tokens.setRange(256, 4_000_000)
        self.tokens.setSingleStep(4096)
        self.tokens.setValue(16384)
        self.tokens.setAccessibleName("Calibration tokens")
        self.centroids = QComboBox()
        self.centroids.setAccessibleName("Centroids")
        for n in CENTROID_CHOICES:
            self.centroids.addItem(f"{n}", n)
        self.centroids.setCurrentIndex(CENTROID_CHOICES.index(1024))
        self.centroids.currentIndexChanged.connect(self._refresh_default_path)
        self.beta = QDoubleSpinBox()
        self.beta.setRange(0.0, 1.0)
        self.beta.setSingleStep(0.1)
        self.beta.setDecimals(2)
        self.beta.setToolTip("0 = fully query-aware, 1 = plain nearest-centroid VQ")
        self.beta.setAccessibleName("Beta")
        self.output = QLineEdit()
        self.output.setAccessibleName("Save codebook to")
        self.output.textEdited.connect(lambda _t: setattr(self, "_path_edited", True))
        browse = QPushButton("Browse\u2026")
        browse.setAutoDefault(False)
        browse.clicked.connect(self._browse)
        out_row = QHBoxLayout()
        out_row.addWidget(self.output, 1)
        out_row.addWidget(browse)
        self._refresh_default_path()

        form = QFormLayout()
        form.addRow("Corpus", corpus_box)
        form.addRow("Tokens", self.tokens)
        form.addRow("Centroids", self.centroids)
        form.addRow("Beta", self.beta)
        form.addRow("Save to", out_row)

        self.progress = ProgressPanel()
        self.progress.hide()
        self.status = QLabel()
        plain_labels(self.status)  # error texts
        self.status.setWordWrap(True)
        self.status.hide()

        self.buttons = QDialogButtonBox()
        self.start_button = self.buttons.addButton(
            "Calibrate", QDialogButtonBox.ButtonRole.AcceptRole
        )
        self.start_button.setDefault(True)
        self.close_button = self.buttons.addButton(QDialogButtonBox.StandardButton.Close)
        self.start_button.clicked.connect(self._start)
        self.close_button.clicked.connect(self._close_or_cancel)

        layout = QVBoxLayout(self)
        layout.addWidget(intro)
        layout.addLayout(form)
        layout.addWidget(self.progress)
        layout.addWidget(self.status)
        layout.addWidget(self.buttons)
        self._form_widgets = [
            self.builtin,
            self.from_files,
            self.files,
            choose,
            self.tokens,
            self.centroids,
            self.beta,
            self.output,
            browse,
        ]

    # ----- inputs ----------------------------------------------------------------------------

    def _refresh_default_path(self) -> None:
        if not self._path_edited:
            path = default_codebook_path(self.folder, self.model_name, self.centroids.currentData())
            self.output.setText(str(path))

    def _choose_files(self) -> None:
        files, _ = QFileDialog.getOpenFileNames(
            self, "Corpus files", "", "Text files (*.txt *.md *.py *.json);;All files (*)"
        )
        if files:
            self.files.clear()
            self.files.addItems(files)
            self.from_files.setChecked(True)

    def _browse(self) -> None:
        path, _ = QFileDialog.getSaveFileName(
            self, "Save codebook", self.output.text(), "Codebooks (*.safetensors)"
        )
        if path:
            if not path.endswith(".safetensors"):
                path += ".safetensors"
            self.output.setText(path)
            self._path_edited = True

    def request(self) -> CalibrationRequest:
        """The request the form describes (ValueError when incomplete)."""
        files = tuple(self.files.item(i).text() for i in range(self.files.count()))
        if self.from_files.isChecked() and not files:
            raise ValueError("Choose at least one corpus file, or use the built-in corpus.")
        output = self.output.text().strip()
        if not output:
            raise ValueError("Choose where to save the codebook.")
        return CalibrationRequest(
            output=output,
            files=files if self.from_files.isChecked() else (),
            tokens=self.tokens.value(),
            n_centroids=int(self.centroids.currentData()),
            beta=round(self.beta.value(), 4),
        )

    # ----- run state -------------------------------------------------------------------------

    def _start(self) -> None:
        try:
            request = self.request()
        except ValueError as exc:
            self._show_status(str(exc), error=True)
            return
        self.running = True
        for widget in self._form_widgets:
            widget.setEnabled(False)
        self.start_button.setEnabled(False)
        self.close_button.setText("Cancel")
        self.progress.reset()
        self.progress.show()
        self.status.hide()
        self.start_requested.emit(request)

    def _close_or_cancel(self) -> None:
        if self.running:
            self.close_button.setEnabled(False)
            self.progress.stage.setText("Cancelling\u2026")
            self.cancel_requested.emit()
        else:
            self.reject()

    def reject(self) -> None:
        if self.running:
            self._close_or_cancel()
            return
        super().reject()

    def on_progress(self, progress: Progress) -> None:
        if progress.task == "calibrate":
            self.progress.update_progress(progress)

    def _stopped(self) -> None:
        self.running = False
        for widget in self._form_widgets:
            widget.setEnabled(True)
        self.files.setEnabled(self.from_files.isChecked())
        self.start_button.setEnabled(True)
        self.close_button.setEnabled(True)
        self.close_button.setText("Close")

    def on_finished(self, path: str) -> None:
        self._stopped()
        self.progress.hide()
        self._show_status(f"Codebook saved to {path} and loaded.")
        self.accept()

    def on_failed(self, message: str) -> None:
        self._stopped()
        self.progress.hide()
        self._show_status(f"Calibration failed: {message}", error=True)

    def on_cancelled(self) -> None:
        self._stopped()
        self.progress.hide()
        self._show_status("Calibration cancelled; nothing was saved.")

    def _show_status(self, text: str, error: bool = False) -> None:
        self.status.setObjectName("ErrorLabel" if error else "HintLabel")
        self.status.setStyleSheet("")
        self.status.setText(text)
        self.status.show()
