"""`a2ats bench decode` runs on a tiny model in seconds and emits one valid JSON object."""

import json
import shlex

import pytest
from tiny import save_tiny_model

from a2ats_engine.cache import graph_step, native_step
from a2ats_engine.cli import main

# the speed benchmarks run on random codebooks on purpose (`a2ats bench` without --codebook, and
# `Codebook.random` here): time and bytes do not depend on the codebook's values
pytestmark = [
    pytest.mark.filterwarnings("ignore:.*no codebook given, using a RANDOM codebook"),
    pytest.mark.filterwarnings("ignore:codebook records no model fingerprint"),
]


def test_bench_decode_json(tmp_path, capsys):
    folder = save_tiny_model(tmp_path / "m", "llama", hidden_size=256)  # head_dim 64
    argv = ["bench", "decode", "--model", str(folder), "--contexts", "300,600", "--steps", "4",
            "--methods", "full,a2ats,a2ats_kv4,kv4", "--telemetry", "--repeats", "1", "--json"]  # fmt: skip
    rc = main(argv)
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
    cfg = _method_cache(model, base, "a2ats_rr4g_cov90_eb0", config, None)[0].config
    assert (cfg.rerank, cfg.rerank_shared, cfg.coverage, cfg.exact_below) == (4, True, 0.9, 0)
    with pytest.raises(ValueError, match="unknown method 'a2ats_rr'"):
        _method_cache(model, base, "a2ats_rr", config, None)
    for suffix, attribute in (("_npstep", "numpy_step"), ("_sync", "synced_step")):
        caches = _method_cache(model, base, f"a2ats_eb0{suffix}", config, None)
        assert caches[0].config.exact_below == 0 and getattr(caches[0], attribute) is True


def test_bench_decode_names_the_host_step_each_method_ran(tmp_path, capsys):
    """`_sync` times the synced C++ step beside the graph step in one run, `_npstep` the NumPy
    one: each row names the step it ran; the two C++ steps retrieve the same tokens (the NumPy
    step's ties at the cut may fall elsewhere)."""
    folder = save_tiny_model(tmp_path / "m", "llama", hidden_size=256)
    argv = ["bench", "decode", "--model", str(folder), "--contexts", "300", "--steps", "4",
            "--methods", "full,a2ats_eb0,a2ats_eb0_sync,a2ats_eb0_npstep", "--repeats", "1",
            "--json"]  # fmt: skip
    assert main(argv) == 0
    rows = {r["method"]: r for r in json.loads(capsys.readouterr().out)["results"]}
    assert "graph_step.cpp" in rows["a2ats_eb0"]["host_step"]
    assert rows["a2ats_eb0_sync"]["host_step"] == "C++ (native_step.cpp), one sync a layer"
    assert rows["a2ats_eb0_npstep"]["host_step"] == "NumPy"
    retrieved = rows["a2ats_eb0"]["retrieved_per_step"]
    assert retrieved == rows["a2ats_eb0_sync"]["retrieved_per_step"] and retrieved > 0
    assert rows["a2ats_eb0_npstep"]["retrieved_per_step"] > 0


def test_median_results_take_ratios_within_each_run():
    from a2ats_engine.bench.speed import DecodeResult
    from a2ats_engine.commands.bench.decode import median_results

    def run(full: float, a2ats: float) -> list:
        return [DecodeResult("full", 8, full, 1, 1.0), DecodeResult("a2ats", 8, a2ats, 1, 1.0)]

    # a noisy machine: run 2 is slow for both methods, run 3 fast for both
    merged = median_results([run(10.0, 15.0), run(4.0, 8.0), run(20.0, 22.0)])
    a2ats = next(r for r in merged if r.method == "a2ats")
    assert a2ats.tokens_per_s == 15.0
    assert a2ats.extra["ratio_runs"] == [1.5, 2.0, 1.1]
    assert a2ats.extra["ratio_median"] == 1.5 and a2ats.extra["ratio_spread"] == [1.1, 2.0]


