"""The evaluation variants: one `Method` record per name in `METHODS`, and the caches they use.

A method is the cache class it builds, the A2ATS settings it changes (applied to the run's
`A2ATSConfig` with `dataclasses.replace`), the codebook it needs and whether it scores with the
model's RoPE. `method_spec` turns a name into a per-layer cache factory; `a2ats eval`,
`a2ats bench passkey` and the tests all go through it. Adding a retrieval variant to the
measurements is adding one `Method` to `METHODS` (and, for a new way to score far tokens, an
`A2ATSCache` subclass here). The method itself is summarised in docs/ARCHITECTURE.md
("The method").

Method names of `a2ats bench decode` (`a2ats`, `a2ats_kv4`, `a2ats_rr2`, `a2ats_kv4_rr2`,
`a2ats_telemetry`, ...) are A2ATS with knobs spelled in the name: `decode_variant_knobs` reads
them.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models.cache import KVCache, QuantizedKVCache

from ..cache import attention as att
from ..cache.a2ats_cache import A2ATSCache
from ..cache.config import A2ATSConfig
from ..cache.geometry import model_geometry
from ..cache.layer_budgets import dense_first_budgets
from ..cache.model_cache import check_layer_budgets
from ..cache.rope import distance_buckets, retrieval_distances
from .plan_caches import clone_native, quantized_copy

# -- method caches ------------------------------------------------------------------------------


class OracleTopKCache(A2ATSCache):
    """A2ATS's selection structure (per-head top-K, GQA union, sinks, window) with far tokens
    ranked by their exact post-RoPE scores: the ceiling for any top-K retrieval at this budget."""

    reranks = False  # its scores are exact already
    scoring = "keys"  # reads every far key (accounting.py)

    def far_token_scores(self, queries: mx.array, lay: att.Layout) -> mx.array:
        """queries post-RoPE `[B, n_q, 1, d]` -> exact scores `[B, n_kv, G, F]` of far tokens."""
        B, n_q, _, d = queries.shape
        n_kv = self.codes.shape[1]
        group = queries.reshape(B, n_kv, n_q // n_kv, d).astype(mx.float32)
        far = self.rows.fetch(lay.n)[0][..., lay.n_sinks : lay.window_start, :]
        return group @ far.astype(mx.float32).swapaxes(-1, -2)


class RecentWindowCache(A2ATSCache):
    """Sinks + the most recent tokens (StreamingLLM-style): the top-K "far" tokens are simply
    the K latest ones before the window, so the attended set is contiguous with the window."""

    reranks = False  # recency, not relevance
    scoring = "none"  # reads nothing to rank (accounting.py)

    def far_token_scores(self, queries: mx.array, lay: att.Layout) -> mx.array:
        """Scores that rank far tokens by recency: `[B, n_kv, G, F]` (later = higher)."""
        B, n_q = queries.shape[:2]
        n_kv = self.codes.shape[1]
        recency = mx.arange(lay.n_far, dtype=mx.float32)
        return mx.broadcast_to(recency, (B, n_kv, n_q // n_kv, lay.n_far))


class ExactKeyWRopeCache(A2ATSCache):
    """Diagnostic: A2ATS's windowed-RoPE distance buckets, but far tokens scored with their
    exact pre-RoPE keys instead of codes (`(R_D q) . k_n`): isolates the bucket approximation."""

    scoring = "keys"  # reads every far key (accounting.py)

    def far_token_scores(self, queries: mx.array, lay: att.Layout) -> mx.array:
        """queries post-RoPE `[B, n_q, 1, d]` -> `[B, n_kv, G, F]`."""
        B, n_q, _, d = queries.shape
        n_kv = self.codes.shape[1]
        G = n_q // n_kv
        cfg = self.config
        dists = retrieval_distances(cfg.window, cfg.far_offset, cfg.far_buckets, self.max_context)
        group = queries.reshape(B, n_kv, G, d).astype(mx.float32)
        pre_q = self.rope.unrotate(group[..., None, :], lay.n - 1)[..., 0, :]  # all at n - 1
        keys = self.rows.fetch(lay.n)[0][..., lay.n_sinks : lay.window_start, :]
        pre_k = self.rope.unrotate(keys.astype(mx.float32), lay.n_sinks)
        per_bucket = [
            (pre_q @ self.rope.rotation_matrix(dist)) @ pre_k.swapaxes(-1, -2) for dist in dists
        ]  # m x [B, n_kv, G, F]
        if len(dists) == 1:
            return per_bucket[0]
        plan = distance_buckets(cfg.window, self.max_context, cfg.far_buckets)
        lower_edges = tuple(lo for lo, _, _ in plan[1:])
        bucket = att.bucket_ids(lay.n, lay.n_sinks, lay.window_start, lower_edges)  # [F]
        out = per_bucket[0]
        for b in range(1, len(dists)):
            out = mx.where(bucket == b, per_bucket[b], out)
        return out


class CodedExactRopeCache(A2ATSCache):
    """Diagnostic: far tokens scored with exact relative RoPE on their centroid keys
    (`q^ . R_n c(k_n)`, no distance approximation): isolates the VQ approximation."""

    def far_token_scores(self, queries: mx.array, lay: att.Layout) -> mx.array:
        """queries post-RoPE `[B, n_q, 1, d]` -> `[B, n_kv, G, F]`."""
        B, n_q, _, d = queries.shape
        n_kv = self.codes.shape[1]
        group = queries.reshape(B, n_kv, n_q // n_kv, d).astype(mx.float32)
        codes = self.codes[..., lay.n_sinks : lay.window_start, :]
        centroid_keys = self.codebook.reconstruct(self.layer, codes)  # pre-RoPE [B, n_kv, F, d]
        post = self.rope.rotate(centroid_keys, lay.n_sinks)
        return group @ post.swapaxes(-1, -2)


class IdentityRope:
    """A stand-in RopeSpec that rotates nothing: an A2ATSCache built with it codes post-RoPE
    keys and scores them with the plain post-RoPE query (the `a2ats_no_wrope` ablation)."""

    def __init__(self, head_dim: int) -> None:
        self.head_dim = head_dim

    def unrotate(self, x: mx.array, offset: int | mx.array = 0) -> mx.array:
        return x

    def rotate(self, x: mx.array, offset: int | mx.array = 0) -> mx.array:
        return x

    def shift(self, x: mx.array, delta: int | mx.array) -> mx.array:
        return x

    def rotation_matrix(self, position: int) -> mx.array:
        """The identity `[head_dim, head_dim]`: no distance rotates anything."""
        return mx.eye(self.head_dim, dtype=mx.float32)

    def to_dict(self) -> dict[str, Any]:
        return {"kind": "identity", "head_dim": self.head_dim}


# -- the registry -------------------------------------------------------------------------------

FIXED = "fixed"  # no budget: run once per evaluation
BUDGET = "budget"  # run at every budget
DIAGNOSTIC = "diagnostic"  # like BUDGET, but only when asked for by name


@dataclass(frozen=True)
class Method:
    """One evaluation variant.

    kind:          FIXED (mlx-lm caches, no budget), BUDGET or DIAGNOSTIC (A2ATS-shaped caches).
    cache:         the A2ATSCache (sub)class it builds; None for the mlx-lm caches.
    kv_bits:       for the mlx-lm caches: None = KVCache, 8 or 4 = QuantizedKVCache.
    knobs:         A2ATSConfig fields it sets (`dataclasses.replace` on the run's config).
    codebook:      key of the codebook it uses in the `codebooks` dict given to `method_spec`.
    codebook_optional: fall back to the "a2ats" codebook when `codebook` is not given.
    identity_rope: code and score post-RoPE keys (no windowed RoPE).
    window_budget: its budget is the far-token count a2ats attended (run a2ats first).
    b_from_codebook: far_offset is the b its own codebook records (metadata "far_offset").
    dense_first:   the first this many layers attend exactly, the others' budget lowered to keep
                   the mean (`layer_budgets.dense_first_budgets`).
    measured_layers: runs with `layer_budgets` the caller allocated from per-layer recall
                   measured on a development span (`evaluate` does it for `a2ats_alloc`).
    summary:       one line for the docs and `a2ats eval` notes.
    """

    name: str
    kind: str
    summary: str
    cache: type[A2ATSCache] | None = A2ATSCache
    kv_bits: int | None = None
    knobs: Mapping[str, Any] = field(default_factory=dict)
    codebook: str = "a2ats"
    codebook_optional: bool = False
    identity_rope: bool = False
    window_budget: bool = False
    b_from_codebook: bool = False  # far_offset = the b its codebook records (its metadata)
    dense_first: int = 0
    measured_layers: bool = False

    def config(self, base: A2ATSConfig, window_budget: int | None = None) -> A2ATSConfig:
        """The A2ATS settings this method runs with: `base` with telemetry on (the measurements
        read `last_stats`), no fidelity shadow, and this method's knobs. The estimate left to
        the machine's measurement (`estimate_missed` None) is off here: a quality figure must
        not depend on the machine it was run on (the `a2ats_estimate*` methods measure it)."""
        knobs: dict[str, Any] = {"telemetry": True, "fidelity_every": 0, **self.knobs}
        if knobs.get("estimate_missed", base.estimate_missed) is None:
            knobs["estimate_missed"] = False
        if self.window_budget:
            if window_budget is None:
                raise ValueError(
                    f"method {self.name} needs the attended count of a2ats (run a2ats first)"
                )
            knobs["budget"] = max(1, int(window_budget))
        return replace(base, **knobs)


COVERAGE_SWEEP = (0.8, 0.9, 0.95, 0.99)  # the adaptive-budget methods a2ats_cov<p>
ESTIMATE_TOP = (1, 3, 11, 13)  # a2ats_estimate_top<n>: the estimate on the n layers that miss most

METHODS: dict[str, Method] = {
    m.name: m
    for m in (
        Method("full", FIXED, "mlx-lm KVCache (exact; the reference)", cache=None),
        Method("kv8", FIXED, "mlx-lm QuantizedKVCache, 8-bit K/V", cache=None, kv_bits=8),
        Method("kv4", FIXED, "mlx-lm QuantizedKVCache, 4-bit K/V", cache=None, kv_bits=4),
        Method("a2ats", BUDGET, "A2ATS with the given codebook and config"),
        Method(
            "window",
            BUDGET,
            "sinks + the most recent tokens; as many as A2ATS attends on average",
            cache=RecentWindowCache,
            knobs={"estimate_missed": False},
            window_budget=True,
        ),
        Method(
            "oracle_topk",
            BUDGET,
            "A2ATS's structure and budget, far tokens ranked by exact scores (the ceiling of "
            "plain top-K: without the estimate)",
            cache=OracleTopKCache,
            knobs={"estimate_missed": False},
        ),
        Method(
            "a2ats_no_rerank",
            BUDGET,
            "A2ATS with rerank = 1: the top-K of the codebook scores alone",
            knobs={"rerank": 1},
        ),
        Method(
            "a2ats_no_estimate",
            BUDGET,
            "A2ATS with estimate_missed off: the far tokens not retrieved are dropped from the "
            "softmax (the paper; the default since the estimate slows decode on the CPU)",
            knobs={"estimate_missed": False},
        ),
        Method(
            "a2ats_estimate",
            BUDGET,
            "A2ATS with estimate_missed on, each (bucket, code) slot scored by its centroid "
            "(estimate_scores centroid: the estimate as recorded before 2026-12-04)",
            knobs={"estimate_missed": True, "estimate_scores": "centroid"},
        ),
        Method(
            "a2ats_estimate_mean",
            BUDGET,
            "A2ATS with estimate_missed on, each slot scored by the mean of its own keys "
            "(estimate_scores mean, the estimate's default) instead of its centroid",
            knobs={"estimate_missed": True, "estimate_scores": "mean"},
        ),
        *(
            Method(
                f"a2ats_estimate_top{n}",
                DIAGNOSTIC,
                f"a2ats_estimate_mean on the {n} layers whose retrieval misses most (their "
                f"estimated missed share over the first retrieval steps; estimate_layers {n})",
                knobs={"estimate_missed": True, "estimate_scores": "mean", "estimate_layers": n},
            )
            for n in ESTIMATE_TOP
        ),
        Method(
            "a2ats_estimate_code",
            BUDGET,
            "A2ATS with estimate_missed on, slots that are codes alone (every distance bucket "
            "together), each scored by the mean of its own keys (estimate_scores code_mean)",
            knobs={"estimate_missed": True, "estimate_scores": "code_mean"},
        ),
        Method(
            "a2ats_auto",
            DIAGNOSTIC,
            "A2ATS with the measured exact_below crossover (crossover.py): exact attention "
            "below it, as the app decodes",
            knobs={"exact_below": None},
        ),
        *(
            Method(
                f"a2ats_rr{r}g",
                DIAGNOSTIC,
                f"A2ATS with rerank {r} over candidates shared by the GQA group (rerank_shared): "
                f"G times fewer key rows gathered",
                knobs={"rerank": r, "rerank_shared": True},
            )
            for r in (2, 4)
        ),
        *(
            Method(
                f"a2ats_reuse{round(cos * 100)}",
                DIAGNOSTIC,
                f"A2ATS reusing the previous step's far selection while every query head's "
                f"pre-RoPE query keeps a cosine >= {cos} with the one it was made for",
                knobs={"reuse_selection": cos},
            )
            for cos in (0.9, 0.95, 0.98)
        ),
        *(
            Method(
                f"a2ats_cov{round(share * 100)}",
                DIAGNOSTIC,
                f"A2ATS with an adaptive budget per head: the fewest of the K best reranked "
                f"candidates covering {share:.0%} of their attention (floor 16)",
                knobs={"coverage": share},
            )
            for share in COVERAGE_SWEEP
        ),
        Method(
            "a2ats_alloc",
            DIAGNOSTIC,
            "A2ATS with a budget per layer: plain a2ats's recall per layer measured on a "
            "development span (the tokens after the evaluated span), more budget where it is "
            "lowest, same mean (layer_budgets.allocate_layer_budgets)",
            measured_layers=True,
        ),
        Method(
            "a2ats_dense2",
            DIAGNOSTIC,
            "A2ATS with the first two layers dense (exact), the others' budget lowered to keep "
            "the mean fraction, floored at 0.25x: equal cost only from budget ~2/L on "
            "(layer_budgets.dense_first_budgets); attended/bytes show the real cost",
            dense_first=2,
        ),
        Method(
            "a2ats_plain_vq", BUDGET, "A2ATS with a plain (beta = 1) codebook", codebook="plain_vq"
        ),
        Method(
            "a2ats_paper",
            BUDGET,
            "the paper's method: one far distance b (2048, or the b its codebook was "
            "calibrated for: tuned on a development text by `tune_paper_b`), no rerank",
            knobs={"far_buckets": 1, "far_offset": 2048, "rerank": 1},
            codebook="paper",
            codebook_optional=True,
            b_from_codebook=True,
        ),
        Method(
            "a2ats_no_wrope",
            BUDGET,
            "codes and scores on post-RoPE keys (no windowed RoPE)",
            knobs={"far_buckets": 1},
            codebook="no_wrope",
            identity_rope=True,
        ),
        Method("a2ats_random", BUDGET, "A2ATS with a random codebook", codebook="random"),
        Method(
            "a2ats_exact_keys",
            DIAGNOSTIC,
            "windowed-RoPE buckets on exact keys (no VQ): the distance approximation alone",
            cache=ExactKeyWRopeCache,
        ),
        Method(
            "a2ats_exact_rope",
            DIAGNOSTIC,
            "exact RoPE on centroid keys (no distance buckets): the VQ approximation alone",
            cache=CodedExactRopeCache,
        ),
    )
}


def method_names(*kinds: str) -> tuple[str, ...]:
    """Names of the registered methods of these kinds, in registry order."""
    return tuple(name for name, m in METHODS.items() if m.kind in kinds)


def prompt_method_names() -> tuple[str, ...]:
    """Methods that can answer a prompt with the run's own codebook alone (every method but
    those needing a second codebook or per-layer budgets measured on a development span): what
    `a2ats bench passkey` and `bench tasks` accept, in registry order."""
    return tuple(
        name
        for name, m in METHODS.items()
        if not m.measured_layers
        and (m.cache is None or m.codebook == "a2ats" or m.codebook_optional)
    )


def kv_group_size(head_dim: int) -> int | None:
    """Largest mx.quantize group size (64 or 32) dividing head_dim, else None."""
    return next((g for g in (64, 32) if head_dim % g == 0), None)


@dataclass
class MethodSpec:
    """How to build one method's cache for layer i: `factory(layer, rope_spec)`; `config`: the
    A2ATS settings it runs with (None for the mlx-lm caches).

    layer_copy: for the mlx-lm methods (full, kv8, kv4), the cache of a layer made from that
    layer's prefilled own cache (`plan_caches.clone_native`, `plan_caches.quantized_copy`),
    used on every layer; None for the A2ATS-shaped methods, which use `factory` on the plan's
    `a2ats` layers and keep the model's own cache elsewhere (`plan_caches.plan_caches`)."""

    name: str
    factory: Callable[[int, Any], Any]
    config: A2ATSConfig | None = None
    layer_copy: Callable[[Any], Any] | None = None


