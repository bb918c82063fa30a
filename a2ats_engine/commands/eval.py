"""`a2ats eval`: recall, output error, perplexity and bytes per token of A2ATS vs other caches."""

from __future__ import annotations

import argparse
from pathlib import Path

from . import _limits as limits
from ._bench_common import (
    a2ats_config,
    command_line,
    find_codebook,
    machine,
    print_json,
    stderr_progress,
)
from ._flags import (
    CODEBOOK_REQUIRED,
    add_budget_flag,
    add_context_decode_flags,
    add_hosts_flags,
    add_json_flag,
    add_model_flags,
    add_rerank_flag,
)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "eval",
        help="fidelity of A2ATS vs exact attention, mlx-lm caches and ablations on a text",
        description=(
            "Prefill N tokens of a text, then teacher-force the next M tokens through each method "
            "and report per method: recall (exact attention mass on the attended tokens), "
            "output_rel_error (attention output vs exact), ppl of the M tokens and cache "
            "bytes_per_token. Ablation codebooks are trained on the fly on the built-in corpus "
            "(and cached) unless given."
        ),
    )
    add_model_flags(p, CODEBOOK_REQUIRED)
    p.add_argument(
        "--text",
        action="append",
        help="text file (default: Python's http/client.py source); repeat for several texts",
    )
    p.add_argument(
        "--texts",
        help="comma list of built-in texts: code (http/client.py), prose (an essay written for "
        "this repository, about 8.9K tokens), dialogue (a two-person dialogue written for this "
        "repository, about 9.1K tokens); with --text, the files come after these",
    )
    add_context_decode_flags(
        p, "prefill tokens N (default 4096)", "teacher-forced tokens M (default 64)"
    )
    add_budget_flag(p)
    p.add_argument(
        "--budgets", help="comma list of budgets: a sweep sharing one prefill (overrides --budget)"
    )
    p.add_argument(
        "--methods",
        default=None,  # every method: resolved at run time, so --help does not import MLX
        help="comma list of methods (default: all but the diagnostics a2ats_exact_keys, "
        "a2ats_exact_rope)",
    )
    p.add_argument("--far-buckets", type=int, default=None, help="A2ATS distance buckets")
    add_rerank_flag(p)
    p.add_argument(
        "--kv-bits",
        type=int,
        choices=(8, 4),
        default=None,
        help="store K/V of the A2ATS methods (a2ats, window, oracle_topk, ablations) quantized "
        "to 8 or 4 bits; recall and output error stay against the exact float reference",
    )
    p.add_argument("--plain-vq-codebook", help="beta = 1 codebook for a2ats_plain_vq")
    p.add_argument("--paper-codebook", help="codebook calibrated for one distance b (a2ats_paper)")
    p.add_argument("--no-wrope-codebook", help="post-RoPE codebook for a2ats_no_wrope")
    p.add_argument(
        "--calib-tokens",
        type=int,
        default=None,
        help="tokens for on-the-fly ablation codebooks (default: as the codebook was calibrated)",
    )
    p.add_argument("--retrain", action="store_true", help="retrain cached ablation codebooks")
    p.add_argument(
        "--tune-paper-b",
        metavar="B,B,...",
        help="tune a2ats_paper's b over these values (e.g. 256,512,1024,2048,4096) on a "
        "development text, one paper codebook calibrated per b, then evaluate the chosen b "
        "(highest dev recall) on the evaluation text",
    )
    p.add_argument(
        "--dev-text",
        help="development text file for --tune-paper-b and a2ats_alloc's per-layer recall "
        "(default: the evaluation text's tokens right after the evaluated span, a different "
        "slice of the same text)",
    )
    add_hosts_flags(p, "evaluate (methods full, kv8, kv4, a2ats, window, oracle_topk)")
    add_json_flag(p, run_eval, "print exactly one JSON object")


def _all_methods() -> tuple[str, ...]:
    from ..bench.evaluate import ALL_METHODS

    return ALL_METHODS


