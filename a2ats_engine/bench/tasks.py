"""RULER-style long-context tasks, generated offline, answered greedily by each method.

Every prompt is an instruction, `context` tokens of filler (sentences of a haystack text cycled
from a seeded start) with needles inserted between sentences, and a question whose answer the
model completes. Tasks (after RULER, Hsieh et al. 2024):

  niah_number, niah_word, niah_uuid   one needle "One of the special magic {kind}s for {key} is:
                                      {value}." at `depth`; asked for that key's value
  niah_multikey                       the needle at `depth` plus 2-4 needles of other keys
                                      (distractors) at seeded depths; asked for the first key
  niah_multivalue                     2-4 needles with the same key and different numbers; the
                                      first at `depth`; every value is asked for
  variable_tracking                   a chain "VAR A = n. VAR B = VAR A. ..." of 2-4 hops starting
                                      at `depth` and a distractor chain; every name holding n is
                                      asked for (multi-hop)
  common_words                        a numbered list of pseudo-words where a few are frequent;
                                      the frequent ones are asked for (aggregation: attention
                                      is spread over the whole list; no haystack, no depth)

A trial's score is the share of reference strings found (case-insensitively) in the answer, in
[0, 1]. The prompt is run through every method by `passkey.answer_with_methods` (one exact
prefill, then the last prompt token and every answer token through the method's decode
attention), so methods are compared on the same prompts of the same model; a small model is
weak in absolute terms, hence the score relative to `full`.
"""

from __future__ import annotations

import functools
import itertools
import json
import random
import string
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import mlx.nn as nn
import numpy as np

from ..cache.config import A2ATSConfig
from .methods import prompt_method_names
from .passkey import answer_with_methods

Progress = Callable[[str, int, int], None]
TASKS = (
    "niah_number",
    "niah_word",
    "niah_uuid",
    "niah_multikey",
    "niah_multivalue",
    "variable_tracking",
    "common_words",
)
TASK_METHODS = prompt_method_names()
DEFAULT_METHODS = ("full", "a2ats", "window", "oracle_topk")
DEFAULT_DEPTHS = (0.1, 0.5, 0.9)
# answer length per task: enough tokens for every reference with a typical BPE tokenizer
ANSWER_TOKENS = {
    "niah_number": 12,
    "niah_word": 12,
    "niah_uuid": 48,
    "niah_multikey": 12,
    "niah_multivalue": 40,
    "variable_tracking": 24,
    "common_words": 32,
}
COMMON_WORDS = 5  # frequent words asked for in common_words

HAYSTACK = Path(__file__).resolve().parents[2] / "resources" / "texts" / "us_founding_prose.txt"
HAYSTACK_DESCRIPTION = (
    "resources/texts/us_founding_prose.txt (public-domain U.S. documents; not in the "
    "calibration corpus)"
)
INTRO = (
    "Some special magic information is hidden inside the following text. Read it and memorize "
    "the information. I will quiz you about it afterwards.\n"
)
CWE_INTRO = (
    "Below is a numbered list of words. In these words, some appear more often than others. "
    "Memorize the ones that appear most often.\n"
)
# keys of the needles and values of niah_word: plain, single-token-ish English words
WORDS = (
    "apple", "river", "candle", "silver", "garden", "pencil", "window", "orange", "forest",
    "bridge", "castle", "dragon", "feather", "harbor", "island", "jacket", "kettle", "lemon",
    "marble", "needle", "ocean", "pepper", "rabbit", "saddle", "tiger", "violet", "walnut",
    "yellow", "anchor", "basket", "copper", "desert", "engine", "falcon", "ginger", "hammer",
    "iron", "jungle", "ladder", "meadow", "nickel", "oyster", "planet", "quartz", "rocket",
    "salmon", "tunnel", "velvet", "wizard", "zebra", "banana", "cactus", "dolphin", "eagle",
    "fossil", "glacier", "helmet", "igloo", "jasmine", "koala", "lantern", "mango", "nutmeg",
)  # fmt: skip


