"""Export a chat to a Markdown or JSON file the user picks (provenance included)."""

from __future__ import annotations

from pathlib import Path

from PySide6.QtWidgets import QFileDialog, QMessageBox, QWidget

from .conversations import Conversation, export_json, export_markdown
from .inert_text import rich_from_plain


def export_to_file(
    parent: QWidget, conversation: Conversation, kind: str, path: str | None = None
) -> str | None:
    """Write `conversation` as "markdown" or "json" to `path` (asked for when None); returns
    the path, or None when the user cancelled or the write failed (a warning was shown)."""
    suffix, text = (".md", export_markdown) if kind == "markdown" else (".json", export_json)
    if path is None:
        safe = "".join(ch if ch.isalnum() or ch in " -_" else "_" for ch in conversation.title)
        path, _ = QFileDialog.getSaveFileName(
            parent,
            "Export chat",
            str(Path.home() / f"{safe.strip() or 'chat'}{suffix}"),
            "Markdown (*.md)" if kind == "markdown" else "JSON (*.json)",
        )
        if not path:
            return None
    try:
        Path(path).write_text(text(conversation), encoding="utf-8")
    except OSError as exc:
        QMessageBox.warning(
            parent,
            "Export failed",
            rich_from_plain(f"Could not write {path}: {exc.strerror or exc}"),
        )
        return None
    return path
