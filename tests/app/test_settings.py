"""Settings: schema-versioned JSON in the config dir, validation, corrupt-file recovery."""

from __future__ import annotations

import json

import pytest

from a2ats_engine.records import SamplingSettings
from app import app_dirs as dirs_module
from app.settings import (
    SCHEMA_VERSION,
    AppSettings,
    CacheSettings,
    load_settings,
    save_settings,
    settings_path,
)
from app.worker import EngineThread


def test_dirs_follow_env_overrides(app_dirs):
    assert dirs_module.config_dir() == app_dirs["config"]
    assert dirs_module.data_dir() == app_dirs["data"]
    assert settings_path() == app_dirs["config"] / "settings.json"
    from a2ats_engine.data_dirs import demo_codebook_path  # the app reads the engine's

    assert demo_codebook_path() == app_dirs["data"] / "codebooks" / "demo-default.safetensors"


def test_round_trip(app_dirs):
    settings = AppSettings(
        model_source="/models/x",
        cache=CacheSettings.of(a2ats_enabled=False, window=32, budget=0.05, kv_bits=8),
        sampling=SamplingSettings(temperature=0.2, seed=7, max_tokens=64),
        theme="dark",
        default_system_prompt="Be brief.",
    )
    settings.remember_model("/models/x")
    settings.remember_model("demo")
    save_settings(settings)
    data = json.loads(settings_path().read_text())
    assert data["schema_version"] == SCHEMA_VERSION
    loaded, message = load_settings()
    assert message is None
    assert loaded == settings
    assert loaded.recent_models == ["demo", "/models/x"]


def test_missing_file_gives_defaults(app_dirs):
    settings, message = load_settings()
    assert settings == AppSettings() and message is None


@pytest.mark.parametrize(
    "content",
    [
        "{not json",
        json.dumps([1, 2]),
        json.dumps({"schema_version": 1, "cache": {"window": -3}}),
        json.dumps({"schema_version": 1, "sampling": {"top_p": 7}}),
        json.dumps({"schema_version": 1, "theme": "purple"}),
        # files that used to stop every start
        "[" * 100000,
        '{"a":' * 50000,
        json.dumps({"splitter_sizes": [99999999999, 5]}),
    ],
    ids=[
        "not-json", "not-an-object", "bad-window", "bad-top-p", "bad-theme",
        "deep-list", "deep-object", "huge-splitter",
    ],
)  # fmt: skip
def test_corrupt_file_is_backed_up_and_defaults_used(app_dirs, content):
    path = settings_path()
    path.parent.mkdir(parents=True)
    path.write_text(content)
    settings, message = load_settings()
    assert settings == AppSettings()
    assert message is not None and "backed up" in message and "settings.json" in message
    assert "\n" not in message  # one line
    (backup,) = path.parent.glob("settings.json.corrupt-*")
    assert backup.read_text() == content
    assert not path.exists()


WRONG_TYPES = [
    {"window_geometry": 5},
    {"window_state": ["x"]},
    {"recent_models": "demo"},
    {"recent_models": ["demo", 3]},
    {"codebook_for_model": {"demo": 7}},
    {"codebook_for_model": []},
    {"auto_load_demo_codebook": "yes"},
    {"default_system_prompt": None},
    {"theme": 1},
    {"splitter_sizes": "200,800"},
    {"splitter_sizes": [True, 5]},
    {"inspector_visible": 1},
    {"last_conversation_id": 12},
    {"model_source": None},
    {"schema_version": True},
    {"cache": "on"},
    {"sampling": [0.7]},
]


@pytest.mark.parametrize("bad", WRONG_TYPES, ids=lambda bad: next(iter(bad)))
def test_a_wrongly_typed_value_sends_the_file_down_the_backup_path(app_dirs, bad):
    path = settings_path()
    path.parent.mkdir(parents=True)
    content = json.dumps({"schema_version": 1, "theme": "dark", **bad})
    path.write_text(content)
    settings, message = load_settings()
    assert settings == AppSettings()
    assert message is not None and next(iter(bad)) in message and "backed up" in message
    (backup,) = path.parent.glob("settings.json.corrupt-*")
    assert backup.read_text() == content


def test_every_field_has_a_type_check():
    from dataclasses import fields

    from app.settings import FIELD_TYPES

    assert set(FIELD_TYPES) == {f.name for f in fields(AppSettings)}
    for f in fields(AppSettings):
        check, _ = FIELD_TYPES[f.name]
        assert check(getattr(AppSettings(), f.name)), f.name


@pytest.mark.parametrize("bad", [{"window_geometry": 5}, {"recent_models": "demo"}])
def test_the_window_starts_over_a_wrongly_typed_settings_file(make_window, app_dirs, bad):
    from .fakes import FakeBackend

    path = settings_path()
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(bad))
    window = make_window(FakeBackend())
    assert "defaults restored" in window.statusBar().currentMessage()


