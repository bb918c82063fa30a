"""ChatSession and SamplingSettings on tiny random models (greedy = temperature 0)."""

from __future__ import annotations

import json
import queue
import threading

import mlx.core as mx
import pytest
from demo_gate import require_demo
from mlx_lm.models.cache import KVCache, make_prompt_cache
from mlx_lm.tokenizer_utils import load as load_tokenizer
from tiny import save_tiny_tokenizer, tiny_model, tiny_tokenizer

from a2ats_engine import SamplingSettings as ExportedSamplingSettings
from a2ats_engine.cache.config import A2ATSConfig
from a2ats_engine.cache.telemetry import GenerationStats, TokenEvent
from a2ats_engine.chat_turn import ContextFit, OverflowPolicy, ReplyMode, after_turn, fit_turn
from a2ats_engine.session import ChatSession, SamplingSettings, render_prompt

GREEDY = SamplingSettings(temperature=0.0, max_tokens=10)


@pytest.fixture
def no_eos_tokenizer(tmp_path):
    """A private tokenizer that never stops on EOS (replies run to max_tokens or stop())."""
    tok = tiny_tokenizer(tmp_path)
    tok.eos_token_ids = []
    return tok


def run(events) -> tuple[list[int], str, GenerationStats]:
    """Drain an event stream: (reply token ids, reply text, final stats)."""
    events = list(events)
    stats = events[-1]
    assert isinstance(stats, GenerationStats)
    tokens = [e for e in events[:-1] if isinstance(e, TokenEvent)]
    ids = []
    for e in tokens:  # a flush event repeats the last index; count each index once
        if not ids or e.index == len(ids):
            ids.append(e.token_id)
    return ids, "".join(e.text for e in tokens), stats


def fresh_reply(model, tokenizer, history, user_text, sampling=GREEDY, system=None):
    """The reply a brand-new session gives to `history` + `user_text` (full prefill)."""
    session = ChatSession(model, tokenizer, sampling=sampling, system_prompt=system)
    session.load_messages(history)
    ids, _, stats = run(session.send(user_text))
    assert stats.extra["reused_tokens"] == 0
    return ids


# ------------------------------------------------------------------ streaming and stats
def test_send_streams_tokens_then_stats(llama, tokenizer):
    session = ChatSession(llama, tokenizer, sampling=GREEDY, system_prompt="Be brief.")
    events = list(session.send("Hello! How are you?"))
    stats = events[-1]
    token_events = events[:-1]
    assert isinstance(stats, GenerationStats)
    assert token_events and all(isinstance(e, TokenEvent) for e in token_events)
    assert [e.index for e in token_events] == list(range(len(token_events)))
    prompt = render_prompt(
        tokenizer, [{"role": "user", "content": "Hello! How are you?"}], "Be brief."
    )
    assert stats.prompt_tokens == len(prompt)
    assert stats.generation_tokens == len(token_events)
    assert stats.stop_reason in ("stop", "length")
    eos = 1 if stats.stop_reason == "stop" else 0
    assert stats.context_tokens == len(prompt) + len(token_events) + eos == session.context_tokens
    assert session.cached_token_ids[: len(prompt)] == prompt
    assert session.caches[0].offset == session.context_tokens
    assert stats.time_to_first_token > 0 and stats.prompt_tps > 0 and stats.generation_tps > 0
    assert stats.peak_memory_gb > 0
    assert stats.cache_bytes == sum(c.nbytes for c in session.caches) > 0
    reply = "".join(e.text for e in token_events)
    assert session.messages == [
        {"role": "user", "content": "Hello! How are you?"},
        {"role": "assistant", "content": reply},
    ]


def test_max_tokens_ends_with_length(llama, no_eos_tokenizer):
    session = ChatSession(llama, no_eos_tokenizer, sampling=SamplingSettings(0.0, max_tokens=7))
    ids, _, stats = run(session.send("Hi"))
    assert stats.stop_reason == "length"
    assert len(ids) == stats.generation_tokens == 7
    assert session.context_tokens == stats.prompt_tokens + 7


