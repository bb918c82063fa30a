"""A reply's own bookkeeping, apart from the controller that routes it: what streamed in so
far, the copy a checkpoint writes, what the chat keeps when the reply ends (and what a
regenerate replaces), its provenance, and the versions of a chat's last reply.

No Qt: `ChatController` (controller.py) holds the `ReplyInProgress`, feeds it the worker's
events, saves and emits; everything here is plain data and tested through the controller.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field, replace

from a2ats_engine.cache.config import A2ATSConfig
from a2ats_engine.cache.telemetry import GenerationStats
from a2ats_engine.records import ModelInfo

from .backend import ContextFit
from .conversations import MAX_ALTERNATIVES, Conversation, Message
from .events import (
    CodebookLoaded,
    ContextOverflow,
    GenerationRequest,
    GenerationStarted,
    JsonDict,
    JsonValue,
    PrefillProgress,
    StopReason,
)

RANDOM_CODEBOOK_NOTE = (
    "No codebook: A2ATS retrieval uses a random one. Load or calibrate a codebook."
)
CHECKPOINT_SECONDS = 2.0  # a streaming reply is written to disk at least this often...
CHECKPOINT_TOKENS = 32  # ...or every this many tokens, whichever comes first
# A reply that ends for one of these reasons without text is not kept.
_NOT_KEPT = (StopReason.CANCELLED, StopReason.ERROR, StopReason.CONTEXT_FULL)


@dataclass
class ReplyInProgress:
    """The reply being produced: its request, where it goes, and what arrived so far.

    `replaces` is the old reply of a regenerate: it stays in the conversation (and on disk)
    until the new reply ends; a new reply with text takes its place and keeps it as an
    alternative, one without text (stopped, failed) leaves it where it was."""

    request: GenerationRequest
    conversation: Conversation
    message: Message
    replaces: Message | None = None
    before: list[Message] | None = None  # the chat's messages before the request changed them
    draft_back: str = ""  # what goes back into the composer if the user gives up the request
    started: GenerationStarted | None = None
    overflow: ContextOverflow | None = None
    text: str = ""
    prefill: PrefillProgress | None = None  # the prompt prefill's last progress
    error: str = ""
    tokens: int = 0
    started_at: float = field(default_factory=time.perf_counter)
    first_token_at: float = 0.0
    checkpoint_at: float = field(default_factory=time.perf_counter)
    checkpoint_tokens: int = 0

    def add_token(self, text: str, now: float) -> bool:
        """Count a streamed token; True when a checkpoint is due."""
        if self.tokens == 0:
            self.first_token_at = now
        self.tokens += 1
        self.text += text
        due = now - self.checkpoint_at >= CHECKPOINT_SECONDS
        return bool(self.text) and (
            due or self.tokens - self.checkpoint_tokens >= CHECKPOINT_TOKENS
        )

    def checkpoint(self, now: float) -> Conversation:
        """The chat as a checkpoint writes it: the partial reply marked interrupted (for a
        regenerate, the finished old reply stays the reply, the partial one beside it as an
        alternative). The next save (the finished reply) replaces it."""
        self.checkpoint_at, self.checkpoint_tokens = now, self.tokens
        partial = Message(
            "assistant",
            self.text,
            created=self.message.created,
            provenance=self.provenance(None),
            interrupted=True,
        )
        messages = list(self.conversation.messages)
        if self.replaces is not None and messages and messages[-1] is self.replaces:
            old = self.replaces
            messages[-1] = replace(old, alternatives=[*old.alternatives, partial])
        else:
            messages.append(partial)
        return replace(self.conversation, messages=messages)

    def finish(self, stats: GenerationStats) -> Message | None:
        """End the reply in its chat: the kept message (it took the old reply's place), or
        None when nothing was kept (the old reply of a regenerate, if any, stays)."""
        if not self.text and stats.stop_reason in _NOT_KEPT:
            return None
        old, message = self.replaces, self.message
        messages = self.conversation.messages
        self.replaces = None
        if old is not None:
            message.alternatives = [*old.alternatives, replace(old, alternatives=[])]
            del message.alternatives[:-MAX_ALTERNATIVES]
            if messages and messages[-1] is old:
                messages.pop()
        message.content = self.text
        message.provenance = self.provenance(stats)
        messages.append(message)
        return message

    def give_up(self) -> None:
        """The user gave up the request: the chat is as before it, the message back in the
        composer's draft."""
        if self.before is not None:
            self.conversation.messages[:] = self.before
            self.conversation.draft = self.draft_back or self.conversation.draft

    def provenance(self, stats: GenerationStats | None) -> JsonDict:
        provenance: JsonDict = dict(self.started.provenance) if self.started else {}
        if stats is not None:
            values = {k: v for k, v in asdict(stats).items() if k != "extra"}
            provenance["stats"] = {**jsonable(values), "extra": jsonable(stats.extra)}
        provenance["finished"] = time.time()
        return provenance


@dataclass(frozen=True)
class ReplyEnded:
    """A reply ended. `message` is the kept assistant message (None when nothing was kept);
    `restored` says the old reply of a regenerate is back."""

    conversation: Conversation
    message: Message | None
    stats: GenerationStats
    note: str = ""
    restored: bool = False


def jsonable(value: object) -> JsonValue:
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [jsonable(v) for v in value]
    if isinstance(value, bool | int | float | str) or value is None:
        return value
    return str(value)


def _by_time(messages: list[Message]) -> list[Message]:
    """Versions of a reply in the order they were written (a stable sort: ties keep order)."""
    return sorted(messages, key=lambda m: m.created)


def versions(conversation: Conversation | None) -> tuple[int, int]:
    """(number of the shown version, how many there are) of the chat's last reply: (1, 1)
    without alternatives, (0, 0) when the chat does not end with a reply. Versions are
    numbered by when they were written."""
    if conversation is None or not conversation.messages:
        return 0, 0
    last = conversation.messages[-1]
    if last.role != "assistant":
        return 0, 0
    ordered = _by_time([*last.alternatives, last])
    return ordered.index(last) + 1, len(ordered)


def show_version(conversation: Conversation | None, step: int) -> bool:
    """Make the version `step` away (-1 earlier, +1 later) the chat's last reply; the one shown
    becomes an alternative. False when there is no such version."""
    number, count = versions(conversation)
    target = number - 1 + step
    if conversation is None or not 0 <= target < count:
        return False
    last = conversation.messages[-1]
    ordered = _by_time([*last.alternatives, last])
    chosen = ordered[target]
    others = [replace(m, alternatives=[]) for m in ordered if m is not chosen]
    conversation.messages[-1] = replace(chosen, alternatives=others)
    return True


# ---- what the worker records about a request ------------------------------------------------
def empty_stats(stop_reason: StopReason, context_tokens: int = 0) -> GenerationStats:
    """The stats of a request that produced nothing (cancelled, failed, did not fit)."""
    return GenerationStats(
        prompt_tokens=0,
        generation_tokens=0,
        time_to_first_token=0.0,
        prompt_tps=0.0,
        generation_tps=0.0,
        peak_memory_gb=0.0,
        stop_reason=str(stop_reason),
        context_tokens=context_tokens,
    )


def fit_notes(fit: ContextFit) -> tuple[str, ...]:
    """What the user is told about how the reply was fitted into the context."""
    notes: tuple[str, ...] = ()
    if fit.dropped:
        notes += (f"Left the {fit.dropped} oldest messages out so the reply fits the context.",)
    if fit.cut:
        notes += (f"The reply stops at the context limit ({fit.max_tokens:,} tokens at most).",)
    return notes


def request_provenance(
    request: GenerationRequest,
    config: A2ATSConfig | None,
    *,
    source: str,
    info: ModelInfo | None,
    codebook: CodebookLoaded | None,
) -> JsonDict:
    """Model, cache settings, codebook, sampling and system prompt a reply was made with."""
    model: JsonDict = {"source": source}
    if info is not None:
        model.update(
            name=info.name,
            path=info.path,
            architecture=info.architecture,
            quantization=info.quantization,
        )
    cache: JsonDict = {"a2ats_enabled": bool(request.cache.a2ats_enabled)}
    if config is not None:
        cache["config"] = config.to_dict()
    if codebook is not None:
        described: JsonDict | None = codebook.provenance()
    elif request.cache.a2ats_enabled:
        described = {"name": "random (uncalibrated)", "sha256": None}
    else:
        described = None
    return {
        "model": model,
        "cache": cache,
        "codebook": described,
        "sampling": asdict(request.sampling),
        "system_prompt": request.system_prompt,
    }
