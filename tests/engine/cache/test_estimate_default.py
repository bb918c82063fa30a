"""The missed-attention estimate's default: on where the crossover probe measured it to cost
nothing on this machine for the model's geometry, off elsewhere (cache/config.py
`estimate_missed` None, cache/crossover.py `measured_estimate`, bench/crossover_probe.py)."""

import json
import re
import warnings

import pytest
from tiny import save_tiny_model

from a2ats_engine.bench.methods import METHODS
from a2ats_engine.cache import crossover as xo
from a2ats_engine.cache.a2ats_cache import A2ATSCache
from a2ats_engine.cache.codebook import Codebook
from a2ats_engine.cache.config import (
    PRESETS,
    A2ATSConfig,
    describe_retrieval,
    estimate_runs,
    preset_of,
    retrieval_fields,
)
from a2ats_engine.cache.crossover_model import with_default_crossover
from a2ats_engine.cache.model_cache import make_cache
from a2ats_engine.cli import main
from a2ats_engine.loading.models import load_model

from .test_cache import D, filled_cache
from .test_crossover import ARGV, row

GEOMETRY = (3, 2, D)


@pytest.fixture
def cpu(monkeypatch):
    monkeypatch.setattr(xo, "backend", lambda: "cpu")


def cache_with(config: A2ATSConfig) -> A2ATSCache:
    book = Codebook.random(*GEOMETRY, 16, seed=0)
    return A2ATSCache(0, filled_cache(n=1)[2], book, config, 8192)


def test_the_default_and_the_speed_preset_leave_the_estimate_to_the_measurement():
    assert A2ATSConfig().estimate_missed is None and PRESETS["speed"]["estimate_missed"] is None
    assert preset_of(A2ATSConfig()) == "speed"
    assert preset_of(A2ATSConfig(estimate_missed=False)) is None  # off by choice: custom
    assert retrieval_fields(None)["estimate_missed"] is None
    assert retrieval_fields("speed", estimate="off")["estimate_missed"] is False
    assert retrieval_fields("quality", estimate="auto")["estimate_missed"] is None
    assert retrieval_fields("speed", estimate="mean")["estimate_missed"] is True
    assert estimate_runs(A2ATSConfig(), 1) is False  # unresolved: not in a step kind
    assert xo.step_kind(A2ATSConfig()) == xo.step_kind(A2ATSConfig(estimate_missed=False))
    assert "where measured to cost nothing" in describe_retrieval(A2ATSConfig(), 1)
    centroid = A2ATSConfig(estimate_scores="centroid")  # cannot run with product VQ: not named
    assert "estimate" not in describe_retrieval(centroid, 16)
    with pytest.raises(ValueError, match="estimate_missed='yes' must be True, False or None"):
        A2ATSConfig(estimate_missed="yes")


def test_a_cache_turns_the_estimate_on_only_where_it_was_measured_to_cost_nothing(table, cpu):
    assert not cache_with(A2ATSConfig()).estimates  # nothing measured
    xo.record_crossover(row(640, geometry=GEOMETRY, estimate={"ratio": 0.99}))
    on = cache_with(A2ATSConfig())
    assert on.estimates and on.exact_below == 640
    assert not cache_with(A2ATSConfig(estimate_missed=False)).estimates
    # the cache keeps the setting as asked (its config, what rebuilds it): another machine, or
    # a later measurement, decides afresh
    assert on.config.estimate_missed is None
    assert json.loads(on.meta_state[1])["estimate_missed"] is None
    again = A2ATSCache.from_state(on.state, on.meta_state, codebook=on.codebook)
    assert again.estimates
    xo.record_crossover(row(640, geometry=GEOMETRY, estimate={"ratio": 0.8}))
    assert not cache_with(A2ATSConfig()).estimates
    assert xo.measured_estimate(*GEOMETRY) is False
    assert cache_with(A2ATSConfig(estimate_missed=True)).estimates
    xo.record_crossover(row(640, geometry=GEOMETRY, estimate={"ratio": xo.ESTIMATE_FREE}))
    assert xo.measured_estimate(*GEOMETRY) is True  # the threshold itself counts as free


@pytest.mark.parametrize(
    "estimate", ["0.99", 0.99, {"ratio": True}, {"ratio": -1}, {"ratio": 1e9}, {"ratio": "1"}]
)
def test_a_malformed_estimate_measurement_counts_as_none(table, cpu, estimate):
    xo.record_crossover(row(640, geometry=GEOMETRY, estimate=estimate))
    found = xo.lookup_crossover(*GEOMETRY)
    assert found.tokens == 640 and found.estimate is None and not found.estimate_on
    assert not cache_with(A2ATSConfig()).estimates


