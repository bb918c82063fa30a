"""The main window's top bar: app title, model picker, codebook menu, A2ATS toggle, settings
and inspector buttons. The window fills the menus and binds the buttons."""

from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import QSize, Qt
from PySide6.QtWidgets import QLabel, QMenu, QSizePolicy, QToolBar, QToolButton, QWidget

from .dialogs.codebook_info import codebook_rows
from .events import CodebookLoaded
from .inert_text import rich_from_plain
from .theme import app_icon, bind_icon


class TopBar(QToolBar):
    """The toolbar; `model_menu` / `codebook_menu` are filled by the window when shown."""

    def __init__(self, a2ats_enabled: bool) -> None:
        super().__init__("Main toolbar")
        self.setObjectName("TopBar")
        self.setMovable(False)
        self.setFloatable(False)
        self.setIconSize(QSize(18, 18))
        self.setContextMenuPolicy(Qt.ContextMenuPolicy.PreventContextMenu)

        logo = QToolButton()
        logo.setIcon(app_icon())
        logo.setIconSize(QSize(22, 22))
        logo.setEnabled(True)
        logo.setAutoRaise(True)
        logo.setFocusPolicy(Qt.FocusPolicy.NoFocus)
        logo.setAccessibleName("A2ATS Chat")
        title = QLabel("A2ATS Chat")
        title.setObjectName("AppTitle")
        self.addWidget(logo)
        self.addWidget(title)
        self.addWidget(_spacer(18))

        self.model_button = QToolButton()
        self.model_button.setObjectName("ModelButton")
        self.model_button.setText("Choose a model  \u25be")
        self.model_button.setAccessibleName("Model picker")
        self.model_button.setToolTip("Choose a model (Ctrl+O opens a model folder)")
        self.model_button.setToolButtonStyle(Qt.ToolButtonStyle.ToolButtonTextBesideIcon)
        self.model_button.setPopupMode(QToolButton.ToolButtonPopupMode.InstantPopup)
        bind_icon(self.model_button, "model", "accent")
        self.model_menu = QMenu(self.model_button)
        self.model_button.setMenu(self.model_menu)
        self.addWidget(self.model_button)
        self.addWidget(_spacer(6))

        self.codebook_button = QToolButton()
        self.codebook_button.setObjectName("CodebookButton")
        self.codebook_button.setText("No codebook  \u25be")
        self.codebook_button.setAccessibleName("Codebook")
        self.codebook_button.setToolButtonStyle(Qt.ToolButtonStyle.ToolButtonTextBesideIcon)
        self.codebook_button.setPopupMode(QToolButton.ToolButtonPopupMode.InstantPopup)
        bind_icon(self.codebook_button, "codebook", "accent")
        self.codebook_menu = QMenu(self.codebook_button)
        self.codebook_button.setMenu(self.codebook_menu)
        self.addWidget(self.codebook_button)
        self.addWidget(_spacer(6))

        self.a2ats_toggle = QToolButton()
        self.a2ats_toggle.setObjectName("A2ATSToggle")
        self.a2ats_toggle.setCheckable(True)
        self.a2ats_toggle.setText("A2ATS cache")
        self.a2ats_toggle.setAccessibleName("A2ATS cache on or off")
        self.a2ats_toggle.setToolTip(
            "On: A2ATS retrieval cache. Off: mlx-lm's KVCache (for comparison). "
            "Applies to the next message."
        )
        self.a2ats_toggle.setChecked(a2ats_enabled)
        self.addWidget(self.a2ats_toggle)

        self.addWidget(_spacer(0, expand=True))
        self.settings_button = QToolButton()
        self.settings_button.setToolTip("Cache & sampling settings (Ctrl+,)")
        self.settings_button.setAccessibleName("Settings")
        bind_icon(self.settings_button, "settings", "muted")
        self.addWidget(self.settings_button)
        self.inspector_button = QToolButton()
        self.inspector_button.setCheckable(True)
        self.inspector_button.setToolTip("Show the cache inspector (Ctrl+I)")
        self.inspector_button.setAccessibleName("Cache inspector")
        bind_icon(self.inspector_button, "inspector", "muted")
        self.addWidget(self.inspector_button)
        self.addWidget(_spacer(4))

    def show_codebook(self, info: CodebookLoaded | None) -> None:
        """The codebook button's label and tooltip for `info` (None = no codebook)."""
        if info is None:
            self.codebook_button.setText("No codebook  \u25be")
            self.codebook_button.setToolTip(
                "No codebook loaded: A2ATS uses a random codebook. Load (Ctrl+L) or calibrate one."
            )
            return
        self.codebook_button.setText(f"{Path(info.name).stem} \u00b7 {info.n_centroids}c  \u25be")
        self.codebook_button.setToolTip(
            rich_from_plain("\n".join(f"{k}: {v}" for k, v in codebook_rows(info)))
        )


def _spacer(width: int, expand: bool = False) -> QWidget:
    spacer = QWidget()
    if expand:
        spacer.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Preferred)
    else:
        spacer.setFixedWidth(width)
    return spacer
