"""`StepSums`: the synced host step's estimate sums of a model's layers, moved for all at once,
give the same sums and the same decode as each layer's own `SlotRows` (the graph step holds its
sums in C++: tests/engine/cache/test_graph_step.py)."""

import mlx.core as mx
import numpy as np
import pytest
from tiny import made_for, tiny_model

from a2ats_engine.cache import native_step, topk
from a2ats_engine.cache.a2ats_cache import A2ATSCache
from a2ats_engine.cache.codebook import Codebook
from a2ats_engine.cache.config import A2ATSConfig
from a2ats_engine.cache.geometry import model_geometry
from a2ats_engine.cache.model_cache import make_cache
from a2ats_engine.cache.slot_rows import SlotRows
from a2ats_engine.cache.step_sums import LayerRows, StepSums


@pytest.fixture(autouse=True)
def synced_step():
    """StepSums are the synced step's (`host_step.missed_sums`)."""
    with native_step.forced("native"):
        yield


def caches_for(model, book, scores: str, shared: bool) -> list:
    config = A2ATSConfig(
        window=16, sinks=4, budget=8, far_buckets=4, exact_below=0, estimate_missed=True,
        estimate_scores=scores,
    )  # fmt: skip
    with topk.forced("numpy"):
        caches = make_cache(model, config, book)
    own = [c for c in caches if isinstance(c, A2ATSCache)]
    assert len({id(c.step_sums) for c in own}) == 1 and own[0].step_sums is not None
    if not shared:
        for c in own:
            c.step_sums = None
    return caches


def decode(model, caches, prompt, steps: int) -> np.ndarray:
    logits = model(mx.array([prompt]), cache=caches)
    out = []
    for _ in range(steps):
        token = int(mx.argmax(logits[0, -1]).item())
        logits = model(mx.array([[token]]), cache=caches)
        out.append(np.array(logits[0, -1]))
    return np.stack(out)


def sums_of(caches) -> list:
    """(context, dense counts, dense sums) of each A2ATS layer's host-step sums."""
    got = []
    for c in caches:
        if isinstance(c, A2ATSCache):
            n, rows = c.retrieval.host_missed
            got.append((n, *rows.dense()))
    return got


@pytest.mark.parametrize("scores", ["mean", "centroid"])
def test_shared_sums_equal_each_layers_own_through_edges_trim_and_prefill(scores):
    """A tiny llama decoding 60 steps from 200 tokens (far tokens crossing bucket edges), then
    trimmed and fed a second prompt: the layers' stacked sums (moved once a step for all) equal
    each layer's own rows at every check, and so do the logits; each layer reads its own part,
    and the parts' bytes add up to the stacked rows'."""
    model = tiny_model("llama", num_hidden_layers=3)
    geo = model_geometry(model)
    book = made_for(model, Codebook.random(geo.num_layers, geo.num_kv_heads, geo.head_dim, 16))
    prompt = [(7 * i) % 97 + 3 for i in range(200)]
    runs = {}
    for shared in (True, False):
        caches = caches_for(model, book, scores, shared)
        first = decode(model, caches, prompt, 60)
        at_60 = sums_of(caches)
        for c in caches:
            c.trim(30)
        second = decode(model, caches, [5, 9, 11, 13], 12)
        runs[shared] = (caches, first, second, at_60, sums_of(caches))
    caches, *shared_run = runs[True]
    _, *own_run = runs[False]
    np.testing.assert_allclose(shared_run[0], own_run[0], rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(shared_run[1], own_run[1], rtol=1e-4, atol=1e-4)
    for got, want in zip(shared_run[2] + shared_run[3], own_run[2] + own_run[3], strict=True):
        assert got[0] == want[0]
        np.testing.assert_allclose(got[1], want[1], atol=1e-4)
        np.testing.assert_allclose(got[2], want[2], atol=1e-4)
    parts = [c.retrieval.host_missed[1] for c in caches if isinstance(c, A2ATSCache)]
    assert all(isinstance(p, LayerRows) for p in parts)
    shared = caches[0].step_sums
    assert shared.rebuilds == 2 and shared.moved_steps == 59 + 11  # the prefills, then moves
    assert len({id(p.rows) for p in parts}) == 1  # one stacked SlotRows
    assert sum(p.nbytes for p in parts) == pytest.approx(parts[0].rows.nbytes, abs=len(parts))
    own_parts = [c.retrieval.host_missed[1] for c in runs[False][0] if isinstance(c, A2ATSCache)]
    assert all(isinstance(p, SlotRows) for p in own_parts)


def test_layers_differing_in_the_estimate_geometry_keep_their_own_sums():
    """Only layers whose sums can be stacked share: different windows (so different moves) or
    a layer without the estimate do not join."""
    model = tiny_model("llama", num_hidden_layers=5)
    geo = model_geometry(model)
    book = made_for(model, Codebook.random(geo.num_layers, geo.num_kv_heads, geo.head_dim, 16))
    with topk.forced("numpy"):
        caches = make_cache(model, A2ATSConfig(estimate_missed=True), book)
    own = [c for c in caches if isinstance(c, A2ATSCache)]
    for c in own:
        c.step_sums = None
    own[0].config = A2ATSConfig(window=32, estimate_missed=True)
    own[1].estimates = False
    StepSums.join(caches)
    assert own[0].step_sums is None and own[1].step_sums is None
    rest = {id(c.step_sums) for c in own[2:]}
    assert len(own) > 3 and len(rest) == 1 and None not in rest


def test_a_member_whose_rows_cannot_be_read_sends_every_layer_to_its_own_sums():
    """A member with its rows not readable on the host (here: too few tokens for the step's far
    region) makes `rows_for` decline for the step; the host step then keeps per-layer rows."""
    model = tiny_model("llama")
    geo = model_geometry(model)
    book = made_for(model, Codebook.random(geo.num_layers, geo.num_kv_heads, geo.head_dim, 16))
    caches = caches_for(model, book, "mean", True)
    decode(model, caches, list(range(3, 120)), 2)
    own = [c for c in caches if isinstance(c, A2ATSCache)]
    shared = own[0].step_sums
    own[-1].offset = 10  # holds fewer tokens than the far region of the next step
    from a2ats_engine.cache import attention as att

    lay = att.layout(own[0].offset + 1, 16, 4, 8)
    assert shared.rows_for(own[0], lay) is None and shared.n is None


def test_a_restored_session_shares_its_layers_sums_and_decodes_as_before(tmp_path):
    """A session saved and loaded back (`persist`) gives its A2ATS layers one StepSums as
    `make_cache` does, and decodes the same tokens' logits as the caches it was saved from."""
    from a2ats_engine.cache.persist import load_session, save_session

    model = tiny_model("llama", num_hidden_layers=3)
    geo = model_geometry(model)
    book = made_for(model, Codebook.random(geo.num_layers, geo.num_kv_heads, geo.head_dim, 16))
    caches = caches_for(model, book, "mean", True)
    decode(model, caches, [(5 * i) % 89 + 2 for i in range(150)], 3)
    save_session(tmp_path / "s.safetensors", caches)
    with topk.forced("numpy"):
        restored, _ = load_session(tmp_path / "s.safetensors", model=model, codebook=book)
    own = [c for c in restored if isinstance(c, A2ATSCache)]
    assert own[0].step_sums is not None and len({id(c.step_sums) for c in own}) == 1
    want = np.array(model(mx.array([[17]]), cache=caches))
    got = np.array(model(mx.array([[17]]), cache=restored))
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    assert own[0].step_sums.rebuilds == 1  # its first step rebuilt every layer's sums at once
