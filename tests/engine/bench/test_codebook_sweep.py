"""`a2ats bench codebooks` on a tiny model: the shared calibration pass returns what `collect`
returns for each request, the sweep's codebooks are `calibrate`'s, and its rows agree with a
separate `evaluate` call with the same codebook."""

import json

import numpy as np
import pytest
from repo_python import bench_script
from tiny import save_tiny_model, tiny_model, tiny_tokenizer

from a2ats_engine.bench.eval_texts import default_text
from a2ats_engine.bench.evaluate import evaluate
from a2ats_engine.cache.codebook import Codebook
from a2ats_engine.cache.codebook_spec import CodebookSpec
from a2ats_engine.cache.config import A2ATSConfig
from a2ats_engine.calibration.calibrate import calibrate
from a2ats_engine.calibration.capture import collect
from a2ats_engine.calibration.corpus import builtin_corpus
from a2ats_engine.calibration.shared_collect import collect_shared
from a2ats_engine.cli import main


def _same(a, b) -> bool:
    return np.array_equal(np.asarray(a), np.asarray(b))


def _assert_same_data(got, want) -> None:
    assert got.tokens == want.tokens and got.chunk_len == want.chunk_len
    assert got.queries == want.queries
    assert np.array_equal(got.key_positions, want.key_positions)
    for name in ("keys", "moments", "heldout_keys", "heldout_moments"):
        a, b = getattr(got, name), getattr(want, name)
        assert (a is None) == (b is None), name
        if a is not None:
            assert len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True)), name


def test_shared_collection_equals_collect_for_every_request(tmp_path):
    model, tokenizer = tiny_model("llama"), tiny_tokenizer(tmp_path)
    config = A2ATSConfig()
    # 1000 tokens: chunks of 256 (the last one 232); 600 tokens: two whole chunks of those
    # and a partial third one (88 tokens) that the longer stream does not have
    requests = [(1000, 300), (1000, 60), (600, 300)]
    shared = collect_shared(
        model, tokenizer, None, config, requests=requests, chunk_len=256, heldout=0.25
    )
    for tokens, keys_per_head in requests:
        texts = builtin_corpus(tokenizer, seed=0, chars=8 * tokens)  # as `calibrate` builds it
        want = collect(model, tokenizer, texts, config, tokens=tokens,
                       keys_per_head=keys_per_head, chunk_len=256, heldout=0.25)  # fmt: skip
        _assert_same_data(shared.data(tokens, keys_per_head), want)
    # every chunk of the longer stream ran once; the shorter one added only its partial chunk
    assert shared.forward_tokens == 1000 + (600 - 512)
    with pytest.raises(ValueError, match="was not collected"):
        shared.data(600, 60)


@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory):
    return save_tiny_model(tmp_path_factory.mktemp("sweep") / "m", "llama", hidden_size=256)


def _json(capsys) -> dict:
    out = capsys.readouterr().out
    assert out.count("\n") == 1  # exactly one JSON object on one line
    return json.loads(out)


def test_bench_codebooks_rows_match_calibrate_and_evaluate(tiny_folder, tmp_path, capsys):
    from a2ats_engine.loading.models import load_model

    save = tmp_path / "books"
    argv = ["bench", "codebooks", "--model", str(tiny_folder), "--centroids", "16,64",
            "--calib-tokens", "1024,2048", "--context", "400", "--decode", "4",
            "--budget", "0.05", "--save-dir", str(save), "--json"]  # fmt: skip
    assert main(argv) == 0
    out = _json(capsys)
    rows = out["results"]
    pairs = [(16, 1024), (16, 2048), (64, 1024), (64, 2048)]
    assert [(r["centroids"], r["calib_tokens"]) for r in rows] == pairs  # one row per pair
    by = {(r["centroids"], r["calib_tokens"]): r for r in rows}
    for t in (1024, 2048):
        assert by[(64, t)]["codebook_bytes"] > by[(16, t)]["codebook_bytes"]
    for r in rows:
        assert 0.0 <= r["recall"] <= 1.0
        assert r["decode_tokens"] == 4 and r["attended_per_head"] < 404  # tokens were dropped
        assert r["calib_seconds"] == pytest.approx(
            r["collect_seconds"] + r["fit_seconds"], abs=0.02
        )
        low, high = r["ppl_ci"]
        assert low <= r["ppl_vs_full"] <= high
    assert out["calibration_shared"]["forward_tokens"] == 2048  # 1024 is a prefix of 2048
    assert out["command"].startswith("a2ats bench codebooks --model MODEL --centroids 16,64")
    assert out["machine"] and out["rests_on"]["tokens"] == 4

    model, tokenizer, _ = load_model(str(tiny_folder))
    ids = tokenizer.encode(default_text()[0])
    for (n, t), row in by.items():
        book = Codebook.load(save / f"codebook-c{n}-t{t}.safetensors")
        assert book.n_centroids == n and book.metadata["tokens"] == t
        if (n, t) == (64, 2048):  # the same recipe as a calibration of its own
            alone = calibrate(model, tokenizer, None, A2ATSConfig(), spec=CodebookSpec(n),
                              tokens=t)  # fmt: skip
            assert all(_same(a, b) for a, b in zip(book.centroids, alone.centroids, strict=True))
            assert book.metadata["heldout_score_error"] == alone.metadata["heldout_score_error"]
        # an independent check: `evaluate` with its own prefill and this codebook
        (run,) = evaluate(
            model, ids, context=400, decode=4, budgets=[0.05], codebooks={"a2ats": book},
            config=A2ATSConfig(exact_below=0), methods=("full", "a2ats"),
        )  # fmt: skip
        a2 = run.methods["a2ats"].to_dict()
        assert row["recall"] == a2["recall"]
        assert row["output_rel_error"] == a2["output_rel_error"]
        assert row["ppl_vs_full"] == a2["ppl_vs_full"]
        assert row["ppl_ci"] == a2["ppl_vs_full_ci95"]

    tables = bench_script("tables")
    table = tables.codebook_sweep_table(out)
    assert table.count("\n| 16 |") == 2 and table.count("\n| 64 |") == 2
    assert f"{rows[0]['recall']:.4f}" in table and out["command"] in table


def test_bench_codebooks_bad_input_is_one_line(tiny_folder, capsys):
    base = ["bench", "codebooks", "--model", str(tiny_folder), "--json"]
    cases = [
        (["--centroids", "1,64"], "--centroids 1 is out of range"),
        (["--centroids", "70000"], "--centroids 70000 is out of range"),
        (["--centroids", ","], "--centroids is empty"),
        (["--centroids", "64,x"], "--centroids 'x' is not an integer"),
        (["--calib-tokens", "512,512"], "--calib-tokens lists 512 more than once"),
        (["--calib-tokens", "1"], "--calib-tokens 1 is out of range"),
        (["--texts", "poem"], "--texts 'poem' is unknown"),
        (["--decode", "0"], "--decode=0 is out of range"),
        (["--centroids", "16", "--calib-tokens", "256", "--context", "10000000"],
         "--context=10000000 is out of range"),
        (["--centroids", "16", "--calib-tokens", "256", "--context", "1000000"],
         "1,000,064 tokens is longer than the model's context"),
    ]  # fmt: skip
    for extra, message in cases:
        assert main(base + extra) == 1, extra
        err = capsys.readouterr().err.strip()
        assert err.count("\n") == 0 and message in err, (extra, err)
