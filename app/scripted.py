"""Scripted mode: load, (codebook), send one prompt, wait for the reply, screenshot, exit."""

from __future__ import annotations

import sys
from pathlib import Path

from PySide6.QtCore import QObject, QTimer
from PySide6.QtWidgets import QApplication

from a2ats_engine.progress import prefill_text

from .events import ErrorReport, PrefillProgress


class ScriptedRun(QObject):
    """Drives a MainWindow through one exchange; `exit_code` is 0 on success, 1 on failure."""

    def __init__(self, window, args) -> None:
        super().__init__(window)
        self.window = window
        self.args = args
        self.exit_code = 1
        self.stage = "start"
        self._timeout = QTimer(self)
        self._timeout.setSingleShot(True)
        self._timeout.timeout.connect(self._on_timeout)
        window.model_ready.connect(self._on_model_ready)
        window.codebook_ready.connect(self._on_codebook_loaded)
        window.error_shown.connect(self._on_error)
        window.reply_finished.connect(self._on_reply_finished)
        window.controller.prefill_progressed.connect(self._on_prefill)

    def start(self) -> None:
        self._timeout.start(int(self.args.timeout * 1000))
        self.stage = "load_model"
        self.window.controller.load_model(self.args.model, getattr(self.args, "hosts", "") or "")

    def _on_model_ready(self, _loaded) -> None:
        if self.stage != "load_model":
            return
        if self.args.codebook:
            self.stage = "load_codebook"
            self.window.controller.load_codebook(self.args.codebook)
        else:
            self._send()

    def _on_codebook_loaded(self, info) -> None:
        if self.stage == "load_codebook" and Path(info.path) == Path(self.args.codebook):
            self._send()

    def _send(self) -> None:
        if not self.args.prompt:
            self.stage = "screenshot"
            QTimer.singleShot(300, self._finish)
            return
        if self.window.controller.read_only:
            self._fail(self.window.controller.ready_reason())  # another instance writes there
            return
        self.stage = "generate"
        self.window.new_chat()
        self.window.send(self.args.prompt)

    def _on_prefill(self, progress: PrefillProgress) -> None:
        """A long prompt's prefill progress on stderr, one line per chunk."""
        text = prefill_text(progress.done, progress.total, progress.seconds)
        if text and self.stage == "generate":
            print(text, file=sys.stderr, flush=True)

    def _on_reply_finished(self, stats) -> None:
        if self.stage != "generate":
            return
        if stats.stop_reason == "error":
            self._fail("the reply failed")  # the error itself was reported by _on_error
            return
        self.stage = "screenshot"
        QTimer.singleShot(400, self._finish)  # let the last render and the panels settle

    def _on_error(self, report: ErrorReport) -> None:
        if self.stage in ("load_model", "load_codebook", "generate"):
            if report.task == "load_codebook" and self.stage != "load_codebook":
                return  # an automatic codebook that did not fit: the run goes on without it
            self._fail(report.message)

    def _finish(self) -> None:
        window = self.window
        if window.inspector is not None and hasattr(window.inspector, "flush"):
            window.inspector.flush(force=True)
        QApplication.processEvents()
        try:
            if self.args.screenshot:
                path = Path(self.args.screenshot)
                path.parent.mkdir(parents=True, exist_ok=True)
                if not window.grab().save(str(path), "PNG"):
                    raise OSError(f"could not write {path}")
                print(f"screenshot: {path}")
            if self.args.export_telemetry:
                if window.inspector is None:
                    raise RuntimeError("the cache inspector is not available")
                meta = {
                    "model": window.controller.model.source if window.controller.model else None,
                    "prompt": self.args.prompt,
                }
                out = window.inspector.export_telemetry(self.args.export_telemetry, meta)
                print(f"telemetry: {out}")
        except Exception as exc:  # noqa: BLE001
            self._fail(str(exc))
            return
        reply = (
            window.controller.current.messages[-1].content
            if window.controller.current and window.controller.current.messages
            else ""
        )
        if reply:
            print(f"reply: {reply[:200]!r}")
        self.exit_code = 0
        self.stage = "done"
        self._timeout.stop()
        if self.args.quit:
            window.close()
            QApplication.instance().quit()

    def _on_timeout(self) -> None:
        self._fail(f"timed out after {self.args.timeout:.0f} s while in stage {self.stage}")

    def _fail(self, message: str) -> None:
        if self.stage == "failed":
            return
        self.stage = "failed"
        self.exit_code = 1
        self._timeout.stop()
        print(f"a2ats-chat: {message}", file=sys.stderr)
        self.window.close()
        QApplication.instance().quit()
