"""Light/dark look: palette, the .qss template in resources/, and SVG icons tinted per theme.

The theme follows the system colour scheme (Qt's style hints) unless the settings force
"light" or "dark". Icons are monochrome SVGs drawn with `currentColor`; `ThemeManager.icon`
tints them with a palette colour and `bind_icon` re-tints a button when the theme changes.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from string import Template

from PySide6.QtCore import QByteArray, QObject, QRectF, QSize, Qt, Signal
from PySide6.QtGui import QColor, QGuiApplication, QIcon, QPainter, QPalette, QPixmap
from PySide6.QtSvg import QSvgRenderer
from PySide6.QtWidgets import QAbstractButton, QApplication

LIGHT = {
    "window": "#f7f7f8",
    "sidebar": "#eeeef1",
    "surface": "#ffffff",
    "raised": "#ffffff",
    "text": "#1d1d1f",
    "muted": "#6e6e76",
    "faint": "#a1a1aa",
    "border": "#e1e1e6",
    "strong_border": "#cfd0d6",
    "hover": "#e4e4e9",
    "pressed": "#d9d9df",
    "accent": "#2f6fed",
    "accent_hover": "#285fd0",
    "accent_text": "#ffffff",
    "accent_soft": "#e6eefd",
    "selection": "#cfe0ff",
    "user_bubble": "#e9f0fe",
    "code_bg": "#f4f5f7",
    "code_border": "#e2e4e9",
    "inline_code": "#eef0f3",
    "highlight": "#ffd54f",
    "danger": "#d93f3f",
    "success": "#1f9d55",
    "warning": "#b7791f",
}

DARK = {
    "window": "#1c1d20",
    "sidebar": "#161719",
    "surface": "#232427",
    "raised": "#2a2b2f",
    "text": "#ececf1",
    "muted": "#a0a0aa",
    "faint": "#6c6c76",
    "border": "#313237",
    "strong_border": "#404148",
    "hover": "#2d2e33",
    "pressed": "#36373d",
    "accent": "#5b8cff",
    "accent_hover": "#7aa2ff",
    "accent_text": "#0e1422",
    "accent_soft": "#25304a",
    "selection": "#33466e",
    "user_bubble": "#2a3349",
    "code_bg": "#17181b",
    "code_border": "#2f3136",
    "inline_code": "#2c2e33",
    "highlight": "#b8860b",
    "danger": "#ff6b6b",
    "success": "#4cc38a",
    "warning": "#e0a84f",
}


def resources_dir() -> Path:
    """The repository's resources/ folder (icons, stylesheet)."""
    return Path(__file__).resolve().parents[1] / "resources"


def system_prefers_dark() -> bool:
    app = QGuiApplication.instance()
    if app is None:
        return False
    scheme = app.styleHints().colorScheme()
    if scheme == Qt.ColorScheme.Dark:
        return True
    if scheme == Qt.ColorScheme.Light:
        return False
    return app.palette().color(QPalette.ColorRole.Window).lightness() < 128


def _palette(colors: dict[str, str]) -> QPalette:
    pal = QPalette()
    role = QPalette.ColorRole
    pairs = {
        role.Window: "window",
        role.WindowText: "text",
        role.Base: "surface",
        role.AlternateBase: "sidebar",
        role.Text: "text",
        role.Button: "raised",
        role.ButtonText: "text",
        role.ToolTipBase: "raised",
        role.ToolTipText: "text",
        role.Highlight: "accent",
        role.HighlightedText: "accent_text",
        role.PlaceholderText: "faint",
        role.Link: "accent",
        role.Mid: "border",
        role.Midlight: "hover",
        role.Dark: "strong_border",
    }
    for r, key in pairs.items():
        pal.setColor(r, QColor(colors[key]))
    pal.setColor(QPalette.ColorGroup.Disabled, role.Text, QColor(colors["faint"]))
    pal.setColor(QPalette.ColorGroup.Disabled, role.ButtonText, QColor(colors["faint"]))
    pal.setColor(QPalette.ColorGroup.Disabled, role.WindowText, QColor(colors["faint"]))
    return pal


class ThemeManager(QObject):
    """Holds the active colours and emits `changed` when the theme switches."""

    changed = Signal()
    _instance: ThemeManager | None = None

    def __init__(self) -> None:
        super().__init__()
        self.mode = "system"
        self.dark = False
        self.colors = dict(LIGHT)
        self._svg_cache: dict[str, bytes] = {}
        self._icon_cache: dict[tuple[str, str], QIcon] = {}

    @classmethod
    def instance(cls) -> ThemeManager:
        if cls._instance is None:
            cls._instance = ThemeManager()
        return cls._instance

    def apply(self, mode: str = "system") -> None:
        """Apply "system", "light" or "dark" to the running QApplication."""
        app = QApplication.instance()
        self.mode = mode
        self.dark = mode == "dark" or (mode == "system" and system_prefers_dark())
        self.colors = dict(DARK if self.dark else LIGHT)
        self._icon_cache.clear()
        if app is not None:
            app.setStyle("Fusion")
            app.setPalette(_palette(self.colors))
            template = Template((resources_dir() / "style.qss").read_text(encoding="utf-8"))
            app.setStyleSheet(template.substitute(self.colors))
        self.changed.emit()

    def color(self, key: str) -> QColor:
        return QColor(self.colors[key])

    def icon(self, name: str, color_key: str = "muted") -> QIcon:
        """The SVG icon `resources/icons/<name>.svg` tinted with the palette colour."""
        key = (name, color_key)
        if key not in self._icon_cache:
            self._icon_cache[key] = self._render(name, self.colors.get(color_key, color_key))
        return self._icon_cache[key]

    def _render(self, name: str, color: str) -> QIcon:
        if name not in self._svg_cache:
            self._svg_cache[name] = (resources_dir() / "icons" / f"{name}.svg").read_bytes()
        data = self._svg_cache[name].replace(b"currentColor", color.encode())
        renderer = QSvgRenderer(QByteArray(data))
        icon = QIcon()
        for size in (16, 20, 24, 32, 48, 64):
            pixmap = QPixmap(QSize(size, size))
            pixmap.fill(Qt.GlobalColor.transparent)
            painter = QPainter(pixmap)
            painter.setRenderHint(QPainter.RenderHint.Antialiasing)
            renderer.render(painter, QRectF(0, 0, size, size))
            painter.end()
            icon.addPixmap(pixmap)
        return icon


def theme() -> ThemeManager:
    return ThemeManager.instance()


def bind_icon(button: QAbstractButton, name: str, color_key: str = "muted") -> None:
    """Set a tinted icon on `button` now and again whenever the theme changes."""
    manager = theme()

    def refresh() -> None:
        with contextlib.suppress(RuntimeError):  # the button may already be deleted
            button.setIcon(manager.icon(name, color_key))

    refresh()
    manager.changed.connect(refresh)
    button.destroyed.connect(lambda *_: _safe_disconnect(manager.changed, refresh))


def _safe_disconnect(signal, slot) -> None:
    with contextlib.suppress(RuntimeError, TypeError):
        signal.disconnect(slot)


def app_icon() -> QIcon:
    return QIcon(str(resources_dir() / "icons" / "app.svg"))
