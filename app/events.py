"""Frozen records the engine worker emits to the GUI (besides the engine's own TokenEvent,
CacheSnapshot and GenerationStats). Everything is immutable or a private copy, so a record can
cross from the engine thread to the GUI thread safely."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class ModelLoaded:
    """A model is ready. `info` is the engine's ModelInfo."""

    source: str
    info: Any
    seconds: float


@dataclass(frozen=True)
class CodebookLoaded:
    """A codebook was loaded and validated against the current model."""

    path: str
    name: str
    sha256: str
    n_centroids: int
    sub_dim: int
    beta: float | None
    num_layers: int
    nbytes: int
    metadata: dict = field(default_factory=dict)
    warnings: tuple[str, ...] = ()
    automatic: bool = False  # loaded without the user asking (remembered or demo default)

    def provenance(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "path": self.path,
            "sha256": self.sha256,
            "n_centroids": self.n_centroids,
            "sub_dim": self.sub_dim,
            "beta": self.beta,
        }


@dataclass(frozen=True)
class Progress:
    """Progress of a long task. `total` 0 = indeterminate."""

    task: str  # "load_model" | "fetch_demo" | "calibrate" | "load_codebook"
    stage: str
    done: int
    total: int


@dataclass(frozen=True)
class ErrorReport:
    """A task failed. `message` is one line for a dialog; `detail` has the traceback, if any."""

    task: str
    message: str
    detail: str = ""
    source: str = ""  # the path / model / request the task was about


@dataclass(frozen=True)
class CalibrationRequest:
    """What the calibration dialog asks for."""

    output: str  # where the codebook file is saved
    files: tuple[str, ...] = ()  # empty = the built-in corpus
    tokens: int = 16384
    n_centroids: int = 1024
    beta: float = 0.0
    sub_dim: int | None = None
    cache: Any = None  # app.settings.CacheSettings: window, far offset b, sinks to record


@dataclass(frozen=True)
class CalibrationFinished:
    path: str
    seconds: float


@dataclass(frozen=True)
class GenerationRequest:
    """One reply to produce. `history` is the conversation as the session must hold it before
    the action (for "regenerate"/"edit" it still contains the turn being replaced)."""

    request_id: int
    conversation_id: str
    mode: str  # "send" | "regenerate" | "edit"
    text: str  # the new user message ("send", "edit"); ignored for "regenerate"
    history: tuple[tuple[str, str], ...]  # (role, content) pairs, no system message
    system_prompt: str
    sampling: Any  # a2ats_engine.records.SamplingSettings
    cache: Any  # app.settings.CacheSettings
    telemetry: bool = False


@dataclass(frozen=True)
class GenerationStarted:
    """The worker began a request. `provenance` describes model, cache, codebook, sampling."""

    request_id: int
    conversation_id: str
    mode: str
    provenance: dict = field(default_factory=dict)
    notes: tuple[str, ...] = ()


@dataclass(frozen=True)
class ContextTokens:
    """The tokens held in the session's context (position i = token_ids[i]), their decoded
    texts (one string per token; empty while a multi-byte character is incomplete), and the
    chat messages those tokens encode, so the chat view can map positions to text spans."""

    request_id: int
    token_ids: tuple[int, ...]
    texts: tuple[str, ...]
    messages: tuple[tuple[str, str], ...]
