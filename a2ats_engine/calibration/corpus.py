"""Calibration text: a built-in corpus that needs no network, and user text files.

The built-in corpus mixes four kinds of text, so the codebook sees the keys a chat model meets:
- prose: the Python language reference topics that ship with Python (`pydoc_data.topics`);
- code and its documentation: source files of pure-Python standard library modules (read as
  text, never imported);
- random UUID lines (as the A2ATS paper does, so codes also cover non-prose keys);
- chat turns built from the prose and rendered through the model's own chat template.

Everything is deterministic for a seed and a Python version.
"""

from __future__ import annotations

import importlib.util
import json
import random
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

# Pure-Python stdlib modules with plenty of docstrings; read as source text only.
STDLIB_MODULES = (
    "argparse", "bisect", "calendar", "collections", "configparser", "csv", "dataclasses",
    "datetime", "difflib", "enum", "fractions", "functools", "gettext", "heapq", "inspect",
    "ipaddress", "json.decoder", "json.encoder", "logging", "pathlib", "pprint", "queue",
    "random", "shutil", "statistics", "string", "tempfile", "textwrap", "threading",
    "tokenize", "typing", "unittest.case", "urllib.parse", "uuid", "zipfile",
)  # fmt: skip

# Share of characters per source in the mixed stream (chat turns take prose as content).
MIX = {"prose": 0.45, "code": 0.30, "chat": 0.15, "uuid": 0.10}
PIECE_CHARS = 2000

_QUESTIONS = (
    "Can you explain this part of the Python documentation?",
    "Summarize the following text in plain words.",
    "What does this mean?",
    "Please rewrite this more simply.",
    "I found this in the docs. Is it right?",
)


def builtin_description() -> str:
    """One line describing the built-in corpus (stored in codebook metadata)."""
    return (
        "built-in: Python language reference prose, stdlib source and docstrings, "
        "chat turns through the model's template, random UUID lines"
    )


def builtin_corpus(tokenizer: Any = None, *, seed: int = 0, chars: int = 400_000) -> list[str]:
    """About `chars` characters of mixed calibration text as a list of documents (strings).

    The sources are interleaved piece by piece (pieces of about PIECE_CHARS characters) in the
    shares of MIX, so any prefix of the list is already a mix. `tokenizer` (an mlx-lm
    TokenizerWrapper or HF tokenizer) renders the chat turns; without one a plain
    "User:/Assistant:" layout is used.
    """
    rng = random.Random(seed)
    sources = {
        "prose": _pieces(_prose_texts(rng)),
        "code": _pieces(_code_texts(rng)),
        "chat": _chat_texts(tokenizer, rng),
        "uuid": _uuid_texts(rng),
    }
    produced = dict.fromkeys(MIX, 0)
    out: list[str] = []
    total = 0
    while total < chars and sources:
        # Next piece from the source furthest below its share.
        name = min(sources, key=lambda s: produced[s] / MIX[s])
        piece = next(sources[name], None)
        if piece is None:
            del sources[name]
            continue
        out.append(piece)
        produced[name] += len(piece)
        total += len(piece)
    return out


def _pieces(texts: Iterator[str]) -> Iterator[str]:
    """Split texts at paragraph breaks into pieces of about PIECE_CHARS characters."""
    for text in texts:
        piece: list[str] = []
        size = 0
        for para in text.split("\n\n"):
            piece.append(para)
            size += len(para) + 2
            if size >= PIECE_CHARS:
                yield "\n\n".join(piece)
                piece, size = [], 0
        if piece and size > 200:
            yield "\n\n".join(piece)


def _prose_texts(rng: random.Random) -> Iterator[str]:
    try:
        from pydoc_data.topics import topics
    except ImportError:  # some embedded Pythons strip pydoc_data
        return iter(())
    names = sorted(topics)
    rng.shuffle(names)
    return (topics[name] for name in names)


def _code_texts(rng: random.Random) -> Iterator[str]:
    names = list(STDLIB_MODULES)
    rng.shuffle(names)
    for name in names:
        try:
            spec = importlib.util.find_spec(name)
        except (ImportError, ValueError):
            continue
        origin = getattr(spec, "origin", None)
        if origin and origin.endswith(".py") and Path(origin).is_file():
            yield Path(origin).read_text(encoding="utf-8", errors="replace")
        elif spec is not None and spec.loader is not None:
            # Frozen app bundles keep some stdlib modules in an archive: ask the loader.
            try:
                source = spec.loader.get_source(name)
            except (ImportError, OSError, AttributeError):
                source = None
            if source:
                yield source


