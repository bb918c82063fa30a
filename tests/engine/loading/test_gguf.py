"""GGUF -> mlx-lm conversion on tiny GGUF files written in the test (no downloads)."""

from __future__ import annotations

import json

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest
from mlx_lm.models.cache import make_prompt_cache
from mlx_lm.tokenizer_utils import load as load_tokenizer
from tiny import save_tiny_tokenizer, tiny_model

from a2ats_engine import _backend
from a2ats_engine.errors import ModelLoadError
from a2ats_engine.loading import gguf, gguf_config
from a2ats_engine.loading.gguf_archs import mlx_tensor_name
from a2ats_engine.loading.gguf_reader import DECODERS, load_tensors, mlx_layout, read_header
from a2ats_engine.loading.gguf_tokenizer import (
    _PRE_TOKENIZERS,
    build_tokenizer,
    sentencepiece_merges,
)
from a2ats_engine.loading.models import load_model

from ..gguf_fixtures import (
    BLOCKS,
    gguf_tensors,
    plain_metadata,
    random_blocks,
    reference_model,
    tiny_gguf_metadata,
    write_gguf,
    write_tiny_gguf,
)

PROMPT_IDS = mx.array([[1, 5, 17, 42, 99, 150, 230, 301, 7, 64, 3, 2, 256, 128]])
TEXTS = [
    "The capital of France is Paris.",
    "Hello!  How are you today?\n\tNumbers: 0123456789 and 3.14",
    "def main():\n    print('hello world')\n",
    "Ünïcödé tëxt, 日本語のテキスト, emoji 🙂 and 👩‍👩‍👧 family",
    "<|im_start|>user\nhi<|im_end|>\n",
    "   leading spaces and trailing   ",
]


# every test here converts into the temporary cache and data folders (conftest.py)
pytestmark = pytest.mark.usefixtures("isolated")


@pytest.fixture(scope="module")
def llama():
    return tiny_model("llama", seed=3)


@pytest.fixture(scope="module")
def llama_gguf(llama, tmp_path_factory):
    path = tmp_path_factory.mktemp("gguf") / "tiny.gguf"
    write_tiny_gguf(path, llama)
    return path


@pytest.fixture(scope="module")
def converted(llama_gguf, tmp_path_factory):
    return gguf.convert_gguf(llama_gguf, tmp_path_factory.mktemp("conv") / "tiny-mlx")


@pytest.fixture(scope="module")
def original_tokenizer(tmp_path_factory):
    return load_tokenizer(save_tiny_tokenizer(tmp_path_factory.mktemp("tok")))


def _logits(model, ids=PROMPT_IDS) -> np.ndarray:
    return np.array(model(ids).astype(mx.float32))


# --- weights, RoPE, config ---------------------------------------------------------------------


def test_llama_cpp_layout_needs_traditional_rope(llama, tmp_path):
    """Sanity check of the test itself: the permuted Q/K rows with half-split RoPE are wrong."""
    path = tmp_path / "t.gguf"
    write_tiny_gguf(path, llama)
    folder = gguf.convert_gguf(path, tmp_path / "out")
    config = json.loads((folder / "config.json").read_text())
    config["rope_traditional"] = False
    (folder / "config.json").write_text(json.dumps(config))
    wrong, _, _ = load_model(str(folder), dequantize=False)
    assert np.abs(_logits(wrong) - _logits(llama)).max() > 1e-2


def test_converted_float_gguf_gives_the_same_logits(llama, converted):
    model, _, info = load_model(str(converted), dequantize=False)
    np.testing.assert_allclose(_logits(model), _logits(llama), atol=2e-4, rtol=1e-4)
    assert info.rope["traditional"] is True
    assert info.quantization is None  # F32 file