def test_second_turn_prefills_only_new_tokens(llama, tokenizer):
    session = ChatSession(llama, tokenizer, sampling=GREEDY)
    run(session.send("Hello! How are you?"))
    caches = session.caches
    cached_before = session.context_tokens
    _, _, stats = run(session.send("What is the capital of France?"))
    full = session.prompt_token_ids(session.messages[:-1])
    assert session.caches is caches
    assert not stats.extra["cache_rebuilt"]
    assert 0 < stats.extra["reused_tokens"] <= cached_before
    assert stats.prompt_tokens == len(full) - stats.extra["reused_tokens"]
    assert stats.prompt_tokens < len(full)


# --------------------------------------------------- cache reuse equals full recomputation
@pytest.mark.parametrize(("arch", "penalty"), [("llama", 1.0), ("qwen2", 1.0), ("llama", 1.3)])
def test_reused_cache_gives_same_tokens_as_fresh_session(arch, penalty, tokenizer):
    model = tiny_model(arch, seed=3)
    sampling = SamplingSettings(temperature=0.0, max_tokens=8, repetition_penalty=penalty)
    session = ChatSession(model, tokenizer, sampling=sampling, system_prompt="You are terse.")

    def check(events, user_text):
        ids, _, stats = run(events)
        history = session.messages[:-2]
        assert ids == fresh_reply(model, tokenizer, history, user_text, sampling, "You are terse.")
        return stats

    check(session.send("Hello there."), "Hello there.")
    stats = check(session.send("The quick brown fox?"), "The quick brown fox?")
    assert stats.extra["reused_tokens"] > 0
    stats = check(session.edit_last_user_message("Numbers: 0123"), "Numbers: 0123")
    assert stats.extra["reused_tokens"] > 0 and not stats.extra["cache_rebuilt"]
    stats = check(session.regenerate(), "Numbers: 0123")
    assert stats.prompt_tokens == 1 and not stats.extra["cache_rebuilt"]
    stats = check(session.send("def main():"), "def main():")
    assert stats.extra["reused_tokens"] > 0
    assert len(session.messages) == 6


def test_regenerate_trims_and_matches_fresh_greedy_answer(llama, tokenizer):
    session = ChatSession(llama, tokenizer, sampling=GREEDY)
    first, text, _ = run(session.send("Hello! How are you?"))
    caches = session.caches
    again, text_again, stats = run(session.regenerate())
    assert session.caches is caches
    assert not stats.extra["cache_rebuilt"]
    assert stats.extra["trimmed_tokens"] >= 1
    assert stats.prompt_tokens == 1  # only the last prompt token is fed again
    assert again == first and text_again == text
    assert again == fresh_reply(llama, tokenizer, [], "Hello! How are you?")
    assert [m["role"] for m in session.messages] == ["user", "assistant"]


def test_edit_last_user_message_trims(llama, tokenizer):
    session = ChatSession(llama, tokenizer, sampling=GREEDY)
    run(session.send("Hello! How are you?"))
    run(session.send("What is the capital of France?"))
    history = session.messages[:2]
    caches = session.caches
    ids, _, stats = run(session.edit_last_user_message("Numbers: 0123456789."))
    assert session.caches is caches and not stats.extra["cache_rebuilt"]
    assert stats.extra["trimmed_tokens"] > 0
    assert stats.extra["reused_tokens"] >= len(session.prompt_token_ids(history[:1]))
    assert stats.prompt_tokens < len(session.prompt_token_ids(session.messages[:-1]))
    assert session.messages[2] == {"role": "user", "content": "Numbers: 0123456789."}
    assert len(session.messages) == 4
    assert ids == fresh_reply(llama, tokenizer, history, "Numbers: 0123456789.")


def test_untrimmable_cache_is_rebuilt(llama, tokenizer):
    class FixedCache(KVCache):
        def is_trimmable(self):
            return False

    built = []

    def factory(model):
        built.append(1)
        return [FixedCache() for _ in model.layers]

    session = ChatSession(llama, tokenizer, sampling=GREEDY, cache_factory=factory)
    first, _, _ = run(session.send("Hello! How are you?"))
    again, _, stats = run(session.regenerate())
    assert len(built) == 2 and stats.extra["cache_rebuilt"]
    assert again == first


