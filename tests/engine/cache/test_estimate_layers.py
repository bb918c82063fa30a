"""The missed-attention estimate on the layers that miss most (`estimate_layers.py`): the choice
after the warm-up, what the measurement affords (`crossover.affordable_layers`), and what the
probe records."""

import mlx.core as mx
import numpy as np
import pytest
from tiny import made_for, tiny_model

from a2ats_engine.cache import crossover as xo
from a2ats_engine.cache import topk
from a2ats_engine.cache.a2ats_cache import A2ATSCache
from a2ats_engine.cache.codebook import Codebook
from a2ats_engine.cache.config import A2ATSConfig
from a2ats_engine.cache.estimate_layers import WARMUP, EstimateLayers
from a2ats_engine.cache.geometry import model_geometry
from a2ats_engine.cache.model_cache import make_cache

from .test_crossover import row

PROMPT = [(7 * i) % 97 + 3 for i in range(200)]
TOKENS = [(11 * i) % 89 + 5 for i in range(WARMUP + 6)]


def model_and_book(layers: int = 4):
    model = tiny_model("llama", num_hidden_layers=layers)
    geo = model_geometry(model)
    return model, made_for(
        model, Codebook.random(geo.num_layers, geo.num_kv_heads, geo.head_dim, 16)
    )


def config(**kw) -> A2ATSConfig:
    return A2ATSConfig(window=16, sinks=4, budget=8, exact_below=0, estimate_missed=True, **kw)


def own(caches) -> list[A2ATSCache]:
    return [c for c in caches if isinstance(c, A2ATSCache)]


def teacher_forced(model, caches, steps: int, each=None) -> np.ndarray:
    """The prompt, then `steps` fixed tokens one at a time; `each(caches)` after every step."""
    model(mx.array([PROMPT]), cache=caches)
    out = []
    for token in TOKENS[:steps]:
        out.append(np.array(model(mx.array([[token]]), cache=caches)[0, -1]))
        if each is not None:
            each(caches)
    return np.stack(out)


@pytest.mark.parametrize("strategy", ["numpy", "mlx"])
def test_the_layers_that_miss_most_keep_the_estimate_after_the_warm_up(strategy):
    """Until the choice every layer runs the estimate (the same logits as the estimate on all
    of them); then the two layers with the highest mean estimated missed share over the warm-up
    keep it, the others drop it and their sums, and the kept ones share one StepSums."""
    model, book = model_and_book()
    shares: dict[int, list[float]] = {}

    def record(caches):
        for c in own(caches):
            shares.setdefault(c.layer, []).append(
                float(np.mean(np.array(c.retrieval.missed_share)))
            )

    with topk.forced(strategy):
        everywhere = make_cache(model, config(), book)
        want = teacher_forced(model, everywhere, WARMUP, record)
        caches = make_cache(model, config(estimate_layers=2), book)
    choice = own(caches)[0].estimate_choice
    assert isinstance(choice, EstimateLayers) and choice.count == 2
    got = teacher_forced(model, caches, WARMUP + 6)
    np.testing.assert_allclose(got[:WARMUP], want, rtol=1e-4, atol=1e-4)
    means = {layer: np.mean(s) for layer, s in shares.items()}
    top = tuple(sorted(sorted(means, key=lambda layer: -means[layer])[:2]))
    assert choice.chosen == top and len(set(means.values())) == len(means)
    for c in own(caches):
        kept = c.layer in top
        assert c.estimates is kept
        assert (c.retrieval.missed_share is not None) is kept  # the inspector's missed mass
        assert (c.retrieval.estimate_bytes > 0) is kept
    if strategy == "numpy":
        kept = [c for c in own(caches) if c.layer in top]
        assert kept[0].step_sums is not None and kept[0].step_sums is kept[1].step_sums
        assert kept[0].step_sums.members == kept
        assert all(getattr(c, "step_sums", None) is None for c in own(caches) if c.layer not in top)


def test_without_a_count_or_with_one_covering_every_layer_there_is_no_choice():
    model, book = model_and_book(3)
    for cfg in (config(), config(estimate_layers=3), config(estimate_layers=9)):
        caches = make_cache(model, cfg, book)
        assert all(getattr(c, "estimate_choice", None) is None for c in own(caches))
    with pytest.raises(ValueError, match="estimate_layers"):
        A2ATSConfig(estimate_layers=0)


@pytest.mark.parametrize(
    "ratio, layers, want",
    [(0.99, 30, 30), (0.95, 30, 30), (0.89, 30, 13), (0.85, 30, 10), (0.9, 3, 1), (0.8, 3, 0),
     (0.2, 30, 1), (0.0, 30, 1), (0.94, 1, 0)],
)  # fmt: skip
def test_affordable_layers_spends_the_free_share_on_as_many_layers_as_fit(ratio, layers, want):
    assert xo.affordable_layers(ratio, layers) == want
    if want:  # the estimate on `want` layers, each costing the same, stays within the bar
        assert 1 - want * (1 - ratio) / layers >= xo.ESTIMATE_FREE - 1e-9 or want == layers