def test_info_says_whether_the_estimate_is_on_and_what_it_measured(table, cpu):
    xo.record_crossover(row(640, geometry=GEOMETRY))
    text = xo.describe_crossover(*GEOMETRY, "tiny")
    assert "missed-attention estimate off by default (its cost not measured here" in text
    assert "`a2ats crossover tiny`" in text
    xo.record_crossover(row(640, geometry=GEOMETRY, estimate={"ratio": 0.97}))
    text = xo.describe_crossover(*GEOMETRY, "tiny")
    assert "missed-attention estimate on by default (0.97x the speed without it" in text
    assert text.count("0.97x") == 1  # said once
    xo.record_crossover(row(640, geometry=GEOMETRY, estimate={"ratio": 0.81}))
    assert "estimate off by default (0.81x" in xo.describe_crossover(*GEOMETRY, "tiny")


def test_the_probe_times_the_estimate_at_the_largest_context_for_the_strategy_kept():
    from a2ats_engine.bench.crossover_probe import timings_of
    from a2ats_engine.bench.speed import DecodeResult

    def run(rates):  # (context, method) -> tokens/s
        return [DecodeResult(m, n, r, 0, 0.0) for (n, m), r in rates.items()]

    runs = [
        run({(1024, "full"): 10, (1024, "a2ats_numpy"): 9, (1024, "a2ats_mlx"): 8,
             (8192, "full"): 5, (8192, "a2ats_numpy"): 4.0, (8192, "a2ats_mlx"): 5.0,
             (8192, "a2ats_numpy_est"): 4.0, (8192, "a2ats_mlx_est"): 4.0 + i / 10})
        for i in range(3)
    ]  # fmt: skip
    timings = timings_of(runs, [1024, 8192])
    assert timings[1].top_k == "mlx"  # the _est methods are not strategies
    assert timings[1].estimate_ratios == pytest.approx((0.8, 0.82, 0.84))
    assert timings[1].estimate_ratio == pytest.approx(0.82) and timings[1].estimate_top_k == "mlx"
    assert timings[0].estimate_ratio is None
    # the estimate is cheaper with NumPy's top-K (its host step): that pair is what counts
    for run_, i in zip(runs, range(3), strict=True):
        next(r for r in run_ if r.method == "a2ats_numpy_est").tokens_per_s = 4.8 - i / 10
    timings = timings_of(runs, [1024, 8192])
    assert timings[1].top_k == "mlx" and timings[1].estimate_top_k == "numpy"
    assert timings[1].estimate_ratios == pytest.approx((0.96, 0.94, 0.92))


def test_with_the_estimate_turned_on_a_cache_takes_the_top_k_measured_with_it(table, cpu):
    from a2ats_engine.cache.topk import NumpyTopK

    estimate = {"ratio": 0.97, "top_k": "numpy"}
    xo.record_crossover(row(640, geometry=GEOMETRY, top_k="mlx", estimate=estimate))
    assert xo.measured_top_k(*GEOMETRY) == "mlx"
    assert xo.measured_top_k(*GEOMETRY, with_estimate=True) == "numpy"
    assert isinstance(cache_with(A2ATSConfig()).top_k, NumpyTopK)  # on by the measurement
    assert not isinstance(cache_with(A2ATSConfig(estimate_missed=False)).top_k, NumpyTopK)
    xo.record_crossover(row(640, geometry=GEOMETRY, top_k="mlx", estimate={"ratio": 0.97}))
    assert xo.measured_top_k(*GEOMETRY, with_estimate=True) == "mlx"  # none recorded with it


@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory):
    return save_tiny_model(tmp_path_factory.mktemp("est") / "tiny-llama", "llama", hidden_size=256)


