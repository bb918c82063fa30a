"""Inspector numbers without Qt: category maps, pooling, code statistics, ring, frequency, export."""

from __future__ import annotations

import gzip
import json
from dataclasses import replace

import numpy as np
import pytest

from a2ats_engine.cache.telemetry import CacheSnapshot, LayerStats
from app.inspector import data, export
from app.inspector.snapshot_ring import FrequencyTracker, SnapshotRing, with_histograms


def make_layer(
    *,
    offset: int = 100,
    window: int = 16,
    sinks: int = 4,
    retrieved: list[list[int]] | None = None,
    n_codes: int = 8,
    codes: list[list[int]] | None = None,
    layer: int = 0,
    step: int = 0,
    exact: bool = False,
    recall: tuple[float, ...] | None = None,
    bytes_held: int | None = None,
) -> LayerStats:
    """A hand-made LayerStats: per KV head `retrieved` far positions, `codes` per cached token."""
    retrieved = retrieved if retrieved is not None else [[20, 30], [30, 50]]
    window_start = max(sinks, offset - window)
    head_sel = []
    for far in retrieved:
        if exact:
            sel = np.arange(offset)
        else:
            sel = np.concatenate([np.arange(sinks), far, np.arange(window_start, offset)])
        head_sel.append(np.unique(sel).astype(np.int32))
    if codes is None:
        codes = [[(t * (h + 1)) % n_codes for t in range(offset)] for h in range(len(retrieved))]
    counts = tuple(np.bincount(c, minlength=n_codes).astype(np.int64) for c in codes)
    return LayerStats(
        step=step,
        offset=offset,
        window_start=window_start,
        sinks=sinks,
        selected=tuple(head_sel),
        code_counts=counts,
        bytes_held=bytes_held if bytes_held is not None else offset * 100 + layer,
        bytes_fp16=offset * 400,
        exact=exact,
        layer=layer,
        recall=recall,
    )


def make_snapshot(step: int = 0, layers: list[LayerStats] | None = None, **kwargs) -> CacheSnapshot:
    layers = (
        layers
        if layers is not None
        else [make_layer(step=step, layer=i, **kwargs) for i in range(3)]
    )
    return CacheSnapshot(step=step, layers=tuple(layers), token_id=step + 7)


def growing_run(n: int, *, heads: int = 2, layers: int = 3, recall_every: int | None = None):
    """n snapshots whose offset grows by one; layer i head h retrieves {10+i, 20+h, 30+step%3}."""
    out = []
    for step in range(n):
        offset = 60 + step
        lyr = []
        for i in range(layers):
            retrieved = [sorted({10 + i, 20 + h, 30 + step % 3}) for h in range(heads)]
            recall = None
            if recall_every and step % recall_every == 0:
                recall = tuple(0.9 - 0.1 * i + 0.01 * h for h in range(heads))
            lyr.append(
                make_layer(offset=offset, retrieved=retrieved, layer=i, step=step, recall=recall)
            )
        out.append(make_snapshot(step, lyr))
    return out


# ---- category map -----------------------------------------------------------------------------
def test_category_row_places_every_category():
    layer = make_layer(offset=100, window=16, sinks=4, retrieved=[[20, 30], [30, 50]])
    row = data.category_row(layer, 110)
    assert row.shape == (110,)
    assert (row[:4] == data.SINK).all()
    assert row[20] == row[30] == row[50] == data.RETRIEVED
    assert row[21] == row[49] == row[4] == row[83] == data.FAR
    assert (row[84:99] == data.WINDOW).all()
    assert row[99] == data.CURRENT
    assert (row[100:] == data.EMPTY).all()


def test_category_row_single_head_and_exact():
    layer = make_layer(retrieved=[[20, 30], [30, 50]])
    head1 = data.category_row(layer, 100, head=1)
    assert head1[20] == data.FAR and head1[30] == head1[50] == data.RETRIEVED
    exact = make_layer(offset=40, window=16, retrieved=[[]], exact=True)
    row = data.category_row(exact, 40)
    assert (row[:4] == data.SINK).all() and (row[4:39] == data.WINDOW).all()
    assert row[39] == data.CURRENT
    assert data.retrieved_positions(exact).size == 0


