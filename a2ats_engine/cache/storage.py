"""How an A2ATS cache stores its post-RoPE K/V rows: in the model dtype, or `mx.quantize`d.

A stored value is what mlx-lm's `QuantizedKVCache` keeps: one array `[B, n_kv, N, d]` (float),
or the tuple `(w, scales, biases)` of `mx.quantize` over the last axis (quantized). `RowStorage`
holds the format (bits, group size) and does every operation with `tree_map` over the value, so
neither the cache nor the attention code branches on the kind of storage.
"""

from __future__ import annotations

from dataclasses import dataclass

import mlx.core as mx
from mlx.utils import tree_flatten, tree_map

Stored = mx.array | tuple[mx.array, mx.array, mx.array]


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
