"""exact_below: exact attention below the crossover context, retrieval from it on."""

import mlx.core as mx
import numpy as np
import pytest

from a2ats_engine.bench.methods import METHODS, decode_variant_knobs
from a2ats_engine.cache import crossover
from a2ats_engine.cache.a2ats_cache import A2ATSCache
from a2ats_engine.cache.codebook import Codebook
from a2ats_engine.cache.config import A2ATSConfig

from .test_cache import D, decode_query, filled_cache


def step(cache: A2ATSCache, rng: np.random.Generator) -> mx.array:
    """Append one random token and attend with a random query: the step's output."""
    kv = [mx.array(rng.standard_normal((1, 1, 1, D)).astype(np.float32)) for _ in range(2)]
    cache.update_and_fetch(*kv)
    n = cache.offset
    _, q = decode_query(cache.rope, 2, n - 1, seed=n)
    keys, values = cache.keys[..., :n, :], cache.values[..., :n, :]
    return cache.attend(q, keys, values, scale=D**-0.5), q, keys, values


def test_steps_below_exact_below_are_exact_then_retrieval_starts():
    config = A2ATSConfig(window=16, sinks=4, budget=8, exact_below=203, telemetry=True)
    cache, _, _ = filled_cache(n=200, config=config)
    rng = np.random.default_rng(0)
    for n in (201, 202):  # context below 203: exact attention over everything
        out, q, keys, values = step(cache, rng)
        ref = mx.fast.scaled_dot_product_attention(q, keys, values, scale=D**-0.5)
        assert float(mx.abs(out - ref).max()) == 0.0
        stats = cache.last_stats
        assert stats.exact and stats.offset == n and stats.exact_until == 203
        assert len(stats.selected[0]) == n
    step(cache, rng)  # context 203: retrieval
    stats = cache.last_stats
    assert not stats.exact and len(stats.retrieved[0]) > 0
    assert len(stats.selected[0]) < stats.offset


def test_default_is_the_measured_crossover_for_the_backend_and_geometry(monkeypatch):
    geometry = (3, 2, D)  # layers, KV heads, head dim of the codebook below
    book = Codebook.random(*geometry, 16, seed=0)
    monkeypatch.setattr(crossover, "backend", lambda: "metal")
    key = ("metal", *geometry, crossover.DEFAULT_KIND)
    monkeypatch.setitem(crossover.MEASURED, key, crossover.Crossover(900, "t"))
    rope = filled_cache(n=1)[2]
    assert A2ATSCache(0, rope, book, A2ATSConfig(), 8192).exact_below == 900
    assert A2ATSCache(0, rope, book, A2ATSConfig(exact_below=5), 8192).exact_below == 5
    # measured with other settings (the estimate costs a step more): it does not apply
    assert A2ATSCache(0, rope, book, A2ATSConfig(estimate_missed=True), 8192).exact_below == 0
    assert A2ATSCache(0, rope, book, A2ATSConfig(budget=0.1), 8192).exact_below == 0
    monkeypatch.setattr(crossover, "backend", lambda: "cpu")  # nobody measured it: 0
    assert A2ATSCache(0, rope, book, A2ATSConfig(), 8192).exact_below == 0
    assert crossover.measured_crossover(30, 3, 64) == 4096  # the demo model on the CPU


def test_exact_below_validated_and_spelled_in_method_names():
    with pytest.raises(ValueError, match=r"A2ATSConfig\.exact_below=-1.*out of range"):
        A2ATSConfig(exact_below=-1)
    assert decode_variant_knobs("a2ats_kv4_rr2_eb0") == {
        "kv_bits": 4,
        "rerank": 2,
        "exact_below": 0,
    }
    # `a2ats eval` runs its methods with exact_below 0 (they measure retrieval); a2ats_auto
    # restores the measured default
    assert METHODS["a2ats"].config(A2ATSConfig(exact_below=0)).exact_below == 0
    assert METHODS["a2ats_auto"].config(A2ATSConfig(exact_below=0)).exact_below is None


