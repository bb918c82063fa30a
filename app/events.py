"""Frozen records crossing the engine thread: the requests the controller sends the worker
(`EngineRequest`), what the worker emits back (besides the engine's own TokenEvent,
CacheSnapshot and GenerationStats), and the string enums they use. Everything is immutable or a
private copy, so a record can cross between the GUI thread and the engine thread safely.
`ReplyMode` and `OverflowPolicy` are the engine's own (a2ats_engine/chat_turn.py)."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import TYPE_CHECKING, Any

from a2ats_engine import OverflowPolicy, ReplyMode  # the engine's chat turn (chat_turn.py)
from a2ats_engine.records import ModelInfo, SamplingSettings

if TYPE_CHECKING:
    from .settings import CacheSettings

JsonValue = str | int | float | bool | None | list["JsonValue"] | dict[str, "JsonValue"]
JsonDict = dict[str, JsonValue]


class Job(StrEnum):
    """What the engine worker was asked to do (the `task` of Progress and ErrorReport)."""

    LOAD_MODEL = "load_model"
    FETCH_DEMO = "fetch_demo"
    LOAD_CODEBOOK = "load_codebook"
    CALIBRATE = "calibrate"
    GENERATE = "generate"
    CROSSOVER = "crossover"  # measuring where retrieval pays off on this machine


class StopReason(StrEnum):
    """Why a reply ended (`GenerationStats.stop_reason`; the engine's strings plus two)."""

    STOP = "stop"  # the model ended it
    LENGTH = "length"  # max tokens reached
    CANCELLED = "cancelled"  # the user stopped it
    ERROR = "error"  # the engine failed (an ErrorReport came first)
    CONTEXT_FULL = "context_full"  # prompt + max tokens do not fit; nothing was generated


@dataclass(frozen=True)
class ModelLoaded:
    """A model is ready: on this computer, or (`hosts`, an mlx.launch hosts file) split over
    the hosts' ranks, `ranks` saying which layers each serves."""

    source: str
    info: ModelInfo
    seconds: float
    hosts: str = ""
    ranks: tuple[str, ...] = ()


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
    metadata: JsonDict = field(default_factory=dict)
    warnings: tuple[str, ...] = ()
    automatic: bool = False  # loaded without the user asking (remembered or demo default)

    def provenance(self) -> JsonDict:
        return {
            "name": self.name,
            "path": self.path,
            "sha256": self.sha256,
            "n_centroids": self.n_centroids,
            "sub_dim": self.sub_dim,
            "beta": self.beta,
        }


@dataclass(frozen=True)
class PrefillProgress:
    """The prompt prefill of request `request_id`: `done` of `total` new prompt tokens are in the
    cache after `seconds` (from its start). Sent after each chunk; a stop is honoured between
    chunks."""

    request_id: int
    done: int
    total: int
    seconds: float


@dataclass(frozen=True)
class CrossoverMeasured:
    """The crossover measured on this machine for the loaded model (recorded in the user table,
    used from the next reply on), or why there is none: `skipped` (already measured here),
    `cancelled` (a message was sent while it ran)."""

    exact_below: int = 0
    never: bool = False
    ratios: tuple[tuple[int, float], ...] = ()
    estimate: float | None = None  # a retrieval step with the missed-attention estimate / without
    estimate_on: bool = False  # so the estimate is on by default (estimate_missed None)
    estimate_layers: int | None = None  # on this many layers (those that miss most); None: all
    skipped: bool = False
    cancelled: bool = False

    @classmethod
    def of(cls, entry: dict) -> CrossoverMeasured:
        """From the crossover row the measurement recorded (`crossover_probe.measure_crossover`)."""
        ratios = tuple((int(n), float(r)) for n, r in entry["ratios"].items())
        est = entry.get("estimate") or {}
        ratio, layers = est.get("ratio"), est.get("layers")
        if not isinstance(layers, int) or layers >= int(entry.get("a2ats_layers") or 0):
            layers = None  # every layer (or not recorded)
        return cls(
            int(entry["exact_below"]), bool(entry["never"]), ratios,
            float(ratio) if ratio is not None else None, bool(est.get("on")), layers,
        )  # fmt: skip


@dataclass(frozen=True)
class Progress:
    """Progress of a long task. `total` 0 = indeterminate."""

    task: Job
    stage: str
    done: int
    total: int


@dataclass(frozen=True)
class ErrorReport:
    """A task failed. `message` is one line for a dialog; `detail` has the traceback, if any."""

    task: Job | str  # a Job, or "save" for a failed write of the app's own files
    message: str
    detail: str = ""
    source: str = ""  # the path / model / request the task was about
    automatic: bool = False  # the app started the task on its own (a remembered codebook)


@dataclass(frozen=True)
class DemoStatus:
    """Whether the demo model is on this computer (`folder` "" = not fetched yet)."""

    folder: str


@dataclass(frozen=True)
class CalibrationRequest:
    """What the calibration dialog asks for. `seq` is set by ChatController.calibrate (a
    cancel cancels every calibration numbered up to the last one sent)."""

    output: str  # where the codebook file is saved
    files: tuple[str, ...] = ()  # empty = the built-in corpus
    tokens: int = 16384
    n_centroids: int = 1024
    beta: float = 0.0
    sub_dim: int | None = None
    cache: CacheSettings | None = None  # window, far offset b, sinks to record
    seq: int = 0


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
    mode: ReplyMode
    text: str  # the new user message ("send", "edit"); ignored for "regenerate"
    history: tuple[tuple[str, str], ...]  # (role, content) pairs, no system message
    system_prompt: str
    sampling: SamplingSettings
    cache: CacheSettings
    telemetry: bool = False
    overflow: OverflowPolicy = OverflowPolicy.ASK
    keep_cache: bool = True  # the chat's cache may be kept on disk (not for a temporary chat)


@dataclass(frozen=True)
class GenerationStarted:
    """The worker began a request. `provenance` describes model, cache, codebook, sampling."""

    request_id: int
    conversation_id: str
    mode: ReplyMode
    provenance: JsonDict = field(default_factory=dict)
    notes: tuple[str, ...] = ()


@dataclass(frozen=True)
class ContextOverflow:
    """Prompt plus max tokens do not fit in the model's context (nothing was generated)."""

    request_id: int
    prompt_tokens: int
    max_tokens: int
    context_length: int


@dataclass(frozen=True)
class ContextTokens:
    """The tokens held in the session's context (position i = token_ids[i]), their decoded
    texts (one string per token; empty while a multi-byte character is incomplete), and the
    chat messages those tokens encode, so the chat view can map positions to text spans."""

    request_id: int
    token_ids: tuple[int, ...]
    texts: tuple[str, ...]
    messages: tuple[tuple[str, str], ...]


# ----- requests: what the controller asks the worker to do (`EngineWorker.handle`) -------------


@dataclass(frozen=True)
class LoadModel:
    """Load a model (folder, .gguf, HF repo id or "demo"), then `codebook` (the one last used
    with it) or, for the demo with `demo_codebook`, the demo's default codebook."""

    source: str
    codebook: str = ""
    demo_codebook: bool = True
    hosts: str = ""  # an mlx.launch hosts file: the model split over its hosts ("" = here)


@dataclass(frozen=True)
class FindDemo:
    """Say whether the demo model was fetched (answered by `demo_found`)."""


@dataclass(frozen=True)
class FetchDemo:
    """Fetch the demo model and build its default codebook (answered by `demo_fetched`)."""


@dataclass(frozen=True)
class LoadCodebook:
    path: str
    automatic: bool = False  # not the user's choice (remembered, or the demo's default)


@dataclass(frozen=True)
class ClearCodebook:
    """Go back to no codebook (A2ATS retrieval then uses a random one)."""


@dataclass(frozen=True)
class MeasureCrossover:
    """Measure the loaded model's crossover here; `automatic`: only if not measured yet for
    these settings. `seq` numbers it (ChatController): a sent message cancels every measurement
    up to it. `config`: the A2ATS settings to measure with (None: the engine's defaults)."""

    name: str
    automatic: bool = False
    seq: int = 0
    config: Any = None


@dataclass(frozen=True)
class ForgetChatCache:
    """Remove a deleted chat's saved cache (and stop keeping the session's for it)."""

    conversation_id: str


EngineRequest = (
    LoadModel
    | FindDemo
    | FetchDemo
    | LoadCodebook
    | ClearCodebook
    | MeasureCrossover
    | CalibrationRequest
    | GenerationRequest
    | ForgetChatCache
)
