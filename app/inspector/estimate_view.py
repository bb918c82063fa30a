"""Estimated missed mass beside measured recall, and the per-head budget, at the viewed step.

Every retrieval step the cache estimates the softmax mass of the far tokens it did not retrieve
(`estimate_missed`, LayerStats.missed_mass). This view plots that estimate per layer at the viewed
step and, averaged over layers, over the kept steps; where the fidelity shadow pass measured a
step it draws the measured missed mass (1 - recall) beside it, so estimate and measurement can be
compared. Below, the far tokens each KV head kept with the adaptive budget (`coverage`,
LayerStats.budget_used) as a layers x KV heads heatmap, or one line saying the budget is fixed.
Numbers come from `data.py`; plot items are made once and updated with setData / setImage.
"""

from __future__ import annotations

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import QRectF, QSize, Qt
from PySide6.QtWidgets import (
    QGridLayout,
    QLabel,
    QLayout,
    QStackedWidget,
    QVBoxLayout,
    QWidget,
)

from . import data
from .plot_theme import Theme, fraction_to_index
from .retrieval_map import LayerAxis
from .snapshot_ring import Entry
from .state import InspectorState
from .widgets import TICK_DENSITY, LegendBar, ThemedPlot, heat_plot, nice_ceiling, small_label

FIXED_BUDGET = (
    "fixed budget K: adaptive coverage is off, so every query head keeps the same K far tokens"
)
EXACT_BUDGET = "no budget at this step: attention was exact"
WIDE_WIDTH = 560  # from this width on, the three plots share one row
ESTIMATE_OFF = "no estimated missed mass at this step (exact step, or estimate_missed is off)"


