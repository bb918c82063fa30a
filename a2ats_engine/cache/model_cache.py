"""A model's cache list: A2ATS layers where the layer plan says so, the model's own elsewhere;
and what is read off a whole list (snapshots, step counts, the codebook's bytes)."""

from __future__ import annotations

import warnings

import mlx.nn as nn
from mlx_lm.models.cache import _BaseCache

from ..errors import ModelNotSupportedError
from ..process_memory import anonymous_bytes
from . import hooks
from .a2ats_cache import A2ATSCache
from .codebook import Codebook
from .config import A2ATSConfig
from .estimate_layers import EstimateLayers
from .geometry import model_geometry
from .layer_plan import A2ATS, native_caches, plan_for, rope_spec_of
from .step_sums import StepSums
from .telemetry import CacheSnapshot

RANDOM_CENTROIDS = 256  # the stand-in codebook's size when none is given (wiring, timing)


def make_cache(model: nn.Module, config: A2ATSConfig | None = None, codebook=None) -> list:
    """The model's cache list built from its layer plan, with the attention hook installed.

    An A2ATSCache for every layer the plan (`layer_plan.py`) marks `a2ats`; the model's own
    cache (mlx-lm's `make_prompt_cache` entry: RotatingKVCache, ArraysCache...) everywhere else.
    With `config.layer_budgets` (one multiplier per layer) each A2ATS layer runs its own scaled
    budget (`A2ATSConfig.for_layer`); a length that does not match the model raises ValueError.
    Raises ModelNotSupportedError (one line) for a model the plan refuses.

    `codebook=None` falls back to a random codebook with a loud warning: retrieval is then
    near random (wiring and tests only; calibrate one with `a2ats calibrate`).
    """
    plan = plan_for(model).require()
    config = config or A2ATSConfig()
    check_layer_budgets(config, len(plan.layers))
    geo = model_geometry(model)
    if codebook is None:
        warnings.warn(
            "A2ATS: no codebook given, using a RANDOM codebook: retrieval will be near random. "
            "Calibrate one (`a2ats calibrate`) for real use.",
            stacklevel=2,
        )
        codebook = Codebook.random(geo.num_layers, geo.num_kv_heads, geo.head_dim, RANDOM_CENTROIDS)
    else:
        codebook.validate_for(model, config)
    if not hooks.install(model):
        raise ModelNotSupportedError(f"{plan.model_type}: the attention hook patched no module")
    ctx = geo.max_context
    caches = native_caches(model)
    chosen = [choice for choice in plan.layers if choice.kind == A2ATS]
    share = None if config.kv_memory is None else config.kv_memory // max(len(chosen), 1)
    for choice in chosen:
        spec = rope_spec_of(model, choice)
        caches[choice.layer] = A2ATSCache(choice.layer, spec, codebook, config, ctx, share)
    StepSums.join(caches)  # the estimate's sums of all layers moved at once (host step)
    EstimateLayers.join(caches)  # the layers that keep the estimate, where not all
    return caches


def check_layer_budgets(config: A2ATSConfig, num_layers: int) -> None:
    """ValueError (one line) when `config.layer_budgets` has not one entry per model layer."""
    budgets = config.layer_budgets
    if budgets is not None and len(budgets) != num_layers:
        raise ValueError(
            f"A2ATSConfig.layer_budgets has {len(budgets)} entries, the model has "
            f"{num_layers} layers: give one multiplier per layer"
        )


def snapshot(caches: list, token_id: int | None = None) -> CacheSnapshot | None:
    """Gather the last step's LayerStats of every A2ATS cache (None when there are none), and
    the bytes the other (native) caches hold (array sizes only: no evaluation, no host sync)."""
    layers = tuple(
        c.take_stats() for c in caches if isinstance(c, A2ATSCache) and c.last_stats is not None
    )
    if not layers:
        return None
    native = sum(cache_nbytes(c) for c in caches if not isinstance(c, A2ATSCache))
    return CacheSnapshot(
        step=layers[0].step,
        layers=layers,
        token_id=token_id,
        native_bytes=native,
        codebook_bytes=model_codebook_bytes(caches),
        process_bytes=anonymous_bytes(),
    )


def attention_steps(caches: list) -> tuple[int, int]:
    """(retrieved, exact): decode steps the A2ATS layers of `caches` have run so far that
    retrieved (top-K over the codes) and that attended exactly (below the crossover, or a context
    too short to retrieve from). Steps are shared by the layers, so each count is the largest any
    layer reports; (0, 0) when there is no A2ATS layer. Plain integers: no sync."""
    own = [c for c in caches if isinstance(c, A2ATSCache)]
    if not own:
        return 0, 0
    return max(c.retrieved_steps for c in own), max(c.exact_steps for c in own)


def model_codebook_bytes(caches: list) -> int:
    """Bytes of the codebook(s) the A2ATS layers use, each counted once: one codebook per
    model, shared by every chat (cache list) of that model (array sizes only, no sync)."""
    books = {id(c.codebook): c.codebook for c in caches if isinstance(c, A2ATSCache)}
    return int(sum(book.nbytes for book in books.values()))


def cache_nbytes(cache: _BaseCache) -> int:
    """Bytes a model's own cache holds (0 for a cache kind that does not report them)."""
    try:
        return int(cache.nbytes)
    except (AttributeError, NotImplementedError):
        return 0
