"""Figures quoted outside the generated tables are the recorded ones, and the paths docs name exist.

A measured figure (a ratio such as `1.22x`, a fraction with three or four decimals such as
`0.915`) in README.md, docs/ARCHITECTURE.md or the code's user-facing text (help strings of
a2ats_engine/commands/, what `a2ats info` prints, the settings dialog, `A2ATSConfig`'s field
docs, the crossover table's sources) must either sit in a region docs/benchmarks/tables.py
generates, or inside a phrase of FIGURES below, which renders the phrase from the recorded JSON
in docs/benchmarks/. A figure that drifts from its JSON, or a new figure nobody tied to a JSON,
fails here. NOT_RECORDED lists the few strings that look like figures but quote no run.
"""

from __future__ import annotations

import ast
import json
import re
import subprocess
from collections.abc import Callable
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "docs" / "benchmarks"
FIGURE = re.compile(r"(?<![\d.])(\d+\.\d{2}x|\d+\.\d{3,4}x?)(?![\d.])")
REGION = re.compile(r"<!-- begin generated: ([\w-]+) -->\n.*?<!-- end generated: \1 -->", re.S)

DOCS = ("README.md", "docs/ARCHITECTURE.md")
CODE = (
    "a2ats_engine/calibration/calibrate.py",
    "a2ats_engine/cache/config.py",
    "a2ats_engine/cache/crossover.py",
    "app/dialogs/settings_dialog.py",
)


@cache
def j(name: str) -> dict:
    return json.loads((BENCH / name).read_text(encoding="utf-8"))


def speed(name: str, context: int, method: str) -> float:
    return next(
        r["speed_vs_full"]
        for r in j(name)["results"]
        if r["context"] == context and r["method"] == method
    )


def ev(name: str, method: str, field: str) -> float:
    return j(name)["methods"][method][field]


def per_token(method: str) -> float:
    rows = j("memory.json")["results"]
    last = max(r["context"] for r in rows)
    return next(r for r in rows if r["context"] == last and r["method"] == method)


def codebook_rows() -> list[dict]:
    return j("codebook_sweep.json")["results"] + j("codebook_sweep_4096.json")["results"]


def sweep_row(centroids: int, tokens: int) -> dict:
    return next(
        r for r in codebook_rows() if r["centroids"] == centroids and r["calib_tokens"] == tokens
    )


def default_codebook() -> dict:
    return sweep_row(512, 12288)


def shipped_below_8k() -> list[float]:
    return [speed("decode_v2.json", c, "a2ats_noest") for c in (512, 1024, 2048, 4096)]


def pooled(name: str, method: str, field: str) -> float:
    return j(name)["pooled"][0]["methods"][method][field]


def estimate_effect() -> tuple[float, ...]:
    """The estimate's effect at 4K / budget 0.03, pooled over the three texts (256 tokens
    each): output error without it, with it (slots scored by their mean keys, the default) and
    oracle top-K's, then ppl vs full without and with it."""
    plain, mean = "eval_4k_texts_estimate.json", "eval_4k_texts_estimate_left.json"
    return (
        pooled(plain, "a2ats", "output_rel_error"),
        pooled(mean, "a2ats_estimate_mean", "output_rel_error"),
        pooled(plain, "oracle_topk", "output_rel_error"),
        pooled(plain, "a2ats", "ppl_vs_full"),
        pooled(mean, "a2ats_estimate_mean", "ppl_vs_full"),
    )


def estimate_scores_cost() -> tuple[int, int]:
    """What the estimate costs a retrieval step at 8K in percent of its speed, with mean slot
    scores then centroid ones, in one run (decode_estimate_scores.json)."""
    rows = {(r["context"], r["method"]): r["ratio_median"]
            for r in j("decode_estimate_scores.json")["results"]}  # fmt: skip
    plain = rows[(8192, "a2ats_eb0")]
    return tuple(
        round(100 * (1 - rows[(8192, m)] / plain)) for m in ("a2ats_eb0_estm", "a2ats_eb0_est")
    )


def estimate_code_effect() -> tuple:
    """Slots of codes alone against (bucket, code) slots, both scored by their mean keys: ppl
    vs full pooled at 4K (codes alone, then buckets), then their cost a retrieval step at 8K
    in percent of its speed (codes alone, then buckets), each pair from one run."""
    rows = {(r["context"], r["method"]): r["ratio_median"]
            for r in j("decode_estimate_code.json")["results"]}  # fmt: skip
    plain = rows[(8192, "a2ats_eb0")]
    return (
        pooled("eval_4k_texts_estimate_left.json", "a2ats_estimate_code", "ppl_vs_full"),
        pooled("eval_4k_texts_estimate_left.json", "a2ats_estimate_mean", "ppl_vs_full"),
        *(round(100 * (1 - rows[(8192, m)] / plain)) for m in ("a2ats_eb0_estc", "a2ats_eb0_estm")),
    )


def estimate_cost_percent() -> tuple[int]:
    """What the estimate costs a retrieval step in the host step, in percent of its speed: the
    larger of 1K's and 8K's (decode_estimate_host_step.json)."""
    rows = {(r["context"], r["method"]): r["ratio_median"]
            for r in j("decode_estimate_host_step.json")["results"]}  # fmt: skip
    cost = max(1 - rows[(n, "a2ats_eb0_est")] / rows[(n, "a2ats_eb0")] for n in (1024, 8192))
    return (round(100 * cost),)


def _multivalue_8k(run: str, method: str = "a2ats") -> dict:
    """A method's 8K multi-value row of a task run's scores relative to full."""
    return next(
        r
        for r in j(run)["relative_to_full"]
        if (r["task"], r["context"], r["method"]) == ("niah_multivalue", 8192, method)
    )


def quality_preset() -> tuple[float, ...]:
    """The quality preset (rerank 4 with the mean-scored estimate) against the default (rerank
    2) at 8K on the demo model: pooled perplexity over the three texts; decode speed of a
    retrieval step vs KVCache in one run (decode_quality_preset.json); Quality's multi-value
    score vs full and its prompts; the share of its answers identical to full's and rerank 4
    alone's (percent); the estimate's cost a rerank-4 step (percent)."""
    rows = {
        (r["context"], r["method"]): r["ratio_median"]
        for r in j("decode_quality_preset.json")["results"]
    }
    quality = _multivalue_8k("tasks_8k_rr4_18.json", "a2ats_estimate_mean")
    alone = _multivalue_8k("tasks_8k_rr4_18.json")
    assert alone["score_vs_full_ci95"] == [1.0, 1.0]
    return (
        pooled("eval_8k_texts_rr4.json", "a2ats_estimate_mean", "ppl_vs_full"),
        pooled("eval_8k_texts.json", "a2ats", "ppl_vs_full"),
        rows[(8192, "a2ats_rr4_eb0_estm")],
        rows[(8192, "a2ats_eb0")],
        quality["score_vs_full"],
        quality["n"],
        round(100 * quality["agrees_with_full"]),
        round(100 * alone["agrees_with_full"]),
        round(100 * (1 - rows[(8192, "a2ats_rr4_eb0_estm")] / rows[(8192, "a2ats_rr4_eb0")])),
    )


def speed_ratio(run: str, context: int, method: str) -> float:
    """A `bench decode` run's median ratio to KVCache for one method and context."""
    return next(
        r["ratio_median"]
        for r in j(run)["results"]
        if (r["context"], r["method"]) == (context, method)
    )


def graph_estimate_cost(run: str, context: int, method: str = "a2ats_eb0") -> float:
    """What the estimate cost a forced retrieval step in a run, in percent of its speed:
    `method` against `a2ats_eb0_noest`."""
    return 100 * (
        1 - speed_ratio(run, context, method) / speed_ratio(run, context, "a2ats_eb0_noest")
    )


def quality_4k() -> tuple[float, ...]:
    """Quality at 4K on 18 prompts a task (tasks_4k_rr4_18.json): multi-key and multi-value
    must be at full's score on every prompt with the estimate; returns rerank 4 alone's
    multi-key score vs full, then the UUID score with the estimate and its interval."""
    rows = {(r["task"], r["method"]): r for r in j("tasks_4k_rr4_18.json")["relative_to_full"]}
    for task in ("niah_multikey", "niah_multivalue"):
        assert rows[(task, "a2ats_estimate_mean")]["score_vs_full_ci95"] == [1.0, 1.0]
        assert rows[(task, "a2ats_estimate_mean")]["n"] == 18
    uuid = rows[("niah_uuid", "a2ats_estimate_mean")]
    return (rows[("niah_multikey", "a2ats")]["score_vs_full"], uuid["score_vs_full"],
            *uuid["score_vs_full_ci95"])  # fmt: skip


def quality_8k_others() -> tuple[float, ...]:
    """Quality (rerank 4 with the estimate) at 8K on variable tracking, relative to full, its
    interval, rerank 4 alone's, and the share (percent) of answers identical to full's with and
    without the estimate; the number needle must be at full's score on every prompt with both
    (tasks_8k_rr4_number_vt.json)."""
    rows = {
        (r["task"], r["method"]): r for r in j("tasks_8k_rr4_number_vt.json")["relative_to_full"]
    }
    for method in ("a2ats", "a2ats_estimate_mean"):
        assert rows[("niah_number", method)]["score_vs_full_ci95"] == [1.0, 1.0]
        assert rows[("niah_number", method)]["agrees_with_full"] == 1.0
    quality = rows[("variable_tracking", "a2ats_estimate_mean")]
    alone = rows[("variable_tracking", "a2ats")]
    return (
        quality["score_vs_full"],
        *quality["score_vs_full_ci95"],
        alone["score_vs_full"],
        round(100 * quality["agrees_with_full"]),
        round(100 * alone["agrees_with_full"]),
    )


def quality_8k_vt24() -> tuple[float, ...]:
    """Variable tracking at 8K on 24 prompts (tasks_8k_rr4_vt24.json): full's score, then
    Quality's (rerank 4 with the estimate) relative to full with its interval, rerank 4 alone's
    with its interval, and the share (percent) of answers identical to full's with and without
    the estimate, and the prompts."""
    data = j("tasks_8k_rr4_vt24.json")
    rows = {r["method"]: r for r in data["relative_to_full"]}
    full = next(r["score"] for r in data["results"] if r["method"] == "full")
    quality, alone = rows["a2ats_estimate_mean"], rows["a2ats"]
    assert quality["n"] == alone["n"] == 24
    return (
        full,
        quality["score_vs_full"],
        *quality["score_vs_full_ci95"],
        alone["score_vs_full"],
        *alone["score_vs_full_ci95"],
        round(100 * quality["agrees_with_full"]),
        round(100 * alone["agrees_with_full"]),
        quality["n"],
    )