def _codebooks(
    args, model, tokenizer, codebook, methods, progress, books=None
) -> tuple[dict, list[str]]:
    from ..bench.ablations import ablation_codebooks
    from ..cache.codebook import Codebook

    books = {"a2ats": codebook, **(books or {})}
    notes = []
    given = {
        "plain_vq": args.plain_vq_codebook,
        "paper": args.paper_codebook,
        "no_wrope": args.no_wrope_codebook,
    }
    wanted = {
        "a2ats_plain_vq": "plain_vq",
        "a2ats_paper": "paper",
        "a2ats_no_wrope": "no_wrope",
        "a2ats_random": "random",
    }
    train = []
    for method, kind in wanted.items():
        if method not in methods or kind in books:
            continue
        if given.get(kind):
            books[kind] = Codebook.load(given[kind])
            notes.append(f"{kind}: given file {given[kind]}")
        else:
            train.append(kind)
    if train:
        trained, more = ablation_codebooks(
            model, tokenizer, codebook, train, tokens=args.calib_tokens,
            use_cache=not args.retrain, progress=progress, cover=args.context + args.decode,
        )  # fmt: skip
        books.update(trained)
        notes.extend(more)
    return books, notes


def run_eval(args: argparse.Namespace) -> int:
    from ..bench.evaluate import evaluate
    from ..loading.models import load_model

    methods, budgets = check_eval_args(args)
    limits.hosts_flags(args)
    if args.hosts:
        return _eval_on_hosts(args, budgets)
    progress = stderr_progress(True)
    model, tokenizer, info = load_model(args.model)
    codebook, codebook_desc = find_codebook(args.codebook, args.model, info.path, required=True)
    span = args.context + args.decode
    limits.check_model_context("--context + --decode", [span], info.context_length)
    # exact_below 0: the methods measure retrieval (a2ats_auto runs the measured crossover);
    # the estimate off unless a method names it (not left to this machine's measurement)
    config = a2ats_config(
        codebook, model, far_buckets=args.far_buckets, rerank=args.rerank, kv_bits=args.kv_bits,
        exact_below=0, estimate_missed=False,
    )  # fmt: skip
    texts = _texts(args)
    tuned, budgets_b = _tune_b(args, model, tokenizer, codebook, config, texts, budgets, progress)
    books, notes = _codebooks(args, model, tokenizer, codebook, methods, progress, budgets_b)
    dev_ids = None
    if "a2ats_alloc" in methods:
        span = args.context + args.decode + 1
        where = f"each text's tokens {span}-{2 * span} (after the evaluated span)"
        if args.dev_text:
            dev_ids = tokenizer.encode(Path(args.dev_text).read_text(encoding="utf-8"))
            where = f"{Path(args.dev_text).name}, tokens 0-{span}"
        notes.append(f"a2ats_alloc: layer budgets from plain a2ats's recall per layer on {where}")
    per_text = [
        evaluate(
            model, tokenizer.encode(text), context=args.context, decode=args.decode,
            budgets=budgets, codebooks=books, config=config, methods=methods, progress=progress,
            dev_ids=dev_ids,
        )
        for text, _ in texts
    ]  # fmt: skip
    if len(texts) > 1:
        return _print_texts(
            args, texts, per_text, budgets, info, codebook, codebook_desc, config, notes, tuned
        )
    runs = per_text[0]
    text_desc = texts[0][1]
    meta = {
        **_run_meta(info, codebook, codebook_desc, config),
        "text": text_desc,
        "machine": machine(),
        "command": command_line(args, "eval"),
        "notes": notes + _method_notes() + _config_notes(config),
        **({"paper_b": tuned} if tuned else {}),
    }
    if len(runs) == 1:
        out = {**runs[0].to_dict(), **meta}
    else:
        out = {
            "context": args.context,
            "decode": args.decode,
            "budgets": budgets,
            "runs": [r.to_dict() for r in runs],
            **meta,
        }
    if print_json(args, out):
        return 0
    print(f"model {info.name}; codebook {codebook_desc}; text {text_desc}")
    kv = "float" if config.kv_bits is None else f"{config.kv_bits}-bit"
    print(f"context {args.context}, decode {args.decode}; A2ATS K/V {kv}; {meta['machine']}")
    for note in meta["notes"]:
        print(f"note: {note}")
    if tuned:
        trials = ", ".join(f"b={t['b']}: recall {t['recall']:.4f}, ppl/full {t['ppl_vs_full']:.4f}"
                           for t in tuned["trials"])  # fmt: skip
        print(f"paper b tuned on {tuned['dev']}: {trials}; chosen b = {tuned['chosen']}")
    for run in runs:
        print(format_table(run))
    return 0


def _run_meta(info, codebook, codebook_desc: str, config) -> dict:
    """What an eval result records of its model, codebook and A2ATS settings."""
    return {
        "model": info.name,
        "codebook": Path(codebook_desc).name,  # the file name: paths are machine-specific
        "n_centroids": codebook.n_centroids,
        "far_buckets": config.far_buckets,
        "rerank": config.rerank,
        "kv_bits": config.kv_bits,
    }


