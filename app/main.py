"""Entry point of `a2ats-chat`: the desktop app, and a scripted mode for checks and demos.

    a2ats-chat [--model SOURCE] [--hosts FILE]
    a2ats-chat --model SOURCE [--hosts FILE] [--codebook FILE] --prompt TEXT --screenshot PNG
               [--quit] [--keep-chat]
    a2ats-chat --self-test [--model SOURCE] [--tokens N]        (selftest.py)

Scripted mode loads the model (and codebook), sends the prompt in a new chat, waits for the
whole reply, saves a screenshot of the window and, with --quit, exits 0. Any failure prints
one line to stderr and exits 1. Works with QT_QPA_PLATFORM=offscreen. The chat is temporary:
a scripted run writes no chat and no settings unless --keep-chat asks it to.
"""

from __future__ import annotations

import argparse
import sys

import a2ats_engine  # noqa: F401  (BLAS preload before mlx.core)

SELF_TEST_HELP = (
    "check this installation headless (Qt, MLX, a reply through A2ATS caches from a tiny model "
    "and from --model, default the demo when fetched, 'tiny' for none), then exit"
)
KEEP_CHAT_HELP = (
    "scripted mode: keep the chat in the history and save the settings (default: a temporary "
    "chat; the run writes no chat and no settings)"
)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="a2ats-chat", description=__doc__.splitlines()[0])
    parser.add_argument("--model", help='model folder, .gguf file, HF repo id or "demo"')
    parser.add_argument("--self-test", action="store_true", help=SELF_TEST_HELP)
    parser.add_argument("--tokens", type=int, default=12, help="self-test: tokens per model")
    parser.add_argument(
        "--hosts",
        metavar="FILE",
        help="run the model split over the hosts of this mlx.launch hosts file (the model "
        "menu's 'Run on'; scripted mode runs on this computer without it)",
    )
    parser.add_argument("--codebook", help="codebook file (.safetensors) to load")
    parser.add_argument("--prompt", help="scripted mode: message to send")
    parser.add_argument("--screenshot", help="scripted mode: PNG of the window after the reply")
    parser.add_argument("--export-telemetry", help="scripted mode: inspector telemetry JSON")
    parser.add_argument("--quit", action="store_true", help="scripted mode: exit when done")
    parser.add_argument("--keep-chat", action="store_true", help=KEEP_CHAT_HELP)
    parser.add_argument("--timeout", type=float, default=900.0, help="scripted mode: seconds")
    parser.add_argument("--theme", choices=("system", "light", "dark"), help="override the theme")
    parser.add_argument("--width", type=int, default=0, help="window width (scripted mode)")
    parser.add_argument("--height", type=int, default=0, help="window height (scripted mode)")
    args = parser.parse_args(argv)
    if args.tokens < 1:
        parser.error(f"--tokens={args.tokens} must be >= 1")
    if args.self_test:
        return args
    if args.codebook and not args.model:
        parser.error("--codebook needs --model")
    if (args.prompt or args.screenshot or args.export_telemetry) and not args.model:
        parser.error("scripted mode needs --model")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    if args.self_test:
        from .selftest import run as self_test

        return self_test(args.model or "demo", args.tokens)
    import warnings

    from .backend import show_note

    warnings.showwarning = show_note  # engine warnings on stderr: one `note:` line each
    missing = _missing_window_libraries()
    if missing:
        print(f"a2ats-chat: {missing}", file=sys.stderr)
        return 1
    from PySide6.QtCore import QTimer
    from PySide6.QtWidgets import QApplication

    from a2ats_engine import sweep_stale

    from .main_window import MainWindow
    from .scripted import ScriptedRun
    from .settings import load_settings
    from .theme import app_icon, theme

    app = QApplication.instance() or QApplication(["a2ats-chat"])
    app.setApplicationName("A2ATS Chat")
    app.setOrganizationName("a2ats-chat")
    app.setWindowIcon(app_icon())
    settings, message = load_settings()
    sweep_stale()  # cold-tier files a crashed instance left behind (live instances keep theirs)
    theme().apply(args.theme or settings.theme)
    scripted = bool(args.prompt or args.screenshot or args.export_telemetry)
    try:
        window = MainWindow(settings, settings_message=message, scripted=scripted)
        window.controller.ephemeral = scripted and not args.keep_chat
    except Exception as exc:  # noqa: BLE001  (one line, never a traceback; the thread has ended)
        print(f"a2ats-chat: could not start: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    if args.width and args.height:
        window.dock.use_default_share()
        window.resize(args.width, args.height)
    window.show()
    if scripted:
        run = ScriptedRun(window, args)
        QTimer.singleShot(0, run.start)
        app.exec()
        return exit_now_if_stuck(run.exit_code)
    _close_on_sigint(window)
    if args.model:
        window.controller.change_settings(model_source=args.model, save=False)
    if args.hosts:
        window.controller.change_settings(hosts_file=args.hosts, run_on_hosts=True, save=False)
    # offers to fetch the demo model when it is missing
    QTimer.singleShot(0, window.controller.start)
    return exit_now_if_stuck(app.exec())


def _missing_window_libraries() -> str | None:
    """A one-line note when Qt would open the window through xcb and its libraries are
    missing (Qt itself would abort with a message that names none of them)."""
    from .platform_libs import missing_xcb_libraries, missing_xcb_note, will_use_xcb

    missing = missing_xcb_libraries() if will_use_xcb() else []
    return missing_xcb_note(missing) if missing else None


def exit_now_if_stuck(code: int) -> int:
    """Return `code`; but when an engine thread did not stop in time (a model call that does
    not return), end the process here: letting Python destroy a running QThread would abort
    it ("QThread: Destroyed while thread is still running")."""
    import os

    from .worker import EngineThread

    if EngineThread.stuck:
        print("a2ats-chat: the engine did not stop in time; exiting anyway", file=sys.stderr)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    return code


def _close_on_sigint(window) -> None:
    """Ctrl+C in the terminal closes the window (saving settings, stopping the engine thread).
    Qt's event loop does not run Python signal handlers, so a timer wakes the interpreter."""
    import signal

    from PySide6.QtCore import QTimer

    signal.signal(signal.SIGINT, lambda *_: window.close())
    timer = QTimer(window)
    timer.timeout.connect(lambda: None)
    timer.start(250)


if __name__ == "__main__":
    sys.exit(main())
