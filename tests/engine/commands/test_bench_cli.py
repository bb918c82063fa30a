"""`a2ats eval` and `a2ats bench memory|passkey|seed-synthetic` on a tiny model: valid JSON."""

import json
import re
import shlex

import pytest
from tiny import save_tiny_model

from a2ats_engine.bench.evaluate import ALL_METHODS
from a2ats_engine.cache.codebook import Codebook
from a2ats_engine.cli import main


@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory):
    root = tmp_path_factory.mktemp("bench")
    folder = save_tiny_model(root / "m", "llama", hidden_size=256)  # head_dim 64
    book = root / "cb.safetensors"
    Codebook.random(2, 2, 64, 32, seed=1).save(book)
    return folder, book


def _json(capsys) -> dict:
    out = capsys.readouterr().out
    assert out.count("\n") == 1  # exactly one JSON object on one line
    return json.loads(out)


def _eval_json(tiny_folder, capsys, *flags: str) -> dict:
    """`a2ats eval` of the tiny model with its codebook, --context 200, `flags` and --json: the
    one JSON object it prints."""
    folder, book = tiny_folder
    argv = ["eval", "--model", str(folder), "--codebook", str(book), "--context", "200", *flags]
    assert main([*argv, "--json"]) == 0
    return _json(capsys)


