"""MarkdownView: a read-only, auto-height QTextBrowser that renders one message's Markdown.

Prose goes through Qt's own Markdown importer (GitHub dialect); fenced code blocks are built
by hand as framed, monospaced boxes with a language label and a "Copy" link, so they stay
readable. While rendering, the view records where each source segment landed in the
document, so `highlight_source_ranges` can highlight source character ranges (context tokens
mapped by the chat view) in the rendered text.

Replies are untrusted text, so the view keeps them inert: raw HTML is shown as text (Qt's
Markdown importer runs with `MarkdownNoHTML`), images become their alt text (prose is imported
into a scratch document with no layout, so no resource is ever loaded, and `loadResource`
returns nothing), links to anything but http(s) become plain text, and a web link opens only
after a confirmation that shows its real address.
"""

from __future__ import annotations

import math

from PySide6.QtCore import QByteArray, QSize, Qt, QUrl, Signal
from PySide6.QtGui import (
    QColor,
    QDesktopServices,
    QFont,
    QFontDatabase,
    QTextBlockFormat,
    QTextCharFormat,
    QTextCursor,
    QTextDocument,
    QTextDocumentFragment,
    QTextFormat,
    QTextFrameFormat,
    QTextLength,
    QTextTableFormat,
)
from PySide6.QtWidgets import (
    QApplication,
    QMenu,
    QMessageBox,
    QSizePolicy,
    QTextBrowser,
    QTextEdit,
    QWidget,
)

from ..theme import theme
from .markdown_segments import Segment, align, split_markdown

COPY_SCHEME = "copy-code"
WEB_SCHEMES = ("http", "https")  # the only links a reply may open (after a confirmation)
MARKDOWN_FEATURES = QTextDocument.MarkdownFeature(
    QTextDocument.MarkdownFeature.MarkdownDialectGitHub.value
    | QTextDocument.MarkdownFeature.MarkdownNoHTML.value
)


def is_web_link(url: QUrl) -> bool:
    """True for an absolute http(s) URL with a host: the only kind of link a reply may open."""
    return url.isValid() and url.scheme().lower() in WEB_SCHEMES and bool(url.host())


def inert_markdown(text: str) -> QTextDocumentFragment:
    """`text` (Markdown) as a document fragment that can load nothing and open nothing unsafe.

    Imported into a scratch document that has no view (so nothing lays it out and no image is
    fetched), without raw HTML; then every image is replaced by its alt text and every link
    whose target is not http(s) loses its anchor (it stays as plain text)."""
    scratch = QTextDocument()
    cursor = QTextCursor(scratch)
    cursor.insertMarkdown(text, MARKDOWN_FEATURES)
    _neutralize(scratch)
    cursor.select(QTextCursor.SelectionType.Document)
    return QTextDocumentFragment(cursor)


def _neutralize(doc: QTextDocument) -> None:
    """Replace images by their alt text; strip anchors that are not web links (last first, so
    earlier positions stay valid)."""
    edits: list[tuple[int, int, QTextCharFormat]] = []
    block = doc.begin()
    while block.isValid():
        it = block.begin()
        while not it.atEnd():
            fragment = it.fragment()
            fmt = fragment.charFormat()
            if fragment.isValid() and (fmt.isImageFormat() or fmt.isAnchor()):
                edits.append((fragment.position(), fragment.length(), fmt))
            it += 1
        block = block.next()
    for position, length, fmt in reversed(edits):
        cursor = QTextCursor(doc)
        cursor.setPosition(position)
        cursor.setPosition(position + length, QTextCursor.MoveMode.KeepAnchor)
        if fmt.isImageFormat():
            alt = fmt.property(QTextFormat.Property.ImageAltText) or ""
            cursor.insertText(str(alt) if alt else "[image]", _text_format(fmt))
        elif not is_web_link(QUrl(fmt.anchorHref())):
            cursor.setCharFormat(_text_format(fmt))
        else:
            fmt.setToolTip(QUrl(fmt.anchorHref()).toString())
            cursor.setCharFormat(fmt)


