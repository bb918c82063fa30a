"""`a2ats bench codebooks`: codebook size and calibration tokens vs quality and time."""

from __future__ import annotations

import argparse

from .. import _limits as limits
from .._bench_common import machine, print_json, stderr_progress
from .._flags import add_budget_flag, add_context_decode_flags, add_json_flag, add_model_flags

HELP = "codebook size and calibration tokens vs recall, ppl and calibration time"
DESCRIPTION = (
    "Calibrate one codebook per (centroids, calibration tokens) pair with the demo "
    "default's recipe (built-in corpus, default config, keys per head as calibrate "
    "chooses them; only the size and the tokens differ), then teacher-force the same "
    "text through `full` and `a2ats` with each codebook. The calibration forward pass is "
    "shared: every distinct chunk of the corpus runs once and serves every size and every "
    "shorter token count, each codebook fit on exactly the data a calibration of its own "
    "would collect; calib_seconds = collect_seconds (corpus, tokenization and the "
    "forward time of that token count's chunks, as a calibration of its own would spend "
    "them) + fit_seconds (k-means and the held-out score error). One exact prefill and "
    "one `full` decode per text serve every codebook. Rows: recall, output_rel_error, "
    "ppl_vs_full with its 95% block-bootstrap interval (ppl_ci), codebook_bytes held."
)


def register(bench: argparse._SubParsersAction) -> None:
    from ...calibration.defaults import DEMO_TOKENS

    c = bench.add_parser("codebooks", help=HELP, description=DESCRIPTION)
    add_model_flags(c, codebook_help=None)
    c.add_argument(
        "--centroids",
        default="256,512,1024,2048,4096",
        help="comma list of codebook sizes, each in [2, 65536] (default 256,512,1024,2048,4096)",
    )
    c.add_argument(
        "--calib-tokens",
        default=str(DEMO_TOKENS),
        help=f"comma list of calibration token counts, each >= 2 (default {DEMO_TOKENS}, the "
        "demo default's)",
    )
    c.add_argument(
        "--texts",
        default="code",
        help="comma list of built-in evaluation texts: code (http/client.py, default), prose "
        "(about 8.9K tokens), dialogue (about 9.1K tokens); figures pooled over them",
    )
    add_context_decode_flags(
        c, "prefill tokens (default 4096)", "teacher-forced tokens (default 64)"
    )
    add_budget_flag(c)
    c.add_argument("--seed", type=int, default=0, help="calibration seed (default 0, the demo's)")
    c.add_argument("--save-dir", help="save every codebook here (codebook-c{N}-t{T}.safetensors)")
    add_json_flag(c, run_codebooks)


def _int_list(flag: str, text: str) -> list[int]:
    """'256,512' -> [256, 512]; ValueError naming the flag for an empty list or a non-integer."""
    items = [x.strip() for x in text.split(",") if x.strip()]
    if not items:
        raise ValueError(f"{flag} is empty: give a comma list such as 256,512")
    out = []
    for x in items:
        try:
            out.append(int(x))
        except ValueError:
            raise ValueError(f"{flag} {x!r} is not an integer (comma list of integers)") from None
    return out


def _check_codebook_args(args: argparse.Namespace) -> tuple[list[int], list[int], list]:
    """(centroids, calibration token counts, [(text, description)]) or a one-line ValueError
    naming the flag (checked before the model loads: calibration is long)."""
    from ...bench.eval_texts import builtin_texts

    centroids = _int_list("--centroids", args.centroids)
    tokens = _int_list("--calib-tokens", args.calib_tokens)
    for flag, values, lo, hi in (("--centroids", centroids, 2, 65536),
                                 ("--calib-tokens", tokens, 2, None)):  # fmt: skip
        for v in values:
            if v < lo or (hi is not None and v > hi):
                allowed = f"in [{lo}, {hi}]" if hi is not None else f">= {lo}"
                raise ValueError(f"{flag} {v} is out of range: must be {allowed}")
        repeated = sorted({v for v in values if values.count(v) > 1})
        if repeated:
            raise ValueError(f"{flag} lists {', '.join(map(str, repeated))} more than once")
    limits.count("--context", args.context, 1, limits.MAX_CONTEXT)
    limits.count("--decode", args.decode)
    limits.budget(args.budget)
    limits.count("--seed", args.seed, 0, limits.MAX_SEED)
    for v in tokens:
        limits.count("--calib-tokens", v, 2, limits.MAX_CALIBRATION_TOKENS)
    known = builtin_texts()
    names = [n.strip() for n in args.texts.split(",") if n.strip()]
    if not names:
        raise ValueError(f"--texts is empty: choose from {', '.join(known)}")
    for name in names:
        if name not in known:
            raise ValueError(f"--texts {name!r} is unknown: must be among {', '.join(known)}")
    if len(set(names)) < len(names):
        raise ValueError("--texts lists a text more than once")
    return centroids, tokens, [known[n] for n in names]


