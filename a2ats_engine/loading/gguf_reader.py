"""A GGUF reader in numpy: the header (metadata, tensor table) and, for quantization types
`mx.load` cannot read correctly, the tensor data as MLX affine-quantized triples.

Why not `mx.load` alone: MLX reads F32/F16/Q4_0/Q4_1/Q8_0 natively, unpacks a few other types to
float16 through gguflib, and fails on the rest. gguflib's Q4_K unpacking applies the scale of
sub-block 2k to sub-block 2k + 1 (a known upstream bug), which silently corrupts Q4_K_M files,
the most common GGUF kind. So the header is parsed here (also to report truncation precisely),
`mx.load` is used when every tensor is of a natively packed type, and otherwise every tensor is
read here.

Every llama.cpp block format used for weights is affine per group of 16 or 32 values
(`value = scale * code + bias`), which is exactly MLX's affine quantization, so the blocks are
repacked without loss (scales and biases rounded to float16):

| GGUF  | MLX bits | group | scale, bias                       |
|-------|----------|-------|-----------------------------------|
| Q4_0  | 4        | 32    | d, -8d                            |
| Q4_1  | 4        | 32    | d, m                              |
| Q5_0  | 5        | 32    | d, -16d                           |
| Q5_1  | 5        | 32    | d, m                              |
| Q8_0  | 8        | 32    | d, -128d (code = q + 128)         |
| Q2_K  | 2        | 16    | d*sc, -dmin*m                     |
| Q3_K  | 3        | 16    | d*(sc-32), -4d*(sc-32)            |
| Q4_K  | 4        | 32    | d*sc, -dmin*m                     |
| Q5_K  | 5        | 32    | d*sc, -dmin*m                     |
| Q6_K  | 6        | 16    | d*sc, -32d*sc                     |

MLX packs b-bit codes of a row as one little-endian bit stream in uint32 words.
"""

from __future__ import annotations

import math
import mmap
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import ModelLoadError

QK_K = 256
MAX_ARRAY_DEPTH = 8
"""Metadata arrays of arrays nest at most this deep (llama.cpp writes one level)."""
MAX_TENSOR_DIMS = 4  # GGML_MAX_DIMS


@dataclass(frozen=True)
class GGMLType:
    name: str
    block_elems: int
    block_bytes: int


# ggml.h `enum ggml_type` -> (name, values per block, bytes per block)
GGML_TYPES = {
    0: GGMLType("F32", 1, 4),
    1: GGMLType("F16", 1, 2),
    2: GGMLType("Q4_0", 32, 18),
    3: GGMLType("Q4_1", 32, 20),
    6: GGMLType("Q5_0", 32, 22),
    7: GGMLType("Q5_1", 32, 24),
    8: GGMLType("Q8_0", 32, 34),
    9: GGMLType("Q8_1", 32, 36),
    10: GGMLType("Q2_K", QK_K, 84),
    11: GGMLType("Q3_K", QK_K, 110),
    12: GGMLType("Q4_K", QK_K, 144),
    13: GGMLType("Q5_K", QK_K, 176),
    14: GGMLType("Q6_K", QK_K, 210),
    15: GGMLType("Q8_K", QK_K, 292),
    16: GGMLType("IQ2_XXS", QK_K, 66),
    17: GGMLType("IQ2_XS", QK_K, 74),
    18: GGMLType("IQ3_XXS", QK_K, 98),
    19: GGMLType("IQ1_S", QK_K, 50),
    20: GGMLType("IQ4_NL", 32, 18),
    21: GGMLType("IQ3_S", QK_K, 110),
    22: GGMLType("IQ2_S", QK_K, 82),
    23: GGMLType("IQ4_XS", QK_K, 136),
    24: GGMLType("I8", 1, 1),
    25: GGMLType("I16", 1, 2),
    26: GGMLType("I32", 1, 4),
    27: GGMLType("I64", 1, 8),
    28: GGMLType("F64", 1, 8),
    29: GGMLType("IQ1_M", QK_K, 56),
    30: GGMLType("BF16", 1, 2),
}
MLX_NATIVE_TYPES = frozenset({"F32", "F16", "Q4_0", "Q4_1", "Q8_0"})
"""Types `mx.load` reads correctly (the quantized ones as packed triples)."""


