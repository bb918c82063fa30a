"""The `a2ats` command. Subcommands live in `a2ats_engine/commands/*.py`, each with `register()`.

Bad input (an `A2ATSError` or `ValueError` from the engine) prints one line and exits 1
(control characters quoted in it shown as escapes, `terminal.printable`); `--debug` shows the
traceback instead.
"""

from __future__ import annotations

import argparse
import importlib
import pkgutil
import sys

from . import commands
from .errors import A2ATSError
from .terminal import printable


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="a2ats",
        description="A2ATS Chat engine: chat, models, codebooks, evaluation and benchmarks.",
    )
    parser.add_argument("--debug", action="store_true", help="show tracebacks on errors")
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


if __name__ == "__main__":
    sys.exit(main())
