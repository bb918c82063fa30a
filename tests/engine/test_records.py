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


def test_model_geometry_is_a_record_model_info_reads():
    from tiny import tiny_model

    from a2ats_engine.cache.geometry import model_geometry
    from a2ats_engine.records import ModelGeometry, ModelInfo

    geo = model_geometry(tiny_model("qwen2", max_position_embeddings=2048))
    assert geo == ModelGeometry("qwen2", 2, 4, 2, 16, geo.rope, 2048)
    assert geo.rope["dims"] == 16
    info = ModelInfo(name="t", geometry=geo, quantization=None, disk_bytes=3, path="/m")
    assert (info.architecture, info.num_layers, info.num_kv_heads, info.context_length) == (
        "qwen2", 2, 2, 2048,
    )  # fmt: skip
    assert list(info.to_dict()) == [
        "name", "architecture", "num_layers", "num_heads", "num_kv_heads", "head_dim", "rope",
        "context_length", "quantization", "disk_bytes", "path", "recommended_sampling", "layer_plan",
    ]  # fmt: skip


def test_planning_context_defaults_when_the_model_states_none():
    from a2ats_engine.cache.rope import retrieval_distances
    from a2ats_engine.records import DEFAULT_MAX_CONTEXT, planning_context

    assert planning_context(None) == DEFAULT_MAX_CONTEXT and planning_context(4096) == 4096
    assert retrieval_distances(64, 2048, 4, None) == retrieval_distances(
        64, 2048, 4, DEFAULT_MAX_CONTEXT
    )
