"""ChatController without widgets: replies, saving failures, checkpoints, regenerate, context
overflow, calibration cancel, the demo fetch and shutdown; over the fake backend and, where the
fake would hide behaviour, the real engine on the tiny model."""

from __future__ import annotations

import errno
import json
import threading
from pathlib import Path

import pytest

from a2ats_engine import SamplingSettings
from app.controller import SAVE, Task
from app.conversations import HistoryStore
from app.events import CalibrationRequest, FetchDemo, Job, LoadModel, OverflowPolicy, ReplyMode
from app.settings import AppSettings, CacheSettings
from app.worker import EngineThread

from .fakes import FakeBackend, in_turn
from .helpers import Requests


def load(qtbot, controller, source="fake"):
    with qtbot.waitSignal(controller.model_loaded, timeout=60000):
        controller.load_model(source)


def send(qtbot, controller, text, timeout=60000):
    with qtbot.waitSignal(controller.reply_ended, timeout=timeout) as blocker:
        assert controller.send(text)
    return blocker.args[0]


def on_disk(controller, conversation_id) -> dict:
    return json.loads(controller.store.path_for(conversation_id).read_text())


def test_send_streams_saves_and_returns_to_idle(make_controller, qtbot):
    controller = make_controller(FakeBackend())
    assert controller.task == Task.IDLE and controller.ready_reason()  # no model yet
    load(qtbot, controller)
    ended = send(qtbot, controller, "hello")
    assert ended.message.content == "You said: hello" and ended.stats.stop_reason == "stop"
    assert controller.task == Task.IDLE and controller.reply is None
    tasks = controller.spy.of("task_changed")
    assert Task.LOADING in tasks and Task.GENERATING in tasks and tasks[-1] == Task.IDLE
    saved = on_disk(controller, controller.current.id)
    assert [m["content"] for m in saved["messages"]] == ["hello", "You said: hello"]
    assert saved["messages"][1]["interrupted"] is False


def test_failed_save_after_a_reply_is_reported_and_the_reply_ends(
    make_controller, qtbot, monkeypatch
):
    controller = make_controller(FakeBackend())
    load(qtbot, controller)

    def disk_full(self, conversation):
        raise OSError(errno.ENOSPC, "No space left on device")

    with monkeypatch.context() as full:  # only this patch ends (the test's dirs stay patched)
        full.setattr(HistoryStore, "save", disk_full)
        ended = send(qtbot, controller, "keep me")
    assert ended.message.content == "You said: keep me"  # kept in memory
    reports = controller.spy.of("error_reported")
    assert [r.task for r in reports] == [SAVE]  # reported once, not per write
    assert "No space left" in reports[0].message
    assert controller.task == Task.IDLE and controller.reply is None
    send(qtbot, controller, "again")  # the next save works and writes everything
    contents = [m["content"] for m in on_disk(controller, controller.current.id)["messages"]]
    assert contents == ["keep me", "You said: keep me", "again", "You said: again"]


def test_failed_save_on_shutdown_still_ends_the_engine(make_controller, qtbot, monkeypatch):
    controller = make_controller(FakeBackend())
    load(qtbot, controller)
    send(qtbot, controller, "hi")
    monkeypatch.setattr(HistoryStore, "save", lambda *a: (_ for _ in ()).throw(OSError("ro")))
    monkeypatch.setattr("app.controller.save_settings", lambda *a: (_ for _ in ()).throw(OSError))
    assert controller.shutdown("unsent draft") is True
    assert not controller.engine.thread.isRunning()


class BlockingLoad(FakeBackend):
    """A model load that does not return until `release` is set (and ignores stop)."""

    def __init__(self) -> None:
        super().__init__()
        self.release = threading.Event()
        self.entered = threading.Event()

    def load_model(self, source, progress=None):
        self.entered.set()
        self.release.wait(30)
        return super().load_model(source, progress)


def test_shutdown_that_times_out_keeps_the_thread_instead_of_aborting(
    make_controller, qtbot, monkeypatch
):
    backend = BlockingLoad()
    controller = make_controller(backend)
    controller.load_model("fake")
    qtbot.waitUntil(backend.entered.is_set, timeout=10000)
    engine = controller.engine
    assert controller.shutdown(timeout_ms=100) is False
    assert engine in EngineThread.stuck and engine.thread.isRunning()
    exits = []
    monkeypatch.setattr("os._exit", exits.append)
    from app.main import exit_now_if_stuck

    exit_now_if_stuck(0)
    assert exits == [0]  # the process ends without destroying the running QThread
    backend.release.set()
    assert engine.thread.wait(30000)
    EngineThread.stuck.remove(engine)
    assert exit_now_if_stuck(3) == 3


