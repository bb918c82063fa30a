"""The text each token of a context contributes (for the inspector's context view).

Decoding one token alone is wrong for two reasons: SentencePiece decoders drop a token's
leading space when it starts the sequence, and a multi-byte character split over several
byte-level tokens decodes to U+FFFD until its last byte arrives. So each token is decoded
after one anchor token (its text is the difference), and a token whose text ends in an
incomplete character gets "" while the completed text goes to the token that finishes it.

Used by the app's worker with its tokenizer, and by rank 0 of the served ranks
(`distributed/serve.py`), which sends a context's token texts to the app.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

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


__all__ = ["REPLACEMENT", "TokenTextCache", "token_texts"]