def test_config_from_metadata(llama, converted):
    config = json.loads((converted / "config.json").read_text())
    assert config["model_type"] == "llama"
    assert config["rope_traditional"] is True
    assert config["tie_word_embeddings"] is True  # the tiny model has no output.weight
    assert config["num_attention_heads"] == llama.config["num_attention_heads"]
    assert config["num_key_value_heads"] == llama.config["num_key_value_heads"]
    assert config["vocab_size"] == llama.config["vocab_size"]
    assert config["rope_theta"] == llama.config["rope_theta"]
    assert "quantization" not in config
    source = gguf.read_source_info(converted)
    assert source["name"] == "Tiny Llama"
    assert source["gguf_file_type"] == "F32"


def test_untied_output_weight(tmp_path):
    model = tiny_model("llama", seed=5, tie_word_embeddings=False)
    path = tmp_path / "untied.gguf"
    write_tiny_gguf(path, model)
    folder = gguf.convert_gguf(path, tmp_path / "out")
    assert json.loads((folder / "config.json").read_text())["tie_word_embeddings"] is False
    loaded, _, _ = load_model(str(folder), dequantize=False)
    np.testing.assert_allclose(_logits(loaded), _logits(model), atol=2e-4, rtol=1e-4)


def test_quantized_tensors_stay_quantized_with_per_tensor_bits(llama, tmp_path, monkeypatch):
    path = tmp_path / "q.gguf"
    quant = {"attn_": "Q8_0", "ffn_": "Q4_0", "token_embd": "Q8_0"}
    held = write_tiny_gguf(path, llama, quantize=quant, **{"general.file_type": ("u32", 7)})
    folder = gguf.convert_gguf(path, tmp_path / "out")
    config = json.loads((folder / "config.json").read_text())
    q = config["quantization"]
    assert q["model.layers.0.self_attn.q_proj"] == {"group_size": 32, "bits": 8, "mode": "affine"}
    assert q["model.layers.1.mlp.down_proj"]["bits"] == 4
    assert q["model.embed_tokens"]["bits"] == 8

    monkeypatch.setattr(_backend, "is_cpu_only", lambda: False)  # as on Metal: as stored
    model, _, info = load_model(str(folder), dequantize=False)
    assert isinstance(model.model.layers[0].self_attn.q_proj, nn.QuantizedLinear)
    assert model.model.layers[1].mlp.up_proj.bits == 4
    assert isinstance(model.model.embed_tokens, nn.QuantizedEmbedding)
    assert info.quantization == "Q8_0"
    # float32 norms are stored in float16 too, so activations and the KV cache stay float16
    assert model.model.norm.weight.dtype == mx.float16
    cache = make_prompt_cache(model)
    model(PROMPT_IDS, cache=cache)
    assert cache[0].keys.dtype == mx.float16
    # The packed blocks hold exactly the values the file encodes...
    q_proj = model.model.layers[0].self_attn.q_proj
    unpacked = mx.dequantize(
        q_proj.weight,
        q_proj.scales.astype(mx.float32),
        q_proj.biases.astype(mx.float32),
        group_size=32,
        bits=8,
    )
    np.testing.assert_allclose(np.array(unpacked), held["blk.0.attn_q.weight"], atol=1e-7)
    # ...and the model computes the reference logits (up to float16 activations).
    reference = reference_model(llama.config, held)
    ours, theirs = _logits(model), _logits(reference)
    np.testing.assert_allclose(ours, theirs, atol=5e-2)
    assert np.corrcoef(ours.ravel(), theirs.ravel())[0, 1] > 0.9999

    dense, _, dense_info = load_model(str(folder), dequantize=True)
    assert not any(
        isinstance(m, nn.QuantizedLinear | nn.QuantizedEmbedding) for m in dense.modules()
    )
    assert dense.model.layers[0].self_attn.q_proj.weight.dtype == mx.float32
    assert dense_info.quantization == "Q8_0 (dequantized to float32 for CPU)"
    np.testing.assert_allclose(_logits(dense), _logits(reference), atol=2e-4, rtol=1e-4)


