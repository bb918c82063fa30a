"""Main window flows on a fake engine (fast, controllable) and on the real tiny model."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from PySide6.QtCore import Qt, QTimer
from PySide6.QtTest import QTest

from a2ats_engine.records import SamplingSettings
from app.context_text import ContextMap
from app.controller import Task
from app.conversations import HistoryStore
from app.settings import CacheSettings, load_settings, settings_path

from .fakes import FakeBackend, in_turn
from .helpers import load, reply, streamed


def counting_reply(prefix="Answer"):
    calls = {"n": 0}

    def fn(messages):
        calls["n"] += 1
        return f"{prefix} {calls['n']} to {messages[-1]['content']}"

    return fn


# ----- send / stream / stop / regenerate / edit --------------------------------------------------


def test_send_streams_renders_and_saves(make_window, qtbot):
    window = make_window(FakeBackend(delay=0.003, reply_fn=lambda m: "Hello **world**, `x = 1`."))
    load(qtbot, window)
    assert window.composer.button.isEnabled() is False  # empty box
    window.composer.set_text("hi there")
    assert window.composer.button.isEnabled()
    seen_streaming = []
    with qtbot.waitSignal(window.reply_finished, timeout=20000):
        qtbot.mouseClick(window.composer.button, Qt.MouseButton.LeftButton)
        qtbot.waitUntil(lambda: window.chat_view._stream_widget is not None, timeout=5000)
        seen_streaming.append(window.composer.generating)
    assert seen_streaming == [True]
    conversation = window.controller.current
    assert [m.role for m in conversation.messages] == ["user", "assistant"]
    assert conversation.messages[1].content == "Hello **world**, `x = 1`."
    assert conversation.title == "hi there"
    widget = window.chat_view.last_widget()
    assert widget.view.toPlainText() == "Hello world, x = 1."  # Markdown rendered
    assert "tok/s" in widget.stats.text()
    assert window.composer.text() == "" and not window.composer.generating
    provenance = conversation.messages[1].provenance
    assert provenance["model"]["name"] == "FakeLM-1M"
    assert (
        provenance["cache"]["a2ats_enabled"] is True and "window" in provenance["cache"]["config"]
    )
    assert provenance["stats"]["stop_reason"] == "stop"
    assert provenance["stats"]["generation_tokens"] == len("Hello **world**, `x = 1`.")
    saved = json.loads(window.controller.store.path_for(conversation.id).read_text())
    assert saved["messages"][1]["provenance"]["stats"]["stop_reason"] == "stop"
    assert "tok/s" in window.status.speed.text() and "ctx" in window.status.context.text()
    assert window.status.ttft.text().startswith("TTFT")


def test_enter_sends_and_shift_enter_adds_a_line(make_window, qtbot):
    window = make_window(FakeBackend())
    load(qtbot, window)
    edit = window.composer.edit
    edit.setFocus()
    QTest.keyClicks(edit, "line one")
    QTest.keyClick(edit, Qt.Key.Key_Return, Qt.KeyboardModifier.ShiftModifier)
    QTest.keyClicks(edit, "line two")
    assert edit.toPlainText() == "line one\nline two"
    assert window.controller.current.messages == []
    with qtbot.waitSignal(window.reply_finished, timeout=20000):
        QTest.keyClick(edit, Qt.Key.Key_Return)
    assert window.controller.current.messages[0].content == "line one\nline two"
    assert window.controller.current.messages[1].content == "You said: line one\nline two"


@pytest.mark.parametrize("how", ["escape", "button", "shortcut"])
def test_stop_keeps_the_partial_reply(make_window, qtbot, how):
    long_once = lambda m: "z" * 1000 if m[-1]["content"] == "go" else "ok"  # noqa: E731
    window = make_window(FakeBackend(delay=0.01, reply_fn=long_once))
    load(qtbot, window)
    window.send("go")
    qtbot.waitUntil(lambda: streamed(window) >= 5, timeout=10000)
    with qtbot.waitSignal(window.reply_finished, timeout=10000) as blocker:
        if how == "escape":
            QTest.keyClick(window.composer.edit, Qt.Key.Key_Escape)
        elif how == "button":
            assert window.composer.button.accessibleName() == "Stop generating"
            qtbot.mouseClick(window.composer.button, Qt.MouseButton.LeftButton)
        else:
            window.stop_action.trigger()
    assert blocker.args[0].stop_reason == "cancelled"
    message = window.controller.current.messages[-1]
    assert message.role == "assistant" and 0 < len(message.content) < 1000
    assert message.provenance["stats"]["stop_reason"] == "cancelled"
    assert "stopped" in window.chat_view.last_widget().stats.text()
    assert not window.composer.generating
    reply(qtbot, window, "again")  # the app is usable after a stop


def _prefill_note(window) -> str:
    widget = window.chat_view.last_widget()
    return widget.note.text() if widget is not None and widget.note.isVisibleTo(window) else ""


def test_a_long_prefill_shows_its_progress_in_the_reply(make_window, qtbot):
    # 10 chunks of 0.1 s: time enough to see the note however busy the machine is
    window = make_window(FakeBackend(delay=0.1, prefill_chunk=300, reply_fn=lambda _m: "ok"))
    load(qtbot, window)
    window.send("p" * 3000)  # the fake tokenizer: one token per character
    qtbot.waitUntil(lambda: "left" in _prefill_note(window), timeout=10000)
    note = _prefill_note(window)
    total = len(window.controller.engine.worker.backend.sessions[-1].prompt_token_ids())
    assert note.startswith("Reading the prompt: ") and f" / {total:,} tokens (" in note
    reply(qtbot, window)
    assert _prefill_note(window) == ""  # gone once the reply streams
    assert window.controller.current.messages[-1].content


def test_stop_during_a_long_prefill_ends_the_reply_between_chunks(make_window, qtbot):
    window = make_window(FakeBackend(delay=0.05, prefill_chunk=100))
    load(qtbot, window)
    window.send("p" * 3000)
    qtbot.waitUntil(lambda: "left" in _prefill_note(window), timeout=10000)
    with qtbot.waitSignal(window.reply_finished, timeout=10000) as blocker:
        window.stop_action.trigger()
    assert blocker.args[0].stop_reason == "cancelled" and blocker.args[0].generation_tokens == 0
    assert _prefill_note(window) == ""
    assert not window.composer.generating


def test_regenerate_replaces_the_last_reply(make_window, qtbot):
    backend = FakeBackend(reply_fn=counting_reply())
    window = make_window(backend)
    load(qtbot, window)
    reply(qtbot, window, "question")
    assert window.controller.current.messages[-1].content == "Answer 1 to question"
    button = window.chat_view.last_widget().regenerate_button
    assert button.isVisibleTo(window)
    with qtbot.waitSignal(window.reply_finished, timeout=20000):
        qtbot.mouseClick(button, Qt.MouseButton.LeftButton)
    assert [m.content for m in window.controller.current.messages] == [
        "question",
        "Answer 2 to question",
    ]
    assert len(window.chat_view.widgets) == 2
    session = backend.sessions[0]
    assert "regenerate" in session.calls and "load_messages" not in session.calls


def test_edit_and_resend_last_user_message(make_window, qtbot):
    backend = FakeBackend(reply_fn=counting_reply())
    window = make_window(backend)
    load(qtbot, window)
    reply(qtbot, window, "first")
    reply(qtbot, window, "secnd")
    user_widget = window.chat_view.widgets[-2]
    assert user_widget.edit_button.isVisibleTo(window)
    assert not window.chat_view.widgets[0].edit_button.isVisibleTo(window)  # only the last
    qtbot.mouseClick(user_widget.edit_button, Qt.MouseButton.LeftButton)
    assert window.composer.editing and window.composer.text() == "secnd"
    window.composer.set_text("second")
    with qtbot.waitSignal(window.reply_finished, timeout=20000):
        QTest.keyClick(window.composer.edit, Qt.Key.Key_Return)
    contents = [m.content for m in window.controller.current.messages]
    assert contents == ["first", "Answer 1 to first", "second", "Answer 3 to second"]
    assert not window.composer.editing
    assert "edit" in backend.sessions[0].calls
    assert [w.message.content for w in window.chat_view.widgets] == contents


def test_edit_can_be_cancelled_with_escape(make_window, qtbot):
    window = make_window(FakeBackend())
    load(qtbot, window)
    reply(qtbot, window, "keep me")
    window.begin_edit_last()
    assert window.composer.editing
    QTest.keyClick(window.composer.edit, Qt.Key.Key_Escape)
    assert not window.composer.editing and window.composer.text() == ""
    assert window.controller.current.messages[0].content == "keep me"


def test_switching_chats_while_a_reply_streams(make_window, qtbot):
    window = make_window(FakeBackend(delay=0.01, reply_fn=lambda m: "w" * 150))
    load(qtbot, window)
    window.send("long")
    streaming = window.controller.current
    qtbot.waitUntil(lambda: streamed(window) >= 5, timeout=10000)
    window.new_chat()
    assert window.chat_view.widgets == []  # the other chat shows nothing of the reply
    qtbot.waitUntil(lambda: streamed(window) >= 20, timeout=10000)
    with qtbot.waitSignal(window.reply_finished, timeout=20000):
        window.select_conversation(streaming.id)  # back while it still streams
        assert window.chat_view.last_widget().streaming
    assert streaming.messages[-1].content == "w" * 150
    assert window.chat_view.last_widget().message.content == "w" * 150
    assert not window.chat_view.last_widget().streaming


def test_deleting_the_streaming_chat_stops_it_and_keeps_it_deleted(
    make_window, qtbot, message_boxes
):
    window = make_window(FakeBackend(delay=0.01, reply_fn=lambda m: "d" * 500))
    load(qtbot, window)
    window.send("doomed")
    doomed = window.controller.current.id
    qtbot.waitUntil(lambda: streamed(window) >= 3, timeout=10000)
    with qtbot.waitSignal(window.reply_finished, timeout=10000) as blocker:
        window.delete_conversation(doomed)
    assert blocker.args[0].stop_reason == "cancelled"
    assert doomed not in [c.id for c in HistoryStore().load_all()]
    assert window.controller.current.id != doomed


# ----- responsiveness ---------------------------------------------------------------------------


class LoopProbe:
    """A 5 ms timer on the GUI thread that records `observe()` at every tick.

    Responsiveness is judged by what the event loop saw, not by wall-clock gaps (those break on
    a shared machine): a loop that is blocked while the engine works (MLX on the GUI thread, a
    worker that never lets go of the GIL) sees the work only at its end, so it observes few
    distinct intermediate states; a live loop observes the work advance step by step.
    """

    def __init__(self, observe) -> None:
        self.observe = observe
        self.seen: list = []
        self.timer = QTimer()
        self.timer.setInterval(5)
        self.timer.timeout.connect(lambda: self.seen.append(self.observe()))

    def __enter__(self):
        self.timer.start()
        return self

    def __exit__(self, *exc) -> None:
        self.timer.stop()

    @property
    def stages(self) -> int:
        """How many distinct states the loop observed while the work ran."""
        return len(set(self.seen))


def measure_event_loop(qtbot, window, text, *, reply_timeout=120000) -> LoopProbe:
    """Send `text`; while the reply streams, a GUI-thread timer records how many tokens have
    been shown so far, and keys are typed into the search box."""
    with (
        LoopProbe(lambda: streamed(window)) as probe,
        qtbot.waitSignal(window.reply_finished, timeout=reply_timeout),
    ):
        window.send(text)
        qtbot.waitUntil(lambda: streamed(window) >= 2, timeout=reply_timeout)
        QTest.keyClicks(window.sidebar.search, "typing works")
    assert window.sidebar.search.text() == "typing works"
    return probe


def test_event_loop_stays_responsive_during_generation_fake(make_window, qtbot):
    window = make_window(FakeBackend(delay=0.004, reply_fn=lambda m: "word " * 150))
    load(qtbot, window)
    probe = measure_event_loop(qtbot, window, "talk")
    assert probe.stages >= 10, probe.stages  # the reply seen growing, not only at its end


def test_event_loop_stays_responsive_during_generation_real(make_window, qtbot, tiny_folder):
    settings, _ = load_settings()
    settings.sampling = SamplingSettings(max_tokens=600, seed=3, temperature=1.0)
    window = make_window(None, settings=settings)
    load(qtbot, window, str(tiny_folder))
    probe = measure_event_loop(qtbot, window, "Hello")
    tokens = window.controller.current.messages[-1].provenance["stats"]["generation_tokens"]
    assert tokens > 20
    assert probe.stages >= 5, (probe.stages, tokens)


def _progress_counter(window) -> list[int]:
    count = [0]
    window.controller.progress.connect(lambda *_: count.__setitem__(0, count[0] + 1))
    return count


def test_event_loop_stays_responsive_while_loading(make_window, qtbot):
    window = make_window(FakeBackend(load_seconds=1.5))  # 20 progress steps
    count = _progress_counter(window)
    with (
        LoopProbe(lambda: count[0]) as probe,
        qtbot.waitSignal(window.model_ready, timeout=20000),
    ):
        window.controller.load_model("fake")
        QTest.keyClicks(window.sidebar.search, "typing")
    assert window.sidebar.search.text() == "typing"
    assert probe.stages >= 5, probe.stages


def test_event_loop_stays_responsive_while_calibrating(make_window, qtbot, tmp_path):
    window = make_window(FakeBackend(delay=0.02))  # 62 progress steps
    load(qtbot, window)
    window.open_calibrate_dialog()
    dialog = window.calibrate_dialog
    dialog.output.setText(str(tmp_path / "cb.safetensors"))
    count = _progress_counter(window)
    with (
        LoopProbe(lambda: count[0]) as probe,
        qtbot.waitSignal(window.codebook_ready, timeout=30000),
    ):
        dialog.start_button.click()
        QTest.keyClicks(window.composer.edit, "draft while calibrating")
    assert window.composer.text() == "draft while calibrating"
    assert probe.stages >= 5, probe.stages


# ----- errors leave the app usable ------------------------------------------------------------


def test_bad_codebook_shows_error_and_changes_nothing(make_window, qtbot, message_boxes, tmp_path):
    window = make_window(FakeBackend())
    load(qtbot, window)
    reply(qtbot, window, "before")
    good = tmp_path / "good.safetensors"
    good.write_text("layers=2")
    with qtbot.waitSignal(window.codebook_ready):
        window.controller.load_codebook(str(good))
    bad = tmp_path / "other-model.safetensors"
    bad.write_text("layers=30")
    with qtbot.waitSignal(window.error_shown, timeout=10000):
        window.controller.load_codebook(str(bad))
    ((title, text),) = message_boxes
    assert title == "Could not load the codebook"
    assert text.startswith("codebook is for 30 layers, the model has 2")
    assert window.controller.codebook.name == "good.safetensors"
    assert "good" in window.codebook_button.text()
    assert [m.content for m in window.controller.current.messages] == ["before", "You said: before"]
    reply(qtbot, window, "after")
    assert (
        window.controller.current.messages[-1].provenance["codebook"]["name"] == "good.safetensors"
    )


def test_bad_model_path_shows_error_and_keeps_the_model(
    make_window, qtbot, message_boxes, tmp_path
):
    window = make_window(FakeBackend())
    load(qtbot, window)
    reply(qtbot, window, "before")
    with qtbot.waitSignal(window.error_shown, timeout=10000):
        window.controller.load_model(str(tmp_path / "no-such-model"))
    ((title, text),) = message_boxes
    assert title == "Could not load the model"
    assert "no-such-model" in text and "Still using FakeLM-1M" in text
    assert window.controller.model.info.name == "FakeLM-1M" and window.controller.task is Task.IDLE
    assert window.composer.edit.placeholderText().startswith("Message")
    reply(qtbot, window, "after")
    assert len(window.controller.current.messages) == 4


def test_real_engine_errors(make_window, qtbot, message_boxes, tiny_folder, tmp_path):
    window = make_window(None)
    with qtbot.waitSignal(window.error_shown, timeout=60000):
        window.controller.load_model(str(tmp_path / "missing-folder"))
    assert message_boxes[0][0] == "Could not load the model"
    load(qtbot, window, str(tiny_folder))
    junk = tmp_path / "junk.safetensors"
    junk.write_bytes(b"\x00" * 64)
    with qtbot.waitSignal(window.error_shown, timeout=60000):
        window.controller.load_codebook(str(junk))
    assert message_boxes[1][0] == "Could not load the codebook"
    assert window.controller.codebook is None
    stats = reply(qtbot, window, "Hi")
    assert stats.stop_reason in ("stop", "length")


# ----- persistence --------------------------------------------------------------------------------


def test_settings_and_history_survive_restart(make_window, qtbot, app_dirs):
    window = make_window(FakeBackend())
    load(qtbot, window)
    reply(qtbot, window, "remember me")
    window.system_edit.setPlainText("Answer in French.")
    from app.dialogs.settings_dialog import SettingsResult

    window.apply_settings(SettingsResult(
        cache=CacheSettings.of(window=32, budget=0.05), sampling=SamplingSettings(temperature=0.3),
        theme="dark", default_system_prompt="Be kind.",
    ))  # fmt: skip
    conversation_id = window.controller.current.id
    window.close()
    assert settings_path().exists()

    again = make_window(FakeBackend())
    assert again.controller.settings.cache == CacheSettings.of(window=32, budget=0.05)
    assert (
        again.controller.settings.sampling.temperature == 0.3
        and again.controller.settings.theme == "dark"
    )
    assert again.controller.settings.default_system_prompt == "Be kind."
    assert again.controller.settings.recent_models[0] == "fake"
    assert again.controller.current.id == conversation_id
    assert [m.content for m in again.controller.current.messages] == [
        "remember me",
        "You said: remember me",
    ]
    assert again.controller.current.system_prompt == "Answer in French."
    assert again.system_edit.toPlainText() == "Answer in French."
    assert len(again.chat_view.widgets) == 2
    from app.theme import theme

    theme().apply("light")


def test_corrupt_settings_are_recovered_with_a_status_message(make_window, app_dirs):
    path = settings_path()
    path.parent.mkdir(parents=True)
    path.write_text("{ this is not json")
    window = make_window(FakeBackend())
    assert "backed up" in window.statusBar().currentMessage()
    assert window.controller.settings.model_source == "demo"
    assert list(path.parent.glob("settings.json.corrupt-*"))


def test_export_contains_provenance(make_window, qtbot, tmp_path):
    window = make_window(FakeBackend())
    load(qtbot, window)
    reply(qtbot, window, "export me")
    md = window.export_conversation(
        window.controller.current.id, "markdown", str(tmp_path / "c.md")
    )
    js = window.export_conversation(window.controller.current.id, "json", str(tmp_path / "c.json"))
    text = (tmp_path / "c.md").read_text()
    assert md and js
    assert "export me" in text and "FakeLM-1M" in text and "tok/s" in text and "A2ATS" in text
    data = json.loads((tmp_path / "c.json").read_text())
    provenance = data["messages"][1]["provenance"]
    assert provenance["model"]["name"] == "FakeLM-1M"
    assert provenance["stats"]["generation_tokens"] == len("You said: export me")
    assert provenance["cache"]["config"]["window"] == 64


# ----- conversations, system prompt, cache settings ----------------------------------------------


def test_conversation_list_new_rename_delete_search(make_window, qtbot, message_boxes):
    window = make_window(FakeBackend())
    load(qtbot, window)
    reply(qtbot, window, "about cats")
    first = window.controller.current.id
    window.new_chat_action.trigger()
    reply(qtbot, window, "about dogs")
    second = window.controller.current.id
    assert first != second and window.sidebar.visible_ids() == [second, first]
    window.sidebar.rename_requested.emit(first, "Feline facts")
    assert window.controller.find(first).title == "Feline facts"
    assert {c.id: c.title for c in HistoryStore().load_all()}[first] == "Feline facts"
    window.sidebar.search.setText("dogs")
    assert window.sidebar.visible_ids() == [second]
    window.sidebar.search.setText("feline")
    assert window.sidebar.visible_ids() == [first]
    window.sidebar.search.clear()
    window.sidebar.selected.emit(first)
    assert (
        window.controller.current.id == first
        and window.chat_view.widgets[0].message.content == "about cats"
    )
    window.sidebar.delete_requested.emit(first)
    assert message_boxes and message_boxes[-1][0] == "Delete chat"
    assert [c.id for c in HistoryStore().load_all()] == [second]
    assert window.controller.current.id == second


def test_system_prompt_is_per_conversation(make_window, qtbot):
    backend = FakeBackend()
    window = make_window(backend)
    load(qtbot, window)
    window.system_button.click()
    assert window.system_panel.isVisible()
    window.system_edit.setPlainText("You are a pirate.")
    reply(qtbot, window, "ahoy")
    assert backend.sessions[0].system_prompt == "You are a pirate."
    assert window.controller.current.messages[1].provenance["system_prompt"] == "You are a pirate."
    window.new_chat()
    assert window.system_edit.toPlainText() == ""
    reply(qtbot, window, "hello")
    assert backend.sessions[0].system_prompt is None


def test_cache_settings_apply_to_the_next_message(make_window, qtbot):
    backend = FakeBackend()
    window = make_window(backend)
    load(qtbot, window)
    reply(qtbot, window, "one")
    assert backend.sessions[0].a2ats is not None
    switches = backend.sessions[0].calls.count("set_cache_factory")
    window.a2ats_toggle.click()
    assert window.controller.settings.cache.a2ats_enabled is False
    assert "next message" in window.statusBar().currentMessage()
    reply(qtbot, window, "two")
    session = backend.sessions[0]
    assert session.calls.count("set_cache_factory") == switches + 1 and session.a2ats is None
    assert window.controller.current.messages[-1].provenance["cache"] == {"a2ats_enabled": False}
    assert window.controller.current.messages[1].provenance["cache"]["a2ats_enabled"] is True
    assert "KVCache" in window.chat_view.last_widget().stats.text()


def test_demo_default_codebook_loads_automatically(make_window, qtbot, tmp_path):
    backend = FakeBackend()
    backend.demo_codebook = tmp_path / "demo-default.safetensors"
    backend.demo_codebook.write_text("layers=2")
    window = make_window(backend)
    # (Never qtbot.waitSignal on worker signals: pytest-qt's blocker runs in the emitting thread.)
    with qtbot.waitSignal(window.codebook_ready, timeout=10000) as blocker:
        window.controller.load_model("demo")
    assert blocker.args[0].automatic and blocker.args[0].name == "demo-default.safetensors"
    assert "demo-default" in window.codebook_button.text()
    stats = reply(qtbot, window, "hi")
    assert stats.stop_reason == "stop"
    assert window.controller.current.messages[-1].provenance["codebook"]["sha256"] == "ab" * 32


def test_first_run_offers_to_fetch_the_demo(make_window, qtbot, message_boxes, tmp_path):
    backend = FakeBackend()
    backend.demo_model_path = lambda: None
    backend.demo_codebook = tmp_path / "demo-default.safetensors"  # built by the fetch
    window = make_window(backend)
    with qtbot.waitSignal(window.model_ready, timeout=10000):
        window.controller.start()
    assert message_boxes[0][0] == "Fetch the demo model?"
    assert window.controller.model.source == "demo"
    qtbot.waitUntil(lambda: window.controller.codebook is not None, timeout=10000)
    assert backend.demo_steps == ["fetch", "codebook:/fake/demo"]  # the codebook was built
    assert window.controller.codebook.automatic and "demo-default" in window.codebook_button.text()


def test_calibration_dialog_runs_and_loads_the_codebook(make_window, qtbot, tmp_path):
    window = make_window(FakeBackend(delay=0.002))
    load(qtbot, window)
    window.open_calibrate_dialog()
    dialog = window.calibrate_dialog
    assert dialog is not None and dialog.output.text().endswith(".safetensors")
    dialog.centroids.setCurrentIndex(0)
    assert dialog.output.text().endswith("FakeLM-1M-256c.safetensors")
    dialog.output.setText(str(tmp_path / "mine.safetensors"))
    with qtbot.waitSignal(window.codebook_ready, timeout=20000):
        dialog.start_button.click()
        assert dialog.running and not window.composer.button.isEnabled()
    assert window.controller.codebook.path == str(tmp_path / "mine.safetensors")
    assert window.controller.task is Task.IDLE
    request = window.controller.engine.worker.backend.calibrations[0]
    assert request.n_centroids == 256 and request.cache == window.controller.settings.cache
    assert window.controller.settings.codebook_for_model["fake"] == str(
        tmp_path / "mine.safetensors"
    )


def test_calibration_can_be_cancelled(make_window, qtbot, tmp_path):
    window = make_window(FakeBackend(delay=0.02))
    load(qtbot, window)
    window.open_calibrate_dialog()
    dialog = window.calibrate_dialog
    dialog.output.setText(str(tmp_path / "never.safetensors"))
    dialog.start_button.click()
    qtbot.waitUntil(lambda: dialog.progress.bar.value() > 0, timeout=10000)
    assert "left" in dialog.progress.eta.text() or "estimating" in dialog.progress.eta.text()
    dialog.close_button.click()
    qtbot.waitUntil(lambda: not dialog.running, timeout=10000)
    assert not dialog.running and "cancelled" in dialog.status.text()
    assert not (tmp_path / "never.safetensors").exists()
    reply(qtbot, window, "still fine")


# ----- the real engine: regenerate and edit trim the cache ---------------------------------------


def test_regenerate_and_edit_reuse_the_cache_on_the_real_engine(make_window, qtbot, tiny_folder):
    settings, _ = load_settings()
    settings.sampling = SamplingSettings(max_tokens=12, seed=9)
    window = make_window(None, settings=settings)
    load(qtbot, window, str(tiny_folder))
    reply(qtbot, window, "The capital of France is Paris.")
    first_context = window.controller.current.messages[-1].provenance["stats"]["context_tokens"]
    with qtbot.waitSignal(window.reply_finished, timeout=60000) as blocker:
        window.controller.regenerate()
    extra = blocker.args[0].extra
    assert extra["cache_rebuilt"] is False and extra["reused_tokens"] > 0
    assert extra["reused_tokens"] < first_context  # the old reply was trimmed away
    assert [m.role for m in window.controller.current.messages] == ["user", "assistant"]
    window.begin_edit_last()
    window.composer.set_text("The capital of Italy is Rome.")
    with qtbot.waitSignal(window.reply_finished, timeout=60000) as blocker:
        window.send(window.composer.text())
    extra = blocker.args[0].extra
    assert extra["cache_rebuilt"] is False and extra["reused_tokens"] > 0
    assert window.controller.current.messages[0].content == "The capital of Italy is Rome."


# ----- transcript link (inspector <-> chat) on the real engine -------------------------------


def test_transcript_link_maps_positions_to_text(make_window, qtbot, tiny_folder):
    settings, _ = load_settings()
    settings.sampling = SamplingSettings(max_tokens=16, seed=5)
    window = make_window(None, settings=settings, inspector=True)
    load(qtbot, window, str(tiny_folder))
    text = "The quick brown fox jumps over the lazy dog."
    reply(qtbot, window, text)
    view = window.chat_view
    cmap: ContextMap = view.context_map()
    positions = [p for p in range(len(cmap)) if (s := cmap.locate(p)) and s.message == 0]
    assert positions
    view.highlight_positions(positions)
    assert view.widgets[0].view.highlighted_text() == [text]
    word = [p for p in positions if "fox" in cmap.texts[p]]
    view.highlight_positions(word)
    assert (
        view.widgets[0].view.highlighted_text() == ["fox"]
        or "fox" in view.widgets[0].view.highlighted_text()[0]
    )
    view.highlight_positions([])
    assert view.widgets[0].view.highlighted_text() == []
    assert view.scroll_to_position(positions[0]) is True
    flashed = view.widgets[0].view.highlighted_text()
    assert len(flashed) == 1 and flashed[0] and text.startswith(flashed[0])
    qtbot.waitUntil(lambda: view.widgets[0].view.highlighted_text() == [], timeout=5000)
    assert view.scroll_to_position(0) is False  # a template token (<|im_start|>)
    # The inspector's signals drive the same methods.
    if window.inspector is not None:
        window.inspector.highlight_requested.emit(positions[:2])
        assert view.widgets[0].view.highlighted_text()
        assert window.inspector.viewed_snapshot() is not None  # snapshots reached the panel


# ----- shortcuts and pickers -----------------------------------------------------------------


def test_keyboard_shortcuts(make_window, qtbot, monkeypatch, tmp_path):
    from PySide6.QtWidgets import QFileDialog

    backend = FakeBackend()
    window = make_window(backend)
    folder = tmp_path / "my-model"
    folder.mkdir()
    monkeypatch.setattr(
        QFileDialog, "getExistingDirectory", staticmethod(lambda *a, **k: str(folder))
    )
    with qtbot.waitActive(window):
        window.activateWindow()
    with qtbot.waitSignal(window.model_ready, timeout=10000):
        QTest.keyClick(window, Qt.Key.Key_O, Qt.KeyboardModifier.ControlModifier)
    assert window.controller.model.source == str(folder)
    codebook = tmp_path / "cb.safetensors"
    codebook.write_text("layers=2")
    monkeypatch.setattr(
        QFileDialog, "getOpenFileName", staticmethod(lambda *a, **k: (str(codebook), ""))
    )
    with qtbot.waitSignal(window.codebook_ready, timeout=10000):
        QTest.keyClick(window, Qt.Key.Key_L, Qt.KeyboardModifier.ControlModifier)
    reply(qtbot, window, "first chat")
    first = window.controller.current.id
    QTest.keyClick(window, Qt.Key.Key_N, Qt.KeyboardModifier.ControlModifier)
    assert window.controller.current.id != first and window.controller.current.messages == []
    backend.delay = 0.02
    backend.reply_fn = lambda m: "q" * 5000  # far past the 10 s wait: only the shortcut ends it
    window.send("long one")
    qtbot.waitUntil(lambda: streamed(window) >= 2, timeout=10000)
    with qtbot.waitSignal(window.reply_finished, timeout=10000) as blocker:
        QTest.keyClick(window, Qt.Key.Key_Period, Qt.KeyboardModifier.ControlModifier)
    assert blocker.args[0].stop_reason == "cancelled"


def test_model_menu_lists_demo_recent_and_openers(make_window, qtbot, tmp_path):
    window = make_window(FakeBackend())
    folder = tmp_path / "recent-model"
    folder.mkdir()
    load(qtbot, window, str(folder))
    window._fill_model_menu()
    texts = [a.text() for a in window.model_menu.actions()]
    assert texts[0].startswith("Demo model")
    assert texts[1] == "Gemma 3 270M (base)"  # the second model the engine fetches by name
    assert any(t.startswith("recent-model") for t in texts)
    run_on = texts.index("Run on")
    assert texts[run_on - 4 : run_on] == [
        "Open model folder\u2026", "Open GGUF file\u2026", "Download from Hugging Face\u2026",
        "Measure crossover on this machine",  # a model is loaded: its crossover, again
    ]  # fmt: skip
    assert texts[run_on + 1 :] == ["Run on this computer", "Run on the hosts of a file\u2026"]


class FakeRanks(FakeBackend):
    """A model "on hosts": the fake engine, saying which layers each of two ranks serves."""

    def __init__(self, hosts: str) -> None:
        if "bad" in hosts:
            raise ValueError(f"hosts file {hosts}: needs a list of hosts")
        super().__init__()
        self.hosts = hosts
        self.closed = False

    def placement(self, model):
        return ("rank 0 of 2: layers 1-1 of 2", "rank 1 of 2: layers 0-0 of 2")

    def close(self):
        self.closed = True


def test_run_on_hosts_loads_the_model_there_and_back_here(
    make_window, qtbot, message_boxes, monkeypatch, tmp_path
):
    from PySide6.QtWidgets import QFileDialog

    made: list[FakeRanks] = []

    def ranks(hosts: str) -> FakeRanks:
        made.append(FakeRanks(hosts))
        return made[-1]

    window = make_window(FakeBackend(), ranks_backend=ranks)
    load(qtbot, window)
    hosts = tmp_path / "hosts.json"
    monkeypatch.setattr(
        QFileDialog, "getOpenFileName", staticmethod(lambda *a, **k: (str(hosts), ""))
    )

    def menu() -> dict:
        window._fill_model_menu()
        return {a.text(): a for a in window.model_menu.actions()}

    assert menu()["Run on this computer"].isChecked()
    with qtbot.waitSignal(window.model_ready, timeout=10000) as loaded:
        menu()["Run on the hosts of a file\u2026"].trigger()
    assert loaded.args[0].hosts == str(hosts) and len(loaded.args[0].ranks) == 2
    assert "on 2 ranks" in window.model_button.text()
    assert "rank 1 of 2: layers 0-0 of 2" in window.model_button.toolTip()
    settings = window.controller.settings
    assert settings.run_on_hosts and settings.hosts_file == str(hosts)
    actions = menu()
    assert actions["Run on the hosts in hosts.json"].isChecked()
    assert not actions["Run on this computer"].isChecked()
    assert "Measure crossover on this machine" not in actions  # each host measures its own
    reply(qtbot, window, "across")  # the chat runs on the hosts' backend
    assert made[-1].sessions and window.controller.settings.hosts == str(hosts)
    window.open_calibrate_dialog()  # calibrating is not done across hosts: says how instead
    assert "a2ats calibrate --hosts" in message_boxes[-1][1]
    with qtbot.waitSignal(window.model_ready, timeout=10000) as loaded:
        menu()["Run on this computer"].trigger()
    assert loaded.args[0].hosts == "" and "ranks" not in window.model_button.text()
    assert made[-1].closed, "the ranks end once the model runs here"
    assert not settings.run_on_hosts and settings.hosts_file == str(hosts)  # offered again
    # a bad hosts file: one error naming it, the model and the choice stay
    bad = tmp_path / "bad-hosts.json"
    with qtbot.waitSignal(window.error_shown, timeout=10000):
        window.controller.run_on(str(bad))
    assert "bad-hosts.json" in message_boxes[-1][1]
    assert window.controller.model.hosts == "" and not settings.run_on_hosts
    assert window.controller.task == Task.IDLE


def test_the_named_models_in_the_menu_are_the_engines_and_load_by_name(
    make_window, qtbot, monkeypatch
):
    from a2ats_engine.loading.fetched_models import model_names
    from app.menus import NAMED_MODELS

    assert ["demo", *(source for source, _, _ in NAMED_MODELS)] == list(model_names())
    window = make_window(FakeBackend())
    asked: list[str] = []
    monkeypatch.setattr(window.controller, "load_model", asked.append)
    window._fill_model_menu()
    gemma = next(a for a in window.model_menu.actions() if a.text() == "Gemma 3 270M (base)")
    assert "first load" in gemma.toolTip()
    gemma.trigger()
    assert asked == ["gemma3-270m"]  # the engine resolves the name (fetching it if needed)


def test_hugging_face_download_error_is_clear(
    make_window, qtbot, message_boxes, monkeypatch, tmp_path
):
    from huggingface_hub import constants

    from app.dialogs import hf_dialog

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)  # the test never uses the network
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hf"))
    window = make_window(None)
    monkeypatch.setattr(hf_dialog.HuggingFaceDialog, "exec", lambda self: True)
    monkeypatch.setattr(hf_dialog.HuggingFaceDialog, "repo_id", lambda self: "no-org/no-such-model")
    with qtbot.waitSignal(window.error_shown, timeout=120000):
        window.download_from_hf()
    ((title, text),) = message_boxes
    assert title == "Could not load the model"
    assert "no-org/no-such-model" in text
    assert "offline" in text
    assert window.controller.task is Task.IDLE


# ----- fidelity shadow pass (settings -> engine -> inspector) --------------------------------


def test_fidelity_setting_reaches_engine_and_inspector(make_window, qtbot, tiny_folder):
    settings, _ = load_settings()
    # retrieval from the first step: below the crossover every step would attend exactly (and
    # measure what retrieval would keep there, on every step)
    settings.cache = CacheSettings.of(window=16, sinks=4, budget=8, fidelity_every=2, exact_below=0)
    settings.sampling = SamplingSettings(max_tokens=6, seed=1, temperature=0.0)
    window = make_window(None, settings=settings, inspector=True)
    assert window.inspector.state.fidelity.enabled and window.inspector.state.fidelity.every == 2
    load(qtbot, window, str(tiny_folder))
    reply(qtbot, window, "The quick brown fox jumps over the lazy dog. " * 6)
    qtbot.waitUntil(lambda: len(window.inspector.state.ring) > 0, timeout=10000)
    recalls = [
        layer.recall
        for entry in window.inspector.state.ring.entries()
        for layer in entry.snapshot.layers
    ]
    measured = [r for r in recalls if r is not None]
    assert measured and all(0.0 < v <= 1.0 + 1e-6 for r in measured for v in r)
    assert len(measured) < len(recalls)  # every 2nd step only
    assert window.inspector.state.fidelity.cost_ms is not None
    window.apply_settings(
        type(
            "R",
            (),
            {
                "cache": CacheSettings(),
                "sampling": settings.sampling,
                "theme": "light",
                "default_system_prompt": "",
                "use_model_sampling": True,
            },
        )()
    )
    assert not window.inspector.state.fidelity.enabled


# ----- nothing a user did is lost, nothing stops the app -------------------------------------


def test_failed_save_after_a_reply_shows_the_error_and_leaves_the_composer_usable(
    make_window, qtbot, message_boxes, monkeypatch
):
    import errno

    window = make_window(FakeBackend())
    load(qtbot, window)

    def disk_full(self, conversation):
        raise OSError(errno.ENOSPC, "No space left on device")

    with monkeypatch.context() as full, qtbot.waitSignal(window.error_shown, timeout=20000):
        full.setattr(HistoryStore, "save", disk_full)  # ends with the block (dirs stay patched)
        reply(qtbot, window, "hello")
    assert message_boxes and message_boxes[0][0] == "Could not save"
    assert "No space left" in message_boxes[0][1]
    assert not window.composer.generating  # not stuck in Stop mode
    assert window.composer.button.accessibleName() == "Send message"
    assert window.controller.current.messages[-1].content == "You said: hello"
    reply(qtbot, window, "again")
    assert len(window.controller.current.messages) == 4


def test_failed_save_on_close_still_stops_the_engine(
    make_window, qtbot, monkeypatch, message_boxes
):
    window = make_window(FakeBackend())
    load(qtbot, window)
    reply(qtbot, window, "hi")
    monkeypatch.setattr(HistoryStore, "save", lambda *a: (_ for _ in ()).throw(OSError("ro")))
    monkeypatch.setattr("app.controller.save_settings", lambda *a: (_ for _ in ()).throw(OSError))
    window.close()
    assert not window.controller.engine.thread.isRunning()
    assert message_boxes[0][0] == "Could not save"  # shown, and the close went on


def test_draft_is_kept_per_chat_across_switch_and_restart(make_window, qtbot):
    window = make_window(FakeBackend())
    load(qtbot, window)
    reply(qtbot, window, "first chat")
    first = window.controller.current.id
    window.composer.set_text("half-written thought")
    window.new_chat()
    assert window.composer.text() == ""
    reply(qtbot, window, "second chat")
    window.composer.set_text("another draft")
    window.select_conversation(first)
    assert window.composer.text() == "half-written thought"
    window.close()
    again = make_window(FakeBackend())
    assert again.controller.current.id == first and again.composer.text() == "half-written thought"
    other = next(c for c in again.controller.conversations if c.id != first)
    assert other.draft == "another draft"


def test_interrupted_reply_is_shown_marked_on_the_next_start(make_window, qtbot):
    window = make_window(FakeBackend(delay=0.01, reply_fn=lambda m: "p" * 400))
    load(qtbot, window)
    window.send("go on")
    path = window.controller.store.path_for(window.controller.current.id)
    checkpoint = []

    def checkpointed():
        last = json.loads(path.read_text())["messages"][-1]
        if last.get("interrupted"):
            checkpoint.append(path.read_text())
        return bool(checkpoint)

    qtbot.waitUntil(checkpointed, timeout=20000)
    with qtbot.waitSignal(window.reply_finished, timeout=20000):
        window.controller.stop()
    window.close()
    path.write_text(checkpoint[0])  # as a kill at the checkpoint would have left it
    again = make_window(FakeBackend())
    widget = again.chat_view.last_widget()
    assert widget.message.interrupted and widget.message.content.startswith("p")
    assert "Interrupted" in widget.note.text()


def test_regenerate_that_fails_shows_the_old_reply_again(make_window, qtbot):
    window = make_window(FakeBackend(reply_fn=in_turn("the old answer", RuntimeError("boom"))))
    load(qtbot, window)
    reply(qtbot, window, "question")
    with qtbot.waitSignal(window.reply_finished, timeout=20000):
        window.controller.regenerate()
    assert [w.message.content for w in window.chat_view.widgets] == [
        "question", "the old answer",
    ]  # fmt: skip
    assert not window.composer.generating


def test_closing_mid_reply_keeps_the_partial_reply_marked_interrupted(make_window, qtbot):
    window = make_window(FakeBackend(delay=0.01, reply_fn=lambda m: "s" * 1000))
    load(qtbot, window)
    window.send("long")
    qtbot.waitUntil(lambda: streamed(window) >= 5, timeout=10000)
    window.close()
    again = make_window(FakeBackend())
    last = again.controller.current.messages[-1]
    assert last.role == "assistant" and last.interrupted and 0 < len(last.content) < 1000
    assert "Interrupted" in again.chat_view.last_widget().note.text()


@pytest.mark.parametrize("choice", ["Stop at the limit", "Cancel"])
def test_context_overflow_is_asked_before_sending(make_window, qtbot, monkeypatch, choice):
    from PySide6.QtWidgets import QMessageBox

    asked = []

    def click(box):
        asked.append(box.text())
        (button,) = [b for b in box.buttons() if b.text().replace("&", "") == choice]
        button.click()  # sets the box's clickedButton()
        return 0

    monkeypatch.setattr(QMessageBox, "exec", click)
    window = make_window(FakeBackend(context_length=100, reply_fn=lambda m: "r" * 300))
    load(qtbot, window)
    window.composer.set_text("a question")
    with qtbot.waitSignal(window.reply_finished, timeout=20000) as blocker:
        window.send("a question")
    (text,) = asked
    assert "context holds 100" in text and "512" in text
    if choice == "Cancel":
        assert window.controller.current.messages == []
        assert window.composer.text() == "a question"  # nothing lost
        assert not window.composer.generating
    else:
        assert blocker.args[0].stop_reason == "length"
        assert blocker.args[0].context_tokens <= 100
        assert (
            window.controller.current.messages[-1].content
            == "r" * blocker.args[0].generation_tokens
        )


def test_the_last_reply_shows_its_versions_and_switches(make_window, qtbot):
    window = make_window(FakeBackend(reply_fn=in_turn("first", "second")))
    load(qtbot, window)
    reply(qtbot, window, "question")
    with qtbot.waitSignal(window.reply_finished, timeout=20000):
        window.controller.regenerate()
    last = window.chat_view.widgets[-1]
    assert not last.versions.isHidden() and last.version_label.text() == "2 / 2"
    last.previous_version_button.click()
    last = window.chat_view.widgets[-1]
    assert last.message.content == "first" and last.version_label.text() == "1 / 2"


def test_the_window_keeps_no_state_of_the_controllers(make_window, qtbot):
    """Settings, the current chat, the model and the codebook live in the controller; the
    window shows what its `settings_changed` reports, whoever changed them."""
    window = make_window(FakeBackend())
    gone = ("settings", "current", "model", "codebook", "telemetry_enabled", "load_model",
            "load_codebook", "regenerate", "stop_generation", "rename_conversation", "start")  # fmt: skip
    assert [name for name in gone if hasattr(window, name)] == []
    load(qtbot, window)
    controller = window.controller
    off = replace(controller.settings.cache, a2ats_enabled=False)
    controller.change_settings(cache=off)
    assert not window.a2ats_toggle.isChecked() and window.status.plan.text() == "A2ATS off"
    window.a2ats_toggle.setChecked(True)  # the toggle goes through the controller, too
    assert controller.settings.cache.a2ats_enabled and window.status.plan.text() != "A2ATS off"
    assert controller.telemetry == (window.inspector is not None and window.dock.isVisible())
    window.dock.setVisible(False)
    assert controller.telemetry is False and controller.settings.inspector_visible is False
