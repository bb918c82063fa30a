"""The sidebar: New chat, search, and the list of conversations (rename, delete, export)."""

from __future__ import annotations

import time

from PySide6.QtCore import QModelIndex, QRect, QSize, Qt, QTimer, Signal
from PySide6.QtGui import QFont, QFontMetrics, QPainter
from PySide6.QtWidgets import (
    QAbstractItemView,
    QLabel,
    QLineEdit,
    QListWidget,
    QListWidgetItem,
    QMenu,
    QPushButton,
    QStyle,
    QStyledItemDelegate,
    QStyleOptionViewItem,
    QVBoxLayout,
    QWidget,
)

from ..conversations import Conversation
from ..inert_text import rich_from_plain
from ..theme import bind_icon, theme

ID_ROLE = Qt.ItemDataRole.UserRole
WHEN_ROLE = Qt.ItemDataRole.UserRole + 1


def relative_time(timestamp: float, now: float | None = None) -> str:
    """ "just now", "5 min ago", "3 h ago", "yesterday", or a date."""
    now = time.time() if now is None else now
    delta = max(0.0, now - timestamp)
    if delta < 60:
        return "just now"
    if delta < 3600:
        return f"{int(delta // 60)} min ago"
    if delta < 86400:
        return f"{int(delta // 3600)} h ago"
    if delta < 2 * 86400:
        return "yesterday"
    return time.strftime("%d %b %Y", time.localtime(timestamp))


class _ItemDelegate(QStyledItemDelegate):
    """Title on one line, a muted "when" line under it."""

    def sizeHint(self, option, index) -> QSize:  # noqa: N802
        metrics = QFontMetrics(option.font)
        return QSize(option.rect.width(), metrics.height() * 2 + 14)

    def paint(self, painter: QPainter, option: QStyleOptionViewItem, index: QModelIndex) -> None:
        opt = QStyleOptionViewItem(option)
        self.initStyleOption(opt, index)
        title = opt.text
        opt.text = ""
        style = opt.widget.style() if opt.widget else None
        if style is not None:
            style.drawControl(QStyle.ControlElement.CE_ItemViewItem, opt, painter, opt.widget)
        colors = theme().colors
        rect = option.rect.adjusted(10, 5, -10, -5)
        metrics = QFontMetrics(option.font)
        painter.save()
        bold = QFont(option.font)
        bold.setWeight(QFont.Weight.Medium)
        painter.setFont(bold)
        painter.setPen(theme().color("text"))
        top = QRect(rect.left(), rect.top(), rect.width(), metrics.height())
        painter.drawText(
            top,
            Qt.AlignmentFlag.AlignLeft | Qt.AlignmentFlag.AlignVCenter,
            QFontMetrics(bold).elidedText(title, Qt.TextElideMode.ElideRight, rect.width()),
        )
        small = QFont(option.font)
        small.setPointSizeF(max(7.0, option.font.pointSizeF() * 0.85))
        painter.setFont(small)
        painter.setPen(theme().color("faint") if colors else painter.pen().color())
        bottom = QRect(rect.left(), top.bottom() + 2, rect.width(), metrics.height())
        painter.drawText(
            bottom,
            Qt.AlignmentFlag.AlignLeft | Qt.AlignmentFlag.AlignVCenter,
            index.data(WHEN_ROLE) or "",
        )
        painter.restore()