@pytest.fixture
def cpu(monkeypatch):
    monkeypatch.setattr(xo, "backend", lambda: "cpu")


def test_a_row_that_affords_some_layers_turns_the_estimate_on_for_them(table, cpu):
    """The probe's `estimate.layers` (bounded by the row's A2ATS layers) turns the default on
    where the estimate on every layer did not pay; `make_cache` then weighs the layers."""
    model, book = model_and_book()
    geo = model_geometry(model)
    geometry = (geo.num_layers, geo.num_kv_heads, geo.head_dim)
    est = {"ratio": 0.9, "layers": 2}
    cfg = A2ATSConfig(window=16, sinks=4, budget=8)
    kind = {"step": xo.step_kind(cfg), "a2ats_layers": 4}
    xo.record_crossover(row(0, geometry=geometry, estimate=est, **kind))
    found = xo.lookup_crossover(*geometry, kind["step"])
    assert found.estimate_on and found.estimate_layers == 2
    assert xo.measured_estimate_layers(*geometry, kind["step"]) == 2
    text = xo.describe_crossover(*geometry, "tiny", kind=kind["step"])
    assert "estimate on the 2 layers that miss most by default" in text
    caches = make_cache(model, cfg, book)
    assert all(c.estimates for c in own(caches))
    assert own(caches)[0].estimate_choice.count == 2
    for bad in (-1, True, "2", 1.5):  # malformed: the ratio alone decides (0.9: off)
        xo.record_crossover(row(0, geometry=geometry, estimate={**est, "layers": bad}, **kind))
        assert xo.lookup_crossover(*geometry, kind["step"]).estimate_layers is None
        assert not xo.measured_estimate(*geometry, kind["step"])
    xo.record_crossover(row(0, geometry=geometry, estimate={"ratio": 0.9, "layers": 0}, **kind))
    assert not xo.measured_estimate(*geometry, kind["step"])
    xo.record_crossover(row(0, geometry=geometry, estimate={"ratio": 0.97, "layers": 4}, **kind))
    assert xo.measured_estimate_layers(*geometry, kind["step"]) is None  # every layer
    caches = make_cache(model, cfg, book)
    assert all(c.estimates and getattr(c, "estimate_choice", None) is None for c in own(caches))


def test_a_chat_names_on_how_many_layers_the_estimate_runs():
    from a2ats_engine.cache.config import describe_retrieval

    auto = A2ATSConfig()
    assert "on the 11 layers that miss most: what its measured cost affords here" in (
        describe_retrieval(auto, 1, True, 11)
    )
    assert "measured to cost nothing here)" in describe_retrieval(auto, 1, True, None)
    asked = describe_retrieval(A2ATSConfig(estimate_missed=True, estimate_layers=4), 1)
    assert "on the 4 layers that miss most)" in asked and "affords" not in asked
    assert "estimate" not in describe_retrieval(A2ATSConfig(estimate_missed=False), 1, True, 11)
    assert xo.step_kind(config(estimate_layers=4)).endswith("estimate mean on 4 layers")
    assert xo.step_kind(config()).endswith("estimate mean")


def test_a_restored_session_weighs_its_layers_again(tmp_path):
    """The choice is not saved: a session loaded back runs the estimate on every layer for its
    first retrieval steps and then chooses again (`persist.load_session` joins its caches)."""
    from a2ats_engine.cache.persist import load_session, save_session

    model, book = model_and_book(3)
    with topk.forced("numpy"):
        caches = make_cache(model, config(estimate_layers=1), book)
        teacher_forced(model, caches, WARMUP + 1)
        assert own(caches)[0].estimate_choice.chosen is not None
        save_session(tmp_path / "s.safetensors", caches)
        restored, _ = load_session(tmp_path / "s.safetensors", model=model, codebook=book)
    choice = own(restored)[0].estimate_choice
    assert choice.chosen is None and all(c.estimates for c in own(restored))
    with topk.forced("numpy"):
        for token in TOKENS[:WARMUP]:
            model(mx.array([[token]]), cache=restored)
    assert len(choice.chosen) == 1 and sum(c.estimates for c in own(restored)) == 1


def test_a_member_that_never_retrieves_does_not_hold_the_choice_up(monkeypatch):
    """A layer that attends exactly at every step (a dense layer) reports no share: the choice
    is made when the others have reported the warm-up, and that layer is not kept."""
    from types import SimpleNamespace

    from a2ats_engine.cache import estimate_layers

    joined = []
    monkeypatch.setattr(estimate_layers.StepSums, "join", staticmethod(joined.append))

    def member(layer):
        retrieval = SimpleNamespace(forget_estimate=lambda: None)
        return SimpleNamespace(layer=layer, estimates=True, retrieval=retrieval, step_sums=None)

    members = [member(i) for i in range(3)]
    choice = EstimateLayers(members, 1)
    for step in range(WARMUP):
        for m, share in zip(members[:2], (0.1, 0.3), strict=True):  # layer 2 never reports
            assert choice.chosen is None
            choice.report(m, mx.full((1, 2, 3), share + step / 100))
    assert choice.chosen == (1,) and joined == [[members[1]]]
    assert [m.estimates for m in members] == [False, True, False]
