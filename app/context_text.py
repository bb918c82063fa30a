"""Per-token texts of a context, and the map from context positions to chat-message spans.

Why per-token texts: the inspector works in context positions (token indices in the KV
cache) while the chat view shows messages. The worker decodes the context token by token in
its own thread (`TokenTexts`), the GUI then finds every message's content inside the
concatenated text (`ContextMap`), so a position maps to (message index, character range).

How a token's text is found (an anchor token decoded before it, incomplete characters held
back): `a2ats_engine/token_texts.py`.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass

from a2ats_engine.token_texts import REPLACEMENT, TokenTextCache, token_texts

__all__ = ["REPLACEMENT", "ContextMap", "Span", "TokenTextCache", "token_texts"]


@dataclass(frozen=True)
class Span:
    """A message's character range [start, end) holding context positions [first, last]."""

    message: int
    start: int
    end: int


class ContextMap:
    """Maps context token positions to (message index, character range in its content).

    Built from the per-token texts and the messages (role, content) the context encodes,
    in order. Each message content is searched in the concatenated context text from where
    the previous one ended, so template text (role markers, special tokens) is skipped and
    repeated content maps to the right occurrence. Messages whose content the template
    changed (not found verbatim) are skipped; their positions map to nothing.
    """

    def __init__(self, texts: Sequence[str], messages: Sequence[tuple[str, str]]) -> None:
        self.texts = list(texts)
        self.offsets = [0]  # offsets[i] = start char of token i in the context text
        for t in self.texts:
            self.offsets.append(self.offsets[-1] + len(t))
        self.context = "".join(self.texts)
        self.message_ranges: list[tuple[int, int, int] | None] = []  # (msg, ctx start, ctx end)
        cursor = 0
        for index, (_, content) in enumerate(messages):
            found = self.context.find(content, cursor) if content else -1
            if found < 0:
                stripped = content.strip()
                found = self.context.find(stripped, cursor) if stripped else -1
                content = stripped
            if found < 0:
                self.message_ranges.append(None)
                continue
            self.message_ranges.append((index, found, found + len(content)))
            cursor = found + len(content)

    def __len__(self) -> int:
        return len(self.texts)

    def locate(self, position: int) -> Span | None:
        """The message and character range (in that message's content) of one token, or None
        for template tokens, out-of-range positions and empty token texts."""
        if not 0 <= position < len(self.texts) or not self.texts[position]:
            return None
        start, end = self.offsets[position], self.offsets[position + 1]
        for entry in self.message_ranges:
            if entry is None:
                continue
            index, m_start, m_end = entry
            if start < m_end and end > m_start:
                return Span(index, max(start, m_start) - m_start, min(end, m_end) - m_start)
        return None

    def spans(self, positions: Sequence[int]) -> list[Span]:
        """`locate` for many positions, merging adjacent ranges of the same message."""
        found = sorted(
            (s for s in (self.locate(int(p)) for p in positions) if s is not None),
            key=lambda s: (s.message, s.start),
        )
        merged: list[Span] = []
        for span in found:
            last = merged[-1] if merged else None
            if last and last.message == span.message and span.start <= last.end:
                merged[-1] = Span(last.message, last.start, max(last.end, span.end))
            else:
                merged.append(span)
        return merged

    def position_of(self, message: int, char: int) -> int | None:
        """The context position of the token covering character `char` of `message`."""
        for entry in self.message_ranges:
            if entry is not None and entry[0] == message:
                target = entry[1] + char
                return max(0, bisect.bisect_right(self.offsets, target) - 1)
        return None
