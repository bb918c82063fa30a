"""File digests: the one sha256 of a file the engine and the app use (codebooks, GGUF files)."""

from __future__ import annotations

import hashlib
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
