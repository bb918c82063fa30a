"""save_session / load_session round trip; the seed-compatible KVCacheConfig / KVCacheBuilder."""

import json

import mlx.core as mx
import mlx_lm
import pytest
from mlx_lm.models.cache import make_prompt_cache
from tiny import tiny_model, tiny_tokenizer

from a2ats_engine import KVCacheBuilder, KVCacheConfig, load_session, save_session
from a2ats_engine.cache.a2ats_cache import A2ATSCache
from a2ats_engine.cache.codebook import Codebook
from a2ats_engine.cache.config import A2ATSConfig
from a2ats_engine.cache.model_cache import make_cache
from a2ats_engine.errors import A2ATSError

# the random codebooks here are made without a model on purpose: what is saved and restored does
# not depend on where a codebook came from
pytestmark = pytest.mark.filterwarnings("ignore:codebook records no model fingerprint")


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


def filled(model, config=None, codebook=None):
    cache = make_cache(
        model, config or A2ATSConfig(window=16, sinks=4, budget=8), codebook or book()
    )
    model(mx.array([list(range(3, 250))]), cache=cache)
    return cache


@pytest.mark.parametrize("kv_bits", [None, 8])
def test_from_state_rebuilds_the_cache_in_both_mlx_lm_orders(kv_bits):
    model = tiny_model("llama", hidden_size=256) if kv_bits else tiny_model("llama")
    codebook = Codebook.random(2, 2, 64, 32, seed=3) if kv_bits else book()
    cache = filled(model, A2ATSConfig(window=16, sinks=4, budget=8, kv_bits=kv_bits), codebook)
    saved = [(c.state, c.meta_state) for c in cache]
    mx.eval([s for s, _ in saved])
    a = model(mx.array([[17]]), cache=cache)
    # mlx-lm's `type(c).from_state(state, meta_state)`, with the codebook given explicitly
    first = [
        type(c).from_state(s, m, codebook=codebook) for c, (s, m) in zip(cache, saved, strict=True)
    ]
    # newer mlx-lm order: __new__, then state, then meta_state
    second = []
    for state, meta in saved:
        obj = A2ATSCache.__new__(A2ATSCache)
        obj.codebook = codebook
        obj.state = state
        obj.meta_state = meta
        second.append(obj)
    for rebuilt in (first, second):
        assert [c.meta_state for c in rebuilt] == [m for _, m in saved]
        assert rebuilt[0].offset == 247 and rebuilt[0].codebook is codebook
        b = model(mx.array([[17]]), cache=rebuilt)
        assert float(mx.abs(a - b).max()) < 1e-6


def test_meta_state_setter_reconfigures_and_a_missing_codebook_is_named():
    model = tiny_model("llama")
    cache = filled(model)
    meta = list(cache[0].meta_state)
    other = A2ATSConfig(window=32, sinks=2, budget=4)
    meta[1] = json.dumps(other.to_dict())
    cache[0].meta_state = meta
    assert cache[0].config == other and cache[0].offset == 247  # the tokens stay
    with pytest.raises(A2ATSError, match="codebook of this A2ATS cache .* is not the one given"):
        A2ATSCache.from_state(cache[0].state, meta)  # no codebook: nothing global is guessed
    meta[5] = "0" * 64
    with pytest.raises(A2ATSError, match="codebook of this A2ATS cache .* is not the one given"):
        A2ATSCache.from_state(cache[0].state, meta, codebook=cache[0].codebook)


def test_session_and_codebook_files_share_one_array_layout(tmp_path):
    model = tiny_model("llama")
    codebook = book()
    save_session(tmp_path / "s.safetensors", filled(model, codebook=codebook))
    codebook.save(tmp_path / "book.safetensors")
    session_keys = {
        k for k in mx.load(str(tmp_path / "s.safetensors")) if k.startswith("codebook.")
    }
    book_keys = set(mx.load(str(tmp_path / "book.safetensors")))
    assert session_keys == {"codebook." + k for k in book_keys}
    assert book_keys == {
        f"layers.{i}.{name}" for i in range(2) for name in ("centroids", "assign_centroids", "chol")
    }  # the codebook file layout did not change: existing codebook files load


def save_version_1_session(path, caches, metadata=None):
    """A session file exactly as version 1 of `save_session` wrote it."""
    arrays, layers = {}, []
    for i, cache in enumerate(caches):
        for j, arr in enumerate(cache.state):
            arrays[f"layers.{i}.{j}"] = arr
        layers.append(
            {
                "n_arrays": len(cache.state),
                "offset": cache.offset,
                "kind": "a2ats",
                "layer": cache.layer,
                "config": cache.config.to_dict(),
                "rope": cache.rope.to_dict(),
                "max_context": cache.max_context,
                "tokens_seen": cache.tokens_seen,
            }
        )
    codebook = caches[0].codebook
    for i in range(codebook.num_layers):
        arrays[f"codebook.{i}.centroids"] = codebook.centroids[i]
        arrays[f"codebook.{i}.assign_centroids"] = codebook.assign_centroids[i]
        arrays[f"codebook.{i}.chol"] = codebook.chol[i]
    meta = {"format": "a2ats-session", "version": 1, "layers": layers}
    meta["metadata"] = metadata or {}
    meta["codebook"] = {"num_layers": codebook.num_layers, "metadata": codebook.metadata}
    mx.save_safetensors(str(path), arrays, metadata={"a2ats-session": json.dumps(meta)})


def test_version_1_session_files_still_load(tmp_path):
    model = tiny_model("llama")
    cache = filled(model)
    save_version_1_session(tmp_path / "old.safetensors", cache, {"title": "old"})
    a = model(mx.array([[17]]), cache=cache)
    restored, meta = load_session(tmp_path / "old.safetensors", model)
    assert meta == {"title": "old"} and restored[0].tokens_seen == 247
    b = model(mx.array([[17]]), cache=restored)
    assert float(mx.abs(a - b).max()) < 1e-6


def test_load_session_refuses_another_model_rope_or_codebook(tmp_path):
    model = tiny_model("llama")
    path = tmp_path / "s.safetensors"
    save_session(path, filled(model))
    with pytest.raises(A2ATSError, match=r"s.safetensors: session was saved for another RoPE"):
        load_session(path, tiny_model("llama", rope_theta=500000.0))
    with pytest.raises(A2ATSError, match="model with 2 layers, this one has 3"):
        load_session(path, tiny_model("llama", num_hidden_layers=3))
    with pytest.raises(A2ATSError, match="session's codebook does not fit the model: head dim"):
        load_session(path, tiny_model("llama", hidden_size=128))
    with pytest.raises(A2ATSError, match="saved with another codebook"):
        load_session(path, model, codebook=Codebook.random(2, 2, 16, 64, seed=4))
    caches, _ = load_session(path, model, codebook=book())  # the same codebook: accepted
    assert caches[0].offset == 247


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
