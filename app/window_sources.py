"""The model and codebook menus' handlers of the main window (main_window.py), as a mixin.

`SourceActions` opens models (folder, GGUF file, Hugging Face, a hosts file), loads, shows and
unloads codebooks and runs the calibration dialog. It reads and changes state only through the
window's `ChatController`; the window class provides the widgets named below.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from PySide6.QtWidgets import QFileDialog, QMessageBox

from .app_dirs import codebooks_dir
from .controller import ChatController, Task
from .dialogs.calibrate_dialog import CalibrateDialog
from .dialogs.codebook_info import CodebookInfoDialog
from .dialogs.hf_dialog import HuggingFaceDialog
from .events import CalibrationFinished, CodebookLoaded, ModelLoaded
from .inert_text import rich_from_plain
from .menus import RunOn, fill_codebook_menu, fill_model_menu, model_tooltip

if TYPE_CHECKING:
    from PySide6.QtCore import SignalInstance
    from PySide6.QtWidgets import QMenu, QStatusBar, QToolButton

    from .status_bar import StatusBar
    from .top_bar import TopBar


def model_label(loaded: ModelLoaded) -> str:
    name = loaded.info.name or Path(loaded.source).name or loaded.source
    return f"{name} on {len(loaded.ranks)} ranks" if loaded.hosts else name


class SourceActions:
    """Model and codebook handlers, mixed into MainWindow (a QMainWindow)."""

    controller: ChatController
    calibrate_dialog: CalibrateDialog | None
    top_bar: TopBar
    status: StatusBar
    model_button: QToolButton
    model_menu: QMenu
    codebook_menu: QMenu
    model_ready: SignalInstance
    codebook_ready: SignalInstance

    if TYPE_CHECKING:

        def statusBar(self) -> QStatusBar: ...  # noqa: N802 (QMainWindow's)

    def _on_model_loaded(self, loaded: ModelLoaded) -> None:
        label = model_label(loaded)
        self.model_button.setText(f"{label}  \u25be")
        self.model_button.setToolTip(rich_from_plain(model_tooltip(loaded)))
        self.status.set_model(label)
        self.status.set_context(0, loaded.info.context_length)
        self._show_codebook_state()
        self.statusBar().showMessage(f"Loaded {label} in {loaded.seconds:.1f} s", 5000)
        self.model_ready.emit(loaded)

    def _fill_model_menu(self) -> None:
        openers = [
            ("Open model folder\u2026", "folder", self.open_model_folder),
            ("Open GGUF file\u2026", "file", self.open_gguf_file),
            ("Download from Hugging Face\u2026", "cloud", self.download_from_hf),
        ]
        model = self.controller.model
        if model is not None and not model.hosts:  # each host measures its own
            openers.append(
                ("Measure crossover on this machine", "info", self.controller.measure_crossover)
            )
        busy = self.controller.task not in (Task.IDLE, Task.GENERATING)
        settings = self.controller.settings
        run_on = RunOn(
            settings.hosts_file,
            bool(model.hosts) if model is not None else settings.run_on_hosts,
            self.controller.run_on,
            self.choose_hosts_file,
        )
        fill_model_menu(
            self.model_menu,
            settings.recent_models,
            busy,
            self.controller.load_model,
            openers,
            run_on,
        )

    def choose_hosts_file(self) -> None:
        """Pick an mlx.launch hosts file: the model loads again split over its hosts."""
        start = self.controller.settings.hosts_file or str(Path.home())
        path, _ = QFileDialog.getOpenFileName(
            self, "Run on the hosts of a hosts file", start, "Hosts files (*.json);;All files (*)"
        )
        if path:
            self.controller.run_on(path)

    def open_model_folder(self) -> None:
        folder = QFileDialog.getExistingDirectory(self, "Open model folder (mlx-lm format)")
        if folder:
            self.controller.load_model(folder)

    def open_gguf_file(self) -> None:
        path, _ = QFileDialog.getOpenFileName(self, "Open GGUF file", "", "GGUF models (*.gguf)")
        if path:
            self.controller.load_model(path)

    def download_from_hf(self) -> None:
        dialog = HuggingFaceDialog(self)
        if dialog.exec():
            self.controller.load_model(dialog.repo_id())

    def load_codebook_dialog(self) -> None:
        if self.controller.model is None:
            QMessageBox.information(self, "Load codebook", "Load a model first.")
            return
        start = str(codebooks_dir()) if codebooks_dir().exists() else str(Path.home())
        path, _ = QFileDialog.getOpenFileName(
            self, "Load codebook", start, "Codebooks (*.safetensors)"
        )
        if path:
            self.controller.load_codebook(path)

    def _on_codebook_loaded(self, info: CodebookLoaded) -> None:
        self._show_codebook_state()
        message = f"Codebook {info.name} loaded ({info.n_centroids} centroids)"
        if info.warnings:
            message += " \u2014 " + "; ".join(info.warnings)
        elif self.controller.reply is not None:  # a reply is already streaming with the old one
            message += "; it applies to the next message"
        self.statusBar().showMessage(message, 8000)
        self.codebook_ready.emit(info)

    def _on_codebook_cleared(self) -> None:
        self._show_codebook_state()
        self.statusBar().showMessage("Codebook unloaded; applies to the next message", 5000)

    def _show_codebook_state(self) -> None:
        self.top_bar.show_codebook(self.controller.codebook)

    def _fill_codebook_menu(self) -> None:
        task = self.controller.task
        has_model = self.controller.model is not None and task in (Task.IDLE, Task.GENERATING)
        fill_codebook_menu(
            self.codebook_menu,
            can_load=has_model,
            can_calibrate=has_model and task == Task.IDLE,
            has_codebook=self.controller.codebook is not None,
            actions={
                "load": self.load_codebook_dialog,
                "calibrate": self.open_calibrate_dialog,
                "details": self.show_codebook_details,
                "unload": self.controller.clear_codebook,
            },
        )

    def show_codebook_details(self) -> None:
        if self.controller.codebook is not None:
            CodebookInfoDialog(self.controller.codebook, self).exec()

    def open_calibrate_dialog(self) -> None:
        if self.controller.model is None:
            QMessageBox.information(self, "Calibrate codebook", "Load a model first.")
            return
        if self.controller.model.hosts:
            QMessageBox.information(
                self,
                "Calibrate codebook",
                rich_from_plain(
                    "The app calibrates on this computer only. For the model on these hosts, run "
                    f"a2ats calibrate --hosts {self.controller.model.hosts} --model SOURCE --out "
                    "FILE, then load the codebook (Ctrl+L); or choose Run on this computer."
                ),
            )
            return
        dialog = CalibrateDialog(model_label(self.controller.model), codebooks_dir(), self)
        dialog.start_requested.connect(self.controller.calibrate)
        dialog.cancel_requested.connect(self.controller.cancel_calibration)
        self.calibrate_dialog = dialog
        dialog.finished.connect(lambda _r: setattr(self, "calibrate_dialog", None))
        dialog.show()

    def _on_calibration_finished(self, finished: CalibrationFinished) -> None:
        self.statusBar().showMessage(
            f"Calibrated in {finished.seconds:.0f} s; saved to {finished.path}", 10000
        )
        if self.calibrate_dialog is not None:
            self.calibrate_dialog.on_finished(finished.path)

    def _on_calibration_cancelled(self) -> None:
        self.statusBar().showMessage("Calibration cancelled", 5000)
        if self.calibrate_dialog is not None:
            self.calibrate_dialog.on_cancelled()
