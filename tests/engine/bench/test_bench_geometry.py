"""`a2ats bench decode --geometry NAME`: real geometries, synthetic caches, calibration timing.

Only tiny sizes run here (the real geometries are checked by their shapes, unevaluated)."""

import json

import mlx.core as mx
import numpy as np
import pytest
from mlx_lm.models.cache import RotatingKVCache, make_prompt_cache
from tiny import made_for

from a2ats_engine.bench.geometries import (
    fill_synthetic,
    geometry_config,
    geometry_model,
    parameter_count,
)
from a2ats_engine.cache.a2ats_cache import A2ATSCache
from a2ats_engine.cache.codebook import Codebook
from a2ats_engine.cache.config import A2ATSConfig
from a2ats_engine.cache.geometry import model_geometry
from a2ats_engine.cache.model_cache import make_cache
from a2ats_engine.cache.model_matrix import tiny_family_model
from a2ats_engine.cli import main


@pytest.mark.parametrize(
    "name, low, high",
    [
        ("qwen3-0.6b", 0.58e9, 0.61e9),
        ("llama-3.2-1b", 1.22e9, 1.25e9),
        ("gemma-3-1b", 0.98e9, 1.01e9),
    ],
)
def test_real_geometries_have_the_real_parameter_counts(name, low, high):
    model = geometry_model(name, materialize=False)  # shapes only: no memory
    assert low <= parameter_count(model) <= high


def test_fill_synthetic_with_the_codebook_spreads_keys_over_its_codes():
    """Keys drawn around the codebook's centroids use most codes (standard-normal keys under a
    trained codebook fall on a few: tied far scores, a top-K timing that real text would not
    give), and the full caches filled with the same codebook hold the same keys."""
    model = tiny_family_model("gemma3_text")
    config = A2ATSConfig(window=4, sinks=2, budget=3)
    geo = model_geometry(model)
    rng = np.random.default_rng(0)
    shape = (geo.num_kv_heads, 1, 16, geo.head_dim)  # centroids far from the origin, like a
    centroids = [mx.array(rng.standard_normal(shape) + 4.0) for _ in range(geo.num_layers)]
    book = made_for(model, Codebook(centroids))  # trained one's: normal keys hit few codes
    normal = make_cache(model, config, book)
    fill_synthetic(model, normal, 200, chunk=64)
    i = next(i for i, c in enumerate(normal) if isinstance(c, A2ATSCache))
    assert max(len(np.unique(h)) for h in np.array(normal[i].codes[0, :, :200, 0])) <= 6
    full, a2ats = make_prompt_cache(model), make_cache(model, config, book)
    fill_synthetic(model, full, 200, chunk=64, codebook=book)
    fill_synthetic(model, a2ats, 200, chunk=64, codebook=book)
    layers = [i for i, c in enumerate(a2ats) if isinstance(c, A2ATSCache)]
    assert layers
    for i in layers:
        codes = np.array(a2ats[i].codes[0, :, :200, 0])
        assert all(len(np.unique(head)) >= 12 for head in codes)  # of 16
        assert mx.array_equal(full[i].keys[..., :200, :], a2ats[i].keys[..., :200, :])
    logits = model(mx.array([[3]]), cache=a2ats)
    assert logits.shape == (1, 1, 128)


def test_unknown_geometry_names_the_known_ones():
    with pytest.raises(ValueError, match="qwen3-0.6b, llama-3.2-1b, gemma-3-1b"):
        geometry_config("gpt-5")


def test_fill_synthetic_reaches_the_context_on_every_kv_layer():
    model = tiny_family_model("gemma3_text")  # sliding (window 8) + global layers
    config = A2ATSConfig(window=4, sinks=2, budget=3)
    geo = model_geometry(model)
    book = made_for(model, Codebook.random(geo.num_layers, geo.num_kv_heads, geo.head_dim, 16))
    for caches in (make_prompt_cache(model), make_cache(model, config, book)):
        fill_synthetic(model, caches, 40, chunk=16)
        for cache in caches:
            assert cache.offset == 40
            if isinstance(cache, RotatingKVCache):
                assert cache.keys.shape[2] <= 8 + 16  # the window stays bounded
        logits = model(mx.array([[3]]), cache=caches)  # decodes from the synthetic state
        assert logits.shape == (1, 1, 128)
    assert any(isinstance(c, A2ATSCache) and c.tokens_retrieved > 0 for c in caches)


# without --codebook the speed bench runs on a random codebook on purpose (speed does not depend
# on its values)
@pytest.mark.filterwarnings("ignore:.*no codebook given, using a RANDOM codebook")
def test_cli_geometry_decode_json(capsys):
    rc = main([
        "bench", "decode", "--geometry", "tiny", "--contexts", "300,600", "--steps", "3",
        "--calibration-tokens", "256", "--repeats", "2", "--json",
    ])  # fmt: skip
    assert rc == 0
    out = json.loads(capsys.readouterr().out)
    assert out["layer_plan"] == "A2ATS on 2 of 2 layers"
    rows = out["results"]
    assert {(r["context"], r["method"]) for r in rows} == {
        (c, m) for c in (300, 600) for m in ("full", "a2ats")
    }
    assert all(r["tokens_per_s"] > 0 and r["bytes_held"] > 0 for r in rows)
    # measured beside computed: the process's private memory over each fill (Linux: RssAnon)
    assert all(isinstance(r["measured_anon_growth"], int) for r in rows)
    assert out["repeats"] == 2 and all(len(r["ratio_runs"]) == 2 for r in rows)
    calib = out["calibration"]
    assert calib["tokens"] == 256 and calib["tokens_per_s"] > 0
    # the k-means fit is timed apart from the forward pass (it is never free)
    assert calib["fit_seconds"] > 0 and calib["collect_seconds"] > 0
    total = calib["collect_seconds"] + calib["fit_seconds"]
    assert abs(calib["tokens_per_s"] - 256 / total) < 0.05 * calib["tokens_per_s"] + 0.2