def _text_format(fmt: QTextCharFormat) -> QTextCharFormat:
    """`fmt` without anything that makes it an image or a link."""
    plain = QTextCharFormat()
    plain.setFontWeight(fmt.fontWeight())
    plain.setFontItalic(fmt.fontItalic())
    plain.setFontStrikeOut(fmt.fontStrikeOut())
    plain.setFontFixedPitch(fmt.fontFixedPitch())
    return plain


def link_address_text(url: QUrl) -> str:
    """The address a link really opens, as shown before opening it: the readable form, plus the
    encoded one when they differ (a look-alike Unicode host shows its punycode)."""
    shown = url.toDisplayString()
    encoded = bytes(url.toEncoded().data()).decode("ascii", "replace")
    return shown if encoded == shown else f"{shown}\n(encoded: {encoded})"


def confirm_open_link(parent: QWidget | None, url: QUrl) -> bool:
    """Ask before opening a web link; the box shows the real address as plain text."""
    box = QMessageBox(
        QMessageBox.Icon.Question,
        "Open link",
        "Open this address in your browser?\n\n" + link_address_text(url),
        QMessageBox.StandardButton.Open | QMessageBox.StandardButton.Cancel,
        parent,
    )
    box.setTextFormat(Qt.TextFormat.PlainText)
    box.setDefaultButton(QMessageBox.StandardButton.Cancel)
    return box.exec() == QMessageBox.StandardButton.Open


class _Placed:
    """Where one source segment ended up in the document."""

    def __init__(
        self, segment: Segment, doc_start: int, doc_end: int, rendered: str = "", lead: int = 0
    ):
        self.segment = segment
        self.doc_start = doc_start
        self.doc_end = doc_end
        self._rendered = rendered
        self._lead = lead  # newlines stripped from the front of the source before rendering
        self._mapping: list[int] | None = None

    @property
    def mapping(self) -> list[int]:
        """Prose: source offset (in the segment) -> rendered offset, or -1. Computed on first
        use, so streaming renders never pay for it (only highlighting does)."""
        if self._mapping is None:
            body = self.segment.body[self._lead :].rstrip("\n")
            self._mapping = [-1] * self._lead + align(body, self._rendered)
        return self._mapping

    def doc_position(self, source_offset: int) -> int | None:
        seg = self.segment
        if seg.kind == "code":
            rel = source_offset - seg.body_start
            if 0 <= rel <= len(seg.body):
                return self.doc_start + rel
            return None
        rel = source_offset - seg.start
        if 0 <= rel < len(self.mapping) and self.mapping[rel] >= 0:
            return self.doc_start + self.mapping[rel]
        return None