@dataclass(frozen=True)
class TensorInfo:
    name: str
    shape: tuple[int, ...]  # numpy order (GGUF lists the fastest dim first)
    ggml_type: int
    offset: int  # absolute byte offset in the file
    nbytes: int

    @property
    def type_name(self) -> str:
        return GGML_TYPES[self.ggml_type].name


@dataclass(frozen=True)
class GGUFHeader:
    version: int
    metadata: dict[str, Any]
    tensors: list[TensorInfo]
    file_size: int


# ---------------------------------------------------------------------------------------------
# Header

_SCALAR_FORMATS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?",
                   10: "<Q", 11: "<q", 12: "<d"}  # fmt: skip
_NUMPY_TYPES = {0: np.uint8, 1: np.int8, 2: np.uint16, 3: np.int16, 4: np.uint32, 5: np.int32,
                6: np.float32, 7: np.bool_, 10: np.uint64, 11: np.int64, 12: np.float64}  # fmt: skip


class _Cursor:
    def __init__(self, buffer, path: Path) -> None:
        self.buffer, self.pos, self.path = buffer, 0, path

    def take(self, n: int, what: str) -> memoryview:
        if n < 0 or self.pos + n > len(self.buffer):
            raise ModelLoadError(
                f"cannot read GGUF {self.path}: {what} extends past the end of the file "
                "(truncated or corrupt)"
            )
        view = memoryview(self.buffer)[self.pos : self.pos + n]
        self.pos += n
        return view

    def unpack(self, fmt: str, what: str):
        return struct.unpack(fmt, self.take(struct.calcsize(fmt), what))[0]

    def string(self, what: str) -> str:
        n = self.unpack("<Q", what)
        return bytes(self.take(n, what)).decode("utf-8", errors="replace")

    def value(self, kind: int, what: str, depth: int = 0):
        if kind == 8:
            return self.string(what)
        if kind == 9:
            if depth >= MAX_ARRAY_DEPTH:
                raise ModelLoadError(
                    f"cannot read GGUF {self.path}: metadata arrays nested more than "
                    f"{MAX_ARRAY_DEPTH} deep ({what})"
                )
            item_kind, count = self.unpack("<I", what), self.unpack("<Q", what)
            if item_kind in _NUMPY_TYPES:
                dtype = np.dtype(_NUMPY_TYPES[item_kind])
                data = self.take(count * dtype.itemsize, what)
                return np.frombuffer(data, dtype=dtype).copy()
            if count > len(self.buffer) - self.pos:  # every item takes at least one byte
                self.take(count, what)  # raises: extends past the end of the file
            return [self.value(item_kind, what, depth + 1) for _ in range(count)]
        if kind in _SCALAR_FORMATS:
            return self.unpack(_SCALAR_FORMATS[kind], what)
        raise ModelLoadError(f"cannot read GGUF {self.path}: unknown metadata type {kind} ({what})")


def read_header(path: str | Path) -> GGUFHeader:
    """Parse a GGUF file's metadata and tensor table, checking every tensor lies inside the file.

    Numeric metadata arrays come back as numpy arrays, string arrays as lists. ModelLoadError
    for a truncated, foreign or corrupt file (the message names the file and the problem).
    """
    path = Path(path)
    with open(path, "rb") as f:
        size = f.seek(0, 2)
        if size == 0:
            raise ModelLoadError(f"{path} is not a GGUF file: it is empty")
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buffer:
            return _parse(_Cursor(buffer, path), size)