def test_decode_and_memory_benches_keep_the_models_own_caches_on_native_layers():
    """A sliding-window model (tiny Gemma 3: layers 0 and 2 slide over 8 tokens): `full` decodes
    with the model's own caches (RotatingKVCache on sliding layers, not a KVCache everywhere),
    A2ATS follows the layer plan, and each method's copy is
    independent of the prefilled caches it came from."""
    import mlx.core as mx
    from mlx_lm.models.cache import KVCache, RotatingKVCache, make_prompt_cache

    from a2ats_engine.bench import speed
    from a2ats_engine.cache.a2ats_cache import A2ATSCache
    from a2ats_engine.cache.codebook import Codebook
    from a2ats_engine.cache.config import A2ATSConfig
    from a2ats_engine.cache.geometry import model_geometry
    from a2ats_engine.cache.model_matrix import tiny_family_model

    model = tiny_family_model("gemma3_text")
    geo = model_geometry(model)
    book = Codebook.random(geo.num_layers, geo.num_kv_heads, geo.head_dim, 16, seed=0)
    config = A2ATSConfig(window=4, sinks=1, budget=4, exact_below=0)
    base = make_prompt_cache(model)
    mx.eval(model(mx.array([list(range(1, 41))]), cache=base))
    kinds = [type(c) for c in base]
    assert kinds == [RotatingKVCache, KVCache, RotatingKVCache, KVCache]
    full = speed._method_cache(model, base, "full", config, book)
    a2ats = speed._method_cache(model, base, "a2ats", config, book)
    assert [type(c) for c in full] == kinds
    assert [type(c) for c in a2ats] == [RotatingKVCache, A2ATSCache, RotatingKVCache, A2ATSCache]
    before = [mx.array(c.keys) for c in base]
    for caches in (full, a2ats):  # decoding a copy leaves the prefilled caches as they were
        logits = model(mx.array([[5]]), cache=caches)
        mx.eval(logits)
    assert all(c.offset == 40 for c in base)
    assert all(bool(mx.array_equal(b, c.keys)) for b, c in zip(before, base, strict=True))
    # the copy decodes like the original: the same next-token logits as decoding `base` itself
    ref = model(mx.array([[5]]), cache=speed._method_cache(model, base, "full", config, book))
    again = model(mx.array([[5]]), cache=base)
    assert float(mx.abs(ref - again).max()) == 0.0
    held = {r.method: r for r in speed.bench_memory(model, [64], methods=("full", "a2ats"),
                                                    config=config, codebook=book)}  # fmt: skip
    plain = KVCache()  # what one layer holds as a plain KVCache after the same 64 tokens
    kv = mx.zeros((1, geo.num_kv_heads, 64, geo.head_dim))
    plain.update_and_fetch(kv, kv)
    # the two sliding layers hold at most their window, not all 64 tokens as a KVCache would
    assert held["full"].bytes_held < len(base) * plain.nbytes
    assert held["full"].bytes_held > 2 * plain.nbytes  # the two global layers hold everything


def test_window_decode_method_attends_sinks_and_the_recent_window_plus_k():
    """`window` (the speed ceiling): sinks + the last window + K tokens, positions continuing
    from the context, and its next token is exact attention over just those positions."""
    import mlx.core as mx
    from mlx_lm.models.cache import KVCache, make_prompt_cache

    from a2ats_engine.bench import speed
    from a2ats_engine.cache.config import A2ATSConfig
    from a2ats_engine.loading.tiny_model import tiny_model

    model = tiny_model("llama")
    config = A2ATSConfig(window=8, sinks=2, budget=6)
    prompt = mx.array([list(range(3, 103))])  # 100 tokens
    base = make_prompt_cache(model)
    mx.eval(model(prompt, cache=base))
    window = speed._method_cache(model, base, "window", config, None)
    for w in window:
        assert w.offset == 100 and w.keys.shape[2] == 2 + 8 + 6
    got = model(mx.array([[7]]), cache=window)

    # independent reference: a plain cache holding exactly those positions' keys and values
    class Held(KVCache):  # holds given rows; RoPE position continues from 100
        def __init__(self, keys, values):
            super().__init__()
            self.keys, self.values, self.offset = keys, values, 100

        def update_and_fetch(self, keys, values):
            self.keys = mx.concatenate([self.keys, keys], axis=2)
            self.values = mx.concatenate([self.values, values], axis=2)
            self.offset += keys.shape[2]
            return self.keys, self.values

    idx = mx.array([*range(2), *range(100 - 13, 100)])  # with the new token: 16 rows
    ref_caches = [Held(src.keys[..., idx, :], src.values[..., idx, :]) for src in base]
    ref = model(mx.array([[7]]), cache=ref_caches)
    assert float(mx.abs(got - ref).max()) < 1e-4


