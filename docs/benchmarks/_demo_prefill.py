# ruff: noqa: I001  (a2ats_engine before mlx: it preloads OpenBLAS)
"""The demo model prefilled from filler text into mlx-lm's KVCache, with its default codebook and
an A2ATS config that retrieves from the first step: the shared start of the decode-step scripts
here (`step_overhead.py`, `host_step_cold.py`)."""

from __future__ import annotations

import a2ats_engine  # noqa: F401  (BLAS preload before mlx.core)
import mlx.core as mx
from mlx_lm.models.cache import KVCache

from a2ats_engine.bench.speed import filler_tokens
from a2ats_engine.commands._bench_common import a2ats_config, find_codebook
from a2ats_engine.loading.models import load_model


def demo_prefilled(context: int, chunk: int = 512):
    """(model, info, codebook, codebook description, config, token ids, prefilled KVCaches)."""
    model, tokenizer, info = load_model("demo")
    codebook, desc = find_codebook(None, "demo", info.path, required=True)
    config = a2ats_config(codebook, model, exact_below=0)
    ids = filler_tokens(tokenizer, context)
    base = [KVCache() for _ in model.layers]
    for i in range(0, context, chunk):
        model(mx.array(ids[i : i + chunk])[None], cache=base)
        mx.eval([c.state for c in base])
    return model, info, codebook, desc, config, ids, base
