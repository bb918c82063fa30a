"""`a2ats chat` on a saved tiny model folder: one-shot, REPL, cache choice, bad input."""

from __future__ import annotations

import io
import re
import signal
import subprocess
import sys

import pytest
from demo_gate import require_demo
from tiny import save_tiny_model

from a2ats_engine.cache.telemetry import TokenEvent
from a2ats_engine.cli import build_parser, main
from a2ats_engine.loading.models import load_model
from a2ats_engine.session import ChatSession, SamplingSettings

STATS = re.compile(
    r"^\[(\d+) prompt tokens, (\d+) generated, TTFT \d+\.\d\d s, \d+\.\d tok/s, "
    r"peak \d+\.\d\d GB, (stop|length)\]$"
)


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return save_tiny_model(tmp_path_factory.mktemp("tiny") / "model", "llama")


def expected_reply(folder, messages, max_tokens=8, system=None):
    """(reply text, prompt tokens) of a greedy ChatSession over the same folder."""
    model, tokenizer, _ = load_model(str(folder))
    session = ChatSession(
        model,
        tokenizer,
        system_prompt=system,
        sampling=SamplingSettings(temperature=0.0, max_tokens=max_tokens),
    )
    for text in messages:
        events = list(session.send(text))
    reply = "".join(e.text for e in events if isinstance(e, TokenEvent))
    return reply, events[-1].prompt_tokens


def stats_lines(err: str) -> list[re.Match]:
    return [m for line in err.splitlines() if (m := STATS.match(line))]


def test_one_shot_prints_reply_and_stats(folder, capsys):
    rc = main(
        [
            "chat",
            "--model",
            str(folder),
            "--prompt",
            "Hello! How are you?",
            "--temp",
            "0",
            "--max-tokens",
            "8",
            "--system",
            "Be brief.",
        ]
    )
    out, err = capsys.readouterr()
    assert rc == 0
    reply, prompt_tokens = expected_reply(folder, ["Hello! How are you?"], system="Be brief.")
    assert out == reply + "\n"
    (stats,) = stats_lines(err)
    assert int(stats.group(1)) == prompt_tokens
    assert 1 <= int(stats.group(2)) <= 8


def test_repl_multi_turn_reset_and_eof(folder, capsys, monkeypatch):
    monkeypatch.setattr(sys, "stdin", io.StringIO("Hello!\nThe quick brown fox?\n/reset\nHi\n"))
    rc = main(["chat", "--model", str(folder), "--temp", "0", "--max-tokens", "6"])
    out, err = capsys.readouterr()
    assert rc == 0  # Ctrl-D (end of input) ends the REPL
    stats = stats_lines(err)
    assert len(stats) == 3
    two_turns, second_prompt = expected_reply(folder, ["Hello!", "The quick brown fox?"], 6)
    assert int(stats[1].group(1)) == second_prompt  # the second turn reused the first's cache
    after_reset, reset_prompt = expected_reply(folder, ["Hi"], 6)
    assert int(stats[2].group(1)) == reset_prompt  # /reset started a fresh conversation
    assert two_turns in out and after_reset in out
    assert "conversation cleared" in err


def test_repl_exit_command(folder, capsys, monkeypatch):
    monkeypatch.setattr(sys, "stdin", io.StringIO("/exit\nHello!\n"))
    assert main(["chat", "--model", str(folder)]) == 0
    _, err = capsys.readouterr()
    assert stats_lines(err) == []


def test_a2ats_cache_with_codebook_file(folder, tmp_path, capsys):
    from a2ats_engine.cache.codebook import Codebook

    path = tmp_path / "cb.safetensors"
    Codebook.random(2, 2, 16, 32).save(path)
    rc = main(
        [
            "chat",
            "--model",
            str(folder),
            "--prompt",
            "Hello!",
            "--temp",
            "0",
            "--max-tokens",
            "5",
            "--cache",
            "a2ats",
            "--codebook",
            str(path),
            "--budget",
            "4",
            "--window",
            "8",
        ]
    )
    out, err = capsys.readouterr()
    assert rc == 0
    assert f"cache: a2ats, codebook {path}" in err
    assert "no model fingerprint" in err  # validate_for's warning, printed once as a note
    assert err.count("no model fingerprint") == 1
    assert len(stats_lines(err)) == 1 and out.endswith("\n")