def test_category_at_agrees_with_row():
    layer = make_layer(retrieved=[[20, 30], [30, 50]])
    for head in (None, 0, 1):
        row = data.category_row(layer, 105, head)
        assert [data.category_at(layer, p, head) for p in range(105)] == row.tolist()


def test_category_image_shape_and_rows():
    snap = make_snapshot(
        layers=[make_layer(layer=0, retrieved=[[20]]), make_layer(layer=1, retrieved=[[40]])]
    )
    image = data.category_image(snap)
    assert image.shape == (2, 100) and image.dtype == np.uint8
    assert image[0, 20] == data.RETRIEVED and image[1, 20] == data.FAR
    assert image[1, 40] == data.RETRIEVED and image[0, 40] == data.FAR


def test_max_pool_keeps_sparse_high_priority_columns():
    image = np.full((2, 10), data.FAR, dtype=np.uint8)
    image[0, 7] = data.RETRIEVED
    image[1, 9] = data.CURRENT
    pooled = data.max_pool_columns(image, 4)
    assert pooled.shape == (2, 3)
    assert pooled[0].tolist() == [data.FAR, data.RETRIEVED, data.FAR]
    assert pooled[1].tolist() == [data.FAR, data.FAR, data.CURRENT]
    assert data.max_pool_columns(image, 1) is image


def test_highlight_positions_per_layer_all_layers_and_head():
    snap = make_snapshot(
        layers=[
            make_layer(layer=0, retrieved=[[20, 30], [30, 50]]),
            make_layer(layer=1, retrieved=[[60], [61]]),
        ]
    )
    assert data.highlight_positions(snap, 0) == [20, 30, 50]
    assert data.highlight_positions(snap, 0, head=1) == [30, 50]
    assert data.highlight_positions(snap, 1) == [60, 61]
    assert data.highlight_positions(snap, None) == [20, 30, 50, 60, 61]
    assert data.highlight_positions(snap, 5) == []


# ---- code statistics ----------------------------------------------------------------------------
def test_code_stats_uniform_onehot_and_dead():
    uniform = data.code_stats(np.full(16, 5))
    assert uniform.entropy_bits == pytest.approx(4.0) and uniform.max_bits == pytest.approx(4.0)
    assert uniform.dead == 0 and uniform.top_share == pytest.approx(1 / 16)
    onehot = data.code_stats(np.array([0, 0, 9, 0]))
    assert onehot.entropy_bits == pytest.approx(0.0) and onehot.dead == 3
    assert onehot.top_share == 1.0 and onehot.tokens == 9 and onehot.used == 1
    half = data.code_stats(np.array([3, 3, 0, 0]))
    assert half.entropy_bits == pytest.approx(1.0) and half.dead == 2
    empty = data.code_stats(np.zeros(4))
    assert empty.entropy_bits == 0.0 and empty.dead == 4


def test_layer_code_stats_mean_over_heads():
    layer = make_layer(offset=8, n_codes=4, retrieved=[[], []], codes=[[0] * 8, [0, 1, 2, 3] * 2])
    assert data.layer_code_stats(layer, 0).entropy_bits == pytest.approx(0.0)
    assert data.layer_code_stats(layer, 1).entropy_bits == pytest.approx(2.0)
    mean = data.layer_code_stats(layer)
    assert mean.entropy_bits == pytest.approx(1.0) and mean.top_share == pytest.approx(0.625)
    assert data.sorted_counts(np.array([1, 5, 0, 3])).tolist() == [5, 3, 1, 0]


def test_memory_summary():
    snap = make_snapshot(layers=[make_layer(layer=i, bytes_held=1000 * (i + 1)) for i in range(3)])
    mem = data.memory_summary(snap)
    assert mem.held.tolist() == [1000, 2000, 3000]
    assert mem.total_fp16 == 3 * 100 * 400
    assert mem.ratio == pytest.approx(120000 / 6000) and mem.saved == 120000 - 6000


def test_recall_matrix_nan_where_not_measured():
    run = growing_run(5, recall_every=2)
    m = data.recall_matrix(run)
    assert m.shape == (3, 5)
    assert np.isnan(m[:, 1]).all() and np.isnan(m[:, 3]).all()
    assert m[1, 2] == pytest.approx(np.mean([0.8, 0.81]))
    assert data.recall_matrix(run, head=1)[2, 4] == pytest.approx(0.71)


