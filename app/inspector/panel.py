"""InspectorPanel: the live cache inspector docked beside the chat.

Contract with the app (docs/ARCHITECTURE.md): snapshots arrive on the GUI thread through
`on_snapshot` after every decode step. Taking one is O(layers): it is appended to a bounded ring
and a throttled single-shot timer is started; panels redraw from the viewed snapshot at most
`redraw_hz` times a second (slower while the GUI thread uses more than `redraw_budget` of a core,
see `throttle.py`), only while visible, creating their plot items once and calling
`setData` / `setImage`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from PySide6.QtCore import QEvent, QObject, QSize, Qt, QTimer, Signal, Slot
from PySide6.QtWidgets import QHBoxLayout, QScrollArea, QSplitter, QVBoxLayout, QWidget

from a2ats_engine.cache.telemetry import CacheSnapshot

from . import export
from .codebook_view import CodebookPanel
from .fidelity_view import FidelityPanel
from .memory_view import MemoryPanel
from .retrieval_map import RetrievalMapPanel
from .scrubber import StepScrubber
from .snapshot_ring import DEFAULT_CAPACITY
from .state import FidelityInfo, InspectorState
from .throttle import RedrawThrottle
from .widgets import Section, ThemedPlot

DEFAULT_REDRAW_HZ = 12.0
DEFAULT_REDRAW_BUDGET = 0.12  # share of one core the GUI thread may use before redraws slow down
SECTION_TITLES = {
    "map": "Window & retrieval map",
    "codebook": "Codebook usage",
    "memory": "Memory",
    "fidelity": "Fidelity: missed mass & budget",
}
SECTION_STRETCH = {"map": 40, "codebook": 19, "memory": 15, "fidelity": 26}
PANEL_MIN_WIDTH = 360  # one column of panels
SECOND_COLUMN = ("memory", "fidelity")  # the sections a second column takes when wide enough
COLUMN_SPACING = 6
COLUMN_SLACK = 12  # px kept free when two columns start: axes widen a little as data comes in


class InspectorPanel(QWidget):
    """All inspector panels, a step scrubber, and telemetry / PNG export.

    Signals:
        highlight_requested(list[int]): context positions to highlight in the chat (the
            retrieved tokens of the chosen layer or of all layers at the viewed step; [] = none).
        scroll_requested(int): a context position clicked in the retrieval map.
    """

    highlight_requested = Signal(object)
    scroll_requested = Signal(int)

    def __init__(
        self,
        parent: QWidget | None = None,
        *,
        history_size: int = DEFAULT_CAPACITY,
        redraw_hz: float = DEFAULT_REDRAW_HZ,
        redraw_budget: float = DEFAULT_REDRAW_BUDGET,
    ) -> None:
        super().__init__(parent)
        self.columns = 1  # panel columns: 2 when wide enough (`reflow`)
        self._two_columns_least = 0
        self._watched_holder: QWidget | None = None
        self.throttle = RedrawThrottle(redraw_hz, redraw_budget)
        self.state = InspectorState()
        self.state.ring.set_capacity(history_size)
        self._last_highlight: list[int] | None = None
        self._generating = False
        self.redraw_count = 0

        self.scrubber = StepScrubber(self.state)
        self.scrubber.seq_chosen.connect(self.select_step)
        self.map_panel = RetrievalMapPanel(self.state)
        self.codebook_panel = CodebookPanel(self.state)
        self.memory_panel = MemoryPanel(self.state)
        self.fidelity_panel = FidelityPanel(self.state)
        self.map_panel.scroll_requested.connect(self.scroll_requested)
        self.map_panel.highlight_changed.connect(self._emit_highlight)
        bodies = {
            "map": self.map_panel,
            "codebook": self.codebook_panel,
            "memory": self.memory_panel,
            "fidelity": self.fidelity_panel,
        }
        self.splitter = QSplitter(Qt.Orientation.Vertical)
        self.splitter.setChildrenCollapsible(True)
        self.sections: dict[str, Section] = {}
        for key, body in bodies.items():
            section = Section(key, SECTION_TITLES[key], body)
            section.png_requested.connect(lambda k=key: self._save_png_dialog(k))
            section.detached_changed.connect(lambda _d: self._schedule())
            body.redraw_requested.connect(self._schedule)
            body.installEventFilter(self)
            self.splitter.addWidget(section)
            self.sections[key] = section
            section.detached_changed.connect(self._on_section_docked)
        total = sum(SECTION_STRETCH.values())
        self.splitter.setSizes([int(900 * SECTION_STRETCH[k] / total) for k in self.sections])
        # Wide (a big screen's dock): the memory and fidelity panels move to a second column.
        self.second_splitter = QSplitter(Qt.Orientation.Vertical)
        self.second_splitter.setChildrenCollapsible(True)
        self.second_splitter.hide()
        columns = QHBoxLayout()
        columns.setContentsMargins(0, 0, 0, 0)
        columns.setSpacing(COLUMN_SPACING)
        columns.addWidget(self.splitter, 1)
        columns.addWidget(self.second_splitter, 1)

        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.setSpacing(0)
        layout.addWidget(self.scrubber)
        layout.addLayout(columns, 1)

        self._timer = QTimer(self)
        self._timer.setSingleShot(True)
        self._timer.setInterval(self.throttle.interval_ms)
        self._timer.timeout.connect(self._redraw)
        self.setMinimumWidth(PANEL_MIN_WIDTH)
        self._plots = self.findChildren(ThemedPlot)  # once: they stay ours when detached
        self._redraw()

    def sizeHint(self) -> QSize:  # noqa: N802 (Qt override: the dock's first size)
        return QSize(560, 940)

    # ---- reflow --------------------------------------------------------------------------
    def resizeEvent(self, event) -> None:  # noqa: N802 (Qt override)
        super().resizeEvent(event)
        self.reflow()

    def showEvent(self, event) -> None:  # noqa: N802 (Qt override)
        super().showEvent(event)
        holder = self.parentWidget()
        if holder is not None and holder is not self._watched_holder:
            holder.installEventFilter(self)  # a scroll area's viewport: its width is ours
            self._watched_holder = holder

    def available_width(self) -> int:
        """The width the panels may use: a scroll area's viewport (which never scrolls
        sideways), else our own."""
        holder = self.parentWidget()
        if holder is not None and isinstance(holder.parentWidget(), QScrollArea):
            return holder.width()
        return self.width()

    def reflow(self) -> None:
        """Two columns when both fit the available width at their panels' minimum widths (as
        measured now: real data can widen a panel's axes), else one."""
        available = self.available_width()
        if self.columns == 2:
            least = self.minimumSizeHint().width()  # not our width: it lags a new scroll bar
            if least > available:  # a panel outgrew its column: we overflow the viewport
                self._two_columns_least = least  # never try two columns below this again
                self.set_columns(1)
        elif available >= max(self.two_columns_width(), self._two_columns_least):
            self.set_columns(2)

    def two_columns_width(self) -> int:
        """The narrowest width at which both columns get their panels' minimum widths, and
        `COLUMN_SLACK` to spare."""
        first = [s for k, s in self.sections.items() if k not in SECOND_COLUMN]
        second = [self.sections[k] for k in SECOND_COLUMN]

        def least(sections) -> int:
            return max([s.minimumSizeHint().width() for s in sections] + [PANEL_MIN_WIDTH // 2])

        both = least(first) + least(second) + COLUMN_SPACING + COLUMN_SLACK
        return max(both, 2 * PANEL_MIN_WIDTH)

    def set_columns(self, columns: int, force: bool = False) -> None:
        """One column of panels, or two (map and codebook | memory and fidelity)."""
        if columns == self.columns and not force:
            return
        self.columns = columns
        target = self.second_splitter if columns == 2 else self.splitter
        for key in SECOND_COLUMN:
            section = self.sections[key]
            if not section.detached:
                target.addWidget(section)
                section.show()
        self.second_splitter.setVisible(columns == 2 and self.second_splitter.count() > 0)
        for splitter in (self.splitter, self.second_splitter):
            keys = [k for k, v in self.sections.items() if splitter.indexOf(v) >= 0]
            if keys:
                splitter.setSizes([int(900 * SECTION_STRETCH[k]) for k in keys])
        self._schedule()

    def _on_section_docked(self, detached: bool) -> None:
        if not detached:  # back home: put it in the column the current width wants
            self.set_columns(self.columns, force=True)

    # ---- slots the app connects ----------------------------------------------------------
    @Slot(object)
    def on_snapshot(self, snapshot: CacheSnapshot) -> None:
        """Take one decode step's snapshot (GUI thread; O(layers), drawing is deferred)."""
        self.state.ring.append(snapshot)
        self._schedule()

    @Slot()
    def on_generation_started(self) -> None:
        """A new reply starts: frequencies and the byte line restart, the view goes live."""
        self.state.ring.new_reply()
        self.state.viewed_seq = None
        self._generating = True
        self.throttle.reset()
        self._schedule()

    @Slot()
    def on_generation_finished(self) -> None:
        self._generating = False
        self._schedule()

    @Slot(list)
    def set_context_tokens(self, token_texts: list[str]) -> None:
        """Decoded text of every context position (hover text and the map's zoomed-in axis)."""
        self.state.tokens = list(token_texts)
        axis = self.map_panel.plot.plotItem.getAxis("bottom")
        axis.picture = None
        axis.update()

    def set_layer_plan(self, plan) -> None:
        """The loaded model's `LayerPlan` (None: unknown): the map shows its native layers as
        grey rows labelled with their reason, never with A2ATS categories."""
        self.state.plan = plan
        self.map_panel.plan_changed()
        self._schedule()

    def set_history_size(self, size: int) -> None:
        """How many recent snapshots the scrubber keeps (>= 1)."""
        self.state.ring.set_capacity(size)
        self._schedule()

    def set_fidelity_info(
        self,
        enabled: bool,
        every: int | None = None,
        cost_ms: float | None = None,
        overhead: float | None = None,
    ) -> None:
        """Tell the fidelity panel whether the shadow pass is on and what it measured to cost."""
        self.state.fidelity = FidelityInfo(enabled, every, cost_ms, overhead)
        self._schedule()

    def clear(self) -> None:
        """Forget every kept snapshot (for a new conversation or a rebuilt cache)."""
        self.state.ring.clear()
        self.state.frequency.reset()
        self.state.viewed_seq = None
        self._schedule()

    # ---- scrubbing -----------------------------------------------------------------------
    @Slot(object)
    def select_step(self, seq: int | None) -> None:
        """View the kept snapshot with sequence number `seq`; None = live (follow the newest)."""
        self.state.viewed_seq = seq
        self._schedule()

    @property
    def generating(self) -> bool:
        """Between `on_generation_started` and `on_generation_finished`."""
        return self._generating

    def viewed_snapshot(self) -> CacheSnapshot | None:
        entry = self.state.entry()
        return entry.snapshot if entry is not None else None

    # ---- export ----------------------------------------------------------------------------
    def export_telemetry(
        self, path: str | Path, meta: dict[str, Any] | None = None, *, histograms: str = "delta"
    ) -> Path:
        """Write every kept step (every layer) as telemetry JSON; see `app.inspector.export`."""
        entries = self.state.ring.restored_entries()
        info = {"context_tokens": list(self.state.tokens), **(meta or {})}
        return export.export_telemetry(
            path,
            [e.snapshot for e in entries],
            replies=[e.reply for e in entries],
            meta=info,
            histograms=histograms,
        )

    def export_pngs(self, folder: str | Path) -> list[Path]:
        """Save each panel as `<key>.png` and the whole inspector as `inspector.png`."""
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        self.flush(force=True)
        paths = [section.save_png(folder / f"{key}.png") for key, section in self.sections.items()]
        whole = folder / "inspector.png"
        if not self.grab().save(str(whole), "PNG"):
            raise OSError(f"could not write PNG {whole}")
        return [*paths, whole]

    def export_panel_png(self, key: str, path: str | Path) -> Path:
        """Save one panel ("map", "codebook", "memory", "fidelity") as a PNG."""
        if key not in self.sections:
            raise ValueError(f"panel={key!r} is not one of {sorted(self.sections)}")
        self.flush(force=True)
        return self.sections[key].save_png(path)

    def _save_png_dialog(self, key: str) -> None:
        from PySide6.QtWidgets import QFileDialog, QMessageBox

        path, _ = QFileDialog.getSaveFileName(
            self, f"Save {SECTION_TITLES[key]} as PNG", f"a2ats-{key}.png", "PNG images (*.png)"
        )
        if path:
            try:
                self.export_panel_png(key, path)
            except OSError as exc:
                QMessageBox.warning(self, "Save PNG", str(exc))

    # ---- redraw ----------------------------------------------------------------------------
    def flush(self, force: bool = False) -> None:
        """Redraw now instead of on the timer; `force` also draws hidden panels."""
        self._timer.stop()
        self._redraw(force=force)

    def _schedule(self) -> None:
        if not hasattr(self, "_timer"):
            return  # an event while the panel is being built: the first redraw comes anyway
        if not self._timer.isActive():
            self._timer.start()

    def _redraw(self, force: bool = False) -> None:
        self.redraw_count += 1
        self.state.ring.compact()  # older steps keep histogram deltas, not full histograms
        for section in self.sections.values():
            body = section.body
            if force or (body.isVisible() and body.width() > 0 and body.height() > 0):
                body.render()
        self.scrubber.refresh()
        self._emit_highlight()
        self._timer.setInterval(self.throttle.after_redraw())
        widened = [plot.refresh_least_width() for plot in self._plots]
        if self.columns == 2 or any(widened):  # new data may have widened a panel's axes
            QTimer.singleShot(0, self, self.reflow)  # context: dropped if we are deleted first

    def _emit_highlight(self) -> None:
        positions = self.map_panel.highlight_for(self.state.entry())
        if positions != self._last_highlight:
            self._last_highlight = positions
            self.highlight_requested.emit(positions)

    def eventFilter(self, watched: QObject, event: QEvent) -> bool:  # noqa: N802 (Qt override)
        if watched is self._watched_holder:
            if event.type() == QEvent.Type.Resize:
                self.reflow()
        elif event.type() in (QEvent.Type.Show, QEvent.Type.Resize):
            self._schedule()
        return super().eventFilter(watched, event)
