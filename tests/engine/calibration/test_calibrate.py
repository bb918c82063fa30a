"""Calibration on tiny models: end to end, determinism, cancel, pre-RoPE keys, WRoPE queries,
query-aware vs plain VQ on an anisotropic model, corpus sources and user files."""

import json
import threading

import mlx.core as mx
import numpy as np
import pytest
from demo_gate import require_demo
from tiny import tiny_model

from a2ats_engine.cache.codebook import Codebook
from a2ats_engine.cache.codebook_spec import CodebookSpec
from a2ats_engine.cache.config import A2ATSConfig
from a2ats_engine.cache.geometry import model_geometry, rope_specs
from a2ats_engine.cache.rope import retrieval_distances
from a2ats_engine.calibration.calibrate import calibrate
from a2ats_engine.calibration.capture import CalibrationCancelled, collect, token_stream
from a2ats_engine.calibration.corpus import builtin_corpus, load_texts

from ..refusals import assert_out_of_range

CONFIG = A2ATSConfig()
SPEC = CodebookSpec(n_centroids=16)


def test_end_to_end_saves_loads_and_validates(tokenizer, tmp_path):
    model = tiny_model("llama")
    book = calibrate(
        model, tokenizer, None, CONFIG, spec=SPEC, tokens=1200, chunk_len=256, model_name="t"
    )
    assert (book.num_layers, book.num_kv_heads, book.head_dim, book.n_centroids) == (2, 2, 16, 16)
    assert book.metadata["tokens"] == 1200
    assert book.metadata["far_offset"] == CONFIG.far_offset
    assert book.metadata["query_aware"] is True
    assert 0.0 < book.metadata["heldout_score_error"] < 1.0
    path = tmp_path / "tiny.safetensors"
    book.save(path)
    loaded = Codebook.load(path)
    assert loaded.validate_for(model, CONFIG) == []
    assert loaded.metadata["model"]["name"] == "t"
    for a, b in zip(book.centroids, loaded.centroids, strict=True):
        assert np.array_equal(np.asarray(a), np.asarray(b))


def test_deterministic_for_a_seed(tokenizer):
    model = tiny_model("qwen2")
    runs = [calibrate(model, tokenizer, None, CONFIG, spec=SPEC, tokens=900, chunk_len=256, seed=s)
            for s in (3, 3, 4)]  # fmt: skip
    same = all(
        np.array_equal(np.asarray(a), np.asarray(b))
        for a, b in zip(runs[0].centroids, runs[1].centroids, strict=True)
    )
    assert same
    assert not np.array_equal(np.asarray(runs[0].centroids[0]), np.asarray(runs[2].centroids[0]))


@pytest.mark.parametrize("stage", ["collecting", "clustering"])
def test_cancel_stops_and_raises(tokenizer, stage):
    model = tiny_model("llama")
    cancel = threading.Event()
    seen = []

    def progress(name, done, total):
        seen.append(name)
        if name == stage:
            cancel.set()

    with pytest.raises(CalibrationCancelled):
        calibrate(model, tokenizer, None, CONFIG, spec=SPEC, tokens=3000, chunk_len=512,
                  progress=progress, cancel=cancel)  # fmt: skip
    # Stopped at the first check after the flag was set: one report of the stage, no later stage.
    assert seen.count(stage) == 1
    assert seen[-1] == stage


def _direct_layer0(model, ids: np.ndarray):
    """Pre-RoPE keys and queries of layer 0 computed from the weights: [n_kv, L, d], [n_q, L, d]."""
    attn = model.model.layers[0].self_attn
    x = model.model.layers[0].input_layernorm(model.model.embed_tokens(mx.array(ids)[None]))
    length = ids.size
    keys = attn.k_proj(x).reshape(length, attn.n_kv_heads, -1).transpose(1, 0, 2)
    queries = attn.q_proj(x).reshape(length, attn.n_heads, -1).transpose(1, 0, 2)
    return keys, queries