# ---- ring buffer and frequency ------------------------------------------------------------------
def test_ring_is_bounded_and_indexed_by_sequence():
    ring = SnapshotRing(4)
    for snap in growing_run(10):
        ring.append(snap)
    assert len(ring) == 4
    assert [e.snapshot.step for e in ring.entries()] == [6, 7, 8, 9]
    assert ring.first_seq == 6 and ring.last_seq == 9
    assert ring.get(5) is None and ring.get(7).snapshot.step == 7
    assert ring.index_of(2) == 0 and ring.index_of(100) == 3
    ring.set_capacity(2)
    assert [e.seq for e in ring.entries()] == [8, 9]
    with pytest.raises(ValueError, match="history size"):
        ring.set_capacity(0)


def test_ring_replies_and_byte_series():
    ring = SnapshotRing(16)
    run = growing_run(6)
    ring.new_reply()
    for snap in run[:3]:
        ring.append(snap)
    second = ring.new_reply()
    for snap in run[3:]:
        ring.append(snap)
    assert [e.reply for e in ring.entries()] == [0, 0, 0, second, second, second]
    steps, held, fp16 = ring.byte_series(second).arrays()
    assert steps.tolist() == [3, 4, 5]
    assert held.tolist() == [s.bytes_held for s in run[3:]]
    assert fp16.tolist() == [s.bytes_fp16 for s in run[3:]]


def test_frequency_counts_retrievals_over_the_reply():
    ring = SnapshotRing(64)
    tracker = FrequencyTracker(ring)
    run = growing_run(7)
    for snap in run:
        ring.append(snap)
    freq = tracker.at(ring.last_seq, None)
    assert freq.steps == 7
    # layer 1 retrieves 11, 20, 21 every step; 30 + step % 3 cycles
    assert freq.count(1, 11) == 7 and freq.count(1, 20) == 7 and freq.count(1, 10) == 0
    assert freq.count(1, 30) == 3 and freq.count(1, 31) == 2 and freq.count(1, 32) == 2
    head0 = tracker.at(ring.last_seq, 0)
    assert head0.count(0, 20) == 7 and head0.count(0, 21) == 0
    # scrub back: recount up to step 2 only
    back = tracker.at(2, None)
    assert back.steps == 3 and back.count(2, 30) == 1 and back.count(2, 12) == 3
    frac = back.fraction(3, 70)
    assert frac[2, 12] == pytest.approx(1.0) and frac[2, 31] == pytest.approx(1 / 3)


def test_frequency_live_increments_equal_recount_and_reset_per_reply():
    ring = SnapshotRing(64)
    tracker = FrequencyTracker(ring)
    run = growing_run(9)
    for snap in run[:4]:
        ring.append(snap)
    tracker.at(ring.last_seq, None)
    for snap in run[4:]:
        ring.append(snap)
    live = tracker.at(ring.last_seq, None).counts.copy()
    fresh = FrequencyTracker(ring).at(ring.last_seq, None).counts
    assert np.array_equal(live[:, : fresh.shape[1]], fresh[:, : live.shape[1]])
    ring.new_reply()
    ring.append(run[0])
    assert tracker.at(ring.last_seq, None).steps == 1


# ---- export -------------------------------------------------------------------------------------
def assert_same_snapshots(a: list[CacheSnapshot], b: list[CacheSnapshot]) -> None:
    """The same records; histograms compared in full (engine runs send new codes per step)."""
    a, b = with_histograms(a), with_histograms(b)
    assert len(a) == len(b)
    for sa, sb in zip(a, b, strict=True):
        assert (sa.step, sa.token_id, len(sa.layers)) == (sb.step, sb.token_id, len(sb.layers))
        assert sa.process_bytes == sb.process_bytes
        for la, lb in zip(sa.layers, sb.layers, strict=True):
            for name in (
                "step",
                "offset",
                "window_start",
                "sinks",
                "bytes_held",
                "bytes_fp16",
                "exact",
                "layer",
                "recall",
                "bytes_on_disk",
            ):
                assert getattr(la, name) == getattr(lb, name), name
            assert (la.would_retrieve is None) == (lb.would_retrieve is None)
            for x, y in zip(la.would_retrieve or (), lb.would_retrieve or (), strict=True):
                assert np.array_equal(x, y)
            assert len(la.selected) == len(lb.selected)
            for x, y in zip(la.selected, lb.selected, strict=True):
                assert np.array_equal(x, y)
            for x, y in zip(la.code_counts, lb.code_counts, strict=True):
                assert np.array_equal(x, y)


