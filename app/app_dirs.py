"""Where the app keeps its files: settings (config dir) and history/codebooks (data dir).

`A2ATS_CONFIG_DIR` and `A2ATS_DATA_DIR` override the platform folders, so tests and scripted
runs can use temporary directories without touching the user's real settings.
"""

from __future__ import annotations

import os
import tempfile
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


def atomic_write_text(path: Path, text: str) -> None:
    """Write `text` to `path` so that a crash leaves either the old or the new file, never half.

    Writes a temporary file in the same folder, fsyncs it, then `os.replace`s it over `path`.
    """
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
