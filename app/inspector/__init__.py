"""Live A2ATS cache inspector (pyqtgraph panels docked beside the chat).

`from app.inspector import InspectorPanel` loads Qt; `app.inspector.export`, `.data` and
`.history` are Qt-free and can be imported on their own (scripts, the CLI).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

__all__ = ["InspectorPanel", "export_telemetry", "load_telemetry"]

if TYPE_CHECKING:
    from .export import export_telemetry, load_telemetry
    from .panel import InspectorPanel


def __getattr__(name: str):
    if name == "InspectorPanel":
        from .panel import InspectorPanel

        return InspectorPanel
    if name in ("export_telemetry", "load_telemetry"):
        from . import export

        return getattr(export, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
