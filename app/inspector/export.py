"""Telemetry export: kept snapshots to JSON and back, losslessly. Qt-free.

File layout (``format`` = "a2ats-telemetry", ``version`` = 1)::

    {"format": "a2ats-telemetry", "version": 1, "created": ISO time, "meta": {...},
     "steps": [
       {"step": 12, "offset": 2048, "token_id": 42, "reply": 0,
        "bytes_held": ..., "bytes_fp16": ..., "native_bytes": ...,   # native: non-A2ATS layers
        "codebook_bytes": ...,                                        # once per model
        "layers": [
          {"layer": 0, "offset": 2048, "window_start": 1985, "sinks": 8, "exact": false,
           "bytes_held": ..., "bytes_fp16": ...,
           "selected": [[[0, 8], [211, 212], ..., [1985, 2048]], ...],   # per KV head: runs
           "retrieved": [[211, 530, ...], ...],                           # per KV head
           "recall": [0.93, 0.88, 0.91] | null,
           "code_counts": [{"n": 4096, "codes": [...], "counts": [...]}, ...]}]}]}

``selected`` lists each KV head's attended positions as half-open runs ``[start, stop)``
(sinks and the window are one run each); ``retrieved`` repeats the far ones as plain positions
for convenience. ``code_counts`` are sparse histograms (only used codes). With
``histograms="delta"`` every step after a layer's first carries ``code_counts_delta`` instead: the
sparse change against the previous exported step of the same layer (a decode step adds one token,
so the file stays small). A file name ending in ``.gz`` is gzip-compressed.
"""

from __future__ import annotations

import gzip
import json
import os
import tempfile
from collections.abc import Iterable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

from a2ats_engine.cache.telemetry import CacheSnapshot, LayerStats
from a2ats_engine.errors import A2ATSError

FORMAT = "a2ats-telemetry"
VERSION = 1


class TelemetryFileError(A2ATSError):
    """A telemetry file that is not ours, truncated or inconsistent (one-line message)."""


# ---- encoding -------------------------------------------------------------------------------
def positions_to_runs(positions: np.ndarray) -> list[list[int]]:
    """Sorted unique positions int [n] -> half-open runs [[start, stop), ...]."""
    pos = np.asarray(positions, dtype=np.int64)
    if pos.size == 0:
        return []
    breaks = np.flatnonzero(np.diff(pos) != 1) + 1
    starts = np.concatenate([[0], breaks])
    stops = np.concatenate([breaks, [pos.size]])
    return [[int(pos[a]), int(pos[b - 1]) + 1] for a, b in zip(starts, stops, strict=True)]


def runs_to_positions(runs: list[list[int]]) -> np.ndarray:
    """Half-open runs -> int32 [n] positions."""
    if not runs:
        return np.zeros(0, dtype=np.int32)
    return np.concatenate([np.arange(a, b, dtype=np.int32) for a, b in runs])


def sparse_counts(counts: np.ndarray) -> dict[str, Any]:
    """Histogram int [n] -> {"n", "codes", "counts"} holding only the non-zero entries."""
    counts = np.asarray(counts)
    codes = np.flatnonzero(counts)
    return {"n": int(counts.size), "codes": codes.tolist(), "counts": counts[codes].tolist()}


def dense_counts(sparse: dict[str, Any]) -> np.ndarray:
    out = np.zeros(int(sparse["n"]), dtype=np.int64)
    out[np.asarray(sparse["codes"], dtype=np.int64)] = np.asarray(sparse["counts"], dtype=np.int64)
    return out


