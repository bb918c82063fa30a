"""Seed-compatible entry points: `KVCacheConfig(method="a2ats", ...)` + `KVCacheBuilder`.

The project started from a document describing an "A2ATS-adapted" cache configured this way.
The same calls build our real cache:

    caches = KVCacheBuilder.for_model(model, KVCacheConfig(method="a2ats", head_dim=64))
    mlx_lm.stream_generate(model, tokenizer, prompt, prompt_cache=caches)

Field mapping: a2ats_codebook_bits -> n_centroids = 2**bits; a2ats_sub_dim -> sub_dim (product VQ;
equal to head_dim means full-dim VQ); a2ats_window -> window; a2ats_beta -> beta, forced to 1.0
(plain VQ) when a2ats_use_query_aware is False; a2ats_retrieval_fraction -> budget (the fraction
of the context retrieved per query head: here tokens really are retrieved, not just re-coded);
a2ats_codebook -> a Codebook or a codebook file path (None: random codebook, loud warning).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import mlx.nn as nn

from ..calibration.codebook_spec import CodebookSpec
from .config import A2ATSConfig


@dataclass(frozen=True)
class KVCacheConfig:
    """Seed-style configuration. Only `method="a2ats"` exists here."""

    method: str = "a2ats"
    head_dim: int = 128
    a2ats_codebook_bits: int = 12
    a2ats_sub_dim: int | None = None
    a2ats_window: int = 64
    a2ats_use_query_aware: bool = True
    a2ats_beta: float = 0.0
    a2ats_retrieval_fraction: float = 0.03
    a2ats_codebook: Any = None
    a2ats_far_offset: int = 2048
    a2ats_sinks: int = 8
    a2ats_far_buckets: int = 4
    a2ats_kv_bits: int | None = None

    def __post_init__(self) -> None:
        if self.method != "a2ats":
            raise ValueError(f"KVCacheConfig.method={self.method!r}: only 'a2ats' is available")
        if not isinstance(self.head_dim, int) or self.head_dim < 2:
            raise ValueError(f"KVCacheConfig.head_dim={self.head_dim!r} must be an integer >= 2")
        bits = self.a2ats_codebook_bits
        if not isinstance(bits, int) or not 1 <= bits <= 16:
            raise ValueError(f"KVCacheConfig.a2ats_codebook_bits={bits!r} must be in [1, 16]")
        frac = self.a2ats_retrieval_fraction
        if not 0.0 < frac <= 1.0:
            raise ValueError(
                f"KVCacheConfig.a2ats_retrieval_fraction={frac!r} is out of range: must be in (0, 1]"
            )
        if not 0.0 <= self.a2ats_beta <= 1.0:
            raise ValueError(
                f"KVCacheConfig.a2ats_beta={self.a2ats_beta!r} is out of range: must be in [0, 1]"
            )
        sub = self.a2ats_sub_dim
        if sub is not None and (sub < 1 or self.head_dim % sub):
            raise ValueError(
                f"KVCacheConfig.a2ats_sub_dim={sub!r} must divide head_dim={self.head_dim}"
            )

    def to_a2ats(self) -> A2ATSConfig:
        """The equivalent A2ATSConfig (the cache settings)."""
        return A2ATSConfig(
            window=self.a2ats_window,
            far_offset=self.a2ats_far_offset,
            sinks=self.a2ats_sinks,
            budget=float(self.a2ats_retrieval_fraction),
            far_buckets=self.a2ats_far_buckets,
            kv_bits=self.a2ats_kv_bits,
        )

    def codebook_spec(self) -> CodebookSpec:
        """The codebook these settings describe (what `calibrate` would train)."""
        sub = self.a2ats_sub_dim
        return CodebookSpec(
            n_centroids=2**self.a2ats_codebook_bits,
            sub_dim=None if sub is None or sub == self.head_dim else sub,
            beta=float(self.a2ats_beta) if self.a2ats_use_query_aware else 1.0,
        )


class KVCacheBuilder:
    """Builds fresh cache lists for a model (one A2ATSCache per attention layer)."""

    @staticmethod
    def for_model(model: nn.Module, config: KVCacheConfig) -> list:
        """A fresh cache list with the attention hook installed. Checks head_dim against the model."""
        from .codebook import Codebook
        from .model_cache import make_cache
        from .rope import model_geometry

        geo = model_geometry(model)
        if geo.head_dim != config.head_dim:
            raise ValueError(
                f"KVCacheConfig.head_dim={config.head_dim} does not match the model's head dim "
                f"{geo.head_dim}"
            )
        codebook = config.a2ats_codebook
        if isinstance(codebook, str | Path):
            codebook = Codebook.load(codebook)
        if codebook is None:
            codebook = _random_codebook(geo, config.codebook_spec())
        return make_cache(model, config.to_a2ats(), codebook)


def _random_codebook(geo: Any, spec: CodebookSpec) -> Any:
    """A random codebook of the spec's shape (at most 256 centroids), with a loud warning."""
    from .codebook import Codebook

    warnings.warn(
        "A2ATS: no codebook given, using a RANDOM codebook: retrieval will be near random. "
        "Calibrate one (`a2ats calibrate`) for real use.",
        stacklevel=3,
    )
    return Codebook.random(
        geo.num_layers,
        geo.num_kv_heads,
        geo.head_dim,
        min(spec.n_centroids, 256),
        sub_dim=spec.sub_dim,
    )
