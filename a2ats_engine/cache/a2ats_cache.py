"""A2ATSCache: an mlx-lm KV cache that retrieves the top-K far tokens with VQ codes.

Every key that enters the cache is un-rotated to its pre-RoPE frame and coded against the
layer's codebook (uint16 per token per KV head and subspace; `code_store.py`: a decode step's
key is coded with the next ones, before anything reads `codes`). The post-RoPE K/V rows go to the
cache's storage kind (`storage.py`: float or kv_bits in memory; `cold.py`: a memory-mapped
file past the KV memory limit), from which a decode step reads the rows it attends.
Attention reaches `attend` through the hook in `hooks.py` (which gives us the true query); the
step's selection is `retrieval.py`, its telemetry `layer_stats.py`, the models' cache lists
`model_cache.py`. `state` / `meta_state` / `from_state` follow mlx-lm's cache protocol.
"""

from __future__ import annotations

import json
from dataclasses import replace

import mlx.core as mx
from mlx_lm.models.cache import _BaseCache, create_attention_mask

from ..errors import A2ATSError, ModelNotSupportedError
from ..records import planning_context
from . import attention as att
from . import layer_stats
from .code_store import CodeStore, checked_codes
from .config import A2ATSConfig
from .crossover import measured_crossover, measured_estimate, step_kind
from .kinds import check_storage, group_size, make_rows
from .retrieval import Retrieval, estimate_applies, estimate_slots
from .rope import RopeSpec, bucket_plan
from .storage import STEP
from .telemetry import LayerStats
from .topk import choose_top_k


