"""The measured crossover: the decision rule, the user table, the lookup order, `a2ats crossover`
and what `a2ats info` says (cache/crossover.py, commands/crossover.py)."""

import json
import re
import shlex
import warnings

import pytest
from tiny import save_tiny_model

from a2ats_engine.cache import crossover as xo
from a2ats_engine.cache import native_step
from a2ats_engine.cache.a2ats_cache import A2ATSCache
from a2ats_engine.cache.codebook import Codebook
from a2ats_engine.cache.config import A2ATSConfig
from a2ats_engine.cache.model_cache import make_cache
from a2ats_engine.cli import main
from a2ats_engine.loading.models import load_model

from .test_cache import D, filled_cache


def row(exact_below=1234, *, backend="cpu", machine=None, geometry=(30, 3, 64), **extra):
    layers, kv, hd = geometry
    return {
        "backend": backend,
        "machine": xo.machine_id() if machine is None else machine,
        "layers": layers,
        "kv_heads": kv,
        "head_dim": hd,
        "exact_below": exact_below,
        "never": False,
        "model": "test-model",
        "date": "2026-01-01",
        "ratios": {"512": 0.8, "1024": 1.1},
        **extra,
    }


# -- the decision rule ----------------------------------------------------------------------------


def test_monotone_ratios_cross_at_the_first_context_at_least_as_fast():
    d = xo.decide_crossover({512: 0.76, 1024: 0.82, 2048: 0.9, 4096: 1.01, 8192: 1.24})
    assert d == xo.Decision(4096, never=False)
    assert xo.decide_crossover({4096: 1.0, 512: 0.5}).exact_below == 4096  # 1.0 counts, any order


def test_noisy_ratios_cross_only_where_they_stay_at_least_1():
    # 1024 is faster by noise, 2048 slower again: the crossover is the start of the last run
    d = xo.decide_crossover({512: 0.8, 1024: 1.02, 2048: 0.97, 4096: 1.1, 8192: 1.3})
    assert d == xo.Decision(4096, never=False)


def test_never_within_the_range_attends_exactly_through_the_largest_context():
    d = xo.decide_crossover({512: 0.5, 2048: 0.7, 16384: 0.82})
    assert d == xo.Decision(16385, never=True)
    # faster in the middle but slower at the largest context: still never
    assert xo.decide_crossover({512: 1.1, 1024: 0.95}) == xo.Decision(1025, never=True)
    assert "every context measured (up to 16,384)" in d.describe(16384)


def test_always_faster_crosses_at_the_smallest_context():
    assert xo.decide_crossover({1024: 1.3, 512: 1.05}) == xo.Decision(512, never=False)


def test_no_measurement_is_an_error():
    with pytest.raises(ValueError, match="at least one measured context"):
        xo.decide_crossover({})


# -- the user table -------------------------------------------------------------------------------


def test_table_round_trip_replaces_the_row_with_the_same_key(table):
    assert xo.record_crossover(row(1234)) == table
    xo.record_crossover(row(777, geometry=(16, 8, 64)))
    xo.record_crossover(row(2048))  # same key as the first: replaces it
    data = json.loads(table.read_text())
    assert data["format"] == xo.FORMAT and data["version"] == xo.VERSION
    assert sorted(e["exact_below"] for e in data["entries"]) == [777, 2048]
    entries = xo.user_table()
    assert entries[("cpu", xo.machine_id(), 30, 3, 64, None, None)]["exact_below"] == 2048
    assert entries[("cpu", xo.machine_id(), 16, 8, 64, None, None)]["model"] == "test-model"
    assert not list(table.parent.glob("*.tmp"))  # the temporary file was renamed away


def test_a_row_without_its_key_is_refused(table):
    bad = row()
    del bad["machine"]
    with pytest.raises(ValueError, match="lacks a key field"):
        xo.record_crossover(bad)
    assert not table.exists()


def test_a_corrupt_table_warns_once_and_is_ignored(table, monkeypatch):
    monkeypatch.setattr(xo, "backend", lambda: "cpu")
    table.parent.mkdir(parents=True)
    table.write_text("{not json")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert xo.measured_crossover(30, 3, 64) == 4096  # the built-in row, no crash
        assert xo.measured_crossover(30, 3, 64) == 4096
        assert xo.measured_crossover(2, 2, 64) == 0
    messages = [str(w.message) for w in caught]
    assert len(messages) == 1 and "not valid JSON" in messages[0], messages
    # recording over it keeps the bad file aside and starts a new table
    with pytest.warns(UserWarning, match="moved to"):
        xo.record_crossover(row(999))
    assert (table.parent / "crossover.json.corrupt").read_text() == "{not json"
    assert xo.measured_crossover(30, 3, 64) == 999


