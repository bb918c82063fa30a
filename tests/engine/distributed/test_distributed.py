"""The model split over MLX distributed ranks (a2ats_engine/distributed/).

Unit tests run in this process (a group of one). The two-rank tests start two processes on the
loopback address with mlx.launch's ring backend (or, to kill one, the same environment by hand)
and compare what they print and record (`--stats-json`) with one process run here.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import mlx.core as mx
import pytest

from a2ats_engine.cache.codebook import Codebook
from a2ats_engine.cache.config import A2ATSConfig
from a2ats_engine.cache.layer_plan import A2ATS, NATIVE, LayerChoice, LayerPlan
from a2ats_engine.cache.model_cache import attention_steps, model_codebook_bytes
from a2ats_engine.distributed.codebook import load_rank_codebook
from a2ats_engine.distributed.launch import launch_command, launcher, read_hosts
from a2ats_engine.distributed.pipeline import (
    RemoteCache,
    pipeline_caches,
    shard_pipeline,
    split_layers,
    stage_for,
)
from a2ats_engine.distributed.plan import join_plans
from a2ats_engine.session import ChatSession, SamplingSettings
from tests.demo_gate import require_demo
from tests.tiny import save_tiny_model, tiny_model
from tests.two_ranks import free_port, local_hosts

ROOT = Path(__file__).resolve().parents[3]
PYTHON = sys.executable
LAUNCH = launcher()  # mlx.launch, its I/O relay calmed (launcher.py)
TIMEOUT = 600  # a bound for a whole two-rank run on a busy machine, not a speed assertion


# -- unit ----------------------------------------------------------------------------------


def test_split_layers_even_custom_and_refused():
    assert split_layers(30, 2) == [15, 15]
    assert split_layers(5, 2) == [3, 2]  # rank 0 (the last layers) takes the extra one
    assert split_layers(4, 2, [1, 3]) == [1, 3]
    for bad in ([2, 2, 0], [1, 1], [0, 4]):
        with pytest.raises(ValueError, match="split="):
            split_layers(4, 2 if len(bad) == 2 else 3, bad)


class _Group:
    def __init__(self, rank: int, size: int) -> None:
        self._rank, self._size = rank, size

    def rank(self) -> int:
        return self._rank

    def size(self) -> int:
        return self._size


def test_stage_rank0_serves_the_last_layers():
    first, last = stage_for(_Group(1, 2), 5), stage_for(_Group(0, 2), 5)
    assert (first.start, first.end) == (0, 2)
    assert (last.start, last.end) == (2, 5)


def test_group_of_one_leaves_the_model_as_it_is():
    model = tiny_model("llama")
    layers = list(model.model.layers)
    stage = shard_pipeline(model, mx.distributed.init())
    assert stage.size == 1 and list(model.model.layers) == layers
    assert pipeline_caches([1, 2], stage) == [1, 2]


def test_remote_cache_counts_tokens_masks_and_trims_like_kvcache():
    from mlx_lm.models.cache import KVCache

    remote, kv = RemoteCache(), KVCache()
    remote.offset = 5
    kv.update_and_fetch(mx.zeros((1, 2, 5, 4)), mx.zeros((1, 2, 5, 4)))
    for n in (1, 3):
        kw = {"return_array": True, "window_size": None}
        a, b = remote.make_mask(n, **kw), kv.make_mask(n, **kw)
        assert (a is None) == (b is None)
        if a is not None:
            assert mx.array_equal(a, b)
    assert remote.trim(2) == 2 and remote.offset == 3
    assert remote.nbytes == 0
    remote.pending = mx.ones((2,))
    assert len(remote.state) == 1 and remote.state == []  # handed out once


def test_join_plans_takes_each_layer_from_the_rank_serving_it():
    rows = [
        {
            "model_type": "llama",
            "choices": [
                {"layer": 2, "kind": A2ATS, "reason": "", "head_dim": 16, "n_kv_heads": 2},
                {
                    "layer": 3,
                    "kind": NATIVE,
                    "reason": "sliding window 8",
                    "head_dim": 16,
                    "n_kv_heads": 2,
                },
            ],
            "refused": "",
            "unrouted": False,
            "shared_layers": 0,
        },
        {
            "model_type": "llama",
            "choices": [
                {"layer": 0, "kind": A2ATS, "reason": "", "head_dim": 16, "n_kv_heads": 2},
                {"layer": 1, "kind": A2ATS, "reason": "", "head_dim": 16, "n_kv_heads": 2},
            ],
            "refused": "",
            "unrouted": False,
            "shared_layers": 0,
        },
    ]
    plan = join_plans(rows, 4)
    assert plan.a2ats_layers == (0, 1, 2) and plan.refused is None
    assert plan.layers[3] == LayerChoice(3, NATIVE, "sliding window 8", 16, 2)
    assert join_plans(rows[:1], 4).refused  # a rank missing: refused, not guessed
    assert isinstance(plan, LayerPlan)


def test_rank_codebook_holds_only_its_layers_and_codes_as_the_full_one(tmp_path):
    book = Codebook.random(4, 2, 16, 64, seed=1)
    path = tmp_path / "book.safetensors"
    book.save(path)
    full = Codebook.load(path)
    part = load_rank_codebook(path, range(2, 4))
    keys = mx.random.normal((1, 2, 7, 16))
    assert mx.array_equal(part.assign(3, keys), full.assign(3, keys))

    def rows(layers):
        return sum(
            a[i].nbytes for a in (full.centroids, full.assign_centroids, full.chol) for i in layers
        )

    weights = full.nbytes - rows(range(4))  # layer 3's assignment matrix, built by `assign`
    assert part.nbytes == rows((2, 3)) + weights
    assert part.sha256 == full.sha256 and part.num_layers == 4
    with pytest.raises(ValueError, match="another rank"):
        part.assign(0, keys)


def _module(command: list) -> str:
    """The module the ranks run (after the calmed launcher's own `-m`)."""
    assert command[: len(LAUNCH)] == LAUNCH
    return command[len(command) - 1 - command[::-1].index("-m") + 1]


def test_hosts_file_and_launch_command(tmp_path):
    hosts = tmp_path / "hosts.json"
    hosts.write_text(json.dumps([{"ssh": "127.0.0.1", "ips": ["127.0.0.1"]}] * 2))
    assert len(read_hosts(hosts)) == 2
    import argparse

    args = argparse.Namespace(model="demo", temp=0.0, prompt="hi", seed=None, budget=0.03)
    command = launch_command(args, hosts, port=40000)
    assert _module(command) == "a2ats_engine.distributed"
    assert command[command.index("--hostfile") + 1] == str(hosts)
    assert "--seed" not in command and command[command.index("--temp") + 1] == "0.0"
    bad = tmp_path / "bad.json"
    bad.write_text('{"hosts": [{"ips": []}]}')
    with pytest.raises(ValueError, match="ssh"):
        read_hosts(bad)
    with pytest.raises(ValueError, match="no such file"):
        read_hosts(tmp_path / "none.json")


# -- two ranks on the loopback address --------------------------------------------------------


def _env() -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    return env


def _launch(tmp_path: Path, args: list[str]) -> subprocess.CompletedProcess:
    command = [*LAUNCH, "--backend", "ring", "--hostfile", str(local_hosts(tmp_path))]
    command += ["--starting-port", str(free_port()), "--python", PYTHON]
    command += ["-m", "a2ats_engine.distributed", *args]
    proc = subprocess.Popen(
        command,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=_env(),
        cwd=tmp_path,
        start_new_session=True,  # the ranks are in its process group: a hang ends them all
    )
    try:
        out, err = proc.communicate(timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
    return subprocess.CompletedProcess(command, proc.returncode, out, err)


def _ranks(prefix: Path) -> list[dict]:
    return [json.loads(Path(f"{prefix}.rank{r}.json").read_text()) for r in range(2)]


def _reference(model_dir: Path, codebook: Path, config: A2ATSConfig, prompt: str, sampling):
    """Tokens, cache bytes, retrieved steps and codebook bytes of the chat on one process."""
    from a2ats_engine.cache.telemetry import TokenEvent
    from a2ats_engine.loading.models import load_model

    model, tokenizer, _ = load_model(str(model_dir))
    session = ChatSession(
        model, tokenizer, sampling=sampling, a2ats=config, codebook=Codebook.load(codebook)
    )
    tokens = [e.token_id for e in session.send(prompt) if isinstance(e, TokenEvent)]
    held = sum(int(c.nbytes) for c in session.caches)
    book_bytes = model_codebook_bytes(session.caches)
    return tokens, held, attention_steps(session.caches)[0], book_bytes


PROMPT = (
    "The ring backend carries one hidden state per decode step from the first layers to the "
    "last. Each rank keeps codes, keys and values for its own layers only, so the cache "
    "halves on two ranks while the tokens stay those of one process."
)


# a random codebook file on purpose: both sides run the same one (the one-process reference here)
@pytest.mark.filterwarnings("ignore:codebook records no model fingerprint")
@pytest.mark.parametrize(
    ("arch", "flags", "knobs"),
    [
        ("llama", [], {}),
        # the estimate and a wider rerank on the ranks: forwarded, each rank's sums its layers'
        ("qwen3", ["--estimate", "mean", "--rerank", "3"], {"estimate_missed": True, "rerank": 3}),
    ],
)
def test_two_ranks_sample_the_tokens_of_one_process_with_half_the_cache(
    two_ranks, tmp_path, arch, flags, knobs
):
    """Sampled (temperature 1, one seed) so a wrong hidden state or seed shows in the tokens;
    A2ATS retrieves from the first decode step (exact_below 0, small window and budget)."""
    extra = {"head_dim": 16} if arch == "qwen3" else {}  # qwen3's file has its own pipeline()
    model_dir = save_tiny_model(tmp_path / "tiny", arch, num_hidden_layers=4, seed=3, **extra)
    book = tmp_path / "book.safetensors"
    Codebook.random(4, 2, 16, 64, seed=2).save(book)
    options = ["--model", str(model_dir), "--codebook", str(book), "--temp", "1.0"]
    options += ["--seed", "11", "--max-tokens", "24", "--window", "16", "--budget", "8"]
    options += ["--exact-below", "0", "--prompt", PROMPT, "--stats-json", str(tmp_path / "s")]
    done = _launch(tmp_path, [*options, *flags])
    assert done.returncode == 0, done.stderr[-2000:]
    if knobs.get("estimate_missed"):
        assert "rerank 3; missed-attention estimate (mean slot scores)" in done.stderr
    ranks = _ranks(tmp_path / "s")
    config = A2ATSConfig(window=16, budget=8, exact_below=0, **knobs)
    sampling = SamplingSettings(temperature=1.0, seed=11, max_tokens=24)
    tokens, held, retrieved, _ = _reference(model_dir, book, config, PROMPT, sampling)
    assert retrieved > 0  # the comparison covers retrieval, not only exact attention
    assert len(set(tokens)) > 3
    for rank in ranks:
        assert rank["replies"][0]["tokens"] == tokens
    assert [r["layers"] for r in ranks] == [[2, 4], [0, 2]]
    per_rank = [r["replies"][0]["cache_bytes"] for r in ranks]
    if knobs.get("estimate_missed"):  # the estimate's sums are stacked per cache list
        # (`StepSums`), each list's rows as many as its layer with the most: two ranks' lists
        # hold a slightly different total than one process's
        assert sum(per_rank) == pytest.approx(held, rel=0.05) and sum(per_rank) != 0
    else:
        assert sum(per_rank) == held
    assert all(0.4 * held <= b <= 0.6 * held for b in per_rank)
    assert ranks[0]["replies"][0]["sent_bytes_per_decode_step"] == 64 * 4  # the gather
    assert ranks[1]["replies"][0]["sent_bytes_per_decode_step"] == 2 * 64 * 4  # send + gather


@pytest.mark.filterwarnings("ignore:codebook records no model fingerprint")
def test_two_ranks_split_by_heads_sample_the_tokens_of_one_process(two_ranks, tmp_path):
    """`--tensor`: mlx-lm's shard() splits every layer by heads; each rank's A2ATS caches and
    codebook rows are its KV head's, and the sampled tokens are one process's, with the quality
    preset (rerank 4) and the missed-attention estimate (each rank's sums its KV head's)."""
    model_dir = save_tiny_model(tmp_path / "tiny", "llama", num_hidden_layers=4, seed=3)
    book = tmp_path / "book.safetensors"
    Codebook.random(4, 2, 16, 64, seed=2).save(book)
    options = ["--tensor", "--model", str(model_dir), "--codebook", str(book), "--temp", "1.0"]
    options += ["--seed", "11", "--max-tokens", "16", "--window", "16", "--budget", "8"]
    options += ["--exact-below", "0", "--prompt", PROMPT, "--stats-json", str(tmp_path / "s")]
    done = _launch(tmp_path, [*options, "--preset", "quality"])  # with the estimate
    assert done.returncode == 0, done.stderr[-2000:]
    assert "rank 1 of 2: KV heads 1-1 of 2 in all 4 layers (tensor split)" in done.stderr
    assert "preset quality, rerank 4; missed-attention estimate (mean" in done.stderr
    ranks = _ranks(tmp_path / "s")
    config = A2ATSConfig(window=16, budget=8, exact_below=0, rerank=4, estimate_missed=True)
    sampling = SamplingSettings(temperature=1.0, seed=11, max_tokens=16)
    tokens, held, retrieved, book_bytes = _reference(model_dir, book, config, PROMPT, sampling)
    assert retrieved > 0 and len(set(tokens)) > 3
    for rank in ranks:
        reply = rank["replies"][0]
        assert reply["tokens"] == tokens
        assert rank["layers"] == [0, 4]  # every layer, its own head
        assert 0.4 * held <= reply["cache_bytes"] <= 0.6 * held
        assert reply["codebook_bytes"] <= 0.6 * book_bytes
        # two ring all_sums of the hidden state (64 float32) per layer; in a ring of 2 each
        # rank sends 2 (n - 1) / n = 1 times the array per all_sum
        assert reply["sent_bytes_per_decode_step"] == 4 * 2 * 64 * 4


def test_a_tensor_split_is_refused_by_name_where_it_cannot_run():
    from a2ats_engine.distributed.tensor import shard_tensor
    from a2ats_engine.errors import ModelNotSupportedError

    class Two:
        def size(self) -> int:
            return 2

        def rank(self) -> int:
            return 0

    odd = tiny_model("llama", num_attention_heads=3, num_key_value_heads=3, hidden_size=48)
    with pytest.raises(ValueError, match="3 query and 3 KV heads: a tensor split over 2 ranks"):
        shard_tensor(odd, Two())
    with pytest.raises(ModelNotSupportedError, match="gemma3_text: .* no shard"):
        shard_tensor(tiny_model("gemma3_text"), Two())


def test_a2ats_chat_tensor_needs_hosts(capsys):
    from a2ats_engine.cli import main

    assert main(["chat", "--tensor", "--prompt", "hi"]) != 0
    assert "--tensor splits the model over hosts" in capsys.readouterr().err


@pytest.mark.demo
def test_demo_two_ranks_greedy_equals_one_process(two_ranks, tmp_path):
    folder = require_demo()
    from a2ats_engine.data_dirs import demo_codebook_path

    book = demo_codebook_path()
    if not book.is_file():
        message = "the demo codebook is not built (run `a2ats fetch-demo`)"
        if os.environ.get("A2ATS_REQUIRE_DEMO") == "1":  # CI: the demo tests never skip
            pytest.fail(f"A2ATS_REQUIRE_DEMO=1: {message}")
        pytest.skip(message)
    prompt = "Explain in three sentences why the sky is blue. " + PROMPT * 3
    options = ["--model", "demo", "--temp", "0", "--max-tokens", "12", "--exact-below", "0"]
    options += ["--prompt", prompt, "--stats-json", str(tmp_path / "d")]
    done = _launch(tmp_path, options)
    assert done.returncode == 0, done.stderr[-2000:]
    ranks = _ranks(tmp_path / "d")
    config = A2ATSConfig(exact_below=0, far_offset=int(Codebook.load(book).metadata["far_offset"]))
    sampling = SamplingSettings(temperature=0.0, max_tokens=12)
    tokens, held, retrieved, book_bytes = _reference(folder, book, config, prompt, sampling)
    assert retrieved > 0
    for rank in ranks:
        assert rank["replies"][0]["tokens"] == tokens
    per_rank = [r["replies"][0]["cache_bytes"] for r in ranks]
    assert sum(per_rank) == held and all(0.4 * held <= b <= 0.6 * held for b in per_rank)
    books = [r["replies"][0]["codebook_bytes"] for r in ranks]  # each rank: its layers' rows
    assert sum(books) == book_bytes and all(b <= 0.6 * book_bytes for b in books)


@pytest.mark.parametrize("how", [signal.SIGKILL, signal.SIGSTOP], ids=["killed", "hung"])
def test_lost_rank_is_reported_on_rank0_in_bounded_time(two_ranks, tmp_path, how):
    """Rank 1 is killed (MLX's ring error) or stopped (the watchdog, --peer-timeout 20) mid-reply;
    rank 0 prints an error and ends."""
    model_dir = save_tiny_model(tmp_path / "tiny", "llama", num_hidden_layers=4)
    port = free_port()
    hostfile = tmp_path / "ring.json"
    hostfile.write_text(json.dumps([[f"127.0.0.1:{port}"], [f"127.0.0.1:{port + 1}"]]))
    options = ["--model", str(model_dir), "--cache", "full", "--temp", "0"]
    options += ["--max-tokens", "3000", "--peer-timeout", "20"]
    procs = []
    for rank in range(2):
        env = _env() | {"MLX_RANK": str(rank), "MLX_HOSTFILE": str(hostfile)}
        procs.append(
            subprocess.Popen(
                [PYTHON, "-m", "a2ats_engine.distributed", *options],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                env=env,
                cwd=tmp_path,
            )
        )
    rank0, rank1 = procs
    try:
        os.set_blocking(rank0.stdout.fileno(), False)
        rank0.stdin.write(b"tell me a long story\n")
        rank0.stdin.flush()
        seen = b""
        deadline = time.monotonic() + TIMEOUT
        while seen.count(b"R") + len(seen) < 40 and time.monotonic() < deadline:
            seen += rank0.stdout.read() or b""
            time.sleep(0.2)
        assert len(seen) >= 20, "rank 0 printed no reply before the kill"
        rank1.send_signal(how)
        killed = time.monotonic()
        rank0.wait(timeout=120)
        waited = time.monotonic() - killed
        err = rank0.stderr.read().decode()
        assert rank0.returncode != 0
        assert "error (rank 0)" in err, err[-1000:]
        assert waited < 60, f"rank 0 took {waited:.0f} s to report the lost rank"
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
            for pipe in (p.stdin, p.stdout, p.stderr):
                pipe.close()


# -- calibration across ranks -----------------------------------------------------------------


def _a2ats_on_hosts(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    """`a2ats ARGS --hosts FILE --port N` through the CLI: two local ranks, a free port."""
    code = "import sys; from a2ats_engine.cli import main; sys.exit(main(sys.argv[1:]))"
    command = [PYTHON, "-c", code, *args, "--hosts", str(local_hosts(tmp_path))]
    command += ["--port", str(free_port())]
    return subprocess.run(command, capture_output=True, text=True, env=_env(), cwd=tmp_path,
                          timeout=TIMEOUT)  # fmt: skip


def test_calibrate_command_forwards_the_options(tmp_path):
    import argparse

    from a2ats_engine.distributed.launch import calibrate_command

    args = argparse.Namespace(model="demo", out="b.safetensors", tokens=4096, centroids=64,
                              text=["a.txt", "b.md"], force=True, seed=None, split="20,10")  # fmt: skip
    command = calibrate_command(args, local_hosts(tmp_path), port=41000)
    assert _module(command) == "a2ats_engine.distributed.calibrate"
    assert [command[i + 1] for i, x in enumerate(command) if x == "--text"] == ["a.txt", "b.md"]
    assert "--force" in command and "--seed" not in command
    assert command[command.index("--split") + 1] == "20,10"
    assert command[command.index("--starting-port") + 1] == "41000"


def test_calibrate_refuses_port_or_split_without_hosts(capsys):
    from a2ats_engine.cli import main

    for flag in (["--port", "40000"], ["--split", "2,2"]):
        assert main(["calibrate", "--model", "demo", "--out", "x.safetensors", *flag]) != 0
        assert "need --hosts" in capsys.readouterr().err


def test_two_ranks_calibrate_the_codebook_of_one_process(two_ranks, tmp_path):
    """`a2ats calibrate --hosts` on two local ranks: one file for every layer, the model's
    fingerprint, query metrics (Cholesky factors of the query moments) equal to one process's,
    so the hidden states crossed the ranks right; held-out error as one process's (k-means
    draws differ per rank)."""
    from a2ats_engine.cache.codebook_spec import CodebookSpec
    from a2ats_engine.calibration.calibrate import calibrate
    from a2ats_engine.calibration.corpus import load_texts
    from a2ats_engine.loading.models import load_model

    model_dir = save_tiny_model(tmp_path / "tiny", "llama", num_hidden_layers=4, seed=3)
    text = tmp_path / "text.txt"
    words = [
        "ring",
        "ranks",
        "carry",
        "hidden",
        "states",
        "while",
        "codes",
        "keys",
        "and",
        "values",
        "stay",
        "on",
        "each",
    ]
    text.write_text(" ".join(words[(i * 7) % len(words)] for i in range(5000)))
    out = tmp_path / "book.safetensors"
    options = ["--model", str(model_dir), "--out", str(out), "--text", str(text)]
    options += ["--tokens", "2048", "--centroids", "16", "--seed", "4"]
    done = _a2ats_on_hosts(tmp_path, "calibrate", *options)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "from 2 ranks" in done.stdout
    two = Codebook.load(out)
    model, tokenizer, info = load_model(str(model_dir))
    one = calibrate(model, tokenizer, load_texts([str(text)], tokenizer), A2ATSConfig(),
                    spec=CodebookSpec(16), tokens=2048, seed=4, model_name=info.name)  # fmt: skip
    assert two.num_layers == 4 and two.metadata["ranks"] == 2
    assert two.metadata["model"] == one.metadata["model"]
    assert two.metadata["tokens"] == one.metadata["tokens"] == 2048
    for a, b in zip(one.chol, two.chol, strict=True):
        assert float(mx.abs(a - b).max()) < 1e-4
    assert two.validate_for(model) == []
    e1, e2 = one.metadata["heldout_score_error"], two.metadata["heldout_score_error"]
    assert abs(e1 - e2) <= 0.1 * e1
    again = _a2ats_on_hosts(tmp_path, "calibrate", *options)
    assert again.returncode != 0 and "exists (use --force" in again.stderr


# -- evaluation across ranks ------------------------------------------------------------------


def test_eval_on_hosts_refuses_what_it_cannot_do_by_name(tmp_path, capsys):
    from a2ats_engine.cli import main

    hosts = str(local_hosts(tmp_path))
    base = ["eval", "--model", "demo", "--codebook", "x.safetensors", "--hosts", hosts]
    for flags, message in (
        (["--kv-bits", "8", "--rerank", "1"], "--rerank, --kv-bits: not across ranks yet"),
        (["--methods", "a2ats,a2ats_random"], "unknown 'a2ats_random'"),
        (["--port", "80"], "--port=80 is out of range"),
    ):
        assert main([*base, *flags]) != 0
        assert message in capsys.readouterr().err
    assert main(["eval", "--model", "demo", "--split", "2,2"]) != 0
    assert "need --hosts" in capsys.readouterr().err


@pytest.mark.filterwarnings("ignore:codebook records no model fingerprint")
def test_two_ranks_evaluate_the_figures_of_one_process(two_ranks, tmp_path):
    """`a2ats eval --hosts` on two local ranks gives every figure one process gives: recall,
    output error, perplexity, bytes per token and bytes read, for full, a2ats, window and
    oracle_topk (records joined over the ranks, bytes summed)."""
    from a2ats_engine.bench.evaluate import evaluate
    from a2ats_engine.loading.models import load_model

    model_dir = save_tiny_model(tmp_path / "tiny", "qwen3", num_hidden_layers=4, seed=5,
                                head_dim=16)  # fmt: skip
    book = tmp_path / "book.safetensors"
    Codebook.random(4, 2, 16, 64, seed=2).save(book)
    text = tmp_path / "text.txt"
    text.write_text(" ".join(f"w{(i * 37) % 101}" for i in range(3000)))
    options = ["--model", str(model_dir), "--codebook", str(book), "--text", str(text)]
    options += ["--context", "384", "--decode", "12", "--budget", "16", "--json"]
    done = _a2ats_on_hosts(tmp_path, "eval", *options)
    assert done.returncode == 0, done.stderr[-2000:]
    two = json.loads(done.stdout.strip().splitlines()[-1])
    assert two["ranks"] == 2
    got = two["results"][0]["runs"][0]["methods"]
    model, tokenizer, _ = load_model(str(model_dir))
    runs = evaluate(
        model, tokenizer.encode(text.read_text()), context=384, decode=12, budgets=[16],
        codebooks={"a2ats": Codebook.load(book)}, methods=["full", "a2ats", "window", "oracle_topk"],
        config=A2ATSConfig(budget=16, exact_below=0),
    )  # fmt: skip
    want = runs[0].to_dict()["methods"]
    assert set(got) == set(want) == {"full", "a2ats", "window", "oracle_topk"}
    assert want["a2ats"]["recall"] < 1.0  # the figures cover retrieval
    for method, figures in want.items():
        for key in ("recall", "output_rel_error", "ppl", "bytes_per_token", "bytes_read_per_step"):
            assert got[method][key] == pytest.approx(figures[key], rel=1e-4), (method, key)