class ConversationList(QWidget):
    """Lists conversations; emits user intents (the main window changes the data)."""

    new_requested = Signal()
    selected = Signal(str)
    rename_requested = Signal(str, str)  # id, new title
    delete_requested = Signal(str)
    export_requested = Signal(str, str)  # id, "markdown" | "json"

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("Sidebar")
        self.setAttribute(Qt.WidgetAttribute.WA_StyledBackground, True)
        self._conversations: list[Conversation] = []
        self._updating = False

        self.new_button = QPushButton("  New chat")
        self.new_button.setObjectName("NewChatButton")
        self.new_button.setAccessibleName("New chat")
        self.new_button.setToolTip("New chat (Ctrl+N)")
        self.new_button.setCursor(Qt.CursorShape.PointingHandCursor)
        bind_icon(self.new_button, "plus", "accent_text")
        self.new_button.clicked.connect(self.new_requested)

        self.search = QLineEdit()
        self.search.setObjectName("SearchField")
        self.search.setPlaceholderText("Search chats")
        self.search.setAccessibleName("Search conversations")
        self.search.setClearButtonEnabled(True)
        self._search_action = self.search.addAction(
            theme().icon("search", "faint"), QLineEdit.ActionPosition.LeadingPosition
        )
        self._search_action.setText("Search")
        theme().changed.connect(self._on_theme_changed)
        self.search.textChanged.connect(self._apply_filter)

        title = QLabel("CHATS")
        title.setObjectName("SidebarTitle")

        self.list = QListWidget()
        self.list.setObjectName("ConversationList")
        self.list.setAccessibleName("Conversations")
        self.list.setItemDelegate(_ItemDelegate(self.list))
        self.list.setEditTriggers(QAbstractItemView.EditTrigger.EditKeyPressed)
        self.list.setContextMenuPolicy(Qt.ContextMenuPolicy.CustomContextMenu)
        self.list.customContextMenuRequested.connect(self._context_menu)
        self.list.currentItemChanged.connect(self._on_current_changed)
        self.list.itemDoubleClicked.connect(self._rename_item)
        self.list.itemChanged.connect(self._on_item_changed)

        self._clock = QTimer(self)  # keeps "5 min ago" labels current
        self._clock.setInterval(60_000)
        self._clock.timeout.connect(self._refresh_times)
        self._clock.start()

        layout = QVBoxLayout(self)
        layout.setContentsMargins(12, 12, 12, 8)
        layout.setSpacing(10)
        layout.addWidget(self.new_button)
        layout.addWidget(self.search)
        layout.addWidget(title)
        layout.addWidget(self.list, 1)

    def _on_theme_changed(self) -> None:
        self._search_action.setIcon(theme().icon("search", "faint"))

    # ----- data ------------------------------------------------------------------------------

    def set_conversations(self, conversations: list[Conversation], current: str | None) -> None:
        self._updating = True
        self._conversations = list(conversations)
        self.list.clear()
        for conversation in conversations:
            item = QListWidgetItem(conversation.title)
            item.setData(ID_ROLE, conversation.id)
            item.setData(WHEN_ROLE, relative_time(conversation.updated))
            item.setToolTip(rich_from_plain(conversation.title))
            item.setFlags(item.flags() | Qt.ItemFlag.ItemIsEditable)
            self.list.addItem(item)
            if conversation.id == current:
                self.list.setCurrentItem(item)
        self._updating = False
        self._apply_filter(self.search.text())

    def _refresh_times(self) -> None:
        by_id = {c.id: c for c in self._conversations}
        for i in range(self.list.count()):
            item = self.list.item(i)
            conversation = by_id.get(item.data(ID_ROLE))
            if conversation is not None:
                item.setData(WHEN_ROLE, relative_time(conversation.updated))

    def current_id(self) -> str | None:
        item = self.list.currentItem()
        return item.data(ID_ROLE) if item else None

    def visible_ids(self) -> list[str]:
        return [
            self.list.item(i).data(ID_ROLE)
            for i in range(self.list.count())
            if not self.list.item(i).isHidden()
        ]

    def _apply_filter(self, text: str) -> None:
        needle = text.strip().lower()
        by_id = {c.id: c for c in self._conversations}
        for i in range(self.list.count()):
            item = self.list.item(i)
            conversation = by_id.get(item.data(ID_ROLE))
            match = not needle or (
                conversation is not None
                and (
                    needle in conversation.title.lower()
                    or any(needle in m.content.lower() for m in conversation.messages)
                )
            )
            item.setHidden(not match)

    # ----- user actions ----------------------------------------------------------------------

    def _on_current_changed(self, current: QListWidgetItem | None, _previous) -> None:
        if current is not None and not self._updating:
            self.selected.emit(current.data(ID_ROLE))

    def _rename_item(self, item: QListWidgetItem) -> None:
        self.list.editItem(item)

    def _on_item_changed(self, item: QListWidgetItem) -> None:
        if self._updating:
            return
        title = " ".join(item.text().split())
        if title:
            self.rename_requested.emit(item.data(ID_ROLE), title)

    def _context_menu(self, point) -> None:
        item = self.list.itemAt(point)
        if item is None:
            return
        conversation_id = item.data(ID_ROLE)
        menu = QMenu(self)
        menu.addAction(theme().icon("rename"), "Rename", lambda: self.list.editItem(item))
        menu.addAction(
            theme().icon("export"),
            "Export as Markdown\u2026",
            lambda: self.export_requested.emit(conversation_id, "markdown"),
        )
        menu.addAction(
            theme().icon("export"),
            "Export as JSON\u2026",
            lambda: self.export_requested.emit(conversation_id, "json"),
        )
        menu.addSeparator()
        menu.addAction(
            theme().icon("trash", "danger"),
            "Delete",
            lambda: self.delete_requested.emit(conversation_id),
        )
        menu.exec(self.list.viewport().mapToGlobal(point))
