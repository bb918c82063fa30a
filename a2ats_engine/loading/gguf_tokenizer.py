"""Rebuild a Hugging Face `tokenizer.json` from a GGUF file's tokenizer metadata.

A GGUF carries no tokenizer.json, only llama.cpp's description of one: the vocabulary
(`tokenizer.ggml.tokens`), token types, merges or scores, special token ids, the pre-tokenizer
name and the chat template. Two vocabulary kinds are rebuilt here with the `tokenizers` library:

- `gpt2`: byte-level BPE (SmolLM, Llama 3, Mistral Nemo...). The pre-tokenizer regex is picked
  from `tokenizer.ggml.pre` the way llama.cpp picks it.
- `llama`: SentencePiece BPE with byte fallback (Llama 2, Mistral 7B...). Merges are recovered from
  the token scores, the way transformers' slow-to-fast converter does, and a space is prefixed to
  each run of text (llama.cpp prefixes one after every special token too).

Control tokens become special added tokens and user-defined tokens plain added tokens, so they
are matched whole in the text, as llama.cpp does.
"""

from __future__ import annotations

import warnings
from typing import Any

from ..errors import ModelLoadError

# llama.cpp token types (`enum llama_token_type`).
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6

_GPT2_SPLIT = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"
_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_TEKKEN_SPLIT = (
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+"
    r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*"
    r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

# `tokenizer.ggml.pre` -> (split regex or None for GPT-2's own, split digits first, ignore merges)
# as llama.cpp's `llama_vocab::impl::load` maps them.
_PRE_TOKENIZERS: dict[str, tuple[str | None, bool, bool]] = {
    "default": (None, False, False),
    "gpt2": (None, False, False),
    "gpt-2": (None, False, False),
    "phi-2": (None, False, False),
    "smollm": (None, True, False),
    "starcoder": (None, True, False),
    "refact": (None, True, False),
    "command-r": (None, True, False),
    "codeshell": (None, True, False),
    "exaone": (None, True, False),
    "minerva-7b": (None, True, False),
    "llama3": (_LLAMA3_SPLIT, False, True),
    "llama-v3": (_LLAMA3_SPLIT, False, True),
    "llama-bpe": (_LLAMA3_SPLIT, False, True),
    "smaug-bpe": (_LLAMA3_SPLIT, False, False),
    "dbrx": (_LLAMA3_SPLIT, False, False),
    "falcon3": (_LLAMA3_SPLIT, False, False),
    "pixtral": (_LLAMA3_SPLIT, False, False),
    "qwen2": (_QWEN2_SPLIT, False, False),
    "deepseek-r1-qwen": (_QWEN2_SPLIT, False, False),
    "tekken": (_TEKKEN_SPLIT, False, False),
}


def _token_id(metadata: dict, key: str) -> int | None:
    value = metadata.get(f"tokenizer.ggml.{key}")
    return None if value is None else int(value.item() if hasattr(value, "item") else value)


def _flag(metadata: dict, key: str, default: bool) -> bool:
    value = metadata.get(f"tokenizer.ggml.{key}")
    if value is None:
        return default
    return bool(value.item() if hasattr(value, "item") else value)


def _as_list(value: Any) -> list:
    return value.tolist() if hasattr(value, "tolist") else list(value)


def _tokens(metadata: dict) -> list[str]:
    tokens = metadata.get("tokenizer.ggml.tokens")
    if not isinstance(tokens, list) or not tokens:
        raise ModelLoadError("GGUF has no tokenizer vocabulary (tokenizer.ggml.tokens)")
    return tokens


def _token_types(metadata: dict, count: int) -> list[int]:
    types = metadata.get("tokenizer.ggml.token_type")
    if types is None:
        return [NORMAL] * count
    types = [int(t) for t in _as_list(types)]
    if len(types) != count:
        raise ModelLoadError(
            f"GGUF tokenizer metadata is inconsistent: {count} tokens but {len(types)} token types"
        )
    return types


def _added_tokens(tokens: list[str], types: list[int], unk_id: int | None) -> tuple[list, list]:
    from tokenizers import AddedToken

    special = [
        AddedToken(tok, special=True, normalized=False)
        for i, (tok, kind) in enumerate(zip(tokens, types, strict=True))
        if kind == CONTROL or (kind == UNKNOWN and i == unk_id)
    ]
    plain = [
        AddedToken(tok, special=False, normalized=False)
        for tok, kind in zip(tokens, types, strict=True)
        if kind == USER_DEFINED
    ]
    return special, plain


def _vocab(tokens: list[str]) -> dict[str, int]:
    # Duplicated strings (padding placeholders in some files) keep their first id.
    vocab: dict[str, int] = {}
    for i, tok in enumerate(tokens):
        vocab.setdefault(tok, i)
    return vocab


def _byte_level_pre_tokenizer(pre: str | None):
    from tokenizers import Regex, pre_tokenizers

    name = pre or "default"
    if name not in _PRE_TOKENIZERS:
        warnings.warn(
            f"GGUF pre-tokenizer {name!r} is unknown here; splitting text like GPT-2",
            stacklevel=3,
        )
        name = "default"
    split, digits, _ = _PRE_TOKENIZERS[name]
    steps = []
    if digits:
        steps.append(pre_tokenizers.Digits(individual_digits=True))
    if split is None:
        steps.append(pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True))
    else:
        steps.append(pre_tokenizers.Split(Regex(split), behavior="isolated"))
        steps.append(pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False))
    return steps[0] if len(steps) == 1 else pre_tokenizers.Sequence(steps)