# ------------------------------------------------------------------------ cancelling
def test_stop_from_another_thread_cancels(llama, no_eos_tokenizer):
    sampling = SamplingSettings(temperature=0.0, max_tokens=100_000)
    session = ChatSession(llama, no_eos_tokenizer, sampling=sampling)
    events: queue.Queue = queue.Queue()
    resume = threading.Event()

    def worker():
        for event in session.send("Hello! How are you?"):
            events.put(event)
            if isinstance(event, TokenEvent) and event.index == 2:
                resume.wait()  # hold here until the main thread has called stop()
        events.put(None)

    thread = threading.Thread(target=worker)
    thread.start()
    seen = []
    while True:
        event = events.get(timeout=60)
        seen.append(event)
        if isinstance(event, TokenEvent) and event.index == 2:
            break
    session.stop()
    resume.set()
    thread.join(timeout=60)
    assert not thread.is_alive()
    while (event := events.get_nowait()) is not None:
        seen.append(event)
    stats = seen[-1]
    assert isinstance(stats, GenerationStats)
    assert stats.stop_reason == "cancelled"
    token_events = [e for e in seen if isinstance(e, TokenEvent)]
    assert {e.index for e in token_events} == {0, 1, 2}  # ended within one token of stop()
    assert stats.generation_tokens == 3
    assert session.messages[-1] == {
        "role": "assistant",
        "content": "".join(e.text for e in token_events),
    }
    assert session.context_tokens == stats.prompt_tokens + 3 == session.caches[0].offset
    assert not session.is_generating


def test_cancelled_reply_keeps_cache_consistent(llama, no_eos_tokenizer):
    sampling = SamplingSettings(temperature=0.0, max_tokens=6)
    session = ChatSession(llama, no_eos_tokenizer, sampling=sampling)
    stream = session.send("Hello! How are you?")
    for event in stream:
        if event.index == 3:
            break
    stream.close()  # the consumer walks away: same as a cancel
    assert session.messages[-1]["role"] == "assistant"
    assert session.caches[0].offset == session.context_tokens
    history = session.messages
    ids, _, stats = run(session.send("And then?"))
    assert stats.extra["reused_tokens"] > 0
    assert ids == fresh_reply(llama, no_eos_tokenizer, history, "And then?", sampling)


def test_stop_before_iterating_generates_nothing(llama, tokenizer):
    session = ChatSession(llama, tokenizer, sampling=GREEDY)
    stream = session.send("Hello! How are you?")
    session.stop()
    events = list(stream)
    assert len(events) == 1
    assert events[0].stop_reason == "cancelled" and events[0].generation_tokens == 0
    assert session.messages[-1] == {"role": "assistant", "content": ""}
    assert session.context_tokens == 0
    run(session.send("Hi"))  # the next message is not cancelled by the old stop()
    assert session.last_stats.stop_reason != "cancelled"


def test_stop_during_prefill_ends_between_chunks(llama, tokenizer):
    holder = {}

    class StoppingCache(KVCache):
        def update_and_fetch(self, keys, values):
            out = super().update_and_fetch(keys, values)
            if self.offset >= 12:  # stop() arrives while the second prefill chunk runs
                holder["session"].stop()
            return out

    def factory(model):
        return [StoppingCache() for _ in model.layers]

    session = ChatSession(llama, tokenizer, sampling=GREEDY, cache_factory=factory)
    holder["session"] = session
    session.prefill_step_size = 8
    progress = []
    session.prefill_progress = lambda stage, done, total: progress.append((stage, done, total))
    text = "The quick brown fox jumps over the lazy dog. " * 3
    ids, _, stats = run(session.send(text))
    total = len(session.prompt_token_ids(session.messages[:-1]))
    assert ids == [] and stats.stop_reason == "cancelled"
    assert stats.prompt_tokens == 16 < total  # two chunks of 8 were prefilled, then it ended
    assert progress == [("prefill", 0, total), ("prefill", 8, total), ("prefill", 16, total)]
    assert session.context_tokens == 16 == session.caches[0].offset
    assert session.messages[-1] == {"role": "assistant", "content": ""}


