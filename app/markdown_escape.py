"""Markdown that a viewer renders inert: model output and provenance go into exported `.md`
files, and a Markdown viewer (an editor preview, a code host) renders raw HTML, loads images
and follows links. What this module emits keeps the text's Markdown (emphasis, lists, headings,
code, web links) but nothing that loads or runs:

- raw HTML and `<...>` autolinks: every `<` outside code becomes `&lt;` (so model text
  `</details>` cannot close the export's provenance wrapper either);
- images: `![` becomes `!\\[` (shown as text, never fetched);
- links and reference definitions whose target is not an absolute http(s) address
  (`javascript:`, `file:`, relative paths) lose their link syntax (`]\\(`, `\\[`);
- terminal escapes (ANSI CSI / OSC sequences) are removed, other control characters become
  U+FFFD;
- a code fence left open is closed at the end of the text, so it cannot swallow what follows.

Code (fenced blocks and inline code spans) is left as written: viewers show it literally.
"""

from __future__ import annotations

import re

_ANSI = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)?|\x1b[@-_]?")
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")
_FENCE = re.compile(r" {0,3}(`{3,}|~{3,})")
_BACKTICKS = re.compile(r"`+")
_LINK_OPEN = re.compile(r"\]\(\s*<?")
_REFERENCE = re.compile(r"^( {0,3})\[([^\]\n]*)\]:[ \t]*<?([^\s>]*)", re.MULTILINE)
_WEB = re.compile(r"https?://", re.IGNORECASE)
_PLAIN_SPECIAL = re.compile(r"([\\`*_\[\]<>&#|~])")  # ( ) need no escape once [ ] have one


def strip_controls(text: str) -> str:
    """`text` without terminal escape sequences; other control characters (tab and newline
    aside) become U+FFFD; carriage returns are dropped."""
    text = _ANSI.sub("", text).replace("\r", "")
    return _CONTROL.sub("\ufffd", text)


def escape_plain(text: str) -> str:
    """Plain text (a title, a model name) as Markdown that shows exactly that text, on one line."""
    one_line = " ".join(strip_controls(text).split())
    return _PLAIN_SPECIAL.sub(r"\\\1", one_line)


def inert_markdown(text: str) -> str:
    """Model output (Markdown) for an exported file: see the module docstring."""
    out: list[str] = []
    prose: list[str] = []
    fence: str | None = None
    for line in strip_controls(text).split("\n"):
        opener = _FENCE.match(line)
        opens = opener is not None and (
            opener.group(1)[0] == "~" or "`" not in line[opener.end() :]
        )  # a backtick fence's info string holds no backtick
        if fence is None and opens:
            if prose:
                out.append(_inert_prose("\n".join(prose)))
            prose = []
            fence = opener.group(1)
            out.append(line)
        elif fence is not None:
            out.append(line)
            closing = _FENCE.match(line)
            if (
                closing is not None
                and closing.group(1)[0] == fence[0]
                and len(closing.group(1)) >= len(fence)
                and not line[closing.end() :].strip()
            ):
                fence = None
        else:
            prose.append(line)
    if prose:
        out.append(_inert_prose("\n".join(prose)))
    if fence is not None:
        out.append(fence)  # close what the text left open
    return "\n".join(out)


def _inert_prose(text: str) -> str:
    """Text outside code fences: escape everything outside inline code spans."""
    pieces: list[str] = []
    position = 0
    search = 0
    while True:
        opening = _BACKTICKS.search(text, search)
        if opening is None:
            break
        ticks = opening.group()
        closing = _find_run(text, ticks, opening.end())
        if closing is None:  # an unmatched run is literal backticks
            search = opening.end()
            continue
        pieces.append(_inert_text(text[position : opening.start()]))
        pieces.append(text[opening.start() : closing + len(ticks)])
        position = search = closing + len(ticks)
    pieces.append(_inert_text(text[position:]))
    return "".join(pieces)


def _find_run(text: str, ticks: str, start: int) -> int | None:
    """Start of the next backtick run of exactly `ticks`' length at or after `start`."""
    for run in _BACKTICKS.finditer(text, start):
        if len(run.group()) == len(ticks):
            return run.start()
    return None


def _inert_text(text: str) -> str:
    text = text.replace("<", "&lt;").replace("![", "!\\[")
    text = _REFERENCE.sub(_reference, text)
    return _LINK_OPEN.sub(_link, text)


def _link(match: re.Match) -> str:
    target = match.string[match.end() : match.end() + 8]
    return match.group() if _WEB.match(target) else "]\\" + match.group()[1:]


def _reference(match: re.Match) -> str:
    indent, label, target = match.groups()
    whole = match.group()
    if _WEB.match(target):
        return whole
    return f"{indent}\\[{label}]" + whole[len(indent) + len(label) + 2 :]