def run_codebooks(args: argparse.Namespace) -> int:
    from ...bench.codebook_sweep import sweep_codebooks
    from ...bench.eval_results import rests_on
    from ...cache.config import A2ATSConfig
    from ...loading.models import load_model

    centroids, tokens, texts = _check_codebook_args(args)
    config = A2ATSConfig(budget=limits.parse_budget(args.budget))
    model, tokenizer, info = load_model(args.model)
    limits.check_model_context("--context", [args.context + args.decode], info.context_length)
    ids = [tokenizer.encode(text) for text, _ in texts]
    run = sweep_codebooks(
        model, tokenizer, ids, centroids=centroids, calib_tokens=tokens, context=args.context,
        decode=args.decode, config=config, seed=args.seed, model_name=info.name,
        save_dir=args.save_dir, progress=stderr_progress(True),
    )  # fmt: skip
    out = {
        "model": info.name,
        "corpus": run.corpus,
        "texts": [desc for _, desc in texts],
        "context": args.context,
        "decode": args.decode,
        "budget": config.budget,
        "rerank": config.rerank,
        "seed": args.seed,
        "rests_on": rests_on(args.decode * len(texts), len(texts)),
        "calibration_shared": run.shared(),
        "notes": [
            "calib_seconds = collect_seconds + fit_seconds: what a calibration of that pair "
            "alone costs; the forward pass ran once for all pairs (calibration_shared: its "
            "real seconds and tokens)",
            "a2ats evaluated with exact_below 0 (every decode step retrieves), against one "
            "shared exact prefill and full decode per text",
            "codebook_bytes: centroids, Cholesky factors and assignment matrices held in memory",
        ],
        "machine": machine(),
        "command": _codebooks_command(args),
        "results": [r.to_dict() for r in run.rows],
    }
    if print_json(args, out):
        return 0
    print(f"model {info.name}; texts {', '.join(out['texts'])}; context {args.context}, "
          f"decode {args.decode}, budget {config.budget}")  # fmt: skip
    shared = out["calibration_shared"]
    print(f"shared calibration pass: {shared['forward_tokens']} tokens forward in "
          f"{shared['forward_seconds']:.1f} s, corpus {shared['corpus_seconds']:.1f} s")  # fmt: skip
    print(f"{'centroids':>9} {'tokens':>7} {'calib s':>8} {'collect':>8} {'fit':>7} {'MiB':>7} "
          f"{'recall':>7} {'out err':>7} {'ppl/full (95% CI)':>24}")  # fmt: skip
    for r in out["results"]:
        low, high = r["ppl_ci"]
        print(f"{r['centroids']:>9} {r['calib_tokens']:>7} {r['calib_seconds']:>8.1f} "
              f"{r['collect_seconds']:>8.1f} {r['fit_seconds']:>7.1f} "
              f"{r['codebook_bytes'] / 2**20:>7.2f} {r['recall']:>7.4f} "
              f"{r['output_rel_error']:>7.4f} "
              f"{r['ppl_vs_full']:>9.4f} ({low:.4f}-{high:.4f})")  # fmt: skip
    return 0


def _codebooks_command(args: argparse.Namespace) -> str:
    """The command line that reproduces a codebook sweep (the model by name only when not
    the demo; --save-dir left out: it changes no figure)."""
    parts = ["a2ats bench codebooks"]
    if args.model != "demo":
        parts.append("--model MODEL")
    parts += [f"--centroids {args.centroids}", f"--calib-tokens {args.calib_tokens}",
              f"--texts {args.texts}", f"--context {args.context}", f"--decode {args.decode}",
              f"--budget {args.budget}"]  # fmt: skip
    if args.seed:
        parts.append(f"--seed {args.seed}")
    return " ".join(parts + ["--json"])
