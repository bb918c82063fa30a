"""The ranks driven by one program (the app): the calmed launcher (launcher.py), the records on
the wire (wire.py), and two local ranks served to a `RanksClient` (serve.py, client.py)."""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from a2ats_engine.cache.codebook import Codebook
from a2ats_engine.cache.config import A2ATSConfig
from a2ats_engine.cache.telemetry import CacheSnapshot, GenerationStats, LayerStats, TokenEvent
from a2ats_engine.distributed import launcher, wire
from a2ats_engine.distributed.client import RanksClient, RanksLost
from a2ats_engine.distributed.launch import launcher as launch_prefix
from a2ats_engine.loading.models import load_model
from a2ats_engine.records import SamplingSettings
from a2ats_engine.session import ChatSession
from a2ats_engine.token_texts import token_texts
from tests.tiny import save_tiny_model
from tests.two_ranks import free_port, group_cpu, local_hosts, rank_pid

PROMPT = "Every rank keeps its own layers' codes and rows; rank 0 answers the app. " * 3


# -- the launcher --------------------------------------------------------------------------------


def test_calm_select_waits_for_output_instead_of_spinning_on_a_writable_pipe():
    r, w = os.pipe()
    try:
        t0 = time.perf_counter()
        for _ in range(5):
            readable, writable, _ = launcher.calm_select([r], [w], [], 1.0)
            assert readable == [] and writable == [w]  # room to write, nothing to read
        assert time.perf_counter() - t0 >= 5 * launcher.WAIT * 0.8  # it waited, each time
        plain = select.select([r], [w], [], 1.0)
        assert plain[1] == [w]  # what mlx.launch's own loop gets at once
        os.write(w, b"x")
        t0 = time.perf_counter()
        readable, _, _ = launcher.calm_select([r], [w], [], 1.0)
        assert readable == [r] and time.perf_counter() - t0 < launcher.WAIT
    finally:
        os.close(r)
        os.close(w)


