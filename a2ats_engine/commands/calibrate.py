"""`a2ats calibrate --model SOURCE --out FILE ...` and `a2ats codebook-info FILE [--model SOURCE]`."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from ._flags import add_hosts_flags, add_json_flag

SOURCE_HELP = "an mlx-lm model folder, a .gguf file, a Hugging Face repo id or 'demo'"


def register(subparsers: argparse._SubParsersAction) -> None:
    from ..calibration.defaults import DEFAULT_MAX_ITERS, DEMO_CENTROIDS, DEMO_TOKENS

    p = subparsers.add_parser(
        "calibrate",
        help="train a query-aware codebook for a model on a text corpus",
        description=(
            "Run the model over calibration text (the built-in corpus, or --text files), collect "
            "pre-RoPE keys and windowed-RoPE queries, train a query-aware VQ codebook and save it. "
            "Also fits plain VQ on the same data and prints the held-out score error of both."
        ),
    )
    p.add_argument("--model", metavar="SOURCE", required=True, help=SOURCE_HELP)
    p.add_argument("--out", metavar="FILE", required=True, help="codebook file to write")
    p.add_argument(
        "--text",
        metavar="FILE",
        action="append",
        default=None,
        help="calibration text (.txt, .md, or .jsonl chat messages); repeatable; "
        "default: the built-in corpus",
    )
    p.add_argument(
        "--tokens", type=int, default=DEMO_TOKENS, help=f"tokens to run (default {DEMO_TOKENS})"
    )
    p.add_argument(
        "--centroids",
        type=int,
        default=DEMO_CENTROIDS,
        help=f"codebook size, 2..65536 (default {DEMO_CENTROIDS}; the paper uses 4096)",
    )
    p.add_argument("--beta", type=float, default=0.0, help="0 = query-aware, 1 = plain VQ")
    p.add_argument("--sub-dim", type=int, default=None, help="product VQ sub-vector size")
    p.add_argument("--far-offset", type=int, default=2048, help="WRoPE distance b (default 2048)")
    p.add_argument("--keys-per-head", type=int, default=None, help="training keys kept per head")
    p.add_argument(
        "--iters",
        type=int,
        default=DEFAULT_MAX_ITERS,
        help=f"max Lloyd iterations (default {DEFAULT_MAX_ITERS})",
    )
    p.add_argument("--seed", type=int, default=0, help="k-means and sampling seed")
    p.add_argument(
        "--no-compare", action="store_true", help="skip the plain-VQ comparison (faster)"
    )
    p.add_argument("--force", action="store_true", help="overwrite --out if it exists")
    add_hosts_flags(p, "calibrate (rank 0 writes --out; no plain-VQ comparison)")
    p.set_defaults(func=run_calibrate)

    p = subparsers.add_parser(
        "codebook-info",
        help="print a codebook file's metadata and whether it fits a model",
        description="Print what a codebook file holds; with --model, check it fits that model.",
    )
    p.add_argument("file", metavar="FILE", help="codebook .safetensors file")
    p.add_argument("--model", metavar="SOURCE", default=None, help=SOURCE_HELP)
    add_json_flag(p, run_codebook_info, "print the metadata as JSON")


class TqdmProgress:
    """progress(stage, done, total) -> one tqdm bar per stage, on stderr."""

    def __init__(self) -> None:
        self._bar = None
        self._stage: str | None = None

    def __call__(self, stage: str, done: int, total: int) -> None:
        from tqdm import tqdm

        if stage != self._stage:
            self.close()
            self._stage = stage
            self._bar = tqdm(total=total, desc=stage, unit=_unit(stage), file=sys.stderr,
                             leave=True, dynamic_ncols=True)  # fmt: skip
        if self._bar.total != total:
            self._bar.total = total
        self._bar.update(done - self._bar.n)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None


def _unit(stage: str) -> str:
    if stage.startswith("clustering"):
        return "iter"
    if stage in ("collecting", "tokenizing"):
        return "tok"
    return "it"


def run_calibrate(args: argparse.Namespace) -> int:
    from ..cache.codebook_spec import CodebookSpec
    from ..cache.config import A2ATSConfig
    from ..calibration.calibrate import calibrate
    from ..calibration.corpus import load_texts
    from ..loading.models import load_model
    from . import _limits as limits

    out = Path(args.out)
    if out.exists() and not args.force:
        raise ValueError(f"{out} exists (use --force to overwrite)")
    limits.count("--tokens", args.tokens, 2, limits.MAX_CALIBRATION_TOKENS)
    limits.count("--centroids", args.centroids, 2, 1 << 16)
    limits.number("--beta", args.beta, 0.0, 1.0)
    limits.optional_count("--sub-dim", args.sub_dim, 1, 1 << 16)
    limits.optional_count("--keys-per-head", args.keys_per_head, 1, limits.MAX_CALIBRATION_TOKENS)
    limits.count("--iters", args.iters, 1, limits.MAX_STEPS)
    limits.count("--seed", args.seed, 0, limits.MAX_SEED)
    limits.config_check("--far-offset", far_offset=args.far_offset)
    limits.hosts_flags(args)
    if args.hosts:
        import subprocess

        from ..distributed.launch import calibrate_command

        return subprocess.call(calibrate_command(args, args.hosts, args.port))
    spec = CodebookSpec(n_centroids=args.centroids, sub_dim=args.sub_dim, beta=args.beta)
    config = A2ATSConfig(far_offset=args.far_offset)
    began = time.perf_counter()
    progress = TqdmProgress()
    try:
        model, tokenizer, info = load_model(args.model, progress=progress)
        texts = load_texts(args.text, tokenizer) if args.text else None
        corpus = ", ".join(Path(t).name for t in args.text) if args.text else None
        book = calibrate(
            model, tokenizer, texts, config, spec=spec, tokens=args.tokens, progress=progress,
            seed=args.seed, keys_per_head=args.keys_per_head, max_iters=args.iters,
            compare_plain=not args.no_compare, corpus=corpus, model_name=info.name,
        )  # fmt: skip
    finally:
        progress.close()
    book.save(out)
    print(calibration_summary(book, time.perf_counter() - began, out))
    return 0


def calibration_summary(book, seconds: float, path: Path) -> str:
    """The final report of `a2ats calibrate`."""
    m = book.metadata
    lines = [
        f"saved {path} ({path.stat().st_size / 2**20:.1f} MiB)",
        f"model: {(m.get('model') or {}).get('name')}; tokens used: {m.get('tokens')}; "
        f"keys per head: {m.get('keys_per_head')}; centroids: {book.n_centroids}; "
        f"k-means iterations: {m.get('kmeans_iterations')}",
        f"time: {seconds:.1f} s total ({m.get('calibration_seconds')} s calibration)",
    ]
    aware, plain = m.get("heldout_score_error"), m.get("heldout_score_error_plain")
    if aware is not None:
        kind = "query-aware" if m.get("query_aware") else "plain"
        line = f"held-out relative score error: {kind} {aware:.4f}"
        if plain is not None:
            line += f", plain VQ {plain:.4f} ({plain / max(aware, 1e-12):.2f}x higher)"
        lines.append(line)
    else:
        lines.append("held-out score error: not measured (too little text for a held-out chunk)")
    return "\n".join(lines)


def run_codebook_info(args: argparse.Namespace) -> int:
    import warnings

    from ..cache.codebook import Codebook
    from ..errors import CodebookError
    from ..terminal import printable

    book = Codebook.load(args.file)
    if args.json:
        print(json.dumps(book.metadata, indent=2, default=str))
    else:
        print(printable(book.summary()))
        m = book.metadata
        if isinstance(m.get("heldout_score_error"), int | float):
            line = f"held-out relative score error: {m['heldout_score_error']:.4f}"
            if isinstance(m.get("heldout_score_error_plain"), int | float):
                line += f" (plain VQ {m['heldout_score_error_plain']:.4f})"
            print(line)
    if args.model is None:
        return 0
    from ..loading.models import load_model

    model, _, info = load_model(args.model)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            found = book.validate_for(model)
        except CodebookError as exc:
            print(printable(f"fits {info.name}: no ({exc})", newlines=False))
            return 1
    print(printable(f"fits {info.name}: yes", newlines=False))
    for message in found:
        print(printable(f"  warning: {message}", newlines=False))
    return 0
