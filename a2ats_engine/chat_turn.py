"""One chat turn before it is generated: the prompt it renders, the conversation it answers, and
fitting it into the model's context as an overflow policy says.

MLX-free (a tokenizer is all the rendering needs). `ChatSession` (session.py) runs these over
its own conversation: `ChatSession.fit` and `ChatSession.reply`; anything else holding a
conversation and a prompt-length function (the app's test double) runs the same rules.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

Messages = list[dict]  # [{"role": "user" | "assistant", "content": str}, ...], no system


class ReplyMode(StrEnum):
    """How a reply is asked for: a new message, the last reply again, or an edited message."""

    SEND = "send"
    REGENERATE = "regenerate"
    EDIT = "edit"


class OverflowPolicy(StrEnum):
    """What to do when prompt + max tokens exceed the model's context."""

    ASK = "ask"  # change nothing: the fit reports the overflow so the user can choose
    STOP_AT_LIMIT = "stop_at_limit"  # cut max tokens so the reply ends at the context limit
    DROP_OLDEST = "drop_oldest"  # leave the oldest turns out of the prompt until it fits


@dataclass(frozen=True)
class ContextFit:
    """How a turn fits the context. `prompt_tokens` is None when the context has no limit;
    `dropped`: the oldest messages left out (the conversation no longer holds them);
    `max_tokens` < `requested`: the reply is cut to the room left; `overflow`: it does not fit
    and the policy is ASK (nothing was changed)."""

    prompt_tokens: int | None
    max_tokens: int
    requested: int
    context_length: int | None
    dropped: int = 0
    overflow: bool = False

    @property
    def cut(self) -> bool:
        return self.max_tokens < self.requested


def last_user_index(messages: Messages) -> int:
    """Index of the last user message; ValueError when there is none."""
    for i in range(len(messages) - 1, -1, -1):
        if messages[i]["role"] == "user":
            return i
    raise ValueError("there is no user message to answer yet")


def after_turn(messages: Messages, mode: ReplyMode | str, text: str = "") -> Messages:
    """The conversation the reply answers: `messages` after the turn's action (a new user
    message; the last reply dropped; the last user message replaced, what followed dropped)."""
    mode = ReplyMode(mode)
    if mode == ReplyMode.SEND:
        return [*messages, {"role": "user", "content": text}]
    last_user = last_user_index(messages)
    if mode == ReplyMode.REGENERATE:
        return list(messages[: last_user + 1])
    return [*messages[:last_user], {"role": "user", "content": text}]


def fit_turn(
    messages: Messages,
    mode: ReplyMode | str,
    text: str,
    *,
    max_tokens: int,
    context_length: int | None,
    policy: OverflowPolicy | str,
    prompt_length: Callable[[Messages], int],
) -> tuple[ContextFit, Messages]:
    """Make prompt + `max_tokens` fit `context_length` as `policy` says. Returns the fit and
    the conversation to hold before the turn (`messages`, or its tail after DROP_OLDEST; never
    the message answered). ValueError when the prompt alone fills the context."""
    policy = OverflowPolicy(policy)
    if not context_length:
        return ContextFit(None, max_tokens, max_tokens, context_length), messages
    prompt = prompt_length(after_turn(messages, mode, text))
    fit = ContextFit(prompt, max_tokens, max_tokens, context_length)
    if prompt + max_tokens <= context_length:
        return fit, messages
    if policy == OverflowPolicy.ASK:
        return ContextFit(prompt, max_tokens, max_tokens, context_length, overflow=True), messages
    dropped = 0
    if policy == OverflowPolicy.DROP_OLDEST:
        keep_from = (
            len(messages) if ReplyMode(mode) == ReplyMode.SEND else last_user_index(messages)
        )
        while prompt + max_tokens > context_length and dropped < keep_from:
            dropped += 1
            while dropped < keep_from and messages[dropped]["role"] != "user":
                dropped += 1  # start at a user turn
            prompt = prompt_length(after_turn(messages[dropped:], mode, text))
        messages = messages[dropped:]
    room = min(max_tokens, context_length - prompt)
    if room < 1:
        raise ValueError(
            f"the prompt alone is {prompt:,} tokens, more than the model's context of "
            f"{context_length:,}: shorten the message or start a new chat"
        )
    return ContextFit(prompt, room, max_tokens, context_length, dropped), messages