def test_reader_matches_mx_load_on_native_types(llama, tmp_path):
    path = tmp_path / "q.gguf"
    write_tiny_gguf(path, llama, quantize={"attn_": "Q8_0", "ffn_": "Q4_0"})
    ours = load_tensors(path, read_header(path))
    theirs = mx.load(str(path), format="gguf")
    assert set(ours) == set(theirs)
    for name, value in theirs.items():
        assert ours[name].dtype == value.dtype and ours[name].shape == value.shape, name
        assert mx.array_equal(ours[name], value).item(), name


@pytest.mark.parametrize("kind", sorted(BLOCKS))
def test_every_block_format_repacks_like_ggml_decodes(kind, tmp_path):
    """Each llama.cpp block format becomes MLX affine triples with the values ggml decodes."""
    tensor, reference = random_blocks(kind, (8, 512), seed=1)
    path = write_gguf(tmp_path / f"{kind}.gguf", {"blk.0.attn_q.weight": tensor}, {})
    header = read_header(path)
    assert header.tensors[0].type_name == kind
    arrays = load_tensors(path, header)
    bits, group = mlx_layout(kind)
    values = mx.dequantize(
        arrays["blk.0.attn_q.weight"],
        arrays["blk.0.attn_q.scales"].astype(mx.float32),
        arrays["blk.0.attn_q.biases"].astype(mx.float32),
        group_size=group,
        bits=bits,
    )
    if group == DECODERS[kind][2]:  # repacked: exact but for float16 scales and biases
        tolerance = 2e-3 * np.abs(reference).max()
    else:  # group-16 formats re-quantized to 8 bits per 32: half a step of the group's range
        ranges = np.ptp(reference.reshape(-1, 32), axis=1)
        tolerance = 0.5 * ranges.max() / 255 * 1.01 + 2e-3 * np.abs(reference).max()
    assert (bits, group) == ((8, 32) if kind in ("Q2_K", "Q3_K", "Q6_K") else DECODERS[kind][1:])
    np.testing.assert_allclose(np.array(values), reference, atol=tolerance)


def _k_quant_model(tmp_path, quant: dict):
    source = tiny_model("llama", seed=13, hidden_size=256, intermediate_size=256)
    path = tmp_path / "k.gguf"
    held = write_tiny_gguf(path, source, quantize=quant, **{"general.file_type": ("u32", 15)})
    folder = gguf.convert_gguf(path, tmp_path / "out")
    return folder, _logits(reference_model(source.config, held))


def test_k_quant_model_gives_the_reference_logits(tmp_path, monkeypatch):
    """A Q4_K_M-like file is read without mx.load (whose gguflib decodes Q4_K wrongly), its
    blocks repacked exactly, and the model computes what the blocks encode."""
    quant = {
        "attn_q": "Q4_K", "attn_k": "Q5_K", "attn_v": "Q4_K", "attn_output": "Q5_1",
        "ffn_gate": "Q4_K", "ffn_up": "Q5_0", "ffn_down": "Q4_1", "token_embd": "Q4_K",
    }  # fmt: skip
    folder, reference = _k_quant_model(tmp_path, quant)
    q = json.loads((folder / "config.json").read_text())["quantization"]
    assert q["model.layers.0.self_attn.q_proj"] == {"group_size": 32, "bits": 4, "mode": "affine"}
    assert q["model.layers.1.self_attn.k_proj"]["bits"] == 5
    assert q["model.layers.1.mlp.up_proj"]["bits"] == 5
    assert gguf.read_source_info(folder)["tensor_types"]["Q4_K"] == 7

    scale = np.abs(reference).max()
    dense, _, info = load_model(str(folder), dequantize=True)
    assert info.quantization == "Q4_K_M (dequantized to float32 for CPU)"
    np.testing.assert_allclose(_logits(dense), reference, atol=2e-3 * scale)
    monkeypatch.setattr(_backend, "is_cpu_only", lambda: False)  # packed, as on Metal
    packed, _, _ = load_model(str(folder), dequantize=False)
    assert packed.model.layers[0].self_attn.k_proj.bits == 5
    ours = _logits(packed)  # float16 activations
    np.testing.assert_allclose(ours, reference, atol=3e-2 * scale)
    assert np.corrcoef(ours.ravel(), reference.ravel())[0, 1] > 0.999


