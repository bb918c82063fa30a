"""CodebookSpec: what codebook calibration trains (size, product-VQ split, query awareness).

MLX-free, so the app can build and validate it on the GUI thread. These are properties of a
codebook, not of the cache: a cache reads them from the codebook it is given
(`Codebook.n_centroids`, `.sub_dim`, `.metadata["beta"]`).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from ..validation import check_int, check_number, from_known_fields


@dataclass(frozen=True)
class CodebookSpec:
    """The codebook `calibrate` trains. Validated (`ValueError` naming field, value and range).

    n_centroids:  centroids per layer, KV head and subspace (2..65536; codes are uint16).
    sub_dim:      None = full head-dim VQ; else product VQ over head_dim / sub_dim subspaces.
    beta:         0 = fully query-aware VQ (weighted by the calibrated query moments),
                  1 = plain nearest-centroid VQ; in between blends the two metrics.
    """

    n_centroids: int = 4096
    sub_dim: int | None = None
    beta: float = 0.0

    def __post_init__(self) -> None:
        check_int("CodebookSpec", "n_centroids", self.n_centroids, 2, 65536)
        if self.sub_dim is not None:
            check_int("CodebookSpec", "sub_dim", self.sub_dim, 1)
        check_number("CodebookSpec", "beta", self.beta, 0.0, 1.0)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> CodebookSpec:
        """Build from a dict, ignoring unknown keys."""
        return from_known_fields(cls, data)
