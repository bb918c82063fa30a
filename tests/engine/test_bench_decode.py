"""`a2ats bench decode` runs on a tiny model in seconds and emits one valid JSON object."""

import json

from tiny import save_tiny_model

from a2ats_engine.cli import main


def test_bench_decode_json(tmp_path, capsys):
    folder = save_tiny_model(tmp_path / "m", "llama", hidden_size=256)  # head_dim 64
    rc = main(
        [
            "bench",
            "decode",
            "--model",
            str(folder),
            "--contexts",
            "300,600",
            "--steps",
            "4",
            "--methods",
            "full,a2ats,a2ats_kv4,kv4",
            "--telemetry",
            "--repeats",
            "1",
            "--json",
        ]
    )
    assert rc == 0
    out = json.loads(capsys.readouterr().out)
    rows = out["results"]
    assert {(r["context"], r["method"]) for r in rows} == {
        (c, m) for c in (300, 600) for m in ("full", "a2ats", "a2ats_kv4", "kv4", "a2ats_telemetry")
    }
    for r in rows:
        assert r["tokens_per_s"] > 0
        if r["method"] == "full":
            assert r["speed_vs_full"] == 1.0
    kv4 = next(r for r in rows if r["method"] == "a2ats_kv4" and r["context"] == 600)
    full = next(r for r in rows if r["method"] == "a2ats" and r["context"] == 600)
    assert kv4["bytes_per_token"] < full["bytes_per_token"] / 3
    assert kv4["retrieved_per_step"] > 0


def test_decode_method_names_set_kv_bits_rerank_and_telemetry():
    import mlx.core as mx
    import pytest
    from mlx_lm.models.cache import make_prompt_cache
    from tiny import tiny_model

    from a2ats_engine.bench.speed import _method_cache
    from a2ats_engine.cache.config import A2ATSConfig

    model = tiny_model("llama", hidden_size=256)
    base = make_prompt_cache(model)
    model(mx.array([list(range(3, 100))]), cache=base)
    config = A2ATSConfig(rerank=1)
    cfg = _method_cache(model, base, "a2ats_kv4_rr3", config, None)[0].config
    assert (cfg.kv_bits, cfg.rerank, cfg.telemetry) == (4, 3, False)
    cfg = _method_cache(model, base, "a2ats_rr2_telemetry", config, None)[0].config
    assert (cfg.kv_bits, cfg.rerank, cfg.telemetry) == (None, 2, True)
    assert _method_cache(model, base, "a2ats", config, None)[0].config == config
    with pytest.raises(ValueError, match="unknown method 'a2ats_rr'"):
        _method_cache(model, base, "a2ats_rr", config, None)


def test_median_results_take_ratios_within_each_run():
    from a2ats_engine.bench.speed import DecodeResult
    from a2ats_engine.commands.bench import median_results

    def run(full: float, a2ats: float) -> list:
        return [DecodeResult("full", 8, full, 1, 1.0), DecodeResult("a2ats", 8, a2ats, 1, 1.0)]

    # a noisy machine: run 2 is slow for both methods, run 3 fast for both
    merged = median_results([run(10.0, 15.0), run(4.0, 8.0), run(20.0, 22.0)])
    a2ats = next(r for r in merged if r.method == "a2ats")
    assert a2ats.tokens_per_s == 15.0
    assert a2ats.extra["ratio_runs"] == [1.5, 2.0, 1.1]
    assert a2ats.extra["ratio_median"] == 1.5 and a2ats.extra["ratio_spread"] == [1.1, 2.0]
