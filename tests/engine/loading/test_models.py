"""load_model on tiny model folders and GGUF files, the CPU dequantize option, the GGUF cache,
Hugging Face errors, and the `info` / `import-gguf` commands (no downloads)."""

from __future__ import annotations

import json
import re
import shutil

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest
from mlx.utils import tree_flatten
from mlx_lm.utils import save_config, save_model
from tiny import save_tiny_model, save_tiny_tokenizer, tiny_model

from a2ats_engine import _backend
from a2ats_engine.cli import main
from a2ats_engine.errors import ModelLoadError
from a2ats_engine.loading import gguf, models
from a2ats_engine.loading.models import ModelInfo, load_model

from ..gguf_fixtures import write_tiny_gguf

IDS = mx.array([[1, 9, 33, 120, 7, 250, 64]])


# every test here converts into the temporary cache and data folders (conftest.py)
pytestmark = pytest.mark.usefixtures("isolated")


@pytest.fixture(scope="module")
def llama_folder(tmp_path_factory):
    return save_tiny_model(tmp_path_factory.mktemp("tiny") / "tiny-llama", "llama", seed=1)


@pytest.fixture(scope="module")
def quantized_folder(tmp_path_factory):
    """A tiny llama saved 4-bit (group 32), as `mlx_lm.convert -q` would."""
    folder = tmp_path_factory.mktemp("q") / "tiny-q4"
    model = tiny_model("llama", seed=2)
    nn.quantize(model, group_size=32, bits=4)
    save_model(folder, model)
    save_config(
        {**model.config, "quantization": {"group_size": 32, "bits": 4, "mode": "affine"}},
        folder / "config.json",
    )
    save_tiny_tokenizer(folder)
    return folder


def _logits(model) -> np.ndarray:
    return np.array(model(IDS).astype(mx.float32))


def _quantized_modules(model) -> list:
    return [m for m in model.modules() if isinstance(m, nn.QuantizedLinear | nn.QuantizedEmbedding)]


def _dtypes(model) -> set:
    return {v.dtype for _, v in tree_flatten(model.parameters())}


# --- folders -----------------------------------------------------------------------------------


def test_load_folder(llama_folder):
    model, tokenizer, info = load_model(str(llama_folder))
    reference = tiny_model("llama", seed=1)
    np.testing.assert_allclose(_logits(model), _logits(reference), atol=1e-5)
    assert tokenizer.encode("<|im_end|>") == [tokenizer.convert_tokens_to_ids("<|im_end|>")]
    assert isinstance(info, ModelInfo)
    assert info.name == "tiny-llama"
    assert info.architecture == "llama"
    assert (info.num_layers, info.num_heads, info.num_kv_heads, info.head_dim) == (2, 4, 2, 16)
    assert info.rope["traditional"] is False and info.rope["dims"] == 16
    assert info.rope["base"] == 10000.0
    assert info.context_length == 4096
    assert info.quantization is None
    assert info.disk_bytes == sum(p.stat().st_size for p in llama_folder.iterdir())
    assert info.path == str(llama_folder.resolve())


def test_load_qwen2_folder(tmp_path):
    folder = save_tiny_model(tmp_path / "tiny-qwen", "qwen2", seed=4)
    model, _, info = load_model(str(folder))
    assert info.architecture == "qwen2"
    np.testing.assert_allclose(_logits(model), _logits(tiny_model("qwen2", seed=4)), atol=1e-5)