def test_regenerate_keeps_the_old_reply_when_the_new_one_fails(make_controller, qtbot):
    answers = in_turn("first answer", RuntimeError("model exploded"), "third answer")
    controller = make_controller(FakeBackend(reply_fn=answers))
    load(qtbot, controller)
    send(qtbot, controller, "question")
    with qtbot.waitSignal(controller.reply_ended, timeout=20000) as blocker:
        assert controller.regenerate()
        # Until the new reply has text, the old one is still part of the chat.
        assert controller.current.messages[-1].content == "first answer"
    ended = blocker.args[0]
    assert ended.message is None and ended.restored and "model exploded" in ended.note
    assert [m.content for m in controller.current.messages] == ["question", "first answer"]
    saved = on_disk(controller, controller.current.id)["messages"]
    assert [m["content"] for m in saved] == ["question", "first answer"]
    with qtbot.waitSignal(controller.reply_ended, timeout=20000):
        controller.regenerate()
    assert [m.content for m in controller.current.messages] == ["question", "third answer"]


def test_regenerate_stopped_before_the_first_token_keeps_the_old_reply(make_controller, qtbot):
    backend = FakeBackend(reply_fn=lambda m: "old answer")
    controller = make_controller(backend)
    load(qtbot, controller)
    send(qtbot, controller, "question")
    backend.delay = 0.5  # the first token takes half a second
    for session in backend.sessions:
        session.delay = 0.5
    with qtbot.waitSignal(controller.reply_ended, timeout=20000) as blocker:
        controller.regenerate()
        controller.stop()
    ended = blocker.args[0]
    assert ended.stats.stop_reason == "cancelled" and ended.restored
    assert [m.content for m in controller.current.messages] == ["question", "old answer"]


def test_context_overflow_asks_and_stop_at_limit_caps_the_reply(make_controller, qtbot):
    backend = FakeBackend(context_length=120, reply_fn=lambda m: "r" * 300)
    controller = make_controller(backend)
    load(qtbot, controller)
    with qtbot.waitSignal(controller.context_overflowed, timeout=20000) as blocker:
        controller.send("hello")
    overflow = blocker.args[0]
    assert overflow.context_length == 120 and overflow.max_tokens == 512
    assert overflow.prompt_tokens + overflow.max_tokens > 120
    assert controller.task == Task.GENERATING  # waiting for the answer, nothing generated
    with qtbot.waitSignal(controller.reply_ended, timeout=20000) as blocker:
        controller.resolve_overflow(OverflowPolicy.STOP_AT_LIMIT)
    stats = blocker.args[0].stats
    assert stats.stop_reason == "length"
    assert overflow.prompt_tokens + stats.generation_tokens <= 120  # never past the context
    # The choice is remembered for this chat: the next message does not ask again.
    ended = send(qtbot, controller, "more")
    assert ended.stats.context_tokens <= 120
    assert len(controller.spy.of("context_overflowed")) == 1


def test_context_overflow_drop_oldest_turns(make_controller, qtbot):
    backend = FakeBackend(context_length=700, reply_fn=lambda m: "x" * 40)
    settings = AppSettings()
    settings.sampling = SamplingSettings(max_tokens=100)
    controller = make_controller(backend, settings)
    controller.context_overflowed.connect(
        lambda _o: controller.resolve_overflow(OverflowPolicy.DROP_OLDEST)
    )
    load(qtbot, controller)
    for text in ("a" * 300, "b" * 300, "c" * 300):
        ended = send(qtbot, controller, text)
        assert ended.message.content == "x" * 40
        assert ended.stats.context_tokens <= 700  # never past the context
    assert len(controller.spy.of("context_overflowed")) == 1  # asked once, then remembered
    held = [m["content"] for m in backend.sessions[0].messages]
    assert "a" * 300 not in held and held[-2:] == ["c" * 300, "x" * 40]
    # The chat itself keeps every message.
    contents = [m.content for m in controller.current.messages]
    assert contents == ["a" * 300, "x" * 40, "b" * 300, "x" * 40, "c" * 300, "x" * 40]


