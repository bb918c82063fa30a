"""The codebook file format: one safetensors file, read and written with a precise one-line
`CodebookError` for every way a file can be missing, foreign, truncated, damaged or too new.

Arrays `layers.{l}.centroids`, `layers.{l}.assign_centroids`, `layers.{l}.chol` (the layout
session files share, under a prefix), and one string metadata entry `a2ats` holding a JSON object:
format name, format version, model fingerprint, n_centroids, sub_dim, beta, far_offset,
far_buckets, window (the calibration settings `Codebook.validate_for` compares with a cache's
config, `codebook_check.py`), corpus description, token count, creation time. The `Codebook`
class (`codebook.py`) reads and writes its files through this module.
"""

from __future__ import annotations

import json
import os
import struct
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, BinaryIO

import mlx.core as mx

from ..errors import CodebookError

FORMAT_NAME = "a2ats-codebook"
FORMAT_VERSION = 1
METADATA_KEY = "a2ats"
MAX_HEADER_BYTES = 100 * 1024 * 1024  # safetensors' own limit
MAX_ABS_VALUE = 1e12
"""Largest magnitude a loaded codebook array may hold: squared distances and score tables of
larger values overflow float32 (a calibrated codebook's values are below 1e4)."""

# A2ATSConfig fields calibration records in the metadata that shape the query moments (the
# distances queries are rotated to): a cache that changes one gets a warning.
CALIBRATED_SETTINGS = ("far_offset", "far_buckets", "window")

ARRAY_NAMES = ("centroids", "assign_centroids", "chol")
"""The arrays stored per layer, as `{prefix}layers.{l}.{name}`."""


def layer_arrays(
    centroids: Sequence[mx.array],
    assign_centroids: Sequence[mx.array],
    chol: Sequence[mx.array],
    prefix: str = "",
) -> dict[str, mx.array]:
    """The arrays under the one layout codebook and session files share:
    `{prefix}layers.{l}.centroids`, `.assign_centroids`, `.chol` for every layer l."""
    arrays = {}
    for i, layer in enumerate(zip(centroids, assign_centroids, chol, strict=True)):
        for name, arr in zip(ARRAY_NAMES, layer, strict=True):
            arrays[f"{prefix}layers.{i}.{name}"] = arr
    return arrays


def read_layer_arrays(
    arrays: dict[str, mx.array], num_layers: Any, prefix: str = "", where: str = "codebook"
) -> tuple[list[mx.array], list[mx.array], list[mx.array]]:
    """The inverse of `layer_arrays`: (centroids, assign_centroids, chol), one array per layer,
    each checked with `check_values`. CodebookError naming `where` for a missing or bad array."""
    if not isinstance(num_layers, int) or num_layers < 1:
        raise CodebookError(f"{where}: file is damaged (no layer count in its metadata)")
    parts = []
    for name in ARRAY_NAMES:
        per_layer = []
        for i in range(num_layers):
            arr = arrays.get(f"{prefix}layers.{i}.{name}")
            if arr is None:
                raise CodebookError(f"{where}: file is damaged ({prefix}layers.{i}.{name} missing)")
            per_layer.append(arr)
        parts.append(per_layer)
    for name, per_layer in zip(ARRAY_NAMES, parts, strict=True):
        for i, arr in enumerate(per_layer):
            check_values(arr, f"{where}: file is damaged ({prefix}layers.{i}.{name}")
    return parts[0], parts[1], parts[2]


def check_values(arr: Any, problem: str) -> None:
    """CodebookError `problem` + why, unless `arr` is a real array of finite values no larger
    than `MAX_ABS_VALUE` (NaN or huge centroids would make every score table garbage)."""
    if not isinstance(arr, mx.array) or not (
        mx.issubdtype(arr.dtype, mx.floating) or mx.issubdtype(arr.dtype, mx.integer)
    ):
        raise CodebookError(f"{problem} is not a real-valued array)")
    values = arr.astype(mx.float32)
    if not bool(mx.all(mx.isfinite(values)).item()):
        raise CodebookError(f"{problem} holds values that are not finite: NaN or infinity)")
    if values.size and float(mx.max(mx.abs(values)).item()) > MAX_ABS_VALUE:
        raise CodebookError(f"{problem} holds values beyond +-{MAX_ABS_VALUE:g})")


