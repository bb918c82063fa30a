"""InspectorPanel with pytest-qt (offscreen): rendering, scrubbing, highlight, export, detach."""

from __future__ import annotations

import json

import numpy as np
import pytest
from PySide6.QtCore import QPointF
from PySide6.QtGui import QColor, QImage

from app.inspector import InspectorPanel, data, export
from app.inspector.plot_theme import Theme
from app.inspector.retrieval_map import HIGHLIGHT_ALL, HIGHLIGHT_OFF, MODE_FREQUENCY
from app.inspector.synthetic import dark_palette, synthetic_snapshots, synthetic_tokens

from .test_inspector_data import assert_same_snapshots, growing_run, make_layer, make_snapshot


@pytest.fixture
def panel(qtbot):
    widget = InspectorPanel(history_size=256)
    qtbot.addWidget(widget)
    widget.resize(900, 1100)
    widget.show()
    qtbot.waitExposed(widget)
    return widget


def feed(panel: InspectorPanel, snapshots) -> None:
    panel.on_generation_started()
    for snap in snapshots:
        panel.on_snapshot(snap)
    panel.flush()


def rendered_rgb(panel: InspectorPanel, column: int, row: int) -> tuple[int, int, int]:
    """Colour pyqtgraph renders for one cell of the displayed map image."""
    item = panel.map_panel.image
    item.render()
    c = item.qimage.pixelColor(column, row)
    return c.red(), c.green(), c.blue()


def hex_rgb(colour: str) -> tuple[int, int, int]:
    c = QColor(colour)
    return c.red(), c.green(), c.blue()


# ---- retrieval map ------------------------------------------------------------------------------
def test_map_shows_known_positions_in_their_colours(panel):
    snap = make_snapshot(
        layers=[
            make_layer(layer=0, retrieved=[[20, 30], [30, 50]]),
            make_layer(layer=1, retrieved=[[61], [62]]),
        ]
    )
    feed(panel, [snap])
    full = panel.map_panel.full_image()
    assert full.shape == (2, 100)
    shown, start, factor = panel.map_panel.displayed()
    assert (start, factor) == (0, 1)  # 100 positions fit: one column per position
    assert np.array_equal(shown, full)
    assert shown[0, 20] == shown[0, 50] == shown[1, 61] == data.RETRIEVED
    assert shown[1, 20] == shown[0, 61] == data.FAR
    assert shown[0, 2] == data.SINK and shown[1, 90] == data.WINDOW and shown[1, 99] == data.CURRENT
    theme = panel.map_panel._theme
    assert rendered_rgb(panel, 20, 0) == hex_rgb(theme.categories[data.RETRIEVED])
    assert rendered_rgb(panel, 20, 1) == hex_rgb(theme.categories[data.FAR])
    assert rendered_rgb(panel, 1, 1) == hex_rgb(theme.categories[data.SINK])
    assert rendered_rgb(panel, 90, 0) == hex_rgb(theme.categories[data.WINDOW])
    assert rendered_rgb(panel, 99, 1) == hex_rgb(theme.categories[data.CURRENT])
    # window boundary: one vertical segment per layer at window_start
    xs, ys = panel.map_panel.boundary.getData()
    assert xs.tolist() == [84, 84, 84, 84] and ys.tolist() == [0, 1, 1, 2]
    assert panel.map_panel.current_line.value() == pytest.approx(99.5)


def test_map_head_choice_changes_the_image(panel):
    feed(panel, [make_snapshot(layers=[make_layer(retrieved=[[20, 30], [30, 50]])])])
    panel.map_panel.set_head(1)
    panel.flush()
    row = panel.map_panel.full_image()[0]
    assert row[20] == data.FAR and row[30] == row[50] == data.RETRIEVED
    panel.map_panel.set_head(0)
    panel.flush()
    row = panel.map_panel.full_image()[0]
    assert row[20] == row[30] == data.RETRIEVED and row[50] == data.FAR