@pytest.mark.parametrize(
    "histograms,suffix", [("delta", ".json"), ("full", ".json"), ("delta", ".json.gz")]
)
def test_export_round_trip(tmp_path, histograms, suffix):
    run = growing_run(6, recall_every=2)
    run.append(
        make_snapshot(
            6, [make_layer(offset=20, exact=True, retrieved=[[], []], layer=i) for i in range(3)]
        )
    )
    path = export.export_telemetry(
        tmp_path / f"t{suffix}",
        run,
        replies=[0] * 3 + [1] * 4,
        meta={"model": "tiny"},
        histograms=histograms,
    )
    snaps, replies = export.load_telemetry(path)
    assert_same_snapshots(run, snaps)
    assert replies == [0, 0, 0, 1, 1, 1, 1]
    raw = path.read_bytes()
    doc = json.loads(gzip.decompress(raw) if suffix.endswith(".gz") else raw)
    assert doc["meta"] == {"model": "tiny"}
    first = doc["steps"][0]["layers"][0]
    assert first["retrieved"] == [[10, 20, 30], [10, 21, 30]]
    assert first["selected"][0][0] == [0, 4] and first["selected"][0][-1] == [44, 60]
    later = doc["steps"][1]["layers"][0]
    assert ("code_counts_delta" in later) == (histograms == "delta")


def test_runs_encoding():
    pos = np.array([0, 1, 2, 7, 9, 10])
    runs = export.positions_to_runs(pos)
    assert runs == [[0, 3], [7, 8], [9, 11]]
    assert export.runs_to_positions(runs).tolist() == pos.tolist()
    assert export.positions_to_runs(np.array([], dtype=np.int32)) == []


def test_load_rejects_foreign_and_broken_files(tmp_path):
    foreign = tmp_path / "foreign.json"
    foreign.write_text(json.dumps({"hello": 1}))
    with pytest.raises(export.TelemetryFileError, match="not an A2ATS telemetry file"):
        export.load_telemetry(foreign)
    good = export.export_telemetry(tmp_path / "good.json", growing_run(2))
    truncated = tmp_path / "truncated.json"
    truncated.write_bytes(good.read_bytes()[:-40])
    with pytest.raises(export.TelemetryFileError, match="cannot read"):
        export.load_telemetry(truncated)
    doc = json.loads(good.read_text())
    del doc["steps"][0]["layers"][0]["code_counts"]
    (tmp_path / "broken.json").write_text(json.dumps(doc))
    with pytest.raises(export.TelemetryFileError):
        export.load_telemetry(tmp_path / "broken.json")
    with pytest.raises(ValueError, match="histograms"):
        export.telemetry_dict([], histograms="zip")


def test_vectorised_code_stats_match_per_layer():
    run = growing_run(2, heads=3)
    snap = run[-1]
    for head in (None, 0, 2):
        fast = data.snapshot_code_stats(snap, head)
        slow = [data.layer_code_stats(layer, head) for layer in snap.layers]
        for a, b in zip(fast, slow, strict=True):
            assert a.dead == b.dead and a.n_codes == b.n_codes and a.tokens == b.tokens
            assert a.entropy_bits == pytest.approx(b.entropy_bits)
            assert a.top_share == pytest.approx(b.top_share)


def test_follow_span_and_nice_ceiling_change_rarely():
    from app.inspector.retrieval_map import follow_span
    from app.inspector.widgets import nice_ceiling

    spans = {follow_span(w) for w in range(2000, 2064)}
    assert len(spans) <= 3 and all(s >= 2000 for s in spans)
    assert all(follow_span(w) >= w for w in (1, 15, 100, 4097, 100_000))
    assert [nice_ceiling(v) for v in (0.7, 1.0, 1.2, 46.1, 51, 7900)] == [
        0.8,
        1.0,
        1.5,
        50,
        60,
        8000,
    ]


