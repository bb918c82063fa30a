"""App settings: one typed object with a schema version, persisted as JSON in the config dir.

A corrupt or unreadable settings file never stops the app: it is moved aside
(`settings.json.corrupt-<time>`), defaults are used, and the caller shows a status-bar message.
"Corrupt" includes a value of the wrong type (`{"window_geometry": 5}`): every field's type is
checked (`FIELD_TYPES`) when the settings are built, so a bad file never reaches the window.

Sampling is the engine's own `SamplingSettings`, and the cache's knobs its own `A2ATSConfig`
(`CacheSettings.config`), both validated there, so the app never accepts what the engine would
refuse and never restates the engine's fields or defaults. Each model's recommended sampling
(`ModelInfo.recommended_sampling`) is the default; the user's own values override it only while
`use_model_sampling` is off (`sampling_for`).
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from a2ats_engine.cache.config import A2ATSConfig
from a2ats_engine.records import MODEL_SAMPLING_FIELDS, ModelInfo, SamplingSettings

from .app_dirs import atomic_write_text, config_dir, remove_stale_temp_files
from .untrusted_json import clean_json, clean_text, read_json

SCHEMA_VERSION = 2
"""2: the Speed preset's missed-attention estimate is None (on where measured to cost nothing
here); a version-1 file on Speed (rerank 2, estimate off, the only off it could mean) migrates to
it (`AppSettings.from_dict`)."""
MAX_SETTINGS_BYTES = 1 << 20  # a larger settings.json is corrupt, not read
MAX_PIXELS = 100_000  # splitter sizes beyond this overflow Qt's int and fit no screen
MAX_RECENT_MODELS = 8
THEMES = ("system", "light", "dark")


def default_kv_bits() -> int | None:
    """K/V storage when the user has not chosen one: full precision on CPU-only MLX builds,
    8-bit on Metal. The recorded 4K eval puts 8-bit storage at ppl 1.026x full attention against
    1.024x with float K/V, for 0.28x the bytes; but on the CPU the dequantization costs decode
    speed, while on a unified-memory Mac memory is what matters. A choice saved in
    settings.json is kept as is."""
    from .backend import is_cpu_only

    return None if is_cpu_only() else 8


def default_config() -> A2ATSConfig:
    """The engine's defaults, with K/V storage per backend (`default_kv_bits`)."""
    return A2ATSConfig(kv_bits=default_kv_bits())


@dataclass(frozen=True)
class CacheSettings:
    """The KV cache used for the next message: `a2ats_enabled=False` = mlx-lm's plain KVCache,
    else A2ATS caches with `config`, the engine's own `A2ATSConfig` (validated there; kv_bits
    defaults per backend, `default_kv_bits`). `config.telemetry` is not a setting: it follows
    the inspector, request by request (`to_config`). The codebook's own properties
    (n_centroids, sub_dim, beta) come with the codebook.

    Saved flat, `{"a2ats_enabled": ..., **config.to_dict()}` without telemetry: the format
    earlier versions wrote (they read the fields they know, this one the fields
    `A2ATSConfig` has), so every settings file keeps loading.
    """

    a2ats_enabled: bool = True
    config: A2ATSConfig = field(default_factory=default_config)

    def __post_init__(self) -> None:
        if not isinstance(self.a2ats_enabled, bool):
            raise ValueError(f"CacheSettings.a2ats_enabled={self.a2ats_enabled!r} must be a bool")
        if not isinstance(self.config, A2ATSConfig):
            raise ValueError(f"CacheSettings.config={self.config!r} must be an A2ATSConfig")

    @classmethod
    def of(cls, a2ats_enabled: bool = True, **config: Any) -> CacheSettings:
        """Settings from `A2ATSConfig` fields by name (kv_bits per backend unless given)."""
        return cls(a2ats_enabled, A2ATSConfig(**{"kv_bits": default_kv_bits(), **config}))

    def to_config(self, telemetry: bool = False, **overrides: Any) -> A2ATSConfig:
        """The config a request runs with: `config` with `telemetry` (and `overrides`)."""
        return replace(self.config, telemetry=telemetry, **overrides)

    def to_dict(self) -> dict[str, Any]:
        values = self.config.to_dict()
        values.pop("telemetry")
        return {"a2ats_enabled": self.a2ats_enabled, **values}

    @classmethod
    def from_dict(cls, data: Any) -> CacheSettings:
        """From a settings file's `cache` object (any version); unknown keys are ignored, a
        bad value raises ValueError naming the field."""
        if not isinstance(data, dict):
            raise ValueError(f"AppSettings.cache={data!r} must be a JSON object")
        values = {k: v for k, v in data.items() if k not in ("a2ats_enabled", "telemetry")}
        values.setdefault("kv_bits", default_kv_bits())  # not chosen yet: per backend
        enabled = data.get("a2ats_enabled", True)
        if not isinstance(enabled, bool):
            raise ValueError(f"CacheSettings.a2ats_enabled={enabled!r} must be a bool")
        return cls(enabled, A2ATSConfig.from_dict(values))