@dataclass(frozen=True)
class TaskPrompt:
    """One generated prompt: token ids, the strings a correct answer contains, and where the
    target needle sits: `needle_at`, the index in `ids` of its first token, after
    `filler_before` of the prompt's `filler_tokens` filler tokens (-1, 0, 0 for common_words)."""

    task: str
    context: int
    depth: float
    seed: int
    ids: tuple[int, ...]
    references: tuple[str, ...]
    needle_at: int
    needle_text: str
    answer_tokens: int
    filler_before: int = 0
    filler_tokens: int = 0


@dataclass(frozen=True)
class TaskTrial:
    """One method's answer to one prompt and its score in [0, 1]."""

    task: str
    context: int
    depth: float
    seed: int
    method: str
    answer: str
    score: float


def score_answer(answer: str, references: Sequence[str]) -> float:
    """Share of `references` found in `answer` (case-insensitive substring), in [0, 1]."""
    if not references:
        raise ValueError("references is empty: a task needs at least one reference answer")
    text = answer.lower()
    return sum(ref.lower() in text for ref in references) / len(references)


# -- haystack -------------------------------------------------------------------------------


def default_haystack() -> tuple[str, str]:
    """(text, description) of the built-in filler text."""
    return HAYSTACK.read_text(encoding="utf-8"), HAYSTACK_DESCRIPTION


def haystack_sentences(text: str) -> list[str]:
    """The text split into sentences (at '.', '!', '?', ':' or ';', and at ',' after 12 words, so
    that pieces stay short), each ending with a space so that they concatenate into prose."""
    out, current = [], []
    for word in text.split():
        current.append(word)
        if (word[-1] in ".!?:;" and len(current) >= 4) or (word[-1] == "," and len(current) >= 12):
            out.append(" ".join(current) + " ")
            current = []
    if current:
        out.append(" ".join(current) + " ")
    if len(out) < 2:
        raise ValueError("the haystack text has fewer than 2 sentences: give a longer text")
    return out