def test_context_overflow_cancel_gives_the_message_back(make_controller, qtbot):
    controller = make_controller(FakeBackend(context_length=50))
    load(qtbot, controller)
    controller.context_overflowed.connect(lambda _o: controller.resolve_overflow(None))
    with qtbot.waitSignal(controller.reply_ended, timeout=20000) as blocker:
        controller.send("a message that will not fit")
    assert blocker.args[0].message is None
    assert controller.current.messages == []
    assert controller.current.draft == "a message that will not fit"
    assert controller.task == Task.IDLE


def test_cancel_while_a_calibration_is_still_queued(make_controller, qtbot, tmp_path, monkeypatch):
    backend = FakeBackend(delay=0.01, reply_fn=lambda m: "z" * 2000)
    controller = make_controller(backend)
    load(qtbot, controller)
    controller.send("busy")  # the engine is busy: the calibration below waits behind it
    qtbot.waitUntil(lambda: controller.reply is not None and controller.reply.tokens > 2)
    out = tmp_path / "queued.safetensors"
    with monkeypatch.context() as busy:  # calibrate without stopping the reply first
        busy.setattr(controller, "stop", lambda: None)
        controller.calibrate(CalibrationRequest(output=str(out)))
    controller.cancel_calibration()
    with qtbot.waitSignal(controller.calibration_cancelled, timeout=20000):
        controller.stop()
    assert not out.exists() and backend.calibrations == []


def test_first_run_fetch_builds_the_demo_codebook_then_loads_both(make_controller, qtbot, tmp_path):
    backend = FakeBackend()
    backend.demo_model_path = lambda: None
    backend.demo_codebook = tmp_path / "codebooks" / "demo-default.safetensors"
    controller = make_controller(backend)
    with qtbot.waitSignal(controller.demo_missing, timeout=10000):
        controller.start()
    with qtbot.waitSignal(controller.codebook_loaded, timeout=20000) as blocker:
        controller.fetch_demo()
        assert controller.task == Task.FETCHING
    assert backend.demo_steps == ["fetch", "codebook:/fake/demo"]
    assert blocker.args[0].automatic and blocker.args[0].name == "demo-default.safetensors"
    assert controller.model.source == "demo"
    assert "demo" not in controller.settings.codebook_for_model  # a default, not a choice


def test_engine_backend_fetch_demo_builds_the_codebook_with_progress(qtbot, monkeypatch, tmp_path):
    """The real EngineBackend over the engine's functions (monkeypatched: no download)."""
    import a2ats_engine.calibration.calibrate as calibrate_module
    import a2ats_engine.loading.models as models_module
    from app.backend import EngineBackend

    calls = []

    def fake_fetch(progress=None):
        calls.append("fetch")
        progress("converting", 1, 1)
        return tmp_path / "demo"

    def fake_codebook(progress=None, *, model_source="demo", force=False, cancel=None):
        calls.append(("codebook", Path(model_source)))
        progress("clustering", 3, 3)
        return tmp_path / "demo-default.safetensors"

    monkeypatch.setattr(models_module, "fetch_demo", fake_fetch)
    monkeypatch.setattr(calibrate_module, "ensure_demo_codebook", fake_codebook)
    engine = EngineThread(EngineBackend())
    send = Requests(engine.worker)
    stages = []
    engine.worker.progress.connect(lambda p: stages.append((p.task, p.stage)))
    try:
        with qtbot.waitSignal(engine.worker.demo_fetched, timeout=20000) as blocker:
            send(FetchDemo())
    finally:
        engine.shutdown()
    assert blocker.args[0] == str(tmp_path / "demo")
    assert calls == ["fetch", ("codebook", tmp_path / "demo")]
    assert (Job.FETCH_DEMO, "clustering") in stages


# ----- the real engine on the tiny model ---------------------------------------------------


def on_real_engine(make_controller, qtbot, folder, *, max_tokens: int, seed: int):
    """A controller on the real engine with the model in `folder` loaded, sampling at
    temperature 1 with `seed`."""
    settings = AppSettings()
    settings.sampling = SamplingSettings(max_tokens=max_tokens, seed=seed, temperature=1.0)
    controller = make_controller(None, settings)
    load(qtbot, controller, str(folder))
    return controller


