"""How an A2ATS cache stores its post-RoPE K/V rows: a value with kinds.

Kinds: `float` (the model dtype) and `kv8`/`kv4` (`mx.quantize`d), both resident
(`ResidentRows`), and `cold` (`cold.py`: rows in a memory-mapped file, only the codes resident).
Every kind answers the same calls (`append`, `fetch`, `gather`, `arrays`, `load`,
`resident_bytes`, `disk_bytes`, `close`), so the cache and the retrieval never branch on it.

A resident value is what mlx-lm's `QuantizedKVCache` keeps: one array `[B, n_kv, N, d]` (float),
or the tuple `(w, scales, biases)` of `mx.quantize` over the last axis (quantized). `RowStorage`
holds the format (bits, group size) and does every operation with `tree_map` over the value.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import mlx.core as mx
from mlx.utils import tree_flatten, tree_map

Stored = mx.array | tuple[mx.array, mx.array, mx.array]
KEYS, VALUES = 0, 1  # which rows `gather` reads
STEP = 256  # rows allocated at a time


@dataclass(frozen=True)
class RowStorage:
    """Format of stored K/V rows. bits None: float rows in the model dtype; else kv_bits."""

    bits: int | None = None
    group_size: int = 64

    @property
    def quantized(self) -> bool:
        return self.bits is not None

    @property
    def n_arrays(self) -> int:
        """Arrays per stored value (1 float array, or w, scales, biases)."""
        return 3 if self.quantized else 1

    def encode(self, x: mx.array) -> Stored:
        """Float rows `[..., d]` -> a stored value."""
        if not self.quantized:
            return x
        return tuple(mx.quantize(x, group_size=self.group_size, bits=self.bits))

    def dequantize(self, stored: Stored) -> mx.array:
        """A stored value -> float rows `[..., d]` (the value itself when float)."""
        if not self.quantized:
            return stored
        return mx.dequantize(*stored, group_size=self.group_size, bits=self.bits)

    @staticmethod
    def zeros_like(stored: Stored, B: int, n_kv: int, size: int) -> Stored:
        """A zero value of `size` rows `[B, n_kv, size, .]` with `stored`'s dtypes and widths."""
        return tree_map(lambda a: mx.zeros((B, n_kv, size, a.shape[-1]), a.dtype), stored)

    @staticmethod
    def rows(stored: Stored, end: int) -> Stored:
        """Rows [0, end): `[B, n_kv, end, .]`."""
        return tree_map(lambda a: a[..., :end, :], stored)

    @staticmethod
    def concat(a: Stored, b: Stored) -> Stored:
        """Rows of `a` then rows of `b` (along the token axis)."""
        return tree_map(lambda x, y: mx.concatenate([x, y], axis=2), a, b)

    @staticmethod
    def write(dst: Stored, src: Stored, start: int, end: int) -> None:
        """dst[..., start:end, :] = src, in place (for every array of the value)."""

        def put(d: mx.array, s: mx.array) -> mx.array:
            d[..., start:end, :] = s
            return d

        tree_map(put, dst, src)

    def take(self, stored: Stored, flat: mx.array, shape: tuple[int, ...]) -> mx.array:
        """Float rows at flat row indices into `[B * n_kv * capacity, .]` -> `[*shape, d]`.

        A flat `mx.take` (10-20x faster than take_along_axis with a broadcast index, see
        docs/ARCHITECTURE.md); quantized rows are dequantized after the take.
        """
        taken = tree_map(lambda a: mx.take(a.reshape(-1, a.shape[-1]), flat, axis=0), stored)
        rows = self.dequantize(taken)
        return rows.reshape(*shape, rows.shape[-1])

    @staticmethod
    def arrays(stored: Stored | None) -> list[mx.array]:
        """The value's arrays in order (for `state`), [] for None."""
        if stored is None:
            return []
        return [a for _, a in tree_flatten(stored)]

    def from_arrays(self, arrays: list[mx.array]) -> Stored:
        """The inverse of `arrays`: `n_arrays` arrays -> a stored value."""
        if len(arrays) != self.n_arrays:
            raise ValueError(f"stored rows need {self.n_arrays} arrays, got {len(arrays)}")
        return tuple(arrays) if self.quantized else arrays[0]

    @staticmethod
    def nbytes(stored: Stored | None) -> int:
        """Bytes held by the value (0 for None)."""
        return sum(a.nbytes for a in RowStorage.arrays(stored))

    @staticmethod
    def capacity(stored: Stored) -> int:
        """Rows allocated (the token axis of the value's arrays)."""
        return RowStorage.arrays(stored)[0].shape[2]


@functools.lru_cache(maxsize=8)
def _row_base(B: int, n_kv: int, capacity: int) -> mx.array:
    return (mx.arange(B * n_kv, dtype=mx.int32) * capacity).reshape(B, n_kv, 1)