def test_malformed_rows_are_dropped_and_the_good_ones_used(table, monkeypatch):
    monkeypatch.setattr(xo, "backend", lambda: "cpu")
    table.parent.mkdir(parents=True)
    good = row(3000)
    entries = [good, {**row(), "layers": "30"}, {**row(), "exact_below": -1}, "junk"]
    table.write_text(json.dumps({"entries": entries}))
    with pytest.warns(UserWarning, match="3 malformed row"):
        assert xo.measured_crossover(30, 3, 64) == 3000
    table.write_text(json.dumps([good]))  # not a table at all
    xo.reload_user_table()
    with pytest.warns(UserWarning, match="no 'entries' list"):
        assert xo.measured_crossover(30, 3, 64) == 4096


def test_rows_of_another_machine_or_backend_are_not_used(table, monkeypatch):
    monkeypatch.setattr(xo, "backend", lambda: "cpu")
    xo.record_crossover(row(111, machine="Darwin arm64, 12 cores, Apple M2 Pro"))
    xo.record_crossover(row(222, backend="metal"))
    assert xo.measured_crossover(30, 3, 64) == 4096  # the built-in row for the demo on the CPU
    assert xo.measured_crossover(2, 2, 64) == 0
    monkeypatch.setattr(xo, "backend", lambda: "metal")
    assert xo.measured_crossover(30, 3, 64) == 222


def test_the_user_table_wins_over_the_built_in_one(table, monkeypatch):
    monkeypatch.setattr(xo, "backend", lambda: "cpu")
    assert xo.lookup_crossover(30, 3, 64).origin == "built-in"
    xo.record_crossover(row(1234, never=True))
    found = xo.lookup_crossover(30, 3, 64)
    assert (found.tokens, found.origin, found.never) == (1234, str(table), True)
    assert found.source == "test-model, 2026-01-01: 512 0.80x, 1024 1.10x"
    assert xo.measured_crossover(30, 3, 64) == 1234


def test_a_cache_with_exact_below_unset_uses_the_user_table(table, monkeypatch):
    monkeypatch.setattr(xo, "backend", lambda: "cpu")
    book = Codebook.random(3, 2, D, 16, seed=0)
    rope = filled_cache(n=1)[2]
    assert A2ATSCache(0, rope, book, A2ATSConfig(), 8192).exact_below == 0
    xo.record_crossover(row(640, geometry=(3, 2, D)))
    assert A2ATSCache(0, rope, book, A2ATSConfig(), 8192).exact_below == 640
    assert A2ATSCache(0, rope, book, A2ATSConfig(exact_below=5), 8192).exact_below == 5


def test_a_row_applies_only_to_the_settings_it_was_measured_with(table, monkeypatch):
    """The step kind (codebook subspaces, budget, rerank, buckets, K/V precision, estimate) is
    in the key: a row measured with the estimate on is not used without it and vice versa; a
    row written before the kind was recorded counts as the default settings, any codebook."""
    monkeypatch.setattr(xo, "backend", lambda: "cpu")
    assert xo.step_kind(A2ATSConfig()) == xo.DEFAULT_KIND
    estimate = xo.step_kind(A2ATSConfig(estimate_missed=True))
    assert estimate == xo.DEFAULT_KIND + ", estimate mean"
    assert xo.step_kind(A2ATSConfig(estimate_missed=True), 16).startswith("pq16, ")
    pq_mean = xo.step_kind(A2ATSConfig(estimate_missed=True), 16)  # runs: slots by own keys
    assert pq_mean.startswith("pq16, ") and pq_mean.endswith(", estimate mean")
    centroid = A2ATSConfig(estimate_missed=True, estimate_scores="centroid")
    assert "estimate" not in xo.step_kind(centroid, 16)  # it cannot run with product VQ
    assert xo.step_kind(centroid).endswith(", estimate centroid")
    geometry = (3, 2, D)
    xo.record_crossover(row(640, geometry=geometry))  # no kind: the defaults
    xo.record_crossover(row(9000, geometry=geometry, step=estimate))
    assert xo.measured_crossover(*geometry) == 640
    assert xo.measured_crossover(*geometry, xo.step_kind(A2ATSConfig(), 16)) == 640
    assert xo.measured_crossover(*geometry, estimate) == 9000
    assert xo.measured_crossover(*geometry, xo.step_kind(A2ATSConfig(budget=0.1))) == 0
    book = Codebook.random(3, 2, D, 16, seed=0)
    rope = filled_cache(n=1)[2]
    on = A2ATSConfig(estimate_missed=True)
    assert A2ATSCache(0, rope, book, on, 8192).exact_below == 9000
    assert A2ATSCache(0, rope, book, A2ATSConfig(), 8192).exact_below == 640
    xo.record_crossover(row(700, geometry=geometry, step=xo.DEFAULT_KIND))
    assert len(json.loads(table.read_text())["entries"]) == 3  # its own row beside the old one
    assert xo.measured_crossover(*geometry) == 700  # a row with the kind wins over an old one
    with pytest.raises(ValueError, match="lacks a key field"):
        xo.record_crossover(row(1, step=3))


