"""Memory: per-layer bytes in memory vs an fp16 full cache, totals, and a line over the reply.

The summary names three figures: what the cache holds in memory, what it keeps on disk (the
cold tier's file, `A2ATSConfig.kv_memory`), and what an fp16 cache would hold; beside them the
process's private memory as the OS measures it. A cache that holds more than the fp16 cache is
called larger, never "saved".

Native layers (the model's own caches, `CacheSnapshot.native_bytes`) are one more bar, "native",
and count in the totals on both sides: they hold the same with or without A2ATS. The codebook
(`CacheSnapshot.codebook_bytes`: held once per model, shared by all chats of that model) is its
own bar, "codebook", counted in the held total and the ratio (an fp16 cache needs none)."""

from __future__ import annotations

import math

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QHBoxLayout, QVBoxLayout, QWidget

from . import data
from .plot_theme import Theme
from .state import InspectorState
from .widgets import LegendBar, PanelBody, ThemedPlot, nice_ceiling, small_label

MB = 1024 * 1024


def format_bytes(n: float) -> str:
    """Human-readable bytes (binary units)."""
    for unit, size in (("GB", 1024**3), ("MB", MB), ("KB", 1024)):
        if abs(n) >= size:
            return f"{n / size:.1f} {unit}"
    return f"{int(n)} B"


TICK_SPACING_PX = 34  # horizontal room per layer label on the bars' axis