class MarkdownView(QTextBrowser):
    """Renders Markdown; height follows the content (no inner scrollbars)."""

    copied = Signal(str)  # a short description of what was copied

    def __init__(self, parent=None) -> None:
        super().__init__(parent)
        self.setObjectName("MarkdownView")
        self.setOpenLinks(False)
        self.anchorClicked.connect(self._on_anchor_clicked)
        self.setVerticalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.setFrameShape(QTextBrowser.Shape.NoFrame)
        self.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Fixed)
        self.setTextInteractionFlags(
            Qt.TextInteractionFlag.TextSelectableByMouse
            | Qt.TextInteractionFlag.TextSelectableByKeyboard
            | Qt.TextInteractionFlag.LinksAccessibleByMouse
        )
        self.document().setDocumentMargin(2)
        self.document().documentLayout().documentSizeChanged.connect(self._fit_height)
        self._source = ""
        self._full = ""
        self._placed: list[_Placed] = []
        self._code_blocks: list[str] = []
        self._highlights: list[tuple[int, int]] = []
        self._flash: tuple[int, int] | None = None
        self._plain = False
        theme().changed.connect(self._rerender)

    # ----- content -------------------------------------------------------------------------

    def source(self) -> str:  # noqa: D401  (QTextBrowser.source() is a QUrl; we shadow it)
        return self._source

    def code_blocks(self) -> list[str]:
        return list(self._code_blocks)

    def set_markdown(self, text: str, plain: bool = False, full: str | None = None) -> None:
        """Render `text` (Markdown unless `plain`); keeps current highlights. `full`: the whole
        message when `text` is only the part shown (what "Copy message" copies)."""
        self._source, self._plain = text, plain
        self._full = text if full is None else full
        self._render()

    def _rerender(self) -> None:
        self._render()

    def _render(self) -> None:
        doc = self.document()
        doc.clear()
        self._placed, self._code_blocks = [], []
        doc.setDefaultFont(self.font())
        cursor = QTextCursor(doc)
        if self._plain:
            cursor.insertText(self._source)
            seg = Segment("code", 0, len(self._source), self._source, 0)
            self._placed.append(_Placed(seg, 0, len(self._source)))
        else:
            for segment in split_markdown(self._source):
                if segment.kind == "code":
                    self._insert_code(cursor, segment)
                else:
                    self._insert_text(cursor, segment)
                cursor.movePosition(QTextCursor.MoveOperation.End)
        self._apply_selections()
        self._fit_height()

    def _insert_text(self, cursor: QTextCursor, segment: Segment) -> None:
        body = segment.body
        lead = len(body) - len(body.lstrip("\n"))
        body = body.strip("\n")
        if not body.strip():
            return
        start = cursor.position()
        cursor.insertFragment(inert_markdown(body))
        end = cursor.position()
        self._style_prose(start, end)
        probe = QTextCursor(self.document())
        probe.setPosition(start)
        probe.setPosition(end, QTextCursor.MoveMode.KeepAnchor)
        self._placed.append(_Placed(segment, start, end, probe.selectedText(), lead))

    def _style_prose(self, start: int, end: int) -> None:
        """Readable defaults: line height, inline-code background, moderate heading sizes."""
        doc = self.document()
        colors = theme().colors
        base = self.font().pointSizeF() if self.font().pointSizeF() > 0 else 10.0
        block = doc.findBlock(start)
        while block.isValid() and block.position() <= end:
            fmt = block.blockFormat()
            level = fmt.headingLevel()
            cursor = QTextCursor(block)
            if not fmt.hasProperty(QTextFormat.Property.BlockCodeFence):
                fmt.setLineHeight(135, QTextBlockFormat.LineHeightTypes.ProportionalHeight.value)
                fmt.setBottomMargin(max(fmt.bottomMargin(), 6))
                cursor.setBlockFormat(fmt)
            if fmt.hasProperty(QTextFormat.Property.BlockQuoteLevel):
                quote = QTextCharFormat()
                quote.setForeground(QColor(colors["muted"]))
                cursor.select(QTextCursor.SelectionType.BlockUnderCursor)
                cursor.mergeCharFormat(quote)
                cursor = QTextCursor(block)
            if level:
                heading = QTextCharFormat()
                heading.setFontPointSize(base * {1: 1.45, 2: 1.28, 3: 1.14}.get(level, 1.05))
                heading.setFontWeight(QFont.Weight.DemiBold)
                cursor.select(QTextCursor.SelectionType.BlockUnderCursor)
                cursor.mergeCharFormat(heading)
            it = block.begin()
            while not it.atEnd():
                fragment = it.fragment()
                if fragment.isValid() and fragment.charFormat().fontFixedPitch():
                    inline = QTextCharFormat()
                    inline.setBackground(QColor(colors["inline_code"]))
                    inline.setFontFamilies([_mono_family()])
                    c = QTextCursor(doc)
                    c.setPosition(fragment.position())
                    c.setPosition(fragment.position() + fragment.length(), c.MoveMode.KeepAnchor)
                    c.mergeCharFormat(inline)
                it += 1
            block = block.next()

    def _insert_code(self, cursor: QTextCursor, segment: Segment) -> None:
        colors = theme().colors
        index = len(self._code_blocks)
        self._code_blocks.append(segment.body)
        frame_format = QTextFrameFormat()
        frame_format.setBackground(QColor(colors["code_bg"]))
        frame_format.setBorder(1)
        frame_format.setBorderBrush(QColor(colors["code_border"]))
        frame_format.setBorderStyle(QTextFrameFormat.BorderStyle.BorderStyle_Solid)
        frame_format.setPadding(10)
        frame_format.setTopMargin(4)
        frame_format.setBottomMargin(8)
        frame_format.setWidth(QTextLength(QTextLength.Type.PercentageLength, 100))
        frame = cursor.insertFrame(frame_format)
        self._insert_code_header(cursor, segment.language, index)
        cursor.setPosition(frame.lastPosition())
        mono = QTextCharFormat()
        mono.setFontFamilies([_mono_family()])
        mono.setFontFixedPitch(True)
        mono.setForeground(QColor(colors["text"]))
        block_format = QTextBlockFormat()
        block_format.setLineHeight(125, QTextBlockFormat.LineHeightTypes.ProportionalHeight.value)
        block_format.setNonBreakableLines(False)
        cursor.setBlockFormat(block_format)
        start = cursor.position()
        cursor.insertText(segment.body, mono)
        self._placed.append(_Placed(segment, start, cursor.position()))

    def _insert_code_header(self, cursor: QTextCursor, language: str, index: int) -> None:
        """A borderless 1x2 table: language on the left, a Copy link on the right."""
        colors = theme().colors
        table_format = QTextTableFormat()
        table_format.setBorder(0)
        table_format.setCellPadding(0)
        table_format.setCellSpacing(0)
        table_format.setBottomMargin(6)
        table_format.setWidth(QTextLength(QTextLength.Type.PercentageLength, 100))
        table = cursor.insertTable(1, 2, table_format)
        label = QTextCharFormat()
        label.setForeground(QColor(colors["muted"]))
        label.setFontPointSize(max(7.0, self.font().pointSizeF() * 0.85))
        table.cellAt(0, 0).firstCursorPosition().insertText(language or "code", label)
        right = table.cellAt(0, 1).firstCursorPosition()
        align_right = QTextBlockFormat()
        align_right.setAlignment(Qt.AlignmentFlag.AlignRight)
        right.setBlockFormat(align_right)
        link = QTextCharFormat(label)
        link.setAnchor(True)
        link.setAnchorHref(f"{COPY_SCHEME}:{index}")
        link.setForeground(QColor(colors["accent"]))
        right.insertText("Copy", link)

    def loadResource(self, kind: int, name: QUrl) -> QByteArray:  # noqa: N802  (Qt override)
        """Never load anything (local files, remote URLs): replies are untrusted."""
        return QByteArray()

    # ----- sizing --------------------------------------------------------------------------

    def _fit_height(self, *_args) -> None:
        doc = self.document()
        width = self.viewport().width()
        if width > 0 and abs(doc.textWidth() - width) > 0.5:
            doc.setTextWidth(width)
        height = math.ceil(doc.size().height()) + 2 * self.frameWidth()
        if height != self.height():
            self.setFixedHeight(max(height, 1))

    def resizeEvent(self, event) -> None:  # noqa: N802  (Qt override)
        super().resizeEvent(event)
        self._fit_height()

    def ideal_width(self) -> int:
        """Width the content needs without wrapping (for shrink-to-fit user bubbles)."""
        probe = self.document().clone()
        probe.setTextWidth(-1)
        return math.ceil(probe.idealWidth()) + 2 * self.frameWidth() + 4

    def sizeHint(self) -> QSize:  # noqa: N802
        return QSize(super().sizeHint().width(), self.height())

    def wheelEvent(self, event) -> None:  # noqa: N802
        event.ignore()  # let the transcript scroll; this view never scrolls itself

    # ----- highlighting --------------------------------------------------------------------

    def highlight_source_ranges(self, ranges: list[tuple[int, int]]) -> None:
        """Highlight source character ranges [start, end) in the rendered text."""
        self._highlights = list(ranges)
        self._apply_selections()

    def flash_source_range(self, start: int, end: int) -> int | None:
        """Mark one source range more strongly; returns its document position (or None)."""
        self._flash = (start, end)
        self._apply_selections()
        return self.doc_position(start)

    def clear_flash(self) -> None:
        self._flash = None
        self._apply_selections()

    def doc_position(self, source_offset: int) -> int | None:
        for placed in self._placed:
            seg = placed.segment
            if seg.start <= source_offset < max(seg.end, seg.start + 1):
                return placed.doc_position(source_offset)
        return None

    def doc_range(self, start: int, end: int) -> tuple[int, int] | None:
        """Document range covering source range [start, end), or None if nothing rendered."""
        positions = [p for p in (self.doc_position(i) for i in range(start, end)) if p is not None]
        return (min(positions), max(positions) + 1) if positions else None

    def _selection(self, doc_range: tuple[int, int], color: QColor) -> QTextEdit.ExtraSelection:
        selection = QTextEdit.ExtraSelection()
        cursor = QTextCursor(self.document())
        cursor.setPosition(doc_range[0])
        cursor.setPosition(doc_range[1], QTextCursor.MoveMode.KeepAnchor)
        selection.cursor = cursor
        fmt = QTextCharFormat()
        fmt.setBackground(color)
        selection.format = fmt
        return selection

    def _apply_selections(self) -> None:
        colors = theme().colors
        soft = QColor(colors["highlight"])
        soft.setAlpha(110)
        strong = QColor(colors["highlight"])
        selections = []
        for start, end in self._highlights:
            found = self.doc_range(start, end)
            if found:
                selections.append(self._selection(found, soft))
        if self._flash is not None:
            found = self.doc_range(*self._flash)
            if found:
                selections.append(self._selection(found, strong))
        self.setExtraSelections(selections)

    def highlighted_text(self) -> list[str]:
        """The rendered text under each active highlight (tests and accessibility)."""
        return [s.cursor.selectedText() for s in self.extraSelections()]

    # ----- copy ----------------------------------------------------------------------------

    def _on_anchor_clicked(self, url: QUrl) -> None:
        if url.scheme() == COPY_SCHEME:
            index = int(url.path() or url.toString().split(":", 1)[1])
            if 0 <= index < len(self._code_blocks):
                QApplication.clipboard().setText(self._code_blocks[index])
                self.copied.emit("Code copied")
            return
        if is_web_link(url) and confirm_open_link(self, url):
            QDesktopServices.openUrl(url)

    def code_block_at(self, doc_position: int) -> int | None:
        for index, placed in enumerate(p for p in self._placed if p.segment.kind == "code"):
            if placed.doc_start <= doc_position <= placed.doc_end:
                return index
        return None

    def contextMenuEvent(self, event) -> None:  # noqa: N802
        menu: QMenu = self.createStandardContextMenu(event.pos())
        position = self.cursorForPosition(event.pos()).position()
        index = self.code_block_at(position) if not self._plain else None
        menu.addSeparator()
        if index is not None:
            action = menu.addAction("Copy code block")
            action.triggered.connect(lambda: self._copy(self._code_blocks[index], "Code copied"))
        action = menu.addAction("Copy message as Markdown")
        action.triggered.connect(lambda: self._copy(self._full, "Message copied"))
        menu.exec(event.globalPos())

    def _copy(self, text: str, what: str) -> None:
        QApplication.clipboard().setText(text)
        self.copied.emit(what)


def _mono_family() -> str:
    return QFontDatabase.systemFont(QFontDatabase.SystemFont.FixedFont).family()
