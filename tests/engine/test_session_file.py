"""Reopening a chat from its saved caches (session_file.py): used only when everything fits."""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path

import pytest
from tiny import tiny_model

from a2ats_engine.cache.codebook import Codebook
from a2ats_engine.cache.config import A2ATSConfig
from a2ats_engine.session import ChatSession, SamplingSettings
from a2ats_engine.session_file import (
    KEEP_BYTES,
    SAVE_FROM_TOKENS,
    chat_cache_path,
    prune_chat_caches,
    restore_cache,
    save_cache,
    weights_sample_hash,
)

from .test_session import run

GREEDY = SamplingSettings(temperature=0.0, max_tokens=8)
CONFIG = A2ATSConfig(window=16, sinks=4, budget=8, exact_below=0)
HISTORY = " ".join(f"word{i}" for i in range(60))

pytestmark = pytest.mark.filterwarnings("ignore:codebook records no model fingerprint")


@pytest.fixture(scope="module")
def book():
    return Codebook.random(2, 2, 16, 32, seed=5)


def chat(model, tokenizer, book, config=CONFIG) -> ChatSession:
    return ChatSession(model, tokenizer, sampling=GREEDY, a2ats=config, codebook=book)


@pytest.mark.parametrize("kv_memory", [None, 0])
def test_a_reopened_chat_continues_from_its_saved_cache(
    llama, tokenizer, book, tmp_path, kv_memory, monkeypatch
):
    monkeypatch.setenv("A2ATS_CACHE_DIR", str(tmp_path / "cache"))
    config = replace(CONFIG, kv_memory=kv_memory)
    first = chat(llama, tokenizer, book, config)
    run(first.send(HISTORY))
    path = tmp_path / "chat.safetensors"
    save_cache(first, path)
    expected, _, _ = run(first.send("and then"))

    reopened = chat(llama, tokenizer, book, config)
    reopened.load_messages(first.messages[:2])
    assert restore_cache(reopened, path) is None
    held = reopened.context_tokens
    assert held > 60
    ids, _, stats = run(reopened.send("and then"))
    assert ids == expected  # the same answer as the chat that never closed
    assert stats.extra["reused_tokens"] >= held - 8 and not stats.extra["cache_rebuilt"]


def test_a_saved_cache_for_anything_else_is_refused_by_name(llama, tokenizer, book, tmp_path):
    first = chat(llama, tokenizer, book)
    run(first.send(HISTORY))
    path = tmp_path / "chat.safetensors"
    save_cache(first, path)

    def reopen(session: ChatSession) -> str | None:
        session.load_messages(first.messages)
        return restore_cache(session, path)

    other_settings = chat(llama, tokenizer, book, replace(CONFIG, budget=4))
    assert "other cache settings" in reopen(other_settings)
    assert other_settings.context_tokens == 0  # refused: nothing adopted
    other_book = chat(llama, tokenizer, Codebook.random(2, 2, 16, 32, seed=6))
    assert "codebook" in reopen(other_book)
    other_weights = tiny_model("llama", seed=1)
    assert weights_sample_hash(other_weights) != weights_sample_hash(llama)
    assert "weights" in reopen(chat(other_weights, tokenizer, book))
    other_model = tiny_model("qwen2")
    reason = reopen(chat(other_model, tokenizer, book))
    assert reason is not None and "model" in reason, reason
    # another conversation shares only the template's first tokens: whatever is adopted is
    # trimmed to them, and the answer is the one a fresh chat gives
    assert "load the conversation" in restore_cache(chat(llama, tokenizer, book), path)
    talk = [{"role": "user", "content": "zzz"}, {"role": "assistant", "content": "yyy"}]
    stranger, fresh = chat(llama, tokenizer, book), chat(llama, tokenizer, book)
    stranger.load_messages(talk)
    fresh.load_messages(talk)
    restore_cache(stranger, path)
    assert run(stranger.send("xxx"))[0] == run(fresh.send("xxx"))[0]
    (tmp_path / "junk.safetensors").write_bytes(b"not a file")
    assert "not an A2ATS session file" in restore_cache(
        chat(llama, tokenizer, book), tmp_path / "junk.safetensors"
    )
    with pytest.raises(Exception, match="no cache to save"):
        save_cache(chat(llama, tokenizer, book), tmp_path / "empty.safetensors")


def test_a_codebook_loaded_from_its_file_restores_too(llama, tokenizer, book, tmp_path):
    """A codebook file's sha256 is the file's: the session file keeps it for its caches."""
    book.save(tmp_path / "book.safetensors")
    loaded = Codebook.load(tmp_path / "book.safetensors")
    first = chat(llama, tokenizer, loaded)
    run(first.send(HISTORY))
    save_cache(first, tmp_path / "chat.safetensors")
    again = chat(llama, tokenizer, Codebook.load(tmp_path / "book.safetensors"))
    again.load_messages(first.messages)
    assert restore_cache(again, tmp_path / "chat.safetensors") is None
    assert again.caches[0].codebook is again.cache_factory.codebook  # no second copy


def test_bench_reopen_reports_both_times(tmp_path, capsys):
    import json

    from tiny import save_tiny_model

    from a2ats_engine.cli import main

    folder = save_tiny_model(tmp_path / "m", "llama")
    assert main(["bench", "reopen", "--model", str(folder), "--contexts", "120", "--json"]) == 0
    row = json.loads(capsys.readouterr().out)["results"][0]
    assert row["reused_tokens"] >= 100 and row["file_bytes"] > 0
    assert row["reopen_total_s"] > 0 and row["reprefill_ttft_s"] > 0
    assert main(["bench", "reopen", "--model", str(folder), "--contexts", "5"]) != 0


def test_a_chats_cache_file_is_named_by_a_hash_of_its_id(tmp_path, monkeypatch):
    monkeypatch.setenv("A2ATS_CACHE_DIR", str(tmp_path))
    hostile = "../../etc/passwd\x00" + "x" * 5000  # an id read from a chat file
    path = chat_cache_path(hostile)
    assert path.parent == tmp_path / "chats" and len(path.name) == 32 + len(".safetensors")
    assert chat_cache_path("a") != chat_cache_path("b") == chat_cache_path("b")


def test_pruning_removes_the_least_recently_written_caches_first(tmp_path):
    for i, name in enumerate(("old", "middle", "new")):
        path = tmp_path / f"{name}.safetensors"
        path.write_bytes(b"x" * 100)
        os.utime(path, (1000 + i, 1000 + i))
    (tmp_path / "notes.txt").write_bytes(b"x" * 1000)  # not a cache: never counted or removed
    assert prune_chat_caches(tmp_path, keep_bytes=250) == [tmp_path / "old.safetensors"]
    assert prune_chat_caches(tmp_path, keep_bytes=250) == []
    assert prune_chat_caches(tmp_path, keep_bytes=0) == [
        tmp_path / "middle.safetensors",
        tmp_path / "new.safetensors",
    ]
    assert (tmp_path / "notes.txt").exists()
    assert prune_chat_caches(tmp_path / "missing") == []


def test_the_readme_states_the_kept_caches_limits():
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text(encoding="utf-8")
    text = " ".join(readme.split())
    assert f"for chats of {SAVE_FROM_TOKENS:,} tokens or more" in text
    assert f"keeping the most recently used {KEEP_BYTES // 2**30} GiB" in text