def test_group16_formats_load_as_8bit(tmp_path):
    """Q2_K, Q3_K and Q6_K (groups of 16, which MLX's matmul cannot take) become 8-bit groups
    of 32: close to, not exactly, what the blocks encode."""
    quant = {"attn_k": "Q6_K", "attn_output": "Q3_K", "ffn_gate": "Q2_K", "token_embd": "Q6_K"}
    folder, reference = _k_quant_model(tmp_path, quant)
    q = json.loads((folder / "config.json").read_text())["quantization"]
    for module in ("model.embed_tokens", "model.layers.0.self_attn.k_proj",
                   "model.layers.1.self_attn.o_proj", "model.layers.1.mlp.gate_proj"):  # fmt: skip
        assert q[module] == {"group_size": 32, "bits": 8, "mode": "affine"}
    dense, _, _ = load_model(str(folder), dequantize=True)
    ours = _logits(dense)
    assert np.corrcoef(ours.ravel(), reference.ravel())[0, 1] > 0.99


def test_tensor_names():
    assert mlx_tensor_name("blk.7.attn_q.weight") == "model.layers.7.self_attn.q_proj.weight"
    assert mlx_tensor_name("blk.0.ffn_down.biases") == "model.layers.0.mlp.down_proj.biases"
    assert mlx_tensor_name("token_embd.scales") == "model.embed_tokens.scales"
    assert mlx_tensor_name("output.weight") == "lm_head.weight"
    assert mlx_tensor_name("rope_freqs.weight") is None
    with pytest.raises(ModelLoadError, match="unexpected tensor in GGUF: blk.0.ssm_conv1d"):
        mlx_tensor_name("blk.0.ssm_conv1d.weight")


def test_llama3_rope_frequency_factors_become_rope_scaling(llama, tmp_path):
    head_dim = 16
    factors = gguf_config._llama3_factors(head_dim, 500000.0, 8.0, 1.0, 4.0, 8192)
    tensors = gguf_tensors(llama)
    tensors["rope_freqs.weight"] = np.array(factors, dtype=np.float32)
    meta = tiny_gguf_metadata(llama.config, **{"llama.rope.freq_base": ("f32", 500000.0)})
    path = write_gguf(tmp_path / "l3.gguf", tensors, meta)
    config = json.loads((gguf.convert_gguf(path, tmp_path / "out") / "config.json").read_text())
    assert config["rope_scaling"] == {
        "rope_type": "llama3",
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
    }


# --- tokenizer ---------------------------------------------------------------------------------


def test_tokenizer_encodes_like_the_original(converted, original_tokenizer):
    _, tokenizer, _ = load_model(str(converted))
    for text in TEXTS:
        assert tokenizer.encode(text) == original_tokenizer.encode(text), text


def _stream(tokenizer, ids) -> str:
    detok = tokenizer.detokenizer
    detok.reset()
    for i in ids:
        detok.add_token(i)
    detok.finalize()
    return detok.text


def test_tokenizer_round_trips_multibyte_text(converted, original_tokenizer):
    _, tokenizer, _ = load_model(str(converted))
    assert type(tokenizer.detokenizer).__name__ == "BPEStreamingDetokenizer"
    for text in TEXTS:
        ids = tokenizer.encode(text)
        assert tokenizer.decode(ids) == text
        # mlx-lm's streaming detokenizer drops one leading space of a reply; same as the source.
        assert _stream(tokenizer, ids) == _stream(original_tokenizer, ids)
        assert _stream(tokenizer, ids).strip() == text.strip()


