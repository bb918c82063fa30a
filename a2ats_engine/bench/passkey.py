"""Passkey retrieval: a number hidden at some depth in filler text, asked for at the end.

The prompt is a short instruction, repeated filler sentences with the needle ("The pass key is
N. Remember it. N is the pass key.") after a share `depth` of them, and the question "What is the
pass key? The pass key is". All but the last prompt token are prefilled once with exact
attention (mlx-lm KVCache); each method's cache gets a copy, then reads the last prompt token and
answers greedily, so every answer token, the first included, goes through the method's decode
attention. A trial is correct when the passkey's digits appear in the answer.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import mlx.nn as nn

from ..cache.config import A2ATSConfig
from ..progress import Progress
from .evaluate import build_caches, greedy_decode, method_spec, prefill
from .methods import prompt_method_names

PASSKEY_METHODS = prompt_method_names()
DEFAULT_METHODS = ("full", "window", "a2ats")
INTRO = (
    "There is an important piece of information hidden inside a lot of irrelevant text. "
    "Find it and memorize it. I will quiz you about the important information there.\n"
)
FILLER = (
    "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again. "
)
NEEDLE = "The pass key is {key}. Remember it. {key} is the pass key. "
QUESTION = "\nWhat is the pass key? The pass key is"


@dataclass(frozen=True)
class PasskeyTrial:
    """One method on one prompt."""

    context: int
    depth: float
    passkey: int
    method: str
    answer: str
    correct: bool
    attended_far: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def passkey_prompt(tokenizer: Any, context: int, depth: float, passkey: int) -> list[int]:
    """Token ids of a prompt of at most `context` tokens with the needle at `depth` in [0, 1]
    of the filler (as close to `context` as whole filler sentences allow)."""
    if not 0.0 <= depth <= 1.0:
        raise ValueError(f"depth={depth} is out of range: must be in [0, 1]")
    intro, filler = tokenizer.encode(INTRO), tokenizer.encode(FILLER, add_special_tokens=False)
    needle = tokenizer.encode(NEEDLE.format(key=passkey), add_special_tokens=False)
    question = tokenizer.encode(QUESTION, add_special_tokens=False)
    room = context - len(intro) - len(needle) - len(question)
    units = room // len(filler)
    if units < 1:
        raise ValueError(f"context={context} is too short for a passkey prompt")
    before = round(depth * units)
    return intro + filler * before + needle + filler * (units - before) + question


def _encode_kwargs_ok(tokenizer: Any) -> bool:
    try:
        tokenizer.encode("a", add_special_tokens=False)
    except TypeError:
        return False
    return True


def answer_with_methods(
    model: nn.Module,
    ids: Sequence[int],
    methods: Sequence[str],
    *,
    codebook: Any,
    config: A2ATSConfig,
    answer_tokens: int,
) -> dict[str, tuple[list[int], float | None]]:
    """Prefill `ids[:-1]` once (exact), then let each method read the last prompt token and
    answer greedily for `answer_tokens` tokens from a copy of that state.

    Returns {method: (answer token ids, far tokens attended per KV head per step or None)} in
    the order of `methods`. `window` attends as many far tokens per KV head as `a2ats` did on
    the same prompt (a2ats runs first, also when it is not asked for)."""
    order = sorted(methods, key=lambda m: (m != "a2ats", m != "full"))
    if "window" in methods and "a2ats" not in methods:
        order = ["a2ats", *order]
    base = prefill(model, ids[:-1])
    answers: dict[str, tuple[list[int], float | None]] = {}
    a2ats_far = None
    for name in order:
        if name == "window":
            spec = method_spec(name, model, config, {"a2ats": codebook},
                               max(1, round(a2ats_far or 1)))  # fmt: skip
        else:
            spec = method_spec(name, model, config, {"a2ats": codebook})
        caches = build_caches(model, base, spec)
        tokens, far = greedy_decode(model, caches, ids[-1], answer_tokens)
        if name == "a2ats":
            a2ats_far = far
        if name in methods:
            answers[name] = (tokens, far)
        del caches
    del base
    return {m: answers[m] for m in methods}


def bench_passkey(
    model: nn.Module,
    tokenizer: Any,
    contexts: Sequence[int],
    depths: Sequence[float],
    *,
    codebook: Any,
    config: A2ATSConfig | None = None,
    methods: Sequence[str] = DEFAULT_METHODS,
    answer_tokens: int = 8,
    seed: int = 0,
    progress: Progress | None = None,
) -> list[PasskeyTrial]:
    """Run every method on a passkey prompt per (context, depth). `window` attends as many far
    tokens per KV head as `a2ats` did on the same prompt (a2ats runs first)."""
    config = config or A2ATSConfig()
    unknown = [m for m in methods if m not in PASSKEY_METHODS]
    if unknown:
        raise ValueError(
            f"unknown passkey method(s) {unknown}; known: {', '.join(PASSKEY_METHODS)}"
        )
    if not _encode_kwargs_ok(tokenizer):
        raise ValueError("the tokenizer's encode() does not take add_special_tokens")
    rng = random.Random(seed)
    trials: list[PasskeyTrial] = []
    total, done = len(contexts) * len(depths), 0
    for context in contexts:
        for depth in depths:
            key = rng.randint(10000, 99999)
            ids = passkey_prompt(tokenizer, context, depth, key)
            if progress is not None:
                progress(f"passkey context {context} depth {depth}", done, total)
            answers = answer_with_methods(
                model, ids, methods, codebook=codebook, config=config, answer_tokens=answer_tokens
            )
            for name, (tokens, far) in answers.items():
                answer = tokenizer.decode(tokens)
                trials.append(
                    PasskeyTrial(context, depth, key, name, answer, str(key) in answer, far)
                )
            done += 1
    if progress is not None:
        progress("passkey", total, total)
    return trials


def accuracy_table(trials: Sequence[PasskeyTrial]) -> dict[str, dict[str, float]]:
    """{method: {str(context): accuracy over depths}}."""
    table: dict[str, dict[str, list[bool]]] = {}
    for t in trials:
        table.setdefault(t.method, {}).setdefault(str(t.context), []).append(t.correct)
    return {m: {c: sum(v) / len(v) for c, v in row.items()} for m, row in table.items()}