def test_prefill_after_cancelled_prefill_resumes_where_it_ended(llama, tokenizer):
    session = ChatSession(llama, tokenizer, sampling=GREEDY)
    session.prefill_step_size = 8
    text = "The quick brown fox jumps over the lazy dog. " * 3

    def stop_after_first_chunk(stage, done, total):
        if done == 8:
            session.stop()

    session.prefill_progress = stop_after_first_chunk
    _, _, stats = run(session.send(text))
    assert stats.stop_reason == "cancelled" and session.context_tokens == 8
    session.prefill_progress = None
    ids, _, stats = run(session.regenerate())
    assert stats.extra["reused_tokens"] == 8 and not stats.extra["cache_rebuilt"]
    assert ids == fresh_reply(llama, tokenizer, [], text)


def test_one_reply_at_a_time(llama, tokenizer):
    session = ChatSession(llama, tokenizer, sampling=GREEDY)
    stream = session.send("Hello!")
    next(stream)
    assert session.is_generating
    with pytest.raises(RuntimeError):
        next(session.send("again"))
    with pytest.raises(RuntimeError):
        session.reset()
    stream.close()
    assert not session.is_generating


def test_failed_reply_leaves_conversation_unchanged(llama, tokenizer):
    def broken(model):
        raise MemoryError("no room")

    session = ChatSession(llama, tokenizer, sampling=GREEDY)
    run(session.send("Hello!"))
    before = session.messages
    session.set_cache_factory(broken)
    with pytest.raises(MemoryError):
        run(session.send("again"))
    assert session.messages == before and session.caches is None
    session.set_cache_factory(None)
    run(session.send("again"))
    assert len(session.messages) == 4


def test_tokenizer_that_does_not_match_the_model_is_a_clear_error(tokenizer):
    small = tiny_model("llama", vocab_size=100)  # the tokenizer's ids go up to 399
    session = ChatSession(small, tokenizer, sampling=GREEDY)
    with pytest.raises(ValueError, match=r"outside the model's vocabulary \(embedding rows 0-99\)"):
        run(session.send("Hello! How are you today?"))
    assert session.messages == [] and session.caches is None


# -------------------------------------------------------- settings between messages
def test_set_cache_factory_rebuilds_on_next_message(llama, tokenizer):
    built = []

    def factory(model):
        built.append(1)
        return make_prompt_cache(model)

    session = ChatSession(llama, tokenizer, sampling=GREEDY)
    run(session.send("Hello!"))
    old = session.caches
    session.set_cache_factory(factory)
    assert built == [] and session.caches is old
    history = session.messages
    ids, _, stats = run(session.send("The quick brown fox?"))
    assert built == [1] and session.caches is not old
    assert stats.extra["cache_rebuilt"] and stats.extra["reused_tokens"] == 0
    assert ids == fresh_reply(llama, tokenizer, history, "The quick brown fox?")


def test_set_system_prompt_applies_to_next_message(llama, tokenizer):
    session = ChatSession(llama, tokenizer, sampling=GREEDY)
    run(session.send("Hello!"))
    history = session.messages
    session.set_system_prompt("Answer in French.")
    ids, _, _ = run(session.send("The quick brown fox?"))
    text = tokenizer.decode(session.cached_token_ids)
    assert text.startswith("<|im_start|>system\nAnswer in French.<|im_end|>")
    expected = fresh_reply(
        llama, tokenizer, history, "The quick brown fox?", system="Answer in French."
    )
    assert ids == expected


