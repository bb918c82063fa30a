"""EngineWorker on its "engine" QThread: signal order, stop, failures, calibration; with a fake
backend and with the real engine on the tiny model."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
from PySide6.QtCore import QObject

from a2ats_engine.cache.telemetry import CacheSnapshot, GenerationStats, TokenEvent
from a2ats_engine.records import SamplingSettings
from app.events import (
    CalibrationRequest,
    CodebookLoaded,
    ContextTokens,
    ErrorReport,
    GenerationRequest,
    GenerationStarted,
    LoadCodebook,
    LoadModel,
    MeasureCrossover,
    ModelLoaded,
)
from app.settings import CacheSettings
from app.worker import EngineThread

from .fakes import FakeBackend
from .helpers import Requests

SIGNALS = (
    "model_loaded", "codebook_loaded", "progress", "failed", "generation_started",
    "token_generated", "snapshot_ready", "context_updated", "generation_finished",
    "calibration_finished", "calibration_cancelled", "crossover_measured",
)  # fmt: skip


class _Receiver(QObject):
    """A bound-method receiver in the GUI thread (a lambda would run on the engine thread)."""

    def __init__(self, recorder: Recorder, name: str, worker) -> None:
        super().__init__(recorder)
        self.recorder, self.name = recorder, name
        getattr(worker, name).connect(self.receive)

    def receive(self, payload=None) -> None:
        self.recorder.threads.add(threading.current_thread().name)
        self.recorder.events.append((self.name, payload))


class Recorder(QObject):
    """Records every worker signal as (name, payload), in arrival order."""

    def __init__(self, worker) -> None:
        super().__init__()
        self.events: list[tuple[str, object]] = []
        self.threads: set[str] = set()
        self.receivers = [_Receiver(self, name, worker) for name in SIGNALS]

    def names(self) -> list[str]:
        return [n for n, _ in self.events]

    def of(self, name: str) -> list:
        return [p for n, p in self.events if n == name]


@pytest.fixture
def engine(qtbot):
    threads = []

    def make(backend=None):
        thread = EngineThread(backend)
        thread.send = Requests(thread.worker)  # what the controller's request signal does
        thread.recorder = Recorder(thread.worker)
        threads.append(thread)
        return thread, thread.recorder

    yield make
    for thread in threads:
        thread.shutdown()


def request(engine_thread, text="hi", mode="send", history=(), **kwargs) -> GenerationRequest:
    values = dict(
        request_id=engine_thread.send.next_request_id(), conversation_id="c1", mode=mode,
        text=text,
        history=tuple(history), system_prompt="", sampling=SamplingSettings(max_tokens=40),
        cache=CacheSettings(), telemetry=False,
    )  # fmt: skip
    values.update(kwargs)
    return GenerationRequest(**values)


def wait_for(qtbot, recorder, name, count=1, timeout=30000):
    qtbot.waitUntil(lambda: len(recorder.of(name)) >= count, timeout=timeout)


def test_engine_thread_is_named_and_receivers_run_in_the_gui_thread(engine, qtbot):
    thread, recorder = engine(FakeBackend())
    assert thread.thread.objectName() == "engine"
    assert thread.worker.thread() is thread.thread
    thread.send(LoadModel("fake"))
    wait_for(qtbot, recorder, "model_loaded")
    assert recorder.threads == {threading.current_thread().name}


def test_generation_signals_in_order(engine, qtbot):
    thread, recorder = engine(FakeBackend(snapshots=True))
    thread.send(LoadModel("fake"))
    wait_for(qtbot, recorder, "model_loaded")
    (loaded,) = recorder.of("model_loaded")
    assert isinstance(loaded, ModelLoaded) and loaded.info.name == "FakeLM-1M"
    thread.send(request(thread, "abc"))
    wait_for(qtbot, recorder, "generation_finished")
    names = [n for n in recorder.names() if n not in ("model_loaded", "progress")]
    reply = "You said: abc"
    # started, context (prompt + first token), then per token: token + snapshot, then the final
    # context and finished.
    expected = ["generation_started", "token_generated", "context_updated", "snapshot_ready"]
    expected += ["token_generated", "snapshot_ready"] * (len(reply) - 1)
    expected += ["context_updated", "generation_finished"]
    assert names[:3] == ["generation_started", "context_updated", "token_generated"]
    assert sorted(names) == sorted(expected)
    assert names[-2:] == ["context_updated", "generation_finished"]
    started = recorder.of("generation_started")[0]
    assert (
        isinstance(started, GenerationStarted)
        and started.provenance["model"]["name"] == "FakeLM-1M"
    )
    assert started.notes  # A2ATS on without a codebook is announced
    tokens = recorder.of("token_generated")
    assert all(isinstance(t, TokenEvent) for t in tokens)
    assert "".join(t.text for t in tokens) == reply
    assert all(isinstance(s, CacheSnapshot) for s in recorder.of("snapshot_ready"))
    stats = recorder.of("generation_finished")[0]
    assert isinstance(stats, GenerationStats) and stats.stop_reason == "stop"
    first, final = recorder.of("context_updated")
    assert isinstance(final, ContextTokens)
    assert final.messages[-1] == ("assistant", reply)
    assert "".join(final.texts).endswith(reply)
    assert len(first.token_ids) == len(final.token_ids) - len(reply) + 1


def test_stop_while_generating_is_a_direct_call(engine, qtbot):
    thread, recorder = engine(FakeBackend(delay=0.02, reply_fn=lambda m: "x" * 500))
    thread.send(LoadModel("fake"))
    wait_for(qtbot, recorder, "model_loaded")
    req = request(thread)
    thread.send(req)
    wait_for(qtbot, recorder, "token_generated", 3)
    seen_at_stop = len(recorder.of("token_generated"))
    thread.worker.stop(req.request_id)
    wait_for(qtbot, recorder, "generation_finished")
    stats = recorder.of("generation_finished")[0]
    assert stats.stop_reason == "cancelled"
    # The reply ended within a few tokens of the stop (counted, not timed), not after 500.
    assert stats.generation_tokens < seen_at_stop + 50 < 500


def test_stop_of_a_queued_request(engine, qtbot):
    thread, recorder = engine(FakeBackend(delay=0.01, reply_fn=lambda m: "y" * 30))
    thread.send(LoadModel("fake"))
    wait_for(qtbot, recorder, "model_loaded")
    first, second = request(thread), request(thread, history=())
    thread.send(first)
    thread.send(second)
    thread.worker.stop(second.request_id)  # still queued behind the first
    wait_for(qtbot, recorder, "generation_finished", 2)
    a, b = recorder.of("generation_finished")
    assert a.stop_reason == "stop" and b.stop_reason == "cancelled" and b.generation_tokens == 0


def test_regenerate_and_edit_use_the_session(engine, qtbot):
    backend = FakeBackend()
    thread, recorder = engine(backend)
    thread.send(LoadModel("fake"))
    wait_for(qtbot, recorder, "model_loaded")
    thread.send(request(thread, "one"))
    wait_for(qtbot, recorder, "generation_finished", 1)
    history = (("user", "one"), ("assistant", "You said: one"))
    thread.send(request(thread, mode="regenerate", text="", history=history))
    wait_for(qtbot, recorder, "generation_finished", 2)
    thread.send(request(thread, "two", mode="edit", history=history))
    wait_for(qtbot, recorder, "generation_finished", 3)
    session = backend.sessions[0]
    assert [c for c in session.calls if c in ("send", "regenerate", "edit")] == [
        "send",
        "regenerate",
        "edit",
    ]
    assert "load_messages" not in session.calls  # the session already held the history
    assert session.messages == [
        {"role": "user", "content": "two"}, {"role": "assistant", "content": "You said: two"},
    ]  # fmt: skip


def test_history_mismatch_reloads_messages(engine, qtbot):
    backend = FakeBackend()
    thread, recorder = engine(backend)
    thread.send(LoadModel("fake"))
    wait_for(qtbot, recorder, "model_loaded")
    history = (("user", "earlier"), ("assistant", "reply"))
    thread.send(request(thread, "next", history=history))
    wait_for(qtbot, recorder, "generation_finished")
    assert "load_messages" in backend.sessions[0].calls
    assert backend.sessions[0].messages[:2] == [
        {"role": "user", "content": "earlier"}, {"role": "assistant", "content": "reply"},
    ]  # fmt: skip


def test_bad_model_keeps_the_previous_one(engine, qtbot, tmp_path):
    thread, recorder = engine(FakeBackend())
    thread.send(LoadModel("fake"))
    wait_for(qtbot, recorder, "model_loaded")
    thread.send(LoadModel(str(tmp_path / "missing")))
    wait_for(qtbot, recorder, "failed")
    (report,) = recorder.of("failed")
    assert isinstance(report, ErrorReport) and report.task == "load_model"
    assert "missing" in report.message and "\n" not in report.message
    thread.send(request(thread, "still there?"))
    wait_for(qtbot, recorder, "generation_finished")
    assert recorder.of("generation_finished")[0].stop_reason == "stop"


def test_codebook_load_and_mismatch(engine, qtbot, tmp_path):
    thread, recorder = engine(FakeBackend())
    thread.send(LoadModel("fake"))
    wait_for(qtbot, recorder, "model_loaded")
    good, bad = tmp_path / "good.safetensors", tmp_path / "bad.safetensors"
    good.write_text("layers=2")
    bad.write_text("layers=30")
    thread.send(LoadCodebook(str(good)))
    wait_for(qtbot, recorder, "codebook_loaded")
    thread.send(LoadCodebook(str(bad)))
    wait_for(qtbot, recorder, "failed")
    (info,) = recorder.of("codebook_loaded")
    assert isinstance(info, CodebookLoaded) and info.name == "good.safetensors"
    assert "30 layers" in recorder.of("failed")[0].message
    thread.send(request(thread))
    wait_for(qtbot, recorder, "generation_started")
    provenance = recorder.of("generation_started")[0].provenance
    assert provenance["codebook"]["name"] == "good.safetensors"  # the good one stayed active


def test_calibration_progress_finish_and_cancel(engine, qtbot, tmp_path):
    thread, recorder = engine(FakeBackend(delay=0.005))
    thread.send(LoadModel("fake"))
    wait_for(qtbot, recorder, "model_loaded")
    out = tmp_path / "cb.safetensors"
    thread.send(
        CalibrationRequest(
            output=str(out), tokens=1024, n_centroids=64, cache=CacheSettings(), seq=1
        )
    )
    wait_for(qtbot, recorder, "codebook_loaded")
    stages = [p.stage for p in recorder.of("progress") if p.task == "calibrate"]
    assert stages[0] == "collecting" and stages[-1] == "clustering"
    assert recorder.of("calibration_finished")[0].path == str(out)
    assert out.exists()
    thread.send(
        CalibrationRequest(output=str(tmp_path / "c2.safetensors"), cache=CacheSettings(), seq=2)
    )
    qtbot.waitUntil(lambda: len([p for p in recorder.of("progress") if p.task == "calibrate"]) > 70)
    thread.worker.cancel_calibration(2)  # direct: the worker is busy calibrating
    wait_for(qtbot, recorder, "calibration_cancelled")
    assert not (tmp_path / "c2.safetensors").exists()


def test_a_crossover_cancel_reaches_a_measurement_still_queued(engine, qtbot):
    """The message that cancels a measurement can be sent before the measurement starts (it
    waits behind another request): it is cancelled as it starts, never run."""
    backend = FakeBackend(delay=0.01, reply_fn=lambda m: "z" * 2000)
    thread, recorder = engine(backend)
    thread.send(LoadModel("fake"))
    wait_for(qtbot, recorder, "model_loaded")
    busy = request(thread)
    thread.send(busy)
    wait_for(qtbot, recorder, "token_generated", 2)
    thread.send(MeasureCrossover("fake", seq=1))
    thread.worker.cancel_crossover(1)  # as a sent message does, while it is still queued
    thread.worker.stop(busy.request_id)
    wait_for(qtbot, recorder, "crossover_measured")
    assert recorder.of("crossover_measured")[0].cancelled and backend.crossover_runs == 0
    thread.send(MeasureCrossover("fake", seq=2))  # a later one runs
    wait_for(qtbot, recorder, "crossover_measured", 2)
    assert recorder.of("crossover_measured")[1].exact_below == 2048


# ----- the real engine on the tiny model -------------------------------------------------------


def test_real_engine_tiny_model(engine, qtbot, tiny_folder, tmp_path):
    thread, recorder = engine()
    thread.send(LoadModel(str(tiny_folder)))
    wait_for(qtbot, recorder, "model_loaded", timeout=120000)
    info = recorder.of("model_loaded")[0].info
    assert info.num_layers == 2 and info.path == str(tiny_folder)
    req = request(
        thread,
        "Hello there",
        sampling=SamplingSettings(max_tokens=24, seed=1),
        telemetry=True,
        cache=CacheSettings.of(window=8, sinks=2, min_k=4, budget=0.1),
    )
    thread.send(req)
    wait_for(qtbot, recorder, "generation_finished", timeout=120000)
    names = recorder.names()
    assert names.index("generation_started") < names.index("token_generated")
    assert names[-2:] == ["context_updated", "generation_finished"]
    stats = recorder.of("generation_finished")[0]
    assert stats.stop_reason in ("stop", "length") and stats.generation_tokens > 0
    snapshots = recorder.of("snapshot_ready")
    assert snapshots and all(isinstance(s, CacheSnapshot) for s in snapshots)
    final = recorder.of("context_updated")[-1]
    assert len(final.token_ids) == stats.context_tokens
    assert final.messages[0] == ("user", "Hello there")
    # The per-token texts spell the context, and the reply is inside it.
    context = "".join(final.texts)
    assert "Hello there" in context and final.messages[-1][1] in context
    # Stop on the real session: a long reply ends early as "cancelled".
    long = request(
        thread,
        "Tell me more",
        sampling=SamplingSettings(max_tokens=2000, seed=2),
        history=final.messages,
    )
    thread.send(long)
    wait_for(
        qtbot, recorder, "token_generated", len(recorder.of("token_generated")) + 3, timeout=120000
    )
    thread.worker.stop(long.request_id)
    wait_for(qtbot, recorder, "generation_finished", 2, timeout=120000)
    stopped = recorder.of("generation_finished")[1]
    assert stopped.stop_reason in ("cancelled", "stop") and stopped.generation_tokens < 2000


def test_real_engine_bad_codebook_file(engine, qtbot, tiny_folder, tmp_path):
    thread, recorder = engine()
    thread.send(LoadModel(str(tiny_folder)))
    wait_for(qtbot, recorder, "model_loaded", timeout=120000)
    junk = tmp_path / "junk.safetensors"
    junk.write_bytes(b"not a safetensors file at all")
    thread.send(LoadCodebook(str(junk)))
    wait_for(qtbot, recorder, "failed")
    report = recorder.of("failed")[0]
    assert report.task == "load_codebook" and report.message and "\n" not in report.message
    assert Path(report.source) == junk


def test_real_engine_calibrates_saves_and_loads(engine, qtbot, tiny_folder, tmp_path):
    thread, recorder = engine()
    thread.send(LoadModel(str(tiny_folder)))
    wait_for(qtbot, recorder, "model_loaded", timeout=120000)
    out = tmp_path / "codebooks" / "tiny.safetensors"
    cache = CacheSettings.of(window=8, sinks=2, min_k=4, budget=0.1)
    thread.send(CalibrationRequest(output=str(out), tokens=2048, n_centroids=32, cache=cache))
    wait_for(qtbot, recorder, "codebook_loaded", timeout=300000)
    assert not recorder.of("failed"), recorder.of("failed")
    info = recorder.of("codebook_loaded")[0]
    assert out.exists() and info.n_centroids == 32 and info.num_layers == 2
    assert {p.stage for p in recorder.of("progress") if p.task == "calibrate"} >= {"collecting"}
    thread.send(
        request(
            thread,
            "Hello",
            cache=cache,
            telemetry=True,
            sampling=SamplingSettings(max_tokens=8, seed=0),
        )
    )
    wait_for(qtbot, recorder, "generation_finished", timeout=120000)
    provenance = recorder.of("generation_started")[0].provenance
    assert provenance["codebook"]["sha256"] == info.sha256 and len(info.sha256) == 64
    assert provenance["codebook"]["n_centroids"] == 32  # the codebook carries its size
    assert not recorder.of("generation_started")[0].notes  # no random-codebook warning
    assert recorder.of("generation_finished")[0].stop_reason in ("stop", "length")


def test_a_stop_before_the_reply_starts_is_not_lost(engine, qtbot):
    """The stop comes while the session is being prepared (before the reply starts and
    clears its stop flag): the reply ends before its first token, not after it."""
    holder = {}

    class StopWhilePreparing(FakeBackend):
        def make_session(self, *args, **kwargs):
            holder["thread"].worker.stop(holder["request"].request_id)  # the user pressed Stop
            return super().make_session(*args, **kwargs)

    thread, recorder = engine(StopWhilePreparing(delay=0.01, reply_fn=lambda m: "x" * 200))
    holder["thread"] = thread
    thread.send(LoadModel("fake"))
    wait_for(qtbot, recorder, "model_loaded")
    holder["request"] = req = request(thread)
    thread.send(req)
    wait_for(qtbot, recorder, "generation_finished")
    stats = recorder.of("generation_finished")[0]
    assert stats.stop_reason == "cancelled" and stats.generation_tokens == 0
    assert recorder.of("token_generated") == []
