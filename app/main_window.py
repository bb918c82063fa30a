"""MainWindow: the widgets of the chat app, bound to a `ChatController` (controller.py).

The window lays out the conversation list, chat view, composer, top bar, status bar and the
inspector dock, forwards user actions to the controller and shows what the controller's
past-tense signals report. It holds no state the controller owns (settings, chats, model,
codebook): it reads them from the controller and changes them through it, and never calls the
engine.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from PySide6.QtCore import QByteArray, QSignalBlocker, Qt, QTimer, Signal
from PySide6.QtGui import QCloseEvent
from PySide6.QtWidgets import (
    QMainWindow,
    QMessageBox,
    QSplitter,
    QVBoxLayout,
    QWidget,
)

from .chat.chat_header import ChatHeader, SystemPromptPanel
from .chat.chat_view import ChatView
from .chat.composer import Composer
from .chat.conversation_list import ConversationList
from .controller import ChatController
from .conversations import Conversation, HistoryStore
from .dialogs.calibrate_dialog import CalibrateDialog
from .dialogs.settings_dialog import SettingsDialog, SettingsResult
from .export_file import export_to_file
from .feedback import Feedback
from .inert_text import rich_from_plain
from .inspector_dock import InspectorDock
from .menus import build_menu_bar
from .reply_view import ReplyView
from .settings import MAX_PIXELS, AppSettings
from .status_bar import StatusBar
from .theme import app_icon, theme
from .top_bar import TopBar
from .window_sources import SourceActions, model_label
from .worker import EngineThread

INTERRUPTED_NOTE = "Interrupted: the app closed before this reply finished."


class MainWindow(QMainWindow, SourceActions):
    """The chat app. `engine` defaults to a real EngineThread; tests may pass one built on a
    fake backend. `scripted` suppresses modal questions (first run, context overflow)."""

    reply_finished = Signal(object)  # GenerationStats, after the reply is saved and shown
    model_ready = Signal(object)  # ModelLoaded, after the window has adopted the model
    error_shown = Signal(object)  # ErrorReport, after it was shown
    codebook_ready = Signal(object)  # CodebookLoaded, after the window has adopted it
    shutdown_timeout_ms = 10000

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
        self.scripted = scripted
        self.controller = ChatController(
            settings,
            engine=engine,
            store=store,
            settings_path=Path(settings_path) if settings_path is not None else None,
        )
        self.calibrate_dialog: CalibrateDialog | None = None
        try:
            self._build()
        except BaseException:
            # The engine thread already runs: end it, or Python destroys a running QThread
            # ("QThread: Destroyed while thread is still running", abort).
            self.controller.engine.shutdown(self.shutdown_timeout_ms)
            raise
        if settings_message:
            self.statusBar().showMessage(settings_message, 15000)

    def _build(self) -> None:
        self.setWindowTitle("A2ATS Chat")
        self.setWindowIcon(app_icon())
        self.setObjectName("MainWindow")
        self._build_ui()
        self._build_actions()
        self._connect_controller()
        self._restore_layout()
        self.controller.load_history()
        self._update_ready()

    # =========================================================================================
    # UI construction
    # =========================================================================================

    def _build_ui(self) -> None:
        self.top_bar = TopBar(self.controller.settings.cache.a2ats_enabled)
        self.addToolBar(Qt.ToolBarArea.TopToolBarArea, self.top_bar)
        bar = self.top_bar
        self.model_button, self.model_menu = bar.model_button, bar.model_menu
        self.codebook_button, self.codebook_menu = bar.codebook_button, bar.codebook_menu
        self.a2ats_toggle, self.inspector_button = bar.a2ats_toggle, bar.inspector_button
        self.model_menu.aboutToShow.connect(self._fill_model_menu)
        self.codebook_menu.aboutToShow.connect(self._fill_codebook_menu)
        self.a2ats_toggle.toggled.connect(self._on_a2ats_toggled)
        bar.settings_button.clicked.connect(self.open_settings)

        self.sidebar = ConversationList()
        self.sidebar.setMinimumWidth(200)
        self.chat_view = ChatView()
        self.composer = Composer()
        self.header = ChatHeader()
        self.header.export_requested.connect(self.export_current)
        self.system_button = self.header.system_button
        self.system_button.toggled.connect(self._on_system_toggled)
        self.system_panel = SystemPromptPanel()
        self.system_edit = self.system_panel.edit
        self.system_edit.textChanged.connect(self._on_system_prompt_edited)
        self._system_save_timer = QTimer(self)
        self._system_save_timer.setSingleShot(True)
        self._system_save_timer.setInterval(500)
        self._system_save_timer.timeout.connect(self._save_current)
        chat_column = QWidget()
        chat_column.setObjectName("ChatColumn")
        chat_column.setAttribute(Qt.WidgetAttribute.WA_StyledBackground, True)
        column_layout = QVBoxLayout(chat_column)
        column_layout.setContentsMargins(0, 0, 0, 0)
        column_layout.setSpacing(0)
        column_layout.addWidget(self.header)
        column_layout.addWidget(self.system_panel)
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

    def _build_inspector_dock(self) -> None:
        self.dock = InspectorDock(self)
        self.inspector = self.dock.inspector
        self.addDockWidget(Qt.DockWidgetArea.RightDockWidgetArea, self.dock)
        self.dock.visibilityChanged.connect(self._on_dock_visibility)
        self.inspector_button.toggled.connect(self.dock.setVisible)
        if self.inspector is not None:
            self.inspector.highlight_requested.connect(self.chat_view.highlight_positions)
            self.inspector.scroll_requested.connect(self.chat_view.scroll_to_position)

    def _build_actions(self) -> None:
        actions = build_menu_bar(self)
        self.new_chat_action, self.stop_action = actions.new_chat, actions.stop
        self.regenerate_action = actions.regenerate
        self.sidebar.new_requested.connect(self.new_chat)
        self.sidebar.selected.connect(self.select_conversation)
        self.sidebar.rename_requested.connect(self.controller.rename)
        self.sidebar.delete_requested.connect(self.delete_conversation)
        self.sidebar.export_requested.connect(self.export_conversation)
        self.composer.send_requested.connect(self.send)
        self.composer.stop_requested.connect(self.controller.stop)
        self.composer.edit_cancelled.connect(
            lambda: self.statusBar().showMessage("Edit cancelled", 3000)
        )
        self.chat_view.regenerate_requested.connect(self.controller.regenerate)
        self.chat_view.edit_requested.connect(self.begin_edit_last)
        self.chat_view.version_requested.connect(self.controller.show_version)
        self.chat_view.copied.connect(lambda what: self.statusBar().showMessage(what, 2500))

    def _connect_controller(self) -> None:
        c = self.controller
        c.task_changed.connect(self._update_ready)
        c.model_loaded.connect(self._on_model_loaded)
        c.codebook_loaded.connect(self._on_codebook_loaded)
        c.codebook_cleared.connect(self._on_codebook_cleared)
        c.notice.connect(self.statusBar().showMessage)
        c.current_changed.connect(self._show_conversation)
        c.conversations_changed.connect(self._refresh_sidebar)
        c.calibration_finished.connect(self._on_calibration_finished)
        c.calibration_cancelled.connect(self._on_calibration_cancelled)
        c.settings_changed.connect(self._on_settings_changed)
        self.replies = ReplyView(c, self.chat_view, self.status, self.inspector)
        self.replies.changed.connect(self._on_reply_changed)
        self.replies.restore_requested.connect(self._show_conversation)
        self.replies.finished.connect(self.reply_finished)
        self.feedback = Feedback(
            self, c, self.scripted, lambda: self.calibrate_dialog, self._model_label
        )
        self.feedback.shown.connect(self.error_shown)

    def _restore_layout(self) -> None:
        settings = self.controller.settings
        if settings.window_geometry:
            self.restoreGeometry(QByteArray.fromBase64(settings.window_geometry.encode()))
        if settings.window_state:
            self.restoreState(QByteArray.fromBase64(settings.window_state.encode()))
        sizes = settings.splitter_sizes
        if len(sizes) == 2 and all(0 < size <= MAX_PIXELS for size in sizes):
            self.splitter.setSizes(sizes)
        self.dock.setVisible(settings.inspector_visible)
        self.inspector_button.setChecked(settings.inspector_visible)
        if settings.window_state:
            self.dock.keep_restored_share()

    def resizeEvent(self, event) -> None:  # noqa: N802 (Qt override)
        super().resizeEvent(event)
        old, new = event.oldSize().width(), event.size().width()
        if new != old and hasattr(self, "dock"):
            self.dock.window_resized(old, new)

    # =========================================================================================
    # Conversations
    # =========================================================================================

    def _refresh_sidebar(self) -> None:
        current = self.controller.current
        self.sidebar.set_conversations(
            self.controller.conversations, current.id if current else None
        )
        self._update_header()

    def _show_conversation(self, conversation: Conversation) -> None:
        self.composer.cancel_edit()
        self.chat_view.set_conversation(conversation)
        for widget in self.chat_view.widgets:
            if widget.message.interrupted:
                widget.set_note(INTERRUPTED_NOTE, error=True)
        reply = self.controller.reply
        self.chat_view.set_busy(reply is not None)
        if reply is not None and conversation is reply.conversation:
            # Back on the chat whose reply is still streaming: show it again, where it is.
            if reply.replaces is not None:
                self.chat_view.remove_last()
            self.chat_view.begin_stream(reply.message)
            self.chat_view.append_stream_text(reply.text)
        self._system_save_timer.stop()
        with QSignalBlocker(self.system_edit):
            self.system_edit.setPlainText(conversation.system_prompt)
        self.composer.set_text(conversation.draft)
        self._update_header()
        if self.inspector is not None:
            self.inspector.set_context_tokens([])
            if reply is None:
                self.inspector.clear()

    def _update_header(self) -> None:
        conversation = self.controller.current
        if conversation is not None:
            self.header.show_conversation(conversation)
            read_only = " (read-only)" if self.controller.read_only else ""
            self.setWindowTitle(f"{conversation.title} \u2014 A2ATS Chat{read_only}")

    def _save_current(self) -> None:
        self.controller.save_current()
        self._update_header()

    def new_chat(self) -> None:
        self.controller.keep_draft(self.composer.draft())
        self.controller.new_chat()
        self.composer.edit.setFocus()

    def select_conversation(self, conversation_id: str) -> None:
        current = self.controller.current
        if current is None or conversation_id != current.id:
            self.controller.keep_draft(self.composer.draft())
            self.controller.select(conversation_id)

    def delete_conversation(self, conversation_id: str, confirm: bool = True) -> None:
        conversation = self.controller.find(conversation_id)
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
        self.controller.delete(conversation_id)

    def export_current(self, kind: str) -> None:
        if self.controller.current is not None:
            self.export_conversation(self.controller.current.id, kind)

    def export_conversation(
        self, conversation_id: str, kind: str, path: str | None = None
    ) -> str | None:
        """Write the conversation as Markdown or JSON (provenance included); returns the path."""
        conversation = self.controller.find(conversation_id)
        if conversation is None:
            return None
        path = export_to_file(self, conversation, kind, path)
        if path:
            self.statusBar().showMessage(f"Exported to {path}", 5000)
        return path

    def _on_system_toggled(self, shown: bool) -> None:
        self.system_panel.setVisible(shown)
        if shown:
            self.system_edit.setFocus()

    def _on_system_prompt_edited(self) -> None:
        self.controller.set_system_prompt(self.system_edit.toPlainText())
        self._update_header()
        self._system_save_timer.start()

    # =========================================================================================
    # Settings
    # =========================================================================================

    def open_settings(self) -> None:
        settings = self.controller.settings
        info = self.controller.model.info if self.controller.model is not None else None
        dialog = SettingsDialog(
            settings.cache,
            settings.sampling,
            settings.theme,
            settings.default_system_prompt,
            self,
            model_sampling=info.recommended_sampling if info is not None else None,
            use_model_sampling=settings.use_model_sampling,
            model_name=info.name if info is not None else "",
        )
        if dialog.exec() and dialog.result_value is not None:
            self.apply_settings(dialog.result_value)

    def apply_settings(self, result: SettingsResult) -> None:
        """The settings dialog's result, through the controller (saved, `settings_changed`)."""
        changed = self.controller.change_settings(
            cache=result.cache,
            sampling=result.sampling,
            use_model_sampling=result.use_model_sampling,
            default_system_prompt=result.default_system_prompt,
            theme=result.theme,
        )
        if changed & {"cache", "sampling", "use_model_sampling"}:
            self.statusBar().showMessage("Settings saved; they apply to the next message", 6000)

    def _on_a2ats_toggled(self, enabled: bool) -> None:
        cache = replace(self.controller.settings.cache, a2ats_enabled=enabled)
        self.controller.change_settings(cache=cache)
        kind = "A2ATS cache" if enabled else "mlx-lm KVCache (A2ATS off)"
        self.statusBar().showMessage(f"The next message uses the {kind}", 6000)

    def _on_settings_changed(self, changed: frozenset[str]) -> None:
        settings = self.controller.settings
        if "theme" in changed:
            theme().apply(settings.theme)
        if "cache" in changed:
            with QSignalBlocker(self.a2ats_toggle):
                self.a2ats_toggle.setChecked(settings.cache.a2ats_enabled)

    def _on_dock_visibility(self, visible: bool) -> None:
        if self.isVisible() or self.scripted:
            shown = self.dock.isVisible() if self.isVisible() else visible
            self.controller.change_settings(inspector_visible=shown, save=False)
        with QSignalBlocker(self.inspector_button):
            self.inspector_button.setChecked(visible)
        self._sync_telemetry()

    def _sync_telemetry(self) -> None:
        """Telemetry costs a host sync per step: on only while the inspector can show it."""
        self.controller.set_telemetry(self.inspector is not None and self.dock.isVisible())

    def showEvent(self, event) -> None:  # noqa: N802 (Qt override)
        super().showEvent(event)
        self._sync_telemetry()

    def hideEvent(self, event) -> None:  # noqa: N802 (Qt override)
        super().hideEvent(event)
        self._sync_telemetry()

    # =========================================================================================
    # Chat
    # =========================================================================================

    def _on_reply_changed(self) -> None:
        self._update_ready()
        self._refresh_sidebar()

    def _model_label(self) -> str:
        return model_label(self.controller.model) if self.controller.model else ""

    def _update_ready(self) -> None:
        reason = self.controller.ready_reason()
        self.composer.set_ready(not reason, reason)
        self.composer.set_generating(self.controller.reply is not None)

    def send(self, text: str) -> None:
        """Send a new user message (or, while editing, resend the edited last message)."""
        if self.composer.editing:
            self.composer.finish_edit()
            sent = self.controller.resend_edited(text)
        else:
            sent = self.controller.send(text)
        if sent:
            self.composer.edit.clear()

    def begin_edit_last(self) -> None:
        conversation = self.controller.current
        if conversation is None or self.controller.reply is not None:
            return
        index = conversation.last_index("user")
        if index is not None:
            self.composer.begin_edit(conversation.messages[index].content)

    # =========================================================================================
    # Shutdown
    # =========================================================================================

    def keyPressEvent(self, event) -> None:  # noqa: N802
        """Esc anywhere in the window stops the reply (the composer handles its own Esc)."""
        if event.key() == Qt.Key.Key_Escape and self.controller.reply is not None:
            self.controller.stop()
            event.accept()
            return
        super().keyPressEvent(event)

    def closeEvent(self, event: QCloseEvent) -> None:  # noqa: N802
        """Save the layout, the chat and its draft; the engine thread ends whatever the saves
        did, and a thread that does not end in time is left running instead of aborting."""
        self.controller.change_settings(
            window_geometry=bytes(self.saveGeometry().toBase64()).decode(),
            window_state=bytes(self.saveState().toBase64()).decode(),
            splitter_sizes=[int(s) for s in self.splitter.sizes()],
            inspector_visible=self.dock.isVisible(),
            save=False,  # save_before_quit writes them
        )
        self._system_save_timer.stop()
        draft = self.composer.draft()
        unsaved = self.controller.save_before_quit(draft)
        if unsaved and not self.feedback.quit_anyway(unsaved):
            event.ignore()
            return
        if not self.controller.shutdown(draft, self.shutdown_timeout_ms, saved=True):
            self.statusBar().showMessage("The engine did not stop in time", 5000)
        super().closeEvent(event)
