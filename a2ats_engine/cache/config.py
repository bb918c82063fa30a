"""A2ATSConfig: every knob of the A2ATS cache, validated at construction."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace
from typing import Any

from ..validation import check_int, from_known_fields

ESTIMATE_SCORES = ("centroid", "mean", "code_mean")  # how `estimate_missed` scores a slot


def _check_int(name: str, value: Any, lo: int, hi: int | None = None) -> None:
    check_int("A2ATSConfig", name, value, lo, hi)


@dataclass(frozen=True)
class A2ATSConfig:
    """Settings of the A2ATS cache (docs/ARCHITECTURE.md, "The method").

    window:       trailing tokens (the current one included) scored with exact RoPE.
    far_offset:   b, the distance every far token is treated as sitting at (paper: 2048).
                  Used only when far_buckets = 1; ignored otherwise (`unused_settings`).
    sinks:        leading tokens always attended.
    budget:       far tokens retrieved per query head: a fraction of the context in (0, 1],
                  or an int token count >= 1.
    min_k:        lower bound on the retrieved count when `budget` is a fraction.
    far_buckets:  1 = the paper's single distance b; m > 1 = m log-spaced distance buckets,
                  each far token scored at its bucket's own distance (far_offset unused).
    rerank:       1 = keep the top-K of the approximate scores (the paper); r > 1 = take the
                  top r*K candidates by approximate score, then keep the K with the highest
                  exact scores among them (their stored keys are gathered and scored exactly).
                  Default 2: recall 0.899 -> 0.915 of the attention mass, ppl 1.044x -> 1.024x
                  full at 4K / budget 0.03 on the demo model (docs/BENCHMARKS.md).
    rerank_shared: with rerank > 1, the candidates are the top rerank*K of the GQA group's best
                  approximate score (max over its query heads), gathered once per KV head and
                  scored exactly by every head: G times fewer key rows than per-head candidates.
    reuse_selection: None = select far tokens afresh every step; c in (0, 1] = reuse the far
                  selection made at an earlier step while every query head's pre-RoPE query
                  keeps a cosine >= c with the query it was made for (next step only; one host
                  sync per layer and step for the test).
    estimate_missed: fold the far tokens that were not retrieved into the softmax through
                  their slots: per (distance bucket, code) slot the cache keeps the token count
                  and value sum, and each step adds `n_c exp(s_c)` to the denominator and
                  `exp(s_c) V_c` to the numerator (minus the retrieved tokens' share), s_c the
                  slot's score (`estimate_scores`). Output error 0.105 -> 0.050 (below oracle
                  top-K's 0.077), ppl 1.025x -> 1.008x full at 4K / budget 0.03 on the demo
                  model (three texts pooled, slots scored by their mean keys). None (the
                  default, the "speed" preset): left to what it costs on this machine for
                  this model's geometry: where `a2ats crossover` (or the app's first-load
                  measurement) timed a retrieval step with it on every layer at >= 0.95x the
                  speed of one without, on every layer; below that, on the layers that miss
                  most, as many as keep that margin (`estimate_layers`,
                  `crossover.measured_estimate`); off where that was not measured; True (every
                  layer) in the "quality" preset (`PRESETS`). Its cost depends on the
                  retrieving layers and KV heads. In the host step it costs about 8% of a
                  retrieval step's speed at 8K with mean slot scores on the demo model's 30
                  layers on a 2-core CPU, nothing measurable on Gemma 3 270M's 3
                  (docs/BENCHMARKS.md sections 1 and 2).
                  With a product-VQ codebook a slot is the
                  first subspace's code (and bucket); "centroid" scores need a full-dimension
                  codebook (sub_dim = head_dim): with product VQ the cache warns and runs
                  without the estimate.
    estimate_layers: with the estimate on, None = every A2ATS layer runs it; N >= 1 = only
                  the N layers whose retrieval misses the most attention mass: every layer
                  runs it for a cache list's first retrieval steps, then the N with the
                  highest estimated missed share keep it (`estimate_layers.EstimateLayers`).
                  With `estimate_missed` None and this None, N is what the measured cost
                  affords on this machine (`crossover.affordable_layers`): every layer where
                  the estimate on all of them costs nothing measurable, else as many as keep
                  a step within that margin (`crossover.ESTIMATE_FREE`).
    estimate_scores: how `estimate_missed` scores a slot. "centroid": the step's lookup
                  table (the query rotated to the bucket's distance, against the centroid).
                  "mean": the query against the mean of the slot's own post-RoPE keys (the
                  cache keeps their sum beside the value sum), which is the slot's exact mean
                  score: no codebook or distance error, only the spread of the scores within
                  the slot; twice the per-slot memory and one more small product a step.
                  "code_mean": "mean" over slots that are codes alone (every distance bucket
                  of a code together): m times fewer slots to hold and read each step, a
                  wider spread of scores within a slot.
    coverage:     None = every query head keeps its K far tokens; p in (0, 1) = an adaptive
                  budget: of the rerank's candidates (exact scores) each head keeps the fewest
                  of its best K whose softmax mass covers p of all candidates' mass, at least
                  `coverage_floor` (the rest are masked: fixed shapes). Needs rerank > 1.
    coverage_floor: fewest far tokens a head keeps with `coverage`.
    exact_below:  decode steps at a context shorter than this many tokens attend exactly (keys
                  are still coded): below the crossover exact attention is faster than
                  retrieval. None = the measured crossover for the backend and model geometry
                  (`crossover.py`; 0 where none was measured), 0 = retrieve as soon as
                  anything can be dropped.
    kv_bits:      None = full K/V in the model dtype; 8 or 4 = stored with mx.quantize.
    kv_group_size: group size for kv_bits quantization (32, 64 or 128).
    kv_memory:    None = K/V rows stay in process memory; B >= 0 = a limit in bytes on the
                  resident K/V rows of one chat's A2ATS layers (each layer gets an equal share):
                  past its share a layer moves its rows to the cold tier, a memory-mapped file
                  under the cache folder (`cold.py`), and keeps only the codes in memory;
                  0 = every row in the file from the first token. Float rows only (not with
                  kv_bits). Native layers (sliding windows, SSM state) are not counted.
                  Default None, from measurements (docs/BENCHMARKS.md section 3, "K/V on
                  disk: the cold tier"): with its file in the page cache the cold tier decodes
                  and prefills about as fast as rows in memory, but from a cold page cache
                  every step is bound by the disk's random reads, every row is written to the
                  disk, and it cannot hold kv_bits rows (8-bit is the app's default on Metal).
    telemetry:    record LayerStats after every decode step (costs a host sync per step).
    fidelity_every: with telemetry, every k-th decode step also runs a shadow exact attention
                  and records the attention mass recalled per KV head (0 = off).
    layer_budgets: None = every layer retrieves `budget`; a tuple of positive multipliers, one
                  per model layer (cache slot; entries of layers that keep the model's own
                  cache are ignored): layer l retrieves `budget * layer_budgets[l]` (a fraction
                  capped at 1; an int count rounded, at least 1). A layer whose fraction reaches
                  1 keeps every far token: it attends exactly (dense), through the same path
                  as a short context. min_k and coverage_floor stay per layer as they are.
                  Each layer's cache holds its own scaled budget (`for_layer`); `make_cache`
                  checks the length against the model. Chosen from measured per-layer recall by
                  `layer_budgets.allocate_layer_budgets` (eval method `a2ats_alloc`).

    What the codebook is (centroids, product-VQ split, beta) is not a cache setting: the cache
    reads it from the codebook it is given, and calibration takes a `CodebookSpec`
    (`cache/codebook_spec.py`).
    """

    window: int = 64
    far_offset: int = 2048
    sinks: int = 8
    budget: float | int = 0.03
    min_k: int = 16
    far_buckets: int = 4
    rerank: int = 2
    rerank_shared: bool = False
    reuse_selection: float | None = None
    estimate_missed: bool | None = None
    estimate_scores: str = "mean"
    estimate_layers: int | None = None
    exact_below: int | None = None
    coverage: float | None = None
    coverage_floor: int = 16
    kv_bits: int | None = None
    kv_group_size: int = 64
    kv_memory: int | None = None
    telemetry: bool = False
    fidelity_every: int = 0
    layer_budgets: tuple[float, ...] | None = None

    def __post_init__(self) -> None:
        _check_int("window", self.window, 1)
        _check_int("far_offset", self.far_offset, 1)
        _check_int("sinks", self.sinks, 0)
        _check_int("min_k", self.min_k, 1)
        _check_int("far_buckets", self.far_buckets, 1, 64)
        _check_int("rerank", self.rerank, 1, 64)
        b = self.budget
        if isinstance(b, bool) or not isinstance(b, int | float):
            raise ValueError(
                f"A2ATSConfig.budget={b!r} is out of range: must be a fraction in (0, 1] "
                "or an integer token count >= 1"
            )
        if isinstance(b, int) and b < 1:
            raise ValueError(
                f"A2ATSConfig.budget={b!r} is out of range: an integer budget must be >= 1"
            )
        if isinstance(b, float) and not (0.0 < b <= 1.0 and math.isfinite(b)):
            raise ValueError(
                f"A2ATSConfig.budget={b!r} is out of range: a fractional budget must be in (0, 1]"
            )
        if self.kv_bits not in (None, 4, 8):
            raise ValueError(
                f"A2ATSConfig.kv_bits={self.kv_bits!r} is out of range: must be None, 8 or 4"
            )
        if self.kv_group_size not in (32, 64, 128):
            raise ValueError(
                f"A2ATSConfig.kv_group_size={self.kv_group_size!r} is out of range: "
                "must be 32, 64 or 128"
            )
        if self.kv_memory is not None:
            _check_int("kv_memory", self.kv_memory, 0, 2**50)
            if self.kv_bits is not None:
                raise ValueError(
                    f"A2ATSConfig.kv_memory={self.kv_memory} cannot be combined with "
                    f"kv_bits={self.kv_bits}: the cold tier keeps rows in the model dtype"
                )
        _check_int("fidelity_every", self.fidelity_every, 0)
        c = self.coverage
        if c is not None and (
            isinstance(c, bool) or not isinstance(c, int | float) or not 0.0 < c < 1.0
        ):
            raise ValueError(
                f"A2ATSConfig.coverage={c!r} is out of range: must be None or a share in (0, 1)"
            )
        _check_int("coverage_floor", self.coverage_floor, 1)
        r = self.reuse_selection
        if r is not None and (
            isinstance(r, bool) or not isinstance(r, int | float) or not 0.0 < r <= 1.0
        ):
            raise ValueError(
                f"A2ATSConfig.reuse_selection={r!r} is out of range: must be None or a cosine "
                "in (0, 1]"
            )
        if self.exact_below is not None:
            _check_int("exact_below", self.exact_below, 0)
        if not isinstance(self.rerank_shared, bool):
            raise ValueError(
                f"A2ATSConfig.rerank_shared={self.rerank_shared!r} must be True or False"
            )
        if self.estimate_missed is not None and not isinstance(self.estimate_missed, bool):
            raise ValueError(
                f"A2ATSConfig.estimate_missed={self.estimate_missed!r} must be True, False or "
                "None (where measured to cost nothing)"
            )
        if self.estimate_layers is not None:
            _check_int("estimate_layers", self.estimate_layers, 1)
        if self.estimate_scores not in ESTIMATE_SCORES:
            raise ValueError(
                f"A2ATSConfig.estimate_scores={self.estimate_scores!r} must be one of "
                f"{', '.join(ESTIMATE_SCORES)}"
            )
        if not isinstance(self.telemetry, bool):
            raise ValueError(f"A2ATSConfig.telemetry={self.telemetry!r} must be True or False")
        if self.layer_budgets is not None:
            # a list (from JSON) becomes a tuple: the config stays hashable and comparable
            object.__setattr__(self, "layer_budgets", _check_layer_budgets(self.layer_budgets))

    def for_layer(self, layer: int) -> A2ATSConfig:
        """The settings layer `layer` runs with: `budget` scaled by its `layer_budgets`
        multiplier (`scaled_budget`) and no `layer_budgets`; self when there are none."""
        if self.layer_budgets is None:
            return self
        if not 0 <= layer < len(self.layer_budgets):
            raise ValueError(
                f"A2ATSConfig.layer_budgets has {len(self.layer_budgets)} entries, no entry "
                f"for layer {layer}"
            )
        budget = scaled_budget(self.budget, self.layer_budgets[layer])
        return replace(self, budget=budget, layer_budgets=None)

    def top_k(self, context: int) -> int:
        """Far tokens retrieved per query head for a context of `context` tokens."""
        if isinstance(self.budget, int):
            return self.budget
        return max(self.min_k, math.ceil(self.budget * context))

    def unused_settings(self) -> dict[str, str]:
        """{field: why} for the fields this configuration ignores: far_offset when
        far_buckets > 1, coverage when rerank = 1 (for CLI notes; the app's settings dialog
        disables them)."""
        notes: dict[str, str] = {}
        if self.coverage is not None and self.rerank == 1:
            notes["coverage"] = "ignored with rerank = 1: the adaptive budget needs exact scores"
        if self.far_buckets > 1:
            return {
                **notes,
                "far_offset": f"ignored with far_buckets = {self.far_buckets}: far tokens are "
                "scored at their distance bucket's own distance (b applies to far_buckets = 1)",
            }
        return notes

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> A2ATSConfig:
        """Build from a dict, ignoring unknown keys (forward compatibility of saved settings)."""
        return from_known_fields(cls, data)


PRESETS: dict[str, dict[str, Any]] = {
    "speed": {"rerank": 2, "estimate_missed": None},
    "quality": {"rerank": 4, "estimate_missed": True, "estimate_scores": "mean"},
}
"""Named retrieval settings (the app's Preset box, `a2ats chat --preset`), each the fields it
sets. "speed" is the default (`A2ATSConfig()`): rerank 2, the missed-attention estimate only
where it was measured to cost nothing on this machine (`A2ATSConfig.estimate_missed` None).
"quality" scores twice as many candidates by their exact keys (rerank 4) and folds the far
tokens not retrieved into the softmax (the estimate, slots scored by their mean keys): on the
demo model at 8K perplexity 0.999x full instead of 1.030x, answers closer to full attention's on
the needle tasks, for about a fifth of a retrieval step's speed on a 2-core CPU
(docs/BENCHMARKS.md, "Across texts", "Retrieval" and section 2)."""


def with_preset(config: A2ATSConfig, name: str) -> A2ATSConfig:
    """`config` with the fields of preset `name` (ValueError naming the presets otherwise)."""
    return replace(config, **retrieval_fields(name))


def retrieval_fields(
    preset: str | None, rerank: int | None = None, estimate: str | None = None
) -> dict[str, Any]:
    """The fields of a preset (speed when None), then `rerank` and `estimate` (a slot scoring,
    "off", or "auto": where measured to cost nothing) over their own when given: what
    `--preset`, `--rerank` and `--estimate` set."""
    if preset is not None and preset not in PRESETS:
        raise ValueError(f"preset {preset!r} is unknown: must be one of {', '.join(PRESETS)}")
    fields = dict(PRESETS[preset or "speed"])
    if rerank is not None:
        fields["rerank"] = rerank
    if estimate == "off":
        fields["estimate_missed"] = False
    elif estimate == "auto":
        fields["estimate_missed"] = None
    elif estimate is not None:
        fields.update(estimate_missed=True, estimate_scores=estimate)
    return fields


def preset_of(config: A2ATSConfig) -> str | None:
    """The preset whose every field `config` has, else None (custom settings)."""
    for name, fields in PRESETS.items():
        if all(getattr(config, key) == value for key, value in fields.items()):
            return name
    return None


def estimate_runs(config: A2ATSConfig, subspaces: int) -> bool:
    """Whether the missed-attention estimate runs with a codebook of `subspaces` subspaces:
    slots scored by their own keys run with any codebook, centroid scores with one VQ only.
    None (where measured to cost nothing) is False here: a cache resolves it when it is made."""
    return bool(config.estimate_missed) and (subspaces == 1 or config.estimate_scores != "centroid")


def estimate_would_run(config: A2ATSConfig, subspaces: int) -> bool:
    """Whether the estimate left to the measurement (`estimate_missed` None) would run if the
    measurement turned it on: what the probe measures and the app asks to be measured."""
    return config.estimate_missed is None and estimate_runs(
        replace(config, estimate_missed=True), subspaces
    )


def describe_retrieval(
    config: A2ATSConfig,
    subspaces: int,
    measured_on: bool | None = None,
    measured_layers: int | None = None,
) -> str:
    """`preset quality, rerank 4; missed-attention estimate (mean slot scores)`: what a chat's
    stderr says of its retrieval settings (the estimate only where it runs: `estimate_runs`).
    `measured_on`: what the measurement decided for an estimate left to it (None: not known,
    `crossover.Crossover.estimate_on`), `measured_layers` on how many layers (None: all)."""
    text = f"preset {preset_of(config) or 'custom'}, rerank {config.rerank}"
    measured = estimate_would_run(config, subspaces)
    if estimate_runs(config, subspaces) or (measured and measured_on):
        text += f"; missed-attention estimate ({config.estimate_scores} slot scores"
        layers = config.estimate_layers or (measured_layers if measured else None)
        if layers is not None:
            text += f", on the {layers} layers that miss most"
            text += ": what its measured cost affords here)" if measured else ")"
        else:
            text += ", measured to cost nothing here)" if measured else ")"
    elif measured and measured_on is None:
        text += "; missed-attention estimate where measured to cost nothing here"
    return text


def scaled_budget(budget: float | int, multiplier: float) -> float | int:
    """`budget` times a layer's multiplier: a fraction capped at 1 (1 = every far token: the
    layer attends exactly), an int token count rounded and at least 1."""
    if isinstance(budget, int):
        return max(1, round(budget * multiplier))
    scaled = min(1.0, budget * multiplier)
    if not scaled > 0.0:
        raise ValueError(
            f"A2ATSConfig.layer_budgets multiplier {multiplier!r} times budget {budget!r} is "
            "out of range: the layer's fraction must be in (0, 1]"
        )
    return scaled


def _check_layer_budgets(value: Any) -> tuple[float, ...]:
    """A non-empty tuple of positive finite floats, else ValueError naming the bad entry."""
    if isinstance(value, str | bytes) or not isinstance(value, tuple | list) or not value:
        raise ValueError(
            f"A2ATSConfig.layer_budgets={value!r} is out of range: must be None or a non-empty "
            "list of positive multipliers, one per model layer"
        )
    for i, m in enumerate(value):
        if (
            isinstance(m, bool)
            or not isinstance(m, int | float)
            or not (math.isfinite(m) and m > 0)
        ):
            raise ValueError(
                f"A2ATSConfig.layer_budgets[{i}]={m!r} is out of range: must be a positive "
                "finite multiplier"
            )
    return tuple(float(m) for m in value)
