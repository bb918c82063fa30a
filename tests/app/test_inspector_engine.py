"""The inspector fed by a real tiny-model A2ATS run: what it shows and exports is the cache's own."""

from __future__ import annotations

import numpy as np
import pytest
from tiny import tiny_model, tiny_tokenizer

from a2ats_engine.cache.codebook import Codebook
from a2ats_engine.cache.config import A2ATSConfig
from a2ats_engine.cache.telemetry import CacheSnapshot, GenerationStats, TokenEvent
from a2ats_engine.session import ChatSession, SamplingSettings
from app.inspector import InspectorPanel, data, export

from .test_inspector_data import assert_same_snapshots

PROMPT = (
    "The capital of France is Paris. The quick brown fox jumps over the lazy dog. "
    "Hello! How are you today? I am fine, thank you. Numbers: 0123456789."
)


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    """(session, events) of one reply with telemetry, the missed-attention estimate and a
    fidelity pass every 2 steps."""
    tokenizer = tiny_tokenizer(tmp_path_factory.mktemp("tok"))
    model = tiny_model("llama")
    config = A2ATSConfig(
        window=8, sinks=2, budget=4, telemetry=True, fidelity_every=2, estimate_missed=True
    )
    codebook = Codebook.random(2, 2, 16, 32, seed=3)
    sampling = SamplingSettings(temperature=0.0, max_tokens=8)
    with pytest.warns(UserWarning):  # a random codebook carries no model fingerprint
        session = ChatSession(model, tokenizer, sampling=sampling, a2ats=config, codebook=codebook)
        events = list(session.send(PROMPT))
    return session, events


def _panel_after(qtbot, snapshots, finished: bool = True) -> InspectorPanel:
    """A shown panel that was fed `snapshots` as one generation (still running unless
    `finished`)."""
    panel = InspectorPanel()
    qtbot.addWidget(panel)
    panel.resize(900, 1000)
    panel.show()
    panel.on_generation_started()
    for snap in snapshots:
        panel.on_snapshot(snap)
    if finished:
        panel.on_generation_finished()
    return panel


def test_panel_shows_and_exports_the_cache_selection(qtbot, tmp_path, tiny_run):
    session, events = tiny_run
    snapshots = [e for e in events if isinstance(e, CacheSnapshot)]
    tokens = [e for e in events if isinstance(e, TokenEvent)]
    assert isinstance(events[-1], GenerationStats) and len(snapshots) == len(tokens) >= 4

    panel = _panel_after(qtbot, snapshots)
    panel.flush()

    # the newest snapshot is the caches' own last step
    last = panel.viewed_snapshot()
    assert last is snapshots[-1]
    for layer, cache in zip(last.layers, session.caches, strict=True):
        assert layer is cache.last_stats
        assert layer.offset == cache.offset == session.context_tokens
    assert not any(layer.exact for layer in last.layers)  # the prompt outgrows sinks + window

    # the map draws exactly the selection the cache attended to
    image = panel.map_panel.full_image()
    assert image.shape == (len(last.layers), last.offset)
    for row, layer in enumerate(last.layers):
        union = np.unique(np.concatenate(layer.selected))
        far = union[(union >= layer.sinks) & (union < layer.window_start)]
        assert far.size > 0
        assert np.flatnonzero(image[row] == data.RETRIEVED).tolist() == far.tolist()
        assert (image[row, : layer.sinks] == data.SINK).all()
        assert (image[row, layer.window_start : layer.offset - 1] == data.WINDOW).all()

    # recall from the shadow pass shows in the fidelity strip (steps 0, 2, 4, ...)
    assert panel.fidelity_panel.showing_strip
    measured = [s for s in snapshots if data.has_recall(s)]
    assert panel.fidelity_panel.matrix.shape == (2, len(measured))
    assert all(0.0 <= r <= 1.0 for s in measured for layer in s.layers for r in layer.recall)

    # memory figures are the caches' byte counts plus the model's codebook (counted once)
    held = sum(c.nbytes for c in session.caches) + session.caches[0].codebook.nbytes
    assert panel.memory_panel.last_summary.total_held == held

    # export -> reload gives the same records, and its selection is the cache's
    path = panel.export_telemetry(tmp_path / "telemetry.json")
    reloaded, _ = export.load_telemetry(path)
    assert_same_snapshots(snapshots, reloaded)
    for layer, cache in zip(reloaded[-1].layers, session.caches, strict=True):
        for mine, theirs in zip(layer.selected, cache.last_stats.selected, strict=True):
            assert np.array_equal(mine, theirs)


def test_codebook_panel_shows_the_caches_histograms_from_new_codes(qtbot, tiny_run):
    session, events = tiny_run
    snapshots = [e for e in events if isinstance(e, CacheSnapshot)]
    assert snapshots[0].layers[0].new_codes is None  # a keyframe after the prefill
    assert all(layer.new_codes is not None for s in snapshots[1:] for layer in s.layers)
    panel = InspectorPanel()
    qtbot.addWidget(panel)
    panel.resize(900, 1000)
    panel.show()
    for snap in snapshots:
        panel.on_snapshot(snap)
    panel.flush(force=True)
    stats = panel.codebook_panel.table_stats()
    for layer, cache, st in zip(snapshots[-1].layers, session.caches, stats, strict=True):
        codes = np.array(cache.codes[0, :, : layer.offset, 0])
        want = [np.bincount(h, minlength=32) for h in codes]
        shown = panel.state.entry(histograms=True).snapshot.layers[layer.layer].code_counts
        assert all(np.array_equal(a, b) for a, b in zip(shown, want, strict=True))
        assert st.tokens == layer.offset


def test_fidelity_panel_shows_the_engines_estimated_missed_mass(qtbot, tmp_path, tiny_run):
    session, events = tiny_run
    snapshots = [e for e in events if isinstance(e, CacheSnapshot)]
    panel = _panel_after(qtbot, snapshots, finished=False)
    panel.flush(force=True)
    last = snapshots[-1]
    view = panel.fidelity_panel.estimate
    # estimate_missed is on in this run: every retrieval step carries the cache's estimate
    assert all(layer.missed_mass is not None for layer in last.layers)
    want = [np.mean(cache.last_stats.missed_mass) for cache in session.caches]
    xs, ys = view.layer_estimate.getData()
    assert xs.tolist() == [layer.layer for layer in last.layers]
    assert ys == pytest.approx(want)
    steps, means = view.step_estimate.getData()
    assert steps.tolist() == [s.step for s in snapshots]
    assert means[-1] == pytest.approx(np.mean(want))
    # beside it, the shadow pass's measurement of the latest measured step (1 - recall)
    measured = [s for s in snapshots if data.has_recall(s)][-1]
    _, got = view.layer_measured.getData()
    assert got == pytest.approx([1 - np.mean(layer.recall) for layer in measured.layers])
    assert "estimated missed mass" in view.info.text() and "A2ATS retrieving" in view.info.text()
    # no coverage in this config: the budget is fixed and said so, not drawn
    assert not view.showing_budget_heatmap and view.budget_note.text().startswith("fixed budget K")
    assert panel.fidelity_panel.grab().save(str(tmp_path / "fidelity.png"))
