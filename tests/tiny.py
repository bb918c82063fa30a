"""Tiny random-weight models and a tiny byte-level BPE tokenizer, built in-process (no downloads).

Use `tiny_model("llama")`, `tiny_model("qwen2", rope_traditional=True)`, `tiny_tokenizer()`, or
`save_tiny_model(folder)` for an mlx-lm folder on disk (config.json, weights, tokenizer files).
The builders live in the engine (`a2ats_engine/loading/tiny_model.py`, shared with the app's
self-test); this module adds the tokenizer wrapper the tests use.
"""

from __future__ import annotations

from pathlib import Path

import a2ats_engine  # noqa: F401  (BLAS preload before mlx.core)
from a2ats_engine.loading.tiny_model import (  # noqa: F401  (the tests' API)
    CHATML,
    SPECIALS,
    save_tiny_model,
    save_tiny_tokenizer,
    tiny_config,
    tiny_model,
)
from a2ats_engine.loading.tiny_model import tokenizer_json as _tokenizer_json  # noqa: F401


def made_for(model, codebook):
    """`codebook` (a `Codebook.random` one) with `model`'s fingerprint recorded, as a calibrated
    codebook records it: a test that makes a random codebook for a model on purpose says so, and
    the engine does not warn that it cannot tell which model the codebook is for. Retrieval with
    it stays near random."""
    from a2ats_engine.cache.codebook_check import model_fingerprint

    codebook.metadata["model"] = model_fingerprint(model)
    return codebook


def tiny_tokenizer(tmp_dir: str | Path | None = None):
    """A TokenizerWrapper over the tiny BPE tokenizer (vocab 400, ChatML template)."""
    import tempfile

    from mlx_lm.tokenizer_utils import load as load_tokenizer

    folder = Path(tmp_dir) if tmp_dir is not None else Path(tempfile.mkdtemp(prefix="tinytok"))
    save_tiny_tokenizer(folder)
    return load_tokenizer(folder)
