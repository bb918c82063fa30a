"""Conversation history: one JSON file per conversation under `<data dir>/conversations/`.

Every write is atomic (temp file + fsync + rename), so a crash mid-write keeps the previous
version. Assistant messages carry `provenance`: the model, cache settings, codebook hash,
sampling and generation stats that produced them. Conversations export to Markdown or JSON.

Chat files are untrusted input. A file's name is `<id>.json` where the id matches `ID_PATTERN`
(letters, digits, `-`, `_`): the store derives every path from a validated id, and a loaded
conversation takes its id from its file name, never from the file's content. Every field is
parsed defensively: a value of the wrong type falls back to the field's default, a message
without a valid role and text is dropped, and a file that is not a JSON object is skipped.
"""

from __future__ import annotations

import json
import math
import re
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from .app_dirs import atomic_write_text, conversations_dir, remove_stale_temp_files
from .markdown_escape import escape_plain, inert_markdown
from .untrusted_json import clean_json, read_json

FORMAT_VERSION = 1
DEFAULT_TITLE = "New chat"
ID_PATTERN = re.compile(r"[A-Za-z0-9_-]{1,64}")
ROLES = ("user", "assistant")
MAX_CHAT_FILE_BYTES = 256 << 20  # a larger chat file is skipped, never read into memory


def is_valid_id(conversation_id: object) -> bool:
    """True when `conversation_id` can name a chat file (no dots, slashes or other characters)."""
    return isinstance(conversation_id, str) and ID_PATTERN.fullmatch(conversation_id) is not None


def number(value: object, default: float = 0.0) -> float:
    """`value` as a finite float, or `default` (for numbers read from chat files)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return default
    return float(value) if math.isfinite(value) else default


@dataclass
class Message:
    """One chat turn. `provenance` is set on assistant messages (see module docstring)."""

    role: str  # "user" | "assistant"
    content: str
    created: float = field(default_factory=time.time)
    provenance: dict[str, Any] | None = None
    interrupted: bool = False  # a partial reply checkpointed while it streamed (app closed)
    # Earlier (or interrupted) versions of this reply, oldest first: a regenerate keeps the
    # reply it replaces here, and a regenerate still streaming is checkpointed here.
    alternatives: list[Message] = field(default_factory=list)

    def as_chat(self) -> dict[str, str]:
        """The {"role", "content"} form the engine's ChatSession uses."""
        return {"role": self.role, "content": self.content}


@dataclass
class Conversation:
    """A titled list of messages with its own system prompt."""

    id: str = field(default_factory=lambda: uuid.uuid4().hex)
    title: str = DEFAULT_TITLE
    system_prompt: str = ""
    messages: list[Message] = field(default_factory=list)
    created: float = field(default_factory=time.time)
    updated: float = field(default_factory=time.time)
    draft: str = ""  # the composer's unsent text for this chat

    def chat_messages(self) -> list[dict[str, str]]:
        return [m.as_chat() for m in self.messages]

    def last_index(self, role: str) -> int | None:
        """Index of the last message with `role`, or None."""
        for i in range(len(self.messages) - 1, -1, -1):
            if self.messages[i].role == role:
                return i
        return None

    def touch(self) -> None:
        self.updated = time.time()

    def to_dict(self) -> dict[str, Any]:
        return {"format_version": FORMAT_VERSION, **asdict(self)}

    @classmethod
    def from_dict(cls, data: object, conversation_id: str | None = None) -> Conversation:
        """Parse a chat file's JSON defensively (see the module docstring). `conversation_id`
        (the file name's) wins over the id inside `data`. ValueError when `data` is not an
        object or no valid id is known."""
        if not isinstance(data, dict):
            raise ValueError(f"a conversation must be a JSON object, not {type(data).__name__}")
        chosen = conversation_id if conversation_id is not None else data.get("id")
        if not is_valid_id(chosen):
            raise ValueError(f"invalid conversation id {chosen!r}")
        raw_messages = data.get("messages")
        messages = [
            message
            for message in map(
                _parse_message, raw_messages if isinstance(raw_messages, list) else []
            )
            if message is not None
        ]
        return cls(id=chosen, messages=messages, **_read_fields(data, _CONVERSATION_FIELDS))


# ----- defensive parsing of chat files ------------------------------------------------------
# Each reader returns the parsed value or _BAD; a _BAD or missing field takes the dataclass's
# default. A new optional field is one line in _MESSAGE_FIELDS / _CONVERSATION_FIELDS.

_BAD = object()


def _text(value: object) -> object:
    return value if isinstance(value, str) else _BAD


def _flag(value: object) -> object:
    return value if isinstance(value, bool) else _BAD


MAX_TIMESTAMP = 32_503_680_000.0  # year 3000: beyond it `time.localtime` may overflow


