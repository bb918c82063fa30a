"""Codebook sweep: one codebook per (centroids, calibration tokens) pair, each calibrated with
the demo default's recipe and measured against full attention (`a2ats bench codebooks`).

Recipe. `calibrate(model, tokenizer, None, config, spec=CodebookSpec(N), tokens=T, seed=seed)`,
as `ensure_demo_codebook` runs it, differing only in N and T: the built-in corpus, chunks of
1024 tokens with a tenth held out, `default_keys_per_head(N)` sampled keys per head, the
config's far distances, sinks and window. The forward pass over the calibration text is
shared (`calibration/shared_collect.py`: every distinct chunk runs once, for the largest T,
and serves every N and every shorter T), and each codebook is fit on exactly the data `collect`
would have returned for its (N, T). Times per row: `collect_seconds` is what collecting for T
alone costs (corpus, tokenization and the forward time of T's chunks, measured in the shared
pass), `fit_seconds` the k-means fit with the held-out score error, `calib_seconds` their sum:
a standalone `calibrate` for that pair.

Evaluation. As `bench/evaluate.py` does it for `full` and `a2ats`, with one exact prefill of
`context` tokens and one `full` teacher-forced decode per text shared by every codebook; each
codebook's `a2ats` decodes from a copy of that prefill (`run_method`). `config` gives the A2ATS
settings (`exact_below` 0: every step retrieves, as `a2ats eval` measures). Recall and output
error are means over the texts; `ppl_vs_full` is the paired ratio on the same tokens with the
95% block-bootstrap interval (stratified by text).
"""

from __future__ import annotations

import itertools
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from ..cache.config import A2ATSConfig
from ..progress import Progress
from .stats import block_bootstrap_ci


@dataclass
class SweepRow:
    """One (centroids, calibration tokens) codebook: its calibration cost and fidelity."""

    centroids: int
    calib_tokens: int
    keys_per_head: int
    collect_seconds: float
    fit_seconds: float
    kmeans_iterations: int
    heldout_score_error: float | None
    codebook_bytes: int
    recall: float
    output_rel_error: float
    ppl_vs_full: float
    ppl_ci: tuple[float, float]
    decode_tokens: int
    attended_per_head: float

    @property
    def calib_seconds(self) -> float:
        return self.collect_seconds + self.fit_seconds

    def to_dict(self) -> dict[str, Any]:
        error = self.heldout_score_error
        return {
            "centroids": self.centroids,
            "calib_tokens": self.calib_tokens,
            "keys_per_head": self.keys_per_head,
            "calib_seconds": round(self.calib_seconds, 2),
            "collect_seconds": round(self.collect_seconds, 2),
            "fit_seconds": round(self.fit_seconds, 2),
            "kmeans_iterations": self.kmeans_iterations,
            "heldout_score_error": None if error is None else round(error, 5),
            "codebook_bytes": self.codebook_bytes,
            "recall": round(self.recall, 5),
            "output_rel_error": round(self.output_rel_error, 5),
            "ppl_vs_full": round(self.ppl_vs_full, 4),
            "ppl_ci": [round(x, 4) for x in self.ppl_ci],
            "decode_tokens": self.decode_tokens,
            "attended_per_head": round(self.attended_per_head, 1),
        }


@dataclass
class SweepRun:
    """Every row, and what the shared calibration pass really cost."""

    rows: list[SweepRow]
    forward_seconds: float  # forward time spent, every distinct chunk once
    forward_tokens: int  # tokens run through the model for calibration
    corpus_seconds: float  # corpus building and tokenization, every token count's
    corpus: str

    def shared(self) -> dict[str, Any]:
        return {
            "forward_seconds": round(self.forward_seconds, 2),
            "forward_tokens": self.forward_tokens,
            "corpus_seconds": round(self.corpus_seconds, 2),
        }


def check_sweep_args(
    centroids: Sequence[int], calib_tokens: Sequence[int], texts: Sequence[Sequence[int]],
    context: int, decode: int,
) -> None:  # fmt: skip
    """ValueError naming the bad argument (empty list, repeat, out of range, short text)."""
    from ..validation import check_int

    for name, values, hi in (("centroids", centroids, 65536), ("calib_tokens", calib_tokens, None)):
        if not values:
            raise ValueError(f"{name} is empty: give at least one value")
        for v in values:
            check_int("codebook sweep", name, v, 2, hi)  # codes are uint16: 65536 at most
        repeated = sorted({v for v in values if list(values).count(v) > 1})
        if repeated:
            raise ValueError(f"{name} lists {repeated} more than once")
    check_int("codebook sweep", "context", context, 1)
    check_int("codebook sweep", "decode", decode, 1)
    if not texts:
        raise ValueError("texts is empty: give at least one evaluation text")
    for i, ids in enumerate(texts):
        if len(ids) < context + decode + 1:
            raise ValueError(
                f"evaluation text {i + 1} has {len(ids)} tokens; context {context} + decode "
                f"{decode} needs {context + decode + 1}"
            )


