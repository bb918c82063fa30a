"""Fidelity: estimated missed mass and the budget per head (every step, `estimate_view.py`),
and a layers x steps heat strip of the attention mass the selection recalled.

Recall comes from the optional shadow exact-attention pass (every k-th step). Without it the
strip explains how to turn it on instead of drawing an empty plot.
"""

from __future__ import annotations

import math

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import QRectF, Qt
from PySide6.QtWidgets import QLabel, QStackedWidget, QVBoxLayout, QWidget

from . import data
from .estimate_view import EstimateView
from .plot_theme import Theme, fraction_to_index
from .retrieval_map import LayerAxis
from .snapshot_ring import Entry
from .state import InspectorState
from .widgets import (
    LegendBar,
    PanelBody,
    combo_head,
    controls_row,
    head_combo,
    heat_plot,
    small_label,
    sync_head_combo,
)

OFF_HINT = (
    "Fidelity is off. Turn on the fidelity shadow pass in Settings to measure how much exact "
    "attention mass each layer's selection recalls (an extra exact pass every k-th step)."
)


class StepAxis(pg.AxisItem):
    """Bottom axis of the strip: column index -> decode step number."""

    def __init__(self) -> None:
        super().__init__("bottom")
        self.steps: list[int] = []

    def tickStrings(self, values, scale, spacing):  # noqa: N802 (pyqtgraph override)
        out = []
        for v in values:
            col = math.floor(v)
            out.append(str(self.steps[col]) if 0 <= col < len(self.steps) else "")
        return out


