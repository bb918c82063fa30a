"""Tiny GGUF files for the converter tests, made in-process (no downloads).

- `tiny_gguf_metadata()`: llama.cpp-style metadata for the tiny llama model and the tiny
  byte-level BPE tokenizer of `tiny.py` (vocab, merges, token types, BOS/EOS, chat template).
- `gguf_tensors(model)`: the model's weights under GGUF names, with Q and K rows permuted the
  way llama.cpp's convert_hf_to_gguf.py does for interleaved RoPE.
- `write_gguf(path, tensors, metadata)`: a minimal GGUF v3 writer that can also store Q8_0 and
  Q4_0 blocks (`mx.save_gguf` writes float tensors only).
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

import mlx.core as mx
import numpy as np
from tiny import CHATML, _tokenizer_json

F32, F16, Q4_0, Q8_0 = 0, 1, 2, 8
ALIGN = 32


def llama_cpp_permute(weight: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp `LlamaModel.permute`: per head, rows (i, i + d/2) -> (2i, 2i + 1)."""
    rows = weight.shape[0]
    return (
        weight.reshape(n_head, 2, rows // n_head // 2, *weight.shape[1:])
        .swapaxes(1, 2)
        .reshape(weight.shape)
    )


def llama_cpp_unpermute(weight: np.ndarray, n_head: int) -> np.ndarray:
    """Inverse of `llama_cpp_permute`."""
    rows = weight.shape[0]
    return (
        weight.reshape(n_head, rows // n_head // 2, 2, *weight.shape[1:])
        .swapaxes(1, 2)
        .reshape(weight.shape)
    )


def reference_model(config: dict, held: dict):
    """The HF-layout (half-split RoPE) tiny llama holding exactly the weights a GGUF stores."""
    from mlx.utils import tree_unflatten
    from mlx_lm.utils import _get_classes

    model_class, args_class = _get_classes(config)
    model = model_class(args_class.from_dict(config))
    inverse = {v: k for k, v in _GGUF_NAMES.items()}
    weights = []
    for name, array in held.items():
        if name == "token_embd.weight":
            key = "model.embed_tokens.weight"
        elif name == "output_norm.weight":
            key = "model.norm.weight"
        elif name == "output.weight":
            key = "lm_head.weight"
        else:
            _, layer, base, _ = name.split(".")
            if base == "attn_q":
                array = llama_cpp_unpermute(array, config["num_attention_heads"])
            elif base == "attn_k":
                array = llama_cpp_unpermute(array, config["num_key_value_heads"])
            key = f"model.layers.{layer}.{inverse[base]}.weight"
        weights.append((key, mx.array(array)))
    model.update(tree_unflatten(weights))
    mx.eval(model.parameters())
    return model


_GGUF_NAMES = {
    "input_layernorm": "attn_norm",
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "post_attention_layernorm": "ffn_norm",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
}


def gguf_tensors(model) -> dict[str, np.ndarray]:
    """GGUF-named float32 numpy weights of an mlx-lm llama model (Q/K permuted like llama.cpp)."""
    from mlx.utils import tree_flatten

    config = model.config
    out = {}
    for name, value in tree_flatten(model.parameters()):
        array = np.array(value.astype(mx.float32))
        if name == "model.embed_tokens.weight":
            out["token_embd.weight"] = array
        elif name == "model.norm.weight":
            out["output_norm.weight"] = array
        elif name == "lm_head.weight":
            out["output.weight"] = array
        else:
            _, _, layer, rest = name.split(".", 3)
            module = rest.rsplit(".", 1)[0]
            if module == "self_attn.q_proj":
                array = llama_cpp_permute(array, config["num_attention_heads"])
            elif module == "self_attn.k_proj":
                array = llama_cpp_permute(array, config["num_key_value_heads"])
            out[f"blk.{layer}.{_GGUF_NAMES[module]}.weight"] = array
    return out


def arch_metadata(
    config: dict, arch: str, head_dim: int | None = None, rope_dims: int | None = None
) -> dict:
    """The `general.architecture` key and the `{arch}.*` geometry keys of a model `config`
    (mlx-lm's config.json). With `head_dim`, also the attention key and value lengths; RoPE
    covers `rope_dims` dimensions (default: the head dim)."""
    if rope_dims is None:
        rope_dims = head_dim or config["hidden_size"] // config["num_attention_heads"]
    out = {
        "general.architecture": arch,
        f"{arch}.block_count": ("u32", config["num_hidden_layers"]),
        f"{arch}.context_length": ("u32", config["max_position_embeddings"]),
        f"{arch}.embedding_length": ("u32", config["hidden_size"]),
        f"{arch}.feed_forward_length": ("u32", config["intermediate_size"]),
        f"{arch}.attention.head_count": ("u32", config["num_attention_heads"]),
        f"{arch}.attention.head_count_kv": ("u32", config["num_key_value_heads"]),
        f"{arch}.attention.layer_norm_rms_epsilon": ("f32", config["rms_norm_eps"]),
        f"{arch}.rope.freq_base": ("f32", config["rope_theta"]),
        f"{arch}.rope.dimension_count": ("u32", rope_dims),
    }
    if head_dim is not None:
        out[f"{arch}.attention.key_length"] = ("u32", head_dim)
        out[f"{arch}.attention.value_length"] = ("u32", head_dim)
    return out


def tiny_gguf_metadata(model_config: dict, **overrides) -> dict:
    """GGUF metadata (python values) for a tiny llama config and the tiny tokenizer."""
    tok = json.loads(_tokenizer_json())
    vocab = tok["model"]["vocab"]
    tokens = [None] * len(vocab)
    for text, index in vocab.items():
        tokens[index] = text
    specials = {t["id"] for t in tok["added_tokens"] if t["special"]}
    merges = [m if isinstance(m, str) else " ".join(m) for m in tok["model"]["merges"]]
    metadata = {
        "general.architecture": "llama",
        "general.name": "Tiny Llama",
        "general.file_type": ("u32", 0),
        **arch_metadata(model_config, "llama"),
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.pre": "gpt2",
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.token_type": (
            "i32[]",
            [3 if i in specials else 1 for i in range(len(tokens))],
        ),
        "tokenizer.ggml.merges": merges,
        "tokenizer.ggml.bos_token_id": ("u32", vocab["<|endoftext|>"]),
        "tokenizer.ggml.eos_token_id": ("u32", vocab["<|im_end|>"]),
        "tokenizer.ggml.padding_token_id": ("u32", vocab["<|endoftext|>"]),
        "tokenizer.ggml.add_bos_token": ("bool", False),
        "tokenizer.chat_template": CHATML,
    }
    metadata.update(overrides)
    return metadata


def plain_metadata(metadata: dict) -> dict:
    """Writer-style metadata ((kind, value) tuples) as the reader returns it."""
    out = {}
    for key, value in metadata.items():
        if isinstance(value, tuple):
            kind, value = value
            value = np.array(value) if kind.endswith("[]") else value
        out[key] = value
    return out


# ---------------------------------------------------------------------------------------------
# Quantized blocks (llama.cpp reference layouts)


def quantize_q8_0(weight: np.ndarray) -> tuple[bytes, np.ndarray]:
    """Q8_0 blocks of 32: float16 scale d + 32 int8; value = d * q. Returns (raw, dequantized)."""
    blocks = weight.astype(np.float32).reshape(-1, 32)
    d = np.abs(blocks).max(axis=1) / 127.0
    inv = np.where(d > 0, 1.0 / np.where(d > 0, d, 1.0), 0.0)
    q = np.round(blocks * inv[:, None]).astype(np.int8)
    d16 = d.astype(np.float16)
    raw = np.concatenate([d16.view(np.uint8).reshape(-1, 2), q.view(np.uint8)], axis=1)
    dequant = d16.astype(np.float32)[:, None] * q.astype(np.float32)
    return raw.tobytes(), dequant.reshape(weight.shape)


def quantize_q4_0(weight: np.ndarray) -> tuple[bytes, np.ndarray]:
    """Q4_0 blocks of 32: float16 scale d + 16 bytes of nibbles (element j low, j + 16 high);
    value = (nibble - 8) * d, d = signed abs-max / -8. Returns (raw, dequantized)."""
    blocks = weight.astype(np.float32).reshape(-1, 32)
    idx = np.abs(blocks).argmax(axis=1)
    signed_max = blocks[np.arange(len(blocks)), idx]
    d = signed_max / -8.0
    inv = np.where(d != 0, 1.0 / np.where(d != 0, d, 1.0), 0.0)
    q = np.minimum(15, (blocks * inv[:, None] + 8.5).astype(np.int32)).astype(np.uint8)
    packed = q[:, :16] | (q[:, 16:] << 4)
    d16 = d.astype(np.float16)
    raw = np.concatenate([d16.view(np.uint8).reshape(-1, 2), packed], axis=1)
    dequant = d16.astype(np.float32)[:, None] * (q.astype(np.float32) - 8.0)
    return raw.tobytes(), dequant.reshape(weight.shape)


# ---------------------------------------------------------------------------------------------
# Writer

_SCALARS = {
    "u32": (4, "<I"),
    "i32": (5, "<i"),
    "f32": (6, "<f"),
    "bool": (7, "<?"),
    "u64": (10, "<Q"),
}


def _string(text: str) -> bytes:
    data = text.encode("utf-8")
    return struct.pack("<Q", len(data)) + data


def _value(value) -> bytes:
    if isinstance(value, bytes):  # a pre-encoded value (type code and payload), for bad files
        return value
    if isinstance(value, str):
        return struct.pack("<I", 8) + _string(value)
    if isinstance(value, list):  # list of strings
        return struct.pack("<IIQ", 9, 8, len(value)) + b"".join(_string(v) for v in value)
    kind, payload = value
    if kind.endswith("[]"):
        code, fmt = _SCALARS[kind[:-2]]
        body = b"".join(struct.pack(fmt, v) for v in payload)
        return struct.pack("<IIQ", 9, code, len(payload)) + body
    code, fmt = _SCALARS[kind]
    return struct.pack("<I", code) + struct.pack(fmt, payload)


def _pad(data: bytes) -> bytes:
    return data + b"\0" * (-len(data) % ALIGN)


def write_gguf(path: str | Path, tensors: dict, metadata: dict) -> Path:
    """Write a GGUF v3 file. tensors: name -> float32 numpy array (stored F32), or
    name -> (ggml_type, shape, raw_bytes) for pre-encoded blocks. Metadata values: str,
    list[str], (kind, value) with kind in u32/i32/f32/bool/u64 or "<kind>[]" for arrays, or
    bytes (type code and payload as they go into the file)."""
    infos, blobs, offset = [], [], 0
    for name, value in tensors.items():
        if isinstance(value, np.ndarray):
            kind, shape, raw = F32, value.shape, value.astype(np.float32).tobytes()
        else:
            kind, shape, raw = value
        dims = list(reversed(shape))  # GGUF lists the fastest-varying dim first
        info = _string(name) + struct.pack("<I", len(dims))
        info += b"".join(struct.pack("<Q", d) for d in dims) + struct.pack("<IQ", kind, offset)
        infos.append(info)
        blobs.append(_pad(raw))
        offset += len(blobs[-1])
    header = b"GGUF" + struct.pack("<IQQ", 3, len(tensors), len(metadata))
    header += b"".join(_string(k) + _value(v) for k, v in metadata.items())
    header += b"".join(infos)
    path = Path(path)
    path.write_bytes(_pad(header) + b"".join(blobs))
    return path


def write_tiny_gguf(path: str | Path, model, quantize: dict | None = None, **metadata) -> dict:
    """Write `model` (a tiny llama from `tiny.tiny_model`) as a GGUF at `path`.

    quantize maps GGUF tensor-name substrings to a block format: "Q8_0" / "Q4_0" quantize the
    model's weights; the other formats of BLOCKS store random blocks instead (the model's values
    are replaced; the returned reference holds what the file encodes). Others stay F32.
    Returns the float32 weights the converted model really holds (dequantized values for
    quantized ones; float16-rounded values for the other tensors of a quantized file, which the
    converter stores in float16), under GGUF names, so a test can build the exact reference.
    """
    weights = gguf_tensors(model)
    stored, held = {}, {}
    for name, array in weights.items():
        kind = next((k for pattern, k in (quantize or {}).items() if pattern in name), None)
        if kind is None or array.ndim != 2:
            stored[name] = array
            held[name] = array.astype(np.float16).astype(np.float32) if quantize else array
            continue
        if kind in ("Q8_0", "Q4_0"):
            encode, code = (quantize_q8_0, Q8_0) if kind == "Q8_0" else (quantize_q4_0, Q4_0)
            raw, dequant = encode(array)
            stored[name], held[name] = (code, array.shape, raw), dequant
        else:
            seed = sum(name.encode())
            stored[name], held[name] = random_blocks(kind, array.shape, seed=seed)
    write_gguf(path, stored, tiny_gguf_metadata(model.config, **metadata))
    return held


# ---------------------------------------------------------------------------------------------
# Every llama.cpp block format, decoded by straight transliterations of ggml's scalar
# `dequantize_row_*` reference code (an implementation independent of the vectorised reader).

BLOCKS = {  # name -> (ggml type id, values per block, bytes per block, float16 field offsets)
    "Q4_0": (2, 32, 18, [0]),
    "Q4_1": (3, 32, 20, [0, 2]),
    "Q5_0": (6, 32, 22, [0]),
    "Q5_1": (7, 32, 24, [0, 2]),
    "Q8_0": (8, 32, 34, [0]),
    "Q2_K": (10, 256, 84, [80, 82]),
    "Q3_K": (11, 256, 110, [108]),
    "Q4_K": (12, 256, 144, [0, 2]),
    "Q5_K": (13, 256, 176, [0, 2]),
    "Q6_K": (14, 256, 210, [208]),
}


def _h(block: bytes, at: int) -> float:
    return float(np.frombuffer(block[at : at + 2], dtype=np.float16)[0])


def _scale_min_k4(j: int, q: bytes) -> tuple[int, int]:
    if j < 4:
        return q[j] & 63, q[j + 4] & 63
    return (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4), (q[j + 4] >> 4) | ((q[j] >> 6) << 4)


def reference_decode(name: str, block: bytes) -> list[float]:
    """ggml's dequantize_row_<name> for one block."""
    y: list[float] = []
    if name in ("Q4_0", "Q4_1"):
        d = _h(block, 0)
        m = _h(block, 2) if name == "Q4_1" else None
        qs = block[4:20] if m is not None else block[2:18]
        lo = [(q & 0xF) for q in qs]
        hi = [(q >> 4) for q in qs]
        if m is None:
            return [(x - 8) * d for x in lo + hi]
        return [x * d + m for x in lo + hi]
    if name in ("Q5_0", "Q5_1"):
        d = _h(block, 0)
        m = _h(block, 2) if name == "Q5_1" else None
        at = 4 if m is not None else 2
        qh = int.from_bytes(block[at : at + 4], "little")
        qs = block[at + 4 : at + 20]
        out = [0.0] * 32
        for j in range(16):
            x0 = (qs[j] & 0x0F) | (((qh >> j) << 4) & 0x10)
            x1 = (qs[j] >> 4) | ((qh >> (j + 12)) & 0x10)
            out[j] = (x0 - 16) * d if m is None else x0 * d + m
            out[j + 16] = (x1 - 16) * d if m is None else x1 * d + m
        return out
    if name == "Q8_0":
        d = _h(block, 0)
        return [d * q for q in np.frombuffer(block[2:34], dtype=np.int8).tolist()]
    if name == "Q2_K":
        scales, qs, d, dmin = block[0:16], block[16:80], _h(block, 80), _h(block, 82)
        is_ = 0
        for n in range(2):
            q = qs[32 * n : 32 * n + 32]
            for shift in (0, 2, 4, 6):
                for half in (0, 16):
                    sc = scales[is_]
                    is_ += 1
                    dl, ml = d * (sc & 0xF), dmin * (sc >> 4)
                    y += [dl * ((q[half + i] >> shift) & 3) - ml for i in range(16)]
        return y
    if name == "Q3_K":
        hm, qs, raw, d = block[0:32], block[32:96], block[96:108], _h(block, 108)
        aux = list(np.frombuffer(raw, dtype="<u4").tolist())
        k1, k2, tmp = 0x03030303, 0x0F0F0F0F, aux[2]
        a2 = ((aux[0] >> 4) & k2) | (((tmp >> 4) & k1) << 4)
        a3 = ((aux[1] >> 4) & k2) | (((tmp >> 6) & k1) << 4)
        a0 = (aux[0] & k2) | (((tmp >> 0) & k1) << 4)
        a1 = (aux[1] & k2) | (((tmp >> 2) & k1) << 4)
        scales = np.array([a0, a1, a2, a3], dtype="<u4").view(np.int8).tolist()
        is_, m = 0, 1
        for n in range(2):
            q = qs[32 * n : 32 * n + 32]
            for shift in (0, 2, 4, 6):
                for half in (0, 16):
                    dl = d * (scales[is_] - 32)
                    is_ += 1
                    y += [
                        dl * (((q[half + i] >> shift) & 3) - (0 if hm[half + i] & m else 4))
                        for i in range(16)
                    ]
                m <<= 1
        return y
    if name in ("Q4_K", "Q5_K"):
        d, dmin, scales = _h(block, 0), _h(block, 2), block[4:16]
        qh = block[16:48] if name == "Q5_K" else None
        ql = block[48:176] if name == "Q5_K" else block[16:144]
        u1, u2 = 1, 2
        for k in range(4):
            sc, m = _scale_min_k4(2 * k, scales)
            d1, m1 = d * sc, dmin * m
            sc, m = _scale_min_k4(2 * k + 1, scales)
            d2, m2 = d * sc, dmin * m
            q = ql[32 * k : 32 * k + 32]
            h1 = [16 if qh is not None and qh[i] & u1 else 0 for i in range(32)]
            h2 = [16 if qh is not None and qh[i] & u2 else 0 for i in range(32)]
            y += [d1 * ((q[i] & 0xF) + h1[i]) - m1 for i in range(32)]
            y += [d2 * ((q[i] >> 4) + h2[i]) - m2 for i in range(32)]
            u1, u2 = u1 << 2, u2 << 2
        return y
    if name == "Q6_K":
        ql, qh = block[0:128], block[128:192]
        sc = np.frombuffer(block[192:208], dtype=np.int8).tolist()
        d = _h(block, 208)
        out = [0.0] * 256
        for n in range(2):
            L, H, S = ql[64 * n :], qh[32 * n :], sc[8 * n :]
            for i in range(32):
                is_ = i // 16
                q1 = ((L[i] & 0xF) | (((H[i] >> 0) & 3) << 4)) - 32
                q2 = ((L[i + 32] & 0xF) | (((H[i] >> 2) & 3) << 4)) - 32
                q3 = ((L[i] >> 4) | (((H[i] >> 4) & 3) << 4)) - 32
                q4 = ((L[i + 32] >> 4) | (((H[i] >> 6) & 3) << 4)) - 32
                out[128 * n + i] = d * S[is_] * q1
                out[128 * n + i + 32] = d * S[is_ + 2] * q2
                out[128 * n + i + 64] = d * S[is_ + 4] * q3
                out[128 * n + i + 96] = d * S[is_ + 6] * q4
        return out
    raise KeyError(name)


def random_blocks(name: str, shape: tuple[int, int], seed: int = 0) -> tuple[tuple, np.ndarray]:
    """A tensor of random (valid) blocks: `((ggml type, shape, raw bytes), reference values)`.

    The float16 scale fields (d, dmin) of each block are set so its largest value is about 0.1.
    """
    code, elems, nbytes, f16_at = BLOCKS[name]
    rng = np.random.default_rng(seed)
    n = shape[0] * shape[1] // elems
    raw = rng.integers(0, 256, size=(n, nbytes), dtype=np.uint8)

    def decode_all() -> np.ndarray:
        return np.array([reference_decode(name, bytes(row)) for row in raw], dtype=np.float32)

    def set_fields(values: np.ndarray) -> None:
        for at in f16_at:
            raw[:, at : at + 2] = values.astype(np.float16).view(np.uint8).reshape(n, 2)

    set_fields(np.ones(n))  # values are linear in (d, dmin): measure at 1, then rescale
    peak = np.abs(decode_all()).max(axis=1)
    set_fields(0.1 / np.where(peak > 0, peak, 1.0) * rng.uniform(0.5, 1.0, n))
    return (code, shape, raw.tobytes()), decode_all().reshape(shape)
