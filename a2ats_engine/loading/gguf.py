"""Convert a llama.cpp GGUF file (llama, qwen2, qwen3, gemma3, phi3) into an mlx-lm model folder.

`mx.load` reads GGUF natively: Q4_0, Q4_1 and Q8_0 tensors come back as MLX quantized triples
(`weight` uint32-packed, `scales`, `biases`, group size 32) and are kept quantized; other types are
dequantized by MLX's reader (to float16). This module renames tensors to mlx-lm's names
(`gguf_archs.py`: the per-architecture tables, RoPE pairing and norm conventions), writes
config.json (built from the metadata in `gguf_config.py`, with a per-layer `quantization` map,
since bits may differ per tensor), safetensors weights, and a tokenizer rebuilt from the metadata
(`gguf_tokenizer`).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections import Counter
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from ..errors import ModelLoadError
from ..files import sha256_file  # noqa: F401  (models and demo_model hash through here)
from ..progress import Progress
from .gguf_archs import architecture, mlx_tensor_name
from .gguf_config import model_config, scalar

CONVERTER_VERSION = 2
"""Bumped when the converted folder changes, so cached conversions are redone."""

SOURCE_FILE = "a2ats_source.json"
"""Provenance written into each converted folder (source file, hash, GGUF file type)."""

GGUF_GROUP_SIZE = 32
GGUF_MAGIC = b"GGUF"
# llama.cpp `enum llama_ftype` (general.file_type) -> name.
FILE_TYPES = {
    0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 7: "Q8_0", 8: "Q5_0", 9: "Q5_1", 10: "Q2_K",
    11: "Q3_K_S", 12: "Q3_K_M", 13: "Q3_K_L", 14: "Q4_K_S", 15: "Q4_K_M", 16: "Q5_K_S",
    17: "Q5_K_M", 18: "Q6_K", 19: "IQ2_XXS", 20: "IQ2_XS", 21: "Q2_K_S", 22: "IQ3_XS",
    23: "IQ3_XXS", 24: "IQ1_S", 25: "IQ4_NL", 26: "IQ3_S", 27: "IQ3_M", 28: "IQ2_S", 29: "IQ2_M",
    30: "IQ4_XS", 31: "IQ1_M", 32: "BF16", 36: "TQ1_0", 37: "TQ2_0",
}  # fmt: skip
UNQUANTIZED_FILE_TYPES = ("F32", "F16", "BF16")


# ---------------------------------------------------------------------------------------------
# Reading


def check_gguf_header(path: Path) -> None:
    """Fail with a one-line ModelLoadError unless `path` starts like a GGUF file (magic, version)."""
    try:
        with open(path, "rb") as f:
            head = f.read(8)
    except OSError as exc:
        raise ModelLoadError(f"cannot read {path}: {exc.strerror or exc}") from exc
    if len(head) < 8:
        raise ModelLoadError(f"{path} is not a GGUF file: only {len(head)} bytes long (truncated?)")
    if head[:4] != GGUF_MAGIC:
        raise ModelLoadError(
            f"{path} is not a GGUF file (it starts with {head[:4]!r}, not b'GGUF')"
        )
    version = int.from_bytes(head[4:8], "little")
    if version not in (2, 3):
        raise ModelLoadError(f"{path}: GGUF version {version} is not supported (only 2 and 3)")


def _read_gguf(path: str | Path):
    """`(tensors, header)` of a GGUF file.

    Tensors are MLX arrays named as in the file; packed types come as `<name>.weight/.scales/
    .biases` triples. `mx.load` reads the file when every tensor is of a type it packs natively
    (F32, F16, Q4_0, Q4_1, Q8_0); otherwise `gguf_reader` repacks every block format itself
    (gguflib, behind `mx.load`, decodes Q4_K wrongly and cannot read Q5_K, Q3_K...).
    """
    import mlx.core as mx

    from .gguf_reader import MLX_NATIVE_TYPES, load_tensors, read_header

    path = Path(path)
    check_gguf_header(path)
    header = read_header(path)
    if {t.type_name for t in header.tensors} <= MLX_NATIVE_TYPES:
        try:
            tensors = mx.load(str(path), format="gguf")
        except (RuntimeError, ValueError) as exc:
            reason = str(exc).replace("[load_gguf] ", "").strip()
            raise ModelLoadError(f"cannot read GGUF {path}: {reason}") from exc
    else:
        tensors = load_tensors(path, header)
    return tensors, header


def tensor_types(path: str | Path) -> dict[str, int]:
    """How many tensors of each GGML type ("Q4_K": 120, "Q6_K": 31, "F32": 61...) a file holds."""
    from .gguf_reader import read_header

    return dict(Counter(t.type_name for t in read_header(path).tensors).most_common())


def file_type_name(metadata: dict, tensors: dict | None = None) -> str:
    """The GGUF's quantization as llama.cpp names it ("Q4_1", "Q4_K_M", "F16"...)."""
    code = scalar(metadata, "general.file_type")
    declared = FILE_TYPES.get(code) if isinstance(code, int) else None
    packed = tensors is not None and any(name.endswith(".scales") for name in tensors)
    if declared is not None and not (packed and declared in UNQUANTIZED_FILE_TYPES):
        return declared
    if packed:
        return "quantized"
    return "F32" if tensors is None else _float_name(tensors)


