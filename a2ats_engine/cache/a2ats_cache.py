"""A2ATSCache: an mlx-lm KV cache that retrieves the top-K far tokens with VQ codes.

Every key that enters the cache is un-rotated to its pre-RoPE frame and coded against the
layer's codebook (uint16 per token per KV head and subspace). Full post-RoPE keys and values are
kept (model dtype, or `mx.quantize`d with kv_bits: `storage.py`) for exact attention on the
selection, chosen by the cache's top-K strategy (`topk.py`, picked once when the cache is made).
Attention reaches `attend` through the hook in `hooks.py` (which gives us the true query).
`state` / `meta_state` / `from_state` follow mlx-lm's cache protocol (see docs/ARCHITECTURE.md).
"""

from __future__ import annotations

import json
import time
import warnings
import weakref
from dataclasses import replace

import mlx.core as mx
import mlx.nn as nn
import numpy as np
from mlx_lm.models.cache import _BaseCache, create_attention_mask

from ..errors import A2ATSError, ModelNotSupportedError
from ..records import planning_context
from . import attention as att
from .config import A2ATSConfig
from .rope import RopeSpec, distance_buckets, model_geometry, retrieval_distances
from .storage import RowStorage
from .telemetry import CacheSnapshot, LayerStats
from .topk import choose_top_k

