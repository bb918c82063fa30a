"""The command line as people expect it: `--help` without MLX, `--version`, one-line notes,
sampling from the model's recommended preset, no misleading tokenizer length warning."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import pytest

from a2ats_engine.commands.chat import sampling_for
from a2ats_engine.records import SamplingSettings

ROOT = Path(__file__).resolve().parents[2]
HEAVY = ("mlx", "mlx_lm", "transformers", "numpy", "huggingface_hub")
# Imports the entry point, prints its --help, then says which heavy modules got imported.
PROBE = """
import contextlib, io, json, sys
heavy_names, module, args = sys.argv[1].split(","), sys.argv[2], sys.argv[3:]
entry = __import__(module, fromlist=["main"])
out = io.StringIO()
with contextlib.redirect_stdout(out):
    try:
        entry.main(args)
    except SystemExit as exc:
        code = exc.code
heavy = sorted({m.split(".")[0] for m in sys.modules} & set(heavy_names))
print(json.dumps({"code": code, "help": out.getvalue(), "heavy": heavy}))
"""


def _help(module: str, *args: str) -> dict:
    done = subprocess.run(
        [sys.executable, "-c", PROBE, ",".join(HEAVY), module, *args],
        cwd=ROOT, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def _commands() -> list[str]:
    from a2ats_engine.cli import build_parser

    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return sorted(sub.choices)


@pytest.mark.parametrize(
    "module, args",
    [
        ("a2ats_engine.cli", ["--help"]),
        *[("a2ats_engine.cli", [name, "--help"]) for name in _commands()],
        ("a2ats_engine.cli", ["bench", "decode", "--help"]),
        ("app.main", ["--help"]),
    ],
)
def test_help_answers_without_importing_mlx(module, args):
    result = _help(module, *args)
    assert result["code"] == 0 and "usage:" in result["help"]
    assert result["heavy"] == [], f"{' '.join(args)} imported {result['heavy']}"


def test_version(capsys):
    from a2ats_engine import __version__
    from a2ats_engine.cli import main

    with pytest.raises(SystemExit) as exit_info:
        main(["--version"])
    assert exit_info.value.code == 0
    assert capsys.readouterr().out.strip() == f"a2ats {__version__}"


def test_warnings_print_as_one_line_notes(monkeypatch, capsys):
    import warnings

    from a2ats_engine import cli

    def warn(_args) -> int:
        warnings.warn("A2ATS: the codebook was calibrated\nwith window 64, not 32", stacklevel=1)
        return 0

    def parser() -> argparse.ArgumentParser:
        p = argparse.ArgumentParser(prog="a2ats")
        p.add_argument("--debug", action="store_true")
        p.add_subparsers(dest="command").add_parser("warn").set_defaults(func=warn)
        return p

    monkeypatch.setattr(cli, "build_parser", parser)
    monkeypatch.setattr(warnings, "showwarning", warnings.showwarning)  # restored afterwards
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        assert cli.main(["warn"]) == 0
        err = capsys.readouterr().err
        assert err == "note: A2ATS: the codebook was calibrated with window 64, not 32\n"
        with pytest.warns(UserWarning, match="calibrated"):  # --debug: left to Python (pytest)
            assert cli.main(["--debug", "warn"]) == 0
        assert "note:" not in capsys.readouterr().err


def _args(**given) -> argparse.Namespace:
    flags = dict(temp=None, top_p=None, min_p=None, top_k=None, repetition_penalty=None)
    return argparse.Namespace(**{**flags, **given, "seed": 3, "max_tokens": 40})


def test_chat_samples_with_the_models_recommended_preset():
    recommended = SamplingSettings(temperature=0.6, top_p=0.9, top_k=20)
    assert sampling_for(_args(), recommended) == SamplingSettings(
        temperature=0.6, top_p=0.9, top_k=20, seed=3, max_tokens=40
    )
    # A flag overrides its own field only.
    assert sampling_for(_args(temp=0.0), recommended) == SamplingSettings(
        temperature=0.0, top_p=0.9, top_k=20, seed=3, max_tokens=40
    )
    # No recommendation: the plain defaults.
    assert sampling_for(_args(), None) == SamplingSettings(seed=3, max_tokens=40)


def test_a_long_text_encodes_without_the_length_warning(tmp_path, capfd):
    from a2ats_engine.loading.models import load_model
    from a2ats_engine.loading.tiny_model import save_tiny_model

    _, tokenizer, _ = load_model(save_tiny_model(tmp_path / "tiny", "llama"))
    inner = tokenizer._tokenizer
    inner.model_max_length = 16
    capfd.readouterr()
    ids = tokenizer.encode("hello world, " * 40)
    assert len(ids) > inner.model_max_length
    assert "longer than the specified maximum" not in "".join(capfd.readouterr())