# ----- rendering ------------------------------------------------------------------------------


def _token_list(ids: Any) -> list[int]:
    """Normalize what a tokenizer returns (list, array, BatchEncoding-like) to a list of ints."""
    if isinstance(ids, dict) or hasattr(ids, "input_ids"):
        ids = ids["input_ids"]
    ids = list(ids)
    if ids and isinstance(ids[0], list | tuple):  # batched output of one conversation
        ids = list(ids[0])
    return [int(i) for i in ids]


TURN_BREAK = "\n\n"  # between the turns of the plain transcript


def _plain_segments(conversation: Messages) -> list[str]:
    """Fallback rendering for tokenizers without a chat template: "Role: text" turns, then
    "Assistant:". Each reply is a segment of its own, the text between them another, so a
    reply is tokenized alone, as it was generated after "Assistant:" (tokenized with its
    neighbours, " The" after "Assistant:" or a reply that is one newline before the next turn
    would merge differently); a turn whose text starts with white space follows its "Role:" directly. Then
    the next turn's prompt starts with exactly the tokens the cache holds, and needs no trim,
    which a sliding-window cache could not do (it would prefill the whole chat again)."""
    segments, text = [], ""
    for i, m in enumerate(conversation):
        text += f"{TURN_BREAK if i else ''}{m['role'].capitalize()}:"
        body = m["content"] if m["content"][:1].isspace() else f" {m['content']}"
        if m["role"] == "assistant":
            segments += [text, body]
            text = ""
        else:
            text += body
    return [*segments, text + (TURN_BREAK if conversation else "") + "Assistant:"]


def _plain_prompt(tokenizer: Any, conversation: Messages) -> list[int]:
    """Token ids of `_plain_segments`, each tokenized alone (special tokens on the first)."""
    ids: list[int] = []
    for segment in _plain_segments(conversation):
        if not segment:
            continue
        encoded = tokenizer.encode(segment) if not ids else _encode_plain(tokenizer, segment)
        ids += _token_list(encoded)
    return ids


def _encode_plain(tokenizer: Any, text: str) -> Any:
    """`text` without the special tokens a tokenizer adds at the start (BOS)."""
    try:
        return tokenizer.encode(text, add_special_tokens=False)
    except TypeError:  # a tokenizer without the keyword adds none
        return tokenizer.encode(text)


def _fold_system(system_prompt: str, messages: Messages) -> Messages:
    """Put the system prompt in front of the first user message (templates without a system role)."""
    folded = [dict(m) for m in messages]
    for m in folded:
        if m["role"] == "user":
            m["content"] = f"{system_prompt}\n\n{m['content']}"
            return folded
    return [{"role": "user", "content": system_prompt}, *folded]


def _apply_template(tokenizer: Any, conversation: Messages) -> list[int]:
    ids = tokenizer.apply_chat_template(conversation, add_generation_prompt=True, tokenize=True)
    return _token_list(ids)


def render_prompt(tokenizer: Any, messages: Messages, system_prompt: str | None) -> list[int]:
    """Token ids of the conversation plus the assistant generation prompt.

    Uses the tokenizer's chat template. A template that rejects the system role (it raises while
    rendering) gets the system prompt folded into the first user message; a tokenizer without
    any chat template gets a plain "Role: text" transcript.
    """
    system = [{"role": "system", "content": system_prompt}] if system_prompt else []
    if not getattr(tokenizer, "has_chat_template", True):
        return _plain_prompt(tokenizer, system + messages)
    try:
        return _apply_template(tokenizer, system + messages)
    except Exception as exc:  # jinja2 TemplateError, ValueError, ...: the template refused
        if not system_prompt:
            raise ValueError(f"the model's chat template failed to render: {exc}") from exc
    try:
        return _apply_template(tokenizer, _fold_system(system_prompt, messages))
    except Exception as exc:
        raise ValueError(f"the model's chat template failed to render: {exc}") from exc