def test_codebook_in_model_folder_is_the_default(tmp_path, capsys):
    from a2ats_engine.cache.codebook import Codebook

    model_dir = save_tiny_model(tmp_path / "model", "llama")
    Codebook.random(2, 2, 16, 32).save(model_dir / "codebook.safetensors")
    args = ["chat", "--model", str(model_dir), "--prompt", "Hi", "--max-tokens", "3"]
    assert main(args) == 0
    assert "cache: a2ats" in capsys.readouterr().err
    assert main([*args, "--cache", "full"]) == 0
    assert "cache: a2ats" not in capsys.readouterr().err


def _chat_with_codebook(tmp_path, monkeypatch) -> tuple[list[str], list]:
    """`a2ats chat` arguments for a one-shot reply from a tiny model with a codebook in its
    folder, and the list each chat's A2ATS config is appended to (a spy on ChatSession)."""
    from a2ats_engine.cache.codebook import Codebook
    from a2ats_engine.session import ChatSession

    model_dir = save_tiny_model(tmp_path / "model", "llama")
    Codebook.random(2, 2, 16, 32).save(model_dir / "codebook.safetensors")
    configs = []
    init = ChatSession.__init__

    def spy(self, *a, **kw):
        configs.append(kw.get("a2ats"))
        init(self, *a, **kw)

    monkeypatch.setattr(ChatSession, "__init__", spy)
    return ["chat", "--model", str(model_dir), "--prompt", "Hi", "--max-tokens", "3"], configs


def test_the_default_estimate_follows_the_measurement_and_the_chat_says_so(
    tmp_path, capsys, monkeypatch
):
    """Where this machine's crossover row measured the estimate to cost nothing, the default
    (speed) chat runs with it (the caches decide: the config keeps None) and says so; where it
    cost more, without."""
    from a2ats_engine.cache import crossover as xo
    from a2ats_engine.cache.a2ats_cache import A2ATSCache

    args, configs = _chat_with_codebook(tmp_path, monkeypatch)
    monkeypatch.setenv("A2ATS_CROSSOVER_FILE", str(tmp_path / "crossover.json"))
    made = []
    configure = A2ATSCache._configure

    def spy(self, *a, **kw):
        configure(self, *a, **kw)
        made.append(self)

    monkeypatch.setattr(A2ATSCache, "_configure", spy)
    for ratio, on in ((0.99, True), (0.8, False)):
        xo.reload_user_table()
        xo.record_crossover({
            "backend": xo.backend(), "machine": xo.machine_id(), "layers": 2, "kv_heads": 2,
            "head_dim": 16, "exact_below": 640, "never": False, "estimate": {"ratio": ratio},
        })  # fmt: skip
        made.clear()
        assert main(args) == 0
        err = capsys.readouterr().err
        assert "preset speed, rerank 2" in err and "exact until 640 tokens" in err
        said = "missed-attention estimate (mean slot scores, measured to cost nothing here)"
        assert (said in err) is on and configs[-1].estimate_missed is None
        assert made and all(c.estimates is on for c in made)
    xo.reload_user_table()


def test_the_estimate_flag_turns_the_missed_attention_estimate_on(tmp_path, capsys, monkeypatch):
    """`--estimate mean` runs the chat's A2ATS caches with the estimate (said on stderr, and
    the caches built with it); with --hosts the flags go to the ranks."""
    args, configs = _chat_with_codebook(tmp_path, monkeypatch)
    assert main([*args, "--estimate", "mean"]) == 0
    assert "missed-attention estimate (mean slot scores)" in capsys.readouterr().err
    assert configs and configs[-1].estimate_missed and configs[-1].estimate_scores == "mean"
    # across hosts the ranks get it (tests/engine/distributed runs them)
    from a2ats_engine.distributed.launch import launch_command

    parsed = build_parser().parse_args([*args, "--estimate", "mean", "--preset", "quality"])
    hosts = tmp_path / "hosts.json"
    hosts.write_text('[{"ssh": "localhost"}]')
    command = launch_command(parsed, hosts)
    assert command[command.index("--estimate") + 1] == "mean"
    assert command[command.index("--preset") + 1] == "quality"


