"""`a2ats bench seed-synthetic`: the seed document's synthetic benchmark."""

from __future__ import annotations

import argparse

from .. import _limits as limits
from .._bench_common import print_json
from .._flags import add_json_flag

HELP = "the seed document's offline benchmark (windowed RoPE, query-aware VQ), deterministic"
DESCRIPTION = (
    "Synthetic sequences of 200 and 400 tokens, geometries local_recency and "
    "long_range_dependent: windowed vs always-exact RoPE score error and query-aware vs "
    "plain VQ (key MSE, score MSE, top-K attention recall). No model needed."
)


def register(bench: argparse._SubParsersAction) -> None:
    s = bench.add_parser("seed-synthetic", help=HELP, description=DESCRIPTION)
    s.add_argument("--sequences", default="200,400", help="comma-separated sequence lengths")
    s.add_argument("--centroids", type=int, default=64, help="codebook size (default 64)")
    s.add_argument("--seed", type=int, default=0, help="random seed")
    add_json_flag(s, run_seed_synthetic)


def run_seed_synthetic(args: argparse.Namespace) -> int:
    from ...bench.seed_synthetic import SyntheticSettings, run

    sequences = limits.int_list("--sequences", args.sequences, 2, 1 << 16)
    limits.count("--centroids", args.centroids, 2, 1 << 16)
    limits.count("--seed", args.seed, 0, limits.MAX_SEED)
    settings = SyntheticSettings(n_centroids=args.centroids, seed=args.seed)
    out = run(settings, sequences=tuple(sequences))
    if print_json(args, out):
        return 0
    claims = out["seed_claims"]["windowed_vs_exact_rope_mse_ratio"]
    print(
        "seed claims: windowed/exact RoPE MSE ratio "
        + ", ".join(f"{g} {v}x" for g, v in claims.items())
        + "; query-aware key MSE above plain VQ in every row"
    )
    head = (
        f"{'spectrum':<14} {'seq':>4} {'geometry':<21} {'key w/e':>8} {'score w/e':>9} "
        f"{'QA/plain key':>12} {'QA score':>9} {'plain score':>11} {'QA recall':>9} "
        f"{'plain recall':>12}"
    )
    print(head)
    for row in out["rows"]:
        rope, vq = row["rope"], row["vq"]
        print(
            f"{row['spectrum']:<14} {row['sequence']:>4} {row['geometry']:<21} "
            f"{rope['seed_key_windowed_over_exact']:>7.2f}x {rope['windowed_over_exact']:>8.2f}x "
            f"{vq['query_aware_key_mse_over_plain']['ratio']:>11.2f}x "
            f"{vq['query_aware']['score_mse_far']:>9.3f} {vq['plain']['score_mse_far']:>11.3f} "
            f"{vq['query_aware']['recall_top_k']:>9.3f} {vq['plain']['recall_top_k']:>12.3f}"
        )
    return 0