def test_special_tokens_and_chat_template(converted, original_tokenizer):
    _, tokenizer, _ = load_model(str(converted))
    im_start = tokenizer.convert_tokens_to_ids("<|im_start|>")
    im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert tokenizer.encode("<|im_start|>")[0] == im_start
    assert im_end in tokenizer.eos_token_ids
    assert tokenizer.eos_token == "<|im_end|>"
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Où est Paris? 🙂"},
    ]
    ours = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    theirs = original_tokenizer.apply_chat_template(
        messages, add_generation_prompt=True, tokenize=False
    )
    assert ours == theirs
    assert ours.endswith("<|im_start|>assistant\n")
    assert tokenizer.encode(ours) == original_tokenizer.encode(theirs)


@pytest.mark.parametrize("pre", sorted(_PRE_TOKENIZERS))
def test_every_known_pre_tokenizer_round_trips(pre, llama):
    metadata = plain_metadata(tiny_gguf_metadata(llama.config, **{"tokenizer.ggml.pre": pre}))
    tokenizer = build_tokenizer(metadata)
    for text in TEXTS:
        assert tokenizer.decode(tokenizer.encode(text).ids, skip_special_tokens=False) == text
    digits = tokenizer.encode("year 2024").tokens
    if pre in ("smollm", "starcoder"):  # digits are split one by one first
        assert digits[-4:] == ["2", "0", "2", "4"]


def test_unknown_pre_tokenizer_warns_and_splits_like_gpt2(llama):
    metadata = plain_metadata(
        tiny_gguf_metadata(llama.config, **{"tokenizer.ggml.pre": "brand-new"})
    )
    with pytest.warns(UserWarning, match="'brand-new' is unknown"):
        tokenizer = build_tokenizer(metadata)
    gpt2 = build_tokenizer(plain_metadata(tiny_gguf_metadata(llama.config)))
    assert tokenizer.encode(TEXTS[1]).ids == gpt2.encode(TEXTS[1]).ids


def test_add_bos_token_flag_prepends_bos(llama, tmp_path):
    path = tmp_path / "bos.gguf"
    write_tiny_gguf(path, llama, **{"tokenizer.ggml.add_bos_token": ("bool", True)})
    _, tokenizer, _ = load_model(str(gguf.convert_gguf(path, tmp_path / "out")))
    ids = tokenizer.encode("Paris")
    assert ids[0] == tokenizer.convert_tokens_to_ids("<|endoftext|>")
    assert tokenizer.decode(ids, skip_special_tokens=True) == "Paris"


def test_sentencepiece_vocab_matches_sentencepiece(tmp_path):
    """A `llama` (SentencePiece BPE + byte fallback) vocabulary encodes like sentencepiece."""
    import sentencepiece as spm

    corpus = tmp_path / "corpus.txt"
    corpus.write_text(
        "\n".join(
            [
                "The quick brown fox jumps over the lazy dog.",
                "Paris is the capital of France; Berlin is the capital of Germany.",
                "Numbers like 12345 and words like tokenization, tokenizer, tokens.",
            ]
            * 20
        )
    )
    spm.SentencePieceTrainer.train(
        input=str(corpus),
        model_prefix=str(tmp_path / "sp"),
        vocab_size=300,
        model_type="bpe",
        byte_fallback=True,
        character_coverage=1.0,
        normalization_rule_name="identity",  # as Llama / Mistral tokenizers
        remove_extra_whitespaces=False,
        minloglevel=2,
    )
    sp = spm.SentencePieceProcessor(model_file=str(tmp_path / "sp.model"))
    types = []
    for i in range(sp.get_piece_size()):
        if sp.is_unknown(i):
            types.append(2)
        elif sp.is_control(i):
            types.append(3)
        elif sp.is_byte(i):
            types.append(6)
        else:
            types.append(1)
    metadata = {
        "tokenizer.ggml.model": "llama",
        "tokenizer.ggml.tokens": [sp.id_to_piece(i) for i in range(sp.get_piece_size())],
        "tokenizer.ggml.scores": mx.array([sp.get_score(i) for i in range(sp.get_piece_size())]),
        "tokenizer.ggml.token_type": mx.array(types, dtype=mx.int32),
        "tokenizer.ggml.bos_token_id": mx.array(sp.bos_id(), dtype=mx.uint32),
        "tokenizer.ggml.eos_token_id": mx.array(sp.eos_id(), dtype=mx.uint32),
        "tokenizer.ggml.unknown_token_id": mx.array(sp.unk_id(), dtype=mx.uint32),
    }
    tokenizer = build_tokenizer(metadata)
    for text in [
        "The lazy fox is the capital of tokens.",
        "Germany 2024: zebra quixotic!",
        "Ünïcödé 日本語 🙂",
        "  two spaces\nnew line",
    ]:
        expected = [sp.bos_id(), *sp.encode(text)]
        assert tokenizer.encode(text).ids == expected, text
        assert tokenizer.decode(expected, skip_special_tokens=True) == text