def _layer_dict(layer: LayerStats, previous: LayerStats | None, histograms: str) -> dict[str, Any]:
    out: dict[str, Any] = {
        "layer": int(layer.layer),
        "step": int(layer.step),
        "offset": int(layer.offset),
        "window_start": int(layer.window_start),
        "sinks": int(layer.sinks),
        "exact": bool(layer.exact),
        "bytes_held": int(layer.bytes_held),
        "bytes_fp16": int(layer.bytes_fp16),
        "selected": [positions_to_runs(s) for s in layer.selected],
        "retrieved": [np.asarray(r).tolist() for r in layer.retrieved],
        "recall": None if layer.recall is None else [float(r) for r in layer.recall],
        "recall_ms": None if layer.recall_ms is None else float(layer.recall_ms),
        "exact_until": int(layer.exact_until),
        "missed_mass": None if layer.missed_mass is None else [float(m) for m in layer.missed_mass],
        "budget_used": None
        if layer.budget_used is None
        else [np.asarray(b).astype(int).tolist() for b in layer.budget_used],
        "reused": bool(layer.reused),
        "bytes_on_disk": int(layer.bytes_on_disk),
        "would_retrieve": None
        if layer.would_retrieve is None
        else [np.asarray(w).astype(int).tolist() for w in layer.would_retrieve],
    }
    same_shape = previous is not None and [c.size for c in previous.code_counts] == [
        c.size for c in layer.code_counts
    ]
    if histograms == "delta" and same_shape:
        out["code_counts_delta"] = [
            sparse_counts(np.asarray(c, np.int64) - np.asarray(p, np.int64))
            for c, p in zip(layer.code_counts, previous.code_counts, strict=True)
        ]
    else:
        out["code_counts"] = [sparse_counts(c) for c in layer.code_counts]
    return out


def telemetry_dict(
    snapshots: Iterable[CacheSnapshot],
    *,
    replies: Iterable[int] | None = None,
    meta: dict[str, Any] | None = None,
    histograms: str = "delta",
) -> dict[str, Any]:
    """Build the JSON-ready document of a run of snapshots (oldest first).

    histograms: "delta" (sparse change per step after a layer's first) or "full".
    Snapshots may be the engine's own (new codes on most steps): they are accumulated first.
    """
    from .snapshot_ring import with_histograms

    if histograms not in ("delta", "full"):
        raise ValueError(f"histograms={histograms!r} is out of range: must be 'delta' or 'full'")
    snapshots = with_histograms(snapshots)
    reply_ids = list(replies) if replies is not None else [0] * len(snapshots)
    if len(reply_ids) != len(snapshots):
        raise ValueError(f"replies has {len(reply_ids)} entries, snapshots has {len(snapshots)}")
    previous: dict[int, LayerStats] = {}
    steps = []
    for snap, reply in zip(snapshots, reply_ids, strict=True):
        layers = []
        for row, layer in enumerate(snap.layers):
            layers.append(_layer_dict(layer, previous.get(row), histograms))
            previous[row] = layer
        steps.append(
            {
                "step": int(snap.step),
                "offset": int(snap.offset),
                "token_id": None if snap.token_id is None else int(snap.token_id),
                "reply": int(reply),
                "bytes_held": int(snap.bytes_held),
                "bytes_fp16": int(snap.bytes_fp16),
                "native_bytes": int(snap.native_bytes),
                "codebook_bytes": int(snap.codebook_bytes),
                "process_bytes": None if snap.process_bytes is None else int(snap.process_bytes),
                "layers": layers,
            }
        )
    return {
        "format": FORMAT,
        "version": VERSION,
        "created": datetime.now(UTC).isoformat(timespec="seconds"),
        "meta": dict(meta or {}),
        "steps": steps,
    }


def export_telemetry(
    path: str | os.PathLike,
    snapshots: Iterable[CacheSnapshot],
    *,
    replies: Iterable[int] | None = None,
    meta: dict[str, Any] | None = None,
    histograms: str = "delta",
) -> Path:
    """Write snapshots as telemetry JSON (gzip when the name ends in .gz), atomically.

    Returns the written path.
    """
    path = Path(path)
    doc = telemetry_dict(snapshots, replies=replies, meta=meta, histograms=histograms)
    text = json.dumps(doc, separators=(",", ":"))
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=path.name + ".", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as raw:
            if path.suffix == ".gz":
                with gzip.GzipFile(fileobj=raw, mode="wb") as gz:
                    gz.write(text.encode())
            else:
                raw.write(text.encode())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