def test_cli_measures_and_records_with_the_settings_given(tiny_folder, table, capsys):
    """`a2ats crossover --estimate mean --budget 0.05` measures those settings and records them
    as the row's kind, beside (not over) the defaults' row; `--preset quality` measures the
    preset's (rerank 4 with the estimate)."""
    argv = ["crossover", str(tiny_folder), *ARGV, "--json"]
    assert main([*argv, "--budget", "0.05", "--estimate", "mean"]) == 0
    out = json.loads(capsys.readouterr().out)
    kind = xo.step_kind(A2ATSConfig(budget=0.05, estimate_missed=True))
    assert out["step"] == kind and out["budget"] == 0.05
    assert main(argv) == 0
    capsys.readouterr()
    kinds = {e["step"] for e in json.loads(table.read_text())["entries"]}
    assert kinds == {kind, xo.DEFAULT_KIND}
    assert main([*argv, "--preset", "quality"]) == 0  # the preset's kind: rerank 4, estimate
    quality = xo.step_kind(A2ATSConfig(rerank=4, estimate_missed=True))
    assert quality.endswith("rerank 4, buckets 4, kv model dtype, estimate mean")
    assert json.loads(capsys.readouterr().out)["step"] == quality


def test_machine_id_names_os_architecture_and_cores():
    import os
    import platform

    assert xo.machine_id().startswith(
        f"{platform.system()} {platform.machine()}, {os.cpu_count()} cores"
    )
    # two virtual machines named "AMD EPYC" are told apart by the CPU's numbers (Linux x86)
    assert xo.machine_id().endswith(f", {xo.cpu_name()}, {xo.cpu_model()}")
    assert xo.cpu_model().startswith("family ")  # this machine (and CI's) gives them


def test_cpu_model_reads_the_first_processor_and_bounds_what_it_takes():
    info = (
        "processor\t: 0\nvendor_id\t: AuthenticAMD\ncpu family\t: 25\nmodel\t\t: 17\n"
        "model name\t: AMD EPYC\nstepping\t: 1\n\nprocessor\t: 1\ncpu family\t: 6\n"
    )
    assert xo.cpu_model(info) == "family 25 model 17 stepping 1"
    assert xo.cpu_model("cpu family : 6\nmodel : 85\n") == "family 6 model 85"
    assert xo.cpu_model("model name : Apple M2\n") == ""  # no family: nothing to add
    assert len(xo.cpu_model("cpu family : " + "9" * 500 + "\nmodel : 1\n")) < 40


def test_bench_machine_line_names_the_cpu_model_where_the_os_gives_it():
    from a2ats_engine.commands._bench_common import machine

    assert xo.cpu_model() in machine()


# -- `a2ats crossover` and `a2ats info` -----------------------------------------------------------


@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory):
    return save_tiny_model(tmp_path_factory.mktemp("xo") / "tiny-llama", "llama", hidden_size=256)


ARGV = ["--contexts", "300,150", "--steps", "2", "--repeats", "2"]