class A2ATSCache(_BaseCache):
    """One attention layer's A2ATS cache (mlx-lm cache protocol + `attend`).

    kv_share: this layer's share of `config.kv_memory` in bytes (`model_cache.make_cache`
    divides the limit over the A2ATS layers); None = no limit (rows stay resident)."""

    # whether `config.rerank` applies (False for evaluation caches whose ranking is not a score)
    reranks: bool = True

    step = STEP

    def __init__(
        self,
        layer: int,
        rope: RopeSpec,
        codebook,
        config: A2ATSConfig | None = None,
        max_context: int | None = None,
        kv_share: int | None = None,
    ) -> None:
        self._configure(layer, rope, codebook, config or A2ATSConfig(), max_context, kv_share)
        self._clear()

    # -- configuration ----------------------------------------------------------------------
    def _configure(
        self,
        layer: int,
        rope: RopeSpec,
        codebook,
        config: A2ATSConfig,
        max_context: int | None,
        kv_share: int | None = None,
    ) -> None:
        """What is fixed for the cache's life (`meta_state`); a layer's own budget (`for_layer`)."""
        self.layer, self.rope, self.codebook = layer, rope, codebook
        kind = step_kind(config, codebook.num_subspaces)  # the model's settings, not the layer's
        geometry = (codebook.num_layers, codebook.num_kv_heads, rope.head_dim)
        self.config = config = config.for_layer(layer)
        estimate, measured_on = decided_estimate(config, geometry, kind)
        self.max_context = planning_context(max_context)
        self.top_k = choose_top_k(geometry, kind, measured_on)  # NumPy or MLX, once (topk.py)
        self.buckets = bucket_plan(config, self.max_context)
        # [d, m * d]: rotation to each far distance (the retrieval queries' frames), built once
        self.rotations = mx.concatenate(
            [rope.rotation_matrix(dist) for dist in self.buckets[0]], axis=-1
        )
        self.kv_share = kv_share
        check_storage(config, rope.head_dim, kv_share)
        self.estimates = estimate_applies(estimate, codebook)  # whether it runs
        self.estimate_edges, self.n_slots = estimate_slots(config, self.buckets, codebook)
        # decode steps of this cache's life that attended exactly / retrieved (`attention_steps`)
        self.exact_steps = self.retrieved_steps = 0
        self.exact_below = config.exact_below  # None: the measured crossover (crossover.py)
        if self.exact_below is None:
            self.exact_below = measured_crossover(*geometry, kind)

    def _clear(self) -> None:
        """No tokens held: the state of a fresh cache."""
        old = getattr(self, "rows", None)
        if old is not None:
            old.close()
        self.rows = make_rows(self.config, self.rope.head_dim, self.kv_share, self.layer)
        self.code_store = CodeStore(self.codebook, self.layer, self.rope)
        self.offset = self.tokens_seen = self.steps = 0
        self.reported: int | None = None  # tokens the last snapshot covered; None: keyframe
        self.step_record = layer_stats.StepRecord()  # the last step, for `last_stats`
        self._unattended = False  # a decode step stored keys and `attend` has not run yet
        self.retrieval = Retrieval()

    @property
    def kv_bits(self) -> int | None:
        return self.config.kv_bits

    @property
    def group_size(self) -> int:
        return group_size(self.config, self.rope.head_dim)

    # -- storage ----------------------------------------------------------------------------
    def update_and_fetch(self, keys: mx.array, values: mx.array):
        """Store post-RoPE keys/values [B, n_kv, L, d] and their codes; return what the model's
        attention call (which reaches `attend`) gets: the storage kind's `for_attention`."""
        L = keys.shape[2]
        if self._unattended:
            raise ModelNotSupportedError(
                f"layer {self.layer}: the last decode step did not attend through A2ATS (the "
                "model computed attention itself); refusing to run full attention as A2ATS"
            )
        self._unattended = L == 1
        prev = self.offset
        self.code_store.add(keys, prev)  # a decode step's key coded with the next (code_store.py)
        self.rows.append(keys, values, prev)
        self.offset = prev + L
        self.tokens_seen += L
        if L > 1:
            self.reported = None  # a prefill: the next snapshot sends full histograms
            self.retrieval.forget()
        return self.rows.for_attention(keys, values, prev)

    @property
    def codes(self) -> mx.array | None:
        """Every held key's codes [B, n_kv, capacity, S] uint16 (None: no key yet)."""
        return self.code_store.codes()

    @codes.setter
    def codes(self, codes: mx.array | None) -> None:
        self.code_store.set(codes)

    @property
    def keys(self) -> mx.array | None:
        """Every held key row: as stored (resident kinds) or read back (cold)."""
        return self.rows.keys

    @property
    def values(self) -> mx.array | None:
        return self.rows.values

    # -- attention --------------------------------------------------------------------------
    def attend(
        self, queries: mx.array, keys, values, *, scale: float, mask=None, sinks=None
    ) -> mx.array:
        """Attention for this layer. queries: post-RoPE [B, n_q, L, d] -> [B, n_q, L, d].

        Prefill (L > 1), short contexts and contexts below `exact_below` use exact attention;
        a decode step retrieves.
        sinks: optional per-query-head sink logits [n_q] (gpt_oss), honoured on both paths.
        """
        self._unattended = False
        cfg = self.config
        L = queries.shape[2]
        lay = att.layout(self.offset, cfg.window, cfg.sinks, cfg.top_k(self.offset))
        if L > 1 or lay.exact or lay.n < self.exact_below:
            cold = self.rows.kind == "cold"
            if cold:  # update_and_fetch gave the incoming rows only
                keys, values = (a.astype(queries.dtype) for a in self.rows.fetch(self.offset))
            out = att.exact_attention(queries, keys, values, scale, mask, sinks)
            if cold and self.rows.spilled:
                mx.eval(out)  # let the rows read back from the file go before the next layer
            if L == 1:
                self.exact_steps += 1
                self._record(lay, None, None, queries, scale)
            return out
        self.retrieved_steps += 1
        out, positions, repeat = self.retrieval.step(self, queries, lay, scale, sinks)
        self._record(lay, positions, repeat, queries, scale)
        return out

    def _record(self, lay: att.Layout, positions, repeat, queries: mx.array, scale: float) -> None:
        args = (self, lay, positions, repeat, queries, scale)
        self.retrieval.timed(self.layer, "telemetry", lambda: layer_stats.record_step(*args))

    def far_token_scores(self, queries: mx.array, lay: att.Layout) -> mx.array:
        """Approximate scores of the far tokens: post-RoPE queries [B, n_q, 1, d] ->
        [B, n_kv, G, F] (`Retrieval.far_token_scores`; evaluation variants override this)."""
        return self.retrieval.far_token_scores(self, queries, lay)

    @property
    def last_stats(self) -> LayerStats | None:
        """The last decode step's LayerStats (telemetry), made when first read (`layer_stats`)."""
        return layer_stats.last_stats(self)

    def take_stats(self) -> LayerStats | None:
        """The last step's LayerStats with its codes, for a snapshot (`layer_stats.take_stats`)."""
        return layer_stats.take_stats(self)

    # -- protocol ---------------------------------------------------------------------------
    def size(self) -> int:
        return self.offset

    def empty(self) -> bool:
        return self.code_store.empty

    def is_trimmable(self) -> bool:
        return True

    def trim(self, n: int) -> int:
        self._unattended = False
        layer_stats.last_stats(self)  # the last step's stats made while its keys are held
        self.code_store.flush()  # the keys waiting are coded at their positions first
        n = min(self.offset, n)
        self.offset -= n
        self.rows.truncate(self.offset)
        self.reported = None  # the next snapshot sends full histograms
        self.retrieval.forget()
        return n

    def make_mask(self, *args, **kwargs):
        return create_attention_mask(*args, offset=self.offset, **kwargs)

    @property
    def state(self):
        """The resident arrays (K/V rows, codes). A cold tier's rows are in its file, not here:
        `export_state` reads them back (for saving a session or rebuilding the cache)."""
        if self.codes is None:
            return []
        return [*self.rows.arrays(self.offset), self.codes[..., : self.offset, :]]

    def export_state(self) -> list[mx.array]:
        """Every row and code, as `from_state` takes them: `state`, with cold rows read back."""
        if self.codes is None:
            return []
        return [*self.rows.export(self.offset), self.codes[..., : self.offset, :]]

    @state.setter
    def state(self, arrays) -> None:
        arrays = list(arrays)
        if not hasattr(self, "config"):  # `from_state` of an mlx-lm that sets state first
            self._pending_state = arrays
            return
        seen = self.tokens_seen
        self._clear()
        self.tokens_seen = seen  # tokens this cache's life has seen (meta_state's record)
        if len(arrays) == 1:
            raise ValueError(
                "A2ATSCache state holds codes only (a cold tier's state): rebuild from "
                "export_state(), which reads the rows back"
            )
        if arrays:
            n = self.rows.load(arrays[:-1])
            self.codes = checked_codes(arrays[-1], self.codebook)
            self.offset = self.codes.shape[2]
            if n != self.offset:
                raise ValueError(f"A2ATSCache state: {n} K/V rows but {self.offset} codes")

    @property
    def meta_state(self) -> tuple[str, ...]:
        """What rebuilds this cache around `state`, as strings (mlx-lm's convention):
        (layer, config JSON, RoPE spec JSON, max_context, tokens_seen, codebook sha256,
        KV memory share in bytes or "")."""
        return (
            str(self.layer),
            json.dumps(self.config.to_dict()),
            json.dumps(self.rope.to_dict()),
            str(self.max_context),
            str(self.tokens_seen),
            self.codebook.sha256,
            "" if self.kv_share is None else str(self.kv_share),
        )

    @meta_state.setter
    def meta_state(self, values) -> None:
        """Configure the cache from `meta_state` strings around the codebook already set
        (`from_state(..., codebook=)`); the recorded sha256 must be that codebook's."""
        values = tuple(values)
        if len(values) not in (5, 6, 7):
            raise ValueError(f"A2ATSCache meta_state has {len(values)} entries, expected 7")
        layer, config, rope, max_context, tokens_seen = values[:5]
        sha = values[5] if len(values) > 5 else None
        codebook = getattr(self, "codebook", None)
        if codebook is None or (sha and codebook.sha256 != sha):
            raise A2ATSError(
                f"the codebook of this A2ATS cache (sha256 {str(sha)[:16]}) is not the one "
                "given: pass it to A2ATSCache.from_state(state, meta_state, codebook=...)"
            )
        share = int(values[6]) if len(values) == 7 and values[6] else None
        spec = RopeSpec.from_dict(json.loads(rope))
        cfg = A2ATSConfig.from_dict(json.loads(config))
        pending = self.__dict__.pop("_pending_state", None)
        kept = None if pending is not None or not hasattr(self, "codes") else self.export_state()
        self._configure(int(layer), spec, codebook, cfg, int(max_context), share)
        self._clear()
        if pending is not None or kept:
            self.state = pending if pending is not None else kept
        self.tokens_seen = int(tokens_seen)

    @classmethod
    def from_state(cls, state, meta_state, codebook=None) -> A2ATSCache:
        """Rebuild a cache from `state` and `meta_state` (mlx-lm's `from_state`, plus the
        codebook, which is not a string and must be given)."""
        obj = cls.__new__(cls)
        obj.codebook = codebook
        obj.meta_state = meta_state
        obj.state = state
        return obj

    # -- bytes (what is actually held; the breakdown is bench/accounting.py) ----------------
    @property
    def resident_bytes(self) -> int:
        """Bytes of K/V rows and codes in process memory."""
        return self.rows.resident_bytes + (0 if self.codes is None else self.codes.nbytes)

    @property
    def disk_bytes(self) -> int:
        """Bytes of K/V rows in the cold tier's file (0 for resident kinds)."""
        return self.rows.disk_bytes

    @property
    def nbytes(self) -> int:
        """Everything this layer holds in memory: rows, codes, the rotation matrices and the
        estimate's sums (the shared codebook is counted once per model elsewhere)."""
        return self.resident_bytes + int(self.rotations.nbytes) + self.retrieval.estimate_bytes

    @property
    def tokens_retrieved(self) -> int:
        """Far tokens selected (union over KV heads), summed over decode steps."""
        return self.top_k.retrieved

    def close(self) -> None:
        """Free the rows now (and remove a cold-tier file)."""
        self.rows.close()


def decided_estimate(config: A2ATSConfig, geometry: tuple, kind: str) -> tuple[A2ATSConfig, bool]:
    """(`config` with the missed-attention estimate decided, whether the measurement turned it
    on): None is on where it was measured to cost nothing here (`crossover.measured_estimate`).
    The cache keeps `config` as asked, so a restore, or a later measurement, decides afresh."""
    if config.estimate_missed is not None:
        return config, False
    on = measured_estimate(*geometry, kind)
    return replace(config, estimate_missed=on), on
