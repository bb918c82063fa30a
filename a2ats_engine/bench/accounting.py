"""Equal-cost accounting: what one decode step of one layer attends and reads, per method.

A budget knob is not a cost: A2ATS's "3%" also attends the sinks and the window, takes the
union of the top-K of every query head in a GQA group, scans a code per far token, builds score
tables from the layer's centroids and (with rerank r) reads r*K full keys per query head. This
module counts all of it for one decode step of one layer, from the cache's geometry and the
positions it attended:

  attended_fraction  positions attended per KV head / positions in the cache (sinks, window and
                     GQA union included), averaged over KV heads
  codes              bytes of codes scanned (every far token, every KV head, every subspace)
  centroids          bytes of centroids read to build the score tables (the layer's codebook)
  keys_scored        bytes of full keys read to score far tokens: rerank candidates
                     (r*K per query head), or every far key for exact-score rankings (oracle)
  rows               bytes of K and V rows attended (stored format: model dtype or quantized)

Row bytes are those of the stored format: `d * dtype_bytes` for float K/V, and for
`mx.quantize`d K/V `d * bits / 8` plus a scale and a bias per group in the model dtype.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ..cache import attention as att

SCORINGS = ("codes", "keys", "none")  # how a retrieval cache ranks its far tokens


@dataclass(frozen=True)
class StepCost:
    """One layer's decode step (see the module docstring); bytes are ints."""

    attended_fraction: float
    codes: int = 0
    centroids: int = 0
    keys_scored: int = 0
    rows: int = 0

    @property
    def total(self) -> int:
        return self.codes + self.centroids + self.keys_scored + self.rows


def row_bytes(
    head_dim: int, dtype_bytes: int, bits: int | None = None, group_size: int | None = None
) -> int:
    """Bytes of one stored K or V row of one KV head: float, or quantized with a scale and a
    bias (model dtype) per group of `group_size` elements."""
    if bits is None:
        return head_dim * dtype_bytes
    if not group_size or head_dim % group_size:
        raise ValueError(f"group_size={group_size} is out of range: must divide {head_dim}")
    return head_dim * bits // 8 + 2 * (head_dim // group_size) * dtype_bytes


def exact_step_cost(n: int, n_kv: int, key_row: int) -> StepCost:
    """Every position attended: K and V rows of all `n` positions of every KV head."""
    return StepCost(1.0, rows=2 * n * n_kv * key_row)


def retrieval_step_cost(
    attended: np.ndarray,
    lay: att.Layout,
    *,
    n_q: int,
    key_row: int,
    scoring: str,
    candidates: int,
    code_bytes_per_token: int = 0,
    centroid_bytes: int = 0,
) -> StepCost:
    """A step of a retrieval cache with layout `lay`.

    attended: `[n_kv]` positions attended per KV head (sinks + window + union of the group's
    top-K). scoring: "codes" (table lookups over codes: `code_bytes_per_token` per far token
    and KV head, plus `centroid_bytes` for the tables), "keys" (exact scores over every far
    key) or "none" (recency). candidates: far tokens per query head whose full keys are read to
    rerank (0 or `lay.k` for none)."""
    if scoring not in SCORINGS:
        raise ValueError(f"scoring={scoring!r} is out of range: must be one of {SCORINGS}")
    attended = np.asarray(attended, dtype=np.int64)
    n_kv = attended.shape[0]
    codes = centroids = keys = 0
    if scoring == "codes":
        codes = lay.n_far * n_kv * code_bytes_per_token
        centroids = centroid_bytes
    elif scoring == "keys":
        keys = lay.n_far * n_kv * key_row
    if candidates > lay.k:
        keys += n_q * candidates * key_row
    return StepCost(
        attended_fraction=float(attended.mean() / lay.n),
        codes=int(codes),
        centroids=int(centroids),
        keys_scored=int(keys),
        rows=int(2 * attended.sum() * key_row),
    )