def test_unknown_keys_ignored_and_old_schema_migrates(app_dirs):
    path = settings_path()
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"schema_version": 0 + 1, "future_knob": 3, "theme": "light"}))
    settings, message = load_settings()
    assert message is None and settings.theme == "light"


@pytest.mark.parametrize(
    ("kind", "field", "value"),
    [
        (CacheSettings.of, "window", 0),
        (CacheSettings.of, "budget", 1.5),
        (CacheSettings.of, "kv_bits", 3),
        (SamplingSettings, "temperature", -1.0),
        (SamplingSettings, "max_tokens", 0),
        (SamplingSettings, "top_k", 1.5),
    ],
)
def test_bad_values_name_the_field(kind, field, value):
    with pytest.raises(ValueError, match=field):
        kind(**{field: value})


def test_cache_settings_build_engine_config():
    config = CacheSettings.of(window=16, sinks=4, budget=0.1).to_config(telemetry=True, rerank=3)
    assert (config.window, config.sinks, config.budget, config.rerank) == (16, 4, 0.1, 3)
    assert config.telemetry is True


# ----- sampling: the model's recommendation is the default -------------------------------------


def _info(recommended):
    from a2ats_engine.records import ModelGeometry, ModelInfo

    geometry = ModelGeometry("llama", 2, 4, 2, 16, {}, 4096)
    return ModelInfo("m", geometry, None, 1, "/m", recommended)


def test_sampling_for_takes_the_models_recommendation_unless_overridden():
    own = SamplingSettings(temperature=0.9, top_p=0.5, top_k=7, max_tokens=64, seed=3)
    model = SamplingSettings(temperature=0.0, top_p=0.95, min_p=0.05, top_k=20,
                             repetition_penalty=1.1, max_tokens=9999, seed=42)  # fmt: skip
    settings = AppSettings(sampling=own)
    chosen = settings.sampling_for(_info(model))
    assert (chosen.temperature, chosen.top_p, chosen.min_p, chosen.top_k) == (0.0, 0.95, 0.05, 20)
    assert chosen.repetition_penalty == 1.1
    assert (chosen.max_tokens, chosen.seed) == (64, 3)  # never the model's
    assert settings.sampling_for(_info(None)) == own  # the model recommends nothing
    assert settings.sampling_for(None) == own  # no model loaded
    settings.use_model_sampling = False  # the user's explicit override
    assert settings.sampling_for(_info(model)) == own


def test_the_override_survives_a_restart(app_dirs):
    settings = AppSettings(sampling=SamplingSettings(temperature=0.3), use_model_sampling=False)
    save_settings(settings)
    loaded, message = load_settings()
    assert message is None and loaded == settings
    assert isinstance(loaded.sampling, SamplingSettings)


@pytest.mark.parametrize("bad", [{"top_p": 0.0}, {"min_p": 1.0}, {"max_tokens": "9"}])
def test_sampling_the_engine_would_refuse_never_loads(app_dirs, bad):
    path = settings_path()
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"schema_version": 1, "sampling": bad}))
    settings, message = load_settings()
    assert settings == AppSettings() and "backed up" in message


def test_a_reply_uses_the_loaded_models_recommended_sampling(make_window, qtbot, app_dirs):
    from dataclasses import replace

    from .fakes import FakeBackend
    from .helpers import load, reply

    settings = AppSettings(sampling=SamplingSettings(temperature=0.9, max_tokens=5, seed=1))
    window = make_window(FakeBackend(), settings=settings)
    load(qtbot, window)
    recommended = SamplingSettings(temperature=0.0, top_k=20)
    window.controller.model = replace(
        window.controller.model,
        info=replace(window.controller.model.info, recommended_sampling=recommended),
    )
    reply(qtbot, window, "hello")
    used = window.controller.current.messages[-1].provenance["sampling"]
    assert (used["temperature"], used["top_k"], used["max_tokens"]) == (0.0, 20, 5)
    window.controller.settings.use_model_sampling = False
    reply(qtbot, window, "again")
    used = window.controller.current.messages[-1].provenance["sampling"]
    assert (used["temperature"], used["top_k"]) == (0.9, 0)


@pytest.mark.parametrize(("cpu_only", "bits"), [(True, None), (False, 8)])
def test_kv_storage_default_follows_the_backend(monkeypatch, app_dirs, cpu_only, bits):
    # float K/V on CPU-only MLX (quantized storage costs decode speed there), 8-bit on Metal
    from a2ats_engine import _backend

    monkeypatch.setattr(_backend, "is_cpu_only", lambda: cpu_only)
    assert CacheSettings().config.kv_bits == bits and AppSettings().cache.config.kv_bits == bits
    assert AppSettings.from_dict({"cache": {"window": 32}}).cache.config.kv_bits == bits
    # the user's explicit choice, saved in settings.json, is kept on either backend
    for chosen in (None, 8, 4):
        save_settings(AppSettings(cache=CacheSettings.of(kv_bits=chosen)))
        loaded, message = load_settings()
        assert message is None and loaded.cache.config.kv_bits == chosen


