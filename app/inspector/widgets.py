"""Small widgets shared by the inspector panels: detachable sections, legends, plot setup."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import QEvent, QPointF, QRectF, QSize, Qt, Signal
from PySide6.QtGui import QColor, QLinearGradient, QPainter, QPen
from PySide6.QtWidgets import (
    QComboBox,
    QFrame,
    QHBoxLayout,
    QLabel,
    QSizePolicy,
    QSplitter,
    QToolButton,
    QVBoxLayout,
    QWidget,
)

from ..inert_text import rich_from_plain
from .plot_theme import Theme, style_plot
from .state import InspectorState

MIN_PLOT_AREA = 80  # px of data area a plot keeps beside its axes, title or not
PLOT_MARGIN = 12  # px: the plot's own frame around axes and data
LEFT_AXIS_RESERVE = 50  # px a left axis is counted at, at least (title and ~4 digit ticks)


class FloatingWindow(QWidget):
    """Top-level window holding one detached section; closing it docks the section back."""

    closed = Signal()

    def __init__(self, title: str, parent: QWidget | None = None) -> None:
        super().__init__(parent, Qt.WindowType.Window)
        self.setWindowTitle(title)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(4, 4, 4, 4)

    def closeEvent(self, event) -> None:  # noqa: N802 (Qt override)
        self.closed.emit()
        super().closeEvent(event)


class Section(QFrame):
    """A titled panel in the inspector's splitter with "PNG" and "Detach" buttons.

    `body` is the panel widget. Detaching reparents the whole section into a floating window;
    "Dock" (or closing that window) puts it back where it was.
    """

    png_requested = Signal()
    detached_changed = Signal(bool)

    def __init__(self, key: str, title: str, body: QWidget, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.key = key
        self.title = title
        self.body = body
        self._window: FloatingWindow | None = None
        self._home: tuple[QSplitter, int, list[int]] | None = None
        self.setObjectName(f"inspector-section-{key}")
        self.setFrameShape(QFrame.Shape.NoFrame)

        header = QHBoxLayout()
        header.setContentsMargins(6, 2, 2, 0)
        self.title_label = QLabel(title)
        font = self.title_label.font()
        font.setBold(True)
        self.title_label.setFont(font)
        header.addWidget(self.title_label)
        header.addStretch(1)
        self.png_button = _tool_button("PNG", f"Save the {title} panel as a PNG image")
        self.png_button.clicked.connect(self.png_requested)
        self.detach_button = _tool_button("Detach", "Show this panel in its own window")
        self.detach_button.clicked.connect(self.toggle_detached)
        header.addWidget(self.png_button)
        header.addWidget(self.detach_button)

        rule = QFrame()
        rule.setFrameShape(QFrame.Shape.HLine)
        rule.setFrameShadow(QFrame.Shadow.Sunken)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.setSpacing(2)
        layout.addWidget(rule)
        layout.addLayout(header)
        layout.addWidget(body, 1)

    @property
    def detached(self) -> bool:
        return self._window is not None

    def toggle_detached(self) -> None:
        if self.detached:
            self.dock()
        else:
            self.detach()

    def detach(self) -> None:
        """Move this section into its own top-level window (remembering its place)."""
        splitter = self.parentWidget()
        if self.detached or not isinstance(splitter, QSplitter):
            return
        self._home = (splitter, splitter.indexOf(self), splitter.sizes())
        size = self.size()
        # owned by the inspector (closed and freed with it), shown as its own top-level window
        owner = splitter.parentWidget() or splitter
        window = FloatingWindow(f"A2ATS inspector: {self.title}", owner)
        window.layout().addWidget(self)
        window.closed.connect(self.dock)
        window.resize(max(size.width(), 520), max(size.height(), 320))
        self._window = window
        self.detach_button.setText("Dock")
        self.detach_button.setToolTip("Put this panel back into the inspector")
        window.show()
        self.show()
        self.detached_changed.emit(True)

    def dock(self) -> None:
        """Put a detached section back into the inspector splitter at its old place."""
        window, home = self._window, self._home
        if window is None or home is None:
            return
        self._window = None
        splitter, index, sizes = home
        splitter.insertWidget(index, self)
        self.show()
        splitter.setSizes(sizes)
        window.closed.disconnect(self.dock)
        window.close()
        window.deleteLater()
        self.detach_button.setText("Detach")
        self.detach_button.setToolTip("Show this panel in its own window")
        self.detached_changed.emit(False)

    def save_png(self, path: str | Path) -> Path:
        """Grab the section (header, plots and tables as seen) into a PNG file."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        if not self.grab().save(str(path), "PNG"):
            raise OSError(f"could not write PNG {path}")
        return path