def _timestamp(value: object) -> object:
    parsed = number(value, default=math.nan)
    return parsed if 0.0 <= parsed <= MAX_TIMESTAMP else _BAD


_PROVENANCE_OBJECTS = ("model", "cache", "codebook", "sampling", "stats")


def _provenance(value: object) -> object:
    """A provenance dict whose known sections are objects (others dropped), or None."""
    if not isinstance(value, dict):
        return None
    clean = {k: v for k, v in value.items() if k not in _PROVENANCE_OBJECTS or isinstance(v, dict)}
    cache = clean.get("cache")
    if cache is not None and "config" in cache and not isinstance(cache["config"], dict):
        clean["cache"] = {k: v for k, v in cache.items() if k != "config"}
    return clean


MAX_ALTERNATIVES = 8  # versions kept per reply (the oldest go first)


def _alternatives(value: object) -> object:
    """Earlier versions of a reply: assistant messages without versions of their own."""
    if not isinstance(value, list):
        return _BAD
    parsed = [_parse_message(item, nested=False) for item in value[-MAX_ALTERNATIVES:]]
    return [m for m in parsed if m is not None and m.role == "assistant"]


_MESSAGE_FIELDS: dict[str, Callable[[object], object]] = {
    "created": _timestamp,
    "provenance": _provenance,
    "interrupted": _flag,
    "alternatives": _alternatives,
}
_CONVERSATION_FIELDS: dict[str, Callable[[object], object]] = {
    "title": _text,
    "system_prompt": _text,
    "created": _timestamp,
    "updated": _timestamp,
    "draft": _text,
}


def _read_fields(data: dict, readers: dict[str, Callable[[object], object]]) -> dict[str, Any]:
    values = {}
    for name, reader in readers.items():
        if name in data:
            value = reader(data[name])
            if value is not _BAD:
                values[name] = value
    return values


def _parse_message(data: object, nested: bool = True) -> Message | None:
    """A message, or None when it has no valid role and text (it is dropped). `nested` False:
    an alternative, whose own alternatives are ignored."""
    if not isinstance(data, dict):
        return None
    role, content = data.get("role"), data.get("content")
    if role not in ROLES or not isinstance(content, str):
        return None
    fields = _read_fields(data, _MESSAGE_FIELDS if nested else _ALTERNATIVE_FIELDS)
    return Message(role=role, content=content, **fields)


_ALTERNATIVE_FIELDS = {k: v for k, v in _MESSAGE_FIELDS.items() if k != "alternatives"}


def title_from_text(text: str, limit: int = 48) -> str:
    """A short title from the first user message (first line, trimmed)."""
    line = " ".join(text.strip().split())
    if not line:
        return DEFAULT_TITLE
    return line if len(line) <= limit else line[: limit - 1].rstrip() + "\u2026"


class HistoryStore:
    """Loads, saves and deletes conversations in one folder (default: the data dir's)."""

    def __init__(self, folder: Path | None = None) -> None:
        self.folder = Path(folder) if folder is not None else conversations_dir()
        self.skipped: list[str] = []  # files that could not be read on the last load_all
        self.reasons: dict[str, str] = {}  # why, per skipped file (one line each)
        self._fingerprints: dict[str, str] = {}  # what each chat file holds, bar `updated`

    def path_for(self, conversation_id: str) -> Path:
        """The file of a conversation; ValueError unless `conversation_id` is a valid id."""
        if not is_valid_id(conversation_id):
            raise ValueError(f"invalid conversation id {conversation_id!r}")
        return self.folder / f"{conversation_id}.json"

    def load_all(self) -> list[Conversation]:
        """Every readable conversation, most recently updated first. Unreadable files (not
        JSON, not an object, a name that is not a valid id) are listed in `self.skipped` and left
        untouched on disk. Lone surrogates in a file's strings become U+FFFD (the chat stays
        savable)."""
        self.skipped, self.reasons = [], {}
        conversations = []
        if not self.folder.is_dir():
            return conversations
        remove_stale_temp_files(self.folder)
        for path in sorted(self.folder.glob("*.json")):
            try:
                data = clean_json(read_json(path, MAX_CHAT_FILE_BYTES))
                loaded = Conversation.from_dict(data, conversation_id=path.stem)
                self._fingerprints[loaded.id] = _fingerprint(loaded)
                conversations.append(loaded)
            except (OSError, ValueError, RecursionError) as exc:
                self.skipped.append(path.name)
                self.reasons[path.name] = str(exc).splitlines()[0] if str(exc) else "unreadable"
        conversations.sort(key=lambda c: c.updated, reverse=True)
        return conversations

    def changed(self, conversation: Conversation) -> bool:
        """False when the chat's file already holds `conversation` (its `updated` aside), as
        this store last read or wrote it: nothing to write."""
        return self._fingerprints.get(conversation.id) != _fingerprint(conversation)

    def save(self, conversation: Conversation) -> None:
        atomic_write_text(
            self.path_for(conversation.id),
            json.dumps(conversation.to_dict(), indent=1, ensure_ascii=False) + "\n",
        )
        self._fingerprints[conversation.id] = _fingerprint(conversation)

    def delete(self, conversation_id: str) -> None:
        self.path_for(conversation_id).unlink(missing_ok=True)
        self._fingerprints.pop(conversation_id, None)