def sweep_codebooks(
    model: Any,
    tokenizer: Any,
    texts: Sequence[Sequence[int]],
    *,
    centroids: Sequence[int],
    calib_tokens: Sequence[int],
    context: int,
    decode: int,
    config: A2ATSConfig | None = None,
    seed: int = 0,
    model_name: str | None = None,
    save_dir: str | Path | None = None,
    progress: Progress | None = None,
) -> SweepRun:
    """Calibrate and evaluate one codebook per pair of `centroids` x `calib_tokens` (rows in
    that order, centroids outermost); see the module docstring.

    texts: token ids of the evaluation texts, each at least `context + decode + 1` long.
    config: calibration distances and the evaluation's A2ATS settings (budget included;
    default `A2ATSConfig()`); evaluation runs with `exact_below = 0`. save_dir: where each
    codebook is saved as `codebook-c{N}-t{T}.safetensors` (None: not saved)."""
    from ..cache.codebook_spec import CodebookSpec
    from ..calibration.calibrate import codebook_from_data
    from ..calibration.capture import default_keys_per_head
    from ..calibration.corpus import builtin_description
    from ..calibration.shared_collect import collect_shared

    check_sweep_args(centroids, calib_tokens, texts, context, decode)
    config = config or A2ATSConfig()
    eval_config = replace(config, exact_below=0)
    pairs = list(itertools.product(centroids, calib_tokens))
    requests = [(t, default_keys_per_head(n)) for n, t in pairs]
    shared = collect_shared(
        model, tokenizer, None, config, requests=requests, seed=seed, progress=progress
    )
    corpus = builtin_description()
    references = [_Reference(model, ids, context, decode, eval_config, progress) for ids in texts]
    rows = []
    for n, t in pairs:
        keys_per_head = default_keys_per_head(n)
        began = time.perf_counter()
        data = shared.data(t, keys_per_head)
        assembled = time.perf_counter() - began
        began = time.perf_counter()
        book = codebook_from_data(
            model, data, config, CodebookSpec(n), corpus=corpus, seed=seed,
            progress=progress, model_name=model_name,
        )  # fmt: skip
        fit_seconds = time.perf_counter() - began
        del data
        collect_seconds = shared.collect_seconds(t) + assembled
        if progress is not None:
            progress(f"evaluate {n} centroids, {t} tokens", pairs.index((n, t)), len(pairs))
        rows.append(_evaluate_row(book, references, n, t, collect_seconds, fit_seconds))
        if save_dir is not None:
            book.metadata["calibration_seconds"] = round(collect_seconds + fit_seconds, 2)
            book.metadata["calibration_note"] = (
                "from a codebook sweep (forward pass shared): collection for these tokens "
                "alone plus this fit"
            )
            folder = Path(save_dir)
            folder.mkdir(parents=True, exist_ok=True)
            book.save(folder / f"codebook-c{n}-t{t}.safetensors")
    return SweepRun(
        rows, shared.forward_seconds, shared.forward_tokens, shared.prep_seconds, corpus
    )


class _Reference:
    """One evaluation text: its exact prefill and `full`'s teacher-forced decode, shared by
    every codebook."""

    def __init__(
        self, model: Any, ids: Sequence[int], context: int, decode: int, config, progress=None
    ) -> None:
        from .evaluate import prefill, run_method
        from .methods import method_spec

        self.model, self.config = model, config
        self.base = prefill(model, ids[:context], progress)
        self.inputs = ids[context : context + decode]
        self.targets = ids[context + 1 : context + decode + 1]
        full = method_spec("full", model, config, {})
        self.full, _ = run_method(model, self.base, full, self.inputs, self.targets)

    def a2ats(self, book: Any):
        """`a2ats`'s MethodResult with `book`, decoded from a copy of the prefill."""
        from .evaluate import run_method
        from .methods import method_spec

        spec = method_spec("a2ats", self.model, self.config, {"a2ats": book})
        result, _ = run_method(self.model, self.base, spec, self.inputs, self.targets)
        return result


def _evaluate_row(
    book: Any,
    references: list[_Reference],
    n: int,
    t: int,
    collect_seconds: float,
    fit_seconds: float,
) -> SweepRow:
    results = [ref.a2ats(book) for ref in references]
    deltas = [r.nll - ref.full.nll for r, ref in zip(results, references, strict=True)]
    mean, low, high = block_bootstrap_ci(deltas)
    error = book.metadata.get("heldout_score_error")
    return SweepRow(
        centroids=n,
        calib_tokens=t,
        keys_per_head=int(book.metadata["keys_per_head"]),  # kept: at most the pool
        collect_seconds=collect_seconds,
        fit_seconds=fit_seconds,
        kmeans_iterations=int(book.metadata.get("kmeans_iterations", 0)),
        heldout_score_error=None if error is None else float(error),
        codebook_bytes=book.nbytes,  # after use: the assignment matrices are built and held
        recall=float(np.mean([r.recall for r in results])),
        output_rel_error=float(np.mean([r.output_rel_error for r in results])),
        ppl_vs_full=math.exp(mean),
        ppl_ci=(math.exp(low), math.exp(high)),
        decode_tokens=int(sum(len(r.nll) for r in results)),
        attended_per_head=float(np.mean([r.attended_per_head for r in results])),
    )
