"""Every generated table in README.md and docs/BENCHMARKS.md is what docs/benchmarks/tables.py
prints from the recorded JSON in docs/benchmarks/ (no hand-edited numbers)."""

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def tables():
    spec = importlib.util.spec_from_file_location("tables", ROOT / "docs/benchmarks/tables.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


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
    first_number = next(t for t in generated[key].split("|") if any(c.isdigit() for c in t))
    edited = text.replace(first_number, first_number.replace("0", "9").replace("1", "8"), 1)
    assert edited != text
    assert tables.render(edited, generated) == text  # regenerating restores the recorded value


def test_a_region_without_a_table_is_an_error(tables, generated):
    text = "a\n<!-- begin generated: nope -->\nx\n<!-- end generated: nope -->\n"
    with pytest.raises(ValueError, match="nope"):
        tables.render(text, generated)


def _decode_run(ratios: dict[int, float]) -> dict:
    rows = [{"context": c, "method": "full", "speed_vs_full": 1.0} for c in ratios]
    rows += [{"context": c, "method": "a2ats", "speed_vs_full": r} for c, r in ratios.items()]
    return {"results": rows}


def test_targets15_counts_no_task_full_attention_fails_as_met(tables):
    texts = tables._load("eval_4k_texts.json")
    tasks = {
        "results": [
            {"task": "needle", "context": 4096, "method": "full", "score": 1.0},
            {"task": "needle", "context": 4096, "method": "a2ats", "score": 1.0},
            {"task": "chain", "context": 4096, "method": "full", "score": 0.0},
            {"task": "chain", "context": 4096, "method": "a2ats", "score": 0.0},
        ]
    }
    first = _decode_run({512: 0.97, 1024: 1.03, 2048: 0.85, 8192: 1.31})
    rerun = _decode_run({512: 0.98, 1024: 0.99, 2048: 0.99})
    table = tables.targets15_table(first, {}, texts, [tasks], [("quiet rerun", rerun)])
    task_row = next(line for line in table.splitlines() if "tasks:" in line)
    assert "1 of the 1 tasks full scores on" in task_row  # the unsolved task is not counted
    assert "full scores 0 on chain" in task_row
    rows = [line for line in table.splitlines() if "512, 1K, 2K" in line]
    assert len(rows) == 2  # both runs shown, neither picked over the other
    assert rows[0].endswith("| **no** |") and "0.85x" in rows[0]
    assert "(quiet rerun)" in rows[1] and rows[1].endswith("| yes |")
