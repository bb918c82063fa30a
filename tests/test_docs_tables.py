"""Every generated table in README.md and docs/BENCHMARKS.md is what docs/benchmarks/tables.py
prints from the recorded JSON in docs/benchmarks/ (no hand-edited numbers)."""

import re
from pathlib import Path

import pytest
from repo_python import bench_script

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def tables():
    return bench_script("tables")


@pytest.fixture(scope="module")
def generated(tables):
    return tables.blocks()


@pytest.mark.parametrize("doc", ["README.md", "docs/BENCHMARKS.md"])
def test_generated_regions_match_the_recorded_json(tables, generated, doc):
    text = (ROOT / doc).read_text(encoding="utf-8")
    assert tables.regions(text), f"{doc} has no generated region"
    assert tables.render(text, generated) == text, (
        f"{doc} differs from the recorded JSON: run `python docs/benchmarks/tables.py --write`"
    )


def test_every_table_is_in_a_doc(tables, generated):
    used = set()
    for doc in tables.DOCS:
        used.update(tables.regions(doc.read_text(encoding="utf-8")))
    assert used == set(generated)


def test_a_changed_number_is_caught(tables, generated):
    text = (ROOT / "docs/BENCHMARKS.md").read_text(encoding="utf-8")
    key = tables.regions(text)[0]
    start = text.index(f"<!-- begin generated: {key} -->")
    number = re.search(r"\d+\.\d+", text[start:])
    at = start + number.end() - 1
    edited = text[:at] + ("1" if text[at] != "1" else "2") + text[at + 1 :]  # last digit changed
    assert edited != text
    assert tables.render(edited, generated) == text  # regenerating restores the recorded value


def test_a_region_without_a_table_is_an_error(tables, generated):
    text = "a\n<!-- begin generated: nope -->\nx\n<!-- end generated: nope -->\n"
    with pytest.raises(ValueError, match="nope"):
        tables.render(text, generated)


def test_every_recorded_json_feeds_a_table_or_the_history(tables, generated):
    recorded = {p.name for p in (ROOT / "docs/benchmarks").glob("*.json")}
    shown, history = set(tables.LOADED), set(tables.HISTORY)
    assert not shown & history, f"in a current table and in the history: {shown & history}"
    assert recorded == shown | history, (
        f"recorded but neither in a table nor in tables.HISTORY: {recorded - shown - history}; "
        f"named but not recorded: {(shown | history) - recorded}"
    )


def test_history_names_only_recorded_files(tables, monkeypatch):
    monkeypatch.setitem(tables.HISTORY, "nope.json", ("2026-01-01", "never recorded"))
    with pytest.raises(FileNotFoundError, match="nope.json"):
        tables.history_list()


def _decode_run(ratios: dict[int, float], extra: tuple[str, ...] = ()) -> dict:
    rows = []
    for c, r in ratios.items():
        rows.append({"context": c, "method": "full", "speed_vs_full": 1.0, "tokens_per_s": 10.0,
                     "ratio_spread": [1.0, 1.0], "ratio_runs": [1.0]})  # fmt: skip
        for m in ("a2ats_noest", "a2ats_eb0_noest", "a2ats", *extra):
            rows.append({"context": c, "method": m, "speed_vs_full": r, "tokens_per_s": 10 * r,
                         "ratio_spread": [r - 0.01, r + 0.01], "ratio_runs": [r]})  # fmt: skip
    return {"results": rows, "repeats": 1, "steps": 4, "command": "cmd", "machine": "here"}


def test_speed_table_shows_the_shipped_default_and_its_spread(tables):
    table = tables.speed_table(_decode_run({512: 0.97, 8192: 1.3}))
    row = next(line for line in table.splitlines() if line.startswith("| 8,192 "))
    assert "| 1.30x (1.29-1.31) |" in row
    assert row.count("1.30x") == 3  # the default, from the first step, with the estimate


def test_speed_options_are_relative_to_the_default_of_the_same_run(tables):
    run = _decode_run({8192: 1.25}, extra=("a2ats_rr1",))
    for r in run["results"]:
        if r["method"] == "a2ats_rr1":
            r["speed_vs_full"], r["ratio_runs"] = 1.5, [1.5]
    table = tables.speed_options_table(run)
    assert "| rerank 1 (the paper's selection) | 1.20x | 1.20 |" in table
    assert "1.25" not in table and "1.50" not in table  # no figure against KVCache
