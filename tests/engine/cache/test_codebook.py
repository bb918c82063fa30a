"""Codebook: query-aware fit, assignment and score tables vs numpy, files, model validation."""

import warnings

import mlx.core as mx
import numpy as np
import pytest
from tiny import tiny_model

from a2ats_engine.cache import attention as att
from a2ats_engine.cache.codebook import (
    Codebook,
    query_metric,
    relative_score_error,
)
from a2ats_engine.cache.codebook_check import model_fingerprint
from a2ats_engine.cache.config import A2ATSConfig
from a2ats_engine.cache.rope import RopeSpec
from a2ats_engine.errors import CodebookError


def _keys_queries(seed: int, n_layers=2, n_kv=2, n=600, m=400, d=16, clusters=12):
    """Keys (around `clusters` centres; 0 = isotropic Gaussian) and strongly anisotropic queries
    (a few dominant directions, randomly rotated)."""
    rng = np.random.default_rng(seed)
    keys, queries = [], []
    for _ in range(n_layers):
        k = rng.standard_normal((n_kv, n, d))
        if clusters:
            centres = rng.standard_normal((clusters, d)) * 2.0
            k = k + centres[rng.integers(0, clusters, (n_kv, n))]
        basis, _ = np.linalg.qr(rng.standard_normal((d, d)))
        scales = np.geomspace(10.0, 0.05, d)
        q = (rng.standard_normal((n_kv, m, d)) * scales) @ basis.T
        keys.append(mx.array(k.astype(np.float32)))
        queries.append(mx.array(q.astype(np.float32)))
    return keys, queries


def _split(arrays, at):
    return [a[:, :at] for a in arrays], [a[:, at:] for a in arrays]


def test_beta_one_is_plain_nearest_centroid_vq():
    keys, queries = _keys_queries(0)
    plain = Codebook.fit(keys, None, n_centroids=16, seed=3)
    blended = Codebook.fit(keys, queries, n_centroids=16, beta=1.0, seed=3)
    for layer in range(2):
        c = np.asarray(blended.centroids[layer])  # [n_kv, 1, K, d]
        assert np.array_equal(c, np.asarray(plain.centroids[layer]))
        codes = np.asarray(blended.assign(layer, keys[layer][None]))[0, :, :, 0]  # [n_kv, N]
        k = np.asarray(keys[layer])
        ref = ((k[:, :, None, :] - c[:, 0][:, None, :, :]) ** 2).sum(-1).argmin(-1)
        assert np.array_equal(codes, ref)
        assert np.allclose(np.asarray(blended.chol[layer]), np.eye(16))
    assert not blended.metadata["query_aware"]


def test_query_aware_lowers_held_out_score_error_on_anisotropic_queries():
    keys, queries = _keys_queries(1, n=1200, m=800, clusters=0)
    (k_fit, k_out), (q_fit, q_out) = _split(keys, 800), _split(queries, 400)
    aware = Codebook.fit(k_fit, q_fit, n_centroids=16, beta=0.0, seed=0)
    plain = Codebook.fit(k_fit, q_fit, n_centroids=16, beta=1.0, seed=0)
    half = Codebook.fit(k_fit, q_fit, n_centroids=16, beta=0.5, seed=0)
    e_aware = relative_score_error(aware, k_out, q_out)
    e_half = relative_score_error(half, k_out, q_out)
    e_plain = relative_score_error(plain, k_out, q_out)
    assert e_aware < 0.7 * e_plain
    assert e_aware <= e_half <= e_plain


def test_query_metric_is_cholesky_of_blended_unit_rms_second_moment():
    _, queries = _keys_queries(2, n_layers=1)
    q = np.asarray(queries[0], dtype=np.float64)  # [n_kv, M, d]
    beta, ridge = 0.25, 1e-3
    chol = np.asarray(query_metric(queries[0], 16, beta, ridge), dtype=np.float64)[:, 0]
    for h in range(q.shape[0]):
        second = q[h].T @ q[h] / q.shape[1]
        second = second * 16 / np.trace(second) + ridge * np.eye(16)
        want = beta * np.trace(second) / 16 * np.eye(16) + (1 - beta) * second
        np.testing.assert_allclose(chol[h] @ chol[h].T, want, rtol=1e-4, atol=1e-5)
        assert np.allclose(np.triu(chol[h], 1), 0.0)


