"""Step scrubber: a slider over the kept snapshots plus a "Live" toggle."""

from __future__ import annotations

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import QHBoxLayout, QSizePolicy, QSlider, QToolButton, QWidget

from .state import InspectorState
from .widgets import StatusLine


class StepScrubber(QWidget):
    """Choose the viewed step. Emits `seq_chosen(seq)` or `seq_chosen(None)` for live."""

    seq_chosen = Signal(object)

    def __init__(self, state: InspectorState, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.state = state
        self.slider = QSlider(Qt.Orientation.Horizontal)
        self.slider.setRange(0, 0)
        self.slider.setToolTip("Scrub through the last kept decode steps")
        self.slider.setAccessibleName("Step scrubber")
        self.slider.valueChanged.connect(self._on_slider)
        self.prev_button = self._button("\u25c0", "Previous kept step", lambda: self._nudge(-1))
        self.next_button = self._button("\u25b6", "Next kept step", lambda: self._nudge(1))
        self.live_button = self._button("Live", "Follow the newest step", None)
        self.live_button.setCheckable(True)
        self.live_button.setChecked(True)
        self.live_button.toggled.connect(self._on_live_toggled)
        self.label = StatusLine("no steps yet")
        self.label.setSizePolicy(QSizePolicy.Policy.Fixed, QSizePolicy.Policy.Fixed)
        self.label.setFixedWidth(
            self.label.fontMetrics().horizontalAdvance(
                "step 00000 \u00b7 000000 tok \u00b7 000/000"
            )
            + 14
        )

        layout = QHBoxLayout(self)
        layout.setContentsMargins(6, 2, 6, 2)
        layout.setSpacing(4)
        layout.addWidget(self.prev_button)
        layout.addWidget(self.slider, 1)
        layout.addWidget(self.next_button)
        layout.addWidget(self.label)
        layout.addWidget(self.live_button)

    @staticmethod
    def _button(text: str, tip: str, slot) -> QToolButton:
        button = QToolButton()
        button.setText(text)
        button.setToolTip(tip)
        button.setAccessibleName(tip)
        button.setAutoRaise(True)
        if slot is not None:
            button.clicked.connect(slot)
        return button

    def refresh(self) -> None:
        """Sync the slider, label and live button with the state (emits nothing)."""
        ring = self.state.ring
        entry = self.state.entry()
        self.slider.blockSignals(True)
        self.live_button.blockSignals(True)
        self.slider.setRange(0, max(0, len(ring) - 1))
        if entry is not None:
            self.slider.setValue(ring.index_of(entry.seq))
        self.live_button.setChecked(self.state.live)
        self.slider.blockSignals(False)
        self.live_button.blockSignals(False)
        if entry is None:
            self.label.setText("no steps yet")
            return
        snap = entry.snapshot
        kept = f"{ring.index_of(entry.seq) + 1}/{len(ring)}"
        self.label.setText(f"step {snap.step} \u00b7 {snap.offset} tok \u00b7 {kept}")

    def _on_slider(self, index: int) -> None:
        ring = self.state.ring
        if not ring:
            return
        self.seq_chosen.emit(ring.at_index(min(index, len(ring) - 1)).seq)

    def _nudge(self, delta: int) -> None:
        target = min(max(self.slider.value() + delta, 0), self.slider.maximum())
        if target != self.slider.value():
            self.slider.setValue(target)  # emits through _on_slider
        elif self.state.ring:
            self._on_slider(target)  # at an end already: still leave live mode, hold the view

    def _on_live_toggled(self, on: bool) -> None:
        if on:
            self.seq_chosen.emit(None)
        else:
            entry = self.state.entry()
            self.seq_chosen.emit(entry.seq if entry is not None else None)