def method_spec(
    name: str,
    model: nn.Module,
    config: A2ATSConfig,
    codebooks: dict[str, Any],
    window_budget: int | None = None,
) -> MethodSpec:
    """The cache factory of the registered method `name` (see `METHODS`). `codebooks` holds
    "a2ats" and, where a method needs one, "plain_vq", "paper" (optional), "no_wrope",
    "random". `window_budget`: the far tokens a2ats attended, for `window`."""
    method = METHODS.get(name)
    if method is None:
        raise ValueError(f"unknown method {name!r}; known: {', '.join(METHODS)}")
    geo = model_geometry(model)
    hd = geo.head_dim
    if method.cache is None:
        return MethodSpec(name, _mlx_lm_factory(method, hd), layer_copy=_mlx_lm_copy(method, hd))
    cfg = method.config(config, window_budget)
    if method.dense_first:
        dense = dense_first_budgets(geo.num_layers, method.dense_first, cfg.budget)
        cfg = replace(cfg, layer_budgets=dense)
    if method.measured_layers and cfg.layer_budgets is None:
        raise ValueError(
            f"method {name} needs layer_budgets allocated from per-layer recall measured on a "
            "development span (evaluate measures them)"
        )
    check_layer_budgets(cfg, geo.num_layers)
    book = codebooks.get(method.codebook)
    if book is not None and method.b_from_codebook and "far_offset" in book.metadata:
        cfg = replace(cfg, far_offset=int(book.metadata["far_offset"]))
    if book is None and method.codebook_optional:
        book = codebooks["a2ats"]
    if book is None:
        raise ValueError(f"method {name} needs a {method.codebook!r} codebook")
    ctx, cls = geo.max_context, method.cache

    def make(i: int, spec: Any) -> A2ATSCache:
        rope = IdentityRope(hd) if method.identity_rope else spec
        return cls(i, rope, book, cfg, ctx)

    return MethodSpec(name, make, cfg)


