"""One forward pass over the calibration text serving several calibrations at once.

`calibrate(tokens=T, spec=CodebookSpec(N))` runs the model over the first T tokens of its corpus
(in chunks, each from a fresh context) and keeps `default_keys_per_head(N)` sampled keys per
head. A sweep over several (T, keys per head) pairs repeats most of that forward pass: a chunk
of a shorter stream is the same chunk of a longer one when the shorter stream is a prefix of
the longer (the built-in corpus is: a longer corpus only appends documents). `collect_shared`
plans every request exactly as `collect` would (`plan_collection`: chunks, held-out split,
sampled positions, same seed), runs each distinct chunk once, keeps the keys at the union of
the positions any request samples there, and assembles each request's `CalibrationData`
from those chunks: the same arrays `collect` returns for that request
(tests/engine/bench/test_codebook_sweep.py checks it), for one forward pass instead of one per
request. A request whose stream is not a prefix of a longer one gets chunks of its own.

Time. `collect_seconds(T)` is what a run of `collect` for T alone would have spent: building
and tokenizing its corpus plus the forward time of the chunks it uses (each chunk timed when
it ran); `forward_seconds` is the forward time really spent.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import mlx.core as mx
import numpy as np

from ..cache.config import A2ATSConfig
from ..progress import Progress
from .capture import (
    DEFAULT_CHUNK_LEN,
    Accumulator,
    CalibrationData,
    CancelFlag,
    ChunkCapturer,
    CollectionPlan,
    calibration_data,
    plan_collection,
    token_stream,
)


@dataclass
class _Chunk:
    """One chunk's forward pass: the chunk positions kept (sorted), the keys there per layer
    `[n_kv, len(local), d]`, the query moments per layer, the query count and its seconds."""

    local: np.ndarray
    keys: list[mx.array]
    moments: list[mx.array | None]
    queries: int
    seconds: float


@dataclass
class _Stream:
    tokens: np.ndarray
    prep_seconds: float  # corpus build + tokenization, as `calibrate` does it for this T
    source: int  # index of the stream whose chunks it uses (itself, or a longer one)


class SharedCollection:
    """Several calibrations' collected data from shared chunks (see the module docstring)."""

    def __init__(
        self,
        streams: dict[int, _Stream],
        plans: dict[tuple[int, int], CollectionPlan],
        chunks: dict[tuple[int, int, int], _Chunk],
        num_layers: int,
    ) -> None:
        self._streams = streams
        self._plans = plans
        self._chunks = chunks
        self._num_layers = num_layers

    @property
    def requests(self) -> list[tuple[int, int]]:
        """The (tokens, keys_per_head) pairs this collection serves."""
        return list(self._plans)

    @property
    def forward_seconds(self) -> float:
        """Forward time really spent, every distinct chunk once."""
        return float(sum(c.seconds for c in self._chunks.values()))

    @property
    def forward_tokens(self) -> int:
        """Tokens really run through the model."""
        return int(sum(end - start for _, start, end in self._chunks))

    @property
    def prep_seconds(self) -> float:
        """Corpus building and tokenization, every token count's."""
        return float(sum(s.prep_seconds for s in self._streams.values()))

    def _chunk_keys(self, tokens: int) -> list[tuple[int, int, int]]:
        stream = self._streams[tokens]
        plan = next(p for (t, _), p in self._plans.items() if t == tokens)
        return [(stream.source, start, end) for start, end in plan.chunks]

    def collect_seconds(self, tokens: int) -> float:
        """Seconds `collect` for `tokens` alone would have spent: its corpus and tokenization
        plus the forward time of its chunks."""
        chunk_s = sum(self._chunks[k].seconds for k in self._chunk_keys(tokens))
        return float(self._streams[tokens].prep_seconds + chunk_s)

    def data(self, tokens: int, keys_per_head: int) -> CalibrationData:
        """The CalibrationData `collect` returns for this request (ValueError if not planned)."""
        plan = self._plans.get((tokens, keys_per_head))
        if plan is None:
            raise ValueError(
                f"(tokens={tokens}, keys_per_head={keys_per_head}) was not collected: "
                f"collected {self.requests}"
            )
        train, held = Accumulator(self._num_layers), Accumulator(self._num_layers)
        for index, key in enumerate(self._chunk_keys(tokens)):
            chunk = self._chunks[key]
            in_held = index in plan.heldout_ids
            acc, positions = (held, plan.out_pos) if in_held else (train, plan.train_pos)
            start, end = key[1], key[2]
            local = positions[(positions >= start) & (positions < end)] - start
            keys = None
            if local.size:
                idx = mx.array(np.searchsorted(chunk.local, local).astype(np.int32))
                keys = [mx.take(k, idx, axis=1) for k in chunk.keys]
            acc.add_parts(keys, chunk.moments, chunk.queries)
        return calibration_data(train, held, plan)


