"""Telemetry made when it is read (`layer_stats.StepRecord`), the inspector's shadow selection
through the C++ step (`host_step.shadow`) and its recall in C++ (`native_step.recall`)."""

import mlx.core as mx
import numpy as np
import pytest

from a2ats_engine.cache import host_step, layer_stats, native_step, topk
from a2ats_engine.cache.config import A2ATSConfig

from .test_cache import D, decode_query, filled_cache
from .test_exact_below import step

SHADOWED = dict(window=16, sinks=4, budget=8, telemetry=True, exact_below=10_000)


def test_a_steps_stats_are_made_when_first_read(monkeypatch):
    """The step keeps what its stats are made from and computes nothing; the first read makes
    them (the shadow selection once), later reads return the same record."""
    made = []
    monkeypatch.setattr(
        layer_stats, "_make", lambda *a, m=layer_stats._make: made.append(1) or m(*a)
    )
    cache, _, _ = filled_cache(n=200, config=A2ATSConfig(**SHADOWED))
    step(cache, np.random.default_rng(0))
    assert made == [] and cache.step_record.pending is not None
    stats = cache.last_stats
    assert made == [1] and cache.step_record.pending is None
    assert stats.exact and stats.offset == 201 and stats.would_retrieve is not None
    assert cache.last_stats is stats and made == [1]
    assert cache.take_stats().would_retrieve is stats.would_retrieve  # the snapshot's, codes added
    step(cache, np.random.default_rng(1))  # a step nobody reads: replaced by the next
    step(cache, np.random.default_rng(2))
    assert cache.last_stats.offset == 203 and made == [1, 1]


def test_trim_makes_the_last_steps_stats_before_it_drops_their_keys():
    kept, _, _ = filled_cache(n=200, config=A2ATSConfig(**SHADOWED))
    trimmed, _, _ = filled_cache(n=200, config=A2ATSConfig(**SHADOWED))
    for cache in (kept, trimmed):
        step(cache, np.random.default_rng(0))
    assert trimmed.trim(150) == 150
    other = np.random.default_rng(9).standard_normal((2, 1, 1, 160, D)).astype(np.float32)
    trimmed.update_and_fetch(mx.array(other[0]), mx.array(other[1]))  # new rows where they were
    want, got = kept.last_stats, trimmed.last_stats
    assert got.offset == want.offset == 201 and got.recall == want.recall
    for a, b in zip(got.would_retrieve, want.would_retrieve, strict=True):
        assert a.tolist() == b.tolist()


def step_heads(cache, n_kv: int, seed: int) -> None:
    """`step` for a cache of n_kv KV heads (two query heads each)."""
    rng = np.random.default_rng(seed)
    kv = [mx.array(rng.standard_normal((1, n_kv, 1, D)).astype(np.float32)) for _ in range(2)]
    cache.update_and_fetch(*kv)
    n = cache.offset
    _, q = decode_query(cache.rope, 2 * n_kv, n - 1, seed=n)
    cache.attend(q, cache.keys[..., :n, :], cache.values[..., :n, :], scale=D**-0.5)


@pytest.mark.parametrize("n_kv", [1, 2])
def test_the_host_shadow_is_the_generic_shadow(monkeypatch, n_kv):
    """The C++ step's selection and the C++ recall give what the MLX step's shadow gives (the
    same far tokens, the same recall up to float rounding), with one C++ call of each."""
    calls = []
    for name in ("run", "recall"):
        real = getattr(native_step, name)
        monkeypatch.setattr(
            native_step, name, lambda *a, _r=real, _n=name, **k: calls.append(_n) or _r(*a, **k)
        )
    stats = {}
    for strategy in ("numpy", "mlx"):  # NumPy's top-K: the host step's shadow
        with topk.forced(strategy):
            cache, _, _ = filled_cache(n=300, n_kv=n_kv, config=A2ATSConfig(**SHADOWED))
        step_heads(cache, n_kv, 3)
        stats[strategy] = cache.last_stats
    assert calls == ["run", "recall"]
    host, generic = stats["numpy"], stats["mlx"]
    assert len(host.would_retrieve) == n_kv
    for a, b in zip(host.would_retrieve, generic.would_retrieve, strict=True):
        assert a.tolist() == b.tolist() and 0 < len(a) < host.offset
    assert host.recall == pytest.approx(generic.recall, abs=1e-6)
    assert all(0 < r < 1 for r in host.recall)


