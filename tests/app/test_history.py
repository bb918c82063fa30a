"""History: atomic JSON files per conversation, provenance, Markdown/JSON export."""

from __future__ import annotations

import json
import os

import pytest

from app.app_dirs import conversations_dir
from app.conversations import (
    Conversation,
    HistoryStore,
    Message,
    export_json,
    export_markdown,
    title_from_text,
)

PROVENANCE = {
    "model": {"name": "TinyLM", "path": "/m/tiny", "source": "/m/tiny"},
    "cache": {"a2ats_enabled": True, "config": {"window": 64, "budget": 0.03}},
    "codebook": {"name": "cb.safetensors", "sha256": "f00d" * 16, "n_centroids": 256},
    "sampling": {"temperature": 0.7},
    "stats": {"generation_tokens": 12, "generation_tps": 33.3, "time_to_first_token": 0.05,
              "prompt_tokens": 20, "peak_memory_gb": 0.1, "cache_bytes": 4096,
              "stop_reason": "stop"},
}  # fmt: skip


def conversation() -> Conversation:
    c = Conversation(title="Paris", system_prompt="Be brief.")
    c.messages += [
        Message("user", "Capital of France?"),
        Message("assistant", "Paris.", provenance=PROVENANCE),
    ]
    return c


def test_store_round_trip(app_dirs):
    store = HistoryStore()
    assert store.folder == conversations_dir()
    c = conversation()
    store.save(c)
    (loaded,) = HistoryStore().load_all()
    assert loaded == c


def test_load_all_orders_by_update_and_skips_bad_files(app_dirs):
    store = HistoryStore()
    old, new = conversation(), conversation()
    old.updated, new.updated = 100.0, 200.0
    store.save(old)
    store.save(new)
    (store.folder / "broken.json").write_text("{")
    loaded = store.load_all()
    assert [c.id for c in loaded] == [new.id, old.id]
    assert store.skipped == ["broken.json"]


def test_a_crash_mid_write_keeps_the_previous_version(app_dirs, monkeypatch):
    store = HistoryStore()
    c = conversation()
    store.save(c)
    before = store.path_for(c.id).read_text()
    c.messages.append(Message("user", "and Germany?"))

    def crash(*_args):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", crash)
    with pytest.raises(OSError):
        store.save(c)
    assert store.path_for(c.id).read_text() == before
    assert [p.name for p in store.folder.iterdir()] == [f"{c.id}.json"]  # no temp file left


def test_delete(app_dirs):
    store = HistoryStore()
    c = conversation()
    store.save(c)
    store.delete(c.id)
    assert store.load_all() == []


def test_export_markdown_has_provenance():
    text = export_markdown(conversation())
    assert text.startswith("# Paris")
    assert "Be brief." in text and "Capital of France?" in text and "Paris." in text
    assert "TinyLM" in text and ("f00d" * 16) in text and '"window": 64' in text
    assert "12 tokens" in text and "33.3 tok/s" in text


def test_export_json_has_provenance():
    data = json.loads(export_json(conversation()))
    assert data["messages"][1]["provenance"] == PROVENANCE
    assert data["system_prompt"] == "Be brief."


def test_title_from_text():
    assert title_from_text("  hello\n  world ") == "hello world"
    assert title_from_text("") == "New chat"
    long = title_from_text("x" * 100)
    assert len(long) == 48 and long.endswith("\u2026")


# ----- chat files are untrusted -----------------------------------------------------------------


def _write(store: HistoryStore, conversation_id: str, data) -> None:
    store.folder.mkdir(parents=True, exist_ok=True)
    store.path_for(conversation_id).write_text(json.dumps(data))


@pytest.mark.parametrize("content", ["[]", "null", "42", '"text"', "[" * 100_000])
def test_a_file_that_is_not_an_object_is_skipped_and_the_others_load(app_dirs, content):
    store = HistoryStore()
    good = conversation()
    store.save(good)
    (store.folder / "0bad.json").write_text(content)
    assert [c.id for c in store.load_all()] == [good.id]
    assert store.skipped == ["0bad.json"]
    assert (store.folder / "0bad.json").read_text() == content  # left for the user to inspect