def estimate_cost(run: str, context: int) -> int:
    """The mean-scored estimate's cost a retrieval step at `context` in one decode run, in
    percent of its speed."""
    rows = {(r["context"], r["method"]): r["ratio_median"] for r in j(run)["results"]}
    return round(100 * (1 - rows[(context, "a2ats_eb0_estm")] / rows[(context, "a2ats_eb0")]))


def estimate_cost_now() -> tuple[int, ...]:
    """The mean-scored estimate's cost a retrieval step at 8K now, then at 1K
    (decode_quality_preset.json)."""
    return tuple(estimate_cost("decode_quality_preset.json", n) for n in (8192, 1024))


def estimate_rows_gain() -> tuple[int, ...]:
    """The estimate's cost at 1K and 8K with rows of the occupied slots, then with every slot
    held (the same command on the commit before, run right after)."""
    runs = ("decode_estimate_rows.json", "decode_estimate_dense.json")
    return tuple(estimate_cost(run, n) for run in runs for n in (1024, 8192))


def estimate_free() -> tuple[float]:
    """`crossover.ESTIMATE_FREE`: from what measured ratio the estimate is on by default."""
    from a2ats_engine.cache.crossover import ESTIMATE_FREE

    return (ESTIMATE_FREE,)


HOST_DAY = (  # that host's three decode runs of 2026-12-06, in order
    "decode_host_f25m17_before_sampled_topk.json",
    "decode_host_f25m17_before_host_tables.json",
    "decode_host_f25m17.json",
)


RERUN = "decode_host_f25m17_rerun.json"  # the same command right after decode_host_f25m17.json


def host_now(context: int, method: str) -> tuple[float, float]:
    """(lower, higher) median ratio of a method in that host's two runs with the current code."""
    got = sorted(host_run(context, method, r)["ratio_median"] for r in (HOST_DAY[-1], RERUN))
    return got[0], got[1]


def overhead_pieces(run: str) -> tuple[float, ...]:
    """A step_overhead.py run's pieces per layer at 1K: code and store, sync, tables, NumPy."""
    pieces = j(run)["runs"][0]["pieces_ms_per_layer"]
    keys = ("code and store each key", "one sync a layer", "lookup tables", "NumPy step")
    return tuple(pieces[k] for k in keys)


def amd_kvcache_8k() -> list[float]:
    """KVCache's tok/s at 8K in every recorded AMD host run of the hosts table."""
    runs = ("decode_amd_epyc.json", "decode_amd_epyc_rerun.json", *HOST_DAY, RERUN)
    return [host_run(8192, "full", r)["tokens_per_s"] for r in runs]


def native_profile(context: int) -> dict:
    """A context's row of the C++ host step's profile (BENCHMARKS "The host step in C++")."""
    return next(r for r in j("profile_native_step.json")["results"] if r["context"] == context)


def caches_us(where: str, part: str) -> float:
    """`host_step_caches.json`: microseconds of one layer's call, by where and which part."""
    return j("host_step_caches.json")["us_per_layer_call"][where][part]


def decode_spread(run: str, context: int, method: str) -> list[float]:
    """A `bench decode` run's ratio spread (lowest, highest) for one method and context."""
    return next(
        r["ratio_spread"]
        for r in j(run)["results"]
        if (r["context"], r["method"]) == (context, method)
    )


F25M1 = "decode_native_step_f25m1.json"  # the second host of the C++ step, as the step is now
F25M1_BEFORE = "decode_native_step_f25m1_before_row_kernels.json"
F25M1_PROBE = "crossover_demo_native_step_f25m1.json"
F25M1_NOEST = "decode_native_step_noest_f25m1.json"
F25M1_GEMMA = "decode_gemma3_270m_native_step_f25m1.json"
F25M1_RERUN = "decode_native_step_f25m1_rerun.json"
# the same host with the far scores kept in one pass (the step as it is now)
F25M1_ONE = "decode_native_step_f25m1_one_pass.json"
F25M1_ONE_PROBE = "crossover_demo_native_step_f25m1_one_pass.json"
F25M1_ONE_NOEST = "decode_native_step_noest_f25m1_one_pass.json"
F25M1_ONE_RERUN = "decode_native_step_f25m1_one_pass_rerun.json"
F25M1_ONE_GEMMA = "decode_gemma3_270m_native_step_f25m1_one_pass.json"
EXACT_DEFAULT = "decode_exact_default_f25m1.json"  # after the decode keys' codes waited
GRAPH = "decode_graph_step_f25m1.json"  # the graph step and the synced step in one run
GRAPH_RERUN = "decode_graph_step_f25m1_rerun.json"
GRAPH_PROBE = "crossover_demo_graph_step_f25m1.json"
GRAPH_ESTIMATE_PROBE = "crossover_demo_graph_estimate_f25m1.json"  # the estimate in the graph
GRAPH_ESTIMATE = "decode_graph_estimate_f25m1.json"  # with the synced step and the estimate off
GRAPH_ESTIMATE_BEFORE = "decode_graph_estimate_before_f25m1.json"  # at bf9e7cb: synced estimate
GRAPH_ESTIMATE_LADDER = "decode_graph_estimate_f25m1_ladder.json"  # 1K-8K, with the synced step
GRAPH_ESTIMATE_PROFILE = "profile_graph_estimate_f25m1.json"  # the estimate in the graph
GRAPH_ESTIMATE_12 = "decode_graph_estimate_f25m1_12layers.json"  # on the probe's 12 layers
GRAPH_HARNESS = "graph_step_engine.json"  # docs/benchmarks/graph_step/run.py, estimate off
GRAPH_GEMMA = "decode_gemma3_270m_graph_step_f25m1.json"
GRAPH_LADDER = "decode_graph_step_f25m1_ladder.json"  # 1K-8K, the third run
GRAPH_PROFILE = "profile_graph_step_f25m1.json"
PY_ENTRY = "decode_native_step_f25m1_py_entry.json"  # the step's own Python entry
PY_ENTRY_RERUN = "decode_native_step_f25m1_py_entry_rerun.json"
INSPECTOR = "inspector_cost_f25m1.json"  # the stats made at the snapshot, the C++ shadow
INSPECTOR_BEFORE = "inspector_cost_f25m1_before.json"


# a second-host reading's sentence: the forced step with each host step, and the fixed cost
FORCED_VS_NUMPY = (
    "C++ step against NumPy step in the same runs: {:.2f}x KVCache against {:.2f}x at 1K, {:.2f}x "
    "against {:.2f}x at 2K, {:.2f}x against {:.2f}x at 4K and {:.2f}x against {:.2f}x at 8K. The "
    "fixed cost (a forced step at 1K, the estimate on {} layers): {:.2f}x KVCache's time"
)


def forced_vs_numpy(run: str) -> tuple:
    """`FORCED_VS_NUMPY`'s figures from a four-method run at 1K-8K."""
    return (
        *(speed_ratio(run, n, m) for n in (1024, 2048, 4096, 8192)
          for m in ("a2ats_eb0", "a2ats_eb0_npstep")),
        host_run(1024, "a2ats_eb0", run)["estimate_layers"],
        1 / speed_ratio(run, 1024, "a2ats_eb0"),
    )  # fmt: skip


def f25m1_profile(context: int, before: bool = False, suffix: str = "") -> dict:
    """A context's row of the second host's profile: the step with its row kernels, before them,
    or (`suffix` "_one_pass") with the far scores kept in one pass."""
    name = "profile_native_step_f25m1" + ("_before_row_kernels" if before else suffix) + ".json"
    return next(r for r in j(name)["results"] if r["context"] == context)


def graph_step(run: str, context: int = 1024) -> dict:
    """One context's row of a graph-step harness run (docs/benchmarks/graph_step/run.py)."""
    return next(r for r in j(run)["results"] if r["context"] == context)


def graph_reading() -> tuple:
    """The figures of the graph step's reading (docs/BENCHMARKS.md), in its order."""
    runs = (GRAPH, GRAPH_RERUN)
    forced = [speed_ratio(run, 1024, m) for m in ("a2ats_eb0", "a2ats_eb0_sync") for run in runs]
    harness = [graph_step(GRAPH_HARNESS, n)["time_vs_kvcache"] for n in (1024, 8192)]
    return (
        *forced, *(1 / x for x in forced),
        *(speed_ratio(run, 8192, m) for m in ("a2ats_eb0", "a2ats_eb0_sync", "a2ats")
          for run in runs),
        host_run(8192, "a2ats", GRAPH)["estimate_layers"],
        j(GRAPH_PROBE)["ratios"]["1024"], j(F25M1_ONE_PROBE)["ratios"]["1024"],
        j(GRAPH_PROBE)["ratios"]["8192"], j(F25M1_ONE_PROBE)["ratios"]["8192"],
        j(GRAPH_PROBE)["exact_below"],
        harness[0]["graph"], harness[1]["graph"], harness[0]["sync"], harness[1]["sync"],
    )  # fmt: skip


def profile_row(run: str, context: int) -> dict:
    """One context's row of a `bench decode --profile` run."""
    return next(r for r in j(run)["results"] if r["context"] == context)


