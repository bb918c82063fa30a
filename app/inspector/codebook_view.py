"""Codebook usage: a layer's code histogram sorted by use, and a layers x metrics table."""

from __future__ import annotations

import math

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import QSize, Qt
from PySide6.QtGui import QColor
from PySide6.QtWidgets import (
    QAbstractItemView,
    QCheckBox,
    QComboBox,
    QHeaderView,
    QLayout,
    QSplitter,
    QTableWidget,
    QTableWidgetItem,
    QVBoxLayout,
    QWidget,
)

from . import data
from .plot_theme import Theme
from .snapshot_ring import Entry
from .state import InspectorState
from .widgets import (
    LegendBar,
    PanelBody,
    ThemedPlot,
    combo_head,
    combo_value,
    controls_row,
    head_combo,
    nice_ceiling,
    select_data,
    select_head,
    small_label,
    sync_head_combo,
    sync_layer_combo,
)

COLUMNS = ("layer", "entropy", "dead", "top code")
WIDE_LAYOUT_PX = 620  # narrower than this: the histogram goes above the table
COLUMN_TIPS = (
    "Model layer",
    "Entropy of code use over the cached tokens, in bits (at most log2 of the codebook size)",
    "Dead codes: codes no cached token uses (unavoidable while tokens < codes)",
    "Share of the cached tokens assigned to the most used code",
)


class CountAxis(pg.AxisItem):
    """Log-count axis with labels only at 1, 2 and 5 times a power of ten."""

    def tickValues(self, minVal, maxVal, size):  # noqa: N802,N803 (pyqtgraph override)
        if not self.logMode:
            return super().tickValues(minVal, maxVal, size)
        lo, hi = math.floor(min(minVal, maxVal)), math.ceil(max(minVal, maxVal))
        decades = [float(k) for k in range(lo, hi + 1)]
        steps = [math.log10(m) + k for k in range(lo, hi + 1) for m in (2, 5)]
        show_steps = (hi - lo) <= 3
        return [(1.0, decades), (0.5, steps if show_steps else [])]

    def tickStrings(self, values, scale, spacing):  # noqa: N802 (pyqtgraph override)
        if not self.logMode:
            return super().tickStrings(values, scale, spacing)
        return [_short_count(10**v) for v in values]


def _short_count(n: float) -> str:
    n = round(n, 6)
    if n >= 1e6:
        return f"{n / 1e6:g}M"
    if n >= 1e3:
        return f"{n / 1e3:g}k"
    return f"{n:g}"


