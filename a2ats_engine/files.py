"""File helpers: the one sha256 of a file the engine and the app use (codebooks, GGUF files),
and an atomic text write for the engine's own small files (the crossover table)."""

from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path

from .progress import Progress


def sha256_file(path: str | Path, progress: Progress | None = None, chunk: int = 1 << 22) -> str:
    """Hex sha256 of a file read in `chunk`-byte blocks, reporting
    `progress("hash", done_bytes, total_bytes)` after each block when given."""
    path = Path(path)
    total = path.stat().st_size
    digest = hashlib.sha256()
    done = 0
    with open(path, "rb") as f:
        while block := f.read(chunk):
            digest.update(block)
            done += len(block)
            if progress is not None:
                progress("hash", done, total)
    return digest.hexdigest()


def atomic_write_text(path: str | Path, text: str) -> None:
    """Write `text` (UTF-8) to `path` so that a crash leaves the old file or the new one, never
    half of it: a temporary file in the same folder, flushed and fsynced, renamed over `path`."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
