"""The app's worker on a model split over two local ranks ("Run on: hosts file"): the real
RanksBackend (app/ranks_backend.py) on mlx.launch's ring backend, the tiny model.

Checked: the model loads on the hosts and says which layers each rank serves; a codebook loads
on every rank; a reply equals one process's tokens with the inspector's telemetry of every
layer; the context view gets each token's ids and text from rank 0 (while streaming and after);
stop ends a reply; a rank killed mid-reply is one error within a bound, the reply ends as an
error and a model loads again; a bad hosts file is refused by name and the model in use stays.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from a2ats_engine.cache.codebook import Codebook
from a2ats_engine.cache.config import A2ATSConfig
from a2ats_engine.cache.telemetry import CacheSnapshot, TokenEvent
from a2ats_engine.loading.models import load_model
from a2ats_engine.records import SamplingSettings
from a2ats_engine.session import ChatSession
from a2ats_engine.token_texts import token_texts
from app.events import (
    ContextTokens,
    GenerationRequest,
    LoadCodebook,
    LoadModel,
    ModelLoaded,
    StopReason,
)
from app.ranks_backend import RanksBackend
from app.settings import CacheSettings
from app.worker import EngineThread
from tests.tiny import save_tiny_model
from tests.two_ranks import free_port, local_hosts, rank_pid

from .helpers import Requests
from .test_worker import Recorder, wait_for

PROMPT = "Each rank serves its own layers; the app shows every one of them. " * 3
CONFIG = A2ATSConfig(window=16, budget=8, exact_below=0)


@pytest.fixture
def ranks_app(two_ranks, tmp_path, qtbot):
    """An engine thread whose models load on two local ranks; the tiny model and a codebook."""
    model_dir = save_tiny_model(tmp_path / "tiny", "llama", num_hidden_layers=4, seed=5)
    book = tmp_path / "book.safetensors"
    Codebook.random(4, 2, 16, 64, seed=4).save(book)
    hosts = local_hosts(tmp_path)
    backends: list[RanksBackend] = []

    def make_ranks(path: str) -> RanksBackend:
        backends.append(RanksBackend(path, port=free_port(), peer_timeout=20))
        return backends[-1]

    thread = EngineThread(ranks_backend=make_ranks)
    thread.send = Requests(thread.worker)
    recorder = Recorder(thread.worker)
    yield thread, recorder, model_dir, book, hosts, backends
    assert thread.shutdown(30000)
    assert all(b.client is None for b in backends), "the ranks end with the app"


def _request(thread, sampling: SamplingSettings, telemetry: bool = True, history=()):
    return GenerationRequest(
        request_id=thread.send.next_request_id(), conversation_id="c1", mode="send",
        text=PROMPT, history=tuple(history), system_prompt="", sampling=sampling,
        cache=CacheSettings(True, CONFIG), telemetry=telemetry,
    )  # fmt: skip


def _load(thread, recorder, qtbot, model_dir, hosts, count=1) -> ModelLoaded:
    thread.send(LoadModel(str(model_dir), "", False, str(hosts)))
    wait_for(qtbot, recorder, "model_loaded", count, timeout=180000)
    return recorder.of("model_loaded")[-1]


@pytest.mark.filterwarnings("ignore:codebook records no model fingerprint")
def test_a_chat_on_two_ranks_is_one_process_chat_with_every_layer_shown(ranks_app, qtbot):
    thread, recorder, model_dir, book, hosts, _ = ranks_app
    loaded = _load(thread, recorder, qtbot, model_dir, hosts)
    assert loaded.hosts == str(hosts) and loaded.info.num_layers == 4
    assert loaded.ranks == ("rank 0 of 2: layers 2-3 of 4", "rank 1 of 2: layers 0-1 of 4")
    thread.send(LoadCodebook(str(book)))
    wait_for(qtbot, recorder, "codebook_loaded", timeout=60000)
    info = recorder.of("codebook_loaded")[-1]
    assert info.num_layers == 4 and info.nbytes == Codebook.load(book).nbytes  # both ranks'
    sampling = SamplingSettings(temperature=1.0, seed=7, max_tokens=12)
    thread.send(_request(thread, sampling))
    wait_for(qtbot, recorder, "generation_finished", timeout=180000)
    assert not recorder.of("failed"), recorder.of("failed")
    tokens = [e.token_id for e in recorder.of("token_generated")]
    snaps = recorder.of("snapshot_ready")
    stats = recorder.of("generation_finished")[-1]
    assert stats.generation_tokens == len(tokens) == 12

    model, tokenizer, _ = load_model(str(model_dir))
    config = A2ATSConfig(window=16, budget=8, exact_below=0, telemetry=True)
    one = ChatSession(
        model, tokenizer, sampling=sampling, a2ats=config, codebook=Codebook.load(book)
    )
    ref = list(one.send(PROMPT))
    assert tokens == [e.token_id for e in ref if isinstance(e, TokenEvent)]
    ref_snaps = [e for e in ref if isinstance(e, CacheSnapshot)]
    assert isinstance(snaps[-1], CacheSnapshot) and len(snaps) == len(ref_snaps)
    assert [layer.layer for layer in snaps[-1].layers] == [0, 1, 2, 3]  # both ranks' layers
    for got, want in zip(snaps[-1].layers, ref_snaps[-1].layers, strict=True):
        assert [s.tolist() for s in got.selected] == [s.tolist() for s in want.selected]

    decode = lambda ids: tokenizer.decode(ids, skip_special_tokens=False)  # noqa: E731
    streaming, final = recorder.of("context_updated")[-2:]
    assert isinstance(streaming, ContextTokens)
    prompt = one.prompt_token_ids(one.messages[:-1])
    assert list(streaming.token_ids) == [*prompt, tokens[0]]  # at the first token
    assert list(streaming.texts[: len(prompt)]) == token_texts(decode, prompt)
    assert list(final.token_ids) == one.cached_token_ids
    assert list(final.texts) == token_texts(decode, one.cached_token_ids)
    assert final.messages[-1][0] == "assistant" and final.messages[0] == ("user", PROMPT)


def test_stop_ends_a_reply_on_the_ranks_and_the_chat_goes_on(ranks_app, qtbot):
    thread, recorder, model_dir, _, hosts, _ = ranks_app
    _load(thread, recorder, qtbot, model_dir, hosts)
    thread.send(_request(thread, SamplingSettings(temperature=0.0, max_tokens=3000), False))
    wait_for(qtbot, recorder, "token_generated", 3, timeout=180000)
    thread.worker.stop()
    wait_for(qtbot, recorder, "generation_finished", timeout=60000)
    stopped = len(recorder.of("token_generated"))
    assert stopped < 1000 and not recorder.of("failed")
    thread.send(_request(thread, SamplingSettings(temperature=0.0, max_tokens=4), False))
    wait_for(qtbot, recorder, "generation_finished", 2, timeout=120000)
    assert recorder.of("generation_finished")[-1].generation_tokens == 4


@pytest.mark.skipif(not Path("/proc/self/environ").exists(), reason="finds rank 1 in /proc")
def test_a_rank_lost_mid_reply_is_one_error_and_the_app_goes_on(ranks_app, qtbot, tmp_path):
    thread, recorder, model_dir, _, hosts, backends = ranks_app
    _load(thread, recorder, qtbot, model_dir, hosts)
    thread.send(_request(thread, SamplingSettings(temperature=0.0, max_tokens=3000), False))
    wait_for(qtbot, recorder, "token_generated", 3, timeout=180000)
    os.kill(rank_pid(backends[-1].client._process.pid, 1), signal.SIGKILL)
    killed = time.monotonic()
    wait_for(qtbot, recorder, "generation_finished", timeout=90000)
    assert time.monotonic() - killed < 60
    assert recorder.of("generation_finished")[-1].stop_reason == StopReason.ERROR
    (error,) = recorder.of("failed")
    assert "lost a rank" in error.message or "ended" in error.message
    assert "load the model again" in error.message
    # a bad hosts file is refused by name, nothing starts
    bad = tmp_path / "bad-hosts.json"
    bad.write_text('{"not": "a list"}')
    thread.send(LoadModel(str(model_dir), "", False, str(bad)))
    wait_for(qtbot, recorder, "failed", 2, timeout=30000)
    assert "bad-hosts.json" in recorder.of("failed")[-1].message
    # the model loads again on the hosts and replies
    _load(thread, recorder, qtbot, model_dir, hosts, count=2)
    thread.send(_request(thread, SamplingSettings(temperature=0.0, max_tokens=3), False))
    wait_for(qtbot, recorder, "generation_finished", 2, timeout=120000)
    assert recorder.of("generation_finished")[-1].generation_tokens == 3