def test_mlx_launch_module_is_patched():
    from mlx._distributed_utils import launch as mlx_launch

    saved = mlx_launch.select
    try:
        assert launcher.patch(mlx_launch) is True  # this MLX: the relay is calmed
        assert mlx_launch.select is launcher.calm_select
        assert launcher.patch(mlx_launch) is False  # only once, and never a foreign select
    finally:
        mlx_launch.select = saved


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads CPU time from /proc")
def test_idle_launcher_costs_next_to_no_cpu(two_ranks, tmp_path):
    """Two local ranks sleeping 4 s: mlx.launch's own relay spins (~1.5 cores here), the calmed
    one stays under 0.2 s of CPU over the whole run."""
    script = tmp_path / "sleep.py"
    script.write_text("import time\ntime.sleep(4)\n")
    command = [*launch_prefix(), "--hostfile", str(local_hosts(tmp_path))]
    command += ["--starting-port", str(free_port()), "--python", sys.executable, str(script)]
    with subprocess.Popen(command, stdin=subprocess.PIPE) as proc:
        time.sleep(3.5)
        fields = Path(f"/proc/{proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        cpu = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        proc.stdin.close()
        proc.wait(timeout=60)
    assert cpu < 0.5, f"the launcher used {cpu:.2f} s of CPU in 3.5 s while the ranks slept"


# -- records on the wire -----------------------------------------------------------------------


def _layer(layer: int) -> LayerStats:
    return LayerStats(
        step=3,
        offset=40,
        window_start=24,
        sinks=4,
        selected=(np.arange(5, dtype=np.int32), np.arange(3, dtype=np.int32)),
        code_counts=(np.ones(8, dtype=np.int64),) * 2,
        bytes_held=1000,
        bytes_fp16=2000,
        layer=layer,
        recall=(0.9, 0.8),
        missed_mass=(0.01, 0.02),
        new_codes=(np.array([1, 2], dtype=np.uint16),) * 2,
    )


def test_snapshot_round_trip_and_join_of_two_ranks():
    a = CacheSnapshot(step=3, layers=(_layer(2), _layer(3)), token_id=7, native_bytes=5,
                      codebook_bytes=100, process_bytes=1 << 20)  # fmt: skip
    b = CacheSnapshot(step=3, layers=(_layer(0),), token_id=7, native_bytes=1, codebook_bytes=50,
                      process_bytes=1 << 21)  # fmt: skip
    joined = wire.snapshot_from(
        wire.join_snapshots([wire.snapshot_json(a), None, wire.snapshot_json(b)])
    )
    assert [layer.layer for layer in joined.layers] == [0, 2, 3]
    assert joined.native_bytes == 6 and joined.codebook_bytes == 150
    assert joined.process_bytes == 3 << 20
    got = joined.layers[1]
    assert got.recall == (0.9, 0.8) and got.bytes_held == 1000 and got.window_start == 24
    assert [s.tolist() for s in got.selected] == [[0, 1, 2, 3, 4], [0, 1, 2]]
    assert got.selected[0].dtype == np.int32 and got.new_codes[0].dtype == np.uint16
    assert wire.join_snapshots([None, None]) is None


@pytest.mark.parametrize(
    ("field", "value", "named"),
    [
        ("step", "3", "snapshot.step"),
        ("layers", "x", "snapshot.layers"),
        ("token_id", -2, "snapshot.token_id"),
    ],
)
def test_hostile_snapshot_fields_are_named(field, value, named):
    data = wire.snapshot_json(CacheSnapshot(step=1, layers=(_layer(0),)))
    data[field] = value
    with pytest.raises(wire.WireError, match=named):
        wire.snapshot_from(data)


def test_hostile_arrays_are_refused():
    data = wire.snapshot_json(CacheSnapshot(step=1, layers=(_layer(0),)))
    data["layers"][0]["selected"] = [["object", [1]]]
    with pytest.raises(wire.WireError, match="selected"):
        wire.snapshot_from(data)
    data["layers"][0]["selected"] = [["int32", ["a"]]]
    with pytest.raises(wire.WireError, match="selected"):
        wire.snapshot_from(data)


def _through_json(value):
    return json.loads(json.dumps(value))


def test_stats_fit_and_model_info_round_trip(tmp_path):
    from a2ats_engine.loading.models import load_model

    stats = GenerationStats(3, 4, 0.5, 10.0, 5.0, 0.1, "stop", cache_bytes=9, extra={"a": 1})
    assert wire.stats_from(_through_json(wire.stats_json(stats))) == stats
    _, _, info = load_model(str(save_tiny_model(tmp_path / "tiny", "qwen3", head_dim=16)))
    back = wire.info_from(_through_json(info.to_dict()))
    assert back.geometry == info.geometry and back.layer_plan == info.layer_plan
    assert back.name == info.name and back.recommended_sampling == info.recommended_sampling
    with pytest.raises(wire.WireError, match="info.num_layers"):
        wire.info_from(_through_json(info.to_dict()) | {"num_layers": "many"})


def test_context_codebook_and_token_records_are_parsed_defensively():
    answer = {"ids": [5, 6], "texts": ["a", "b"], "turns": [["user", "hi"]]}
    back = wire.context_from(_through_json(answer))
    assert back.ids == (5, 6) and back.texts == ("a", "b") and back.turns == (("user", "hi"),)
    for field, value, named in (
        ("ids", [5, -1], "context.ids"),
        ("ids", "5,6", "context.ids"),
        ("texts", ["a"], "context.texts"),  # not one text an id
        ("texts", ["a", 7], "context.texts"),
        ("turns", [["user"]], "context.turns"),
        ("turns", [["user", {"x": 1}]], "context.turns"),
    ):
        with pytest.raises(wire.WireError, match=named):
            wire.context_from(answer | {field: value})
    book = {"n_centroids": 64, "sub_dim": 16, "num_layers": 4, "nbytes": 10, "sha256": "ab"}
    assert wire.codebook_from(book, "b.safetensors").nbytes == 10
    with pytest.raises(wire.WireError, match="codebook.n_centroids"):
        wire.codebook_from(book | {"n_centroids": 0}, "b.safetensors")
    assert wire.token_from({"text": "x", "token_id": 3, "index": 0}).token_id == 3
    with pytest.raises(wire.WireError, match="token.index"):
        wire.token_from({"text": "x", "token_id": 3, "index": -2})


def test_a_request_failing_on_one_rank_alone_fails_on_every_rank(monkeypatch):
    """A codebook file missing on rank 1's host: every rank raises rank 1's message (the ranks
    stay in step); otherwise `nbytes` is summed over the ranks."""
    from types import SimpleNamespace

    from a2ats_engine.distributed import group, serve

    state = SimpleNamespace(stage=SimpleNamespace(size=2, group=None))
    monkeypatch.setattr(serve, "_run_op", lambda state, op, request: {"nbytes": 5, "x": 1})
    theirs = {"error": "codebook b.safetensors: no such file", "nbytes": None}
    monkeypatch.setattr(group, "gather_json", lambda value, g: [value, theirs])
    with pytest.raises(ValueError, match="rank 1: codebook b.safetensors: no such file"):
        serve._agreed(state, "codebook", {})
    theirs.update(error=None, nbytes=7)
    assert serve._agreed(state, "codebook", {}) == {"nbytes": 12, "x": 1}

    def fails(state, op, request):
        raise ValueError("bad path")

    monkeypatch.setattr(serve, "_run_op", fails)  # rank 0's own failure, named as it is
    with pytest.raises(ValueError, match="^bad path$"):
        serve._agreed(state, "codebook", {})


# -- two ranks served to one client ----------------------------------------------------------------


@pytest.fixture
def tiny_ranks(two_ranks, tmp_path):
    model_dir = save_tiny_model(tmp_path / "tiny", "llama", num_hidden_layers=4, seed=3)
    book = tmp_path / "book.safetensors"
    Codebook.random(4, 2, 16, 64, seed=2).save(book)
    client = RanksClient(local_hosts(tmp_path), str(model_dir), port=free_port(), peer_timeout=20)
    yield client, model_dir, book
    client.close()


@pytest.mark.filterwarnings("ignore:codebook records no model fingerprint")
def test_client_chats_on_two_ranks_like_one_process_and_sees_every_layer(tiny_ranks):
    client, model_dir, book = tiny_ranks
    from a2ats_engine.loading.models import load_model

    assert client.ranks == ["rank 0 of 2: layers 2-3 of 4", "rank 1 of 2: layers 0-1 of 4"]
    loaded = client.load_codebook(book)
    assert loaded.num_layers == 4 and loaded.nbytes == Codebook.load(book).nbytes
    config = A2ATSConfig(window=16, budget=8, exact_below=0, telemetry=True)
    sampling = SamplingSettings(temperature=1.0, seed=11, max_tokens=16)
    client.configure(system_prompt=None, sampling=sampling, a2ats=config, turns=[])
    assert client.fit("send", PROMPT, context_length=None, policy="ask").overflow is False
    events = list(client.reply("send", PROMPT))
    tokens = [e.token_id for e in events if isinstance(e, TokenEvent)]
    snaps = [e for e in events if isinstance(e, CacheSnapshot)]
    stats = events[-1]
    assert isinstance(stats, GenerationStats) and stats.generation_tokens == 16

    model, tokenizer, _ = load_model(str(model_dir))
    session = ChatSession(
        model, tokenizer, sampling=sampling, a2ats=config, codebook=Codebook.load(book)
    )
    ref = list(session.send(PROMPT))
    assert tokens == [e.token_id for e in ref if isinstance(e, TokenEvent)]
    ref_snaps = [e for e in ref if isinstance(e, CacheSnapshot)]
    assert len(snaps) == len(ref_snaps) > 0
    assert [layer.layer for layer in snaps[-1].layers] == [0, 1, 2, 3]  # both ranks' layers
    for got, want in zip(snaps[-1].layers, ref_snaps[-1].layers, strict=True):
        assert [s.tolist() for s in got.selected] == [s.tolist() for s in want.selected]
    assert stats.cache_bytes == sum(int(c.nbytes) for c in session.caches)  # both ranks'
    context = client.context(streaming=False)
    ids = list(context.ids)
    assert ids == session.cached_token_ids and context.turns[-1][0] == "assistant"
    decode = lambda i: tokenizer.decode(i, skip_special_tokens=False)  # noqa: E731
    assert list(context.texts) == token_texts(decode, ids)
    assert client.decode(ids[:5]) == decode(ids[:5])
    # the reply's first token came with the context it continues (the app's streaming view)
    assert client.prompt is not None and list(client.prompt.ids) == session.prompt_token_ids(
        session.messages[:-1]
    )
    assert list(client.prompt.texts) == token_texts(decode, list(client.prompt.ids))
    # the crossover rank 0's machine applies, as one process decides it
    from a2ats_engine.cache.crossover_model import with_default_crossover

    asked = A2ATSConfig(window=16, budget=8)
    assert client.crossover(asked) == with_default_crossover(model, asked)[0]


def _greedy_plain(client: RanksClient, max_tokens: int) -> None:
    """Greedy replies with mlx-lm's own caches, from an empty conversation."""
    sampling = SamplingSettings(temperature=0.0, max_tokens=max_tokens)
    client.configure(system_prompt=None, sampling=sampling, a2ats=None, turns=[])


@pytest.mark.filterwarnings("ignore:codebook records no model fingerprint")
def test_a_reply_ending_on_end_of_sequence_leaves_the_ranks_in_step(two_ranks, tmp_path):
    """mlx-lm queues the step after an end-of-sequence token on its own stream before the
    reply ends; every rank must wait for it before the ranks' next exchange (it hung: the
    stats' gather met a peer's pipeline send and read garbage)."""
    model_dir = save_tiny_model(tmp_path / "tiny", "llama", num_hidden_layers=4, seed=3)
    book = tmp_path / "book.safetensors"
    Codebook.random(4, 2, 16, 64, seed=2).save(book)
    model, tokenizer, _ = load_model(str(model_dir))
    sampling = SamplingSettings(temperature=1.0, seed=11, max_tokens=12)
    config = A2ATSConfig(window=16, budget=8, exact_below=0, telemetry=True)
    one = ChatSession(
        model, tokenizer, sampling=sampling, a2ats=config, codebook=Codebook.load(book)
    )
    tokens = [e.token_id for e in one.send(PROMPT) if isinstance(e, TokenEvent)]
    end = next(i for i in range(3, len(tokens)) if tokens[i] not in tokens[:i])
    folder_config = json.loads((model_dir / "config.json").read_text())
    folder_config["eos_token_id"] = tokens[end]  # the model ends its reply there
    (model_dir / "config.json").write_text(json.dumps(folder_config))
    client = RanksClient(local_hosts(tmp_path), str(model_dir), port=free_port(), peer_timeout=20)
    try:
        client.load_codebook(book)
        for a2ats in (config, None, config):
            client.configure(system_prompt=None, sampling=sampling, a2ats=a2ats, turns=[])
            stats = list(client.reply("send", PROMPT))[-1]
            assert isinstance(stats, GenerationStats)
            if a2ats is not None:
                assert stats.stop_reason == "stop" and stats.generation_tokens == end
    finally:
        client.close()


@pytest.mark.demo
@pytest.mark.filterwarnings("ignore:A2ATS. no codebook given")
def test_the_demo_ending_its_reply_leaves_the_ranks_in_step(two_ranks, tmp_path):
    """The demo ends a short answer with its end-of-turn token, telemetry on: before the ranks
    waited for mlx-lm's stream at the end of a reply, this hung (the tiny model's timing hides
    the race; the test above pins the path)."""
    from tests.demo_gate import require_demo

    require_demo()
    client = RanksClient(local_hosts(tmp_path), "demo", port=free_port(), peer_timeout=60)
    try:
        sampling = SamplingSettings(temperature=0.0, max_tokens=64)
        config = A2ATSConfig(exact_below=0, telemetry=True)
        for text in ("Say hello in one word.", "Now say goodbye in one word."):
            client.configure(system_prompt=None, sampling=sampling, a2ats=config, turns=[])
            stats = list(client.reply("send", text))[-1]
            assert isinstance(stats, GenerationStats) and stats.stop_reason == "stop"
    finally:
        client.close()


@pytest.mark.filterwarnings("ignore:A2ATS. no codebook given")
def test_a_reply_without_a_seed_is_sampled_alike_on_every_rank(tiny_ranks):
    """The app sends no seed by default: the ranks draw one per reply from rank 0 (each with its
    own seed, they fed different tokens to their layers; the reply's end now checks every
    rank's tokens against rank 0's and says so)."""
    client, _, _ = tiny_ranks
    sampling = SamplingSettings(temperature=1.0, max_tokens=24)
    a2ats = A2ATSConfig(window=16, budget=8, exact_below=0, telemetry=True)
    replies = []
    for _ in range(2):
        client.configure(system_prompt=None, sampling=sampling, a2ats=a2ats, turns=[])
        events = list(client.reply("send", PROMPT))  # ValueError when the ranks' tokens differ
        assert isinstance(events[-1], GenerationStats)
        replies.append([e.token_id for e in events if isinstance(e, TokenEvent)])
    assert replies[0] != replies[1]  # still a fresh draw per reply


def test_stop_ends_the_reply_on_every_rank_and_the_ranks_carry_on(tiny_ranks):
    client, _, _ = tiny_ranks
    _greedy_plain(client, max_tokens=3000)
    seen = 0
    stats = None
    for event in client.reply("send", PROMPT):
        if isinstance(event, TokenEvent):
            seen += 1
            if seen == 5:
                client.stop()
        elif isinstance(event, GenerationStats):
            stats = event
    assert stats is not None and stats.stop_reason == "cancelled"
    assert 5 <= stats.generation_tokens < 1000  # the ranks may run ahead of the reader
    with pytest.raises(ValueError, match="unknown request"):
        client.request("nonsense")
    again = [e for e in client.reply("send", "and again") if isinstance(e, GenerationStats)]
    assert again and again[0].generation_tokens > 0  # the ranks still serve


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads CPU time in /proc")
def test_ranks_waiting_for_the_next_request_cost_next_to_no_cpu(tiny_ranks):
    """A rank waiting inside an MLX collective spins a core (~1 CPU-s a second here); the
    served ranks check for a request on a timer instead (serve._next_request)."""
    client, _, _ = tiny_ranks
    client.request("clear_codebook")  # the ranks answer requests, then wait
    time.sleep(3.0)  # past the quick checks right after a request
    before = group_cpu(client._process.pid)
    time.sleep(4.0)
    used = group_cpu(client._process.pid) - before
    assert used < 0.8, f"the idle ranks used {used:.2f} CPU-s in 4 s"
    assert client.request("clear_codebook") == {"ev": "ok"}  # and still answer at once


@pytest.mark.skipif(not Path("/proc/self/environ").exists(), reason="finds rank 1 in /proc")
def test_a_rank_killed_mid_reply_is_reported_in_bounded_time(tiny_ranks):
    client, _, _ = tiny_ranks
    _greedy_plain(client, max_tokens=100000)
    rank1 = rank_pid(client._process.pid, 1)
    killed_at = None
    with pytest.raises(RanksLost, match="lost a rank|no progress|ended"):
        for event in client.reply("send", PROMPT):
            if isinstance(event, TokenEvent) and killed_at is None and event.index == 3:
                os.kill(rank1, signal.SIGKILL)
                killed_at = time.monotonic()
            assert killed_at is None or time.monotonic() - killed_at < 90, "still replying"
    assert killed_at is not None and time.monotonic() - killed_at < 60
    assert not client.alive
    with pytest.raises(RanksLost, match="load the model again"):
        client.fit("send", "x", context_length=None, policy="ask")


def test_unreachable_host_is_one_clear_error(tmp_path):
    hosts = tmp_path / "hosts.json"
    hosts.write_text('[{"ssh": "no-such-host.invalid", "ips": ["10.255.255.1"]},'
                     ' {"ssh": "no-such-host.invalid", "ips": ["10.255.255.1"]}]')  # fmt: skip
    t0 = time.monotonic()
    with pytest.raises(RanksLost) as caught:
        RanksClient(hosts, "demo", port=free_port(), start_timeout=120)
    assert time.monotonic() - t0 < 120
    assert "no-such-host.invalid" in str(caught.value) or "ssh" in str(caught.value).lower()


def test_bad_hosts_file_is_refused_before_anything_starts(tmp_path):
    bad = tmp_path / "hosts.json"
    bad.write_text("not json")
    with pytest.raises(ValueError, match="not JSON"):
        RanksClient(bad, "demo")
    assert threading.active_count() >= 1
