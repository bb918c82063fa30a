"""Where the engine keeps user data (models, codebooks) and caches (converted GGUF files).

`A2ATS_DATA_DIR` and `A2ATS_CACHE_DIR` override the platform defaults (tests point them at a
temporary folder); `A2ATS_CROSSOVER_FILE` overrides where the measured crossover table lives.
"""

from __future__ import annotations

import os
from pathlib import Path

APP_NAME = "a2ats-chat"
DEMO_CODEBOOK_NAME = "demo-default.safetensors"


def data_dir() -> Path:
    """Root of the user data folder (`$A2ATS_DATA_DIR` or `platformdirs.user_data_dir`)."""
    override = os.environ.get("A2ATS_DATA_DIR")
    if override:
        return Path(override).expanduser()
    import platformdirs

    return Path(platformdirs.user_data_dir(APP_NAME))


def cache_dir() -> Path:
    """Root of the cache folder (`$A2ATS_CACHE_DIR` or `platformdirs.user_cache_dir`)."""
    override = os.environ.get("A2ATS_CACHE_DIR")
    if override:
        return Path(override).expanduser()
    import platformdirs

    return Path(platformdirs.user_cache_dir(APP_NAME))


def models_dir() -> Path:
    """Folder holding converted models kept for the user (the demo model lives here)."""
    return data_dir() / "models"


def gguf_cache_dir() -> Path:
    """Folder holding GGUF files converted to mlx-lm folders, one subfolder per file hash."""
    return cache_dir() / "gguf"


def codebooks_dir() -> Path:
    """Folder of the user's codebooks (the demo default, those calibrated in the app)."""
    return data_dir() / "codebooks"


def demo_codebook_path() -> Path:
    """Where the demo model's default codebook lives (built by `ensure_demo_codebook`)."""
    return codebooks_dir() / DEMO_CODEBOOK_NAME


def crossover_table_path() -> Path:
    """The user's measured crossover table (`a2ats crossover`, `cache/crossover.py`):
    `$A2ATS_CROSSOVER_FILE`, else `crossover.json` in the data dir."""
    override = os.environ.get("A2ATS_CROSSOVER_FILE")
    if override:
        return Path(override).expanduser()
    return data_dir() / "crossover.json"
