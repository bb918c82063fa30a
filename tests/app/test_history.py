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