def test_load_messages_and_reset(llama, tokenizer):
    session = ChatSession(llama, tokenizer, sampling=GREEDY)
    session.load_messages(
        [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": "Hello!"},
        ]
    )
    assert session.system_prompt == "Be brief."
    assert [m["role"] for m in session.messages] == ["user", "assistant"]
    run(session.send("How are you?"))
    assert len(session.messages) == 4 and session.context_tokens > 0
    session.reset()
    assert session.messages == [] and session.context_tokens == 0 and session.caches is None
    assert session.system_prompt == "Be brief."
    with pytest.raises(ValueError, match="role"):
        session.load_messages([{"role": "robot", "content": "x"}])
    with pytest.raises(ValueError, match="content"):
        session.load_messages([{"role": "user", "content": 3}])
    with pytest.raises(ValueError, match="no user message"):
        session.regenerate()


def test_template_without_system_role_folds_system_prompt(llama, tmp_path):
    folder = save_tiny_tokenizer(tmp_path)
    config = json.loads((folder / "tokenizer_config.json").read_text())
    config["chat_template"] = (
        "{% for message in messages %}"
        "{% if message['role'] == 'system' %}{{ raise_exception('System role not supported') }}"
        "{% endif %}"
        "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' }}"
        "{% endfor %}"
        "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
    )
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    tok = load_tokenizer(folder)
    session = ChatSession(llama, tok, sampling=GREEDY, system_prompt="Be brief.")
    _, _, stats = run(session.send("Hello!"))
    assert stats.prompt_tokens > 0
    text = tok.decode(session.cached_token_ids)
    assert text.startswith("<|im_start|>user\nBe brief.\n\nHello!<|im_end|>")


# --------------------------------------------------------------------------- sampling
def test_seeded_sampling_is_reproducible(llama, no_eos_tokenizer):
    def sample(seed):
        settings = SamplingSettings(temperature=1.5, top_k=50, seed=seed, max_tokens=12)
        session = ChatSession(llama, no_eos_tokenizer, sampling=settings)
        return run(session.send("Hello!"))[0]

    assert sample(7) == sample(7)
    assert sample(7) != sample(8)


def test_sampling_settings_export_and_dict_round_trip():
    settings = SamplingSettings(temperature=0.2, top_p=0.9, min_p=0.05, top_k=40, seed=3)
    assert ExportedSamplingSettings is SamplingSettings
    assert SamplingSettings.from_dict({**settings.to_dict(), "future_knob": 1}) == settings
    assert SamplingSettings(temperature=0).greedy


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("temperature", -0.1),
        ("temperature", float("nan")),
        ("top_p", 0.0),
        ("top_p", 1.5),
        ("min_p", 1.0),
        ("min_p", -0.1),
        ("top_k", -1),
        ("top_k", 2.5),
        ("repetition_penalty", 0.0),
        ("seed", -1),
        ("seed", 1.5),
        ("max_tokens", 0),
        ("max_tokens", True),
        ("repetition_context_size", 0),
    ],
)
def test_sampling_settings_validation(field, value):
    with pytest.raises(ValueError, match=f"SamplingSettings.{field}="):
        SamplingSettings(**{field: value})


def test_sampler_greedy_picks_argmax():
    logits = mx.array([[0.1, 3.0, -1.0, 2.0]])
    sampler = SamplingSettings(temperature=0.0).make_sampler()
    assert sampler(logits).item() == 1
    assert SamplingSettings().make_logits_processors() == []
    assert len(SamplingSettings(repetition_penalty=1.2).make_logits_processors()) == 1


# ------------------------------------------------------------------- A2ATS cache factory
@pytest.fixture
def a2ats_session(tokenizer):
    from a2ats_engine.cache.codebook import Codebook
    from a2ats_engine.cache.config import A2ATSConfig

    model = tiny_model("llama")  # same weights as `llama`; its own copy gets the attention hook

    config = A2ATSConfig(window=8, sinks=2, budget=4, telemetry=True)
    codebook = Codebook.random(2, 2, 16, 32, seed=1)
    with pytest.warns(UserWarning):  # a random codebook carries no model fingerprint
        session = ChatSession(model, tokenizer, sampling=GREEDY, a2ats=config, codebook=codebook)
        run(session.send("Hello! How are you?"))  # the caches are built on the first reply
    return session