def _mlx_lm_factory(method: Method, head_dim: int) -> Callable[[int, Any], Any]:
    if method.kv_bits is None:
        return lambda i, spec: KVCache()
    gs = kv_group_size(head_dim)
    if gs is None:
        raise ValueError(f"method {method.name} needs head_dim divisible by 32 (got {head_dim})")
    bits = method.kv_bits
    return lambda i, spec: QuantizedKVCache(group_size=gs, bits=bits)


def _mlx_lm_copy(method: Method, head_dim: int) -> Callable[[Any], Any]:
    if method.kv_bits is None:
        return clone_native
    gs, bits = kv_group_size(head_dim), method.kv_bits
    return lambda src: quantized_copy(src, bits, gs)


# -- decode-benchmark names ---------------------------------------------------------------------

# a2ats, a2ats_kv4, a2ats_rr2 (rerank 2), a2ats_rr2g (candidates shared by the GQA group),
# a2ats_kv4_rr2, a2ats_cov90 (coverage 0.9: adaptive budget per head), a2ats_eb0 (exact_below
# 0: retrieval from the start, the crossover probe),
# a2ats_noest (estimate_missed off), a2ats_est / a2ats_estm / a2ats_estc (on; estm:
# estimate_scores mean, estc: code_mean), a2ats_estm_l13 (on the 13 layers that miss most),
# a2ats_telemetry, ...
_DECODE_VARIANT = re.compile(
    r"a2ats(?:_kv(?P<bits>4|8))?(?:_rr(?P<rerank>\d+)(?P<shared>g)?)?(?:_cov(?P<coverage>\d\d))?"
    r"(?:_eb(?P<exact_below>\d+))?(?:_(?P<estimate>estc|estm|est|noest))?(?:_l(?P<layers>\d+))?"
    r"(?P<telemetry>_telemetry)?"
)


