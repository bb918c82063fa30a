"""A codebook's pure functions (MLX ops only, so `mx.compile` can take them): the lookup tables
of queries (`table_scores`) and a decode step's codes in one compiled function
(`Codebook.assign_rotated`): the step's new post-RoPE keys, un-rotated by the step's matrix
(`attention.step_unrotation`), coded against a layer's assignment weights (`Codebook._weights`:
`argmin` of one matmul is the nearest centroid under the codebook's metric, as in
`Codebook.assign`)."""

from __future__ import annotations

import mlx.core as mx


def _codes_of_rotated(keys: mx.array, unrotation: mx.array, weights: mx.array) -> mx.array:
    """`Codebook.assign_rotated`'s body: keys [B, n_kv, n, d] @ unrotation [d, d] -> codes
    uint16 [B, n_kv, n, S] against weights [n_kv, S, sub_dim + 1, K] (`Codebook._weights`)."""
    b, h, n, d = keys.shape
    s = weights.shape[1]
    x = (keys.astype(mx.float32) @ unrotation).reshape(b, h, n, s, d // s).transpose(0, 1, 3, 2, 4)
    x = mx.concatenate([x, mx.ones((b, h, s, n, 1), dtype=mx.float32)], axis=-1)
    codes = mx.argmin(x @ weights, axis=-1)  # [B, n_kv, S, n]
    return codes.astype(mx.uint16).transpose(0, 1, 3, 2)


codes_of_rotated = mx.compile(_codes_of_rotated)


def table_scores(queries: mx.array, centroids: mx.array) -> mx.array:
    """`Codebook.score_tables` as a pure function: queries `[B, n_kv, G, head_dim]`, centroids
    `[n_kv, S, K, sub_dim]` -> `[B, n_kv, G, S, K]` (MLX ops only, so `mx.compile` can fuse it
    into `attention.retrieval_tables`)."""
    b, h, g, _ = queries.shape
    s, sd = centroids.shape[1], centroids.shape[3]
    q = queries.reshape(b, h, g, s, sd).transpose(0, 1, 3, 2, 4)  # [B, n_kv, S, G, sd]
    tables = q @ mx.swapaxes(centroids, -1, -2)  # [B, n_kv, S, G, K]
    return tables.transpose(0, 1, 3, 2, 4)