def write_codebook_file(path: Path, arrays: dict[str, mx.array], metadata: dict[str, Any]) -> None:
    """Write one safetensors file (atomically: a temporary file renamed into place)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp.safetensors")
    try:
        mx.save_safetensors(str(tmp), arrays, metadata={METADATA_KEY: json.dumps(metadata)})
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()


def read_codebook_arrays(path: Path) -> dict[str, mx.array]:
    """Every array of a codebook file whose header `read_metadata` accepted."""
    try:
        return mx.load(str(path), format="safetensors")
    except Exception as exc:  # MLX raises plain RuntimeError/ValueError on bad content
        raise CodebookError(f"{path.name}: file is damaged ({exc})") from exc


def header_length(f: BinaryIO, size: int, refuse: Callable[[str], Exception]) -> int:
    """The length of a safetensors file's JSON header: the little-endian u64 the open file `f`
    (of `size` bytes) starts with. Raises `refuse("only N bytes")` for a shorter file."""
    head = f.read(8)
    if len(head) < 8:
        raise refuse(f"only {size} bytes")
    return struct.unpack("<Q", head)[0]


def read_metadata(path: Path) -> dict[str, Any]:
    """Parse the safetensors header by hand so every failure gets a precise one-line message."""
    name = path.name
    if not path.exists():
        raise CodebookError(f"codebook file not found: {path}")
    if path.is_dir():
        raise CodebookError(f"{path} is a folder, not a codebook file")

    def refuse(why: str) -> CodebookError:
        return CodebookError(f"{name}: not an A2ATS codebook file ({why})")

    size = path.stat().st_size
    with open(path, "rb") as f:
        header_len = header_length(f, size, refuse)
        if header_len > MAX_HEADER_BYTES:
            raise refuse("not safetensors")
        raw = f.read(header_len)
    if len(raw) < header_len:
        # Could be a truncated codebook or a foreign file; say which when the prefix tells.
        if raw.lstrip().startswith(b"{") and (b'"__metadata__"' in raw or b"layers." in raw):
            raise CodebookError(f"{name}: file is truncated ({size} bytes, header incomplete)")
        raise refuse("not safetensors")
    try:
        header = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise refuse("not safetensors") from None
    if not isinstance(header, dict):
        raise refuse("not safetensors")
    blob = (header.get("__metadata__") or {}).get(METADATA_KEY)
    try:
        meta = json.loads(blob) if isinstance(blob, str) else None
    except json.JSONDecodeError:
        meta = None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT_NAME:
        raise refuse("a safetensors file without codebook metadata")
    version = meta.get("format_version")
    if not isinstance(version, int) or version > FORMAT_VERSION:
        raise CodebookError(
            f"{name}: codebook format version {version} is newer than this app supports "
            f"({FORMAT_VERSION}); update A2ATS Chat"
        )
    try:
        data_end = max(
            (int(v["data_offsets"][1]) for k, v in header.items() if k != "__metadata__"),
            default=0,
        )
    except (KeyError, TypeError, ValueError, IndexError):
        raise CodebookError(f"{name}: file is damaged (bad safetensors header)") from None
    expected = 8 + header_len + data_end
    if size < expected:
        raise CodebookError(f"{name}: file is truncated ({size} of {expected} bytes)")
    _check_metadata_types(name, meta)
    return meta


def _check_metadata_types(name: str, meta: dict[str, Any]) -> None:
    """CodebookError for metadata fields of the wrong type (code reads them as such)."""
    if meta.get("model") is not None and not isinstance(meta["model"], dict):
        raise CodebookError(f"{name}: file is damaged (metadata 'model' is not an object)")
    for key in (*CALIBRATED_SETTINGS, "num_layers", "n_centroids", "sub_dim", "tokens"):
        value = meta.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
            raise CodebookError(f"{name}: file is damaged (metadata {key!r} is not an integer)")