def test_bench_prefill_times_both_methods_and_checks_the_first_token(tmp_path, capsys):
    """`a2ats bench prefill`: a row per (context, method), A2ATS with its ratio to full; the
    run itself checks that both prefills give the same first token (exact prefill)."""
    folder = save_tiny_model(tmp_path / "m", "llama", hidden_size=256)
    argv = ["bench", "prefill", "--model", str(folder / "a b"), "--contexts", "100,300",
            "--repeats", "2", "--json"]  # fmt: skip
    (folder / "a b").symlink_to(folder, target_is_directory=True)  # a path that needs quoting
    rc = main(argv)
    assert rc == 0
    out = json.loads(capsys.readouterr().out)
    rows = out["results"]
    assert [(r["context"], r["method"]) for r in rows] == [
        (100, "full"), (100, "a2ats"), (300, "full"), (300, "a2ats")
    ]  # fmt: skip
    for r in rows:
        assert len(r["seconds_runs"]) == 2 and r["seconds"] > 0
    a2ats = rows[1]
    lo, hi = a2ats["ratio_spread"]
    assert lo <= a2ats["ratio_median"] <= hi
    # the command as given to `main`, quoted so it runs again (not the test runner's sys.argv)
    assert out["command"] == "a2ats " + shlex.join(argv)
    assert main(["bench", "prefill", "--model", str(folder), "--contexts", "1"]) != 0
    assert "--contexts: 1 is out of range: must be in [2, " in capsys.readouterr().err


def test_bench_prefill_times_the_cold_tier_reading_the_past_back(tmp_path, capsys, monkeypatch):
    """`--methods full,a2ats_cold`: every chunk's exact attention reads the past from the cold
    tier's file; the first token must still be full's (checked inside the run)."""
    monkeypatch.setenv("A2ATS_CACHE_DIR", str(tmp_path / "cache"))
    folder = save_tiny_model(tmp_path / "m", "llama", hidden_size=256)
    rc = main(["bench", "prefill", "--model", str(folder), "--contexts", "300", "--repeats",
               "1", "--methods", "full,a2ats,a2ats_cold", "--json"])  # fmt: skip
    assert rc == 0
    rows = json.loads(capsys.readouterr().out)["results"]
    assert [r["method"] for r in rows] == ["full", "a2ats", "a2ats_cold"]
    assert rows[2]["ratio_median"] > 0
    assert main(["bench", "prefill", "--model", str(folder), "--methods", "a2ats"]) != 0
    assert "full plus any of" in capsys.readouterr().err


def test_time_to_first_token_evaluates_the_a2ats_codes():
    """The prefill timing includes coding every key: after it the A2ATS caches hold evaluated
    codes for every prompt token (nothing left lazy for the first decode step to pay)."""
    import mlx.core as mx

    from a2ats_engine.bench.speed import time_to_first_token
    from a2ats_engine.cache.codebook import Codebook
    from a2ats_engine.cache.geometry import model_geometry
    from a2ats_engine.cache.model_cache import make_cache
    from a2ats_engine.loading.tiny_model import tiny_model

    model = tiny_model("llama")
    geo = model_geometry(model)
    book = Codebook.random(geo.num_layers, geo.num_kv_heads, geo.head_dim, 16, seed=0)
    caches = make_cache(model, None, book)
    seconds, token = time_to_first_token(model, caches, list(range(3, 53)), chunk=16)
    assert seconds > 0 and isinstance(token, int)
    assert all(c.offset == 50 for c in caches)
    codes = caches[0].codes[..., :50, :]
    assert codes.shape[-2] == 50 and mx.all(codes < 16).item()