def graph_estimate_reading() -> tuple:
    """The figures of the estimate-in-the-graph reading (docs/BENCHMARKS.md), in its order."""
    before, after, ladder = GRAPH_ESTIMATE_BEFORE, GRAPH_ESTIMATE, GRAPH_ESTIMATE_LADDER
    return (
        *(graph_estimate_cost(before, n) for n in (1024, 8192)),
        *(speed_ratio(before, n, m) for n in (1024, 8192) for m in ("a2ats_eb0", "a2ats_eb0_noest")),
        *(graph_estimate_cost(after, n) for n in (1024, 8192)),
        *(speed_ratio(after, n, m) for n in (1024, 8192) for m in ("a2ats_eb0", "a2ats_eb0_noest")),
        *(speed_ratio(after, n, "a2ats_eb0_sync") for n in (1024, 8192)),
        j(GRAPH_ESTIMATE_PROBE)["estimate"]["ratio"], j(GRAPH_PROBE)["estimate"]["ratio"],
        j(GRAPH_ESTIMATE_PROBE)["estimate"]["layers"], j(GRAPH_PROBE)["estimate"]["layers"],
        *(speed_ratio(ladder, n, m) for m in ("a2ats_eb0", "a2ats_eb0_sync")
          for n in (1024, 2048, 4096, 8192)),
        speed_ratio(ladder, 1024, "a2ats"), j(GRAPH_ESTIMATE_PROBE)["exact_below"],
        *(speed_ratio(ladder, n, "a2ats") for n in (2048, 4096, 8192)),
        1 / speed_ratio(ladder, 1024, "a2ats_eb0"),
    )  # fmt: skip


GRAPH_ESTIMATE_READING = (
    "Reading: the estimate cost a forced retrieval step {:.0f}% of its speed at 1K and {:.0f}% "
    "at 8K with its layers synced ({:.2f}x KVCache against {:.2f}x without it at 1K, {:.2f}x "
    "against {:.2f}x at 8K), {:.0f}% and {:.0f}% in the graph ({:.2f}x against {:.2f}x, {:.2f}x "
    "against {:.2f}x; the synced step in the same run {:.2f}x and {:.2f}x). The probe then timed "
    "the estimate on every layer at {:.2f}x the speed without it ({:.2f}x in the last probe) and "
    "runs it on {} of 30 layers ({} before). With those, at 1K-8K, retrieval forced decoded at "
    "{:.2f}x, {:.2f}x, {:.2f}x and {:.2f}x KVCache in the graph, {:.2f}x, {:.2f}x, {:.2f}x and "
    "{:.2f}x synced; the default at {:.2f}x (exact below {:,} tokens), {:.2f}x, {:.2f}x and "
    "{:.2f}x. A forced step at 1K took {:.2f}x KVCache's time"
)


def host_run(context: int, method: str, run: str = "decode_host_f25m17.json") -> dict:
    """One row of the decode run on the host named by its model numbers."""
    return next(r for r in j(run)["results"] if (r["context"], r["method"]) == (context, method))


def step_ms_over_kvcache(run: str) -> tuple[float, float]:
    """(ms a forced retrieval step takes beyond KVCache's, KVCache's ms) at 1K in a host run."""
    full, forced = (1e3 / host_run(1024, m, run)["tokens_per_s"] for m in ("full", "a2ats_eb0"))
    return round(forced - full, 1), round(full, 1)


def ab_ms(variant: str) -> float:
    """docs/benchmarks/host_step_ab_estimate.json: a variant's median ms a step."""
    return j("host_step_ab_estimate.json")["ms_per_step"][variant]


def profile_phase(run: str, context: int, phase: str) -> float:
    """A phase's ms per layer in a `bench decode --profile` run."""
    row = next(r for r in j(run)["results"] if r["context"] == context)
    return row["phases_ms_per_layer"][phase]


def cold_run(i: int) -> tuple[float, float, float]:
    """(warm, after a layer's weights, inside decode) ms of the host step's NumPy part, run i of
    host_step_cold_host_f25m17.json."""
    r = j("host_step_cold_host_f25m17.json")["runs"][i]
    whole = "whole NumPy part"
    return r["warm_ms"][whole], r["cold_ms"][whole], r["in_decode_ms_per_layer"]


def amd(context: int, method: str) -> float:
    """A method's median ratio to KVCache in the 2-core AMD EPYC host's decode run."""
    return next(
        r["ratio_median"]
        for r in j("decode_amd_epyc.json")["results"]
        if r["context"] == context and r["method"] == method
    )


def first_context_at_full_speed() -> int:
    """The crossover rule on decode_v2.json: the first context from which retrieval from the
    first step is at least as fast as KVCache at every larger one."""
    rows = {
        r["context"]: r["speed_vs_full"]
        for r in j("decode_v2.json")["results"]
        if r["method"] == "a2ats_eb0_noest"
    }
    contexts = sorted(rows)
    return next(c for i, c in enumerate(contexts) if all(rows[x] >= 1 for x in contexts[i:]))