def test_the_native_recall_is_the_attention_mass_on_the_selection():
    rng = np.random.default_rng(0)
    B, n_kv, G, cap, n, M = 2, 2, 3, 40, 33, 9
    q = rng.standard_normal((B, n_kv, G, D)).astype(np.float32)
    keys = rng.standard_normal((B, n_kv, cap, D)).astype(np.float32)
    positions = rng.integers(0, n, (B, n_kv, M)).astype(np.int32)
    repeat = np.zeros((B, n_kv, M), bool)
    repeat[..., 3] = True  # a GQA union's repeat is not counted
    scale = D**-0.5
    got = native_step.recall(q, keys, n, positions, repeat, scale)
    logits = np.einsum("bhgd,bhnd->bhgn", q.astype(np.float64), keys[:, :, :n]) * scale
    p = np.exp(logits - logits.max(axis=-1, keepdims=True))
    p /= p.sum(axis=-1, keepdims=True)
    want = np.zeros((B, n_kv))
    for b in range(B):
        for h in range(n_kv):
            kept = positions[b, h][~repeat[b, h]]  # a position twice counts twice, as in MLX's
            want[b, h] = p[b, h][:, kept].sum(axis=-1).mean()
    assert got.shape == (B, n_kv) and got == pytest.approx(want, rel=1e-5)
    positions[1, 0, 2] = n  # a row not held
    with pytest.raises(ValueError, match="outside the 33 rows held"):
        native_step.recall(q, keys, n, positions, repeat, scale)
    with pytest.raises(ValueError, match="shapes"):
        native_step.recall(q, keys, cap + 1, positions, repeat, scale)
    with pytest.raises(ValueError, match="C-contiguous"):
        native_step.recall(q, keys[:, :, ::2], n // 2, positions // 2, repeat, scale)
    with pytest.raises(ValueError, match="queries are not float32"):
        native_step.recall(q.astype(np.float16), keys, n, positions // 2, repeat, scale)


@pytest.mark.parametrize("strategy", ["native", "graph"])
def test_the_host_step_hands_its_selection_as_numpy_copies(monkeypatch, strategy):
    """The positions the synced host step returns are its own copies (new arrays each call),
    and the telemetry reads them without MLX; the graph step's are its lazy outputs, new each
    step, which the telemetry reads once the step was evaluated."""
    monkeypatch.setattr(native_step, "_forced", strategy)
    config = A2ATSConfig(window=16, sinks=4, budget=8, telemetry=True, exact_below=0)
    cache, _, _ = filled_cache(n=300, config=config)
    assert host_step.applies(cache, mx.zeros((1, 2, 1, D)))
    seen, real = [], layer_stats.record_step

    def record(c, lay, positions, repeat, *rest):
        seen.append((positions, repeat))
        real(c, lay, positions, repeat, *rest)

    monkeypatch.setattr(layer_stats, "record_step", record)
    for seed in (0, 1):
        step(cache, np.random.default_rng(seed))
    (p0, r0), (p1, r1) = seen
    if strategy == "graph":
        assert all(isinstance(a, mx.array) for a in (p0, r0, p1, r1)) and p0 is not p1
        p0, r0, p1, r1 = (np.array(a) for a in (p0, r0, p1, r1))
    assert isinstance(p0, np.ndarray) and isinstance(r0, np.ndarray)
    assert p0.dtype == np.int32 and r0.dtype == np.bool_
    assert not np.shares_memory(p0, p1)
    assert cache.last_stats.selected[0].tolist() == sorted(set(p1[0, 0][~r1[0, 0]].tolist()))
