"""A2ATSCache: exactness, selection, windowed-RoPE scores, storage, trim, batches, models."""

import math

import mlx.core as mx
import numpy as np
import pytest
from mlx_lm.generate import generate_step
from mlx_lm.models.cache import KVCache, make_prompt_cache
from mlx_lm.models.rope_utils import initialize_rope
from tiny import made_for, tiny_model

from a2ats_engine.bench.accounting import layer_bytes
from a2ats_engine.cache import attention as att
from a2ats_engine.cache.a2ats_cache import A2ATSCache
from a2ats_engine.cache.codebook import Codebook
from a2ats_engine.cache.config import A2ATSConfig
from a2ats_engine.cache.geometry import model_geometry
from a2ats_engine.cache.model_cache import make_cache, model_codebook_bytes, snapshot
from a2ats_engine.cache.rope import RopeSpec, distance_buckets
from a2ats_engine.cache.topk import MlxTopK, NumpyTopK, choose_top_k

from ..refusals import assert_out_of_range

D = 32


def spec(traditional=False):
    return RopeSpec.from_module(initialize_rope(D, 10000.0, traditional, None, 8192), D)


def exact_codebook(pre_keys: np.ndarray) -> Codebook:
    """One centroid per token (centroid = that token's pre-RoPE key): codes are exact, so the
    lookup-table score of token n equals the windowed-RoPE score (R_D q) . k_n exactly."""
    return Codebook([mx.array(pre_keys[:, None, :, :])])  # [n_kv, 1, N, d]


def filled_cache(n=200, n_kv=1, config=None, traditional=False, seed=0):
    rng = np.random.default_rng(seed)
    pre = rng.standard_normal((n_kv, n, D)).astype(np.float32)
    rope = spec(traditional)
    cache = A2ATSCache(0, rope, exact_codebook(pre), config or A2ATSConfig(), max_context=8192)
    post = rope.rotate(mx.array(pre[None]), 0)
    cache.update_and_fetch(post, mx.array(rng.standard_normal((1, n_kv, n, D)).astype(np.float32)))
    return cache, pre, rope


def decode_query(rope, n_q, position, seed=1):
    q = np.random.default_rng(seed).standard_normal((1, n_q, 1, D)).astype(np.float32)
    return mx.array(q), rope.rotate(mx.array(q), position)


def wrope_scores(q_pre: np.ndarray, pre: np.ndarray, rope, distance: int) -> np.ndarray:
    """(R_D q) . k for every key: q_pre [n_q, d], pre [N, d] -> [n_q, N]."""
    rq = np.array(rope.rotate(mx.array(q_pre[:, None, :]), distance))[:, 0, :]
    return rq @ pre.T


def test_codes_are_assigned_for_every_key_and_exact():
    cache, pre, _ = filled_cache(n=50)
    codes = np.array(cache.codes[0, 0, :50, 0])
    assert (codes == np.arange(50)).all()  # each pre-RoPE key found its own centroid
    assert cache.tokens_seen == 50 and cache.offset == 50


@pytest.mark.parametrize("traditional", [False, True])
def test_far_scores_single_distance_equal_wrope_exactly(traditional):
    config = A2ATSConfig(window=16, sinks=4, budget=8, far_buckets=1, far_offset=2048)
    cache, pre, rope = filled_cache(n=200, config=config, traditional=traditional)
    n = cache.offset
    q_pre, q_post = decode_query(rope, 2, n - 1)
    lay = att.layout(n, 16, 4, 8)
    got = np.array(cache.far_token_scores(q_post.reshape(1, 2, 1, D), lay))[0, 0]  # [G, F]
    want = wrope_scores(np.array(q_pre)[0, :, 0], pre[0], rope, 2048)[:, 4 : n - 16]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-3)


def test_far_scores_with_buckets_use_each_tokens_bucket_distance():
    config = A2ATSConfig(window=16, sinks=4, budget=8, far_buckets=3)
    cache, pre, rope = filled_cache(n=600, config=config)
    n = cache.offset
    q_pre, q_post = decode_query(rope, 1, n - 1)
    lay = att.layout(n, 16, 4, 8)
    got = np.array(cache.far_token_scores(q_post, lay))[0, 0, 0]
    plan = distance_buckets(16, 8192, 3)
    for p in [4, 100, 500, n - 17]:
        dist = (n - 1) - p
        bucket = sum(dist >= lo for lo, _, _ in plan[1:])
        d_rep = round(plan[bucket][2])
        want = wrope_scores(np.array(q_pre)[0, :, 0], pre[0], rope, d_rep)[0, p]
        assert got[p - 4] == pytest.approx(want, rel=1e-4, abs=1e-3), (p, bucket)
    # different buckets really use different distances
    assert len({round(b[2]) for b in plan}) == 3


