"""Codebooks for the evaluation's ablations, trained on the fly on the built-in corpus.

Each ablation changes one thing against the codebook under test and keeps the rest of its
calibration (token count, chunk length, keys per head, centroids, seed; read from its metadata):

- plain_vq: the same collected keys clustered with beta = 1 (plain nearest-centroid VQ);
- paper:    the query metric over retrieval queries at the single distance b (far_buckets = 1),
  as the paper calibrates; b is tuned on a development text (`tune_paper_b`), not the eval text;
- no_wrope: post-RoPE keys clustered with the metric of the plain post-RoPE queries (codes and
  scores without windowed RoPE), collected on chunks at least as long as the evaluated span
  (`cover` = context + decode), so the codebook has seen the rotations of every evaluated
  position;
- random:   standard-normal centroids (wiring baseline).

Every trained ablation codebook sees the same tokens as the codebook under test: the built-in
corpus stream cut to its token count, less the chunks calibration holds out (`training_stream`).

Trained codebooks are kept under `<data dir>/codebooks/ablations/` keyed by model and settings,
so a second evaluation reuses them.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import mlx.core as mx
import numpy as np

from ..cache.codebook import Codebook
from ..cache.codebook_check import model_fingerprint
from ..cache.codebook_spec import CodebookSpec
from ..cache.config import A2ATSConfig
from ..cache.geometry import model_geometry
from ..progress import Progress

KINDS = ("plain_vq", "paper", "no_wrope", "random")
DEFAULT_TOKENS = 12288
HELDOUT = 0.1  # calibrate's default: the same chunks are held out, so the training keys match


def ablation_dir() -> Path:
    from ..data_dirs import data_dir

    return data_dir() / "codebooks" / "ablations"


def calibration_settings(codebook: Codebook, tokens: int | None = None) -> dict[str, Any]:
    """The calibration settings of `codebook` (metadata), with defaults where it has none."""
    meta = codebook.metadata
    return {
        "n_centroids": codebook.n_centroids,
        "sub_dim": None if codebook.num_subspaces == 1 else codebook.sub_dim,
        "beta": float(meta.get("beta", 0.0)),
        "tokens": int(tokens or meta.get("tokens") or DEFAULT_TOKENS),
        "chunk_len": int(meta.get("chunk_len") or 1024),
        "calib_chunk_len": int(meta.get("chunk_len") or 1024),
        "keys_per_head": meta.get("keys_per_head"),
        "far_offset": int(meta.get("far_offset") or 2048),
        "sinks": int(meta.get("sinks") or 8),
        "window": int(meta.get("window") or 64),
        "far_buckets": int(meta.get("far_buckets") or 4),
        "seed": int(meta.get("seed") or 0),
    }


def _cache_path(model: Any, kind: str, settings: dict[str, Any]) -> Path:
    blob = json.dumps({"model": model_fingerprint(model), "kind": kind, **settings}, sort_keys=True)
    digest = hashlib.sha256(blob.encode()).hexdigest()[:16]
    return ablation_dir() / f"{kind}-{settings['n_centroids']}-{digest}.safetensors"


def ablation_codebooks(
    model: Any,
    tokenizer: Any,
    codebook: Codebook,
    kinds: Sequence[str],
    *,
    tokens: int | None = None,
    use_cache: bool = True,
    progress: Progress | None = None,
    cover: int | None = None,
    paper_b: int | None = None,
) -> tuple[dict[str, Codebook], list[str]]:
    """Codebooks for `kinds` (subset of KINDS) matched to `codebook`'s calibration.

    cover: positions the evaluation reaches (context + decode): the no_wrope codebook is
    collected on chunks at least that long. paper_b: the one distance b of the paper codebook
    (default: `codebook`'s far offset). Returns ({kind: Codebook}, notes): one human-readable
    note per codebook saying where it came from (trained now, or reused from the cache)."""
    unknown = [k for k in kinds if k not in KINDS]
    if unknown:
        raise ValueError(f"unknown ablation codebook(s) {unknown}; known: {', '.join(KINDS)}")
    base = calibration_settings(codebook, tokens)
    out: dict[str, Codebook] = {}
    notes: list[str] = []
    stream = None
    for kind in kinds:
        settings = _kind_settings(kind, base, cover, paper_b)
        if kind == "random":
            geo = model_geometry(model)
            out[kind] = Codebook.random(
                geo.num_layers, geo.num_kv_heads, geo.head_dim,
                settings["n_centroids"], sub_dim=settings["sub_dim"], seed=settings["seed"],
            )  # fmt: skip
            notes.append(f"random: standard-normal centroids ({settings['n_centroids']})")
            continue
        path = _cache_path(model, kind, settings)
        if use_cache and path.is_file():
            out[kind] = Codebook.load(path)
            notes.append(f"{kind}: reused {path} (trained earlier on the built-in corpus)")
            continue
        if stream is None:
            stream = _corpus_stream(tokenizer, settings, progress)
        out[kind] = _train(model, kind, stream, settings, progress)
        if use_cache:
            path.parent.mkdir(parents=True, exist_ok=True)
            out[kind].save(path)
        notes.append(
            f"{kind}: trained now on the {len(training_stream(stream, base))} training tokens "
            f"of the default's {len(stream)}-token built-in corpus stream "
            f"({settings['n_centroids']} centroids{_kind_note(kind, settings)})"
            + (f", saved to {path.name}" if use_cache else "")
        )
    return out, notes


def _kind_settings(kind: str, base: dict[str, Any], cover: int | None, paper_b: int | None):
    """`base` with what this kind changes: b for paper, the chunk length for no_wrope."""
    if kind == "paper" and paper_b is not None:
        return {**base, "far_offset": int(paper_b)}
    if kind == "no_wrope":
        return {**base, "chunk_len": max(base["chunk_len"], int(cover or 0))}
    return base


def _kind_note(kind: str, settings: dict[str, Any]) -> str:
    if kind == "paper":
        return f", b = {settings['far_offset']}"
    if kind == "no_wrope":
        return f", chunks of {settings['chunk_len']} tokens"
    return ""


def training_stream(stream: np.ndarray, settings: dict[str, Any]) -> np.ndarray:
    """The tokens calibration trains on: `stream` in chunks of the codebook's chunk length,
    less the held-out chunks (`capture.collect`'s split), in order -> `[T']`."""
    from ..calibration.capture import _chunks, _heldout_chunks

    chunks = _chunks(len(stream), calibration_settings_chunk(settings))
    held = _heldout_chunks(len(chunks), HELDOUT)
    kept = [stream[s:e] for i, (s, e) in enumerate(chunks) if i not in held]
    return np.concatenate(kept) if kept else stream[:0]


def calibration_settings_chunk(settings: dict[str, Any]) -> int:
    """The chunk length the codebook under test was calibrated with (its held-out split)."""
    return int(settings.get("calib_chunk_len") or settings["chunk_len"])


def _corpus_stream(tokenizer: Any, settings: dict[str, Any], progress) -> np.ndarray:
    from ..calibration.capture import token_stream
    from ..calibration.corpus import builtin_corpus

    texts = builtin_corpus(tokenizer, seed=settings["seed"], chars=8 * settings["tokens"])
    return token_stream(tokenizer, texts, settings["tokens"], progress=progress)


def _config(settings: dict[str, Any], far_buckets: int | None = None) -> A2ATSConfig:
    return A2ATSConfig(
        far_offset=settings["far_offset"], sinks=settings["sinks"], window=settings["window"],
        far_buckets=far_buckets or settings["far_buckets"],
    )  # fmt: skip


def _spec(settings: dict[str, Any]) -> CodebookSpec:
    return CodebookSpec(settings["n_centroids"], settings["sub_dim"], settings["beta"])


def _train(model, kind: str, stream: np.ndarray, settings: dict[str, Any], progress) -> Codebook:
    from ..calibration.calibrate import fit_codebook, spread_to_layers
    from ..calibration.capture import collect, default_keys_per_head

    config = _config(settings)
    keys_per_head = settings["keys_per_head"] or default_keys_per_head(settings["n_centroids"])
    meta = {"ablation": kind, "corpus": "built-in", "tokens": int(len(stream))}
    if kind in ("plain_vq", "paper"):
        if kind == "paper":
            config = _config(settings, far_buckets=1)
            meta["far_offset"] = config.far_offset
        data = collect(
            model, _StreamTokenizer(stream), ["stream"], config, tokens=len(stream),
            keys_per_head=keys_per_head, chunk_len=settings["chunk_len"], heldout=HELDOUT,
            seed=settings["seed"], progress=progress,
        )  # fmt: skip
        return fit_codebook(
            data, _spec(settings), beta=1.0 if kind == "plain_vq" else settings["beta"],
            seed=settings["seed"], progress=progress, stage=f"clustering {kind}",
            metadata={**meta, "far_buckets": config.far_buckets},
        )  # fmt: skip
    train = training_stream(stream, settings)  # the default's training tokens, held-out removed
    keys, moments = collect_post_rope(
        model, train, chunk_len=settings["chunk_len"], keys_per_head=keys_per_head,
        sinks=settings["sinks"], window=settings["window"], seed=settings["seed"],
        progress=progress,
    )  # fmt: skip
    book = Codebook.fit(
        keys, n_centroids=settings["n_centroids"], query_moments=moments,
        sub_dim=settings["sub_dim"], beta=settings["beta"], seed=settings["seed"],
        max_iters=20, metadata={**meta, "post_rope": True, "chunk_len": settings["chunk_len"]},
        callback=(lambda it, total: progress("clustering no-WRoPE", it, total)) if progress else None,
    )  # fmt: skip
    return spread_to_layers(book, model)  # indexed by model layer, native ones unused


class _StreamTokenizer:
    """Feeds an already tokenized stream to `capture.collect` (its `encode` returns it)."""

    eos_token_id = None

    def __init__(self, stream: np.ndarray) -> None:
        self.stream = stream

    def encode(self, text: str) -> list[int]:
        return [int(t) for t in self.stream]


def collect_post_rope(
    model: Any,
    stream: np.ndarray,
    *,
    chunk_len: int,
    keys_per_head: int,
    sinks: int,
    window: int,
    seed: int = 0,
    progress: Progress | None = None,
) -> tuple[list[mx.array], list[mx.array]]:
    """Post-RoPE keys `[n_kv, N, d]` and post-RoPE query moments `sum q^ q^T` `[n_kv, d, d]`
    per A2ATS layer of the model's plan (in layer order), collected like `capture.collect`
    (fresh context per chunk, keys past the sinks sampled uniformly, queries from position
    `sinks + window` on; the plan's native layers run with the model's own caches, a sliding
    window's `RotatingKVCache` included, so every captured layer sees the model's residuals)."""
    from ..cache import hooks
    from ..cache.layer_plan import A2ATS, native_caches, plan_for
    from ..calibration.capture import STEP_TOKENS, CaptureCache, transformer_body
    from .methods import IdentityRope

    served = [c for c in plan_for(model).require().layers if c.kind == A2ATS]
    total = len(stream)
    bounds = [(s, min(s + chunk_len, total)) for s in range(0, total, chunk_len)]
    pool = np.concatenate([np.arange(s + min(sinks, e - s - 1), e) for s, e in bounds])
    rng = np.random.default_rng(seed)
    if len(pool) > keys_per_head:
        pool = np.sort(rng.choice(pool, size=keys_per_head, replace=False))
    keys: list[list[mx.array]] = [[] for _ in served]
    moments: list[mx.array | None] = [None] * len(served)
    was_installed = hooks.is_installed(model)
    hooks.install(model)
    body = transformer_body(model)
    try:
        for start, end in bounds:
            q_start = min(sinks + window, (end - start) // 2)
            captures = [
                CaptureCache(IdentityRope(c.head_dim), [0], c.n_kv_heads, q_start) for c in served
            ]
            caches = native_caches(model)
            for choice, capture in zip(served, captures, strict=True):
                caches[choice.layer] = capture
            tokens = mx.array(stream[start:end])[None]
            for s in range(0, end - start, STEP_TOKENS):
                body(tokens[:, s : s + STEP_TOKENS], cache=caches)
                mx.eval(
                    [c.keys for c in captures]
                    + [c.moment for c in captures if c.moment is not None]
                )
            local = mx.array((pool[(pool >= start) & (pool < end)] - start).astype(np.int32))
            for i, cache in enumerate(captures):
                if local.size:
                    keys[i].append(mx.take(cache.pre_rope_keys()[0], local, axis=1))
                if cache.moment is not None:
                    prev = moments[i]
                    moments[i] = cache.moment if prev is None else prev + cache.moment
            mx.eval([k[-1] for k in keys if k] + [m for m in moments if m is not None])
            if progress is not None:
                progress("collecting (post-RoPE)", end, total)
    finally:
        if not was_installed:
            hooks.uninstall(model)
    if any(m is None for m in moments) or not all(keys):
        raise ValueError("the calibration text is too short for the no-WRoPE ablation")
    return [mx.concatenate(k, axis=1) for k in keys], list(moments)


# -- tuning the paper's b ------------------------------------------------------------------------

PAPER_B_VALUES = (256, 512, 1024, 2048, 4096)


def choose_b(trials: Sequence[dict[str, Any]]) -> int:
    """The b of the best trial: highest recall (attention mass, averaged over every layer, head
    and step, so steadier than a short perplexity), then lowest ppl vs full, then smallest b.
    trials: [{"b", "recall", "ppl_vs_full"}, ...] (non-empty)."""
    if not trials:
        raise ValueError("choose_b needs at least one trial")
    best = min(trials, key=lambda t: (-t["recall"], t["ppl_vs_full"], t["b"]))
    return int(best["b"])


def tune_paper_b(
    model: Any,
    tokenizer: Any,
    codebook: Codebook,
    dev_ids: Sequence[int],
    *,
    values: Sequence[int] = PAPER_B_VALUES,
    context: int,
    decode: int,
    budget: float | int,
    config: A2ATSConfig,
    tokens: int | None = None,
    use_cache: bool = True,
    progress: Progress | None = None,
) -> tuple[int, list[dict[str, Any]], dict[int, Codebook]]:
    """Tune a2ats_paper's b on a development text (never the evaluation text): for each b in
    `values`, a paper codebook calibrated at b (`ablation_codebooks(paper_b=b)`) and a2ats_paper
    run with it at `budget` on `dev_ids[:context + decode + 1]`.

    Returns (chosen b, trials [{"b", "recall", "ppl_vs_full", "output_rel_error"}], {b: codebook}).
    """
    from .evaluate import evaluate

    if not values:
        raise ValueError("tune_paper_b: values is empty; give at least one b (e.g. 2048)")
    trials: list[dict[str, Any]] = []
    books: dict[int, Codebook] = {}
    for b in values:
        trained, _ = ablation_codebooks(
            model, tokenizer, codebook, ["paper"], tokens=tokens, use_cache=use_cache,
            progress=progress, paper_b=int(b),
        )  # fmt: skip
        books[int(b)] = trained["paper"]
        run = evaluate(
            model, dev_ids, context=context, decode=decode, budgets=[budget],
            codebooks={"a2ats": codebook, "paper": trained["paper"]}, config=config,
            methods=["full", "a2ats_paper"], progress=progress,
        )[0]  # fmt: skip
        r = run.methods["a2ats_paper"]
        trials.append(
            {
                "b": int(b),
                "recall": round(float(r.recall), 4),
                "ppl_vs_full": round(float(r.ppl_vs_full), 4),
                "output_rel_error": round(float(r.output_rel_error), 4),
            }
        )
    return choose_b(trials), trials, books