class Encoder:
    """Token ids of prompt pieces with one tokenizer (pieces after the first without special
    tokens), cached per string."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self._piece = functools.lru_cache(maxsize=65536)(self._encode_piece)

    def _encode_piece(self, text: str) -> tuple[int, ...]:
        return tuple(self.tokenizer.encode(text, add_special_tokens=False))

    def first(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text))

    def piece(self, text: str) -> list[int]:
        return list(self._piece(text))


def _assemble(
    enc: Encoder,
    sentences: Sequence[str],
    context: int,
    intro: str,
    needles: Sequence[tuple[float, str]],
    question: str,
    rng: random.Random,
    target: int = 0,
) -> tuple[list[int], int, int, int]:
    """Token ids of intro + filler sentences (from a seeded start, cycled) with `needles`
    [(depth in [0, 1], text)] inserted at the sentence boundary nearest to that share of the
    filler tokens (needles at one boundary keep their order) + question; at most `context` tokens. Returns (ids, index of needle `target`'s
    first token, filler tokens before it, filler tokens in all)."""
    head, tail = enc.first(intro), enc.piece(question)
    needle_ids = [enc.piece(text) for _, text in needles]
    room = context - len(head) - len(tail) - sum(len(n) for n in needle_ids)
    start = rng.randrange(len(sentences))
    filler: list[list[int]] = []
    used = 0
    while True:
        ids = enc.piece(sentences[(start + len(filler)) % len(sentences)])
        if used + len(ids) > room:
            break
        filler.append(ids)
        used += len(ids)
    if not filler:
        raise ValueError(f"context={context} is too short for this task's prompt")
    ends = list(itertools.accumulate(len(f) for f in filler))  # filler tokens before slot s + 1
    starts = [0, *ends]
    slots = [min(range(len(starts)), key=lambda s: abs(starts[s] - d * used)) for d, _ in needles]
    order = sorted(range(len(needles)), key=lambda i: (slots[i], i))
    out, at, k = list(head), -1, 0
    for s in range(len(filler) + 1):
        while k < len(order) and slots[order[k]] == s:
            if order[k] == target:
                at = len(out)
            out.extend(needle_ids[order[k]])
            k += 1
        if s < len(filler):
            out.extend(filler[s])
    return out + tail, at, starts[slots[target]], used


# -- the tasks ------------------------------------------------------------------------------


def _number(rng: random.Random) -> str:
    return str(rng.randint(1_000_000, 9_999_999))


def _uuid(rng: random.Random) -> str:
    return str(uuid.UUID(int=rng.getrandbits(128), version=4))


def _needle(kind: str, key: str, value: str) -> str:
    return f"One of the special magic {kind}s for {key} is: {value}. "


def _niah_question(kind: str, key: str) -> str:
    return (
        f"\nWhat is the special magic {kind} for {key} mentioned in the text above? "
        f"The special magic {kind} for {key} mentioned in the text above is"
    )


def _niah(task: str, rng: random.Random, depth: float):
    kind = {"niah_number": "number", "niah_word": "word", "niah_uuid": "uuid"}.get(task, "number")
    make = {"number": _number, "uuid": _uuid, "word": lambda r: r.choice(WORDS)}[kind]
    keys = rng.sample(WORDS, 5)
    key, value = keys[0], make(rng)
    while kind == "word" and value == key:
        value = make(rng)
    needles = [(depth, _needle(kind, key, value))]
    references = (value,)
    if task == "niah_multikey":
        for other in keys[1 : 1 + rng.randint(2, 4)]:
            needles.append((rng.random(), _needle(kind, other, make(rng))))
    elif task == "niah_multivalue":
        values, count = [value], rng.randint(2, 4)
        while len(values) < count:
            extra = make(rng)
            if extra not in values:
                values.append(extra)
        needles += [(rng.random(), _needle(kind, key, v)) for v in values[1:]]
        references = tuple(values)
        question = (
            f"\nWhat are all the special magic {kind}s for {key} mentioned in the text above? "
            f"The special magic {kind}s for {key} mentioned in the text above are"
        )
        return needles, question, references
    return needles, _niah_question(kind, key), references


def _variable_name(rng: random.Random) -> str:
    return "".join(rng.choices(string.ascii_uppercase, k=5))


def _variable_tracking(rng: random.Random, depth: float):
    hops = rng.randint(2, 4)
    names: list[str] = []
    while len(names) < 2 * (hops + 1):
        name = _variable_name(rng)
        if name not in names:
            names.append(name)
    chain, decoy = names[: hops + 1], names[hops + 1 :]
    value, other = _number(rng)[:5], _number(rng)[:5]
    while other == value:
        other = _number(rng)[:5]
    spots = sorted([depth] + [depth + (1 - depth) * rng.random() for _ in range(hops)])
    needles = [(spots[0], f"VAR {chain[0]} = {value}. ")]
    needles += [(spots[i], f"VAR {chain[i]} = VAR {chain[i - 1]}. ") for i in range(1, hops + 1)]
    decoy_spots = sorted(rng.random() for _ in range(hops + 1))
    needles.append((decoy_spots[0], f"VAR {decoy[0]} = {other}. "))
    needles += [
        (decoy_spots[i], f"VAR {decoy[i]} = VAR {decoy[i - 1]}. ") for i in range(1, hops + 1)
    ]
    question = (
        f"\nFind all variables that are assigned the value {value} in the text above. "
        f"Answer: according to the chain of variables assigned in the text above, "
        f"{hops + 1} variables are assigned the value {value}, they are: VAR"
    )
    return needles, question, tuple(chain)


def _pseudo_words(rng: random.Random, n: int) -> list[str]:
    """n distinct pronounceable lowercase pseudo-words (consonant-vowel syllables)."""
    consonants, vowels = "bdfgklmnprstvz", "aeiou"
    words: list[str] = []
    seen: set[str] = set()
    while len(words) < n:
        word = "".join(rng.choice(consonants) + rng.choice(vowels) for _ in range(3))
        if word not in seen:
            seen.add(word)
            words.append(word)
    return words


def _common_words_prompt(enc: Encoder, context: int, rng: random.Random) -> tuple[list[int], tuple]:
    """A numbered list filling `context` tokens: COMMON_WORDS words repeated often (about a
    quarter of the entries together), the other entries words used at most twice."""
    question = (
        f"\nWhat are the {COMMON_WORDS} most common words in the list above? Answer: the "
        f"{COMMON_WORDS} words that appear most often in the list are:"
    )
    head, tail = enc.first(CWE_INTRO), enc.piece(question)
    room = context - len(head) - len(tail)
    probe = enc.piece(f"{room}. babela\n")
    entries = max(4 * COMMON_WORDS, room // max(len(probe), 1))
    repeats = max(3, entries // (4 * COMMON_WORDS))
    rare_count = max(1, (entries - repeats * COMMON_WORDS) // 2 + 1)
    words = _pseudo_words(rng, COMMON_WORDS + rare_count)
    common, rare = words[:COMMON_WORDS], words[COMMON_WORDS:]
    while True:
        pool = common * repeats + [w for w in rare for _ in range(2)]
        pool = pool[: max(entries, repeats * COMMON_WORDS)]
        rng.shuffle(pool)
        body: list[int] = []
        for i, word in enumerate(pool, 1):
            body += enc.piece(f"{i}. {word}\n")
        if len(body) <= room or entries <= 4 * COMMON_WORDS:
            break
        entries = int(entries * room / len(body)) - 1
        repeats = max(3, entries // (4 * COMMON_WORDS))
    if len(head) + len(body) + len(tail) > context:
        raise ValueError(f"context={context} is too short for the common_words prompt")
    return head + body + tail, tuple(common)


def make_prompt(
    tokenizer: Any,
    task: str,
    context: int,
    depth: float,
    seed: int,
    sentences: Sequence[str],
    encoder: Encoder | None = None,
) -> TaskPrompt:
    """The prompt of `task` at `context` tokens with its target needle at `depth` in [0, 1] of
    the filler, deterministic for (task, context, depth, seed, haystack)."""
    if task not in TASKS:
        raise ValueError(f"task={task!r} is unknown: must be one of {', '.join(TASKS)}")
    if not 0.0 <= depth <= 1.0:
        raise ValueError(f"depth={depth} is out of range: must be in [0, 1]")
    enc = encoder or Encoder(tokenizer)
    rng = random.Random(f"{task}/{context}/{depth}/{seed}")
    answer_tokens = ANSWER_TOKENS[task]
    if task == "common_words":
        ids, refs = _common_words_prompt(enc, context, rng)
        return TaskPrompt(task, context, depth, seed, tuple(ids), refs, -1, "", answer_tokens)
    if task == "variable_tracking":
        needles, question, refs = _variable_tracking(rng, depth)
    else:
        needles, question, refs = _niah(task, rng, depth)
    ids, at, before, filler = _assemble(enc, sentences, context, INTRO, needles, question, rng)
    return TaskPrompt(
        task, context, depth, seed, tuple(ids), tuple(refs), at, needles[0][1], answer_tokens,
        before, filler,
    )  # fmt: skip


def task_prompts(
    tokenizer: Any,
    tasks: Sequence[str],
    contexts: Sequence[int],
    depths: Sequence[float],
    seeds: int,
    haystack: str,
) -> list[TaskPrompt]:
    """Every (task, context, depth, seed) prompt. common_words has no depth: as many lists as
    every other task has prompts (seeds 0 to seeds x depths - 1, at depth 0.5)."""
    if seeds < 1:
        raise ValueError(f"seeds={seeds} is out of range: must be >= 1")
    sentences, enc = haystack_sentences(haystack), Encoder(tokenizer)
    out = []
    for task in tasks:
        cells = [(depth, seed) for seed in range(seeds) for depth in depths]
        if task == "common_words":
            cells = [(0.5, seed) for seed in range(len(cells))]
        for context in contexts:
            for depth, seed in cells:
                out.append(make_prompt(tokenizer, task, context, depth, seed, sentences, enc))
    return out


# -- running and scoring ------------------------------------------------------------------------


def bench_tasks(
    model: nn.Module,
    tokenizer: Any,
    prompts: Sequence[TaskPrompt],
    *,
    codebook: Any,
    config: A2ATSConfig | None = None,
    methods: Sequence[str] = DEFAULT_METHODS,
    progress: Progress | None = None,
    journal: Path | None = None,
    setup: Mapping[str, Any] | None = None,
) -> list[TaskTrial]:
    """Every method's greedy answer to every prompt, scored (see the module docstring).

    journal: a JSON-lines file of finished trials: a prompt runs only the methods it lacks
    there (a method added to a finished run costs that method alone), and each prompt's new
    trials are appended as soon as they are scored (a long run that stops part-way resumes
    where it stopped). Its first line is `setup` (what the answers
    depend on besides the prompt: model, codebook, retrieval settings; JSON values), and a
    journal written with another setup is refused rather than mixed in."""
    config = config or A2ATSConfig()
    unknown = [m for m in methods if m not in TASK_METHODS]
    if unknown:
        raise ValueError(f"unknown task method(s) {unknown}; known: {', '.join(TASK_METHODS)}")
    # the journal's trials by prompt and method (a prompt answered twice: its last answers)
    done: dict[tuple, dict[str, TaskTrial]] = {}
    if journal is not None:
        for t in open_journal(journal, dict(setup or {})):
            done.setdefault((t.task, t.context, t.depth, t.seed), {})[t.method] = t
    trials = []
    for i, p in enumerate(prompts):
        kept = done.get((p.task, p.context, p.depth, p.seed), {})
        missing = [m for m in methods if m not in kept]  # only these run (answers are greedy)
        if missing:
            if progress is not None:
                progress(f"{p.task} {p.context} depth {p.depth} seed {p.seed}", i, len(prompts))
            answers = answer_with_methods(
                model, p.ids, missing, codebook=codebook, config=config,
                answer_tokens=p.answer_tokens,
            )  # fmt: skip
            for name, (tokens, _) in answers.items():
                answer = tokenizer.decode(tokens)
                kept[name] = TaskTrial(p.task, p.context, p.depth, p.seed, name, answer,
                                       score_answer(answer, p.references))  # fmt: skip
            if journal is not None:
                with journal.open("a", encoding="utf-8") as f:
                    f.writelines(json.dumps(vars(kept[m])) + "\n" for m in missing)
        trials += [kept[m] for m in methods]
    if progress is not None:
        progress("tasks", len(prompts), len(prompts))
    return trials


JOURNAL_MAX_BYTES = 64 << 20  # far more than any run's trials


def open_journal(path: Path, setup: dict[str, Any]) -> list[TaskTrial]:
    """The trials already in the journal at `path`, after checking that it was written with
    `setup`; a journal that does not exist or is empty is started with `setup` as its first line.
    A journal of another setup, or one without a setup line, is an error naming the file and
    the first setting that differs (its answers would be mixed with this run's)."""
    if not path.exists() or path.stat().st_size == 0:
        path.write_text(json.dumps({"setup": setup}) + "\n", encoding="utf-8")
        return []
    found, trials, whole = read_journal(path)
    if found is None:
        raise ValueError(
            f"task journal {path}: no setup line (the model, codebook and settings it was "
            "written with), so it cannot be resumed safely; start a new --journal file"
        )
    if found != setup:
        key = sorted(k for k in {*found, *setup} if found.get(k) != setup.get(k))[0]
        raise ValueError(
            f"task journal {path} was written with another setup: {key} "
            f"{found.get(key)!r} there, {setup.get(key)!r} now; start a new --journal file"
        )
    with path.open("rb+") as f:  # a killed run's half-written last line: cut, answered again
        f.truncate(whole)
        f.seek(whole - 1)
        if f.read(1) != b"\n":  # a whole last line without its newline: end it
            f.write(b"\n")
    return trials


def read_journal(path: Path) -> tuple[dict[str, Any] | None, list[TaskTrial], int]:
    """(setup, trials, bytes of whole lines) of a `bench_tasks` journal; setup is None for a
    journal without a setup line (hostile until parsed: size bounded, every field type-checked;
    a bad line is an error naming the file and line, except a last line without its newline that
    is not JSON: a run killed while writing it, left out of the trials and the byte count)."""
    if path.stat().st_size > JOURNAL_MAX_BYTES:
        raise ValueError(f"task journal {path}: larger than {JOURNAL_MAX_BYTES} bytes")
    types = {"task": str, "context": int, "depth": (int, float), "seed": int, "method": str,
             "answer": str, "score": (int, float)}  # fmt: skip
    setup, trials, whole = None, [], 0
    with path.open("rb") as f:
        for n, raw in enumerate(f, 1):
            try:
                row = json.loads(raw.decode("utf-8"))
            except (UnicodeDecodeError, ValueError) as exc:
                if n > 1 and not raw.endswith(b"\n"):
                    break  # torn last line
                raise ValueError(f"task journal {path}, line {n}: not JSON ({exc})") from None
            whole += len(raw)
            if n == 1 and isinstance(row, dict) and set(row) == {"setup"}:
                if not isinstance(row["setup"], dict):
                    raise ValueError(f"task journal {path}, line 1: setup is not an object")
                setup = row["setup"]
                continue
            if (
                not isinstance(row, dict)
                or set(row) != set(types)
                or not all(
                    isinstance(row[k], t) and not isinstance(row[k], bool) for k, t in types.items()
                )
            ):
                raise ValueError(f"task journal {path}, line {n}: not a task trial")
            trials.append(TaskTrial(**{**row, "depth": float(row["depth"]),
                                       "score": float(row["score"])}))  # fmt: skip
    return setup, trials, whole


def summarize(trials: Sequence[TaskTrial]) -> list[dict[str, Any]]:
    """[{"task", "context", "method", "score", "n"}]: mean score over depths and seeds."""
    groups: dict[tuple[str, int, str], list[float]] = {}
    for t in trials:
        groups.setdefault((t.task, t.context, t.method), []).append(t.score)
    return [
        {
            "task": task,
            "context": context,
            "method": method,
            "score": round(sum(v) / len(v), 4),
            "n": len(v),
        }  # fmt: skip
        for (task, context, method), v in groups.items()
    ]


def relative_to_full(trials: Sequence[TaskTrial]) -> list[dict[str, Any]]:
    """Per (task, context, method): the score as a share of `full`'s (None where full scored 0)
    with its 95% interval (`paired_ratio_ci`: prompts resampled, the same prompts for both),
    and `agrees_with_full`, the share of prompts whose answer is the same text as full's."""
    full = {(t.task, t.context, t.depth, t.seed): t for t in trials if t.method == "full"}
    if not full:
        return []
    rows = []
    for row in summarize(trials):
        mine = [
            t for t in trials
            if (t.task, t.context, t.method) == (row["task"], row["context"], row["method"])
        ]  # fmt: skip
        refs = [full[(t.task, t.context, t.depth, t.seed)] for t in mine]
        full_score = sum(r.score for r in refs) / len(refs)
        agree = sum(t.answer == r.answer for t, r in zip(mine, refs, strict=True)) / len(mine)
        ci = paired_ratio_ci([t.score for t in mine], [r.score for r in refs])
        rows.append(
            {
                "task": row["task"],
                "context": row["context"],
                "method": row["method"],
                "score_vs_full": round(row["score"] / full_score, 4) if full_score else None,
                "score_vs_full_ci95": None if ci is None else [_finite(v) for v in ci],
                "agrees_with_full": round(agree, 4),
                "n": row["n"],
            }
        )
    return rows


def _finite(value: float) -> float | None:
    """A bound for JSON: rounded, or None for an unbounded one (strict JSON has no inf)."""
    return round(value, 4) if np.isfinite(value) else None


def paired_ratio_ci(
    scores: Sequence[float], full: Sequence[float], resamples: int = 2000, seed: int = 0
) -> tuple[float, float] | None:
    """95% percentile interval of mean(scores) / mean(full) over prompts drawn with replacement
    (each draw keeps a prompt's two scores together). None where full scored 0 on every prompt;
    a resample whose full mean is 0 counts as the ratio 1 when both means are 0, else as
    infinitely far (it widens the interval rather than being dropped)."""
    a = np.asarray(scores, dtype=np.float64)
    b = np.asarray(full, dtype=np.float64)
    if a.shape != b.shape or a.ndim != 1 or not a.size:
        raise ValueError(f"need as many scores as full scores, got {a.shape} and {b.shape}")
    if not b.any():
        return None
    rng = np.random.default_rng(seed)
    index = rng.integers(0, a.size, size=(resamples, a.size))
    num, den = a[index].mean(axis=1), b[index].mean(axis=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where(den > 0, num / np.where(den > 0, den, 1.0), np.where(num > 0, np.inf, 1.0))
    low, high = np.quantile(ratio, [0.025, 0.975], method="inverted_cdf")  # inf-safe
    return float(low), float(high)