@pytest.mark.filterwarnings("ignore:codebook records no model fingerprint")  # a random book
def test_cli_dry_run_measures_and_writes_nothing(tiny_folder, table, capsys, tmp_path):
    assert main(["crossover", str(tiny_folder), *ARGV, "--dry-run", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["command"] == shlex.join(["a2ats", "crossover", str(tiny_folder), *ARGV,
                                         "--dry-run", "--json"])  # fmt: skip
    assert not table.exists() and out["recorded"] is None
    assert [r["context"] for r in out["results"]] == [150, 300]
    for r in out["results"]:
        assert len(r["ratio_runs"]) == 2 and r["full_tokens_per_s"] > 0
    assert (out["layers"], out["kv_heads"], out["head_dim"]) == (2, 2, 64)
    assert out["exact_below"] in (150, 300, 301)
    assert out["never"] == (out["exact_below"] == 301)
    book = tmp_path / "book.safetensors"
    Codebook.random(2, 2, 64, 16, seed=0).save(book)
    assert main(["crossover", str(tiny_folder), *ARGV, "--codebook", str(book), "--dry-run",
                 "--json"]) == 0  # fmt: skip
    assert json.loads(capsys.readouterr().out)["codebook"] == "book.safetensors"  # not its path
    assert main(["crossover", str(tiny_folder), *ARGV, "--dry-run"]) == 0
    text = capsys.readouterr().out
    assert re.search(r"^crossover: .*\(exact_below = \d+\)$", text, re.M)
    assert "--dry-run: nothing recorded" in text and not table.exists()
    assert f"; host step: {native_step.status()}\n" in text  # what the row is measured with
    if xo.backend() == "cpu":
        assert re.search(r"^top-K: (MLX|NumPy) measured faster", text, re.M)


def test_cli_records_the_table_that_caches_and_info_then_use(tiny_folder, table, capsys):
    assert main(["info", str(tiny_folder)]) == 0
    before = capsys.readouterr().out
    # nothing measured: the cost model's estimate, never 0, says it is one and how to measure
    assert re.search(
        r"^exact below +exact until [\d,]+ tokens \(estimated from the geometry", before, re.M
    )
    assert f"`a2ats crossover {tiny_folder}`" in before
    assert re.search(r"^host step +C\+\+ in MLX's graph \(graph_step\.cpp\)$", before, re.M)

    assert main(["crossover", str(tiny_folder), *ARGV, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["recorded"] == str(table)
    (entry,) = json.loads(table.read_text())["entries"]
    assert entry["model"] == "tiny-llama" and entry["exact_below"] == out["exact_below"]
    assert (entry["backend"], entry["machine"]) == (xo.backend(), xo.machine_id())
    assert set(entry["ratios"]) == {"150", "300"}
    assert entry["step"] == xo.DEFAULT_KIND  # the settings it was measured with
    if xo.backend() == "cpu":  # both top-K strategies timed; the faster one recorded
        assert entry["top_k"] in ("mlx", "numpy") and set(entry["top_k_ratios"]) == {"150", "300"}

    model, _, _ = load_model(str(tiny_folder))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the random codebook's warning
        caches = make_cache(model, A2ATSConfig())
    assert [c.exact_below for c in caches] == [entry["exact_below"]] * 2

    assert main(["info", str(tiny_folder)]) == 0
    after = capsys.readouterr().out
    n = entry["exact_below"]
    assert re.search(rf"^exact below +exact until {n:,} tokens", after, re.M)
    step = "the C++ step in MLX's graph"  # what the probe ran, recorded with the row
    assert entry["host_step_kind"] == "graph" and entry["host_step"] == native_step.status()
    assert f"measured on this machine with {step}: {table}; tiny-llama" in after
    assert main(["info", "--json", str(tiny_folder)]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert listed["crossover"].startswith(f"exact until {n:,}")
    assert listed["host_step"] == native_step.status() and "graph_step.cpp" in listed["host_step"]


# -- the host step a row was measured with ------------------------------------------------------


def test_a_row_applies_only_where_its_host_step_runs(table):
    geo = (16, 8, 64)  # no built-in row
    xo.record_crossover(row(777, geometry=geo, step=xo.DEFAULT_KIND, host_step_kind="numpy"))
    assert native_step.kind() == "graph"
    assert xo.lookup_crossover(*geo) is None  # measured with the slower NumPy step: not here
    with native_step.forced("numpy"):
        assert xo.measured_crossover(*geo) == 777
        assert xo.lookup_crossover(*geo).host_step == "numpy"
    # a row for the graph step sits beside it; each step reads its own
    xo.record_crossover(row(2048, geometry=geo, step=xo.DEFAULT_KIND, host_step_kind="graph"))
    assert len(json.loads(table.read_text())["entries"]) == 2
    assert xo.measured_crossover(*geo) == 2048
    with native_step.forced("numpy"):
        assert xo.measured_crossover(*geo) == 777
    with native_step.forced("native"):  # none for the synced step
        assert native_step.kind() == "native" and xo.lookup_crossover(*geo) is None


def test_a_row_from_before_the_host_step_was_recorded_stands_for_any(table):
    geo = (16, 8, 64)
    xo.record_crossover(row(900, geometry=geo))  # neither host_step nor step: the NumPy era
    for strategy in native_step.STRATEGIES:
        with native_step.forced(strategy):
            assert xo.measured_crossover(*geo) == 900
    # one measured with the step that runs wins over it
    xo.record_crossover(row(3000, geometry=geo, host_step="C++ in MLX's graph (graph_step.cpp)"))
    assert xo.measured_crossover(*geo) == 3000
    with native_step.forced("native"):
        assert xo.measured_crossover(*geo) == 900


def test_the_host_step_of_a_row_is_read_from_what_each_version_recorded():
    of = xo.host_step_of
    assert of({"host_step": "NumPy (the C++ step is not built (No module ...))"}) == "numpy"
    assert of({"host_step": "NumPy"}) == "numpy"
    graph_58 = "C++ in MLX's graph (graph_step.cpp; synced on layers with the estimate)"
    assert of({"host_step": graph_58}) == of({"host_step": native_step.GRAPH}) == "graph"
    assert of({"host_step": f"{native_step.SYNCED} (A2ATS_HOST_STEP=native)"}) == "native"
    assert of({"host_step": "C++ (native_step.cpp)"}) == "native"  # the first C++ step's line
    assert of({"host_step_kind": "native", "host_step": "NumPy"}) == "native"  # the kind first
    # hostile or from a later version: a step this one does not run, so the row never applies
    for odd in ({"host_step": 42}, {"host_step": "Rust"}, {"host_step_kind": [1]},
                {"host_step_kind": "gpu"}):  # fmt: skip
        assert of(odd) == "other"
    assert of({}) is None
    for strategy in native_step.STRATEGIES:
        with native_step.forced(strategy):
            assert of({"host_step": native_step.status()}) == native_step.kind() == strategy


def test_info_says_why_a_row_measured_here_does_not_apply(table):
    geo = (16, 8, 64)
    xo.record_crossover(row(777, geometry=geo, step=xo.DEFAULT_KIND, host_step_kind="native"))
    text = xo.describe_crossover(*geo, "demo", estimate=5000)
    assert text.startswith("exact until 5,000 tokens (estimated from the geometry")
    assert (
        "measured here on 2026-01-01 with the synced C++ step, which does not apply to the C++ "
        "step in MLX's graph running now; the app measures it" in text
    )
    assert "with the synced C++ step" not in xo.describe_crossover(*(30, 3, 64), "demo")
    with native_step.forced("native"):
        text = xo.describe_crossover(*geo, "demo", estimate=5000)
        assert text.startswith("exact until 777 tokens (measured on this machine with the synced")


def test_the_crossover_command_says_on_how_many_layers_the_estimate_went_on():
    from a2ats_engine.commands.crossover import _estimate_state

    entry = {"a2ats_layers": 30}
    assert _estimate_state({"on": True, "layers": 30}, entry) == "on every layer"
    assert _estimate_state({"on": True}, entry) == "on every layer"  # recorded before layers
    assert _estimate_state({"on": True, "layers": 12}, entry) == "on the 12 layers that miss most"
    assert _estimate_state({"on": True, "layers": 1}, entry) == "on the 1 layer that misses most"
    assert _estimate_state({"on": False, "layers": 0}, entry) == "off"


def test_info_names_the_built_in_row(monkeypatch, capsys):
    from a2ats_engine.commands.models import crossover_text

    class Plan:
        refused = None
        a2ats_layers = (0, 1)

    class Info:
        layer_plan, num_layers, num_heads, num_kv_heads, head_dim = Plan(), 30, 9, 3, 64

    monkeypatch.setattr(xo, "backend", lambda: "cpu")
    text = crossover_text(Info(), "demo")
    assert text.startswith("exact until 4,096 tokens (built-in table, measured on another machine")
    assert "`a2ats crossover demo` measures this one" in text
    Plan.a2ats_layers = ()
    assert crossover_text(Info(), "demo") is None


@pytest.mark.parametrize(
    "bad, message",
    [
        (["--contexts", "512,x"], "--contexts: 'x' is not a whole number"),
        (["--contexts", "0"], "--contexts: 0 is out of range"),
        (["--contexts", ","], "--contexts is empty"),
        (["--steps", "0"], "--steps=0 is out of range"),
        (["--repeats", "0"], "--repeats=0 is out of range"),
        (["--budget", "x"], "--budget='x' is not a number"),
        (["--rerank", "0"], "--rerank"),
    ],
)
def test_cli_bad_input_is_one_line(tiny_folder, table, capsys, bad, message):
    assert main(["crossover", str(tiny_folder), *bad]) == 1
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and message in err
    assert not table.exists()


@pytest.mark.parametrize(
    "content, problem",
    [
        (b'\xff\xfe{"entries": []}', "not UTF-8"),
        (b"[" * 100_000, "nested too deep"),
        (b'{"entries": [' + b"1" * 5000 + b"]}", "not valid JSON"),
    ],
)
def test_an_undecodable_or_deeply_nested_table_warns_once_and_is_ignored(
    table, monkeypatch, content, problem
):
    monkeypatch.setattr(xo, "backend", lambda: "cpu")
    table.parent.mkdir(parents=True)
    table.write_bytes(content)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert xo.measured_crossover(30, 3, 64) == 4096  # the built-in row, no crash
        assert xo.measured_crossover(2, 2, 64) == 0
    messages = [str(w.message) for w in caught]
    assert len(messages) == 1, messages
    assert str(table) in messages[0] and problem in messages[0] and "ignored" in messages[0]
    assert "\n" not in messages[0]


def test_an_oversized_table_is_ignored_without_reading_it_whole(table, monkeypatch):
    monkeypatch.setattr(xo, "backend", lambda: "cpu")
    table.parent.mkdir(parents=True)
    with open(table, "wb") as f:
        f.truncate(xo.MAX_TABLE_BYTES + 1)  # sparse: nothing written
    with pytest.warns(UserWarning, match="larger than"):
        assert xo.measured_crossover(30, 3, 64) == 4096


def test_info_and_chat_survive_an_undecodable_table(tiny_folder, table, capsys):
    table.parent.mkdir(parents=True)
    table.write_bytes(b'\xff\xfe{"entries": []}')
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert main(["info", str(tiny_folder)]) == 0
        assert "estimated from the geometry" in capsys.readouterr().out
        assert (
            main(["chat", "--model", str(tiny_folder), "--prompt", "hi", "--max-tokens", "2"]) == 0
        )


def test_the_cost_model_reproduces_the_measured_row_and_is_never_zero():
    from a2ats_engine.cache.crossover_model import MIN_ESTIMATE, estimate_crossover

    # calibrated on the demo's measured crossover (9 query / 3 KV heads, d 64, float32)
    assert (
        estimate_crossover(9, 3, 64, 4)
        == xo.MEASURED[("cpu", 30, 3, 64, xo.DEFAULT_KIND)].tokens
        == 4096
    )
    # more bytes per token for exact attention: retrieval pays off sooner
    qwen3, llama, gemma = (
        estimate_crossover(*g, 4) for g in ((16, 8, 128), (32, 8, 64), (4, 1, 256))
    )
    assert qwen3 < llama < gemma < 4096  # more bytes per token than the demo: sooner
    assert estimate_crossover(9, 3, 64, 2) > 4096  # fp16 K/V: exact attention reads half
    assert estimate_crossover(2, 2, 16, 4) >= MIN_ESTIMATE > 0  # tiny: never 0
    # the missed-attention estimate reads its per-slot sums every step: retrieval pays later,
    # the more so with (bucket, code) slots than with codes alone, and only where C is known
    on = A2ATSConfig(estimate_missed=True)
    by_code = A2ATSConfig(estimate_missed=True, estimate_scores="code_mean")
    with_sums = estimate_crossover(9, 3, 64, 4, on, n_centroids=512)
    assert with_sums > estimate_crossover(9, 3, 64, 4, by_code, n_centroids=512) > 4096
    assert estimate_crossover(9, 3, 64, 4, on) == 4096  # codebook size unknown: not counted


def test_the_app_and_chat_default_follows_a_measurement_over_the_estimate(tiny_folder, table):
    """A fake timing source where retrieval is slower at every measured context on this machine:
    the recorded row wins over the estimate, so the chat attends exactly there (never slower)."""
    from a2ats_engine.cache.crossover_model import ESTIMATE_SOURCE, with_default_crossover

    model, _, _ = load_model(str(tiny_folder))
    config, row = with_default_crossover(model, A2ATSConfig())
    assert row.origin == "estimate" and row.source == ESTIMATE_SOURCE and config.exact_below > 0
    slower = {150: 0.8, 300: 0.9, 600: 0.95}  # a2ats / full at each context, as measured
    decision = xo.decide_crossover(slower)
    assert decision.never and decision.exact_below == 601
    xo.record_crossover(
        {"backend": xo.backend(), "machine": xo.machine_id(), "layers": 2, "kv_heads": 2,
         "head_dim": 64, "exact_below": decision.exact_below, "never": True,
         "ratios": {str(k): v for k, v in slower.items()}, "model": "tiny-llama"},
        table,
    )  # fmt: skip
    xo.reload_user_table()
    config, row = with_default_crossover(model, A2ATSConfig())
    assert config.exact_below == 601 and row.never and row.origin == str(table)
    pinned, _ = with_default_crossover(model, A2ATSConfig(exact_below=5))
    assert pinned.exact_below == 5  # a setting wins over both


# -- the top-K strategy, measured per machine ------------------------------------------------------


def test_the_top_k_strategy_follows_forced_then_env_then_the_measurement(table, monkeypatch):
    from a2ats_engine.cache import topk

    monkeypatch.setattr(xo, "backend", lambda: "cpu")
    monkeypatch.delenv(topk.ENV, raising=False)
    geometry = (3, 2, D)
    platform = topk.NumpyTopK if topk.cpu_only() else topk.MlxTopK
    assert isinstance(topk.choose_top_k(geometry), platform)  # nothing measured
    xo.record_crossover(row(640, geometry=geometry, top_k="mlx"))
    assert xo.measured_top_k(*geometry) == "mlx"
    assert isinstance(topk.choose_top_k(geometry), topk.MlxTopK)
    assert isinstance(topk.choose_top_k(), platform)  # no geometry: no lookup
    monkeypatch.setenv(topk.ENV, "numpy")
    assert isinstance(topk.choose_top_k(geometry), topk.NumpyTopK)  # the env overrides
    with topk.forced("mlx"):
        assert isinstance(topk.choose_top_k(geometry), topk.MlxTopK)  # forced overrides both
    assert isinstance(topk.choose_top_k(geometry), topk.NumpyTopK)
    monkeypatch.delenv(topk.ENV)
    book = Codebook.random(3, 2, D, 16, seed=0)
    rope = filled_cache(n=1)[2]
    assert isinstance(A2ATSCache(0, rope, book, A2ATSConfig(), 8192).top_k, topk.MlxTopK)
    xo.record_crossover(row(640, geometry=geometry, top_k="bogus"))  # hostile: not a strategy
    assert xo.measured_top_k(*geometry) is None
    assert xo.lookup_crossover(*geometry).source.endswith("1024 1.10x")


def test_the_probe_keeps_the_strategy_faster_at_the_largest_context():
    from a2ats_engine.bench.crossover_probe import timings_of
    from a2ats_engine.bench.speed import DecodeResult

    def run(rates):  # (context, method) -> tokens/s
        return [DecodeResult(m, n, r, 0, 0.0) for (n, m), r in rates.items()]

    # NumPy faster at 1K, MLX at 8K: MLX is kept, at every context
    runs = [
        run({(1024, "full"): 10, (1024, "a2ats_numpy"): 9, (1024, "a2ats_mlx"): 8,
             (8192, "full"): 5, (8192, "a2ats_numpy"): 4.5, (8192, "a2ats_mlx"): 5.5 + i / 10})
        for i in range(3)
    ]  # fmt: skip
    timings = timings_of(runs, [1024, 8192])
    assert [t.top_k for t in timings] == ["mlx", "mlx"]
    assert timings[0].ratio == pytest.approx(0.8) and timings[1].ratio == pytest.approx(1.12)
    assert timings[1].top_k_ratios == {"numpy": 0.9, "mlx": 1.12}
    # only the default timed (Metal): no strategy recorded
    plain = timings_of([run({(512, "full"): 4, (512, "a2ats"): 5})], [512])
    assert plain[0].top_k is None and plain[0].ratio == pytest.approx(1.25)
