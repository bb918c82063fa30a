"""Text for a terminal: untrusted strings (GGUF names, model output, file contents quoted in
errors) keep their printable characters; control characters are shown as escapes.

A terminal obeys escape sequences (ESC ] 0; sets the window title, ESC [2J clears the screen),
backspaces and carriage returns (which overwrite what was printed), so a crafted model name or
model output could rewrite or hide what the user sees. `printable` replaces every C0 / C1
control character except newline and tab, DEL, the line / paragraph separators and the bidi
overrides with its Python escape (`\\x1b`, `\\u202e`). MLX-free.
"""

from __future__ import annotations

import re
from typing import TextIO

_BIDI = "\u202a-\u202e\u2066-\u2069"
_CONTROLS = re.compile(f"[\x00-\x08\x0b-\x1f\x7f-\x9f\u2028\u2029{_BIDI}]")
_CONTROLS_AND_NEWLINES = re.compile(f"[\x00-\x1f\x7f-\x9f\u2028\u2029{_BIDI}]")


def _escape(match: re.Match) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escape_named(match: re.Match) -> str:
    return _NAMED.get(match.group()) or _escape(match)


def printable(text: str, *, newlines: bool = True) -> str:
    """`text` with control characters replaced by visible escapes (`\\x1b`, `\\r`). Newlines
    and tabs are kept unless `newlines` is False (one-line messages: they become `\\n`)."""
    if newlines:
        return _CONTROLS.sub(lambda m: "\\r" if m.group() == "\r" else _escape(m), text)
    return _CONTROLS_AND_NEWLINES.sub(_escape_named, text)


def for_stream(text: str, stream: TextIO) -> str:
    """`printable(text)` when `stream` is a terminal; `text` unchanged otherwise (a pipe or a
    file gets the model's text as it is)."""
    try:
        tty = stream.isatty()
    except (AttributeError, ValueError):
        tty = False
    return printable(text) if tty else text