class FidelityPanel(PanelBody):
    """Recall heat strip (layers x measured steps), its colour scale and the measured cost."""

    def __init__(self, state: InspectorState, parent: QWidget | None = None) -> None:
        super().__init__(state, parent)
        self.matrix = np.zeros((0, 0), dtype=np.float32)  # [L, measured steps] as drawn
        self._entries: list[Entry] = []
        self._columns: dict[tuple, np.ndarray] = {}
        self._viewed_seq: int | None = None
        self._build()

    def _build(self) -> None:
        self.head_combo = head_combo(
            "mean of heads", "KV head whose missed mass and recall are shown"
        )
        self.estimate = EstimateView(self.state)
        self.head_combo.currentIndexChanged.connect(self._on_choice_changed)
        self.hint = QLabel(OFF_HINT)
        self.hint.setWordWrap(True)
        self.hint.setAlignment(Qt.AlignmentFlag.AlignCenter)
        self.hint.setMargin(12)

        self.layer_axis = LayerAxis()
        self.step_axis = StepAxis()
        axes = {"left": self.layer_axis, "bottom": self.step_axis}
        self.plot, self.image = heat_plot("decode step (measured steps)", "layer", axes)
        item = self.plot.plotItem
        self.marker = pg.InfiniteLine(angle=90, movable=False)
        item.addItem(self.marker)
        self.plot.on_theme = self._on_theme
        self.plot.setMinimumHeight(90)
        self.plot.scene().sigMouseMoved.connect(self._on_mouse_moved)
        self.legend = LegendBar()
        self.info = small_label("", 2)

        strip = QWidget()
        strip_layout = QVBoxLayout(strip)
        strip_layout.setContentsMargins(0, 0, 0, 0)
        strip_layout.setSpacing(2)
        strip_layout.addWidget(self.plot, 1)
        strip_layout.addWidget(self.legend)
        strip_layout.addWidget(self.info)
        self.stack = QStackedWidget()
        self.stack.addWidget(self.hint)
        self.stack.addWidget(strip)
        self.cost = small_label("", 1)

        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.setSpacing(2)
        layout.addLayout(controls_row(self.head_combo))
        layout.addWidget(self.estimate, 3)
        layout.addWidget(self.stack, 2)
        layout.addWidget(self.cost)
        self._on_theme(self.plot.theme)

    @property
    def head(self) -> int | None:
        return combo_head(self.head_combo)

    @property
    def showing_strip(self) -> bool:
        return self.stack.currentIndex() == 1

    def render(self) -> None:
        entry = self.state.entry()
        measured = [e for e in self.state.ring.entries() if data.has_recall(e.snapshot)]
        self.cost.setText(self.cost_text())
        if entry is not None:
            sync_head_combo(self.head_combo, data.num_kv_heads(entry.snapshot))
        self.estimate.head = self.head
        self.estimate.render(entry)
        if entry is None or not measured:
            self.stack.setCurrentIndex(0)
            self.hint.setText(
                OFF_HINT
                if not self.state.fidelity.enabled
                else "Fidelity is on: the first measured step will appear here."
            )
            self._key = None
            return
        self.stack.setCurrentIndex(1)
        key = (measured[0].seq, measured[-1].seq, len(measured), self.head)
        if key != self._key:
            self._key = key
            self._draw_strip(measured)
        if entry.seq != self._viewed_seq:
            self._viewed_seq = entry.seq
            viewed = [i for i, e in enumerate(measured) if e.seq <= entry.seq]
            self.marker.setValue((viewed[-1] + 0.5) if viewed else 0.0)
            self.marker.setVisible(bool(viewed))
            latest = measured[viewed[-1]] if viewed else entry
            self.info.setText(self.step_text(latest, entry))

    def _column(self, entry: Entry) -> np.ndarray:
        """Recall of one measured step per layer, computed once per (step, head)."""
        key = (entry.seq, self.head)
        column = self._columns.get(key)
        if column is None:
            column = data.recall_column(entry.snapshot, self.head)
            self._columns[key] = column
        return column

    def _draw_strip(self, measured: list[Entry]) -> None:
        self._entries = measured
        keep = {(e.seq, self.head) for e in measured}
        self._columns = {k: v for k, v in self._columns.items() if k in keep}
        rows = max(len(e.snapshot.layers) for e in measured)
        self.matrix = np.full((rows, len(measured)), np.nan, dtype=np.float32)
        for j, e in enumerate(measured):
            column = self._column(e)
            self.matrix[: column.size, j] = column
        cols = len(measured)
        self.layer_axis.layer_ids = [layer.layer for layer in measured[-1].snapshot.layers]
        self.step_axis.steps = [e.snapshot.step for e in measured]
        self.layer_axis.picture = None
        self.step_axis.picture = None
        low = self._low_level()
        scaled = (self.matrix - low) / (1.0 - low)
        # recall exactly at the low end must stay visible (index 0 means "not measured")
        scaled = np.where(np.isnan(self.matrix), np.nan, np.clip(scaled, 1e-6, 1.0))
        self.image.setImage(fraction_to_index(scaled), autoLevels=False, levels=(0, 256))
        self.image.setRect(QRectF(0, 0, cols, rows))
        self.plot.plotItem.setXRange(0, cols, padding=0)
        self.plot.plotItem.setYRange(0, rows, padding=0)
        self.legend.set_gradient(
            self._lut,
            f"recall {low:.2f}",
            "1.00",
            none=(self._theme.categories[data.FAR], "not measured"),
        )
        self._viewed_seq = None  # the marker's column may have moved

    def _low_level(self) -> float:
        """Lower end of the colour scale: the lowest recall rounded down to 0.1 (at most 0.9)."""
        finite = self.matrix[np.isfinite(self.matrix)]
        lowest = float(finite.min()) if finite.size else 1.0
        return max(0.0, min(0.9, math.floor(lowest * 10) / 10))

    def step_text(self, measured: Entry, viewed: Entry) -> str:
        """Summary of the latest measured step at or before the viewed one."""
        layers = measured.snapshot.layers
        values = np.array([data.recall_value(layer, self.head) for layer in layers])
        if not np.isfinite(values).any():
            return f"step {viewed.snapshot.step}: no measured step yet"
        worst = int(np.nanargmin(values))
        which = f"step {measured.snapshot.step}"
        if measured.seq != viewed.seq:
            which += " (latest measured)"
        if any(layer.would_retrieve for layer in layers):  # an exact step's shadow selection
            mean = float(np.nanmean(values))
            return (
                f"{which} attended exactly: retrieval there would keep {mean:.3f} of the "
                f"attention (miss {1 - mean:.3f}) \u00b7 lowest layer {layers[worst].layer} "
                f"({values[worst]:.3f}) \u00b7 highest {np.nanmax(values):.3f}"
            )
        return (
            f"{which}: mean recall {np.nanmean(values):.3f} \u00b7 lowest layer "
            f"{layers[worst].layer} ({values[worst]:.3f}) \u00b7 highest "
            f"{np.nanmax(values):.3f}"
        )

    def cost_text(self) -> str:
        info = self.state.fidelity
        parts = []
        if info.every:
            parts.append(f"shadow pass every {info.every} steps")
        if info.cost_ms is not None:
            parts.append(f"{info.cost_ms:.1f} ms per measured step")
        if info.overhead is not None:
            parts.append(f"measured slowdown {100 * info.overhead:.1f}% tokens/s")
        return ("Cost: " + ", ".join(parts)) if parts else ""

    def _on_mouse_moved(self, scene_pos) -> None:
        vb = self.plot.plotItem.vb
        if not vb.sceneBoundingRect().contains(scene_pos) or self.matrix.size == 0:
            return
        p = vb.mapSceneToView(scene_pos)
        row, col = math.floor(p.y()), math.floor(p.x())
        rows, cols = self.matrix.shape
        if not (0 <= row < rows and 0 <= col < cols):
            return
        layer = self._entries[col].snapshot.layers[row]
        per_head = ", ".join(f"{r:.3f}" for r in (layer.recall or ()))
        self.info.setText(
            f"layer {layer.layer} \u00b7 step {self._entries[col].snapshot.step} \u00b7 recall "
            f"{self.matrix[row, col]:.3f} (per KV head: {per_head})"
        )

    def _on_theme(self, theme: Theme) -> None:
        self._theme = theme
        self._lut = theme.sequential_lut()
        self.image.setLookupTable(self._lut)
        self.marker.setPen(pg.mkPen(theme.marker, width=1.5))
        self._key = None
        self._viewed_seq = None

    def _on_choice_changed(self, _index: int) -> None:
        self._key = None
        self._viewed_seq = None
        self.redraw_requested.emit()