def _eval_on_hosts(args: argparse.Namespace, budgets: list) -> int:
    """`a2ats eval --hosts FILE`: the evaluation across ranks (`distributed/evaluate.py`), for
    the options it takes; any other is refused by name before anything starts."""
    import subprocess

    from ..distributed.evaluate import DEFAULT_METHODS, METHODS
    from ..distributed.launch import eval_command
    from ..loading.fetched_models import default_codebook

    unsupported = {
        "--budgets": args.budgets, "--far-buckets": args.far_buckets, "--rerank": args.rerank,
        "--kv-bits": args.kv_bits, "--plain-vq-codebook": args.plain_vq_codebook,
        "--paper-codebook": args.paper_codebook, "--no-wrope-codebook": args.no_wrope_codebook,
        "--calib-tokens": args.calib_tokens, "--retrain": args.retrain or None,
        "--tune-paper-b": args.tune_paper_b, "--dev-text": args.dev_text,
    }  # fmt: skip
    given = [flag for flag, value in unsupported.items() if value is not None]
    if given:
        raise ValueError(f"{', '.join(given)}: not across ranks yet (drop them, or --hosts)")
    chosen = args.methods or DEFAULT_METHODS
    limits.names("--methods", chosen, METHODS.__contains__, list(METHODS))
    codebook = args.codebook or default_codebook(args.model, None)
    if codebook is None:
        raise ValueError("--hosts needs --codebook FILE (the same path on every host)")
    forwarded = argparse.Namespace(**{**vars(args), "methods": chosen, "budget": budgets[0],
                                      "codebook": str(codebook), "json": args.json or None})  # fmt: skip
    return subprocess.call(eval_command(forwarded, args.hosts, args.port))


def check_eval_args(args: argparse.Namespace) -> tuple[list[str], list[float | int]]:
    """(methods, budgets) of `a2ats eval`, every flag range-checked before the model loads
    and before any ablation codebook is trained (ValueError naming the flag)."""
    from ..bench.methods import METHODS

    limits.count("--context", args.context, 1, limits.MAX_CONTEXT)
    limits.count("--decode", args.decode)
    if args.budgets:
        budgets = limits.budgets(args.budgets)
    else:
        budgets = [limits.budget(args.budget)]
    chosen = args.methods or ",".join(_all_methods())
    methods = limits.names("--methods", chosen, METHODS.__contains__, list(METHODS))
    limits.config_check(far_buckets=args.far_buckets, rerank=args.rerank)
    limits.optional_count("--calib-tokens", args.calib_tokens, 2, limits.MAX_CALIBRATION_TOKENS)
    if args.tune_paper_b:
        limits.int_list("--tune-paper-b", args.tune_paper_b, 1, limits.MAX_CONTEXT)
    return methods, budgets


def _tune_b(args, model, tokenizer, codebook, config, texts, budgets, progress):
    """With --tune-paper-b: ({"dev", "budget", "trials", "chosen"}, {"paper": chosen codebook});
    (None, None) without it. The development text is --dev-text, else the first evaluation
    text's tokens after the evaluated span (a different slice). Tuned at the first budget."""
    if not args.tune_paper_b:
        return None, None
    from ..bench.ablations import tune_paper_b

    values = [int(v) for v in args.tune_paper_b.split(",") if v.strip()]
    span = args.context + args.decode + 1
    if args.dev_text:
        dev_ids = tokenizer.encode(Path(args.dev_text).read_text(encoding="utf-8"))
        dev = f"{Path(args.dev_text).name} (tokens 0-{span})"
    else:
        dev_ids = tokenizer.encode(texts[0][0])[span:]
        dev = f"{texts[0][1]}, tokens {span}-{2 * span} (after the evaluated span)"
    if len(dev_ids) < span:
        raise ValueError(
            f"--tune-paper-b: the development text has {len(dev_ids)} tokens, needs {span} "
            "(context + decode + 1); give a longer --dev-text"
        )
    chosen, trials, books = tune_paper_b(
        model, tokenizer, codebook, dev_ids[:span], values=values, context=args.context,
        decode=args.decode, budget=budgets[0], config=config, tokens=args.calib_tokens,
        use_cache=not args.retrain, progress=progress,
    )  # fmt: skip
    tuned = {"dev": dev, "budget": budgets[0], "trials": trials, "chosen": chosen}
    return tuned, {"paper": books[chosen]}


