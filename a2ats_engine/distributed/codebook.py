"""A codebook holding only this rank's layers.

A codebook file has one set of arrays per model layer (`layers.{l}.centroids`, ...). A rank
reads the arrays of the layers it serves; every other layer gets a zero-stride view of one
float (same shape, 4 bytes), so layer numbers, shapes, file checks and `validate_for` are the
codebook's own. `nbytes` counts what the rank holds.
"""

from __future__ import annotations

import os
from pathlib import Path

import mlx.core as mx

from ..cache.codebook import Codebook
from ..cache.codebook_file import read_metadata
from ..errors import CodebookError
from ..files import sha256_file

_ARRAYS = ("centroids", "assign_centroids", "chol")


class RankCodebook(Codebook):
    """A `Codebook` whose arrays are real only for `owned` layers (see the module docstring)."""

    owned: frozenset[int] = frozenset()

    @property
    def nbytes(self) -> int:
        held = [
            a
            for i in sorted(self.owned)
            for a in (self._centroids[i], self._assign[i], self._chol[i])
        ]
        held += [w for i, w in self._assign_weights.items() if i in self.owned]
        return int(sum(a.nbytes for a in held))

    def _check_layer(self, layer: int) -> None:
        super()._check_layer(layer)
        if layer not in self.owned:
            raise ValueError(f"layer={layer} is served by another rank: this rank has no codes")


def load_rank_codebook(
    path: str | os.PathLike, owned: list[int] | range, heads: range | None = None
) -> RankCodebook:
    """The codebook at `path` with real arrays only for the `owned` model layers, and with
    `heads` (a tensor split's KV heads) only those heads' rows of every layer.
    CodebookError (one line) for a missing or damaged file, as `Codebook.load`, or one with
    fewer KV heads than `heads` asks for."""
    path = Path(path)
    meta = read_metadata(path)
    try:
        arrays = mx.load(str(path), format="safetensors")
    except Exception as exc:  # MLX raises plain RuntimeError/ValueError on bad content
        raise CodebookError(f"{path.name}: file is damaged ({exc})") from exc
    owned = frozenset(int(i) for i in owned)
    for key in list(arrays):
        parts = key.split(".")
        ours = len(parts) == 3 and parts[0] == "layers" and parts[2] in _ARRAYS
        if ours and heads is not None:
            arr = arrays[key]
            if arr.ndim < 1 or arr.shape[0] < heads.stop:
                raise CodebookError(
                    f"{path.name}: {key} has {arr.shape[0] if arr.ndim else 0} KV heads, this "
                    f"rank serves heads {heads.start}-{heads.stop - 1}"
                )
            arrays[key] = arr[heads.start : heads.stop]
        if ours and int(parts[1]) not in owned:
            arr = arrays[key]
            arrays[key] = mx.broadcast_to(mx.zeros((1,) * arr.ndim, arr.dtype), arr.shape)
    book = RankCodebook.from_arrays(arrays, meta, meta.get("num_layers"), where=path.name)
    book.owned = owned
    book._sha256 = sha256_file(path)  # provenance: the same file as on one process
    return book


__all__ = ["RankCodebook", "load_rank_codebook"]
