"""Conversation history: one JSON file per conversation under `<data dir>/conversations/`.

Every write is atomic (temp file + fsync + rename), so a crash mid-write keeps the previous
version. Assistant messages carry `provenance`: the model, cache settings, codebook hash,
sampling and generation stats that produced them. Conversations export to Markdown or JSON.
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from .app_dirs import atomic_write_text, conversations_dir

FORMAT_VERSION = 1
DEFAULT_TITLE = "New chat"


@dataclass
class Message:
    """One chat turn. `provenance` is set on assistant messages (see module docstring)."""

    role: str  # "user" | "assistant"
    content: str
    created: float = field(default_factory=time.time)
    provenance: dict[str, Any] | None = None
    interrupted: bool = False  # a partial reply checkpointed while it streamed (app closed)

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
    def from_dict(cls, data: dict[str, Any]) -> Conversation:
        messages = [
            Message(
                role=str(m["role"]),
                content=str(m["content"]),
                created=float(m.get("created", 0.0)),
                provenance=m.get("provenance"),
                interrupted=m.get("interrupted") is True,
            )
            for m in data.get("messages", [])
        ]
        return cls(
            id=str(data["id"]),
            title=str(data.get("title", DEFAULT_TITLE)),
            system_prompt=str(data.get("system_prompt", "")),
            messages=messages,
            created=float(data.get("created", 0.0)),
            updated=float(data.get("updated", 0.0)),
            draft=draft if isinstance(draft := data.get("draft", ""), str) else "",
        )


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

    def path_for(self, conversation_id: str) -> Path:
        return self.folder / f"{conversation_id}.json"

    def load_all(self) -> list[Conversation]:
        """Every readable conversation, most recently updated first. Unreadable files are
        listed in `self.skipped` and left untouched on disk."""
        self.skipped = []
        conversations = []
        if not self.folder.exists():
            return conversations
        for path in sorted(self.folder.glob("*.json")):
            try:
                conversations.append(Conversation.from_dict(json.loads(path.read_text("utf-8"))))
            except (OSError, ValueError, KeyError, TypeError):
                self.skipped.append(path.name)
        conversations.sort(key=lambda c: c.updated, reverse=True)
        return conversations

    def save(self, conversation: Conversation) -> None:
        atomic_write_text(
            self.path_for(conversation.id),
            json.dumps(conversation.to_dict(), indent=1, ensure_ascii=False) + "\n",
        )

    def delete(self, conversation_id: str) -> None:
        self.path_for(conversation_id).unlink(missing_ok=True)


def export_json(conversation: Conversation) -> str:
    """The conversation with every message's provenance, as indented JSON."""
    return json.dumps(conversation.to_dict(), indent=2, ensure_ascii=False) + "\n"


def _provenance_lines(provenance: dict[str, Any]) -> list[str]:
    model = provenance.get("model", {})
    cache = provenance.get("cache", {})
    codebook = provenance.get("codebook") or {}
    stats = provenance.get("stats", {})
    cache_text = (
        "A2ATS " + json.dumps(cache.get("config", {}), sort_keys=True)
        if cache.get("a2ats_enabled")
        else "mlx-lm KVCache (A2ATS off)"
    )
    lines = [
        f"- model: {model.get('name', '?')} ({model.get('path', '?')})",
        f"- cache: {cache_text}",
        f"- codebook: {codebook.get('name', 'none')} sha256 {codebook.get('sha256', '-')}",
        f"- sampling: {json.dumps(provenance.get('sampling', {}), sort_keys=True)}",
    ]
    if stats:
        lines.append(
            "- stats: {gen} tokens, {tps:.1f} tok/s, TTFT {ttft:.3f} s, prompt {prompt} tokens, "
            "peak {peak:.2f} GB, cache {cache_bytes} bytes, stop: {stop}".format(
                gen=stats.get("generation_tokens", 0),
                tps=float(stats.get("generation_tps", 0.0)),
                ttft=float(stats.get("time_to_first_token", 0.0)),
                prompt=stats.get("prompt_tokens", 0),
                peak=float(stats.get("peak_memory_gb", 0.0)),
                cache_bytes=stats.get("cache_bytes", 0),
                stop=stats.get("stop_reason", "?"),
            )
        )
    return lines


def export_markdown(conversation: Conversation) -> str:
    """A readable Markdown transcript; each assistant reply is followed by its provenance."""
    out = [f"# {conversation.title}", ""]
    if conversation.system_prompt:
        out += ["**System prompt:**", "", conversation.system_prompt, ""]
    for message in conversation.messages:
        out += [f"## {message.role.capitalize()}", "", message.content, ""]
        if message.provenance:
            out += ["<details><summary>Provenance</summary>", ""]
            out += _provenance_lines(message.provenance)
            out += ["", "</details>", ""]
    return "\n".join(out).rstrip() + "\n"