@pytest.mark.parametrize(
    "bad",
    [
        {"provenance": []},
        {"provenance": "x"},
        {"provenance": {"stats": [], "model": "m", "cache": {"config": 3}, "codebook": 1}},
        {"provenance": {"stats": {"generation_tps": "fast", "time_to_first_token": None}}},
        {"created": "yesterday"},
        {"created": 1e300},
        {"created": True},
    ],
)
def test_wrongly_typed_message_fields_fall_back_to_defaults(app_dirs, qtbot, bad):
    from app.chat.message_widget import MessageWidget, provenance_tooltip, stats_text

    store = HistoryStore()
    c = conversation()
    data = c.to_dict()
    data["messages"][1].update(bad)
    _write(store, c.id, data)
    (loaded,) = store.load_all()
    assert store.skipped == []
    reply = loaded.messages[1]
    assert reply.content == "Paris." and isinstance(reply.created, float)
    assert reply.provenance is None or isinstance(reply.provenance, dict)
    stats_text(reply.provenance), provenance_tooltip(reply.provenance)  # neither raises
    export_markdown(loaded)
    qtbot.addWidget(MessageWidget(reply))


def test_invalid_messages_are_dropped_and_conversation_fields_defaulted(app_dirs):
    store = HistoryStore()
    c = conversation()
    data = c.to_dict()
    data["messages"] += [[], None, {"role": "system", "content": "x"}, {"role": "user"}]
    data["messages"].append({"role": "user", "content": 5})
    data.update(title=["t"], system_prompt=None, updated="soon", created=float("nan"))
    _write(store, c.id, data)
    (loaded,) = store.load_all()
    assert [m.content for m in loaded.messages] == ["Capital of France?", "Paris."]
    assert loaded.title == "New chat" and loaded.system_prompt == ""
    assert isinstance(loaded.updated, float) and isinstance(loaded.created, float)
    data["messages"] = {"not": "a list"}
    _write(store, c.id, data)
    assert store.load_all()[0].messages == []


def test_the_id_comes_from_the_file_name_never_from_the_content(app_dirs, tmp_path):
    store = HistoryStore()
    c = conversation()
    data = c.to_dict()
    data["id"] = "../../escaped"
    _write(store, c.id, data)
    (loaded,) = store.load_all()
    assert loaded.id == c.id
    loaded.title = "Renamed"
    store.save(loaded)
    store.delete(loaded.id)
    assert sorted(p.name for p in app_dirs["data"].rglob("*")) == ["conversations"]
    assert not (tmp_path / "escaped.json").exists()


@pytest.mark.parametrize("bad_id", ["../../escaped", "a/b", "x.y", "", "..", "a" * 65, 7, None])
def test_invalid_ids_never_become_paths(app_dirs, tmp_path, bad_id):
    store = HistoryStore()
    victim = store.folder.parent / "victim.json"
    victim.parent.mkdir(parents=True, exist_ok=True)
    victim.write_text("{}")
    with pytest.raises(ValueError, match="invalid conversation id"):
        store.path_for(bad_id)
    with pytest.raises(ValueError):
        store.save(Conversation(id=bad_id))
    with pytest.raises(ValueError):
        store.delete(bad_id)
    with pytest.raises(ValueError):
        Conversation.from_dict({"id": bad_id})
    assert victim.read_text() == "{}"


def test_a_file_whose_name_is_not_a_valid_id_is_skipped(app_dirs):
    store = HistoryStore()
    store.folder.mkdir(parents=True)
    (store.folder / "has.dot.json").write_text(json.dumps(conversation().to_dict()))
    assert store.load_all() == [] and store.skipped == ["has.dot.json"]


def test_the_window_starts_over_bad_chat_files(make_window, app_dirs):
    from .fakes import FakeBackend

    store = HistoryStore()
    good = conversation()
    data = good.to_dict()
    data["messages"][1]["provenance"] = ["not", "an", "object"]
    _write(store, good.id, data)
    (store.folder / "list.json").write_text("[]")
    (store.folder / "none.json").write_text("null")
    window = make_window(FakeBackend())
    assert [c.id for c in window.controller.conversations] == [good.id]
    assert "Skipped 2 unreadable conversation file(s)" in window.statusBar().currentMessage()