def test_bench_decode_profile_times_every_phase_with_the_thread_settings(tmp_path, capsys):
    """`--profile`: a row per context with the KVCache and A2ATS step times, exact attention per
    layer and the retrieval phases (retrieval forced even at a short context)."""
    folder = save_tiny_model(tmp_path / "m", "llama", hidden_size=256)
    argv = ["bench", "decode", "--model", str(folder), "--contexts", "300", "--steps", "3",
            "--profile", "--json"]  # fmt: skip
    assert main(argv) == 0
    out = json.loads(capsys.readouterr().out)
    assert "blas_threads" in out["threads"] and out["threads"]["cpus"] >= 1
    row = out["results"][0]
    assert row["retrieved_steps"] >= 6  # uninstrumented and instrumented steps both retrieved
    phases = row["phases_ms_per_step"]
    assert "graph step" in phases and "graph_step.cpp" in out["threads"]["host_step"]
    assert "native step" not in phases  # no sync: no phase of the synced step
    with native_step.forced("native"):  # the synced step: its one call a phase
        assert main(argv) == 0
    phases = json.loads(capsys.readouterr().out)["results"][0]["phases_ms_per_step"]
    assert "native step" in phases and "graph step" not in phases
    assert all(ms >= 0 for ms in phases.values()) and row["exact_attention_ms_per_layer"] > 0
    assert (
        set(row["phase_layers"])
        == set(row["phases_ms_per_layer"])
        == set(row["phases_ms_per_step"])
    )
    assert row["phase_layers"]["graph step"] == row["a2ats_layers"]
    assert row["kvcache_step_ms"] > 0 and row["a2ats_step_ms"] > 0
    with native_step.forced("numpy"):  # the NumPy step's phases, one by one
        assert main(argv) == 0
    out = json.loads(capsys.readouterr().out)
    phases = out["results"][0]["phases_ms_per_step"]
    assert {"code scores", "top-K + rerank", "union", "gather K/V", "attention"} <= set(phases)
    assert "native step" not in phases and out["threads"]["host_step"] == "NumPy"


def test_a_phase_some_layers_skip_is_timed_per_layer_that_ran_it():
    from a2ats_engine.bench.profile import phase_times
    from a2ats_engine.cache.retrieval import PhaseClock

    clock = PhaseClock()
    for layer in range(30):
        clock.seconds[(layer, "graph step")] += 0.004  # every layer, 4 steps: 1 ms a step
    for layer in (3, 7, 11):
        clock.seconds[(layer, "estimate")] += 0.008  # 3 layers, 2 ms a step each
    per_step, per_layer, layers = phase_times(clock, 4)
    assert list(per_step) == ["graph step", "estimate"]  # the costliest first
    assert per_step == pytest.approx({"graph step": 30.0, "estimate": 6.0})
    assert per_layer == pytest.approx({"graph step": 1.0, "estimate": 2.0})  # not 6 / 30
    assert layers == {"graph step": 30, "estimate": 3}