# a decode method's last suffix -> the attribute it sets on the method's caches: `_npstep` the
# NumPy host step, `_sync` the synced C++ step instead of the graph step (`cache/native_step.py`,
# `cache/graph_step.py`)
HOST_STEP_SUFFIXES = {"_npstep": "numpy_step", "_sync": "synced_step"}


def host_step_variant(name: str) -> tuple[str, str | None]:
    """(`name` without a last host-step suffix, the cache attribute the suffix sets or None):
    `a2ats_eb0_npstep` times the caches of `a2ats_eb0` with the NumPy host step, `a2ats_eb0_sync`
    with the synced C++ step."""
    for suffix, attribute in HOST_STEP_SUFFIXES.items():
        if name.startswith("a2ats") and name.endswith(suffix):
            return name[: -len(suffix)], attribute
    return name, None


def decode_variant_knobs(name: str) -> dict[str, Any] | None:
    """A2ATSConfig fields spelled in an `a2ats bench decode` method name, None if it is not one:
    `a2ats_kv4_rr2_eb0_telemetry` -> {"kv_bits": 4, "rerank": 2, "exact_below": 0,
    "telemetry": True}."""
    match = _DECODE_VARIANT.fullmatch(name)
    if match is None:
        return None
    knobs: dict[str, Any] = {}
    if match["bits"]:
        knobs["kv_bits"] = int(match["bits"])
    if match["rerank"]:
        knobs["rerank"] = int(match["rerank"])
    if match["shared"]:
        knobs["rerank_shared"] = True
    if match["coverage"]:
        knobs["coverage"] = int(match["coverage"]) / 100  # a2ats_cov90: the adaptive budget 0.9
    if match["exact_below"]:
        knobs["exact_below"] = int(match["exact_below"])
    if match["estimate"]:
        knobs["estimate_missed"] = match["estimate"] != "noest"
        if knobs["estimate_missed"]:  # est: centroid slot scores (as recorded), estm: mean
            scores = {"estm": "mean", "estc": "code_mean"}  # keys, estc: mean keys of a code
            knobs["estimate_scores"] = scores.get(match["estimate"], "centroid")
    if match["layers"]:  # a2ats_estm_l13: the estimate on the 13 layers that miss most
        knobs["estimate_layers"] = int(match["layers"])
    if match["telemetry"]:
        knobs["telemetry"] = True
    return knobs