def collect_shared(
    model: Any,
    tokenizer: Any,
    texts: Sequence[str] | None,
    config: A2ATSConfig,
    *,
    requests: Sequence[tuple[int, int]],
    chunk_len: int = DEFAULT_CHUNK_LEN,
    heldout: float = 0.1,
    seed: int = 0,
    progress: Progress | None = None,
    cancel: CancelFlag | None = None,
) -> SharedCollection:
    """Collect for every (tokens, keys_per_head) in `requests` with shared forward passes.

    texts: the calibration documents (None: the built-in corpus, built per token count as
    `calibrate` builds it, `chars = 8 * tokens`). Everything else as `collect`. Progress
    stages: "tokenizing", "collecting" (tokens actually run). Raises CalibrationCancelled."""
    from .capture import _check_positive
    from .corpus import builtin_corpus

    if not requests:
        raise ValueError("requests is empty: give at least one (tokens, keys_per_head)")
    for tokens, keys_per_head in requests:
        _check_positive("tokens", tokens, 2)
        _check_positive("keys_per_head", keys_per_head, 1)
    _check_positive("chunk_len", chunk_len, 2)
    if not 0.0 <= heldout < 1.0:
        raise ValueError(f"heldout={heldout!r} is out of range: must be in [0, 1)")

    streams: dict[int, _Stream] = {}
    sources: list[np.ndarray] = []
    for tokens in sorted({t for t, _ in requests}, reverse=True):  # longest first
        began = time.perf_counter()
        docs = (
            texts if texts is not None else builtin_corpus(tokenizer, seed=seed, chars=8 * tokens)
        )
        ids = token_stream(tokenizer, docs, tokens, progress=progress, cancel=cancel)
        prep = time.perf_counter() - began
        source = next(
            (
                i
                for i, s in enumerate(sources)
                if len(s) >= len(ids) and np.array_equal(s[: len(ids)], ids)
            ),
            None,
        )
        if source is None:
            sources.append(ids)
            source = len(sources) - 1
        streams[tokens] = _Stream(ids, prep, source)

    plans = {
        (t, k): plan_collection(len(streams[t].tokens), chunk_len, heldout, config.sinks, k, seed)
        for t, k in dict.fromkeys(requests)
    }
    wanted: dict[tuple[int, int, int], set[int]] = {}
    for (tokens, _), plan in plans.items():
        source = streams[tokens].source
        for start, end in plan.chunks:
            keep = wanted.setdefault((source, start, end), set())
            for positions in (plan.train_pos, plan.out_pos):
                inside = positions[(positions >= start) & (positions < end)] - start
                keep.update(int(p) for p in inside)

    chunks: dict[tuple[int, int, int], _Chunk] = {}
    total = sum(end - start for _, start, end in wanted)
    done = 0
    with ChunkCapturer(model, config) as capturer:
        for key in sorted(wanted):
            source, start, end = key

            def step(n: int, base: int = done) -> None:
                if progress is not None:
                    progress("collecting", base + n, total)

            began = time.perf_counter()
            captures = capturer.run(sources[source][start:end], cancel=cancel, on_step=step)
            local = np.array(sorted(wanted[key]), dtype=np.int64)
            keys: list[mx.array] = []
            if local.size:
                idx = mx.array(local.astype(np.int32))
                keys = [mx.take(c.pre_rope_keys()[0], idx, axis=1) for c in captures]
            moments = [c.moment for c in captures]
            mx.eval(keys + [m for m in moments if m is not None])
            chunks[key] = _Chunk(
                local, keys, moments, captures[0].query_count, time.perf_counter() - began
            )
            done += end - start
    return SharedCollection(streams, plans, chunks, len(capturer.served))
