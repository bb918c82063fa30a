"""Untrusted strings (model output, chat titles, GGUF names, error texts) shown as inert text.

Qt guesses whether a label, tooltip or message box holds rich text (`Qt.mightBeRichText`), so a
chat titled `<img src="file:///...">` would be rendered as HTML. Labels get `Qt.PlainText`;
tooltips and static message boxes (which have no text-format setting) get the text escaped and
wrapped as rich text, which shows exactly the original characters.
"""

from __future__ import annotations

import html

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QLabel, QMessageBox


def rich_from_plain(text: str) -> str:
    """Rich text that displays `text` verbatim (markup escaped, line breaks kept); "" stays ""."""
    if not text:
        return ""
    return f"<p style='white-space:pre-wrap'>{html.escape(text, quote=False)}</p>"


def plain_labels(*labels: QLabel) -> None:
    """Make each label show its text verbatim, whatever it contains."""
    for label in labels:
        label.setTextFormat(Qt.TextFormat.PlainText)


def plain_message_box(box: QMessageBox) -> QMessageBox:
    """`box` with its text shown verbatim; returns it (for chaining)."""
    box.setTextFormat(Qt.TextFormat.PlainText)
    return box
