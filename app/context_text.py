"""Per-token texts of a context, and the map from context positions to chat-message spans.

Why per-token texts: the inspector works in context positions (token indices in the KV
cache) while the chat view shows messages. The worker decodes the context token by token in
its own thread (`TokenTexts`), the GUI then finds every message's content inside the
concatenated text (`ContextMap`), so a position maps to (message index, character range).

Decoding one token alone is wrong for two reasons: SentencePiece decoders drop a token's
leading space when it starts the sequence, and a multi-byte character split over several
byte-level tokens decodes to U+FFFD until its last byte arrives. So each token is decoded
after one anchor token (its text is the difference), and a token whose text ends in an
incomplete character gets "" while the completed text goes to the token that finishes it.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Sequence
from dataclasses import dataclass

REPLACEMENT = "\ufffd"


def token_texts(decode: Callable[[list[int]], str], ids: Sequence[int]) -> list[str]:
    """Text contributed by each token of `ids` (len(ids) strings; "".join == decode(ids)
    for well-formed input). `decode` maps a list of ids to text, special tokens kept."""
    texts: list[str] = []
    anchor = 0  # first id of the decode window
    anchor_text = ""  # decode(ids[anchor:start]) for the window's already-emitted prefix
    for i in range(len(ids)):
        text = decode(list(ids[anchor : i + 1]))
        if text.endswith(REPLACEMENT) and i + 1 < len(ids):
            texts.append("")  # incomplete character: wait for the token that completes it
            continue
        piece = text[len(anchor_text) :] if text.startswith(anchor_text) else text
        texts.append(piece)
        anchor = i
        anchor_text = decode([ids[i]])
    return texts


class TokenTextCache:
    """`token_texts` that reuses the result for the longest common prefix of the last call
    (a chat context grows turn by turn, so only the new tail is decoded)."""

    def __init__(self, decode: Callable[[list[int]], str]) -> None:
        self._decode = decode
        self._ids: list[int] = []
        self._texts: list[str] = []

    def texts(self, ids: Sequence[int]) -> list[str]:
        ids = list(ids)
        common = 0
        for a, b in zip(self._ids, ids, strict=False):
            if a != b:
                break
            common += 1
        # Re-decode a few tokens before the split: the last kept ones may be mid-character.
        keep = max(0, common - 4)
        tail_start = max(0, keep - 1)
        tail = token_texts(self._decode, ids[tail_start:])
        if tail_start < keep:
            tail = tail[1:]  # the anchor token's text is already in the kept prefix
        self._ids, self._texts = ids, self._texts[:keep] + tail
        return list(self._texts)


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
