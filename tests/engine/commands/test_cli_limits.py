"""Every number a CLI flag takes is range-checked before any work: before the model loads,
before ablation codebooks are trained, before any prefill (commands/_limits.py)."""

from __future__ import annotations

import pytest
from tiny import save_tiny_model

from a2ats_engine.cli import main
from a2ats_engine.commands import _limits


@pytest.fixture
def no_work(monkeypatch):
    """Any model load, geometry build or calibration fails the test: the check must come first."""

    def refuse(*args, **kwargs):
        raise AssertionError("work started before the flags were checked")

    monkeypatch.setattr("a2ats_engine.loading.models.load_model", refuse)
    monkeypatch.setattr("a2ats_engine.bench.geometries.geometry_model", refuse)
    monkeypatch.setattr("a2ats_engine.calibration.calibrate.calibrate", refuse)


BAD = [
    (["bench", "decode", "--contexts", "100000000000"], "--contexts: 100,000,000,000 is out of"),
    (["bench", "decode", "--steps", "-1"], "--steps=-1 is out of range"),
    (["bench", "decode", "--steps", "0"], "--steps=0 is out of range"),
    (["bench", "decode", "--budget", "0"], "--budget"),
    (["bench", "decode", "--methods", "full,bogus"], "--methods: unknown 'bogus'; valid: full"),
    (["bench", "decode", "--rerank", "0"], "rerank"),
    (["bench", "decode", "--repeats", "100000"], "--repeats=100000 is out of range"),
    (["bench", "decode", "--geometry", "tiny", "--contexts", "0"], "--contexts: 0 is out of"),
    (["bench", "passkey", "--contexts", "1000000000"], "--contexts: 1,000,000,000 is out of"),
    (["bench", "passkey", "--depths", "1.5"], "--depths: 1.5 is out of range"),
    (["bench", "passkey", "--methods", "nope"], "--methods: unknown 'nope'"),
    (["bench", "passkey", "--methods", "full,a2ats_plain_vq"], "unknown 'a2ats_plain_vq'"),
    (["bench", "tasks", "--methods", "a2ats_alloc"], "--methods: unknown 'a2ats_alloc'"),
    (["bench", "passkey", "--answer-tokens", "0"], "--answer-tokens=0"),
    (["bench", "memory", "--contexts", "1000000000000"], "--contexts: 1,000,000,000,000 is"),
    (["bench", "memory", "--methods", "full,window"], "--methods: unknown 'window'"),
    (["bench", "prefill", "--contexts", "1"], "--contexts: 1 is out of range"),
    (["bench", "tasks", "--seeds", "0"], "--seeds=0"),
    (["bench", "tasks", "--budget", "nan"], "--budget"),
    (["bench", "codebooks", "--calib-tokens", "100000000000"], "--calib-tokens=100000000000"),
    (["bench", "seed-synthetic", "--sequences", "100000000"], "--sequences: 100,000,000"),
    (["calibrate", "--model", "demo", "--out", "x.st", "--tokens", "100000000000"], "--tokens="),
    (["calibrate", "--model", "demo", "--out", "x.st", "--beta", "nan"], "--beta=nan"),
    (["calibrate", "--model", "demo", "--out", "x.st", "--centroids", "1"], "--centroids=1"),
    (["eval", "--context", "-5"], "--context=-5 is out of range"),
    (["eval", "--decode", "-1"], "--decode=-1 is out of range"),
    (["eval", "--budget", "-1"], "--budget"),
    (["eval", "--budget", "nan"], "--budget"),
    (["eval", "--budget", "0"], "--budget"),
    (["eval", "--budgets", "0.03,2.5"], "--budgets"),
    (["eval", "--methods", "a2ats,bogus"], "--methods: unknown 'bogus'"),
    (["eval", "--far-buckets", "0"], "far_buckets"),
    (["chat", "--budget", "0", "--prompt", "hi"], "budget"),
    (["chat", "--window", "-1", "--prompt", "hi"], "window"),
    (["chat", "--max-tokens", "100000000000", "--prompt", "hi"], "--max-tokens="),
    (["crossover", "demo", "--contexts", "100000000000"], "--contexts: 100,000,000,000 is"),
    (["crossover", "demo", "--steps", "-1"], "--steps=-1 is out of range"),
]