_STEP = 256
RANDOM_CENTROIDS = 256  # the stand-in codebook's size when none is given (wiring, timing)
# codebooks of caches whose meta_state was taken, by sha256 (weak: dropped with their caches)
_CODEBOOKS: weakref.WeakValueDictionary = weakref.WeakValueDictionary()


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
        self._configure(layer, rope, codebook, config or A2ATSConfig(), max_context)
        self._clear()

    # -- configuration ----------------------------------------------------------------------
    def _configure(
        self, layer: int, rope: RopeSpec, codebook, config: A2ATSConfig, max_context: int | None
    ) -> None:
        """Everything fixed for the cache's life (what `meta_state` records), and what follows."""
        self.layer = layer
        self.rope = rope
        self.codebook = codebook
        self.config = config
        self.max_context = planning_context(max_context)
        self.top_k = choose_top_k()  # NumPy or MLX top-K, decided once (topk.py)
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
        self.storage = RowStorage(self.config.kv_bits, self.group_size)

    def _clear(self) -> None:
        """No tokens held: the state of a fresh cache."""
        self.keys = None
        self.values = None
        self.codes = None
        self.offset = 0
        self.tokens_seen = 0
        self._step = 0
        self._reported: int | None = None  # tokens the last snapshot covered; None: keyframe
        self.last_stats: LayerStats | None = None
        self._stats_final = False  # last_stats already carries its codes (`take_stats`)
        self._unattended = False  # a decode step stored keys and `attend` has not run yet

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
    @property
    def capacity(self) -> int:
        return 0 if self.codes is None else self.codes.shape[2]

    def _grow(self, keys, values, codes, L: int) -> None:
        prev = self.offset
        if self.codes is not None and prev + L <= self.capacity:
            return
        B, n_kv = codes.shape[:2]
        size = ((L + self.step - 1) // self.step) * self.step
        new_k = self.storage.zeros_like(keys, B, n_kv, size)
        new_v = self.storage.zeros_like(values, B, n_kv, size)
        new_c = mx.zeros((B, n_kv, size, codes.shape[-1]), mx.uint16)
        if self.codes is None:
            self.keys, self.values, self.codes = new_k, new_v, new_c
            return
        if prev % self.step:
            rows = self.storage.rows
            self.keys, self.values = rows(self.keys, prev), rows(self.values, prev)
            self.codes = self.codes[..., :prev, :]
        self.keys = self.storage.concat(self.keys, new_k)
        self.values = self.storage.concat(self.values, new_v)
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
        k_store, v_store = self.storage.encode(keys), self.storage.encode(values)
        self._grow(k_store, v_store, codes, L)
        prev = self.offset
        self.offset += L
        self.storage.write(self.keys, k_store, prev, self.offset)
        self.storage.write(self.values, v_store, prev, self.offset)
        self.codes[..., prev : self.offset, :] = codes
        self.tokens_seen += L
        if L > 1:
            self._reported = None  # a prefill: the next snapshot sends full histograms
        if self.kv_bits is None:
            rows = self.storage.rows
            return rows(self.keys, self.offset), rows(self.values, self.offset)
        return self._float_with(self.keys, keys, prev), self._float_with(self.values, values, prev)

    def _float_with(self, stored, fresh: mx.array, prev: int) -> mx.array:
        """Dequantized stored rows [0, prev) followed by the fresh rows: [B, n_kv, prev + L, d]."""
        if prev == 0:
            return fresh
        past = self.storage.dequantize(self.storage.rows(stored, prev)).astype(fresh.dtype)
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
                self._after_step(lay, None, None, queries, scale)
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
        candidates = min(self.config.rerank * lay.k, lay.n_far) if self.reranks else lay.k
        if candidates > lay.k:
            top = att.rerank(group, scores, lay, candidates, self.keys, self.storage, self.top_k)
        else:
            top = self.top_k.top(scores, lay.k)
        positions, repeat = self.top_k.select(top, lay)
        k_sel = att.gather_rows(self.keys, positions, self.storage)
        v_sel = att.gather_rows(self.values, positions, self.storage)
        out = att.selected_attention(group, k_sel, v_sel, repeat, scale, sinks)
        self._after_step(lay, positions, repeat, queries, scale)
        return out.reshape(B, n_q, 1, d)

    # -- telemetry --------------------------------------------------------------------------
    def _after_step(self, lay: att.Layout, positions, repeat, queries, scale: float) -> None:
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
            recall = self._recall(queries, positions, repeat, scale)
            recall_ms = (time.perf_counter() - start) * 1e3
        self._stats_final = False
        self.last_stats = LayerStats(
            step=step,
            offset=lay.n,
            window_start=lay.window_start,
            sinks=lay.n_sinks,
            selected=selected,
            code_counts=(),
            bytes_held=self.nbytes,
            bytes_fp16=self.fp16_key_bytes + self.fp16_value_bytes,
            exact=positions is None,
            layer=self.layer,
            recall=recall,
            recall_ms=recall_ms,
        )

    def take_stats(self) -> LayerStats | None:
        """The last step's LayerStats with its codes, for a snapshot (telemetry only).

        A keyframe (full per-head histograms of the tokens cached at that step) when nothing was
        reported since the cache was made, prefilled, trimmed or restored; else the codes
        appended since the previous snapshot (`new_codes`). Computed here, when the snapshot is
        taken, so a step whose stats nobody took (mlx-lm runs one step ahead) loses nothing.
        """
        stats = self.last_stats
        if stats is None or self._stats_final:
            return stats
        first = self.codes[0, :, :, 0]  # [n_kv, capacity]: first subspace, batch 0
        end, since = stats.offset, self._reported
        if since is None or since > end:
            codes = np.array(first[:, :end]).astype(np.int64)  # [n_kv, end]
            n_kv, C = codes.shape[0], self.codebook.n_centroids
            flat = (codes + (np.arange(n_kv) * C)[:, None]).reshape(-1)
            counts = np.bincount(flat, minlength=n_kv * C).reshape(n_kv, C)
            stats = replace(stats, code_counts=tuple(counts))
        else:
            new = np.array(first[:, since:end]).astype(np.uint16)  # [n_kv, end - since]
            stats = replace(stats, new_codes=tuple(new))
        self._reported = end
        self._stats_final = True
        self.last_stats = stats
        return stats

    def _recall(
        self, queries: mx.array, positions: mx.array, repeat: mx.array, scale: float
    ) -> tuple[float, ...]:
        """Shadow exact attention: per KV head, the attention mass on the selection.

        queries post-RoPE [B, n_q, 1, d]; positions / repeat [B, n_kv, M] as `select` returns
        them; scale: the layer's own attention scale (what `attend` received). The mass is
        averaged over the GQA group's query heads and every batch row.
        """
        n, (B, n_q, _, d) = self.offset, queries.shape
        keys = self.storage.dequantize(self.storage.rows(self.keys, n)).astype(mx.float32)
        n_kv, M = keys.shape[1], positions.shape[-1]
        G = n_q // n_kv
        q = queries[:, :, 0, :].astype(mx.float32).reshape(B, n_kv, G, d)
        probs = mx.softmax((q @ keys.swapaxes(-1, -2)) * scale, axis=-1)  # [B, n_kv, G, n]
        index = mx.broadcast_to(positions[:, :, None, :], (B, n_kv, G, M))
        picked = mx.take_along_axis(probs, index, axis=-1) * (~repeat)[:, :, None, :]
        mass = np.array(picked.sum(axis=-1).mean(axis=(0, 2)))  # [n_kv]
        return tuple(float(m) for m in mass)

    def _dequantized(self, stored):
        """Float rows of a stored value (for the evaluation caches in bench/)."""
        return self.storage.dequantize(stored)

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
        self._reported = None  # the next snapshot sends full histograms
        return n

    def make_mask(self, *args, **kwargs):
        return create_attention_mask(*args, offset=self.offset, **kwargs)

    @property
    def state(self):
        if self.codes is None:
            return []
        rows, arrays = self.storage.rows, self.storage.arrays
        k, v = arrays(rows(self.keys, self.offset)), arrays(rows(self.values, self.offset))
        return [*k, *v, self.codes[..., : self.offset, :]]

    @state.setter
    def state(self, arrays) -> None:
        arrays = list(arrays)
        if not hasattr(self, "config"):  # `from_state` of an mlx-lm that sets state first
            self._pending_state = arrays
            return
        if not arrays:
            self.keys = self.values = self.codes = None
            self.offset = 0
            self._reported = None
            return
        per = self.storage.n_arrays
        if len(arrays) != 2 * per + 1:
            raise ValueError(f"A2ATSCache state has {len(arrays)} arrays, expected {2 * per + 1}")
        self.keys = self.storage.from_arrays(arrays[:per])
        self.values = self.storage.from_arrays(arrays[per : 2 * per])
        self.codes = arrays[-1].astype(mx.uint16)
        self.offset = self.codes.shape[2]
        self._reported = None

    @property
    def meta_state(self) -> tuple[str, ...]:
        """What rebuilds this cache around `state`, as strings (mlx-lm's convention):
        (layer, config JSON, RoPE spec JSON, max_context, tokens_seen, codebook sha256)."""
        _CODEBOOKS[self.codebook.sha256] = self.codebook  # so `from_state` can find it again
        return (
            str(self.layer),
            json.dumps(self.config.to_dict()),
            json.dumps(self.rope.to_dict()),
            str(self.max_context),
            str(self.tokens_seen),
            self.codebook.sha256,
        )

    @meta_state.setter
    def meta_state(self, values) -> None:
        """Configure the cache from `meta_state` strings; the codebook is the one already set
        (`from_state(..., codebook=)`) or the loaded codebook with the recorded sha256."""
        values = tuple(values)
        if len(values) not in (5, 6):
            raise ValueError(f"A2ATSCache meta_state has {len(values)} entries, expected 6")
        layer, config, rope, max_context, tokens_seen = values[:5]
        codebook = getattr(self, "codebook", None)
        if codebook is None:
            sha = values[5] if len(values) == 6 else None
            codebook = _CODEBOOKS.get(sha) if sha else None
            if codebook is None:
                raise A2ATSError(
                    f"the codebook of this A2ATS cache (sha256 {str(sha)[:16]}) is not loaded; "
                    "load it first or pass it to from_state"
                )
        spec = RopeSpec.from_dict(json.loads(rope))
        cfg = A2ATSConfig.from_dict(json.loads(config))
        self._configure(int(layer), spec, codebook, cfg, int(max_context))
        if not hasattr(self, "codes"):
            self._clear()
        pending = self.__dict__.pop("_pending_state", None)
        if pending is not None:
            self.state = pending
        self.tokens_seen = int(tokens_seen)

    @classmethod
    def from_state(cls, state, meta_state, codebook=None) -> A2ATSCache:
        """Rebuild a cache from `state` and `meta_state` (mlx-lm's `from_state`, plus the
        codebook, which is not a string: given here, or found among loaded codebooks)."""
        obj = cls.__new__(cls)
        obj.codebook = codebook
        obj.meta_state = meta_state
        obj.state = state
        return obj

    # -- byte accounting (what is actually held) --------------------------------------------
    @property
    def compressed_key_bytes(self) -> int:
        """Key storage (full keys for exact attention on the selection) plus the codes."""
        return RowStorage.nbytes(self.keys) + RowStorage.nbytes(self.codes)

    @property
    def compressed_value_bytes(self) -> int:
        return RowStorage.nbytes(self.values)

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
    def storage_bytes(self) -> int:
        """Per-token storage: keys, values (float or kv_bits) and codes."""
        return self.compressed_key_bytes + self.compressed_value_bytes

    @property
    def overhead_bytes(self) -> int:
        """This layer's own fixed extras: the rotation matrices to the retrieval distances
        (`[d, m * d]`, built once). The shared codebook is not here (`model_codebook_bytes`,
        counted once per model). Telemetry keeps no device buffer: only the last step's
        LayerStats on the host (a few KB, handed to the snapshot), which is not counted."""
        return int(self._rotations.nbytes)

    @property
    def nbytes(self) -> int:
        """Everything this layer holds: storage plus its own extras (codebook excluded)."""
        return self.storage_bytes + self.overhead_bytes

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
        """Bits held per cached K/V element (storage + codes), codebook and extras excluded."""
        if self.codes is None or not self.offset:
            return 0.0
        B, n_kv = self.codes.shape[:2]
        elements = 2 * B * n_kv * self.offset * self.rope.head_dim
        return 8.0 * self.storage_bytes * self.offset / (elements * max(self.capacity, 1))

    @property
    def tokens_retrieved(self) -> int:
        """Far tokens selected (union over KV heads), summed over decode steps."""
        return self.top_k.retrieved


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
        codebook = Codebook.random(geo.num_layers, geo.num_kv_heads, geo.head_dim, RANDOM_CENTROIDS)
    else:
        codebook.validate_for(model, config)
    if not hooks.install(model):
        raise ModelNotSupportedError(f"{plan.model_type}: the attention hook patched no module")
    ctx = geo.max_context
    caches = native_caches(model)
    for choice in plan.layers:
        if choice.kind == A2ATS:
            spec = rope_spec_of(model, choice)
            caches[choice.layer] = A2ATSCache(choice.layer, spec, codebook, config, ctx)
    return caches


def snapshot(caches: list, token_id: int | None = None) -> CacheSnapshot | None:
    """Gather the last step's LayerStats of every A2ATS cache (None when there are none), and
    the bytes the other (native) caches hold (array sizes only: no evaluation, no host sync)."""
    layers = tuple(
        c.take_stats() for c in caches if isinstance(c, A2ATSCache) and c.last_stats is not None
    )
    if not layers:
        return None
    native = sum(_native_nbytes(c) for c in caches if not isinstance(c, A2ATSCache))
    return CacheSnapshot(
        step=layers[0].step,
        layers=layers,
        token_id=token_id,
        native_bytes=native,
        codebook_bytes=model_codebook_bytes(caches),
    )


def model_codebook_bytes(caches: list) -> int:
    """Bytes of the codebook(s) the A2ATS layers use, each counted once: one codebook per
    model, shared by every chat (cache list) of that model (array sizes only, no sync)."""
    books = {id(c.codebook): c.codebook for c in caches if isinstance(c, A2ATSCache)}
    return int(sum(book.nbytes for book in books.values()))


def _native_nbytes(cache: _BaseCache) -> int:
    """Bytes a model's own cache holds (0 for a cache kind that does not report them)."""
    try:
        return int(cache.nbytes)
    except (AttributeError, NotImplementedError):
        return 0
