"""File helpers: the one sha256 of a file the engine and the app use (codebooks, GGUF files),
and the atomic text write the engine (the crossover table) and the app (settings, chats) share."""

from __future__ import annotations

import hashlib
import os
import sys
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


TEMP_SUFFIX = ".tmp"


def atomic_write_text(path: str | Path, text: str) -> None:
    """Write `text` to `path` so that a crash leaves either the old or the new file, never half.

    Writes a temporary file in the same folder, flushes it to the disk (`F_FULLFSYNC` on macOS,
    where `fsync` only reaches the drive's cache), `os.replace`s it over `path`, then syncs the
    folder so the rename itself survives a power loss. A kill between the first and the last
    step leaves a temporary file, which `remove_stale_temp_files` deletes at the next start.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=TEMP_SUFFIX, dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            full_fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    sync_folder(path.parent)


def full_fsync(fd: int) -> None:
    """Flush an open file to the disk: `F_FULLFSYNC` where the platform has it (macOS), since
    plain `fsync` there stops at the drive's volatile cache; `os.fsync` elsewhere."""
    if sys.platform == "darwin":
        import fcntl

        full = getattr(fcntl, "F_FULLFSYNC", None)
        if full is not None:
            try:
                fcntl.fcntl(fd, full)
                return
            except OSError:
                pass  # some file systems (network, FAT) refuse it: fall back to fsync
    os.fsync(fd)


def sync_folder(folder: Path) -> None:
    """Make a rename inside `folder` durable (fsync of the folder itself; no-op on Windows,
    which cannot open a folder and journals renames anyway)."""
    if os.name == "nt":
        return
    fd = os.open(folder, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        full_fsync(fd)
    except OSError:
        pass  # a file system that cannot sync folders: the file itself is already on disk
    finally:
        os.close(fd)