def test_sentencepiece_merges_rank_by_merged_score():
    tokens = ["a", "b", "c", "ab", "bc", "abc"]
    scores = [0.0, 0.0, 0.0, -2.0, -1.0, -3.0]
    merges = sentencepiece_merges(tokens, scores, [1] * 6)
    assert merges == [("b", "c"), ("a", "b"), ("a", "bc"), ("ab", "c")]


# --- bad input ---------------------------------------------------------------------------------


def test_truncated_file(llama_gguf, tmp_path):
    data = llama_gguf.read_bytes()
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(data[: len(data) // 2])
    with pytest.raises(ModelLoadError, match=r"cut\.gguf.*extends past the end of the file"):
        load_model(str(cut))
    tiny = tmp_path / "tiny.gguf"
    tiny.write_bytes(data[:6])
    with pytest.raises(ModelLoadError, match=r"tiny\.gguf is not a GGUF file: only 6 bytes"):
        load_model(str(tiny))


def test_foreign_file(tmp_path):
    fake = tmp_path / "model.gguf"
    fake.write_bytes(b"\x89PNG\r\n\x1a\n" + b"\0" * 100)
    with pytest.raises(ModelLoadError, match=r"model\.gguf is not a GGUF file \(it starts with"):
        load_model(str(fake))
    other = tmp_path / "weights.bin"
    other.write_bytes(b"hello world")
    with pytest.raises(ModelLoadError, match=r"weights\.bin is a file but not a GGUF"):
        load_model(str(other))


def test_missing_file(tmp_path):
    with pytest.raises(ModelLoadError, match=r"no such GGUF file: .*nothere\.gguf"):
        load_model(str(tmp_path / "nothere.gguf"))


def test_unsupported_architecture(llama, tmp_path):
    path = tmp_path / "mamba.gguf"
    write_tiny_gguf(path, llama, **{"general.architecture": "mamba"})
    with pytest.raises(ModelLoadError, match=r"mamba\.gguf: not supported yet: mamba$"):
        load_model(str(path))


def test_unsupported_tokenizer_type(llama, tmp_path):
    path = tmp_path / "t5tok.gguf"
    write_tiny_gguf(path, llama, **{"tokenizer.ggml.model": "t5"})
    with pytest.raises(ModelLoadError, match="not supported yet: GGUF tokenizer type 't5'"):
        gguf.convert_gguf(path, tmp_path / "out")
    assert not (tmp_path / "out").exists()  # nothing half-written
    assert not list(tmp_path.glob(".out.*"))


def test_convert_refuses_a_non_empty_folder(llama_gguf, tmp_path):
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "keep.txt").write_text("mine")
    with pytest.raises(ModelLoadError, match="already exists and is not empty"):
        gguf.convert_gguf(llama_gguf, tmp_path / "out")


# --- hostile metadata -------------------------------------------------------------------------


def _nested_arrays(depth: int) -> bytes:
    """A metadata value (type code + payload): arrays of one array, `depth` deep, of a u32."""
    import struct

    inner = struct.pack("<IIQ", 9, 4, 1) + struct.pack("<I", 7)
    return struct.pack("<I", 9) + struct.pack("<IQ", 9, 1) * (depth - 1) + inner[4:]


def test_metadata_arrays_nested_too_deep_are_one_error_naming_the_file(llama, tmp_path):
    path = tmp_path / "deep.gguf"
    write_tiny_gguf(path, llama, **{"general.deep": _nested_arrays(5000)})
    with pytest.raises(ModelLoadError, match=r"deep\.gguf.*nested .*deep.*general\.deep"):
        read_header(path)
    with pytest.raises(ModelLoadError, match=r"deep\.gguf"):
        load_model(str(path))


def test_two_levels_of_nested_arrays_still_read(llama, tmp_path):
    path = tmp_path / "nest2.gguf"
    write_tiny_gguf(path, llama, **{"general.nested": _nested_arrays(2)})
    value = read_header(path).metadata["general.nested"]
    assert [list(x) for x in value] == [[7]]


@pytest.mark.parametrize("alignment", ["abc", ("f32", 1.5), ("u32", 0), ("u32", 12)])
def test_a_bad_alignment_is_one_error_naming_the_file_and_the_key(llama, tmp_path, alignment):
    path = tmp_path / "align.gguf"
    write_tiny_gguf(path, llama, **{"general.alignment": alignment})
    with pytest.raises(ModelLoadError, match=r"align\.gguf.*general\.alignment"):
        read_header(path)


def _huge_head_gguf(llama, tmp_path, **more):
    tensors = gguf_tensors(llama)
    tensors["rope_freqs.weight"] = np.ones(4, dtype=np.float32)
    meta = {
        "llama.attention.key_length": ("u64", 1 << 40),
        "llama.rope.dimension_count": ("u64", 1 << 40),
        **more,
    }
    return write_gguf(tmp_path / "huge.gguf", tensors, tiny_gguf_metadata(llama.config, **meta))


def test_sizes_from_metadata_are_checked_against_the_tensors_before_allocating(llama, tmp_path):
    from ..bounded import run_capped

    path = _huge_head_gguf(llama, tmp_path)
    out = tmp_path / "out"
    result = run_capped(
        f"""
        from a2ats_engine.loading import gguf
        gguf.convert_gguf({str(path)!r}, {str(out)!r})
        """
    )
    assert result["kind"] == "ModelLoadError", result
    assert "huge.gguf" in result["message"] and "key_length" in result["message"]
    assert "\n" not in result["message"]


@pytest.mark.parametrize(
    "key, value, problem",
    [
        ("llama.attention.head_count", ("u32", 1 << 30), "head_count"),
        ("llama.attention.head_count_kv", ("u32", 3), "head_count_kv"),
        ("llama.embedding_length", ("u32", 1 << 31), "embedding_length"),
        ("llama.feed_forward_length", ("u32", 7), "feed_forward_length"),
        ("llama.block_count", ("u32", 1 << 31), "block_count"),
        ("llama.context_length", ("u64", 1 << 60), "context_length"),
        ("llama.rope.freq_base", ("f32", float("nan")), "freq_base"),
        ("llama.attention.layer_norm_rms_epsilon", ("f32", -1.0), "rms_epsilon"),
        ("llama.block_count", "abc", "block_count"),
    ],
)
def test_each_size_in_the_metadata_must_agree_with_the_tensors(
    llama, tmp_path, key, value, problem
):
    path = tmp_path / "bad.gguf"
    write_tiny_gguf(path, llama, **{key: value})
    with pytest.raises(ModelLoadError, match=rf"bad\.gguf.*{problem}") as info:
        gguf.convert_gguf(path, tmp_path / "out")
    assert "\n" not in str(info.value)


def test_rope_freqs_of_the_wrong_length_is_refused(llama, tmp_path):
    tensors = gguf_tensors(llama)
    tensors["rope_freqs.weight"] = np.ones(3, dtype=np.float32)  # head_dim 16 needs 8
    path = write_gguf(tmp_path / "rf.gguf", tensors, tiny_gguf_metadata(llama.config))
    with pytest.raises(ModelLoadError, match=r"rf\.gguf.*rope_freqs.*3.*8"):
        gguf.convert_gguf(path, tmp_path / "out")
