"""Calibrate a codebook with the model split over ranks: `a2ats calibrate --hosts FILE ...`, or
`mlx.launch ... -m a2ats_engine.distributed.calibrate --model SOURCE --out FILE`.

Every rank runs the calibration text through its own layers (the hidden state passes between the
ranks as in a chat, `pipeline.py`), keeps the keys and query moments of its own A2ATS layers only
and fits their codebook rows: the ranks' k-means run at the same time, each on its own layers.
Rank 0 gathers the rows (`group.gather_bytes`: one safetensors file's bytes per rank) and writes
one codebook for the whole model, the file `a2ats calibrate` writes on one process (its metadata,
model fingerprint, rows indexed by model layer). Every rank samples the same tokens and key
positions (one seed), so the keys and query moments are those of one process; the k-means draws
differ (each rank seeds the problem of its own layers), so centroids are not bit-equal to one
process's. No plain-VQ comparison is fit here.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from ..calibration.capture import ChunkCapturer
from ..calibration.defaults import DEFAULT_MAX_ITERS, DEMO_CENTROIDS, DEMO_TOKENS


class StageCapturer(ChunkCapturer):
    """A rank's capturer: captures on its own A2ATS layers, `RemoteCache`s in its peers' slots,
    and each step evaluates the model's output too (that runs the sends, receives and the
    gather every rank must take part in)."""

    def __init__(self, model: Any, config: Any) -> None:
        from .pipeline import owned_layers, stage_of

        super().__init__(model, config, layers=set(owned_layers(model)))
        self.stage = stage_of(model)

    def cache_list(self, captures: list) -> list:
        from .pipeline import pipeline_caches

        return pipeline_caches(super().cache_list(captures), self.stage)

    def to_evaluate(self, out: Any, captures: list) -> list:
        return [out, *super().to_evaluate(out, captures)]


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The options `a2ats calibrate --hosts` forwards (same names), plus the split's own."""
    p.add_argument("--model", default="demo", metavar="SOURCE", help="model source (default demo)")
    p.add_argument("--out", required=True, metavar="FILE", help="codebook file rank 0 writes")
    p.add_argument("--text", action="append", metavar="FILE", help="calibration text; repeatable")
    p.add_argument("--tokens", type=int, default=DEMO_TOKENS, help="tokens to run")
    p.add_argument("--centroids", type=int, default=DEMO_CENTROIDS, help="codebook size")
    p.add_argument("--beta", type=float, default=0.0, help="0 = query-aware, 1 = plain VQ")
    p.add_argument("--sub-dim", type=int, default=None, help="product VQ sub-vector size")
    p.add_argument("--far-offset", type=int, default=2048, help="WRoPE distance b (default 2048)")
    p.add_argument("--keys-per-head", type=int, default=None, help="training keys kept per head")
    p.add_argument("--iters", type=int, default=DEFAULT_MAX_ITERS, help="max Lloyd iterations")
    p.add_argument("--seed", type=int, default=0, help="k-means and sampling seed")
    p.add_argument("--force", action="store_true", help="overwrite --out if it exists")
    p.add_argument("--split", metavar="N,N,...", help="layers per rank, rank 0 first")
    p.add_argument(
        "--peer-timeout",
        type=float,
        default=120.0,
        help="seconds without progress while collecting after which a rank reports the others "
        "as lost (default 120)",
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m a2ats_engine.distributed.calibrate",
        description="Calibrate a codebook with the model split over the ranks of mlx.launch.",
    )
    add_arguments(p)
    from .chat import rank_main

    return rank_main(p, argv, run)


def run(args: argparse.Namespace) -> int:
    """Collective: every rank runs it with the same arguments."""
    from .chat import run_ranks

    return run_ranks(args.peer_timeout, lambda group, dog: _run(args, group, dog))


