"""Untrusted text (GGUF names, model output, file contents in errors) reaches a terminal as
printable text only: no escape sequences, backspaces or carriage returns (commands/*, cli.py)."""

from __future__ import annotations

import io
import json
import warnings

import pytest
from tiny import tiny_model

from a2ats_engine.cache.telemetry import TokenEvent
from a2ats_engine.cli import main
from a2ats_engine.commands import chat
from a2ats_engine.terminal import printable

from .gguf_fixtures import write_tiny_gguf

HOSTILE = "A\x1b]0;pwned\x07B\x1b[2JC\x08D\rE\x9bF\u202eG\x00H"


def _no_controls(text: str, keep: str = "\n\t") -> None:
    bad = [c for c in text if (ord(c) < 32 or 0x7F <= ord(c) < 0xA0) and c not in keep]
    assert not bad, [hex(ord(c)) for c in bad]
    assert "\u202e" not in text


def test_printable_keeps_text_newlines_and_tabs_and_shows_controls_visibly():
    out = printable("line 1\n\tline 2 " + HOSTILE + " 日本語 🙂")
    _no_controls(out)
    assert out.startswith("line 1\n\tline 2 A")
    assert "\\x1b]0;pwned\\x07B\\x1b[2JC\\x08D\\rE\\x9bF\\u202eG\\x00H" in out
    assert out.endswith(" 日本語 🙂")
    assert printable("a\nb", newlines=False) == "a\\nb"


@pytest.fixture
def hostile_gguf(tmp_path, monkeypatch):
    monkeypatch.setenv("A2ATS_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("A2ATS_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setenv("A2ATS_CROSSOVER_FILE", str(tmp_path / "crossover.json"))
    path = tmp_path / "evil.gguf"
    write_tiny_gguf(path, tiny_model("llama", seed=3), **{"general.name": HOSTILE})
    return path


def test_info_prints_a_crafted_gguf_name_without_escapes(hostile_gguf, capsys):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert main(["info", str(hostile_gguf)]) == 0
    out = capsys.readouterr().out
    _no_controls(out)
    assert "A\\x1b]0;pwned" in out
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert main(["info", "--json", str(hostile_gguf)]) == 0
    out = capsys.readouterr().out
    _no_controls(out)
    assert json.loads(out)["name"] == HOSTILE  # JSON escapes them and keeps the value


def test_errors_naming_hostile_text_are_one_printable_line(tmp_path, capsys):
    bad = tmp_path / "x\x1b[2J\ny.gguf"
    bad.write_bytes(b"GGUF" + b"\x03\0\0\0" + b"\xff" * 16)
    assert main(["info", str(bad)]) == 1
    err = capsys.readouterr().err  # progress lines ("  hash...") first, then the error
    line = err.splitlines()[-1]
    assert line.startswith("a2ats info: error: ") and "x\\x1b[2J\\ny.gguf" in line
    assert err.endswith(line + "\n")
    _no_controls(line, keep="")


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_chat_writes_model_text_to_a_terminal_as_printable_text(monkeypatch):
    tty = _Tty()
    monkeypatch.setattr("sys.stdout", tty)
    events = [TokenEvent(piece, i, i) for i, piece in enumerate(["ok\n", HOSTILE, "\tend"])]
    chat._print_reply(iter(events))
    out = tty.getvalue()
    _no_controls(out)
    assert out.startswith("ok\nA\\x1b]0;pwned") and out.endswith("\tend\n")


def test_chat_piped_to_a_file_keeps_the_model_text_as_it_is(monkeypatch):
    pipe = io.StringIO()
    monkeypatch.setattr("sys.stdout", pipe)
    chat._print_reply(iter([TokenEvent(HOSTILE, 0, 0)]))
    assert pipe.getvalue() == HOSTILE + "\n"
