"""Ablation codebooks: the same training tokens as the default, no-WRoPE chunks covering the
evaluated positions, and tuning the paper's b on a development text (tiny model, no downloads)."""

import numpy as np
import pytest
from tiny import tiny_model, tiny_tokenizer

from a2ats_engine.bench.ablations import (
    ablation_codebooks,
    calibration_settings,
    choose_b,
    training_stream,
    tune_paper_b,
)
from a2ats_engine.bench.methods import method_spec
from a2ats_engine.cache.codebook import Codebook
from a2ats_engine.cache.config import A2ATSConfig
from a2ats_engine.cache.geometry import rope_specs


def test_training_stream_drops_the_held_out_chunk_by_hand():
    # 4 chunks of 1024: calibrate holds out round(0.1 * 4) -> 1 chunk, index int(0.5 * 4) = 2
    settings = {"chunk_len": 1024, "calib_chunk_len": 1024}
    kept = training_stream(np.arange(4096), settings)
    assert kept.tolist() == list(range(2048)) + list(range(3072, 4096))
    # a longer no-WRoPE chunk keeps the default's split (calib_chunk_len), not its own
    longer = training_stream(np.arange(4096), {"chunk_len": 4096, "calib_chunk_len": 1024})
    assert longer.tolist() == kept.tolist()
    # one chunk: nothing held out
    assert training_stream(np.arange(500), settings).tolist() == list(range(500))


def test_choose_b_by_hand():
    trials = [
        {"b": 256, "recall": 0.80, "ppl_vs_full": 1.10},
        {"b": 1024, "recall": 0.85, "ppl_vs_full": 1.07},
        {"b": 2048, "recall": 0.85, "ppl_vs_full": 1.05},  # same recall, lower ppl: wins
        {"b": 4096, "recall": 0.84, "ppl_vs_full": 1.01},
    ]
    assert choose_b(trials) == 2048
    tie = [
        {"b": 512, "recall": 0.9, "ppl_vs_full": 1.0},
        {"b": 256, "recall": 0.9, "ppl_vs_full": 1.0},
    ]
    assert choose_b(tie) == 256  # full tie: the smaller b
    with pytest.raises(ValueError, match="at least one"):
        choose_b([])


@pytest.fixture(scope="module")
def tiny_setup():
    model = tiny_model("llama", hidden_size=256)  # 2 layers, 2 KV heads, head_dim 64
    book = Codebook.random(2, 2, 64, 16, seed=3)
    book.metadata.update({"chunk_len": 128, "tokens": 512, "window": 16, "sinks": 4})
    return model, tiny_tokenizer(), book


def test_no_wrope_chunks_cover_the_evaluated_positions(tiny_setup):
    model, tokenizer, book = tiny_setup
    assert calibration_settings(book)["chunk_len"] == 128
    books, notes = ablation_codebooks(
        model, tokenizer, book, ["no_wrope", "plain_vq"], use_cache=False, cover=300
    )
    assert int(books["no_wrope"].metadata["chunk_len"]) == 300  # >= context + decode
    # the same training tokens as the default: 512 tokens in chunks of 128, one held out
    assert int(books["plain_vq"].metadata["tokens"]) == int(books["no_wrope"].metadata["tokens"])
    assert "384 training tokens of the default's 512-token" in notes[0]
    assert "chunks of 300 tokens" in notes[0]


def test_tune_paper_b_calibrates_one_codebook_per_b_and_picks_the_best(tiny_setup):
    model, tokenizer, book = tiny_setup
    dev = [int(x) for x in np.random.default_rng(5).integers(3, 390, 200)]
    config = A2ATSConfig(window=16, sinks=4, budget=0.1)
    chosen, trials, books = tune_paper_b(
        model, tokenizer, book, dev, values=(32, 96), context=150, decode=8, budget=0.1,
        config=config, use_cache=False,
    )  # fmt: skip
    assert [t["b"] for t in trials] == [32, 96] and chosen == choose_b(trials)
    assert all(0.0 < t["recall"] <= 1.0 and t["ppl_vs_full"] > 0 for t in trials)
    for b, paper in books.items():
        assert int(paper.metadata["far_offset"]) == b
        # a2ats_paper retrieves at the b its codebook was calibrated for
        cache = method_spec("a2ats_paper", model, config, {"a2ats": book, "paper": paper})
        built = cache.factory(0, rope_specs(model)[0])
        assert built.config.far_offset == b and built.config.far_buckets == 1
    with pytest.raises(ValueError, match="values is empty"):
        tune_paper_b(model, tokenizer, book, dev, values=(), context=150, decode=8, budget=0.1,
                     config=config)  # fmt: skip


def test_no_wrope_keys_come_from_the_models_own_caches_on_sliding_layers():
    """On a sliding-window model (tiny Gemma 3: layers 0 and 2 slide over 8 tokens) the
    no-WRoPE collection captures the plan's A2ATS layers only, while the sliding layers run
    their RotatingKVCache: the captured post-RoPE keys are those the model's own caches store."""
    import mlx.core as mx
    from mlx_lm.models.cache import make_prompt_cache

    from a2ats_engine.bench.ablations import collect_post_rope
    from a2ats_engine.cache.layer_plan import A2ATS, plan_for
    from a2ats_engine.cache.model_matrix import tiny_family_model

    model = tiny_family_model("gemma3_text")
    served = [c.layer for c in plan_for(model).layers if c.kind == A2ATS]
    stream = np.random.default_rng(0).integers(3, 120, size=64)
    sinks = 2
    keys, moments = collect_post_rope(
        model, stream, chunk_len=64, keys_per_head=10_000, sinks=sinks, window=4
    )
    assert len(keys) == len(moments) == len(served)
    own = make_prompt_cache(model)
    mx.eval(model(mx.array(stream)[None], cache=own))
    for got, layer in zip(keys, served, strict=True):
        want = own[layer].keys[0, :, sinks:64, :].astype(mx.float32)
        assert float(mx.abs(got.astype(mx.float32) - want).max()) < 1e-4, layer