def test_eval_json_has_the_issue_shape(tiny_folder, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("A2ATS_DATA_DIR", str(tmp_path / "data"))
    folder, book = tiny_folder
    argv = ["eval", "--model", str(folder), "--codebook", str(book), "--context", "200",
            "--decode", "3", "--budget", "0.05", "--calib-tokens", "1024", "--json"]  # fmt: skip
    assert main(argv) == 0
    out = _json(capsys)
    assert out["context"] == 200 and out["decode"] == 3 and out["budget"] == 0.05
    assert set(out["methods"]) == set(ALL_METHODS)
    for name, row in out["methods"].items():
        for key in ("recall", "output_rel_error", "ppl", "bytes_per_token"):
            assert isinstance(row[key], float | int), (name, key)
    assert out["methods"]["full"]["recall"] == 1.0
    # equal-cost accounting: attended share and bytes read per decode step, every method
    for name, row in out["methods"].items():
        assert 0.0 < row["attended_fraction"] <= 1.0, name
        parts = row["bytes_read"]
        assert set(parts) == {"codes", "centroids", "keys_scored", "rows"}
        assert abs(sum(parts.values()) - row["bytes_read_per_step"]) <= 4, name
    a2, full = out["methods"]["a2ats"], out["methods"]["full"]
    assert a2["attended_fraction"] < 1.0 == full["attended_fraction"]
    assert a2["bytes_read"]["codes"] > 0 == full["bytes_read"]["codes"]
    notes = " ".join(out["notes"])
    assert "plain_vq: trained now" in notes and "no_wrope: trained now" in notes
    assert "paper: trained now" in notes
    # the trained ablation codebooks are cached: a second run reuses them
    assert main(argv[:-1] + ["--methods", "full,a2ats_plain_vq", "--json"]) == 0
    again = _json(capsys)
    assert set(again["methods"]) == {"full", "a2ats_plain_vq"}
    assert "plain_vq: reused" in " ".join(again["notes"])


def test_eval_tunes_the_paper_b_on_a_development_slice(tiny_folder, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("A2ATS_DATA_DIR", str(tmp_path / "data"))
    folder, book = tiny_folder
    argv = ["eval", "--model", str(folder), "--codebook", str(book), "--context", "150",
            "--decode", "4", "--methods", "full,a2ats_paper,a2ats_no_wrope",
            "--tune-paper-b", "32,64", "--calib-tokens", "512", "--json"]  # fmt: skip
    assert main(argv) == 0
    out = _json(capsys)
    tuned = out["paper_b"]
    assert [t["b"] for t in tuned["trials"]] == [32, 64] and tuned["chosen"] in (32, 64)
    assert "tokens 155-310" in tuned["dev"]  # a different slice than the evaluated tokens
    assert out["methods"]["a2ats_paper"]["ppl_vs_full"] > 0
    assert any("no_wrope" in n and "chunks of 1024 tokens" in n for n in out["notes"])
    dev = tmp_path / "dev.txt"
    dev.write_text("short")
    bad = argv[:-1] + ["--dev-text", str(dev), "--json"]
    assert main(bad) == 1
    assert "development text has" in capsys.readouterr().err


def test_eval_budget_sweep_json(tiny_folder, capsys):
    out = _eval_json(tiny_folder, capsys, "--decode", "2", "--budgets", "0.05,0.2", "--methods",
                     "full,a2ats,oracle_topk,window")  # fmt: skip
    assert out["budgets"] == [0.05, 0.2]
    assert [r["budget"] for r in out["runs"]] == [0.05, 0.2]
    low, high = (r["methods"]["oracle_topk"]["attended_per_head"] for r in out["runs"])
    assert high > low


def test_eval_kv_bits_json(tiny_folder, capsys):
    base = ["--decode", "2", "--methods", "full,a2ats"]
    plain = _eval_json(tiny_folder, capsys, *base)
    kv4 = _eval_json(tiny_folder, capsys, *base, "--kv-bits", "4")
    assert plain["kv_bits"] is None and kv4["kv_bits"] == 4
    assert kv4["methods"]["full"] == plain["methods"]["full"]  # full keeps float K/V
    a, b = plain["methods"]["a2ats"], kv4["methods"]["a2ats"]
    assert b["bytes_per_token"] < a["bytes_per_token"]
    assert b["output_rel_error"] > a["output_rel_error"]
    with pytest.raises(SystemExit):  # argparse rejects anything but 8 or 4
        _eval_json(tiny_folder, capsys, *base, "--kv-bits", "3")
    assert "--kv-bits" in capsys.readouterr().err


def test_eval_several_texts_json(tiny_folder, tmp_path, capsys):
    folder, book = tiny_folder
    texts = []
    for i, body in enumerate(("The cat sat on the mat. ", "def f(x):\n    return x + 1\n")):
        texts += ["--text", str(tmp_path / f"t{i}.txt")]
        (tmp_path / f"t{i}.txt").write_text(body * 80)
    argv = ["eval", "--model", str(folder), "--codebook", str(book), "--context", "150",
            "--decode", "6", "--methods", "full,a2ats", *texts, "--json"]  # fmt: skip
    assert main(argv) == 0
    out = _json(capsys)
    assert [t["text"] for t in out["texts"]] == ["t0.txt", "t1.txt"]
    for t in out["texts"]:
        assert t["runs"][0]["rests_on"]["tokens"] == 6
        assert t["runs"][0]["methods"]["a2ats"]["tokens"] == 6
    (pooled,) = out["pooled"]
    assert pooled["rests_on"]["tokens"] == 12 and pooled["rests_on"]["texts"] == 2
    assert "stratified by text" in pooled["rests_on"]["ci95"]
    full, a2 = pooled["methods"]["full"], pooled["methods"]["a2ats"]
    assert full["ppl_vs_full"] == 1.0 and full["tokens"] == a2["tokens"] == 12
    low, high = a2["ppl_vs_full_ci95"]
    assert low <= a2["ppl_vs_full"] <= high
    recalls = [t["runs"][0]["methods"]["a2ats"]["recall"] for t in out["texts"]]
    assert a2["recall"] == pytest.approx(sum(recalls) / 2, abs=1e-5)
    assert main(argv[:-1] + ["--texts", "nope", "--json"]) == 1
    assert "--texts" in capsys.readouterr().err
    # recall per layer: each text's, and pooled as the per-layer mean over the texts
    layers = [t["runs"][0]["methods"]["a2ats"]["recall_per_layer"] for t in out["texts"]]
    assert a2["recall_per_layer"] == pytest.approx(
        [(a + b) / 2 for a, b in zip(*layers, strict=True)], abs=1e-5
    )
    assert "recall_per_layer" not in full


def test_eval_alloc_reports_layer_budgets_and_recall_per_layer(tiny_folder, capsys):
    out = _eval_json(tiny_folder, capsys, "--decode", "3", "--budget", "0.2", "--methods",
                     "full,a2ats,a2ats_alloc")  # fmt: skip
    a2, alloc = out["methods"]["a2ats"], out["methods"]["a2ats_alloc"]
    assert len(a2["recall_per_layer"]) == 2 and "recall_per_layer" not in out["methods"]["full"]
    assert sum(a2["recall_per_layer"]) / 2 == pytest.approx(a2["recall"], abs=1e-5)
    assert len(alloc["layer_budgets"]) == 2
    assert sum(alloc["layer_budgets"]) / 2 == pytest.approx(1.0, abs=1e-3)
    assert len(alloc["dev_recall_per_layer"]) == 2 and alloc["ppl_vs_full"] > 0
    assert any("a2ats_alloc" in n and "tokens 204-408" in n for n in out["notes"])


def test_eval_runs_on_the_builtin_dialogue(tiny_folder, capsys):
    from a2ats_engine.bench.eval_texts import builtin_texts
    from a2ats_engine.loading.models import load_model

    text, desc = builtin_texts()["dialogue"]
    assert "keeper_dialogue.txt" in desc and text.count("MARTA:") > 50
    # long: about 9.1K tokens with the demo's tokenizer (enough for an 8K eval), over 8K here
    folder, book = tiny_folder
    _, tokenizer, _ = load_model(str(folder))
    assert len(tokenizer.encode(text)) > 8000
    argv = ["eval", "--model", str(folder), "--codebook", str(book), "--context", "150",
            "--decode", "4", "--methods", "full,a2ats", "--texts", "dialogue,code", "--json"]  # fmt: skip
    assert main(argv) == 0
    out = _json(capsys)
    assert out["texts"][0]["text"] == desc
    assert out["command"] == "a2ats " + shlex.join(argv)  # recorded, so the run can be redone
    assert out["texts"][0]["runs"][0]["methods"]["a2ats"]["tokens"] == 4


def test_builtin_prose_is_the_essay_not_the_haystack():
    from a2ats_engine.bench.eval_texts import builtin_texts
    from a2ats_engine.bench.tasks import default_haystack

    text, desc = builtin_texts()["prose"]
    assert "brackmoor_canal_essay.txt" in desc and "not in the calibration corpus" in desc
    assert text != default_haystack()[0] and "Gettysburg" not in text
    assert len(text.split()) >= 4000 and text.isascii()
    # plain prose in paragraphs: no speaker lines (the dialogue's "MARTA:"), no code, no lists
    paragraphs = text.strip().split("\n\n")
    assert len(paragraphs) > 20
    assert not re.search(r"^([A-Z]+:|[-*] |\d+\. |def |    )", text, re.MULTILINE)
    # figures restated far apart (long-range retrieval): first and last mention > half apart
    for fact in ("1,146 yards", "84,000 pounds", "96 million gallons", "Anchor Inn", "Dunnet"):
        first, last = text.index(fact), text.rindex(fact)
        assert last - first > len(text) // 2, fact


@pytest.mark.demo
def test_builtin_texts_fit_a_4k_eval_with_the_demo_tokenizer():
    from demo_gate import require_demo
    from mlx_lm.tokenizer_utils import load as load_tokenizer

    from a2ats_engine.bench.eval_texts import builtin_texts

    tokenizer = load_tokenizer(require_demo())
    need = 4096 + 256 + 1  # `a2ats eval --context 4096 --decode 256`, as _check_eval_args asks
    for name, (text, _) in builtin_texts().items():
        assert len(tokenizer.encode(text)) >= need, name


def test_eval_needs_a_codebook(tiny_folder, capsys):
    folder, _ = tiny_folder
    assert main(["eval", "--model", str(folder), "--json"]) == 1
    assert "codebook" in capsys.readouterr().err


# a random codebook file on purpose: the bytes measured do not depend on its origin
@pytest.mark.filterwarnings("ignore:codebook records no model fingerprint")
def test_bench_memory_json(tiny_folder, capsys):
    folder, book = tiny_folder
    argv = ["bench", "memory", "--model", str(folder), "--codebook", str(book),
            "--contexts", "256,512", "--json"]  # fmt: skip
    assert main(argv) == 0
    out = _json(capsys)
    rows = {(r["context"], r["method"]): r for r in out["results"]}
    assert len(rows) == 2 * 6
    for n in (256, 512):
        full = rows[(n, "full")]
        assert full["vs_full"] == 1.0
        assert rows[(n, "kv4")]["bytes_per_token"] < rows[(n, "kv8")]["bytes_per_token"]
        assert rows[(n, "a2ats_kv4")]["vs_full"] < 0.35
        # A2ATS = full K/V + one 2-byte code per token, KV head (2) and layer (2)
        extra = rows[(n, "a2ats")]["bytes_per_token"] - full["bytes_per_token"]
        assert extra == pytest.approx(2 * 2 * 2)
        # fixed costs: the codebook once, plus each layer's rotations; counted in bytes_held
        a2 = rows[(n, "a2ats_kv8")]
        assert a2["codebook_bytes"] == out["codebook_bytes"] > 0
        assert a2["fixed_bytes"] > a2["codebook_bytes"] and full["fixed_bytes"] == 0
        assert a2["bytes_held"] == pytest.approx(a2["bytes_per_token"] * n + a2["fixed_bytes"])
    for row in rows.values():  # measured beside computed: MLX holds at least the caches' bytes
        measured = row["measured"]
        assert measured["mlx_active"] >= row["bytes_held"]
        # MLX's allocator grew by the arrays' bytes (the fill's temporaries freed)
    for method in ("full", "a2ats"):  # float storage (tiny quantized arrays round up to pages)
        row = rows[(512, method)]
        storage = row["bytes_per_token"] * 512  # fixed costs (codebook, rotations) came before
        assert row["measured"]["mlx_active_growth"] == pytest.approx(storage, rel=0.1)
        assert measured["mlx_peak"] >= measured["mlx_active"]
        assert isinstance(measured["anon_growth"], int)  # Linux: RssAnon, read before and after
        assert measured["anon_peak_growth"] >= measured["anon_growth"]
    # break-even contexts follow from bytes/token and fixed bytes
    from a2ats_engine.bench.speed import break_even_context

    last = {m: rows[(512, m)] for m in ("kv8", "a2ats_kv4", "a2ats")}
    be = {(b["method"], b["baseline"]): b["context"] for b in out["break_even"]}
    assert len(be) == 3 * 3
    assert be[("a2ats_kv4", "kv8")] == break_even_context(
        last["a2ats_kv4"]["bytes_per_token"], last["a2ats_kv4"]["fixed_bytes"],
        last["kv8"]["bytes_per_token"],
    )  # fmt: skip
    assert be[("a2ats", "kv8")] is None  # float K/V + codes never holds less than kv8


def test_bench_passkey_json(tiny_folder, capsys):
    folder, book = tiny_folder
    argv = ["bench", "passkey", "--model", str(folder), "--codebook", str(book),
            "--contexts", "400,600", "--depths", "0.2,0.8", "--answer-tokens", "3", "--json"]  # fmt: skip
    assert main(argv) == 0
    out = _json(capsys)
    assert set(out["accuracy"]) == {"full", "window", "a2ats"}
    assert set(out["accuracy"]["full"]) == {"400", "600"}
    assert len(out["trials"]) == 2 * 2 * 3
    keys = {(t["context"], t["depth"]): t["passkey"] for t in out["trials"]}
    assert len(set(keys.values())) == 4  # one passkey per prompt, shared by the methods
    for t in out["trials"]:
        assert 0.0 <= out["accuracy"][t["method"]][str(t["context"])] <= 1.0
        assert t["correct"] == (str(t["passkey"]) in t["answer"])


def test_bench_seed_synthetic_json_is_deterministic(capsys):
    argv = ["bench", "seed-synthetic", "--sequences", "200", "--centroids", "16", "--json"]
    assert main(argv) == 0
    first = _json(capsys)
    assert main(argv) == 0
    assert _json(capsys) == first
    rows = first["rows"]
    assert {(r["spectrum"], r["geometry"]) for r in rows} == {
        (s, g) for s in ("low_frequency", "flat") for g in ("local_recency", "long_range_dependent")
    }
    for r in rows:
        assert r["sequence"] == 200
        assert r["rope"]["exact_rope_mse"] > 0 and r["rope"]["windowed_mse"] > 0
        assert 0.0 < r["vq"]["query_aware"]["recall_top_k"] <= 1.0


def test_eval_says_when_far_offset_is_ignored(tiny_folder, capsys):
    folder, book = tiny_folder
    argv = ["eval", "--model", str(folder), "--codebook", str(book), "--context", "120",
            "--decode", "2", "--methods", "full,a2ats", "--json"]  # fmt: skip
    assert main([*argv, "--far-buckets", "3"]) == 0
    notes = " ".join(_json(capsys)["notes"])
    assert "far_offset: ignored with far_buckets = 3" in notes
    assert main([*argv, "--far-buckets", "1"]) == 0
    assert "far_offset" not in " ".join(_json(capsys)["notes"])


def test_break_even_context_by_hand():
    from a2ats_engine.bench.speed import break_even_context

    # 100 B/token + 1000 B fixed vs 150 B/token: 100 n + 1000 < 150 n from n = 21 (n = 20 ties)
    assert break_even_context(100, 1000, 150) == 21
    assert 100 * 20 + 1000 == 150 * 20 and 100 * 21 + 1000 < 150 * 21
    assert break_even_context(100, 999, 150) == 20  # 2999 < 3000
    assert break_even_context(100, 0, 150) == 1
    assert break_even_context(150, 10, 150) is None  # never below a baseline it matches
    assert break_even_context(200, 10, 150) is None