def test_wide_map_is_pooled_without_losing_a_single_retrieved_token(panel):
    layers = [make_layer(offset=6000, window=64, layer=i, retrieved=[[1234 + i]]) for i in range(4)]
    feed(panel, [make_snapshot(layers=layers)])
    shown, start, factor = panel.map_panel.displayed()
    assert factor > 1 and shown.shape[1] * factor >= 6000
    for i in range(4):
        col = (1234 + i - start) // factor
        assert shown[i, col] == data.RETRIEVED
        assert shown[i, col + 2] == data.FAR
    assert shown[0, (5999 - start) // factor] == data.CURRENT
    # zoom in: full resolution again, only the visible range drawn
    panel.map_panel.zoom_to(1200, 1300)
    panel.flush()
    shown, start, factor = panel.map_panel.displayed()
    assert factor == 1 and start <= 1200 and shown[0, 1234 - start] == data.RETRIEVED
    assert shown.shape[1] <= 110  # only the visible columns
    assert panel.map_panel.fit_button.isEnabled()
    panel.map_panel.fit_button.click()
    panel.flush()
    assert panel.map_panel.displayed()[2] > 1


def test_hover_text_names_layer_position_token_and_counts(panel):
    panel.set_context_tokens([f"tok{i}" for i in range(80)])
    feed(panel, growing_run(5))
    text = panel.map_panel.describe(1, 21)
    assert "layer 1" in text and "position 21" in text and "tok21" in text
    assert "retrieved by KV head 1" in text
    assert "5 of the last 5 steps" in text and "5 of 5 this reply" in text
    text = panel.map_panel.describe(2, 30)  # retrieved at steps 0 and 3, not at the last (4)
    assert "2 of 5 this reply" in text and "far (not retrieved)" in text


def test_click_emits_scroll_to_position(panel, qtbot):
    feed(panel, growing_run(3))
    vb = panel.map_panel.plot.plotItem.vb
    scene_pos = vb.mapViewToScene(QPointF(37.5, 1.5))

    class Click:
        def button(self):
            from PySide6.QtCore import Qt

            return Qt.MouseButton.LeftButton

        def scenePos(self):  # noqa: N802 (Qt naming)
            return scene_pos

    with qtbot.waitSignal(panel.scroll_requested) as blocker:
        panel.map_panel._on_mouse_clicked(Click())
    assert blocker.args == [37]


def test_highlight_requested_for_chosen_layer_all_layers_and_off(panel):
    got = []
    panel.highlight_requested.connect(got.append)
    snap = make_snapshot(
        layers=[
            make_layer(layer=0, retrieved=[[20, 30], [30, 50]]),
            make_layer(layer=1, retrieved=[[61], [62]]),
        ]
    )
    feed(panel, [snap])
    panel.map_panel.set_highlight_choice(1)
    assert got[-1] == [61, 62]
    panel.map_panel.set_highlight_choice(HIGHLIGHT_ALL)
    assert got[-1] == [20, 30, 50, 61, 62]
    panel.map_panel.set_head(1)
    assert got[-1] == [30, 50, 62]
    panel.map_panel.set_highlight_choice(HIGHLIGHT_OFF)
    assert got[-1] == []


def test_frequency_mode_counts_over_the_reply(panel):
    feed(panel, growing_run(6))
    panel.map_panel.set_mode(MODE_FREQUENCY)
    panel.flush()
    full = panel.map_panel.full_image()
    assert full.shape == (3, 65)
    # layer 0 retrieves 10, 20, 21 on every step; 31 on steps 1 and 4 (2 of 6)
    every = full[0, 10]
    assert every == full[0, 20] == full[0, 21] == 255
    assert full[0, 11] == 0  # never retrieved
    assert 0 < full[0, 31] < every
    from app.inspector.plot_theme import fraction_to_index

    assert full[0, 31] == fraction_to_index(np.array([2 / 6]))[0]
    assert "frequency over 6 steps" in panel.map_panel.summary.text()


# ---- scrubber -----------------------------------------------------------------------------------
def test_scrubber_selects_a_step_and_every_panel_follows(panel):
    run = growing_run(10, recall_every=3)
    feed(panel, run)
    assert panel.state.live and panel.scrubber.slider.maximum() == 9
    panel.scrubber.slider.setValue(3)
    panel.flush()
    assert not panel.state.live and not panel.scrubber.live_button.isChecked()
    assert_same_snapshots([panel.viewed_snapshot()], [run[3]])  # histograms rebuilt exactly
    assert panel.map_panel.full_image().shape == (3, 63)
    assert "step 3 " in panel.map_panel.summary.text()
    expected = [data.layer_code_stats(layer) for layer in run[3].layers]
    assert panel.codebook_panel.table_stats() == expected
    assert panel.memory_panel.last_summary.total_held == run[3].bytes_held
    assert panel.memory_panel.step_marker.value() == 3
    assert panel.fidelity_panel.showing_strip
    assert panel.fidelity_panel.marker.value() == pytest.approx(1.5)  # measured steps 0, 3, ...
    assert "step 3 " in panel.scrubber.label.text()
    # new steps keep the view where it is until "Live" is pressed
    panel.on_snapshot(growing_run(11)[10])
    panel.flush()
    assert panel.viewed_snapshot().step == 3
    panel.scrubber.live_button.setChecked(True)
    panel.flush()
    assert panel.state.live and panel.viewed_snapshot().step == 10
    assert panel.scrubber.slider.value() == 10


def test_scrubber_buttons_step_and_leave_live(panel):
    feed(panel, growing_run(5))
    panel.scrubber.prev_button.click()
    panel.flush()
    assert panel.viewed_snapshot().step == 3 and not panel.state.live
    panel.scrubber.next_button.click()
    panel.scrubber.next_button.click()
    panel.flush()
    assert panel.viewed_snapshot().step == 4


def test_ring_bound_respected(qtbot):
    panel = InspectorPanel(history_size=5)
    qtbot.addWidget(panel)
    feed(panel, growing_run(12))
    assert len(panel.state.ring) == 5
    assert panel.scrubber.slider.maximum() == 4
    assert panel.viewed_snapshot().step == 11
    panel.set_history_size(3)
    panel.flush()
    assert [e.snapshot.step for e in panel.state.ring.entries()] == [9, 10, 11]
    with pytest.raises(ValueError, match="history size"):
        panel.set_history_size(0)


def test_snapshots_are_taken_without_redrawing(qtbot):
    panel = InspectorPanel()
    qtbot.addWidget(panel)
    panel.show()
    before = panel.redraw_count
    for snap in growing_run(40):
        panel.on_snapshot(snap)
    assert panel.redraw_count == before  # drawing waits for the throttled timer
    qtbot.waitUntil(lambda: panel.redraw_count > before, timeout=3000)
    assert panel.redraw_count == before + 1
    assert panel.viewed_snapshot().step == 39


# ---- codebook, memory, fidelity -----------------------------------------------------------------
def test_codebook_panel_histogram_and_table(panel):
    layer = make_layer(
        offset=8, n_codes=4, retrieved=[[], []], codes=[[0] * 8, [0, 1, 2, 3, 3, 3, 1, 3]]
    )
    feed(panel, [make_snapshot(layers=[layer, make_layer(layer=1)])])
    cb = panel.codebook_panel
    assert cb.curve_data(0).tolist() == [8]
    assert cb.curve_data(1).tolist() == [4, 2, 1, 1]
    assert cb.table.rowCount() == 2
    assert cb.table.item(0, 2).text() == "2"  # mean dead codes of (3, 0) = 1.5 -> 2
    cb.set_head(1)
    panel.flush()
    assert cb.curve_data(0).size == 0 and cb.table.item(0, 2).text() == "0"
    assert (
        cb.table.item(0, 1).text() == f"{data.code_stats(np.array([1, 2, 1, 4])).entropy_bits:.2f}"
    )
    cb.set_layer_row(1)
    panel.flush()
    assert "layer 1" in cb.summary.text()


def test_memory_panel_bars_totals_and_line(panel):
    run = growing_run(4)
    feed(panel, run)
    mem = panel.memory_panel
    _, heights = mem.held_bars.opts["x"], mem.held_bars.opts["height"]
    assert np.allclose(heights * 1024 * 1024, [layer.bytes_held for layer in run[-1].layers])
    steps, held = mem.held_line.getData()
    assert steps.tolist() == [0, 1, 2, 3]
    assert np.allclose(held * 1024 * 1024, [s.bytes_held for s in run])
    ratio = run[-1].bytes_fp16 / run[-1].bytes_held
    assert f"{ratio:.2f}\u00d7 less in memory" in mem.summary.text()


def test_memory_panel_counts_the_codebook_as_its_own_bar(panel, tmp_path):
    from dataclasses import replace

    run = [replace(s, codebook_bytes=5_000_000) for s in growing_run(4)]
    feed(panel, run)
    mem = panel.memory_panel
    last = run[-1]
    heights = mem.held_bars.opts["height"] * 1024 * 1024
    assert np.allclose(heights, [*(layer.bytes_held for layer in last.layers), 5_000_000])
    assert np.allclose(mem.fp16_bars.opts["height"][-1], 0)  # an fp16 cache needs no codebook
    assert mem.last_summary.total_held == last.bytes_held + 5_000_000
    _, held = mem.held_line.getData()
    assert np.allclose(held * 1024 * 1024, [s.bytes_held + 5_000_000 for s in run])
    text = mem.summary.text()
    ratio = (last.bytes_held + 5_000_000) / last.bytes_fp16  # larger: the codebook outweighs
    assert f"{ratio:.2f}\u00d7 more in memory" in text and "codebook 4.8 MB" in text
    assert "shared by all its chats" in text
    path = panel.export_telemetry(tmp_path / "t.json")
    assert [s.codebook_bytes for s in export.load_telemetry(path)[0]] == [5_000_000] * 4


def test_status_bar_counts_the_codebook(qtbot):
    from app.status_bar import StatusBar

    bar = StatusBar()
    qtbot.addWidget(bar)
    bar.set_cache(1000, 8000)
    assert bar.cache.text() == "cache 1000 B in memory (8.0x less than an fp16 cache's 7.8 KB)"
    bar.set_cache(1000, 8000, True, 3000)
    assert "(2.0x less than" in bar.cache.text() and "codebook" in bar.cache.toolTip()
    bar.set_cache(1000, 2000, True, 3000)
    assert "(2.0x more than an fp16 cache's" in bar.cache.text()
    assert "shared by all chats" in bar.cache.toolTip()
    bar.set_cache(1000, 8000, True, 0, 5 << 20)
    assert bar.cache.text().startswith("cache 1000 B in memory, 5.0 MB on disk (")
    assert "saved" not in bar.cache.text() and "page out" in bar.cache.toolTip()


def test_fidelity_off_by_default_then_strip(panel):
    feed(panel, growing_run(3))
    fid = panel.fidelity_panel
    assert not fid.showing_strip and "fidelity is off" in fid.hint.text().lower()
    assert "settings" in fid.hint.text().lower()
    panel.set_fidelity_info(True, every=2, cost_ms=4.5, overhead=0.07)
    feed(panel, growing_run(5, recall_every=2))
    assert fid.showing_strip
    assert fid.matrix.shape == (3, 3)  # measured steps 0, 2, 4 of the kept ring
    assert fid.matrix[2, 1] == pytest.approx(np.mean([0.7, 0.71]))
    assert "4.5 ms" in fid.cost.text() and "7.0%" in fid.cost.text()


# ---- export & detach ----------------------------------------------------------------------------
def test_export_telemetry_round_trip_and_pngs(panel, tmp_path):
    tokens = [f"t{i}" for i in range(70)]
    panel.set_context_tokens(tokens)
    run = growing_run(6, recall_every=2)
    feed(panel, run[:3])
    feed(panel, run[3:])
    path = panel.export_telemetry(tmp_path / "telemetry.json", meta={"model": "tiny"})
    snaps, replies = export.load_telemetry(path)
    assert_same_snapshots(run, snaps)
    assert replies[:3] == [replies[0]] * 3 and replies[3] != replies[0]
    doc = json.loads(path.read_text())
    assert doc["meta"]["context_tokens"] == tokens and doc["meta"]["model"] == "tiny"
    pngs = panel.export_pngs(tmp_path / "png")
    assert sorted(p.name for p in pngs) == sorted(
        ["map.png", "codebook.png", "memory.png", "fidelity.png", "inspector.png"]
    )
    for p in pngs:
        img = QImage(str(p))
        assert not img.isNull() and img.width() > 200 and img.height() > 50
    one = panel.export_panel_png("memory", tmp_path / "one.png")
    assert not QImage(str(one)).isNull()
    with pytest.raises(ValueError, match="panel"):
        panel.export_panel_png("nope", tmp_path / "x.png")


def test_detach_and_dock_a_section(panel):
    section = panel.sections["codebook"]
    index = panel.splitter.indexOf(section)
    section.detach()
    assert section.detached and panel.splitter.indexOf(section) == -1
    assert section.window() is not panel.window() and section.window().isVisible()
    feed(panel, growing_run(2))
    assert panel.codebook_panel.table.rowCount() == 3  # still drawn while floating
    section.window().close()
    assert not section.detached and panel.splitter.indexOf(section) == index


def test_palette_change_restyles_the_map(panel):
    feed(panel, growing_run(2))
    light = panel.map_panel._theme
    panel.setPalette(dark_palette())
    dark = panel.map_panel._theme
    assert dark.dark and not light.dark
    assert dark.categories[data.FAR] != light.categories[data.FAR]
    assert rendered_rgb(panel, 40, 0) == hex_rgb(dark.categories[data.FAR])
    assert Theme.from_widget(panel.memory_panel.bars_plot).held == dark.held


def test_realistic_synthetic_run_renders(panel, tmp_path):
    panel.set_context_tokens(synthetic_tokens(530))
    panel.set_fidelity_info(True, every=4)
    feed(panel, synthetic_snapshots(layers=6, prompt_tokens=500, steps=12, fidelity_every=4))
    full = panel.map_panel.full_image()
    snap = panel.viewed_snapshot()
    assert full.shape == (6, snap.offset)
    for row, layer in enumerate(snap.layers):
        picked = data.retrieved_positions(layer)
        assert (full[row, picked] == data.RETRIEVED).all()
        assert (full[row, layer.window_start : layer.offset - 1] == data.WINDOW).all()
    assert panel.fidelity_panel.showing_strip


def test_short_context_exact_steps_and_empty_snapshots(panel):
    exact = make_snapshot(
        layers=[make_layer(offset=30, exact=True, retrieved=[[], []], layer=i) for i in range(2)]
    )
    feed(panel, [exact])
    row = panel.map_panel.full_image()[0]
    assert (row[4:29] == data.WINDOW).all() and row[29] == data.CURRENT
    assert "exact attention" in panel.map_panel.summary.text()
    panel.map_panel.set_highlight_choice(HIGHLIGHT_ALL)
    assert panel.map_panel.highlight_for(panel.state.entry()) == []
    from a2ats_engine.cache.telemetry import CacheSnapshot

    feed(panel, [CacheSnapshot(step=0, layers=())])
    assert panel.map_panel.full_image().size == 0
    assert panel.codebook_panel.table.rowCount() == 0


def test_memory_summary_names_memory_disk_and_fp16_and_never_calls_a_loss_saved():
    from app.inspector.memory_view import MemoryPanel

    smaller = data.MemorySummary(np.array([100, 100]), np.array([400, 400]))
    text = MemoryPanel.summary_text(smaller)
    assert text.startswith("in memory 200 B") and "an fp16 cache would hold 800 B" in text
    assert "4.00\u00d7 less in memory" in text and "on disk" not in text
    larger = data.MemorySummary(np.array([800, 900]), np.array([400, 400]))
    text = MemoryPanel.summary_text(larger)
    assert "2.12\u00d7 more in memory" in text and "saved" not in text
    cold = data.MemorySummary(
        np.array([10, 10]), np.array([400, 400]), codebook=4096, on_disk=3 << 20, process=5 << 30
    )
    text = MemoryPanel.summary_text(cold)
    assert "on disk 3.0 MB" in text and "process 5.0 GB (measured)" in text
    assert "codebook 4.0 KB: one per model, shared by all its chats" in text


def test_codebook_layout_follows_the_width(panel, qtbot):
    from PySide6.QtCore import Qt

    cb = panel.codebook_panel
    panel.resize(1400, 1000)  # two columns of panels, each wider than WIDE_LAYOUT_PX
    qtbot.waitUntil(lambda: cb.split.orientation() == Qt.Orientation.Horizontal, timeout=2000)
    panel.resize(420, 1000)
    qtbot.waitUntil(lambda: cb.split.orientation() == Qt.Orientation.Vertical, timeout=2000)


def test_panels_reflow_into_two_columns_when_wide(panel, qtbot):
    from app.inspector.panel import SECOND_COLUMN

    feed(panel, growing_run(3))
    panel.resize(500, 1000)
    qtbot.waitUntil(lambda: panel.columns == 1, timeout=2000)
    assert [panel.splitter.indexOf(s) for s in panel.sections.values()] == [0, 1, 2, 3]
    assert not panel.second_splitter.isVisible()
    wide = panel.two_columns_width()
    panel.resize(wide, 1000)
    qtbot.waitUntil(lambda: panel.columns == 2, timeout=2000)
    for key, section in panel.sections.items():
        column = panel.second_splitter if key in SECOND_COLUMN else panel.splitter
        assert column.indexOf(section) >= 0, key
        # every panel gets at least its minimum width: nothing is cut at the right edge
        assert section.width() >= section.minimumSizeHint().width(), key
    assert panel.second_splitter.isVisible()
    # a section detached and docked again goes back into the column the width wants
    memory = panel.sections["memory"]
    memory.detach()
    memory.window().close()
    assert panel.second_splitter.indexOf(memory) >= 0
    panel.resize(panel.minimumSizeHint().width() - 1, 1000)  # the two no longer fit
    qtbot.waitUntil(lambda: panel.columns == 1, timeout=2000)
    assert [panel.splitter.indexOf(s) for s in panel.sections.values()] == [0, 1, 2, 3]


def test_two_columns_fall_back_to_one_when_a_panel_outgrows_its_room(panel, qtbot):
    panel.resize(panel.two_columns_width(), 1000)
    qtbot.waitUntil(lambda: panel.columns == 2, timeout=2000)
    # real data widened a panel (longer axis labels, say): the columns no longer fit
    panel.sections["fidelity"].body.setMinimumWidth(panel.width())
    qtbot.waitUntil(lambda: panel.columns == 1, timeout=2000)  # the next redraw reflows
    panel.resize(panel.width() + 1, 1000)  # and it does not flip back at the same width
    assert panel.columns == 1


# ---- estimated missed mass, budget per head, exact until ----------------------------------------
def test_estimate_beside_measured_recall_and_fixed_budget(panel):
    panel.set_fidelity_info(True, every=4)
    feed(panel, synthetic_snapshots(layers=6, prompt_tokens=500, steps=12, fidelity_every=4))
    view = panel.fidelity_panel.estimate
    snap = panel.viewed_snapshot()
    _, ys = view.layer_estimate.getData()
    assert ys == pytest.approx(data.missed_column(snap))
    steps, means = view.step_estimate.getData()
    assert steps.tolist() == list(range(12))
    kept = [e.snapshot for e in panel.state.ring.entries()]
    assert means == pytest.approx(data.missed_history(kept).estimate)
    measured_steps, measured = view.step_measured.getData()
    assert measured_steps.tolist() == [0, 4, 8]  # only where the shadow pass measured
    assert measured == pytest.approx(data.missed_history(kept).measured[[0, 4, 8]])
    assert "measured (1 - recall) at step 8" in view.info.text()
    assert not view.showing_budget_heatmap
    assert view.budget_note.text().startswith("fixed budget K")
    # the head choice reaches the estimate
    panel.fidelity_panel.head_combo.setCurrentIndex(2)  # KV head 1
    panel.flush()
    _, ys = view.layer_estimate.getData()
    assert ys == pytest.approx(data.missed_column(snap, 1))


def test_the_estimate_on_some_layers_leaves_gaps_and_says_on_how_many(panel):
    """The estimate kept on the layers that miss most (`estimate_layers`): the other layers of
    a retrieving step have no estimated mass; the plot leaves them out and the info line says
    over how many layers the mean is."""
    from dataclasses import replace

    snaps = [
        replace(
            s,
            layers=tuple(
                layer if layer.layer in (0, 3) else replace(layer, missed_mass=None)
                for layer in s.layers
            ),
        )  # fmt: skip
        for s in synthetic_snapshots(layers=6, prompt_tokens=500, steps=4, fidelity_every=2)
    ]
    feed(panel, snaps)
    view = panel.fidelity_panel.estimate
    xs, ys = view.layer_estimate.getData()
    assert np.isfinite(ys).tolist() == [True, False, False, True, False, False]
    assert ys[[0, 3]] == pytest.approx(data.missed_column(panel.viewed_snapshot())[[0, 3]])
    assert "over the 2 of 6 layers that run it" in view.info.text()
    # over steps the measured mean is over the same two layers as the estimate's
    steps, measured = view.step_measured.getData()
    want = [np.mean(data.measured_missed_column(snaps[i])[[0, 3]]) for i in (0, 2)]
    assert steps.tolist() == [0, 2] and measured == pytest.approx(want)


def test_budget_heatmap_with_adaptive_coverage(panel):
    feed(panel, synthetic_snapshots(layers=5, prompt_tokens=400, steps=4, coverage=True))
    view = panel.fidelity_panel.estimate
    snap = panel.viewed_snapshot()
    assert view.showing_budget_heatmap
    want = data.budget_matrix(snap)
    assert want.shape == (5, 3) and np.isfinite(want).all()
    assert np.array_equal(view.budget, want)
    assert view.budget_image.image.shape == (5, 3)
    assert f"max {want.max():.0f}" in view.budget_info.text()
    assert any(f"{want.max():.0f} kept" in label for label in view.budget_legend.labels())


def test_exact_until_n_tokens_below_the_crossover(panel):
    # prompt 500: steps 0-3 (context 501-504) are below exact_below=505, the rest retrieve
    feed(panel, synthetic_snapshots(layers=4, prompt_tokens=500, steps=8, exact_below=505))
    live = panel.map_panel.summary.text()
    assert "exact until" not in live and "retrieved per layer" in live
    assert "A2ATS retrieving" in panel.fidelity_panel.estimate.info.text()
    first = panel.state.ring.entries()[0].seq
    panel.select_step(first)
    panel.flush()
    assert "exact until 505 tokens" in panel.map_panel.summary.text()
    view = panel.fidelity_panel.estimate
    assert "exact until 505 tokens" in view.info.text()
    assert "A2ATS retrieving" not in view.info.text()
    assert view.budget_note.text() == "no budget at this step: attention was exact"
    assert view.layer_estimate.getData()[1] is None or not len(view.layer_estimate.getData()[1])


def test_status_bar_says_exact_until_then_retrieving(qtbot):
    from app.status_bar import StatusBar

    bar = StatusBar()
    qtbot.addWidget(bar)
    snaps = list(synthetic_snapshots(layers=2, prompt_tokens=100, steps=3, exact_below=102))
    bar.set_attention(data.attention_mode_text(snaps[0]))
    assert bar.attention.text() == "exact until 102 tokens"
    bar.set_attention(data.attention_mode_text(snaps[-1]))
    assert bar.attention.text() == "A2ATS retrieving"
    bar.set_cache(1000, None, a2ats=False)
    assert bar.attention.text() == ""


def test_below_the_crossover_the_panels_show_what_retrieval_would_keep(panel):
    from dataclasses import replace

    def shadow_layer(i: int, step: int):
        layer = make_layer(offset=100 + step, retrieved=[[], []], exact=True, layer=i, step=step)
        would = (np.array([20, 30], np.int32), np.array([30, 50], np.int32))
        return replace(layer, would_retrieve=would, recall=(0.8, 0.6), exact_until=4096)

    feed(panel, [make_snapshot(s, [shadow_layer(i, s) for i in range(3)]) for s in range(3)])
    summary = panel.map_panel.summary.text()
    assert "exact until 4,096 tokens" in summary and "would keep 70% of attention" in summary
    fid = panel.fidelity_panel
    assert fid.showing_strip  # the would-be recall is measured even with the fidelity pass off
    assert "attended exactly: retrieval there would keep 0.700" in fid.info.text()
    assert "miss 0.300" in fid.info.text()
    legend = " ".join(str(item[1]) for item in panel.map_panel.legend._items)
    assert "would retrieve" in legend


def test_a_reflow_scheduled_by_a_redraw_is_dropped_when_the_panel_is_deleted_first(qtbot):
    """A redraw in two columns schedules a reflow for the next event loop turn; if the panel is
    deleted before that turn (a window closed at the end of a test, or by the user), the reflow
    must not run on the deleted panel (it once raised "Internal C++ object already deleted" in
    the event loop)."""
    from PySide6.QtCore import QCoreApplication, QEvent

    widget = InspectorPanel(history_size=64)
    widget.resize(1600, 900)
    widget.show()
    qtbot.waitExposed(widget)
    widget.set_columns(2)
    feed(widget, growing_run(2))
    widget._redraw(force=True)  # columns == 2: a reflow is scheduled
    widget.deleteLater()
    QCoreApplication.sendPostedEvents(None, QEvent.Type.DeferredDelete)
    with qtbot.capture_exceptions() as caught:
        qtbot.wait(30)
    errors = [str(e[1]) for e in caught]
    assert errors == []
