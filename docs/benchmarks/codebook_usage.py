"""Why retrieval finds what it finds on a model: codebook usage and distance-bucket spread.

For every layer the model's plan serves with A2ATS, after an exact prefill of `--context` tokens
of a built-in text (the model's own caches, as `a2ats eval` prefills):
- codebook usage per KV head: distinct codes among the prefix's keys (of `n_centroids`), the
  perplexity of the code histogram (exp of its entropy: the number of equally used codes it
  amounts to) and the share of keys on the most used code;
- the calibration's held-out score error (codebook metadata);
and, from the layer's RoPE (analytic, no model run), per distance bucket: the rotary pairs whose
angle varies by more than pi/4 across the bucket around its representative distance (the
query is rotated to one distance for the whole bucket: on those pairs the approximate score of a
far key can take the wrong sign).

    python docs/benchmarks/codebook_usage.py --model gemma3-270m --text prose --context 4096

prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import math
import sys

import a2ats_engine  # noqa: F401  (BLAS preload before mlx.core)


def bucket_spread(spec, window: int, context: int, buckets: int) -> list[dict]:
    """Per distance bucket: (lo, hi, representative) and how many rotary pairs rotate by more
    than pi/4 between the representative and the farther bucket edge."""
    from a2ats_engine.cache.rope import distance_buckets

    inv = [float(x) for x in spec.inv_freqs.tolist()]
    out = []
    for lo, hi, mid in distance_buckets(window, context, buckets):
        reach = max(mid - lo, hi - mid)
        wrong = sum(1 for w in inv if reach * w > math.pi / 4)
        out.append({"lo": lo, "hi": hi, "representative": round(mid), "pairs": len(inv),
                    "pairs_over_quarter_turn": wrong})  # fmt: skip
    return out


def usage(codes) -> list[dict]:
    """Per KV head of codes `[n_kv, N]`: distinct codes, histogram perplexity, top share."""
    import numpy as np

    rows = []
    for head in np.asarray(codes):
        counts = np.bincount(head.astype(np.int64))
        p = counts[counts > 0] / counts.sum()
        rows.append({
            "distinct": int((counts > 0).sum()),
            "perplexity": round(float(np.exp(-(p * np.log(p)).sum())), 1),
            "top_share": round(float(p.max()), 4),
        })  # fmt: skip
    return rows


def main(argv: list[str]) -> int:
    import mlx.core as mx

    from a2ats_engine.bench.eval_texts import builtin_texts
    from a2ats_engine.bench.evaluate import prefill
    from a2ats_engine.cache.codebook import Codebook
    from a2ats_engine.cache.config import A2ATSConfig
    from a2ats_engine.cache.layer_plan import A2ATS, plan_for, rope_spec_of
    from a2ats_engine.loading.fetched_models import default_codebook
    from a2ats_engine.loading.models import load_model
    from a2ats_engine.records import planning_context

    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="demo")
    parser.add_argument("--text", default="prose", choices=("code", "prose", "dialogue"))
    parser.add_argument("--context", type=int, default=4096)
    args = parser.parse_args(argv)
    model, tokenizer, info = load_model(args.model)
    path = default_codebook(args.model, None)
    book = Codebook.load(path)
    ids = tokenizer.encode(builtin_texts()[args.text][0])[: args.context]
    base = prefill(model, ids)
    cfg = A2ATSConfig()
    context = planning_context(info.context_length)
    layers = []
    for choice in plan_for(model).layers:
        if choice.kind != A2ATS:
            continue
        spec = rope_spec_of(model, choice)
        src = base[choice.layer]
        pre = spec.unrotate(src.keys[..., : src.offset, :].astype(mx.float32), 0)
        codes = book.assign(choice.layer, pre)[0, :, :, 0]  # [n_kv, N] (full-dim codebook)
        layers.append({
            "layer": choice.layer,
            "rope_base": spec.base,
            "usage": usage(codes),
            "buckets": bucket_spread(spec, cfg.window, context, cfg.far_buckets),
        })  # fmt: skip
    out = {
        "command": "python docs/benchmarks/codebook_usage.py " + " ".join(argv),
        "model": info.name,
        "codebook": path.name,
        "n_centroids": book.n_centroids,
        "heldout_score_error": book.metadata.get("heldout_score_error"),
        "keys": len(ids),
        "planning_context": context,
        "layers": layers,
    }
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
