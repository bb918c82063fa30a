"""A2ATSCache: an mlx-lm KV cache that retrieves the top-K far tokens with VQ codes.

Every key that enters the cache is un-rotated to its pre-RoPE frame and coded against the
layer's codebook (uint16 per token per KV head and subspace). Full post-RoPE keys and values are
kept (model dtype, or `mx.quantize`d with kv_bits) for exact attention on the selection.
Attention reaches `attend` through the hook in `hooks.py` (which gives us the true query).
"""

from __future__ import annotations

import json
import time
import warnings

import mlx.core as mx
import mlx.nn as nn
import numpy as np
from mlx_lm.models.cache import _BaseCache, create_attention_mask

from ..errors import ModelNotSupportedError
from . import attention as att
from .config import A2ATSConfig
from .rope import RopeSpec, distance_buckets, model_geometry, retrieval_distances
from .telemetry import CacheSnapshot, LayerStats

_STEP = 256


class A2ATSCache(_BaseCache):
    """One attention layer's A2ATS cache (mlx-lm cache protocol + `attend`)."""

    # whether `config.rerank` applies (False for evaluation caches whose ranking is not a score)
    reranks: bool = True

    step = _STEP

    def __init__(
        self,
        layer: int,
        rope: RopeSpec,
        codebook,
        config: A2ATSConfig | None = None,
        max_context: int | None = None,
    ) -> None:
        self.layer = layer
        self.rope = rope
        self.codebook = codebook
        self.config = config or A2ATSConfig()
        self.max_context = int(max_context or 8192)
        self.keys = None
        self.values = None
        self.codes = None
        self.offset = 0
        self.tokens_seen = 0
        self._retrieved = mx.array(0, dtype=mx.int32)  # counted by MLX (Metal path)
        self._retrieved_host = 0  # counted on the host (NumPy top-K path)
        self._step = 0
        self._code_counts: np.ndarray | None = None
        self.last_stats: LayerStats | None = None
        self._unattended = False  # a decode step stored keys and `attend` has not run yet
        self._buckets = self._bucket_plan()
        # [d, m * d]: rotation to each far distance (the retrieval queries' frames), built once
        self._rotations = mx.concatenate(
            [rope.rotation_matrix(dist) for dist in self._buckets[0]], axis=-1
        )
        hd = rope.head_dim
        if self.config.kv_bits is not None and (hd % self.group_size or self.group_size < 32):
            raise ValueError(
                f"A2ATSConfig.kv_bits={self.config.kv_bits} needs head_dim ({hd}) divisible by "
                f"a quantization group of 32, 64 or 128"
            )

    # -- configuration ----------------------------------------------------------------------
    def _bucket_plan(self) -> tuple[list[int], tuple[int, ...] | None]:
        """Retrieval distances and the lower edges of buckets 1..m-1 (None for one b)."""
        cfg = self.config
        distances = retrieval_distances(
            cfg.window, cfg.far_offset, cfg.far_buckets, self.max_context
        )
        if cfg.far_buckets == 1:
            return distances, None
        plan = distance_buckets(cfg.window, self.max_context, cfg.far_buckets)
        return distances, tuple(lo for lo, _, _ in plan[1:])

    @property
    def kv_bits(self) -> int | None:
        return self.config.kv_bits

    @property
    def group_size(self) -> int:
        """kv_bits group size: the configured one, capped at head_dim (it must divide it)."""
        return min(self.config.kv_group_size, self.rope.head_dim)

    # -- storage ----------------------------------------------------------------------------
    def _store(self, x: mx.array):
        if self.kv_bits is None:
            return x
        return tuple(mx.quantize(x, group_size=self.group_size, bits=self.kv_bits))

    @staticmethod
    def _alloc_like(stored, B: int, n_kv: int, size: int):
        if isinstance(stored, tuple):
            return tuple(mx.zeros((B, n_kv, size, a.shape[-1]), a.dtype) for a in stored)
        return mx.zeros((B, n_kv, size, stored.shape[-1]), stored.dtype)

    @staticmethod
    def _slice(stored, end: int):
        if isinstance(stored, tuple):
            return tuple(a[..., :end, :] for a in stored)
        return stored[..., :end, :]

    @staticmethod
    def _concat(a, b):
        if isinstance(a, tuple):
            return tuple(mx.concatenate([x, y], axis=2) for x, y in zip(a, b, strict=True))
        return mx.concatenate([a, b], axis=2)

    @staticmethod
    def _write(dst, src, start: int, end: int) -> None:
        if isinstance(dst, tuple):
            for d, s in zip(dst, src, strict=True):
                d[..., start:end, :] = s
        else:
            dst[..., start:end, :] = src

    @property
    def capacity(self) -> int:
        return 0 if self.codes is None else self.codes.shape[2]

    def _grow(self, keys, values, codes, L: int) -> None:
        prev = self.offset
        if self.codes is not None and prev + L <= self.capacity:
            return
        B, n_kv = codes.shape[:2]
        size = ((L + self.step - 1) // self.step) * self.step
        new_k = self._alloc_like(keys, B, n_kv, size)
        new_v = self._alloc_like(values, B, n_kv, size)
        new_c = mx.zeros((B, n_kv, size, codes.shape[-1]), mx.uint16)
        if self.codes is None:
            self.keys, self.values, self.codes = new_k, new_v, new_c
            return
        if prev % self.step:
            self.keys, self.values = self._slice(self.keys, prev), self._slice(self.values, prev)
            self.codes = self.codes[..., :prev, :]
        self.keys = self._concat(self.keys, new_k)
        self.values = self._concat(self.values, new_v)
        self.codes = mx.concatenate([self.codes, new_c], axis=2)

    def update_and_fetch(self, keys: mx.array, values: mx.array):
        """Store post-RoPE keys/values [B, n_kv, L, d] and their codes; return the whole cache.

        The returned K/V are float arrays in the model dtype. With kv_bits the stored past is
        dequantized and the incoming tokens are returned as they came, so prefill attention stays
        a plain (fast) attention; MLX evaluates them only if exact attention uses them.
        """
        L = keys.shape[2]
        if self._unattended:
            raise ModelNotSupportedError(
                f"layer {self.layer}: the last decode step did not attend through A2ATS (the "
                "model computed attention itself); refusing to run full attention as A2ATS"
            )
        self._unattended = L == 1
        pre_rope = self.rope.unrotate(keys.astype(mx.float32), self.offset)
        codes = self.codebook.assign(self.layer, pre_rope)  # [B, n_kv, L, S]
        k_store, v_store = self._store(keys), self._store(values)
        self._grow(k_store, v_store, codes, L)
        prev = self.offset
        self.offset += L
        self._write(self.keys, k_store, prev, self.offset)
        self._write(self.values, v_store, prev, self.offset)
        self.codes[..., prev : self.offset, :] = codes
        self.tokens_seen += L
        if self.config.telemetry:
            self._count_codes(codes)
        if self.kv_bits is None:
            return self._slice(self.keys, self.offset), self._slice(self.values, self.offset)
        return self._float_with(self.keys, keys, prev), self._float_with(self.values, values, prev)

    def _float_with(self, stored, fresh: mx.array, prev: int) -> mx.array:
        """Dequantized stored rows [0, prev) followed by the fresh rows: [B, n_kv, prev + L, d]."""
        if prev == 0:
            return fresh
        past = self._dequantized(self._slice(stored, prev)).astype(fresh.dtype)
        return mx.concatenate([past, fresh], axis=2)

    # -- attention --------------------------------------------------------------------------
    def attend(
        self, queries: mx.array, keys, values, *, scale: float, mask=None, sinks=None
    ) -> mx.array:
        """Attention for this layer. queries: post-RoPE [B, n_q, L, d] -> [B, n_q, L, d].

        Prefill (L > 1) and short contexts use exact attention; a decode step retrieves.
        sinks: optional per-query-head sink logits [n_q] (gpt_oss), honoured on both paths.
        """
        self._unattended = False
        cfg = self.config
        L = queries.shape[2]
        lay = att.layout(self.offset, cfg.window, cfg.sinks, cfg.top_k(self.offset))
        if L > 1 or lay.exact:
            out = att.exact_attention(queries, keys, values, scale, mask, sinks)
            if L == 1:
                self._after_step(lay, None, None, queries)
            return out
        return self._retrieve(queries, lay, scale, sinks)

    def far_token_scores(self, queries: mx.array, lay: att.Layout) -> mx.array:
        """Approximate windowed-RoPE scores of the far tokens for a decode query.

        queries: post-RoPE [B, n_q, 1, d] at position lay.n - 1 -> [B, n_kv, G, F] float32,
        F = far tokens [n_sinks, window_start). Each far token is scored with the query rotated
        to its distance bucket's representative distance (the single distance b when
        far_buckets = 1): table lookups `(R_D q) . C[code]`, never the keys themselves.
        """
        B, n_q, _, d = queries.shape
        n_kv = self.codes.shape[1]
        group = queries.reshape(B, n_kv, n_q // n_kv, d)
        _, lower_edges = self._buckets
        tables = att.retrieval_tables(
            group, self.rope, lay.n - 1, self._rotations, self.codebook, self.layer
        )
        far_codes = self.codes[..., lay.n_sinks : lay.window_start, :]
        bucket_ids = None
        if lower_edges is not None:
            bucket_ids = att.bucket_ids(lay.n, lay.n_sinks, lay.window_start, lower_edges)
        return att.far_scores(tables, far_codes, bucket_ids, self.codebook.n_centroids)

    def _retrieve(self, queries: mx.array, lay: att.Layout, scale: float, sinks=None) -> mx.array:
        B, n_q, _, d = queries.shape
        n_kv = self.codes.shape[1]
        group = queries.reshape(B, n_kv, n_q // n_kv, d)
        scores = self.far_token_scores(queries, lay)
        cap, bits, gs = self.capacity, self.kv_bits, self.group_size
        candidates = min(self.config.rerank * lay.k, lay.n_far) if self.reranks else lay.k
        host = att.host_top_k()
        if candidates > lay.k:
            top = att.rerank(group, scores, lay, candidates, self.keys, cap, gs, bits, host)
        elif host:
            top = att.top_far_host(np.asarray(scores), lay.k)
        else:
            top = None
        if host:
            positions, repeat, n_union = att.select_host(top, lay)
            self._retrieved_host += n_union
        else:
            positions, repeat = att.select(scores, lay, top)
            self._retrieved = self._retrieved + att.count_union(positions, repeat, lay)
        k_sel = att.gather_rows(self.keys, positions, cap, gs, bits)
        v_sel = att.gather_rows(self.values, positions, cap, gs, bits)
        out = att.selected_attention(group, k_sel, v_sel, repeat, scale, sinks)
        self._after_step(lay, positions, repeat, queries)
        return out.reshape(B, n_q, 1, d)

    # -- telemetry --------------------------------------------------------------------------
    def _count_codes(self, codes: mx.array) -> None:
        first = np.array(codes[0, :, :, 0]).astype(np.int64)  # [n_kv, L]
        n_kv, C = first.shape[0], self.codebook.n_centroids
        if self._code_counts is None:
            self._code_counts = np.zeros((n_kv, C), np.int64)
        for h in range(n_kv):  # telemetry only; n_kv is small
            self._code_counts[h] += np.bincount(first[h], minlength=C)

    def _recount_codes(self) -> None:
        self._code_counts = None
        if self.codes is not None and self.offset:
            self._count_codes(self.codes[:, :, : self.offset, :])

    def _after_step(self, lay: att.Layout, positions, repeat, queries) -> None:
        step = self._step
        self._step += 1
        if not self.config.telemetry:
            return
        n_kv = self.codes.shape[1]
        if positions is None:
            selected = tuple(np.arange(lay.n, dtype=np.int32) for _ in range(n_kv))
        else:
            pos, rep = np.array(positions[0]), np.array(repeat[0])
            selected = tuple(np.unique(pos[h][~rep[h]]).astype(np.int32) for h in range(n_kv))
        recall = recall_ms = None
        every = self.config.fidelity_every
        if every and positions is not None and step % every == 0:
            start = time.perf_counter()
            recall = self._recall(queries, selected)
            recall_ms = (time.perf_counter() - start) * 1e3
        counts = self._code_counts
        code_counts = tuple(counts[h].copy() for h in range(n_kv)) if counts is not None else ()
        self.last_stats = LayerStats(
            step=step,
            offset=lay.n,
            window_start=lay.window_start,
            sinks=lay.n_sinks,
            selected=selected,
            code_counts=code_counts,
            bytes_held=self.nbytes,
            bytes_fp16=self.fp16_key_bytes + self.fp16_value_bytes,
            exact=positions is None,
            layer=self.layer,
            recall=recall,
            recall_ms=recall_ms,
        )

    def _recall(self, queries: mx.array, selected: tuple[np.ndarray, ...]) -> tuple[float, ...]:
        """Shadow exact attention: attention mass on the selection per KV head (batch 0)."""
        n, n_q = self.offset, queries.shape[1]
        keys = self._dequantized(self.keys)[0, :, :n, :].astype(mx.float32)  # [n_kv, n, d]
        n_kv, _, d = keys.shape
        q = queries[0, :, 0, :].astype(mx.float32).reshape(n_kv, n_q // n_kv, d)
        probs = np.array(mx.softmax((q @ keys.swapaxes(-1, -2)) * (d**-0.5), axis=-1))
        return tuple(float(probs[h][:, selected[h]].sum(-1).mean()) for h in range(n_kv))

    def _dequantized(self, stored):
        if isinstance(stored, tuple):
            return mx.dequantize(*stored, group_size=self.group_size, bits=self.kv_bits)
        return stored

    # -- protocol ---------------------------------------------------------------------------
    def size(self) -> int:
        return self.offset

    def empty(self) -> bool:
        return self.codes is None

    def is_trimmable(self) -> bool:
        return True

    def trim(self, n: int) -> int:
        self._unattended = False
        n = min(self.offset, n)
        self.offset -= n
        if self.config.telemetry:
            self._recount_codes()
        return n

    def make_mask(self, *args, **kwargs):
        return create_attention_mask(*args, offset=self.offset, **kwargs)

    @property
    def state(self):
        if self.codes is None:
            return []
        k, v = self._slice(self.keys, self.offset), self._slice(self.values, self.offset)
        k = list(k) if isinstance(k, tuple) else [k]
        v = list(v) if isinstance(v, tuple) else [v]
        return [*k, *v, self.codes[..., : self.offset, :]]

    @state.setter
    def state(self, arrays) -> None:
        arrays = list(arrays)
        if not arrays:
            self.keys = self.values = self.codes = None
            self.offset = 0
            return
        per = 3 if self.kv_bits is not None else 1
        if len(arrays) != 2 * per + 1:
            raise ValueError(f"A2ATSCache state has {len(arrays)} arrays, expected {2 * per + 1}")
        k, v = arrays[:per], arrays[per : 2 * per]
        self.keys = tuple(k) if per == 3 else k[0]
        self.values = tuple(v) if per == 3 else v[0]
        self.codes = arrays[-1].astype(mx.uint16)
        self.offset = self.codes.shape[2]
        if self.config.telemetry:
            self._recount_codes()

    @property
    def meta_state(self):
        return (
            str(self.layer),
            json.dumps(self.config.to_dict()),
            json.dumps(self.rope.to_dict()),
            str(self.max_context),
            str(self.tokens_seen),
        )

    # -- byte accounting (what is actually held) --------------------------------------------
    @staticmethod
    def _bytes(stored) -> int:
        if stored is None:
            return 0
        if isinstance(stored, tuple):
            return sum(a.nbytes for a in stored)
        return stored.nbytes

    @property
    def compressed_key_bytes(self) -> int:
        """Key storage (full keys for exact attention on the selection) plus the codes."""
        return self._bytes(self.keys) + self._bytes(self.codes)

    @property
    def compressed_value_bytes(self) -> int:
        return self._bytes(self.values)

    def _fp16_bytes(self) -> int:
        if self.codes is None:
            return 0
        B, n_kv = self.codes.shape[:2]
        return B * n_kv * self.offset * self.rope.head_dim * 2

    @property
    def fp16_key_bytes(self) -> int:
        """Bytes an fp16 KVCache would need for the same tokens' keys."""
        return self._fp16_bytes()

    @property
    def fp16_value_bytes(self) -> int:
        return self._fp16_bytes()

    @property
    def nbytes(self) -> int:
        return self.compressed_key_bytes + self.compressed_value_bytes

    @property
    def compression_ratio(self) -> float:
        """fp16 full-cache bytes / bytes held (> 1 means savings)."""
        held = self.nbytes
        return (self.fp16_key_bytes + self.fp16_value_bytes) / held if held else 0.0

    @property
    def codebook_bytes(self) -> int:
        """This layer's share of the codebook held in memory (static overhead)."""
        return self.codebook.nbytes // max(self.codebook.num_layers, 1)

    @property
    def assigned_avg_bits(self) -> float:
        """Bits held per cached K/V element (storage + codes), codebook excluded."""
        if self.codes is None or not self.offset:
            return 0.0
        B, n_kv = self.codes.shape[:2]
        elements = 2 * B * n_kv * self.offset * self.rope.head_dim
        return 8.0 * self.nbytes * self.offset / (elements * max(self.capacity, 1))

    @property
    def tokens_retrieved(self) -> int:
        """Far tokens selected (union over KV heads), summed over decode steps."""
        return int(self._retrieved.item()) + self._retrieved_host


# -- model-level helpers ----------------------------------------------------------------------


def make_cache(model: nn.Module, config: A2ATSConfig | None = None, codebook=None) -> list:
    """The model's cache list built from its layer plan, with the attention hook installed.

    An A2ATSCache for every layer the plan (`layer_plan.py`) marks `a2ats`; the model's own
    cache (mlx-lm's `make_prompt_cache` entry: RotatingKVCache, ArraysCache...) everywhere else.
    Raises ModelNotSupportedError (one line) for a model the plan refuses.

    `codebook=None` falls back to a random codebook with a loud warning: retrieval is then
    near random (wiring and tests only; calibrate one with `a2ats calibrate`).
    """
    from . import hooks
    from .layer_plan import A2ATS, native_caches, plan_for, rope_spec_of

    plan = plan_for(model).require()
    config = config or A2ATSConfig()
    geo = model_geometry(model)
    if codebook is None:
        from .codebook import Codebook

        warnings.warn(
            "A2ATS: no codebook given, using a RANDOM codebook: retrieval will be near random. "
            "Calibrate one (`a2ats calibrate`) for real use.",
            stacklevel=2,
        )
        codebook = Codebook.random(
            geo["num_layers"],
            geo["num_kv_heads"],
            geo["head_dim"],
            min(config.n_centroids, 256),
            sub_dim=config.sub_dim,
        )
    else:
        codebook.validate_for(model, config)
    if not hooks.install(model):
        raise ModelNotSupportedError(f"{plan.model_type}: the attention hook patched no module")
    ctx = geo.get("max_context")
    caches = native_caches(model)
    for choice in plan.layers:
        if choice.kind == A2ATS:
            spec = rope_spec_of(model, choice)
            caches[choice.layer] = A2ATSCache(choice.layer, spec, codebook, config, ctx)
    return caches


def snapshot(caches: list, token_id: int | None = None) -> CacheSnapshot | None:
    """Gather the last step's LayerStats of every A2ATS cache (None when there are none)."""
    layers = tuple(
        c.last_stats for c in caches if isinstance(c, A2ATSCache) and c.last_stats is not None
    )
    if not layers:
        return None
    return CacheSnapshot(step=layers[0].step, layers=layers, token_id=token_id)
