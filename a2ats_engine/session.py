"""ChatSession: multi-turn streaming chat over an mlx-lm model with prompt-cache reuse.

The session keeps one prompt cache (a list with one cache object per layer, from a pluggable
factory: mlx-lm's `KVCache` by default, A2ATS caches when an `A2ATSConfig` is given) and the exact
token ids that cache holds. Each reply renders the whole conversation with the tokenizer's chat
template, keeps the longest common prefix of the cached ids, trims the cache back to it and
prefills only the rest. `regenerate()` and `edit_last_user_message()` therefore trim instead of
recomputing, and a cancelled reply leaves the cache consistent with its token list.

Events streamed by `send()` and friends: `TokenEvent` per generated token, `CacheSnapshot` after
each decode step when the caches record telemetry, and one `GenerationStats` last.

A turn driven from outside (the app's worker) is three calls: `configure(...)` (system prompt,
sampling, cache, conversation; only what differs changes), `fit(mode, text, ...)` (the prompt
and max tokens against the context, by an overflow policy) and `reply(mode, text)`; the turn's
rules (the conversation a reply answers, fitting, rendering) live in chat_turn.py.
"""

from __future__ import annotations

import copy
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from typing import Any

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.generate import stream_generate
from mlx_lm.models.cache import can_trim_prompt_cache, make_prompt_cache, trim_prompt_cache

from .cache.config import A2ATSConfig
from .cache.model_cache import (
    attention_steps,
    cache_nbytes,
    make_cache,
    model_codebook_bytes,
    snapshot,
)
from .cache.telemetry import CacheSnapshot, GenerationStats, TokenEvent
from .chat_turn import (
    ContextFit,
    OverflowPolicy,
    ReplyMode,
    after_turn,
    fit_turn,
    last_user_index,
    render_prompt,
)
from .progress import Progress
from .records import SamplingSettings

CacheFactory = Callable[[nn.Module], list]
Event = TokenEvent | CacheSnapshot | GenerationStats
ROLES = ("system", "user", "assistant")


def resolve_cache_factory(
    factory: CacheFactory | None = None,
    *,
    a2ats: A2ATSConfig | None = None,
    codebook: Any | None = None,
) -> CacheFactory:
    """The cache factory to use: `factory`, A2ATS caches from (a2ats, codebook), or mlx-lm's default.

    A codebook without a config uses the default `A2ATSConfig()`.
    """
    if factory is not None and (a2ats is not None or codebook is not None):
        raise ValueError("pass either a cache factory or an A2ATS config/codebook, not both")
    if a2ats is None and codebook is None:
        return factory if factory is not None else make_prompt_cache
    config = a2ats if a2ats is not None else A2ATSConfig()

    def a2ats_factory(model: nn.Module) -> list:
        return make_cache(model, config, codebook)

    a2ats_factory.a2ats_config = config  # type: ignore[attr-defined]  (for display / tests)
    a2ats_factory.codebook = codebook  # type: ignore[attr-defined]  (saved caches check it)
    return a2ats_factory


def vocab_rows(model: Any) -> int | None:
    """Rows of the model's input embedding table (None when it has no recognisable one)."""
    import mlx.nn as nn

    for _, module in model.named_modules():
        if isinstance(module, (nn.Embedding, nn.QuantizedEmbedding)):
            return int(module.weight.shape[0])
    return None


def check_token_ids(rows: int | None, ids: list[int]) -> None:
    """ValueError when a token id lies outside an embedding table of `rows` rows (`vocab_rows`).

    MLX does not bounds-check gathers: such an id would silently read memory past the table.
    It means the tokenizer does not belong to the model.
    """
    if rows is None or not ids:
        return
    low, high = min(ids), max(ids)
    if low < 0 or high >= rows:
        bad = high if high >= rows else low
        raise ValueError(
            f"token id {bad} is outside the model's vocabulary (embedding rows 0-{rows - 1}): "
            "the tokenizer does not match the model"
        )