def test_an_oversized_settings_file_is_not_read_whole(app_dirs):
    path = settings_path()
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"default_system_prompt": "x" * (2 << 20)}))
    settings, message = load_settings()
    assert settings == AppSettings() and "too large" in message


def test_the_window_starts_over_huge_splitter_sizes(make_window, app_dirs):
    from .fakes import FakeBackend

    settings = AppSettings()
    settings.splitter_sizes = [2**31 - 1, 5]  # valid for the file, too wide for any screen
    window = make_window(FakeBackend(), settings=settings)
    assert all(0 < size < 2**31 - 1 for size in window.splitter.sizes())


def test_a_window_that_fails_to_build_ends_its_engine_thread(qtbot, app_dirs, monkeypatch):
    from app.main_window import MainWindow

    from .fakes import FakeBackend

    def broken(self):
        raise RuntimeError("layout exploded")

    monkeypatch.setattr(MainWindow, "_restore_layout", broken)
    engine = EngineThread(FakeBackend())
    with pytest.raises(RuntimeError, match="layout exploded"):
        MainWindow(AppSettings(), engine=engine)
    assert not engine.thread.isRunning()  # no "QThread: Destroyed while thread ... running"


# A settings.json as earlier versions wrote it: the cache's fields flat beside a2ats_enabled.
EARLIER_CACHE = {
    "a2ats_enabled": True, "window": 32, "far_offset": 2048, "sinks": 4, "budget": 0.05,
    "min_k": 16, "far_buckets": 4, "rerank": 2, "estimate_missed": False, "kv_bits": None,
    "fidelity_every": 2, "kv_memory": None, "exact_below": None,
}  # fmt: skip


@pytest.mark.parametrize(
    "version, cache, expected",
    [
        (1, {"rerank": 2, "estimate_missed": False}, None),  # version 1's Speed: now measured
        (1, {"estimate_missed": False}, None),
        (1, {"rerank": 3, "estimate_missed": False}, False),  # custom: kept
        (1, {"rerank": 2, "estimate_missed": True}, True),
        (2, {"rerank": 2, "estimate_missed": False}, False),  # chosen off in version 2: kept
    ],
)
def test_a_version_1_speed_preset_migrates_to_the_measured_estimate(
    app_dirs, version, cache, expected
):
    path = settings_path()
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"schema_version": version, "cache": cache}))
    settings, message = load_settings()
    assert message is None and settings.cache.config.estimate_missed is expected
    assert settings.schema_version == SCHEMA_VERSION == 2


def test_a_settings_file_of_the_earlier_format_still_loads_and_is_written_alike(app_dirs):
    from a2ats_engine.cache.config import A2ATSConfig

    path = settings_path()
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"schema_version": 1, "theme": "dark", "cache": EARLIER_CACHE}))
    settings, message = load_settings()
    assert message is None and settings.theme == "dark" and settings.cache.a2ats_enabled
    expected = A2ATSConfig(window=32, sinks=4, budget=0.05, fidelity_every=2, kv_bits=None)
    assert settings.cache.config == expected  # the app holds the engine's own config
    assert expected.estimate_missed is None  # version 1's Speed preset, migrated
    save_settings(settings)
    cache = json.loads(path.read_text())["cache"]
    # the same fields, flat: an earlier version reads them (all but the migrated estimate)
    assert {k: cache[k] for k in EARLIER_CACHE} == {**EARLIER_CACHE, "estimate_missed": None}
    assert "telemetry" not in cache and "config" not in cache  # flat, as before
    assert set(cache) - set(EARLIER_CACHE) <= set(A2ATSConfig.__dataclass_fields__)
    assert load_settings()[0] == settings


def test_the_cache_settings_hold_one_config_built_by_the_dialog(app_dirs, qtbot):
    """`A2ATSConfig` is built once, from the dialog's values: the settings store it, a request
    adds only its telemetry (`to_config`), and fields the dialog does not edit are kept."""
    from dataclasses import replace

    from a2ats_engine.cache.config import A2ATSConfig
    from app.dialogs.settings_dialog import SettingsDialog

    held = CacheSettings.of(window=32, exact_below=4096, coverage=0.9)
    dialog = SettingsDialog(held, SamplingSettings(), "system", "")
    edited = dialog.values().cache
    assert edited.config == held.config and isinstance(edited.config, A2ATSConfig)
    dialog.window.setValue(48)
    assert dialog.values().cache.config == replace(held.config, window=48)
    assert edited.to_config(telemetry=True) == replace(held.config, telemetry=True)


def test_app_tests_save_settings_in_a_folder_of_their_own():
    """A test that saves settings (every controller does) never writes the user's own file."""
    import os
    import tempfile
    from pathlib import Path

    from app.settings import settings_path

    assert os.environ.get("A2ATS_CONFIG_DIR")
    assert Path(tempfile.gettempdir()).resolve() in settings_path().resolve().parents