def test_partial_reply_is_checkpointed_and_marked_interrupted_real(
    make_controller, qtbot, tiny_folder
):
    controller = on_real_engine(make_controller, qtbot, tiny_folder, max_tokens=400, seed=3)
    path = None
    checkpoints: list[str] = []

    def read_checkpoint():
        data = json.loads(path.read_text()) if path.exists() else {"messages": []}
        last = data["messages"][-1] if data["messages"] else {}
        if last.get("interrupted"):
            checkpoints.append(path.read_text())
        return bool(checkpoints)

    controller.send("Tell me a long story")
    path = controller.store.path_for(controller.current.id)
    qtbot.waitUntil(read_checkpoint, timeout=60000)
    with qtbot.waitSignal(controller.reply_ended, timeout=60000) as blocker:
        controller.stop()
    final = blocker.args[0].message
    # What a kill at the checkpoint leaves on disk: the prompt and the partial reply.
    path.write_text(checkpoints[0])
    again = HistoryStore().load_all()[0]
    partial = again.messages[-1]
    assert partial.role == "assistant" and partial.interrupted and partial.content
    assert final.content.startswith(partial.content)
    assert partial.provenance["model"]["path"] == str(tiny_folder)


def test_stop_during_a_long_prefill_is_honoured_between_chunks_real(qtbot, tiny_folder):
    """The stop arrives while the prompt is being prefilled (from the prefill's own progress
    callback, i.e. between chunks): nothing is generated and only part of the prompt is in
    the cache."""
    from app.backend import EngineBackend
    from app.events import GenerationRequest

    chunks = []

    class StopInPrefill(EngineBackend):
        def reply(self, session, mode, text, progress=None):
            def on_prefill(stage, done, total):
                chunks.append((done, total))
                progress(stage, done, total)  # the worker's own callback still runs
                if len(chunks) == 2:
                    engine.worker.stop()  # as the Stop button does, from outside the stream

            return super().reply(session, mode, text, on_prefill)

    engine = EngineThread(StopInPrefill(prefill_step_size=16))
    send = Requests(engine.worker)
    finished, shown = [], []
    engine.worker.generation_finished.connect(finished.append)
    engine.worker.prefill_progressed.connect(shown.append)
    try:
        with qtbot.waitSignal(engine.worker.model_loaded, timeout=60000):
            send(LoadModel(str(tiny_folder)))
        request = GenerationRequest(
            request_id=send.next_request_id(), conversation_id="c", mode=ReplyMode.SEND,
            text="word " * 300, history=(), system_prompt="",
            sampling=SamplingSettings(max_tokens=50, seed=0), cache=CacheSettings(),
        )  # fmt: skip
        send(request)
        qtbot.waitUntil(lambda: bool(finished), timeout=60000)
    finally:
        engine.shutdown()
    stats = finished[0]
    total = chunks[0][1]
    assert total > 200 and stats.stop_reason == "cancelled"
    assert stats.generation_tokens == 0
    assert 0 < stats.prompt_tokens < total  # it stopped between chunks, not at the end
    assert stats.context_tokens == stats.prompt_tokens
    # The worker reported each chunk: tokens done of the total, timed from the start.
    qtbot.waitUntil(lambda: len(shown) == 2, timeout=10000)
    assert [(p.done, p.total) for p in shown] == chunks == [(0, total), (16, total)]
    assert shown[0].request_id == request.request_id and shown[1].seconds >= shown[0].seconds


def test_codebook_mismatch_is_reported_and_the_chat_kept_real(
    make_controller, qtbot, tiny_folder, tmp_path
):
    from a2ats_engine import Codebook

    controller = make_controller(None)
    load(qtbot, controller, str(tiny_folder))
    send(qtbot, controller, "Hello")
    before = [m.content for m in controller.current.messages]
    wrong = tmp_path / "thirty-layers.safetensors"
    Codebook.random(num_layers=30, num_kv_heads=2, head_dim=32, n_centroids=16).save(wrong)
    with qtbot.waitSignal(controller.error_reported, timeout=60000) as blocker:
        controller.load_codebook(str(wrong))
    report = blocker.args[0]
    assert report.task == Job.LOAD_CODEBOOK and "30" in report.message
    assert "\n" not in report.message
    assert controller.codebook is None
    assert [m.content for m in controller.current.messages] == before
    ended = send(qtbot, controller, "Still there?")
    assert ended.stats.stop_reason in ("stop", "length")


