"""Split chat Markdown into prose and fenced code blocks, and align source text with rendered
text (so a character range of a message's Markdown source maps to a range in its rendering).

Pure Python; no Qt. Used by `MarkdownView` and tested on its own.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_FENCE = re.compile(r"^( {0,3})(`{3,}|~{3,})[ \t]*([^\n`]*)$")


@dataclass(frozen=True)
class Segment:
    """A piece of the source: `kind` "text" (Markdown prose) or "code" (fenced block).

    start/end:   the whole segment's range in the source (fences included for code).
    body_start:  for code, where the code text starts in the source (after the opening fence
                 line); `body` is the code text itself (closing fence excluded).
    """

    kind: str
    start: int
    end: int
    body: str
    body_start: int
    language: str = ""
    closed: bool = True


def split_markdown(source: str) -> list[Segment]:
    """Prose and fenced code segments covering `source` in order. An unclosed fence (a reply
    still streaming) runs to the end of the text."""
    segments: list[Segment] = []
    lines = source.splitlines(keepends=True)
    pos = 0
    text_start = 0
    i = 0
    while i < len(lines):
        match = _FENCE.match(lines[i].rstrip("\r\n"))
        if not match:
            pos += len(lines[i])
            i += 1
            continue
        if pos > text_start:
            segments.append(Segment("text", text_start, pos, source[text_start:pos], text_start))
        fence, language = match.group(2), match.group(3).strip().split(" ")[0]
        body_start = pos + len(lines[i])
        cursor, j, closed = body_start, i + 1, False
        while j < len(lines):
            stripped = lines[j].strip()
            if stripped.startswith(fence[0] * len(fence)) and set(stripped) <= {fence[0]}:
                closed = True
                break
            cursor += len(lines[j])
            j += 1
        body = source[body_start:cursor]
        end = cursor + (len(lines[j]) if closed else 0)
        body = body[:-1] if body.endswith("\n") else body
        segments.append(Segment("code", pos, end, body, body_start, language, closed))
        pos, text_start, i = end, end, (j + 1 if closed else j)
    if pos > text_start or not segments:
        segments.append(Segment("text", text_start, len(source), source[text_start:], text_start))
    return segments


def _space(ch: str) -> bool:
    return ch.isspace() or ch in "\u2029\u2028\ufffc"


# Source characters that never render: link/image targets. (Raw HTML, comments included, is
# rendered as text: MarkdownView imports Markdown without HTML.)
_HIDDEN = re.compile(r"\]\((?:[^()\s]|\([^()]*\))*(?:\s+\"[^\"]*\")?\)")
_MARKUP = set("*_~`#>|[]!-+=\\:")
_LOOKAHEAD = 3


def align(source: str, rendered: str) -> list[int]:
    """For each source character, the index of the same character in `rendered`, or -1.

    Greedy monotone matching in linear time: link targets are masked first (they never
    render); other Markdown markup (`*`, `#`, list markers...) is skipped when it
    does not match; a content character may skip a few rendered characters the source lacks
    (list numbering, entities); runs of whitespace match loosely (a paragraph break renders as
    one separator)."""
    hidden = [False] * len(source)
    for match in _HIDDEN.finditer(source):
        for i in range(match.start() + 1, match.end()):  # keep the "]": it is markup anyway
            hidden[i] = True
    mapping = [-1] * len(source)
    j = 0
    for i, ch in enumerate(source):
        if j >= len(rendered):
            break
        if hidden[i]:
            continue
        if _space(ch):
            if _space(rendered[j]):
                mapping[i] = j
                j += 1
            continue
        k = j
        while k < len(rendered) and _space(rendered[k]):
            k += 1  # a break the source does not have here (e.g. between list items)
        if k < len(rendered) and rendered[k] == ch:
            mapping[i], j = k, k + 1
        elif ch not in _MARKUP:
            ahead = rendered.find(ch, k + 1, k + 1 + _LOOKAHEAD)
            if ahead >= 0:
                mapping[i], j = ahead, ahead + 1
    return mapping