def test_bench_decode_profile_takes_the_named_methods_settings(tmp_path, capsys):
    """`--profile --methods a2ats_rr4_estm`: the profiled step runs with rerank 4 and the
    missed-attention estimate (its phase is timed, the JSON names the settings); a list that is
    not one A2ATS method is refused before any model loads, so no setting is dropped unseen."""
    folder = save_tiny_model(tmp_path / "m", "llama", hidden_size=256)
    argv = ["bench", "decode", "--model", str(folder), "--contexts", "300", "--steps", "3",
            "--profile", "--budget", "32", "--json"]  # fmt: skip
    assert main([*argv, "--methods", "full,a2ats_rr4_estm"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["method"] == "a2ats_rr4_estm" and out["budget"] == 32
    assert "rerank 4" in out["retrieval"] and "estimate (mean" in out["retrieval"]
    phases = out["results"][0]["phases_ms_per_step"]
    assert "graph step" in phases if graph_step.on() else "estimate" in phases  # its one phase
    assert main(argv) == 0  # default: a2ats, no estimate
    out = json.loads(capsys.readouterr().out)
    assert out["method"] == "a2ats" and "estimate" not in out["results"][0]["phases_ms_per_step"]
    for bad in ("full,a2ats,a2ats_kv4", "kv4", "full"):
        assert main([*argv, "--methods", bad]) == 1
        assert "--profile times one A2ATS method" in capsys.readouterr().err
    assert main([*argv, "--methods", "a2ats_rr4", "--rerank", "2"]) == 1
    assert "--rerank=2 disagrees" in capsys.readouterr().err


def test_bench_decode_records_the_estimates_rows(tmp_path, capsys):
    """With the missed-attention estimate on the host step, a row records the share of the
    slots that hold a row (the occupied ones), below 1 on a short context, and every A2ATS row
    whether the estimate ran."""
    folder = save_tiny_model(tmp_path / "m", "llama", hidden_size=256)
    argv = ["bench", "decode", "--model", str(folder), "--contexts", "300", "--steps", "3",
            "--methods", "full,a2ats_eb0,a2ats_eb0_estm", "--repeats", "1", "--json"]  # fmt: skip
    assert main(argv) == 0
    rows = {r["method"]: r for r in json.loads(capsys.readouterr().out)["results"]}
    assert 0.0 < rows["a2ats_eb0_estm"]["estimate_rows_share"] < 1.0
    assert "estimate_rows_share" not in rows["a2ats_eb0"]
    # whether the estimate ran, as named or as this machine's measurement decided (none here)
    assert rows["a2ats_eb0_estm"]["estimate"] is True and rows["a2ats_eb0"]["estimate"] is False


def test_bench_decode_geometry_refuses_methods(capsys):
    """A geometry run times full and a2ats only: --methods is refused, not ignored."""
    argv = ["bench", "decode", "--geometry", "tiny", "--contexts", "256", "--methods", "full"]
    assert main(argv) == 1
    assert "--methods does not apply with --geometry" in capsys.readouterr().err


def test_decode_copies_of_a_hybrid_models_state_are_independent():
    """A linear-attention layer's ArraysCache holds a list of states: a copy that shares the
    list would let one method's decode move another's state (qwen3_next: layers 0 and 2)."""
    import mlx.core as mx
    from mlx_lm.models.cache import ArraysCache, make_prompt_cache

    from a2ats_engine.bench import speed
    from a2ats_engine.cache.config import A2ATSConfig
    from a2ats_engine.cache.model_matrix import tiny_family_model

    model = tiny_family_model("qwen3_next")
    base = make_prompt_cache(model)
    mx.eval(model(mx.array([list(range(1, 41))]), cache=base))
    assert any(isinstance(c, ArraysCache) for c in base)
    first = speed._method_cache(model, base, "full", A2ATSConfig(), None)
    second = speed._method_cache(model, base, "full", A2ATSConfig(), None)
    mx.eval(model(mx.array([[5]]), cache=first))  # one decode step through the first copy
    ref = model(
        mx.array([[7]]), cache=speed._method_cache(model, base, "full", A2ATSConfig(), None)
    )
    got = model(mx.array([[7]]), cache=second)
    assert float(mx.abs(ref - got).max()) == 0.0


def test_telemetry_methods_take_a_snapshot_after_each_token_as_the_app_does(monkeypatch):
    """The app's session takes the inspector's snapshot after each token, and the stats are
    made then (`layer_stats`): the bench's `_telemetry` methods time that too; the others take
    none."""
    import mlx.core as mx
    from mlx_lm.models.cache import make_prompt_cache
    from tiny import tiny_model

    from a2ats_engine.bench import speed
    from a2ats_engine.cache.config import A2ATSConfig

    model = tiny_model("llama", hidden_size=256)
    base = make_prompt_cache(model)
    model(mx.array([list(range(3, 100))]), cache=base)
    taken, snapshot = [], speed.snapshot
    monkeypatch.setattr(speed, "snapshot", lambda c, t: taken.append(snapshot(c, t)))
    config = A2ATSConfig(window=16, sinks=4)
    for method, want in (("a2ats", 0), ("a2ats_telemetry", 5)):
        cache = speed._method_cache(model, base, method, config, None)
        speed._decode_chunk(model, cache, mx.array([5]), 5)
        assert len(taken) == want
    assert all(s is not None and len(s.layers) == len(model.layers) for s in taken)
    # each shows the newest step built (the next one's graph is built before a token is read:
    # 97 prompt tokens, the first step 98); after the last token no other step was built
    assert [s.layers[0].offset for s in taken] == [99, 100, 101, 102, 102]
