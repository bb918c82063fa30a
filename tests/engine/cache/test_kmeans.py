"""k-means++ / Lloyd in MLX: quality, determinism, edge cases, reference agreement."""

import mlx.core as mx
import numpy as np
import pytest

from a2ats_engine.cache.kmeans import kmeans, nearest


def _blobs(h: int, per_blob: int, centres: np.ndarray, spread: float, seed: int) -> np.ndarray:
    """[h, n_blobs * per_blob, d] points around `centres` [n_blobs, d] (shuffled per head)."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(h):
        pts = np.concatenate(
            [c + spread * rng.standard_normal((per_blob, c.size)) for c in centres]
        )
        out.append(pts[rng.permutation(len(pts))])
    return np.stack(out).astype(np.float32)


def test_separable_clusters_are_recovered():
    rng = np.random.default_rng(1)
    centres = rng.standard_normal((6, 8)) * 20.0
    x = _blobs(3, 50, centres, spread=0.5, seed=2)
    result = kmeans(mx.array(x), 6, seed=0)
    got = np.asarray(result.centroids)  # [3, 6, 8]
    for h in range(3):
        # every true centre has a centroid within a few spreads, and vice versa
        dist = np.linalg.norm(got[h][:, None] - centres[None], axis=-1)
        assert dist.min(axis=0).max() < 1.0
        assert dist.min(axis=1).max() < 1.0
    assert np.all(np.asarray(result.inertia) < 0.5**2 * 8 * 1.5)


def test_deterministic_for_a_seed():
    x = mx.random.normal((2, 500, 16), key=mx.random.key(3))
    a = kmeans(x, 32, seed=7)
    b = kmeans(x, 32, seed=7)
    c = kmeans(x, 32, seed=8)
    assert np.array_equal(np.asarray(a.centroids), np.asarray(b.centroids))
    assert np.array_equal(np.asarray(a.codes), np.asarray(b.codes))
    assert not np.array_equal(np.asarray(a.centroids), np.asarray(c.centroids))


def test_lloyd_lowers_inertia_and_stops_on_tolerance():
    x = mx.random.normal((2, 800, 8), key=mx.random.key(4))
    seeded = kmeans(x, 16, seed=0, max_iters=0)
    trained = kmeans(x, 16, seed=0, max_iters=50, tol=1e-3)
    assert np.all(np.asarray(trained.inertia) < np.asarray(seeded.inertia))
    assert 1 <= trained.iterations < 50


def test_nearest_matches_numpy_reference():
    rng = np.random.default_rng(5)
    x = rng.standard_normal((3, 300, 12)).astype(np.float32)
    c = rng.standard_normal((3, 20, 12)).astype(np.float32)
    codes, dists = nearest(mx.array(x), mx.array(c))
    ref = ((x[:, :, None, :] - c[:, None, :, :]) ** 2).sum(-1)
    assert np.array_equal(np.asarray(codes), ref.argmin(-1))
    np.testing.assert_allclose(np.asarray(dists), ref.min(-1), rtol=1e-4, atol=1e-4)


def test_more_centroids_than_points():
    x = mx.random.normal((2, 6, 4), key=mx.random.key(6))
    result = kmeans(x, 10, seed=0)
    assert result.centroids.shape == (2, 10, 4)
    codes, dists = nearest(x, result.centroids)
    assert np.allclose(np.asarray(dists), 0.0, atol=1e-5)
    assert np.all(np.asarray(result.inertia) == 0.0)


def test_duplicate_points_leave_no_nan_and_reseed_empty_clusters():
    base = np.array([[0.0, 0.0], [5.0, 5.0], [-5.0, 5.0]], dtype=np.float32)
    x = np.repeat(base, 20, axis=0)[None]  # only 3 distinct points, 60 rows
    result = kmeans(mx.array(x), 5, seed=0)
    cents = np.asarray(result.centroids)
    assert np.all(np.isfinite(cents))
    assert np.allclose(np.asarray(result.inertia), 0.0, atol=1e-6)
    # every distinct point has an exact centroid
    for p in base:
        assert np.min(np.linalg.norm(cents[0] - p, axis=-1)) < 1e-5


def test_callback_can_abort():
    calls = []

    def callback(it, total):
        calls.append((it, total))
        if it == 2:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        kmeans(
            mx.random.normal((1, 400, 4), key=mx.random.key(0)),
            8,
            max_iters=10,
            tol=0.0,
            callback=callback,
        )
    assert calls == [(0, 10), (1, 10), (2, 10)]


def test_bad_arguments():
    with pytest.raises(ValueError, match="k=0"):
        kmeans(mx.zeros((1, 4, 2)), 0)
    with pytest.raises(ValueError, match="H, N, d"):
        kmeans(mx.zeros((4, 2)), 2)
