"""Window & retrieval map: layers x context positions of one decode step (or the reply so far).

With the model's layer plan (`InspectorState.plan`) every cache slot is a row: A2ATS layers show
their categories, native layers (the model's own cache: a sliding window, SSM state...) are grey
bands labelled with their reason ("sliding window 512, native"): a sliding band covers the
positions that layer still holds. Without a plan the rows are the snapshot's (A2ATS) layers.

Current-step mode colours every position by category (sinks, far, retrieved, window, current
token); frequency mode colours it by how often it was retrieved over the reply. Wide contexts are
drawn at screen resolution by max-pooling columns (categories are ordered by priority), so a
single retrieved token never disappears between pixels.
"""

from __future__ import annotations

import math

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import QRectF, Qt, Signal
from PySide6.QtGui import QBrush, QColor, QPen
from PySide6.QtWidgets import (
    QComboBox,
    QGraphicsRectItem,
    QLabel,
    QToolButton,
    QVBoxLayout,
    QWidget,
)

from a2ats_engine.cache.layer_plan import A2ATS

from . import data
from .plot_theme import Theme, fraction_to_index
from .snapshot_ring import Entry
from .state import InspectorState, printable_token
from .widgets import (
    LegendBar,
    PanelBody,
    combo_head,
    combo_value,
    controls_row,
    head_combo,
    heat_plot,
    select_data,
    select_head,
    small_label,
    sync_head_combo,
    sync_layer_combo,
)

MODE_STEP = "step"
MODE_FREQUENCY = "frequency"
HIGHLIGHT_OFF = "off"
HIGHLIGHT_ALL = "all"
RECENT_STEPS = 32  # "how often retrieved in the last steps" looks back this many kept steps
NATIVE_LABEL_MIN_PX = 11  # a native run's label is drawn only when its rows are this tall