@pytest.mark.parametrize("arch,traditional", [("llama", False), ("llama", True), ("qwen2", False)])
def test_collected_keys_are_pre_rope_and_queries_are_wrope(tokenizer, arch, traditional):
    model = tiny_model(arch, rope_traditional=traditional)
    texts = builtin_corpus(tokenizer, chars=4000)
    config = A2ATSConfig(sinks=4, window=16, far_offset=300, far_buckets=1)
    data = collect(
        model, tokenizer, texts, config, spec=SPEC, tokens=200, chunk_len=200, heldout=0.0
    )
    ids = token_stream(tokenizer, texts, 200)
    keys, queries = _direct_layer0(model, ids)
    assert np.array_equal(data.key_positions, np.arange(4, 200))  # sinks left out
    got = np.asarray(data.keys[0])
    want = np.asarray(keys)[:, 4:]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    spec = rope_specs(model)[0]
    post = np.asarray(spec.rotate(keys, 0))[:, 4:]
    assert np.abs(got - post).max() > 1e-2  # the rotation is really undone
    # WRoPE queries: R_b q_i for positions >= sinks + window, grouped by KV head.
    far = spec.rotate(queries[:, 20:, None, :], 300)[:, :, 0, :]  # [n_q, L', d]
    grouped = np.asarray(far).reshape(2, -1, 16)  # query head j -> KV head j // 2
    want_moment = np.swapaxes(grouped, 1, 2) @ grouped
    np.testing.assert_allclose(np.asarray(data.moments[0]), want_moment, rtol=1e-3, atol=1e-3)
    assert data.queries == 2 * 180
    # With distance buckets the moment averages the queries rotated to every bucket distance.
    buckets = A2ATSConfig(sinks=4, window=16, far_buckets=3)
    data = collect(
        model, tokenizer, texts, buckets, spec=SPEC, tokens=200, chunk_len=200, heldout=0.0
    )
    distances = retrieval_distances(16, buckets.far_offset, 3, model_geometry(model).max_context)
    assert len(set(distances)) == 3
    want_moment = 0
    for dist in distances:
        far = np.asarray(spec.rotate(queries[:, 20:, None, :], dist)[:, :, 0, :]).reshape(2, -1, 16)
        want_moment = want_moment + np.swapaxes(far, 1, 2) @ far / 3
    np.testing.assert_allclose(np.asarray(data.moments[0]), want_moment, rtol=1e-3, atol=1e-3)


def _anisotropic_model():
    """Tiny Llama whose queries concentrate on a few rotary pairs (scaled q_proj rows)."""
    model = tiny_model("llama", seed=1)
    for layer in model.model.layers:
        attn = layer.self_attn
        scale = np.full(16, 0.2, dtype=np.float32)
        scale[[0, 1, 8, 9]] = 6.0  # half-split RoPE pairs (0, 8) and (1, 9)
        rows = np.tile(scale, attn.n_heads)[:, None]
        attn.q_proj.weight = attn.q_proj.weight * mx.array(rows)
    mx.eval(model.parameters())
    return model


def test_query_aware_beats_plain_vq_on_anisotropic_queries(tokenizer):
    model = _anisotropic_model()
    book = calibrate(model, tokenizer, None, CONFIG, spec=SPEC, tokens=4096, chunk_len=512,
                     heldout=0.25, compare_plain=True)  # fmt: skip
    aware = book.metadata["heldout_score_error"]
    plain = book.metadata["heldout_score_error_plain"]
    assert aware < 0.8 * plain


def test_builtin_corpus_mixes_sources_deterministically(tokenizer):
    texts = builtin_corpus(tokenizer, seed=1, chars=60_000)
    again = builtin_corpus(tokenizer, seed=1, chars=60_000)
    assert texts == again
    assert sum(map(len, texts)) >= 60_000
    joined = "\n".join(texts)
    assert "<|im_start|>user" in joined  # chat turns through the model's template
    assert "def " in joined  # stdlib source
    uuid_lines = [t for t in texts if t.count("-") >= 8 * 20]
    assert uuid_lines
    assert builtin_corpus(tokenizer, seed=2, chars=60_000) != texts


