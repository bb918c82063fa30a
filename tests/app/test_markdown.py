"""Markdown split/alignment and the MarkdownView (code blocks, copy, highlight mapping)."""

from __future__ import annotations

import pytest
from PySide6.QtWidgets import QApplication

from app.chat.markdown_segments import align, split_markdown
from app.chat.markdown_view import MarkdownView
from app.theme import theme

SOURCE = """Intro with **bold** and `code`.

```python
def f(x):
    return x + 1
```

After the *block*: [a link](http://example.com) here.
"""


def test_split_finds_fenced_code():
    segments = split_markdown(SOURCE)
    assert [s.kind for s in segments] == ["text", "code", "text"]
    code = segments[1]
    assert code.language == "python" and code.closed
    assert code.body == "def f(x):\n    return x + 1"
    assert SOURCE[code.body_start : code.body_start + len(code.body)] == code.body
    assert "".join(SOURCE[s.start : s.end] for s in segments) == SOURCE


def test_unclosed_fence_runs_to_the_end():
    segments = split_markdown("text\n```js\nlet a = 1;\nlet b")
    assert segments[-1].kind == "code" and not segments[-1].closed
    assert segments[-1].body == "let a = 1;\nlet b"


def test_align_skips_markup():
    source = "Some **bold** and [link](http://x.y) text"
    rendered = "Some bold and link text"
    mapping = align(source, rendered)
    for word in ("bold", "link", "text"):
        i = source.index(word)
        assert rendered[mapping[i] : mapping[i] + len(word)] == word
    assert mapping[source.index("*")] == -1


@pytest.fixture
def view(qtbot):
    theme().apply("light")
    widget = MarkdownView()
    qtbot.addWidget(widget)
    widget.resize(500, 100)
    widget.show()
    widget.set_markdown(SOURCE)
    return widget


def test_renders_code_block_and_copies_it(view):
    assert view.code_blocks() == ["def f(x):\n    return x + 1"]
    assert "def f(x):" in view.toPlainText() and "**" not in view.toPlainText()
    copied = []
    view.copied.connect(copied.append)
    from PySide6.QtCore import QUrl

    view.anchorClicked.emit(QUrl("copy-code:0"))
    assert QApplication.clipboard().text() == "def f(x):\n    return x + 1"
    assert copied == ["Code copied"]


def test_height_follows_content(view, qtbot):
    short = view.height()
    view.set_markdown(SOURCE + "\n\n" + "More text. " * 200)
    assert view.height() > short + 40


@pytest.mark.parametrize("word", ["bold", "code", "return x + 1", "block", "link", "Intro"])
def test_highlight_source_range_covers_the_rendered_word(view, word):
    start = SOURCE.index(word)
    view.highlight_source_ranges([(start, start + len(word))])
    assert view.highlighted_text() == [word]


# ----- untrusted replies stay inert ----------------------------------------------------------


def _fragments(view):
    """(text, char format) of every fragment in the view's document."""
    out = []
    block = view.document().begin()
    while block.isValid():
        it = block.begin()
        while not it.atEnd():
            fragment = it.fragment()
            if fragment.isValid():
                out.append((fragment.text(), fragment.charFormat()))
            it += 1
        block = block.next()
    return out


def test_raw_html_is_shown_as_text_not_a_link(view):
    view.set_markdown('Click <a href="smb://evil/share">here</a> or <b>there</b>.')
    assert '<a href="smb://evil/share">here</a>' in view.toPlainText()
    assert "<b>there</b>" in view.toPlainText()
    assert not any(fmt.isAnchor() for _, fmt in _fragments(view))


def test_images_are_never_loaded_and_show_their_alt_text(view, tmp_path):
    from PySide6.QtCore import QUrl
    from PySide6.QtGui import QImage, QTextDocument

    picture = tmp_path / "secret.png"
    image = QImage(4, 4, QImage.Format.Format_RGB32)
    image.fill(0xFF0000)
    assert image.save(str(picture))
    url = QUrl.fromLocalFile(str(picture))
    view.set_markdown(f"Look: ![the alt]({url.toString()}) and ![]({url.toString()}).")
    view.grab()  # lay out and paint: nothing may fetch the file
    assert not any(fmt.isImageFormat() for _, fmt in _fragments(view))
    assert "Look: the alt and ." in view.toPlainText()  # Qt drops an image without alt text
    assert view.loadResource(int(QTextDocument.ResourceType.ImageResource), url).isEmpty()


@pytest.mark.parametrize(
    "markdown",
    [
        "[share](smb://host/share)",
        "<smb://host/share>",
        "[run](javascript:alert(1))",
        "[file](file:///etc/passwd)",
        "[rel](some/relative/path)",
    ],
)
def test_links_other_than_http_are_plain_text(view, markdown):
    view.set_markdown(f"See {markdown} now")
    assert not any(fmt.isAnchor() for _, fmt in _fragments(view))
    assert view.toPlainText().startswith("See ")


def test_web_link_opens_only_after_confirming_the_real_address(view, monkeypatch):
    from PySide6.QtCore import QUrl
    from PySide6.QtWidgets import QMessageBox

    from app.chat import markdown_view

    view.set_markdown("[https://bank.example](https://evil.example/login)")
    anchors = [(text, fmt) for text, fmt in _fragments(view) if fmt.isAnchor()]
    assert [fmt.anchorHref() for _, fmt in anchors] == ["https://evil.example/login"]
    assert anchors[0][1].toolTip() == "https://evil.example/login"
    opened, asked = [], []
    monkeypatch.setattr(markdown_view.QDesktopServices, "openUrl", opened.append)

    def answer(choice):
        def exec_(box):
            asked.append((box.text(), box.textFormat()))
            return choice

        return exec_

    monkeypatch.setattr(QMessageBox, "exec", answer(QMessageBox.StandardButton.Cancel))
    view.anchorClicked.emit(QUrl("https://evil.example/login"))
    assert opened == [] and "https://evil.example/login" in asked[0][0]
    assert asked[0][1] == markdown_view.Qt.TextFormat.PlainText
    monkeypatch.setattr(QMessageBox, "exec", answer(QMessageBox.StandardButton.Open))
    view.anchorClicked.emit(QUrl("https://evil.example/login"))
    assert opened == [QUrl("https://evil.example/login")]
    view.anchorClicked.emit(QUrl("smb://host/share"))  # never opened, never asked
    assert len(opened) == 1 and len(asked) == 2


def test_highlights_map_through_html_shown_as_text(view):
    source = "Before <!-- note --> after <span>x</span> end"
    view.set_markdown(source)
    for word in ("note", "after", "span", "end"):
        start = source.index(word)
        view.highlight_source_ranges([(start, start + len(word))])
        assert view.highlighted_text() == [word]


def test_the_confirmation_reveals_a_look_alike_host():
    from PySide6.QtCore import QUrl

    from app.chat.markdown_view import link_address_text

    assert link_address_text(QUrl("https://example.com/a")) == "https://example.com/a"
    text = link_address_text(QUrl("https://p\u0430ypal.com/login"))  # Cyrillic "а"
    assert "xn--" in text and "p\u0430ypal.com" in text
