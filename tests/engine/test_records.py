"""The shared records are MLX-free: the GUI thread can build and validate them."""

from __future__ import annotations

import subprocess
import sys

import pytest

from a2ats_engine.records import SamplingSettings


def test_records_and_config_import_without_mlx():
    code = (
        "import sys, a2ats_engine\n"
        "from a2ats_engine.records import ModelInfo, SamplingSettings\n"
        "from a2ats_engine.cache.config import A2ATSConfig\n"
        "SamplingSettings(top_p=0.9); A2ATSConfig()\n"
        "loaded = sorted(m for m in sys.modules if m == 'mlx' or m.startswith('mlx.'))\n"
        "assert not loaded, loaded\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.parametrize(
    ("field", "value"), [("top_p", 0.0), ("min_p", 1.0), ("temperature", -1.0), ("top_k", -1)]
)
def test_sampling_settings_refuse_out_of_range_values(field, value):
    with pytest.raises(ValueError, match=f"SamplingSettings.{field}="):
        SamplingSettings(**{field: value})