def test_load_texts_reads_txt_md_and_chat_jsonl(tokenizer, tmp_path):
    (tmp_path / "a.txt").write_text("plain text")
    (tmp_path / "b.md").write_text("# title\n\nbody")
    lines = [
        {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]},
        [{"role": "user", "content": "list form"}],
        {"role": "user", "content": "one"},
        {"role": "assistant", "content": "two"},
        {"text": "raw"},
    ]
    (tmp_path / "c.jsonl").write_text("\n".join(json.dumps(x) for x in lines))
    texts = load_texts([tmp_path / "a.txt", tmp_path / "b.md", tmp_path / "c.jsonl"], tokenizer)
    assert texts[:2] == ["plain text", "# title\n\nbody"]
    assert texts[2] == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\nyo<|im_end|>\n"
    assert "list form" in texts[3]
    assert "one" in texts[4] and "two" in texts[4]
    assert texts[5] == "raw"
    (tmp_path / "bad.jsonl").write_text('{"messages": []}\n{oops\n')
    with pytest.raises(ValueError, match="bad.jsonl line 2"):
        load_texts([tmp_path / "bad.jsonl"], tokenizer)
    (tmp_path / "x.pdf").write_text("")
    with pytest.raises(ValueError, match="unsupported"):
        load_texts([tmp_path / "x.pdf"])


def test_bad_settings_name_the_field(tokenizer):
    model = tiny_model("llama")
    with pytest.raises(ValueError, match="tokens"):
        calibrate(model, tokenizer, None, CONFIG, spec=SPEC, tokens=0)
    with pytest.raises(ValueError, match="empty"):
        calibrate(model, tokenizer, [""], CONFIG, spec=SPEC, tokens=100)


def test_cli_calibrate_and_codebook_info(tmp_path, capsys):
    from tiny import save_tiny_model

    from a2ats_engine.cli import main

    folder = save_tiny_model(tmp_path / "model")
    out = tmp_path / "book.safetensors"
    argv = ["calibrate", "--model", str(folder), "--out", str(out), "--tokens", "3000",
            "--centroids", "16", "--iters", "5"]  # fmt: skip
    assert main(argv) == 0
    report = capsys.readouterr().out
    assert "tokens used: 3000" in report
    assert "query-aware" in report and "plain VQ" in report
    assert main(argv) == 1  # refuses to overwrite without --force
    assert "exists" in capsys.readouterr().err
    assert main(["codebook-info", str(out), "--model", str(folder)]) == 0
    info = capsys.readouterr().out
    assert "16 centroids" in info and "fits model: yes" in info
    other = save_tiny_model(tmp_path / "other", num_hidden_layers=3)
    assert main(["codebook-info", str(out), "--model", str(other)]) == 1
    assert "codebook is for 2 layers, the model has 3" in capsys.readouterr().out
    cut = tmp_path / "cut.safetensors"
    cut.write_bytes(out.read_bytes()[:-100])
    assert main(["codebook-info", str(cut)]) == 1
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "file is truncated" in err


def test_ensure_demo_codebook_keeps_a_valid_file(tmp_path, monkeypatch):
    from a2ats_engine.calibration import calibrate as calibration

    monkeypatch.setenv("A2ATS_DATA_DIR", str(tmp_path))
    path = calibration.demo_codebook_path()
    assert path == tmp_path / "codebooks" / "demo-default.safetensors"
    Codebook.random(2, 2, 16, 8).save(path)
    before = path.read_bytes()
    assert calibration.ensure_demo_codebook() == path  # valid file: nothing rebuilt
    assert path.read_bytes() == before