def _fingerprint(conversation: Conversation) -> str:
    data = conversation.to_dict()
    data.pop("updated")
    return json.dumps(data, ensure_ascii=False, sort_keys=True, default=str)


def export_json(conversation: Conversation) -> str:
    """The conversation with every message's provenance, as indented JSON."""
    return json.dumps(conversation.to_dict(), indent=2, ensure_ascii=False) + "\n"


def _count(value: object) -> int:
    """A non-negative step count read from a chat file (anything else: 0)."""
    return int(value) if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def attention_label(provenance: dict[str, Any] | None) -> str:
    """How a reply attended, in a few words: "KVCache" (A2ATS off), "A2ATS (exact)" when the
    A2ATS layers attended exactly on every step (a context below the crossover: nothing was
    retrieved), "A2ATS (retrieved 40 of 64 steps)" when only some steps retrieved, and "A2ATS"
    when every step retrieved or the file does not say (replies saved before steps were kept)."""
    provenance = _provenance(provenance) or {}
    cache = provenance.get("cache", {})
    if not cache.get("a2ats_enabled"):
        return "KVCache"
    stats = provenance.get("stats", {})
    extra = stats.get("extra") if isinstance(stats.get("extra"), dict) else {}
    retrieved = _count(extra.get("a2ats_retrieved_steps"))
    exact = _count(extra.get("a2ats_exact_steps"))
    if exact and not retrieved:
        return "A2ATS (exact)"
    if exact and retrieved:
        return f"A2ATS (retrieved {retrieved} of {retrieved + exact} steps)"
    return "A2ATS"


def _provenance_lines(provenance: dict[str, Any]) -> list[str]:
    provenance = _provenance(provenance) or {}
    model = provenance.get("model", {})
    cache = provenance.get("cache", {})
    codebook = provenance.get("codebook") or {}
    stats = provenance.get("stats", {})
    cache_text = (
        attention_label(provenance) + " " + json.dumps(cache.get("config", {}), sort_keys=True)
        if cache.get("a2ats_enabled")
        else "mlx-lm KVCache (A2ATS off)"
    )
    plain = escape_plain
    lines = [
        f"- model: {plain(str(model.get('name', '?')))} ({plain(str(model.get('path', '?')))})",
        f"- cache: {plain(cache_text)}",
        f"- codebook: {plain(str(codebook.get('name', 'none')))} "
        f"sha256 {plain(str(codebook.get('sha256', '-')))}",
        f"- sampling: {plain(json.dumps(provenance.get('sampling', {}), sort_keys=True))}",
    ]
    if stats:
        lines.append(
            "- stats: {gen} tokens, {tps:.1f} tok/s, TTFT {ttft:.3f} s, prompt {prompt} tokens, "
            "peak {peak:.2f} GB, cache {cache_bytes} bytes, stop: {stop}".format(
                gen=plain(str(stats.get("generation_tokens", 0))),
                tps=number(stats.get("generation_tps")),
                ttft=number(stats.get("time_to_first_token")),
                prompt=plain(str(stats.get("prompt_tokens", 0))),
                peak=number(stats.get("peak_memory_gb")),
                cache_bytes=plain(str(stats.get("cache_bytes", 0))),
                stop=plain(str(stats.get("stop_reason", "?"))),
            )
        )
    return lines


def export_markdown(conversation: Conversation) -> str:
    """A readable Markdown transcript; each assistant reply is followed by its provenance.
    Chat text keeps its Markdown but nothing a viewer would load, run or follow
    (`markdown_escape`); titles and provenance are plain text."""
    out = [f"# {escape_plain(conversation.title)}", ""]
    if conversation.system_prompt:
        out += ["**System prompt:**", "", inert_markdown(conversation.system_prompt), ""]
    for message in conversation.messages:
        out += [f"## {message.role.capitalize()}", "", inert_markdown(message.content), ""]
        if message.provenance:
            out += ["<details><summary>Provenance</summary>", ""]
            out += _provenance_lines(message.provenance)
            out += ["", "</details>", ""]
    return "\n".join(out).rstrip() + "\n"
