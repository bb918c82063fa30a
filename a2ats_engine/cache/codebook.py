"""Codebook: query-aware VQ centroids per layer x KV head (assign, score tables, reconstruct, fit).

Math (docs/ARCHITECTURE.md, "The method"). Keys are row vectors in the pre-RoPE frame. The score
error of a code is `E_q[(q~ . (k - c))^2] = (k - c)^T H (k - c)` with `H = E[q~ q~^T]` over the
WRoPE queries of the KV head's GQA group. With `H = L L^T` (Cholesky) that is `||(k - c) L||^2`, so
k-means on `kL` minimises it. Per layer we hold

    C  = centroids         [n_kv, S, K, sub_dim]   key space: score tables `q . C_j`
    C' = assign_centroids  [n_kv, S, K, sub_dim]   `C' = C L`: assignment `argmin ||kL - C'_j||`
    L  = chol              [n_kv, S, sub_dim, sub_dim]

S = head_dim // sub_dim subspaces (S = 1: full-dim VQ; S > 1: product VQ, H restricted to its
diagonal blocks, per-subspace tables summed by the user of `score_tables`).

The file format (`save`, `load`) lives in `codebook_file.py`; the model fingerprint and the
checks of `validate_for` against a model and a config in `codebook_check.py`.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import os
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import mlx.core as mx
import numpy as np

from ..errors import CodebookError
from ..files import sha256_file
from .codebook_check import fit_problems
from .codebook_codes import codes_of_rotated, table_scores
from .codebook_file import (
    FORMAT_NAME,
    FORMAT_VERSION,
    layer_arrays,
    read_codebook_arrays,
    read_layer_arrays,
    read_metadata,
    write_codebook_file,
)
from .kmeans import Interrupt, KMeansCallback, kmeans

DEFAULT_RIDGE = 1e-3
_ASSIGN_BLOCK_ELEMENTS = 1 << 24  # bound on a [.., N_chunk, K] distance block in `assign`


class Codebook:
    """Query-aware VQ codebook for every attention layer of one model (see module docstring)."""

    def __init__(
        self,
        centroids: Sequence[mx.array],
        chol: Sequence[mx.array] | None = None,
        metadata: dict[str, Any] | None = None,
        assign_centroids: Sequence[mx.array] | None = None,
    ) -> None:
        """centroids[l] `[n_kv, S, K, sub_dim]`; chol[l] `[n_kv, S, sub_dim, sub_dim]` lower
        triangular (None = identity, plain VQ); assign_centroids[l] = `C L` (computed if None)."""
        if not centroids:
            raise ValueError("Codebook needs at least one layer of centroids")
        self._centroids = [mx.array(c, dtype=mx.float32) for c in centroids]
        shape = self._centroids[0].shape
        if len(shape) != 4:
            raise ValueError(f"centroids must be [n_kv, S, K, sub_dim], got {tuple(shape)}")
        for i, c in enumerate(self._centroids):
            if c.shape != shape:
                raise ValueError(f"layer {i} centroids {tuple(c.shape)} != layer 0 {shape}")
        n_kv, s, _, sd = shape
        if chol is None:
            eye = mx.broadcast_to(mx.eye(sd, dtype=mx.float32), (n_kv, s, sd, sd))
            chol = [eye] * len(self._centroids)
        self._chol = [mx.array(x, dtype=mx.float32) for x in chol]
        if len(self._chol) != len(self._centroids) or any(
            x.shape != (n_kv, s, sd, sd) for x in self._chol
        ):
            raise ValueError("chol must hold one [n_kv, S, sub_dim, sub_dim] array per layer")
        if assign_centroids is None:
            assign_centroids = [c @ x for c, x in zip(self._centroids, self._chol, strict=True)]
        self._assign = [mx.array(x, dtype=mx.float32) for x in assign_centroids]
        if len(self._assign) != len(self._centroids) or any(x.shape != shape for x in self._assign):
            raise ValueError("assign_centroids must match centroids layer for layer")
        mx.eval(self._centroids, self._chol, self._assign)
        self.metadata: dict[str, Any] = dict(metadata or {})
        self._assign_weights: dict[int, mx.array] = {}
        self._sha256: str | None = None

    # -- geometry -------------------------------------------------------------------------
    @property
    def num_layers(self) -> int:
        return len(self._centroids)

    @property
    def num_kv_heads(self) -> int:
        return int(self._centroids[0].shape[0])

    @property
    def num_subspaces(self) -> int:
        return int(self._centroids[0].shape[1])

    @property
    def n_centroids(self) -> int:
        return int(self._centroids[0].shape[2])

    @property
    def sub_dim(self) -> int:
        return int(self._centroids[0].shape[3])

    @property
    def head_dim(self) -> int:
        return self.sub_dim * self.num_subspaces

    @property
    def centroids(self) -> list[mx.array]:
        """C per layer `[n_kv, S, K, sub_dim]` (key space)."""
        return list(self._centroids)

    @property
    def assign_centroids(self) -> list[mx.array]:
        """C' = C L per layer `[n_kv, S, K, sub_dim]` (assignment space)."""
        return list(self._assign)

    @property
    def chol(self) -> list[mx.array]:
        """L per layer `[n_kv, S, sub_dim, sub_dim]`, H = L L^T."""
        return list(self._chol)

    @property
    def nbytes(self) -> int:
        """Bytes held in memory: C, C', L and the lazily built assignment matrices."""
        held = self._centroids + self._assign + self._chol + list(self._assign_weights.values())
        return int(sum(a.nbytes for a in held))

    # -- use --------------------------------------------------------------------------------
    def _weights(self, layer: int) -> mx.array:
        """`[n_kv, S, sub_dim + 1, K]`: rows `-2 W^T` and a last row `||C'_j||^2`, W = C' L^T.

        `[k, 1] @ this` = `||C'_j||^2 - 2 k . W_j`, which differs from `||kL - C'_j||^2` only
        by `||kL||^2` (constant per key), so its argmin over j is the code. One matmul."""
        w = self._assign_weights.get(layer)
        if w is None:
            c_assign = self._assign[layer]
            w_rows = c_assign @ mx.swapaxes(self._chol[layer], -1, -2)  # [n_kv, S, K, sd]
            norms = mx.sum(c_assign * c_assign, axis=-1, keepdims=True)  # [n_kv, S, K, 1]
            w = mx.swapaxes(mx.concatenate([-2.0 * w_rows, norms], axis=-1), -1, -2)
            mx.eval(w)
            self._assign_weights[layer] = w
        return w

    def _check_keys(self, layer: int, keys: mx.array) -> None:
        self._check_layer(layer)
        if keys.shape[1] != self.num_kv_heads or keys.shape[3] != self.head_dim:
            raise ValueError(f"keys {tuple(keys.shape)} do not fit the codebook "
                             f"({self.num_kv_heads} KV heads, head dim {self.head_dim})")  # fmt: skip

    def _check_layer(self, layer: int) -> None:
        if not 0 <= layer < self.num_layers:
            raise ValueError(f"layer={layer} is out of range: the codebook has {self.num_layers}")

    def assign(self, layer: int, keys: mx.array) -> mx.array:
        """Codes of pre-RoPE keys: `[B, n_kv, N, head_dim]` -> uint16 `[B, n_kv, N, S]`.

        `code = argmin_j ||k L - C'_j||^2`, one matmul per block of keys (no per-head loop)."""
        self._check_keys(layer, keys)
        b, h, n, d = keys.shape
        s, sd = self.num_subspaces, self.sub_dim
        w = self._weights(layer)  # [n_kv, S, sd+1, K]
        x = keys.astype(mx.float32).reshape(b, h, n, s, sd).transpose(0, 1, 3, 2, 4)
        x = mx.concatenate([x, mx.ones((b, h, s, n, 1), dtype=mx.float32)], axis=-1)
        step = max(1, min(n, _ASSIGN_BLOCK_ELEMENTS // max(1, b * h * s * self.n_centroids)))
        if step >= n:
            codes = mx.argmin(x @ w, axis=-1)
        else:
            codes = mx.concatenate(
                [mx.argmin(x[:, :, :, i : i + step] @ w, axis=-1) for i in range(0, n, step)],
                axis=-1,
            )
        return codes.astype(mx.uint16).transpose(0, 1, 3, 2)  # [B, n_kv, N, S]

    def assign_rotated(self, layer: int, keys: mx.array, unrotation: mx.array) -> mx.array:
        """`assign` of post-RoPE decode keys `[B, n_kv, 1, head_dim]` whose pre-RoPE rows are
        `keys @ unrotation` (`attention.step_unrotation`): the same codes in one compiled
        function (a decode step's one row per head, so no blocks)."""
        self._check_keys(layer, keys)
        return codes_of_rotated(keys, unrotation, self._weights(layer))

    def score_tables(self, layer: int, queries: mx.array) -> mx.array:
        """Lookup tables: queries `[B, n_kv, G, head_dim]` -> `[B, n_kv, G, S, K]` float32,
        `tables[..., s, j] = q_s . C_{s,j}` (q_s: the s-th sub_dim slice of the query)."""
        return table_scores(queries, self.scoring_centroids(layer, queries))

    def scoring_centroids(self, layer: int, queries: mx.array | None = None) -> mx.array:
        """The layer's centroids C `[n_kv, S, K, sub_dim]` that `score_tables` scores against,
        after checking the layer and, when given, that queries `[B, n_kv, G, head_dim]` fit."""
        self._check_layer(layer)
        if queries is not None:
            _, h, _, d = queries.shape
            if h != self.num_kv_heads or d != self.head_dim:
                raise ValueError(
                    f"queries {tuple(queries.shape)} do not fit the codebook "
                    f"({self.num_kv_heads} KV heads, head dim {self.head_dim})"
                )
        return self._centroids[layer]

    def reconstruct(self, layer: int, codes: mx.array) -> mx.array:
        """Centroid keys of codes: `[B, n_kv, N, S]` -> `[B, n_kv, N, head_dim]` float32."""
        self._check_layer(layer)
        b, h, n, s = codes.shape
        k, sd = self.n_centroids, self.sub_dim
        head = mx.arange(h, dtype=mx.int32)[None, :, None, None]
        sub = mx.arange(s, dtype=mx.int32)[None, None, None, :]
        flat = (head * s + sub) * k + codes.astype(mx.int32)
        table = self._centroids[layer].reshape(-1, sd)
        return mx.take(table, flat.reshape(-1), axis=0).reshape(b, h, n, s * sd)

    # -- training ---------------------------------------------------------------------------
    @classmethod
    def fit(
        cls,
        keys: Sequence[mx.array],
        queries: Sequence[mx.array] | None = None,
        *,
        n_centroids: int,
        query_moments: Sequence[mx.array] | None = None,
        sub_dim: int | None = None,
        beta: float = 0.0,
        seed: int = 0,
        max_iters: int = 25,
        tol: float = 1e-4,
        ridge: float = DEFAULT_RIDGE,
        metadata: dict[str, Any] | None = None,
        callback: KMeansCallback | None = None,
        interrupt: Interrupt | None = None,
    ) -> Codebook:
        """Train a codebook.

        keys[l]: pre-RoPE keys `[n_kv, N, head_dim]`; queries[l]: WRoPE queries `[n_kv, M,
        head_dim]` (every query head of the GQA group stacked along M), or instead
        query_moments[l] = `sum q q^T` `[n_kv, head_dim, head_dim]` (what calibration streams).
        No queries or beta == 1 gives plain nearest-centroid VQ (L = I exactly). All heads, subspaces and
        layers with the same N are clustered in one batched k-means call.
        `callback(iteration, max_iters)` and `interrupt()` are forwarded to k-means (either may
        raise to abort).
        """
        geometry = _check_fit_inputs(keys, queries, n_centroids, beta, ridge)
        n_kv, d = geometry
        sub_dim = d if sub_dim is None else sub_dim
        if isinstance(sub_dim, bool) or not isinstance(sub_dim, int) or sub_dim < 1 or d % sub_dim:
            raise ValueError(f"sub_dim={sub_dim!r} is out of range: must divide head_dim={d}")
        s = d // sub_dim
        if query_moments is not None:
            if queries is not None:
                raise ValueError("Codebook.fit: pass queries or query_moments, not both")
            if len(query_moments) != len(keys) or any(
                m.shape != (n_kv, d, d) for m in query_moments
            ):
                raise ValueError(f"query_moments must be one [{n_kv}, {d}, {d}] array per layer")
        elif queries is not None:
            query_moments = [
                mx.swapaxes(q, 1, 2) @ q for q in (x.astype(mx.float32) for x in queries)
            ]
        query_aware = query_moments is not None and float(beta) < 1.0
        chol = [
            metric_from_moment(query_moments[i], sub_dim, beta, ridge)
            if query_aware
            else mx.broadcast_to(mx.eye(sub_dim, dtype=mx.float32), (n_kv, s, sub_dim, sub_dim))
            for i in range(len(keys))
        ]
        assign, iterations = _cluster_layers(
            keys, chol, n_centroids, sub_dim, seed=seed, max_iters=max_iters, tol=tol,
            callback=callback, interrupt=interrupt,
        )  # fmt: skip
        centroids = [_map_back(c, x) for c, x in zip(assign, chol, strict=True)]
        meta = {
            "format": FORMAT_NAME,
            "format_version": FORMAT_VERSION,
            "n_centroids": int(n_centroids),
            "sub_dim": int(sub_dim),
            "beta": float(beta),
            "query_aware": bool(query_aware),
            "ridge": float(ridge),
            "seed": int(seed),
            "kmeans_iterations": iterations,
            "keys_per_head": int(keys[0].shape[1]),
            "created": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
        }
        meta.update(metadata or {})
        return cls(centroids, chol, meta, assign_centroids=assign)

    @classmethod
    def random(
        cls,
        num_layers: int,
        num_kv_heads: int,
        head_dim: int,
        n_centroids: int,
        sub_dim: int | None = None,
        seed: int = 0,
    ) -> Codebook:
        """Standard-normal centroids, L = I: for wiring and tests only (retrieval is random)."""
        sub_dim = head_dim if sub_dim is None else sub_dim
        if sub_dim < 1 or head_dim % sub_dim:
            raise ValueError(f"sub_dim={sub_dim} is out of range: must divide head_dim={head_dim}")
        if not 2 <= n_centroids <= 65536:
            raise ValueError(f"n_centroids={n_centroids} is out of range: must be in [2, 65536]")
        key = mx.random.key(seed)
        shape = (num_kv_heads, head_dim // sub_dim, n_centroids, sub_dim)
        keys = mx.random.split(key, num_layers)
        centroids = [mx.random.normal(shape, key=keys[i]) for i in range(num_layers)]
        meta = {
            "format": FORMAT_NAME,
            "format_version": FORMAT_VERSION,
            "n_centroids": n_centroids,
            "sub_dim": sub_dim,
            "beta": 1.0,
            "query_aware": False,
            "random": True,
            "seed": seed,
            "created": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
        }
        return cls(centroids, None, meta)

    # -- files (format: codebook_file.py) ------------------------------------------------------
    def save(self, path: str | os.PathLike) -> None:
        """Write one safetensors file (atomically: a temporary file renamed into place)."""
        path = Path(path)
        arrays = self.to_arrays()
        meta = dict(self.metadata)
        meta.setdefault("format", FORMAT_NAME)
        meta["format_version"] = FORMAT_VERSION
        meta.update(
            num_layers=self.num_layers,
            num_kv_heads=self.num_kv_heads,
            head_dim=self.head_dim,
            n_centroids=self.n_centroids,
            sub_dim=self.sub_dim,
        )
        self.metadata = meta
        write_codebook_file(path, arrays, meta)
        self._sha256 = sha256_file(path)

    def to_arrays(self, prefix: str = "") -> dict[str, mx.array]:
        """The codebook's arrays under the one layout codebook and session files share:
        `{prefix}layers.{l}.centroids`, `.assign_centroids`, `.chol` for every layer l."""
        return layer_arrays(self._centroids, self._assign, self._chol, prefix)

    @classmethod
    def from_arrays(
        cls,
        arrays: dict[str, mx.array],
        metadata: dict[str, Any],
        num_layers: Any,
        prefix: str = "",
        where: str = "codebook",
    ) -> Codebook:
        """The inverse of `to_arrays`. CodebookError naming `where` for a missing or bad array."""
        centroids, assign, chol = read_layer_arrays(arrays, num_layers, prefix, where)
        try:
            return cls(centroids, chol, metadata, assign_centroids=assign)
        except ValueError as exc:
            raise CodebookError(f"{where}: file is damaged ({exc})") from exc

    @classmethod
    def load(cls, path: str | os.PathLike) -> Codebook:
        """Read a codebook file. CodebookError (one line) for a missing, foreign, truncated,
        damaged or too-new file."""
        path = Path(path)
        meta = read_metadata(path)
        arrays = read_codebook_arrays(path)
        book = cls.from_arrays(arrays, meta, meta.get("num_layers"), where=path.name)
        if (book.n_centroids, book.sub_dim) != (meta.get("n_centroids"), meta.get("sub_dim")):
            raise CodebookError(f"{path.name}: file is damaged (arrays disagree with metadata)")
        book._sha256 = sha256_file(path)
        return book

    def identify_as(self, sha256: str) -> None:
        """Take the sha256 of the file these arrays were read from (a session file stores the
        codebook's arrays, not its file: caches saved with it record the file's hash)."""
        self._sha256 = sha256

    @property
    def sha256(self) -> str:
        """SHA-256 of the file this codebook was loaded from / saved to, else of its arrays."""
        if self._sha256 is None:
            digest = hashlib.sha256()
            for arr in self._centroids + self._assign + self._chol:
                digest.update(np.asarray(arr).tobytes())
            self._sha256 = digest.hexdigest()
        return self._sha256

    # -- model fit (checks: codebook_check.py) ----------------------------------------------
    def validate_for(self, model: Any, config: Any | None = None) -> list[str]:
        """Check that this codebook fits `model` (and `config`, an A2ATSConfig).

        Raises CodebookError naming the first hard mismatch (layers, KV heads, head dim, RoPE).
        Returns warnings for soft ones (the config's far_offset, far_buckets or window differs
        from the one the codebook was calibrated with: they set the distances its query moments
        were rotated to; a different model with the same geometry); each is also issued with
        `warnings.warn`. The codebook's own n_centroids and sub_dim are what a cache uses."""
        shape = (self.num_layers, self.num_kv_heads, self.head_dim)
        found = fit_problems(shape, self.metadata, model, config)
        for message in found:
            warnings.warn(message, stacklevel=2)
        return found

    def summary(self) -> str:
        """Human-readable one-paragraph description (for `a2ats codebook-info` and the GUI)."""
        m = self.metadata
        model = m.get("model") or {}
        kind = "query-aware" if m.get("query_aware") else "plain"
        if m.get("random"):
            kind = "random"
        lines = [
            f"{kind} VQ codebook: {self.num_layers} layers x {self.num_kv_heads} KV heads, "
            f"head dim {self.head_dim}, {self.n_centroids} centroids, sub_dim {self.sub_dim} "
            f"({self.num_subspaces} subspace{'s' if self.num_subspaces > 1 else ''}), "
            f"beta {m.get('beta')}",
            f"model: {model.get('name') or model.get('model_type', 'unknown')}",
            f"far_offset: {m.get('far_offset')}, calibration tokens: {m.get('tokens')}, "
            f"corpus: {m.get('corpus', 'unknown')}",
            f"created: {m.get('created')}, {self.nbytes / 2**20:.1f} MiB, sha256 {self.sha256[:16]}",
        ]
        return "\n".join(lines)

    def __repr__(self) -> str:
        return (
            f"Codebook(layers={self.num_layers}, kv_heads={self.num_kv_heads}, "
            f"head_dim={self.head_dim}, n_centroids={self.n_centroids}, sub_dim={self.sub_dim})"
        )


# -- query metric -----------------------------------------------------------------------------


def query_metric(
    queries: mx.array, sub_dim: int, beta: float = 0.0, ridge: float = DEFAULT_RIDGE
) -> mx.array:
    """Cholesky factors of the blended query second moment, per KV head and subspace.

    queries `[n_kv, M, d]` -> L `[n_kv, S, sub_dim, sub_dim]` (see `metric_from_moment`)."""
    if queries.shape[1] == 0:
        raise ValueError("query_metric: no queries (M = 0)")
    q = queries.astype(mx.float32)
    return metric_from_moment(mx.swapaxes(q, 1, 2) @ q, sub_dim, beta, ridge)


def metric_from_moment(
    moment: mx.array, sub_dim: int, beta: float = 0.0, ridge: float = DEFAULT_RIDGE
) -> mx.array:
    """moment `[n_kv, d, d]` = `sum q q^T` (any positive scale) -> L `[n_kv, S, sd, sd]`.

    L is lower triangular with `L L^T = beta * (tr(H)/d) I + (1 - beta) H`, where H is the
    moment scaled to unit RMS (tr(H) = d) plus `ridge * I`, restricted to its S diagonal blocks.
    float64 Cholesky (numpy)."""
    second = np.asarray(mx.array(moment, dtype=mx.float32), dtype=np.float64)
    d = second.shape[-1]
    if not np.all(np.isfinite(second)):
        raise ValueError("query second moment has non-finite entries (NaN/inf queries)")
    trace = np.trace(second, axis1=1, axis2=2)[:, None, None]
    h = second * (d / np.maximum(trace, 1e-30)) + ridge * np.eye(d)
    h_beta = beta * (np.trace(h, axis1=1, axis2=2)[:, None, None] / d) * np.eye(d)
    h_beta = h_beta + (1.0 - beta) * h
    s = d // sub_dim
    blocks = np.stack(
        [
            h_beta[:, i * sub_dim : (i + 1) * sub_dim, i * sub_dim : (i + 1) * sub_dim]
            for i in range(s)
        ],
        axis=1,
    )  # [n_kv, S, sd, sd]
    try:
        chol = np.linalg.cholesky(blocks)
    except np.linalg.LinAlgError as exc:  # ridge > 0 makes this unreachable for finite queries
        raise ValueError(f"query second moment is not positive definite ({exc})") from exc
    return mx.array(chol.astype(np.float32))


def _map_back(assign: mx.array, chol: mx.array) -> mx.array:
    """C = C' L^{-1}: `[n_kv, S, K, sd]`, `[n_kv, S, sd, sd]` -> `[n_kv, S, K, sd]` (float64)."""
    inv = np.linalg.inv(np.asarray(chol, dtype=np.float64))
    return mx.array((np.asarray(assign, dtype=np.float64) @ inv).astype(np.float32))


def _check_fit_inputs(
    keys: Sequence[mx.array],
    queries: Sequence[mx.array] | None,
    n_centroids: int,
    beta: float,
    ridge: float,
) -> tuple[int, int]:
    if not keys:
        raise ValueError("Codebook.fit: keys is empty (one [n_kv, N, d] array per layer)")
    if isinstance(n_centroids, bool) or not isinstance(n_centroids, int):
        raise ValueError(f"n_centroids={n_centroids!r} must be an integer in [2, 65536]")
    if not 2 <= n_centroids <= 65536:
        raise ValueError(f"n_centroids={n_centroids} is out of range: must be in [2, 65536]")
    if not 0.0 <= float(beta) <= 1.0:
        raise ValueError(f"beta={beta!r} is out of range: must be in [0, 1]")
    if not ridge > 0.0:
        raise ValueError(f"ridge={ridge!r} is out of range: must be > 0")
    n_kv, _, d = keys[0].shape
    for i, k in enumerate(keys):
        if k.ndim != 3 or k.shape[0] != n_kv or k.shape[2] != d or k.shape[1] < 1:
            raise ValueError(f"keys[{i}] has shape {tuple(k.shape)}, expected [{n_kv}, N>0, {d}]")
    if queries is not None:
        if len(queries) != len(keys):
            raise ValueError(f"queries has {len(queries)} layers, keys has {len(keys)}")
        for i, q in enumerate(queries):
            if q.ndim != 3 or q.shape[0] != n_kv or q.shape[2] != d or q.shape[1] < 1:
                raise ValueError(
                    f"queries[{i}] has shape {tuple(q.shape)}, expected [{n_kv}, M>0, {d}]"
                )
    return n_kv, d


def _cluster_layers(
    keys: Sequence[mx.array],
    chol: list[mx.array],
    n_centroids: int,
    sub_dim: int,
    *,
    seed: int,
    max_iters: int,
    tol: float,
    callback: KMeansCallback | None,
    interrupt: Interrupt | None = None,
) -> tuple[list[mx.array], int]:
    """k-means on `kL` for every layer, one batched problem per group of layers with equal N.
    Returns (C' per layer `[n_kv, S, K, sd]`, Lloyd iterations of the longest run)."""
    groups: dict[int, list[int]] = {}
    for i, k in enumerate(keys):
        groups.setdefault(int(k.shape[1]), []).append(i)
    out: list[mx.array | None] = [None] * len(keys)
    iterations = 0
    for n, members in sorted(groups.items()):
        mapped = [_mapped_keys(keys[i], chol[i], sub_dim) for i in members]  # [n_kv, S, N, sd]
        n_kv, s = mapped[0].shape[:2]
        stacked = mx.stack(mapped).reshape(-1, n, sub_dim)  # [layers * n_kv * S, N, sd]
        result = kmeans(
            stacked,
            n_centroids,
            seed=seed,
            max_iters=max_iters,
            tol=tol,
            callback=callback,
            interrupt=interrupt,
        )
        iterations = max(iterations, result.iterations)
        cents = result.centroids.reshape(len(members), n_kv, s, n_centroids, sub_dim)
        for j, i in enumerate(members):
            out[i] = cents[j]
    return out, iterations  # type: ignore[return-value]


def _mapped_keys(keys: mx.array, chol: mx.array, sub_dim: int) -> mx.array:
    """kL per subspace: keys `[n_kv, N, d]`, L `[n_kv, S, sd, sd]` -> `[n_kv, S, N, sd]`."""
    n_kv, n, d = keys.shape
    k = keys.astype(mx.float32).reshape(n_kv, n, d // sub_dim, sub_dim).transpose(0, 2, 1, 3)
    return k @ chol


# -- evaluation -----------------------------------------------------------------------------


def relative_score_error(
    codebook: Codebook, keys: Sequence[mx.array], queries: Sequence[mx.array]
) -> float:
    """Mean over layers of `sum (q . (k - c(k)))^2 / sum (q . k)^2` over all query/key pairs.

    keys[l] pre-RoPE `[n_kv, N, d]`, queries[l] WRoPE `[n_kv, M, d]` (held-out data)."""
    moments = []
    for q in queries:
        q32 = q.astype(mx.float32)
        moments.append(mx.swapaxes(q32, 1, 2) @ q32)
    return relative_score_error_from_moments(codebook, keys, moments)


def relative_score_error_from_moments(
    codebook: Codebook, keys: Sequence[mx.array], moments: Sequence[mx.array]
) -> float:
    """`relative_score_error` with the queries given by their second moments `sum q q^T`
    (`[n_kv, d, d]` per layer, any positive scale): exact over all pairs, since
    `sum_q (q . e)^2 = e^T (sum_q q q^T) e`."""
    ratios = []
    for layer, (k, second) in enumerate(zip(keys, moments, strict=True)):
        k32 = k.astype(mx.float32)
        second = mx.array(second, dtype=mx.float32)
        codes = codebook.assign(layer, k32[None])
        err = k32 - codebook.reconstruct(layer, codes)[0]
        num = mx.sum((err @ second) * err)
        den = mx.sum((k32 @ second) * k32)
        ratios.append(float((num / mx.maximum(den, 1e-30)).item()))
    return float(np.mean(ratios))