def test_product_vq_uses_diagonal_blocks():
    keys, queries = _keys_queries(3, n_layers=1)
    book = Codebook.fit(keys, queries, n_centroids=8, sub_dim=4, seed=0)
    assert (book.num_subspaces, book.sub_dim, book.head_dim) == (4, 4, 16)
    assert book.centroids[0].shape == (2, 4, 8, 4)
    full = np.asarray(query_metric(queries[0], 16))[:, 0]  # [n_kv, 16, 16]
    blocks = np.asarray(book.chol[0])  # [n_kv, 4, 4, 4]
    h_full = full @ np.swapaxes(full, -1, -2)
    for s in range(4):
        got = blocks[:, s] @ np.swapaxes(blocks[:, s], -1, -2)
        np.testing.assert_allclose(
            got, h_full[:, 4 * s : 4 * s + 4, 4 * s : 4 * s + 4], rtol=1e-4, atol=1e-5
        )


@pytest.mark.parametrize("sub_dim", [16, 8])
def test_assign_and_score_tables_match_numpy(sub_dim):
    keys, queries = _keys_queries(4, n_layers=2)
    book = Codebook.fit(keys, queries, n_centroids=12, sub_dim=sub_dim, seed=1)
    s = 16 // sub_dim
    rng = np.random.default_rng(9)
    k = rng.standard_normal((2, 2, 37, 16)).astype(np.float32)  # [B, n_kv, N, d]
    q = rng.standard_normal((2, 2, 5, 16)).astype(np.float32)  # [B, n_kv, G, d]
    layer = 1
    codes = book.assign(layer, mx.array(k))
    assert codes.shape == (2, 2, 37, s) and codes.dtype == mx.uint16
    tables = book.score_tables(layer, mx.array(q))
    assert tables.shape == (2, 2, 5, s, 12)
    c = np.asarray(book.centroids[layer], dtype=np.float64)  # [n_kv, S, K, sd]
    chol = np.asarray(book.chol[layer], dtype=np.float64)
    c_assign = np.asarray(book.assign_centroids[layer], dtype=np.float64)
    np.testing.assert_allclose(c_assign, c @ chol, rtol=1e-4, atol=1e-4)
    ks = k.reshape(2, 2, 37, s, sub_dim).astype(np.float64)
    qs = q.reshape(2, 2, 5, s, sub_dim).astype(np.float64)
    for h in range(2):
        for j in range(s):
            mapped = ks[:, h, :, j] @ chol[h, j]  # [B, N, sd]
            dist = ((mapped[:, :, None, :] - c_assign[h, j][None, None]) ** 2).sum(-1)
            assert np.array_equal(np.asarray(codes)[:, h, :, j], dist.argmin(-1))
            want = qs[:, h, :, j] @ c[h, j].T  # [B, G, K]
            np.testing.assert_allclose(np.asarray(tables)[:, h, :, j], want, rtol=1e-4, atol=1e-4)
    recon = np.asarray(book.reconstruct(layer, codes))  # [B, n_kv, N, d]
    picked = np.asarray(codes).astype(np.int64)
    for h in range(2):
        for j in range(s):
            want = c[h, j][picked[:, h, :, j]]
            np.testing.assert_allclose(
                recon[:, h, :, j * sub_dim : (j + 1) * sub_dim], want, rtol=1e-6
            )


@pytest.mark.parametrize("sub_dim", [16, 8])
@pytest.mark.parametrize(
    "rope",
    [
        RopeSpec(dims=16, traditional=False, base=10000.0, head_dim=16),
        RopeSpec(dims=16, traditional=True, base=1e6, scale=1.3, head_dim=16),  # magnitude
        RopeSpec(dims=8, traditional=False, base=500000.0, head_dim=16),  # partial rotary
    ],
)
def test_a_decode_step_codes_its_key_as_a_prefill_does(sub_dim, rope):
    """`assign_rotated` (the decode step: the step's un-rotation matrix, one compiled
    function) gives the codes `assign` gives the key un-rotated by RoPE."""
    keys, queries = _keys_queries(4, n_layers=2)
    book = Codebook.fit(keys, queries, n_centroids=64, sub_dim=sub_dim, seed=1)
    rng = np.random.default_rng(3)
    same = total = 0
    for position in (0, 17, 4095, 100_000):
        post = mx.array(rng.standard_normal((2, 2, 1, 16)).astype(np.float32) * 3)
        want = book.assign(1, rope.unrotate(post, position))
        got = book.assign_rotated(1, post, att.step_unrotation(rope, position))
        assert got.shape == want.shape and got.dtype == mx.uint16
        same += int(np.sum(np.asarray(got) == np.asarray(want)))
        total += want.size
    assert same == total
    with pytest.raises(ValueError, match="do not fit the codebook"):
        book.assign_rotated(1, post[:, :1], att.step_unrotation(rope, 5))


