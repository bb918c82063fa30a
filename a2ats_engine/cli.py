"""The `a2ats` command. Subcommands live in `a2ats_engine/commands/*.py`, each with `register()`.

Bad input (an `A2ATSError` or `ValueError` from the engine) prints one line and exits 1
(control characters quoted in it shown as escapes, `terminal.printable`); `--debug` shows the
traceback instead. Warnings print as one `note: ...` line each (no file path); `--debug` shows
them as Python prints them.

`register()` must not import MLX, mlx-lm or transformers (import them in the command's run
function): `a2ats --help` and `a2ats COMMAND --help` then answer at once
(`tests/engine/test_cli_basics.py` checks).
"""

from __future__ import annotations

import argparse
import importlib
import pkgutil
import sys
import warnings

from . import __version__, commands
from .errors import A2ATSError
from .terminal import printable


class DefaultsHelpFormatter(argparse.HelpFormatter):
    """Help that shows every option's default (unless its text already says it, or the default
    is None / a flag's False)."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        default = action.default
        if (
            "default" in text.lower()
            or default is None
            or default is False
            or default is argparse.SUPPRESS
            or not action.option_strings
        ):
            return text
        return f"{text} (default: %(default)s)" if text else "default: %(default)s"


class Parser(argparse.ArgumentParser):
    """ArgumentParser whose help shows defaults; sub-commands' parsers are of this class too."""

    def __init__(self, *args, **kwargs) -> None:
        kwargs.setdefault("formatter_class", DefaultsHelpFormatter)
        super().__init__(*args, **kwargs)


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="a2ats",
        description="A2ATS Chat engine: chat, models, codebooks, evaluation and benchmarks.",
    )
    parser.add_argument("--version", action="version", version=f"a2ats {__version__}")
    parser.add_argument(
        "--debug", action="store_true", help="show tracebacks on errors, warnings in full"
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for info in sorted(pkgutil.iter_modules(commands.__path__), key=lambda m: m.name):
        module = importlib.import_module(f"{commands.__name__}.{info.name}")
        register = getattr(module, "register", None)
        if register is not None:
            register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    # the command line as given, for what a run records of itself ("command" in a JSON result)
    args.argv = list(sys.argv[1:] if argv is None else argv)
    shown = warnings.showwarning
    if not args.debug:
        warnings.showwarning = show_note
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except (A2ATSError, ValueError, FileNotFoundError, OSError) as exc:
        if args.debug:
            raise
        text = printable(str(exc), newlines=False)
        print(f"a2ats {args.command}: error: {text}", file=sys.stderr)
        return 1
    finally:
        warnings.showwarning = shown


def show_note(message, category, filename, lineno, file=None, line=None) -> None:
    """`warnings.showwarning` for the command line: `note: <message>` on one line."""
    text = " ".join(str(message).split())
    print(f"note: {text}", file=file if file is not None else sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