def common_prefix(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


def _close_caches(caches: list | None) -> None:
    """Free what caches hold outside the arrays (an A2ATS cold tier's file)."""
    for c in caches or []:
        close = getattr(c, "close", None)
        if callable(close):
            close()


def _cache_disk_bytes(caches: list | None) -> int:
    return int(sum(getattr(c, "disk_bytes", 0) for c in caches or []))


def _cache_nbytes(caches: list | None) -> int:
    return sum(cache_nbytes(c) for c in caches or [])


def _check_messages(messages: list[dict]) -> list[dict]:
    out = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or m.get("role") not in ROLES:
            raise ValueError(f"message {i} must be a dict with role in {ROLES}, got {m!r}")
        if not isinstance(m.get("content"), str):
            raise ValueError(f"message {i} content must be a string, got {m.get('content')!r}")
        out.append({"role": m["role"], "content": m["content"]})
    return out


class _PrefillCancelled(Exception):
    """Raised from the prefill progress callback to end a cancelled prefill between chunks."""


@dataclass
class _Reply:
    """Mutable record of one reply while it streams."""

    prompt_ids: list[int]
    start: int  # prompt tokens already in the cache (reused)
    trimmed: int = 0
    rebuilt: bool = False
    prefilled: int = 0  # new prompt tokens already in the cache (prefill progress)
    received: list[int] = field(default_factory=list)  # every id the stream fed (EOS included)
    reply_ids: list[int] = field(default_factory=list)  # ids of the reply text (no EOS)
    text: list[str] = field(default_factory=list)
    reason: str = "cancelled"
    t_start: float = 0.0
    ttft: float = 0.0
    prompt_tps: float = 0.0
    generation_tps: float = 0.0
    steps_before: tuple[int, int] = (0, 0)  # attention_steps(cache) when the reply began


class ChatSession:
    """A multi-turn conversation with one model, reusing its prompt cache across turns.

    model:          an mlx-lm model (nn.Module). tokenizer: mlx-lm's TokenizerWrapper.
    system_prompt:  optional system message rendered before the conversation.
    sampling:       SamplingSettings (default: temperature 0.7, 512 tokens).
    cache_factory:  model -> fresh prompt-cache list (default: mlx-lm's make_prompt_cache).
    a2ats/codebook: build A2ATS caches instead (`make_cache(model, a2ats, codebook)`).

    Generation methods return iterators; nothing happens until they are iterated. All MLX work
    runs in the iterating thread; `stop()` may be called from any thread.
    """

    def __init__(
        self,
        model: nn.Module,
        tokenizer: Any,
        *,
        system_prompt: str | None = None,
        sampling: SamplingSettings | None = None,
        cache_factory: CacheFactory | None = None,
        a2ats: A2ATSConfig | None = None,
        codebook: Any | None = None,
    ) -> None:
        self.model = model
        self._vocab_rows = vocab_rows(model)
        self.tokenizer = tokenizer
        self._system_prompt = system_prompt or None
        self._sampling = sampling if sampling is not None else SamplingSettings()
        self._factory = resolve_cache_factory(cache_factory, a2ats=a2ats, codebook=codebook)
        self._messages: list[dict] = []
        self._cache: list | None = None
        self._cache_ids: list[int] = []
        self._cache_stale = False
        self._stop = threading.Event()
        self._busy = threading.Lock()
        self.last_stats: GenerationStats | None = None
        # Tokens per prefill chunk; stop() is honoured between chunks, too.
        self.prefill_step_size = 2048
        # Optional progress(stage, done, total) callback, called with stage "prefill".
        self.prefill_progress: Progress | None = None

    # ----------------------------------------------------------------- state
    @property
    def messages(self) -> list[dict]:
        """A copy of the conversation: [{"role": "user"|"assistant", "content": str}, ...]."""
        return copy.deepcopy(self._messages)

    @property
    def system_prompt(self) -> str | None:
        return self._system_prompt

    @property
    def sampling(self) -> SamplingSettings:
        return self._sampling

    @property
    def caches(self) -> list | None:
        """The live prompt-cache list (one per layer), or None before the first reply."""
        return self._cache

    @property
    def cache_factory(self) -> CacheFactory:
        return self._factory

    @property
    def context_tokens(self) -> int:
        """Tokens currently held by the prompt cache."""
        return len(self._cache_ids)

    @property
    def cached_token_ids(self) -> list[int]:
        """A copy of the token ids the prompt cache holds, in order."""
        return list(self._cache_ids)

    @property
    def is_generating(self) -> bool:
        return self._busy.locked()

    def prompt_token_ids(self, messages: list[dict] | None = None) -> list[int]:
        """Rendered ids of `messages` (default: the conversation) plus the generation prompt."""
        msgs = self._messages if messages is None else _check_messages(messages)
        return render_prompt(self.tokenizer, msgs, self._system_prompt)

    # -------------------------------------------------------------- settings
    def set_system_prompt(self, text: str | None) -> None:
        """Takes effect on the next reply (the cache is trimmed to what still matches)."""
        if text is not None and not isinstance(text, str):
            raise ValueError(f"system prompt must be a string or None, got {text!r}")
        self._system_prompt = text or None

    def set_sampling(self, sampling: SamplingSettings) -> None:
        if not isinstance(sampling, SamplingSettings):
            raise ValueError(f"sampling must be a SamplingSettings, got {type(sampling).__name__}")
        self._sampling = sampling

    def set_cache_factory(
        self,
        factory: CacheFactory | None = None,
        *,
        a2ats: A2ATSConfig | None = None,
        codebook: Any | None = None,
    ) -> None:
        """Switch cache kind; the next reply rebuilds the cache from the whole conversation."""
        self._factory = resolve_cache_factory(factory, a2ats=a2ats, codebook=codebook)
        self._cache_stale = True

    def configure(
        self,
        *,
        system_prompt: str | None,
        sampling: SamplingSettings,
        a2ats: A2ATSConfig | None,
        codebook: Any | None,
        messages: list[dict] | None = None,
    ) -> None:
        """Set everything the next reply uses in one call, changing only what differs from what
        the session holds: the cache is rebuilt only when the A2ATS config (None = mlx-lm's
        KVCache) or the codebook (compared by identity) changed, the conversation is replaced
        only when `messages` (None = keep it) differs from it."""
        self._ensure_idle()
        codebook = codebook if a2ats is not None else None
        held = self._factory
        same = getattr(held, "a2ats_config", None) == a2ats and (
            getattr(held, "codebook", None) is codebook
        )
        if not same:
            self.set_cache_factory(a2ats=a2ats, codebook=codebook)
        self.set_sampling(sampling)
        self.set_system_prompt(system_prompt)
        if messages is not None and _check_messages(messages) != self._messages:
            self.load_messages(messages)

    def fit(
        self,
        mode: ReplyMode | str,
        text: str = "",
        *,
        context_length: int | None,
        policy: OverflowPolicy | str = OverflowPolicy.ASK,
    ) -> ContextFit:
        """Make the reply `reply(mode, text)` would start fit `context_length` with the
        sampling's max tokens, as `policy` says (chat_turn.py): DROP_OLDEST leaves the oldest
        turns out of the conversation, a cut lowers this session's max tokens; ASK changes
        nothing and reports `overflow`. ValueError when the prompt alone fills the context."""
        self._ensure_idle()
        fit, messages = fit_turn(
            self._messages,
            mode,
            text,
            max_tokens=self._sampling.max_tokens,
            context_length=context_length,
            policy=policy,
            prompt_length=lambda msgs: len(self.prompt_token_ids(msgs)),
        )
        if fit.dropped:
            self._messages = messages
        if fit.cut:
            self._sampling = replace(self._sampling, max_tokens=fit.max_tokens)
        return fit

    def adopt_cache(self, caches: list, token_ids: list[int]) -> None:
        """Use `caches` holding `token_ids` as the prompt cache (a restored session file,
        `session_file.restore_cache`): the next reply prefills only what follows them."""
        self._ensure_idle()
        _close_caches(self._cache)
        self._cache, self._cache_ids, self._cache_stale = caches, list(token_ids), False

    def load_messages(self, messages: list[dict]) -> None:
        """Restore a saved conversation. A leading system message becomes the system prompt."""
        self._ensure_idle()
        msgs = _check_messages(messages)
        if msgs and msgs[0]["role"] == "system":
            self._system_prompt = msgs.pop(0)["content"] or None
        if any(m["role"] == "system" for m in msgs):
            raise ValueError("only the first message may have role 'system'")
        self._messages = msgs

    def reset(self) -> None:
        """Forget the conversation and the cache (the system prompt and settings stay)."""
        self._ensure_idle()
        self._messages = []
        self._drop_cache()

    def stop(self) -> None:
        """Ask the running reply to end (thread-safe). It ends before the next token."""
        self._stop.set()

    # ------------------------------------------------------------ generation
    def reply(self, mode: ReplyMode | str, text: str = "") -> Iterator[Event]:
        """`send(text)`, `regenerate()` or `edit_last_user_message(text)` by `mode`."""
        mode = ReplyMode(mode)
        if mode == ReplyMode.SEND:
            return self.send(text)
        if mode == ReplyMode.REGENERATE:
            return self.regenerate()
        return self.edit_last_user_message(text)

    def send(self, text: str) -> Iterator[Event]:
        """Add a user message and stream the assistant's reply (events; GenerationStats last)."""
        if not isinstance(text, str):
            raise ValueError(f"message text must be a string, got {type(text).__name__}")
        self._stop.clear()
        return self._reply(lambda msgs: after_turn(msgs, ReplyMode.SEND, text))

    def regenerate(self) -> Iterator[Event]:
        """Drop the last assistant reply and answer the last user message again."""
        last_user_index(self._messages)  # fail now, not at the first next()
        self._stop.clear()
        return self._reply(lambda msgs: after_turn(msgs, ReplyMode.REGENERATE))

    def edit_last_user_message(self, text: str) -> Iterator[Event]:
        """Replace the last user message (dropping what followed it) and answer it."""
        if not isinstance(text, str):
            raise ValueError(f"message text must be a string, got {type(text).__name__}")
        last_user_index(self._messages)  # fail now, not at the first next()
        self._stop.clear()
        return self._reply(lambda msgs: after_turn(msgs, ReplyMode.EDIT, text))

    def _ensure_idle(self) -> None:
        if self._busy.locked():
            raise RuntimeError("a reply is being generated; stop it first")

    def _reply(self, edit: Callable[[list[dict]], list[dict]]) -> Iterator[Event]:
        """Run one reply over `edit(messages)`; on error the conversation is left as it was."""
        if not self._busy.acquire(blocking=False):
            raise RuntimeError("a reply is already being generated")
        previous = self._messages
        try:
            messages = edit(list(previous))
            self._messages = messages
            try:
                prompt_ids = render_prompt(self.tokenizer, messages, self._system_prompt)
                check_token_ids(self._vocab_rows, prompt_ids)
                reply = self._prepare_cache(prompt_ids)
                yield from self._stream(reply)
            except GeneratorExit:  # the consumer walked away: keep the partial reply
                self._finish(reply, "cancelled")
                raise
            except BaseException:
                self._messages = previous
                self._drop_cache()  # state after a failed model call is unknown
                raise
            yield self._finish(reply, reply.reason)
        finally:
            self._busy.release()

    def _prepare_cache(self, prompt_ids: list[int]) -> _Reply:
        """Trim the cache to the longest prefix it shares with `prompt_ids` (>= 1 token left)."""
        if not prompt_ids:
            raise ValueError("the rendered prompt is empty")
        rebuilt = False
        if self._cache is None or self._cache_stale or not self._cache_consistent():
            self._new_cache()
            rebuilt = True
        common = min(common_prefix(self._cache_ids, prompt_ids), len(prompt_ids) - 1)
        excess = len(self._cache_ids) - common
        trimmed = 0
        if excess > 0:
            if common > 0 and can_trim_prompt_cache(self._cache):
                trimmed = trim_prompt_cache(self._cache, excess)
            if trimmed != excess:
                self._new_cache()
                rebuilt, common, trimmed = True, 0, 0
            else:
                del self._cache_ids[common:]
        return _Reply(prompt_ids=prompt_ids, start=common, trimmed=trimmed, rebuilt=rebuilt)

    def _cache_consistent(self) -> bool:
        """The first layer's offset matches the ids we believe the cache holds."""
        offset = getattr(self._cache[0], "offset", None) if self._cache else None
        return offset is None or offset == len(self._cache_ids)

    def _new_cache(self) -> None:
        _close_caches(self._cache)
        self._cache = self._factory(self.model)
        self._cache_ids = []
        self._cache_stale = False

    def _drop_cache(self) -> None:
        _close_caches(self._cache)  # a cold tier's files go now, not when collected
        self._cache = None
        self._cache_ids = []

    def _logits_processors(self, prefix_ids: list[int]) -> list[Callable]:
        """Repetition penalty over the full context: the cached ids come before the new ones."""
        processors = self._sampling.make_logits_processors()
        context = prefix_ids[-self._sampling.repetition_context_size :]
        if not processors or not context:
            return processors
        prefix = mx.array(context, dtype=mx.int32)

        def with_prefix(processor: Callable) -> Callable:
            return lambda tokens, logits: processor(
                mx.concatenate([prefix, tokens.astype(mx.int32)]), logits
            )

        return [with_prefix(p) for p in processors]

    def _stream(self, reply: _Reply) -> Iterator[TokenEvent | CacheSnapshot]:
        """Prefill the new prompt tokens and stream the reply into `reply`."""
        settings = self._sampling
        if settings.seed is not None:
            mx.random.seed(settings.seed)
        mx.reset_peak_memory()
        reply.t_start = time.perf_counter()
        if self._stop.is_set():
            return  # cancelled before prefill: the cache holds prompt_ids[:start]
        snapshot = self._snapshot_function()
        reply.steps_before = attention_steps(self._cache or [])
        stream = stream_generate(
            self.model,
            self.tokenizer,
            mx.array(reply.prompt_ids[reply.start :], dtype=mx.int32),
            max_tokens=settings.max_tokens,
            prompt_cache=self._cache,
            sampler=settings.make_sampler(),
            logits_processors=self._logits_processors(reply.prompt_ids[: reply.start]),
            prefill_step_size=self.prefill_step_size,
            prompt_progress_callback=lambda done, total: self._on_prefill(reply, done, total),
        )
        try:
            for response in stream:
                if not reply.received:
                    reply.ttft = time.perf_counter() - reply.t_start
                reply.received.append(response.token)  # the stream has fed it to the cache
                reply.prompt_tps = response.prompt_tps
                reply.generation_tps = response.generation_tps
                if response.finish_reason == "stop":  # `token` is EOS; text flushes the rest
                    reply.reason = "stop"
                    if response.text:
                        reply.text.append(response.text)
                        yield TokenEvent(response.text, response.token, len(reply.reply_ids))
                    break
                reply.reply_ids.append(response.token)
                reply.text.append(response.text)
                yield TokenEvent(response.text, response.token, len(reply.reply_ids) - 1)
                if snapshot is not None:
                    snap = snapshot(self._cache, response.token)
                    if snap is not None:
                        yield snap
                if response.finish_reason == "length":
                    reply.reason = "length"
                    break
                if self._stop.is_set():
                    break
        except _PrefillCancelled:
            pass  # the cache holds prompt_ids[: start + prefilled]
        finally:
            stream.close()
        if reply.reason == "cancelled":
            yield from self._flush(reply)

    def _on_prefill(self, reply: _Reply, done: int, total: int) -> None:
        """Progress of the prefill (called after each chunk); ends it early after stop()."""
        reply.prefilled = done
        if self.prefill_progress is not None:
            self.prefill_progress("prefill", done, total)
        if done < total and self._stop.is_set():
            raise _PrefillCancelled

    def _flush(self, reply: _Reply) -> Iterator[TokenEvent]:
        """Text the streaming detokenizer still held back when the reply was cancelled."""
        if not reply.reply_ids:
            return
        shown = "".join(reply.text)
        full = self.tokenizer.decode(reply.reply_ids)
        if len(full) > len(shown) and full.startswith(shown):
            tail = full[len(shown) :]
            reply.text.append(tail)
            yield TokenEvent(tail, reply.reply_ids[-1], len(reply.reply_ids) - 1)

    def _snapshot_function(self) -> Callable | None:
        """`cache.snapshot` when the caches record telemetry (A2ATS caches), else None."""
        if not any(hasattr(c, "last_stats") for c in self._cache or []):
            return None
        return snapshot

    def _finish(self, reply: _Reply, reason: str) -> GenerationStats:
        """Record the reply in the conversation and the cache ids; return its stats."""
        if reply.received:  # the stream prefilled the prompt and fed every id it handed out
            self._cache_ids = reply.prompt_ids + reply.received
        else:  # cancelled before or during prefill: the cache holds the chunks done
            self._cache_ids = reply.prompt_ids[: reply.start + reply.prefilled]
        self._messages = [*self._messages, {"role": "assistant", "content": "".join(reply.text)}]
        extra = {
            "reused_tokens": reply.start,
            "trimmed_tokens": reply.trimmed,
            "cache_rebuilt": reply.rebuilt,
            "total_seconds": time.perf_counter() - reply.t_start,
        }
        if any(hasattr(c, "retrieved_steps") for c in self._cache or []):
            # how the A2ATS layers attended during this reply: the stats line says "exact"
            # when no step retrieved (a context below the crossover), never a bare "A2ATS"
            retrieved, exact = attention_steps(self._cache or [])
            extra["a2ats_retrieved_steps"] = max(0, retrieved - reply.steps_before[0])
            extra["a2ats_exact_steps"] = max(0, exact - reply.steps_before[1])
        stats = GenerationStats(
            prompt_tokens=len(reply.prompt_ids) - reply.start
            if reply.received
            else reply.prefilled,
            generation_tokens=len(reply.reply_ids),
            time_to_first_token=reply.ttft,
            prompt_tps=reply.prompt_tps,
            generation_tps=reply.generation_tps,
            peak_memory_gb=mx.get_peak_memory() / 1e9,
            stop_reason=reason,
            cache_bytes=_cache_nbytes(self._cache),
            cache_disk_bytes=_cache_disk_bytes(self._cache),
            codebook_bytes=model_codebook_bytes(self._cache or []),
            context_tokens=len(self._cache_ids),
            extra=extra,
        )
        self.last_stats = stats
        return stats