@dataclass
class AppSettings:
    """Everything the app remembers between runs (one JSON file, `schema_version` first)."""

    schema_version: int = SCHEMA_VERSION
    model_source: str = "demo"
    recent_models: list[str] = field(default_factory=list)
    codebook_for_model: dict[str, str] = field(default_factory=dict)
    auto_load_demo_codebook: bool = True
    cache: CacheSettings = field(default_factory=CacheSettings)
    sampling: SamplingSettings = field(default_factory=SamplingSettings)
    use_model_sampling: bool = True
    default_system_prompt: str = ""
    theme: str = "system"
    window_geometry: str = ""
    window_state: str = ""
    splitter_sizes: list[int] = field(default_factory=list)
    inspector_visible: bool = True
    last_conversation_id: str | None = None
    auto_measure_crossover: bool = True  # the first load of a model measures its crossover
    hosts_file: str = ""  # the last mlx.launch hosts file chosen ("Run on" in the model menu)
    run_on_hosts: bool = False  # models load split over hosts_file's hosts, not on this computer

    def __post_init__(self) -> None:
        for name, (check, expected) in FIELD_TYPES.items():
            value = getattr(self, name)
            if not check(value):
                raise ValueError(f"AppSettings.{name}={value!r} must be {expected}")
        if self.theme not in THEMES:
            raise ValueError(f"AppSettings.theme={self.theme!r} must be one of {THEMES}")

    @property
    def hosts(self) -> str:
        """The hosts file models load on ("" = this computer)."""
        return self.hosts_file if self.run_on_hosts and self.hosts_file else ""

    def recent_with(self, source: str) -> list[str]:
        """The recent-models list with `source` first (deduplicated, capped); changes nothing."""
        recent = [source, *[m for m in self.recent_models if m != source]]
        return recent[:MAX_RECENT_MODELS]

    def remember_model(self, source: str) -> None:
        """Put `source` first in the recent-models list (deduplicated, capped)."""
        self.recent_models = self.recent_with(source)

    def sampling_for(self, info: ModelInfo | None) -> SamplingSettings:
        """The sampling for the next reply of the model `info` describes: the model's
        recommended `MODEL_SAMPLING_FIELDS` while `use_model_sampling` is on and the model
        recommends something, the user's own values otherwise; max_tokens, seed and the
        repetition context always come from the user's settings."""
        recommended = info.recommended_sampling if info is not None else None
        if not self.use_model_sampling or recommended is None:
            return self.sampling
        return replace(self.sampling, **{k: getattr(recommended, k) for k in MODEL_SAMPLING_FIELDS})

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "cache": self.cache.to_dict()}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> AppSettings:
        """Build from saved JSON; unknown keys are ignored, bad values raise ValueError/TypeError."""
        if not isinstance(data, dict):
            raise ValueError("settings file does not hold a JSON object")
        version = data.get("schema_version", SCHEMA_VERSION)
        if not _is_int(version) or version < 1:
            raise ValueError(f"AppSettings.schema_version={version!r} is not a valid version")
        names = {f.name for f in fields(cls)}
        values = {k: v for k, v in data.items() if k in names}
        values["schema_version"] = SCHEMA_VERSION  # older versions migrate by defaulting fields
        cache = values.get("cache")
        speed_v1 = isinstance(cache, dict) and cache.get("estimate_missed") is False
        if version < 2 and speed_v1 and cache.get("rerank", 2) == 2:  # version 1's Speed preset
            values["cache"] = {**cache, "estimate_missed": None}  # now its estimate is measured
        if "cache" in values:
            values["cache"] = CacheSettings.from_dict(values["cache"])
        if "sampling" in values:
            values["sampling"] = _sub("sampling", SamplingSettings, values["sampling"])
        return cls(**values)