def _float_name(tensors: dict) -> str:
    import mlx.core as mx

    dtypes = Counter(t.dtype for name, t in tensors.items() if name.endswith(".weight"))
    common = dtypes.most_common(1)[0][0] if dtypes else mx.float32
    return {mx.float16: "F16", mx.bfloat16: "BF16"}.get(common, "F32")


# ---------------------------------------------------------------------------------------------
# Weights


def convert_weights(
    tensors: dict, types: dict[str, str] | None = None, arch: str = "llama"
) -> tuple[dict, dict | None]:
    """Rename GGUF tensors to mlx-lm names (for the GGUF architecture `arch`) and build the
    quantization map. Gemma 3 norm weights get their folded-in 1 subtracted.

    types: GGML type name of each GGUF tensor ("blk.0.attn_q.weight" -> "Q4_K"), which gives
    the MLX bits and group size of packed tensors; without it, group size 32 is assumed (all
    `mx.load` packs). Returns `(weights, quantization)`; quantization is None when nothing is
    packed, else `{"group_size": 32, "bits": <most common>, "mode": "affine",
    "<module path>": {"group_size": g, "bits": b, "mode": "affine"}, ...}` with one entry per
    packed module (GGUF bits and groups differ per tensor: Q4_K next to Q6_K).
    """
    from .gguf_reader import DECODERS, mlx_layout

    weights, per_module = {}, {}
    for name, value in tensors.items():
        new = mlx_tensor_name(name, arch)
        if new is None:
            continue
        if arch == "gemma3" and name.endswith("norm.weight"):
            value = value - 1.0  # llama.cpp stores Gemma's 1 + w
        weights[new] = value
        if name.endswith(".scales"):
            base = name[: -len(".scales")]
            packed = tensors[f"{base}.weight"]
            kind = (types or {}).get(f"{base}.weight")
            group = mlx_layout(kind)[1] if kind in DECODERS else GGUF_GROUP_SIZE
            # packed words per scale = group * bits / 32
            bits = packed.shape[-1] * 32 // (value.shape[-1] * group)
            per_module[new[: -len(".scales")]] = {
                "group_size": group,
                "bits": bits,
                "mode": "affine",
            }
    weights = _uniform_float_dtype(weights)
    if not per_module:
        return weights, None
    bits = Counter(q["bits"] for q in per_module.values()).most_common(1)[0][0]
    return weights, {"group_size": GGUF_GROUP_SIZE, "bits": bits, "mode": "affine", **per_module}


def _uniform_float_dtype(weights: dict) -> dict:
    """Store float32 tensors (llama.cpp keeps norms in F32) in the model's compute dtype.

    In a quantized or F16 file the scales / matrices are float16; float32 norm weights would
    promote every activation, and so the KV cache, to float32 (twice the memory on Metal).
    F32 files stay float32.
    """
    import mlx.core as mx

    floats = (mx.float16, mx.bfloat16, mx.float32)
    scales = [v.dtype for k, v in weights.items() if k.endswith(".scales")]
    matrices = [v.dtype for v in weights.values() if v.ndim == 2 and v.dtype in floats]
    candidates = scales or matrices
    if not candidates:
        return weights
    target = Counter(candidates).most_common(1)[0][0]
    if target == mx.float32:
        return weights
    return {k: v.astype(target) if v.dtype == mx.float32 else v for k, v in weights.items()}


# ---------------------------------------------------------------------------------------------
# Writing the folder


def _save_weights(folder: Path, weights: dict) -> None:
    import mlx.core as mx
    from mlx_lm.utils import make_shards

    shards = make_shards(weights)
    if len(shards) == 1:
        mx.save_safetensors(str(folder / "model.safetensors"), shards[0], {"format": "mlx"})
        return
    index: dict[str, Any] = {"metadata": {"total_size": 0}, "weight_map": {}}
    for i, shard in enumerate(shards, start=1):
        name = f"model-{i:05d}-of-{len(shards):05d}.safetensors"
        mx.save_safetensors(str(folder / name), shard, {"format": "mlx"})
        for key, value in shard.items():
            index["weight_map"][key] = name
            index["metadata"]["total_size"] += value.nbytes
    (folder / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))


