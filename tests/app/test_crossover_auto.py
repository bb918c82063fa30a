"""The app measures a model's crossover the first time it is loaded on a machine (background,
cancellable, re-measurable from the Model menu), and the engine backend records it."""

from __future__ import annotations

import json

import pytest

from app.events import CrossoverMeasured
from app.settings import AppSettings

from .fakes import FakeBackend
from .test_controller import load, send


@pytest.fixture
def auto(monkeypatch):
    monkeypatch.delenv("A2ATS_NO_AUTO_CROSSOVER", raising=False)


def measured(qtbot, controller, action) -> CrossoverMeasured:
    with qtbot.waitSignal(controller.crossover_measured, timeout=60000) as blocker:
        action()
    return blocker.args[0]


def test_the_first_load_measures_the_crossover_in_the_background(
    auto,
    make_controller,
    qtbot,
):
    backend = FakeBackend()
    controller = make_controller(backend)
    stages = []
    controller.progress.connect(lambda p: stages.append(p.stage) if p.task == "crossover" else 0)
    result = measured(qtbot, controller, lambda: controller.load_model("fake"))
    assert result == CrossoverMeasured(2048, False, ((1024, 0.9), (2048, 1.1), (4096, 1.3)))
    assert backend.crossover_runs == 1
    assert stages and stages[0] == "context 1024"  # progress for the status bar
    # measured here already: the next load says so and measures nothing
    backend.crossover_known = True
    again = measured(qtbot, controller, lambda: controller.load_model("fake"))
    assert again.skipped and backend.crossover_runs == 1
    # the Model menu measures again whatever the table holds
    menu = measured(qtbot, controller, controller.measure_crossover)
    assert menu.exact_below == 2048 and backend.crossover_runs == 2


def test_new_cache_settings_measure_the_crossover_for_them(auto, make_controller, qtbot):
    """Settings that change what a retrieval step costs (here the estimate) are measured as on
    a first load, with the new settings, unless this machine has a row for them already."""
    from dataclasses import replace

    backend = FakeBackend()
    controller = make_controller(backend)
    measured(qtbot, controller, lambda: controller.load_model("fake"))
    assert backend.crossover_runs == 1 and not backend.crossover_asked.estimate_missed
    cache = controller.settings.cache
    on = replace(cache, config=replace(cache.config, estimate_missed=True))
    result = measured(qtbot, controller, lambda: controller.change_settings(cache=on))
    assert backend.crossover_runs == 2 and result.exact_below == 2048
    assert backend.crossover_asked.estimate_missed  # measured with the new settings
    backend.crossover_known = True  # a row for them: nothing measured again
    off = measured(qtbot, controller, lambda: controller.change_settings(cache=cache))
    assert off.skipped and backend.crossover_runs == 2
    controller.change_settings(theme="dark")  # not the cache: nothing asked
    qtbot.wait(200)
    assert backend.crossover_runs == 2


def test_a_message_sent_while_it_measures_cancels_it_and_is_answered(auto, make_controller, qtbot):
    backend = FakeBackend()
    backend.crossover_delay = 0.5
    controller = make_controller(backend)
    with qtbot.waitSignal(controller.crossover_measured, timeout=60000) as blocker:
        load(qtbot, controller)
        controller.new_chat()
        ended = send(qtbot, controller, "Hello")
    assert blocker.args[0].cancelled
    assert ended.message is not None and ended.message.content


def test_no_measurement_when_switched_off_or_scripted(
    auto,
    make_controller,
    qtbot,
):
    backend = FakeBackend()
    controller = make_controller(backend, AppSettings(auto_measure_crossover=False))
    load(qtbot, controller)
    scripted = make_controller(backend)
    scripted.ephemeral = True
    load(qtbot, scripted)
    qtbot.wait(200)
    assert backend.crossover_runs == 0


def test_the_engine_backend_measures_records_and_can_be_cancelled(tmp_path, monkeypatch):
    import threading

    from tiny import tiny_model

    from a2ats_engine.cache import crossover as xo
    from a2ats_engine.cache import native_step
    from a2ats_engine.cache.config import A2ATSConfig
    from app.backend import CrossoverCancelled, EngineBackend

    table = tmp_path / "crossover.json"
    monkeypatch.setenv("A2ATS_CROSSOVER_FILE", str(table))
    xo.reload_user_table()
    model = tiny_model("llama", max_position_embeddings=2048)
    backend, stages = EngineBackend(), []
    assert not backend.crossover_measured_here(model)
    estimate = A2ATSConfig(estimate_missed=True)
    cancel = threading.Event()
    entry = backend.measure_crossover(model, "tiny", None, lambda *a: stages.append(a), cancel)
    assert set(entry["ratios"]) == {"1024", "2048"}  # the contexts within the model's own
    (row,) = json.loads(table.read_text())["entries"]
    assert row["exact_below"] == entry["exact_below"] and row["model"] == "tiny"
    assert backend.crossover_measured_here(model) and stages
    assert not backend.crossover_measured_here(model, estimate)  # other settings: not measured
    backend.measure_crossover(model, "tiny", None, lambda *a: None, cancel, estimate)
    assert backend.crossover_measured_here(model, estimate)
    assert len(json.loads(table.read_text())["entries"]) == 2
    with native_step.forced("native"):  # both measured with the graph step: not for this one
        assert not backend.crossover_measured_here(model)
    # the default leaves the estimate to the measurement: a row without it is measured again
    assert row["estimate"]["context"] == 2048 and "ratio" in row["estimate"]
    data = json.loads(table.read_text())
    data["entries"] = [{k: v for k, v in e.items() if k != "estimate"} for e in data["entries"]]
    table.write_text(json.dumps(data))
    xo.reload_user_table()
    assert not backend.crossover_measured_here(model)
    assert backend.crossover_measured_here(model, A2ATSConfig(estimate_missed=False))
    cancel.set()
    with pytest.raises(CrossoverCancelled):
        backend.measure_crossover(model, "tiny", None, lambda *a: None, cancel)
    xo.reload_user_table()


@pytest.mark.parametrize(
    "ratio, state, layers",
    [(0.98, "on", 30), (0.81, "off", 0), (0.87, "on the 11 layers that miss most", 11)],
)
def test_the_status_bar_says_whether_the_measurement_turned_the_estimate_on(
    auto, make_window, qtbot, ratio, state, layers
):
    backend = FakeBackend()
    on = state != "off"
    backend.crossover_estimate = {"ratio": ratio, "on": on, "context": 4096, "layers": layers}
    window = make_window(backend)
    result = measured(qtbot, window.controller, lambda: window.controller.load_model("fake"))
    assert result.estimate == ratio and result.estimate_on is on
    assert result.estimate_layers == {30: None, 0: 0, 11: 11}[layers]  # None: every layer
    message = window.statusBar().currentMessage()
    assert message.startswith("Measured on this machine: retrieval pays off from 2,048 tokens")
    assert f"missed-attention estimate {state} by default ({ratio:.2f}x the speed" in message
