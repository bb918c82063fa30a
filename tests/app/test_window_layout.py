"""Window layout at common screen sizes: the inspector dock keeps a usable width and so does the
chat. Each size is also grabbed to a PNG (in the test's temporary folder) to look at."""

from __future__ import annotations

import pytest
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QApplication

from a2ats_engine.data_dirs import demo_codebook_path
from a2ats_engine.loading.models import demo_model_path
from app.inspector.widgets import ThemedPlot
from app.inspector_dock import DOCK_SHARE

from .fakes import FakeBackend
from .helpers import cut_labels, load, reply

USABLE_DOCK = 360  # the inspector panels' own minimum width (InspectorPanel)
USABLE_CHAT = 340

CODE_REPLY = "Here:\n\n```python\n" + "value = compute(x) + 1  # note\n" * 8 + "```\n\nDone."


def _settle() -> None:
    for _ in range(5):
        QApplication.processEvents()


def _chat_column(window):
    return window.chat_view.parentWidget()


@pytest.mark.parametrize("size", [(1024, 768), (1440, 900), (1920, 1080)], ids=str)
def test_the_dock_and_the_chat_stay_usable(make_window, qtbot, tmp_path, size):
    window = make_window(FakeBackend(reply_fn=lambda _m: CODE_REPLY), inspector=True)
    load(qtbot, window)
    reply(qtbot, window, "Show me some code, with a title as long as titles get " * 2)
    window.resize(*size)
    _settle()
    shot = tmp_path / f"layout-{size[0]}x{size[1]}.png"
    assert window.grab().save(str(shot))
    assert window.size().toTuple() == size
    assert window.dock.isVisible() and window.dock.width() >= USABLE_DOCK
    scroll = window.dock.widget()
    assert scroll.viewport().width() >= window.inspector.minimumWidth()  # no panel cut off
    assert _chat_column(window).width() >= USABLE_CHAT


def test_the_dock_cannot_be_squeezed_to_a_strip(make_window, qtbot):
    window = make_window(FakeBackend(), inspector=True)
    window.resize(1024, 768)
    _settle()
    window.resizeDocks([window.dock], [70], Qt.Orientation.Horizontal)  # a user's drag, say
    _settle()
    assert window.dock.width() >= USABLE_DOCK
    assert window.dock.widget().minimumWidth() >= USABLE_DOCK
    assert _chat_column(window).width() >= USABLE_CHAT


SIZES = [(1024, 768), (1440, 900), (1920, 1080)]
# Read before any fixture points the data dir at a temporary folder.
REAL_DEMO = demo_model_path()
REAL_CODEBOOK = demo_codebook_path()
LONG_TITLE = "Compare these two long configuration files and tell me which settings differ " * 2


def _readable_width(plot) -> float:
    """A plot's left axis as drawn plus its whole bottom title: narrower, the title is cut."""
    item = plot.plotItem
    title = item.getAxis("bottom").label
    return item.getAxis("left").width() + (title.boundingRect().width() if title.isVisible() else 0)


def _check_size(window, size, shot) -> None:
    window.resize(*size)
    _settle()
    assert window.grab().save(str(shot))
    assert window.size().toTuple() == size  # nothing asks for more width than the screen has
    assert not cut_labels(window), cut_labels(window)
    # the inspector's panels fit its scroll area, which never scrolls sideways
    viewport = window.dock.widget().viewport()
    assert window.inspector.width() <= viewport.width(), window.inspector.columns
    # and every plot keeps its tick labels and its whole axis title (ThemedPlot's least width)
    squeezed = [
        (plot.plotItem.getAxis("bottom").labelText, plot.width(), _readable_width(plot))
        for plot in window.inspector.findChildren(ThemedPlot)
        if plot.isVisible() and plot.width() < _readable_width(plot)
    ]
    assert not squeezed, (size, window.inspector.columns, squeezed)


@pytest.mark.parametrize("size", SIZES, ids=str)
def test_no_label_is_cut_at_common_sizes(make_window, qtbot, tmp_path, size):
    window = make_window(FakeBackend(reply_fn=lambda _m: CODE_REPLY), inspector=True)
    load(qtbot, window)
    reply(qtbot, window, LONG_TITLE)
    window.status.set_attention("exact until 4,096 tokens")
    window.status.set_cache(48_000_000, 1_100_000, True, 35_000_000)
    window.statusBar().showMessage(
        "Codebook demo-default.safetensors loaded (512 centroids); it applies to the next message"
    )
    _check_size(window, size, tmp_path / f"labels-{size[0]}x{size[1]}.png")
    # An elided label still tells the whole text, in its tooltip.
    title = window.header.chat_title
    if title.is_elided():
        assert title.text().strip() in title.toolTip()


def test_the_inspector_takes_a_share_of_a_wide_window_and_uses_two_columns(make_window, qtbot):
    window = make_window(FakeBackend(), inspector=True)
    window.resize(1920, 1080)
    _settle()
    # its default share, not one latched while the panels settled at the first size
    assert abs(window.dock.width() - DOCK_SHARE * 1920) <= 12, window.dock.width()
    assert window.inspector.columns == 2
    window.resize(1024, 768)
    _settle()
    assert window.inspector.columns == 1 and window.dock.width() >= USABLE_DOCK
    assert _chat_column(window).width() >= USABLE_CHAT


@pytest.mark.demo
def test_the_real_app_fits_every_size(make_window, qtbot, tmp_path, app_dirs):
    """The demo model through the real engine: its name, plan, crossover and byte counts in
    the status bar and the inspector's real panels, at each size (screenshots in tmp_path)."""
    from demo_gate import require_demo

    if REAL_DEMO is None:
        require_demo()  # skips, or fails under A2ATS_REQUIRE_DEMO=1
    data = app_dirs["data"]
    data.mkdir(parents=True, exist_ok=True)
    (data / "models").symlink_to(REAL_DEMO.parent)
    if REAL_CODEBOOK.exists():
        (data / "codebooks").symlink_to(REAL_CODEBOOK.parent)
    window = make_window(None, inspector=True)
    load(qtbot, window, "demo", timeout=120000)
    window.controller.settings.sampling = window.controller.settings.sampling.__class__(
        max_tokens=12, temperature=0
    )
    reply(qtbot, window, "What is the capital of France? Answer in two sentences.", 120000)
    for size in SIZES:
        _check_size(window, size, tmp_path / f"demo-{size[0]}x{size[1]}.png")


def test_a_label_narrower_than_its_text_is_reported(qtbot):
    from PySide6.QtWidgets import QLabel, QVBoxLayout, QWidget

    from app.elided_label import ElidedLabel

    root = QWidget()
    qtbot.addWidget(root)
    layout = QVBoxLayout(root)
    plain, elided = QLabel("a rather long status message"), ElidedLabel("a rather long title")
    for label in (plain, elided):
        label.setFixedWidth(60)
        layout.addWidget(label)
    root.show()
    _settle()
    (report,) = cut_labels(root)
    assert "a rather long status message" in report  # the elided one fits: "a rat…"
    assert elided.is_elided() and "a rather long title" in elided.toolTip()
