"""save_session / load_session round trip; the seed-compatible KVCacheConfig / KVCacheBuilder."""

import mlx.core as mx
import mlx_lm
import pytest
from mlx_lm.models.cache import make_prompt_cache
from tiny import tiny_model, tiny_tokenizer

from a2ats_engine import KVCacheBuilder, KVCacheConfig, load_session, save_session
from a2ats_engine.cache.a2ats_cache import A2ATSCache, make_cache
from a2ats_engine.cache.codebook import Codebook
from a2ats_engine.cache.config import A2ATSConfig
from a2ats_engine.errors import A2ATSError


def book(n=64):
    return Codebook.random(2, 2, 16, n, seed=3)


@pytest.mark.parametrize("kv_bits", [None, 8])
def test_session_round_trip_continues_identically(tmp_path, kv_bits):
    model = tiny_model("llama", hidden_size=256) if kv_bits else tiny_model("llama")
    geo_book = Codebook.random(2, 2, 64, 32, seed=3) if kv_bits else book()
    config = A2ATSConfig(window=16, sinks=4, budget=8, kv_bits=kv_bits)
    cache = make_cache(model, config, geo_book)
    model(mx.array([list(range(3, 250))]), cache=cache)
    save_session(tmp_path / "s.safetensors", cache, {"title": "hello", "tokens": [1, 2]})
    a = model(mx.array([[17]]), cache=cache)
    restored, meta = load_session(tmp_path / "s.safetensors", model)
    assert meta == {"title": "hello", "tokens": [1, 2]}
    assert all(isinstance(c, A2ATSCache) for c in restored)
    assert restored[0].offset == 247 and restored[0].config == config
    b = model(mx.array([[17]]), cache=restored)
    assert float(mx.abs(a - b).max()) < 1e-6


def test_session_round_trip_plain_kvcache(tmp_path):
    model = tiny_model("llama")
    cache = make_prompt_cache(model)
    model(mx.array([list(range(3, 50))]), cache=cache)
    save_session(tmp_path / "kv.safetensors", cache)
    a = model(mx.array([[5]]), cache=cache)
    restored, _ = load_session(tmp_path / "kv.safetensors")
    b = model(mx.array([[5]]), cache=restored)
    assert float(mx.abs(a - b).max()) < 1e-6


def test_load_session_bad_files(tmp_path):
    with pytest.raises(A2ATSError, match="not found"):
        load_session(tmp_path / "missing.safetensors")
    junk = tmp_path / "junk.safetensors"
    junk.write_bytes(b"\x00" * 64)
    with pytest.raises(A2ATSError, match="not an A2ATS session file"):
        load_session(junk)


def test_seed_style_builder_works_with_stream_generate():
    model, tok = tiny_model("llama"), tiny_tokenizer()
    config = KVCacheConfig(
        method="a2ats",
        head_dim=16,
        a2ats_codebook_bits=6,
        a2ats_sub_dim=8,
        a2ats_window=16,
        a2ats_use_query_aware=False,
        a2ats_beta=0.5,
        a2ats_retrieval_fraction=0.2,
        a2ats_codebook=Codebook.random(2, 2, 16, 64, sub_dim=8, seed=0),
    )
    a2, spec = config.to_a2ats(), config.codebook_spec()
    assert (spec.n_centroids, spec.sub_dim, a2.window, spec.beta, a2.budget) == (
        64,
        8,
        16,
        1.0,
        0.2,
    )
    caches = KVCacheBuilder.for_model(model, config)
    assert len(caches) == 2 and all(isinstance(c, A2ATSCache) for c in caches)
    prompt = tok.encode("The quick brown fox jumps over the lazy dog. " * 8)
    texts = [
        r.text
        for r in mlx_lm.stream_generate(model, tok, prompt, max_tokens=6, prompt_cache=caches)
    ]
    assert len(texts) == 6
    assert caches[0].tokens_retrieved > 0  # tokens really were retrieved


def test_seed_style_validation():
    with pytest.raises(ValueError, match="a2ats_retrieval_fraction"):
        KVCacheConfig(a2ats_retrieval_fraction=1.5)
    with pytest.raises(ValueError, match="a2ats_beta"):
        KVCacheConfig(a2ats_beta=-0.1)
    with pytest.raises(ValueError, match="only 'a2ats'"):
        KVCacheConfig(method="h2o")
    with pytest.raises(ValueError, match="head dim 16"):
        KVCacheBuilder.for_model(tiny_model("llama"), KVCacheConfig(head_dim=128))


def test_missing_codebook_falls_back_to_random_with_a_loud_warning():
    model = tiny_model("llama")
    with pytest.warns(UserWarning, match="RANDOM codebook"):
        caches = KVCacheBuilder.for_model(model, KVCacheConfig(head_dim=16))
    assert caches[0].codebook.n_centroids == 256
