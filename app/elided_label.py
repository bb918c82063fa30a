"""ElidedLabel: a one-line label that never asks for more width than it gets.

A plain QLabel's minimum width is its whole text, so a long chat title, model name or status
message widens the window past the screen (a 1024-pixel-wide window became 1143 wide). This
label's minimum is a few characters; when its text does not fit it shows the start and "…",
and its tooltip gives the whole text (escaped: titles and model names are untrusted).
"""

from __future__ import annotations

from PySide6.QtCore import QEvent, QSize, Qt
from PySide6.QtWidgets import QLabel, QSizePolicy, QWidget

from .inert_text import rich_from_plain

MIN_CHARS = 6  # the narrowest an elided label gets: a few characters and the ellipsis
SLACK = 4  # px beyond the text's advance: a bold last glyph overhangs it


class ElidedLabel(QLabel):
    """A plain-text one-line QLabel that elides (…) instead of growing; `text()` is the whole
    text, `shown_text()` what is drawn; the tooltip adds the whole text while elided."""

    def __init__(
        self,
        text: str = "",
        parent: QWidget | None = None,
        mode: Qt.TextElideMode = Qt.TextElideMode.ElideRight,
    ) -> None:
        super().__init__(parent)
        self._full = ""
        self._mode = mode
        self._tip = ""
        self.setTextFormat(Qt.TextFormat.PlainText)
        self.setSizePolicy(QSizePolicy.Policy.Preferred, QSizePolicy.Policy.Preferred)
        self.setText(text)

    # ---- QLabel API ----------------------------------------------------------------------
    def text(self) -> str:  # the whole text, as callers set it
        return self._full

    def setText(self, text: str) -> None:  # noqa: N802 (Qt override)
        if text == self._full and super().text():
            return
        self._full = text or ""
        self.updateGeometry()  # the size hint follows the whole text
        self._fit()

    def setToolTip(self, tip: str) -> None:  # noqa: N802 (Qt override)
        self._tip = tip or ""
        self._fit()

    def shown_text(self) -> str:
        return super().text()

    def is_elided(self) -> bool:
        return super().text() != self._full

    # ---- geometry ------------------------------------------------------------------------
    def sizeHint(self) -> QSize:  # noqa: N802 (Qt override: the whole text when room allows)
        margins = self.contentsMargins()
        width = self.fontMetrics().horizontalAdvance(self._full) + margins.left() + margins.right()
        return QSize(width + SLACK, super().sizeHint().height())

    def minimumSizeHint(self) -> QSize:  # noqa: N802 (Qt override)
        fm = self.fontMetrics()
        shortest = self._full[:MIN_CHARS] + "\u2026" if len(self._full) > MIN_CHARS else self._full
        return QSize(fm.horizontalAdvance(shortest) + 2, super().minimumSizeHint().height())

    def resizeEvent(self, event) -> None:  # noqa: N802 (Qt override)
        super().resizeEvent(event)
        self._fit()

    def changeEvent(self, event) -> None:  # noqa: N802 (Qt override: a style sheet's font)
        super().changeEvent(event)
        if event.type() in (QEvent.Type.FontChange, QEvent.Type.StyleChange):
            self.updateGeometry()  # the size hint was measured in the old font
            self._fit()

    def _fit(self) -> None:
        width = self.contentsRect().width()
        shown = self.fontMetrics().elidedText(self._full, self._mode, max(width - SLACK // 2, 0))
        if not self._full:
            shown = ""
        QLabel.setText(self, shown)
        tip = self._tip
        if shown != self._full:
            whole = rich_from_plain(self._full)
            extra = tip if tip.startswith("<") else rich_from_plain(tip)
            tip = whole + extra
        QLabel.setToolTip(self, tip)
