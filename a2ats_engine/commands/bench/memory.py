"""`a2ats bench memory`: bytes per token and fixed bytes of every cache kind, and where A2ATS breaks even."""

from __future__ import annotations

import argparse

from .. import _limits as limits
from .._bench_common import a2ats_config, machine, print_json, silence_random_codebook_warning
from .._flags import add_json_flag, add_model_flags
from .common import load_codebook

HELP = "cache bytes per token vs context for each method (ratios to full and fp16)"
DESCRIPTION = (
    "Fill each method's caches with `context` tokens of random keys/values of the model's "
    "geometry and K/V dtype (what a cache holds does not depend on the values) and report "
    "the bytes held per token, with ratios to `full` (mlx-lm KVCache) and to an fp16 "
    "full cache. A2ATS's fixed costs (the codebook, once per model and shared by all its "
    "chats, and each layer's rotation matrices) are counted in bytes_held, and the "
    "context from which each A2ATS storage holds less than an fp16 cache and mlx-lm's "
    "kv8/kv4 caches is solved from bytes/token and those fixed bytes. Beside the computed "
    "bytes, what the process measured during each fill: its private resident memory's growth "
    "and peak growth (RssAnon on Linux, the footprint on macOS) and MLX's active and peak bytes."
)


def register(bench: argparse._SubParsersAction) -> None:
    m = bench.add_parser("memory", help=HELP, description=DESCRIPTION)
    add_model_flags(m, contexts="1024,4096,8192,16384")
    m.add_argument(
        "--methods",
        default="full,kv8,kv4,a2ats,a2ats_kv8,a2ats_kv4",
        help="comma list of: full, kv8, kv4, a2ats, a2ats_kv8, a2ats_kv4",
    )
    add_json_flag(m, run_memory)


def run_memory(args: argparse.Namespace) -> int:
    from ...bench.speed import MEMORY_METHODS, bench_memory, fp16_bytes_per_token, kv_dtype
    from ...loading.models import load_model

    contexts = limits.contexts("--contexts", args.contexts)
    methods = tuple(
        limits.names("--methods", args.methods, MEMORY_METHODS.__contains__, MEMORY_METHODS)
    )
    silence_random_codebook_warning()
    model, _, info = load_model(args.model)
    limits.check_cache_memory("--contexts", contexts, fp16_bytes_per_token(model))
    codebook, codebook_desc = load_codebook(args.codebook, args.model, info.path)
    config = a2ats_config(codebook, model)
    results = bench_memory(model, contexts, methods=methods, config=config, codebook=codebook)
    fp16 = fp16_bytes_per_token(model)
    rows = []
    for r in results:
        full = next((x for x in results if x.context == r.context and x.method == "full"), None)
        rows.append(
            {
                "method": r.method,
                "context": r.context,
                "bytes_held": r.bytes_held,
                "bytes_per_token": round(r.bytes_per_token, 1),
                "fixed_bytes": r.fixed_bytes,
                "codebook_bytes": r.codebook_bytes,
                "held_vs_fp16_full": round(r.bytes_held / (fp16 * r.context), 4),
                "vs_full": round(r.bytes_per_token / full.bytes_per_token, 4) if full else None,
                "vs_fp16_full": round(r.bytes_per_token / fp16, 4),
                "measured": r.measured,
            }
        )
    out = {
        "model": info.name,
        "kv_dtype": str(kv_dtype(model)).rsplit(".", 1)[-1],
        "fp16_bytes_per_token": fp16,
        "codebook": codebook_desc,
        "codebook_bytes": max((r.codebook_bytes for r in results), default=0) or None,
        "machine": machine(),
        "results": rows,
        "break_even": break_even_rows(results, fp16),
    }
    if print_json(args, out):
        return 0
    print(f"model {info.name}; K/V dtype {out['kv_dtype']}; fp16 full = {fp16} B/token")
    if out["codebook_bytes"]:
        print(
            f"codebook held once per model, shared by all its chats: "
            f"{out['codebook_bytes'] / 2**20:.2f} MiB (counted in bytes held, not per token)"
        )
    print(
        f"{'context':>8} {'method':<10} {'B/token':>10} {'vs full':>8} {'vs fp16':>8} "
        f"{'fixed MiB':>9} {'held MiB':>9} {'held/fp16':>9} {'measured MiB':>12}"
    )
    for row in rows:
        vs_full = "" if row["vs_full"] is None else f"{row['vs_full']:.3f}x"
        print(
            f"{row['context']:>8} {row['method']:<10} {row['bytes_per_token']:>10.0f} "
            f"{vs_full:>8} {row['vs_fp16_full']:>7.3f}x {row['fixed_bytes'] / 2**20:>9.2f} "
            f"{row['bytes_held'] / 2**20:>9.2f} {row['held_vs_fp16_full']:>8.3f}x "
            f"{_growth(row['measured']):>12}"
        )
    if out["break_even"]:
        print("context from which A2ATS holds less (codebook and rotations counted):")
        for b in out["break_even"]:
            at = "never" if b["context"] is None else f"{b['context']:,} tokens"
            print(f"  {b['method']:<10} vs {b['baseline']:<5} {at}")
    return 0


def _growth(measured: dict) -> str:
    """The process's private memory growth over the fill, in MiB ('-' where not measured)."""
    grew = measured.get("anon_growth")
    return "-" if grew is None else f"{grew / 2**20:.2f}"


def break_even_rows(results: list, fp16_per_token: int) -> list[dict]:
    """Per A2ATS method (float, kv8, kv4 storage): the context from which it holds less than an
    fp16 full cache and than mlx-lm's kv8 / kv4 caches (those measured), solved from its
    bytes/token and fixed bytes at the largest context (`break_even_context`)."""
    from ...bench.speed import break_even_context

    last = max((r.context for r in results), default=0)
    at_last = {r.method: r for r in results if r.context == last}
    baselines = {"fp16": float(fp16_per_token)}
    baselines.update({m: at_last[m].bytes_per_token for m in ("kv8", "kv4") if m in at_last})
    rows = []
    for method, r in at_last.items():
        if not method.startswith("a2ats"):
            continue
        for name, per_token in baselines.items():
            n = break_even_context(r.bytes_per_token, r.fixed_bytes, per_token)
            rows.append({"method": method, "baseline": name, "context": n})
    return rows