def test_folder_without_config(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(ModelLoadError, match=r"empty has no config\.json: not an mlx-lm"):
        load_model(str(tmp_path / "empty"))
    (tmp_path / "g").mkdir()
    (tmp_path / "g" / "m.gguf").write_bytes(b"GGUF")
    with pytest.raises(ModelLoadError, match=r"it holds m\.gguf: pass that file instead"):
        load_model(str(tmp_path / "g"))


def test_folder_without_weights_or_with_unknown_type(tmp_path, llama_folder):
    folder = tmp_path / "noweights"
    folder.mkdir()
    (folder / "config.json").write_text((llama_folder / "config.json").read_text())
    with pytest.raises(ModelLoadError, match=r"noweights has no weights"):
        load_model(str(folder))
    config = json.loads((llama_folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "model_type": "nosuchmodel"}))
    shutil.copy(llama_folder / "model.safetensors", folder / "model.safetensors")
    with pytest.raises(ModelLoadError, match=r"^not supported yet: nosuchmodel"):
        load_model(str(folder))


def test_missing_path_and_empty_source(tmp_path):
    with pytest.raises(ModelLoadError, match=r"no such file or folder: .*nowhere"):
        load_model(str(tmp_path / "nowhere"))
    with pytest.raises(ModelLoadError, match="no model given"):
        load_model("  ")


# --- CPU backend: dequantize -------------------------------------------------------------------


def test_dequantize_true_gives_float32_with_same_logits(quantized_folder):
    quantized, _, qinfo = load_model(str(quantized_folder), dequantize=False)
    assert len(_quantized_modules(quantized)) > 0
    assert qinfo.quantization == "4-bit affine, group 32"
    dense, _, info = load_model(str(quantized_folder), dequantize=True)
    assert _quantized_modules(dense) == []
    assert _dtypes(dense) == {mx.float32}
    assert info.quantization == "4-bit affine, group 32 (dequantized to float32 for CPU)"
    np.testing.assert_allclose(_logits(dense), _logits(quantized), atol=2e-3, rtol=1e-3)


def test_default_follows_the_backend(quantized_folder, monkeypatch):
    monkeypatch.setattr(_backend, "is_cpu_only", lambda: True)
    cpu_model, _, _ = load_model(str(quantized_folder))
    assert _quantized_modules(cpu_model) == []
    monkeypatch.setattr(_backend, "is_cpu_only", lambda: False)  # Metal: left as is
    metal_model, _, info = load_model(str(quantized_folder))
    assert len(_quantized_modules(metal_model)) > 0
    assert info.quantization == "4-bit affine, group 32"


def test_half_weights_become_float32(tmp_path, monkeypatch):
    folder = tmp_path / "half"
    model = tiny_model("llama", seed=6)
    model.set_dtype(mx.float16)
    save_model(folder, model)
    save_config(dict(model.config), folder / "config.json")
    save_tiny_tokenizer(folder)
    cast, _, info = load_model(str(folder), dequantize=True)
    assert _dtypes(cast) == {mx.float32}
    assert info.quantization is None
    monkeypatch.setattr(_backend, "is_cpu_only", lambda: False)  # Metal: kept as stored
    kept, _, _ = load_model(str(folder), dequantize=False)
    assert _dtypes(kept) == {mx.float16}


def test_cpu_keeps_quantized_layers_but_float32_activations(tmp_path, monkeypatch):
    """dequantize=False on CPU: packed layers stay, float16 norms go float32 (fp16 is slow)."""
    path = tmp_path / "q.gguf"
    write_tiny_gguf(path, tiny_model("llama", seed=12), quantize={"attn_": "Q8_0", "ffn_": "Q4_0"})
    monkeypatch.setattr(_backend, "is_cpu_only", lambda: True)
    model, _, info = load_model(str(path), dequantize=False)
    q_proj = model.model.layers[0].self_attn.q_proj
    assert isinstance(q_proj, nn.QuantizedLinear) and q_proj.scales.dtype == mx.float16
    assert model.model.norm.weight.dtype == mx.float32
    assert model(IDS).dtype == mx.float32
    assert info.quantization == "quantized"  # its general.file_type (F32) is contradicted


# --- GGUF sources and the conversion cache -----------------------------------------------------


