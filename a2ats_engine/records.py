"""Records the engine and the app share: what a model is and how tokens are drawn.

MLX-free (importing this module never imports `mlx`), so the GUI thread can build and validate
them; the engine's cache settings live beside them in `cache/config.py` (also MLX-free).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from .validation import check_int, check_number, from_known_fields

if TYPE_CHECKING:  # an annotation only: records stay below the cache package
    from .cache.layer_plan import LayerPlan

DEFAULT_MAX_CONTEXT = 8192
"""Context length assumed for distance-bucket planning when a model does not state one."""


def planning_context(max_context: int | None) -> int:
    """The context the far-distance buckets are planned for: the model's `max_context`, or
    DEFAULT_MAX_CONTEXT when it does not state one."""
    return int(max_context or DEFAULT_MAX_CONTEXT)


@dataclass(frozen=True)
class ModelGeometry:
    """The attention shape of a model, as A2ATS sees it (read by `cache.rope.model_geometry`).

    model_type:   mlx-lm's model type ("llama", "qwen2", ...).
    num_layers:   attention layers; num_heads / num_kv_heads: query / key-value heads per layer.
    head_dim:     features per head.
    rope:         layer 0's RoPE parameters (`RopeSpec.to_dict()`), or {"error": ...} when the
                  variant is one A2ATS cannot replay.
    max_context:  the model's stated context length (max_position_embeddings), None if none.
    """

    model_type: str
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rope: dict
    max_context: int | None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class ModelInfo:
    """What a loaded model is, for the UI and `a2ats info`.

    geometry: its attention shape (`ModelGeometry`); `architecture`, `num_layers`, `num_heads`,
    `num_kv_heads`, `head_dim`, `rope` and `context_length` read from it. quantization: the
    source's quantization ("Q4_1", "4-bit affine, group 64"...), with a note when it was
    dequantized for the CPU; None when the weights were never quantized. disk_bytes: size of the
    source on disk (GGUF file, or model folder). path: the source file or folder.
    recommended_sampling: what the model's authors recommend (its generation_config.json, a
    GGUF's `general.sampling.*` keys, or the demo's preset), None when they say nothing; only `MODEL_SAMPLING_FIELDS` come from the model.
    layer_plan: which layers get A2ATS and why the others keep the model's own cache (None
    when the model could not be probed).
    """

    name: str
    geometry: ModelGeometry
    quantization: str | None
    disk_bytes: int
    path: str
    recommended_sampling: SamplingSettings | None = None
    layer_plan: LayerPlan | None = None

    @property
    def architecture(self) -> str:
        return self.geometry.model_type

    @property
    def num_layers(self) -> int:
        return self.geometry.num_layers

    @property
    def num_heads(self) -> int:
        return self.geometry.num_heads

    @property
    def num_kv_heads(self) -> int:
        return self.geometry.num_kv_heads

    @property
    def head_dim(self) -> int:
        return self.geometry.head_dim

    @property
    def rope(self) -> dict:
        return self.geometry.rope

    @property
    def context_length(self) -> int | None:
        return self.geometry.max_context

    def to_dict(self) -> dict[str, Any]:
        """Flat: name, architecture, num_layers, num_heads, num_kv_heads, head_dim, rope,
        context_length, quantization, disk_bytes, path, recommended_sampling and layer_plan (dicts or None)."""
        g = self.geometry
        return {
            "name": self.name,
            "architecture": g.model_type,
            "num_layers": g.num_layers,
            "num_heads": g.num_heads,
            "num_kv_heads": g.num_kv_heads,
            "head_dim": g.head_dim,
            "rope": g.rope,
            "context_length": g.max_context,
            "quantization": self.quantization,
            "disk_bytes": self.disk_bytes,
            "path": self.path,
            "recommended_sampling": (
                None if self.recommended_sampling is None else self.recommended_sampling.to_dict()
            ),
            "layer_plan": None if self.layer_plan is None else asdict(self.layer_plan),
        }


def _check_number(name: str, value: Any, lo: float, hi: float, **open_ends: bool) -> None:
    check_number("SamplingSettings", name, value, lo, hi, **open_ends)


def _check_int(name: str, value: Any, lo: int, hi: int | None = None) -> None:
    check_int("SamplingSettings", name, value, lo, hi)


MODEL_SAMPLING_FIELDS = ("temperature", "top_p", "min_p", "top_k", "repetition_penalty")
"""The sampling fields a model may recommend (max_tokens, seed, ... are the user's)."""


@dataclass(frozen=True)
class SamplingSettings:
    """How tokens are drawn. Validated at construction (`ValueError` naming field and range).

    temperature:        0 = greedy (argmax); > 0 = sample from softmax(logits / temperature).
    top_p:              nucleus sampling mass in (0, 1]; 1 = off.
    min_p:              drop tokens below min_p x p(top token), in [0, 1); 0 = off.
    top_k:              keep the k most likely tokens; 0 = off.
    repetition_penalty: > 0; 1 = off, > 1 discourages the last `repetition_context_size` tokens.
    seed:               None = unseeded; else `mx.random.seed(seed)` before every reply.
    max_tokens:         reply length limit (stop reason "length").
    repetition_context_size: how many previous tokens the repetition penalty looks at.
    """

    temperature: float = 0.7
    top_p: float = 1.0
    min_p: float = 0.0
    top_k: int = 0
    repetition_penalty: float = 1.0
    seed: int | None = None
    max_tokens: int = 512
    repetition_context_size: int = 20

    def __post_init__(self) -> None:
        _check_number("temperature", self.temperature, 0.0, 100.0)
        _check_number("top_p", self.top_p, 0.0, 1.0, lo_open=True)
        _check_number("min_p", self.min_p, 0.0, 1.0, hi_open=True)
        _check_int("top_k", self.top_k, 0)
        _check_number("repetition_penalty", self.repetition_penalty, 0.0, 100.0, lo_open=True)
        if self.seed is not None:
            _check_int("seed", self.seed, 0, 2**63 - 1)
        _check_int("max_tokens", self.max_tokens, 1)
        _check_int("repetition_context_size", self.repetition_context_size, 1)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    def make_sampler(self) -> Callable:
        """mlx-lm sampler: log-probs [B, vocab] -> token ids [B]."""
        from mlx_lm.sample_utils import make_sampler

        return make_sampler(
            temp=float(self.temperature),
            top_p=float(self.top_p),
            min_p=float(self.min_p),
            top_k=self.top_k,
        )

    def make_logits_processors(self) -> list[Callable]:
        """mlx-lm logits processors (tokens [T], logits [B, vocab]) -> logits; [] when off."""
        from mlx_lm.sample_utils import make_logits_processors

        if self.repetition_penalty == 1.0:
            return []
        return make_logits_processors(
            repetition_penalty=float(self.repetition_penalty),
            repetition_context_size=self.repetition_context_size,
        )

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> SamplingSettings:
        """Build from a dict, ignoring unknown keys (forward compatibility of saved settings)."""
        return from_known_fields(cls, data)


def sampling_from_generation_config(config: object) -> SamplingSettings | None:
    """The sampling a Hugging Face `generation_config.json` recommends, or None when it names
    none of `MODEL_SAMPLING_FIELDS`. The file is untrusted: a value of the wrong type or out of
    range is ignored. `"do_sample": false` means greedy (temperature 0); a file that names other
    fields but no temperature gets Hugging Face's default temperature, 1.0."""
    if not isinstance(config, dict):
        return None
    values: dict[str, Any] = {}
    for name in MODEL_SAMPLING_FIELDS:
        value = config.get(name)
        if isinstance(value, float) and name == "top_k" and value.is_integer():
            value = int(value)
        try:
            SamplingSettings(**{name: value})
        except (TypeError, ValueError):
            continue
        values[name] = value
    if config.get("do_sample") is False:
        values["temperature"] = 0.0
    if not values:
        return None
    values.setdefault("temperature", 1.0)
    return SamplingSettings(**values)