def _chat_texts(tokenizer: Any, rng: random.Random) -> Iterator[str]:
    prose = list(_pieces(_prose_texts(random.Random(rng.random()))))
    rng.shuffle(prose)
    for i in range(0, len(prose) - 1, 2):
        question, answer = prose[i][: PIECE_CHARS // 2], prose[i + 1][: PIECE_CHARS // 2]
        messages = [
            {"role": "user", "content": f"{rng.choice(_QUESTIONS)}\n\n{question}"},
            {"role": "assistant", "content": answer},
        ]
        yield render_chat(messages, tokenizer)


def _uuid_texts(rng: random.Random) -> Iterator[str]:
    while True:
        lines = []
        for _ in range(24):
            ident = uuid.UUID(int=rng.getrandbits(128), version=4)
            key = uuid.UUID(int=rng.getrandbits(128), version=4)
            lines.append(f"{ident}: {key}")
        yield "\n".join(lines)


def render_chat(messages: Sequence[dict[str, str]], tokenizer: Any = None) -> str:
    """A conversation as text, through the tokenizer's chat template when it has one."""
    template = getattr(tokenizer, "apply_chat_template", None) if tokenizer is not None else None
    has_template = bool(getattr(tokenizer, "chat_template", None)) if tokenizer else False
    if template is not None and has_template:
        try:
            return template(list(messages), tokenize=False, add_generation_prompt=False)
        except Exception:  # templates that reject a role order: fall back to the plain layout
            pass
    return "\n".join(f"{m['role'].capitalize()}: {m['content']}" for m in messages) + "\n"


def load_texts(paths: Sequence[str | Path], tokenizer: Any = None) -> list[str]:
    """Read user calibration files: `.txt` / `.md` as text, `.jsonl` as chat conversations.

    A `.jsonl` line may be `{"messages": [...]}` or a list of messages (one conversation each),
    a single `{"role", "content"}` message (consecutive ones form one conversation), or
    `{"text": "..."}`. Conversations are rendered through the tokenizer's chat template.
    ValueError names the file (and line) that cannot be used.
    """
    out: list[str] = []
    for raw in paths:
        path = Path(raw)
        if not path.is_file():
            raise ValueError(f"calibration text file not found: {path}")
        suffix = path.suffix.lower()
        text = path.read_text(encoding="utf-8", errors="replace")
        if suffix in (".txt", ".md", ".markdown", ".rst"):
            if text.strip():
                out.append(text)
        elif suffix == ".jsonl":
            out.extend(_jsonl_texts(path, text, tokenizer))
        else:
            raise ValueError(
                f"calibration text file {path.name}: unsupported type {suffix!r} "
                "(use .txt, .md or .jsonl)"
            )
    if not out:
        raise ValueError("the calibration text files contain no text")
    return out


def _jsonl_texts(path: Path, text: str, tokenizer: Any) -> list[str]:
    out: list[str] = []
    pending: list[dict[str, str]] = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            item = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path.name} line {number}: not JSON ({exc.msg})") from None
        if isinstance(item, dict) and "role" in item and "content" in item:
            pending.append(_message(item, path, number))
            continue
        if pending:
            out.append(render_chat(pending, tokenizer))
            pending = []
        if isinstance(item, dict) and isinstance(item.get("text"), str):
            out.append(item["text"])
        elif isinstance(item, dict) and isinstance(item.get("messages"), list):
            out.append(
                render_chat([_message(m, path, number) for m in item["messages"]], tokenizer)
            )
        elif isinstance(item, list):
            out.append(render_chat([_message(m, path, number) for m in item], tokenizer))
        else:
            raise ValueError(
                f"{path.name} line {number}: expected {{'messages': [...]}}, a list of "
                "messages, a {'role', 'content'} message or {'text': ...}"
            )
    if pending:
        out.append(render_chat(pending, tokenizer))
    return out


def _message(item: Any, path: Path, number: int) -> dict[str, str]:
    if not (
        isinstance(item, dict)
        and isinstance(item.get("role"), str)
        and isinstance(item.get("content"), str)
    ):
        raise ValueError(f"{path.name} line {number}: a message needs string 'role' and 'content'")
    return {"role": item["role"], "content": item["content"]}