class MemoryPanel(PanelBody):
    """Bars per layer (held vs fp16) and the reply's totals per step, with a summary line."""

    def __init__(self, state: InspectorState, parent: QWidget | None = None) -> None:
        super().__init__(state, parent)
        self.last_summary: data.MemorySummary | None = None
        self._ranges: tuple | None = None
        self._ticks: list | None = None
        self._build()

    def _build(self) -> None:
        self.bars_plot = ThemedPlot()
        bars = self.bars_plot.plotItem
        bars.setLabel("bottom", "layer")
        bars.setLabel("left", "MB")
        bars.showGrid(x=False, y=True, alpha=0.15)
        bars.setMouseEnabled(x=False, y=False)
        self.fp16_bars = pg.BarGraphItem(x=[], height=[], width=0.42)
        self.held_bars = pg.BarGraphItem(x=[], height=[], width=0.42)
        bars.addItem(self.fp16_bars)
        bars.addItem(self.held_bars)

        self.line_plot = ThemedPlot()
        line = self.line_plot.plotItem
        line.setLabel("bottom", "decode step")  # short: the plot fits a one-column dock
        self.line_plot.setToolTip("Memory of all layers at each decode step of this reply")
        line.setLabel("left", "MB, all layers")
        line.showGrid(x=True, y=True, alpha=0.15)
        self.fp16_line = pg.PlotDataItem()
        self.held_line = pg.PlotDataItem()
        self.step_marker = pg.InfiniteLine(angle=90, movable=False)
        line.addItem(self.fp16_line)
        line.addItem(self.held_line)
        line.addItem(self.step_marker)
        for plot in (self.bars_plot, self.line_plot):
            plot.on_theme = self._on_theme
            plot.setMinimumHeight(110)

        self.legend = LegendBar()
        self.summary = small_label("", 2, bold=True)

        plots = QHBoxLayout()
        plots.setSpacing(4)
        plots.addWidget(self.bars_plot, 3)
        plots.addWidget(self.line_plot, 2)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.setSpacing(2)
        layout.addWidget(self.summary)
        layout.addLayout(plots, 1)
        layout.addWidget(self.legend)
        self._on_theme(self.bars_plot.theme)

    def render(self) -> None:
        entry = self.state.entry()
        if entry is None:
            self.fp16_bars.setOpts(x=[], height=[])
            self.held_bars.setOpts(x=[], height=[])
            self.fp16_line.setData([], [])
            self.held_line.setData([], [])
            self.summary.setText("Waiting for telemetry.")
            return
        series = self.state.ring.byte_series(entry.reply)
        most_ticks = max(2, self.bars_plot.width() // TICK_SPACING_PX)
        key = (entry.seq, len(series), most_ticks)
        if key == self._key:
            return
        self._key = key
        summary = data.memory_summary(entry.snapshot)
        self.last_summary = summary
        held, fp16 = summary.held, summary.fp16
        ids = [str(layer.layer) for layer in entry.snapshot.layers]
        every = max(1, math.ceil(len(ids) / min(10, most_ticks)))  # labels that fit the width
        ticks = [(i, lid) for i, lid in enumerate(ids) if i % every == 0]
        if summary.native:
            held, fp16 = np.append(held, summary.native), np.append(fp16, summary.native)
            ticks.append((len(ids), "native"))
            ids.append("native")
        if summary.codebook:
            held, fp16 = np.append(held, summary.codebook), np.append(fp16, 0)
            ticks.append((len(ids), "codebook"))
            ids.append("codebook")
        x = np.arange(len(held), dtype=float)
        self.fp16_bars.setOpts(x=x - 0.22, height=fp16 / MB)
        self.held_bars.setOpts(x=x + 0.22, height=held / MB)
        if ticks != self._ticks:
            self._ticks = ticks
            self.bars_plot.plotItem.getAxis("bottom").setTicks([ticks])
        # rounded tops with ~8% headroom: the axes change only when the data outgrows them
        bar_top = nice_ceiling(1.08 * float(max(fp16.max(initial=0), held.max(initial=0))) / MB)
        steps, held, fp16 = series.arrays()
        line_top = nice_ceiling(1.08 * float(max(fp16.max(initial=0), held.max(initial=0), 1)) / MB)
        self.fp16_line.setData(steps.astype(float), fp16 / MB)
        self.held_line.setData(steps.astype(float), held / MB)
        self.step_marker.setValue(entry.snapshot.step)
        first = float(steps[0]) if steps.size else 0.0
        span = nice_ceiling(max(float(steps[-1]) - first, 8.0)) if steps.size else 8.0
        self._set_ranges(len(ids), bar_top, first, span, line_top)
        self.summary.setText(self.summary_text(summary))

    def _set_ranges(
        self, layers: int, bar_top: float, first: float, span: float, top: float
    ) -> None:
        """Rounded ranges, changed only when the data outgrows them (axes redraw rarely)."""
        ranges = (layers, bar_top, first, span, top)
        if ranges == self._ranges:
            return
        self._ranges = ranges
        self.bars_plot.plotItem.setXRange(-0.6, max(layers - 0.4, 0.4), padding=0)
        self.bars_plot.plotItem.setYRange(0, bar_top, padding=0)
        self.line_plot.plotItem.setXRange(first, first + span, padding=0.01)
        self.line_plot.plotItem.setYRange(0, top, padding=0)

    @staticmethod
    def summary_text(summary: data.MemorySummary) -> str:
        if summary.total_held <= 0:
            return "No cache bytes reported yet."
        parts = [f"in memory {format_bytes(summary.total_held)}"]
        if summary.on_disk:
            parts.append(f"on disk {format_bytes(summary.on_disk)}")
        parts.append(f"an fp16 cache would hold {format_bytes(summary.total_fp16)}")
        if summary.ratio >= 1:
            parts.append(f"{summary.ratio:.2f}\u00d7 less in memory")
        elif summary.ratio > 0:
            parts.append(f"{1 / summary.ratio:.2f}\u00d7 more in memory")
        if summary.process is not None:
            parts.append(f"process {format_bytes(summary.process)} (measured)")
        notes = []
        if summary.codebook:
            notes.append(
                f"codebook {format_bytes(summary.codebook)}: one per model, shared by all its chats"
            )
        if summary.native:
            notes.append(f"native layers {format_bytes(summary.native)} on both sides")
        text = " \u00b7 ".join(parts)
        return f"{text} ({'; '.join(notes)})" if notes else text

    def _on_theme(self, theme: Theme) -> None:
        self._theme = theme
        self.fp16_bars.setOpts(brush=theme.fp16, pen=pg.mkPen(None))
        self.held_bars.setOpts(brush=theme.held, pen=pg.mkPen(None))
        self.fp16_line.setPen(pg.mkPen(theme.fp16, width=2, style=Qt.PenStyle.DashLine))
        self.held_line.setPen(pg.mkPen(theme.held, width=2))
        self.step_marker.setPen(pg.mkPen(theme.marker, width=1))
        self.legend.set_categories(
            [
                (theme.held, "held (A2ATS: K/V + codes + rotations; codebook bar)"),
                (theme.fp16, "fp16 full cache"),
            ]
        )
        self._key = None