def test_ensure_demo_codebook_rebuilds_a_damaged_file(tmp_path, monkeypatch):
    from tiny import save_tiny_model

    from a2ats_engine.calibration import calibrate as calibration

    monkeypatch.setenv("A2ATS_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setattr(calibration, "DEMO_TOKENS", 1500)
    monkeypatch.setattr(calibration, "DEMO_CENTROIDS", 16)
    folder = save_tiny_model(tmp_path / "model")
    path = calibration.demo_codebook_path()
    path.parent.mkdir(parents=True)
    path.write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{")  # truncated header
    assert calibration.ensure_demo_codebook(model_source=folder) == path
    book = Codebook.load(path)
    assert book.n_centroids == 16 and book.metadata["tokens"] == 1500


@pytest.mark.demo
def test_demo_model_keys_are_pre_rope_and_query_aware_wins():
    """The real demo model (GGUF: traditional RoPE, base 1e5): collected keys equal k_proj
    outputs; on held-out text query-aware VQ beats plain VQ."""
    from a2ats_engine.loading.models import load_model

    require_demo()
    model, tokenizer, _ = load_model("demo")
    config, spec = A2ATSConfig(), CodebookSpec(n_centroids=64)
    texts = builtin_corpus(tokenizer, chars=20_000)
    data = collect(
        model, tokenizer, texts, config, spec=spec, tokens=1200, chunk_len=600, heldout=0.5
    )
    ids = token_stream(tokenizer, texts, 1200)
    keys, _ = _direct_layer0(model, ids[:600])  # chunk 0 trains, chunk 1 is held out
    np.testing.assert_allclose(
        np.asarray(data.keys[0]), np.asarray(keys)[:, 8:], rtol=1e-3, atol=1e-3
    )
    from a2ats_engine.calibration.calibrate import fit_codebook

    aware = fit_codebook(data, spec, beta=0.0).metadata["heldout_score_error"]
    plain = fit_codebook(data, spec, beta=1.0).metadata["heldout_score_error"]
    assert aware < plain


@pytest.mark.parametrize(
    ("field", "value"), [("beta", 1.2), ("n_centroids", 70000), ("n_centroids", 1), ("sub_dim", 0)]
)
def test_codebook_spec_validation_names_field_value_and_range(field, value):
    assert_out_of_range(CodebookSpec, field, value)


def test_codebook_spec_from_dict_ignores_unknown_keys():
    spec = CodebookSpec(n_centroids=64, sub_dim=8, beta=0.5)
    assert CodebookSpec.from_dict({**spec.to_dict(), "future": 1}) == spec


def test_the_cache_config_no_longer_carries_codebook_properties():
    names = set(A2ATSConfig().to_dict())
    assert not names & {"n_centroids", "sub_dim", "beta"}
    # settings saved by an older version still load: the codebook keys are ignored
    assert A2ATSConfig.from_dict({"window": 32, "n_centroids": 64, "beta": 0.0}).window == 32


def test_default_codebook_recipes_gemma_is_product_vq_the_demo_is_not():
    """Gemma 3 270M's 256-dim keys are too coarse under one 512-centroid VQ (docs/BENCHMARKS.md,
    "A second model: Gemma 3 270M"): its default codebook is product VQ over 16-dim subspaces;
    the demo keeps full head-dim VQ."""
    from a2ats_engine.calibration import calibrate as calibration

    assert calibration.default_codebook_spec("demo") == CodebookSpec(512)
    assert calibration.default_codebook_spec("gemma3-270m") == CodebookSpec(512, sub_dim=8)


def test_ensure_default_codebook_rebuilds_a_book_of_the_old_recipe(tmp_path, monkeypatch):
    """A default codebook built before the model's recipe became product VQ (one subspace) is
    rebuilt with the recipe's subspaces; one that follows the recipe is kept."""
    import dataclasses

    from tiny import save_tiny_model

    from a2ats_engine.calibration import calibrate as calibration
    from a2ats_engine.loading import fetched_models

    monkeypatch.setenv("A2ATS_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setattr(calibration, "DEMO_TOKENS", 1500)
    monkeypatch.setattr(calibration, "DEMO_CENTROIDS", 16)
    name = "gemma3-270m"
    spec = fetched_models.FETCHED[name]
    monkeypatch.setitem(fetched_models.FETCHED, name, dataclasses.replace(spec, codebook_sub_dim=8))
    folder = save_tiny_model(tmp_path / "model")  # head_dim 16
    path = fetched_models.default_codebook_path(name)
    path.parent.mkdir(parents=True)
    Codebook.random(2, 2, 16, 16).save(path)  # the old recipe: full head-dim VQ
    assert calibration.ensure_default_codebook(name, model_source=folder) == path
    book = Codebook.load(path)
    assert (book.sub_dim, book.num_subspaces, book.n_centroids) == (8, 2, 16)
    assert book.metadata["tokens"] == 1500
    before = path.read_bytes()
    assert calibration.ensure_default_codebook(name, model_source=folder) == path
    assert path.read_bytes() == before  # follows the recipe: kept