def _tool_button(text: str, tip: str) -> QToolButton:
    button = QToolButton()
    button.setText(text)
    button.setToolTip(tip)
    button.setAccessibleName(tip)
    button.setAutoRaise(True)
    return button


class LegendBar(QWidget):
    """Colour swatches with labels, or a gradient with end labels (frequency maps).

    Items flow onto as many lines as the width needs; the height changes only when that line
    count does (on resize or new items, never per decode step).
    """

    GRADIENT_WIDTH = 150

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self._items: list[tuple[str, ...]] = []
        self._gradient: tuple[np.ndarray, str, str] | None = None
        self._none: tuple[str, str] | None = None
        self.setSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Fixed)
        self._fit_height()

    def set_categories(self, items: list[tuple[str, ...]]) -> None:
        """items: (colour hex, label) or (colour hex, label, "line") in display order."""
        if self._gradient is None and list(items) == self._items:
            return
        self._items = list(items)
        self._gradient = None
        self._none = None
        self._fit_height()
        self.update()

    def set_gradient(
        self, lut: np.ndarray, low: str, high: str, none: tuple[str, str] | None = None
    ) -> None:
        """lut uint8 [n, 4] (index 0 is drawn as the `none` swatch when given)."""
        current = self._gradient
        if (
            current is not None
            and current[1:] == (low, high)
            and self._none == none
            and np.array_equal(current[0], lut)
        ):
            return
        self._gradient = (lut, low, high)
        self._none = none
        self._items = []
        self._fit_height()
        self.update()

    def labels(self) -> list[str]:
        if self._gradient is not None:
            extra = [self._none[1]] if self._none else []
            return [*extra, self._gradient[1], self._gradient[2]]
        return [item[1] for item in self._items]

    # ---- layout ---------------------------------------------------------------------------
    def _pieces(self) -> list[tuple[str, tuple, float]]:
        """(kind, payload, width) units that are never split across lines."""
        fm = self.fontMetrics()
        sw = fm.height() - 4
        pieces = []
        items = self._items if self._gradient is None else ([self._none] if self._none else [])
        for item in items:
            pieces.append(("swatch", tuple(item), sw + 4 + fm.horizontalAdvance(item[1]) + 14))
        if self._gradient is not None:
            _, low, high = self._gradient
            width = fm.horizontalAdvance(low) + 6 + self.GRADIENT_WIDTH + 6
            pieces.append(("gradient", self._gradient, width + fm.horizontalAdvance(high) + 8))
        return pieces

    def _rows(self, width: float) -> list[list[tuple[str, tuple, float, float]]]:
        rows: list[list[tuple[str, tuple, float, float]]] = [[]]
        x = 6.0
        for kind, payload, w in self._pieces():
            if rows[-1] and x + w > width:
                rows.append([])
                x = 6.0
            rows[-1].append((kind, payload, x, w))
            x += w
        return rows

    def _line_height(self) -> int:
        return self.fontMetrics().height() + 6

    def _fit_height(self) -> None:
        lines = max(1, len(self._rows(max(self.width(), 1))))
        height = lines * self._line_height() + 2
        if self.height() != height or self.minimumHeight() != height:
            self.setFixedHeight(height)

    def resizeEvent(self, event) -> None:  # noqa: N802 (Qt override)
        super().resizeEvent(event)
        self._fit_height()

    def sizeHint(self) -> QSize:  # noqa: N802 (Qt override)
        return QSize(300, self.height())

    # ---- painting -------------------------------------------------------------------------
    def paintEvent(self, event) -> None:  # noqa: N802 (Qt override)
        painter = QPainter(self)
        painter.setRenderHint(QPainter.RenderHint.Antialiasing)
        fm = self.fontMetrics()
        sw = fm.height() - 4
        lh = self._line_height()
        text_colour = self.palette().color(self.foregroundRole())

        def text(x: float, top: float, label: str) -> float:
            painter.setPen(text_colour)
            w = fm.horizontalAdvance(label)
            painter.drawText(QRectF(x, top, w + 2, lh), Qt.AlignmentFlag.AlignVCenter, label)
            return x + w

        for line, row in enumerate(self._rows(self.width())):
            top = line * lh + 1
            y = top + (lh - sw) / 2
            for kind, payload, x, _w in row:
                if kind == "swatch":
                    colour, label, *rest = payload
                    if rest and rest[0] == "line":
                        painter.setPen(QPen(QColor(colour), 1.5, Qt.PenStyle.DashLine))
                        painter.drawLine(
                            QPointF(x + sw / 2, y - 1), QPointF(x + sw / 2, y + sw + 1)
                        )
                    else:
                        painter.setPen(Qt.PenStyle.NoPen)
                        painter.setBrush(QColor(colour))
                        painter.drawRoundedRect(QRectF(x, y, sw, sw), 2, 2)
                    text(x + sw + 4, top, label)
                    continue
                lut, low, high = payload
                x = text(x, top, low) + 6
                grad = QLinearGradient(x, 0, x + self.GRADIENT_WIDTH, 0)
                stops = lut[1:] if self._none is not None else lut
                for i in range(0, len(stops), max(1, len(stops) // 16)):
                    r, g, b, a = (int(v) for v in stops[i])
                    grad.setColorAt(i / max(1, len(stops) - 1), QColor(r, g, b, a))
                r, g, b, a = (int(v) for v in stops[-1])
                grad.setColorAt(1.0, QColor(r, g, b, a))
                painter.setPen(Qt.PenStyle.NoPen)
                painter.setBrush(grad)
                painter.drawRoundedRect(QRectF(x, y, self.GRADIENT_WIDTH, sw), 2, 2)
                text(x + self.GRADIENT_WIDTH + 6, top, high)


class ThemedPlot(pg.PlotWidget):
    """A PlotWidget that follows the widget palette (light / dark) and calls `on_theme`."""

    def __init__(self, parent: QWidget | None = None, **kwargs) -> None:
        self._ready = False
        super().__init__(parent, **kwargs)
        self._ready = True
        self._least_width = 0
        # positions, steps and layers: never a "(x0.001)" scale on the title (pyqtgraph adds one
        # while an empty plot's range is 0..1, which widened the title by a third)
        self.plotItem.getAxis("bottom").enableAutoSIPrefix(False)
        self.plotItem.setMenuEnabled(False)
        self.plotItem.hideButtons()
        self.theme = Theme.from_widget(self)
        self.on_theme = None
        self.apply_theme()

    def minimumSizeHint(self) -> QSize:  # noqa: N802 (Qt override)
        """Wide enough for the left axis (its tick labels as drawn now) and the whole bottom
        axis title: a layout that gives the plot less cuts the title or squeezes the ticks."""
        hint = super().minimumSizeHint()
        item = self.plotItem
        left = item.getAxis("left")
        bottom = item.getAxis("bottom")
        # room for a few more tick digits than drawn now: the least width does not move (and
        # the panels reflow) each time new data adds one
        side = max(left.minimumWidth(), LEFT_AXIS_RESERVE) if left.isVisible() else 0
        right = item.getAxis("right")
        side += right.minimumWidth() if right.isVisible() else 0
        title = bottom.label.boundingRect().width() if bottom.label.isVisible() else 0
        least = math.ceil(side + max(title, MIN_PLOT_AREA) + PLOT_MARGIN)
        return QSize(max(hint.width(), least), hint.height())

    def refresh_least_width(self) -> bool:
        """Tell the layouts when the least width changed (new tick labels, a title drawn in
        another font): True if it did."""
        least = self.minimumSizeHint().width()
        if least == self._least_width:
            return False
        self._least_width = least
        self.updateGeometry()
        return True

    def apply_theme(self) -> None:
        self.theme = Theme.from_widget(self)
        self.setBackground(self.theme.background)
        style_plot(self.plotItem, self.theme)
        if self.on_theme is not None:
            self.on_theme(self.theme)

    def changeEvent(self, event) -> None:  # noqa: N802 (Qt override)
        if event.type() == QEvent.Type.PaletteChange and getattr(self, "_ready", False):
            self.apply_theme()
        super().changeEvent(event)


class PanelBody(QWidget):
    """One inspector panel's body (what a `Section` holds): each subclass draws the viewed step
    of `state` in its `render()` and asks the owning `InspectorPanel` for a redraw through
    `redraw_requested` when one of its own controls changes."""

    redraw_requested = Signal()

    def __init__(self, state: InspectorState, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.state = state
        self._key: tuple | None = None  # what was drawn last (redraw only when it changes)


def heat_plot(
    bottom: str, left: str | None = None, axis_items: dict | None = None, pan_x: bool = False
) -> tuple[ThemedPlot, pg.ImageItem]:
    """A plot holding one row-major image (layers down, steps or positions across), y inverted
    so layer 0 is on top; only `pan_x` lets the mouse move it (sideways)."""
    plot = ThemedPlot(axisItems=axis_items or {})
    item = plot.plotItem
    item.setLabel("bottom", bottom)
    if left is not None:
        item.setLabel("left", left)
    item.invertY(True)
    item.setMouseEnabled(x=pan_x, y=False)
    item.vb.setDefaultPadding(0.0)
    image = pg.ImageItem(axisOrder="row-major")
    item.addItem(image)
    return plot, image


ALL_HEADS_DATA = -1  # item data of "all heads" (an int: None as item data reads back unreliably)


def combo_value(combo: QComboBox):
    """Item data of the current item, or None when the combo is empty."""
    index = combo.currentIndex()
    return combo.itemData(index) if index >= 0 else None


def combo_head(combo: QComboBox) -> int | None:
    """Chosen KV head of a `head_combo`: None = all heads."""
    value = combo_value(combo)
    return None if value is None or value == ALL_HEADS_DATA else int(value)


def select_data(combo: QComboBox, value) -> None:
    """Select the item whose data equals `value` (the first item if none does)."""
    for i in range(combo.count()):
        if combo.itemData(i) == value:
            combo.setCurrentIndex(i)
            return
    if combo.count():
        combo.setCurrentIndex(0)


def select_head(combo: QComboBox, head: int | None) -> None:
    select_data(combo, ALL_HEADS_DATA if head is None else head)


def head_combo(first_label: str, tooltip: str) -> QComboBox:
    """A KV-head chooser: item 0 = `first_label` (all heads), then "KV head h" (data h)."""
    combo = QComboBox()
    combo.addItem(first_label, ALL_HEADS_DATA)
    combo.setToolTip(tooltip)
    combo.setAccessibleName(tooltip)
    combo.setSizeAdjustPolicy(QComboBox.SizeAdjustPolicy.AdjustToContents)
    return combo


def sync_head_combo(combo: QComboBox, heads: int) -> None:
    """Make the combo list exactly `heads` heads after its first item, keeping the choice."""
    if combo.count() == heads + 1:
        return
    current = combo_head(combo)
    combo.blockSignals(True)
    while combo.count() > 1:
        combo.removeItem(1)
    for h in range(heads):
        combo.addItem(f"KV head {h}", h)
    select_head(combo, current)
    combo.blockSignals(False)


def sync_layer_combo(
    combo: QComboBox, layer_ids: list[int], prefix: list[tuple[str, object]] | None = None
) -> None:
    """Fill a layer chooser: optional fixed leading items, then one item per snapshot row.

    Item data for layers is the row index in the snapshot; the label is the model layer index.
    """
    prefix = prefix or []
    labels = [label for label, _ in prefix] + [f"layer {lid}" for lid in layer_ids]
    if [combo.itemText(i) for i in range(combo.count())] == labels:
        return
    current = combo_value(combo)
    combo.blockSignals(True)
    combo.clear()
    for label, value in prefix:
        combo.addItem(label, value)
    for row, lid in enumerate(layer_ids):
        combo.addItem(f"layer {lid}", row)
    select_data(combo, current)
    combo.blockSignals(False)


def controls_row(*widgets: QWidget) -> QHBoxLayout:
    row = QHBoxLayout()
    row.setContentsMargins(6, 0, 6, 0)
    row.setSpacing(6)
    for w in widgets:
        row.addWidget(w)
    row.addStretch(1)
    return row


class StatusLine(QWidget):
    """Text that changes every step: wrapped into a fixed number of lines, elided beyond them.

    Unlike a word-wrapping QLabel, setting the text never asks the layout to recompute (a
    relayout of the whole inspector per decode step), it only repaints this strip.
    """

    def __init__(self, text: str = "", lines: int = 1, bold: bool = False) -> None:
        super().__init__()
        self._text = ""
        self._lines = lines
        if bold:
            font = self.font()
            font.setBold(True)
            self.setFont(font)
        self.setSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Fixed)
        self.setFixedHeight(self.fontMetrics().lineSpacing() * lines + 4)
        self.setText(text)

    def text(self) -> str:
        return self._text

    def setText(self, text: str) -> None:  # noqa: N802 (QLabel-like API)
        if text == self._text:
            return
        self._text = text
        self.setToolTip(rich_from_plain(text))  # may quote token texts (model output)
        self.setAccessibleName(text)
        self.update()

    def sizeHint(self) -> QSize:  # noqa: N802 (Qt override)
        return QSize(200, self.height())

    def paintEvent(self, event) -> None:  # noqa: N802 (Qt override)
        painter = QPainter(self)
        painter.setPen(self.palette().color(self.foregroundRole()))
        rect = self.rect().adjusted(6, 2, -6, -2)
        fm = self.fontMetrics()
        flags = Qt.AlignmentFlag.AlignLeft | Qt.AlignmentFlag.AlignTop | Qt.TextFlag.TextWordWrap
        text = self._text
        if fm.boundingRect(rect, flags, text).height() > rect.height():
            # too long for the lines we have: elide the end so the cut is visible
            budget = rect.width() * self._lines - fm.horizontalAdvance("\u2026") * 2
            text = fm.elidedText(text, Qt.TextElideMode.ElideRight, max(budget, 10))
        painter.drawText(rect, flags, text)


def small_label(text: str = "", lines: int = 1, bold: bool = False) -> StatusLine:
    return StatusLine(text, lines, bold)


TICK_DENSITY = 0.6  # fewer tick labels than pyqtgraph's default: small plots stay readable

NICE_STEPS = (1.0, 1.5, 2.0, 3.0, 4.0, 5.0, 6.0, 8.0, 10.0)


def nice_ceiling(value: float) -> float:
    """Smallest "round" number (1, 1.5, 2, 3, 4, 5, 6, 8 times a power of ten) >= value.

    Axis ranges snap to these so a growing series changes its axes (costly to redraw) rarely.
    """
    if value <= 0 or not math.isfinite(value):
        return 1.0
    power = 10.0 ** math.floor(math.log10(value))
    for step in NICE_STEPS:
        if step * power >= value * (1 - 1e-12):
            return step * power
    return 10.0 * power