@pytest.mark.parametrize(
    "enabled, extra, label",
    [
        (False, {"a2ats_exact_steps": 9}, "KVCache"),
        (True, {"a2ats_retrieved_steps": 0, "a2ats_exact_steps": 9}, "A2ATS (exact)"),
        (
            True,
            {"a2ats_retrieved_steps": 4, "a2ats_exact_steps": 5},
            "A2ATS (retrieved 4 of 9 steps)",
        ),
        (True, {"a2ats_retrieved_steps": 9, "a2ats_exact_steps": 0}, "A2ATS"),
        (True, {}, "A2ATS"),  # saved before steps were recorded
        (True, {"a2ats_retrieved_steps": "9", "a2ats_exact_steps": -3}, "A2ATS"),  # bad types
        (True, "not a dict", "A2ATS"),
    ],
)
def test_stats_line_says_when_a2ats_attended_exactly(enabled, extra, label):
    from app.chat.message_widget import stats_text

    provenance = {
        "cache": {"a2ats_enabled": enabled, "config": {"budget": 0.03}},
        "stats": {"generation_tokens": 9, "generation_tps": 10.0, "extra": extra},
    }
    assert stats_text(provenance).split(" \u00b7 ")[0] == label
    c = conversation()
    c.messages[1].provenance = provenance
    cache_line = next(x for x in export_markdown(c).splitlines() if x.startswith("- cache:"))
    assert cache_line.startswith(f"- cache: {label if enabled else 'mlx-lm KVCache'}")


def test_a_lone_surrogate_in_a_chat_file_leaves_the_chat_savable(make_window, app_dirs, qtbot):
    from app.settings import settings_path

    from .fakes import FakeBackend

    store = HistoryStore()
    store.folder.mkdir(parents=True)
    # Valid JSON, but "\udc80" / "\ud800" are lone surrogates: not encodable as UTF-8.
    (store.folder / "abc.json").write_text(
        '{"title":"t\\udc80","messages":[{"role":"user","content":"hi \\ud800"}],"draft":"unsent"}'
    )
    window = make_window(FakeBackend())
    current = window.controller.current
    assert current.id == "abc" and current.title == "t\ufffd"
    assert current.messages[0].content == "hi \ufffd"
    errors = []
    window.controller.error_reported.connect(errors.append)
    current.draft = "changed"
    assert window.controller.save(current)
    assert errors == []
    saved = json.loads((store.folder / "abc.json").read_text("utf-8"))
    assert saved["title"] == "t\ufffd" and saved["draft"] == "changed"
    window.close()
    assert settings_path().exists()  # the quit still saved the settings


def test_a_write_that_cannot_encode_is_reported_not_raised(make_window, app_dirs, message_boxes):
    from .fakes import FakeBackend

    window = make_window(FakeBackend())
    errors = []
    window.controller.error_reported.connect(errors.append)
    current = window.controller.current
    current.messages.append(Message("user", "bad \udc80 text"))  # from anywhere but a file
    assert window.controller.save(current) is False
    assert len(errors) == 1 and errors[0].message.startswith("Could not save")


HOSTILE = (
    'Look: <img src="file:///etc/passwd"> and <script>alert(1)</script>\n\n'
    "![logo](file:///Users/me/secret.png) [click](javascript:alert(1)) "
    "[local](file:///etc/hosts) [rel](../../etc/hosts) <javascript:alert(2)>\n\n"
    "[ref]: javascript:alert(3)\n\n"
    "\x1b[31mred\x1b[0m and a bell\x07\n\n"
    "</details>\n\n# Injected heading\n\n"
    "Fine: [docs](https://example.com/a?b=1) and `code <b>` stays.\n\n"
    "```\n<script>in a fence</script>\n"  # an unclosed fence
)


def rendered_export(text: str) -> str:
    from markdown_it import MarkdownIt

    return MarkdownIt("commonmark").render(text)  # HTML allowed, as many viewers do


def test_markdown_export_keeps_model_text_inert():
    chat = Conversation(title="<img src=x onerror=alert(1)> title")
    hostile_provenance = {
        **PROVENANCE,
        "model": {"name": "</details><script>x</script>", "path": "\x1b]8;;file:///x\x07p"},
    }
    chat.messages += [
        Message("user", HOSTILE),
        Message("assistant", HOSTILE, provenance=hostile_provenance),
        Message("user", "after"),
    ]
    text = export_markdown(chat)
    html = rendered_export(text)
    assert "\x1b" not in text and "\x07" not in text
    assert "<img" not in html and "<script" not in html
    assert 'href="javascript' not in html and 'href="file' not in html
    assert 'href="../' not in html
    assert html.count("<details>") == html.count("</details>") == 1
    assert "<h1>Injected heading</h1>" in html  # model text still renders as Markdown...
    assert '<a href="https://example.com/a?b=1">docs</a>' in html  # ...web links too
    assert "<code>code &lt;b&gt;</code>" in html  # code spans are left as they were
    assert "<h2>User</h2>" in html.split("</details>")[1]  # the fence was closed in its message
