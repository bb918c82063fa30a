"""Where the app keeps its files: settings (config dir) and history/codebooks (data dir).

`A2ATS_CONFIG_DIR` and `A2ATS_DATA_DIR` override the platform folders, so tests and scripted
runs can use temporary directories without touching the user's real settings.
"""

from __future__ import annotations

import os
import re
import sys
import tempfile
import time
from pathlib import Path

import platformdirs

APP_NAME = "a2ats-chat"


def config_dir() -> Path:
    """Folder of settings.json (`A2ATS_CONFIG_DIR` or the platform's user config dir)."""
    override = os.environ.get("A2ATS_CONFIG_DIR")
    return Path(override) if override else Path(platformdirs.user_config_dir(APP_NAME))


def data_dir() -> Path:
    """Folder of conversations and codebooks (`A2ATS_DATA_DIR` or the user data dir)."""
    override = os.environ.get("A2ATS_DATA_DIR")
    return Path(override) if override else Path(platformdirs.user_data_dir(APP_NAME))


def conversations_dir() -> Path:
    return data_dir() / "conversations"


def codebooks_dir() -> Path:
    return data_dir() / "codebooks"


TEMP_SUFFIX = ".tmp"
# `.<file name>.<mkstemp's 8 random characters>.tmp`: what atomic_write_text leaves behind if it
# is killed between creating the temporary file and renaming it.
_TEMP_NAME = re.compile(r"\..+\.[a-z0-9_]{8}\.tmp")
STALE_TEMP_AGE_S = 60.0


def atomic_write_text(path: Path, text: str) -> None:
    """Write `text` to `path` so that a crash leaves either the old or the new file, never half.

    Writes a temporary file in the same folder, flushes it to the disk (`F_FULLFSYNC` on macOS,
    where `fsync` only reaches the drive's cache), `os.replace`s it over `path`, then syncs the
    folder so the rename itself survives a power loss. A kill between the first and the last
    step leaves a temporary file, which `remove_stale_temp_files` deletes at the next start.
    """
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


def remove_stale_temp_files(folder: Path, older_than_s: float = STALE_TEMP_AGE_S) -> list[Path]:
    """Delete temporary files `atomic_write_text` left in `folder` (a killed write). Only files
    older than `older_than_s` go, so a write in progress in another instance is left alone.
    Returns what was removed."""
    removed: list[Path] = []
    try:
        candidates = [p for p in folder.iterdir() if _TEMP_NAME.fullmatch(p.name)]
    except OSError:
        return removed
    now = time.time()
    for path in candidates:
        try:
            if path.is_file() and now - path.stat().st_mtime >= older_than_s:
                path.unlink()
                removed.append(path)
        except OSError:
            continue
    return removed