@pytest.fixture(scope="module")
def short_context_folder(tmp_path_factory):
    """The tiny Llama with a 160-token context."""
    from tiny import save_tiny_model

    folder = tmp_path_factory.mktemp("short") / "tiny-short"
    return save_tiny_model(folder, hidden_size=128, max_position_embeddings=160)


def held_turns(controller) -> list[tuple[str, str]]:
    worker = controller.engine.worker  # read after the reply: the engine thread is idle
    return worker.backend.session_turns(worker._session)


def test_context_limit_on_the_real_engine_stop_at_limit(
    make_controller, qtbot, short_context_folder
):
    controller = on_real_engine(
        make_controller, qtbot, short_context_folder, max_tokens=120, seed=4
    )
    assert controller.model.info.context_length == 160
    asked = []

    def answer(overflow):
        asked.append(overflow)
        controller.resolve_overflow(OverflowPolicy.STOP_AT_LIMIT)

    controller.context_overflowed.connect(answer)
    for text in ("The quick brown fox jumps over the lazy dog.", "And then?"):
        ended = send(qtbot, controller, text)
        assert ended.stats.context_tokens <= 160  # never past the model's context
    assert asked and asked[0].prompt_tokens + asked[0].max_tokens > 160


def test_context_limit_on_the_real_engine_drop_oldest(make_controller, qtbot, short_context_folder):
    controller = on_real_engine(make_controller, qtbot, short_context_folder, max_tokens=24, seed=5)
    controller.context_overflowed.connect(
        lambda _o: controller.resolve_overflow(OverflowPolicy.DROP_OLDEST)
    )
    texts = [f"Message number {i}: the quick brown fox." for i in range(6)]
    for text in texts:
        ended = send(qtbot, controller, text)
        assert ended.stats.context_tokens <= 160
    assert controller.spy.of("context_overflowed")  # it did overflow along the way
    held = [content for role, content in held_turns(controller) if role == "user"]
    assert held[-1] == texts[-1] and texts[0] not in held  # the oldest turns were left out
    assert [m.content for m in controller.current.messages if m.role == "user"] == texts


def test_failed_saves_of_different_files_are_each_reported(make_controller, qtbot, monkeypatch):
    controller = make_controller(FakeBackend())

    def disk_full(*args):
        raise OSError(errno.ENOSPC, "No space left on device")

    with monkeypatch.context() as full:  # only these patches end (the test's dirs stay patched)
        full.setattr("app.controller.save_settings", disk_full)
        load(qtbot, controller)  # saves the settings: fails
        full.setattr(HistoryStore, "save", disk_full)
        send(qtbot, controller, "keep me")  # saves the chat: fails too
    reports = controller.spy.of("error_reported")
    assert [r.task for r in reports] == [SAVE, SAVE]
    assert "settings" in reports[0].message and "keep me" in reports[1].message
    assert len(controller.unsaved()) == 2
    assert controller.save_before_quit("") == []  # both written now: nothing unsaved


def test_quitting_with_an_unsaved_chat_asks_first(make_window, qtbot, monkeypatch, message_boxes):
    from PySide6.QtWidgets import QMessageBox

    from .helpers import load as load_window
    from .helpers import reply

    window = make_window(FakeBackend())
    load_window(qtbot, window)
    monkeypatch.setattr(
        HistoryStore, "save", lambda *a: (_ for _ in ()).throw(OSError(errno.ENOSPC, "full"))
    )
    reply(qtbot, window, "precious")
    answers = [QMessageBox.StandardButton.No, QMessageBox.StandardButton.Yes]
    asked = []

    def question(parent, title, text, *args, **kwargs):
        asked.append(text)
        return answers.pop(0)

    monkeypatch.setattr(QMessageBox, "question", staticmethod(question))
    assert not window.close()  # "No": the window stays and keeps its chat
    assert window.isVisible() and window.controller.engine.thread.isRunning()
    assert "precious" in asked[0] and "full" in asked[0]
    assert window.close()  # "Yes": quit anyway
    assert not window.controller.engine.thread.isRunning()


