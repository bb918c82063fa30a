"""Where the app keeps its files: settings (config dir) and history/codebooks (data dir).

`A2ATS_CONFIG_DIR` and `A2ATS_DATA_DIR` override the platform folders, so tests and scripted
runs can use temporary directories without touching the user's real settings.
"""

from __future__ import annotations

import os
import re
import time
from pathlib import Path

import platformdirs

from a2ats_engine.files import TEMP_SUFFIX, atomic_write_text, full_fsync, sync_folder

__all__ = [
    "TEMP_SUFFIX",
    "atomic_write_text",
    "full_fsync",
    "sync_folder",
]  # shared with the engine

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


# `.<file name>.<mkstemp's 8 random characters>.tmp`: what atomic_write_text leaves behind if it
# is killed between creating the temporary file and renaming it.
_TEMP_NAME = re.compile(r"\..+\.[a-z0-9_]{8}\.tmp")
STALE_TEMP_AGE_S = 60.0


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