class CodebookPanel(PanelBody):
    """Sorted code-use histogram of one layer plus per-layer entropy / dead codes / top share."""

    def __init__(self, state: InspectorState, parent: QWidget | None = None) -> None:
        super().__init__(state, parent)
        self._curves: list[pg.PlotDataItem] = []
        self._stats: list[data.CodeStats] = []
        self._layer_ids: list[int] = []
        self._ranges: tuple | None = None
        self._texts: dict[tuple[int, int], str] = {}
        self._build()

    def _build(self) -> None:
        self.layer_combo = QComboBox()
        self.layer_combo.setToolTip("Layer whose histogram is drawn")
        self.layer_combo.setAccessibleName("Codebook layer")
        self.head_combo = head_combo("all heads", "KV head (each has its own codebook)")
        self.log_box = QCheckBox("log scale")
        self.log_box.setChecked(True)
        self.log_box.setToolTip("Logarithmic count axis")
        self.layer_combo.currentIndexChanged.connect(self._on_choice_changed)
        self.head_combo.currentIndexChanged.connect(self._on_choice_changed)
        self.log_box.toggled.connect(self._on_log_toggled)

        self.plot = ThemedPlot(axisItems={"left": CountAxis("left")})
        item = self.plot.plotItem
        item.setLabel("bottom", "code rank")  # a short title: the plot stays narrow enough
        self.plot.setToolTip("Tokens per code, the codes ordered by use (most used first)")
        item.setLabel("left", "tokens")
        item.setLogMode(x=False, y=True)
        item.showGrid(x=False, y=True, alpha=0.15)
        # codes no cached token uses, right of the last used rank
        self.dead_region = pg.LinearRegionItem(movable=False)
        for line in self.dead_region.lines:
            line.setPen(pg.mkPen(None))
        item.addItem(self.dead_region)
        self.plot.on_theme = self._on_theme
        self.plot.setMinimumHeight(90)
        self.legend = LegendBar()

        self.table = QTableWidget(0, len(COLUMNS))
        self.table.setHorizontalHeaderLabels(list(COLUMNS))
        for col, tip in enumerate(COLUMN_TIPS):
            self.table.horizontalHeaderItem(col).setToolTip(tip)
        self.table.verticalHeader().setVisible(False)
        self.table.verticalHeader().setDefaultSectionSize(self.fontMetrics().height() + 4)
        header = self.table.horizontalHeader()
        header.setSectionResizeMode(QHeaderView.ResizeMode.Stretch)
        fm = header.fontMetrics()
        widths = [fm.horizontalAdvance(c) + 18 for c in COLUMNS]
        header.setMinimumSectionSize(min(widths))
        self.table.setMinimumWidth(sum(widths) + 24)  # every header readable
        self.table.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        self.table.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
        self.table.setSelectionMode(QAbstractItemView.SelectionMode.SingleSelection)
        self.table.setAlternatingRowColors(True)
        self.table.cellClicked.connect(self._on_row_clicked)
        self.table.setAccessibleName("Codebook statistics per layer")
        self.summary = small_label("", 2)

        left = QWidget()
        left_layout = QVBoxLayout(left)
        left_layout.setContentsMargins(0, 0, 0, 0)
        left_layout.addWidget(self.plot, 1)
        left_layout.addWidget(self.legend)
        self.split = split = QSplitter(Qt.Orientation.Horizontal)
        split.addWidget(left)
        split.addWidget(self.table)
        split.setStretchFactor(0, 3)
        split.setStretchFactor(1, 2)
        split.setSizes([400, 260])
        split.setChildrenCollapsible(False)

        layout = QVBoxLayout(self)
        # our minimum is `minimumSizeHint`'s (histogram above the table), not the side-by-side one
        layout.setSizeConstraint(QLayout.SizeConstraint.SetNoConstraint)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.setSpacing(2)
        layout.addLayout(controls_row(self.layer_combo, self.head_combo, self.log_box))
        layout.addWidget(split, 1)
        layout.addWidget(self.summary)
        self._on_theme(self.plot.theme)

    # ---- settings -------------------------------------------------------------------------
    @property
    def layer_row(self) -> int:
        row = combo_value(self.layer_combo)
        return int(row) if row is not None else 0

    def set_layer_row(self, row: int) -> None:
        select_data(self.layer_combo, row)

    @property
    def head(self) -> int | None:
        return combo_head(self.head_combo)

    def set_head(self, head: int | None) -> None:
        select_head(self.head_combo, head)

    # ---- drawing --------------------------------------------------------------------------
    def render(self) -> None:
        entry = self.state.entry(histograms=True)
        if entry is None or not entry.snapshot.layers:
            for curve in self._curves:
                curve.setData([], [])
            self.table.setRowCount(0)
            self.summary.setText("Waiting for telemetry.")
            return
        snap = entry.snapshot
        sync_head_combo(self.head_combo, data.num_kv_heads(snap))
        ids = [layer.layer for layer in snap.layers]
        if ids != self._layer_ids:
            self._layer_ids = ids
            sync_layer_combo(self.layer_combo, ids)
        key = (entry.seq, self.layer_row, self.head)
        if key == self._key:
            return
        self._key = key
        self._draw_histogram(entry)
        self._fill_table(entry)

    def _draw_histogram(self, entry: Entry) -> None:
        layers = entry.snapshot.layers
        row = min(self.layer_row, len(layers) - 1)
        layer = layers[row]
        heads = range(len(layer.code_counts)) if self.head is None else [self.head]
        heads = [h for h in heads if h < len(layer.code_counts)]
        self._ensure_curves(len(layer.code_counts))
        legend = []
        top = 1.0
        for h, curve in enumerate(self._curves):
            if h not in heads:
                curve.setData([], [])
                curve.hide()
                continue
            counts = data.sorted_counts(layer.code_counts[h])
            used = counts[counts > 0]
            # step-shaped curve over used codes only (log axis cannot show zero)
            x = np.arange(used.size + 1, dtype=float)
            curve.setData(x, used.astype(float), stepMode="center")
            curve.show()
            top = max(top, float(used[0]) if used.size else 1.0)
            legend.append((self._theme.head_color(h), f"KV head {h}"))
        n_codes = layer.code_counts[0].size if layer.code_counts else 0
        used_max = max((int(np.count_nonzero(layer.code_counts[h])) for h in heads), default=0)
        self.dead_region.setRegion((used_max, n_codes))
        self.dead_region.setVisible(used_max < n_codes)
        legend.append((self._dead_colour, "dead codes"))
        self.legend.set_categories(legend)
        self._set_ranges(layer.code_counts[0].size if layer.code_counts else 1, top)
        stats = data.layer_code_stats(layer, self.head)
        who = "mean over KV heads" if self.head is None else f"KV head {self.head}"
        self.summary.setText(
            f"layer {layer.layer} ({who}): {stats.tokens} tokens on {stats.used} of "
            f"{stats.n_codes} codes \u00b7 entropy {stats.entropy_bits:.2f} of "
            f"{stats.max_bits:.1f} bits \u00b7 {stats.dead} dead \u00b7 top code "
            f"{100 * stats.top_share:.1f}%"
        )

    def _set_ranges(self, n_codes: int, top: float) -> None:
        """Fixed x (every code) and a rounded y, so the axes are not redrawn every step."""
        ranges = (n_codes, nice_ceiling(top), self.log_box.isChecked())
        if ranges == self._ranges:
            return
        self._ranges = ranges
        item = self.plot.plotItem
        item.setXRange(0, n_codes, padding=0.01)
        if self.log_box.isChecked():
            item.setYRange(-0.2, math.log10(ranges[1]) + 0.05, padding=0)
        else:
            item.setYRange(0, ranges[1], padding=0)

    def _ensure_curves(self, heads: int) -> None:
        while len(self._curves) < heads:
            h = len(self._curves)
            curve = pg.PlotDataItem(stepMode="center")
            self._style_curve(curve, h)
            self.plot.plotItem.addItem(curve)
            self._curves.append(curve)

    def _style_curve(self, curve: pg.PlotDataItem, head: int) -> None:
        colour = QColor(self._theme.head_color(head))
        curve.setPen(pg.mkPen(colour, width=1.6))
        fill = QColor(colour)
        fill.setAlpha(40)
        curve.setBrush(fill)
        curve.setFillLevel(0)

    def _fill_table(self, entry: Entry) -> None:
        layers = entry.snapshot.layers
        self._stats = data.snapshot_code_stats(entry.snapshot, self.head)
        if self.table.rowCount() != len(layers):
            self.table.setRowCount(len(layers))
            self._texts = {}
        for row, (layer, st) in enumerate(zip(layers, self._stats, strict=True)):
            values = (
                str(layer.layer),
                f"{st.entropy_bits:.2f}",
                f"{st.dead}",
                f"{100 * st.top_share:.1f}%",
            )
            for col, text in enumerate(values):
                key = (row, col)
                if self._texts.get(key) == text:
                    continue
                self._texts[key] = text
                item = self.table.item(row, col)
                if item is None:
                    item = QTableWidgetItem()
                    item.setTextAlignment(Qt.AlignmentFlag.AlignCenter)
                    self.table.setItem(row, col, item)
                item.setText(text)
        row = min(self.layer_row, len(layers) - 1)
        if self.table.currentRow() != row:
            self.table.blockSignals(True)
            self.table.selectRow(row)
            self.table.blockSignals(False)

    def table_stats(self) -> list[data.CodeStats]:
        """Per-layer statistics currently shown in the table (row order)."""
        return list(self._stats)

    def curve_data(self, head: int) -> np.ndarray:
        """The sorted counts drawn for one head (empty when hidden)."""
        if head >= len(self._curves):
            return np.zeros(0)
        y = self._curves[head].yData
        return np.zeros(0) if y is None else np.asarray(y)

    # ---- events ---------------------------------------------------------------------------
    def _on_theme(self, theme: Theme) -> None:
        self._theme = theme
        dead = QColor(theme.categories[data.FAR])
        self._dead_colour = dead.name()
        dead.setAlpha(150)
        self.dead_region.setBrush(dead)
        for h, curve in enumerate(self._curves):
            self._style_curve(curve, h)
        self._key = None

    def _on_choice_changed(self, _index: int) -> None:
        self._key = None
        self.redraw_requested.emit()

    def _on_log_toggled(self, on: bool) -> None:
        self.plot.plotItem.setLogMode(x=False, y=on)
        self._ranges = None
        self._key = None
        self.redraw_requested.emit()

    def minimumSizeHint(self) -> QSize:  # noqa: N802 (Qt override)
        """The narrow arrangement's least width (histogram above the table): squeezed below
        the side-by-side one, the panel rearranges instead of overflowing."""
        parts = (self.split.widget(0), self.table, self.summary)
        controls = self.layout().itemAt(0).minimumSize().width()
        least = max(controls, *(w.minimumSizeHint().width() for w in parts))
        return QSize(least, super().minimumSizeHint().height())

    def resizeEvent(self, event) -> None:  # noqa: N802 (Qt override)
        super().resizeEvent(event)
        # side by side when there is room, histogram above the table in a narrow dock
        beside = sum(w.minimumSizeHint().width() for w in (self.split.widget(0), self.table))
        wide = event.size().width() >= max(WIDE_LAYOUT_PX, beside + self.split.handleWidth())
        orientation = Qt.Orientation.Horizontal if wide else Qt.Orientation.Vertical
        if self.split.orientation() != orientation:
            self.split.setOrientation(orientation)
            extent = event.size().width() if wide else event.size().height()
            share = 0.6 if wide else 0.5
            self.split.setSizes([int(extent * share), int(extent * (1 - share))])

    def _on_row_clicked(self, row: int, _col: int) -> None:
        self.set_layer_row(row)