def test_a_crash_during_regenerate_keeps_the_finished_reply_on_disk(make_controller, qtbot):
    finished = ("A complete answer. " * 24).strip()  # 455 characters, under max tokens
    backend = FakeBackend(reply_fn=in_turn(finished, "A new answer that never finishes " * 20))
    controller = make_controller(backend)
    load(qtbot, controller)
    send(qtbot, controller, "question")
    path = controller.store.path_for(controller.current.id)
    for session in backend.sessions:
        session.delay = 0.005
    kills: list[str] = []  # what the file holds at each checkpoint: what a kill would leave

    def checkpointed():
        text = path.read_text()
        if '"interrupted": true' in text:
            kills.append(text)
        return bool(kills)

    with qtbot.waitSignal(controller.reply_ended, timeout=20000):
        assert controller.regenerate()
        qtbot.waitUntil(checkpointed, timeout=10000)
        controller.stop()
    # The stopped reply had text, so it is the reply now; the finished one is its alternative.
    (shown,) = controller.current.messages[1:]
    assert shown.content.startswith("A new answer") and shown.alternatives[0].content == finished
    saved = on_disk(controller, controller.current.id)["messages"]
    assert saved[1]["alternatives"][0]["content"] == finished
    path.write_text(kills[0])  # a kill at the first checkpoint
    (left,) = [c for c in HistoryStore(path.parent).load_all() if c.id == controller.current.id]
    replies = left.messages[1:]
    assert [m.content for m in replies] == [finished] and not replies[0].interrupted
    (partial,) = replies[0].alternatives
    assert partial.interrupted and partial.content.startswith("A new answer")


def test_versions_of_a_regenerated_reply_can_be_switched(make_controller, qtbot):
    controller = make_controller(FakeBackend(reply_fn=in_turn("first", "second")))
    load(qtbot, controller)
    send(qtbot, controller, "question")
    with qtbot.waitSignal(controller.reply_ended, timeout=20000):
        controller.regenerate()
    assert controller.versions() == (2, 2)
    assert controller.show_version(-1)
    last = controller.current.messages[-1]
    assert last.content == "first" and [a.content for a in last.alternatives] == ["second"]
    assert controller.versions() == (1, 2)
    saved = on_disk(controller, controller.current.id)["messages"][-1]
    assert saved["content"] == "first" and saved["alternatives"][0]["content"] == "second"
    assert not controller.show_version(-1)  # already the first
    assert controller.show_version(+1) and controller.current.messages[-1].content == "second"


def test_settings_change_through_the_controller(make_controller, qtbot, app_dirs):
    from app.settings import load_settings, settings_path

    controller = make_controller(FakeBackend())
    changed: list[frozenset[str]] = []
    controller.settings_changed.connect(changed.append)
    cache = CacheSettings.of(window=32, kv_bits=None)
    assert controller.change_settings(cache=cache, theme="dark") == {"cache", "theme"}
    assert changed == [{"cache", "theme"}]
    saved, message = load_settings(settings_path())
    assert message is None and saved.cache == cache and saved.theme == "dark"
    assert controller.change_settings(cache=cache) == frozenset() and len(changed) == 1
    with pytest.raises(ValueError, match="no_such_field"):
        controller.change_settings(no_such_field=1)
    with pytest.raises(ValueError, match="recent_models"):  # typed as a settings file is
        controller.change_settings(recent_models="demo")
    assert controller.settings.recent_models == [] and len(changed) == 1
    controller.change_settings(inspector_visible=False, save=False)  # the window's layout
    assert (
        changed[-1] == {"inspector_visible"} and load_settings(settings_path())[0].inspector_visible
    )
    load(qtbot, controller)  # adopting a model is a settings change, too
    assert changed[-1] == {"model_source", "recent_models"}
    assert load_settings(settings_path())[0].recent_models == ["fake"]


def test_telemetry_is_the_controllers_state(make_controller, qtbot):
    controller = make_controller(FakeBackend())
    load(qtbot, controller)
    requests = []
    controller.reply_started.connect(lambda reply: requests.append(reply.request))
    send(qtbot, controller, "off")
    controller.set_telemetry(True)
    send(qtbot, controller, "on")
    assert [r.telemetry for r in requests] == [False, True]


def test_views_get_the_engines_events_from_the_controller(make_controller, qtbot):
    """Snapshots and the start / end of every request are re-emitted by the controller, so no
    view connects to the engine thread's worker."""
    controller = make_controller(FakeBackend(snapshots=True))
    load(qtbot, controller)
    seen: list[str] = []
    controller.generation_started.connect(lambda s: seen.append(f"started {s.mode}"))
    controller.snapshot_ready.connect(lambda s: seen.append("snapshot"))
    controller.generation_finished.connect(lambda s: seen.append(f"finished {s.stop_reason}"))
    ended = send(qtbot, controller, "abc")
    # reply_ended and generation_finished come from one worker signal, in either order
    qtbot.waitUntil(lambda: any(e.startswith("finished") for e in seen), timeout=5000)
    n = len(ended.message.content)
    assert seen == ["started send", *["snapshot"] * n, "finished stop"]


