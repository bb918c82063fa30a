"""Share of (layer, step) decode steps that reuse the previous selection (`reuse_selection`).

Demo model, 1K tokens of the built-in evaluation text prefilled, 48 teacher-forced steps:
    PYTHONPATH=. python docs/benchmarks/reuse_rate.py
"""

import mlx.core as mx

from a2ats_engine.bench.evaluate import default_text
from a2ats_engine.cache.a2ats_cache import A2ATSCache
from a2ats_engine.cache.config import A2ATSConfig
from a2ats_engine.cache.model_cache import make_cache
from a2ats_engine.commands._bench_common import find_codebook
from a2ats_engine.loading.models import load_model

model, tok, info = load_model("demo")
book, _ = find_codebook(None, "demo", info.path, required=True)
ids = tok.encode(default_text()[0])
ctx, steps = 1024, 48
for cos in (0.9, 0.95, 0.98):
    cache = make_cache(model, A2ATSConfig(reuse_selection=cos, telemetry=True, exact_below=0), book)
    for s in range(0, ctx, 256):
        model(mx.array([ids[s : s + 256]]), cache=cache)
        mx.eval([c.keys for c in cache])
    reused = total = 0
    for t in range(steps):
        model(mx.array([[ids[ctx + t]]]), cache=cache)
        for c in cache:
            if isinstance(c, A2ATSCache) and c.last_stats is not None and not c.last_stats.exact:
                total += 1
                reused += c.last_stats.reused
    print(f"reuse_selection={cos}: {reused}/{total} layer-steps reused ({reused / total:.3f})")