def test_the_preset_flag_sets_the_rerank_and_the_estimate_and_flags_override_it(
    tmp_path, capsys, monkeypatch
):
    """`--preset quality` = rerank 4 with the estimate (mean slot scores), said on stderr and
    the caches built with it; `--estimate` and `--rerank` override the preset's; `--preset
    speed` (the default) is A2ATSConfig()'s, its estimate decided by the measurement; a bad --rerank fails before the model loads or a
    rank starts."""
    from a2ats_engine.cache.config import A2ATSConfig

    args, configs = _chat_with_codebook(tmp_path, monkeypatch)
    assert main([*args, "--preset", "quality"]) == 0
    err = capsys.readouterr().err
    assert "preset quality, rerank 4; missed-attention estimate (mean slot scores)" in err
    assert (configs[-1].rerank, configs[-1].estimate_missed) == (4, True)
    assert configs[-1].estimate_scores == "mean"
    assert main([*args, "--preset", "quality", "--estimate", "off"]) == 0
    err = capsys.readouterr().err
    assert "preset custom, rerank 4" in err and "missed-attention" not in err
    assert (configs[-1].rerank, configs[-1].estimate_missed) == (4, False)
    assert main([*args, "--preset", "quality", "--rerank", "3"]) == 0
    assert "preset custom, rerank 3;" in capsys.readouterr().err
    assert (configs[-1].rerank, configs[-1].estimate_missed) == (3, True)
    assert main([*args, "--preset", "speed"]) == 0
    err = capsys.readouterr().err
    assert "preset speed, rerank 2" in err and "missed-attention" not in err
    # the default's estimate is left to this machine's measurement (the caches decide)
    assert (configs[-1].rerank, configs[-1].estimate_missed) == (A2ATSConfig().rerank, None)
    calls = len(configs)
    hosts = tmp_path / "hosts.json"
    hosts.write_text('[{"ssh": "localhost"}]')
    for extra in ([], ["--hosts", str(hosts)]):  # refused before any model or rank starts
        assert main([*args, "--rerank", "0", *extra]) == 1
        assert "rerank" in capsys.readouterr().err and len(configs) == calls


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--cache", "a2ats"], "--cache a2ats needs a codebook"),
        (["--temp", "-1"], "SamplingSettings.temperature=-1.0"),
        (["--max-tokens", "0"], "--max-tokens=0 is out of range"),
        (["--cache", "a2ats", "--codebook", "/no/such/codebook.safetensors"], "codebook"),
    ],
)
def test_bad_settings_give_one_line_error(folder, capsys, extra, message):
    rc = main(["chat", "--model", str(folder), "--prompt", "Hi", *extra])
    _, err = capsys.readouterr()
    assert rc == 1
    assert len(err.strip().splitlines()) == 1
    assert err.startswith("a2ats chat: error:") and message in err


def test_missing_model_path_exits_1_with_one_line(tmp_path):
    missing = tmp_path / "no-such-model"
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "a2ats_engine.cli",
            "chat",
            "--model",
            str(missing),
            "--prompt",
            "Hi",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.stderr
    assert lines[0].startswith("a2ats chat: error:") and str(missing) in lines[0]
    assert result.stdout == ""


def test_help_says_where_stats_go(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["chat", "--help"])
    assert exit_info.value.code == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "stderr" in text and "--prompt" in text and "--cache {a2ats,full}" in text


def test_ctrl_c_in_repl_cancels_the_reply_not_the_repl(folder):
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "a2ats_engine.cli",
            "chat",
            "--model",
            str(folder),
            "--temp",
            "0",
            "--max-tokens",
            "100000",
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        proc.stdin.write("Hello! How are you?\n")
        proc.stdin.flush()
        assert proc.stdout.read(len(">>> ") + 1)  # the reply has started streaming
        proc.send_signal(signal.SIGINT)
        proc.stdin.write("/exit\n")
        proc.stdin.flush()
        _, err = proc.communicate(timeout=300)
    finally:
        proc.kill()
    assert proc.returncode == 0
    (stats,) = [line for line in err.splitlines() if line.startswith("[")]
    assert stats.endswith(", cancelled]")


@pytest.mark.demo
def test_demo_one_shot_names_paris(capsys):
    require_demo()
    question = "What is the capital of France? Answer in one sentence."
    rc = main(
        [
            "chat",
            "--model",
            "demo",
            "--prompt",
            question,
            "--temp",
            "0",
            "--max-tokens",
            "40",
            "--cache",
            "full",
        ]
    )
    out, err = capsys.readouterr()
    assert rc == 0 and "Paris" in out
    assert len(stats_lines(err)) == 1