def test_gguf_is_converted_once_into_the_cache(tmp_path, monkeypatch):
    source = tiny_model("llama", seed=7)
    path = tmp_path / "tiny.gguf"
    write_tiny_gguf(path, source)
    stages = []
    model, _, info = load_model(str(path), progress=lambda s, d, t: stages.append(s))
    assert {"hash", "convert", "load"} <= set(stages)
    np.testing.assert_allclose(_logits(model), _logits(source), atol=2e-4, rtol=1e-4)
    digest = gguf.sha256_file(path)
    folder = tmp_path / "cache" / "gguf" / digest[:16]
    assert (folder / "config.json").is_file()
    assert info.name == "Tiny Llama"
    assert info.path == str(path.resolve())
    assert info.disk_bytes == path.stat().st_size

    def no_second_conversion(*args, **kwargs):
        raise AssertionError("converted twice")

    def no_second_hash(*args, **kwargs):
        raise AssertionError("hashed twice")

    monkeypatch.setattr(gguf, "convert_gguf", no_second_conversion)
    monkeypatch.setattr(gguf, "sha256_file", no_second_hash)
    again, _, _ = load_model(str(path))
    np.testing.assert_allclose(_logits(again), _logits(model), atol=1e-6)


def test_stale_conversion_is_redone(tmp_path):
    path = tmp_path / "tiny.gguf"
    write_tiny_gguf(path, tiny_model("llama", seed=8))
    folder = models.gguf_folder(path)
    source = json.loads((folder / gguf.SOURCE_FILE).read_text())
    (folder / gguf.SOURCE_FILE).write_text(json.dumps({**source, "converter_version": 0}))
    assert models.gguf_folder(path) == folder
    assert gguf.read_source_info(folder)["converter_version"] == gguf.CONVERTER_VERSION


def test_gguf_without_the_extension_is_recognised(tmp_path):
    path = tmp_path / "model.bin"
    write_tiny_gguf(path, tiny_model("llama", seed=9))
    _, _, info = load_model(str(path))
    assert info.architecture == "llama"


# --- Hugging Face ------------------------------------------------------------------------------


def test_offline_repo_id_is_a_clear_error(tmp_path, monkeypatch):
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hf"))
    with pytest.raises(ModelLoadError, match=r"cannot download a2ats-test/no-such-model: offline"):
        load_model("a2ats-test/no-such-model")


def test_download_progress_adapter():
    calls = []
    bar_class = models._progress_tqdm(lambda *a: calls.append(a))
    bar = bar_class(total=100, unit="B", desc="Reconstructing")
    bar.update(40)
    bar.update(60)
    bar.close()
    files = bar_class(total=3, desc="Fetching 3 files")
    files.update(1)
    files.close()
    assert calls[-3:-1] == [("download", 100, 100), ("download files", 0, 3)]
    assert ("download", 40, 100) in calls and calls[-1] == ("download files", 1, 3)


# --- CLI ---------------------------------------------------------------------------------------


