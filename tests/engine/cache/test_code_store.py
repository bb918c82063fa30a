"""A decode step's key waits to be coded with the next ones (`cache/code_store.py`), and every
reader of `A2ATSCache.codes` still sees every key coded."""

import mlx.core as mx
import numpy as np

from a2ats_engine.cache.a2ats_cache import A2ATSCache
from a2ats_engine.cache.code_store import CHUNK
from a2ats_engine.cache.config import A2ATSConfig

from .test_cache import D, exact_codebook, spec

N = 40 + CHUNK + 12  # tokens: a prefill of 40, then decode steps


def cache_and_keys(prefill: int = 40, seed: int = 0):
    """A cache over a one-centroid-per-token codebook (token n's code is n) and the post-RoPE
    keys of all N tokens, the first `prefill` of them stored."""
    pre = np.random.default_rng(seed).standard_normal((1, N, D)).astype(np.float32)
    rope = spec()
    cache = A2ATSCache(0, rope, exact_codebook(pre), A2ATSConfig(), max_context=8192)
    post = rope.rotate(mx.array(pre[None]), 0)  # [1, 1, N, D]
    if prefill:
        cache.update_and_fetch(post[:, :, :prefill], post[:, :, :prefill])
    return cache, post


def decode(cache, post, n: int) -> None:
    """n decode steps (store, then attend: exact at these lengths, reading no code)."""
    for _ in range(n):
        p = cache.offset
        keys, values = cache.update_and_fetch(post[:, :, p : p + 1], post[:, :, p : p + 1])
        cache.attend(post[:, :, p : p + 1], keys, values, scale=D**-0.5)


def coded(array, end: int) -> np.ndarray:
    return np.array(array[0, 0, :end, 0])


def test_decode_keys_wait_and_any_read_codes_them_first():
    cache, post = cache_and_keys()
    decode(cache, post, 3)
    store = cache.code_store
    assert len(store.pending) == 3
    assert (coded(store.array, 43)[40:] == 0).all()  # not coded yet (the rows are zeros)
    assert (coded(cache.codes, 43) == np.arange(43)).all()  # the read coded them, in place
    assert store.pending == []


def test_a_chunk_of_waiting_keys_is_coded_without_a_read():
    cache, post = cache_and_keys()
    decode(cache, post, CHUNK - 1)
    assert len(cache.code_store.pending) == CHUNK - 1
    decode(cache, post, 1)
    assert cache.code_store.pending == []
    assert (coded(cache.code_store.array, 40 + CHUNK) == np.arange(40 + CHUNK)).all()


def test_trim_state_and_a_cache_that_starts_with_a_decode_step():
    cache, post = cache_and_keys()
    decode(cache, post, 5)
    assert cache.trim(2) == 2  # the waiting keys coded first, then two tokens dropped
    assert cache.offset == 43 and cache.code_store.pending == []
    decode(cache, post, 4)  # positions 43..46 again
    assert (coded(cache.codes, 47) == np.arange(47)).all()
    decode(cache, post, 2)
    state = cache.state  # the state carries every token's code
    assert state[-1].shape[2] == 49 and (coded(state[-1], 49) == np.arange(49)).all()

    fresh, post = cache_and_keys(prefill=0)
    assert fresh.empty()
    decode(fresh, post, 2)
    assert not fresh.empty() and fresh.code_store.array is None  # waiting, not yet coded
    assert (coded(fresh.codes, 2) == np.arange(2)).all()
