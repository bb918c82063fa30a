"""Per-token texts of a context and the position -> message span map (transcript link)."""

from __future__ import annotations

import pytest

from app.context_text import ContextMap, TokenTextCache, token_texts


@pytest.fixture(scope="module")
def tokenizer():
    from tiny import tiny_tokenizer

    return tiny_tokenizer()


def decode_with(tokenizer):
    return lambda ids: tokenizer.decode(ids, skip_special_tokens=False)


@pytest.mark.parametrize(
    "text",
    [
        "Hello! How are you today?",
        "Ünïcödé tëxt, 日本語のテキスト 🙂 ok",
        "def main():\n    return 0\n",
    ],
)
def test_token_texts_concatenate_to_the_decoded_text(tokenizer, text):
    ids = tokenizer.encode(text, add_special_tokens=False)
    texts = token_texts(decode_with(tokenizer), ids)
    assert len(texts) == len(ids)
    assert "".join(texts) == tokenizer.decode(ids)
    assert all("\ufffd" not in t for t in texts)


def test_multibyte_character_goes_to_the_token_that_completes_it(tokenizer):
    ids = tokenizer.encode("🙂", add_special_tokens=False)
    assert len(ids) > 1  # byte-level pieces of one emoji
    texts = token_texts(decode_with(tokenizer), ids)
    assert texts[:-1] == [""] * (len(ids) - 1) and texts[-1] == "🙂"


def test_cache_reuses_prefix_and_matches_full_decode(tokenizer):
    decode = decode_with(tokenizer)
    a = tokenizer.encode("The capital of France is Paris. 日本", add_special_tokens=False)
    b = a + tokenizer.encode(" The quick brown fox 🙂", add_special_tokens=False)
    cache = TokenTextCache(decode)
    assert cache.texts(a) == token_texts(decode, a)
    assert cache.texts(b) == token_texts(decode, b)
    shorter = b[: len(a) - 3]
    assert cache.texts(shorter) == token_texts(decode, shorter)


def chat_context(tokenizer, messages):
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=False)
    return ids, token_texts(decode_with(tokenizer), ids)


def test_positions_map_to_message_spans(tokenizer):
    messages = [("user", "Hello there, Paris!"), ("assistant", "Hello! Paris, 日本語 ok")]
    ids, texts = chat_context(tokenizer, [{"role": r, "content": c} for r, c in messages])
    cmap = ContextMap(texts, messages)
    found: dict[int, str] = {}
    for position in range(len(ids)):
        span = cmap.locate(position)
        if span is not None:
            found.setdefault(span.message, "")
            found[span.message] += messages[span.message][1][span.start : span.end]
    # Every character of both messages is covered by exactly the tokens that encode it.
    assert found == {0: messages[0][1], 1: messages[1][1]}
    # Template tokens (role markers) map to nothing.
    assert cmap.locate(0) is None


def test_spans_merge_and_position_of_inverts_locate(tokenizer):
    messages = [("user", "The quick brown fox jumps over the lazy dog.")]
    ids, texts = chat_context(tokenizer, [{"role": "user", "content": messages[0][1]}])
    cmap = ContextMap(texts, messages)
    inside = [p for p in range(len(ids)) if cmap.locate(p) is not None]
    (merged,) = cmap.spans(inside)
    assert (merged.message, merged.start, merged.end) == (0, 0, len(messages[0][1]))
    for p in inside:
        span = cmap.locate(p)
        assert cmap.position_of(0, span.start) == p


def test_repeated_content_maps_to_the_right_occurrence():
    texts = ["<u>", "hi", "</u>", "<a>", "hi", "</a>", "<u>", "hi", "</u>"]
    cmap = ContextMap(texts, [("user", "hi"), ("assistant", "hi"), ("user", "hi")])
    assert [cmap.locate(p).message for p in (1, 4, 7)] == [0, 1, 2]
    assert cmap.locate(9) is None and cmap.locate(-1) is None