def test_a2ats_session_streams_snapshots_after_each_token(a2ats_session):
    from a2ats_engine.cache.a2ats_cache import A2ATSCache
    from a2ats_engine.cache.telemetry import CacheSnapshot

    events = list(a2ats_session.send("What is the capital of France?"))
    stats = events[-1]
    assert all(isinstance(c, A2ATSCache) for c in a2ats_session.caches)
    pairs = list(zip(events[:-1:2], events[1:-1:2], strict=True))
    assert pairs and len(pairs) == stats.generation_tokens
    offsets = []
    for token, snap in pairs:
        assert isinstance(token, TokenEvent) and isinstance(snap, CacheSnapshot)
        assert snap.token_id == token.token_id and len(snap.layers) == 2
        offsets.append(snap.offset)
    assert offsets == list(range(offsets[0], offsets[0] + len(offsets)))
    assert offsets[-1] == a2ats_session.context_tokens == stats.context_tokens
    assert stats.extra["reused_tokens"] > 0 and not stats.extra["cache_rebuilt"]
    assert stats.cache_bytes == sum(c.nbytes for c in a2ats_session.caches) > 0


def test_a2ats_regenerate_trims_and_repeats_greedy_reply(a2ats_session):
    first, _, _ = run(a2ats_session.send("The quick brown fox?"))
    caches = a2ats_session.caches
    again, _, stats = run(a2ats_session.regenerate())
    assert a2ats_session.caches is caches and not stats.extra["cache_rebuilt"]
    assert stats.prompt_tokens == 1
    assert again == first
    assert all(c.offset == a2ats_session.context_tokens for c in caches)


def test_switching_to_full_cache_rebuilds(a2ats_session, llama, tokenizer):
    from a2ats_engine.cache.a2ats_cache import A2ATSCache

    a2ats_session.set_cache_factory(None)
    history = a2ats_session.messages
    ids, _, stats = run(a2ats_session.send("Numbers: 0123"))
    assert stats.extra["cache_rebuilt"]
    assert not any(isinstance(c, A2ATSCache) for c in a2ats_session.caches)
    assert ids == fresh_reply(llama, tokenizer, history, "Numbers: 0123")


# ------------------------------------------------------------------------- demo model
@pytest.fixture(scope="module")
def demo():
    from a2ats_engine.loading.models import load_model

    require_demo()
    model, tokenizer, _ = load_model("demo")
    return model, tokenizer


@pytest.mark.demo
def test_demo_multi_turn_reuse_matches_fresh_session(demo):
    model, tokenizer = demo
    sampling = SamplingSettings(temperature=0.0, max_tokens=16)
    system = "You are a concise assistant."
    session = ChatSession(model, tokenizer, sampling=sampling, system_prompt=system)
    _, text, _ = run(session.send("What is the capital of France?"))
    assert "Paris" in text
    history = session.messages
    ids, text, stats = run(session.send("And of Germany?"))
    assert "Berlin" in text
    full = len(session.prompt_token_ids(session.messages[:-1]))
    assert stats.prompt_tokens < full / 2 and stats.extra["reused_tokens"] > 0
    assert ids == fresh_reply(model, tokenizer, history, "And of Germany?", sampling, system)
    again, _, stats = run(session.regenerate())
    assert again == ids and stats.prompt_tokens == 1


def test_a2ats_snapshots_rebuild_the_code_histograms_across_turns(a2ats_session):
    """Keyframe on each reply's first snapshot (prefill or trim), new codes after: summing
    them gives the histograms of the codes the caches hold, at every step of every reply."""
    import numpy as np

    from a2ats_engine.cache.telemetry import CacheSnapshot

    hist: dict[int, np.ndarray] = {}
    for events in (
        a2ats_session.send("What is the capital of France?"),
        a2ats_session.send("And of Italy?"),
        a2ats_session.regenerate(),  # a trim, then a one-token prefill
    ):
        snaps = 0
        for event in events:
            if not isinstance(event, CacheSnapshot):
                continue
            for layer, cache in zip(event.layers, a2ats_session.caches, strict=True):
                if snaps == 0:
                    assert layer.new_codes is None
                    hist[layer.layer] = np.stack(layer.code_counts)
                else:
                    assert layer.code_counts == ()
                    for h, codes in enumerate(layer.new_codes):
                        np.add.at(hist[layer.layer][h], codes.astype(np.int64), 1)
                held = np.array(cache.codes[0, :, : layer.offset, 0])
                want = np.stack([np.bincount(c, minlength=32) for c in held])
                assert np.array_equal(hist[layer.layer], want)
            snaps += 1
        assert snaps > 1