def test_the_crossover_command_measures_the_estimate_only_when_left_to_it(
    tiny_folder, table, capsys, monkeypatch
):
    """Left at its default, `a2ats crossover` also times the estimate at its largest context
    (over `ESTIMATE_STEPS` times the steps: its ratio is the noisiest the probe takes) and
    records the ratio and the decision; the app's and chat's config then follows it.
    `--estimate off` or `mean` measures those settings and nothing about the default."""
    from a2ats_engine.bench import crossover_probe, geometries

    timed = []  # (methods, tokens decoded) of each interleaved decode

    def decode(model, caches, tokens, *args, **kwargs):
        timed.append((tuple(sorted(caches)), len(tokens)))
        return real_decode(model, caches, tokens, *args, **kwargs)

    real_decode = geometries._decode_interleaved
    monkeypatch.setattr(geometries, "_decode_interleaved", decode)
    argv = ["crossover", str(tiny_folder), *ARGV, "--json"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the random codebook's warning
        assert main(argv) == 0
    printed = json.loads(capsys.readouterr().out)
    (entry,) = json.loads(table.read_text())["entries"]
    est = entry["estimate"]
    assert est["context"] == 300 and len(est["ratio_runs"]) == 2 and est["scores"] == "mean"
    steps = int(ARGV[ARGV.index("--steps") + 1])
    assert crossover_probe.ESTIMATE_STEPS > 1
    assert est["steps"] == crossover_probe.ESTIMATE_STEPS * steps
    with_est = [n for methods, n in timed if any(m.endswith("_est") for m in methods)]
    without = [n for methods, n in timed if not any(m.endswith("_est") for m in methods)]
    assert with_est == [est["steps"] + 2] * 2 and without == [steps + 2] * 2  # 2 untimed each
    # on where it pays on every layer, or on as many as its cost affords (the probe's rule
    # since the estimate runs on the layers that miss most: 0.908 affords 1 of these 2)
    affords = xo.affordable_layers(est["ratio"], entry["a2ats_layers"])
    assert est["layers"] == affords and est["on"] == (affords > 0)
    assert (affords == entry["a2ats_layers"]) == (est["ratio"] >= xo.ESTIMATE_FREE)
    assert printed["estimate"] == est
    model, _, _ = load_model(str(tiny_folder))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        config, crossover = with_default_crossover(model, A2ATSConfig())
        fixed, _ = with_default_crossover(model, A2ATSConfig(exact_below=5))
    # the chat and the app keep None for the caches to decide; the crossover says what
    assert config.estimate_missed is None and crossover.estimate_on is est["on"]
    assert crossover.estimate == est["ratio"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the random codebook's warning
        caches = make_cache(model, config)
    assert all(c.estimates is est["on"] for c in caches)
    assert fixed.exact_below == 5 and fixed.estimate_missed is None
    for asked in ("off", "mean"):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            assert main([*argv, "--estimate", asked, "--dry-run"]) == 0
        assert "estimate" not in json.loads(capsys.readouterr().out)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert main(argv[:-1]) == 0  # the text output names the measurement and the decision
    text = capsys.readouterr().out
    assert re.search(
        r"missed-attention estimate: a retrieval step with it \d+\.\d\dx the speed of one "
        r"without at 300 \([\d., ]+\): (on every layer|on the 1 layer that misses most|off) by "
        r"default \(on every layer from 0\.95x\)",
        text,
    )


def test_quality_methods_run_the_estimate_as_named_not_as_measured():
    base = A2ATSConfig()
    assert METHODS["a2ats"].config(base).estimate_missed is False
    assert METHODS["a2ats_no_rerank"].config(base).estimate_missed is False
    assert METHODS["a2ats_estimate_mean"].config(base).estimate_missed is True
    assert METHODS["a2ats"].config(A2ATSConfig(estimate_missed=True)).estimate_missed is True


def test_the_crossover_is_where_the_default_with_its_estimate_pays(tiny_folder, monkeypatch):
    """On a fake timing source: retrieval timed without the estimate at 1.01x KVCache at 2K and
    1.23x at 8K, the estimate on every layer 0.92x of that. By default it runs on the share of
    layers that cost affords, so the default decodes at ~0.95x of the timed ratios: exact at
    2K and 4K (0.96x there), retrieving at 8K. Measured with the estimate set (not left to the
    probe), the timed ratios decide as they are."""
    from a2ats_engine.bench import crossover_probe as cp

    ratios = {1024: 0.84, 2048: 1.01, 4096: 1.007, 8192: 1.23}

    def fake(model, contexts, **_):
        return [
            cp.ContextTiming(n, 10.0, 10.0 * r, (r, r, r),
                             estimate_ratios=(0.92, 0.919, 0.91) if n == 8192 else ())
            for n, r in ratios.items()
        ]  # fmt: skip

    monkeypatch.setattr(cp, "probe_crossover", fake)
    model, _, _ = load_model(str(tiny_folder))
    entry, _ = cp.measure_crossover(model, "tiny", list(ratios))
    layers = entry["a2ats_layers"]
    assert entry["estimate"]["layers"] == xo.affordable_layers(0.919, layers) > 0
    assert entry["exact_below"] == 8192 and not entry["never"]
    assert xo.decide_crossover(ratios).exact_below == 2048  # the timed ratios alone
    # the fold: nothing without an estimate measured, the whole ratio on every layer
    assert cp.as_default_decodes(ratios, None, 0, 30) == ratios
    assert cp.as_default_decodes(ratios, 0.97, 30, 30)[8192] == pytest.approx(1.23 * 0.97)
    assert cp.as_default_decodes(ratios, 0.919, 18, 30)[4096] == pytest.approx(1.007 * 0.9514)


def test_the_estimate_layers_follow_from_the_ratio_the_entry_records(tiny_folder, monkeypatch):
    """The entry records the estimate's ratio to 3 decimals; the layers it keeps follow from
    that recorded ratio, so a ratio just under the free mark (0.9496 -> 0.95) keeps it on every
    layer, as anyone recomputing from the entry finds (it once kept it on fewer)."""
    from a2ats_engine.bench import crossover_probe as cp

    def fake(model, contexts, **_):
        return [cp.ContextTiming(n, 10.0, 12.0, (1.2, 1.2, 1.2),
                                 estimate_ratios=(0.9496,) * 3 if n == 8192 else ())
                for n in contexts]  # fmt: skip

    monkeypatch.setattr(cp, "probe_crossover", fake)
    model, _, _ = load_model(str(tiny_folder))
    entry, _ = cp.measure_crossover(model, "tiny", [1024, 8192])
    est = entry["estimate"]
    assert est["ratio"] == xo.ESTIMATE_FREE == 0.95
    assert est["layers"] == xo.affordable_layers(est["ratio"], entry["a2ats_layers"])
    assert est["layers"] == entry["a2ats_layers"]