@pytest.mark.parametrize("argv, message", BAD, ids=[" ".join(a) for a, _ in BAD])
def test_a_bad_flag_fails_in_one_line_before_any_work(no_work, capsys, argv, message):
    assert main(argv) == 1
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0, err
    assert message in err, err


def test_decode_methods_error_lists_every_valid_name(no_work, capsys):
    assert main(["bench", "decode", "--methods", "bogus"]) == 1
    err = capsys.readouterr().err
    for name in ("full", "kv8", "kv4", "window", "a2ats", "a2ats_kv4", "a2ats_rr<N>"):
        assert name in err


@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory):
    return save_tiny_model(tmp_path_factory.mktemp("limits") / "tiny-llama", "llama")


def test_contexts_longer_than_the_model_fail_before_any_prefill(tiny_folder, monkeypatch, capsys):
    def refuse(*args, **kwargs):
        raise AssertionError("prefill started before the context was checked")

    monkeypatch.setattr("a2ats_engine.bench.speed.bench_decode", refuse)
    monkeypatch.setattr("a2ats_engine.bench.speed.bench_prefill", refuse)
    monkeypatch.setattr("a2ats_engine.bench.passkey.bench_passkey", refuse)
    monkeypatch.setattr("a2ats_engine.bench.evaluate.evaluate", refuse)
    monkeypatch.setattr("a2ats_engine.commands.eval.find_codebook", lambda *a, **k: (None, "-"))
    model = str(tiny_folder)
    for argv in (
        ["bench", "decode", "--model", model, "--contexts", "1024,4097"],
        ["bench", "prefill", "--model", model, "--contexts", "4097"],
        ["bench", "passkey", "--model", model, "--contexts", "5000"],
        ["eval", "--model", model, "--context", "4090", "--decode", "64"],
    ):
        assert main(argv) == 1, argv
        err = capsys.readouterr().err.strip()
        assert "longer than the model's context (4,096 tokens)" in err, (argv, err)


def test_memory_bench_refuses_contexts_that_do_not_fit_in_memory(tiny_folder, monkeypatch, capsys):
    def refuse(*args, **kwargs):
        raise AssertionError("caches filled before the memory was checked")

    monkeypatch.setattr("a2ats_engine.bench.speed.bench_memory", refuse)
    monkeypatch.setattr(_limits, "physical_memory", lambda: 2**20)
    assert main(["bench", "memory", "--model", str(tiny_folder), "--contexts", "4096"]) == 1
    assert "more than half this machine's" in capsys.readouterr().err


@pytest.mark.parametrize(
    "argv, shown",
    [
        (["bench", "decode"], ["(default: 32)", "(default: 1024,4096,8192)", "(default: 0.03)"]),
        (["bench", "passkey"], ["(default: 0.1,0.3,0.5,0.7,0.9)", "(default: 8)"]),
        (["bench", "memory"], ["(default: full,kv8,kv4,a2ats,a2ats_kv8,a2ats_kv4)"]),
        (["eval"], ["(default: 0.03)"]),
        (
            ["calibrate"],
            [
                "(default: 0.0)",
                "(default 2048)",
                "--seed SEED k-means and sampling seed (default: 0)",
            ],
        ),
        (["chat"], ["(default 0.7)", "(default: demo, SmolLM2-135M-Instruct)"]),
    ],
)
def test_help_shows_the_defaults(capsys, argv, shown):
    with pytest.raises(SystemExit) as info:
        main([*argv, "--help"])
    assert info.value.code == 0
    out = " ".join(capsys.readouterr().out.split())
    for text in shown:
        assert text in out, text
