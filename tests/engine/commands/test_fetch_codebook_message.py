"""`a2ats fetch-demo` says whether the default codebook was there, built, or rebuilt because
the stored one came from an earlier recipe (it used to say "already present" after a rebuild)."""

from __future__ import annotations

import argparse
import os

import pytest

from a2ats_engine.calibration import calibrate
from a2ats_engine.commands import models as commands
from a2ats_engine.loading import fetched_models


@pytest.mark.parametrize(
    ("stored", "rebuild", "said"),
    [
        (False, True, "default codebook ready:"),
        (True, False, "default codebook already present:"),
        (True, True, "default codebook rebuilt to the current recipe:"),
    ],
)
def test_fetch_says_what_happened_to_the_default_codebook(
    tmp_path, monkeypatch, capsys, stored, rebuild, said
):
    book = tmp_path / "book.safetensors"
    if stored:
        book.write_bytes(b"old")
        os.utime(book, ns=(1, 1))
    monkeypatch.setattr(fetched_models, "up_to_date", lambda name: True)
    monkeypatch.setattr(fetched_models, "fetch_model", lambda name, progress=None: tmp_path)
    monkeypatch.setattr(fetched_models, "default_codebook_path", lambda name: book)

    def ensure(name, progress=None, *, model_source=None, force=False, cancel=None):
        if rebuild:
            book.write_bytes(b"new")
        return book

    monkeypatch.setattr(calibrate, "ensure_default_codebook", ensure)
    assert commands.run_fetch_demo(argparse.Namespace(model="demo", no_codebook=False)) == 0
    assert said in capsys.readouterr().out
