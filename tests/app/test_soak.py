"""Soak: 200 short scripted replies over the fake engine with random stops, regenerations and
chat switches through the window; then every chat file is checked against the transcript the
test kept itself (what was sent, and the prefix of each scripted reply that was kept)."""

from __future__ import annotations

import json
import random

from app.conversations import HistoryStore

from .fakes import FakeBackend
from .helpers import load

REPLIES = 200
CHATS = 5


class Scripted:
    """Replies the test knows in advance: reply n is `reply n ...` with a random length."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.made: list[str] = []

    def __call__(self, messages) -> str:
        words = " ".join(f"w{self.rng.randrange(100)}" for _ in range(self.rng.randrange(1, 8)))
        self.made.append(f"reply {len(self.made)}: {words}")
        return self.made[-1]


def test_soak_replies_stops_regenerations_and_switches(make_window, qtbot):
    rng = random.Random(20261202)
    script = Scripted(random.Random(7))
    window = make_window(FakeBackend(delay=0.0005, reply_fn=script))
    load(qtbot, window)
    controller = window.controller
    ids: list[str] = []
    for _ in range(CHATS):
        window.new_chat()
        window.send("first message")  # a chat file exists only once it has a message
        qtbot.waitUntil(lambda: controller.reply is None, timeout=10000)
        ids.append(controller.current.id)
    # The transcript the test keeps: (role, content) per chat, and each last reply's versions.
    transcript: dict[str, list[tuple[str, str]]] = {
        cid: [("user", "first message"), ("assistant", script.made[i])] for i, cid in enumerate(ids)
    }
    versions: dict[str, list[str]] = {cid: [] for cid in ids}
    seen = {"stopped empty": 0, "stopped partial": 0, "replaced": 0, "kept old": 0, "switch": 0}
    for n in range(REPLIES):
        if rng.random() < 0.3:
            seen["switch"] += 1
            window.select_conversation(rng.choice(ids))
        cid = controller.current.id
        turns = transcript[cid]
        regenerate = turns[-1][0] == "assistant" and rng.random() < 0.3
        made_before = len(script.made)
        with qtbot.waitSignal(controller.reply_ended, timeout=10000) as ended:
            if regenerate:
                window.controller.regenerate()
            else:
                window.composer.edit.setPlainText(f"message {n}")
                window.send(f"message {n}")
            if rng.random() < 0.3:  # stop at a random point, maybe before the first token
                stop_after = rng.randrange(0, 6)
                qtbot.waitUntil(
                    lambda k=stop_after: controller.reply is None or controller.reply.tokens >= k,
                    timeout=10000,
                )
                window.controller.stop()
        kept = ended.args[0].message
        full = script.made[made_before] if len(script.made) > made_before else ""
        if kept is not None:
            assert full.startswith(kept.content), (kept.content, full)
        if ended.args[0].stats.stop_reason == "cancelled":
            seen["stopped partial" if kept is not None else "stopped empty"] += 1
        if regenerate:
            seen["replaced" if kept is not None else "kept old"] += 1
        if regenerate:
            if kept is not None and kept.content:
                versions[cid].append(turns[-1][1])
                turns[-1] = ("assistant", kept.content)
        else:
            turns.append(("user", f"message {n}"))
            if kept is not None:
                turns.append(("assistant", kept.content))
                versions[cid] = []
    assert all(seen.values()), seen  # every path was taken
    assert window.close()
    store = HistoryStore()
    on_disk = {c.id: c for c in store.load_all()}
    for cid in ids:
        saved = on_disk[cid]
        assert [(m.role, m.content) for m in saved.messages] == transcript[cid]
        assert not any(m.interrupted for m in saved.messages)
        last = saved.messages[-1]
        if last.role == "assistant":
            assert [a.content for a in last.alternatives] == versions[cid][-8:]
        raw = json.loads(store.path_for(cid).read_text("utf-8"))
        assert raw["format_version"] == 1