class EstimateView(QWidget):
    """Missed mass (estimated vs measured) per layer and over steps, and the budget per head."""

    def __init__(self, state: InspectorState, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.state = state
        self.head: int | None = data.ALL_HEADS  # set by the owning panel's head choice
        self._history: dict[tuple, tuple[int, float, float]] = {}
        self._measured: Entry | None = None  # latest fidelity-measured step <= the viewed one
        self.budget = np.zeros((0, 0), dtype=np.float32)  # [L, H] as drawn (NaN: none)
        self._build()

    def _build(self) -> None:
        self.layer_plot = ThemedPlot()
        item = self.layer_plot.plotItem
        item.setLabel("bottom", "layer (viewed step)")
        item.setLabel("left", "missed")
        item.setMouseEnabled(x=False, y=False)
        # gaps where a layer runs no estimate (on the layers that miss most only)
        self.layer_estimate = item.plot([], [], name="estimated", connect="finite")
        self.layer_measured = item.plot([], [], name="measured (1 - recall)")

        self.step_plot = ThemedPlot()
        item = self.step_plot.plotItem
        item.setLabel("bottom", "step (mean of layers)")
        item.setMouseEnabled(x=False, y=False)
        self.step_estimate = item.plot([], [])
        self.step_measured = item.plot([], [], connect="finite")
        self.step_marker = pg.InfiniteLine(angle=90, movable=False)
        item.addItem(self.step_marker)
        for plot in (self.layer_plot, self.step_plot):
            plot.setMinimumHeight(60)
            plot.plotItem.getAxis("left").enableAutoSIPrefix(False)
        self.legend = LegendBar()

        self.budget_axis = LayerAxis()
        self.budget_plot, self.budget_image = heat_plot(
            "budget per KV head", axis_items={"left": self.budget_axis}
        )
        self.budget_plot.setMinimumHeight(60)
        self.budget_legend = LegendBar()
        self.budget_note = QLabel(FIXED_BUDGET)
        self.budget_note.setWordWrap(True)
        self.budget_note.setAlignment(Qt.AlignmentFlag.AlignCenter)
        heat = QWidget()
        heat_layout = QVBoxLayout(heat)
        heat_layout.setContentsMargins(0, 0, 0, 0)
        heat_layout.addWidget(self.budget_plot, 1)
        heat_layout.addWidget(self.budget_legend)
        self.budget_stack = QStackedWidget()
        self.budget_stack.addWidget(self.budget_note)
        self.budget_stack.addWidget(heat)
        self.info = small_label("", 2)
        self.budget_info = small_label("", 1)

        for plot in (self.layer_plot, self.step_plot, self.budget_plot):
            plot.plotItem.getAxis("bottom").setTickDensity(TICK_DENSITY)
        # Wide: missed mass per layer | over steps | budget per head in one row; narrow: the
        # budget gets a row of its own, so no plot is too small for its ticks and axis title.
        self.plots = QGridLayout()
        self.plots.setContentsMargins(0, 0, 0, 0)
        self.plots.setSpacing(4)
        self.wide: bool | None = None
        self._arrange(wide=False)
        layout = QVBoxLayout(self)
        # our minimum is `minimumSizeHint`'s (the narrow arrangement), not the wide layout's
        layout.setSizeConstraint(QLayout.SizeConstraint.SetNoConstraint)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.setSpacing(2)
        layout.addLayout(self.plots, 1)
        layout.addWidget(self.legend)
        layout.addWidget(self.info)
        layout.addWidget(self.budget_info)
        self.layer_plot.on_theme = self._on_theme
        self._on_theme(self.layer_plot.theme)

    def _arrange(self, wide: bool) -> None:
        if wide == self.wide:
            return
        self.wide = wide
        for widget in (self.layer_plot, self.step_plot, self.budget_stack):
            self.plots.removeWidget(widget)
        self.plots.addWidget(self.layer_plot, 0, 0)
        self.plots.addWidget(self.step_plot, 0, 1)
        if wide:
            self.plots.addWidget(self.budget_stack, 0, 2)
            stretches = ((0, 3), (1, 3), (2, 2))
        else:
            self.plots.addWidget(self.budget_stack, 1, 0, 1, 2)
            stretches = ((0, 1), (1, 1), (2, 0))
        for column, stretch in stretches:
            self.plots.setColumnStretch(column, stretch)
        self._stretch_rows()

    def _stretch_rows(self) -> None:
        """Narrow: the budget row grows with the plots only while it shows a heatmap (a note
        needs its text's height, and the missed-mass plots get the rest)."""
        narrow = not self.wide
        self.plots.setRowStretch(0, 2 if narrow else 1)
        self.plots.setRowStretch(1, 1 if narrow and self.showing_budget_heatmap else 0)

    def least_width(self, wide: bool) -> int:
        """The narrowest width at which every plot of that arrangement keeps its ticks and
        whole axis title (as the axes are drawn now)."""
        pair = sum(p.minimumSizeHint().width() for p in (self.layer_plot, self.step_plot))
        budget = self.budget_stack.minimumSizeHint().width()
        spacing = self.plots.horizontalSpacing()
        plots = pair + budget + 2 * spacing if wide else max(pair + spacing, budget)
        labels = [w.minimumSizeHint().width() for w in (self.legend, self.info, self.budget_info)]
        return max(plots, *labels)

    def minimumSizeHint(self) -> QSize:  # noqa: N802 (Qt override)
        """The narrow arrangement's least width: squeezed below the wide one, the plots rearrange
        instead of overflowing (see `resizeEvent`)."""
        return QSize(self.least_width(wide=False), super().minimumSizeHint().height())

    def resizeEvent(self, event) -> None:  # noqa: N802 (Qt override)
        super().resizeEvent(event)
        self._arrange(self.width() >= max(WIDE_WIDTH, self.least_width(wide=True)))

    def _show_budget(self, index: int) -> None:
        if self.budget_stack.currentIndex() != index:
            self.budget_stack.setCurrentIndex(index)
            self._stretch_rows()

    @property
    def showing_budget_heatmap(self) -> bool:
        return self.budget_stack.currentIndex() == 1

    # ---- drawing -------------------------------------------------------------------------------
    def render(self, entry: Entry | None) -> None:
        entries = self.state.ring.entries()
        if entry is None:
            for curve in (self.layer_estimate, self.layer_measured):
                curve.setData([], [])
            for curve in (self.step_estimate, self.step_measured):
                curve.setData([], [])
            self.info.setText("")
            self.budget_info.setText("")
            self.budget_note.setText(FIXED_BUDGET)
            self._show_budget(0)
            return
        self._measured = self._latest_measured(entries, entry)
        self._draw_layers(entry.snapshot)
        self._draw_steps(entries, entry)
        self._share_y_range()
        self._draw_budget(entry.snapshot)
        self.info.setText(self.step_text(entry))

    @staticmethod
    def _latest_measured(entries: list[Entry], viewed: Entry) -> Entry | None:
        """The latest step at or before the viewed one that the fidelity pass measured."""
        for e in reversed(entries):
            if e.seq <= viewed.seq and data.has_recall(e.snapshot):
                return e
        return None

    def _share_y_range(self) -> None:
        """Both plots on one 0-based scale, so estimate and measurement compare by eye."""
        ys = [
            curve.getData()[1]
            for curve in (
                self.layer_estimate,
                self.layer_measured,
                self.step_estimate,
                self.step_measured,
            )
        ]
        ys = [y for y in ys if y is not None and np.isfinite(y).any()]  # NaN: a layer's gap
        top = float(max(np.nanmax(y) for y in ys)) if ys else 0.0
        top = nice_ceiling(top) if top > 0 else 0.1
        for plot in (self.layer_plot, self.step_plot):
            plot.plotItem.setYRange(0.0, top, padding=0.02)

    def _draw_layers(self, snap) -> None:
        x = np.array([layer.layer for layer in snap.layers], dtype=np.float64)
        estimate = data.missed_column(snap, self.head).astype(np.float64)
        measured = np.full(len(snap.layers), np.nan)
        if self._measured is not None:
            # the latest measured step (layers by model index, like the estimate)
            by_layer = {
                layer.layer: data.recall_value(layer, self.head)
                for layer in self._measured.snapshot.layers
            }
            measured = 1.0 - np.array([by_layer.get(layer.layer, np.nan) for layer in snap.layers])
        has, got = np.isfinite(estimate), np.isfinite(measured)
        if has.any():  # a gap at each layer that runs no estimate
            self.layer_estimate.setData(x, estimate, connect="finite")
        else:
            self.layer_estimate.setData([], [])
        self.layer_measured.setData(x[got], measured[got])

    def _step_point(self, entry: Entry) -> tuple[int, float, float]:
        """(step, estimated, measured) of one kept step, computed once per (step, head)."""
        key = (entry.seq, self.head)
        point = self._history.get(key)
        if point is None:
            h = data.missed_history([entry.snapshot], self.head)
            point = (int(h.steps[0]), float(h.estimate[0]), float(h.measured[0]))
            self._history[key] = point
        return point

    def _draw_steps(self, entries: list[Entry], viewed: Entry) -> None:
        keep = {(e.seq, self.head) for e in entries}
        self._history = {k: v for k, v in self._history.items() if k in keep}
        points = np.array([self._step_point(e) for e in entries], dtype=np.float64).reshape(-1, 3)
        steps, estimate, measured = points[:, 0], points[:, 1], points[:, 2]
        has = np.isfinite(estimate)
        self.step_estimate.setData(steps[has], estimate[has])
        got = np.isfinite(measured)
        self.step_measured.setData(steps[got], measured[got])
        self.step_marker.setValue(float(viewed.snapshot.step))

    def _draw_budget(self, snap) -> None:
        self.budget = data.budget_matrix(snap)
        if not data.has_adaptive_budget(snap):
            exact = bool(snap.layers) and all(layer.exact for layer in snap.layers)
            self.budget_note.setText(EXACT_BUDGET if exact else FIXED_BUDGET)
            self._show_budget(0)
            self.budget_info.setText("")
            return
        self._show_budget(1)
        rows, cols = self.budget.shape
        top = float(np.nanmax(self.budget))
        top = top if top > 0 else 1.0
        self.budget_image.setImage(
            fraction_to_index(self.budget / top), autoLevels=False, levels=(0, 256)
        )
        self.budget_image.setRect(QRectF(0, 0, cols, rows))
        self.budget_axis.layer_ids = [layer.layer for layer in snap.layers]
        self.budget_axis.picture = None
        self.budget_plot.plotItem.getAxis("bottom").setTicks(
            [[(h + 0.5, str(h)) for h in range(cols)]]
        )
        self.budget_plot.plotItem.setXRange(0, cols, padding=0)
        self.budget_plot.plotItem.setYRange(0, rows, padding=0)
        self.budget_legend.set_gradient(self._lut, "0", f"{top:.0f} kept", none=(self._far, "none"))
        self.budget_info.setText(self.budget_text())

    # ---- text ----------------------------------------------------------------------------------
    def step_text(self, entry: Entry) -> str:
        """Viewed step: how it attended, estimated missed mass, measured one when measured."""
        snap = entry.snapshot
        parts = [f"step {snap.step}"]
        mode = data.attention_mode_text(snap)
        if mode:
            parts.append(mode)
        estimate = data.missed_column(snap, self.head)
        if np.isfinite(estimate).any():
            worst = int(np.nanargmax(estimate))
            retrieving = sum(not layer.exact for layer in snap.layers)
            some = int(np.isfinite(estimate).sum())
            where = (
                f" over the {some} of {retrieving} layers that run it" if some < retrieving else ""
            )
            parts.append(
                f"estimated missed mass mean {np.nanmean(estimate):.3f}{where}, highest layer "
                f"{snap.layers[worst].layer} ({estimate[worst]:.3f})"
            )
        elif snap.layers and mode == "A2ATS retrieving":
            parts.append(ESTIMATE_OFF)
        if self._measured is not None:
            measured = data.measured_missed_column(self._measured.snapshot, self.head)
            if np.isfinite(measured).any():
                at = self._measured.snapshot.step
                parts.append(f"measured (1 - recall) at step {at}: mean {np.nanmean(measured):.3f}")
        return " \u00b7 ".join(parts)

    def budget_text(self) -> str:
        """Summary of the drawn adaptive budget (kept far tokens per KV head)."""
        finite = self.budget[np.isfinite(self.budget)]
        if not finite.size:
            return ""
        return (
            f"adaptive budget, far tokens kept per KV head: mean {finite.mean():.1f}, "
            f"min {finite.min():.0f}, max {finite.max():.0f}"
        )

    def _on_theme(self, theme: Theme) -> None:
        self._lut = theme.sequential_lut()
        self._far = theme.categories[data.FAR]
        self.budget_image.setLookupTable(self._lut)
        estimate, measured = theme.head_color(0), theme.head_color(1)
        for curve in (self.layer_estimate, self.step_estimate):
            curve.setPen(pg.mkPen(estimate, width=2))
            curve.setSymbol("o")
            curve.setSymbolSize(4)
            curve.setSymbolBrush(estimate)
            curve.setSymbolPen(None)
        for curve in (self.layer_measured, self.step_measured):
            curve.setPen(None)
            curve.setSymbol("x")
            curve.setSymbolSize(8)
            curve.setSymbolPen(pg.mkPen(measured, width=2))
            curve.setSymbolBrush(None)
        self.step_marker.setPen(pg.mkPen(theme.marker, width=1.5))
        self.legend.set_categories(
            [(estimate, "estimated missed mass"), (measured, "measured: 1 - recall")]
        )
