"""Two app instances on the same data and config folders: the first holds the data folder's
lock and saves; a second one is read-only (it shows the chats, sends nothing, writes nothing),
so neither can put back a copy of a chat the other changed or deleted."""

from __future__ import annotations

import json

import pytest

from app.controller import ChatController
from app.conversations import Conversation, HistoryStore, Message
from app.settings import AppSettings, settings_path
from app.worker import EngineThread

from .fakes import FakeBackend


@pytest.fixture
def chat_c(app_dirs) -> Conversation:
    """Chat C on disk with one exchange (2 messages)."""
    chat = Conversation(id="chatc", title="C")
    chat.messages += [Message("user", "one"), Message("assistant", "You said: one")]
    HistoryStore().save(chat)
    return chat


@pytest.fixture
def start(make_controller):
    """Factory: one more app instance (a controller on the fake backend) on the same folders."""
    return lambda: make_controller(FakeBackend())


def on_disk(conversation_id: str) -> list[str]:
    path = HistoryStore().path_for(conversation_id)
    return [m["content"] for m in json.loads(path.read_text())["messages"]]


def load(qtbot, controller):
    with qtbot.waitSignal(controller.model_loaded, timeout=20000):
        controller.load_model("fake")


def test_an_idle_second_instance_does_not_delete_the_firsts_messages(start, chat_c, qtbot):
    first, second = start(), start()
    assert not first.read_only and second.read_only
    assert first.current.id == second.current.id == "chatc"  # B opens C and stays idle
    load(qtbot, first)
    with qtbot.waitSignal(first.reply_ended, timeout=20000):
        assert first.send("two")
    assert first.shutdown()
    assert len(on_disk("chatc")) == 4
    assert second.shutdown()  # B quits after A: its old copy of C is not written
    assert on_disk("chatc") == ["one", "You said: one", "two", "You said: two"]


def test_the_read_only_instance_says_so_sends_nothing_and_deletes_nothing(start, chat_c, qtbot):
    first = start()
    notices = []
    second = ChatController(AppSettings(), engine=EngineThread(FakeBackend()), store=HistoryStore())
    second.notice.connect(lambda text, _ms: notices.append(text))
    second.load_history()
    try:
        assert second.read_only and any("read-only" in n for n in notices)
        load(qtbot, second)
        assert "read-only" in second.ready_reason()
        assert not second.send("lost?") and not second.regenerate()
        second.delete("chatc")
        assert HistoryStore().path_for("chatc").exists()
        second.settings.theme = "dark"
        assert second.shutdown()
        assert not settings_path().exists()  # the writer's settings are not overwritten either
        first.delete("chatc")  # deleted by the writer, the chat does not come back
        assert not HistoryStore().path_for("chatc").exists()
    finally:
        second.engine.shutdown()


def test_the_lock_is_released_when_the_writer_quits(start, chat_c):
    first = start()
    assert first.shutdown()
    later = start()
    assert not later.read_only


def test_quitting_does_not_rewrite_a_chat_that_did_not_change(start, chat_c):
    first = start()
    path = HistoryStore().path_for("chatc")
    before = path.read_text()
    assert first.shutdown()
    assert path.read_text() == before  # not even its "updated" time
