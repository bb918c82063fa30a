"""Property tests over the files the app reads (settings.json, chat files): whatever they
hold, loading gives defaults or the readable part plus a one-line message naming the file, never
a traceback; what was loaded can always be saved and exported again; reading allocates a
bounded amount; and the window still starts over them."""

from __future__ import annotations

import json
import os
import tempfile
import tracemalloc
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from app.conversations import HistoryStore, export_json, export_markdown
from app.settings import AppSettings, load_settings, save_settings

# Text that includes lone surrogates (valid in JSON as "\udc80", not encodable as UTF-8).
TEXT = st.text(st.characters(codec=None, categories=("L", "N", "P", "S", "Z", "C")), max_size=40)
SCALARS = st.none() | st.booleans() | st.integers() | st.floats() | TEXT
JSON = st.recursive(
    SCALARS,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(TEXT, inner, max_size=4),
    max_leaves=20,
)
SETTINGS_KEYS = [
    "schema_version", "model_source", "recent_models", "codebook_for_model", "cache",
    "sampling", "theme", "window_geometry", "window_state", "splitter_sizes",
    "inspector_visible", "last_conversation_id", "default_system_prompt",
]  # fmt: skip
CACHE_KEYS = ["window", "budget", "kv_bits", "sinks", "rerank", "far_buckets", "a2ats_enabled"]
SETTINGS_OBJECT = st.fixed_dictionaries(
    {},
    optional={
        **{k: JSON for k in SETTINGS_KEYS},
        "cache": st.dictionaries(st.sampled_from(CACHE_KEYS), SCALARS, max_size=4),
        "splitter_sizes": st.lists(st.integers(), max_size=3),
    },
)
MESSAGE = st.fixed_dictionaries(
    {},
    optional={
        "role": st.sampled_from(["user", "assistant", "system"]) | JSON,
        "content": TEXT | JSON,
        "created": SCALARS,
        "provenance": JSON,
        "interrupted": SCALARS,
        "alternatives": st.lists(JSON, max_size=3),
    },
)
CHAT_OBJECT = st.fixed_dictionaries(
    {},
    optional={
        "title": TEXT | JSON,
        "system_prompt": TEXT | JSON,
        "draft": TEXT | JSON,
        "created": SCALARS,
        "updated": SCALARS,
        "messages": st.lists(MESSAGE, max_size=5) | JSON,
    },
)
PATHOLOGICAL = st.sampled_from(
    [b"[" * 100_000, b'{"a":' * 50_000, b"\xff\xfe\x00", b"", b"null", b"\x00" * 64]
)


def file_bytes(objects) -> st.SearchStrategy[bytes]:
    """File contents: JSON of `objects` (ASCII-escaped, so lone surrogates survive), random
    JSON, raw bytes, or a known pathological file."""
    encoded = objects.map(lambda v: json.dumps(v, ensure_ascii=True).encode())
    return (
        encoded
        | JSON.map(lambda v: json.dumps(v).encode())
        | st.binary(max_size=64)
        | (PATHOLOGICAL)
    )


FAST = settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
PEAK_BYTES = 64 << 20


def one_line(message: str | None, name: str) -> None:
    assert message is not None and "\n" not in message and name in message
    assert "Traceback" not in message


@FAST
@given(content=file_bytes(SETTINGS_OBJECT))
def test_any_settings_file_loads_or_is_moved_aside(app_dirs, content):
    path = app_dirs["config"] / "settings.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    for old in path.parent.iterdir():
        old.unlink()
    path.write_bytes(content)
    tracemalloc.start()
    try:
        settings_read, message = load_settings()
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < PEAK_BYTES
    if message is not None:
        one_line(message, "settings.json")
        assert settings_read == AppSettings()
    save_settings(settings_read)  # whatever was read can be written back
    assert load_settings() == (settings_read, None)


@FAST
@given(contents=st.lists(file_bytes(CHAT_OBJECT), min_size=1, max_size=3))
def test_any_chat_file_loads_or_is_skipped_and_stays_savable(app_dirs, contents):
    store = HistoryStore()
    store.folder.mkdir(parents=True, exist_ok=True)
    for old in store.folder.iterdir():
        old.unlink()
    for index, content in enumerate(contents):
        (store.folder / f"chat{index}.json").write_bytes(content)
    tracemalloc.start()
    try:
        loaded = store.load_all()
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < PEAK_BYTES
    assert len(loaded) + len(store.skipped) == len(contents)
    for name in store.skipped:
        reason = store.reasons[name]
        assert "\n" not in reason and "Traceback" not in reason
    for conversation in loaded:
        store.save(conversation)  # never UnicodeEncodeError, never TypeError
        export_markdown(conversation).encode("utf-8")
        export_json(conversation).encode("utf-8")
    assert [c.to_dict() for c in HistoryStore().load_all()] == [c.to_dict() for c in loaded]


@settings(
    max_examples=8,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(settings_file=file_bytes(SETTINGS_OBJECT), chat_file=file_bytes(CHAT_OBJECT))
def test_the_window_starts_over_any_files(qtbot, monkeypatch, settings_file, chat_file):
    from app.main_window import MainWindow
    from app.worker import EngineThread

    from .fakes import FakeBackend

    with tempfile.TemporaryDirectory() as root:
        config, data = Path(root, "config"), Path(root, "data")
        monkeypatch.setenv("A2ATS_CONFIG_DIR", str(config))
        monkeypatch.setenv("A2ATS_DATA_DIR", str(data))
        (data / "conversations").mkdir(parents=True)
        config.mkdir()
        (config / "settings.json").write_bytes(settings_file)
        (data / "conversations" / "fuzzed.json").write_bytes(chat_file)
        loaded, message = load_settings()
        if message is not None:
            one_line(message, "settings.json")
        window = MainWindow(
            loaded, engine=EngineThread(FakeBackend()), store=HistoryStore(), scripted=True
        )
        try:
            assert window.controller.current is not None
            window.show()
        finally:
            assert window.close()
            assert not window.controller.engine.thread.isRunning()
        assert os.listdir(config)  # settings written on quit