def test_redraw_throttle_backs_off_when_the_gui_thread_is_busy():
    from app.inspector.throttle import RedrawThrottle

    clock = {"wall": 0.0, "cpu": 0.0}
    throttle = RedrawThrottle(
        max_hz=10,
        budget=0.1,
        slowest_ms=500,
        wall_clock=lambda: clock["wall"],
        cpu_clock=lambda: clock["cpu"],
    )
    assert throttle.after_redraw() == 100  # first call: nothing measured yet

    def frame(wall: float, cpu: float) -> int:
        clock["wall"] += wall
        clock["cpu"] += cpu
        return throttle.after_redraw()

    busy = [frame(0.1, 0.05) for _ in range(12)]  # 50% of a core
    assert busy == sorted(busy) and busy[-1] == 500 and throttle.last_share == pytest.approx(0.5)
    calm = [frame(0.5, 0.01) for _ in range(12)]  # 2% of a core
    assert calm == sorted(calm, reverse=True) and calm[-1] == 100
    with pytest.raises(ValueError, match="redraw_hz"):
        RedrawThrottle(max_hz=100)
    with pytest.raises(ValueError, match="budget"):
        RedrawThrottle(budget=0)


def test_ring_compacts_histograms_and_restores_them_exactly():
    run = growing_run(30, heads=3)
    # a trim (counts drop), then a snapshot with another codebook size (keyframe)
    trimmed = [
        make_layer(offset=40, retrieved=[[10], [11], [12]], layer=i, step=30) for i in range(3)
    ]
    run.append(make_snapshot(30, trimmed))
    other = [
        make_layer(offset=41, n_codes=16, retrieved=[[10], [11]], layer=i, step=31)
        for i in range(3)
    ]
    run.append(make_snapshot(31, other))
    run += growing_run(3, heads=3)
    ring = SnapshotRing(64)
    for snap in run:
        ring.append(snap)
    ring.compact()
    entries = ring.entries()
    assert all(not layer.code_counts for e in entries[:-1] for layer in e.snapshot.layers)
    assert entries[-1].snapshot is run[-1]  # the newest keeps its original record
    assert_same_snapshots([e.snapshot for e in ring.restored_entries()], run)
    for seq in (0, 17, 29, 30, 31, 33):
        assert_same_snapshots([ring.restored(ring.get(seq)).snapshot], [run[seq]])


def test_ring_memory_is_about_the_selections_not_the_histograms():
    run = [
        make_snapshot(
            step,
            [
                make_layer(offset=200 + step, n_codes=4096, retrieved=[[10], [11], [12]], layer=i)
                for i in range(4)
            ],
        )
        for step in range(12)
    ]
    ring = SnapshotRing(64)
    for snap in run:
        ring.append(snap)
    ring.compact()
    histograms = sum(c.nbytes for s in run for layer in s.layers for c in layer.code_counts)
    selections = sum(sel.nbytes for s in run for layer in s.layers for sel in layer.selected)
    assert ring.nbytes < 2 * selections + 300 * 4 * 12 and histograms > 10 * ring.nbytes
    kept = [c for e in ring.entries() for layer in e.snapshot.layers for c in layer.code_counts]
    assert len(kept) == 4 * 3  # only the newest step still holds full histograms
    assert_same_snapshots([e.snapshot for e in ring.restored_entries()], run)


def test_ring_respects_a_byte_budget():
    run = growing_run(40)
    ring = SnapshotRing(256, max_bytes=20_000)
    for snap in run:
        ring.append(snap)
    ring.compact()
    assert 2 <= len(ring) < 40 and ring.nbytes <= 20_000 + 5_000
    assert ring.last_seq == 39
    assert_same_snapshots([e.snapshot for e in ring.restored_entries()], run[-len(ring) :])