# ---- a chat's cache kept on disk across chat switches and restarts ---------------------------
def test_switching_chats_keeps_the_last_ones_cache_and_reopens_it(make_controller, qtbot):
    backend = FakeBackend()
    controller = make_controller(backend)
    notices: list[str] = []
    controller.notice.connect(lambda text, _ms: notices.append(text))
    load(qtbot, controller)
    send(qtbot, controller, "first chat")
    first = controller.current.id
    assert backend.cache_log == []  # nothing is written while the chat stays the session's
    controller.new_chat()
    send(qtbot, controller, "second chat")
    second = controller.current.id
    assert backend.cache_log == [("save", first)]
    controller.select(first)
    notices.clear()
    send(qtbot, controller, "back to the first")
    assert backend.cache_log[1:] == [("save", second), ("restore", first)]
    assert any(n.startswith("Reopened from the chat's saved cache") for n in notices), notices
    # a deleted chat's file goes with it, and the app's end keeps the open chat's cache
    controller.delete(second)
    qtbot.waitUntil(lambda: ("forget", second) in backend.cache_log, timeout=5000)
    assert second not in backend.saved_caches
    assert controller.shutdown()
    assert backend.cache_log[-1] == ("save", first)


def test_a_temporary_chat_keeps_no_cache(make_controller, qtbot):
    backend = FakeBackend()
    controller = make_controller(backend)
    controller.ephemeral = True  # a scripted run: `a2ats-chat --prompt ... --quit`
    load(qtbot, controller)
    send(qtbot, controller, "one question")
    controller.new_chat()
    send(qtbot, controller, "another")
    assert controller.shutdown()
    assert backend.cache_log == [] and backend.saved_caches == {}


def test_a_chat_reopens_from_its_saved_cache_on_the_real_engine(
    make_controller, qtbot, tiny_folder, app_dirs, monkeypatch
):
    from a2ats_engine import session_file

    monkeypatch.setattr(session_file, "SAVE_FROM_TOKENS", 8)  # the tiny chats are short
    controller = on_real_engine(make_controller, qtbot, tiny_folder, max_tokens=6, seed=1)
    notices: list[str] = []
    controller.notice.connect(lambda text, _ms: notices.append(text))
    send(qtbot, controller, "Tell me about the sea, and the ships that sail on it")
    first = controller.current.id
    controller.new_chat()
    send(qtbot, controller, "Something else")
    saved = session_file.chat_cache_path(first)
    assert saved.is_file() and saved.parent == app_dirs["cache"] / "chats"
    assert first not in str(saved)  # the id is hashed, never part of the path
    controller.select(first)
    ended = send(qtbot, controller, "And the harbours?")
    assert any(n.startswith("Reopened from the chat's saved cache") for n in notices), notices
    reused = ended.stats.extra["reused_tokens"]
    assert reused > 0 and ended.stats.prompt_tokens < reused  # only the new turn prefilled
    controller.delete(first)
    qtbot.waitUntil(lambda: not saved.exists(), timeout=10000)


def test_a_chat_cache_that_cannot_be_written_is_a_note_and_the_reply_goes_on(
    make_controller, qtbot, tiny_folder, app_dirs, monkeypatch
):
    from a2ats_engine import session_file

    monkeypatch.setattr(session_file, "SAVE_FROM_TOKENS", 8)
    (app_dirs["cache"]).mkdir(parents=True, exist_ok=True)
    (app_dirs["cache"] / "chats").write_text("a file where the folder should be")
    controller = on_real_engine(make_controller, qtbot, tiny_folder, max_tokens=4, seed=2)
    notices: list[str] = []
    controller.notice.connect(lambda text, _ms: notices.append(text))
    send(qtbot, controller, "A first chat that is long enough to keep")
    controller.new_chat()
    ended = send(qtbot, controller, "Another chat")
    assert ended.stats.stop_reason in ("stop", "length")  # the reply is not lost
    assert any(n.startswith("The chat's cache was not kept") for n in notices), notices