def cache_step_cost(
    cache: Any, attended: np.ndarray, n: int, n_q: int, dtype_bytes: int, scoring: str = "codes"
) -> StepCost:
    """The cost of the decode step a layer cache just ran (`n` positions in it now).

    cache: mlx-lm KVCache / QuantizedKVCache or an A2ATSCache (with `scoring` saying how it ranks
    far tokens); attended: `[n_kv]` positions attended per KV head at this step."""
    from ..cache.a2ats_cache import A2ATSCache

    attended = np.asarray(attended)
    n_kv = attended.shape[0]
    if not isinstance(cache, A2ATSCache):
        bits = getattr(cache, "bits", None)
        head_dim = int(cache.keys[0].shape[-1] if bits else cache.keys.shape[-1])
        if bits:
            head_dim = head_dim * 32 // bits  # packed uint32 words
        key_row = row_bytes(head_dim, dtype_bytes, bits, getattr(cache, "group_size", None))
        return exact_step_cost(n, n_kv, key_row)
    cfg = cache.config
    key_row = row_bytes(cache.rope.head_dim, dtype_bytes, cache.kv_bits, cache.group_size)
    lay = att.layout(n, cfg.window, cfg.sinks, cfg.top_k(n))
    if lay.exact:
        return exact_step_cost(n, n_kv, key_row)
    candidates = att.rerank_candidates(cache, lay)
    return retrieval_step_cost(
        attended, lay, n_q=n_q, key_row=key_row, scoring=scoring, candidates=candidates,
        code_bytes_per_token=int(cache.codes.shape[-1] * cache.codes.dtype.size),
        centroid_bytes=int(cache.codebook.centroids[cache.layer].nbytes),
    )  # fmt: skip


@dataclass(frozen=True)
class LayerBytes:
    """Where one A2ATS layer's bytes are (`layer_bytes`): all counted from the arrays held.

    keys / values: resident K/V rows (stored format); codes: the code array; rotations and
    estimate: the layer's fixed extras; on_disk: rows in the cold tier's file; fp16_keys: what an
    fp16 KVCache would hold for the same tokens' keys (the same again for values);
    codebook_share: the layer's share of the model's codebook (held once per model)."""

    keys: int
    values: int
    codes: int
    rotations: int
    estimate: int
    on_disk: int
    fp16_keys: int
    codebook_share: int
    tokens: int
    head_dim: int
    n_kv: int

    @property
    def storage(self) -> int:
        """Per-token storage in memory: K/V rows and codes."""
        return self.keys + self.values + self.codes

    @property
    def held(self) -> int:
        """Everything the layer holds in memory (the cache's `nbytes`)."""
        return self.storage + self.rotations + self.estimate

    @property
    def compression_ratio(self) -> float:
        """fp16 full-cache bytes / bytes held in memory (> 1 means less memory)."""
        return 2 * self.fp16_keys / self.held if self.held else 0.0

    @property
    def bits_per_element(self) -> float:
        """Bits held in memory per cached K/V element (storage only, per token held)."""
        elements = 2 * self.n_kv * self.tokens * self.head_dim
        return 8.0 * self.storage / elements if elements else 0.0


def layer_bytes(cache: Any) -> LayerBytes:
    """The byte breakdown of an A2ATSCache, from the arrays it holds now (no evaluation)."""
    from ..cache.layer_stats import fp16_bytes
    from ..cache.storage import RowStorage

    rows = cache.rows
    resident = rows.kind != "cold" or not rows.spilled
    memory = rows if rows.kind != "cold" else rows.memory
    codes = 0 if cache.codes is None else cache.codes[..., : cache.offset, :].nbytes
    n_kv = 0 if cache.codes is None else cache.codes.shape[1]
    capacity = 0 if cache.codes is None else cache.codes.shape[2]
    # rows are allocated a STEP at a time: count what is allocated (held), per token held
    return LayerBytes(
        keys=RowStorage.nbytes(memory.keys) if resident else 0,
        values=RowStorage.nbytes(memory.values) if resident else 0,
        codes=codes * capacity // max(cache.offset, 1) if codes else 0,
        rotations=int(cache.rotations.nbytes),
        estimate=cache.retrieval.estimate_bytes,
        on_disk=cache.disk_bytes,
        fp16_keys=fp16_bytes(cache),
        codebook_share=cache.codebook.nbytes // max(cache.codebook.num_layers, 1),
        tokens=capacity,
        head_dim=cache.rope.head_dim,
        n_kv=n_kv,
    )
