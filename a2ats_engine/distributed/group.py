"""Small exchanges over MLX's distributed runtime (no transport of our own): text and bytes.

Everything here is a collective: every rank of the group must call it, in the same order.
Payloads ride on `all_sum` / `all_gather` of int32 arrays on the CPU stream.
"""

from __future__ import annotations

import json
from typing import Any

import mlx.core as mx
import numpy as np


def _all_sum(values: np.ndarray, group: Any) -> np.ndarray:
    out = mx.distributed.all_sum(mx.array(values), group=group, stream=mx.cpu)
    return np.array(out)


def share_bytes(data: bytes | None, group: Any) -> bytes:
    """Rank 0's `data` on every rank (other ranks pass None)."""
    own = data if group.rank() == 0 else b""
    own = own or b""
    size = int(_all_sum(np.array([len(own)], dtype=np.int32), group)[0])
    buf = np.zeros(max(size, 1), dtype=np.int32)
    buf[: len(own)] = np.frombuffer(own, dtype=np.uint8)
    return bytes(_all_sum(buf, group)[:size].astype(np.uint8))


def share_json(value: Any, group: Any) -> Any:
    """Rank 0's JSON-able `value` on every rank."""
    data = json.dumps(value).encode() if group.rank() == 0 else None
    return json.loads(share_bytes(data, group).decode())


def gather_bytes(data: bytes, group: Any) -> list[bytes]:
    """Every rank's `data`, indexed by rank."""
    lengths = np.array(
        mx.distributed.all_gather(mx.array([len(data)], dtype=mx.int32), group=group, stream=mx.cpu)
    )
    width = max(int(lengths.max()), 1)
    buf = np.zeros(width, dtype=np.int32)
    buf[: len(data)] = np.frombuffer(data, dtype=np.uint8)
    rows = np.array(mx.distributed.all_gather(mx.array(buf)[None], group=group, stream=mx.cpu))
    return [bytes(rows[r, : int(n)].astype(np.uint8)) for r, n in enumerate(lengths)]


def gather_json(value: Any, group: Any) -> list[Any]:
    """Every rank's JSON-able `value`, indexed by rank."""
    return [json.loads(b.decode()) for b in gather_bytes(json.dumps(value).encode(), group)]


def shared_seed(seed: int | None, group: Any) -> int:
    """One seed for every rank (rank 0's, or one rank 0 draws): the ranks sample the same
    token from the same logits only with the same seed."""
    if group.rank() == 0 and seed is None:
        seed = int(np.random.SeedSequence().entropy % (2**31))
    return int(share_json(seed if group.rank() == 0 else None, group))


__all__ = ["share_bytes", "share_json", "gather_bytes", "gather_json", "shared_seed"]