def gather_rows(stored: Stored, positions: mx.array, storage: RowStorage) -> mx.array:
    """Rows of [B, n_kv, capacity, d] stored rows at `positions` [B, n_kv, M] -> [B, n_kv, M, d].

    A flat `mx.take` on [B * n_kv * capacity, ...] (10-20x faster than take_along_axis with a
    broadcast index; docs/ARCHITECTURE.md, "The method"). Quantized storage is dequantized after.
    """
    B, n_kv, M = positions.shape
    flat = (positions + _row_base(B, n_kv, storage.capacity(stored))).reshape(-1)
    return storage.take(stored, flat, (B, n_kv, M))


def grown(stored: Stored | None, incoming: Stored, start: int, end: int) -> Stored:
    """`stored` (None: nothing yet) with room for rows [start, end): its rows past `start`
    dropped, then zero rows for the rest, a multiple of STEP, in `incoming`'s format."""
    B, n_kv = RowStorage.arrays(incoming)[0].shape[:2]
    size = ((end - start + STEP - 1) // STEP) * STEP
    new = RowStorage.zeros_like(incoming, B, n_kv, size)
    return new if stored is None else RowStorage.concat(RowStorage.rows(stored, start), new)


class ResidentRows:
    """K/V rows held in process memory, in `fmt`'s format (float or kv_bits), grown by STEP."""

    def __init__(self, fmt: RowStorage) -> None:
        self.fmt = fmt
        self.keys: Stored | None = None
        self.values: Stored | None = None

    @property
    def kind(self) -> str:
        return "float" if self.fmt.bits is None else f"kv{self.fmt.bits}"

    @property
    def capacity(self) -> int:
        return 0 if self.keys is None else RowStorage.capacity(self.keys)

    def append(self, keys: mx.array, values: mx.array, start: int) -> None:
        """Store float rows [B, n_kv, L, d] at [start, start + L) (rows past start are dropped)."""
        end = start + keys.shape[2]
        if not self.fmt.quantized and self.keys is not None and end <= self.keys.shape[2]:
            self.keys[..., start:end, :] = keys  # float rows with room: a decode step's two writes
            self.values[..., start:end, :] = values
            return
        k, v = self.fmt.encode(keys), self.fmt.encode(values)
        if self.keys is None or end > self.capacity:
            self.keys, self.values = (
                grown(self.keys, k, start, end),
                grown(self.values, v, start, end),
            )
        RowStorage.write(self.keys, k, start, end)
        RowStorage.write(self.values, v, start, end)

    def fetch(self, end: int) -> tuple[mx.array, mx.array]:
        """Float K/V rows [0, end): `[B, n_kv, end, d]` each."""
        if not self.fmt.quantized:
            return self.keys[..., :end, :], self.values[..., :end, :]
        deq = self.fmt.dequantize
        return deq(RowStorage.rows(self.keys, end)), deq(RowStorage.rows(self.values, end))

    def gather(self, which: int, positions: mx.array) -> mx.array:
        """Float rows at positions [B, n_kv, M] of the keys (KEYS) or values -> [B, n_kv, M, d]."""
        return gather_rows(self.values if which else self.keys, positions, self.fmt)

    def candidate_keys(self, positions: mx.array) -> mx.array:
        """The rerank's candidate keys at positions [B, n_kv, M] (the stored keys)."""
        return self.gather(KEYS, positions)

    def for_attention(self, keys: mx.array, values: mx.array, start: int):
        """What the model's attention call gets after rows [start, start + L) were appended:
        float rows, the whole cache (lazy slices); kv_bits, the stored past dequantized then the
        incoming rows as they came (prefill attention stays a plain, fast attention)."""
        end = start + keys.shape[2]
        if not self.fmt.quantized:
            return self.fetch(end)
        if start == 0:
            return keys, values
        past_k, past_v = self.fetch(start)
        return (
            mx.concatenate([past_k.astype(keys.dtype), keys], axis=2),
            mx.concatenate([past_v.astype(values.dtype), values], axis=2),
        )

    def truncate(self, end: int) -> None:
        """Rows past `end` are dead (overwritten by the next append); nothing to free."""

    def arrays(self, end: int) -> list[mx.array]:
        """The rows [0, end) as `state` arrays (keys' arrays, then values')."""
        if self.keys is None:
            return []
        rows = RowStorage.rows
        return [
            *RowStorage.arrays(rows(self.keys, end)),
            *RowStorage.arrays(rows(self.values, end)),
        ]

    export = arrays  # every row is resident: what `state` holds is everything

    def load(self, arrays: list[mx.array]) -> int:
        """Take rows from `state` arrays (as `arrays` gives them); returns the row count."""
        per = self.fmt.n_arrays
        if len(arrays) != 2 * per:
            raise ValueError(f"stored rows need {2 * per} arrays, got {len(arrays)}")
        self.keys = self.fmt.from_arrays(arrays[:per])
        self.values = self.fmt.from_arrays(arrays[per:])
        return RowStorage.capacity(self.keys)

    @property
    def resident_bytes(self) -> int:
        return RowStorage.nbytes(self.keys) + RowStorage.nbytes(self.values)

    @property
    def disk_bytes(self) -> int:
        return 0

    def close(self) -> None:
        self.keys = self.values = None