def _write_folder(folder: Path, tensors: dict, header, source: dict) -> None:
    from .gguf_tokenizer import build_tokenizer, generation_config, tokenizer_config

    metadata = header.metadata
    config = model_config(metadata, tensors)
    types = {t.name: t.type_name for t in header.tensors}
    weights, quantization = convert_weights(tensors, types, architecture(metadata))
    if quantization is not None:
        config["quantization"] = quantization
    tokenizer = build_tokenizer(metadata)
    tok_config = tokenizer_config(metadata, config["max_position_embeddings"])
    _save_weights(folder, weights)
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    tokenizer.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps(tok_config, indent=2))
    sampling = generation_config(metadata)
    if sampling:
        (folder / "generation_config.json").write_text(json.dumps(sampling, indent=2))
    (folder / SOURCE_FILE).write_text(json.dumps(source, indent=2))


def convert_gguf(
    path: str | Path,
    out_dir: str | Path,
    *,
    name: str | None = None,
    sha256: str | None = None,
    origin: str | None = None,
    progress: Progress | None = None,
) -> Path:
    """Convert the GGUF at `path` into an mlx-lm folder `out_dir` (written to a temporary sibling
    folder, then renamed, so a crash never leaves a half-written folder behind).

    `out_dir` must not exist yet, or be empty. `name` and `origin` (where the file came from,
    default its path) are recorded in the folder's a2ats_source.json. Returns `out_dir`.
    ModelLoadError on a bad file.
    """
    path, out_dir = Path(path).expanduser(), Path(out_dir).expanduser()
    if out_dir.exists() and (not out_dir.is_dir() or any(out_dir.iterdir())):
        raise ModelLoadError(f"{out_dir} already exists and is not empty; choose a new folder")
    if not path.is_file():
        raise ModelLoadError(f"no such GGUF file: {path}")
    check_gguf_header(path)
    if progress is not None:
        progress("read gguf", 0, 1)
    with _naming_the_file(path):
        return _convert(path, out_dir, name, sha256, origin, progress)


@contextmanager
def _naming_the_file(path: Path):
    """Every failure while converting `path` as one ModelLoadError line that names the file
    (metadata problems are found far from where the file is known)."""
    try:
        yield
    except ModelLoadError as exc:
        text = str(exc)
        if str(path) in text or path.name in text:
            raise
        raise ModelLoadError(f"cannot convert GGUF {path}: {text}") from exc
    except (ValueError, TypeError, KeyError, IndexError, OverflowError, RecursionError) as exc:
        detail = " ".join(str(exc).split())[:300] or type(exc).__name__
        raise ModelLoadError(f"cannot convert GGUF {path}: damaged metadata ({detail})") from exc


def _text_field(metadata: dict, key: str) -> str | None:
    """A string metadata field (None when absent, empty or not a string)."""
    value = metadata.get(key)
    return value if isinstance(value, str) and value.strip() else None


def _convert(path, out_dir, name, sha256, origin, progress) -> Path:
    tensors, header = _read_gguf(path)
    metadata = header.metadata
    architecture(metadata)  # fail fast on unsupported architectures
    if progress is not None:
        progress("read gguf", 1, 1)
        progress("convert", 0, 1)
    source = {
        "converter_version": CONVERTER_VERSION,
        "source": origin or str(path.resolve()),
        "sha256": sha256 or sha256_file(path),
        "name": name or _text_field(metadata, "general.name") or path.stem,
        "gguf_file_type": file_type_name(metadata, tensors),
        "tensor_types": dict(Counter(t.type_name for t in header.tensors).most_common()),
        "disk_bytes": path.stat().st_size,
    }
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", suffix=".tmp", dir=out_dir.parent))
    try:
        _write_folder(tmp, tensors, header, source)
        tmp.chmod(0o755)  # mkdtemp makes it private
        if out_dir.exists():
            out_dir.rmdir()  # empty, checked above
        os.replace(tmp, out_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if progress is not None:
        progress("convert", 1, 1)
    return out_dir


def read_source_info(folder: str | Path) -> dict | None:
    """The provenance a converted folder records (None for folders not made from a GGUF)."""
    file = Path(folder) / SOURCE_FILE
    try:
        return json.loads(file.read_text())
    except (OSError, ValueError):
        return None