def _byte_level_tokenizer(metadata: dict, tokens: list[str]):
    from tokenizers import Tokenizer, decoders, models

    merges = metadata.get("tokenizer.ggml.merges")
    if not isinstance(merges, list):
        raise ModelLoadError("GGUF byte-level BPE tokenizer has no merges (tokenizer.ggml.merges)")
    pairs = []
    for merge in merges:
        left, sep, right = merge.partition(" ")
        if not sep:
            raise ModelLoadError(f"GGUF tokenizer merge {merge!r} is not a pair")
        pairs.append((left, right))
    pre = metadata.get("tokenizer.ggml.pre")
    ignore_merges = _PRE_TOKENIZERS.get(pre or "default", (None, False, False))[2]
    model = models.BPE(vocab=_vocab(tokens), merges=pairs, ignore_merges=ignore_merges)
    tokenizer = Tokenizer(model)
    tokenizer.pre_tokenizer = _byte_level_pre_tokenizer(pre)
    tokenizer.decoder = decoders.ByteLevel()
    return tokenizer


def sentencepiece_merges(
    tokens: list[str], scores: list[float], types: list[int]
) -> list[tuple[str, str]]:
    """BPE merges implied by a SentencePiece vocabulary: every split of a normal token into two
    tokens of the vocabulary, best merged-token score first (ties by the pieces' ids)."""
    vocab = _vocab(tokens)
    ranked = []
    for token, score, kind in zip(tokens, scores, types, strict=True):
        if kind != NORMAL or len(token) < 2:
            continue
        for cut in range(1, len(token)):
            left, right = token[:cut], token[cut:]
            if left in vocab and right in vocab:
                ranked.append((-score, vocab[left], vocab[right], left, right))
    ranked.sort()
    return [(left, right) for *_, left, right in ranked]


def _sentencepiece_tokenizer(metadata: dict, tokens: list[str], types: list[int]):
    from tokenizers import Tokenizer, decoders, models, normalizers

    scores = metadata.get("tokenizer.ggml.scores")
    scores = [float(s) for s in _as_list(scores)] if scores is not None else None
    if scores is None or len(scores) != len(tokens):
        # Without scores the file order is the merge order (earlier = more frequent).
        scores = [-float(i) for i in range(len(tokens))]
    unk_id = _token_id(metadata, "unknown_token_id")
    model = models.BPE(
        vocab=_vocab(tokens),
        merges=sentencepiece_merges(tokens, scores, types),
        unk_token=tokens[unk_id] if unk_id is not None else None,
        fuse_unk=True,
        byte_fallback=True,
    )
    tokenizer = Tokenizer(model)
    prefix_space = _flag(metadata, "add_space_prefix", True)
    steps = [normalizers.Replace(" ", "\u2581")]
    if prefix_space:
        steps.insert(0, normalizers.Prepend("\u2581"))
    tokenizer.normalizer = normalizers.Sequence(steps)
    decode = [decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse()]
    if prefix_space:
        decode.append(decoders.Strip(" ", 1, 0))
    tokenizer.decoder = decoders.Sequence(decode)
    return tokenizer


