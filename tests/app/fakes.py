"""A fake engine backend for GUI tests: a character-level "model" that streams a scripted
reply at a controllable pace, with the real engine's event types and ChatSession semantics
(messages, prompt-cache ids, stop, regenerate, edit). No MLX work at all."""

from __future__ import annotations

import tempfile
import threading
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from a2ats_engine.cache.layer_plan import LayerPlan
from a2ats_engine.cache.telemetry import CacheSnapshot, GenerationStats, LayerStats, TokenEvent
from a2ats_engine.chat_turn import fit_turn
from a2ats_engine.errors import CodebookError, ModelLoadError
from a2ats_engine.loading.models import ModelInfo
from a2ats_engine.records import ModelGeometry
from app.events import ReplyMode

SPECIAL = {"<|im_start|>": 1, "<|im_end|>": 2}


class CharTokenizer:
    """ids = code points (+ 1000) and two specials; decode is exact and per-char."""

    def encode(self, text: str) -> list[int]:
        out, i = [], 0
        while i < len(text):
            for token, tid in SPECIAL.items():
                if text.startswith(token, i):
                    out.append(tid)
                    i += len(token)
                    break
            else:
                out.append(ord(text[i]) + 1000)
                i += 1
        return out

    def decode(self, ids, skip_special_tokens: bool = False) -> str:
        names = {v: k for k, v in SPECIAL.items()}
        return "".join(names.get(i, "") if i < 1000 else chr(i - 1000) for i in ids)


def render(messages: list[dict], system: str | None) -> str:
    parts = [f"<|im_start|>system\n{system}<|im_end|>\n"] if system else []
    parts += [f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages]
    return "".join(parts) + "<|im_start|>assistant\n"


def default_reply(messages: list[dict]) -> str:
    return f"You said: {messages[-1]['content']}"


def in_turn(*replies):
    """A `reply_fn` giving `replies` in turn, one per request (an exception fails that reply)."""
    queue = iter(replies)
    return lambda _messages: next(queue)