def as_engine_deltas(run: list[CacheSnapshot]) -> list[CacheSnapshot]:
    """The run as the engine sends it: a keyframe when the offset did not grow by one (first
    step, trim), else each layer's one new code per KV head (make_layer's codes)."""
    out, previous = [], None
    for snap in run:
        layers = []
        for layer in snap.layers:
            if previous is None or layer.offset != previous + 1:
                layers.append(layer)
                continue
            t = layer.offset - 1
            new = tuple(
                np.array([(t * (h + 1)) % 8], np.uint16) for h in range(len(layer.selected))
            )
            layers.append(replace(layer, code_counts=(), new_codes=new))
        previous = snap.layers[0].offset
        out.append(CacheSnapshot(snap.step, tuple(layers), snap.token_id))
    return out


@pytest.mark.parametrize("capacity", [64, 10])
def test_ring_accumulates_the_engines_new_codes_exactly(capacity):
    run = growing_run(20, heads=3)
    run.append(
        make_snapshot(20, [make_layer(offset=50, retrieved=[[10]] * 3, layer=i) for i in range(3)])
    )
    run += [
        make_snapshot(
            21 + s, [make_layer(offset=51 + s, retrieved=[[10]] * 3, layer=i) for i in range(3)]
        )
        for s in range(5)
    ]
    sent = as_engine_deltas(run)
    assert sum(layer.new_codes is not None for s in sent for layer in s.layers) == 3 * 24
    ring = SnapshotRing(capacity)
    for snap in sent:
        ring.append(snap)
    kept = run[-len(ring) :]
    assert_same_snapshots([e.snapshot for e in ring.restored_entries()], kept)
    for entry, want in zip(ring.entries(), kept, strict=True):
        assert_same_snapshots([ring.restored(entry).snapshot], [want])
    assert ring.entries()[-1].snapshot is sent[-1]  # the newest is the engine's own record
    selections = sum(sel.nbytes for s in kept for layer in s.layers for sel in layer.selected)
    assert ring.nbytes < selections + 200 * 3 * len(kept) + 64 * 3 * 3 * len(kept)
    assert_same_snapshots(with_histograms(sent), run)


# ---- estimated missed mass, adaptive budget, exact crossover ------------------------------------
def test_missed_mass_per_layer_and_history_beside_measured_recall():
    from dataclasses import replace

    run = growing_run(3, recall_every=2)
    run = [
        make_snapshot(
            s.step,
            [
                replace(x, missed_mass=(0.01 * (i + 1), 0.03 * (i + 1)))
                for i, x in enumerate(s.layers)
            ],
        )
        for s in run
    ]
    snap = run[0]
    assert data.missed_column(snap) == pytest.approx([0.02, 0.04, 0.06])
    assert data.missed_column(snap, 1) == pytest.approx([0.03, 0.06, 0.09])
    assert np.isnan(data.missed_value(snap.layers[0], 5))
    # measured = 1 - recall (recall 0.9 - 0.1 i + 0.01 h)
    assert data.measured_missed_column(snap) == pytest.approx([0.095, 0.195, 0.295])
    assert np.isnan(data.measured_missed_column(run[1])).all()  # step 1 not measured
    hist = data.missed_history(run)
    assert hist.steps.tolist() == [0, 1, 2]
    assert hist.estimate == pytest.approx([0.04] * 3)
    assert hist.measured[0] == pytest.approx(0.195) and np.isnan(hist.measured[1])
    assert data.has_missed(snap) and not data.has_missed(growing_run(1)[0])
    assert np.isnan(data.missed_history(growing_run(2)).estimate).all()


def test_budget_matrix_means_the_group_and_marks_fixed_layers():
    from dataclasses import replace

    layers = [make_layer(layer=i) for i in range(3)]
    layers[0] = replace(layers[0], budget_used=(np.array([4, 6], np.int32), np.array([16, 16])))
    layers[2] = replace(layers[2], budget_used=(np.array([1, 3], np.int32), np.array([2, 2])))
    snap = make_snapshot(0, layers)
    m = data.budget_matrix(snap)
    assert m.shape == (3, 2)
    assert m[0].tolist() == [5.0, 16.0] and m[2].tolist() == [2.0, 2.0]
    assert np.isnan(m[1]).all()
    assert data.has_adaptive_budget(snap) and not data.has_adaptive_budget(growing_run(1)[0])