def _fitted_for(model, **meta):
    keys, queries = _keys_queries(5, n_layers=2, n_kv=2, d=16)
    metadata = {"model": model_fingerprint(model, name="tiny"), "far_offset": 2048}
    metadata.update(meta)
    return Codebook.fit(keys, queries, n_centroids=8, seed=0, metadata=metadata)


def test_save_load_round_trip(tmp_path):
    model = tiny_model("llama")
    book = _fitted_for(model, corpus="unit test", tokens=600)
    path = tmp_path / "book.safetensors"
    book.save(path)
    loaded = Codebook.load(path)
    for name in ("centroids", "assign_centroids", "chol"):
        for a, b in zip(getattr(book, name), getattr(loaded, name), strict=True):
            assert np.array_equal(np.asarray(a), np.asarray(b))
    assert loaded.metadata["corpus"] == "unit test"
    assert loaded.metadata["model"] == book.metadata["model"]
    assert loaded.sha256 == book.sha256
    keys = mx.random.normal((1, 2, 50, 16), key=mx.random.key(0))
    assert np.array_equal(np.asarray(loaded.assign(0, keys)), np.asarray(book.assign(0, keys)))
    assert loaded.validate_for(model, A2ATSConfig()) == []
    assert loaded.nbytes >= 3 * 2 * 2 * 8 * 16 * 4