@pytest.mark.parametrize("exact_below, retrieves", [(10**6, False), (0, True)])
def test_reply_stats_say_how_the_a2ats_layers_attended(llama, tokenizer, exact_below, retrieves):
    """Below the crossover every decode step attends exactly: the reply's stats say so (the app
    then shows "A2ATS (exact)", never a bare "A2ATS" over exact attention)."""
    from a2ats_engine.cache.codebook import Codebook
    from a2ats_engine.cache.config import A2ATSConfig
    from a2ats_engine.cache.geometry import model_geometry

    geo = model_geometry(llama)
    book = Codebook.random(geo.num_layers, geo.num_kv_heads, geo.head_dim, 16, seed=0)
    config = A2ATSConfig(window=4, sinks=1, budget=2, exact_below=exact_below)
    session = ChatSession(llama, tokenizer, sampling=GREEDY, a2ats=config, codebook=book)
    ids, _, stats = run(session.send("Hello there, how are you today?"))
    steps = stats.extra["a2ats_retrieved_steps"] + stats.extra["a2ats_exact_steps"]
    # the prompt's last token is a one-token step; mlx-lm computes one token ahead
    assert len(ids) - 1 <= steps <= len(ids) + 1
    assert (stats.extra["a2ats_retrieved_steps"] > 0) == retrieves
    assert (stats.extra["a2ats_exact_steps"] == 0) == retrieves
    _, _, plain = run(ChatSession(llama, tokenizer, sampling=GREEDY).send("Hi"))
    assert "a2ats_retrieved_steps" not in plain.extra  # no A2ATS layer: nothing claimed


# ------------------------------------------------------------ the chat turn: configure, fit
def words(messages: list[dict]) -> int:
    """A prompt length for the pure fitting rules: one token per word, plus 2 per message."""
    return sum(len(m["content"].split()) + 2 for m in messages)


HISTORY = [
    {"role": "user", "content": "one two three"},  # 5
    {"role": "assistant", "content": "four five"},  # 4
    {"role": "user", "content": "six"},  # 3
    {"role": "assistant", "content": "seven eight nine"},  # 5
]


def test_after_turn_is_the_conversation_each_mode_answers():
    assert after_turn(HISTORY, ReplyMode.SEND, "ten")[-1] == {"role": "user", "content": "ten"}
    assert after_turn(HISTORY, ReplyMode.REGENERATE) == HISTORY[:3]
    assert after_turn(HISTORY, ReplyMode.EDIT, "new") == [
        *HISTORY[:2],
        {"role": "user", "content": "new"},
    ]
    with pytest.raises(ValueError, match="no user message"):
        after_turn([], ReplyMode.REGENERATE)


@pytest.mark.parametrize("policy", list(OverflowPolicy))
def test_fit_turn_leaves_a_turn_that_fits_alone(policy):
    fit, kept = fit_turn(HISTORY, "send", "ten", max_tokens=10, context_length=100,
                         policy=policy, prompt_length=words)  # fmt: skip
    assert kept is HISTORY and fit == ContextFit(20, 10, 10, 100)
    assert not fit.cut and not fit.overflow and fit.dropped == 0
    unlimited, _ = fit_turn(HISTORY, "send", "ten", max_tokens=10, context_length=None,
                            policy=policy, prompt_length=words)  # fmt: skip
    assert unlimited.prompt_tokens is None and unlimited.max_tokens == 10


