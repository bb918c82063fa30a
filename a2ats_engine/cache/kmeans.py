"""k-means++ initialisation and Lloyd iterations in MLX, batched over independent problems.

Every function works on `H` independent point sets at once (`x` is `[H, N, d]`: one set per
layer x KV head x subspace), so one call keeps the matmul units busy instead of looping over heads.
Distances are computed as `||c||^2 - 2 x . c` with batched matmuls (the `||x||^2` term does not
change an argmin), in chunks over N so the `[H, chunk, K]` distance block stays bounded.
Centroid updates are a one-hot matmul (also GEMM), so an iteration costs about `4 H N K d` flops.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import mlx.core as mx

# Upper bound on the elements of one [H, chunk, K] distance block (float32: 32 MiB; small
# blocks stay in cache, measured as fast as larger ones).
_BLOCK_ELEMENTS = 1 << 23

INIT_POINTS_PER_CENTROID = 4
INIT_MIN_POINTS = 4096

Interrupt = Callable[[], None]
"""Called often (between distance blocks and seeding steps, well under a second apart); it may
raise to abort the clustering (calibration's cancel does this)."""

KMeansCallback = Callable[[int, int], None]
"""`callback(iteration, max_iters)`, called after the init and after every Lloyd iteration.
It may raise to abort (calibration cancels this way)."""


@dataclass(frozen=True)
class KMeansResult:
    """centroids `[H, K, d]` float32, codes `[H, N]` int32, inertia per problem `[H]` (mean
    squared distance of a point to its centroid), Lloyd iterations run."""

    centroids: mx.array
    codes: mx.array
    inertia: mx.array
    iterations: int


def _chunk_size(h: int, n: int, k: int) -> int:
    return max(1, min(n, _BLOCK_ELEMENTS // max(1, h * k)))


def nearest(x: mx.array, centroids: mx.array) -> tuple[mx.array, mx.array]:
    """Nearest centroid of every point.

    x `[H, N, d]`, centroids `[H, K, d]` -> (codes `[H, N]` int32, squared distances `[H, N]`).
    """
    x = x.astype(mx.float32)
    return _nearest_augmented(_augment(x), x, centroids.astype(mx.float32))


def _augment(x: mx.array) -> mx.array:
    """`[H, N, d]` -> `[H, N, d + 1]` with a trailing column of ones (see `_nearest_augmented`)."""
    return mx.concatenate([x, mx.ones((*x.shape[:-1], 1), dtype=x.dtype)], axis=-1)


def _nearest_augmented(
    x_aug: mx.array, x: mx.array, centroids: mx.array, interrupt: Interrupt | None = None
) -> tuple[mx.array, mx.array]:
    """`argmin_j ||c_j||^2 - 2 x . c_j` as ONE matmul: [x, 1] @ [-2 c_j, ||c_j||^2]^T.
    Folding the norms into the GEMM avoids an elementwise pass over the [H, N, K] block, which
    costs as much as the matmul itself on a CPU."""
    h, n, _ = x.shape
    k = centroids.shape[1]
    norms = mx.sum(centroids * centroids, axis=-1, keepdims=True)  # [H, K, 1]
    c_aug = mx.swapaxes(mx.concatenate([-2.0 * centroids, norms], axis=-1), 1, 2)  # [H, d+1, K]
    step = _chunk_size(h, n, k)
    codes = []
    for start in range(0, n, step):
        if interrupt is not None:
            interrupt()
        idx = mx.argmin(x_aug[:, start : start + step] @ c_aug, axis=-1)
        mx.eval(idx)
        codes.append(idx.astype(mx.int32))
    codes = mx.concatenate(codes, axis=1)
    diff = x - mx.take_along_axis(centroids, codes[..., None], axis=1)
    dists = mx.sum(diff * diff, axis=-1)
    mx.eval(dists)
    return codes, dists


def kmeans_plus_plus(
    x: mx.array, k: int, key: mx.array, interrupt: Interrupt | None = None
) -> mx.array:
    """k-means++ seeding (D^2 sampling), batched. x `[H, N, d]` with N >= k -> `[H, k, d]`."""
    x = x.astype(mx.float32)
    h, n, d = x.shape
    x_norms = mx.sum(x * x, axis=-1)  # [H, N]
    rows = mx.arange(h)
    keys = mx.random.split(key, k)
    first = mx.random.randint(0, n, shape=(h,), key=keys[0])
    chosen = [first]
    centre = x[rows, first]  # [H, d]
    best = _sq_dist_to(x, x_norms, centre)
    mx.eval(best)
    for i in range(1, k):
        if interrupt is not None and i % 16 == 0:
            interrupt()
        # Normalise per problem so all-zero distances (duplicate points) become a uniform draw.
        scaled = best / (mx.max(best, axis=-1, keepdims=True) + 1e-30)
        logits = mx.log(scaled + 1e-12)
        pick = mx.random.categorical(logits, axis=-1, key=keys[i])  # [H]
        chosen.append(pick)
        centre = x[rows, pick]
        best = mx.minimum(best, _sq_dist_to(x, x_norms, centre))
        mx.eval(best, pick)
    idx = mx.stack(chosen, axis=1)  # [H, k]
    return mx.take_along_axis(x, idx[..., None], axis=1)


def _sq_dist_to(x: mx.array, x_norms: mx.array, centre: mx.array) -> mx.array:
    """Squared distance of every point `[H, N, d]` to one centre per problem `[H, d]` -> `[H, N]`."""
    dots = (x @ centre[:, :, None])[..., 0]
    return mx.maximum(x_norms - 2.0 * dots + mx.sum(centre * centre, axis=-1)[:, None], 0.0)


def _update(
    x: mx.array, codes: mx.array, dists: mx.array, centroids: mx.array
) -> tuple[mx.array, int]:
    """One Lloyd update. Empty clusters are re-seeded with the points farthest from their centroid
    (distinct points per problem, farthest first), which is deterministic and lowers the inertia.
    Returns (new centroids `[H, K, d]`, number of empty clusters re-seeded)."""
    h, n, d = x.shape
    k = centroids.shape[1]
    sums, counts = _cluster_sums(x, codes, k)
    means = sums / mx.maximum(counts, 1.0)[..., None]
    empty = counts == 0
    n_empty = int(mx.sum(empty).item())
    if n_empty == 0:
        return means, 0
    farthest = mx.argsort(-dists, axis=-1)[:, :k]  # [H, K] (N >= K here)
    rank = mx.cumsum(empty.astype(mx.int32), axis=-1) - 1  # i-th empty cluster takes i-th point
    replacement_idx = mx.take_along_axis(farthest, mx.maximum(rank, 0), axis=-1)
    replacement = mx.take_along_axis(x, replacement_idx[..., None], axis=1)
    return mx.where(empty[..., None], replacement, means), n_empty


def _cluster_sums(x: mx.array, codes: mx.array, k: int) -> tuple[mx.array, mx.array]:
    """Per-cluster sums `[H, K, d]` and counts `[H, K]`.

    On the CPU a scatter-add (4x faster than the one-hot GEMM there, and sequential, so
    deterministic). On a GPU scatter-adds are atomic (summation order varies run to run), so the
    one-hot matmul is used: deterministic and GEMM-bound.
    """
    h, n, d = x.shape
    if mx.default_device() == mx.cpu:
        flat = (codes + (mx.arange(h, dtype=mx.int32) * k)[:, None]).reshape(-1)
        sums = mx.zeros((h * k, d), dtype=mx.float32).at[flat].add(x.reshape(-1, d))
        counts = mx.zeros((h * k,), dtype=mx.float32).at[flat].add(1.0)
        return sums.reshape(h, k, d), counts.reshape(h, k)
    sums = mx.zeros((h, k, d), dtype=mx.float32)
    counts = mx.zeros((h, k), dtype=mx.float32)
    arange_k = mx.arange(k)
    step = _chunk_size(h, n, k)
    for start in range(0, n, step):
        one_hot = (codes[:, start : start + step, None] == arange_k).astype(mx.float32)
        sums = sums + mx.swapaxes(one_hot, 1, 2) @ x[:, start : start + step]
        counts = counts + mx.sum(one_hot, axis=1)
        mx.eval(sums, counts)
    return sums, counts


def kmeans(
    x: mx.array,
    k: int,
    *,
    seed: int = 0,
    max_iters: int = 25,
    tol: float = 1e-4,
    callback: KMeansCallback | None = None,
    interrupt: Interrupt | None = None,
) -> KMeansResult:
    """Cluster each of H point sets into k clusters: k-means++ seeding, then Lloyd iterations.

    x `[H, N, d]` (any float dtype; computed in float32), k >= 1. Stops when every problem's
    inertia improves by less than `tol` (relative) or after `max_iters` Lloyd iterations.
    Seeding uses a random subset of `max(4 k, 4096)` points when N is larger.
    When k >= N every point becomes its own centroid and the remaining k - N centroids repeat
    points (a repeated centroid is never the unique nearest one, so codes stay valid).
    Deterministic for a given seed. `callback(iteration, max_iters)` reports progress;
    `interrupt()` is polled often and may raise to abort. Returns a `KMeansResult`.
    """
    if x.ndim != 3:
        raise ValueError(f"kmeans: x must be [H, N, d], got shape {tuple(x.shape)}")
    if k < 1:
        raise ValueError(f"kmeans: k={k} is out of range: must be >= 1")
    if max_iters < 0:
        raise ValueError(f"kmeans: max_iters={max_iters} is out of range: must be >= 0")
    x = x.astype(mx.float32)
    h, n, _ = x.shape
    if n == 0:
        raise ValueError("kmeans: no points to cluster (N = 0)")
    key = mx.random.key(seed)
    if k >= n:
        return _every_point_a_centroid(x, k, key)
    init_key, sample_key = mx.random.split(key)
    centroids = kmeans_plus_plus(_init_sample(x, k, sample_key), k, init_key, interrupt)
    x_aug = _augment(x)
    codes, dists = _nearest_augmented(x_aug, x, centroids, interrupt)
    inertia = mx.mean(dists, axis=-1)
    if callback is not None:
        callback(0, max_iters)
    iterations = 0
    for it in range(1, max_iters + 1):
        centroids, _ = _update(x, codes, dists, centroids)
        codes, dists = _nearest_augmented(x_aug, x, centroids, interrupt)
        new_inertia = mx.mean(dists, axis=-1)
        iterations = it
        improvement = (inertia - new_inertia) / mx.maximum(inertia, 1e-30)
        converged = bool(mx.all(improvement < tol).item())
        inertia = new_inertia
        if callback is not None:
            callback(it, max_iters)
        if converged:
            break
    return KMeansResult(centroids=centroids, codes=codes, inertia=inertia, iterations=iterations)


def _init_sample(x: mx.array, k: int, key: mx.array) -> mx.array:
    """Seed on a random subset of `max(INIT_POINTS_PER_CENTROID * k, INIT_MIN_POINTS)` points.

    k-means++ is k sequential passes over the points; on the full set it would cost more than all
    the Lloyd iterations together. A uniform subsample of a few points per centroid seeds as well
    in practice (Lloyd then runs on every point)."""
    n = x.shape[1]
    limit = max(INIT_POINTS_PER_CENTROID * k, INIT_MIN_POINTS)
    if n <= limit:
        return x
    idx = mx.sort(mx.random.permutation(n, key=key)[:limit])
    return x[:, idx]


def _every_point_a_centroid(x: mx.array, k: int, key: mx.array) -> KMeansResult:
    h, n, _ = x.shape
    order = mx.concatenate([mx.arange(n), mx.random.randint(0, n, shape=(k - n,), key=key)])
    centroids = x[:, order]
    codes = mx.broadcast_to(mx.arange(n, dtype=mx.int32)[None], (h, n))
    return KMeansResult(
        centroids=centroids, codes=codes, inertia=mx.zeros((h,), dtype=mx.float32), iterations=0
    )
