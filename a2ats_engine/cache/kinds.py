"""Which storage kind a layer's K/V rows get, from its settings (`storage.py`, `cold.py`)."""

from __future__ import annotations

from .cold import ColdRows
from .config import A2ATSConfig
from .storage import ResidentRows, RowStorage


def group_size(config: A2ATSConfig, head_dim: int) -> int:
    """kv_bits group size: the configured one, capped at head_dim (it must divide it)."""
    return min(config.kv_group_size, head_dim)


def check_storage(config: A2ATSConfig, head_dim: int, kv_share: int | None) -> None:
    """ValueError (one line) for settings no storage kind can hold."""
    size = group_size(config, head_dim)
    if config.kv_bits is not None and (head_dim % size or size < 32):
        raise ValueError(
            f"A2ATSConfig.kv_bits={config.kv_bits} needs head_dim ({head_dim}) divisible by "
            f"a quantization group of 32, 64 or 128"
        )
    if config.kv_bits is not None and kv_share is not None:
        raise ValueError(
            "A2ATSConfig.kv_memory and kv_bits cannot be combined: the cold tier keeps "
            "rows in the model dtype (set kv_bits to None, or kv_memory to None)"
        )


def make_rows(
    config: A2ATSConfig, head_dim: int, kv_share: int | None, layer: int
) -> ResidentRows | ColdRows:
    """Resident rows (float or kv_bits) without a KV memory share, else the cold kind."""
    if kv_share is None:
        return ResidentRows(RowStorage(config.kv_bits, group_size(config, head_dim)))
    return ColdRows(kv_share, f"layer{layer:03d}")