def test_fit_turn_policies_when_the_turn_does_not_fit():
    args = dict(max_tokens=10, context_length=25, prompt_length=words)  # the prompt is 20
    ask, kept = fit_turn(HISTORY, "send", "ten", policy="ask", **args)
    assert ask.overflow and kept is HISTORY and ask.max_tokens == 10 and ask.prompt_tokens == 20
    cut, kept = fit_turn(HISTORY, "send", "ten", policy="stop_at_limit", **args)
    assert cut.cut and cut.max_tokens == 5 and cut.requested == 10 and kept is HISTORY
    drop, kept = fit_turn(HISTORY, "send", "ten", policy="drop_oldest", **args)
    assert drop.dropped == 2 and kept == HISTORY[2:] and drop.prompt_tokens == 11
    assert not drop.cut  # 11 + 10 fits in 25
    # regenerate never drops the message it answers; what is left is cut to the room
    regen, kept = fit_turn(HISTORY, "regenerate", "", policy="drop_oldest",
                           max_tokens=10, context_length=8, prompt_length=words)  # fmt: skip
    assert regen.dropped == 2 and kept == HISTORY[2:] and regen.max_tokens == 5 and regen.cut
    with pytest.raises(ValueError, match="the prompt alone is 20 tokens"):
        fit_turn(HISTORY, "send", "ten", policy="stop_at_limit", max_tokens=10,
                 context_length=20, prompt_length=words)  # fmt: skip


def test_session_fit_drops_or_cuts_in_the_session(llama, tokenizer):
    session = ChatSession(llama, tokenizer, sampling=GREEDY)
    session.load_messages(HISTORY)
    full = len(session.prompt_token_ids(after_turn(HISTORY, "send", "ten")))
    ask = session.fit("send", "ten", context_length=full + 5, policy=OverflowPolicy.ASK)
    assert ask.overflow and session.messages == HISTORY and session.sampling == GREEDY
    cut = session.fit("send", "ten", context_length=full + 5, policy="stop_at_limit")
    assert cut.max_tokens == 5 and session.sampling.max_tokens == 5
    session.set_sampling(GREEDY)
    dropped = session.fit("send", "ten", context_length=full, policy="drop_oldest")
    assert dropped.dropped == 2 and session.messages == HISTORY[2:]
    _, _, stats = run(session.reply(ReplyMode.SEND, "ten"))
    assert stats.prompt_tokens + stats.extra["reused_tokens"] == dropped.prompt_tokens
    assert [m["content"] for m in session.messages][:3] == ["six", "seven eight nine", "ten"]


def test_configure_changes_only_what_differs(tokenizer):
    from a2ats_engine.cache.codebook import Codebook

    model = tiny_model("llama")  # its own copy: A2ATS caches hook its attention
    session = ChatSession(model, tokenizer)
    settings = dict(system_prompt="Be brief.", sampling=GREEDY, a2ats=None, codebook=None)
    session.configure(**settings, messages=HISTORY)
    assert session.messages == HISTORY and session.system_prompt == "Be brief."
    run(session.reply("send", "ten"))
    session.configure(**settings, messages=session.messages)  # the same: the cache is kept
    _, _, stats = run(session.reply("regenerate"))
    assert stats.extra["reused_tokens"] > 0 and not stats.extra["cache_rebuilt"]
    codebook = Codebook.random(2, 2, 16, 32, seed=1)
    a2ats = {**settings, "a2ats": A2ATSConfig(window=4, sinks=2, budget=4), "codebook": codebook}
    session.configure(**a2ats, messages=session.messages)
    factory = session.cache_factory
    assert factory.a2ats_config == a2ats["a2ats"] and factory.codebook is codebook
    session.configure(**{**a2ats, "a2ats": A2ATSConfig(window=4, sinks=2, budget=4)})
    assert session.cache_factory is factory  # an equal config keeps the factory and its cache
    with pytest.warns(UserWarning):  # a random codebook carries no model fingerprint
        _, _, stats = run(session.reply("regenerate"))
    assert stats.extra["cache_rebuilt"]  # the switch to A2ATS rebuilt it, once
    _, _, stats = run(session.reply("regenerate"))
    assert not stats.extra["cache_rebuilt"]
    session.configure(**settings, messages=HISTORY[:2])  # A2ATS off, another conversation
    assert session.messages == HISTORY[:2] and session.cache_factory is make_prompt_cache
