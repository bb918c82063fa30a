"""`a2ats bench ...`: benchmarks that compare methods as ratios within one run."""

from __future__ import annotations

import argparse
import json
import platform
import sys


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("bench", help="benchmarks (decode speed, memory, ...)")
    bench = p.add_subparsers(dest="bench", metavar="BENCH")
    bench.required = True
    d = bench.add_parser(
        "decode",
        help="decode tokens/s and cache bytes of A2ATS vs mlx-lm's KVCache at several contexts",
        description=(
            "Prefill each context once, then decode the same tokens through every method from an "
            "identical state. Prints tokens/s, bytes held per token and ratios to `full` "
            "(mlx-lm KVCache)."
        ),
    )
    d.add_argument("--model", default="demo", help="model source (default: demo)")
    d.add_argument("--codebook", help="codebook file (default: the model's default, else random)")
    d.add_argument("--contexts", default="1024,4096,8192", help="comma-separated context lengths")
    d.add_argument("--steps", type=int, default=32, help="decode steps timed per method")
    d.add_argument("--budget", type=float, default=0.03, help="retrieval budget (fraction)")
    d.add_argument(
        "--methods",
        default="full,a2ats,a2ats_kv4",
        help="comma list of: full, kv8, kv4, a2ats, a2ats_kv8, a2ats_kv4, a2ats_telemetry",
    )
    d.add_argument(
        "--telemetry", action="store_true", help="also time a2ats with telemetry on (overhead)"
    )
    d.add_argument("--json", action="store_true", help="print one JSON object")
    d.set_defaults(func=run_decode)


def _load_codebook(path: str | None, model_source: str):
    from ..codebook import Codebook

    if path:
        return Codebook.load(path)
    if model_source == "demo":
        try:
            from ..calibrate import default_codebook_path

            default = default_codebook_path()
            if default.exists():
                return Codebook.load(default)
        except ImportError:
            pass
    return None


def run_decode(args: argparse.Namespace) -> int:
    from ..config import A2ATSConfig
    from ..models import load_model
    from ..speed import bench_decode, fp16_bytes_per_token

    model, tokenizer, info = load_model(args.model)
    codebook = _load_codebook(args.codebook, args.model)
    contexts = [int(c) for c in args.contexts.split(",") if c]
    methods = [m for m in args.methods.split(",") if m]
    if args.telemetry and "a2ats_telemetry" not in methods:
        methods.append("a2ats_telemetry")
    config = A2ATSConfig(budget=args.budget)

    def progress(stage, done, total):
        if not args.json:
            print(f"  {stage} ({done + 1}/{total})", file=sys.stderr)

    results = bench_decode(
        model,
        tokenizer,
        contexts,
        steps=args.steps,
        config=config,
        codebook=codebook,
        methods=tuple(methods),
        progress=progress,
    )
    fp16 = fp16_bytes_per_token(model)
    rows = []
    for r in results:
        full = next(x for x in results if x.context == r.context and x.method == "full")
        rows.append(
            {
                "method": r.method,
                "context": r.context,
                "tokens_per_s": round(r.tokens_per_s, 2),
                "speed_vs_full": round(r.tokens_per_s / full.tokens_per_s, 3),
                "bytes_per_token": round(r.bytes_per_token, 1),
                "bytes_vs_fp16_full": round(r.bytes_per_token / fp16, 3),
                **r.extra,
            }
        )
    meta = {
        "model": info.name,
        "codebook": (codebook.metadata.get("name") or "file") if codebook else "random",
        "n_centroids": codebook.n_centroids if codebook else None,
        "budget": args.budget,
        "steps": args.steps,
        "fp16_bytes_per_token": fp16,
        "machine": f"{platform.system()} {platform.machine()}",
        "command": "a2ats bench decode " + " ".join(sys.argv[3:]),
    }
    if args.json:
        print(json.dumps({**meta, "results": rows}))
        return 0
    print(
        f"model {info.name}, codebook {meta['codebook']}, budget {args.budget}, {args.steps} steps"
    )
    print(
        f"{'context':>8} {'method':<16} {'tok/s':>8} {'vs full':>8} {'B/token':>10} {'vs fp16':>8}"
    )
    for row in rows:
        print(
            f"{row['context']:>8} {row['method']:<16} {row['tokens_per_s']:>8.2f} "
            f"{row['speed_vs_full']:>7.2f}x {row['bytes_per_token']:>10.0f} "
            f"{row['bytes_vs_fp16_full']:>7.3f}x"
        )
    return 0
