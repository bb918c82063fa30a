import mlx.core as mx
import numpy as np
import pytest
from mlx_lm.models.rope_utils import initialize_rope
from tiny import tiny_model

from a2ats_engine.cache.geometry import model_geometry, rope_specs
from a2ats_engine.cache.rope import RopeSpec, distance_buckets

VARIANTS = [
    None,
    {"type": "linear", "factor": 2.0},
    {"rope_type": "llama3", "factor": 8.0, "original_max_position_embeddings": 8192},
    {
        "type": "yarn",
        "factor": 4.0,
        "original_max_position_embeddings": 4096,
        "mscale": 1.0,
        "mscale_all_dim": 0.5,
    },
]


def reference_rope(x: np.ndarray, positions: np.ndarray, inv: np.ndarray, traditional: bool):
    """Textbook RoPE in float64: rotate pairs by position * inv_freq."""
    d2 = inv.shape[0]
    ang = positions[:, None] * inv[None, :]
    cos, sin = np.cos(ang), np.sin(ang)
    out = x.copy()
    if traditional:
        a, b = x[..., 0 : 2 * d2 : 2], x[..., 1 : 2 * d2 : 2]
        out[..., 0 : 2 * d2 : 2] = a * cos - b * sin
        out[..., 1 : 2 * d2 : 2] = a * sin + b * cos
    else:
        a, b = x[..., :d2], x[..., d2 : 2 * d2]
        out[..., :d2] = a * cos - b * sin
        out[..., d2 : 2 * d2] = a * sin + b * cos
    return out


@pytest.mark.parametrize("scaling", VARIANTS)
@pytest.mark.parametrize("traditional", [False, True])
def test_rotate_matches_model_and_unrotate_is_exact(scaling, traditional):
    rope = initialize_rope(64, 10000.0, traditional, scaling, 131072)
    spec = RopeSpec.from_module(rope, 64)
    x = mx.random.normal((1, 3, 20, 64))
    post = rope(x, offset=777)
    assert float(mx.abs(spec.rotate(x, 777) - post).max()) == 0.0
    back = spec.unrotate(post, 777)
    assert float(mx.abs(back - x).max()) < 2e-6  # fp32 rounding level
    # against a float64 textbook implementation at the same positions
    ref = reference_rope(
        np.array(x, dtype=np.float64) * spec.scale if spec.dims == 64 else np.array(x),
        np.arange(777, 797, dtype=np.float64),
        np.array(spec.inv_freqs, dtype=np.float64),
        traditional,
    )
    assert np.abs(np.array(post) - ref).max() < 5e-3  # angle rounding at position ~800


def test_partial_rotary_leaves_tail_untouched():
    rope = initialize_rope(32, 10000.0, False, None, 4096)
    spec = RopeSpec.from_module(rope, 64)
    x = mx.random.normal((1, 2, 5, 64))
    post = rope(x, offset=10)
    assert float(mx.abs(spec.unrotate(post, 10) - x).max()) < 2e-6
    assert float(mx.abs(post[..., 32:] - x[..., 32:]).max()) == 0.0


def test_shift_gives_windowed_rope_query():
    rope = initialize_rope(64, 10000.0, False, None, 8192)
    spec = RopeSpec.from_module(rope, 64)
    q = mx.random.normal((1, 3, 1, 64))
    i, b = 500, 2048
    got = spec.shift(rope(q, offset=i), b - i)
    assert float(mx.abs(got - rope(q, offset=b)).max()) < 2e-4


def test_rotate_at_matches_rotate():
    spec = RopeSpec.from_module(initialize_rope(16, 10000.0, True, None, 4096), 16)
    x = mx.random.normal((2, 3, 7, 16))
    assert float(mx.abs(spec.rotate_at(x, mx.arange(40, 47)) - spec.rotate(x, 40)).max()) < 1e-4


def test_unsupported_variant_is_a_clear_error():
    class WeirdRoPE:
        dims = 16

    with pytest.raises(ValueError, match="unsupported RoPE variant 'WeirdRoPE'"):
        RopeSpec.from_module(WeirdRoPE(), 16)


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_model_introspection(arch):
    model = tiny_model(arch)
    geo = model_geometry(model)
    assert (geo.num_layers, geo.num_heads, geo.num_kv_heads, geo.head_dim) == (
        2,
        4,
        2,
        16,
    )
    specs = rope_specs(model)
    assert len(specs) == 2 and specs[0].dims == 16
    assert RopeSpec.from_dict(specs[0].to_dict()) == specs[0]


def test_distance_buckets_are_log_spaced():
    buckets = distance_buckets(64, 8192, 4)
    assert buckets[0][0] == 64 and buckets[-1][1] == 8192
    widths = [hi / lo for lo, hi, _ in buckets]
    assert max(widths) / min(widths) < 1.1
    for lo, hi, mid in buckets:
        assert lo < mid < hi


@pytest.mark.parametrize("traditional", [False, True])
def test_rotation_matrix_equals_rotation_at_that_position(traditional):
    rope = initialize_rope(32, 10000.0, traditional, None, 8192)
    spec = RopeSpec.from_module(rope, 64)  # partial rotary: the tail passes through
    q = mx.random.normal((2, 5, 64))
    got = q @ spec.rotation_matrix(1500)
    want = rope(q[:, :, None, :], offset=1500)[:, :, 0, :]
    assert float(mx.abs(got - want).max()) < 1e-3