def test_selection_top_k_union_sinks_window():
    config = A2ATSConfig(window=16, sinks=4, budget=5, far_buckets=1, rerank=1, telemetry=True)
    n_kv, n_q = 1, 2
    cache, pre, rope = filled_cache(n=200, n_kv=n_kv, config=config)
    n = cache.offset
    q_pre, q_post = decode_query(rope, n_q, n - 1)
    cache.attend(q_post, None, None, scale=D**-0.5)
    stats = cache.last_stats
    scores = wrope_scores(np.array(q_pre)[0, :, 0], pre[0], rope, 2048)  # [n_q, N]
    far = np.arange(4, n - 16)
    expected_far = set()
    for h in range(n_q):
        top = far[np.argsort(-scores[h, far])[:5]]
        expected_far |= set(top.tolist())
    expected = set(range(4)) | expected_far | set(range(n - 16, n))
    assert set(stats.selected[0].tolist()) == expected
    assert stats.window_start == n - 16  # exactly `window` tokens, current one included
    assert set(stats.retrieved[0].tolist()) == expected_far
    assert not stats.exact and stats.offset == n
    assert cache.tokens_retrieved == len(expected_far)


def test_decode_output_is_exact_attention_over_the_selection():
    config = A2ATSConfig(
        window=16, sinks=4, budget=6, far_buckets=1, telemetry=True, estimate_missed=False
    )
    cache, pre, rope = filled_cache(n=300, n_kv=2, config=config)
    n = cache.offset
    _, q_post = decode_query(rope, 4, n - 1)
    out = np.array(cache.attend(q_post, None, None, scale=D**-0.5))
    keys = np.array(cache.keys[0, :, :n])
    values = np.array(cache.values[0, :, :n])
    for qh in range(4):
        h = qh // 2
        sel = cache.last_stats.selected[h]
        s = keys[h, sel] @ np.array(q_post)[0, qh, 0] * D**-0.5
        p = np.exp(s - s.max())
        p /= p.sum()
        np.testing.assert_allclose(out[0, qh, 0], p @ values[h, sel], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("bits", [None, 8])
def test_rerank_keeps_the_exact_top_k_of_the_candidates(bits):
    """Rerank over every far token gives the exact top-K; over r*K candidates it keeps the
    exact best among the approximate top r*K. One centroid per token: no score ties."""
    n, window, sinks, k = 300, 16, 4, 10
    rng = np.random.default_rng(3)
    pre = rng.standard_normal((1, n, 64)).astype(np.float32)
    rope = RopeSpec.from_module(initialize_rope(64, 10000.0, False, None, 8192), 64)
    book = Codebook([mx.array(pre[:, None, :, :])])
    values = mx.array(rng.standard_normal((1, 1, n, 64)).astype(np.float32))
    post = rope.rotate(mx.array(pre[None]), 0)
    q_post = rope.rotate(mx.array(rng.standard_normal((1, 2, 1, 64)).astype(np.float32)), n - 1)
    exact = np.array(q_post)[0, :, 0] @ np.array(post)[0, 0].T  # [2, n]
    far = np.arange(sinks, n - window)
    chosen = {}
    for rerank in (1, 3, 64):
        config = A2ATSConfig(window=window, sinks=sinks, budget=k, rerank=rerank, kv_bits=bits,
                             kv_group_size=64, telemetry=True)  # fmt: skip
        cache = A2ATSCache(0, rope, book, config, max_context=8192)
        cache.update_and_fetch(post, values)
        cache.attend(q_post, None, None, scale=0.125)
        got = chosen[rerank] = set(cache.last_stats.retrieved[0].tolist())
        lay = att.layout(n, window, sinks, k)
        approx = np.array(cache.far_token_scores(q_post, lay))[0, 0]  # [2, F]
        want = set()
        for h in range(2):
            cand = far[np.argsort(-approx[h])[: min(rerank * k, len(far))]]
            want |= set(cand[np.argsort(-exact[h, cand])[:k]].tolist())
        if bits is None:
            assert got == want
        else:  # exact scores from 8-bit keys: the same tokens up to near-ties
            assert len(got & want) >= len(want) - 2
    best = {int(t) for h in range(2) for t in far[np.argsort(-exact[h, far])[:k]]}
    assert len(chosen[64] & best) >= len(best) - (0 if bits is None else 2)
    assert chosen[1] != chosen[64]  # the approximate ranking alone misses some of the best
    with pytest.raises(ValueError, match="rerank"):
        A2ATSConfig(rerank=0)


def test_host_select_matches_the_mlx_select():
    lay = att.layout(500, 16, 4, 12)
    rng = np.random.default_rng(0)
    # 2 batch rows, 3 KV heads, GQA group 3; heads of a group pick overlapping tokens
    top = np.stack(
        [rng.permuted(np.tile(np.arange(40), (2, 3, 1)), axis=-1)[..., :12] for _ in range(3)],
        axis=2,
    )
    top = top.astype(np.int32)
    host, device = NumpyTopK(), MlxTopK()
    pos_h, rep_h = host.select(top, lay)
    pos_m, rep_m = device.select(mx.array(top), lay)
    assert np.array_equal(np.array(pos_h), np.array(pos_m))
    assert np.array_equal(np.array(rep_h), np.array(rep_m))
    n_union = host.retrieved
    assert n_union == device.retrieved
    assert n_union < top.size  # the overlap was counted once
    # top-K and the rerank pick agree too (distinct scores: no ties)
    scores = rng.permuted(np.tile(np.arange(300, dtype=np.float32), (2, 3, 3, 1)), axis=-1)
    best_h = np.sort(host.top(scores, 12), axis=-1)
    best_m = np.sort(np.array(device.top(mx.array(scores), 12)), axis=-1)
    assert np.array_equal(best_h, best_m)
    exact = mx.array(rng.standard_normal((2, 3, 3, 40)).astype(np.float32))
    cand = top[..., :1].repeat(40, axis=-1) + np.arange(40, dtype=np.int32)
    picked_h = np.sort(host.pick(cand, exact, 5), axis=-1)
    picked_m = np.sort(np.array(device.pick(mx.array(cand), exact, 5)), axis=-1)
    assert np.array_equal(picked_h, picked_m)


def test_top_k_strategy_is_chosen_once_per_cache(monkeypatch):
    monkeypatch.setenv("A2ATS_TOPK", "numpy")
    cache, _, rope = filled_cache(n=300, config=A2ATSConfig(window=16, sinks=4, budget=8))
    assert isinstance(cache.top_k, NumpyTopK)
    monkeypatch.setenv("A2ATS_TOPK", "mlx")  # read when the cache was made, not per step
    _, q_post = decode_query(rope, 1, 299)
    cache.attend(q_post, None, None, scale=D**-0.5)
    assert isinstance(cache.top_k, NumpyTopK) and cache.tokens_retrieved > 0
    assert isinstance(choose_top_k(), MlxTopK)


def test_budget_fraction_and_int():
    assert A2ATSConfig(budget=0.03, min_k=16).top_k(4096) == math.ceil(0.03 * 4096)
    assert A2ATSConfig(budget=0.03, min_k=16).top_k(100) == 16
    assert A2ATSConfig(budget=40).top_k(4096) == 40
    config = A2ATSConfig(window=8, sinks=2, budget=0.05, min_k=3, far_buckets=1, telemetry=True)
    cache, _, rope = filled_cache(n=400, config=config)
    _, q_post = decode_query(rope, 1, 399)
    cache.attend(q_post, None, None, scale=D**-0.5)
    assert len(cache.last_stats.retrieved[0]) == math.ceil(0.05 * 400)


def test_short_context_is_exact_and_reported_as_such():
    config = A2ATSConfig(window=64, sinks=8, budget=16, telemetry=True)
    cache, _, rope = filled_cache(n=80, config=config)
    _, q_post = decode_query(rope, 1, 79)
    k, v = cache.keys[..., :80, :], cache.values[..., :80, :]
    out = cache.attend(q_post, k, v, scale=D**-0.5)
    ref = mx.fast.scaled_dot_product_attention(q_post, k, v, scale=D**-0.5)
    assert float(mx.abs(out - ref).max()) == 0.0
    assert cache.last_stats.exact and len(cache.last_stats.selected[0]) == 80


def random_codebook(model, n=64):
    geo = model_geometry(model)
    return made_for(model, Codebook.random(geo.num_layers, geo.num_kv_heads, geo.head_dim, n))


def greedy(model, prompt, cache, steps=12):
    out = []
    for tok, _ in generate_step(mx.array(prompt), model, prompt_cache=cache, max_tokens=steps):
        out.append(int(tok))
    return out


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
@pytest.mark.parametrize("traditional", [False, True])
def test_no_drop_generation_identical_to_kvcache(arch, traditional):
    model = tiny_model(arch, rope_traditional=traditional)
    prompt = list(range(5, 105))
    config = A2ATSConfig(window=256)  # nothing can be dropped
    a = greedy(model, prompt, make_cache(model, config, random_codebook(model)))
    b = greedy(model, prompt, make_prompt_cache(model))
    assert a == b
    # logits at rounding level
    ca, cb = make_cache(model, config, random_codebook(model)), make_prompt_cache(model)
    x = mx.array([prompt])
    la, lb = model(x, cache=ca), model(x, cache=cb)
    la, lb = model(mx.array([[7]]), cache=ca), model(mx.array([[7]]), cache=cb)
    assert float(mx.abs(la - lb).max()) < 1e-4


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_retrieval_runs_on_models_and_differs_from_exact(arch):
    model = tiny_model(arch)
    config = A2ATSConfig(window=16, sinks=4, budget=8, telemetry=True)
    cache = make_cache(model, config, random_codebook(model))
    x = mx.array([list(range(3, 303))])
    model(x, cache=cache)
    logits = model(mx.array([[9]]), cache=cache)
    assert logits.shape == (1, 1, 400) and bool(mx.isfinite(logits).all())
    snap = snapshot(cache, token_id=9)
    assert snap is not None and len(snap.layers) == 2 and snap.offset == 301
    assert all(not layer.exact for layer in snap.layers)
    assert all(len(layer.code_counts[0]) == 64 for layer in snap.layers)
    assert all(int(layer.code_counts[0].sum()) == 301 for layer in snap.layers)


def test_batch_of_two_matches_single_rows():
    model = tiny_model("llama", hidden_size=128)  # head_dim 32
    config = A2ATSConfig(window=16, sinks=4, budget=8)
    book = random_codebook(model)
    rows = [list(range(3, 203)), list(range(103, 303))]
    cache = make_cache(model, config, book)
    model(mx.array(rows), cache=cache)
    both = model(mx.array([[5], [6]]), cache=cache)
    for r, (row, tok) in enumerate(zip(rows, [5, 6], strict=True)):
        single = make_cache(model, config, book)
        model(mx.array([row]), cache=single)
        one = model(mx.array([[tok]]), cache=single)
        assert float(mx.abs(both[r] - one[0]).max()) < 1e-4


@pytest.mark.parametrize("bits", [8, 4])
def test_kv_bits_storage_saves_bytes_and_stays_close(bits):
    model = tiny_model("llama", hidden_size=256)  # head_dim 64
    book = random_codebook(model)
    x = mx.array([[3 + i % 390 for i in range(400)]])  # ids inside the tiny vocab (400)
    full = make_cache(model, A2ATSConfig(window=512), book)
    quant = make_cache(model, A2ATSConfig(window=512, kv_bits=bits), book)
    a = model(x, cache=full)
    b = model(x, cache=quant)
    a = model(mx.array([[5]]), cache=full)
    b = model(mx.array([[5]]), cache=quant)
    rel = float(mx.abs(a - b).max() / mx.abs(a).max())
    assert rel < (0.05 if bits == 8 else 0.3)
    quant_bytes, full_bytes = layer_bytes(quant[0]).storage, layer_bytes(full[0]).storage
    assert quant_bytes < full_bytes * (0.4 if bits == 8 else 0.25)
    assert quant[0].nbytes < full[0].nbytes
    assert isinstance(quant[0].keys, tuple)
    # retrieval also works on quantized storage
    small = make_cache(model, A2ATSConfig(window=16, sinks=4, budget=8, kv_bits=bits), book)
    model(x, cache=small)
    assert bool(mx.isfinite(model(mx.array([[5]]), cache=small)).all())


def test_trim_then_continue_equals_fresh():
    model = tiny_model("llama")
    config = A2ATSConfig(window=16, sinks=4, budget=8)
    book = random_codebook(model)
    prompt = list(range(3, 203))
    cache = make_cache(model, config, book)
    model(mx.array([prompt + [11, 12, 13]]), cache=cache)
    assert cache[0].trim(3) == 3 and cache[0].offset == 200
    for c in cache[1:]:
        c.trim(3)
    a = model(mx.array([[21]]), cache=cache)
    fresh = make_cache(model, config, book)
    model(mx.array([prompt]), cache=fresh)
    b = model(mx.array([[21]]), cache=fresh)
    assert float(mx.abs(a - b).max()) < 1e-5


def test_byte_accounting_is_what_is_held():
    model = tiny_model("llama", hidden_size=256)
    cache = make_cache(model, A2ATSConfig(kv_bits=4), random_codebook(model))
    model(mx.array([list(range(3, 259))]), cache=cache)
    c = cache[0]
    held = sum(a.nbytes for a in c.keys) + sum(a.nbytes for a in c.values) + c.codes.nbytes
    b = layer_bytes(c)
    assert b.storage == held == c.resident_bytes and b.on_disk == c.disk_bytes == 0
    # the layer's own extras: its rotation matrices [d, m * d] (telemetry is off)
    assert b.rotations == c.rotations.nbytes > 0 and b.estimate == 0
    assert c.nbytes == held + b.rotations == b.held
    assert b.fp16_keys == 1 * 2 * 256 * 64 * 2
    assert b.compression_ratio == pytest.approx((b.fp16_keys * 2) / c.nbytes)
    assert (b.fp16_keys * 2) / b.storage > 2.5  # per-token storage
    assert 1 < b.compression_ratio < 2.5  # 256 tokens: the fixed rotations still weigh
    assert 4 < b.bits_per_element < 6
    assert b.codebook_share > 0 and c.tokens_seen == 256


def test_hook_routes_only_a2ats_caches(monkeypatch):
    from mlx_lm.models import llama

    from a2ats_engine.cache import hooks

    # models of other tests may still be alive (and installed): count only this test's models
    monkeypatch.setattr(hooks, "_installed", {})
    monkeypatch.setattr(llama, "scaled_dot_product_attention", hooks._ORIGINAL)
    model = tiny_model("llama")
    x = mx.array([list(range(3, 60))])
    before = model(x, cache=make_prompt_cache(model))
    make_cache(model, A2ATSConfig(), random_codebook(model))  # installs
    assert hooks.is_installed(model) and llama.scaled_dot_product_attention is hooks.dispatch
    assert hooks.install(model) >= 1  # idempotent
    after = model(x, cache=make_prompt_cache(model))
    assert float(mx.abs(before - after).max()) == 0.0  # KVCache untouched

    calls = []

    class Spy(KVCache):
        def attend(self, q, k, v, *, scale, mask):
            calls.append(q.shape)
            return mx.fast.scaled_dot_product_attention(q, k, v, scale=scale, mask=mask)

    model(x, cache=[Spy(), Spy()])
    assert len(calls) == 2 and calls[0] == (1, 4, 57, 16)
    other = tiny_model("llama")
    hooks.install(other)
    hooks.uninstall(model)
    assert llama.scaled_dot_product_attention is hooks.dispatch  # `other` still uses it
    hooks.uninstall(other)
    assert llama.scaled_dot_product_attention is not hooks.dispatch
    calls.clear()
    model(x, cache=[Spy(), Spy()])
    assert calls == []


@pytest.mark.parametrize(
    ("field", "value"),
    [("window", 0), ("budget", 0.0), ("budget", 1.5), ("budget", 0), ("kv_bits", 3),
     ("far_buckets", 0), ("sinks", -1)],
)  # fmt: skip
def test_config_validation_names_field_value_and_range(field, value):
    assert_out_of_range(A2ATSConfig, field, value)


def test_config_from_dict_ignores_unknown_keys():
    assert A2ATSConfig.from_dict({**A2ATSConfig().to_dict(), "unknown": 1}) == A2ATSConfig()


def test_config_names_the_settings_it_ignores():
    assert A2ATSConfig(far_buckets=1).unused_settings() == {}
    unused = A2ATSConfig(far_buckets=4, far_offset=1024).unused_settings()
    assert list(unused) == ["far_offset"] and "far_buckets = 4" in unused["far_offset"]


def test_telemetry_sends_a_keyframe_then_only_the_new_codes():
    model = tiny_model("llama")
    config = A2ATSConfig(window=16, sinks=4, budget=8, telemetry=True)
    cache = make_cache(model, config, random_codebook(model))
    hist = None

    def check(snap, keyframe):
        nonlocal hist
        for layer, c in zip(snap.layers, cache, strict=True):
            codes = np.array(c.codes[0, :, : layer.offset, 0])
            want = np.stack([np.bincount(h, minlength=64) for h in codes])
            if keyframe:
                assert layer.new_codes is None and len(layer.code_counts) == 2
                got = np.stack(layer.code_counts)
            else:
                assert layer.code_counts == () and [len(n) for n in layer.new_codes] == [1, 1]
                got = hist[layer.layer] + np.stack(
                    [np.bincount(n, minlength=64) for n in layer.new_codes]
                )
            assert np.array_equal(got, want)
            hist[layer.layer] = got

    model(mx.array([list(range(3, 203))]), cache=cache)  # prefill
    hist = {}
    for i, keyframe in enumerate([True, False, False]):
        model(mx.array([[5 + i]]), cache=cache)
        check(snapshot(cache), keyframe)
    assert snapshot(cache).layers[0] is cache[0].last_stats  # taking it twice: the same record
    for c in cache:
        c.trim(3)
    model(mx.array([[9]]), cache=cache)
    check(snapshot(cache), keyframe=True)  # after a trim: a keyframe
    model(mx.array([[10]]), cache=cache)
    model(mx.array([[11]]), cache=cache)  # a step nobody took: its code comes with the next
    snap = snapshot(cache)
    assert [len(n) for n in snap.layers[0].new_codes] == [2, 2]
    for c in cache:
        c.state = c.state
    model(mx.array([[12]]), cache=cache)
    check(snapshot(cache), keyframe=True)  # after a restore: a keyframe


def test_fidelity_uses_the_layers_scale_and_every_batch_row():
    config = A2ATSConfig(window=16, sinks=4, budget=8, telemetry=True, fidelity_every=1)
    scale = 0.05  # not head_dim ** -0.5, as for Gemma's query_pre_attn_scalar
    cache, _, rope = filled_cache(n=300, config=config)
    _, q_post = decode_query(rope, 2, 299, seed=3)
    cache.attend(q_post, None, None, scale=scale)
    stats = cache.last_stats
    keys = np.array(cache.keys[0, 0, :300, :])
    logits = np.array(q_post[0, :, 0, :]) @ keys.T * scale  # [2, 300]
    probs = np.exp(logits - logits.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    want = probs[:, stats.selected[0]].sum(-1).mean()
    assert stats.recall[0] == pytest.approx(want, rel=1e-5)

    # two batch rows with other queries: the mean of each row's own recall
    rows = [decode_query(rope, 2, 299, seed=s)[1] for s in (3, 4)]
    single = []
    for q in rows:
        one, _, _ = filled_cache(n=300, config=config)
        one.attend(q, None, None, scale=scale)
        single.append(one.last_stats.recall[0])
    assert abs(single[0] - single[1]) > 1e-3
    one, _, _ = filled_cache(n=300, config=config)
    k, v = one.keys[..., :300, :], one.values[..., :300, :]
    both = A2ATSCache(0, rope, one.codebook, config, max_context=8192)
    both.update_and_fetch(mx.concatenate([k, k]), mx.concatenate([v, v]))
    both.attend(mx.concatenate(rows), None, None, scale=scale)
    assert both.last_stats.recall[0] == pytest.approx(np.mean(single), rel=1e-5)


def test_snapshot_counts_the_codebook_once_and_rotations_in_the_layer():
    model = tiny_model("llama", hidden_size=256)
    book = random_codebook(model)
    cache = make_cache(model, A2ATSConfig(telemetry=True), book)
    model(mx.array([list(range(3, 259))]), cache=cache)
    model(mx.array([[5]]), cache=cache)
    snap = snapshot(cache)
    # one codebook shared by every layer (and every chat of the model): counted once
    assert snap.codebook_bytes == book.nbytes > 0
    assert snap.bytes_total == snap.bytes_held + snap.native_bytes + book.nbytes
    c = cache[0]
    assert (
        snap.layers[0].bytes_held
        == c.nbytes
        == layer_bytes(c).storage + c.rotations.nbytes + c.retrieval.estimate_bytes
    )
    # a second chat of the same model shares the codebook
    other = make_cache(model, A2ATSConfig(telemetry=True), book)
    assert model_codebook_bytes(cache + other) == book.nbytes


def test_the_mlx_retrieved_count_stays_right_across_its_periodic_evaluation():
    lay = att.layout(500, 16, 4, 12)
    rng = np.random.default_rng(1)
    host, device = NumpyTopK(), MlxTopK()
    for _ in range(2 * MlxTopK.COUNT_EVERY + 3):  # through two evaluations of the counter
        top = rng.integers(0, 60, (1, 2, 3, 12)).astype(np.int32)
        host.select(top, lay)
        device.select(mx.array(top), lay)
    assert device._uncounted == 3
    assert device.retrieved == host.retrieved > 0