def _run(args: argparse.Namespace, group: Any, dog: Any) -> int:
    from ..cache.codebook_spec import CodebookSpec
    from ..cache.config import A2ATSConfig
    from ..calibration.calibrate import calibration_metadata, fit_codebook, spread_to_layers
    from ..calibration.capture import collect, served_layers
    from ..calibration.corpus import builtin_corpus, builtin_description, load_texts
    from .chat import _split
    from .group import gather_bytes, gather_json, share_json
    from .load import load_stage

    rank0 = group.rank() == 0
    out = Path(args.out)
    refused = rank0 and out.exists() and not args.force
    if share_json(refused if rank0 else None, group):
        raise ValueError(f"{out} exists (use --force to overwrite)")
    began = time.perf_counter()
    model, tokenizer, info, stage = load_stage(args.model, group, split=_split(args.split))
    dog.arm(True)
    described = gather_json(stage.describe(), group)
    if rank0:
        for line in described:
            print(f"distributed: {line}", file=sys.stderr)
    spec = CodebookSpec(n_centroids=args.centroids, sub_dim=args.sub_dim, beta=args.beta)
    config = A2ATSConfig(far_offset=args.far_offset)
    if args.text:
        texts = load_texts(args.text, tokenizer)
        corpus = ", ".join(Path(t).name for t in args.text)
    else:
        texts = builtin_corpus(tokenizer, seed=args.seed, chars=8 * args.tokens)
        corpus = builtin_description()
    data = collect(
        model, tokenizer, texts, config, spec=spec, tokens=args.tokens, seed=args.seed,
        keys_per_head=args.keys_per_head, progress=lambda *_: dog.beat(), capturer=StageCapturer,
    )  # fmt: skip
    dog.arm(False)  # each rank fits at its own pace; the gather below waits for the slowest
    served = [c.layer for c in served_layers(model) if c.layer in stage.owns]
    part = None
    if served:
        part = fit_codebook(data, spec, seed=args.seed, max_iters=args.iters)
    parts = gather_bytes(_to_bytes(part), group)
    layers = gather_json(served, group)
    if not rank0:
        return 0
    book = _merge(parts, layers)
    book.metadata.update(calibration_metadata(model, data, config, corpus, info.name))
    book.metadata["ranks"] = group.size()
    book.metadata["calibration_seconds"] = round(time.perf_counter() - began, 2)
    book = spread_to_layers(book, model)
    book.save(out)
    m = book.metadata
    print(
        f"saved {out} ({out.stat().st_size / 2**20:.1f} MiB) from {group.size()} ranks; "
        f"tokens used: {m['tokens']}; keys per head: {m.get('keys_per_head')}; centroids: "
        f"{book.n_centroids}; held-out relative score error: "
        + (f"{m['heldout_score_error']:.4f}" if "heldout_score_error" in m else "not measured")
    )
    return 0


def _to_bytes(book: Any) -> bytes:
    """A codebook as the bytes of its safetensors file (b"" for None)."""
    if book is None:
        return b""
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "part.safetensors"
        book.save(path)
        return path.read_bytes()


def _merge(parts: list[bytes], layers: list[list[int]]) -> Any:
    """One codebook from the ranks' parts (rows in model-layer order); the held-out score error
    is the mean over every layer, as one process's."""
    from ..cache.codebook import Codebook

    rows: dict[int, tuple] = {}
    errors: list[tuple[float, int]] = []
    meta: dict[str, Any] = {}
    iterations = 0
    with tempfile.TemporaryDirectory() as folder:
        for rank, (blob, served) in enumerate(zip(parts, layers, strict=True)):
            if not blob:
                continue
            path = Path(folder) / f"rank{rank}.safetensors"
            path.write_bytes(blob)
            part = Codebook.load(path)
            for i, layer in enumerate(served):
                rows[int(layer)] = (part.centroids[i], part.chol[i], part.assign_centroids[i])
            meta = meta or dict(part.metadata)
            iterations = max(iterations, int(part.metadata.get("kmeans_iterations", 0)))
            if "heldout_score_error" in part.metadata:
                errors.append((float(part.metadata["heldout_score_error"]), len(served)))
    if not rows:
        raise ValueError("no rank served an A2ATS layer: nothing to calibrate")
    order = sorted(rows)
    meta["kmeans_iterations"] = iterations
    meta.pop("heldout_score_error", None)
    if errors:
        meta["heldout_score_error"] = sum(e * n for e, n in errors) / sum(n for _, n in errors)
    return Codebook(
        [rows[i][0] for i in order],
        [rows[i][1] for i in order],
        meta,
        assign_centroids=[rows[i][2] for i in order],
    )


if __name__ == "__main__":
    sys.exit(main())
