"""Records the engine and the app share: what a model is and how tokens are drawn.

MLX-free (importing this module never imports `mlx`), so the GUI thread can build and validate
them; the engine's cache settings live beside them in `cache/config.py` (also MLX-free).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass, fields
from typing import Any

from .cache.config import check_int
from .cache.layer_plan import LayerPlan


@dataclass(frozen=True)
class ModelInfo:
    """What a loaded model is, for the UI and `a2ats info`.

    rope: the RoPE parameters of layer 0 (`RopeSpec.to_dict()`), or {"error": ...} when the
    variant is one A2ATS cannot replay. quantization: the source's quantization ("Q4_1",
    "4-bit affine, group 64"...), with a note when it was dequantized for the CPU; None when the
    weights were never quantized. disk_bytes: size of the source on disk (GGUF file, or model
    folder). path: the source file or folder. layer_plan: which layers get A2ATS and why the
    others keep the model's own cache (None when the model could not be probed).
    """

    name: str
    architecture: str
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rope: dict
    context_length: int | None
    quantization: str | None
    disk_bytes: int
    path: str
    layer_plan: LayerPlan | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _check_number(
    name: str, value: Any, lo: float, hi: float, *, lo_open: bool = False, hi_open: bool = False
) -> None:
    ok = not isinstance(value, bool) and isinstance(value, int | float) and math.isfinite(value)
    if ok:
        ok = (value > lo if lo_open else value >= lo) and (value < hi if hi_open else value <= hi)
    if not ok:
        left, right = "(" if lo_open else "[", ")" if hi_open else "]"
        raise ValueError(
            f"SamplingSettings.{name}={value!r} is out of range: must be in {left}{lo}, {hi}{right}"
        )


def _check_int(name: str, value: Any, lo: int, hi: int | None = None) -> None:
    check_int("SamplingSettings", name, value, lo, hi)


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
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})