def follow_span(width: int) -> int:
    """X extent shown while following a context of `width` positions: width rounded up to a
    step of about 3% (at least 16), so the view (and its axis) changes every few dozen tokens."""
    if width <= 0:
        return 1
    step = max(16, 2 ** math.floor(math.log2(max(width // 32, 1))))
    return -(-width // step) * step


class TokenAxis(pg.AxisItem):
    """Bottom axis: position numbers, or the tokens' own text once zoomed in far enough."""

    def __init__(self, state: InspectorState) -> None:
        super().__init__("bottom")
        self._state = state
        self._token_mode = False

    def tickValues(self, minVal, maxVal, size):  # noqa: N802,N803 (pyqtgraph override)
        span = maxVal - minVal
        self._token_mode = False
        if span <= 0 or size <= 0:
            return super().tickValues(minVal, maxVal, size)
        px_per_position = size / span
        if self._state.tokens and px_per_position >= 24:
            self._token_mode = True
            step = max(1, math.ceil(52 / px_per_position))
            first = max(0, math.ceil(minVal - 0.5))
            first += (-first) % step
            last = math.floor(maxVal - 0.5)
            return [(float(step), [p + 0.5 for p in range(first, last + 1, step)])]
        return super().tickValues(minVal, maxVal, size)

    def tickStrings(self, values, scale, spacing):  # noqa: N802 (pyqtgraph override)
        if self._token_mode:
            return [printable_token(self._state.token_text(int(v)), 8) for v in values]
        return [f"{int(round(v))}" if float(v).is_integer() else "" for v in values]


class LayerAxis(pg.AxisItem):
    """Left axis: one tick per row (as many as fit), labelled with the model layer index."""

    def __init__(self) -> None:
        super().__init__("left")
        self.layer_ids: list[int] = []

    def tickValues(self, minVal, maxVal, size):  # noqa: N802,N803 (pyqtgraph override)
        rows = len(self.layer_ids)
        if rows == 0 or size <= 0:
            return []
        minVal, maxVal = sorted((minVal, maxVal))  # noqa: N806 (the view is inverted)
        span = max(maxVal - minVal, 1e-9)
        step = max(1, math.ceil(14 / (size / span)))
        lo = max(0, math.floor(minVal))
        hi = min(rows - 1, math.ceil(maxVal))
        return [(float(step), [r + 0.5 for r in range(lo, hi + 1) if r % step == 0])]

    def tickStrings(self, values, scale, spacing):  # noqa: N802 (pyqtgraph override)
        out = []
        for v in values:
            row = int(v)
            out.append(str(self.layer_ids[row]) if 0 <= row < len(self.layer_ids) else "")
        return out


class RetrievalMapPanel(PanelBody):
    """Layers x positions map with legend, hover details, click-to-scroll and chat highlight."""

    scroll_requested = Signal(int)
    highlight_changed = Signal()

    def __init__(self, state: InspectorState, parent: QWidget | None = None) -> None:
        super().__init__(state, parent)
        self._full: np.ndarray = np.zeros((0, 0), dtype=np.uint8)  # [L, W] indices at full res
        self._full_key: tuple | None = None
        self._entry: Entry | None = None
        self._follow = True
        self._rendering = False
        self._shown: tuple[int, int, int] = (0, 1, 0)  # (start, factor, columns) now displayed
        self._layer_ids: list[int] = []
        self._highlight_ids: list[int] = []
        self._rows: list[data.MapRow] = []
        self._native_items: list = []  # grey bands of native rows
        self._native_labels: list[tuple[pg.TextItem, int, int]] = []  # (label, first row, rows)
        self._ranges: tuple[int, int] | None = None
        self._build()

    # ---- construction ---------------------------------------------------------------------
    def _build(self) -> None:
        self.mode_combo = QComboBox()
        self.mode_combo.addItem("this step", MODE_STEP)
        self.mode_combo.addItem("frequency (reply)", MODE_FREQUENCY)
        self.mode_combo.setToolTip(
            "Colour positions by their role at this step, or by how often "
            "they were retrieved over the reply so far"
        )
        self.head_combo = head_combo(
            "all heads", "KV head whose retrievals are shown (union over heads)"
        )
        self.highlight_combo = QComboBox()
        self.highlight_combo.setToolTip("Highlight in the chat the tokens retrieved at this step")
        self.highlight_combo.setAccessibleName("Chat highlight")
        sync_layer_combo(self.highlight_combo, [], self._highlight_prefix())
        self.fit_button = QToolButton()
        self.fit_button.setText("Fit")
        self.fit_button.setToolTip("Show the whole context and follow it as it grows")
        self.fit_button.setAutoRaise(True)
        self.fit_button.setEnabled(False)
        for combo in (self.mode_combo, self.head_combo):
            combo.currentIndexChanged.connect(self._on_view_changed)
        self.highlight_combo.currentIndexChanged.connect(lambda _i: self.highlight_changed.emit())
        self.head_combo.currentIndexChanged.connect(lambda _i: self.highlight_changed.emit())
        self.fit_button.clicked.connect(self._on_fit_clicked)
        highlight_label = QLabel("Chat:")

        self.layer_axis = LayerAxis()
        axes = {"bottom": TokenAxis(self.state), "left": self.layer_axis}
        self.plot, self.image = heat_plot("context position", "layer", axes, pan_x=True)
        item = self.plot.plotItem
        self.image.setAutoDownsample(False)  # we pool columns ourselves, by category priority
        self.boundary = pg.PlotDataItem(connect="pairs")
        item.addItem(self.boundary)
        # the current token is one column: a line keeps it visible at any zoom
        self.current_line = pg.InfiniteLine(angle=90, movable=False)
        item.addItem(self.current_line)
        item.vb.sigRangeChangedManually.connect(self._on_manual_range)
        item.vb.sigXRangeChanged.connect(self._on_range_changed)
        item.vb.sigResized.connect(self._on_range_changed)
        self.plot.scene().sigMouseMoved.connect(self._on_mouse_moved)
        self.plot.scene().sigMouseClicked.connect(self._on_mouse_clicked)
        self.plot.on_theme = self._on_theme
        self.plot.setMinimumHeight(140)

        self.legend = LegendBar()
        self.info = small_label("Hover the map for a token's details; click to scroll the chat.", 2)
        self.summary = small_label("", 2)

        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.setSpacing(2)
        layout.addLayout(
            controls_row(
                self.mode_combo,
                self.head_combo,
                highlight_label,
                self.highlight_combo,
                self.fit_button,
            )
        )
        layout.addWidget(self.plot, 1)
        layout.addWidget(self.legend)
        layout.addWidget(self.summary)
        layout.addWidget(self.info)
        self._on_theme(self.plot.theme)

    @staticmethod
    def _highlight_prefix() -> list[tuple[str, object]]:
        return [("no highlight", HIGHLIGHT_OFF), ("all layers", HIGHLIGHT_ALL)]

    # ---- settings -------------------------------------------------------------------------
    @property
    def mode(self) -> str:
        return combo_value(self.mode_combo)

    def set_mode(self, mode: str) -> None:
        select_data(self.mode_combo, mode)

    @property
    def head(self) -> int | None:
        return combo_head(self.head_combo)

    def set_head(self, head: int | None) -> None:
        select_head(self.head_combo, head)

    def highlight_choice(self) -> str | int:
        """HIGHLIGHT_OFF, HIGHLIGHT_ALL or a row index (layer of the snapshot)."""
        return combo_value(self.highlight_combo)

    def set_highlight_choice(self, choice: str | int) -> None:
        select_data(self.highlight_combo, choice)

    def highlight_for(self, entry: Entry | None) -> list[int]:
        """Positions to highlight in the chat for the current choice at `entry`'s step."""
        choice = self.highlight_choice()
        if entry is None or choice in (HIGHLIGHT_OFF, None):
            return []
        layer = None if choice == HIGHLIGHT_ALL else int(choice)
        return data.highlight_positions(entry.snapshot, layer, self.head)

    # ---- drawing --------------------------------------------------------------------------
    def render(self) -> None:
        """Redraw from the viewed step (cheap when only the visible range changed)."""
        entry = self.state.entry()
        self._entry = entry
        self._rendering = True
        try:
            if entry is None:
                self._clear()
                return
            snap = entry.snapshot
            rows = data.map_rows(snap, self.state.plan)
            self._sync_choosers(snap, rows)
            key = (entry.seq, self.mode, self.head)
            if key != self._full_key:
                self._rows = rows
                self._full = self._full_image(entry)
                self._full_key = key
                self._draw_boundary(snap)
                self._draw_native(snap)
                self.current_line.setValue(max(snap.offset - 0.5, 0))
                self._update_summary(entry)
            rows, width = self._full.shape
            vb = self.plot.plotItem.vb
            span = follow_span(width)
            if (span, rows) != self._ranges:
                # the axes are redrawn only when the context outgrows the span
                self._ranges = (span, rows)
                vb.setLimits(xMin=0, xMax=span, yMin=0, yMax=max(rows, 1))
                vb.setYRange(0, max(rows, 1), padding=0)
                if self._follow:
                    vb.setXRange(0, span, padding=0)
            self._draw_lod()
        finally:
            self._rendering = False

    def _clear(self) -> None:
        self._full = np.zeros((0, 0), dtype=np.uint8)
        self._full_key = None
        self.image.clear()
        self.boundary.setData([], [])
        self._remove_native_items()
        self.summary.setText("Waiting for the first decode step with telemetry.")

    def plan_changed(self) -> None:
        """The layer plan changed (another model): rebuild rows, axis and legend."""
        self._full_key = None
        self._layer_ids = []
        self._ranges = None
        if hasattr(self, "_theme"):
            self._apply_lut()

    def _sync_choosers(self, snap, rows: list[data.MapRow]) -> None:
        sync_head_combo(self.head_combo, data.num_kv_heads(snap))
        ids = [row.layer for row in rows]
        if ids != self._layer_ids:
            self._layer_ids = ids
            self.layer_axis.layer_ids = ids
            self.layer_axis.picture = None
            self.layer_axis.update()
        highlight_ids = [layer.layer for layer in snap.layers]  # only A2ATS layers retrieve
        if highlight_ids != self._highlight_ids:
            self._highlight_ids = highlight_ids
            sync_layer_combo(self.highlight_combo, highlight_ids, self._highlight_prefix())

    def _full_image(self, entry: Entry) -> np.ndarray:
        """uint8 [R, W]: category codes, or frequency LUT indices in frequency mode (R = map
        rows; native rows are 0 there and drawn by `_draw_native`)."""
        snap = entry.snapshot
        if self.mode == MODE_FREQUENCY:
            width = max((layer.offset for layer in snap.layers), default=0)
            freq = self.state.frequency.at(entry.seq, self.head)
            image = fraction_to_index(freq.fraction(len(snap.layers), width))
        else:
            image = data.category_image(snap, self.head)
        return data.expand_rows(image, self._rows)

    def _draw_lod(self) -> None:
        """Show the visible columns pooled down to about one column per screen pixel."""
        rows, width = self._full.shape
        if rows == 0 or width == 0:
            self.image.clear()
            self._shown = (0, 1, 0)
            return
        vb = self.plot.plotItem.vb
        (x0, x1), _ = vb.viewRange()
        lo = int(max(0, math.floor(x0)))
        hi = int(min(width, math.ceil(x1)))
        if hi <= lo:
            lo, hi = 0, width
        pixels = max(1, int(vb.width()))
        factor = max(1, math.ceil((hi - lo) / pixels))
        lo -= lo % factor
        self._place_native_labels()
        pooled = data.max_pool_columns(self._full[:, lo:hi], factor)
        self.image.setImage(pooled, autoLevels=False, levels=(0, self._lut_size()))
        self.image.setRect(QRectF(lo, 0, pooled.shape[1] * factor, rows))
        self._shown = (lo, factor, pooled.shape[1])

    def _lut_size(self) -> int:
        return len(self.image.lut) if self.image.lut is not None else 256

    def _draw_boundary(self, snap) -> None:
        xs, ys = [], []
        for row, map_row in enumerate(self._rows):
            if map_row.stats is None or snap.layers[map_row.stats].exact:
                continue
            layer = snap.layers[map_row.stats]
            xs += [layer.window_start, layer.window_start]
            ys += [row, row + 1]
        self.boundary.setData(np.asarray(xs, dtype=float), np.asarray(ys, dtype=float))

    def _remove_native_items(self) -> None:
        item = self.plot.plotItem
        for band in self._native_items:
            item.removeItem(band)
        for label, _first, _count in self._native_labels:
            item.removeItem(label)
        self._native_items, self._native_labels = [], []

    def _draw_native(self, snap) -> None:
        """Grey bands over native rows (a sliding window's band covers the positions it still
        holds; the evicted ones are blanked, in both modes) and one label per run of rows
        sharing a reason."""
        self._remove_native_items()
        item = self.plot.plotItem
        offset = snap.offset
        solid = QColor(self._theme.fp16)
        blank = QColor(self._theme.background)
        for first, count, reason in data.native_runs(self._rows):
            window = data.sliding_window(reason)
            start = max(0, offset - window) if window is not None else 0
            for lo, hi, colour in ((0, start, blank), (start, offset, solid)):
                if hi <= lo:
                    continue
                band = QGraphicsRectItem(QRectF(lo, first, hi - lo, count))
                band.setBrush(QBrush(colour))
                band.setPen(QPen(Qt.PenStyle.NoPen))
                item.addItem(band)
                self._native_items.append(band)
            label = pg.TextItem(f"{reason}, native", color=self._theme.foreground, anchor=(0, 0))
            item.addItem(label)
            self._native_labels.append((label, first, count))
        self._place_native_labels()

    def _place_native_labels(self) -> None:
        """Labels at the visible left edge, shown where their rows are tall enough to read."""
        vb = self.plot.plotItem.vb
        (x0, _x1), _ = vb.viewRange()
        rows = max(len(self._rows), 1)
        row_px = vb.height() / rows
        for label, first, count in self._native_labels:
            label.setPos(max(x0, 0.0), first)
            label.setVisible(count * row_px >= NATIVE_LABEL_MIN_PX)

    def native_labels(self) -> list[str]:
        """The texts of the native runs' labels (for tests and exports)."""
        return [label.textItem.toPlainText() for label, _first, _count in self._native_labels]

    def _update_summary(self, entry: Entry) -> None:
        snap = entry.snapshot
        if not snap.layers:
            self.summary.setText("")
            return
        first = snap.layers[0]
        retrieved = [len(data.retrieved_positions(layer, self.head)) for layer in snap.layers]
        exact = sum(layer.exact for layer in snap.layers)
        far = max(0, first.window_start - first.sinks)
        native = [row for row in self._rows if row.native]
        parts = [f"A2ATS on {len(self._rows) - len(native)} of {len(self._rows)} layers"]
        parts = parts if native else []
        parts += [
            f"step {snap.step}",
            f"{snap.offset} tokens",
            f"window from {first.window_start}",
            f"{first.sinks} sinks",
        ]
        until = data.exact_until(snap)
        keep = data.would_keep_share(snap)
        if until is not None and keep is not None:
            parts.append(
                f"exact until {until:,} tokens \u00b7 retrieval now would keep {100 * keep:.0f}% "
                "of attention"
            )
        elif until is not None:
            parts.append(f"exact until {until:,} tokens (exact attention below the crossover)")
        elif exact == len(snap.layers):
            parts.append("exact attention (context too short to drop anything)")
        else:
            mean = float(np.mean(retrieved))
            share = f" ({100 * mean / far:.1f}% of {far} far)" if far else ""
            parts.append(f"retrieved per layer: mean {mean:.0f}{share}, max {max(retrieved)}")
        if self.mode == MODE_FREQUENCY:
            steps = self.state.frequency.at(entry.seq, self.head).steps
            parts.append(f"frequency over {steps} step{'s' if steps != 1 else ''} of this reply")
        self.summary.setText(" \u00b7 ".join(parts))

    # ---- theme & legend --------------------------------------------------------------------
    def _on_theme(self, theme: Theme) -> None:
        self._theme = theme
        self.boundary.setPen(pg.mkPen(theme.foreground, width=1.5, style=Qt.PenStyle.DashLine))
        self.current_line.setPen(pg.mkPen(theme.categories[data.CURRENT], width=2))
        self._apply_lut()

    def _apply_lut(self) -> None:
        theme = self._theme
        if self.mode == MODE_FREQUENCY:
            lut = theme.sequential_lut()
            self.legend.set_gradient(
                lut,
                "rarely",
                "every step",
                none=(theme.categories[data.FAR], "never retrieved"),
            )
        else:
            lut = np.zeros((256, 4), dtype=np.uint8)
            cat = theme.category_lut()
            lut[: len(cat)] = cat
            order = (data.SINK, data.FAR, data.RETRIEVED, data.WINDOW, data.CURRENT, data.WOULD)
            items = [(theme.categories[c], data.CATEGORY_NAMES[c]) for c in order]
            items.append((theme.foreground, "window boundary", "line"))
            plan = self.state.plan
            if plan is not None and any(c.kind != A2ATS for c in plan.layers):
                items.append((theme.fp16, "native layer (the model's own cache)"))
            self.legend.set_categories(items)
        self.image.setLookupTable(lut)
        if self.image.image is not None:
            self.image.setLevels((0, len(lut)))

    def _on_view_changed(self, _index: int) -> None:
        self._full_key = None
        self._apply_lut()
        self.redraw_requested.emit()

    def zoom_to(self, first: float, last: float) -> None:
        """Show positions [first, last) and stop following the growing context."""
        self._on_manual_range()
        self.plot.plotItem.vb.setXRange(first, last, padding=0)

    def _on_fit_clicked(self) -> None:
        self._follow = True
        self._ranges = None
        self.fit_button.setEnabled(False)
        self.redraw_requested.emit()

    def _on_manual_range(self, *_args) -> None:
        self._follow = False
        self.fit_button.setEnabled(True)

    def _on_range_changed(self, *_args) -> None:
        if not self._rendering:
            self.redraw_requested.emit()

    # ---- hover & click ---------------------------------------------------------------------
    def _position_at(self, scene_pos) -> tuple[int, int] | None:
        """(row, position) under a scene point, or None outside the data."""
        vb = self.plot.plotItem.vb
        if not vb.sceneBoundingRect().contains(scene_pos):
            return None
        point = vb.mapSceneToView(scene_pos)
        row, pos = math.floor(point.y()), math.floor(point.x())
        rows, width = self._full.shape
        if 0 <= row < rows and 0 <= pos < width:
            return row, pos
        return None

    def _on_mouse_moved(self, scene_pos) -> None:
        hit = self._position_at(scene_pos)
        if hit is None or self._entry is None:
            return
        self.info.setText(self.describe(*hit))

    def _on_mouse_clicked(self, event) -> None:
        if event.button() != Qt.MouseButton.LeftButton:
            return
        hit = self._position_at(event.scenePos())
        if hit is not None:
            self.scroll_requested.emit(hit[1])

    def describe(self, row: int, position: int) -> str:
        """Hover text for one cell: layer, position, token, role and retrieval counts."""
        entry = self._entry
        if entry is None or not 0 <= row < len(self._rows):
            return ""
        map_row = self._rows[row]
        if map_row.native:
            return (
                f"layer {map_row.layer} \u00b7 position {position} \u00b7 {map_row.native}, "
                "native: the model's own cache, no A2ATS retrieval"
            )
        if map_row.stats is None:
            return f"layer {map_row.layer} \u00b7 A2ATS, no statistics at this step"
        row = map_row.stats
        layer = entry.snapshot.layers[row]
        token = printable_token(self.state.token_text(position))
        category = data.category_at(layer, position, self.head)
        role = data.CATEGORY_NAMES.get(category, "not in the context yet")
        heads = data.heads_retrieving(layer, position) if not layer.exact else []
        if heads and category == data.RETRIEVED:
            role += " by KV head " + ", ".join(str(h) for h in heads)
        freq = self.state.frequency.at(entry.seq, self.head)
        reply_count = freq.count(row, position)
        recent = self.state.ring.reply_entries(entry.reply, up_to_seq=entry.seq)[-RECENT_STEPS:]
        recent_count = sum(
            1
            for e in recent
            if row < len(e.snapshot.layers)
            and position in data.retrieved_positions(e.snapshot.layers[row], self.head)
        )
        token_part = f" \u201c{token}\u201d" if token else ""
        return (
            f"layer {layer.layer} \u00b7 position {position}{token_part} \u00b7 {role} \u00b7 "
            f"retrieved in {recent_count} of the last {len(recent)} steps, "
            f"{reply_count} of {freq.steps} this reply"
        )

    # ---- test / export helpers ---------------------------------------------------------------
    def full_image(self) -> np.ndarray:
        """uint8 [L, W] category codes (or frequency indices) of the drawn step, full res."""
        return self._full

    def displayed(self) -> tuple[np.ndarray | None, int, int]:
        """(image array set on the ImageItem, first position, positions per column)."""
        start, factor, _ = self._shown
        return self.image.image, start, factor