def _parse(cur: _Cursor, size: int) -> GGUFHeader:
    if bytes(cur.take(4, "magic")) != b"GGUF":
        raise ModelLoadError(f"{cur.path} is not a GGUF file")
    version = cur.unpack("<I", "version")
    if version not in (2, 3):
        raise ModelLoadError(f"{cur.path}: GGUF version {version} is not supported (only 2, 3)")
    n_tensors, n_kv = cur.unpack("<Q", "tensor count"), cur.unpack("<Q", "metadata count")
    if n_tensors > 1_000_000 or n_kv > 1_000_000:
        raise ModelLoadError(f"cannot read GGUF {cur.path}: corrupt header (counts too large)")
    metadata: dict[str, Any] = {}
    for _ in range(n_kv):
        key = cur.string("metadata key")
        metadata[key] = cur.value(cur.unpack("<I", f"metadata {key}"), f"metadata value {key}")
    raw_tensors = []
    for _ in range(n_tensors):
        name = cur.string("tensor name")
        n_dims = cur.unpack("<I", f"tensor {name}")
        if n_dims > MAX_TENSOR_DIMS:
            raise ModelLoadError(
                f"cannot read GGUF {cur.path}: tensor {name} has {n_dims} dimensions "
                f"(at most {MAX_TENSOR_DIMS})"
            )
        dims = [cur.unpack("<Q", f"tensor {name}") for _ in range(n_dims)]
        kind, offset = cur.unpack("<I", f"tensor {name}"), cur.unpack("<Q", f"tensor {name}")
        raw_tensors.append((name, dims, kind, offset))
    alignment = _alignment(cur.path, metadata.get("general.alignment", 32))
    data_start = -(-cur.pos // alignment) * alignment
    tensors = [_tensor_info(cur.path, data_start, size, *t) for t in raw_tensors]
    return GGUFHeader(version, metadata, tensors, size)


def _alignment(path: Path, value: Any) -> int:
    """`general.alignment`: a positive multiple of 8 (the GGUF spec), else ModelLoadError."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 8 or value % 8:
        raise ModelLoadError(
            f"cannot read GGUF {path}: general.alignment={_short(value)} is not a positive "
            "multiple of 8"
        )
    return value


def _short(value: Any, limit: int = 40) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _tensor_info(path, data_start, size, name, dims, kind, offset) -> TensorInfo:
    ggml = GGML_TYPES.get(kind)
    if ggml is None:
        raise ModelLoadError(
            f"cannot read GGUF {path}: not supported yet: GGML tensor type {kind} (tensor {name})"
        )
    count = math.prod(dims)  # Python ints: no overflow to a small product
    if dims and dims[0] % ggml.block_elems:
        raise ModelLoadError(
            f"cannot read GGUF {path}: tensor {name} row length {dims[0]} is not a multiple of "
            f"the {ggml.name} block ({ggml.block_elems})"
        )
    nbytes = count // ggml.block_elems * ggml.block_bytes
    start = data_start + offset
    if start + nbytes > size:
        raise ModelLoadError(
            f"cannot read GGUF {path}: Tensor '{name}' extends past the end of the file "
            f"(needs {start + nbytes} bytes, file has {size}; truncated download?)"
        )
    return TensorInfo(name, tuple(reversed(dims)), kind, start, nbytes)


# ---------------------------------------------------------------------------------------------
# Block decoders: raw blocks [n, block_bytes] uint8 -> (codes [n, block_elems] uint8,
# scales [n, groups] float32, biases [n, groups] float32)


def _f16(raw: np.ndarray) -> np.ndarray:
    """[n, 2] uint8 -> [n] float32."""
    return np.ascontiguousarray(raw).view(np.float16)[:, 0].astype(np.float32)


def _nibbles(qs: np.ndarray) -> np.ndarray:
    """[n, 16] bytes -> [n, 32] codes: low nibbles are values 0..15, high nibbles 16..31."""
    return np.concatenate([qs & 0x0F, qs >> 4], axis=1)


def _high_bits(qh: np.ndarray, count: int) -> np.ndarray:
    """[n, 4] bytes (a little-endian uint32) -> [n, count] bits, bit j = value j."""
    bits = np.unpackbits(qh, axis=1, bitorder="little")
    return bits[:, :count]


def _q4_0(b):
    d = _f16(b[:, 0:2])
    return _nibbles(b[:, 2:18]), d[:, None], -8.0 * d[:, None]


def _q4_1(b):
    d, m = _f16(b[:, 0:2]), _f16(b[:, 2:4])
    return _nibbles(b[:, 4:20]), d[:, None], m[:, None]


def _q5_0(b):
    d = _f16(b[:, 0:2])
    codes = _nibbles(b[:, 6:22]) | (_high_bits(b[:, 2:6], 32) << 4)
    return codes, d[:, None], -16.0 * d[:, None]


def _q5_1(b):
    d, m = _f16(b[:, 0:2]), _f16(b[:, 2:4])
    codes = _nibbles(b[:, 8:24]) | (_high_bits(b[:, 4:8], 32) << 4)
    return codes, d[:, None], m[:, None]


def _q8_0(b):
    d = _f16(b[:, 0:2])
    codes = (b[:, 2:34].view(np.int8).astype(np.int16) + 128).astype(np.uint8)
    return codes, d[:, None], -128.0 * d[:, None]


def _k_scales_mins(s: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Q4_K / Q5_K: 12 bytes -> 8 six-bit scales and 8 six-bit mins (ggml get_scale_min_k4)."""
    s = s.astype(np.int32)
    low_sc, low_m, mixed = s[:, 0:4], s[:, 4:8], s[:, 8:12]
    scales = np.concatenate([low_sc & 63, (mixed & 0x0F) | ((low_sc >> 6) << 4)], axis=1)
    mins = np.concatenate([low_m & 63, (mixed >> 4) | ((low_m >> 6) << 4)], axis=1)
    return scales.astype(np.float32), mins.astype(np.float32)


def _q4_k(b):
    d, dmin = _f16(b[:, 0:2]), _f16(b[:, 2:4])
    sc, m = _k_scales_mins(b[:, 4:16])
    qs = b[:, 16:144].reshape(-1, 4, 32)  # 4 chunks of 32 bytes = 64 values each
    codes = np.stack([qs & 0x0F, qs >> 4], axis=2).reshape(-1, QK_K)  # low half, high half
    return codes, d[:, None] * sc, -dmin[:, None] * m


def _q5_k(b):
    d, dmin = _f16(b[:, 0:2]), _f16(b[:, 2:4])
    sc, m = _k_scales_mins(b[:, 4:16])
    qh = b[:, 16:48]  # bit 2k of qh[l] -> value l of group 2k, bit 2k + 1 -> group 2k + 1
    qs = b[:, 48:176].reshape(-1, 4, 32)
    low = np.stack([qs & 0x0F, qs >> 4], axis=2).reshape(-1, 8, 32)
    high = (qh[:, None, :] >> np.arange(8, dtype=np.uint8)[None, :, None]) & 1
    codes = (low | (high << 4)).reshape(-1, QK_K)
    return codes, d[:, None] * sc, -dmin[:, None] * m


def _q6_k(b):
    ql, qh = b[:, 0:128].reshape(-1, 2, 64), b[:, 128:192].reshape(-1, 2, 32)
    sc = b[:, 192:208].view(np.int8).astype(np.float32)
    d = _f16(b[:, 208:210])
    # per 128-value half: values l, l+32, l+64, l+96 (l < 32) from ql[l], ql[l+32], qh[l]
    low = np.concatenate([ql[:, :, :32] & 0x0F, ql[:, :, 32:] & 0x0F,
                          ql[:, :, :32] >> 4, ql[:, :, 32:] >> 4], axis=2)  # fmt: skip
    shifts = np.repeat(np.array([0, 2, 4, 6], dtype=np.uint8), 32)
    high = (np.tile(qh, (1, 1, 4)) >> shifts[None, None, :]) & 3
    codes = (low | (high << 4)).reshape(-1, QK_K)
    scale = d[:, None] * sc
    return codes, scale, -32.0 * scale


def _q2_k(b):
    sc = b[:, 0:16].astype(np.float32)
    qs = b[:, 16:80].reshape(-1, 2, 1, 32)
    d, dmin = _f16(b[:, 80:82]), _f16(b[:, 82:84])
    shifts = np.array([0, 2, 4, 6], dtype=np.uint8)[None, None, :, None]
    codes = ((qs >> shifts) & 3).reshape(-1, QK_K)  # per half: shift 0 (32 values), 2, 4, 6
    scales = d[:, None] * (sc.astype(np.int32) & 0x0F)
    biases = -dmin[:, None] * (sc.astype(np.int32) >> 4)
    return codes, scales.astype(np.float32), biases.astype(np.float32)


def _q3_k_scales(s: np.ndarray) -> np.ndarray:
    """Q3_K: 12 bytes -> 16 six-bit scales (ggml's kmask unpacking), as signed sc - 32."""
    s = s.astype(np.int32)
    low = np.concatenate([s[:, 0:8] & 0x0F, s[:, 0:8] >> 4], axis=1)  # 16 low nibbles
    top = s[:, 8:12]
    high = np.concatenate([(top >> shift) & 3 for shift in (0, 2, 4, 6)], axis=1)
    return (low | (high << 4)).astype(np.float32) - 32.0


def _q3_k(b):
    hmask, qs = b[:, 0:32], b[:, 32:96].reshape(-1, 2, 1, 32)
    sc, d = _q3_k_scales(b[:, 96:108]), _f16(b[:, 108:110])
    shifts = np.array([0, 2, 4, 6], dtype=np.uint8)[None, None, :, None]
    low = ((qs >> shifts) & 3).reshape(-1, 8, 32)
    high = (hmask[:, None, :] >> np.arange(8, dtype=np.uint8)[None, :, None]) & 1
    codes = (low | (high << 2)).reshape(-1, QK_K)  # value = dl * (low + 4 * high - 4)
    scale = d[:, None] * sc
    return codes, scale, -4.0 * scale


# name -> (decoder, bits, group size)
DECODERS = {
    "Q4_0": (_q4_0, 4, 32),
    "Q4_1": (_q4_1, 4, 32),
    "Q5_0": (_q5_0, 5, 32),
    "Q5_1": (_q5_1, 5, 32),
    "Q8_0": (_q8_0, 8, 32),
    "Q2_K": (_q2_k, 2, 16),
    "Q3_K": (_q3_k, 3, 16),
    "Q4_K": (_q4_k, 4, 32),
    "Q5_K": (_q5_k, 5, 32),
    "Q6_K": (_q6_k, 6, 16),
}


REQUANTIZED_BITS = 8
"""MLX's quantized matmul takes groups of 32, 64 or 128 values only. The group-16 formats
(Q2_K, Q3_K, Q6_K) are decoded and re-quantized to 8 bits per group of 32 (error at most
1/510 of a group's range, far below their own step)."""


def mlx_layout(type_name: str) -> tuple[int, int]:
    """(bits, group size) of the MLX triple a packed GGUF type becomes."""
    _, bits, group = DECODERS[type_name]
    return (bits, group) if group in (32, 64, 128) else (REQUANTIZED_BITS, 32)


def decode_blocks(type_name: str, raw: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Blocks of one type -> (codes [n_values] uint8, scales [n_groups], biases [n_groups]) with
    value = scale * code + bias per group (float32 scales/biases)."""
    decoder, _, _ = DECODERS[type_name]
    ggml = next(t for t in GGML_TYPES.values() if t.name == type_name)
    codes, scales, biases = decoder(raw.reshape(-1, ggml.block_bytes))
    return codes.reshape(-1), scales.reshape(-1), biases.reshape(-1)


def requantize(values: np.ndarray, bits: int, group: int):
    """Affine min/max quantization of float rows [rows, cols] with float16 scales and biases,
    codes chosen against the rounded scale and bias. Returns (packed uint32, scales, biases)."""
    rows, cols = values.shape
    grouped = values.reshape(rows, cols // group, group)
    low, high = grouped.min(axis=2), grouped.max(axis=2)
    levels = 2**bits - 1
    scale = ((high - low) / levels).astype(np.float16)
    bias = low.astype(np.float16)
    safe = np.where(scale == 0, 1, scale).astype(np.float32)
    codes = np.rint((grouped - bias.astype(np.float32)[..., None]) / safe[..., None])
    codes = np.clip(codes, 0, levels).astype(np.uint8).reshape(rows, cols)
    return pack_codes(codes, bits), scale, bias


def pack_codes(codes: np.ndarray, bits: int) -> np.ndarray:
    """[rows, cols] codes < 2**bits -> [rows, cols * bits / 32] uint32, MLX's packing (each row a
    little-endian bit stream). cols * bits must be a multiple of 32."""
    rows, cols = codes.shape
    codes = codes.astype(np.uint8)
    if bits == 8:
        packed = codes
    elif bits == 4:
        packed = codes[:, 0::2] | (codes[:, 1::2] << 4)
    else:
        eights = codes.reshape(rows, cols // 8, 8).astype(np.uint64)
        stream = np.zeros((rows, cols // 8), dtype=np.uint64)
        for k in range(8):
            stream |= eights[:, :, k] << np.uint64(k * bits)
        packed = stream.view(np.uint8).reshape(rows, cols // 8, 8)[:, :, :bits]
    return np.ascontiguousarray(packed).reshape(rows, -1).view(np.uint32)


# ---------------------------------------------------------------------------------------------
# Tensors


def _base_name(name: str) -> str:
    return name[: -len(".weight")] if name.endswith(".weight") else name


def load_tensors(path: str | Path, header: GGUFHeader, chunk_values: int = 1 << 23) -> dict:
    """Every tensor of the file as MLX arrays, named like `mx.load` names them: packed types
    give `<base>.weight` (uint32), `<base>.scales` and `<base>.biases` (float16).

    ModelLoadError for tensor types that have no decoder here (IQ*, Q8_K...).
    """
    import mlx.core as mx

    data = np.memmap(path, dtype=np.uint8, mode="r")
    out: dict[str, Any] = {}
    for info in header.tensors:
        raw = data[info.offset : info.offset + info.nbytes]
        name = info.type_name
        if name in ("F32", "F16"):
            dtype = np.float32 if name == "F32" else np.float16
            out[info.name] = mx.array(np.array(raw.view(dtype)).reshape(info.shape))
        elif name == "BF16":
            bits = mx.array(np.array(raw.view(np.uint16)).reshape(info.shape))
            out[info.name] = bits.view(mx.bfloat16)
        elif name in DECODERS:
            out.update(_packed_tensor(info, raw, chunk_values))
        else:
            raise ModelLoadError(f"not supported yet: {name} tensors (tensor {info.name})")
    return out


def _packed_tensor(info: TensorInfo, raw: np.ndarray, chunk_values: int) -> dict:
    import mlx.core as mx

    _, bits, group = DECODERS[info.type_name]
    out_bits, out_group = mlx_layout(info.type_name)
    cols = info.shape[-1]
    rows = int(np.prod(info.shape[:-1])) if len(info.shape) > 1 else 1
    row_bytes = info.nbytes // rows
    step = max(1, chunk_values // cols)
    weights, scales, biases = [], [], []
    for start in range(0, rows, step):
        stop = min(rows, start + step)
        codes, sc, bi = decode_blocks(info.type_name, raw[start * row_bytes : stop * row_bytes])
        n = stop - start
        if out_group == group:
            weights.append(mx.array(pack_codes(codes.reshape(n, cols), bits)))
            scales.append(mx.array(sc.reshape(n, cols // group).astype(np.float16)))
            biases.append(mx.array(bi.reshape(n, cols // group).astype(np.float16)))
        else:
            values = codes.reshape(-1, group).astype(np.float32) * sc[:, None] + bi[:, None]
            packed, sc16, bi16 = requantize(values.reshape(n, cols), out_bits, out_group)
            weights.append(mx.array(packed))
            scales.append(mx.array(sc16))
            biases.append(mx.array(bi16))
    lead = info.shape[:-1] if len(info.shape) > 1 else (1,)
    base = _base_name(info.name)
    return {
        f"{base}.weight": mx.concatenate(weights).reshape(*lead, -1),
        f"{base}.scales": mx.concatenate(scales).reshape(*lead, -1),
        f"{base}.biases": mx.concatenate(biases).reshape(*lead, -1),
    }
