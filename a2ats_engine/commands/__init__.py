"""Subcommands of `a2ats`. Each module defines `register(subparsers)` and sets `func` defaults."""
