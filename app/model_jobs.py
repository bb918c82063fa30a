"""The controller's engine jobs other than replies: finding and fetching the demo model, loading
a model and its codebook, calibrating one, and measuring the crossover, with the worker's
answers to them.

`ModelJobs` is a part of `ChatController` (controller.py), not an object of its own: the
controller is `ChatController(ModelJobs, QObject)`, so its state (the settings, the model and
codebook in use, the task) has one owner and a request still goes window -> controller ->
worker. No widgets.
"""

from __future__ import annotations

import os
from dataclasses import replace
from enum import StrEnum
from typing import TYPE_CHECKING, Any

from .events import (
    CalibrationFinished,
    CalibrationRequest,
    ClearCodebook,
    CodebookLoaded,
    DemoStatus,
    EngineRequest,
    ErrorReport,
    FetchDemo,
    FindDemo,
    Job,
    LoadCodebook,
    LoadModel,
    MeasureCrossover,
    ModelLoaded,
)
from .worker import DEMO

if TYPE_CHECKING:
    from .replies import ReplyInProgress
    from .settings import AppSettings
    from .worker import EngineThread


class Task(StrEnum):
    """What the engine is busy with, as far as the user is concerned."""

    IDLE = "idle"
    LOADING = "loading"
    FETCHING = "fetching"
    CALIBRATING = "calibrating"
    GENERATING = "generating"


class ModelJobs:
    """The model, codebook, demo, calibration and crossover part of `ChatController`."""

    if TYPE_CHECKING:  # what it uses of the controller (defined there)
        settings: AppSettings
        engine: EngineThread
        model: ModelLoaded | None
        codebook: CodebookLoaded | None
        reply: ReplyInProgress | None
        ephemeral: bool
        _calibrations: int  # the number of the last calibration sent (a cancel's limit)
        _crossovers: int  # the number of the last crossover measurement sent
        model_loaded: Any  # and the other signals emitted below
        codebook_loaded: Any
        codebook_cleared: Any
        demo_missing: Any
        error_reported: Any
        calibration_finished: Any
        calibration_cancelled: Any

        def _send(self, request: EngineRequest) -> None: ...
        def _set_job(self, job: Task) -> None: ...
        def stop(self) -> None: ...
        def change_settings(self, *, save: bool = True, **values: Any) -> frozenset[str]: ...

    def start(self, ask_for_demo: bool = True) -> None:
        """Load the remembered model; for the demo model, first check it was fetched."""
        source = self.settings.model_source or DEMO
        if source == DEMO and ask_for_demo:
            self._send(FindDemo())
        else:
            self.load_model(source)

    def _on_demo_found(self, status: DemoStatus) -> None:
        if status.folder:
            self.load_model(DEMO)
        else:
            self.demo_missing.emit()

    def fetch_demo(self) -> None:
        """Fetch the demo model and build its default codebook, then load it."""
        self._set_job(Task.FETCHING)
        self._send(FetchDemo())

    def _on_demo_fetched(self, _folder: str) -> None:
        self._set_job(Task.IDLE)
        self.load_model(DEMO)

    def load_model(self, source: str, hosts: str | None = None) -> None:
        """Load a model (folder, .gguf, HF repo id or "demo") and its remembered codebook, where
        models run (`settings.hosts`), or on `hosts` ("": this computer; a hosts file: split
        over its hosts)."""
        self.stop()
        self._set_job(Task.LOADING)
        remembered = self.settings.codebook_for_model.get(source, "")
        hosts = self.settings.hosts if hosts is None else hosts
        self._send(LoadModel(source, remembered, self.settings.auto_load_demo_codebook, hosts))

    def run_on(self, hosts: str) -> None:
        """Run the models on this computer ("") or split over the hosts of a hosts file: the
        model in use (or the remembered one) loads again there. The choice is kept once a
        model loaded there; a failure leaves it as it was."""
        self.load_model(self.model.source if self.model else self.settings.model_source, hosts)

    def _on_model_loaded(self, loaded: ModelLoaded) -> None:
        self.model, self.codebook = loaded, None
        recent = self.settings.recent_with(loaded.source)
        where = {"run_on_hosts": bool(loaded.hosts)}
        if loaded.hosts:
            where["hosts_file"] = loaded.hosts
        self.change_settings(model_source=loaded.source, recent_models=recent, **where)
        self._set_job(Task.IDLE)
        self.model_loaded.emit(loaded)
        if self.auto_measure_crossover() and not loaded.hosts:  # hosts measure their own
            self._measure(loaded.source, automatic=True)

    def auto_measure_crossover(self) -> bool:
        """Measure a model's crossover the first time it is loaded here: on by default (setting
        `auto_measure_crossover`), never in a scripted run, never with A2ATS_NO_AUTO_CROSSOVER=1
        (the test suite sets it: a measurement would write the crossover table tests read)."""
        disabled = os.environ.get("A2ATS_NO_AUTO_CROSSOVER") == "1"
        return self.settings.auto_measure_crossover and not self.ephemeral and not disabled

    def measure_crossover(self) -> None:
        """Measure the loaded model's crossover on this machine again (model menu); it runs on
        the engine thread in the background and a sent message cancels it."""
        if self.model is not None:
            self._measure(self.model.source, automatic=False)

    def _measure(self, source: str, automatic: bool) -> None:
        """Numbered: a message sent later cancels it, also while it is still queued."""
        self._crossovers += 1
        config = self.settings.cache.to_config()  # what the next reply runs with
        self._send(MeasureCrossover(source, automatic, self._crossovers, config))

    def load_codebook(self, path: str) -> None:
        self._send(LoadCodebook(path, automatic=False))

    def clear_codebook(self) -> None:
        self._send(ClearCodebook())

    def _on_codebook_loaded(self, info: CodebookLoaded) -> None:
        self.codebook = info
        if self.model is not None and not info.automatic:
            remembered = {**self.settings.codebook_for_model, self.model.source: info.path}
            self.change_settings(codebook_for_model=remembered)
        self.codebook_loaded.emit(info)

    def _on_codebook_cleared(self) -> None:
        self.codebook = None
        if self.model is not None:
            remembered = dict(self.settings.codebook_for_model)
            remembered.pop(self.model.source, None)
            self.change_settings(codebook_for_model=remembered)
        self.codebook_cleared.emit()

    def calibrate(self, request: CalibrationRequest) -> None:
        """Calibrate a codebook (numbered: a cancel also cancels one still queued)."""
        self.stop()
        self._set_job(Task.CALIBRATING)
        self._calibrations += 1
        self._send(replace(request, cache=self.settings.cache, seq=self._calibrations))

    def cancel_calibration(self) -> None:
        """Direct call (the worker is busy with it): cancels the running calibration and any
        still queued."""
        self.engine.worker.cancel_calibration(self._calibrations)

    def _on_calibration_finished(self, finished: CalibrationFinished) -> None:
        self._set_job(Task.IDLE)
        self.calibration_finished.emit(finished)

    def _on_calibration_cancelled(self) -> None:
        self._set_job(Task.IDLE)
        self.calibration_cancelled.emit()

    def _on_failed(self, report: ErrorReport) -> None:
        if report.task in (Job.LOAD_MODEL, Job.FETCH_DEMO, Job.CALIBRATE):
            self._set_job(Task.IDLE)
        if report.task == Job.GENERATE and self.reply is not None:
            self.reply.error = report.message
        self.error_reported.emit(report)
