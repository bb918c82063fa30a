"""InspectorDock: the dock that holds the cache inspector beside the chat, and keeps its share of
the window's width.

The panels sit in a scroll area (their minimum heights never force the window taller than the
screen) that never scrolls sideways. Docked beside the chat, the dock takes `DOCK_SHARE` of the
window's width as the window is resized, never less than the panels' least width and never so
much that the chat keeps less than `CHAT_ROOM`; a drag of its edge with the mouse sets a new
share, and a restored layout keeps its own proportion. Where the inspector cannot be built, the
dock says why instead.
"""

from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QApplication, QDockWidget, QFrame, QLabel, QMainWindow, QScrollArea

DOCK_SHARE = 0.45  # the inspector's share of the window's width until the user drags its edge
CHAT_ROOM = 620  # width the sidebar and a usable chat column keep beside the inspector


def _load_inspector():
    """The inspector panel class, or (None, reason) until app/inspector is usable."""
    try:
        from .inspector import InspectorPanel
    except Exception as exc:  # noqa: BLE001  (a missing or broken inspector must not stop the app)
        return None, f"{type(exc).__name__}: {exc}"
    return InspectorPanel, ""


class InspectorDock(QDockWidget):
    """The "Cache inspector" dock of `window`; `inspector` is its panel, or None (with a
    placeholder saying why)."""

    def __init__(self, window: QMainWindow) -> None:
        super().__init__("Cache inspector", window)
        self.main_window = window
        self.setObjectName("InspectorDock")
        self.setAllowedAreas(
            Qt.DockWidgetArea.RightDockWidgetArea
            | Qt.DockWidgetArea.LeftDockWidgetArea
            | Qt.DockWidgetArea.BottomDockWidgetArea
        )
        self.setFeatures(
            QDockWidget.DockWidgetFeature.DockWidgetMovable
            | QDockWidget.DockWidgetFeature.DockWidgetFloatable
            | QDockWidget.DockWidgetFeature.DockWidgetClosable
        )
        panel_class, reason = _load_inspector()
        self.inspector = None
        if panel_class is not None:
            try:
                self.inspector = panel_class()
            except Exception as exc:  # noqa: BLE001
                reason = f"{type(exc).__name__}: {exc}"
        if self.inspector is not None:
            holder = QScrollArea()
            holder.setObjectName("InspectorScroll")
            holder.setWidgetResizable(True)
            holder.setFrameShape(QFrame.Shape.NoFrame)
            holder.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
            holder.setWidget(self.inspector)
            # The scroll area's own minimum is a scroll bar (~70 px): keep the panels readable.
            holder.setMinimumWidth(
                self.inspector.minimumWidth() + holder.verticalScrollBar().sizeHint().width()
            )
            self.setWidget(holder)
        else:
            placeholder = QLabel("The cache inspector is not available in this build.\n" + reason)
            placeholder.setObjectName("DockPlaceholder")
            placeholder.setWordWrap(True)
            placeholder.setAlignment(Qt.AlignmentFlag.AlignCenter)
            placeholder.setMinimumWidth(280)
            self.setWidget(placeholder)
        self.share: float | None = DOCK_SHARE
        self._fit_width = self._target = 0
        self._fitting = False

    def keep_restored_share(self) -> None:
        """A restored layout keeps its own proportion (taken at the next window resize)."""
        self.share = None

    def use_default_share(self) -> None:
        """`DOCK_SHARE` of the width from the next resize on, whatever a restored layout said
        (scripted runs at a given size)."""
        self.share = DOCK_SHARE

    def docked_beside(self) -> bool:
        area = self.main_window.dockWidgetArea(self)
        beside = area in (
            Qt.DockWidgetArea.RightDockWidgetArea,
            Qt.DockWidgetArea.LeftDockWidgetArea,
        )
        return beside and not self.isFloating()

    def window_resized(self, old: int, new: int) -> None:
        """Take the share of the window's new width (two columns of panels on a big screen)."""
        if not self.docked_beside():
            return
        if self.share is None:  # a restored layout: its proportion from now on
            if old <= 0 or self.width() <= 0:
                return
            self.share = self.width() / old
        least = self.minimumSizeHint().width()
        target = max(least, min(round(self.share * new), new - CHAT_ROOM))
        self._fitting, self._target = True, target
        try:
            self.main_window.resizeDocks([self], [target], Qt.Orientation.Horizontal)
        finally:
            self._fitting = False
        self._fit_width = new

    def resizeEvent(self, event) -> None:  # noqa: N802 (Qt override)
        super().resizeEvent(event)
        if (
            not self._fitting
            and self.main_window.width() == self._fit_width
            and abs(self.width() - self._target) > 2  # not the width a fit asked for
            and self.docked_beside()
            # a drag holds a mouse button: a dock that resized itself (its panels' least width
            # changed) is no new share
            and QApplication.mouseButtons() != Qt.MouseButton.NoButton
        ):
            self.share = self.width() / max(self.main_window.width(), 1)  # the user's drag