@dataclass
class FakeSession:
    tokenizer: CharTokenizer
    system_prompt: str | None
    delay: float
    reply_fn: object
    snapshots: bool = False
    messages_: list[dict] = field(default_factory=list)
    cached: list[int] = field(default_factory=list)
    calls: list[str] = field(default_factory=list)
    a2ats: object = None
    codebook: object = None
    sampling: object = None  # SamplingSettings: the reply stops at its max_tokens
    layer_ids: tuple[int, ...] = (0, 1)  # the A2ATS layers snapshots report
    native_bytes_per_token: int = 0  # what the plan's native layers hold, per cached token
    prefill_chunk: int = 0  # > 0: the prompt is "prefilled" in chunks this long, `delay` each
    prefill_progress: object = None  # progress("prefill", done, total), as the engine calls it

    def __post_init__(self) -> None:
        self._stop = threading.Event()

    @property
    def messages(self) -> list[dict]:
        return [dict(m) for m in self.messages_]

    @property
    def cached_token_ids(self) -> list[int]:
        return list(self.cached)

    def prompt_token_ids(self, messages=None) -> list[int]:
        messages = self.messages_ if messages is None else messages
        return self.tokenizer.encode(render(messages, self.system_prompt))

    def set_system_prompt(self, text):
        self.calls.append("set_system_prompt")
        self.system_prompt = text or None

    def set_sampling(self, sampling):
        self.calls.append("set_sampling")
        self.sampling = sampling

    def set_cache_factory(self, factory=None, *, a2ats=None, codebook=None):
        self.calls.append("set_cache_factory")
        self.a2ats, self.codebook = a2ats, codebook

    def configure(self, *, system_prompt, sampling, a2ats, codebook, messages=None):
        """As `ChatSession.configure`: only what differs changes."""
        codebook = codebook if a2ats is not None else None
        if self.a2ats != a2ats or self.codebook is not codebook:
            self.set_cache_factory(a2ats=a2ats, codebook=codebook)
        self.set_sampling(sampling)
        self.set_system_prompt(system_prompt)
        if messages is not None and messages != self.messages_:
            self.load_messages(messages)

    def fit(self, mode, text="", *, context_length, policy):
        """`ChatSession.fit`: the engine's own rules (chat_turn.fit_turn) over this session."""
        fit, messages = fit_turn(
            self.messages_, mode, text, max_tokens=self.sampling.max_tokens,
            context_length=context_length, policy=policy,
            prompt_length=lambda msgs: len(self.prompt_token_ids(msgs)),
        )  # fmt: skip
        if fit.dropped:
            self.load_messages(messages)
        if fit.cut:
            self.sampling = replace(self.sampling, max_tokens=fit.max_tokens)
        return fit

    def load_messages(self, messages):
        self.calls.append("load_messages")
        self.messages_ = [dict(m) for m in messages]
        self.cached = []

    def stop(self):
        self._stop.set()

    def send(self, text):
        self._stop.clear()
        return self._reply([*self.messages_, {"role": "user", "content": text}], "send")

    def regenerate(self):
        self._stop.clear()
        i = max(i for i, m in enumerate(self.messages_) if m["role"] == "user")
        return self._reply(self.messages_[: i + 1], "regenerate")

    def edit_last_user_message(self, text):
        self._stop.clear()
        i = max(i for i, m in enumerate(self.messages_) if m["role"] == "user")
        return self._reply([*self.messages_[:i], {"role": "user", "content": text}], "edit")

    def _reply(self, messages, kind):
        self.calls.append(kind)
        self.messages_ = messages
        prompt = self.prompt_token_ids()
        reply = self.reply_fn(messages)
        if isinstance(reply, Exception):
            raise reply
        limited = self.sampling is not None and len(reply) > self.sampling.max_tokens
        if limited:
            reply = reply[: self.sampling.max_tokens]
        start = time.perf_counter()
        text, received, reason = [], [], "length" if limited else "stop"
        if not self._prefill(len(prompt)):
            reply, reason = "", "cancelled"
        for index, char in enumerate(reply):
            # a stop during the token's compute is honoured before it is shown (as the engine
            # honours one between prefill chunks); waiting on the flag keeps the test free of races
            if self._stop.is_set() or self._stop.wait(self.delay):
                reason = "cancelled"
                break
            tid = ord(char) + 1000
            received.append(tid)
            text.append(char)
            yield TokenEvent(char, tid, index)
            if self.snapshots:
                offset = len(prompt) + index + 1
                snap = make_snapshot(offset, index, tid, layer_ids=self.layer_ids)
                yield replace(snap, native_bytes=self.native_bytes_per_token * offset)
        self.messages_ = [*messages, {"role": "assistant", "content": "".join(text)}]
        self.cached = prompt + received
        elapsed = max(time.perf_counter() - start, 1e-6)
        yield GenerationStats(
            prompt_tokens=len(prompt), generation_tokens=len(received),
            time_to_first_token=self.delay, prompt_tps=1000.0,
            generation_tps=len(received) / elapsed, peak_memory_gb=0.01, stop_reason=reason,
            cache_bytes=4096 + 64 * len(self.cached), context_tokens=len(self.cached),
            extra={"kind": kind},
        )  # fmt: skip

    def _prefill(self, total: int) -> bool:
        """Report chunked prefill progress as the engine does (done 0 first, then after each
        chunk); False when a stop came between chunks."""
        if self.prefill_progress is None or self.prefill_chunk <= 0:
            return True
        done = 0
        self.prefill_progress("prefill", done, total)
        while total - done > 1:
            if self._stop.is_set() or self._stop.wait(self.delay):
                return False
            done = min(total - 1, done + self.prefill_chunk)
            self.prefill_progress("prefill", done, total)
        return True


def make_snapshot(
    offset: int, step: int, token_id: int, layers: int = 2, layer_ids: tuple[int, ...] = ()
) -> CacheSnapshot:
    window_start = max(8, offset - 16)
    selected = np.unique(np.r_[np.arange(min(8, offset)), np.arange(window_start, offset)])
    stats = tuple(
        LayerStats(
            step=step,
            offset=offset,
            window_start=window_start,
            sinks=8,
            selected=(selected.astype(np.int32),) * 2,
            code_counts=(np.ones(16, dtype=np.int64),) * 2,
            bytes_held=100 * offset,
            bytes_fp16=400 * offset,
            layer=layer,
        )  # fmt: skip
        for layer in (layer_ids or range(layers))
    )
    return CacheSnapshot(step=step, layers=stats, token_id=token_id)


