"""The layer plan in the app: the status bar says how many layers use A2ATS, the retrieval map
shows native layers as labelled grey rows (never with A2ATS categories) and the memory panel
counts their bytes. Over the fake backend with a plan of 2 A2ATS + 2 native layers, and on a
real tiny Gemma 3 (sliding + global layers) and the real tiny Llama."""

from __future__ import annotations

import numpy as np

from a2ats_engine.cache.layer_plan import A2ATS, NATIVE, LayerChoice, LayerPlan
from app.inspector import data
from app.status_bar import plan_text

from .fakes import FakeBackend, make_snapshot
from .helpers import load, reply

SLIDING = "sliding window 16"
# layers 0 and 2 global (A2ATS), 1 and 3 sliding (native), like Gemma 3's interleaving
FAKE_PLAN = LayerPlan(
    "fake",
    tuple(
        LayerChoice(i, A2ATS if i % 2 == 0 else NATIVE, "" if i % 2 == 0 else SLIDING, 16, 2)
        for i in range(4)
    ),
)
NATIVE_PER_TOKEN = 50


def test_plan_text_says_plainly_how_many_layers_use_a2ats():
    demo = LayerPlan("llama", tuple(LayerChoice(i, A2ATS) for i in range(30)))
    assert plan_text(demo, True) == "A2ATS on all 30 layers"
    assert plan_text(FAKE_PLAN, True) == "A2ATS on 2 of 4 layers"
    assert plan_text(FAKE_PLAN, False) == "A2ATS off"
    assert plan_text(None, True) == ""  # unknown: nothing is claimed
    # Gemma 4's KV-shared layers have no cache of their own and attend exactly: never "all"
    shared = LayerPlan("gemma4_text", tuple(LayerChoice(i, A2ATS) for i in range(4)), None, 2)
    assert plan_text(shared, True) == "A2ATS on 4 of 6 layers"


def test_map_rows_place_native_layers_and_never_draw_a2ats_on_them():
    snap = make_snapshot(40, 3, 1000, layer_ids=(0, 2))
    rows = data.map_rows(snap, FAKE_PLAN)
    assert [(r.layer, r.stats, r.native) for r in rows] == [
        (0, 0, ""), (1, None, SLIDING), (2, 1, ""), (3, None, SLIDING)
    ]  # fmt: skip
    image = data.expand_rows(data.category_image(snap), rows)
    assert image.shape == (4, 40)
    assert not image[1].any() and not image[3].any()
    assert (image[[0, 2]] == data.category_image(snap)).all()
    assert data.native_runs(rows) == [(1, 1, SLIDING), (3, 1, SLIDING)]
    assert data.sliding_window(SLIDING) == 16 and data.sliding_window("NoPE") is None
    # a snapshot reporting a layer the plan calls native: rows are the snapshot's own only
    odd = make_snapshot(40, 3, 1000, layer_ids=(0, 1))
    assert [(r.layer, r.native) for r in data.map_rows(odd, FAKE_PLAN)] == [(0, ""), (1, "")]


def test_memory_summary_counts_native_bytes_on_both_sides():
    snap = make_snapshot(40, 3, 1000, layer_ids=(0, 2))
    plain = data.memory_summary(snap)
    with_native = data.memory_summary(
        type(snap)(snap.step, snap.layers, snap.token_id, native_bytes=1000)
    )
    assert with_native.total_held == plain.total_held + 1000
    assert with_native.total_fp16 == plain.total_fp16 + 1000


def test_the_window_shows_the_plan_in_the_status_bar_map_and_memory(make_window, qtbot):
    backend = FakeBackend(plan=FAKE_PLAN, snapshots=True, native_bytes_per_token=NATIVE_PER_TOKEN)
    window = make_window(backend, inspector=True)
    load(qtbot, window)
    assert window.status.plan.text() == "A2ATS on 2 of 4 layers"
    reply(qtbot, window, "hello")
    inspector = window.inspector
    qtbot.waitUntil(lambda: inspector.map_panel.full_image().shape[0] == 4, timeout=5000)
    inspector.flush(force=True)
    panel = inspector.map_panel
    image = panel.full_image()
    assert not image[1].any() and not image[3].any()  # native rows carry no A2ATS category
    assert image[0].any() and image[2].any()
    assert panel.layer_axis.layer_ids == [0, 1, 2, 3]
    assert panel.native_labels() == [f"{SLIDING}, native"] * 2
    assert "native" in panel.describe(1, 5) and "retrieved" not in panel.describe(1, 5)
    assert panel.describe(0, 5).startswith("layer 0")
    assert "A2ATS on 2 of 4 layers" in panel.summary.text()
    offset = inspector.state.entry().snapshot.offset
    summary = inspector.memory_panel.last_summary
    assert summary.native == NATIVE_PER_TOKEN * offset
    assert "native layers" in inspector.memory_panel.summary.text()
    assert window.status.attention.text() == "A2ATS retrieving"  # the fake's steps retrieve
    window.a2ats_toggle.setChecked(False)
    assert window.status.plan.text() == "A2ATS off"
    assert window.status.attention.text() == ""
    window.a2ats_toggle.setChecked(True)
    assert window.status.plan.text() == "A2ATS on 2 of 4 layers"