def test_eval_measures_retrieval_even_below_the_crossover(tmp_path, monkeypatch, capsys):
    """`a2ats eval` runs its methods with exact_below 0; a2ats_auto runs the measured default."""
    import json

    from tiny import save_tiny_model

    from a2ats_engine.cli import main

    folder = save_tiny_model(tmp_path / "m", "llama", hidden_size=256)  # 2 layers, 2 KV, d 64
    book = tmp_path / "cb.safetensors"
    Codebook.random(2, 2, 64, 32, seed=1).save(book)
    row = crossover.Crossover(100_000, "test")
    kind = crossover.step_kind(A2ATSConfig(budget=0.05))  # what the run below measures with
    monkeypatch.setitem(crossover.MEASURED, (crossover.backend(), 2, 2, 64, kind), row)
    argv = ["eval", "--model", str(folder), "--codebook", str(book), "--context", "200",
            "--decode", "2", "--budget", "0.05", "--methods", "full,a2ats,a2ats_auto", "--json"]  # fmt: skip
    assert main(argv) == 0
    rows = json.loads(capsys.readouterr().out)["methods"]
    assert rows["a2ats"]["recall"] < 1.0  # retrieval, although 200 < the crossover
    assert rows["a2ats_auto"]["recall"] == 1.0  # below the crossover: exact


def test_attention_steps_count_exact_and_retrieved_decode_steps():
    from a2ats_engine.cache.model_cache import attention_steps

    config = A2ATSConfig(window=16, sinks=4, budget=8, exact_below=203)
    cache, _, _ = filled_cache(n=200, config=config)
    assert attention_steps([cache]) == (0, 0)  # the prefill is not a decode step
    rng = np.random.default_rng(1)
    for _ in range(5):  # contexts 201, 202 exact; 203, 204, 205 retrieve
        step(cache, rng)
    assert (cache.retrieved_steps, cache.exact_steps) == (3, 2)
    assert attention_steps([object(), cache]) == (3, 2)  # other caches are not counted
    assert attention_steps([object()]) == (0, 0)


def test_an_exact_step_shows_what_retrieval_would_keep_and_its_recall():
    """Below the crossover the step attends exactly, and with telemetry the shadow selection
    says which far tokens retrieval would keep there and what share of this step's exact
    attention they hold: the very tokens and recall a retrieving cache reports at that step."""
    base = dict(window=16, sinks=4, budget=8, telemetry=True, fidelity_every=1)
    exact, _, _ = filled_cache(n=200, config=A2ATSConfig(exact_below=10_000, **base))
    live, _, _ = filled_cache(n=200, config=A2ATSConfig(exact_below=0, **base))
    retrieved_before = exact.tokens_retrieved
    for seed in (0, 1):
        out_exact = step(exact, np.random.default_rng(seed))[0]
        step(live, np.random.default_rng(seed))
    shadow, real = exact.last_stats, live.last_stats
    assert shadow.exact and not real.exact and real.would_retrieve is None
    assert len(shadow.selected[0]) == shadow.offset  # it still attended everything
    for would, kept in zip(shadow.would_retrieve, real.retrieved, strict=True):
        assert would.tolist() == kept.tolist() and 0 < len(would) < shadow.offset
    assert shadow.recall == pytest.approx(real.recall, abs=1e-6)
    assert 0 < shadow.recall[0] < 1 and shadow.recall_ms > 0
    assert exact.tokens_retrieved == retrieved_before  # a shadow retrieves nothing
    # the exact step's output is exact attention, whatever the shadow computed
    n = exact.offset
    keys, values = exact.keys[..., :n, :], exact.values[..., :n, :]
    _, q = decode_query(exact.rope, 2, n - 1, seed=n)
    ref = mx.fast.scaled_dot_product_attention(q, keys, values, scale=D**-0.5)
    assert float(mx.abs(out_exact - ref).max()) == 0.0


def test_no_shadow_without_telemetry_or_when_nothing_can_be_dropped():
    quiet, _, _ = filled_cache(n=200, config=A2ATSConfig(window=16, sinks=4, budget=8,
                                                         exact_below=10_000))  # fmt: skip
    step(quiet, np.random.default_rng(0))
    assert quiet.last_stats is None
    short, _, _ = filled_cache(n=20, config=A2ATSConfig(window=16, sinks=4, budget=8,
                                                        telemetry=True))  # fmt: skip
    step(short, np.random.default_rng(0))
    assert short.last_stats.exact and short.last_stats.would_retrieve is None
