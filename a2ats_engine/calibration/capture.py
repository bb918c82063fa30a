"""Calibration data: run the model over a corpus and capture what the codebook is trained on.

Every attention layer gets a `CaptureCache` (mlx-lm's `KVCache` plus an `attend` method);
`hooks.install(model)` routes the layer's attention call to `attend`, which sees the true
post-RoPE queries `q^_i`, computes exact attention (so the forward pass is the model's own), and
accumulates the second moment of the WRoPE retrieval queries of every query head, grouped by KV
head (`Accumulator`). After each chunk the cache holds the chunk's post-RoPE keys; they are
un-rotated with the model's own RoPE and the sampled positions are kept (`ChunkCapturer`).
`calibrate.py` trains the codebook from what this module collects; its docstring has the memory
bound and the cancel rules.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import mlx.core as mx
import numpy as np
from mlx_lm.models.cache import KVCache

from ..cache.codebook_spec import CodebookSpec
from ..cache.config import A2ATSConfig
from ..cache.geometry import model_geometry
from ..cache.rope import RopeSpec, retrieval_distances
from ..errors import A2ATSError
from ..progress import Progress
from ..validation import check_int

STEP_TOKENS = 128  # forward step between cancel checks: cancel took 1.7 s on the demo model
# with the 2-core CPU 4x oversubscribed, so well under a second on an idle one
DEFAULT_CHUNK_LEN = 1024
HELDOUT_KEY_SHARE = 4  # held-out keys per head = keys_per_head // HELDOUT_KEY_SHARE


class CancelFlag(Protocol):
    def is_set(self) -> bool: ...


class CalibrationCancelled(A2ATSError):
    """Raised by `calibrate` / `collect` when the cancel flag was set. Nothing was saved."""


@dataclass
class CalibrationData:
    """What one pass over the corpus collected (all float32).

    keys[l]:            training pre-RoPE keys `[n_kv, N, d]`
    moments[l]:         training WRoPE query second moment `sum q~ q~^T` `[n_kv, d, d]`
    heldout_keys[l]:    held-out keys `[n_kv, N_out, d]` (None when there is no held-out chunk)
    heldout_moments[l]: held-out query second moment `[n_kv, d, d]` (or None)
    key_positions:      stream positions of the training keys `[N]` (same for every head)
    tokens:             tokens run through the model; queries: query vectors per KV head (train)
    """

    keys: list[mx.array]
    moments: list[mx.array]
    heldout_keys: list[mx.array] | None
    heldout_moments: list[mx.array] | None
    key_positions: np.ndarray
    tokens: int
    queries: int
    chunk_len: int


class CaptureCache(KVCache):
    """A `KVCache` that also accumulates the WRoPE query second moment of its layer.

    The moment is over the retrieval queries the cache will really use: each query rotated to
    every retrieval distance (b alone with one bucket, each bucket's distance otherwise), averaged.
    Queries at chunk positions `< query_start` are left out (sink/early-context queries never
    retrieve far tokens). `moment` is `[n_kv, d, d]` float32 (None before the first query)."""

    def __init__(self, spec: RopeSpec, distances: list[int], num_kv_heads: int, query_start: int):
        super().__init__()
        self.spec = spec
        self.distances = list(distances)
        # [d, m * d]: one matmul rotates a pre-RoPE query to every retrieval distance
        self.rotations = mx.concatenate([spec.rotation_matrix(x) for x in distances], axis=-1)
        self.num_kv_heads = num_kv_heads
        self.query_start = query_start
        self.moment: mx.array | None = None
        self.query_count = 0
        self.collect_queries = True

    def attend(self, queries, keys, values, *, scale, mask, sinks=None):
        """Exact attention (the model's forward is unchanged) + the query moment update.
        queries `[B, n_q, L, d]` post-RoPE at positions `offset - L ... offset - 1`."""
        out = mx.fast.scaled_dot_product_attention(
            queries, keys, values, scale=scale, mask=mask, sinks=sinks
        )
        if self.collect_queries:
            self._accumulate(queries)
        return out

    def _accumulate(self, queries: mx.array) -> None:
        b, n_q, length, d = queries.shape
        start = self.offset - length
        first = max(self.query_start - start, 0)
        if first >= length:
            return
        post = queries[:, :, first:].astype(mx.float32)
        pre = self.spec.unrotate(post, start + first)  # q_i (model-scaled, pre-RoPE)
        far = pre @ self.rotations  # [B, n_q, L, m * d]: R_D q_i for every distance D
        grouped = far.reshape(b, self.num_kv_heads, -1, d)  # query head j -> KV head j // G
        moment = mx.sum(mx.swapaxes(grouped, -1, -2) @ grouped, axis=0)  # [n_kv, d, d]
        moment = moment / len(self.distances)
        self.moment = moment if self.moment is None else self.moment + moment
        self.query_count += b * (n_q // self.num_kv_heads) * (length - first)

    def pre_rope_keys(self) -> mx.array:
        """The chunk's keys un-rotated to the pre-RoPE frame, `[B, n_kv, offset, d]` float32."""
        post = self.keys[..., : self.offset, :].astype(mx.float32)
        return self.spec.unrotate(post, 0)


def default_keys_per_head(n_centroids: int) -> int:
    """Training keys kept per head: 16 per centroid, at least 8192, at most 32768.

    k-means needs a few tens of points per centroid to place them well; more mostly costs time
    (Lloyd is `O(N K d)` per iteration) and memory (the cap bounds the keys of a 30-layer,
    3-KV-head, d = 64 model to 0.94 GB with the held-out share)."""
    return int(min(32768, max(8192, 16 * n_centroids)))


def collect(
    model: Any,
    tokenizer: Any,
    texts: Sequence[str],
    config: A2ATSConfig | None = None,
    *,
    spec: CodebookSpec | None = None,
    tokens: int = 65536,
    keys_per_head: int | None = None,
    chunk_len: int = DEFAULT_CHUNK_LEN,
    heldout: float = 0.1,
    seed: int = 0,
    progress: Progress | None = None,
    cancel: CancelFlag | None = None,
    capturer: Callable[[Any, A2ATSConfig], ChunkCapturer] | None = None,
) -> CalibrationData:
    """Run the model over `texts` (at most `tokens` tokens, in chunks of `chunk_len` that each
    start a fresh context) and collect keys and query moments (see the module docstring).

    A share `heldout` of the chunks (evenly spread; none when there is a single chunk) goes to
    held-out data for evaluation. `config` gives sinks, window and the far distances the
    queries are rotated to; `spec` (its n_centroids) sizes the default `keys_per_head`.
    Raises CalibrationCancelled when `cancel` is set. `capturer` (default `ChunkCapturer`)
    makes the object that runs the chunks (a pipeline rank's captures only its own layers)."""
    config = config or A2ATSConfig()
    spec = spec or CodebookSpec()
    _check_positive("tokens", tokens, 2)
    _check_positive("chunk_len", chunk_len, 2)
    if not 0.0 <= heldout < 1.0:
        raise ValueError(f"heldout={heldout!r} is out of range: must be in [0, 1)")
    keys_per_head = keys_per_head or default_keys_per_head(spec.n_centroids)
    _check_positive("keys_per_head", keys_per_head, 1)
    stream = token_stream(tokenizer, texts, tokens, progress=progress, cancel=cancel)
    plan = plan_collection(len(stream), chunk_len, heldout, config.sinks, keys_per_head, seed)
    return _run(model, stream, plan, config, progress, cancel, capturer or ChunkCapturer)


@dataclass(frozen=True)
class CollectionPlan:
    """What `collect` runs and keeps for a stream: its chunks (start, end), the held-out chunk
    indices, and the sorted stream positions of the training and held-out keys it samples."""

    chunks: list[tuple[int, int]]
    heldout_ids: frozenset[int]
    train_pos: np.ndarray
    out_pos: np.ndarray


def plan_collection(
    total: int, chunk_len: int, heldout: float, sinks: int, keys_per_head: int, seed: int
) -> CollectionPlan:
    """The plan `collect` follows for a stream of `total` tokens (deterministic for a seed)."""
    chunks = _chunks(total, chunk_len)
    heldout_ids = _heldout_chunks(len(chunks), heldout)
    rng = np.random.default_rng(seed)
    train_pos = _sample_positions(chunks, set(range(len(chunks))) - heldout_ids, sinks,
                                  keys_per_head, rng)  # fmt: skip
    out_pos = _sample_positions(chunks, heldout_ids, sinks,
                                max(1, keys_per_head // HELDOUT_KEY_SHARE), rng)  # fmt: skip
    return CollectionPlan(chunks, frozenset(heldout_ids), train_pos, out_pos)


def _check_positive(name: str, value: Any, lo: int) -> None:
    check_int("collect", name, value, lo)


def token_stream(
    tokenizer: Any,
    texts: Sequence[str],
    limit: int,
    *,
    progress: Progress | None = None,
    cancel: CancelFlag | None = None,
) -> np.ndarray:
    """Token ids of the texts, in order, separated by the EOS token, cut at `limit` -> `[T]`."""
    eos = getattr(tokenizer, "eos_token_id", None)
    ids: list[int] = []
    for text in texts:
        check_cancel(cancel)
        ids.extend(int(t) for t in tokenizer.encode(text))
        if eos is not None:
            ids.append(int(eos))
        if progress is not None:
            progress("tokenizing", min(len(ids), limit), limit)
        if len(ids) >= limit:
            break
    if len(ids) < 2:
        raise ValueError("the calibration text is empty (fewer than 2 tokens)")
    return np.asarray(ids[:limit], dtype=np.int32)


def _chunks(total: int, chunk_len: int) -> list[tuple[int, int]]:
    """[(start, end)] covering the stream; a short tail chunk is merged into the previous one
    only when it would otherwise be shorter than a quarter chunk."""
    bounds = [(s, min(s + chunk_len, total)) for s in range(0, total, chunk_len)]
    if len(bounds) > 1 and bounds[-1][1] - bounds[-1][0] < chunk_len // 4:
        bounds = bounds[:-1]
    return bounds


def _heldout_chunks(n_chunks: int, share: float) -> set[int]:
    if n_chunks < 2 or share <= 0.0:
        return set()
    count = min(n_chunks - 1, max(1, round(share * n_chunks)))
    return {int((j + 0.5) * n_chunks / count) for j in range(count)}


def _sample_positions(
    chunks: list[tuple[int, int]], chosen: set[int], sinks: int, limit: int, rng
) -> np.ndarray:
    """Sorted stream positions: every position of the chosen chunks past the first `sinks`
    (sinks are always attended, never coded for retrieval), subsampled to `limit`."""
    pools = [
        np.arange(s + min(sinks, e - s - 1), e) for i, (s, e) in enumerate(chunks) if i in chosen
    ]
    if not pools:
        return np.zeros((0,), dtype=np.int64)
    pool = np.concatenate(pools)
    if len(pool) > limit:
        pool = np.sort(rng.choice(pool, size=limit, replace=False))
    return pool


def _run(
    model: Any,
    stream: np.ndarray,
    plan: CollectionPlan,
    config: A2ATSConfig,
    progress: Progress | None,
    cancel: CancelFlag | None,
    make_capturer: Callable[[Any, A2ATSConfig], ChunkCapturer],
) -> CalibrationData:
    total = int(plan.chunks[-1][1])
    with make_capturer(model, config) as capturer:
        train, held = Accumulator(len(capturer.served)), Accumulator(len(capturer.served))
        for index, (start, end) in enumerate(plan.chunks):
            in_held = index in plan.heldout_ids
            acc, positions = (held, plan.out_pos) if in_held else (train, plan.train_pos)

            def step(done: int, start: int = start) -> None:
                if progress is not None:
                    progress("collecting", start + done, total)

            captures = capturer.run(stream[start:end], cancel=cancel, on_step=step)
            local = positions[(positions >= start) & (positions < end)] - start
            acc.add(captures, mx.array(local.astype(np.int32)))
    return calibration_data(train, held, plan)


def calibration_data(
    train: Accumulator, held: Accumulator, plan: CollectionPlan
) -> CalibrationData:
    """The CalibrationData of one plan's accumulated train and held-out parts."""
    heldout_keys = held.key_arrays() if plan.heldout_ids else None
    return CalibrationData(
        keys=train.key_arrays(),
        moments=train.moments,
        heldout_keys=heldout_keys,
        heldout_moments=held.moments if plan.heldout_ids and held.queries else None,
        key_positions=plan.train_pos,
        tokens=int(plan.chunks[-1][1]),
        queries=train.queries,
        chunk_len=plan.chunks[0][1] - plan.chunks[0][0],
    )


class ChunkCapturer:
    """Runs chunks of tokens through the model, each from a fresh context, with a CaptureCache
    on every A2ATS layer (the layer plan's); the model's own caches on the others.

    Use as a context manager (installs the attention hooks, removes them after unless they
    were installed before): `with ChunkCapturer(model, config) as cap: captures = cap.run(ids)`.
    """

    def __init__(self, model: Any, config: A2ATSConfig, layers: Collection[int] | None = None):
        from ..cache.layer_plan import rope_spec_of

        self.model = model
        self.config = config
        geometry = model_geometry(model)
        self.served = [c for c in served_layers(model) if layers is None or c.layer in layers]
        self.specs = [rope_spec_of(model, c) for c in self.served]
        self.distances = retrieval_distances(
            config.window, config.far_offset, config.far_buckets, geometry.max_context
        )
        self.body = transformer_body(model)
        self._was_installed = False

    def __enter__(self) -> ChunkCapturer:
        from ..cache import hooks

        self._was_installed = hooks.is_installed(self.model)
        hooks.install(self.model)
        return self

    def __exit__(self, *exc: object) -> None:
        from ..cache import hooks

        if not self._was_installed:
            hooks.uninstall(self.model)

    def run(
        self,
        ids: np.ndarray,
        *,
        cancel: CancelFlag | None = None,
        on_step: Callable[[int], None] | None = None,
    ) -> list[CaptureCache]:
        """One chunk `ids [L]` in steps of STEP_TOKENS (cancel polled before each; `on_step`
        gets the tokens done) -> the filled CaptureCache of every A2ATS layer."""
        length = len(ids)
        query_start = min(self.config.sinks + self.config.window, length // 2)
        captures = [
            CaptureCache(s, self.distances, c.n_kv_heads, query_start)
            for s, c in zip(self.specs, self.served, strict=True)
        ]
        caches = self.cache_list(captures)
        tokens = mx.array(ids)[None]
        for s in range(0, length, STEP_TOKENS):
            check_cancel(cancel)
            out = self.body(tokens[:, s : s + STEP_TOKENS], cache=caches)
            mx.eval(self.to_evaluate(out, captures))
            if on_step is not None:
                on_step(min(s + STEP_TOKENS, length))
        return captures

    def cache_list(self, captures: list[CaptureCache]) -> list:
        """One cache per model layer: the captures on the served layers, the model's own caches
        on the layers A2ATS leaves (a pipeline rank also puts its peers' slots here)."""
        from ..cache.layer_plan import native_caches

        caches = native_caches(self.model)
        for choice, capture in zip(self.served, captures, strict=True):
            caches[choice.layer] = capture
        return caches

    def to_evaluate(self, out: mx.array, captures: list[CaptureCache]) -> list[mx.array]:
        """What a step evaluates: the captures' keys and moments (not the output: the layers
        after the last A2ATS layer are not needed)."""
        return [c.keys for c in captures] + [c.moment for c in captures if c.moment is not None]


class Accumulator:
    """Per-layer key samples and query moments of one split (train or held-out)."""

    def __init__(self, num_layers: int):
        self.keys: list[list[mx.array]] = [[] for _ in range(num_layers)]
        self.moments: list[mx.array] = []
        self.queries = 0

    def add(self, caches: list[CaptureCache], local: mx.array) -> None:
        """One chunk's captures; `local`: the chunk positions of the keys to keep `[n]`."""
        keys = (
            [mx.take(c.pre_rope_keys()[0], local, axis=1) for c in caches] if local.size else None
        )
        queries = caches[0].query_count if caches else 0  # a pipeline rank may serve none
        self.add_parts(keys, [c.moment for c in caches], queries)

    def add_parts(
        self, keys: list[mx.array] | None, moments: list[mx.array | None], queries: int
    ) -> None:
        """One chunk's kept keys per layer `[n_kv, n, d]` (None: none kept), its query
        moments per layer (None before any query) and its query count."""
        for layer, moment in enumerate(moments):
            if keys is not None:
                self.keys[layer].append(keys[layer])
            if moment is not None:
                if len(self.moments) <= layer:
                    self.moments.append(moment)
                else:
                    self.moments[layer] = self.moments[layer] + moment
        self.queries += queries
        mx.eval([k[-1] for k in self.keys if k] + self.moments)

    def key_arrays(self) -> list[mx.array]:
        if not all(self.keys):
            raise ValueError("the calibration text is too short: no keys were collected")
        return [mx.concatenate(parts, axis=1) for parts in self.keys]


def transformer_body(model: Any) -> Callable[..., Any]:
    """The model without its LM head, for passes that only need the caches filled.

    Returns `model.model` when it is callable with `cache=` (mlx-lm's layout: calling it runs
    the embeddings and every layer, so each cache sees its keys and queries, and skips the
    `[L, vocab]` output matmul), else `model` itself. Call it as
    `transformer_body(model)(tokens [1, L], cache=caches)`."""
    inner = getattr(model, "model", None)
    if inner is not None and callable(inner):
        try:
            if "cache" in inspect.signature(inner.__call__).parameters:
                return inner
        except (TypeError, ValueError):
            pass
    return model


def check_cancel(cancel: CancelFlag | None) -> None:
    if cancel is not None and cancel.is_set():
        raise CalibrationCancelled("calibration cancelled")


def served_layers(model: Any) -> list:
    """The layer plan's `a2ats` layers (LayerChoice): the only ones calibration captures."""
    from ..cache.layer_plan import A2ATS, plan_for

    return [c for c in plan_for(model).require().layers if c.kind == A2ATS]