# ---- decoding -------------------------------------------------------------------------------
def _layer_from_dict(d: dict[str, Any], previous: LayerStats | None) -> LayerStats:
    if "code_counts" in d:
        counts = tuple(dense_counts(c) for c in d["code_counts"])
    else:
        if previous is None:
            raise TelemetryFileError(
                f"layer {d.get('layer')} step {d.get('step')}: histogram delta without a base step"
            )
        counts = tuple(
            p + dense_counts(c)
            for p, c in zip(previous.code_counts, d["code_counts_delta"], strict=True)
        )
    recall, missed, budget = d.get("recall"), d.get("missed_mass"), d.get("budget_used")
    recall_ms, would = d.get("recall_ms"), d.get("would_retrieve")
    return LayerStats(
        step=int(d["step"]),
        offset=int(d["offset"]),
        window_start=int(d["window_start"]),
        sinks=int(d["sinks"]),
        selected=tuple(runs_to_positions(runs) for runs in d["selected"]),
        code_counts=counts,
        bytes_held=int(d["bytes_held"]),
        bytes_fp16=int(d["bytes_fp16"]),
        exact=bool(d["exact"]),
        layer=int(d["layer"]),
        recall=None if recall is None else tuple(float(r) for r in recall),
        # fields added after version 1 files were first written: absent = not recorded
        recall_ms=None if recall_ms is None else float(recall_ms),
        exact_until=int(d.get("exact_until", 0)),
        missed_mass=None if missed is None else tuple(float(m) for m in missed),
        budget_used=None
        if budget is None
        else tuple(np.asarray(b, dtype=np.int32).reshape(-1) for b in budget),
        reused=bool(d.get("reused", False)),
        bytes_on_disk=int(d.get("bytes_on_disk", 0)),
        would_retrieve=None
        if would is None
        else tuple(np.asarray(w, dtype=np.int32).reshape(-1) for w in would),
    )


def _optional_int(value: Any) -> int | None:
    return None if value is None else int(value)


def snapshots_from_dict(doc: dict[str, Any]) -> tuple[list[CacheSnapshot], list[int]]:
    """Rebuild (snapshots, reply numbers) from a telemetry document."""
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise TelemetryFileError("not an A2ATS telemetry file (missing format tag)")
    if doc.get("version") != VERSION:
        raise TelemetryFileError(f"telemetry version {doc.get('version')!r} is not supported")
    previous: dict[int, LayerStats] = {}
    snapshots, replies = [], []
    try:
        for step in doc["steps"]:
            layers = []
            for row, d in enumerate(step["layers"]):
                layer = _layer_from_dict(d, previous.get(row))
                previous[row] = layer
                layers.append(layer)
            token = step.get("token_id")
            snapshots.append(
                CacheSnapshot(
                    int(step["step"]),
                    tuple(layers),
                    None if token is None else int(token),
                    int(step.get("native_bytes", 0)),
                    int(step.get("codebook_bytes", 0)),
                    _optional_int(step.get("process_bytes")),
                )
            )
            replies.append(int(step.get("reply", 0)))
    except (KeyError, TypeError, ValueError) as exc:
        raise TelemetryFileError(f"telemetry file is inconsistent: {exc!r}") from None
    return snapshots, replies


def load_telemetry(path: str | os.PathLike) -> tuple[list[CacheSnapshot], list[int]]:
    """Read a telemetry file written by `export_telemetry`: (snapshots, reply numbers)."""
    path = Path(path)
    try:
        raw = path.read_bytes()
        if raw[:2] == b"\x1f\x8b":
            raw = gzip.decompress(raw)
        doc = json.loads(raw)
    except (OSError, EOFError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise TelemetryFileError(f"cannot read telemetry file {path}: {exc}") from None
    return snapshots_from_dict(doc)