@dataclass(frozen=True)
class FakeCodebook:
    n_centroids: int = 64
    sub_dim: int = 16
    num_layers: int = 2
    nbytes: int = 8192
    sha256: str = "ab" * 32
    metadata: dict = field(default_factory=lambda: {"corpus": "fake", "tokens": 4096, "beta": 0.0})


class FakeBackend:
    """Implements the EngineBackend methods the worker uses."""

    def __init__(
        self,
        delay: float = 0.002,
        reply_fn=default_reply,
        snapshots: bool = False,
        load_seconds: float = 0.0,
        context_length: int = 4096,
        plan: LayerPlan | None = None,
        native_bytes_per_token: int = 0,
        prefill_chunk: int = 0,
    ):
        """`plan`: the model's layer plan (ModelInfo.layer_plan); snapshots then report its
        A2ATS layers, and `native_bytes_per_token` * offset bytes for its native ones."""
        self.context_length = context_length
        self.plan = plan
        self.native_bytes_per_token = native_bytes_per_token
        self.prefill_chunk = prefill_chunk  # > 0: replies report chunked prefill progress
        self.demo_steps: list[str] = []
        self.delay = delay
        self.crossover_known = False  # this machine has its own measurement for the model
        self.crossover_runs = 0
        self.crossover_delay = 0.0
        self.crossover_estimate: dict | None = None  # the row's estimate measurement, if any
        self.load_seconds = load_seconds
        self.reply_fn = reply_fn
        self.snapshots = snapshots
        self.sessions: list[FakeSession] = []
        self.calibrations: list = []
        self.demo_codebook: Path | None = None  # no default codebook until one is built
        self.saved_caches: dict[str, list[int]] = {}  # chat id -> the token ids kept for it
        self.cache_log: list[tuple[str, str]] = []  # ("save" | "restore" | "forget", chat id)

    def load_model(self, source, progress=None):
        if progress:
            progress("load", 0, 1)
        steps = 20
        for step in range(steps if self.load_seconds else 0):
            time.sleep(self.load_seconds / steps)
            if progress:
                progress("load", step, steps)
        if source not in ("fake", "demo") and not Path(source).is_dir():
            raise ModelLoadError(f"no model folder, .gguf file or repo id at {source}")
        if progress:
            progress("load", 1, 1)
        geometry = ModelGeometry(
            model_type="llama", num_layers=self.plan.num_layers if self.plan else 2, num_heads=4, num_kv_heads=2, head_dim=16, rope={},
            max_context=self.context_length,
        )  # fmt: skip
        info = ModelInfo(
            name="FakeLM-1M", geometry=geometry, quantization=None, disk_bytes=1, path=str(source),
            layer_plan=self.plan,
        )  # fmt: skip
        return object(), CharTokenizer(), info

    def demo_model_path(self):
        return Path("/fake/demo")

    def fetch_demo(self, progress=None):
        self.demo_steps.append("fetch")
        if progress:
            progress("download", 1, 1)
        return Path("/fake/demo")

    def ensure_demo_codebook(self, folder, progress=None):
        self.demo_steps.append(f"codebook:{folder}")
        if progress:
            progress("collecting", 1, 1)
        assert self.demo_codebook is not None, "set FakeBackend.demo_codebook to a temp path"
        self.demo_codebook.parent.mkdir(parents=True, exist_ok=True)
        self.demo_codebook.write_text("fake codebook layers=2\n")
        return self.demo_codebook

    def demo_codebook_path(self):
        if self.demo_codebook is None:
            return Path(tempfile.gettempdir()) / "a2ats-fake-none" / "demo-default.safetensors"
        return self.demo_codebook

    def default_codebook_path(self, source):
        return self.demo_codebook_path() if source == "demo" else None

    def load_codebook(self, path, model):
        path = Path(path)
        if not path.is_file() or path.suffix != ".safetensors":
            raise CodebookError(f"cannot read codebook {path.name}: not a safetensors file")
        text = path.read_text(errors="replace")
        if "layers=" in text:
            layers = int(text.split("layers=")[1].split()[0])
            if layers != 2:
                raise CodebookError(f"codebook is for {layers} layers, the model has 2")
        return FakeCodebook(), []

    def make_session(self, model, tokenizer):
        session = FakeSession(
            tokenizer,
            None,
            self.delay,
            self.reply_fn,
            self.snapshots,
            layer_ids=self.plan.a2ats_layers if self.plan is not None else (0, 1),
            native_bytes_per_token=self.native_bytes_per_token,
            prefill_chunk=self.prefill_chunk,
        )
        self.sessions.append(session)
        return session

    def crossover_measured_here(self, model, config=None, codebook=None):
        self.crossover_asked = config
        return self.crossover_known

    def measure_crossover(self, model, name, codebook, progress, cancel, config=None):
        from app.backend import CrossoverCancelled

        self.crossover_runs += 1
        for i, n in enumerate((1024, 2048, 4096)):
            if cancel.is_set():
                raise CrossoverCancelled("cancelled")
            progress(f"context {n}", i, 3)
            time.sleep(self.crossover_delay)
        return {
            "exact_below": 2048,
            "never": False,
            "ratios": {"1024": 0.9, "2048": 1.1, "4096": 1.3},
            "a2ats_layers": 30,
            **({"estimate": self.crossover_estimate} if self.crossover_estimate else {}),
        }

    def with_crossover(self, model, config, codebook=None):
        return config  # the fake model has no geometry: the settings' exact_below as it is

    def configure_session(self, session, *, system_prompt, sampling, a2ats, codebook, turns):
        messages = [{"role": r, "content": c} for r, c in turns]
        session.configure(
            system_prompt=system_prompt or None, sampling=sampling, a2ats=a2ats,
            codebook=codebook, messages=messages,
        )  # fmt: skip

    def fit(self, session, mode, text, *, context_length, policy):
        return session.fit(mode, text, context_length=context_length, policy=policy)

    def session_turns(self, session):
        return [(m["role"], m["content"]) for m in session.messages]

    def reply(self, session, mode, text, progress=None):
        session.prefill_progress = progress
        if mode == ReplyMode.SEND:
            return session.send(text)
        if mode == ReplyMode.REGENERATE:
            return session.regenerate()
        return session.edit_last_user_message(text)

    def stop(self, session):
        session.stop()

    def save_chat_cache(self, session, chat_id):
        if session is None or not session.cached_token_ids:
            return None
        self.saved_caches[chat_id] = list(session.cached_token_ids)
        self.cache_log.append(("save", chat_id))
        return None

    def restore_chat_cache(self, session, chat_id):
        if chat_id not in self.saved_caches:
            return None
        self.cache_log.append(("restore", chat_id))
        return f"Reopened from the chat's saved cache: {len(self.saved_caches[chat_id])} tokens"

    def forget_chat_cache(self, chat_id):
        self.saved_caches.pop(chat_id, None)
        self.cache_log.append(("forget", chat_id))

    def context_token_ids(self, session, *, streaming):
        return session.prompt_token_ids() if streaming else session.cached_token_ids

    def decode(self, tokenizer, ids):
        return tokenizer.decode(ids)

    def text_cache(self, tokenizer):
        from a2ats_engine.token_texts import TokenTextCache

        return TokenTextCache(lambda ids: self.decode(tokenizer, ids))

    def placement(self, model):
        return ()

    def close(self):
        pass

    def calibrate(self, model, tokenizer, request, progress, cancel, model_name):
        self.calibrations.append(request)
        for stage, total in (("collecting", 40), ("clustering", 20)):
            for done in range(total + 1):
                if cancel.is_set():
                    from a2ats_engine.calibration.capture import CalibrationCancelled

                    raise CalibrationCancelled("calibration cancelled")
                progress(stage, done, total)
                time.sleep(self.delay)
        Path(request.output).parent.mkdir(parents=True, exist_ok=True)
        Path(request.output).write_text("fake codebook layers=2\n")
        return FakeCodebook()

    def is_cancellation(self, exc):
        from a2ats_engine.calibration.capture import CalibrationCancelled

        return isinstance(exc, CalibrationCancelled)

    def codebook_sha256(self, codebook, path):
        return codebook.sha256