def _post_processor(tokenizer, metadata: dict, tokens: list[str], kind: str):
    """Add BOS / EOS around encoded text when the file asks for it."""
    from tokenizers import processors

    bos_id = _token_id(metadata, "bos_token_id")
    eos_id = _token_id(metadata, "eos_token_id")
    add_bos = _flag(metadata, "add_bos_token", kind == "llama") and bos_id is not None
    add_eos = _flag(metadata, "add_eos_token", False) and eos_id is not None
    if not (add_bos or add_eos):
        if kind == "gpt2":
            tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
        return
    before = [tokens[bos_id]] if add_bos else []
    after = [tokens[eos_id]] if add_eos else []
    specials = {tokens[i]: i for i, on in ((bos_id, add_bos), (eos_id, add_eos)) if on}
    tokenizer.post_processor = processors.TemplateProcessing(
        single=[*before, "$A", *after],
        pair=[*before, "$A", *after, *before, "$B:1", *after],
        special_tokens=list(specials.items()),
    )


def build_tokenizer(metadata: dict):
    """A `tokenizers.Tokenizer` equivalent to the GGUF's tokenizer (its tokenizer.json).

    Raises ModelLoadError when the metadata is missing or of a kind not handled here.
    """
    kind = metadata.get("tokenizer.ggml.model")
    tokens = _tokens(metadata)
    types = _token_types(metadata, len(tokens))
    if kind == "gpt2":
        tokenizer = _byte_level_tokenizer(metadata, tokens)
    elif kind == "llama":
        tokenizer = _sentencepiece_tokenizer(metadata, tokens, types)
    else:
        raise ModelLoadError(f"not supported yet: GGUF tokenizer type {kind!r}")
    special, plain = _added_tokens(tokens, types, _token_id(metadata, "unknown_token_id"))
    if special:
        tokenizer.add_special_tokens(special)
    if plain:
        tokenizer.add_tokens(plain)
    _post_processor(tokenizer, metadata, tokens, kind)
    return tokenizer


def tokenizer_config(metadata: dict, context_length: int | None = None) -> dict:
    """tokenizer_config.json contents: special tokens, BOS/EOS flags and the chat template."""
    tokens = _tokens(metadata)
    kind = metadata.get("tokenizer.ggml.model")

    def token(key: str) -> str | None:
        token_id = _token_id(metadata, key)
        return tokens[token_id] if token_id is not None and 0 <= token_id < len(tokens) else None

    config: dict[str, Any] = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": token("bos_token_id"),
        "eos_token": token("eos_token_id"),
        "unk_token": token("unknown_token_id"),
        "pad_token": token("padding_token_id"),
        "add_bos_token": _flag(metadata, "add_bos_token", kind == "llama"),
        "add_eos_token": _flag(metadata, "add_eos_token", False),
        "clean_up_tokenization_spaces": False,
    }
    if context_length:
        config["model_max_length"] = int(context_length)
    template = metadata.get("tokenizer.chat_template")
    if isinstance(template, str) and template:
        config["chat_template"] = template
    return config


def stop_token_ids(metadata: dict) -> list[int]:
    """Token ids that end a reply: EOS, and end-of-turn / end-of-message when the file names them."""
    ids = [_token_id(metadata, key) for key in ("eos_token_id", "eot_token_id", "eom_token_id")]
    return sorted({i for i in ids if i is not None})


# llama.cpp's recommended-sampling keys -> Hugging Face generation_config.json names.
GGUF_SAMPLING_KEYS = {
    "general.sampling.temp": "temperature",
    "general.sampling.top_p": "top_p",
    "general.sampling.top_k": "top_k",
    "general.sampling.min_p": "min_p",
    "general.sampling.penalty_repeat": "repetition_penalty",
}


def generation_config(metadata: dict) -> dict:
    """The `generation_config.json` of a converted GGUF: the model's recommended sampling from
    its `general.sampling.*` keys ({} when it has none). Values are copied as numbers; the
    reader (`records.sampling_from_generation_config`) drops any that are out of range."""
    config = {}
    for key, name in GGUF_SAMPLING_KEYS.items():
        value = metadata.get(key)
        if hasattr(value, "item") and getattr(value, "size", 1) == 1:
            value = value.item()  # numpy scalar
        if isinstance(value, int | float) and not isinstance(value, bool):
            config[name] = value
    return config