# (file, phrase with format fields, the recorded values it renders): the phrase must occur in
# the file's text (whitespace runs read as one space; in .py files, the string constants).
FIGURES: list[tuple[str, str, Callable[[], tuple]]] = [
    # README: the demo codebook and the sweep it was chosen from
    ("README.md", "{:.0f} MiB in memory, calibrated in {:.0f} s",
     lambda: (default_codebook()["codebook_bytes"] / 2**20, default_codebook()["calib_seconds"])),
    ("README.md", "recall was flat ({:.3f}-{:.3f}) while memory ({:.0f}-{:.0f} MiB) and fit "
     "time ({:.0f}-{:.0f} s)",
     lambda: (min(r["recall"] for r in codebook_rows()), max(r["recall"] for r in codebook_rows()),
              min(r["codebook_bytes"] for r in codebook_rows()) / 2**20,
              max(r["codebook_bytes"] for r in codebook_rows()) / 2**20,
              min(r["fit_seconds"] for r in codebook_rows()),
              max(r["fit_seconds"] for r in codebook_rows()))),
    # the demo codebook's sizing (calibrate.DEMO_SIZING)
    ("a2ats_engine/calibration/calibrate.py", "recall was {:.3f}-{:.3f} from 256 to 4096 centroids; "
     "output error fell only from {:.3f} (512) to {:.3f} (4096) while the codebook held in memory "
     "went from {:.0f} to {:.0f} MiB and the fit from {:.0f} to {:.0f} s. 12288 tokens rather than "
     "6144 lower the held-out score error from {:.4f} to {:.4f} for about {:.0f} s more",
     lambda: (min(r["recall"] for r in codebook_rows()), max(r["recall"] for r in codebook_rows()),
              default_codebook()["output_rel_error"], sweep_row(4096, 12288)["output_rel_error"],
              default_codebook()["codebook_bytes"] / 2**20,
              sweep_row(4096, 12288)["codebook_bytes"] / 2**20,
              default_codebook()["fit_seconds"], sweep_row(4096, 12288)["fit_seconds"],
              sweep_row(512, 6144)["heldout_score_error"], default_codebook()["heldout_score_error"],
              default_codebook()["calib_seconds"] - sweep_row(512, 6144)["calib_seconds"])),
    # README: K/V storage in the settings
    ("README.md", "(ppl {:.3f}x full attention against {:.3f}x with float K/V, for {:.2f}x the "
     "bytes)",
     lambda: (ev("eval_4k_kv8.json", "a2ats", "ppl_vs_full"),
              ev("eval_4k_kv_float.json", "a2ats", "ppl_vs_full"),
              per_token("a2ats_kv8")["bytes_per_token"] / per_token("a2ats")["bytes_per_token"])),
    # README: the crossover and the limitations
    ("README.md", "(`exact_below`: {:,} tokens for the demo model on the 2-core AMD EPYC host of "
     "the current figures, {:,} on another 2-core host",
     lambda: (j("crossover_demo.json")["exact_below"], first_context_at_full_speed())),
    ("README.md", "so at 8K it is {:.2f}x KVCache on one host, {:.2f}x on another and "
     "{:.2f}-{:.2f}x on a third (two runs)",
     lambda: (amd(8192, "a2ats"), speed("decode_v2.json", 8192, "a2ats_noest"),
              *host_now(8192, "a2ats"))),
    ("README.md", "on a third (AMD EPYC family 25 model 17, crossover 8K) {:.2f}x at 1K and "
     "{:.2f}-{:.2f}x at 8K over two runs, retrieval forced {:.2f}-{:.2f}x at 1K",
     lambda: (host_run(1024, "a2ats")["ratio_median"], *host_now(8192, "a2ats"),
              *host_now(1024, "a2ats_eb0"))),
    ("docs/BENCHMARKS.md", "gave {:.2f}x at 8K ({:.2f}-{:.2f}) and retrieval forced {:.2f}x at 1K",
     lambda: (host_run(8192, "a2ats", RERUN)["ratio_median"],
              *host_run(8192, "a2ats", RERUN)["ratio_spread"],
              host_run(1024, "a2ats_eb0", RERUN)["ratio_median"])),
    ("README.md", "forced from the first step it decodes at {:.2f}x KVCache at 1K on a 2-core AMD "
     "EPYC host",
     lambda: (amd(1024, "a2ats_eb0"),)),
    ("README.md", "the default measured {:.2f}x, {:.2f}x and {:.2f}x KVCache at 1K, 4K and 8K; on "
     "another 2-core host (crossover 4K) {:.2f}-{:.2f}x up to 4K and {:.2f}x at 8K",
     lambda: (amd(1024, "a2ats"), amd(4096, "a2ats"), amd(8192, "a2ats"),
              min(shipped_below_8k()), max(shipped_below_8k()),
              speed("decode_v2.json", 8192, "a2ats_noest"))),
    ("README.md", "so the first token took {:.2f}x KVCache's time at 1K tokens, {:.2f}x at 4K "
     "and {:.2f}x at 8K",
     lambda: tuple(r["ratio_median"] for r in j("prefill.json")["results"] if "ratio_median" in r)),
    # the estimate's default: on where measured to cost nothing (the threshold, in code)
    ("README.md", "where that keeps at least {:.2f}x the speed of a step", estimate_free),
    ("a2ats_engine/cache/config.py", "with it on every layer at >= {:.2f}x the",
     estimate_free),
    ("app/dialogs/settings_dialog.py", "timed it at {:.2f}x the speed or more", estimate_free),
    # the estimate on the layers that miss most: the default's quality and speed on the demo
    ("README.md", "the demo ran it on {} of its 30 layers with the NumPy host step, for "
     "perplexity {:.3f}x full at 4K instead of {:.3f}x without it and {:.3f}x on every layer",
     lambda: (j("crossover_demo_estimate_layers.json")["estimate"]["layers"],
              *(pooled("eval_4k_texts_estimate_layers.json", m, "ppl_vs_full")
                for m in ("a2ats_estimate_top11", "a2ats", "a2ats_estimate_mean")))),
    ("README.md", "retrieval step's speed at 8K of {:.2f}x KVCache's, as without it",
     lambda: (speed_ratio("decode_estimate_layers.json", 8192, "a2ats_eb0"),)),
    ("app/dialogs/settings_dialog.py", "CPU {} of the demo's 30; on {}, perplexity {:.3f}x full "
     "at 4K instead of {:.3f}x",
     lambda: (j("crossover_demo_native_step.json")["estimate"]["layers"],
              j("crossover_demo_estimate_layers.json")["estimate"]["layers"],
              *(pooled("eval_4k_texts_estimate_layers.json", m, "ppl_vs_full")
                for m in ("a2ats_estimate_top11", "a2ats")))),
    ("README.md", "host step, which attends with the estimate in C++ too, on {} in its latest "
     "probe (not evaluated on {}; that probe's runs timed the estimate at {:.2f}x to {:.2f}x",
     lambda: (j("crossover_demo_native_step.json")["estimate"]["layers"],
              j("crossover_demo_native_step.json")["estimate"]["layers"],
              min(j("crossover_demo_native_step.json")["estimate"]["ratio_runs"]),
              max(j("crossover_demo_native_step.json")["estimate"]["ratio_runs"]))),
    # the estimate inside the graph: its cost, synced and in the graph
    ("docs/ARCHITECTURE.md", "on the {} layers the probe chose on the family 25 model 1 host it "
     "cost a retrieval step {:.0f}% of its speed at 1K and {:.0f}% at 8K, where synced it cost "
     "{:.0f}% and {:.0f}%",
     lambda: (j(GRAPH_PROBE)["estimate"]["layers"],
              *(graph_estimate_cost(GRAPH_ESTIMATE, n) for n in (1024, 8192)),
              *(graph_estimate_cost(GRAPH_ESTIMATE_BEFORE, n) for n in (1024, 8192)))),
    # the estimate on the layers that miss most: how many the AMD host's probe affords
    ("docs/ARCHITECTURE.md", "{} of the demo's 30 on a 2-core AMD EPYC family 25 model 17 host "
     "with the C++ host step, {} there with the NumPy one, {} on a family 25 model 1 host with the "
     "synced C++ step, {} there with the step inside MLX's graph, {} there with the estimate "
     "in the graph too and {} in the next probe of the same step",
     lambda: (j("crossover_demo_native_step.json")["estimate"]["layers"],
              j("crossover_demo_estimate_layers.json")["estimate"]["layers"],
              j(F25M1_ONE_PROBE)["estimate"]["layers"], j(GRAPH_PROBE)["estimate"]["layers"],
              j(GRAPH_ESTIMATE_PROBE)["estimate"]["layers"],
              j("crossover_demo_host_check_f25m1.json")["estimate"]["layers"])),
    ("a2ats_engine/commands/crossover.py", "where it keeps at least {:.2f}x the speed",
     estimate_free),
    # BENCHMARKS "The host step in C++": the same runs, C++ step against NumPy step
    ("docs/BENCHMARKS.md", "C++ step against NumPy step in the same runs: {:.2f}x KVCache "
     "against {:.2f}x at 1K, {:.2f}x against {:.2f}x at 2K, {:.2f}x against {:.2f}x at 4K and "
     "{:.2f}x against {:.2f}x at 8K. Without the estimate: {:.2f}x against {:.2f}x at 1K, "
     "{:.2f}x against {:.2f}x at 8K",
     lambda: (*(speed_ratio("decode_native_step.json", n, m) for n in (1024, 2048, 4096, 8192)
                for m in ("a2ats_eb0", "a2ats_eb0_npstep")),
              *(speed_ratio("decode_native_step_noest.json", n, m) for n in (1024, 8192)
                for m in ("a2ats_eb0_noest", "a2ats_eb0_noest_npstep")))),
    ("docs/BENCHMARKS.md", "{:.2f}x KVCache's time without the estimate ({:.2f}x with the NumPy "
     "step in the same run), {:.2f}x with it on {} layers ({:.2f}x)",
     lambda: (1 / speed_ratio("decode_native_step_noest.json", 1024, "a2ats_eb0_noest"),
              1 / speed_ratio("decode_native_step_noest.json", 1024, "a2ats_eb0_noest_npstep"),
              1 / speed_ratio("decode_native_step.json", 1024, "a2ats_eb0"),
              j("crossover_demo_native_step.json")["estimate"]["layers"],
              1 / speed_ratio("decode_native_step.json", 1024, "a2ats_eb0_npstep"))),
    ("docs/BENCHMARKS.md", "1.2x target is met without the estimate and missed by {:.0f}% with it. "
     "Of a layer's step at 1K the C++ call is {:.2f} ms in the profile (exact attention over the "
     "layer {:.2f} ms); the estimate's attention, its second C++ call, takes {:.2f} ms a step over "
     "its {} layers",
     lambda: (100 * (1 / speed_ratio("decode_native_step.json", 1024, "a2ats_eb0") / 1.2 - 1),
              native_profile(1024)["phases_ms_per_layer"]["native step"],
              native_profile(1024)["exact_attention_ms_per_layer"],
              native_profile(1024)["phases_ms_per_step"]["attention"],
              j("crossover_demo_native_step.json")["estimate"]["layers"])),
    ("docs/BENCHMARKS.md", "sends this host into retrieval from {:,} tokens: retrieval timed {:.2f}x "
     "KVCache at 2K, {:.2f}x at 4K and {:.2f}x at 8K on synthetic caches, times {:.2f} for the "
     "estimate on {} of {} layers ({:.2f}x on all of them)",
     lambda: (j("crossover_demo_native_step.json")["exact_below"],
              *(j("crossover_demo_native_step.json")["ratios"][str(n)] for n in (2048, 4096, 8192)),
              1 - j("crossover_demo_native_step.json")["estimate"]["layers"]
              / j("crossover_demo_native_step.json")["a2ats_layers"]
              * (1 - j("crossover_demo_native_step.json")["estimate"]["ratio"]),
              j("crossover_demo_native_step.json")["estimate"]["layers"],
              j("crossover_demo_native_step.json")["a2ats_layers"],
              j("crossover_demo_native_step.json")["estimate"]["ratio"])),
    ("docs/BENCHMARKS.md", "{} of 30 in this probe, whose three runs timed the estimate on every "
     "layer at {:.2f}x, {:.2f}x and {:.2f}x",
     lambda: (j("crossover_demo_native_step.json")["estimate"]["layers"],
              *j("crossover_demo_native_step.json")["estimate"]["ratio_runs"])),
    ("docs/BENCHMARKS.md", "(12.8 us a call warm, {:.1f} with the writes, {:.1f} in a decode) and "
     "about half of the call's ({:.1f}, {:.1f}, {:.1f})",
     lambda: (caches_us("flushed_loop", "python"), caches_us("in_decode", "python"),
              caches_us("warm_loop", "call"), caches_us("flushed_loop", "call"),
              caches_us("in_decode", "call"))),
    ("docs/BENCHMARKS.md", "Reading: {:.2f}x KVCache ({:.2f}-{:.2f}) with the C++ step against "
     "{:.2f}x ({:.2f}-{:.2f}) with the NumPy",
     lambda: tuple(
         x for m in ("a2ats_eb0", "a2ats_eb0_npstep")
         for x in (speed_ratio("decode_gemma3_270m_native_step.json", 8192, m),
                   *decode_spread("decode_gemma3_270m_native_step.json", 8192, m)))),
    ("docs/BENCHMARKS.md", "The default as shipped: {:.2f}x KVCache at 1K, {:.2f}x at 2K, {:.2f}x "
     "at 4K",
     lambda: tuple(speed_ratio("decode_native_step.json", n, "a2ats") for n in (1024, 2048, 4096))),
    # README: the C++ step on two hosts
    ("README.md", "with the C++ step {:.2f}x on the third and {:.2f}x on a fourth",
     lambda: (speed_ratio("decode_native_step.json", 8192, "a2ats"),
              speed_ratio(F25M1_ONE, 8192, "a2ats"))),
    ("README.md", "the default decodes at {:.2f}x KVCache at 8K; on a fourth (AMD EPYC family 25 "
     "model 1, crossover {}K), with the synced C++ step, at {:.2f}x KVCache at 1K (exact "
     "there; {:.2f}x before the decode keys' codes waited to be coded in batches), {:.2f}x at 4K "
     "and {:.2f}x at 8K",
     lambda: (speed_ratio("decode_native_step.json", 8192, "a2ats"),
              j(F25M1_ONE_PROBE)["exact_below"] // 1024,
              speed_ratio(EXACT_DEFAULT, 1024, "a2ats"),
              *(speed_ratio(F25M1_ONE, n, "a2ats") for n in (1024, 4096, 8192)))),
    ("docs/BENCHMARKS.md", "with the C++ step {:.2f}x on the family 25 model 17 host and {:.2f}x "
     "on a family 25 model 1 host, where a forced step at 1K is {:.2f}x KVCache",
     lambda: (speed_ratio("decode_native_step.json", 8192, "a2ats"),
              speed_ratio(F25M1_ONE, 8192, "a2ats"), speed_ratio(F25M1_ONE, 1024, "a2ats_eb0"))),
    ("docs/BENCHMARKS.md", "there, with the step inside MLX's graph, {:.2f}x and {:.2f}x in two "
     "runs, a forced step at 1K {:.2f}x and {:.2f}x",
     lambda: (*(speed_ratio(run, 8192, "a2ats") for run in (GRAPH, GRAPH_RERUN)),
              *(speed_ratio(run, 1024, "a2ats_eb0") for run in (GRAPH, GRAPH_RERUN)))),
    ("README.md", "({:.2f}-{:.2f}; {:.2f}x in a rerun), retrieval forced at 1K at {:.2f}x (a step "
     "{:.2f}x KVCache's time; {:.2f}x in the rerun)",
     lambda: (*decode_spread(F25M1_ONE, 8192, "a2ats"), speed_ratio(F25M1_ONE_RERUN, 8192, "a2ats"),
              speed_ratio(F25M1_ONE, 1024, "a2ats_eb0"),
              1 / speed_ratio(F25M1_ONE, 1024, "a2ats_eb0"),
              1 / speed_ratio(F25M1_ONE_RERUN, 1024, "a2ats_eb0"))),
    # BENCHMARKS "The far scores kept in one pass" (family 25 model 1, the step as it is now)
    ("docs/BENCHMARKS.md", "the default {:.2f}x at 1K and {:.2f}x at 8K ({:.2f}-{:.2f}); forced "
     "{:.2f}x at 1K (a step {:.2f}x KVCache's time) and {:.2f}x at 8K",
     lambda: (speed_ratio(F25M1_ONE_RERUN, 1024, "a2ats"),
              speed_ratio(F25M1_ONE_RERUN, 8192, "a2ats"),
              *decode_spread(F25M1_ONE_RERUN, 8192, "a2ats"),
              speed_ratio(F25M1_ONE_RERUN, 1024, "a2ats_eb0"),
              1 / speed_ratio(F25M1_ONE_RERUN, 1024, "a2ats_eb0"),
              speed_ratio(F25M1_ONE_RERUN, 8192, "a2ats_eb0"))),
    ("docs/BENCHMARKS.md", "The default as shipped: {:.2f}x KVCache at 1K (exact there; "
     "{:.2f}-{:.2f} over the runs), {:.2f}x at 2K, {:.2f}x at 4K and **{:.2f}x at 8K "
     "({:.2f}-{:.2f})**. KVCache decoded at {:.2f} tok/s at 1K and {:.2f} at 8K in these runs, "
     "against {:.2f} and {:.2f} in the previous step's",
     lambda: (speed_ratio(F25M1_ONE, 1024, "a2ats"), *decode_spread(F25M1_ONE, 1024, "a2ats"),
              *(speed_ratio(F25M1_ONE, n, "a2ats") for n in (2048, 4096, 8192)),
              *decode_spread(F25M1_ONE, 8192, "a2ats"),
              *(host_run(n, "full", F25M1_ONE)["tokens_per_s"] for n in (1024, 8192)),
              *(host_run(n, "full", F25M1)["tokens_per_s"] for n in (1024, 8192)))),
    ("docs/BENCHMARKS.md", FORCED_VS_NUMPY + ". Without the estimate: {:.2f}x against {:.2f}x at "
     "1K (a step {:.2f}x KVCache's time), {:.2f}x against {:.2f}x at 8K",
     lambda: (*forced_vs_numpy(F25M1_ONE),
              speed_ratio(F25M1_ONE_NOEST, 1024, "a2ats_eb0_noest"),
              speed_ratio(F25M1_ONE_NOEST, 1024, "a2ats_eb0_noest_npstep"),
              1 / speed_ratio(F25M1_ONE_NOEST, 1024, "a2ats_eb0_noest"),
              speed_ratio(F25M1_ONE_NOEST, 8192, "a2ats_eb0_noest"),
              speed_ratio(F25M1_ONE_NOEST, 8192, "a2ats_eb0_noest_npstep"))),
    ("docs/BENCHMARKS.md", "the NumPy step, unchanged, {:.2f}x and now {:.2f}x at 8K; the C++ "
     "step forced {:.2f}x ({:.2f}x in the rerun) and now {:.2f}x; the default {:.2f}x in both "
     "runs and now {:.2f}x",
     lambda: (speed_ratio(F25M1, 8192, "a2ats_eb0_npstep"),
              speed_ratio(F25M1_ONE, 8192, "a2ats_eb0_npstep"),
              speed_ratio(F25M1, 8192, "a2ats_eb0"), speed_ratio(F25M1_RERUN, 8192, "a2ats_eb0"),
              speed_ratio(F25M1_ONE, 8192, "a2ats_eb0"), speed_ratio(F25M1, 8192, "a2ats"),
              speed_ratio(F25M1_ONE, 8192, "a2ats"))),
    ("docs/BENCHMARKS.md", "The probe: retrieval {:.2f}x, {:.2f}x, {:.2f}x and {:.2f}x KVCache at "
     "1K-8K, exact below {:,}; the estimate on every layer {:.2f}x ({:.2f}, {:.2f}, {:.2f} over {} "
     "steps each) -> {} of 30 layers",
     lambda: (*(j(F25M1_ONE_PROBE)["ratios"][str(n)] for n in (1024, 2048, 4096, 8192)),
              j(F25M1_ONE_PROBE)["exact_below"], j(F25M1_ONE_PROBE)["estimate"]["ratio"],
              *j(F25M1_ONE_PROBE)["estimate"]["ratio_runs"],
              j(F25M1_ONE_PROBE)["estimate"]["steps"], j(F25M1_ONE_PROBE)["estimate"]["layers"])),
    ("docs/BENCHMARKS.md", "The profile: the C++ call {:.2f} ms a layer at 1K and {:.2f} ms at 8K, "
     "against {:.2f} and {:.2f} ms with the previous step; with retrieval on every layer an A2ATS "
     "step at 8K is {:.2f}x KVCache's speed",
     lambda: (f25m1_profile(1024, suffix="_one_pass")["phases_ms_per_layer"]["native step"],
              f25m1_profile(8000, suffix="_one_pass")["phases_ms_per_layer"]["native step"],
              f25m1_profile(1024)["phases_ms_per_layer"]["native step"],
              f25m1_profile(8000)["phases_ms_per_layer"]["native step"],
              f25m1_profile(8000, suffix="_one_pass")["a2ats_vs_kvcache"])),
    ("docs/BENCHMARKS.md", "no Gemma probe on this host): {:.2f}x KVCache ({:.2f}-{:.2f}) with the "
     "C++ step against {:.2f}x ({:.2f}-{:.2f}) with the NumPy step, where the previous step's run "
     "measured {:.2f}x and {:.2f}x",
     lambda: (*(x for m in ("a2ats_eb0", "a2ats_eb0_npstep")
                for x in (speed_ratio(F25M1_ONE_GEMMA, 8192, m),
                          *decode_spread(F25M1_ONE_GEMMA, 8192, m))),
              speed_ratio(F25M1_GEMMA, 8192, "a2ats_eb0"),
              speed_ratio(F25M1_GEMMA, 8192, "a2ats_eb0_npstep"))),
    ("docs/BENCHMARKS.md", "Reading: retrieval forced at 1K took the graph step to {:.2f}x and "
     "{:.2f}x KVCache's speed in the two runs, the synced step to {:.2f}x and {:.2f}x in the same "
     "runs: a step {:.2f}x and {:.2f}x KVCache's time, where the synced one was {:.2f}x and "
     "{:.2f}x. At 8K the graph step {:.2f}x and {:.2f}x, the synced {:.2f}x and {:.2f}x; the "
     "default {:.2f}x and {:.2f}x (the estimate on {} of 30 layers, each keeping its sync). The "
     "probe measured retrieval at {:.2f}x KVCache at 1K (the synced step's last probe here: "
     "{:.2f}x) and {:.2f}x at 8K ({:.2f}x); its crossover stays at {:,} tokens. With the estimate "
     "off on every layer (the harness), the graph step took {:.2f}x KVCache's time at 1K and "
     "{:.2f}x at 8K, the synced step {:.2f}x and {:.2f}x",
     graph_reading),
    ("docs/BENCHMARKS.md", GRAPH_ESTIMATE_READING, graph_estimate_reading),
    ("docs/BENCHMARKS.md", "On the {} layers, run last, the estimate cost a forced step {:.0f}% "
     "at 1K and {:.0f}% at 8K in the graph, {:.0f}% and {:.0f}% synced in the same run ({:.2f}x "
     "and {:.2f}x KVCache against {:.2f}x without it at 1K, {:.2f}x and {:.2f}x against {:.2f}x "
     "at 8K; the 1K spreads are wide, {:.2f}-{:.2f} and {:.2f}-{:.2f})",
     lambda: (
         j(GRAPH_ESTIMATE_PROBE)["estimate"]["layers"],
         *(graph_estimate_cost(GRAPH_ESTIMATE_12, n) for n in (1024, 8192)),
         *(graph_estimate_cost(GRAPH_ESTIMATE_12, n, "a2ats_eb0_sync") for n in (1024, 8192)),
         *(speed_ratio(GRAPH_ESTIMATE_12, n, m) for n in (1024, 8192)
           for m in ("a2ats_eb0", "a2ats_eb0_sync", "a2ats_eb0_noest")),
         *decode_spread(GRAPH_ESTIMATE_12, 1024, "a2ats_eb0"),
         *decode_spread(GRAPH_ESTIMATE_12, 1024, "a2ats_eb0_sync"),
     )),
    ("docs/BENCHMARKS.md", "In the profile a forced A2ATS step took {:.2f}x KVCache's speed at "
     "1K and {:.2f}x at 8K, the graph step {:.2f} ms a layer at 1K against {:.2f} ms of exact "
     "attention over the layer, {:.2f} ms against {:.2f} ms at 8K",
     lambda: tuple(
         x for r in (profile_row(GRAPH_ESTIMATE_PROFILE, n) for n in (1024, 8000))
         for x in (r["a2ats_vs_kvcache"],)
     ) + tuple(
         x for r in (profile_row(GRAPH_ESTIMATE_PROFILE, n) for n in (1024, 8000))
         for x in (r["phases_ms_per_layer"]["graph step"], r["exact_attention_ms_per_layer"])
     )),
    ("docs/BENCHMARKS.md", "At 1K-8K (the third run) the graph step {:.2f}x, {:.2f}x, {:.2f}x "
     "and {:.2f}x KVCache, the synced step {:.2f}x, {:.2f}x, {:.2f}x and {:.2f}x; the default "
     "{:.2f}x (exact below the crossover), {:.2f}x, {:.2f}x and {:.2f}x",
     lambda: tuple(speed_ratio(GRAPH_LADDER, n, m) for m in ("a2ats_eb0", "a2ats_eb0_sync", "a2ats")
                   for n in (1024, 2048, 4096, 8192))),
    ("docs/BENCHMARKS.md", "(on Gemma 3 270M, with 3 retrieving layers, none: {:.2f}x KVCache at "
     "8K in the graph, {:.2f}x synced); the profile's A2ATS step at 1K, retrieval forced, took "
     "{:.2f}x KVCache's speed",
     lambda: (speed_ratio(GRAPH_GEMMA, 8192, "a2ats_eb0"),
              speed_ratio(GRAPH_GEMMA, 8192, "a2ats_eb0_sync"),
              next(r for r in j(GRAPH_PROFILE)["results"] if r["context"] == 1024)[
                  "a2ats_vs_kvcache"])),
    ("docs/BENCHMARKS.md", "Reading (the Hosts table's last two rows): retrieval forced at 1K "
     "{:.2f}x KVCache ({:.2f}-{:.2f}) and {:.2f}x ({:.2f}-{:.2f}) in the two runs, against {:.2f}x "
     "and {:.2f}x with the ctypes call in the two runs before it",
     lambda: (*(x for run in (PY_ENTRY, PY_ENTRY_RERUN)
                for x in (speed_ratio(run, 1024, "a2ats_eb0"),
                          *decode_spread(run, 1024, "a2ats_eb0"))),
              speed_ratio(F25M1_ONE, 1024, "a2ats_eb0"),
              speed_ratio(F25M1_ONE_RERUN, 1024, "a2ats_eb0"))),
    ("docs/BENCHMARKS.md", "At 8K the default {:.2f}x and {:.2f}x, retrieval forced {:.2f}x and "
     "{:.2f}x",
     lambda: (*(speed_ratio(run, 8192, m) for m in ("a2ats", "a2ats_eb0")
                for run in (PY_ENTRY, PY_ENTRY_RERUN)),)),
    ("docs/BENCHMARKS.md", "Reading: with the inspector visible the demo decodes at {:.2f}x KVCache "
     "at 1K (exact, with the shadow selection; {:.2f}-{:.2f} over the runs), {:.2f}x at 2K and "
     "{:.2f}x at 8K (retrieving); the same command with the engine before this change (the stats "
     "made in the step, the MLX shadow selection) gave {:.2f}x, {:.2f}x and {:.2f}x",
     lambda: (speed_ratio(INSPECTOR, 1024, "a2ats_telemetry"),
              *decode_spread(INSPECTOR, 1024, "a2ats_telemetry"),
              speed_ratio(INSPECTOR, 2048, "a2ats_telemetry"),
              speed_ratio(INSPECTOR, 8192, "a2ats_telemetry"),
              *(speed_ratio(INSPECTOR_BEFORE, c, "a2ats_telemetry") for c in (1024, 2048, 8192)))),
    ("docs/BENCHMARKS.md", "Reading: the default {:.2f}x KVCache at 1K (exact there; {:.2f}-{:.2f} "
     "over the runs), {:.2f}x at 2K and {:.2f}x at 8K ({:.2f}-{:.2f}), where it retrieves",
     lambda: (speed_ratio(EXACT_DEFAULT, 1024, "a2ats"), *decode_spread(EXACT_DEFAULT, 1024, "a2ats"),
              speed_ratio(EXACT_DEFAULT, 2048, "a2ats"), speed_ratio(EXACT_DEFAULT, 8192, "a2ats"),
              *decode_spread(EXACT_DEFAULT, 8192, "a2ats"))),
    ("docs/BENCHMARKS.md", "The exact default at 1K ({:.2f}x here, {:.2f}x and {:.2f}x in the "
     "previous step's two runs)",
     lambda: (speed_ratio(F25M1_ONE, 1024, "a2ats"), speed_ratio(F25M1, 1024, "a2ats"),
              speed_ratio(F25M1_RERUN, 1024, "a2ats"))),
    ("docs/BENCHMARKS.md", "the default {:.2f}x at 1K and {:.2f}x at 8K ({:.2f}-{:.2f}); forced "
     "{:.2f}x at 1K, a step {:.2f}x KVCache's time, within the 1.2x target but not the first "
     "run's {:.2f}x",
     lambda: (speed_ratio(F25M1_RERUN, 1024, "a2ats"), speed_ratio(F25M1_RERUN, 8192, "a2ats"),
              *decode_spread(F25M1_RERUN, 8192, "a2ats"),
              speed_ratio(F25M1_RERUN, 1024, "a2ats_eb0"),
              1 / speed_ratio(F25M1_RERUN, 1024, "a2ats_eb0"),
              1 / speed_ratio(F25M1, 1024, "a2ats_eb0"))),
    # BENCHMARKS "A second host, and the step's other dots 8 rows at a time" (family 25 model 1)
    ("docs/BENCHMARKS.md", "retrieval forced at 1K {:.2f}x KVCache, the default {:.2f}x at 8K",
     lambda: (speed_ratio(F25M1_BEFORE, 1024, "a2ats_eb0"), speed_ratio(F25M1_BEFORE, 8192, "a2ats"))),
    ("docs/BENCHMARKS.md", "The default as shipped: {:.2f}x KVCache at 1K (exact there), {:.2f}x "
     "at 2K, {:.2f}x at 4K and **{:.2f}x at 8K ({:.2f}-{:.2f})**",
     lambda: (*(speed_ratio(F25M1, n, "a2ats") for n in (1024, 2048, 4096, 8192)),
              *decode_spread(F25M1, 8192, "a2ats"))),
    ("docs/BENCHMARKS.md", "KVCache decodes at {:.2f} tok/s at 1K and {:.2f} at 8K",
     lambda: tuple(host_run(n, "full", F25M1)["tokens_per_s"] for n in (1024, 8192))),
    ("docs/BENCHMARKS.md", FORCED_VS_NUMPY, lambda: forced_vs_numpy(F25M1)),
    ("docs/BENCHMARKS.md", "the NumPy step, unchanged, measured {:.2f}x at 8K in both; the C++ "
     "step forced went from {:.2f}x to {:.2f}x at 8K",
     lambda: (speed_ratio(F25M1, 8192, "a2ats_eb0_npstep"),
              speed_ratio(F25M1_BEFORE, 8192, "a2ats_eb0"), speed_ratio(F25M1, 8192, "a2ats_eb0"))),
    ("docs/BENCHMARKS.md", "The probe: exact below {:,}; the estimate on every layer {:.2f}x "
     "({:.2f}, {:.2f}, {:.2f} over {} steps each) -> {} of 30 layers",
     lambda: (j(F25M1_PROBE)["exact_below"], j(F25M1_PROBE)["estimate"]["ratio"],
              *j(F25M1_PROBE)["estimate"]["ratio_runs"], j(F25M1_PROBE)["estimate"]["steps"],
              j(F25M1_PROBE)["estimate"]["layers"])),
    ("docs/BENCHMARKS.md", "Without the estimate: {:.2f}x against {:.2f}x at 1K (a step {:.2f}x "
     "KVCache's time), {:.2f}x against {:.2f}x at 8K",
     lambda: (speed_ratio(F25M1_NOEST, 1024, "a2ats_eb0_noest"),
              speed_ratio(F25M1_NOEST, 1024, "a2ats_eb0_noest_npstep"),
              1 / speed_ratio(F25M1_NOEST, 1024, "a2ats_eb0_noest"),
              speed_ratio(F25M1_NOEST, 8192, "a2ats_eb0_noest"),
              speed_ratio(F25M1_NOEST, 8192, "a2ats_eb0_noest_npstep"))),
    ("docs/BENCHMARKS.md", "Gemma 3 270M at 8K, retrieval forced: {:.2f}x KVCache ({:.2f}-{:.2f}) "
     "with the C++ step against {:.2f}x ({:.2f}-{:.2f}) with the NumPy step",
     lambda: tuple(
         x for m in ("a2ats_eb0", "a2ats_eb0_npstep")
         for x in (speed_ratio(F25M1_GEMMA, 8192, m), *decode_spread(F25M1_GEMMA, 8192, m)))),
    ("docs/BENCHMARKS.md", "The profile: the C++ call {:.2f} ms a layer at 1K (exact attention "
     "over the layer {:.2f} ms) and {:.2f} ms at 8K, against {:.2f} and {:.2f} ms with the previous "
     "step on this host; the estimate's attention {:.2f} ms on each of its layers at 8K, against "
     "{:.2f}",
     lambda: (f25m1_profile(1024)["phases_ms_per_layer"]["native step"],
              f25m1_profile(1024)["exact_attention_ms_per_layer"],
              f25m1_profile(8000)["phases_ms_per_layer"]["native step"],
              f25m1_profile(1024, True)["phases_ms_per_layer"]["native step"],
              f25m1_profile(8000, True)["phases_ms_per_layer"]["native step"],
              f25m1_profile(8000)["phases_ms_per_step"]["attention"]
              / host_run(8192, "a2ats_eb0", F25M1)["estimate_layers"],
              f25m1_profile(8000, True)["phases_ms_per_step"]["attention"]
              / host_run(8192, "a2ats_eb0", F25M1_BEFORE)["estimate_layers"])),
    # BENCHMARKS "Hosts": the host named by its model numbers
    ("docs/BENCHMARKS.md", "where it attends exactly ({:.2f}x at 1K, {:.2f}x at 2K, {:.2f}x at 4K",
     lambda: tuple(host_run(n, "a2ats")["ratio_median"] for n in (1024, 2048, 4096))),
    ("docs/BENCHMARKS.md", "{:.2f}x at 8K where it retrieves ({:.2f}-{:.2f})",
     lambda: (host_run(8192, "a2ats")["ratio_median"], *host_run(8192, "a2ats")["ratio_spread"])),
    ("docs/BENCHMARKS.md", "Retrieval forced from the first step costs {:.2f}x KVCache's step time "
     "at 1K ({:.2f}x the speed)",
     lambda: (1 / host_run(1024, "a2ats_eb0")["ratio_median"],
              host_run(1024, "a2ats_eb0")["ratio_median"])),
    ("docs/BENCHMARKS.md", "per layer that leaves {:.2f} ms to code and store the key, {:.2f} ms "
     "for the one sync, {:.2f} ms for the lookup tables and {:.2f} ms for the rest of the NumPy "
     "step (the table above), against {:.2f} ms of exact attention",
     lambda: (*overhead_pieces("step_overhead_host_f25m17.json"),
              j("profile_step_host_f25m17.json")["results"][0]["exact_attention_ms_per_layer"])),
    ("docs/BENCHMARKS.md", "the estimate's cost a step went from {:.1f} to {:.1f} ms",
     lambda: tuple(ab_ms(v + "_estm") - ab_ms(v + "_noest") for v in ("then", "now"))),
    ("docs/BENCHMARKS.md", "keeps {:.3f}x the speed of one without instead of {:.3f}x",
     lambda: (j("host_step_ab_estimate.json")["estimate_speed_ratio"]["now"],
              j("host_step_ab_estimate.json")["estimate_speed_ratio"]["then"])),
    ("docs/BENCHMARKS.md", "the two steps are the same speed ({:.3f}x)",
     lambda: (j("host_step_ab_estimate.json")["now_vs_then_speed"]["noest"],)),
    ("docs/BENCHMARKS.md", "the step is as fast as before ({:.3f}x)",
     lambda: (j("host_step_ab_1k.json")["now_vs_then_speed"]["noest"],)),
    ("docs/BENCHMARKS.md", "with the estimate this step decodes at {:.3f}x the speed of the one "
     "before (medians of the rounds' ratios), without it at {:.3f}x",
     lambda: (j("host_step_ab_step_sums.json")["now_vs_then_speed"]["estm"],
              j("host_step_ab_step_sums.json")["now_vs_then_speed"]["noest"])),
    ("docs/BENCHMARKS.md", "with the estimate keeps {:.3f}x the speed of one without, against "
     "{:.3f}x for the step before",
     lambda: (j("host_step_ab_step_sums.json")["estimate_speed_ratio"]["now"],
              j("host_step_ab_step_sums.json")["estimate_speed_ratio"]["then"])),
    ("docs/BENCHMARKS.md", "gave them {:.2f} ms a layer in MLX", lambda: (overhead_pieces(
        "step_overhead_host_f25m17_before_host_tables.json")[2],)),
    ("docs/BENCHMARKS.md", "and {:.2f} ms in NumPy now (the sync {:.2f} ms in that run, {:.2f} ms "
     "in this)",
     lambda: (overhead_pieces("step_overhead_host_f25m17.json")[2],
              overhead_pieces("step_overhead_host_f25m17_before_host_tables.json")[1],
              overhead_pieces("step_overhead_host_f25m17.json")[1])),
    ("docs/BENCHMARKS.md", "top-K and rerank at 8K took {:.2f} ms a layer before it and {:.2f} ms "
     "after",
     lambda: tuple(profile_phase(f, 8000, "top-K + rerank") for f in (
         "profile_step_host_f25m17_before_sampled_topk.json",
         "profile_step_host_f25m17_before_host_tables.json"))),
    ("docs/BENCHMARKS.md", "the phase went from {:.2f} to {:.2f} ms a layer at 8K",
     lambda: tuple(profile_phase(f, 8000, "top-K + rerank") for f in (
         "profile_step_host_f25m17_before_sampled_topk.json",
         "profile_step_host_f25m17_before_host_tables.json"))),
    ("docs/BENCHMARKS.md", "Forced retrieval at 8K went {:.2f}x -> {:.2f}x -> {:.2f}x KVCache over "
     "the first three runs of the day ({:.2f}x in the rerun) and the crossover's 8K ratio "
     "{:.2f}x -> {:.2f}x -> {:.2f}x",
     lambda: (*(host_run(8192, "a2ats_eb0", f)["ratio_median"] for f in (*HOST_DAY, RERUN)),
              *(j(f"crossover_demo_host_f25m17{x}.json")["ratios"]["8192"]
                for x in ("_before_sampled_topk", "_before_host_tables", "")))),
    ("docs/BENCHMARKS.md", "the rerun: {:.1f} ms more than {:.1f} ms)",
     lambda: step_ms_over_kvcache(RERUN)),
    ("docs/BENCHMARKS.md", "over the first three runs of the day ({:.2f}x in the rerun)",
     lambda: (host_run(8192, "a2ats_eb0", RERUN)["ratio_median"],)),
    ("docs/BENCHMARKS.md", "with the lookup tables also in NumPy a forced step there decodes 8K at "
     "{:.2f}x KVCache", lambda: (host_run(8192, "a2ats_eb0")["ratio_median"],)),
    ("docs/BENCHMARKS.md", "{:.1f} ms a step more than KVCache's {:.1f} ms, against {:.1f} ms more "
     "than {:.1f} ms in the first run of the day",
     lambda: (*step_ms_over_kvcache("decode_host_f25m17.json"),
              *step_ms_over_kvcache(HOST_DAY[0]))),
    ("docs/BENCHMARKS.md", "at 1K {:.2f} ms a layer warm, {:.2f} ms right after one layer's "
     "weights passed through the caches, {:.2f} ms inside decode steps ({:.2f}x warm; {:.2f}x "
     "at 8K)",
     lambda: (*cold_run(0)[:3], cold_run(0)[2] / cold_run(0)[0], cold_run(1)[2] / cold_run(1)[0])),
    ("docs/BENCHMARKS.md", "KVCache's own speed at 8K ({:.1f}-{:.1f} tok/s on the AMD runs",
     lambda: (min(amd_kvcache_8k()), max(amd_kvcache_8k()))),
    # ARCHITECTURE and A2ATSConfig: the estimate's quality and its decode cost
    ("docs/ARCHITECTURE.md", "at 4K it gives {:.3f}x full pooled against {:.3f}x with (bucket, "
     "code) slots (`eval_4k_texts_estimate_left.json`), for {}% of a retrieval step's speed at "
     "8K against {}%", estimate_code_effect),
    ("docs/ARCHITECTURE.md", "the attention-output error from {:.3f} to {:.3f} (below oracle "
     "top-K's {:.3f}) and perplexity from {:.3f}x to {:.3f}x full",
     estimate_effect),
    ("docs/BENCHMARKS.md", "layer's sums move at once (`cache/step_sums.py`) it costs {1}% at 1K and "
     "{0}% at 8K", estimate_cost_now),
    ("docs/ARCHITECTURE.md", "with mean slot scores it costs about {1}% of a retrieval step's "
     "speed at 1K and {0}% at 8K (`decode_quality_preset.json`", estimate_cost_now),
    ("docs/ARCHITECTURE.md", "before every layer's sums moved at once: {}% and {}%; {}% and {}% "
     "with every slot held", estimate_rows_gain),
    ("docs/ARCHITECTURE.md", "centroid slot scores cost {}% in an earlier run",
     lambda: estimate_scores_cost()[1:]),
    ("docs/BENCHMARKS.md", "the mean-scored estimate then cost {}% of a retrieval step's speed at "
     "1K and {}% at 8K, against {}% and {}% with every slot held", estimate_rows_gain),
    ("docs/BENCHMARKS.md", "the estimate now costs about {}% of a retrieval step at both contexts",
     estimate_cost_percent),
    ("a2ats_engine/cache/config.py", "Default 2: recall {:.3f} -> {:.3f} of the attention mass, "
     "ppl {:.3f}x -> {:.3f}x full at 4K / budget 0.03 on the demo model",
     lambda: (ev("eval_4k_b003.json", "a2ats_no_rerank", "recall"),
              ev("eval_4k_b003.json", "a2ats", "recall"),
              ev("eval_4k_b003.json", "a2ats_no_rerank", "ppl_vs_full"),
              ev("eval_4k_b003.json", "a2ats", "ppl_vs_full"))),
    ("a2ats_engine/cache/config.py", "Output error {:.3f} -> {:.3f} (below oracle top-K's {:.3f}), "
     "ppl {:.3f}x -> {:.3f}x full at 4K / budget 0.03 on the demo model",
     estimate_effect),
    ("a2ats_engine/cache/config.py", "In the host step it costs about {}% of a retrieval step's "
     "speed at 8K with mean slot scores", estimate_cost_now),
    ("app/dialogs/settings_dialog.py", "for a slower retrieval step (about {}% at 8K on a 2-core "
     "CPU)", estimate_cost_now),
    # the built-in crossover row (`a2ats info` prints its source)
    ("a2ats_engine/cache/crossover.py", "(a2ats_eb0_noest) {:.2f}x full at 2K, {:.2f}x at 4K, "
     "{:.2f}x at 8K, median of 3 runs (docs/benchmarks/decode_v2.json)",
     lambda: tuple(speed("decode_v2.json", c, "a2ats_eb0_noest") for c in (2048, 4096, 8192))),
    # the settings dialog
    ("app/dialogs/settings_dialog.py", "ppl {:.3f}x full attention. 8-bit: {:.2f}x an fp16 cache, "
     "ppl {:.3f}x; decodes more slowly on a CPU (dequantization). 4-bit: {:.2f}x an fp16 cache, "
     "ppl {:.3f}x.",
     lambda: (ev("eval_4k_kv_float.json", "a2ats", "ppl_vs_full"),
              per_token("a2ats_kv8")["vs_fp16_full"],
              ev("eval_4k_kv8.json", "a2ats", "ppl_vs_full"),
              per_token("a2ats_kv4")["vs_fp16_full"],
              ev("eval_4k_kv4.json", "a2ats", "ppl_vs_full"))),
    ("README.md", "at 8K on the demo model perplexity {0:.3f}x full attention instead of {1:.3f}x "
     "(three texts) and the multi-value needles at {4:.2f}x full's score ({5:d} prompts; its "
     "answers are full attention's word for word on {6:d}% of them, rerank 4 alone's on {7:d}%)",
     quality_preset),
    ("README.md", "(18 prompts each; rerank 4 alone {0:.2f}x on multi-key)", quality_4k),
    ("docs/BENCHMARKS.md", "on the 18 prompts: UUIDs {1:.2f}x ({2:.2f}-{3:.2f}), multi-key and "
     "multi-value 1.00x", quality_4k),
    ("README.md", "variable tracking at {1:.2f}x full ({2:.2f}-{3:.2f}; rerank 4 alone {4:.2f}x, "
     "{9:d} prompts, its answers full's on {7:d}% against {8:d}%)", quality_8k_vt24),
    ("docs/BENCHMARKS.md", "Reading: on 24 prompts full attention scores {0:.2f}", quality_8k_vt24),
    ("docs/BENCHMARKS.md", "and rerank 4 alone {4:.2f}x full ({5:.2f}-{6:.2f}), *Quality* {1:.2f}x "
     "({2:.2f}-{3:.2f})", quality_8k_vt24),
    ("docs/BENCHMARKS.md", "word on {7:d}% of the 24 (rerank 4 alone {8:d}%)", quality_8k_vt24),
    ("docs/BENCHMARKS.md", "variable tracking {1:.2f}x ({2:.2f}-{3:.2f}, {9:d} prompts), against "
     "rerank 4 alone's 1.00x and {4:.2f}x", quality_8k_vt24),
    ("docs/BENCHMARKS.md", "multi-value 0.92x (18 prompts) and variable tracking {0:.2f}x",
     quality_8k_others),
    ("README.md", "decodes at {2:.2f}x KVCache's speed at 8K on a 2-core CPU instead of {3:.2f}x "
     "(the estimate costs {8:d}% of it)", quality_preset),
    ("README.md", "subspace's code): perplexity {:.3f}x -> {:.3f}x full at 4K and {:.3f}x -> "
     "{:.3f}x at 8K (three texts",
     lambda: tuple(pooled(f"eval_gemma3_270m_{n}k_texts_pq_estimate.json", m, "ppl_vs_full")
                   for n in (4, 8) for m in ("a2ats", "a2ats_estimate_mean"))),
    ("README.md", "at 8K: {:.2f}x KVCache without it, {:.2f}x with it, 2-core CPU)",
     lambda: (speed_ratio("decode_gemma3_270m_estimate.json", 8192, "a2ats_eb0"),
              speed_ratio("decode_gemma3_270m_estimate.json", 8192, "a2ats_eb0_estm"))),
    ("a2ats_engine/cache/numpy_blas.py", "from {0:.2f}x to {1:.2f}x KVCache's speed",
     lambda: tuple(j(f)["results"][0]["a2ats_vs_kvcache"] for f in (
         "profile_gemma3_270m_8k_blas_kept.json", "profile_gemma3_270m_8k.json"))),
    ("docs/ARCHITECTURE.md", "Gemma 3 270M's 8K retrieval step {0:.2f}x -> {1:.2f}x KVCache's",
     lambda: tuple(j(f)["results"][0]["a2ats_vs_kvcache"] for f in (
         "profile_gemma3_270m_8k_blas_kept.json", "profile_gemma3_270m_8k.json"))),
    ("app/dialogs/settings_dialog.py", "at 8K on the demo model perplexity {0:.3f}x full "
     "attention instead of {1:.3f}x (three texts) and answers closer to full attention's, for a "
     "retrieval step that decodes at {2:.2f}x KVCache's speed on a 2-core CPU instead of "
     "{3:.2f}x", quality_preset),
    ("docs/ARCHITECTURE.md", "takes 8K perplexity from {1:.3f}x to {0:.3f}x full", quality_preset),
    ("docs/ARCHITECTURE.md", "decodes at {2:.2f}x KVCache's speed at 8K on a 2-core CPU instead "
     "of {3:.2f}x", quality_preset),
    ("a2ats_engine/cache/config.py", "perplexity {0:.3f}x full instead of {1:.3f}x",
     quality_preset),
    ("docs/BENCHMARKS.md", "the estimate (the *Quality* preset) {2:.2f}x", quality_preset),
    ("docs/BENCHMARKS.md", "the estimate costs {8:d}% of a rerank-4", quality_preset),
    ("docs/BENCHMARKS.md", "With the estimate as well (*Quality*) {4:.2f}x", quality_preset),
    ("app/dialogs/settings_dialog.py", "perplexity {:.3f}x -> {:.3f}x full at 4K on the demo "
     "model (three texts)",
     lambda: estimate_effect()[3:]),
]  # fmt: skip