def _sub(name: str, kind: type, data: Any):
    if not isinstance(data, dict):
        raise ValueError(f"AppSettings.{name}={data!r} must be a JSON object")
    names = {f.name for f in fields(kind)}
    return kind(**{k: v for k, v in data.items() if k in names})


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _list_of(check):
    return lambda value: isinstance(value, list) and all(check(item) for item in value)


def _is_str(value: object) -> bool:
    return isinstance(value, str)


def _is_bool(value: object) -> bool:
    return isinstance(value, bool)


FIELD_TYPES = {
    "schema_version": (lambda v: _is_int(v) and v >= 1, "an integer >= 1"),
    "model_source": (_is_str, "a string"),
    "recent_models": (_list_of(_is_str), "a list of strings"),
    "codebook_for_model": (
        lambda v: isinstance(v, dict) and all(_is_str(k) and _is_str(x) for k, x in v.items()),
        "an object of strings",
    ),
    "auto_load_demo_codebook": (_is_bool, "true or false"),
    "cache": (lambda v: isinstance(v, CacheSettings), "a cache settings object"),
    "sampling": (lambda v: isinstance(v, SamplingSettings), "a sampling settings object"),
    "use_model_sampling": (_is_bool, "true or false"),
    "default_system_prompt": (_is_str, "a string"),
    "theme": (_is_str, "a string"),
    "window_geometry": (_is_str, "a string"),
    "window_state": (_is_str, "a string"),
    "splitter_sizes": (
        _list_of(lambda v: _is_int(v) and 0 <= v <= MAX_PIXELS),
        f"a list of integers from 0 to {MAX_PIXELS}",
    ),
    "inspector_visible": (_is_bool, "true or false"),
    "last_conversation_id": (lambda v: v is None or _is_str(v), "a string or null"),
    "auto_measure_crossover": (_is_bool, "true or false"),
    "hosts_file": (_is_str, "a string"),
    "run_on_hosts": (_is_bool, "true or false"),
}
"""Every AppSettings field: (check, what it must be). A test keeps this in step with the fields."""


def settings_path() -> Path:
    return config_dir() / "settings.json"


def load_settings(path: Path | None = None) -> tuple[AppSettings, str | None]:
    """Read the settings file. Returns (settings, message); `message` (one line naming the
    file) is set when the file was corrupt and has been backed up (defaults are returned then).
    Lone surrogates in its strings become U+FFFD, so the settings can always be saved again."""
    path = path or settings_path()
    remove_stale_temp_files(path.parent)
    if not path.exists():
        return AppSettings(), None
    try:
        data = clean_json(read_json(path, MAX_SETTINGS_BYTES))
        return AppSettings.from_dict(data), None
    except (ValueError, TypeError, OSError, OverflowError, RecursionError) as exc:
        backup = path.with_name(f"{path.name}.corrupt-{time.strftime('%Y%m%d-%H%M%S')}")
        try:
            path.replace(backup)
        except OSError:
            backup = None
        where = f" (backed up to {backup.name})" if backup else ""
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        reason = clean_text(reason)[:300]
        return AppSettings(), (
            f"Settings file {path.name} was unreadable, defaults restored{where}: {reason}"
        )


def save_settings(settings: AppSettings, path: Path | None = None) -> None:
    """Write the settings atomically as indented JSON."""
    atomic_write_text(path or settings_path(), json.dumps(settings.to_dict(), indent=2) + "\n")