def test_truncated_files_are_named(tmp_path):
    model = tiny_model("llama")
    path = tmp_path / "book.safetensors"
    _fitted_for(model).save(path)
    data = path.read_bytes()
    for cut in (len(data) - 10, len(data) // 2, 40):
        bad = tmp_path / f"cut{cut}.safetensors"
        bad.write_bytes(data[:cut])
        with pytest.raises(CodebookError, match="file is truncated"):
            Codebook.load(bad)


def test_foreign_files_are_named(tmp_path):
    text = tmp_path / "notes.safetensors"
    text.write_text("hello, this is not a codebook at all")
    with pytest.raises(CodebookError, match="not an A2ATS codebook file"):
        Codebook.load(text)
    other = tmp_path / "weights.safetensors"
    mx.save_safetensors(str(other), {"w": mx.zeros((4, 4))})
    with pytest.raises(CodebookError, match="not an A2ATS codebook file"):
        Codebook.load(other)
    empty = tmp_path / "empty.safetensors"
    empty.write_bytes(b"")
    with pytest.raises(CodebookError, match="not an A2ATS codebook file"):
        Codebook.load(empty)
    with pytest.raises(CodebookError, match="not found"):
        Codebook.load(tmp_path / "missing.safetensors")


def test_mismatched_models_are_named():
    model = tiny_model("llama")
    with pytest.raises(CodebookError, match="codebook is for 3 layers, the model has 2"):
        Codebook.random(3, 2, 16, 8).validate_for(model)
    with pytest.raises(CodebookError, match="head dim 32 vs 16"):
        Codebook.random(2, 2, 32, 8).validate_for(model)
    with pytest.raises(CodebookError, match="codebook is for 1 KV heads, the model has 2"):
        Codebook.random(2, 1, 16, 8).validate_for(model)
    other_rope = tiny_model("llama", rope_theta=500000.0)
    with pytest.raises(CodebookError, match="RoPE.*base 10000.0 vs 500000.0"):
        _fitted_for(model).validate_for(other_rope)
    trad = tiny_model("llama", rope_traditional=True)
    with pytest.raises(CodebookError, match="traditional False vs True"):
        _fitted_for(model).validate_for(trad)


def test_soft_mismatches_warn():
    model = tiny_model("llama")
    book = _fitted_for(model)
    with pytest.warns(UserWarning, match="far_offset 2048"):
        found = book.validate_for(model, A2ATSConfig(far_offset=1024))
    assert len(found) == 1 and "1024" in found[0]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert book.validate_for(model, A2ATSConfig()) == []
        other = tiny_model("llama", intermediate_size=96)  # same geometry, different model
        assert any("different model" in f for f in book.validate_for(other))
        assert any(
            "no model fingerprint" in f for f in Codebook.random(2, 2, 16, 8).validate_for(model)
        )


def test_random_codebook_geometry_and_bad_settings():
    book = Codebook.random(3, 2, 16, 32, sub_dim=8, seed=1)
    assert (book.num_layers, book.num_kv_heads, book.head_dim, book.n_centroids) == (3, 2, 16, 32)
    assert book.num_subspaces == 2
    with pytest.raises(ValueError, match="sub_dim"):
        Codebook.random(1, 1, 16, 8, sub_dim=5)
    keys, queries = _keys_queries(6, n_layers=1)
    with pytest.raises(ValueError, match="n_centroids"):
        Codebook.fit(keys, queries, n_centroids=1)
    with pytest.raises(ValueError, match="beta"):
        Codebook.fit(keys, queries, n_centroids=8, beta=1.5)
    with pytest.raises(ValueError, match="sub_dim"):
        Codebook.fit(keys, queries, n_centroids=8, sub_dim=3)
    with pytest.raises(ValueError, match="keys"):
        book.assign(0, mx.zeros((1, 2, 4, 8)))


def test_changed_buckets_or_window_warn_like_far_offset():
    """far_buckets and window set the distances the query moments were rotated to."""
    model = tiny_model("llama")
    book = _fitted_for(model, far_buckets=4, window=64)
    with pytest.warns(UserWarning, match="far_buckets 4, the cache uses 2"):
        found = book.validate_for(model, A2ATSConfig(far_buckets=2))
    assert len(found) == 1
    with pytest.warns(UserWarning, match="window 64, the cache uses 32"):
        found = book.validate_for(model, A2ATSConfig(window=32))
    assert len(found) == 1
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert book.validate_for(model, A2ATSConfig(window=64, far_buckets=4)) == []


@pytest.mark.parametrize(
    "name, value, problem",
    [
        ("centroids", float("nan"), "not finite"),
        ("assign_centroids", float("inf"), "not finite"),
        ("chol", float("-inf"), "not finite"),
        ("centroids", 1e30, "beyond"),
    ],
)
def test_non_finite_or_absurd_arrays_are_refused_at_load(tmp_path, name, value, problem):
    book = Codebook.random(2, 2, 16, n_centroids=8, seed=0)
    path = tmp_path / "bad.safetensors"
    book.save(path)
    arrays, meta = mx.load(str(path), return_metadata=True)
    arrays[f"layers.1.{name}"] = mx.full(arrays[f"layers.1.{name}"].shape, value)
    mx.save_safetensors(str(path), arrays, metadata=meta)
    with pytest.raises(CodebookError, match=problem) as info:
        Codebook.load(path)
    message = str(info.value)
    assert message.startswith("bad.safetensors:") and f"layers.1.{name}" in message
    assert "\n" not in message


def test_codebook_info_says_a_nan_codebook_does_not_load(tmp_path, capsys):
    from a2ats_engine.cli import main

    book = Codebook.random(2, 2, 16, n_centroids=8, seed=0)
    path = tmp_path / "nan.safetensors"
    book.save(path)
    arrays, meta = mx.load(str(path), return_metadata=True)
    arrays = {k: mx.full(v.shape, float("nan")) for k, v in arrays.items()}
    mx.save_safetensors(str(path), arrays, metadata=meta)
    assert main(["codebook-info", str(path)]) == 1
    captured = capsys.readouterr()
    assert "fits" not in captured.out
    assert "nan.safetensors" in captured.err and "not finite" in captured.err


@pytest.mark.parametrize("key, value", [("model", "x"), ("far_offset", "abc"), ("tokens", 1.5)])
def test_metadata_of_the_wrong_type_is_refused_at_load(tmp_path, key, value):
    import json

    book = Codebook.random(2, 2, 16, n_centroids=8, seed=0)
    path = tmp_path / "meta.safetensors"
    book.save(path)
    arrays, meta = mx.load(str(path), return_metadata=True)
    blob = json.loads(meta["a2ats"])
    blob[key] = value
    mx.save_safetensors(str(path), arrays, metadata={"a2ats": json.dumps(blob)})
    with pytest.raises(CodebookError, match=f"meta.safetensors: file is damaged .*{key}"):
        Codebook.load(path)
