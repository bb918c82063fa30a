"""Details of the active codebook: file, centroids, calibration corpus, hash, warnings."""

from __future__ import annotations

import time

from PySide6.QtWidgets import QDialog, QDialogButtonBox, QFormLayout, QLabel, QVBoxLayout, QWidget

from ..events import CodebookLoaded
from ..inert_text import plain_labels
from ..units import human_bytes


def codebook_rows(info: CodebookLoaded) -> list[tuple[str, str]]:
    """(label, value) rows describing a codebook, for the dialog and tooltips."""
    meta = info.metadata or {}
    rows = [
        ("File", info.path),
        ("Centroids", f"{info.n_centroids} per layer and KV head"),
        ("Sub-vector dim", str(info.sub_dim)),
        ("Layers", str(info.num_layers)),
        ("Beta", "-" if info.beta is None else f"{info.beta:g}"),
        ("Held in memory", human_bytes(info.nbytes)),
        ("SHA-256", info.sha256),
    ]
    corpus = meta.get("corpus") or meta.get("calibration_corpus")
    if corpus:
        rows.append(("Calibration corpus", str(corpus)))
    tokens = meta.get("num_tokens") or meta.get("calibration_tokens") or meta.get("tokens")
    if tokens:
        rows.append(("Calibration tokens", str(tokens)))
    created = meta.get("created") or meta.get("creation_time")
    if isinstance(created, int | float):
        created = time.strftime("%Y-%m-%d %H:%M", time.localtime(created))
    if created:
        rows.append(("Created", str(created)))
    for warning in info.warnings:
        rows.append(("Warning", warning))
    return rows


class CodebookInfoDialog(QDialog):
    def __init__(self, info: CodebookLoaded, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setWindowTitle(f"Codebook: {info.name}")
        self.setMinimumWidth(520)
        form = QFormLayout()
        for label, value in codebook_rows(info):
            text = QLabel(value)
            plain_labels(text)  # names and warnings come from the file
            text.setWordWrap(True)
            text.setTextInteractionFlags(
                text.textInteractionFlags() | text.textInteractionFlags().TextSelectableByMouse
            )
            form.addRow(label, text)
        buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Close)
        buttons.rejected.connect(self.reject)
        layout = QVBoxLayout(self)
        layout.addLayout(form)
        layout.addWidget(buttons)
