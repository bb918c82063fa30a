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