# strings that look like figures but quote no recorded run: (file, the exact phrase)
NOT_RECORDED = [
    # the format of a user-table row's source, in a docstring
    ("a2ats_engine/cache/crossover.py", "'SmolLM2-135M-Instruct, 2026-05-01: 512 0.76x, 2048 0.90x'"),
    # a literal of the prefill table's printout: `full` against itself
    ("a2ats_engine/commands/bench/prefill.py", "1.00x"),
]  # fmt: skip


def _py_text(path: Path) -> str:
    """The string constants of a module (docstrings, messages, f-string parts), one per line."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return "\n".join(
        n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)
    )


def _text(rel: str) -> str:
    """What a reader sees of `rel`, whitespace runs as one space, generated regions removed."""
    path = ROOT / rel
    raw = _py_text(path) if path.suffix == ".py" else REGION.sub("", path.read_text("utf-8"))
    return re.sub(r"\s+", " ", raw)


def _scope() -> list[str]:
    commands = sorted(
        str(p.relative_to(ROOT)) for p in (ROOT / "a2ats_engine/commands").rglob("*.py")
    )
    return [*DOCS, *CODE, *commands]


def _rendered(template: str, values: Callable[[], tuple]) -> str:
    return template.format(*values())


@pytest.mark.parametrize(
    "rel, template, values", FIGURES, ids=[f"{f}: {t[:40]}" for f, t, _ in FIGURES]
)
def test_a_quoted_figure_is_the_recorded_one(rel, template, values):
    phrase = _rendered(template, values)
    assert phrase in _text(rel), f"{rel} should say, from the recorded JSON: {phrase!r}"


@pytest.mark.parametrize("rel", _scope())
def test_every_figure_is_generated_or_tied_to_a_recorded_run(rel):
    text = _text(rel)
    covered = [False] * len(text)
    phrases = [_rendered(t, v) for f, t, v in FIGURES if f == rel]
    phrases += [p for f, p in NOT_RECORDED if f == rel]
    for phrase in phrases:
        for m in re.finditer(re.escape(phrase), text):
            covered[m.start() : m.end()] = [True] * (m.end() - m.start())
    loose = [
        text[max(0, m.start() - 60) : m.end() + 20]
        for m in FIGURE.finditer(text)
        if not all(covered[m.start() : m.end()])
    ]
    assert not loose, (
        f"{rel}: figures not from a generated table and not in tests/test_docs_figures.py's "
        f"FIGURES: {loose}"
    )


def test_a_drifted_figure_fails():
    rel, template, values = next(f for f in FIGURES if f[0].endswith("crossover.py"))
    drifted = template.format(*(v + 0.01 for v in values()))
    assert drifted not in _text(rel)
    text = _text(rel).replace(_rendered(template, values), drifted)
    assert any(not _covered(m, text, _rendered(template, values)) for m in FIGURE.finditer(text))


def _covered(m: re.Match, text: str, phrase: str) -> bool:
    return any(p.start() <= m.start() and m.end() <= p.end() for p in re.finditer(re.escape(phrase), text))  # fmt: skip


# paths a doc may name that are not in this repository: other projects' files, user data
EXTERNAL = {
    "http/client.py", "argparse.py", "mlx_lm/models/llama.py",  # Python's and mlx-lm's sources
    "config.json", "generation_config.json",  # a model folder's
    "settings.json", "crossover.json", "hosts.json", "a2ats_source.json",  # written at run time
}  # fmt: skip
PATH = re.compile(r"(?<![\w/.<>-])((?:[\w*-]+/)*[\w*-]+\.(?:py|json|md))(?![\w/])")
BASES = ("", "a2ats_engine/", "app/", "docs/", "docs/benchmarks/", "tests/")


@cache
def _tracked() -> tuple[str, ...]:
    out = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT, capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    return tuple(out.split())


def _exists(name: str) -> bool:
    """`a/b.py` relative to the root or a package folder; a bare `b.py` anywhere; `*` a glob."""
    pattern = re.escape(name).replace(r"\*", "[^/]*")
    if "/" in name:
        return any(re.fullmatch(re.escape(b) + pattern, f) for b in BASES for f in _tracked())
    return any(re.fullmatch(pattern, f.rsplit("/", 1)[-1]) for f in _tracked())


@pytest.mark.parametrize(
    "rel", ["README.md", "CONTRIBUTING.md", "docs/ARCHITECTURE.md", "docs/BENCHMARKS.md",
            "docs/MODELS.md", *CODE],
)  # fmt: skip
def test_every_named_file_exists(rel):
    path = ROOT / rel
    text = _py_text(path) if path.suffix == ".py" else path.read_text(encoding="utf-8")
    missing = sorted({p for p in PATH.findall(text) if p not in EXTERNAL and not _exists(p)})
    assert not missing, f"{rel} names files that are not in the repository: {missing}"


def test_a_missing_module_is_caught():
    assert _exists("a2ats_engine/cache/crossover.py") and _exists("cache/crossover.py")
    assert _exists("loading/gguf*.py") and _exists("crossover.py")
    assert not _exists("a2ats_engine/cache/cache.py") and not _exists("cache.py")


def test_section_references_point_to_a_section():
    """`docs/BENCHMARKS.md section N, "Title"` names a numbered section (and a heading in it)."""
    bench = (ROOT / "docs/BENCHMARKS.md").read_text(encoding="utf-8")
    numbers = set(re.findall(r"^## (\d+)\.", bench, re.M))
    headings = {h.strip() for h in re.findall(r"^#+ (?:\d+\. )?(.+)$", bench, re.M)}
    ref = re.compile(r'BENCHMARKS\.md,? section (\d+)(?:, "([^"]+)")?')
    for rel in (*DOCS, *CODE, "CONTRIBUTING.md"):
        for number, title in ref.findall(_text(rel)):
            assert number in numbers, f"{rel}: docs/BENCHMARKS.md has no section {number}"
            if title:
                assert title in headings, f"{rel}: docs/BENCHMARKS.md has no heading {title!r}"


def test_no_issue_numbers_in_documents():
    docs = [ROOT / "README.md", ROOT / "CONTRIBUTING.md", *(ROOT / "docs").glob("*.md")]
    for path in docs:
        text = path.read_text(encoding="utf-8")
        found = re.findall(r"\bissues?[ -]#?\d+|(?<![\w&])#\d+(?![\w-])", text, re.I)
        assert not found, f"{path.name} cites issue numbers: {found}"


def test_readme_benchmark_part_fits_on_one_screen():
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    part = text.split("## Benchmarks (summary)", 1)[1].split("\n## ", 1)[0]
    lines = part.strip("\n").splitlines()
    assert len(lines) <= 40, f"README's benchmark part has {len(lines)} lines"
    assert max(map(len, lines)) <= 600
    assert "docs/BENCHMARKS.md" in part
