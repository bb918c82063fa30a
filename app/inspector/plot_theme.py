"""Colours of the inspector: a colour-blind-friendly palette (Okabe & Ito) in light and dark.

Every panel asks `Theme.from_widget(widget)` when it is styled (again on palette changes), so the
inspector follows the application palette, light or dark.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyqtgraph as pg
from PySide6.QtGui import QColor, QPalette
from PySide6.QtWidgets import QWidget

from . import data

# Okabe & Ito (2008), "Color Universal Design": distinguishable under the common colour-vision
# deficiencies.
ORANGE = "#E69F00"
SKY_BLUE = "#56B4E9"
BLUISH_GREEN = "#009E73"
YELLOW = "#F0E442"
BLUE = "#0072B2"
VERMILLION = "#D55E00"
REDDISH_PURPLE = "#CC79A7"

# Sequential map for frequencies and recall (perceptually uniform, colour-blind safe).
SEQUENTIAL_MAP = "cividis"


@dataclass(frozen=True)
class Theme:
    """Resolved colours for one palette (hex strings)."""

    dark: bool
    background: str
    foreground: str
    muted: tuple[int, int, int, int]  # RGBA (pyqtgraph reads "#..." strings as RRGGBBAA)
    categories: dict[int, str]
    heads: tuple[str, ...]
    held: str
    fp16: str
    marker: str

    @classmethod
    def from_widget(cls, widget: QWidget | None = None) -> Theme:
        palette = widget.palette() if widget is not None else QPalette()
        base = palette.color(QPalette.ColorRole.Base)
        text = palette.color(QPalette.ColorRole.Text)
        return cls.for_colors(base, text)

    @classmethod
    def for_colors(cls, base: QColor, text: QColor) -> Theme:
        dark = base.lightness() < 128
        if dark:
            categories = {
                data.EMPTY: base.name(),
                data.FAR: "#3B4048",
                data.WINDOW: BLUISH_GREEN,
                data.SINK: REDDISH_PURPLE,
                data.RETRIEVED: SKY_BLUE,
                data.CURRENT: YELLOW,
                data.WOULD: ORANGE,
            }
            heads = (SKY_BLUE, ORANGE, BLUISH_GREEN, REDDISH_PURPLE, YELLOW, VERMILLION)
            held, fp16, marker = SKY_BLUE, "#6B717B", YELLOW
        else:
            categories = {
                data.EMPTY: base.name(),
                data.FAR: "#DADDE3",
                data.WINDOW: BLUISH_GREEN,
                data.SINK: REDDISH_PURPLE,
                data.RETRIEVED: BLUE,
                data.CURRENT: ORANGE,
                data.WOULD: VERMILLION,
            }
            heads = (BLUE, ORANGE, BLUISH_GREEN, REDDISH_PURPLE, VERMILLION, SKY_BLUE)
            held, fp16, marker = BLUE, "#B9BEC7", VERMILLION
        return cls(
            dark=dark,
            background=base.name(),
            foreground=text.name(),
            muted=(text.red(), text.green(), text.blue(), 150),
            categories=categories,
            heads=heads,
            held=held,
            fp16=fp16,
            marker=marker,
        )

    def category_lut(self) -> np.ndarray:
        """uint8 [7, 4] RGBA lookup table indexed by category code (EMPTY is transparent)."""
        lut = np.zeros((max(self.categories) + 1, 4), dtype=np.uint8)
        for code, colour in self.categories.items():
            c = QColor(colour)
            lut[code] = (c.red(), c.green(), c.blue(), 0 if code == data.EMPTY else 255)
        return lut

    def sequential_lut(self, n: int = 256) -> np.ndarray:
        """uint8 [n, 4] RGBA: index 0 = "none" (the far colour), 1..n-1 = the sequential map."""
        cmap = pg.colormap.get(SEQUENTIAL_MAP)
        lut = np.empty((n, 4), dtype=np.uint8)
        lut[1:] = cmap.getLookupTable(0.0, 1.0, n - 1, alpha=True)
        far = QColor(self.categories[data.FAR])
        lut[0] = (far.red(), far.green(), far.blue(), 255)
        return lut

    def head_color(self, head: int) -> str:
        return self.heads[head % len(self.heads)]


def fraction_to_index(values: np.ndarray, n: int = 256) -> np.ndarray:
    """Map fractions in [0, 1] to `sequential_lut` indices: 0 stays 0 ("none"), (0, 1] -> 1..n-1.

    NaN also maps to 0. Returns uint8 (n <= 256) of the same shape.
    """
    v = np.nan_to_num(np.asarray(values, dtype=np.float32), nan=0.0)
    idx = np.where(v > 0, 1 + np.rint(np.clip(v, 0.0, 1.0) * (n - 2)), 0)
    return idx.astype(np.uint8)


def style_plot(plot: pg.PlotItem, theme: Theme) -> None:
    """Apply the theme to a PlotItem's axes (labels, ticks, lines)."""
    for name in ("left", "bottom", "right", "top"):
        axis = plot.getAxis(name)
        axis.setPen(pg.mkPen(theme.muted))
        axis.setTextPen(pg.mkPen(theme.foreground))