def test_cli_info(llama_folder, capsys):
    assert main(["info", str(llama_folder)]) == 0
    out = capsys.readouterr().out
    assert re.search(r"^architecture +llama$", out, re.M)
    assert re.search(r"^heads +4 query, 2 KV, head_dim 16$", out, re.M)
    assert re.search(r"^rope +RoPE, 16 dims, half-split, base 10000$", out, re.M)
    assert re.search(r"^quantization +none$", out, re.M)
    assert main(["info", "--json", str(llama_folder)]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["num_layers"] == 2 and data["path"] == str(llama_folder.resolve())


def test_cli_info_reports_the_cpu_dequantize(quantized_folder, capsys, monkeypatch):
    monkeypatch.setattr(_backend, "is_cpu_only", lambda: True)
    assert main(["info", "--json", str(quantized_folder)]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["quantization"] == "4-bit affine, group 32 (dequantized to float32 for CPU)"


def test_cli_missing_path_is_one_line_and_exit_1(tmp_path, capsys):
    assert main(["info", str(tmp_path / "missing")]) == 1
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0
    assert err.startswith("a2ats info: error: no such file or folder:")
    assert "Traceback" not in err


def test_cli_import_gguf(tmp_path, capsys):
    path = tmp_path / "tiny.gguf"
    write_tiny_gguf(path, tiny_model("llama", seed=10))
    out = tmp_path / "converted"
    assert main(["import-gguf", str(path), "--out", str(out)]) == 0
    assert (out / "config.json").is_file() and (out / "tokenizer.json").is_file()
    _, _, info = load_model(str(out))
    assert info.quantization is None and info.rope["traditional"] is True
    capsys.readouterr()
    assert main(["import-gguf", str(path), "--out", str(out)]) == 1
    assert "already exists and is not empty" in capsys.readouterr().err


def test_cli_help_texts(capsys):
    for command in ("fetch-demo", "import-gguf", "info"):
        with pytest.raises(SystemExit) as exit_info:
            main([command, "--help"])
        assert exit_info.value.code == 0
        assert f"usage: a2ats {command}" in capsys.readouterr().out


# --- the model's recommended sampling ------------------------------------------------------------


def test_recommended_sampling_comes_from_generation_config(tmp_path):
    from a2ats_engine.records import SamplingSettings

    folder = save_tiny_model(tmp_path / "with-config", "llama", seed=1)
    config = {"do_sample": True, "temperature": 0.6, "top_p": 0.9, "top_k": 20,
              "repetition_penalty": 1.05, "bos_token_id": 1}  # fmt: skip
    (folder / "generation_config.json").write_text(json.dumps(config))
    info = models.describe(folder)
    assert info.recommended_sampling == SamplingSettings(
        temperature=0.6, top_p=0.9, top_k=20, repetition_penalty=1.05
    )
    assert info.to_dict()["recommended_sampling"]["top_k"] == 20
    (folder / "generation_config.json").write_text("{not json")
    assert models.describe(folder).recommended_sampling is None


def test_a_folder_that_recommends_nothing_has_none(llama_folder):
    assert models.describe(llama_folder).recommended_sampling is None


@pytest.mark.parametrize(
    ("config", "expected"),
    [
        ({"do_sample": False, "temperature": 0.6}, {"temperature": 0.0}),
        ({"top_p": 0.8}, {"temperature": 1.0, "top_p": 0.8}),  # Hugging Face's temperature
        ({"temperature": "hot", "top_p": 0.0, "min_p": 1.0, "top_k": 40.0}, {"temperature": 1.0,
                                                                            "top_k": 40}),
        ({"bos_token_id": 1}, None),
        ([0.7], None),
    ],
)  # fmt: skip
def test_generation_config_is_read_defensively(config, expected):
    from a2ats_engine.records import SamplingSettings, sampling_from_generation_config

    found = sampling_from_generation_config(config)
    assert found == (None if expected is None else SamplingSettings(**expected))


def test_gguf_sampling_keys_become_the_recommendation(tmp_path):
    path = tmp_path / "tiny.gguf"
    write_tiny_gguf(
        path,
        tiny_model("llama", seed=3),
        **{
            "general.sampling.temp": ("f32", 0.25),
            "general.sampling.top_k": ("i32", 30),
            "general.sampling.top_p": ("f32", 0.5),
            "general.sampling.penalty_repeat": ("f32", 1.5),
        },
    )
    sampling = models.describe(path).recommended_sampling
    assert (sampling.temperature, sampling.top_k, sampling.top_p) == (0.25, 30, 0.5)
    assert (sampling.repetition_penalty, sampling.min_p) == (1.5, 0.0)


def test_the_demo_preset_is_greedy(tmp_path):
    from a2ats_engine.loading import demo_model

    folder = save_tiny_model(demo_model.demo_folder(), "llama", seed=1)
    sampling = models.describe(folder).recommended_sampling
    assert sampling == demo_model.DEMO_SAMPLING and sampling.greedy
