"""Fixtures for the desktop-app tests: temp config/data dirs, controllers and windows on a fake
or real engine."""

from __future__ import annotations

import gc

import pytest
from PySide6.QtCore import QEvent
from PySide6.QtWidgets import QApplication, QMessageBox

from app.controller import ChatController
from app.conversations import HistoryStore
from app.settings import AppSettings, load_settings
from app.theme import theme
from app.worker import EngineThread
from tests.two_ranks import two_ranks  # noqa: F401  (the two-rank fixture)

from .helpers import Spy


@pytest.fixture(autouse=True)
def _restore_application_look():
    """Tests that apply the app's theme leave no stylesheet/palette behind for other tests."""
    yield
    app = QApplication.instance()
    if app is not None and app.styleSheet():
        app.setStyleSheet("")
        app.setPalette(app.style().standardPalette())


@pytest.fixture(autouse=True)
def _collect_on_the_main_thread():
    """After each test (its windows closed, their engine threads stopped, pytest-qt done with
    its widgets): delete what was deferred and collect the garbage here, on the main thread.

    Left to the cyclic GC, a closed window's QObjects may be freed later in whatever thread
    allocates then, such as the next test's engine thread; shiboken then destroys them there
    while the main thread destroys other Qt objects, and the two can deadlock (Qt's
    signal-slot mutexes against the GIL: the whole suite once hung 15 minutes on it)."""
    yield
    QApplication.sendPostedEvents(None, QEvent.Type.DeferredDelete)
    gc.collect()


@pytest.fixture(autouse=True)
def _own_config_dir(tmp_path_factory, monkeypatch):
    """Every app test saves its settings into a folder of its own, never the user's real
    settings.json (a controller saves on every settings change; `app_dirs` below also moves the
    data and cache dirs)."""
    monkeypatch.setenv("A2ATS_CONFIG_DIR", str(tmp_path_factory.mktemp("config")))


@pytest.fixture
def app_dirs(tmp_path, monkeypatch):
    """Point the app's config/data/cache dirs at a temporary folder."""
    dirs = {name: tmp_path / name for name in ("config", "data", "cache")}
    monkeypatch.setenv("A2ATS_CONFIG_DIR", str(dirs["config"]))
    monkeypatch.setenv("A2ATS_DATA_DIR", str(dirs["data"]))
    monkeypatch.setenv("A2ATS_CACHE_DIR", str(dirs["cache"]))
    return dirs


@pytest.fixture(autouse=True)
def no_blocking_message_box(monkeypatch):
    """A message box a test did not arrange for fails it at once instead of blocking it until
    its timeout (offscreen, nobody closes a modal box). Tests that expect boxes use
    `message_boxes` (or patch QMessageBox themselves), which replaces this guard."""

    def refuse(*args, **_kwargs):
        box = args[0] if args and isinstance(args[0], QMessageBox) else None
        said = (box.windowTitle(), box.text()) if box is not None else args[1:3]
        raise AssertionError(f"a message box would block this test: {said!r}")

    monkeypatch.setattr(QMessageBox, "exec", refuse)
    for kind in ("warning", "information", "question", "critical"):
        monkeypatch.setattr(QMessageBox, kind, staticmethod(refuse))


@pytest.fixture
def message_boxes(monkeypatch):
    """Record QMessageBox dialogs instead of showing them: list of (title, text)."""
    shown: list[tuple[str, str]] = []

    def fake_exec(box):
        shown.append((box.windowTitle(), box.text()))
        return QMessageBox.StandardButton.Ok

    def fake_static(kind):
        def show(parent, title, text, *args, **kwargs):
            shown.append((title, text))
            return (
                QMessageBox.StandardButton.Yes
                if kind == "question"
                else QMessageBox.StandardButton.Ok
            )

        return show

    monkeypatch.setattr(QMessageBox, "exec", fake_exec)
    for kind in ("warning", "information", "question", "critical"):
        monkeypatch.setattr(QMessageBox, kind, staticmethod(fake_static(kind)))
    return shown


@pytest.fixture(scope="session")
def tiny_folder(tmp_path_factory):
    """An mlx-lm folder of the tiny random Llama model (tests/tiny.py)."""
    from tiny import save_tiny_model

    # head_dim 32: the smallest MLX quantization group, so the default 8-bit K/V storage works
    return save_tiny_model(tmp_path_factory.mktemp("tiny") / "tiny-llama", hidden_size=128)


@pytest.fixture
def make_window(qtbot, app_dirs):
    """Factory: a MainWindow on an EngineThread over `backend` (default: the real engine),
    with settings and history in the temp dirs. Windows are closed (thread stopped) at the end."""
    from app.main_window import MainWindow

    windows = []

    def make(backend=None, settings: AppSettings | None = None, scripted: bool = False, **kwargs):
        theme().apply("light")
        if settings is None:
            settings, message = load_settings()
            kwargs.setdefault("settings_message", message)
        settings.inspector_visible = kwargs.pop("inspector", settings.inspector_visible)
        engine = EngineThread(backend, ranks_backend=kwargs.pop("ranks_backend", None))
        window = MainWindow(
            settings, engine=engine, store=HistoryStore(), scripted=scripted, **kwargs
        )
        qtbot.addWidget(window)
        window.resize(1200, 800)
        window.show()
        windows.append(window)
        return window

    yield make
    for window in windows:
        window.controller.engine.worker.stop()
        window.close()


@pytest.fixture
def make_controller(qtbot, app_dirs):
    """Factory: a ChatController without widgets on an EngineThread over `backend` (default: the
    real engine), its history loaded from the temp dirs, its signals recorded in `controller.spy`
    (helpers.Spy). Engine threads are shut down at the end."""
    made: list[ChatController] = []

    def make(backend=None, settings: AppSettings | None = None) -> ChatController:
        controller = ChatController(
            settings or AppSettings(), engine=EngineThread(backend), store=HistoryStore()
        )
        controller.spy = Spy(controller)
        controller.load_history()
        made.append(controller)
        return controller

    yield make
    for controller in made:
        controller.engine.shutdown()