def test_a_model_without_a_plan_claims_nothing(make_window, qtbot):
    window = make_window(FakeBackend(), inspector=True)
    load(qtbot, window)
    assert window.status.plan.text() == ""


def test_real_tiny_llama_says_a2ats_on_all_its_layers(make_window, qtbot, tiny_folder):
    window = make_window(None)
    load(qtbot, window, str(tiny_folder))
    layers = window.controller.model.info.num_layers
    assert window.status.plan.text() == f"A2ATS on all {layers} layers"


def test_real_tiny_gemma3_snapshot_reports_native_bytes_and_maps_sliding_rows():
    import mlx.core as mx
    from mlx_lm.models.cache import RotatingKVCache

    from a2ats_engine.cache.a2ats_cache import A2ATSCache
    from a2ats_engine.cache.codebook import Codebook
    from a2ats_engine.cache.config import A2ATSConfig
    from a2ats_engine.cache.geometry import model_geometry
    from a2ats_engine.cache.layer_plan import plan_for
    from a2ats_engine.cache.model_cache import make_cache, snapshot
    from a2ats_engine.cache.model_matrix import tiny_family_model

    model = tiny_family_model("gemma3_text")
    plan = plan_for(model)
    first = next(c for c in plan.layers if c.kind == A2ATS)
    codebook = Codebook.random(
        model_geometry(model).num_layers, first.n_kv_heads, first.head_dim, 16, seed=1
    )
    caches = make_cache(model, A2ATSConfig(window=4, sinks=2, budget=3, telemetry=True), codebook)
    prompt = mx.array([[int(t) for t in np.random.default_rng(0).integers(3, 120, size=30)]])
    logits = model(prompt, cache=caches)[0, -1]
    model(mx.array([[int(mx.argmax(logits).item())]]), cache=caches)
    snap = snapshot(caches)
    native = [c for c in caches if not isinstance(c, A2ATSCache)]
    assert native and all(isinstance(c, RotatingKVCache) for c in native)
    assert snap.native_bytes == sum(c.nbytes for c in native) > 0
    rows = data.map_rows(snap, plan)
    assert len(rows) == plan.num_layers
    for row, choice in zip(rows, plan.layers, strict=True):
        assert (row.stats is None) == (choice.kind != A2ATS)  # A2ATS rows only where A2ATS is
        assert row.native == (choice.reason if choice.kind != A2ATS else "")
    assert all(data.sliding_window(row.native) == 8 for row in rows if row.native)
    text = plan_text(plan, True)
    assert text == f"A2ATS on {len(plan.a2ats_layers)} of {plan.num_layers} layers"
    assert len(plan.a2ats_layers) < plan.num_layers


def test_native_bytes_survive_the_ring_and_the_telemetry_file():
    from dataclasses import replace

    from app.inspector.export import snapshots_from_dict, telemetry_dict
    from app.inspector.snapshot_ring import SnapshotRing

    snaps = [
        replace(make_snapshot(40 + i, i, 1000, layer_ids=(0, 2)), native_bytes=100 * (40 + i))
        for i in range(3)
    ]
    ring = SnapshotRing(8)
    for snap in snaps:
        ring.append(snap)
    assert [ring.restored(e).snapshot.native_bytes for e in ring.entries()] == [4000, 4100, 4200]
    _steps, held, fp16 = ring.byte_series(ring.current_reply).arrays()
    assert (held == [s.bytes_held + s.native_bytes for s in snaps]).all()
    assert (fp16 == [s.bytes_fp16 + s.native_bytes for s in snaps]).all()
    loaded, _replies = snapshots_from_dict(telemetry_dict(snaps))
    assert [s.native_bytes for s in loaded] == [4000, 4100, 4200]