def _texts(args: argparse.Namespace) -> list[tuple[str, str]]:
    """[(text, description)] from --texts (built-in names) then --text files; the default
    text when neither is given."""
    from ..bench.eval_texts import builtin_texts, default_text

    out = []
    if args.texts:
        known = builtin_texts()
        for name in (n.strip() for n in args.texts.split(",") if n.strip()):
            if name not in known:
                raise ValueError(f"--texts {name!r} is unknown: must be among {', '.join(known)}")
            out.append(known[name])
    for path in args.text or []:
        out.append((Path(path).read_text(encoding="utf-8"), Path(path).name))
    return out or [default_text()]


def _print_texts(
    args, texts, per_text, budgets, info, codebook, codebook_desc, config, notes, tuned=None
) -> int:
    """Several texts: each text's runs, and per budget the figures pooled over the texts."""
    from ..bench.eval_results import pooled_figures, rests_on

    pooled = [
        {
            "budget": budget,
            "rests_on": rests_on(args.decode * len(texts), len(texts)),
            "methods": pooled_figures([runs[i] for runs in per_text]),
        }
        for i, budget in enumerate(budgets)
    ]
    out = {
        "context": args.context,
        "decode": args.decode,
        "budgets": budgets,
        "texts": [
            {"text": desc, "runs": [r.to_dict() for r in runs]}
            for (_, desc), runs in zip(texts, per_text, strict=True)
        ],
        "pooled": pooled,
        **_run_meta(info, codebook, codebook_desc, config),
        "machine": machine(),
        "command": command_line(args, "eval"),
        "notes": notes + _method_notes(),
        **({"paper_b": tuned} if tuned else {}),
    }
    if print_json(args, out):
        return 0
    for (_, desc), runs in zip(texts, per_text, strict=True):
        print(f"text {desc}")
        for run in runs:
            print(format_table(run))
    for row in pooled:
        print(f"pooled over {len(texts)} texts, budget {row['budget']} ({row['rests_on']['ci95']})")
        for name, fig in row["methods"].items():
            ratio = fig.get("ppl_vs_full")
            ci = fig.get("ppl_vs_full_ci95") or ["", ""]
            print(f"  {name:<16} recall {fig['recall']:.4f} out err {fig['output_rel_error']:.4f} "
                  f"ppl/full {ratio} ({ci[0]}-{ci[1]}) over {fig['tokens']} tokens")  # fmt: skip
    return 0


def _method_notes() -> list[str]:
    return [
        "window: sinks + most recent tokens, as many as a2ats attends on average; its "
        "bytes_per_token is what an evicting cache of that size holds",
        "oracle_topk: a2ats's structure and budget with far tokens ranked by exact scores",
        "a2ats_no_rerank: a2ats with rerank 1; a2ats_paper: the paper's one distance b, "
        "no rerank; the other a2ats_* ablations keep a2ats's rerank",
    ]


def _config_notes(config) -> list[str]:
    """One note per A2ATS setting the run ignores (far_offset with far_buckets > 1)."""
    return [f"{name}: {why}" for name, why in config.unused_settings().items()]


def format_table(run) -> str:
    """A text table of one EvalRun."""
    lines = [
        f"budget {run.budget}",
        f"{'method':<16} {'recall':>8} {'out err':>8} {'ppl':>9} {'ppl/full (95% CI)':>24} "
        f"{'B/token':>9} {'attended':>9} {'att. %':>7} {'read KB':>8} {'argmax=':>8}",
    ]
    for name, r in run.methods.items():
        agree = "" if r.argmax_agreement is None else f"{r.argmax_agreement:.3f}"
        ratio = ""
        if r.ppl_vs_full is not None:
            low, high = r.ppl_vs_full_ci95
            ratio = f"{r.ppl_vs_full:.4f} ({low:.3f}-{high:.3f})"
        lines.append(
            f"{name:<16} {r.recall:>8.4f} {r.output_rel_error:>8.4f} {r.ppl:>9.3f} {ratio:>24} "
            f"{r.bytes_per_token:>9.0f} {r.attended_per_head:>9.1f} "
            f"{100 * (r.attended_fraction or 0):>7.2f} {(r.bytes_read or {}).get('total', 0) / 1e3:>8.1f} "
            f"{agree:>8}"
        )
    return "\n".join(lines)