def test_attention_mode_says_exact_until_below_the_crossover():
    from dataclasses import replace

    def snap_of(offset: int, exact: bool, until: int):
        layers = [make_layer(offset=offset, exact=exact, layer=i) for i in range(2)]
        return make_snapshot(0, [replace(x, exact_until=until) for x in layers])

    assert data.exact_until(snap_of(300, True, 2048)) == 2048
    assert data.attention_mode_text(snap_of(300, True, 2048)) == "exact until 2,048 tokens"
    assert data.exact_until(snap_of(300, False, 2048)) is None
    assert data.attention_mode_text(snap_of(3000, False, 2048)) == "A2ATS retrieving"
    # exact because nothing can be dropped (short context, no crossover): still says exact
    assert data.attention_mode_text(snap_of(10, True, 0)) == "exact attention (nothing to drop yet)"
    assert data.attention_mode_text(None) == ""
    assert data.attention_mode_text(make_snapshot(0, [])) == ""


def test_export_keeps_missed_mass_budget_exact_until_and_reuse(tmp_path):
    """The fidelity fields the inspector plots survive an export and a reload; files written
    before these fields existed load with them unset."""
    from dataclasses import replace

    base = make_layer(offset=40, retrieved=[[10], [12]])
    rich = replace(
        base,
        missed_mass=(0.125, 0.25),
        budget_used=(np.array([3, 5, 7], np.int32), np.array([2, 2, 9], np.int32)),
        exact_until=4096,
        reused=True,
        recall=(0.9, 0.8),
        recall_ms=1.5,
    )
    path = export.export_telemetry(tmp_path / "t.json", [make_snapshot(0, [rich])])
    (snap,), _ = export.load_telemetry(path)
    got = snap.layers[0]
    assert got.missed_mass == (0.125, 0.25) and got.exact_until == 4096 and got.reused
    assert got.recall == (0.9, 0.8) and got.recall_ms == 1.5
    assert [b.tolist() for b in got.budget_used] == [[3, 5, 7], [2, 2, 9]]
    doc = json.loads(path.read_text())
    for key in ("missed_mass", "budget_used", "exact_until", "reused", "recall_ms"):
        del doc["steps"][0]["layers"][0][key]  # an older file
    (old,), _ = export.snapshots_from_dict(doc)
    layer = old.layers[0]
    assert layer.missed_mass is None and layer.budget_used is None
    assert layer.exact_until == 0 and not layer.reused and layer.recall_ms is None


def test_an_exact_step_shows_what_retrieval_would_keep_in_its_own_colour():
    from dataclasses import replace

    exact = make_layer(offset=100, window=16, retrieved=[[], []], exact=True)
    shadow = replace(
        exact,
        would_retrieve=(np.array([20, 30], np.int32), np.array([30, 50], np.int32)),
        recall=(0.9, 0.7),
        exact_until=4096,
    )
    row = data.category_row(shadow, 100)
    assert row[20] == row[30] == row[50] == data.WOULD and row[21] == data.WINDOW
    assert (row[:4] == data.SINK).all() and row[99] == data.CURRENT
    head0 = data.category_row(shadow, 100, head=0)
    assert head0[50] == data.WINDOW and head0[20] == data.WOULD
    for head in (None, 0, 1):  # the hover agrees with the picture
        expect = data.category_row(shadow, 100, head).tolist()
        assert [data.category_at(shadow, p, head) for p in range(100)] == expect
    assert data.retrieved_positions(shadow).size == 0  # nothing was retrieved: it was exact
    assert data.would_positions(shadow).tolist() == [20, 30, 50]
    assert data.would_positions(exact).size == 0
    snap = make_snapshot(0, [shadow, replace(shadow, layer=1, recall=(0.5, 0.5))])
    assert data.would_keep_share(snap) == pytest.approx(0.65)
    assert data.attention_mode_text(snap) == (
        "exact until 4,096 tokens \u00b7 retrieval now would keep 65% of attention"
    )
    assert data.would_keep_share(make_snapshot(0, [exact])) is None
    from app.inspector import export

    cold = replace(shadow, bytes_on_disk=12345)
    snaps = [replace(make_snapshot(0, [cold]), process_bytes=7 << 20)]
    doc = export.telemetry_dict(snaps)
    assert_same_snapshots(snaps, export.snapshots_from_dict(doc)[0])
