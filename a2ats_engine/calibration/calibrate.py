"""Codebook calibration: run the model over a corpus, collect pre-RoPE keys and WRoPE queries,
train a query-aware codebook (docs/ARCHITECTURE.md, "The method").

How the data is captured. Every attention layer gets a `CaptureCache` (mlx-lm's `KVCache` plus
an `attend` method); `hooks.install(model)` routes the layer's attention call to `attend`, which
sees the true post-RoPE queries `q^_i`, computes exact attention (so the forward pass is the
model's own), and accumulates the second moment of the WRoPE retrieval queries
`q~_i = R_b q_i = rotate(unrotate(q^_i, i), b)` of every query head, grouped by KV head. After each
chunk the cache holds the chunk's post-RoPE keys; they are un-rotated with the model's own RoPE
(`RopeSpec.unrotate`) and the sampled positions are kept.

Memory bound. Keys: at most `keys_per_head` training keys and `keys_per_head // 4` held-out keys
per layer x KV head, float32, i.e. `num_layers * n_kv * 1.25 * keys_per_head * head_dim * 4`
bytes (demo defaults: 30 * 3 * 1.25 * 8192 * 64 * 4 B = 236 MB). Positions are drawn uniformly
without replacement up front (deterministic for the seed). Queries are never stored: only their
second moment, `[n_kv, d, d]` per layer. Activations: one chunk of `chunk_len` tokens at a time.

Cancel: `cancel.is_set()` is polled between forward steps of `STEP_TOKENS` tokens and inside
k-means (between distance blocks); when set, `calibrate` raises `CalibrationCancelled` and
returns nothing (nothing is saved: saving is the caller's job after a successful return).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..cache.codebook import Codebook, relative_score_error_from_moments
from ..cache.codebook_check import model_fingerprint
from ..cache.codebook_spec import CodebookSpec
from ..cache.config import A2ATSConfig
from ..cache.geometry import model_geometry
from ..data_dirs import DEMO_CODEBOOK_NAME, demo_codebook_path  # noqa: F401  (re-exported)
from ..progress import Progress
from .capture import CalibrationData, CancelFlag, check_cancel, collect
from .defaults import DEFAULT_MAX_ITERS, DEMO_CENTROIDS, DEMO_TOKENS

STEP_TOKENS = 128  # forward step between cancel checks: cancel took 1.7 s on the demo model
# with the 2-core CPU 4x oversubscribed, so well under a second on an idle one
DEFAULT_CHUNK_LEN = 1024
HELDOUT_KEY_SHARE = 4  # held-out keys per head = keys_per_head // HELDOUT_KEY_SHARE


def spread_to_layers(book: Codebook, model: Any) -> Codebook:
    """A codebook fit on the plan's A2ATS layers, indexed by model layer: each layer the plan
    leaves native (sliding window, NoPE, linear attention) reuses the first A2ATS layer's
    arrays (never used by a cache; they keep `codebook.assign(layer, ...)` indexing by model
    layer). Metadata `a2ats_layers` lists the layers that were really calibrated. Unchanged
    when every layer is an A2ATS layer."""
    from ..cache.layer_plan import A2ATS, plan_for

    served = [c.layer for c in plan_for(model).layers if c.kind == A2ATS]
    total = model_geometry(model).num_layers  # decoder layers, as validate_for counts them
    if len(served) == total:
        return book
    index = {layer: i for i, layer in enumerate(served)}
    pick = [index.get(layer, 0) for layer in range(total)]
    return Codebook(
        [book.centroids[i] for i in pick],
        [book.chol[i] for i in pick],
        {**book.metadata, "a2ats_layers": served},
        assign_centroids=[book.assign_centroids[i] for i in pick],
    )


def fit_codebook(
    data: CalibrationData,
    spec: CodebookSpec | None = None,
    *,
    beta: float | None = None,
    seed: int = 0,
    max_iters: int = DEFAULT_MAX_ITERS,
    tol: float = 1e-4,
    progress: Progress | None = None,
    cancel: CancelFlag | None = None,
    stage: str = "clustering",
    metadata: dict[str, Any] | None = None,
) -> Codebook:
    """Train a codebook on collected data with `spec`'s n_centroids, sub_dim and beta
    (`beta` overrides the spec's). Held-out score error goes into the metadata."""
    spec = spec or CodebookSpec()
    beta = spec.beta if beta is None else beta

    def callback(it: int, total: int) -> None:
        if progress is not None:
            progress(stage, it, total)

    book = Codebook.fit(
        data.keys,
        n_centroids=spec.n_centroids,
        query_moments=data.moments if data.moments else None,
        sub_dim=spec.sub_dim,
        beta=beta,
        seed=seed,
        max_iters=max_iters,
        tol=tol,
        metadata=metadata,
        callback=callback,
        interrupt=lambda: check_cancel(cancel),
    )
    if data.heldout_keys is not None and data.heldout_moments is not None:
        book.metadata["heldout_score_error"] = relative_score_error_from_moments(
            book, data.heldout_keys, data.heldout_moments
        )
    return book


def calibrate(
    model: Any,
    tokenizer: Any,
    texts: Sequence[str] | None,
    config: A2ATSConfig | None = None,
    *,
    spec: CodebookSpec | None = None,
    tokens: int = 65536,
    progress: Progress | None = None,
    cancel: CancelFlag | None = None,
    seed: int = 0,
    keys_per_head: int | None = None,
    chunk_len: int = DEFAULT_CHUNK_LEN,
    max_iters: int = DEFAULT_MAX_ITERS,
    heldout: float = 0.1,
    compare_plain: bool = False,
    corpus: str | None = None,
    model_name: str | None = None,
) -> Codebook:
    """Calibrate a codebook for `model` on `texts` (None: the built-in corpus).

    The codebook's n_centroids, sub_dim and beta come from `spec` (default `CodebookSpec()`);
    far_offset (b), far_buckets, sinks and window from `config` (recorded in the metadata).
    With `compare_plain` a plain-VQ (beta = 1) codebook is also fit on the same keys and its
    held-out score error stored as `heldout_score_error_plain` (for the CLI summary).
    Deterministic for a seed. Raises CalibrationCancelled when `cancel` is set (nothing saved).
    Progress stages: "tokenizing", "collecting" (tokens), "clustering" (Lloyd iterations),
    "clustering plain VQ".
    """
    from .corpus import builtin_corpus, builtin_description

    config = config or A2ATSConfig()
    spec = spec or CodebookSpec()
    began = time.perf_counter()
    if texts is None:
        texts = builtin_corpus(tokenizer, seed=seed, chars=8 * tokens)
        corpus = corpus or builtin_description()
    data = collect(
        model, tokenizer, texts, config, spec=spec, tokens=tokens, keys_per_head=keys_per_head,
        chunk_len=chunk_len, heldout=heldout, seed=seed, progress=progress, cancel=cancel,
    )  # fmt: skip
    book = codebook_from_data(
        model, data, config, spec, corpus=corpus or f"user texts ({len(texts)} documents)",
        seed=seed, max_iters=max_iters, compare_plain=compare_plain, progress=progress,
        cancel=cancel, model_name=model_name,
    )  # fmt: skip
    book.metadata["calibration_seconds"] = round(time.perf_counter() - began, 2)
    return book


def codebook_from_data(
    model: Any,
    data: CalibrationData,
    config: A2ATSConfig,
    spec: CodebookSpec,
    *,
    corpus: str,
    seed: int = 0,
    max_iters: int = DEFAULT_MAX_ITERS,
    compare_plain: bool = False,
    progress: Progress | None = None,
    cancel: CancelFlag | None = None,
    model_name: str | None = None,
) -> Codebook:
    """`calibrate`'s codebook from data already collected: the fit with `spec`, the metadata
    (`calibration_metadata`), indexed by model layer (`spread_to_layers`); with
    `compare_plain` the plain-VQ held-out error too."""
    metadata = calibration_metadata(model, data, config, corpus, model_name)
    book = fit_codebook(
        data, spec, seed=seed, max_iters=max_iters, progress=progress, cancel=cancel,
        metadata=metadata,
    )  # fmt: skip
    book = spread_to_layers(book, model)
    if compare_plain and spec.beta < 1.0:
        plain = fit_codebook(
            data, spec, beta=1.0, seed=seed, max_iters=max_iters, progress=progress,
            cancel=cancel, stage="clustering plain VQ",
        )  # fmt: skip
        if "heldout_score_error" in plain.metadata:
            book.metadata["heldout_score_error_plain"] = plain.metadata["heldout_score_error"]
    return book


def calibration_metadata(
    model: Any, data: CalibrationData, config: A2ATSConfig, corpus: str, model_name: str | None
) -> dict[str, Any]:
    """What a calibrated codebook records of its making: the model, config's far distances,
    sinks and window, the corpus, tokens and chunk length."""
    return {
        "model": model_fingerprint(model, name=model_name),
        "far_offset": config.far_offset,
        "far_buckets": config.far_buckets,
        "sinks": config.sinks,
        "window": config.window,
        "corpus": corpus,
        "tokens": data.tokens,
        "chunk_len": data.chunk_len,
    }


# -- demo default ---------------------------------------------------------------------------

DEMO_SIZING = """Why 512 centroids and 12288 tokens for the demo model (SmolLM2-135M: 30 layers x 3 KV
heads, head_dim 64): chosen from the recorded codebook sweep (`a2ats bench codebooks`,
docs/benchmarks/codebook_sweep.json and codebook_sweep_4096.json, read in docs/BENCHMARKS.md
section 1, "What the settings change"). On the three evaluation texts at 4K, budget
0.03, recall was 0.888-0.893 from 256 to 4096 centroids; output error fell only from 0.113 (512)
to 0.106 (4096) while the codebook held in memory went from 35 to 273 MiB and the fit from 67 to
622 s. 12288 tokens rather than 6144 lower the held-out score error from 0.0111 to 0.0069 for
about 110 s more, once."""


def ensure_demo_codebook(
    progress: Progress | None = None,
    *,
    model_source: str | Path = "demo",
    force: bool = False,
    cancel: CancelFlag | None = None,
) -> Path:
    """Build the demo model's default codebook unless a valid one exists; return its path.

    Path: `<A2ATS_DATA_DIR or user_data_dir("a2ats-chat")>/codebooks/demo-default.safetensors`.
    An existing file that does not load (truncated, foreign) is rebuilt. Settings:
    DEMO_CENTROIDS centroids trained on DEMO_TOKENS tokens of the built-in corpus, chosen by
    measurement on a 2-core x86 CPU (see DEMO_SIZING). No plain-VQ comparison is fit here.
    """
    return ensure_default_codebook(
        "demo", progress, model_source=model_source, force=force, cancel=cancel
    )


def default_codebook_spec(name: str) -> CodebookSpec:
    """What the named model's default codebook is trained as: DEMO_CENTROIDS centroids, full
    head-dim VQ unless the model's entry sets a product-VQ split
    (`fetched_models.default_codebook_sub_dim`: Gemma 3 270M, 8-dim subspaces)."""
    from ..loading.fetched_models import default_codebook_sub_dim

    return CodebookSpec(DEMO_CENTROIDS, sub_dim=default_codebook_sub_dim(name))


def _follows_recipe(book: Codebook, spec: CodebookSpec) -> bool:
    """Whether a stored default codebook has the recipe's subspaces. Only the split is compared
    (the recipes changed only there); a valid book of another size is kept, as before."""
    return book.num_subspaces == 1 if spec.sub_dim is None else book.sub_dim == spec.sub_dim


def ensure_default_codebook(
    name: str,
    progress: Progress | None = None,
    *,
    model_source: str | Path | None = None,
    force: bool = False,
    cancel: CancelFlag | None = None,
) -> Path:
    """The default codebook of a model fetched by name ("demo", "gemma3-270m":
    `fetched_models.model_names()`), built unless a valid one exists: `default_codebook_spec(name)`
    (DEMO_CENTROIDS centroids, product VQ where the model's entry says) on DEMO_TOKENS tokens of
    the built-in corpus, on the layers the plan serves with A2ATS. A file that does not load, or
    whose subspaces differ from the recipe's (a book built before the recipe changed), is rebuilt.
    Path: `fetched_models.default_codebook_path(name)`. `model_source` (default: `name`) is what
    is loaded to calibrate, e.g. the folder just fetched. Returns the path."""
    from ..cache.codebook import Codebook
    from ..errors import CodebookError
    from ..loading.fetched_models import default_codebook_path
    from ..loading.models import load_model

    path = default_codebook_path(name)
    spec = default_codebook_spec(name)
    if path.is_file() and not force:
        try:
            if _follows_recipe(Codebook.load(path), spec):
                return path
        except CodebookError:
            pass  # damaged: rebuild below
    source = name if model_source is None else model_source
    model, tokenizer, info = load_model(str(source), progress=progress)
    book = calibrate(
        model, tokenizer, None, A2ATSConfig(), spec=spec, tokens=DEMO_TOKENS,
        progress=progress, cancel=cancel, model_name=info.name,
    )  # fmt: skip
    book.save(path)
    return path
